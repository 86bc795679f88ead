// The sampler's access to a step's logits rows where they live (backend memory). Reading a whole row
// back and taking its softmax on the host cost a sampled token ~0.75 ms on an H100 (1 MB of a 248K
// vocabulary, 248K exps), a quarter of a decode step. Here the backend summarises the rows
// (Backend::logit_summary: max, softmax mass per chunk, how the tokens spread below the max) and the
// host reads back only what the sampling parameters need:
// - truncated sampling (top-k, top-p, min-p): the row's best tokens down to a threshold the summary
//   says covers the cut (Backend::select_logits), then Sampler::distribution_of_best;
// - temperature alone: the summary's chunk masses pick the chunk a draw lands in, and only that chunk
//   is read (inverse CDF in token order, as Sampler::draw walks such a distribution);
// - greedy: the backend's argmax;
// - penalties, or a summary that cannot decide: the whole row, as before.
// Every path draws from Sampler::distribution's distribution with the sampler's RNG, one uniform per
// draw.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"

namespace hyspec {

// Temperature alone (sampled, no top-k, top-p or min-p cut): the sampler's draws go by chunk
// (backend/chunk_draw.h), which a backend can also make on its own (Backend::draw_token).
bool draws_by_chunk(const SamplingParams& sp, int64_t n_vocab);
// Sampled under a top-k cut of at most TokenDraw::kMaxTopK tokens (min-p and top-p after it): the distribution
// is a function of the row's k best tokens alone, which a backend can find and draw from on its own
// (Backend::draw_top_k). Penalties aside (they need the history).
bool draws_top_k(const SamplingParams& sp, int64_t n_vocab);

class LogitRows {
 public:
  // logits: n rows of the vocabulary (backend memory); scratch: backend memory of scratch_bytes(n, V).
  LogitRows(Backend& be, Rows logits, void* scratch, Sampler& sampler);
  static size_t scratch_bytes(int64_t rows, int64_t n_vocab);

  // Row r, read back whole once (logprobs, the fallback path).
  const float* host_row(int64_t r);
  // Make row r's distribution under the sampler current; `history`: the tokens before this row's.
  void select(int64_t r, std::span<const int32_t> history);
  // A verify round under temperature alone (the chunk path, no penalties): the summaries of every row
  // and, for each row r < drafts.size(), the logit of drafts[r], in one read-back, so that p() of the
  // drafts costs no further round trip (each used to read its chunk, 16 KB). Does nothing under other
  // parameters.
  void prefetch_drafts(std::span<const int32_t> drafts);
  // The current distribution's probability of `id` (0 if truncated away).
  float p(int32_t id);
  // A draw from it; with exclude >= 0, from the residual without that token (speculative rejection),
  // which is `exclude` itself when nothing else is left.
  int32_t draw(int32_t exclude = -1);

  // How the last select() went (tests and profiling).
  enum class Path { Explicit, Candidates, Chunks };
  Path path() const { return path_; }

  static constexpr int32_t kMaxCandidates = 16384;

 private:
  const float* summary(int64_t r);
  float chunk_logit(int32_t id);
  int32_t draw_by_chunk(int32_t exclude);  // -1: the chunks cannot decide
  const std::vector<float>& chunk(int64_t c);

  Backend& be_;
  Rows logits_;
  Sampler& sampler_;
  int64_t V_;
  float* summary_dev_;
  int32_t* count_dev_;          // select_logits' count, then (a pad and) its picks
  SelectedLogit* picked_dev_;

  std::vector<std::vector<float>> host_rows_;  // [r] empty until read
  std::vector<float> summaries_;               // rows [0, summarized_) on the host
  int64_t summarized_ = 0;

  // The current row.
  int64_t row_ = -1;
  Path path_ = Path::Explicit;
  std::vector<TokenProb> dist_;  // Explicit / Candidates
  // Chunks: max m, its softmax normaliser Z and per-chunk masses (summary), chunks read so far.
  float m_ = 0;
  double z_ = 0;
  const float* chunk_mass_ = nullptr;
  std::vector<std::vector<float>> chunks_;
  float* staged_dev_;                            // prefetch_drafts' 16-byte pieces, after the summaries
  std::vector<std::pair<int32_t, float>> drafts_;  // [r]: (draft id, its logit), id -1: none
  std::pair<int32_t, float> draft_ = {-1, 0.0f};   // the current row's
};

}  // namespace hyspec
