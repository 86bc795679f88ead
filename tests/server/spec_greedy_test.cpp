// Speculative decoding is lossless over HTTP too: greedy output of `hyspec serve --spec mtp|dflash`
// equals plain greedy decoding by the Engine API (SpecMethod::None) on the same model.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "format/gguf.h"
#include "server_harness.h"
#include "text/tokenizer.h"

namespace hyspec::test {
namespace {

using json = nlohmann::json;

struct Reference {
  std::unique_ptr<Engine> engine;
  std::set<int32_t> end_tokens;
};

Reference plain_engine(const std::string& model) {
  Reference r;
  EngineConfig c;
  c.model_path = model;
  c.n_threads = 1;
  auto e = Engine::create(c);
  EXPECT_TRUE(e.is_ok()) << e.message();
  if (!e.is_ok()) return r;
  r.engine = std::move(e).value();
  auto tok = Tokenizer::from_gguf(r.engine->model_file());
  EXPECT_TRUE(tok.is_ok()) << tok.message();
  if (!tok.is_ok()) return r;
  for (int32_t id = 0; id < (*tok)->n_vocab(); ++id)
    if ((*tok)->is_end_of_generation(id)) r.end_tokens.insert(id);
  return r;
}

// Plain greedy tokens, without a final end-of-generation token (the server does not return it).
std::vector<int32_t> plain_greedy(Reference& ref, const std::vector<int32_t>& prompt, int max_tokens) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.stop_tokens = ref.end_tokens;
  std::vector<int32_t> out;
  auto st = ref.engine->generate(prompt, o, [&](const std::vector<int32_t>& t) {
    out.insert(out.end(), t.begin(), t.end());
    return true;
  });
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (!out.empty() && ref.end_tokens.count(out.back())) out.pop_back();
  return out;
}

std::vector<std::vector<int32_t>> prompts() {
  const json manifest = read_json_file(fixture_path("qwen35-tiny/manifest.json"));
  std::vector<std::vector<int32_t>> out;
  for (const json& c : manifest["cases"]) {
    auto t = c["tokens"].get<std::vector<int32_t>>();
    if (t.size() > 64) t.resize(64);
    out.push_back(t);
  }
  out.push_back({10, 20, 30, 40, 50, 10, 20, 30, 40, 50, 10, 20, 30});
  return out;
}

void expect_http_greedy_equals_plain(const std::vector<std::string>& spec_args, const std::string& method) {
  const std::string model = tiny_model("f32");
  Reference ref = plain_engine(model);
  ASSERT_TRUE(ref.engine);
  std::vector<std::string> args = {"-m", model, "--threads", "1", "--draft-max", "8"};
  args.insert(args.end(), spec_args.begin(), spec_args.end());
  ServerProcess server(args);
  ASSERT_TRUE(server.ready());
  auto c = server.client();
  int64_t proposed = 0;
  for (const auto& prompt : prompts()) {
    const int max_tokens = 96;
    const std::vector<int32_t> want = plain_greedy(ref, prompt, max_tokens);
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
  // Opting out per request: plain decoding, same tokens.
  const json body = {{"prompt", prompts()[0]}, {"max_tokens", 32}, {"temperature", 0}, {"return_token_ids", true},
                     {"speculative", false}};
  const HttpReply r = post_json(c, "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.json["usage"]["hyspec"]["spec_method"], "none");
  EXPECT_EQ(r.json["usage"]["hyspec"]["draft_proposed"], 0);
  EXPECT_EQ(r.json["choices"][0]["token_ids"].get<std::vector<int32_t>>(), plain_greedy(ref, prompts()[0], 32));
  EXPECT_EQ(server.stop(20), 0);
}

TEST(HttpSpecGreedy, MtpOutputEqualsPlainGreedy) { expect_http_greedy_equals_plain({"--spec", "mtp"}, "mtp"); }

TEST(HttpSpecGreedy, DflashOutputEqualsPlainGreedy) {
  expect_http_greedy_equals_plain({"--spec", "dflash", "--draft-model", fixture_path("dflash-tiny/dflash-tiny-f32.gguf")},
                                  "dflash");
}

}  // namespace
}  // namespace hyspec::test
