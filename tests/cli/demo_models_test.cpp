// The shipped demo models (models/README.md), found the way hyspec finds them by default:
// speculative greedy decoding (MTP, DFlash, n-gram) returns exactly the plain greedy tokens, and
// the trained drafters are real ones: mean acceptance length above 1.5 (an untrained drafter stays
// near 1.0: its drafts are almost never the target's token).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/default_model.h"
#include "common/fixtures.h"
#include "engine/engine.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace hyspec {
namespace {

namespace fs = std::filesystem;

// Restores (unsets) an environment variable at scope exit.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~ScopedEnv() { unsetenv(name); }
};

TEST(DefaultModel, EnvironmentFirstThenTheSourceTreesModels) {
  unsetenv("HYSPEC_MODEL");
  unsetenv("HYSPEC_DRAFT_MODEL");
  const fs::path models = fs::path(test::source_dir()) / "models";
  EXPECT_EQ(cli::default_model_path(), fs::weakly_canonical(models / cli::kDefaultModelFile).string());
  EXPECT_EQ(cli::default_draft_model_path(), fs::weakly_canonical(models / cli::kDefaultDraftModelFile).string());
  {
    ScopedEnv env("HYSPEC_MODEL", "/nowhere/model.gguf");  // used as given, even when missing
    EXPECT_EQ(cli::default_model_path(), "/nowhere/model.gguf");
  }
  ScopedEnv env("HYSPEC_DRAFT_MODEL", "/nowhere/drafter.gguf");
  EXPECT_EQ(cli::default_draft_model_path(), "/nowhere/drafter.gguf");
}

std::unique_ptr<Engine> demo_engine(SpecMethod spec, int draft_max, GgmlType kv_type = GgmlType::F32) {
  EngineConfig c;
  c.model_path = cli::default_model_path();
  c.backend = test::test_backend_kind();
  c.kv_type = kv_type;
  c.spec = spec;
  c.draft_max = draft_max;
  c.n_ctx = 1024;
  c.n_threads = 2;
  if (spec == SpecMethod::Dflash) c.draft_model = cli::default_draft_model_path();
  auto e = Engine::create(c);
  EXPECT_TRUE(e.is_ok()) << e.message();
  return e.is_ok() ? std::move(e).value() : nullptr;
}

std::vector<std::vector<int32_t>> demo_prompts(const Engine& e) {
  auto tok = Tokenizer::from_gguf(e.model_file());
  EXPECT_TRUE(tok.is_ok()) << tok.message();
  if (!tok.is_ok()) return {};
  std::vector<std::string> texts = {
      "import os\nimport sys\n\n\ndef main(argv):\n    \"\"\"",
      "class Stack:\n    \"\"\"A last-in, first-out container.\"\"\"\n\n    def __init__(self):\n",
      "def _check_arg_types(funcname, *args):\n    hasstr = hasbytes = False\n    for s in args:\n",
  };
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "user"}, {"content", "Write the Python module `textwrap`."}});
  ChatTemplateOptions o;
  o.add_generation_prompt = true;
  auto chat = render_chat_template(messages, o);
  EXPECT_TRUE(chat.is_ok()) << chat.message();
  if (chat.is_ok()) texts.push_back(*chat);
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& t : texts) prompts.push_back((*tok)->encode(t, /*parse_special=*/true));
  return prompts;
}

struct DemoRun {
  std::vector<std::vector<int32_t>> tokens;  // per prompt
  int64_t rounds = 0, accepted = 0;
  double mean_acceptance_length() const { return rounds ? static_cast<double>(accepted + rounds) / rounds : 0.0; }
};

DemoRun generate_all(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int max_tokens = 64) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.adaptive = false;  // speculate on every round: acceptance is the drafter's, not the scheduler's
  DemoRun run;
  for (const auto& p : prompts) {
    std::vector<int32_t> out;
    auto st = e.generate(p, o, [&](const std::vector<int32_t>& t) {
      out.insert(out.end(), t.begin(), t.end());
      return true;
    });
    EXPECT_TRUE(st.is_ok()) << st.message();
    if (st.is_ok()) {
      run.rounds += st->spec_rounds;
      run.accepted += st->accepted;
    }
    run.tokens.push_back(out);
  }
  return run;
}

TEST(DemoModels, SpeculativeGreedyEqualsPlainAndTheDraftersAreTrained) {
  ASSERT_FALSE(cli::default_model_path().empty()) << "models/" << cli::kDefaultModelFile << " is missing";
  ASSERT_FALSE(cli::default_draft_model_path().empty()) << "models/" << cli::kDefaultDraftModelFile << " is missing";
  auto plain = demo_engine(SpecMethod::None, 0);
  ASSERT_TRUE(plain);
  const auto prompts = demo_prompts(*plain);
  ASSERT_EQ(prompts.size(), 4u);
  const DemoRun want = generate_all(*plain, prompts);
  for (const auto& t : want.tokens) ASSERT_FALSE(t.empty());

  struct Case {
    SpecMethod spec;
    int draft_max;
    double min_acceptance;  // 0: no bound (n-gram lookup depends on the text repeating itself)
  };
  for (const Case c : {Case{SpecMethod::Mtp, 3, 1.5}, Case{SpecMethod::Dflash, 15, 1.5}, Case{SpecMethod::Ngram, 8, 0}}) {
    auto e = demo_engine(c.spec, c.draft_max);
    ASSERT_TRUE(e);
    const DemoRun got = generate_all(*e, prompts);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(got.tokens[i], want.tokens[i]) << spec_method_name(c.spec) << ", prompt " << i;
    if (c.min_acceptance > 0) {
      EXPECT_GT(got.rounds, 0) << spec_method_name(c.spec);
      EXPECT_GT(got.mean_acceptance_length(), c.min_acceptance) << spec_method_name(c.spec);
    }
    std::printf("%s: %lld rounds, mean acceptance length %.2f\n", spec_method_name(c.spec),
                static_cast<long long>(got.rounds), got.mean_acceptance_length());
  }
}

// The 64 held-out prompts of the training run (models/demo-training-stats.json), 128 tokens each:
// trained models meet near-tied logits often, and any difference between a verify step's rows and
// a decode step's flips one of them. Before the CPU ops were made batch-invariant, 7-12 of these
// runs (192 tokens) diverged from plain greedy.
TEST(DemoModels, SpeculativeGreedyEqualsPlainOnEveryHeldOutPrompt) {
  ASSERT_FALSE(cli::default_model_path().empty()) << "models/" << cli::kDefaultModelFile << " is missing";
  const auto stats = test::read_json_file(test::source_dir() + "/models/demo-training-stats.json");
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : stats.at("heldout_prompts")) prompts.push_back(p.at("prompt_ids").get<std::vector<int32_t>>());
  ASSERT_EQ(prompts.size(), 64u);
  for (GgmlType kv : {GgmlType::F16}) {
    auto plain = demo_engine(SpecMethod::None, 0, kv);
    ASSERT_TRUE(plain);
    const DemoRun want = generate_all(*plain, prompts, 128);
    struct Case {
      SpecMethod spec;
      int draft_max;
    };
    for (const Case c : {Case{SpecMethod::Mtp, 3}, Case{SpecMethod::Dflash, 15}, Case{SpecMethod::Ngram, 8}}) {
      auto e = demo_engine(c.spec, c.draft_max, kv);
      ASSERT_TRUE(e);
      const DemoRun got = generate_all(*e, prompts, 128);
      int differ = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(got.tokens[i], want.tokens[i]) << spec_method_name(c.spec) << ", held-out prompt " << i;
        differ += got.tokens[i] != want.tokens[i];
      }
      std::printf("%s: %d of %zu held-out prompts differ from plain greedy, mean acceptance length %.2f\n",
                  spec_method_name(c.spec), differ, prompts.size(), got.mean_acceptance_length());
    }
  }
}

}  // namespace
}  // namespace hyspec
