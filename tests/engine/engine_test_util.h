// Shared helpers for engine tests: engines on the tiny fixtures, plain greedy reference runs.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/fixtures.h"
#include "engine/engine.h"

namespace hyspec::test {

inline std::unique_ptr<Engine> make_engine(const std::string& fixture_dir, SpecMethod spec, int draft_max = 8,
                                           int64_t n_ctx = 512, std::string draft_model = "",
                                           bool add_ngram = false, GgmlType kv_type = GgmlType::F32,
                                           int64_t draft_vocab = 0,
                                           StateCapture capture = EngineConfig{}.capture,
                                           PadVerify pad_verify = EngineConfig{}.pad_verify,
                                           bool use_graphs = true,
                                           LookAhead look_ahead = EngineConfig{}.look_ahead) {
  EngineConfig c;
  c.model_path = fixture_path(fixture_dir + "/" + fixture_dir + "-f32.gguf");
  c.spec = spec;
  c.backend = test_backend_kind();
  c.draft_max = draft_max;
  c.n_ctx = n_ctx;
  c.n_batch = 64;
  c.n_threads = 2;
  c.draft_model = std::move(draft_model);
  c.add_ngram = add_ngram;
  c.kv_type = kv_type;
  c.draft_vocab = draft_vocab;
  c.capture = capture;
  c.pad_verify = pad_verify;
  c.use_graphs = use_graphs;
  c.look_ahead = look_ahead;
  auto e = Engine::create(c);
  EXPECT_TRUE(e.is_ok()) << e.message();
  return e.is_ok() ? std::move(e).value() : nullptr;
}

inline std::vector<int32_t> generate_ids(Engine& e, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                                         SessionStats* stats = nullptr, FinishReason* finish = nullptr) {
  std::vector<int32_t> all;
  auto r = e.generate(prompt, o, [&](const std::vector<int32_t>& t) {
    all.insert(all.end(), t.begin(), t.end());
    return true;
  }, finish);
  EXPECT_TRUE(r.is_ok()) << r.message();
  if (stats && r.is_ok()) *stats = *r;
  return all;
}

// What a session emitted, how it finished, its statistics and probe_next_logits after it.
struct SessionRun {
  std::vector<int32_t> emitted;
  FinishReason finish = FinishReason::None;
  std::vector<float> next_logits;
  SessionStats stats;
};

// One session over `prompt` (with drafter d when given), cancelled once `cancel_after` tokens are out (-1:
// never), then probed for the next logits.
inline SessionRun run_session(Engine& e, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                              std::unique_ptr<Drafter> d = nullptr, int cancel_after = -1) {
  SessionRun r;
  auto s = e.new_session();
  EXPECT_TRUE(s.is_ok()) << s.message();
  if (!s.is_ok()) return r;
  if (d) (*s)->set_drafter(std::move(d));
  EXPECT_TRUE((*s)->start(prompt, o).is_ok());
  while (!(*s)->done()) {
    if (cancel_after >= 0 && static_cast<int>(r.emitted.size()) >= cancel_after) (*s)->cancel();
    std::vector<int32_t> out;
    const Status st = (*s)->step(out);
    EXPECT_TRUE(st.is_ok()) << st.message();
    r.emitted.insert(r.emitted.end(), out.begin(), out.end());
  }
  r.finish = (*s)->finish_reason();
  r.stats = (*s)->stats();
  auto l = (*s)->probe_next_logits();
  EXPECT_TRUE(l.is_ok()) << l.message();
  if (l.is_ok()) r.next_logits = *l;
  return r;
}

inline std::vector<std::vector<int32_t>> fixture_prompts(const std::string& fixture_dir) {
  const auto manifest = read_json_file(fixture_path(fixture_dir + "/manifest.json"));
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : manifest["cases"]) {
    auto t = c["tokens"].get<std::vector<int32_t>>();
    if (t.size() > 80) t.resize(80);
    prompts.push_back(t);
  }
  // A repetitive prompt, where n-gram drafting has something to find.
  prompts.push_back({10, 20, 30, 40, 50, 10, 20, 30, 40, 50, 10, 20, 30});
  return prompts;
}

}  // namespace hyspec::test
