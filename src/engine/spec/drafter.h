// The drafter interface: everything that proposes tokens for the target to verify (DFlash, MTP,
// n-gram). One instance per sequence. The session tells it what the target committed (observe)
// and asks it for up to k tokens to follow the pending token (propose).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/step_graphs.h"
#include "model/qwen35.h"
#include "util/status.h"

namespace hyspec {

// What a drafter needs the target to produce for every committed row.
struct DrafterNeeds {
  bool final_hidden = false;  // hidden after output_norm (MTP)
  std::vector<int> taps;      // inputs of these target layers (DFlash)
};

// Rows of the target's last forward that are now committed, at positions first_pos ... first_pos+n-1.
struct CommittedRows {
  int64_t first_pos = 0;
  int64_t n = 0;
  Rows hidden;                        // [n, n_embd] backend memory (when needs().final_hidden)
  Rows features;                      // [n, taps*n_embd] backend memory (when needs().taps)
  std::vector<int32_t> row_tokens;    // host, [n]: the token at each row
  std::vector<int32_t> next_tokens;   // host, [n]: the token after each row; the last is the pending token
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  virtual DrafterNeeds needs() const { return {}; }
  // Start a new sequence whose target state is `state` (the MTP head keeps its KV there).
  virtual Status reset(SequenceState& state) = 0;
  virtual Status observe(const CommittedRows& rows) = 0;
  // Up to max_k tokens to follow the pending token (may return fewer, or none).
  virtual Result<std::vector<int32_t>> propose(int max_k) = 0;
  // propose() without the read-back, where drafts_on_device(): how many, and where they lie in backend memory
  // (target ids, valid until the next propose or observe), so that the verify step can be fed from them and
  // the round read them back with the verify's argmaxes (one wait a round instead of two).
  struct OnDevice {
    const int32_t* ids = nullptr;
    int count = 0;
  };
  virtual bool drafts_on_device() const { return false; }
  virtual Result<OnDevice> propose_on_device(int /*max_k*/) {
    return Status::error("this drafter's proposals are made on the host");
  }
  // The most tokens one proposal can hold (DFlash: block_size - 1).
  virtual int max_draft() const { return 64; }
  // What its step graphs cost so far: a proposal that recorded one took longer than the next one will.
  virtual GraphStats graph_stats() const { return {}; }
};

enum class SpecMethod { None, Ngram, Mtp, Dflash };
Result<SpecMethod> parse_spec_method(const std::string& name);  // none | ngram | mtp | dflash
const char* spec_method_name(SpecMethod m);

}  // namespace hyspec
