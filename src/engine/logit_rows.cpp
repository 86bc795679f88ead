#include "engine/logit_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/chunk_draw.h"

namespace hyspec {

namespace {
using S = LogitSummary;

size_t summary_floats(int64_t rows, int64_t n_vocab) { return static_cast<size_t>(rows * S::floats(n_vocab)); }
// prefetch_drafts' pieces right after the summaries (one read-back takes both), 4 floats per row.
size_t staged_floats(int64_t rows) { return static_cast<size_t>(4 * rows); }
// Where the selection's count starts: after the summaries and staged pieces, 8-byte aligned (the picks
// follow it).
size_t selection_at(int64_t rows, int64_t n_vocab) {
  return ((summary_floats(rows, n_vocab) + staged_floats(rows)) * sizeof(float) + 7) / 8 * 8;
}
}  // namespace

// Scratch: the summaries, the staged pieces, then the selection's count (and a pad) right before its
// picks, so that one read-back fetches both.
size_t LogitRows::scratch_bytes(int64_t rows, int64_t n_vocab) {
  return selection_at(rows, n_vocab) + (1 + static_cast<size_t>(kMaxCandidates)) * sizeof(SelectedLogit);
}

LogitRows::LogitRows(Backend& be, Rows logits, void* scratch, Sampler& sampler)
    : be_(be), logits_(logits), sampler_(sampler), V_(logits.n_cols) {
  summary_dev_ = static_cast<float*>(scratch);
  count_dev_ = reinterpret_cast<int32_t*>(static_cast<char*>(scratch) + selection_at(logits.n_rows, V_));
  picked_dev_ = reinterpret_cast<SelectedLogit*>(count_dev_) + 1;
  staged_dev_ = summary_dev_ + summary_floats(logits.n_rows, V_);
  host_rows_.resize(static_cast<size_t>(logits.n_rows));
}

void LogitRows::prefetch_drafts(std::span<const int32_t> drafts) {
  const SamplingParams& sp = sampler_.params();
  if (sp.greedy() || sp.has_penalties() || !draws_by_chunk(sp, V_) || !summaries_.empty()) return;
  const int64_t rows = std::min<int64_t>(static_cast<int64_t>(drafts.size()), logits_.n_rows);
  be_.logit_summary(logits_, 1.0f / sp.temperature, summary_dev_);
  // Each draft's logit in the 16-byte piece around it (within its row), so the copies stay whole
  // aligned words where the rows are.
  std::vector<Backend::CopyPart> copies;
  std::vector<int64_t> at(static_cast<size_t>(rows), -1);  // the draft's index in its row's piece
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t d = drafts[static_cast<size_t>(r)];
    if (d < 0 || d >= V_) continue;
    const int64_t first = std::min<int64_t>(d / 4 * 4, std::max<int64_t>(0, V_ - 4));
    const size_t bytes = static_cast<size_t>(std::min<int64_t>(4, V_)) * sizeof(float);
    copies.push_back({staged_dev_ + 4 * r, logits_.row(r) + first, bytes});
    at[static_cast<size_t>(r)] = d - first;
  }
  be_.copy_many(copies.data(), copies.size());
  const size_t summary = summary_floats(logits_.n_rows, V_);
  std::vector<float> host(summary + static_cast<size_t>(4 * rows));
  be_.download(host.data(), summary_dev_, host.size() * sizeof(float));
  summaries_.assign(host.begin(), host.begin() + static_cast<std::ptrdiff_t>(summary));
  drafts_.assign(static_cast<size_t>(logits_.n_rows), {-1, 0.0f});
  for (int64_t r = 0; r < rows; ++r) {
    const size_t i = static_cast<size_t>(r);
    if (at[i] >= 0) drafts_[i] = {drafts[i], host[summary + 4 * i + static_cast<size_t>(at[i])]};
  }
}

bool draws_by_chunk(const SamplingParams& sp, int64_t n_vocab) {
  return !sp.greedy() && !(sp.top_k > 0 && sp.top_k < n_vocab) && sp.top_p >= 1.0f && sp.min_p <= 0.0f;
}

bool draws_top_k(const SamplingParams& sp, int64_t n_vocab) {
  return !sp.greedy() && sp.top_k > 0 && sp.top_k < n_vocab && sp.top_k <= TokenDraw::kMaxTopK;
}

const float* LogitRows::host_row(int64_t r) {
  std::vector<float>& h = host_rows_[static_cast<size_t>(r)];
  if (h.empty()) {
    h.resize(static_cast<size_t>(V_));
    be_.download(h.data(), logits_.row(r), h.size() * sizeof(float));
  }
  return h.data();
}

const float* LogitRows::summary(int64_t r) {
  if (summaries_.empty()) {  // every row at once: a verify round reads them in order
    be_.logit_summary(logits_, 1.0f / sampler_.params().temperature, summary_dev_);
    summaries_.resize(summary_floats(logits_.n_rows, V_));
    be_.download(summaries_.data(), summary_dev_, summaries_.size() * sizeof(float));
  }
  return summaries_.data() + r * S::floats(V_);
}

void LogitRows::select(int64_t r, std::span<const int32_t> history) {
  row_ = r;
  draft_ = {-1, 0.0f};
  chunks_.clear();
  dist_.clear();
  const SamplingParams& sp = sampler_.params();
  const int n_vocab = static_cast<int>(V_);
  auto whole_row = [&] {
    path_ = Path::Explicit;
    sampler_.distribution(host_row(r), n_vocab, history, dist_);
  };
  const bool penalties = sp.has_penalties() && !history.empty();
  if (sp.greedy() && !penalties) {  // the row's argmax (first on ties), on the backend: 4 bytes read back
    int32_t best = 0;
    be_.argmax(logits_.rows(r, 1), count_dev_);
    be_.download(&best, count_dev_, sizeof(best));
    path_ = Path::Explicit;
    dist_.push_back({best, 1.0f});
    return;
  }
  if (sp.greedy() || penalties) return whole_row();
  const float* s = summary(r);
  const float m = s[0];
  const double z = chunk_total(s + S::chunk_at(), S::chunks(V_));
  if (!chunk_row_drawable(ChunkedRow{m, s + S::chunk_at(), S::chunks(V_), V_, z, sp.temperature})) return whole_row();
  const bool top_k = sp.top_k > 0 && sp.top_k < n_vocab;
  if (draws_by_chunk(sp, V_)) {  // draws by chunk
    path_ = Path::Chunks;
    m_ = m;
    z_ = z;
    chunk_mass_ = s + S::chunk_at();
    chunks_.resize(static_cast<size_t>(S::chunks(V_)));
    if (static_cast<size_t>(r) < drafts_.size()) draft_ = drafts_[static_cast<size_t>(r)];
    return;
  }
  // The bucket whose tokens (and all better ones) surely hold the cut; one bucket of margin where the
  // summary's float sums or the bucket edges could mislead. With top-k, its k tokens: the softmax
  // that min-p and top-p read is over them.
  const float* count = s + S::count_at(V_);
  const float* mass = s + S::mass_at(V_);
  int64_t cut = S::kBuckets - 1;
  double cum_count = 0, cum_mass = 0;
  for (int64_t b = 0; b < S::kBuckets; ++b) {
    cum_count += count[b];
    cum_mass += mass[b];
    if (top_k && cum_count >= sp.top_k) cut = std::min(cut, b);
    if (!top_k && sp.top_p < 1.0f && cum_mass >= sp.top_p * z) cut = std::min(cut, b + 1);
  }
  if (!top_k && sp.min_p > 0.0f)
    cut = std::min(cut, static_cast<int64_t>(-std::log(sp.min_p) * S::kPerNat) + 1);
  double selected = 0;  // the tokens the threshold below takes, but for rounding at its edge
  for (int64_t b = 0; b <= std::min(cut + 1, S::kBuckets - 1); ++b) selected += count[b];
  if (cut >= S::kBuckets - 1 || selected > kMaxCandidates) return whole_row();
  // Bucket b holds (m - l) * scale in [b, b + 1); the threshold sits a bucket lower, so rounding in
  // either computation cannot drop a token of bucket `cut`.
  const float scale = (1.0f / sp.temperature) * S::kPerNat;
  const float threshold = m - static_cast<float>(cut + 2) / scale;
  be_.select_logits(logits_, r, threshold, kMaxCandidates, count_dev_, picked_dev_);
  // The count and the picks the histogram expects in one read-back; more only when rounding at the
  // threshold took more.
  const int32_t expected = static_cast<int32_t>(std::min<double>(selected + 16, kMaxCandidates));
  std::vector<SelectedLogit> got(static_cast<size_t>(expected) + 1);  // [0]: the count (and a pad)
  be_.download(got.data(), count_dev_, got.size() * sizeof(SelectedLogit));
  int32_t n = 0;
  std::memcpy(&n, got.data(), sizeof(n));
  if (n > kMaxCandidates || n <= 0) return whole_row();
  if (n > expected) {
    got.resize(static_cast<size_t>(n) + 1);
    be_.download(got.data() + 1 + expected, picked_dev_ + expected,
                 static_cast<size_t>(n - expected) * sizeof(SelectedLogit));
  }
  const SelectedLogit* picked = got.data() + 1;
  dist_.resize(static_cast<size_t>(n));
  double inside = 0;
  for (int32_t i = 0; i < n; ++i) {
    dist_[i] = {picked[i].id, picked[i].logit};
    inside += std::exp((picked[i].logit - m) / sp.temperature);
  }
  std::sort(dist_.begin(), dist_.end(),
            [](const TokenProb& a, const TokenProb& b) { return a.p > b.p || (a.p == b.p && a.id < b.id); });
  sampler_.distribution_of_best(dist_, n_vocab, std::max(0.0, z - inside));
  // Top-k: the candidates hold its k tokens, so the cuts after it are the row's. Otherwise a cut inside
  // the candidates is the row's cut, and a distribution that kept them all may be missing tokens below
  // the threshold.
  const bool decided = n == n_vocab || (top_k ? n >= sp.top_k : dist_.size() < static_cast<size_t>(n));
  if (!decided) return whole_row();
  path_ = Path::Candidates;
}

const std::vector<float>& LogitRows::chunk(int64_t c) {
  std::vector<float>& h = chunks_[static_cast<size_t>(c)];
  if (h.empty()) {
    h.resize(static_cast<size_t>(std::min(S::kChunk, V_ - c * S::kChunk)));
    be_.download(h.data(), logits_.row(row_) + c * S::kChunk, h.size() * sizeof(float));
  }
  return h;
}

float LogitRows::chunk_logit(int32_t id) {  // its chunk, which a draw may read next (one round trip either way)
  if (id >= 0 && id == draft_.first) return draft_.second;  // prefetched
  return chunk(id / S::kChunk)[static_cast<size_t>(id % S::kChunk)];
}

float LogitRows::p(int32_t id) {
  if (path_ != Path::Chunks) {
    for (const TokenProb& t : dist_)
      if (t.id == id) return t.p;
    return 0.0f;
  }
  if (id < 0 || id >= V_) return 0.0f;
  const float l = chunk_logit(id);
  if (!(l > -INFINITY)) return 0.0f;
  return static_cast<float>(std::exp((l - m_) / sampler_.params().temperature) / z_);
}

int32_t LogitRows::draw(int32_t exclude) {
  if (path_ == Path::Chunks) {
    const int32_t t = draw_by_chunk(exclude);
    if (t >= 0) return t;
    // The device's masses and the host's exps disagree on whether anything is left (underflow at the
    // edge): the row's distribution as the host computes it decides.
    path_ = Path::Explicit;
    sampler_.distribution(host_row(row_), static_cast<int>(V_), {}, dist_);
  }
  if (exclude < 0) return sampler_.draw(dist_);
  std::vector<TokenProb> residual;
  for (const TokenProb& t : dist_)
    if (t.id != exclude) residual.push_back(t);
  return residual.empty() ? exclude : sampler_.draw(residual);
}

int32_t LogitRows::draw_by_chunk(int32_t exclude) {
  // Inverse CDF in token order: the device's chunk masses find the chunk, the host's exps of that
  // chunk's logits the token (backend/chunk_draw.h).
  const ChunkedRow row{m_, chunk_mass_, S::chunks(V_), V_, z_, sampler_.params().temperature};
  return draw_by_chunks(
      row, exclude, [&] { return sampler_.uniform(); }, [&](int32_t id) { return chunk_logit(id); },
      [&](int64_t c) { return std::span<const float>(chunk(c)); });
}

}  // namespace hyspec
