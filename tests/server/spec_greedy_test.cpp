// Speculative decoding is lossless over HTTP too: greedy output of `hyspec serve --spec mtp|dflash`
// equals `hyspec run --temp 0 --ids` (plain decoding) on the same model.
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "common/process.h"
#include "engine/engine_test_util.h"  // fixture_prompts (tests/engine)
#include "format/gguf.h"
#include "server_harness.h"
#include "text/tokenizer.h"

namespace hyspec::test {
namespace {

using json = nlohmann::json;

// End-of-generation ids of the model's vocabulary (the server never returns them as tokens).
std::set<int32_t> end_tokens(const std::string& model) {
  std::set<int32_t> out;
  auto file = GgufFile::open(model);
  EXPECT_TRUE(file.is_ok()) << file.message();
  if (!file.is_ok()) return out;
  auto tok = Tokenizer::from_gguf(**file);
  EXPECT_TRUE(tok.is_ok()) << tok.message();
  if (!tok.is_ok()) return out;
  for (int32_t id = 0; id < (*tok)->n_vocab(); ++id)
    if ((*tok)->is_end_of_generation(id)) out.insert(id);
  return out;
}

// Plain greedy ids from `hyspec run --temp 0 --ids` (no speculation), without a final end token, on the
// backend the server runs on (ServerProcess adds --backend cuda under HYSPEC_TEST_BACKEND=cuda), so that
// both take the same defaults (the KV cache type among them).
std::vector<int32_t> hyspec_run_greedy(const std::string& model, const std::vector<int32_t>& prompt, int max_tokens,
                                       const std::set<int32_t>& ends) {
  std::string list;
  for (int32_t t : prompt) list += (list.empty() ? "" : ",") + std::to_string(t);
  std::string cmd = "'" + hyspec_binary() + "' run -m '" + model + "' --tokens " + list + " -n " +
                    std::to_string(max_tokens) + " --temp 0 --ids --no-stats -t 1";
  if (test_backend_kind() == BackendKind::Cuda) cmd += " --backend cuda";
  const CommandResult r = run_command(cmd);  // stderr joined: empty unless the run fails
  EXPECT_EQ(r.exit_code, 0) << "hyspec run failed: " << r.output;
  std::vector<int32_t> ids;
  std::istringstream in(r.output);
  for (int32_t id; in >> id;) ids.push_back(id);
  if (!ids.empty() && ends.count(ids.back())) ids.pop_back();
  return ids;
}

void expect_http_greedy_equals_plain(const std::vector<std::string>& spec_args, const std::string& method) {
  const std::string model = tiny_model("f32");
  const std::set<int32_t> ends = end_tokens(model);
  ASSERT_FALSE(ends.empty());
  std::vector<std::string> args = {"-m", model, "--threads", "1", "--draft-max", "8"};
  args.insert(args.end(), spec_args.begin(), spec_args.end());
  ServerProcess server(args);
  ASSERT_TRUE(server.ready());
  auto c = server.client();
  int64_t proposed = 0;
  size_t compared = 0;
  for (const auto& prompt : fixture_prompts("qwen35-tiny")) {
    const int max_tokens = 96;
    const std::vector<int32_t> want = hyspec_run_greedy(model, prompt, max_tokens, ends);
    compared += want.size();
    const json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"return_token_ids", true}};
    const HttpReply r = post_json(c, "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want) << "prompt of " << prompt.size() << " tokens";
    EXPECT_EQ(r.json["usage"]["hyspec"]["spec_method"], method);
    proposed += r.json["usage"]["hyspec"]["draft_proposed"].get<int64_t>();
    // The same request streamed gives the same tokens.
    json streamed_body = body;
    streamed_body["stream"] = true;
    const HttpReply s = post_stream(c, "/v1/completions", streamed_body.dump(), nullptr);
    std::vector<int32_t> streamed;
    for (const json& e : sse_events(s.body))
      if (e.is_object() && e.contains("choices") && !e["choices"].empty())
        for (int32_t t : e["choices"][0]["token_ids"]) streamed.push_back(t);
    EXPECT_EQ(streamed, want);
  }
  EXPECT_GT(proposed, 0) << "the drafter never proposed anything: nothing was verified";
  // The slot's step graphs: recorded on CUDA (for the first request's shapes), never on the CPU.
  const double graphs = server_metric(server, "hyspec_step_graphs_recorded_total");
  if (test_backend_kind() == BackendKind::Cuda) EXPECT_GT(graphs, 0);
  else EXPECT_EQ(graphs, 0);
  EXPECT_GT(compared, 200u) << "too few tokens compared";
  // Opting out per request: plain decoding, same tokens.
  const std::vector<int32_t> prompt = fixture_prompts("qwen35-tiny")[0];
  const json body = {{"prompt", prompt}, {"max_tokens", 32}, {"temperature", 0}, {"return_token_ids", true},
                     {"speculative", false}};
  const HttpReply r = post_json(c, "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.json["usage"]["hyspec"]["spec_method"], "none");
  EXPECT_EQ(r.json["usage"]["hyspec"]["draft_proposed"], 0);
  EXPECT_EQ(r.json["choices"][0]["token_ids"].get<std::vector<int32_t>>(), hyspec_run_greedy(model, prompt, 32, ends));
  EXPECT_EQ(server.stop(20), 0);
}

TEST(HttpSpecGreedy, MtpOutputEqualsPlainGreedy) { expect_http_greedy_equals_plain({"--spec", "mtp"}, "mtp"); }

TEST(HttpSpecGreedy, DflashOutputEqualsPlainGreedy) {
  expect_http_greedy_equals_plain({"--spec", "dflash", "--draft-model", fixture_path("dflash-tiny/dflash-tiny-f32.gguf")},
                                  "dflash");
}

}  // namespace
}  // namespace hyspec::test
