// Qwen3.5 / Qwen3.6 hyperparameters as stored in GGUF (QWEN35.md, "Architectures and metadata").
#pragma once
#include <string>
#include <vector>

#include "format/gguf.h"
#include "util/status.h"

namespace hyspec {

// The attention geometry the target and the DFlash drafter share, stored under the same GGUF keys.
struct AttentionHparams {
  int n_embd = 0, n_ctx_train = 0;
  int n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  float rope_base = 1e7f, eps = 1e-6f;
};

// What a reader assumes for keys the file may leave out.
struct AttentionKeyDefaults {
  bool head_count_kv_required = true;  // else head_count
  double rope_freq_base = 1e7;
  bool rms_eps_required = false;       // else 1e-6
};

// {prefix}embedding_length, context_length (default 4096), attention.head_count, head_count_kv,
// key_length (default embd/heads), value_length (must equal key_length), rope.dimension_count
// (default key_length), rope.freq_base, attention.layer_norm_rms_epsilon; errors name the file and key.
Status read_attention_hparams(const GgufFile& f, const std::string& prefix, const AttentionKeyDefaults& defaults,
                              AttentionHparams& hp);
// Heads divisible into kv groups, an even rope dimension within the head; errors name `source`.
Status validate_attention_hparams(const AttentionHparams& hp, const std::string& source);

struct Qwen35Hparams : AttentionHparams {
  std::string arch;  // "qwen35" or "qwen35moe"
  bool moe = false;
  int n_layer = 0;   // trunk layers (block_count - nextn_predict_layers)
  int n_nextn = 0;   // trailing MTP blocks
  int n_ff = 0, n_vocab = 0;
  std::vector<int> rope_sections;
  // Gated DeltaNet
  int conv_kernel = 0, ssm_d = 0, ssm_k_heads = 0, ssm_v_heads = 0, ssm_inner = 0;
  std::vector<bool> recurrent;  // per trunk layer
  // MoE
  int n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;

  int gdn_channels() const { return 2 * ssm_k_heads * ssm_d + ssm_v_heads * ssm_d; }  // 2K + V
  int n_attention_layers() const;
  int n_recurrent_layers() const { return n_layer - n_attention_layers(); }
};

// Reads and validates every field; errors name the file and the key.
Result<Qwen35Hparams> read_qwen35_hparams(const GgufFile& f);

// Bytes of weights a one-token forward step reads, as stored in f: every trunk tensor and the output
// head, MoE expert tensors at the share a token routes to (n_expert_used / n_expert), not the MTP
// blocks (a target step does not run them) and not the token embedding (one row per token), unless
// the head reads it (tied embeddings). The floor of a decode step is this over the memory bandwidth.
double step_weight_bytes(const GgufFile& f, const Qwen35Hparams& hp);

}  // namespace hyspec
