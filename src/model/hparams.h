// Qwen3.5 / Qwen3.6 hyperparameters as stored in GGUF (QWEN35.md, "Architectures and metadata").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
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
// qk_norm_rope_store's arguments with this geometry filled in (heads, head and rope dims, eps, rope
// base; q_pitch = head_dim): the caller sets the rows, norm weights, positions and cache.
QkPrepArgs qk_prep_args(const AttentionHparams& hp);

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

// Bytes of weights one decode step reads, as stored in f (`hyspec info`, `hyspec bench`): every tensor
// once, but one row of the token embedding (all of it when there is no output.weight: the head is
// tied to it) and the expert tensors ("_exps.") at n_used of n_expert; the blocks from first_nextn on
// (the MTP head, which a target step does not run) counted apart. The floor of a decode step is
// `target` over the memory bandwidth.
struct DecodeWeightBytes {
  uint64_t target = 0, nextn = 0;
};
DecodeWeightBytes decode_weight_bytes(const GgufFile& f, int64_t first_nextn, int64_t n_expert, int64_t n_used);

}  // namespace hyspec
