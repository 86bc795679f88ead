// The DFlash drafter: hyperparameters and weights from llama.cpp's `dflash` GGUF, variant rejection,
// the loading steps shared with the HF path, state and workspace. The forward is in dflash_forward.cpp.
#include "model/dflash.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "model/dflash_impl.h"
#include "model/qwen35.h"

namespace hyspec {

namespace {

constexpr const char* kPlainOnly = "hyspec runs plain DFlash drafters only";

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool contains(std::string_view s, std::string_view p) { return s.find(p) != std::string_view::npos; }

// DFlash2 (per-layer dynamic convolutions + a selector head) and DSpark (a Markov bias head, or a
// DeepSeek-V4 backbone) share the `dflash` architecture upstream; name them instead of failing on
// the first unknown tensor.
Status reject_variants(const GgufFile& f) {
  const std::string p = "dflash.";
  for (const char* key : {"selector_rank", "selector_top_k", "conv_kernel_size", "conv_group_size"})
    if (f.has(p + key))
      return Status::errorf("{}: a DFlash2 drafter (key '{}{}': dynamic convolutions and a selector head); {}",
                            f.path(), p, key, kPlainOnly);
  if (f.has(p + "hyper_connection_count"))
    return Status::errorf("{}: a DSpark drafter on a DeepSeek-V4 backbone (key '{}hyper_connection_count'); {}",
                          f.path(), p, kPlainOnly);
  for (const GgufTensorInfo& t : f.tensors()) {
    const std::string_view n = t.name;
    if (starts_with(n, "selector") || contains(n, ".attn_conv") || contains(n, ".ffn_conv"))
      return Status::errorf("{}: a DFlash2 drafter (tensor '{}': dynamic convolutions and a selector head); {}",
                            f.path(), n, kPlainOnly);
    if (starts_with(n, "markov") || starts_with(n, "dspark") || starts_with(n, "conf_proj") ||
        starts_with(n, "confidence_head"))
      return Status::errorf("{}: a DSpark drafter (tensor '{}': a Markov bias head on the draft logits); {}", f.path(),
                            n, kPlainOnly);
  }
  return Status::ok();
}

Result<DflashHparams> read_gguf_hparams(const GgufFile& f) {
  HS_ASSIGN_OR_RETURN(std::string_view arch, f.get_string("general.architecture"));
  if (arch == "dspark") return Status::errorf("{}: a DSpark drafter (architecture 'dspark'); {}", f.path(), kPlainOnly);
  if (arch == "dflash-draft")
    return Status::errorf(
        "{}: architecture 'dflash-draft' is an older fork's schema; convert the drafter with "
        "upstream llama.cpp (architecture 'dflash')",
        f.path());
  if (arch != "dflash")
    return Status::errorf("{}: architecture '{}' is not a DFlash drafter (expected 'dflash')", f.path(), arch);
  HS_RETURN_IF_ERROR(reject_variants(f));

  const std::string p = "dflash.";
  DflashHparams hp;
  HS_ASSIGN_OR_RETURN(int64_t blocks, f.get_int(p + "block_count"));
  AttentionKeyDefaults keys;
  keys.head_count_kv_required = false;
  keys.rope_freq_base = 10000.0;
  keys.rms_eps_required = true;
  // Drafters of mrope targets carry degenerate sections [n_rot/2, 0, 0, 0]: plain positions, NeoX pairs.
  HS_RETURN_IF_ERROR(read_attention_hparams(f, p, keys, hp));
  HS_ASSIGN_OR_RETURN(int64_t ff, f.get_int(p + "feed_forward_length"));
  HS_ASSIGN_OR_RETURN(bool causal, f.get_bool_or(p + "attention.causal", false));
  HS_ASSIGN_OR_RETURN(int64_t block, f.get_int_or(p + "block_size", 16));
  HS_ASSIGN_OR_RETURN(int64_t swa, f.get_int_or(p + "attention.sliding_window", 0));
  if (swa > 0)
    return Status::errorf("{}: sliding-window attention ({}attention.sliding_window = {}) is not supported", f.path(),
                          p, swa);
  if (f.has(p + "rope.scaling.type")) {
    HS_ASSIGN_OR_RETURN(std::string_view scaling, f.get_string(p + "rope.scaling.type"));
    if (scaling != "none")
      return Status::errorf("{}: rope scaling '{}' is not supported for drafters", f.path(), scaling);
  }
  hp.n_layer = static_cast<int>(blocks);
  hp.n_ff = static_cast<int>(ff);
  hp.causal = causal;
  hp.block_size = static_cast<int>(block);

  HS_ASSIGN_OR_RETURN(std::vector<int64_t> layers, f.get_int_array(p + "target_layers"));
  for (int64_t id : layers) hp.target_layers.push_back(static_cast<int>(id));
  // The mask id: older converters wrote dflash.mask_token_id, current ones the tokenizer's key.
  const std::string mask_key = f.has(p + "mask_token_id") ? p + "mask_token_id" : "tokenizer.ggml.mask_token_id";
  if (!f.has(mask_key))
    return Status::errorf("{}: no mask token id (neither {}mask_token_id nor tokenizer.ggml.mask_token_id)", f.path(),
                          p);
  HS_ASSIGN_OR_RETURN(int64_t mask, f.get_int(mask_key));
  hp.mask_token_id = static_cast<int32_t>(mask);

  // The target's hidden size: the fc input split over the taps (and the key when present).
  const GgufTensorInfo* fc = f.find_tensor("fc.weight");
  if (!fc) return Status::errorf("{}: missing tensor 'fc.weight'", f.path());
  if (!hp.target_layers.empty()) hp.n_embd_target = static_cast<int>(fc->ne[0] / static_cast<int64_t>(layers.size()));
  HS_ASSIGN_OR_RETURN(int64_t target_hidden, f.get_int_or(p + "target_hidden_size", hp.n_embd_target));
  if (target_hidden != hp.n_embd_target || fc->ne[0] != static_cast<int64_t>(hp.n_features()))
    return Status::errorf("{}: fc.weight {} does not take {} target layers of hidden size {}", f.path(),
                          fc->shape_string(), layers.size(), target_hidden);
  HS_RETURN_IF_ERROR(DflashLoader::validate(hp, f.path()));
  return hp;
}

// GGUF d2t holds target ids (llama.cpp scatters draft logit i to target row d2t[i]).
Result<std::vector<int32_t>> read_gguf_d2t(const GgufFile& f) {
  std::vector<int32_t> d2t;
  const GgufTensorInfo* t = f.find_tensor("d2t");
  if (!t) return d2t;
  if (t->n_dims != 1 || (t->type != GgmlType::I64 && t->type != GgmlType::I32))
    return Status::errorf("{}: tensor 'd2t' is {} {}, expected a 1-D I64 or I32 map", f.path(), ggml_type_name(t->type),
                          t->shape_string());
  d2t.resize(static_cast<size_t>(t->ne[0]));
  for (size_t i = 0; i < d2t.size(); ++i) {
    int64_t v;
    if (t->type == GgmlType::I64) {
      std::memcpy(&v, t->data + i * 8, 8);
    } else {
      int32_t v32;
      std::memcpy(&v32, t->data + i * 4, 4);
      v = v32;
    }
    if (v < 0 || v > std::numeric_limits<int32_t>::max())
      return Status::errorf("{}: d2t[{}] = {} is not a token id", f.path(), i, v);
    d2t[i] = static_cast<int32_t>(v);
  }
  return d2t;
}

}  // namespace

DflashTarget DflashTarget::of(const Qwen35Model& target) {
  DflashTarget t;
  t.token_embd = target.token_embd();
  t.output = target.output();
  t.n_layer = target.hparams().n_layer;
  return t;
}

Status DflashLoader::validate(const DflashHparams& hp, const std::string& source) {
  if (hp.n_layer <= 0 || hp.n_embd <= 0 || hp.n_ff <= 0)
    return Status::errorf("{}: invalid drafter shape ({} layers, hidden {}, ffn {})", source, hp.n_layer, hp.n_embd,
                          hp.n_ff);
  HS_RETURN_IF_ERROR(validate_attention_hparams(hp, source));
  if (hp.block_size < 2) return Status::errorf("{}: block size {} is invalid", source, hp.block_size);
  if (hp.mask_token_id < 0) return Status::errorf("{}: mask token id {} is invalid", source, hp.mask_token_id);
  if (hp.target_layers.empty()) return Status::errorf("{}: the drafter lists no target layers", source);
  for (int id : hp.target_layers)
    if (id < 0) return Status::errorf("{}: target layer id {} is invalid", source, id);
  if (hp.n_embd_target <= 0) return Status::errorf("{}: target hidden size {} is invalid", source, hp.n_embd_target);
  return Status::ok();
}

std::set<std::string> DflashLoader::known_tensors(const DflashHparams& hp) {
  std::set<std::string> names = {"fc.weight",         "enc.output_norm.weight", "output_norm.weight",
                                 "token_embd.weight", "output.weight",          "d2t"};
  for (int i = 0; i < hp.n_layer; ++i)
    for (const char* t : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                          "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"})
      names.insert(blk(i, t) + ".weight");
  return names;
}

Result<std::unique_ptr<DflashModel>> DflashLoader::build(Backend& backend, const DflashHparams& hp, Binder& b,
                                                         const DflashTarget& target, std::vector<int32_t> d2t,
                                                         std::shared_ptr<void> keepalive, const std::string& source) {
  std::unique_ptr<DflashModel> m(new DflashModel(backend, hp));
  DflashModel::Impl& I = *m->impl_;
  I.keepalive = std::move(keepalive);
  const int64_t E = hp.n_embd, D = hp.head_dim, H = hp.n_head, Hkv = hp.n_head_kv, F = hp.n_ff;
  I.fc = b.get("fc.weight", {hp.n_features(), E});
  I.enc_output_norm = b.get("enc.output_norm.weight", {E}, true, true);
  I.output_norm = b.get("output_norm.weight", {E}, true, true);
  I.layers.resize(hp.n_layer);
  for (int i = 0; i < hp.n_layer; ++i) {
    DflashLayer& l = I.layers[i];
    l.attn_norm = b.get(blk(i, "attn_norm.weight"), {E}, true, true);
    l.attn_q = b.get(blk(i, "attn_q.weight"), {E, H * D});
    l.attn_k = b.get(blk(i, "attn_k.weight"), {E, Hkv * D});
    l.attn_v = b.get(blk(i, "attn_v.weight"), {E, Hkv * D});
    l.attn_output = b.get(blk(i, "attn_output.weight"), {H * D, E});
    l.attn_q_norm = b.get(blk(i, "attn_q_norm.weight"), {D}, true, true);
    l.attn_k_norm = b.get(blk(i, "attn_k_norm.weight"), {D}, true, true);
    l.ffn_norm = b.get(blk(i, "ffn_norm.weight"), {E}, true, true);
    l.ffn_gate = b.get(blk(i, "ffn_gate.weight"), {E, F});
    l.ffn_up = b.get(blk(i, "ffn_up.weight"), {E, F});
    l.ffn_down = b.get(blk(i, "ffn_down.weight"), {F, E});
  }
  HS_RETURN_IF_ERROR(b.status());

  // Vocabulary: the target's (embeddings index target ids), unless the drafter is self-contained.
  const GgufTensorInfo* own_embd = b.find("token_embd.weight");
  const GgufTensorInfo* own_head = b.find("output.weight");
  if (target.token_embd.present()) {
    I.n_vocab_target = target.token_embd.n_out;
  } else if (target.output.present()) {
    I.n_vocab_target = target.output.n_out;
  } else if (own_embd && own_embd->n_dims >= 2) {
    I.n_vocab_target = own_embd->ne[1];
  } else {
    return Status::errorf("{}: the drafter has no token embeddings of its own and no target was given", source);
  }
  const int64_t Vt = I.n_vocab_target;
  if (own_embd) {
    I.token_embd = b.get("token_embd.weight", {E, Vt});
  } else if (!target.token_embd.present() || target.token_embd.n_in != E) {
    return Status::errorf(
        "{}: the drafter borrows the target's token_embd, which must be [{}, n_vocab] (have [{}, {}])", source, E,
        target.token_embd.n_in, target.token_embd.n_out);
  } else {
    I.token_embd = target.token_embd;
  }
  I.n_vocab_draft = d2t.empty() ? Vt : static_cast<int64_t>(d2t.size());
  if (!d2t.empty() && !own_head) return Status::errorf("{}: a d2t map without the drafter's own output.weight", source);
  if (own_head) {
    I.output = b.get("output.weight", {E, I.n_vocab_draft});
  } else if (!target.output.present() || target.output.n_in != E || target.output.n_out > Vt ||
             target.output.n_out <= 0) {
    return Status::errorf("{}: the drafter borrows the target's LM head, which must be [{}, {}] (have [{}, {}])",
                          source, E, Vt, target.output.n_in, target.output.n_out);
  } else {
    I.output = target.output;  // all of it, or its first rows (a reduced draft vocabulary)
    I.n_vocab_draft = target.output.n_out;
  }
  HS_RETURN_IF_ERROR(b.status());

  for (size_t i = 0; i < d2t.size(); ++i)
    if (d2t[i] >= Vt)
      return Status::errorf("{}: d2t[{}] = {} is outside the target vocabulary of {}", source, i, d2t[i], Vt);
  if (!d2t.empty()) {
    HS_ASSIGN_OR_RETURN(I.d2t, backend.alloc(d2t.size() * sizeof(int32_t)));
    backend.upload(I.d2t.data(), d2t.data(), d2t.size() * sizeof(int32_t));
    I.d2t_host = std::move(d2t);
  }
  if (hp.mask_token_id >= Vt)
    return Status::errorf("{}: mask token id {} is outside the vocabulary of {}", source, hp.mask_token_id, Vt);
  if (target.token_embd.present() && target.token_embd.n_in != hp.n_embd_target)
    return Status::errorf("{}: the drafter expects target features of hidden size {}, the target has {}", source,
                          hp.n_embd_target, target.token_embd.n_in);
  if (target.n_layer > 0)
    for (int id : hp.target_layers)
      if (id > target.n_layer)
        return Status::errorf("{}: target layer {} does not exist in a target of {} layers", source, id,
                              target.n_layer);
  return m;
}

Result<std::unique_ptr<DflashModel>> DflashModel::load(Backend& backend, const GgufFile& file,
                                                       const DflashTarget& target, const DflashLoadOptions& options) {
  HS_ASSIGN_OR_RETURN(DflashHparams hp, read_gguf_hparams(file));
  const std::set<std::string> known = DflashLoader::known_tensors(hp);
  for (const GgufTensorInfo& t : file.tensors())
    if (!known.count(t.name))
      return Status::errorf("{}: tensor '{}' is not part of a plain DFlash drafter (an unsupported feature); {}",
                            file.path(), t.name, kPlainOnly);
  HS_ASSIGN_OR_RETURN(std::vector<int32_t> d2t, read_gguf_d2t(file));
  Binder b(backend, file, options.dequantize_to_f32);
  return DflashLoader::build(backend, hp, b, target, std::move(d2t), nullptr, file.path());
}

DflashModel::DflashModel(Backend& backend, DflashHparams hp)
    : backend_(backend), hp_(std::move(hp)), impl_(std::make_unique<Impl>()) {}
DflashModel::~DflashModel() = default;

int64_t DflashModel::n_vocab_draft() const { return impl_->n_vocab_draft; }
int64_t DflashModel::n_vocab_target() const { return impl_->n_vocab_target; }
bool DflashModel::has_d2t() const { return !impl_->d2t_host.empty(); }
const int32_t* DflashModel::d2t() const { return has_d2t() ? impl_->d2t.as<int32_t>() : nullptr; }
int64_t DflashModel::reserved_tokens() const { return impl_->max_tokens; }

int32_t DflashModel::target_token(int32_t draft_id) const {
  if (draft_id < 0 || draft_id >= impl_->n_vocab_draft) return -1;
  return has_d2t() ? impl_->d2t_host[static_cast<size_t>(draft_id)] : draft_id;
}

void DflashModel::logits_to_target(const float* draft, int64_t rows, float* target) const {
  const Impl& I = *impl_;
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = draft + r * I.n_vocab_draft;
    float* dst = target + r * I.n_vocab_target;
    if (!has_d2t()) {
      std::memcpy(dst, src, static_cast<size_t>(I.n_vocab_target) * sizeof(float));
      continue;
    }
    std::fill_n(dst, I.n_vocab_target, -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < I.n_vocab_draft; ++i) dst[I.d2t_host[static_cast<size_t>(i)]] = src[i];
  }
}

Result<DflashState> DflashModel::create_state(int64_t n_ctx, GgmlType kv_type) const {
  HS_RETURN_IF_ERROR(check_kv_cache_type(kv_type, hp_.head_dim));
  if (n_ctx <= 0) return Status::errorf("context length {} is invalid", n_ctx);
  DflashState s;
  s.n_ctx = n_ctx;
  const int64_t width = int64_t{hp_.n_head_kv} * hp_.head_dim;
  s.kv.resize(hp_.n_layer);
  for (KvLayer& kv : s.kv) {
    kv.type = kv_type;
    kv.capacity = n_ctx;
    kv.width = width;
    kv.head_dim = hp_.head_dim;
    const size_t bytes = static_cast<size_t>(n_ctx) * kv.row_bytes();
    for (void** p : {&kv.k, &kv.v}) {
      HS_ASSIGN_OR_RETURN(Buffer b, backend_.alloc(bytes));
      backend_.fill_zero(b.data(), bytes);
      s.storage.push_back(b);
      *p = b.data();
    }
  }
  return s;
}

Status DflashModel::reserve(int64_t max_tokens) {
  const int64_t widest = std::max<int64_t>({hp_.n_embd, int64_t{hp_.n_head} * hp_.head_dim, hp_.n_ff});
  return impl_->reserve(backend_, max_tokens, hp_.n_embd, widest);
}

}  // namespace hyspec
