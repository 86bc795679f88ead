// Internal to the DFlash drafter: bound weights, workspace, and the loading steps that the GGUF
// (dflash.cpp) and HF (dflash_hf.cpp) paths share once both speak GGUF names.
#pragma once
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "model/binder.h"
#include "model/dflash.h"
#include "model/workspace.h"

namespace hyspec {

struct DflashLayer {
  Weight attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm;
  Weight ffn_norm, ffn_gate, ffn_up, ffn_down;
};

// The workspace (x, h, mix, t1..t4; [max_tokens, width] each) is the base.
struct DflashModel::Impl : StepWorkspace {
  std::vector<DflashLayer> layers;
  Weight fc, enc_output_norm, output_norm;
  Weight token_embd, output;  // the drafter's own, else the target's
  int64_t n_vocab_target = 0, n_vocab_draft = 0;
  std::vector<int32_t> d2t_host;    // draft id -> target id (empty: shared vocabulary)
  Buffer d2t;                       // the same in backend memory
  std::shared_ptr<void> keepalive;  // the HF path's mapped safetensors
};

// z-lab HF tensor name (without a leading "model.") -> the GGUF name llama.cpp's converter writes;
// empty when the tensor is not part of a plain DFlash drafter. Shared by load_hf and the converter.
std::string dflash_gguf_name(const std::string& hf);

struct DflashLoader {
  // Checks the hyperparameters for consistency (errors name `source`).
  static Status validate(const DflashHparams& hp, const std::string& source);
  // Every GGUF tensor name a plain DFlash drafter with these hparams may hold.
  static std::set<std::string> known_tensors(const DflashHparams& hp);
  // Binds the drafter's tensors (GGUF names) through b, checks them against the target, and
  // returns the model. d2t: draft id -> target id (empty without a reduced vocabulary).
  static Result<std::unique_ptr<DflashModel>> build(Backend& backend, const DflashHparams& hp, Binder& b,
                                                    const DflashTarget& target, std::vector<int32_t> d2t,
                                                    std::shared_ptr<void> keepalive, const std::string& source);
};

}  // namespace hyspec
