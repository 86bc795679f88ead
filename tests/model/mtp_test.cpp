// The MTP (nextn) head against llama.cpp's own implementation (mtp_manifest.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "backend/backend.h"
#include "common/backend_io.h"
#include "common/fixtures.h"
#include "model/qwen35.h"

namespace hyspec {
namespace {

float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

class MtpFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpFixture, HeadLogitsMatchLlamaCppForEveryRowAndTheChainedStep) {
  const std::string dir = GetParam();
  const auto manifest = test::read_json_file(test::fixture_path(dir + "/manifest.json"));
  const auto mtp_manifest = test::read_json_file(test::fixture_path(dir + "/mtp_manifest.json"));
  auto file = GgufFile::open(test::fixture_path(dir + "/" + dir + "-f32.gguf"));
  ASSERT_TRUE(file.is_ok());
  auto backend = create_backend(test::test_backend_kind());
  auto model = Qwen35Model::load(**backend, **file, {});
  ASSERT_TRUE(model.is_ok()) << model.message();
  Qwen35Model& m = **model;
  ASSERT_TRUE(m.has_mtp());
  const int64_t E = m.hparams().n_embd, V = m.hparams().n_vocab;
  for (const auto& mc : mtp_manifest["cases"]) {
    std::vector<int32_t> tokens;
    for (const auto& c : manifest["cases"])
      if (c["name"] == mc["name"]) tokens = c["tokens"].get<std::vector<int32_t>>();
    const int64_t n = static_cast<int64_t>(tokens.size());
    ASSERT_GT(n, 0);
    ASSERT_TRUE(m.reserve(n + 1).is_ok());
    auto st = m.create_state(n + 8, 0, GgmlType::F32);
    ASSERT_TRUE(st.is_ok());
    std::vector<int32_t> pos(n + 1);
    for (int64_t i = 0; i <= n; ++i) pos[i] = static_cast<int32_t>(i);
    test::BackendArena io(**backend);
    const int32_t* pos_dev = io.put(pos);
    ForwardArgs f;
    f.n = n;
    f.tokens = io.put(tokens);
    f.positions = pos_dev;
    f.gdn_chunked = true;
    f.final_hidden = io.rows(n, E);
    f.logits = io.rows(1, V);
    ASSERT_TRUE(m.forward(f, *st).is_ok());
    const auto logits = io.get(f.logits);
    const int32_t last = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(last, mc["last_token"].get<int32_t>());

    // Row k: token t_{k+1} (t_n = last) with hidden h_k. llama.cpp ropes it at position k+1; RoPE is
    // relative, so hyspec uses position k (the hidden row's own), which keeps KV slots dense from 0.
    std::vector<int32_t> mtp_tokens(tokens.begin() + 1, tokens.end());
    mtp_tokens.push_back(last);
    MtpArgs a;
    a.n = n;
    a.hidden = f.final_hidden;
    a.tokens = io.put(mtp_tokens);
    a.positions = pos_dev;
    a.logits = io.rows(n, V);
    a.out_hidden = io.rows(n, E);
    ASSERT_TRUE(m.forward_mtp(a, *st).is_ok());
    const auto mtp_logits = io.get(a.logits);
    const auto want = test::read_f32_file(test::fixture_path(dir + "/" + mc["mtp_logits"].get<std::string>()));
    ASSERT_EQ(want.size(), mtp_logits.size());
    EXPECT_LE(max_abs_diff(mtp_logits.data(), want.data(), want.size()), 2e-3f) << mc["name"];
    if (std::getenv("HYSPEC_TEST_VERBOSE"))
      for (int64_t r = 0; r < n; ++r)
        std::printf("row %ld: %.3g\n", (long)r, max_abs_diff(&mtp_logits[r * V], &want[r * V], V));
    const float* last_row = &mtp_logits[(n - 1) * V];
    const int32_t draft1 = static_cast<int32_t>(std::max_element(last_row, last_row + V) - last_row);
    EXPECT_EQ(draft1, mc["draft1"].get<int32_t>());

    // Chained step: draft1 one position after row n-1, with the head's own output hidden of row n-1.
    MtpArgs b;
    b.n = 1;
    b.hidden = a.out_hidden.rows(n - 1, 1);
    b.tokens = io.put(&draft1, 1);
    b.positions = pos_dev + n;
    b.logits = io.rows(1, V);
    ASSERT_TRUE(m.forward_mtp(b, *st).is_ok());
    const auto step2 = io.get(b.logits);
    const auto want2 = test::read_f32_file(test::fixture_path(dir + "/" + mc["mtp_step2_logits"].get<std::string>()));
    ASSERT_EQ(want2.size(), step2.size());
    EXPECT_LE(max_abs_diff(step2.data(), want2.data(), want2.size()), 2e-3f) << mc["name"] << " step 2";
    EXPECT_EQ(std::max_element(step2.begin(), step2.end()) - step2.begin(), mc["draft2"].get<int32_t>());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpFixture, ::testing::Values("qwen35-tiny", "qwen35moe-tiny"));

}  // namespace
}  // namespace hyspec
