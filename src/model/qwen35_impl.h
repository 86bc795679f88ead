// Internal to the qwen35 model: bound weights and the activation workspace.
#pragma once
#include <memory>
#include <vector>

#include "model/binder.h"
#include "model/qwen35.h"
#include "model/workspace.h"

namespace hyspec {

struct AttentionWeights {
  Weight attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm;
};
struct GdnWeights {
  // attn_qkv, attn_gate, ssm_beta, ssm_alpha: [n, C | V | Hv | Hv] from one (or a few) matmuls
  StackedProjection in_proj;
  Weight ssm_conv1d, ssm_dt_bias, ssm_a, ssm_norm, ssm_out;
};
struct FfnWeights {
  Weight ffn_gate, ffn_up, ffn_down;                                      // dense
  Weight ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;         // MoE routed
  Weight ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp, ffn_gate_inp_shexp;  // MoE shared expert
};
struct Block {
  bool recurrent = false;
  Weight attn_norm, post_attention_norm;
  AttentionWeights attn;
  GdnWeights gdn;
  FfnWeights ffn;
};
struct MtpBlock {
  Block block;
  Weight eh_proj, enorm, hnorm, shared_head_norm, shared_head_head, embed_tokens;
};

// The workspace (x, h, mix, t1..t4, small; [max_tokens, width] each) is the base.
struct Qwen35Model::Impl : StepWorkspace {
  std::vector<Block> blocks;
  std::unique_ptr<MtpBlock> mtp;
  Weight token_embd, output_norm, output;
};


}  // namespace hyspec
