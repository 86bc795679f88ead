// Prompt-lookup / n-gram drafting, model-free: find the most recent earlier occurrence of the
// longest suffix (n = max_ngram..min_ngram) of the sequence and propose what followed it.
// Wins on code edits, quoting and repetitive text; costs nothing when it finds no match.
#pragma once
#include "engine/spec/drafter.h"

namespace hyspec {

struct NgramOptions {
  int min_ngram = 2;
  int max_ngram = 4;
};

std::unique_ptr<Drafter> make_ngram_drafter(const NgramOptions& options = {});

// A model drafter and n-gram lookup side by side: both observe everything; each round proposes
// whichever of the two offers the longer draft (n-gram wins on repeated text, the model elsewhere).
std::unique_ptr<Drafter> make_longest_of(std::unique_ptr<Drafter> model, std::unique_ptr<Drafter> ngram);

// Longest-suffix lookup over `tokens`: up to max_k tokens of what followed the most recent match, a
// loop continued past the end as far as it has held (exposed for tests and for composing with model
// drafters).
std::vector<int32_t> ngram_lookup(const std::vector<int32_t>& tokens, int min_ngram, int max_ngram, int max_k);

}  // namespace hyspec
