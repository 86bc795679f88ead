// Qwen3.5 / Qwen3.6 (dense `qwen35` and MoE `qwen35moe`): weights bound from GGUF, per-sequence
// state, and the forward pass of the trunk and of the MTP (nextn) head, written once against
// backend.h. Tensor names follow the GGUF so a reader can grep from the file to the code.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "format/gguf.h"
#include "model/hparams.h"

namespace hyspec {

// What a verify step keeps of each token's GDN state, for the rollback to the accepted prefix:
//   F32      the state itself (lossless; d*d floats per v-head and token);
//   F16      the state as halves (half the bytes; a rollback restores rounded states);
//   Updates  the token's rank-1 update (its key, a coefficient per state column, its decay: ~1/d of a
//            state), the state left as it was; the rollback replays the kept updates, bit-identical
//            to an F32 capture, so lossless too.
enum class StateCapture { F32, F16, Updates };
Result<StateCapture> parse_state_capture(const std::string& name);  // "f32" | "f16" | "updates"

// Everything one sequence carries between steps, in backend memory.
struct SequenceState {
  int64_t n_ctx = 0;
  int max_capture = 0;                 // verify width the capture buffers hold
  StateCapture capture = StateCapture::F32;
  std::vector<KvLayer> kv;             // per trunk layer (empty for GDN layers)
  std::vector<float*> conv, ssm;       // per trunk layer (null for attention layers)
  std::vector<float*> conv_capture;    // per GDN layer: [max_capture, K-1, C] state after token i
  std::vector<float*> ssm_capture;     // per GDN layer: [max_capture, Hv, d, d] (F32 capture)
  std::vector<uint16_t*> ssm_capture_f16;  // the same as halves (F16 capture: half the bytes, lossy rollback)
  std::vector<float*> ssm_updates;     // or [max_capture, gdn_update_floats(..)] (Updates capture)
  KvLayer mtp_kv;                      // the MTP block's own cache (when the model has one)
  std::vector<Buffer> storage;
};

struct ForwardArgs {
  int64_t n = 0;                       // tokens in this step
  const int32_t* tokens = nullptr;     // backend memory [n]
  const int32_t* positions = nullptr;  // backend memory [n], consecutive
  bool gdn_chunked = false;            // prompt form of the GDN layers
  bool capture = false;                // write per-token GDN/conv state into capture slots 0..n-1
  Rows logits;                         // logits of the LAST logits.n_rows rows (n_rows 0: none)
  Rows final_hidden;                   // optional [n, n_embd]: hidden after output_norm (MTP input)
  Rows features;                       // optional [n, taps*n_embd]: inputs of the tapped layers (DFlash)
  std::vector<int> taps;               // layer ids whose input goes to `features` (n_layer = final, pre-norm)
  int64_t max_keys = 0;                // AttentionArgs::max_keys of the attention layers (0: the capacity)
};

struct MtpArgs {
  int64_t n = 0;
  Rows hidden;                         // [n, n_embd] target hidden after output_norm (or MTP's own, chained)
  const int32_t* tokens = nullptr;     // backend memory [n]: the token following each hidden row
  // backend memory [n]: the hidden row's own position (its KV slot). llama.cpp ropes at position+1;
  // RoPE is relative, so the logits are the same and the slots stay dense from 0.
  const int32_t* positions = nullptr;
  // logits of the last logits.n_rows rows, over the vocabulary's first logits.n_cols ids (all of it, or a
  // reduced draft vocabulary: the head's first rows)
  Rows logits;
  Rows out_hidden;                     // optional [n, n_embd]: the head's normed output hidden (for chaining)
  int64_t max_keys = 0;                // AttentionArgs::max_keys of the block's attention (0: the capacity)
};

struct LoadOptions {
  bool dequantize_to_f32 = false;  // every weight converted to F32 at load (kernel parity checks)
  bool load_mtp = true;            // bind the nextn block when present
};

class Qwen35Model {
 public:
  static Result<std::unique_ptr<Qwen35Model>> load(Backend& backend, const GgufFile& file, const LoadOptions& options);
  ~Qwen35Model();

  const Qwen35Hparams& hparams() const { return hp_; }
  bool has_mtp() const;
  Backend& backend() const { return backend_; }
  const Weight& token_embd() const;
  const Weight& output_norm() const;
  const Weight& output() const;

  // Allocate state for one sequence of up to n_ctx tokens, with capture room for verify steps of
  // up to max_capture tokens. KV type F32, F16, BF16 or Q8_0. With an F16 capture a rollback restores
  // rounded states, so speculative output is no longer bit-identical to plain decoding.
  Result<SequenceState> create_state(int64_t n_ctx, int max_capture, GgmlType kv_type,
                                     StateCapture capture = StateCapture::F32) const;
  void reset_state(SequenceState& s) const;  // empty sequence: zero conv and recurrent state
  // After a verify of `verified` tokens: the GDN/conv state becomes the one after token `slot` (the
  // last kept). Nothing to do when F32 or F16 states keep the last token; Updates always replays.
  void restore_captured(SequenceState& s, int slot, int verified) const;

  // Activation workspace for steps of up to max_tokens tokens (allocated once; pointers stable).
  Status reserve(int64_t max_tokens);
  int64_t reserved_tokens() const;

  Status forward(const ForwardArgs& args, SequenceState& state);
  Status forward_mtp(const MtpArgs& args, SequenceState& state);
  // The MTP head alone: logits (over its first logits.n_cols ids) of rows forward_mtp wrote as out_hidden.
  Status mtp_logits(Rows normed, Rows logits);

  struct Impl;  // bound weights and workspace (model/qwen35_impl.h)

 private:
  Qwen35Model(Backend& backend, Qwen35Hparams hp);
  Backend& backend_;
  Qwen35Hparams hp_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyspec
