// Drafting with the model's own MTP (nextn) head: each committed row (target hidden h_p, next
// token t_{p+1}) goes through the head, which keeps its own KV in the sequence state; the last
// row's argmax is the first draft, and the head's own output hidden chains the next k-1 drafts.
#pragma once
#include "engine/spec/drafter.h"

namespace hyspec {

// The model must have an MTP head (Qwen35Model::has_mtp()). use_graphs: record the chained draft steps
// as graphs where the backend can (CUDA). draft_vocab > 0: drafts among the first draft_vocab ids only
// (the head's first rows; EngineConfig::draft_vocab).
Result<std::unique_ptr<Drafter>> make_mtp_drafter(Qwen35Model& model, int max_rows, bool use_graphs,
                                                  int64_t draft_vocab = 0);

}  // namespace hyspec
