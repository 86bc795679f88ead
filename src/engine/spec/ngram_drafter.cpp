#include "engine/spec/ngram_drafter.h"

#include <algorithm>

namespace hyspec {

std::vector<int32_t> ngram_lookup(const std::vector<int32_t>& tokens, int min_ngram, int max_ngram, int max_k) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  for (int n = std::min<int64_t>(max_ngram, len - 1); n >= min_ngram; --n) {
    const int32_t* suffix = tokens.data() + len - n;
    // Most recent earlier match first: recent context predicts best.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix, suffix + n, tokens.data() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min<int64_t>(max_k, len - from);
      if (count <= 0) continue;
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

namespace {

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(const NgramOptions& o) : options_(o) {}
  std::string name() const override { return "ngram"; }
  Status reset(SequenceState&) override {
    tokens_.clear();
    return Status::ok();
  }
  // tokens_ mirrors the sequence: every committed token, then the pending one.
  Status observe(const CommittedRows& rows) override {
    tokens_.resize(static_cast<size_t>(std::min<int64_t>(rows.first_pos, static_cast<int64_t>(tokens_.size()))));
    tokens_.insert(tokens_.end(), rows.row_tokens.begin(), rows.row_tokens.end());
    if (!rows.next_tokens.empty()) tokens_.push_back(rows.next_tokens.back());
    return Status::ok();
  }
  Result<std::vector<int32_t>> propose(int max_k) override {
    return ngram_lookup(tokens_, options_.min_ngram, options_.max_ngram, max_k);
  }

 private:
  NgramOptions options_;
  std::vector<int32_t> tokens_;
};

}  // namespace

std::unique_ptr<Drafter> make_ngram_drafter(const NgramOptions& options) {
  return std::make_unique<NgramDrafter>(options);
}

}  // namespace hyspec
