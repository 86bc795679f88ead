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
      // What followed the match, up to max_k tokens of it. Where that runs into the end of the sequence
      // the text is a loop of period len - from ("a b a b" -> "a b a b ..."): the draft goes on around
      // it for as many tokens as the loop has already held (a long loop, as a model repeating itself,
      // drafts whole blocks; two repeats in passing draft a token or two).
      const int64_t from = start + n, period = len - from;
      int64_t held = 0;
      while (held < max_k && len - 1 - held - period >= 0 && tokens[len - 1 - held] == tokens[len - 1 - held - period])
        ++held;  // (the draft goes no further than max_k past the end)
      std::vector<int32_t> draft;
      for (int64_t i = 0; i < max_k && from + i < len + held; ++i)
        draft.push_back(from + i < len ? tokens[from + i] : draft[from + i - len]);
      return draft;
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

class LongestOfDrafter final : public Drafter {
 public:
  LongestOfDrafter(std::unique_ptr<Drafter> a, std::unique_ptr<Drafter> b) : a_(std::move(a)), b_(std::move(b)) {}
  std::string name() const override { return a_->name() + "+" + b_->name(); }
  DrafterNeeds needs() const override {
    DrafterNeeds n = a_->needs(), m = b_->needs();
    n.final_hidden = n.final_hidden || m.final_hidden;
    if (n.taps.empty()) n.taps = m.taps;
    return n;
  }
  int max_draft() const override { return std::max(a_->max_draft(), b_->max_draft()); }
  GraphStats graph_stats() const override {
    GraphStats s = a_->graph_stats();
    return s += b_->graph_stats();
  }
  Status reset(SequenceState& s) override {
    HS_RETURN_IF_ERROR(a_->reset(s));
    return b_->reset(s);
  }
  Status observe(const CommittedRows& rows) override {
    HS_RETURN_IF_ERROR(a_->observe(rows));
    return b_->observe(rows);
  }
  Result<std::vector<int32_t>> propose(int max_k) override {
    // The cheap lookup first: a long match makes the model's draft pass unnecessary.
    HS_ASSIGN_OR_RETURN(std::vector<int32_t> lookup, b_->propose(std::min(max_k, b_->max_draft())));
    if (static_cast<int>(lookup.size()) >= std::min(max_k, a_->max_draft())) return lookup;
    HS_ASSIGN_OR_RETURN(std::vector<int32_t> model, a_->propose(std::min(max_k, a_->max_draft())));
    return model.size() >= lookup.size() ? model : lookup;
  }

 private:
  std::unique_ptr<Drafter> a_, b_;
};

}  // namespace

std::unique_ptr<Drafter> make_longest_of(std::unique_ptr<Drafter> model, std::unique_ptr<Drafter> ngram) {
  return std::make_unique<LongestOfDrafter>(std::move(model), std::move(ngram));
}

std::unique_ptr<Drafter> make_ngram_drafter(const NgramOptions& options) {
  return std::make_unique<NgramDrafter>(options);
}

}  // namespace hyspec
