// HF checkpoint -> GGUF (hf_convert.h): the checkpoint reader, the Qwen3.5 and DFlash tensor maps
// with their transforms, the metadata in llama.cpp's order, and the type policy.
#include "model/hf_convert.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "format/safetensors.h"
#include "model/hf_config.h"
#include "model/dflash_impl.h"

namespace hyspec {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Every tensor of the checkpoint, by name, over its safetensors files.
struct Checkpoint {
  std::string dir;
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsFile*> by_name;  // sorted: the order tensors are written in

  static Result<Checkpoint> open(const std::string& dir) {
    Checkpoint c;
    c.dir = dir;
    std::vector<std::string> paths;
    const std::string index = dir + "/model.safetensors.index.json";
    if (fs::exists(index)) {
      HS_ASSIGN_OR_RETURN(json j, read_json_object(index));
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        return Status::errorf("{}: no 'weight_map' object", index);
      std::set<std::string> shards;
      for (const auto& [name, file] : j["weight_map"].items()) {
        if (!file.is_string()) return Status::errorf("{}: weight_map['{}'] is not a file name", index, name);
        shards.insert(file.get<std::string>());
      }
      for (const std::string& s : shards) paths.push_back(dir + "/" + s);
    } else if (fs::exists(dir + "/model.safetensors")) {
      paths.push_back(dir + "/model.safetensors");
    } else {
      return Status::errorf("{}: no model.safetensors or model.safetensors.index.json", dir);
    }
    for (const std::string& p : paths) {
      HS_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(p));
      for (const SafetensorsTensor& t : f->tensors())
        if (!c.by_name.emplace(t.name, f.get()).second)
          return Status::errorf("{}: tensor '{}' appears in two files", dir, t.name);
      c.files.push_back(std::move(f));
    }
    return c;
  }

  const SafetensorsTensor* info(const std::string& name) const {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second->find(name);
  }
  Result<std::vector<float>> read(const std::string& name) const {
    auto it = by_name.find(name);
    if (it == by_name.end()) return Status::errorf("{}: no tensor '{}'", dir, name);
    return it->second->read_f32(name);
  }
};

// A converted tensor before typing: GGUF name, GGUF dims (ne[0] contiguous), f32 values.
struct OutTensor {
  std::string name;
  std::vector<int64_t> ne;
  std::vector<float> data;
};

std::vector<int64_t> gguf_dims(const std::vector<int64_t>& shape) { return {shape.rbegin(), shape.rend()}; }

// llama.cpp's choice per tensor: norms, 1-D tensors, non-weights and the GDN conv stay F32; a
// quantized type needs whole blocks per row, else F16.
GgmlType tensor_type(const OutTensor& t, GgmlType wanted) {
  const bool ends_weight = t.name.size() >= 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
  const bool is_norm = t.name.size() >= 12 && t.name.compare(t.name.size() - 12, 12, "_norm.weight") == 0;
  if (t.ne.size() <= 1 || is_norm || !ends_weight || t.name.find(".ssm_conv1d.") != std::string::npos)
    return GgmlType::F32;
  const uint32_t block = ggml_type_traits(wanted).block_size;
  if (block > 1 && t.ne[0] % block != 0) return GgmlType::F16;
  return wanted;
}

// ---- Qwen3.5 ---------------------------------------------------------------------------------

struct Qwen35Dims {
  int n_layer = 0, n_nextn = 0;
  int hk = 0, hv = 0, dk = 0, dv = 0;  // GDN k-heads, v-heads, their head dims
};

// The v-heads of `n_heads * head_rows` consecutive rows starting at row0 (each row row_len values)
// go from HF's grouped order (head j*r + m) to tiled order (head m*Hk + j), r = Hv / Hk.
void tile_v_head_rows(std::vector<float>& w, int64_t row0, int64_t row_len, int64_t head_rows, const Qwen35Dims& d) {
  if (d.hv == d.hk) return;
  const int r = d.hv / d.hk;
  const int64_t head = head_rows * row_len;
  std::vector<float> src(w.begin() + row0 * row_len, w.begin() + row0 * row_len + d.hv * head);
  for (int j = 0; j < d.hk; ++j)
    for (int m = 0; m < r; ++m)
      std::copy_n(src.begin() + (j * r + m) * head, head, w.begin() + row0 * row_len + (m * d.hk + j) * head);
}

// The same along the columns of a [rows, Hv * head_cols] matrix (ssm_out's input side).
void tile_v_head_cols(std::vector<float>& w, int64_t rows, int64_t head_cols, const Qwen35Dims& d) {
  if (d.hv == d.hk) return;
  const int r = d.hv / d.hk;
  const int64_t row_len = d.hv * head_cols;
  std::vector<float> src(row_len);
  for (int64_t i = 0; i < rows; ++i) {
    float* row = w.data() + i * row_len;
    std::copy_n(row, row_len, src.begin());
    for (int j = 0; j < d.hk; ++j)
      for (int m = 0; m < r; ++m)
        std::copy_n(src.begin() + (j * r + m) * head_cols, head_cols, row + (m * d.hk + j) * head_cols);
  }
}

void add_one(std::vector<float>& w) {
  for (float& v : w) v += 1.0f;
}

// One decoder block's tensor (HF name relative to the layer) -> its GGUF tensor, transformed.
Result<OutTensor> qwen35_layer_tensor(const Checkpoint& ck, const std::string& hf, int bid, const std::string& rest,
                                      const Qwen35Dims& d) {
  static const std::map<std::string, std::pair<const char*, bool>> plain = {  // GGUF suffix, +1
      {"input_layernorm.weight", {"attn_norm.weight", true}},
      {"post_attention_layernorm.weight", {"post_attention_norm.weight", true}},
      {"mlp.gate_proj.weight", {"ffn_gate.weight", false}},
      {"mlp.up_proj.weight", {"ffn_up.weight", false}},
      {"mlp.down_proj.weight", {"ffn_down.weight", false}},
      {"self_attn.q_proj.weight", {"attn_q.weight", false}},
      {"self_attn.k_proj.weight", {"attn_k.weight", false}},
      {"self_attn.v_proj.weight", {"attn_v.weight", false}},
      {"self_attn.o_proj.weight", {"attn_output.weight", false}},
      {"self_attn.q_norm.weight", {"attn_q_norm.weight", true}},
      {"self_attn.k_norm.weight", {"attn_k_norm.weight", true}},
      {"linear_attn.norm.weight", {"ssm_norm.weight", false}},  // the gated norm keeps its weight
  };
  const SafetensorsTensor* info = ck.info(hf);
  OutTensor t;
  t.ne = gguf_dims(info->shape);
  HS_ASSIGN_OR_RETURN(t.data, ck.read(hf));
  const std::string blk = "blk." + std::to_string(bid) + ".";
  if (auto it = plain.find(rest); it != plain.end()) {
    t.name = blk + it->second.first;
    if (it->second.second) add_one(t.data);
    return t;
  }
  const int64_t K = int64_t{d.hk} * d.dk, V = int64_t{d.hv} * d.dv;
  auto expect = [&](std::vector<int64_t> shape) -> Status {
    if (info->shape != shape)
      return Status::errorf("{}: tensor '{}' has shape {}, expected [{}]", ck.dir, hf, info->shape_string(),
                            fmt::join(shape, ", "));
    return Status::ok();
  };
  const int64_t hidden = info->shape.empty() ? 0 : info->shape.back();
  if (rest == "linear_attn.in_proj_qkv.weight") {
    HS_RETURN_IF_ERROR(expect({2 * K + V, hidden}));
    tile_v_head_rows(t.data, 2 * K, hidden, d.dv, d);
    t.name = blk + "attn_qkv.weight";
  } else if (rest == "linear_attn.in_proj_z.weight") {
    HS_RETURN_IF_ERROR(expect({V, hidden}));
    tile_v_head_rows(t.data, 0, hidden, d.dv, d);
    t.name = blk + "attn_gate.weight";
  } else if (rest == "linear_attn.in_proj_b.weight" || rest == "linear_attn.in_proj_a.weight") {
    HS_RETURN_IF_ERROR(expect({d.hv, hidden}));
    tile_v_head_rows(t.data, 0, hidden, 1, d);
    t.name = blk + (rest == "linear_attn.in_proj_b.weight" ? "ssm_beta.weight" : "ssm_alpha.weight");
  } else if (rest == "linear_attn.conv1d.weight") {
    const int64_t C = 2 * K + V, k = info->shape.empty() ? 0 : info->shape.back();
    HS_RETURN_IF_ERROR(expect({C, 1, k}));
    tile_v_head_rows(t.data, 2 * K, k, d.dv, d);
    t.ne = {k, C};  // [C, 1, K] squeezed
    t.name = blk + "ssm_conv1d.weight";
  } else if (rest == "linear_attn.dt_bias" || rest == "linear_attn.A_log") {
    HS_RETURN_IF_ERROR(expect({d.hv}));
    tile_v_head_rows(t.data, 0, 1, 1, d);
    if (rest == "linear_attn.A_log") {
      for (float& v : t.data) v = -std::exp(v);
      t.name = blk + "ssm_a";
    } else {
      t.name = blk + "ssm_dt.bias";
    }
  } else if (rest == "linear_attn.out_proj.weight") {
    HS_RETURN_IF_ERROR(expect({info->shape.empty() ? 0 : info->shape[0], V}));
    tile_v_head_cols(t.data, info->shape[0], d.dv, d);
    t.name = blk + "ssm_out.weight";
  } else if (rest.rfind("mlp.experts.", 0) == 0 || rest.rfind("mlp.gate.", 0) == 0 ||
             rest.rfind("mlp.shared_expert", 0) == 0) {
    return Status::errorf("{}: tensor '{}': MoE checkpoints (Qwen3_5MoeForCausalLM) are not converted by hyspec",
                          ck.dir, hf);
  } else {
    return Status::errorf("{}: tensor '{}' is not part of a Qwen3.5 decoder block", ck.dir, hf);
  }
  return t;
}

// Parses "<prefix><N>.<rest>"; false when name does not have that form.
bool split_layer(const std::string& name, const std::string& prefix, int& index, std::string& rest) {
  if (name.rfind(prefix, 0) != 0) return false;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return false;
  const std::string idx = name.substr(prefix.size(), dot - prefix.size());
  if (idx.empty() || idx.size() > 6 || idx.find_first_not_of("0123456789") != std::string::npos) return false;
  index = std::stoi(idx);
  rest = name.substr(dot + 1);
  return true;
}

using Meta = std::vector<std::pair<std::string, GgufMetaValue>>;

// The <arch>.* keys (and general.file_type among them, where llama.cpp writes it) into meta, the
// converted tensors into tensors.
Status convert_qwen35(const Checkpoint& ck, const HfConfig& c, const HfConvertOptions& o, HfConversion& out,
                      Meta& meta, std::vector<OutTensor>& tensors) {
  Qwen35Dims d;
  HS_ASSIGN_OR_RETURN(d.n_layer, c.get<int>(c.j, "num_hidden_layers"));
  HS_ASSIGN_OR_RETURN(d.n_nextn, c.get<int>(c.j, "mtp_num_hidden_layers", 0));
  HS_ASSIGN_OR_RETURN(d.hk, c.get<int>(c.j, "linear_num_key_heads"));
  HS_ASSIGN_OR_RETURN(d.hv, c.get<int>(c.j, "linear_num_value_heads"));
  HS_ASSIGN_OR_RETURN(d.dk, c.get<int>(c.j, "linear_key_head_dim"));
  HS_ASSIGN_OR_RETURN(d.dv, c.get<int>(c.j, "linear_value_head_dim"));
  if (d.n_layer <= 0 || d.n_nextn < 0 || d.hk <= 0 || d.hv <= 0 || d.hv % d.hk != 0)
    return Status::errorf("{}: layers {}, GDN k-heads {} / v-heads {}: v-heads must be a multiple of k-heads", c.path,
                          d.n_layer, d.hk, d.hv);
  HS_ASSIGN_OR_RETURN(int hidden, c.get<int>(c.j, "hidden_size"));
  HS_ASSIGN_OR_RETURN(int n_head, c.get<int>(c.j, "num_attention_heads"));
  HS_ASSIGN_OR_RETURN(int n_head_kv, c.get<int>(c.j, "num_key_value_heads"));
  HS_ASSIGN_OR_RETURN(int head_dim, c.get<int>(c.j, "head_dim", n_head > 0 ? hidden / n_head : 0));
  HS_ASSIGN_OR_RETURN(int ffn, c.get<int>(c.j, "intermediate_size"));
  HS_ASSIGN_OR_RETURN(int ctx, c.get<int>(c.j, "max_position_embeddings"));
  HS_ASSIGN_OR_RETURN(float eps, c.get<float>(c.j, "rms_norm_eps", 1e-6f));
  HS_ASSIGN_OR_RETURN(int conv, c.get<int>(c.j, "linear_conv_kernel_dim"));
  HS_ASSIGN_OR_RETURN(int interval, c.get<int>(c.j, "full_attention_interval", 4));
  HS_ASSIGN_OR_RETURN(out.n_vocab, c.get<int64_t>(c.j, "vocab_size"));
  const json& rope = c.j.contains("rope_parameters") && c.j["rope_parameters"].is_object() ? c.j["rope_parameters"] : c.j;
  HS_ASSIGN_OR_RETURN(float theta_top, c.get<float>(c.j, "rope_theta", 10000.0f));
  HS_ASSIGN_OR_RETURN(float theta, c.get<float>(rope, "rope_theta", theta_top));
  HS_ASSIGN_OR_RETURN(double prf_top, c.get<double>(c.j, "partial_rotary_factor", 0.25));
  HS_ASSIGN_OR_RETURN(double prf, c.get<double>(rope, "partial_rotary_factor", prf_top));
  HS_ASSIGN_OR_RETURN(std::vector<int32_t> sections, c.get<std::vector<int32_t>>(rope, "mrope_section",
                                                                             std::vector<int32_t>{11, 11, 10}));
  sections.resize(4, 0);
  std::vector<bool> recurrent(d.n_layer + d.n_nextn, false);
  if (c.j.contains("layer_types")) {
    HS_ASSIGN_OR_RETURN(std::vector<std::string> types, c.get<std::vector<std::string>>(c.j, "layer_types"));
    if (static_cast<int>(types.size()) != d.n_layer)
      return Status::errorf("{}: layer_types has {} entries for {} layers", c.path, types.size(), d.n_layer);
    for (int i = 0; i < d.n_layer; ++i) recurrent[i] = types[i] == "linear_attention";
  } else {
    for (int i = 0; i < d.n_layer; ++i) recurrent[i] = (i + 1) % interval != 0;
  }

  // Tensors, in the checkpoint's (sorted) order.
  const int n_block = d.n_layer + d.n_nextn;
  for (const auto& [name, file] : ck.by_name) {
    int bid = 0;
    std::string rest;
    if (name == "lm_head.weight" || name == "model.embed_tokens.weight") {
      OutTensor t{name == "lm_head.weight" ? "output.weight" : "token_embd.weight", gguf_dims(ck.info(name)->shape), {}};
      HS_ASSIGN_OR_RETURN(t.data, ck.read(name));
      tensors.push_back(std::move(t));
    } else if (name == "model.norm.weight") {
      OutTensor t{"output_norm.weight", gguf_dims(ck.info(name)->shape), {}};
      HS_ASSIGN_OR_RETURN(t.data, ck.read(name));
      add_one(t.data);
      tensors.push_back(std::move(t));
    } else if (split_layer(name, "model.layers.", bid, rest)) {
      if (bid >= d.n_layer) return Status::errorf("{}: tensor '{}' is beyond the {} layers", ck.dir, name, d.n_layer);
      HS_ASSIGN_OR_RETURN(OutTensor t, qwen35_layer_tensor(ck, name, bid, rest, d));
      tensors.push_back(std::move(t));
    } else if (split_layer(name, "mtp.layers.", bid, rest)) {
      if (bid >= d.n_nextn)
        return Status::errorf("{}: tensor '{}' but mtp_num_hidden_layers is {}", ck.dir, name, d.n_nextn);
      HS_ASSIGN_OR_RETURN(OutTensor t, qwen35_layer_tensor(ck, name, d.n_layer + bid, rest, d));
      tensors.push_back(std::move(t));
    } else if (name.rfind("mtp.", 0) == 0) {
      static const std::map<std::string, std::pair<const char*, bool>> shared = {
          {"mtp.fc.weight", {"nextn.eh_proj.weight", false}},
          {"mtp.pre_fc_norm_embedding.weight", {"nextn.enorm.weight", true}},
          {"mtp.pre_fc_norm_hidden.weight", {"nextn.hnorm.weight", true}},
          {"mtp.norm.weight", {"nextn.shared_head_norm.weight", true}},
      };
      auto it = shared.find(name);
      if (it == shared.end()) return Status::errorf("{}: tensor '{}' is not part of a Qwen3.5 MTP block", ck.dir, name);
      if (d.n_nextn == 0) return Status::errorf("{}: tensor '{}' but mtp_num_hidden_layers is 0", ck.dir, name);
      HS_ASSIGN_OR_RETURN(std::vector<float> w, ck.read(name));
      if (it->second.second) add_one(w);
      for (int b = d.n_layer; b < n_block; ++b)  // shared by every MTP block, as llama.cpp writes it
        tensors.push_back({"blk." + std::to_string(b) + "." + it->second.first, gguf_dims(ck.info(name)->shape), w});
    } else {
      return Status::errorf("{}: tensor '{}' is not part of a Qwen3_5ForCausalLM checkpoint", ck.dir, name);
    }
  }

  const std::string a = "qwen35.";
  meta.emplace_back(a + "block_count", GgufMetaValue::u32(n_block));
  meta.emplace_back(a + "context_length", GgufMetaValue::u32(ctx));
  meta.emplace_back(a + "embedding_length", GgufMetaValue::u32(hidden));
  meta.emplace_back(a + "feed_forward_length", GgufMetaValue::u32(ffn));
  meta.emplace_back(a + "attention.head_count", GgufMetaValue::u32(n_head));
  meta.emplace_back(a + "attention.head_count_kv", GgufMetaValue::u32(n_head_kv));
  meta.emplace_back(a + "rope.dimension_sections", GgufMetaValue::i32_array(sections));
  meta.emplace_back(a + "rope.freq_base", GgufMetaValue::f32(theta));
  meta.emplace_back(a + "attention.layer_norm_rms_epsilon", GgufMetaValue::f32(eps));
  meta.emplace_back(a + "attention.key_length", GgufMetaValue::u32(head_dim));
  meta.emplace_back(a + "attention.value_length", GgufMetaValue::u32(head_dim));
  meta.emplace_back("general.file_type", GgufMetaValue::u32(gguf_file_type(o.type)));
  if (d.n_nextn > 0) meta.emplace_back(a + "nextn_predict_layers", GgufMetaValue::u32(d.n_nextn));
  meta.emplace_back(a + "ssm.conv_kernel", GgufMetaValue::u32(conv));
  meta.emplace_back(a + "ssm.state_size", GgufMetaValue::u32(d.dk));
  meta.emplace_back(a + "ssm.group_count", GgufMetaValue::u32(d.hk));
  meta.emplace_back(a + "ssm.time_step_rank", GgufMetaValue::u32(d.hv));
  meta.emplace_back(a + "ssm.inner_size", GgufMetaValue::u32(d.hv * d.dv));
  std::vector<GgufMetaValue> flags;
  for (bool r : recurrent) flags.push_back(GgufMetaValue::boolean(r));
  meta.emplace_back(a + "attention.recurrent_layers", GgufMetaValue::array(GgufValueType::BOOL, flags));
  meta.emplace_back(a + "full_attention_interval", GgufMetaValue::u32(interval));
  meta.emplace_back(a + "rope.dimension_count", GgufMetaValue::u32(static_cast<uint32_t>(head_dim * prf)));
  return Status::ok();
}

// ---- DFlash ----------------------------------------------------------------------------------

Status convert_dflash(const Checkpoint& ck, const HfConfig& c, const HfConvertOptions& o, HfConversion& out,
                      Meta& meta, std::vector<OutTensor>& tensors) {
  if (!c.j.contains("dflash_config") || !c.j["dflash_config"].is_object())
    return Status::errorf("{}: no 'dflash_config': not a DFlash drafter", c.path);
  const json& dc = c.j["dflash_config"];
  HS_ASSIGN_OR_RETURN(int n_layer, c.get<int>(c.j, "num_hidden_layers"));
  HS_ASSIGN_OR_RETURN(int hidden, c.get<int>(c.j, "hidden_size"));
  HS_ASSIGN_OR_RETURN(int ffn, c.get<int>(c.j, "intermediate_size"));
  HS_ASSIGN_OR_RETURN(int n_head, c.get<int>(c.j, "num_attention_heads"));
  HS_ASSIGN_OR_RETURN(int n_head_kv, c.get<int>(c.j, "num_key_value_heads", n_head));
  HS_ASSIGN_OR_RETURN(int head_dim, c.get<int>(c.j, "head_dim", n_head > 0 ? hidden / n_head : 0));
  HS_ASSIGN_OR_RETURN(int ctx, c.get<int>(c.j, "max_position_embeddings", 4096));
  HS_ASSIGN_OR_RETURN(float eps, c.get<float>(c.j, "rms_norm_eps", 1e-6f));
  const json& rope = c.j.contains("rope_parameters") && c.j["rope_parameters"].is_object() ? c.j["rope_parameters"] : c.j;
  HS_ASSIGN_OR_RETURN(float theta_top, c.get<float>(c.j, "rope_theta", 10000.0f));
  HS_ASSIGN_OR_RETURN(float theta, c.get<float>(rope, "rope_theta", theta_top));
  HS_ASSIGN_OR_RETURN(int top_block, c.get<int>(c.j, "block_size", 16));
  HS_ASSIGN_OR_RETURN(int block, c.get<int>(dc, "block_size", top_block));
  HS_ASSIGN_OR_RETURN(int mask, c.get<int>(dc, "mask_token_id"));
  HS_ASSIGN_OR_RETURN(std::vector<int32_t> ids, c.get<std::vector<int32_t>>(dc, "target_layer_ids"));
  HS_ASSIGN_OR_RETURN(out.n_vocab, c.get<int64_t>(c.j, "vocab_size"));
  if (ids.empty()) return Status::errorf("{}: dflash_config.target_layer_ids is empty", c.path);
  for (int32_t& id : ids) id += 1;  // the GGUF lists the layers whose INPUT is a feature

  for (const auto& [hf, file] : ck.by_name) {
    const std::string name = hf.rfind("model.", 0) == 0 ? hf.substr(6) : hf;
    if (name == "d2t" || name == "t2d")
      return Status::errorf("{}: tensor '{}': drafters with their own reduced vocabulary are not converted by hyspec",
                            ck.dir, hf);
    OutTensor t{dflash_gguf_name(name), gguf_dims(ck.info(hf)->shape), {}};
    if (t.name.empty()) return Status::errorf("{}: tensor '{}' is not part of a plain DFlash drafter", ck.dir, hf);
    HS_ASSIGN_OR_RETURN(t.data, ck.read(hf));
    tensors.push_back(std::move(t));
  }

  const std::string a = "dflash.";
  meta.emplace_back(a + "block_count", GgufMetaValue::u32(n_layer));
  meta.emplace_back(a + "context_length", GgufMetaValue::u32(ctx));
  meta.emplace_back(a + "embedding_length", GgufMetaValue::u32(hidden));
  meta.emplace_back(a + "feed_forward_length", GgufMetaValue::u32(ffn));
  meta.emplace_back(a + "attention.head_count", GgufMetaValue::u32(n_head));
  meta.emplace_back(a + "attention.head_count_kv", GgufMetaValue::u32(n_head_kv));
  meta.emplace_back(a + "rope.freq_base", GgufMetaValue::f32(theta));
  meta.emplace_back(a + "attention.layer_norm_rms_epsilon", GgufMetaValue::f32(eps));
  meta.emplace_back(a + "attention.key_length", GgufMetaValue::u32(head_dim));
  meta.emplace_back(a + "attention.value_length", GgufMetaValue::u32(head_dim));
  meta.emplace_back("general.file_type", GgufMetaValue::u32(gguf_file_type(o.type)));
  meta.emplace_back(a + "block_size", GgufMetaValue::u32(block));
  meta.emplace_back(a + "target_layers", GgufMetaValue::i32_array(ids));
  // Plain positions: the whole rotary half in the first section (DFLASH.md).
  meta.emplace_back(a + "rope.dimension_sections", GgufMetaValue::i32_array({head_dim / 2, 0, 0, 0}));
  out.vocab_from_target = true;
  out.after_vocab.emplace_back("tokenizer.ggml.mask_token_id", GgufMetaValue::u32(mask));
  return Status::ok();
}

std::string default_name(const std::string& dir) {
  std::string base = fs::path(dir).lexically_normal().filename().string();
  if (base.empty()) base = fs::path(dir).lexically_normal().parent_path().filename().string();
  if (!base.empty()) base[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(base[0])));
  return base;
}

}  // namespace

Result<GgmlType> parse_convert_type(const std::string& name) {
  if (name == "f32") return GgmlType::F32;
  if (name == "f16") return GgmlType::F16;
  if (name == "bf16") return GgmlType::BF16;
  if (name == "q8_0") return GgmlType::Q8_0;
  return Status::errorf("output type '{}': use f32, f16, bf16 or q8_0", name);
}

uint32_t gguf_file_type(GgmlType type) {
  switch (type) {
    case GgmlType::F16: return 1;
    case GgmlType::Q8_0: return 7;
    case GgmlType::BF16: return 32;
    default: return 0;
  }
}

std::string gguf_size_label(int64_t n_params) {
  // gguf-py's model_weight_count_rounded_notation with min_digits = 2.
  const double n = static_cast<double>(n_params);
  double scaled = n * 1e-3;
  char suffix = 'K';
  if (n > 1e12) {
    scaled = n * 1e-12, suffix = 'T';
  } else if (n > 1e9) {
    scaled = n * 1e-9, suffix = 'B';
  } else if (n > 1e6) {
    scaled = n * 1e-6, suffix = 'M';
  }
  std::string digits = std::to_string(static_cast<int64_t>(std::nearbyint(scaled)));  // Python round(): half-even
  digits.erase(0, digits.find_first_not_of('0') == std::string::npos ? digits.size() : digits.find_first_not_of('0'));
  const int fix = std::max(2 - static_cast<int>(digits.size()), 0);
  return fmt::format("{:.{}f}{}", scaled, fix, suffix);
}

Result<HfConversion> convert_hf_model(const std::string& dir, const HfConvertOptions& options) {
  if (options.type != GgmlType::F32 && options.type != GgmlType::F16 && options.type != GgmlType::BF16 &&
      options.type != GgmlType::Q8_0)
    return Status::errorf("output type {}: use F32, F16, BF16 or Q8_0", ggml_type_name(options.type));
  const std::string config_path = dir + "/config.json";
  HS_ASSIGN_OR_RETURN(json j, read_json_object(config_path));
  HfConfig c{j, config_path};
  HS_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::open(dir));
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();

  HfConversion out;
  Meta meta;
  std::vector<OutTensor> tensors;
  if (arch == "Qwen3_5ForCausalLM") {
    out.arch = "qwen35";
    HS_RETURN_IF_ERROR(convert_qwen35(ck, c, options, out, meta, tensors));
  } else if (arch == "DFlashDraftModel") {
    out.arch = "dflash";
    HS_RETURN_IF_ERROR(convert_dflash(ck, c, options, out, meta, tensors));
  } else {
    return Status::errorf("{}: architecture '{}' is not converted by hyspec (Qwen3_5ForCausalLM, DFlashDraftModel)",
                          config_path, arch);
  }
  for (const OutTensor& t : tensors) out.n_params += static_cast<int64_t>(t.data.size());

  GgufWriter& w = out.writer;
  HS_RETURN_IF_ERROR(w.set("general.architecture", GgufMetaValue::string(out.arch)));
  HS_RETURN_IF_ERROR(w.set("general.type", GgufMetaValue::string("model")));
  HS_RETURN_IF_ERROR(
      w.set("general.name", GgufMetaValue::string(options.name.empty() ? default_name(dir) : options.name)));
  HS_RETURN_IF_ERROR(w.set("general.size_label", GgufMetaValue::string(gguf_size_label(out.n_params))));
  for (auto& [key, value] : meta) HS_RETURN_IF_ERROR(w.set(key, std::move(value)));
  HS_RETURN_IF_ERROR(w.set("general.quantization_version", GgufMetaValue::u32(2)));
  for (OutTensor& t : tensors) {
    HS_RETURN_IF_ERROR(w.add_tensor_f32(t.name, tensor_type(t, options.type), t.ne, t.data)
                           .with_context(fmt::format("{}: tensor {}", dir, t.name)));
    std::vector<float>().swap(t.data);
  }
  return out;
}

}  // namespace hyspec
