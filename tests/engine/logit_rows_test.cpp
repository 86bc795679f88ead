// LogitRows (the sampler's reads of device rows) against Sampler::distribution on the whole row read
// back: the same distribution on every path (candidates, chunks, the whole row), and, for temperature
// alone, the same draws for the same uniforms (inverse CDF in token order, across chunks). Runs on the
// backend HYSPEC_TEST_BACKEND names.
#include "engine/logit_rows.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/fixtures.h"

namespace hyspec {
namespace {

struct Case {
  float temperature, top_p, min_p;
  int top_k;
  LogitRows::Path path;
};

class LogitRowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto be = create_backend(test::test_backend_kind());
    ASSERT_TRUE(be.is_ok()) << be.message();
    be_ = std::move(be).value();
  }
  // rows x V logits in backend memory, and the scratch for them.
  void put(const std::vector<float>& host, int64_t rows, int64_t V) {
    logits_ = be_->alloc(host.size() * sizeof(float)).value();
    be_->upload(logits_.data(), host.data(), host.size() * sizeof(float));
    scratch_ = be_->alloc(LogitRows::scratch_bytes(rows, V)).value();
    rows_ = Rows(logits_.as<float>(), rows, V);
  }
  std::unique_ptr<Backend> be_;
  Buffer logits_, scratch_;
  Rows rows_;
};

// Rows of a 248K vocabulary: peaked (a few tokens hold most of the mass) and flat (top-p needs
// thousands), with a tie at the top and a -inf token.
std::vector<float> vocabulary_rows(int64_t V) {
  std::mt19937 rng(11);
  std::vector<float> l(static_cast<size_t>(2 * V));
  for (int64_t r = 0; r < 2; ++r) {
    const float spread = r == 0 ? 6.0f : 1.0f;
    std::normal_distribution<float> d(0.0f, spread);
    for (int64_t c = 0; c < V; ++c) l[r * V + c] = d(rng);
    l[r * V + 777] = l[r * V + 200000] = 4.5f * spread;
    l[r * V + 5] = -INFINITY;
  }
  return l;
}

TEST_F(LogitRowsTest, DistributionsEqualTheWholeRowsOnEveryPath) {
  const int64_t V = 248320;
  const auto host = vocabulary_rows(V);
  put(host, 2, V);
  using P = LogitRows::Path;
  const Case cases[] = {{0.7f, 1.0f, 0.0f, 20, P::Candidates},  {1.0f, 0.95f, 0.05f, 0, P::Candidates},
                        {0.7f, 1.0f, 0.1f, 0, P::Candidates},   {1.3f, 0.5f, 0.0f, 1000, P::Candidates},
                        {0.8f, 0.9f, 0.0f, 0, P::Candidates},   {1.0f, 1.0f, 0.0f, 0, P::Chunks},
                        {0.0f, 1.0f, 0.0f, 0, P::Explicit}};
  for (int64_t r = 0; r < 2; ++r) {
    const std::span<const float> row(host.data() + r * V, static_cast<size_t>(V));
    for (const Case& c : cases) {
      SamplingParams sp;
      sp.temperature = c.temperature, sp.top_p = c.top_p, sp.min_p = c.min_p, sp.top_k = c.top_k;
      const std::string what =
          fmt::format("row {} T {} top_p {} min_p {} top_k {}", r, c.temperature, c.top_p, c.min_p, c.top_k);
      Sampler s(sp);
      std::vector<TokenProb> want;
      s.distribution(row.data(), static_cast<int>(V), {}, want);
      LogitRows rows(*be_, rows_, scratch_.data(), s);
      rows.select(r, {});
      // On the flat row, top-p may keep too many tokens to select: the whole row is read then.
      if (r == 0 || c.path != P::Candidates) EXPECT_EQ(rows.path(), c.path) << what;
      // Every kept token (up to 3000 of them, evenly spread) with its probability, and none other.
      std::vector<bool> kept(static_cast<size_t>(V));
      const size_t step = std::max<size_t>(1, want.size() / 3000);
      for (size_t i = 0; i < want.size(); ++i) {
        kept[want[i].id] = true;
        if (i % step == 0) ASSERT_NEAR(rows.p(want[i].id), want[i].p, 1e-6 + 1e-4 * want[i].p) << what << ": token " << want[i].id;
      }
      for (int32_t id = 0; id < V; id += 97)
        if (!kept[id]) ASSERT_EQ(rows.p(id), 0.0f) << what << ": token " << id;
      EXPECT_EQ(rows.p(5), 0.0f) << what;  // -inf
    }
  }
}

// Temperature alone: a draw walks the row in token order, chunk by chunk, so the same uniforms give
// the same tokens as Sampler::draw on the whole row's distribution; excluding a token draws from the
// rest.
TEST_F(LogitRowsTest, ChunkDrawsAreTheWholeRowsDraws) {
  const int64_t V = 40000;  // 10 chunks, the last partial
  std::mt19937 rng(3);
  std::vector<float> host(static_cast<size_t>(V));
  std::normal_distribution<float> d(0.0f, 2.0f);
  for (auto& v : host) v = d(rng);
  put(host, 1, V);
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.seed = 42;
  Sampler reference(sp), sampler(sp);
  std::vector<TokenProb> dist;
  reference.distribution(host.data(), static_cast<int>(V), {}, dist);
  LogitRows rows(*be_, rows_, scratch_.data(), sampler);
  rows.select(0, {});
  ASSERT_EQ(rows.path(), LogitRows::Path::Chunks);
  int same = 0;
  const int n = 3000;
  for (int i = 0; i < n; ++i) same += rows.draw() == reference.draw(dist);
  EXPECT_GE(same, n - 1) << "draws differ beyond a rounding at a token's edge";
  // Excluding the most likely token.
  const int32_t best = static_cast<int32_t>(std::max_element(host.begin(), host.end()) - host.begin());
  std::vector<TokenProb> residual;
  for (const TokenProb& t : dist)
    if (t.id != best) residual.push_back(t);
  same = 0;
  for (int i = 0; i < n; ++i) {
    const int32_t got = rows.draw(best);
    ASSERT_NE(got, best);
    same += got == reference.draw(residual);
  }
  EXPECT_GE(same, n - 1);
}

// A verify round's prefetch (summaries and the drafts' logits in one read-back) changes nothing the
// sampler sees: the same probability of each draft and the same draws for the same uniforms, on rows
// whose drafts sit in the first, a middle and the last (partial) chunk.
TEST_F(LogitRowsTest, PrefetchedDraftsGiveTheSameProbabilitiesAndDraws) {
  const int64_t V = 40000, n = 4;
  std::mt19937 rng(5);
  std::vector<float> host(static_cast<size_t>(n * V));
  std::normal_distribution<float> d(0.0f, 2.0f);
  for (auto& v : host) v = d(rng);
  put(host, n, V);
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  sp.seed = 7;
  const std::vector<int32_t> drafts = {123, 20001, 39999};  // row 3: the bonus row, no draft
  Sampler plain_sampler(sp), prefetch_sampler(sp);
  LogitRows plain(*be_, rows_, scratch_.data(), plain_sampler);
  LogitRows prefetched(*be_, rows_, scratch_.data(), prefetch_sampler);
  prefetched.prefetch_drafts(drafts);
  for (int64_t r = 0; r < n; ++r) {
    plain.select(r, {});
    prefetched.select(r, {});
    ASSERT_EQ(prefetched.path(), LogitRows::Path::Chunks);
    if (r < static_cast<int64_t>(drafts.size())) {
      const int32_t dr = drafts[static_cast<size_t>(r)];
      EXPECT_EQ(prefetched.p(dr), plain.p(dr)) << "row " << r;
      EXPECT_GT(prefetched.p(dr), 0.0f) << "row " << r;
      for (int i = 0; i < 20; ++i) EXPECT_EQ(prefetched.draw(dr), plain.draw(dr)) << "row " << r;
    }
    for (int i = 0; i < 20; ++i) EXPECT_EQ(prefetched.draw(), plain.draw()) << "row " << r;
  }
}

// Penalties need the whole row: the distribution is still Sampler::distribution's.
TEST_F(LogitRowsTest, PenaltiesReadTheWholeRow) {
  const int64_t V = 9000;
  std::vector<float> host(static_cast<size_t>(V));
  std::mt19937 rng(4);
  std::normal_distribution<float> d(0.0f, 3.0f);
  for (auto& v : host) v = d(rng);
  put(host, 1, V);
  SamplingParams sp;
  sp.temperature = 0.8f, sp.top_k = 10, sp.repeat_penalty = 1.3f, sp.presence_penalty = 0.5f;
  const int32_t best = static_cast<int32_t>(std::max_element(host.begin(), host.end()) - host.begin());
  const std::vector<int32_t> history = {best, 3, best};
  Sampler s(sp);
  std::vector<TokenProb> want;
  s.distribution(host.data(), static_cast<int>(V), history, want);
  LogitRows rows(*be_, rows_, scratch_.data(), s);
  rows.select(0, history);
  EXPECT_EQ(rows.path(), LogitRows::Path::Explicit);
  for (const TokenProb& t : want) EXPECT_EQ(rows.p(t.id), t.p);
}

}  // namespace
}  // namespace hyspec
