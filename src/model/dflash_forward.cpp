// The DFlash drafter's two passes (DFLASH.md "What the drafter sees", "One draft step"), top to
// bottom, as backend ops over the workspace.
#include <cmath>

#include "model/dflash.h"
#include "model/dflash_impl.h"

namespace hyspec {

namespace {
// k_norm and RoPE on k (and q_norm and RoPE on q, when given), then k and v into the layer's cache.
QkPrepArgs qk_prep(const DflashHparams& hp, const DflashLayer& l, Rows q, Rows k, Rows v, const int32_t* positions,
                   const KvLayer& kv) {
  QkPrepArgs p = qk_prep_args(hp);
  p.q_in = p.q = q;
  p.k = k;
  p.v = v;
  p.q_norm = l.attn_q_norm.f32();
  p.k_norm = l.attn_k_norm.f32();
  p.positions = positions;
  p.kv = kv;
  return p;
}
}  // namespace

Status DflashModel::inject(const DflashInjectArgs& args, DflashState& st) {
  Impl& I = *impl_;
  const int64_t n = args.n, E = hp_.n_embd, D = hp_.head_dim, Hkv = hp_.n_head_kv;
  if (n <= 0 || n > I.max_tokens)
    return Status::errorf("DFlash inject of {} rows exceeds the reserved workspace of {}", n, I.max_tokens);
  if (args.features.n_cols != hp_.n_features() || args.features.n_rows < n)
    return Status::errorf("DFlash inject: features are [{}, {}], expected [{}, {}]", args.features.n_rows,
                          args.features.n_cols, n, hp_.n_features());
  if (st.kv.size() != I.layers.size()) return Status::error("DFlash inject: the state belongs to another drafter");
  Backend& be = backend_;
  // g = RMSNorm(fc · f) · enc.output_norm   [n, E]
  Rows fused(I.mix, n, E), g(I.x, n, E);
  be.matmul(I.fc, args.features.rows(0, n), fused);
  be.rms_norm(fused, I.enc_output_norm.f32(), E, hp_.eps, g);
  // Per layer, the context K/V: no attn_norm on g, k_norm and RoPE on K, V as projected.
  Rows k(I.t1, n, Hkv * D), v(I.t2, n, Hkv * D);
  for (size_t il = 0; il < I.layers.size(); ++il) {
    const DflashLayer& l = I.layers[il];
    const Backend::MatmulPart kv[] = {{&l.attn_k, k}, {&l.attn_v, v}};
    be.matmul_many(g, kv, 2);
    be.qk_norm_rope_store(qk_prep(hp_, l, Rows(), k, v, args.positions, st.kv[il]));
  }
  return Status::ok();
}

Status DflashModel::draft(const DflashDraftArgs& args, DflashState& st) {
  Impl& I = *impl_;
  const int64_t n = args.n, E = hp_.n_embd, D = hp_.head_dim, H = hp_.n_head, Hkv = hp_.n_head_kv, F = hp_.n_ff;
  if (n <= 0 || n > I.max_tokens)
    return Status::errorf("DFlash draft of {} tokens exceeds the reserved workspace of {}", n, I.max_tokens);
  const int64_t nl = args.logits.n_rows;
  if (nl > n) return Status::error("DFlash draft: more logits rows requested than block tokens");
  if (nl > 0 && args.logits.n_cols != I.n_vocab_draft)
    return Status::errorf("DFlash draft: logits have {} columns, the draft vocabulary has {}", args.logits.n_cols,
                          I.n_vocab_draft);
  if (st.kv.size() != I.layers.size()) return Status::error("DFlash draft: the state belongs to another drafter");
  Backend& be = backend_;
  Rows x(I.x, n, E), h(I.h, n, E), mix(I.mix, n, E);
  // Pre-norm layers as the target's blocks; each residual add runs fused with the norm that reads
  // its result (add_rms_norm): the next layer's attn_norm, or the output norm after the last layer.
  be.embed(I.token_embd, args.tokens, n, x);
  be.rms_norm(x, I.layers[0].attn_norm.f32(), E, hp_.eps, h);
  for (size_t il = 0; il < I.layers.size(); ++il) {
    const DflashLayer& l = I.layers[il];
    // Attention of the block over [injected context ; the block itself].
    Rows q(I.t1, n, H * D), k(I.t2, n, Hkv * D), v(I.t3, n, Hkv * D), att(I.t4, n, H * D);
    const Backend::MatmulPart qkv[] = {{&l.attn_q, q}, {&l.attn_k, k}, {&l.attn_v, v}};
    be.matmul_many(h, qkv, 3);
    be.qk_norm_rope_store(qk_prep(hp_, l, q, k, v, args.positions, st.kv[il]));
    AttentionArgs a;
    a.q = q;
    a.kv = st.kv[il];
    a.positions = args.positions;
    a.n_head = hp_.n_head;
    a.n_kv_head = hp_.n_head_kv;
    a.head_dim = hp_.head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(D));
    a.causal = hp_.causal;  // false: every block row sees the context and the whole block
    a.out = att;
    a.max_keys = args.max_keys;
    be.attention(a);
    be.matmul(l.attn_output, att, mix);
    be.add_rms_norm(x, mix, l.ffn_norm.f32(), E, hp_.eps, h);
    // SwiGLU FFN (one pass over gate and up where the backend fuses them: the same bits).
    Rows gate(I.t1, n, F), up(I.t2, n, F);
    if (!be.matmul_swiglu(l.ffn_gate, l.ffn_up, h, gate)) {
      be.matmul(l.ffn_gate, h, gate);
      be.matmul(l.ffn_up, h, up);
      be.swiglu(gate, up, gate);
    }
    be.matmul(l.ffn_down, gate, mix);
    if (il + 1 < I.layers.size()) be.add_rms_norm(x, mix, I.layers[il + 1].attn_norm.f32(), E, hp_.eps, h);
  }
  // The last layer's add, on the logits rows only: nothing reads x after the draft.
  if (nl == 0) return Status::ok();
  Rows normed = h.rows(0, nl);
  be.add_rms_norm(x.rows(n - nl, nl), mix.rows(n - nl, nl), I.output_norm.f32(), E, hp_.eps, normed);
  be.matmul(I.output, normed, args.logits);
  return Status::ok();
}

}  // namespace hyspec
