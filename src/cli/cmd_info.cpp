// `hyspec info MODEL.gguf`: what a GGUF file holds — header, hyperparameters, tokenizer summary,
// tensor table, quant mix, parameter count, and the weight bytes one decode step reads.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "backend/backend.h"
#include "format/gguf.h"
#include "model/hparams.h"

namespace hyspec::cli {
namespace {

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

std::string human_count(uint64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f} B", static_cast<double>(n) / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f} M", static_cast<double>(n) / 1e6);
  if (n >= 1'000) return fmt::format("{:.2f} K", static_cast<double>(n) / 1e3);
  return fmt::format("{}", n);
}

// One metadata value on one line; long arrays show their first items and their length.
std::string format_value(const GgufValue& v, size_t max_items = 12) {
  switch (v.type) {
    case GgufValueType::STRING: {
      std::string s(v.str.substr(0, 80));
      for (char& c : s)
        if (c == '\n' || c == '\r' || c == '\t') c = ' ';
      return fmt::format("\"{}\"{}", s, v.str.size() > 80 ? fmt::format("... ({} chars)", v.str.size()) : "");
    }
    case GgufValueType::BOOL: return v.scalar.b ? "true" : "false";
    case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: return fmt::format("{:g}", v.scalar.f);
    case GgufValueType::ARRAY: {
      std::string s = "[";
      for (size_t i = 0; i < v.array.size() && i < max_items; ++i)
        s += (i ? ", " : "") + format_value(v.array[i], max_items);
      if (v.array.size() > max_items) s += fmt::format(", ... {} items", v.array.size());
      return s + "]";
    }
    default: return v.type == GgufValueType::UINT64 ? fmt::format("{}", v.scalar.u) : fmt::format("{}", v.as_int());
  }
}

void print_tokenizer(const GgufFile& f) {
  if (!f.has("tokenizer.ggml.model")) return;
  fmt::print("\ntokenizer:\n");
  auto str = [&](const char* k) { auto r = f.get_string(k); return r ? std::string(*r) : std::string("-"); };
  fmt::print("  model: {}\n  pre: {}\n", str("tokenizer.ggml.model"), str("tokenizer.ggml.pre"));
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (tokens) fmt::print("  vocab size: {}\n", tokens->size());
  if (auto merges = f.get_string_array("tokenizer.ggml.merges")) fmt::print("  merges: {}\n", merges->size());
  const std::pair<const char*, const char*> specials[] = {
      {"bos", "tokenizer.ggml.bos_token_id"}, {"eos", "tokenizer.ggml.eos_token_id"},
      {"eot", "tokenizer.ggml.eot_token_id"}, {"pad", "tokenizer.ggml.padding_token_id"},
      {"mask", "tokenizer.ggml.mask_token_id"}};
  for (const auto& [label, key] : specials) {
    auto id = f.get_int(key);
    if (!id) continue;
    std::string text;
    if (tokens && *id >= 0 && static_cast<size_t>(*id) < tokens->size())
      text = fmt::format(" \"{}\"", (*tokens)[static_cast<size_t>(*id)]);
    fmt::print("  {}: {}{}\n", label, *id, text);
  }
  if (auto types = f.get_int_array("tokenizer.ggml.token_type")) {
    constexpr int64_t kControl = 3;  // llama.cpp token type CONTROL
    fmt::print("  control tokens: {}\n", std::count(types->begin(), types->end(), kControl));
  }
  if (f.has("tokenizer.chat_template")) fmt::print("  chat template: present\n");
}

Status print_info(const std::string& path) {
  HS_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(path));
  const GgufFile& f = *file;
  auto arch_r = f.get_string("general.architecture");
  const std::string arch = arch_r ? std::string(*arch_r) : std::string();
  const std::string prefix = arch + ".";
  // Read everything that can fail before printing, so an error is the only output.
  HS_ASSIGN_OR_RETURN(const int64_t n_layers, f.get_int_or(prefix + "block_count", 0));
  HS_ASSIGN_OR_RETURN(const int64_t n_nextn, f.get_int_or(prefix + "nextn_predict_layers", 0));
  HS_ASSIGN_OR_RETURN(const int64_t n_expert, f.get_int_or(prefix + "expert_count", 0));
  HS_ASSIGN_OR_RETURN(const int64_t n_used, f.get_int_or(prefix + "expert_used_count", 0));

  fmt::print("file: {} ({})\n", path, human_bytes(f.file_size()));
  fmt::print("GGUF version: {}\n", f.version());
  fmt::print("alignment: {}\n", f.alignment());
  fmt::print("architecture: {}\n", arch.empty() ? "-" : arch);
  if (auto name = f.get_string("general.name")) fmt::print("name: {}\n", *name);

  fmt::print("\nhyperparameters ({}*):\n", prefix);
  size_t width = 0;
  for (const auto& [key, value] : f.metadata())
    if (!arch.empty() && key.rfind(prefix, 0) == 0) width = std::max(width, key.size() - prefix.size());
  for (const auto& [key, value] : f.metadata())
    if (!arch.empty() && key.rfind(prefix, 0) == 0)
      fmt::print("  {:<{}}  {}\n", key.substr(prefix.size()), width, format_value(value));

  print_tokenizer(f);

  const auto& tensors = f.tensors();
  fmt::print("\ntensors: {}\n", tensors.size());
  if (tensors.empty()) return Status::ok();
  size_t name_w = 4;
  for (const GgufTensorInfo& t : tensors) name_w = std::max(name_w, t.name.size());
  fmt::print("  {:<{}}  {:<7}  {:<18}  {:>10}\n", "name", name_w, "type", "shape", "size");
  for (const GgufTensorInfo& t : tensors)
    fmt::print("  {:<{}}  {:<7}  {:<18}  {:>10}\n", t.name, name_w, ggml_type_name(t.type), t.shape_string(), human_bytes(t.nbytes));

  // Quant mix and parameter count.
  struct Mix {
    uint64_t bytes = 0, count = 0;
  };
  std::map<std::string_view, Mix> mix;
  uint64_t total_bytes = 0, params = 0;
  for (const GgufTensorInfo& t : tensors) {
    Mix& m = mix[ggml_type_name(t.type)];
    m.bytes += t.nbytes;
    m.count += 1;
    total_bytes += t.nbytes;
    params += static_cast<uint64_t>(t.n_elements());
  }
  fmt::print("\nquant mix:\n");
  for (const auto& [type, m] : mix)
    fmt::print("  {:<7}  {:>4} tensors  {:>10}  {:5.1f}%\n", type, m.count, human_bytes(m.bytes),
               100.0 * static_cast<double>(m.bytes) / static_cast<double>(std::max<uint64_t>(total_bytes, 1)));
  fmt::print("\nparameters: {} ({})\n", human_count(params), params);
  fmt::print("tensor bytes: {} ({} B)\n", human_bytes(total_bytes), total_bytes);

  const auto [target, nextn] = decode_weight_bytes(f, n_layers - n_nextn, n_expert, n_used);
  fmt::print("\nbytes read per token at decode:\n");
  fmt::print("  model: {} ({} B)\n", human_bytes(target), target);
  if (n_nextn > 0)
    fmt::print("  nextn/MTP block: {} ({} B; per drafted token, plus the shared output head)\n", human_bytes(nextn),
               nextn);
  fmt::print("  (token_embd: one row, or all of it as the tied output head; all other weights once");
  if (n_expert > 0 && n_used > 0) fmt::print("; expert tensors at {}/{} experts", n_used, n_expert);
  fmt::print(")\n");
  // KV cache per 1024 tokens of context for each cache type (--kv-type); the GDN state does not grow.
  if (auto hp = read_qwen35_hparams(f); hp.is_ok() && hp->n_attention_layers() > 0) {
    fmt::print("\nKV cache per 1024 tokens ({} attention layers x {} kv heads x {}):", hp->n_attention_layers(),
               hp->n_head_kv, hp->head_dim);
    for (const GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
      const size_t slot = kv_head_bytes(t, hp->head_dim);
      if (slot == 0) continue;
      fmt::print("  {} {}", ggml_type_name(t), human_bytes(2 * 1024 * slot * hp->n_head_kv * hp->n_attention_layers()));
    }
    fmt::print("\n");
  }
  return Status::ok();
}

}  // namespace

void register_info(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("info", "Describe a GGUF file: metadata, tokenizer, tensors, quant mix");
  auto path = std::make_shared<std::string>();
  cmd->add_option("model", *path, "GGUF file")->required();
  cmd->callback([path, &exit_code] {
    std::fflush(stdout);
    const Status st = print_info(*path);
    if (!st.is_ok()) {
      std::fflush(stdout);
      fmt::print(stderr, "error: {}\n", st.message());
      exit_code = 1;
    }
  });
}

}  // namespace hyspec::cli
