// The Qwen3.5 forward pass (QWEN35.md "Block", "Gated DeltaNet mixer", "Full-attention mixer",
// "MoE FFN", "MTP head"), top to bottom, as backend ops over the workspace.
#include <cmath>

#include "model/qwen35.h"
#include "model/qwen35_impl.h"

namespace hyspec {

namespace {

struct Ctx {
  Backend& be;
  const Qwen35Hparams& hp;
  Qwen35Model::Impl& I;
  int64_t n;
  int64_t max_keys = 0;  // AttentionArgs::max_keys
  Rows buf(float* p, int64_t cols) const { return Rows(p, n, cols); }
};

// x [n, E] normed input -> out [n, E]
// capture: each token's conv window and GDN state (or update) into the state's capture slots.
void gdn_mixer(const Ctx& c, const GdnWeights& w, Rows x, SequenceState& st, int layer, bool capture, bool chunked,
               Rows out) {
  float* conv_state = st.conv[layer];
  float* conv_capture = capture ? st.conv_capture[layer] : nullptr;
  const Qwen35Hparams& hp = c.hp;
  const int64_t d = hp.ssm_d, K = int64_t{hp.ssm_k_heads} * d, V = int64_t{hp.ssm_v_heads} * d;
  const int64_t C = hp.gdn_channels();
  Rows in = c.buf(c.I.t1, w.in_proj.width), conv = c.buf(c.I.t3, C), o = c.buf(c.I.t4, V);
  w.in_proj.matmul(c.be, x, in);
  Rows qkv = w.in_proj.part(in, 0), z = w.in_proj.part(in, 1), beta = w.in_proj.part(in, 2),
       alpha = w.in_proj.part(in, 3);
  c.be.causal_conv_silu(qkv, w.ssm_conv1d.f32(), hp.conv_kernel, conv_state, conv_capture, conv);
  GdnArgs g;
  g.q = conv.cols(0, K);
  g.k = conv.cols(K, K);
  g.v = conv.cols(2 * K, V);
  g.beta_logit = beta;
  g.alpha = alpha;
  g.ssm_a = w.ssm_a.f32();
  g.dt_bias = w.ssm_dt_bias.f32();
  g.n_k_heads = hp.ssm_k_heads;
  g.n_v_heads = hp.ssm_v_heads;
  g.head_dim = hp.ssm_d;
  g.eps = hp.eps;
  g.state = st.ssm[layer];
  if (capture) {
    g.capture = st.ssm_capture[layer];
    g.capture_f16 = st.ssm_capture_f16[layer];
    g.updates = st.ssm_updates[layer];
  }
  g.chunked = chunked;
  g.out = o;
  c.be.gated_delta_net(g);
  // The norm writes over the conv's output (read by the recurrence only), not in place: CUDA folds the
  // norm into the one-token matvec that reads it, whose blocks read o while others store the norm's output.
  Rows normed = c.buf(c.I.t3, V);
  c.be.gated_rms_norm(o, z, w.ssm_norm.f32(), d, hp.eps, normed);
  c.be.matmul(w.ssm_out, normed, out);
}

void attention_mixer(const Ctx& c, const AttentionWeights& w, Rows x, const KvLayer& kv, const int32_t* positions,
                     Rows out) {
  const Qwen35Hparams& hp = c.hp;
  const int64_t D = hp.head_dim, H = hp.n_head, Hkv = hp.n_head_kv, n = c.n;
  Rows qg = c.buf(c.I.t1, 2 * H * D), q = c.buf(c.I.t2, H * D), k = c.buf(c.I.t3, Hkv * D),
       v = c.buf(c.I.t3 + n * Hkv * D, Hkv * D), att = c.buf(c.I.t4, H * D);
  const Backend::MatmulPart qkv[] = {{&w.attn_q, qg}, {&w.attn_k, k}, {&w.attn_v, v}};
  c.be.matmul_many(x, qkv, 3);
  // attn_q rows hold, per head, D query values then D gate values.
  QkPrepArgs p = qk_prep_args(hp);
  p.q_in = qg;
  p.q_pitch = 2 * D;
  p.q = q;
  p.k = k;
  p.v = v;
  p.q_norm = w.attn_q_norm.f32();
  p.k_norm = w.attn_k_norm.f32();
  p.positions = positions;
  p.kv = kv;
  c.be.qk_norm_rope_store(p);
  AttentionArgs a;
  a.q = q;
  a.kv = kv;
  a.positions = positions;
  a.n_head = hp.n_head;
  a.n_kv_head = hp.n_head_kv;
  a.head_dim = hp.head_dim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.causal = true;
  a.out = att;
  a.max_keys = c.max_keys;
  c.be.attention(a);
  // The gated output over q (read by the attention only), not in place: as the GDN mixer's norm.
  Rows att_heads(att.data, n * H, D), gate_parts(qg.data + D, n * H, D, 2 * D), gated = c.buf(c.I.t2, H * D);
  c.be.sigmoid_mul(att_heads, gate_parts, Rows(gated.data, n * H, D));
  c.be.matmul(w.attn_output, gated, out);
}

void ffn(const Ctx& c, const FfnWeights& w, Rows x, Rows out) {
  const Qwen35Hparams& hp = c.hp;
  if (!hp.moe) {
    Rows g = c.buf(c.I.t1, hp.n_ff), u = c.buf(c.I.t2, hp.n_ff);
    if (!c.be.matmul_swiglu(w.ffn_gate, w.ffn_up, x, g)) {
      c.be.matmul(w.ffn_gate, x, g);
      c.be.matmul(w.ffn_up, x, u);
      c.be.swiglu(g, u, g);
    }
    c.be.matmul(w.ffn_down, g, out);
    return;
  }
  MoeArgs m;
  m.x = x;
  m.router = &w.ffn_gate_inp;
  m.gate_exps = &w.ffn_gate_exps;
  m.up_exps = &w.ffn_up_exps;
  m.down_exps = &w.ffn_down_exps;
  m.top_k = hp.n_expert_used;
  m.out = out;
  const bool shared = w.ffn_gate_shexp.present();
  Rows gate = c.buf(c.I.small, 1);
  if (shared) m.shared_gate = &w.ffn_gate_inp_shexp, m.shared_gate_out = gate;  // the shared expert's gate
  // The shared expert beside the routed ones (on CUDA a second stream): it reads x and writes t1..t3,
  // which moe_ffn does not touch; its latency-bound matvecs then overlap the router's chain.
  Rows s = c.buf(c.I.t3, hp.n_embd);
  if (shared) {
    c.be.begin_side();
    Rows g = c.buf(c.I.t1, hp.n_ff_shexp), u = c.buf(c.I.t2, hp.n_ff_shexp);
    if (!c.be.matmul_swiglu(w.ffn_gate_shexp, w.ffn_up_shexp, x, g)) {
      c.be.matmul(w.ffn_gate_shexp, x, g);
      c.be.matmul(w.ffn_up_shexp, x, u);
      c.be.swiglu(g, u, g);
    }
    c.be.matmul(w.ffn_down_shexp, g, s);
    c.be.end_side();
  }
  c.be.moe_ffn(m);
  if (shared) {
    c.be.join_side();
    c.be.add_sigmoid_scaled(s, gate, out);
  }
}

// One pre-norm block: x += Mixer(attn_norm(x)); x += FFN(post_attention_norm(x)). Each residual add
// runs fused with the norm that reads its result (add_rms_norm), so the block takes h = attn_norm(x)
// from its caller and leaves its last add to the caller too: on return mix holds FFN(...), and the
// block's output is x + mix, for the caller to add while it applies the next norm.
void block(const Ctx& c, const Block& b, int layer, SequenceState& st, const int32_t* positions, bool chunked,
           bool capture, const KvLayer* kv_override) {
  const int64_t E = c.hp.n_embd;
  Rows x = c.buf(c.I.x, E), h = c.buf(c.I.h, E), mix = c.buf(c.I.mix, E);
  if (b.recurrent) {
    gdn_mixer(c, b.gdn, h, st, layer, capture, chunked, mix);
  } else {
    attention_mixer(c, b.attn, h, kv_override ? *kv_override : st.kv[layer], positions, mix);
  }
  c.be.add_rms_norm(x, mix, b.post_attention_norm.f32(), E, c.hp.eps, h);
  ffn(c, b.ffn, h, mix);
}

}  // namespace

Status Qwen35Model::forward(const ForwardArgs& args, SequenceState& st) {
  Impl& I = *impl_;
  const int64_t n = args.n, E = hp_.n_embd;
  if (n <= 0 || n > I.max_tokens)
    return Status::errorf("forward of {} tokens exceeds the reserved workspace of {}", n, I.max_tokens);
  if (args.capture && n > st.max_capture)
    return Status::errorf("capture of {} tokens exceeds the state's capture room of {}", n, st.max_capture);
  if (args.logits.n_rows > n) return Status::error("more logits rows requested than tokens");
  Ctx c{backend_, hp_, I, n, args.max_keys};
  Rows x = c.buf(I.x, E), h = c.buf(I.h, E), mix = c.buf(I.mix, E);
  backend_.embed(I.token_embd, args.tokens, n, x);
  auto tap = [&](int layer) {
    for (size_t t = 0; t < args.taps.size(); ++t)
      if (args.taps[t] == layer) backend_.copy_rows(x, args.features.cols(static_cast<int64_t>(t) * E, E));
  };
  backend_.rms_norm(x, I.blocks[0].attn_norm.f32(), E, hp_.eps, h);
  for (int il = 0; il < hp_.n_layer; ++il) {
    tap(il);
    block(c, I.blocks[il], il, st, args.positions, args.gdn_chunked, args.capture, nullptr);
    if (il + 1 < hp_.n_layer) backend_.add_rms_norm(x, mix, I.blocks[il + 1].attn_norm.f32(), E, hp_.eps, h);
  }
  // The last block's add, fused with the output norm on the rows that need it: all of them for
  // final_hidden, else the last nl (the logits rows); the others get the plain add (taps read x).
  const int64_t nl = args.logits.n_rows;
  if (args.final_hidden.data) {
    backend_.add_rms_norm(x, mix, I.output_norm.f32(), E, hp_.eps, args.final_hidden);
    tap(hp_.n_layer);
    if (nl > 0) backend_.matmul(I.output, args.final_hidden.rows(n - nl, nl), args.logits);
    return Status::ok();
  }
  const int64_t n_plain = n - nl;
  if (n_plain > 0) backend_.add(x.rows(0, n_plain), mix.rows(0, n_plain), x.rows(0, n_plain));
  if (nl > 0) {
    Rows hl = h.rows(0, nl);
    backend_.add_rms_norm(x.rows(n_plain, nl), mix.rows(n_plain, nl), I.output_norm.f32(), E, hp_.eps, hl);
    backend_.matmul(I.output, hl, args.logits);
  }
  tap(hp_.n_layer);
  return Status::ok();
}

Status Qwen35Model::forward_mtp(const MtpArgs& args, SequenceState& st) {
  Impl& I = *impl_;
  if (!I.mtp) return Status::error("this model has no MTP (nextn) head");
  const int64_t n = args.n, E = hp_.n_embd;
  if (n <= 0 || n > I.max_tokens)
    return Status::errorf("MTP step of {} tokens exceeds the reserved workspace of {}", n, I.max_tokens);
  const MtpBlock& m = *I.mtp;
  Ctx c{backend_, hp_, I, n, args.max_keys};
  Rows x = c.buf(I.x, E), h = c.buf(I.h, E), mix = c.buf(I.mix, E);
  // x = eh_proj · [enorm(embed(tok)) ; hnorm(hidden)]  (t4 holds the concatenation)
  Rows cat = c.buf(I.t4, 2 * E);
  const Weight& emb = m.embed_tokens.present() ? m.embed_tokens : I.token_embd;
  backend_.embed(emb, args.tokens, n, h);
  backend_.rms_norm(h, m.enorm.f32(), E, hp_.eps, cat.cols(0, E));
  backend_.rms_norm(args.hidden, m.hnorm.f32(), E, hp_.eps, cat.cols(E, E));
  backend_.matmul(m.eh_proj, cat, x);
  backend_.rms_norm(x, m.block.attn_norm.f32(), E, hp_.eps, h);
  block(c, m.block, hp_.n_layer, st, args.positions, false, false, &st.mtp_kv);
  const Weight& norm = m.shared_head_norm.present() ? m.shared_head_norm : I.output_norm;
  Rows normed = args.out_hidden.data ? args.out_hidden : h;
  backend_.add_rms_norm(x, mix, norm.f32(), E, hp_.eps, normed);  // the block's last add
  const int64_t nl = args.logits.n_rows;
  return nl > 0 ? mtp_logits(normed.rows(n - nl, nl), args.logits) : Status::ok();
}

Status Qwen35Model::mtp_logits(Rows normed, Rows logits) {
  Impl& I = *impl_;
  if (!I.mtp) return Status::error("this model has no MTP (nextn) head");
  const Weight& head = I.mtp->shared_head_head.present() ? I.mtp->shared_head_head : I.output;
  if (logits.n_cols <= 0 || logits.n_cols > head.n_out)
    return Status::errorf("MTP logits of {} columns for a head of {} rows", logits.n_cols, head.n_out);
  if (logits.n_rows != normed.n_rows || normed.n_cols != hp_.n_embd)
    return Status::errorf("MTP logits of {} rows for {} rows of {} columns", logits.n_rows, normed.n_rows, normed.n_cols);
  Weight rows = head;  // the head's first logits.n_cols rows: a reduced draft vocabulary
  rows.n_out = logits.n_cols;
  backend_.matmul(rows, normed, logits);
  return Status::ok();
}

}  // namespace hyspec
