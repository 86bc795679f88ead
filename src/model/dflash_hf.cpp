// The DFlash drafter from z-lab's HF directory (config.json with dflash_config + model.safetensors),
// translated to what llama.cpp's converter writes, so one binder and one forward serve both:
// - target_layer_ids are HF layer ids (the OUTPUT of layer id); the GGUF stores id + 1 (its input).
// - Tensors are renamed (hidden_norm -> enc.output_norm, layers.N.* -> blk.N.*); their bytes are
//   used as stored: the converter changes no values of a DFlash drafter (norm weights are plain
//   Qwen3 RMSNorm weights, unlike the Qwen3.5 target's w-1 convention; checked tensor by tensor
//   against the converted fixture). HF [out, in] row-major is GGUF [in, out].
// - A d2t tensor here holds offsets (target id = draft id + d2t[id], the EAGLE/speculators layout);
//   the GGUF holds target ids.
#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "format/safetensors.h"
#include "model/hf_config.h"
#include "model/dflash.h"
#include "model/dflash_impl.h"

namespace hyspec {

std::string dflash_gguf_name(const std::string& hf) {
  static const std::map<std::string, std::string> global = {
      {"fc.weight", "fc.weight"},
      {"hidden_norm.weight", "enc.output_norm.weight"},
      {"norm.weight", "output_norm.weight"},
      {"embed_tokens.weight", "token_embd.weight"},
      {"lm_head.weight", "output.weight"},
  };
  static const std::map<std::string, std::string> per_layer = {
      {"input_layernorm.weight", "attn_norm.weight"},    {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},       {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  if (auto it = global.find(hf); it != global.end()) return it->second;
  if (hf.rfind("layers.", 0) != 0) return {};
  const size_t dot = hf.find('.', 7);
  if (dot == std::string::npos) return {};
  const std::string idx = hf.substr(7, dot - 7);
  if (idx.empty() || idx.find_first_not_of("0123456789") != std::string::npos) return {};
  auto it = per_layer.find(hf.substr(dot + 1));
  return it == per_layer.end() ? std::string() : "blk." + idx + "." + it->second;
}

namespace {

using nlohmann::json;

constexpr const char* kPlainOnly = "hyspec runs plain DFlash drafters only";

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Result<GgmlType> ggml_type_of(SafetensorsDtype t, const std::string& source, const std::string& name) {
  switch (t) {
    case SafetensorsDtype::F32:
      return GgmlType::F32;
    case SafetensorsDtype::F16:
      return GgmlType::F16;
    case SafetensorsDtype::BF16:
      return GgmlType::BF16;
    default:
      return Status::errorf("{}: tensor '{}' has dtype {}; weights must be F32, F16 or BF16", source, name,
                            safetensors_dtype_name(t));
  }
}

Result<DflashHparams> read_hf_hparams(const json& j, const std::string& path, const SafetensorsFile& st,
                                      const DflashTarget& target) {
  HfConfig c{j, path};
  std::vector<std::string> archs;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"])
      if (a.is_string()) archs.push_back(a.get<std::string>());
  for (const std::string& a : archs) {
    if (lower(a).find("dspark") != std::string::npos)
      return Status::errorf("{}: a DSpark drafter ({}); {}", path, a, kPlainOnly);
    if (lower(a).find("dflash2") != std::string::npos)
      return Status::errorf("{}: a DFlash2 drafter ({}); {}", path, a, kPlainOnly);
  }
  if (!j.contains("dflash_config") || !j["dflash_config"].is_object())
    return Status::errorf("{}: no 'dflash_config': not a DFlash drafter directory", path);
  const json& dc = j["dflash_config"];

  DflashHparams hp;
  HS_ASSIGN_OR_RETURN(hp.n_embd, c.get<int>(j, "hidden_size"));
  HS_ASSIGN_OR_RETURN(hp.n_layer, c.get<int>(j, "num_hidden_layers"));
  HS_ASSIGN_OR_RETURN(hp.n_ff, c.get<int>(j, "intermediate_size"));
  HS_ASSIGN_OR_RETURN(hp.n_head, c.get<int>(j, "num_attention_heads"));
  HS_ASSIGN_OR_RETURN(hp.n_head_kv, c.get<int>(j, "num_key_value_heads", hp.n_head));
  HS_ASSIGN_OR_RETURN(hp.head_dim, c.get<int>(j, "head_dim", hp.n_head > 0 ? hp.n_embd / hp.n_head : 0));
  hp.n_rot = hp.head_dim;
  HS_ASSIGN_OR_RETURN(hp.eps, c.get<float>(j, "rms_norm_eps", 1e-6f));
  HS_ASSIGN_OR_RETURN(hp.n_ctx_train, c.get<int>(j, "max_position_embeddings", 4096));
  // rope_theta moved into rope_parameters in transformers 5.
  const json& rope = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"] : j;
  HS_ASSIGN_OR_RETURN(hp.rope_base, c.get<float>(rope, "rope_theta", 10000.0f));
  HS_ASSIGN_OR_RETURN(std::string rope_type, c.get<std::string>(rope, "rope_type", std::string("default")));
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    HS_ASSIGN_OR_RETURN(rope_type, c.get<std::string>(j["rope_scaling"], "rope_type", std::string("default")));
  }
  if (rope_type != "default")
    return Status::errorf("{}: rope type '{}' is not supported for drafters", path, rope_type);
  HS_ASSIGN_OR_RETURN(std::string act, c.get<std::string>(j, "hidden_act", std::string("silu")));
  if (act != "silu") return Status::errorf("{}: hidden_act '{}' is not supported (silu)", path, act);
  HS_ASSIGN_OR_RETURN(bool bias, c.get<bool>(j, "attention_bias", false));
  if (bias) return Status::errorf("{}: attention biases are not supported", path);
  HS_ASSIGN_OR_RETURN(bool swa, c.get<bool>(j, "use_sliding_window", false));
  if (swa) return Status::errorf("{}: sliding-window attention is not supported", path);
  if (j.contains("layer_types") && j["layer_types"].is_array())
    for (const auto& t : j["layer_types"])
      if (t != "full_attention") return Status::errorf("{}: layer type {} is not supported", path, t.dump());
  HS_ASSIGN_OR_RETURN(hp.causal, c.get<bool>(j, "is_causal", false));

  HS_ASSIGN_OR_RETURN(int top_block, c.get<int>(j, "block_size", 16));
  HS_ASSIGN_OR_RETURN(hp.block_size, c.get<int>(dc, "block_size", top_block));
  HS_ASSIGN_OR_RETURN(hp.mask_token_id, c.get<int32_t>(dc, "mask_token_id"));
  std::vector<int> ids;
  if (dc.contains("target_layer_ids")) {
    HS_ASSIGN_OR_RETURN(ids, c.get<std::vector<int>>(dc, "target_layer_ids"));
  } else if (target.n_layer > 0) {
    // The converter's fallback: evenly spaced across the target depth.
    for (int i = 0; i < hp.n_layer; ++i) ids.push_back(std::max(0, (i + 1) * target.n_layer / (hp.n_layer + 1) - 1));
  } else {
    return Status::errorf("{}: dflash_config has no target_layer_ids", path);
  }
  for (int id : ids) hp.target_layers.push_back(id + 1);

  const SafetensorsTensor* fc = st.find("fc.weight");
  if (!fc) fc = st.find("model.fc.weight");
  if (!fc || fc->shape.size() != 2) return Status::errorf("{}: missing 2-D tensor 'fc.weight'", st.path());
  hp.n_embd_target = static_cast<int>(fc->shape[1] / static_cast<int64_t>(ids.empty() ? 1 : ids.size()));
  HS_ASSIGN_OR_RETURN(int target_hidden, c.get<int>(j, "target_hidden_size", hp.n_embd_target));
  if (target_hidden != hp.n_embd_target || fc->shape[1] != hp.n_features())
    return Status::errorf("{}: fc.weight {} does not take {} target layers of hidden size {}", st.path(),
                          fc->shape_string(), ids.size(), target_hidden);
  HS_RETURN_IF_ERROR(DflashLoader::validate(hp, path));
  return hp;
}

// The mapped file plus any tensor copied to meet its element alignment.
struct HfStorage {
  std::unique_ptr<SafetensorsFile> file;
  std::vector<std::vector<uint8_t>> copies;
  std::map<std::string, GgufTensorInfo, std::less<>> tensors;  // by GGUF name
};

}  // namespace

Result<std::unique_ptr<DflashModel>> DflashModel::load_hf(Backend& backend, const std::string& dir,
                                                          const DflashTarget& target,
                                                          const DflashLoadOptions& options) {
  const std::string config_path = dir + "/config.json";
  HS_ASSIGN_OR_RETURN(json j, read_json_object(config_path));

  auto storage = std::make_shared<HfStorage>();
  HS_ASSIGN_OR_RETURN(storage->file, SafetensorsFile::open(dir + "/model.safetensors"));
  const SafetensorsFile& st = *storage->file;
  HS_ASSIGN_OR_RETURN(DflashHparams hp, read_hf_hparams(j, config_path, st, target));

  const SafetensorsTensor* d2t_offsets = nullptr;
  for (const SafetensorsTensor& t : st.tensors()) {
    std::string name = t.name.rfind("model.", 0) == 0 ? t.name.substr(6) : t.name;
    if (name == "t2d") continue;  // the inverse map: not needed to draft
    if (name == "d2t") {
      d2t_offsets = &t;
      continue;
    }
    const std::string g = dflash_gguf_name(name);
    if (g.empty())
      return Status::errorf("{}: tensor '{}' is not part of a plain DFlash drafter (an unsupported feature); {}",
                            st.path(), t.name, kPlainOnly);
    HS_ASSIGN_OR_RETURN(GgmlType type, ggml_type_of(t.dtype, st.path(), t.name));
    if (t.shape.empty() || t.shape.size() > 4)
      return Status::errorf("{}: tensor '{}' has shape {}", st.path(), t.name, t.shape_string());
    GgufTensorInfo info;
    info.name = g;
    info.type = type;
    info.n_dims = static_cast<int>(t.shape.size());
    for (int d = 0; d < info.n_dims; ++d) info.ne[d] = t.shape[t.shape.size() - 1 - d];
    info.nbytes = t.nbytes;
    info.data = t.data;
    if (reinterpret_cast<uintptr_t>(t.data) % safetensors_dtype_size(t.dtype) != 0) {
      storage->copies.emplace_back(t.data, t.data + t.nbytes);
      info.data = storage->copies.back().data();
    }
    if (!storage->tensors.emplace(g, info).second)
      return Status::errorf("{}: tensor '{}' appears twice (with and without 'model.')", st.path(), g);
  }

  // d2t offsets apply to the drafter's own, reduced LM head only; without one the vocabulary is shared.
  std::vector<int32_t> d2t;
  auto head = storage->tensors.find("output.weight");
  if (d2t_offsets && head != storage->tensors.end() && head->second.ne[1] == d2t_offsets->n_elements()) {
    if (d2t_offsets->dtype != SafetensorsDtype::I64 && d2t_offsets->dtype != SafetensorsDtype::I32)
      return Status::errorf("{}: tensor 'd2t' has dtype {}, expected I64 or I32", st.path(),
                            safetensors_dtype_name(d2t_offsets->dtype));
    const size_t esize = safetensors_dtype_size(d2t_offsets->dtype);
    for (int64_t i = 0; i < d2t_offsets->n_elements(); ++i) {
      int64_t off = 0;
      if (esize == 8) {
        std::memcpy(&off, d2t_offsets->data + i * 8, 8);
      } else {
        int32_t o32;
        std::memcpy(&o32, d2t_offsets->data + i * 4, 4);
        off = o32;
      }
      const int64_t id = i + off;
      if (id < 0 || id > INT32_MAX) return Status::errorf("{}: d2t[{}] maps to token {}", st.path(), i, id);
      d2t.push_back(static_cast<int32_t>(id));
    }
  }

  const auto* tensors = &storage->tensors;
  Binder b(
      backend, st.path(),
      [tensors](std::string_view n) -> const GgufTensorInfo* {
        auto it = tensors->find(n);
        return it == tensors->end() ? nullptr : &it->second;
      },
      options.dequantize_to_f32);
  return DflashLoader::build(backend, hp, b, target, std::move(d2t), storage, dir);
}

}  // namespace hyspec
