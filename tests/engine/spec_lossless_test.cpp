// Speculative decoding is lossless: greedy output is token-identical to plain greedy decoding.
#include <gtest/gtest.h>

#include "engine/spec/ngram_drafter.h"
#include "engine_test_util.h"

namespace hyspec {
namespace {

struct Case {
  std::string fixture;
  SpecMethod spec;
  std::string draft_model;  // relative to the fixtures
  bool add_ngram = false;
  GgmlType kv_type = GgmlType::F32;  // both engines' target caches (the DFlash drafter keeps F32)
  int64_t draft_vocab = 0;           // EngineConfig::draft_vocab of the speculative engine
  StateCapture capture = EngineConfig{}.capture;  // the speculative engine's rollback
  bool adaptive = false;  // adaptive rounds: plain stretches, whose rows the drafter observes at once
  PadVerify pad_verify = EngineConfig{}.pad_verify;  // auto: padded to whole 8-row tiles where graphs are recorded
};

class SpecLossless : public ::testing::TestWithParam<Case> {};

TEST_P(SpecLossless, GreedySpeculativeOutputEqualsPlainGreedyOver200Tokens) {
  const Case c = GetParam();
  auto plain = test::make_engine(c.fixture, SpecMethod::None, 8, 512, "", false, c.kv_type);
  auto spec = test::make_engine(c.fixture, c.spec, 8, 512,
                               c.draft_model.empty() ? "" : test::fixture_path(c.draft_model), c.add_ngram, c.kv_type,
                               c.draft_vocab, c.capture, c.pad_verify);
  ASSERT_TRUE(plain && spec);
  GenerateOptions o;
  o.max_tokens = 200;
  o.adaptive = c.adaptive;  // without: speculate on every round
  int64_t spec_rounds = 0;
  for (const auto& prompt : test::fixture_prompts(c.fixture)) {
    const auto want = test::generate_ids(*plain, prompt, o);
    SessionStats st;
    const auto got = test::generate_ids(*spec, prompt, o, &st);
    ASSERT_EQ(want.size(), 200u);
    EXPECT_EQ(got, want) << "prompt of " << prompt.size() << " tokens";
    spec_rounds += st.spec_rounds;
    // Each sequence (a session of its own) records its step graphs on CUDA, and says what that took.
    EXPECT_EQ(st.graphs_recorded > 0, test::test_backend_kind() == BackendKind::Cuda);
    EXPECT_EQ(st.graph_record_s > 0, st.graphs_recorded > 0);
  }
  // Model drafters always propose; n-gram lookup proposes only when the random model repeats itself.
  if (c.spec != SpecMethod::Ngram) EXPECT_GT(spec_rounds, 0) << "the drafter never proposed anything";
}

INSTANTIATE_TEST_SUITE_P(Drafters, SpecLossless,
                         ::testing::Values(Case{"qwen35-tiny", SpecMethod::Ngram, ""},
                                           Case{"qwen35-tiny", SpecMethod::Mtp, ""},
                                           Case{"qwen35-tiny", SpecMethod::Dflash, "dflash-tiny/dflash-tiny-f32.gguf"},
                                           Case{"qwen35-tiny", SpecMethod::Dflash, "dflash-tiny/hf"},
                                           Case{"qwen35moe-tiny", SpecMethod::Ngram, ""},
                                           Case{"qwen35moe-tiny", SpecMethod::Mtp, ""},
                                           Case{"qwen35moe-tiny", SpecMethod::Mtp, "", true},
                                           Case{"qwen35-tiny", SpecMethod::Mtp, "", false, GgmlType::Q8_0},
                                           Case{"qwen35-tiny", SpecMethod::Dflash, "dflash-tiny/dflash-tiny-f32.gguf",
                                                false, GgmlType::Q8_0},
                                           // drafts among the first 256 of the 512 ids
                                           Case{"qwen35-tiny", SpecMethod::Mtp, "", false, GgmlType::F32, 256},
                                           Case{"qwen35-tiny", SpecMethod::Dflash, "dflash-tiny/dflash-tiny-f32.gguf",
                                                false, GgmlType::F32, 256},
                                           // rollback by captured F32 states instead of replayed updates
                                           Case{"qwen35-tiny", SpecMethod::Mtp, "", false, GgmlType::F32, 0,
                                                StateCapture::F32},
                                           Case{"qwen35-tiny", SpecMethod::Dflash, "dflash-tiny/dflash-tiny-f32.gguf",
                                                false, GgmlType::F32, 0, StateCapture::F32},
                                           Case{"qwen35moe-tiny", SpecMethod::Mtp, "", true, GgmlType::F32, 0,
                                                StateCapture::F32},
                                           // adaptive: plain stretches between speculative probes
                                           Case{"qwen35-tiny", SpecMethod::Mtp, "", false, GgmlType::F32, 0,
                                                EngineConfig{}.capture, true},
                                           Case{"qwen35-tiny", SpecMethod::Dflash, "dflash-tiny/dflash-tiny-f32.gguf",
                                                false, GgmlType::F32, 0, EngineConfig{}.capture, true},
                                           // verify steps padded to 8 rows on every backend (n-gram and adaptive
                                           // drafts vary in length), and never padded
                                           Case{"qwen35-tiny", SpecMethod::Ngram, "", false, GgmlType::F32, 0,
                                                EngineConfig{}.capture, false, PadVerify::kOn},
                                           Case{"qwen35-tiny", SpecMethod::Mtp, "", false, GgmlType::F32, 0,
                                                EngineConfig{}.capture, true, PadVerify::kOn},
                                           Case{"qwen35-tiny", SpecMethod::Dflash, "dflash-tiny/dflash-tiny-f32.gguf",
                                                false, GgmlType::F32, 0, EngineConfig{}.capture, true, PadVerify::kOn},
                                           Case{"qwen35-tiny", SpecMethod::Ngram, "", false, GgmlType::F32, 0,
                                                EngineConfig{}.capture, false, PadVerify::kOff}),
                         [](const auto& info) {
                           std::string f = info.param.fixture == "qwen35-tiny" ? "dense" : "moe";
                           std::string hf = info.param.draft_model.ends_with("hf") ? "_hf" : "";
                           return f + "_" + spec_method_name(info.param.spec) + hf +
                                  (info.param.add_ngram ? "_ngram" : "") +
                                  (info.param.kv_type == GgmlType::Q8_0 ? "_kv_q8_0" : "") +
                                  (info.param.draft_vocab ? "_vocab" + std::to_string(info.param.draft_vocab) : "") +
                                  (info.param.capture == StateCapture::F32 ? "_f32_states" : "") +
                                  (info.param.adaptive ? "_adaptive" : "") +
                                  (info.param.pad_verify == PadVerify::kOn    ? "_padded"
                                   : info.param.pad_verify == PadVerify::kOff ? "_unpadded"
                                                                              : "");
                         });

// A session keeps its step graphs from one sequence to the next (a server slot's requests): the same
// sequence again records none, and gives the same tokens.
TEST(SessionGraphs, ASecondSequenceOfTheSameShapesRecordsNoGraph) {
  auto e = test::make_engine("qwen35-tiny", SpecMethod::Mtp, 8, 512);
  ASSERT_TRUE(e);
  auto s = e->new_session();
  ASSERT_TRUE(s.is_ok());
  GenerateOptions o;
  o.max_tokens = 40;
  o.adaptive = false;  // the same widths every time
  const auto prompt = test::fixture_prompts("qwen35-tiny")[0];
  std::vector<int32_t> first, second;
  for (auto* out : {&first, &second}) {
    ASSERT_TRUE((*s)->start(prompt, o).is_ok());
    while (!(*s)->done()) ASSERT_TRUE((*s)->step(*out).is_ok());
    if (out == &first) {
      EXPECT_EQ((*s)->stats().graphs_recorded > 0, test::test_backend_kind() == BackendKind::Cuda);
    } else {
      EXPECT_EQ((*s)->stats().graphs_recorded, 0);
    }
  }
  EXPECT_EQ(second, first);
}

TEST(SessionGraphs, ARecordedStepsKeyBoundIsAPowerOfTwoFrom4096WithinTheCapacity) {
  EXPECT_EQ(recorded_key_bound(1, 131072), 4096);
  EXPECT_EQ(recorded_key_bound(4096, 131072), 4096);
  EXPECT_EQ(recorded_key_bound(4097, 131072), 8192);
  EXPECT_EQ(recorded_key_bound(70000, 131072), 131072);
  EXPECT_EQ(recorded_key_bound(131072, 131072), 131072);
  EXPECT_EQ(recorded_key_bound(9, 512), 512);
  EXPECT_EQ(recorded_key_bound(5000, 9000), 8192);
  EXPECT_EQ(recorded_key_bound(8193, 9000), 9000);
}

// Steps bound their attention's keys (recorded_key_bound: the split layout on CUDA), so a sequence that
// crosses a bound (4096 here) lays its splits anew, records the next bound's graphs, and keeps each verify
// step within the bound of the plain step at its first position: speculative greedy output stays the plain
// greedy output (MTP and DFlash drafters, F16 and Q8_0 target caches), recorded or not.
TEST(SessionGraphs, SpeculationAcrossAKeyBoundEqualsPlainDecoding) {
  std::vector<int32_t> prompt;
  const auto base = test::fixture_prompts("qwen35-tiny")[0];
  while (prompt.size() < 4085) prompt.push_back(base[prompt.size() % base.size()]);
  GenerateOptions o;
  o.max_tokens = 40;
  o.adaptive = false;  // speculate on every round
  const bool cuda = test::test_backend_kind() == BackendKind::Cuda;
  struct Run {
    SpecMethod spec;
    std::string draft_model;
  };
  for (GgmlType kv : {GgmlType::F16, GgmlType::Q8_0}) {
    auto plain = test::make_engine("qwen35-tiny", SpecMethod::None, 8, 9000, "", false, kv);
    ASSERT_TRUE(plain);
    const auto want = test::generate_ids(*plain, prompt, o);
    ASSERT_EQ(want.size(), 40u);
    for (const Run& r : {Run{SpecMethod::Mtp, ""}, Run{SpecMethod::Dflash, test::fixture_path("dflash-tiny/dflash-tiny-f32.gguf")}})
      for (bool graphs : {true, false}) {
        if (!graphs && !cuda) continue;  // nothing is recorded on the CPU
        auto e = test::make_engine("qwen35-tiny", r.spec, 8, 9000, r.draft_model, false, kv, 0, EngineConfig{}.capture,
                                   PadVerify::kOn, graphs);
        ASSERT_TRUE(e);
        SessionStats st;
        EXPECT_EQ(test::generate_ids(*e, prompt, o, &st), want)
            << (r.spec == SpecMethod::Mtp ? "mtp " : "dflash ") << ggml_type_name(kv) << (graphs ? " recorded" : "");
        EXPECT_GT(st.spec_rounds, 0);
        EXPECT_EQ(st.graphs_recorded > 0, cuda && graphs);
      }
  }
}

TEST(NgramLookup, ProposesWhatFollowedTheMostRecentLongestSuffixMatch) {
  const std::vector<int32_t> seq = {1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3};
  EXPECT_EQ(ngram_lookup(seq, 2, 4, 3), (std::vector<int32_t>{7, 8, 5}));
  EXPECT_EQ(ngram_lookup(seq, 2, 4, 1), (std::vector<int32_t>{7}));
  EXPECT_TRUE(ngram_lookup({1, 2, 3, 4}, 2, 4, 3).empty());
  EXPECT_TRUE(ngram_lookup(seq, 2, 4, 0).empty());
}

TEST(NgramLookup, ALoopContinuesPastTheEndOfTheSequenceAsFarAsItHasHeld) {
  // The most recent match of the suffix overlaps it: what follows is the loop itself, drafted for as
  // many tokens as the sequence has followed it after its first period (7, 4 and 2 here).
  EXPECT_EQ(ngram_lookup({4, 5, 6, 5, 6, 5, 6, 5, 6}, 2, 4, 5), (std::vector<int32_t>{5, 6, 5, 6, 5}));
  EXPECT_EQ(ngram_lookup({3, 7, 7, 7, 7, 7}, 2, 4, 9), (std::vector<int32_t>{7, 7, 7, 7, 7}));
  EXPECT_EQ(ngram_lookup({1, 2, 3, 1, 2}, 2, 4, 6), (std::vector<int32_t>{3, 1, 2, 3, 1}));
}

}  // namespace
}  // namespace hyspec
