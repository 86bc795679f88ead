// The layout of Backend::logit_summary's and select_logits' outputs, shared with the CUDA kernels (no other
// includes).
// C++17.
#pragma once
#include <cstdint>

namespace hyspec {

// What logit_summary writes for each row of C logits at inverse temperature inv_t (the sampler's
// view of a row it does not read back whole; engine/logit_rows.h), in floats:
//   [0]                        m: the row's largest logit (at least -FLT_MAX)
//   [chunk_at() + c]           sum of exp((l - m) * inv_t) over tokens c*kChunk .. (c+1)*kChunk - 1
//   [count_at(C) + b]          how many tokens fall in bucket b = min(kBuckets - 1, floor((m - l) * scale)),
//                              scale = inv_t * kPerNat: their probability is within exp(-b/8) ..
//                              exp(-(b+1)/8) of the best token's (counts are whole numbers in floats)
//   [mass_at(C) + b]           their sum of exp((l - m) * inv_t)
// Tokens whose logit is NaN or -inf count nowhere (probability 0). Sums are stored as f32, added in an
// order (and a precision) of the backend's choosing.
struct LogitSummary {
  static constexpr int64_t kChunk = 4096, kBuckets = 512;
  static constexpr float kPerNat = 8.0f;
  static constexpr int64_t chunks(int64_t cols) { return (cols + kChunk - 1) / kChunk; }
  static constexpr int64_t chunk_at() { return 1; }
  static constexpr int64_t count_at(int64_t cols) { return 1 + chunks(cols); }
  static constexpr int64_t mass_at(int64_t cols) { return 1 + chunks(cols) + kBuckets; }
  static constexpr int64_t floats(int64_t cols) { return 1 + chunks(cols) + 2 * kBuckets; }
};

// One draw that Backend::draw_token or draw_top_k makes on the backend (look-ahead sampling): the host writes
// the inputs before the op is enqueued, the op writes the token and status. The token comes first, so that
// feed_token can read it where it lies.
struct TokenDraw {
  static constexpr int32_t kDrawn = 0, kNoMass = 1;
  static constexpr int32_t kMaxTopK = 256;  // the largest top_k draw_top_k takes
  int32_t token;      // out: the drawn token; with kNoMass, the row's argmax
  int32_t status;     // out: kDrawn, or kNoMass (no finite mass to draw from: NaN or infinite logits)
  float temperature;  // in, > 0
  int32_t top_k;      // in, draw_top_k's cut: 1 .. kMaxTopK, below the row's width
  double uniform;     // in, [0, 1)
  float top_p;        // in, draw_top_k's cut after min-p: (0, 1], 1 off
  float min_p;        // in, draw_top_k's cut after top-k: [0, 1), 0 off
};

// A token select_logits picked: its id and its logit.
struct SelectedLogit {
  int32_t id;
  float logit;
};

}  // namespace hyspec
