// Drafting with a DFlash block-diffusion drafter (DFLASH.md): the target's tapped-layer features of
// every committed position are injected into the drafter's own KV cache; one drafter forward over
// [pending, MASK x (B-1)] proposes a whole block.
#pragma once
#include "engine/spec/drafter.h"

namespace hyspec {

// Load the drafter (llama.cpp-converted GGUF, or a z-lab HF directory) against the target model.
// The weights are shared by every session's drafter.
// draft_vocab > 0: a drafter that borrows the target's head drafts among the first draft_vocab ids
// (EngineConfig::draft_vocab); one with its own head refuses it.
Result<std::shared_ptr<void>> load_dflash_weights(Qwen35Model& target, const std::string& path, int max_rows,
                                                  int64_t draft_vocab = 0);
// use_graphs: record the block's draft and the context injections as graphs where the backend can (CUDA).
Result<std::unique_ptr<Drafter>> make_dflash_drafter(Qwen35Model& target, const std::shared_ptr<void>& weights,
                                                     int max_rows, int64_t n_ctx, bool use_graphs = false);

}  // namespace hyspec
