#include "model/qwen35.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/binder.h"
#include "model/qwen35_impl.h"

namespace hyspec {

Qwen35Model::Qwen35Model(Backend& backend, Qwen35Hparams hp)
    : backend_(backend), hp_(std::move(hp)), impl_(std::make_unique<Impl>()) {}
Qwen35Model::~Qwen35Model() = default;

bool Qwen35Model::has_mtp() const { return impl_->mtp != nullptr; }
const Weight& Qwen35Model::token_embd() const { return impl_->token_embd; }
const Weight& Qwen35Model::output_norm() const { return impl_->output_norm; }
const Weight& Qwen35Model::output() const { return impl_->output; }
int64_t Qwen35Model::reserved_tokens() const { return impl_->max_tokens; }

static void bind_block(Binder& b, const Qwen35Hparams& hp, int i, bool recurrent, Block& blk_w) {
  const int64_t E = hp.n_embd, D = hp.head_dim;
  blk_w.recurrent = recurrent;
  blk_w.attn_norm = b.get(blk(i, "attn_norm.weight"), {E}, true, true);
  blk_w.post_attention_norm = b.get(blk(i, "post_attention_norm.weight"), {E}, true, true);
  if (recurrent) {
    const int64_t d = hp.ssm_d, V = int64_t{hp.ssm_v_heads} * d, C = hp.gdn_channels(), Hv = hp.ssm_v_heads;
    GdnWeights& g = blk_w.gdn;
    g.in_proj = b.get_stacked({{blk(i, "attn_qkv.weight"), C},
                               {blk(i, "attn_gate.weight"), V},
                               {blk(i, "ssm_beta.weight"), Hv},
                               {blk(i, "ssm_alpha.weight"), Hv}},
                              E);
    g.ssm_conv1d = b.get(blk(i, "ssm_conv1d.weight"), {hp.conv_kernel, C}, true, true);
    g.ssm_dt_bias = b.get(blk(i, "ssm_dt.bias"), {Hv}, true, true);
    g.ssm_a = b.get(blk(i, "ssm_a"), {Hv}, true, true);
    g.ssm_norm = b.get(blk(i, "ssm_norm.weight"), {d}, true, true);
    g.ssm_out = b.get(blk(i, "ssm_out.weight"), {V, E});
  } else {
    AttentionWeights& a = blk_w.attn;
    a.attn_q = b.get(blk(i, "attn_q.weight"), {E, 2 * hp.n_head * D});
    a.attn_k = b.get(blk(i, "attn_k.weight"), {E, hp.n_head_kv * D});
    a.attn_v = b.get(blk(i, "attn_v.weight"), {E, hp.n_head_kv * D});
    a.attn_output = b.get(blk(i, "attn_output.weight"), {hp.n_head * D, E});
    a.attn_q_norm = b.get(blk(i, "attn_q_norm.weight"), {D}, true, true);
    a.attn_k_norm = b.get(blk(i, "attn_k_norm.weight"), {D}, true, true);
  }
  FfnWeights& f = blk_w.ffn;
  if (hp.moe) {
    const int64_t X = hp.n_expert, F = hp.n_ff_exp;
    f.ffn_gate_inp = b.get(blk(i, "ffn_gate_inp.weight"), {E, X});
    f.ffn_gate_exps = b.get(blk(i, "ffn_gate_exps.weight"), {E, F, X});
    f.ffn_up_exps = b.get(blk(i, "ffn_up_exps.weight"), {E, F, X});
    f.ffn_down_exps = b.get(blk(i, "ffn_down_exps.weight"), {F, E, X});
    if (hp.n_ff_shexp > 0) {
      f.ffn_gate_shexp = b.get(blk(i, "ffn_gate_shexp.weight"), {E, hp.n_ff_shexp});
      f.ffn_up_shexp = b.get(blk(i, "ffn_up_shexp.weight"), {E, hp.n_ff_shexp});
      f.ffn_down_shexp = b.get(blk(i, "ffn_down_shexp.weight"), {hp.n_ff_shexp, E});
      f.ffn_gate_inp_shexp = b.get(blk(i, "ffn_gate_inp_shexp.weight"), {E, 1});
    }
  } else {
    f.ffn_gate = b.get(blk(i, "ffn_gate.weight"), {E, hp.n_ff});
    f.ffn_up = b.get(blk(i, "ffn_up.weight"), {E, hp.n_ff});
    f.ffn_down = b.get(blk(i, "ffn_down.weight"), {hp.n_ff, E});
  }
}

Result<std::unique_ptr<Qwen35Model>> Qwen35Model::load(Backend& backend, const GgufFile& file,
                                                        const LoadOptions& options) {
  HS_ASSIGN_OR_RETURN(Qwen35Hparams hp, read_qwen35_hparams(file));
  for (const char* variant : {"selector", "dflash"})
    if (file.find_tensor(std::string(variant) + ".weight"))
      return Status::errorf("{}: not a Qwen3.5 target model", file.path());
  std::unique_ptr<Qwen35Model> m(new Qwen35Model(backend, hp));
  Impl& I = *m->impl_;
  Binder b(backend, file, options.dequantize_to_f32);
  const int64_t E = hp.n_embd, Vocab = hp.n_vocab;
  I.token_embd = b.get("token_embd.weight", {E, Vocab});
  I.output_norm = b.get("output_norm.weight", {E}, true, true);
  I.output = b.get("output.weight", {E, Vocab}, false);
  if (b.status().is_ok() && !I.output.present()) I.output = I.token_embd;  // tied embeddings
  I.blocks.resize(hp.n_layer);
  for (int i = 0; i < hp.n_layer; ++i) bind_block(b, hp, i, hp.recurrent[i], I.blocks[i]);
  if (options.load_mtp && hp.n_nextn > 0) {
    const int i = hp.n_layer;  // the first nextn block
    auto mtp = std::make_unique<MtpBlock>();
    bind_block(b, hp, i, false, mtp->block);
    mtp->eh_proj = b.get(blk(i, "nextn.eh_proj.weight"), {2 * E, E});
    mtp->enorm = b.get(blk(i, "nextn.enorm.weight"), {E}, true, true);
    mtp->hnorm = b.get(blk(i, "nextn.hnorm.weight"), {E}, true, true);
    mtp->shared_head_norm = b.get(blk(i, "nextn.shared_head_norm.weight"), {E}, false, true);
    mtp->shared_head_head = b.get(blk(i, "nextn.shared_head_head.weight"), {E, Vocab}, false);
    mtp->embed_tokens = b.get(blk(i, "nextn.embed_tokens.weight"), {E, Vocab}, false);
    I.mtp = std::move(mtp);
  }
  HS_RETURN_IF_ERROR(b.status());
  return m;
}

Result<StateCapture> parse_state_capture(const std::string& name) {
  if (name == "f32") return StateCapture::F32;
  if (name == "f16") return StateCapture::F16;
  if (name == "updates") return StateCapture::Updates;
  return Status::errorf("state capture '{}' is not supported (f32, f16 or updates)", name);
}

Result<SequenceState> Qwen35Model::create_state(int64_t n_ctx, int max_capture, GgmlType kv_type,
                                                StateCapture capture) const {
  HS_RETURN_IF_ERROR(check_kv_cache_type(kv_type, hp_.head_dim));
  if (n_ctx <= 0) return Status::errorf("context length {} is invalid", n_ctx);
  SequenceState s;
  s.n_ctx = n_ctx;
  s.max_capture = std::max(0, max_capture);
  s.capture = capture;
  const int64_t kv_width = int64_t{hp_.n_head_kv} * hp_.head_dim;
  const int64_t C = hp_.gdn_channels(), hist = hp_.conv_kernel - 1;
  const int64_t ssm_size = int64_t{hp_.ssm_v_heads} * hp_.ssm_d * hp_.ssm_d;
  auto alloc = [&](size_t bytes) -> Result<void*> {
    HS_ASSIGN_OR_RETURN(Buffer b, backend_.alloc(bytes));
    backend_.fill_zero(b.data(), bytes);
    s.storage.push_back(b);
    return b.data();
  };
  auto make_kv = [&]() -> Result<KvLayer> {
    KvLayer kv;
    kv.type = kv_type;
    kv.capacity = n_ctx;
    kv.width = kv_width;
    kv.head_dim = hp_.head_dim;
    HS_ASSIGN_OR_RETURN(kv.k, alloc(static_cast<size_t>(n_ctx) * kv.row_bytes()));
    HS_ASSIGN_OR_RETURN(kv.v, alloc(static_cast<size_t>(n_ctx) * kv.row_bytes()));
    return kv;
  };
  s.kv.resize(hp_.n_layer);
  s.conv.assign(hp_.n_layer, nullptr);
  s.ssm.assign(hp_.n_layer, nullptr);
  s.conv_capture.assign(hp_.n_layer, nullptr);
  s.ssm_capture.assign(hp_.n_layer, nullptr);
  s.ssm_capture_f16.assign(hp_.n_layer, nullptr);
  s.ssm_updates.assign(hp_.n_layer, nullptr);
  const int64_t update_size = gdn_update_floats(hp_.ssm_k_heads, hp_.ssm_v_heads, hp_.ssm_d);
  for (int i = 0; i < hp_.n_layer; ++i) {
    if (!hp_.recurrent[i]) {
      HS_ASSIGN_OR_RETURN(s.kv[i], make_kv());
      continue;
    }
    HS_ASSIGN_OR_RETURN(void* conv, alloc(static_cast<size_t>(hist * C) * sizeof(float)));
    HS_ASSIGN_OR_RETURN(void* ssm, alloc(static_cast<size_t>(ssm_size) * sizeof(float)));
    s.conv[i] = static_cast<float*>(conv);
    s.ssm[i] = static_cast<float*>(ssm);
    if (s.max_capture > 0) {
      HS_ASSIGN_OR_RETURN(void* cc, alloc(static_cast<size_t>(s.max_capture * hist * C) * sizeof(float)));
      s.conv_capture[i] = static_cast<float*>(cc);
      const size_t slots = static_cast<size_t>(s.max_capture);
      switch (capture) {
        case StateCapture::F32: {
          HS_ASSIGN_OR_RETURN(void* sc, alloc(slots * ssm_size * sizeof(float)));
          s.ssm_capture[i] = static_cast<float*>(sc);
          break;
        }
        case StateCapture::F16: {
          HS_ASSIGN_OR_RETURN(void* sc, alloc(slots * ssm_size * sizeof(uint16_t)));
          s.ssm_capture_f16[i] = static_cast<uint16_t*>(sc);
          break;
        }
        case StateCapture::Updates: {
          HS_ASSIGN_OR_RETURN(void* su, alloc(slots * update_size * sizeof(float)));
          s.ssm_updates[i] = static_cast<float*>(su);
          break;
        }
      }
    }
  }
  if (impl_->mtp) {
    HS_ASSIGN_OR_RETURN(s.mtp_kv, make_kv());
  }
  return s;
}

void Qwen35Model::reset_state(SequenceState& s) const {
  const int64_t C = hp_.gdn_channels(), hist = hp_.conv_kernel - 1;
  const int64_t ssm_size = int64_t{hp_.ssm_v_heads} * hp_.ssm_d * hp_.ssm_d;
  for (int i = 0; i < hp_.n_layer; ++i) {
    if (!s.conv[i]) continue;
    backend_.fill_zero(s.conv[i], static_cast<size_t>(hist * C) * sizeof(float));
    backend_.fill_zero(s.ssm[i], static_cast<size_t>(ssm_size) * sizeof(float));
  }
}

void Qwen35Model::restore_captured(SequenceState& s, int slot, int verified) const {
  if (slot == verified - 1 && s.capture != StateCapture::Updates) return;  // the step's own final state
  const int64_t conv_size = int64_t{hp_.gdn_channels()} * (hp_.conv_kernel - 1);
  const int64_t ssm_size = int64_t{hp_.ssm_v_heads} * hp_.ssm_d * hp_.ssm_d;
  const size_t conv_bytes = static_cast<size_t>(conv_size) * sizeof(float);
  const size_t ssm_bytes = static_cast<size_t>(ssm_size) * sizeof(float);
  std::vector<Backend::CopyPart> copies;  // every layer's in one op (48 copies for a 9B)
  std::vector<Backend::GdnReplayPart> replays;
  const bool conv_final = slot == verified - 1;  // Updates after a whole accepted step: the conv is current
  for (int i = 0; i < hp_.n_layer; ++i) {
    if (!s.conv[i] || !s.conv_capture[i]) continue;
    if (!conv_final) copies.push_back({s.conv[i], s.conv_capture[i] + slot * conv_size, conv_bytes});
    if (s.ssm_updates[i]) {
      replays.push_back({s.ssm[i], s.ssm_updates[i]});
    } else if (s.ssm_capture_f16[i]) {
      backend_.f16_to_f32(s.ssm_capture_f16[i] + slot * ssm_size, s.ssm[i], ssm_size);
    } else {
      copies.push_back({s.ssm[i], s.ssm_capture[i] + slot * ssm_size, ssm_bytes});
    }
  }
  backend_.copy_many(copies.data(), copies.size());
  if (!replays.empty())
    backend_.gdn_replay(replays.data(), replays.size(), slot + 1, hp_.ssm_k_heads, hp_.ssm_v_heads, hp_.ssm_d);
}

Status Qwen35Model::reserve(int64_t max_tokens) {
  const int64_t qg = 2 * int64_t{hp_.n_head} * hp_.head_dim;
  int64_t widest = std::max<int64_t>({int64_t{hp_.n_embd} * 2, qg, hp_.n_ff, hp_.n_ff_shexp, hp_.n_ff_exp});
  for (const Block& b : impl_->blocks) widest = std::max(widest, b.gdn.in_proj.width);  // GDN stacked projections
  return impl_->reserve(backend_, max_tokens, hp_.n_embd, widest, 16);  // small: the shared expert gate
}

}  // namespace hyspec
