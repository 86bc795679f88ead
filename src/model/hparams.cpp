#include "model/hparams.h"

#include <string_view>

namespace hyspec {

int Qwen35Hparams::n_attention_layers() const {
  int n = 0;
  for (bool r : recurrent) n += r ? 0 : 1;
  return n;
}

Status read_attention_hparams(const GgufFile& f, const std::string& p, const AttentionKeyDefaults& d,
                              AttentionHparams& hp) {
  HS_ASSIGN_OR_RETURN(int64_t embd, f.get_int(p + "embedding_length"));
  HS_ASSIGN_OR_RETURN(int64_t ctx, f.get_int_or(p + "context_length", 4096));
  HS_ASSIGN_OR_RETURN(int64_t heads, f.get_int(p + "attention.head_count"));
  int64_t heads_kv = heads;
  if (d.head_count_kv_required || f.has(p + "attention.head_count_kv")) {
    HS_ASSIGN_OR_RETURN(heads_kv, f.get_int(p + "attention.head_count_kv"));
  }
  HS_ASSIGN_OR_RETURN(int64_t key_len, f.get_int_or(p + "attention.key_length", heads > 0 ? embd / heads : 0));
  HS_ASSIGN_OR_RETURN(int64_t val_len, f.get_int_or(p + "attention.value_length", key_len));
  HS_ASSIGN_OR_RETURN(int64_t n_rot, f.get_int_or(p + "rope.dimension_count", key_len));
  HS_ASSIGN_OR_RETURN(double base, f.get_float_or(p + "rope.freq_base", d.rope_freq_base));
  const std::string eps_key = p + "attention.layer_norm_rms_epsilon";
  double eps = 1e-6;
  if (d.rms_eps_required || f.has(eps_key)) {
    HS_ASSIGN_OR_RETURN(eps, f.get_float(eps_key));
  }
  if (key_len != val_len)
    return Status::errorf("{}: {}attention.key_length {} != value_length {}", f.path(), p, key_len, val_len);
  hp.n_embd = static_cast<int>(embd);
  hp.n_ctx_train = static_cast<int>(ctx);
  hp.n_head = static_cast<int>(heads);
  hp.n_head_kv = static_cast<int>(heads_kv);
  hp.head_dim = static_cast<int>(key_len);
  hp.n_rot = static_cast<int>(n_rot);
  hp.rope_base = static_cast<float>(base);
  hp.eps = static_cast<float>(eps);
  return Status::ok();
}

Status validate_attention_hparams(const AttentionHparams& hp, const std::string& source) {
  if (hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv != 0)
    return Status::errorf("{}: head count {} is not a multiple of the kv head count {}", source, hp.n_head,
                          hp.n_head_kv);
  if (hp.head_dim <= 0 || hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2)
    return Status::errorf("{}: rope dimension {} is invalid for head dim {}", source, hp.n_rot, hp.head_dim);
  return Status::ok();
}

QkPrepArgs qk_prep_args(const AttentionHparams& hp) {
  QkPrepArgs p;
  p.q_pitch = hp.head_dim;
  p.n_head = hp.n_head;
  p.n_kv_head = hp.n_head_kv;
  p.head_dim = hp.head_dim;
  p.n_rot = hp.n_rot;
  p.eps = hp.eps;
  p.freq_base = hp.rope_base;
  return p;
}

Result<Qwen35Hparams> read_qwen35_hparams(const GgufFile& f) {
  Qwen35Hparams hp;
  HS_ASSIGN_OR_RETURN(std::string_view arch, f.get_string("general.architecture"));
  if (arch != "qwen35" && arch != "qwen35moe")
    return Status::errorf("{}: unsupported architecture '{}' (hyspec runs qwen35 and qwen35moe)", f.path(), arch);
  hp.arch = std::string(arch);
  hp.moe = arch == "qwen35moe";
  const std::string p = hp.arch + ".";
  auto geti = [&](const char* key) { return f.get_int(p + key); };
  HS_ASSIGN_OR_RETURN(int64_t blocks, geti("block_count"));
  HS_ASSIGN_OR_RETURN(int64_t nextn, f.get_int_or(p + "nextn_predict_layers", 0));
  if (nextn < 0 || nextn >= blocks)
    return Status::errorf("{}: {}nextn_predict_layers = {} with block_count {}", f.path(), p, nextn, blocks);
  hp.n_layer = static_cast<int>(blocks - nextn);
  hp.n_nextn = static_cast<int>(nextn);
  HS_RETURN_IF_ERROR(read_attention_hparams(f, p, AttentionKeyDefaults{}, hp));
  HS_RETURN_IF_ERROR(validate_attention_hparams(hp, f.path()));
  if (f.has(p + "rope.dimension_sections")) {
    HS_ASSIGN_OR_RETURN(std::vector<int64_t> s, f.get_int_array(p + "rope.dimension_sections"));
    for (int64_t v : s) hp.rope_sections.push_back(static_cast<int>(v));
  }

  HS_ASSIGN_OR_RETURN(int64_t conv, geti("ssm.conv_kernel"));
  HS_ASSIGN_OR_RETURN(int64_t d_state, geti("ssm.state_size"));
  HS_ASSIGN_OR_RETURN(int64_t groups, geti("ssm.group_count"));
  HS_ASSIGN_OR_RETURN(int64_t dt_rank, geti("ssm.time_step_rank"));
  HS_ASSIGN_OR_RETURN(int64_t inner, geti("ssm.inner_size"));
  hp.conv_kernel = static_cast<int>(conv);
  hp.ssm_d = static_cast<int>(d_state);
  hp.ssm_k_heads = static_cast<int>(groups);
  hp.ssm_v_heads = static_cast<int>(dt_rank);
  hp.ssm_inner = static_cast<int>(inner);
  if (conv < 2 || conv > 8) return Status::errorf("{}: ssm.conv_kernel {} is not supported (2..8)", f.path(), conv);
  if (groups <= 0 || dt_rank % groups != 0)
    return Status::errorf("{}: ssm.time_step_rank {} is not a multiple of ssm.group_count {}", f.path(), dt_rank, groups);
  if (inner != dt_rank * d_state)
    return Status::errorf("{}: ssm.inner_size {} != time_step_rank {} x state_size {}", f.path(), inner, dt_rank, d_state);

  hp.recurrent.assign(hp.n_layer, false);
  if (f.has(p + "attention.recurrent_layers")) {
    HS_ASSIGN_OR_RETURN(std::vector<int64_t> r, f.get_int_array(p + "attention.recurrent_layers"));
    if (static_cast<int64_t>(r.size()) < hp.n_layer)
      return Status::errorf("{}: attention.recurrent_layers has {} entries for {} layers", f.path(), r.size(), hp.n_layer);
    for (int i = 0; i < hp.n_layer; ++i) hp.recurrent[i] = r[i] != 0;
  } else {
    HS_ASSIGN_OR_RETURN(int64_t interval, geti("full_attention_interval"));
    if (interval <= 0) return Status::errorf("{}: full_attention_interval {} is invalid", f.path(), interval);
    for (int i = 0; i < hp.n_layer; ++i) hp.recurrent[i] = (i + 1) % interval != 0;
  }

  if (hp.moe) {
    HS_ASSIGN_OR_RETURN(int64_t ne, geti("expert_count"));
    HS_ASSIGN_OR_RETURN(int64_t nu, geti("expert_used_count"));
    HS_ASSIGN_OR_RETURN(int64_t ffe, geti("expert_feed_forward_length"));
    HS_ASSIGN_OR_RETURN(int64_t ffs, f.get_int_or(p + "expert_shared_feed_forward_length", 0));
    if (nu <= 0 || nu > ne) return Status::errorf("{}: expert_used_count {} of {} experts", f.path(), nu, ne);
    hp.n_expert = static_cast<int>(ne);
    hp.n_expert_used = static_cast<int>(nu);
    hp.n_ff_exp = static_cast<int>(ffe);
    hp.n_ff_shexp = static_cast<int>(ffs);
  } else {
    HS_ASSIGN_OR_RETURN(int64_t ff, geti("feed_forward_length"));
    hp.n_ff = static_cast<int>(ff);
  }
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb || emb->n_dims < 2) return Status::errorf("{}: missing tensor 'token_embd.weight'", f.path());
  hp.n_vocab = static_cast<int>(emb->ne[1]);
  if (emb->ne[0] != hp.n_embd)
    return Status::errorf("{}: token_embd.weight has rows of {} but embedding_length is {}", f.path(), emb->ne[0], hp.n_embd);
  return hp;
}

DecodeWeightBytes decode_weight_bytes(const GgufFile& f, int64_t first_nextn, int64_t n_expert, int64_t n_used) {
  const bool tied = f.find_tensor("output.weight") == nullptr;
  DecodeWeightBytes r;
  for (const GgufTensorInfo& t : f.tensors()) {
    uint64_t bytes = t.nbytes;
    if (t.name == "token_embd.weight" && !tied) bytes = t.nbytes / static_cast<uint64_t>(t.n_elements() / t.ne[0]);
    else if (n_expert > 0 && n_used > 0 && t.name.find("_exps.") != std::string::npos)
      bytes = t.nbytes / static_cast<uint64_t>(n_expert) * static_cast<uint64_t>(n_used);
    const int blk = gguf_block_index(t.name);
    (blk >= 0 && blk >= first_nextn ? r.nextn : r.target) += bytes;
  }
  return r;
}

}  // namespace hyspec
