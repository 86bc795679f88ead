// A model file's skeleton, and random weights in it: device probes' A/B builds then need a 9B-shaped
// Q4_K_M file in seconds instead of the anchor's ~190 s (transformers, llama.cpp's converter and
// llama-quantize), with the exact header of the anchor's file (tensor names, shapes, types, metadata).
//   gguf_skeleton skeleton IN.gguf OUT.gguf   IN's header, then a hole to IN's size (sparse; xz packs it
//                                             to its header's size)
//   gguf_skeleton fill FILE.gguf [SEED]       every tensor of FILE rewritten in place with random data
//                                             of finite, model-like size (see fill_tensor)
//   gguf_skeleton add-nextn IN.gguf OUT.gguf  IN's header (a Qwen3.5 target) with one MTP block added as
//                                             the converters lay it out, as a skeleton to fill: blk.N.* in
//                                             the shapes and types of the last full-attention block's, the
//                                             nextn.eh_proj / enorm / hnorm, block_count N + 1 and
//                                             nextn_predict_layers 1 (the anchor's files have no MTP head)
//   gguf_skeleton dflash-for TARGET.gguf OUT.gguf [LAYERS]
//                                             a DFlash drafter for TARGET as a skeleton to fill: LAYERS
//                                             (5) Qwen3-style layers of TARGET's width and FFN (32 heads,
//                                             8 kv heads of 128), Q8_0 matrices, 5 taps, block 16, the
//                                             target's head borrowed (no 9B-shaped drafter is at hand)
// Timing A/Bs only: the weights are noise, so the output text is too.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "util/half.h"

namespace hyspec {
namespace {

// xorshift64*: fast, and the same bytes for the same seed.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed ? seed : 0x9e3779b97f4a7c15ull) {}
  uint64_t next() {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 0x2545f4914f6cdd1dull;
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) / 16777216.0f; }
};

uint64_t hash(std::string_view s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

void put_f16(uint8_t* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Byte offsets of the f16 scales in a block of each quantized type (ggml's block layouts); the rest of
// the block (codes, sub-block scales) is random bits. d = 1e-4 keeps every weight below ~0.5.
struct ScaleFields {
  int n = 0;
  int at[2] = {0, 0};
};
bool scale_fields(GgmlType t, ScaleFields& f) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::IQ4_NL: case GgmlType::IQ4_XS:
      f = {1, {0, 0}};
      return true;
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
      f = {2, {0, 2}};
      return true;
    case GgmlType::Q2_K: f = {2, {80, 82}}; return true;
    case GgmlType::Q3_K: f = {1, {108, 0}}; return true;
    case GgmlType::Q6_K: f = {1, {208, 0}}; return true;
    default: return false;
  }
}

// F32 vectors by role, so that the recurrence and the norms stay finite: norm weights 1, the GDN decay
// rates (ssm_a = -exp(A_log)) in [-2, -0.5], dt biases 0, everything else (conv taps) small.
float f32_value(std::string_view name, Rng& r) {
  if (name.find("norm") != std::string_view::npos) return 1.0f;
  if (name.ends_with(".ssm_a")) return r.uniform(-2.0f, -0.5f);
  if (name.find("ssm_dt") != std::string_view::npos) return 0.0f;
  return r.uniform(-0.3f, 0.3f);
}

Status fill_tensor(const GgufTensorInfo& t, uint8_t* data, uint64_t seed) {
  Rng r(hash(t.name, seed));
  const size_t n = t.nbytes;
  switch (t.type) {
    case GgmlType::F32:
      for (size_t i = 0; i + 4 <= n; i += 4) {
        const float v = f32_value(t.name, r);
        std::memcpy(data + i, &v, 4);
      }
      return Status::ok();
    case GgmlType::F16:
      for (size_t i = 0; i + 2 <= n; i += 2) put_f16(data + i, r.uniform(-0.05f, 0.05f));
      return Status::ok();
    case GgmlType::BF16:
      for (size_t i = 0; i + 2 <= n; i += 2) {
        const uint16_t b = fp32_to_bf16(r.uniform(-0.05f, 0.05f));
        std::memcpy(data + i, &b, 2);
      }
      return Status::ok();
    default: break;
  }
  ScaleFields f;
  const size_t block = ggml_type_traits(t.type).type_size;
  if (!scale_fields(t.type, f) || block == 0 || n % block != 0)
    return Status::errorf("tensor '{}': no fill for type {}", t.name, ggml_type_name(t.type));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = r.next();
    std::memcpy(data + i, &v, 8);
  }
  for (; i < n; ++i) data[i] = static_cast<uint8_t>(r.next());
  for (size_t b = 0; b < n; b += block)
    for (int k = 0; k < f.n; ++k) put_f16(data + b + f.at[k], 1e-4f);
  return Status::ok();
}

Status skeleton(const std::string& in, const std::string& out) {
  HS_ASSIGN_OR_RETURN(MappedFile m, MappedFile::open(in));
  HS_ASSIGN_OR_RETURN(auto file, GgufFile::parse(m.data(), m.size(), in));
  const size_t header = std::min(file->data_offset(), m.size());
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::errorf("{}: cannot create: {}", out, std::strerror(errno));
  bool ok = true;
  for (size_t done = 0; ok && done < header;) {
    const ssize_t k = ::write(fd, m.data() + done, header - done);
    ok = k > 0;
    done += ok ? static_cast<size_t>(k) : 0;
  }
  ok = ok && ::ftruncate(fd, static_cast<off_t>(m.size())) == 0;
  ok = ::close(fd) == 0 && ok;
  if (!ok) return Status::errorf("{}: write failed: {}", out, std::strerror(errno));
  std::fprintf(stderr, "%s: %zu header bytes of %zu (%zu tensors)\n", out.c_str(), header, m.size(), file->tensors().size());
  return Status::ok();
}

Status add_nextn(const std::string& in, const std::string& out) {
  HS_ASSIGN_OR_RETURN(auto file, GgufFile::open(in));
  HS_ASSIGN_OR_RETURN(std::string_view arch_view, file->get_string("general.architecture"));
  const std::string arch(arch_view);
  HS_ASSIGN_OR_RETURN(int64_t blocks, file->get_int(arch + ".block_count"));
  HS_ASSIGN_OR_RETURN(int64_t E, file->get_int(arch + ".embedding_length"));
  HS_ASSIGN_OR_RETURN(int64_t nextn, file->get_int_or(arch + ".nextn_predict_layers", 0));
  if (nextn != 0) return Status::errorf("{}: has {} nextn block(s) already", in, nextn);
  int64_t last = -1;
  for (int64_t i = 0; i < blocks; ++i)
    if (file->find_tensor(fmt::format("blk.{}.attn_q.weight", i))) last = i;
  if (last < 0) return Status::errorf("{}: no full-attention block to copy", in);
  const GgufTensorInfo* out_proj = file->find_tensor(fmt::format("blk.{}.attn_output.weight", last));
  if (!out_proj) return Status::errorf("{}: blk.{}.attn_output.weight missing", in, last);

  GgufWriter w;
  for (const auto& [key, value] : file->metadata())
    HS_RETURN_IF_ERROR(w.set(key, key == arch + ".block_count" ? GgufMetaValue::u32(static_cast<uint32_t>(blocks + 1))
                                                              : GgufMetaValue::from(value)));
  HS_RETURN_IF_ERROR(w.set(arch + ".nextn_predict_layers", GgufMetaValue::u32(1)));
  auto dims = [](const GgufTensorInfo& t) { return std::vector<int64_t>(t.ne, t.ne + t.n_dims); };
  for (const GgufTensorInfo& t : file->tensors()) HS_RETURN_IF_ERROR(w.add_tensor_shape(t.name, t.type, dims(t)));
  const std::string from = fmt::format("blk.{}.", last), to = fmt::format("blk.{}.", blocks);
  int copied = 0;
  for (const GgufTensorInfo& t : file->tensors()) {
    if (!t.name.starts_with(from)) continue;
    HS_RETURN_IF_ERROR(w.add_tensor_shape(to + t.name.substr(from.size()), t.type, dims(t)));
    ++copied;
  }
  HS_RETURN_IF_ERROR(w.add_tensor_shape(to + "nextn.eh_proj.weight", out_proj->type, {2 * E, E}));
  HS_RETURN_IF_ERROR(w.add_tensor_shape(to + "nextn.enorm.weight", GgmlType::F32, {E}));
  HS_RETURN_IF_ERROR(w.add_tensor_shape(to + "nextn.hnorm.weight", GgmlType::F32, {E}));
  HS_RETURN_IF_ERROR(w.write_skeleton(out));
  std::fprintf(stderr, "%s: blk.%lld as block %lld's copy (%d tensors) and its nextn tensors\n", out.c_str(),
               static_cast<long long>(blocks), static_cast<long long>(last), copied);
  return Status::ok();
}

Status dflash_for(const std::string& target_path, const std::string& out, int layers) {
  HS_ASSIGN_OR_RETURN(auto target, GgufFile::open(target_path));
  HS_ASSIGN_OR_RETURN(std::string_view arch_view, target->get_string("general.architecture"));
  const std::string arch(arch_view);
  HS_ASSIGN_OR_RETURN(int64_t E, target->get_int(arch + ".embedding_length"));
  HS_ASSIGN_OR_RETURN(int64_t F, target->get_int(arch + ".feed_forward_length"));
  HS_ASSIGN_OR_RETURN(int64_t blocks, target->get_int(arch + ".block_count"));
  HS_ASSIGN_OR_RETURN(int64_t nextn, target->get_int_or(arch + ".nextn_predict_layers", 0));
  HS_ASSIGN_OR_RETURN(int64_t eos, target->get_int_or("tokenizer.ggml.eos_token_id", 0));
  const int64_t H = 32, Hkv = 8, D = 128, taps = 5, trunk = blocks - nextn;
  if (layers <= 0 || E % D != 0 || trunk < taps)
    return Status::errorf("{}: no DFlash shape for this target", target_path);
  std::vector<int32_t> tap_ids;  // inputs of layers spread over the trunk
  for (int64_t t = 0; t < taps; ++t) tap_ids.push_back(static_cast<int32_t>(1 + t * (trunk - 2) / (taps - 1)));
  GgufWriter w;
  auto u32 = [](int64_t v) { return GgufMetaValue::u32(static_cast<uint32_t>(v)); };
  HS_RETURN_IF_ERROR(w.set("general.architecture", GgufMetaValue::string("dflash")));
  HS_RETURN_IF_ERROR(w.set("dflash.block_count", u32(layers)));
  HS_RETURN_IF_ERROR(w.set("dflash.context_length", u32(32768)));
  HS_RETURN_IF_ERROR(w.set("dflash.embedding_length", u32(E)));
  HS_RETURN_IF_ERROR(w.set("dflash.feed_forward_length", u32(F)));
  HS_RETURN_IF_ERROR(w.set("dflash.attention.head_count", u32(H)));
  HS_RETURN_IF_ERROR(w.set("dflash.attention.head_count_kv", u32(Hkv)));
  HS_RETURN_IF_ERROR(w.set("dflash.attention.key_length", u32(D)));
  HS_RETURN_IF_ERROR(w.set("dflash.attention.value_length", u32(D)));
  HS_RETURN_IF_ERROR(w.set("dflash.rope.freq_base", GgufMetaValue::f32(1e7f)));
  HS_RETURN_IF_ERROR(w.set("dflash.attention.layer_norm_rms_epsilon", GgufMetaValue::f32(1e-6f)));
  HS_RETURN_IF_ERROR(w.set("dflash.block_size", u32(16)));
  HS_RETURN_IF_ERROR(w.set("dflash.target_layers", GgufMetaValue::i32_array(tap_ids)));
  const int32_t half = static_cast<int32_t>(D / 2);  // plain positions (DFLASH.md)
  HS_RETURN_IF_ERROR(w.set("dflash.rope.dimension_sections", GgufMetaValue::i32_array({half, 0, 0, 0})));
  HS_RETURN_IF_ERROR(w.set("tokenizer.ggml.mask_token_id", u32(eos)));
  const GgmlType q = GgmlType::Q8_0, f = GgmlType::F32;
  HS_RETURN_IF_ERROR(w.add_tensor_shape("fc.weight", q, {taps * E, E}));
  HS_RETURN_IF_ERROR(w.add_tensor_shape("enc.output_norm.weight", f, {E}));
  for (int i = 0; i < layers; ++i) {
    auto t = [&](const char* name, GgmlType type, std::vector<int64_t> ne) {
      return w.add_tensor_shape(fmt::format("blk.{}.{}.weight", i, name), type, std::move(ne));
    };
    HS_RETURN_IF_ERROR(t("attn_norm", f, {E}));
    HS_RETURN_IF_ERROR(t("attn_q", q, {E, H * D}));
    HS_RETURN_IF_ERROR(t("attn_k", q, {E, Hkv * D}));
    HS_RETURN_IF_ERROR(t("attn_v", q, {E, Hkv * D}));
    HS_RETURN_IF_ERROR(t("attn_output", q, {H * D, E}));
    HS_RETURN_IF_ERROR(t("attn_q_norm", f, {D}));
    HS_RETURN_IF_ERROR(t("attn_k_norm", f, {D}));
    HS_RETURN_IF_ERROR(t("ffn_norm", f, {E}));
    HS_RETURN_IF_ERROR(t("ffn_gate", q, {E, F}));
    HS_RETURN_IF_ERROR(t("ffn_up", q, {E, F}));
    HS_RETURN_IF_ERROR(t("ffn_down", q, {F, E}));
  }
  HS_RETURN_IF_ERROR(w.add_tensor_shape("output_norm.weight", f, {E}));
  HS_RETURN_IF_ERROR(w.write_skeleton(out));
  std::fprintf(stderr, "%s: a %d-layer DFlash drafter for %s\n", out.c_str(), layers, target_path.c_str());
  return Status::ok();
}

Status fill(const std::string& path, uint64_t seed) {
  const int fd = ::open(path.c_str(), O_RDWR);
  if (fd < 0) return Status::errorf("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
    ::close(fd);
    return Status::errorf("{}: empty or unreadable", path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return Status::errorf("{}: mmap failed: {}", path, std::strerror(errno));
  uint8_t* base = static_cast<uint8_t*>(p);
  Status s = [&]() -> Status {
    HS_ASSIGN_OR_RETURN(auto file, GgufFile::parse(base, size, path));
    for (const GgufTensorInfo& t : file->tensors())
      HS_RETURN_IF_ERROR(fill_tensor(t, const_cast<uint8_t*>(t.data), seed));  // a view of our writable map
    std::fprintf(stderr, "%s: %zu tensors filled (seed %llu)\n", path.c_str(), file->tensors().size(),
                 static_cast<unsigned long long>(seed));
    return Status::ok();
  }();
  if (::munmap(p, size) != 0 && s.is_ok()) s = Status::errorf("{}: munmap failed", path);
  return s;
}

}  // namespace
}  // namespace hyspec

int main(int argc, char** argv) {
  using hyspec::Status;
  const std::string mode = argc > 1 ? argv[1] : "";
  Status s = Status::error(
      "usage: gguf_skeleton skeleton IN.gguf OUT.gguf | fill FILE.gguf [SEED] | add-nextn IN.gguf OUT.gguf | "
      "dflash-for TARGET.gguf OUT.gguf [LAYERS]");
  if (mode == "skeleton" && argc == 4) s = hyspec::skeleton(argv[2], argv[3]);
  if (mode == "add-nextn" && argc == 4) s = hyspec::add_nextn(argv[2], argv[3]);
  if (mode == "dflash-for" && (argc == 4 || argc == 5))
    s = hyspec::dflash_for(argv[2], argv[3], argc == 5 ? std::atoi(argv[4]) : 5);
  if (mode == "fill" && (argc == 3 || argc == 4)) s = hyspec::fill(argv[2], argc == 4 ? std::strtoull(argv[3], nullptr, 10) : 1);
  if (s.is_ok()) return 0;
  std::fprintf(stderr, "error: %s\n", s.message().c_str());
  return 1;
}
