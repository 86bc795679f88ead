// The DFlash block-diffusion drafter (DFLASH.md): a small Qwen3-style transformer that drafts a whole
// block of tokens in one pass, conditioned on hidden features of the target. Loaded from the GGUF
// llama.cpp's converter writes (architecture `dflash`) or from z-lab's HF directory; the forward is
// written once against backend.h. Tensor names follow the GGUF.
//
// Per sequence:  inject(features of committed positions)  ->  draft([last, mask x (B-1)])  -> logits.
// The drafter's KV cache holds, per layer, the injected context K/V at the committed positions;
// a draft writes its block's own K/V at positions n..n+B-1, where the next inject overwrites them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "format/gguf.h"
#include "model/hparams.h"

namespace hyspec {

class Qwen35Model;

struct DflashHparams : AttentionHparams {
  int n_layer = 0, n_ff = 0;
  bool causal = false;  // attention inside the block; false for every published drafter
  int block_size = 16;  // tokens per draft: [last committed token, mask x (block_size - 1)]
  int32_t mask_token_id = -1;
  // Target layer ids whose INPUT is a feature (the residual stream after layer id-1), in feature
  // order: pass them as ForwardArgs.taps. GGUF `dflash.target_layers`; HF target_layer_ids + 1.
  std::vector<int> target_layers;
  int n_embd_target = 0;  // target hidden size

  int n_features() const { return static_cast<int>(target_layers.size()) * n_embd_target; }  // fc input
};

// What the drafter borrows from its target unless it ships its own: views, so the target's weights
// must outlive the drafter.
struct DflashTarget {
  Weight token_embd;  // [n_embd, n_vocab]
  Weight output;      // [n_embd, n_vocab] LM head (the target's token_embd when tied), or its first rows
  int n_layer = 0;    // target trunk layers: tap ids must lie in 0..n_layer

  static DflashTarget of(const Qwen35Model& target);
};

// The drafter's per-sequence state: its own KV cache, in backend memory.
struct DflashState {
  int64_t n_ctx = 0;
  std::vector<KvLayer> kv;  // per drafter layer
  std::vector<Buffer> storage;
};

struct DflashInjectArgs {
  int64_t n = 0;
  Rows features;                       // [n, n_features()]: the target's ForwardArgs.features rows
  const int32_t* positions = nullptr;  // backend memory [n]: the committed positions of those rows
};

struct DflashDraftArgs {
  int64_t n = 0;                       // block length (block_size, or fewer near the context end)
  const int32_t* tokens = nullptr;     // backend memory [n]: [last committed token, mask, mask, ...]
  const int32_t* positions = nullptr;  // backend memory [n]: consecutive, the first = context length
  Rows logits;                         // [rows, n_vocab_draft()] of the LAST logits.n_rows block rows
  int64_t max_keys = 0;                // AttentionArgs::max_keys of the layers' attention (0: the capacity)
};

struct DflashLoadOptions {
  bool dequantize_to_f32 = false;  // every weight converted to F32 at load (kernel parity checks)
};

class DflashModel {
 public:
  // From llama.cpp's `dflash` GGUF (which must outlive the model). Rejects the DFlash2 and DSpark
  // variants and every tensor or key this implementation would ignore.
  static Result<std::unique_ptr<DflashModel>> load(Backend& backend, const GgufFile& file, const DflashTarget& target,
                                                   const DflashLoadOptions& options = {});
  // From z-lab's HF directory (config.json with dflash_config + model.safetensors); the model keeps
  // the mapping. Computes what the GGUF path computes for the same checkpoint.
  static Result<std::unique_ptr<DflashModel>> load_hf(Backend& backend, const std::string& dir,
                                                      const DflashTarget& target,
                                                      const DflashLoadOptions& options = {});
  ~DflashModel();

  const DflashHparams& hparams() const { return hp_; }
  Backend& backend() const { return backend_; }

  // Logit columns of a draft: the target vocabulary, or the drafter's reduced one when it ships a
  // d2t map (its own LM head over a subset of the target's tokens).
  int64_t n_vocab_draft() const;
  int64_t n_vocab_target() const;
  bool has_d2t() const;
  // Target token id of a draft-vocabulary id (identity without d2t); -1 when out of range.
  int32_t target_token(int32_t draft_id) const;
  // The d2t map in backend memory [n_vocab_draft] (null without d2t): device-side draft -> target ids.
  const int32_t* d2t() const;
  // Host: scatter draft-space logits [rows, n_vocab_draft] into target-space rows [rows, n_vocab_target]
  // (-inf for target tokens the drafter cannot propose), as llama.cpp does; a copy without d2t.
  void logits_to_target(const float* draft, int64_t rows, float* target) const;

  // State for one sequence of up to n_ctx positions (context plus one block). KV type F32, F16, BF16 or Q8_0.
  Result<DflashState> create_state(int64_t n_ctx, GgmlType kv_type) const;
  // Activation workspace for inject/draft calls of up to max_tokens rows (allocated once).
  Status reserve(int64_t max_tokens);
  int64_t reserved_tokens() const;

  // g = RMSNorm(fc·f)·enc_norm; per layer K = RoPE(RMSNorm(W_k g)·k_norm), V = W_v g stored at positions.
  Status inject(const DflashInjectArgs& args, DflashState& state);
  // One block: embeddings, the layers (the block attends to the cache up to its last position,
  // non-causally unless hparams().causal), the final norm and the LM head.
  Status draft(const DflashDraftArgs& args, DflashState& state);

  struct Impl;  // bound weights and workspace (model/dflash_impl.h)

 private:
  friend struct DflashLoader;
  DflashModel(Backend& backend, DflashHparams hp);
  Backend& backend_;
  DflashHparams hp_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyspec
