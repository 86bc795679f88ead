// `hyspec serve` over raw HTTP (httplib::Client against the real binary on a loopback port):
// routes, OpenAI error shapes and statuses, streaming format, stop strings, logprobs, auth,
// disconnects, the bounded queue and graceful shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "server_harness.h"

namespace hyspec::test {
namespace {

using json = nlohmann::json;

const std::string kChat = "/v1/chat/completions";
const std::string kCompletion = "/v1/completions";

std::string chat_body(const std::string& extra = "") {
  return R"({"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, "temperature": 0,
             "chat_template_kwargs": {"enable_thinking": false})" + (extra.empty() ? "" : ", " + extra) + "}";
}

void expect_openai_error(const HttpReply& r, int status, const std::string& param = "") {
  EXPECT_EQ(r.status, status) << r.body;
  ASSERT_TRUE(r.json.is_object()) << r.body;
  ASSERT_TRUE(r.json.contains("error")) << r.body;
  const json& e = r.json["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r.body;
  EXPECT_TRUE(e["type"].is_string()) << r.body;
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << r.body;
  if (!param.empty()) EXPECT_EQ(e["param"], param) << r.body;
}

// One server for the tests that do not need their own flags.
class HttpApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess({"-m", tiny_model(), "--parallel", "2", "--threads", "1"}); }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->stop(20), 0) << server_->output();
    delete server_;
  }
  void SetUp() override { ASSERT_TRUE(server_->ready()); }
  static ServerProcess* server_;
};
ServerProcess* HttpApi::server_ = nullptr;

TEST_F(HttpApi, HealthIsOkAndModelsReportTheLoadedModel) {
  auto c = server_->client();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "qwen35-tiny-q8_0");
  EXPECT_EQ(m["data"][0]["object"], "model");
  auto one = c.Get("/v1/models/qwen35-tiny-q8_0");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  auto other = c.Get("/v1/models/gpt-4o");
  ASSERT_TRUE(other);
  HttpReply r{other->status, other->body, json::parse(other->body, nullptr, false), {}};
  expect_openai_error(r, 404, "model");
  auto unknown = c.Get("/v2/nothing");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
}

TEST_F(HttpApi, AnyModelNameIsAcceptedAndTheLoadedOneReported) {
  auto c = server_->client();
  const HttpReply r = post_json(c, kChat, chat_body(R"("model": "gpt-4o")"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["model"], "qwen35-tiny-q8_0");
}

TEST_F(HttpApi, MalformedJsonIs400) {
  auto c = server_->client();
  expect_openai_error(post_json(c, kChat, R"({"messages": [)"), 400);
  expect_openai_error(post_json(c, kCompletion, "not json at all"), 400);
  expect_openai_error(post_json(c, kCompletion, R"(["an", "array"])"), 400);
}

TEST_F(HttpApi, WrongTypesAre400NamingTheField) {
  auto c = server_->client();
  expect_openai_error(post_json(c, kChat, chat_body(R"("temperature": "hot")")), 400, "temperature");
  expect_openai_error(post_json(c, kChat, R"({"messages": "hello"})"), 400, "messages");
  expect_openai_error(post_json(c, kChat, chat_body(R"("stream": "yes")")), 400, "stream");
  expect_openai_error(post_json(c, kCompletion, R"({"prompt": "x", "max_tokens": "ten"})"), 400, "max_tokens");
  expect_openai_error(post_json(c, kCompletion, R"({"prompt": {"text": "x"}})"), 400, "prompt");
}

TEST_F(HttpApi, BadValuesAre400AndUnknownFieldsAreIgnored) {
  auto c = server_->client();
  expect_openai_error(post_json(c, kChat, chat_body(R"("temperature": -0.5)")), 400, "temperature");
  expect_openai_error(post_json(c, kChat, chat_body(R"("top_p": 0)")), 400, "top_p");
  expect_openai_error(post_json(c, kChat, chat_body(R"("top_p": 1.5)")), 400, "top_p");
  expect_openai_error(post_json(c, kChat, chat_body(R"("n": 2)")), 400, "n");
  expect_openai_error(post_json(c, kChat, R"({"messages": [{"role": "wizard", "content": "x"}]})"), 400, "messages");
  expect_openai_error(post_json(c, kCompletion, R"({"prompt": [1, 2, 100000]})"), 400, "prompt");
  const HttpReply ok = post_json(c, kChat, chat_body(R"("frobnicate": {"deeply": [1, 2]}, "x_custom": null)"));
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_F(HttpApi, ChatAndCompletionBodiesHaveTheOpenAiShapeAndUsage) {
  auto c = server_->client();
  const HttpReply chat = post_json(c, kChat, chat_body(R"("ignore_eos": true)"));
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_TRUE(chat.json["id"].get<std::string>().starts_with("chatcmpl-"));
  EXPECT_EQ(chat.json["object"], "chat.completion");
  EXPECT_TRUE(chat.json["created"].is_number_integer());
  const json& choice = chat.json["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_TRUE(choice["message"]["content"].is_string());
  EXPECT_EQ(choice["finish_reason"], "length");
  const json& usage = chat.json["usage"];
  EXPECT_EQ(usage["completion_tokens"], 8);
  EXPECT_GT(usage["prompt_tokens"].get<int>(), 5);
  EXPECT_EQ(usage["total_tokens"], usage["prompt_tokens"].get<int>() + 8);
  EXPECT_EQ(usage["hyspec"]["spec_method"], "none");

  const HttpReply comp = post_json(c, kCompletion, R"({"prompt": "Once upon", "max_tokens": 5, "temperature": 0,
      "ignore_eos": true, "return_token_ids": true})");
  ASSERT_EQ(comp.status, 200) << comp.body;
  EXPECT_EQ(comp.json["object"], "text_completion");
  EXPECT_TRUE(comp.json["choices"][0]["text"].is_string());
  EXPECT_EQ(comp.json["choices"][0]["token_ids"].size(), 5u);
  EXPECT_EQ(comp.json["usage"]["completion_tokens"], 5);
}

TEST_F(HttpApi, ContextOverflowIs400SayingByHowManyTokens) {
  ServerProcess small({"-m", tiny_model(), "-c", "64", "--threads", "1"});
  ASSERT_TRUE(small.ready());
  auto c = small.client();
  std::string ids = "[";
  for (int i = 0; i < 70; ++i) ids += (i ? ", " : "") + std::to_string(10 + i);
  ids += "]";
  const HttpReply r = post_json(c, kCompletion, R"({"prompt": )" + ids + "}");
  expect_openai_error(r, 400, "prompt");
  EXPECT_EQ(r.json["error"]["code"], "context_length_exceeded");
  EXPECT_NE(r.json["error"]["message"].get<std::string>().find("7 tokens too many"), std::string::npos) << r.body;
  EXPECT_EQ(small.stop(20), 0);
}

TEST(HttpAuth, EveryRouteButHealthNeedsTheBearerKey) {
  ServerProcess server({"-m", tiny_model(), "--api-key", "s3cret", "--threads", "1"});
  ASSERT_TRUE(server.ready());
  auto c = server.client();
  EXPECT_EQ(c.Get("/health")->status, 200);
  for (const char* path : {"/v1/models", "/metrics"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r);
    HttpReply reply{r->status, r->body, json::parse(r->body, nullptr, false), {}};
    expect_openai_error(reply, 401);
    auto wrong = c.Get(path, {{"Authorization", "Bearer nope"}});
    EXPECT_EQ(wrong->status, 401);
    auto right = c.Get(path, {{"Authorization", "Bearer s3cret"}});
    EXPECT_EQ(right->status, 200);
  }
  expect_openai_error(post_json(c, kChat, chat_body()), 401);
  EXPECT_EQ(post_json(c, kChat, chat_body(), {{"Authorization", "Bearer s3cret"}}).status, 200);
  EXPECT_EQ(server.stop(20), 0);
}

TEST_F(HttpApi, StreamedChatIsSseChunksEndingWithUsageAndDoneAndMatchesTheUnstreamedText) {
  auto c = server_->client();
  const std::string extra = R"("ignore_eos": true, "max_tokens": 12)";
  const HttpReply whole = post_json(c, kChat, chat_body(extra));
  ASSERT_EQ(whole.status, 200);
  const HttpReply s = post_stream(c, kChat, chat_body(extra + R"(, "stream": true, "stream_options": {"include_usage": true})"), nullptr);
  ASSERT_EQ(s.status, 200) << s.body;
  bool event_stream = false;
  for (const auto& [k, v] : s.headers)
    if (k == "Content-Type" && v.rfind("text/event-stream", 0) == 0) event_stream = true;
  EXPECT_TRUE(event_stream);
  const auto events = sse_events(s.body);
  ASSERT_GE(events.size(), 4u) << s.body;
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  int finishes = 0;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json& e = events[i];
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_EQ(e["id"], events[0]["id"]);
    EXPECT_TRUE(e.contains("usage") && e["usage"].is_null()) << "include_usage: usage is null until the last chunk";
    const json& ch = e["choices"][0];
    if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) {
      ++finishes;
      EXPECT_EQ(ch["finish_reason"], "length");
    }
  }
  EXPECT_EQ(finishes, 1);
  const json& usage_chunk = events[events.size() - 2];
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 12);
  EXPECT_EQ(content, whole.json["choices"][0]["message"]["content"].get<std::string>());
}

TEST_F(HttpApi, StreamedCompletionChunksConcatenateToTheUnstreamedText) {
  auto c = server_->client();
  const std::string body = R"({"prompt": "The cat", "max_tokens": 16, "temperature": 0, "ignore_eos": true)";
  const HttpReply whole = post_json(c, kCompletion, body + "}");
  const HttpReply s = post_stream(c, kCompletion, body + R"(, "stream": true})", nullptr);
  ASSERT_EQ(s.status, 200);
  const auto events = sse_events(s.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i]["object"], "text_completion");
    EXPECT_FALSE(events[i].contains("usage")) << "no usage without include_usage";
    text += events[i]["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, whole.json["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
}

TEST_F(HttpApi, StopStringEndsTheTextBeforeItAndNeverStreamsAnyOfIt) {
  auto c = server_->client();
  // Greedy text and its token boundaries (logprobs text_offset), then a stop string across tokens.
  const std::string base = R"({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "ignore_eos": true)";
  const HttpReply whole = post_json(c, kCompletion, base + R"(, "logprobs": 0})");
  ASSERT_EQ(whole.status, 200) << whole.body;
  const std::string text = whole.json["choices"][0]["text"];
  const json& offsets = whole.json["choices"][0]["logprobs"]["text_offset"];
  std::string stop;
  size_t stop_at = 0;
  for (size_t t = 1; t + 1 < offsets.size() && stop.empty(); ++t) {
    const size_t boundary = offsets[t];
    if (boundary < 2 || boundary + 2 > text.size()) continue;
    const std::string candidate = text.substr(boundary - 2, 4);
    bool printable = true;
    for (unsigned char ch : candidate) printable = printable && ch >= 0x20 && ch < 0x7f;
    if (printable && text.find(candidate) == boundary - 2) {
      stop = candidate;
      stop_at = boundary - 2;
    }
  }
  ASSERT_FALSE(stop.empty()) << "no ASCII window across a token boundary in: " << text;
  const json stop_json = stop;
  const HttpReply cut = post_json(c, kCompletion, base + R"(, "stop": [)" + stop_json.dump() + "]}");
  ASSERT_EQ(cut.status, 200);
  EXPECT_EQ(cut.json["choices"][0]["text"], text.substr(0, stop_at));
  EXPECT_EQ(cut.json["choices"][0]["finish_reason"], "stop");
  const HttpReply streamed = post_stream(c, kCompletion, base + R"(, "stream": true, "stop": )" + stop_json.dump() + "}", nullptr);
  std::string joined;
  for (const json& e : sse_events(streamed.body))
    if (e.is_object()) joined += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(joined, text.substr(0, stop_at)) << "stop string '" << stop << "'";
}

TEST_F(HttpApi, ChatLogprobsListEveryTokenWithItsTopAlternatives) {
  auto c = server_->client();
  const HttpReply r = post_json(c, kChat, chat_body(R"("ignore_eos": true, "logprobs": true, "top_logprobs": 3)"));
  ASSERT_EQ(r.status, 200) << r.body;
  const json& content = r.json["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 8u);
  for (const json& t : content) {
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_EQ(t["top_logprobs"][0]["logprob"], t["logprob"]) << "greedy picks the most likely token";
    EXPECT_TRUE(t["bytes"].is_array());
  }
}

TEST_F(HttpApi, ToolHistoryWithCallsAndResultsIsAcceptedAndRendered) {
  auto c = server_->client();
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";
  const std::string messages = R"([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}])";
  const HttpReply with_tools = post_json(c, kChat, R"({"max_tokens": 4, "temperature": 0, "tools": )" + tools +
                                                       R"(, "messages": )" + messages + "}");
  ASSERT_EQ(with_tools.status, 200) << with_tools.body;
  const HttpReply no_tools = post_json(c, kChat, R"({"max_tokens": 4, "temperature": 0, "tool_choice": "none", "tools": )" +
                                                     tools + R"(, "messages": )" + messages + "}");
  ASSERT_EQ(no_tools.status, 200) << no_tools.body;
  EXPECT_GT(with_tools.json["usage"]["prompt_tokens"].get<int>(), no_tools.json["usage"]["prompt_tokens"].get<int>() + 20)
      << "the tool schema is rendered into the prompt";
  // Arguments that are not JSON cannot be rendered.
  const HttpReply bad = post_json(c, kChat, R"({"max_tokens": 4, "messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]})");
  expect_openai_error(bad, 400, "messages");
}

TEST(HttpStreaming, DisconnectMidStreamCancelsTheRequestAndFreesTheSlot) {
  // Long streams (30000 tokens in a 32k context) so that even ~13k tokens/s cannot finish first.
  ServerProcess server({"-m", tiny_model(), "--parallel", "1", "--threads", "1", "-c", "32768"});
  ASSERT_TRUE(server.ready());
  auto c = server.client();
  int chunks = 0;
  const HttpReply r = post_stream(c, kCompletion,
                                  R"({"prompt": "Hi", "max_tokens": 30000, "ignore_eos": true, "stream": true})",
                                  [&](const std::string& so_far) {
                                    chunks = static_cast<int>(sse_events(so_far).size());
                                    return chunks < 3;  // hang up after three chunks
                                  });
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(wait_for_metric(server, "hyspec_active_slots", 0, 10), 0) << "the slot stayed busy after the client left";
  EXPECT_EQ(server_metric(server, "hyspec_requests_finished_total{reason=\"cancelled\"}"), 1);
  EXPECT_LT(server_metric(server, "hyspec_generation_tokens_total"), 30000);
  // The freed slot serves the next request.
  const HttpReply next = post_json(c, kCompletion, R"({"prompt": "Hi", "max_tokens": 4})");
  EXPECT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(server.stop(20), 0);
}

TEST(HttpQueue, FullQueueIs429WithRetryAfter) {
  ServerProcess server({"-m", tiny_model(), "--parallel", "1", "--queue", "1", "--threads", "1", "-c", "32768"});
  ASSERT_TRUE(server.ready());
  std::atomic<bool> hang_up{false};
  std::vector<std::thread> streams;
  for (int i = 0; i < 2; ++i) {
    streams.emplace_back([&] {
      auto c = server.client();
      post_stream(c, kCompletion, R"({"prompt": "Hi", "max_tokens": 30000, "ignore_eos": true, "stream": true})",
                  [&](const std::string&) { return !hang_up.load(); });
    });
  }
  // One request runs, one waits.
  EXPECT_EQ(wait_for_metric(server, "hyspec_active_slots", 1, 10), 1);
  EXPECT_EQ(wait_for_metric(server, "hyspec_queue_depth", 1, 10), 1);
  auto c = server.client();
  const HttpReply r = post_json(c, kCompletion, R"({"prompt": "Hi", "max_tokens": 2})");
  expect_openai_error(r, 429);
  bool retry_after = false;
  for (const auto& [k, v] : r.headers) retry_after = retry_after || (k == "Retry-After" && !v.empty());
  EXPECT_TRUE(retry_after);
  hang_up = true;
  for (auto& t : streams) t.join();
  EXPECT_EQ(wait_for_metric(server, "hyspec_active_slots", 0, 10), 0);
  EXPECT_EQ(wait_for_metric(server, "hyspec_queue_depth", 0, 10), 0);
  EXPECT_EQ(server_metric(server, "hyspec_http_requests_total{code=\"429\"}"), 1);
  EXPECT_EQ(server.stop(20), 0);
}

TEST(HttpShutdown, SigtermRefusesNewWorkEndsOpenStreamsWithDoneAndExitsZero) {
  // A stream that outlives the 1 s grace period even at ~13k tokens/s: a long context, 30000 tokens.
  ServerProcess server({"-m", tiny_model(), "--threads", "1", "--shutdown-grace", "1", "-c", "32768"});
  ASSERT_TRUE(server.ready());
  std::atomic<bool> started{false};
  HttpReply r;
  std::thread stream([&] {
    auto c = server.client();
    r = post_stream(c, kCompletion, R"({"prompt": "Hi", "max_tokens": 30000, "ignore_eos": true, "stream": true})",
                    [&](const std::string&) {
                      started = true;
                      return true;
                    });
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  server.terminate();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  {
    // Draining: still listening for the open stream, but no new work and not healthy.
    auto c = server.client();
    auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 503);
    expect_openai_error(post_json(c, kCompletion, R"({"prompt": "Hi", "max_tokens": 2})"), 503);
  }
  EXPECT_EQ(server.stop(30), 0) << server.output();
  stream.join();
  const auto events = sse_events(r.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]") << "the stream ends cleanly";
  EXPECT_TRUE(events[events.size() - 2].contains("error")) << "a cancelled stream says why";
}

TEST(HttpScheduling, LongPromptIsPrefilledInChunksBetweenAnotherStreamsTokens) {
  // --batch-size 16: a 1500-token prompt takes ~94 prefill turns; each is followed by a decoding turn
  // of the other slot, so that stream keeps receiving tokens while the prompt is processed.
  ServerProcess server({"-m", tiny_model(), "--parallel", "2", "--batch-size", "16", "--threads", "1", "-c", "32768"});
  ASSERT_TRUE(server.ready());
  using Clock = std::chrono::steady_clock;
  std::mutex mu;
  std::vector<Clock::time_point> a_chunks;
  std::atomic<bool> stop_a{false};
  std::thread a([&] {
    auto c = server.client();
    post_stream(c, kCompletion, R"({"prompt": "Hi", "max_tokens": 30000, "ignore_eos": true, "stream": true})",
                [&](const std::string&) {
                  std::lock_guard<std::mutex> lock(mu);
                  a_chunks.push_back(Clock::now());
                  return !stop_a.load();
                });
  });
  while (true) {
    std::lock_guard<std::mutex> lock(mu);
    if (a_chunks.size() >= 3) break;
  }
  std::string ids = "[";
  for (int i = 0; i < 1500; ++i) ids += (i ? "," : "") + std::to_string(i % 500);
  ids += "]";
  auto c = server.client();
  const Clock::time_point b_sent = Clock::now();
  Clock::time_point b_first;
  post_stream(c, kCompletion, R"({"prompt": )" + ids + R"(, "max_tokens": 2, "stream": true})", [&](const std::string& so_far) {
    if (so_far.find("\"text\"") != std::string::npos && b_first == Clock::time_point()) b_first = Clock::now();
    return true;
  });
  stop_a = true;
  a.join();
  ASSERT_NE(b_first, Clock::time_point());
  size_t during = 0;
  for (const auto& t : a_chunks) during += t > b_sent && t < b_first;
  EXPECT_GE(during, 30u) << "the other stream stalled while the long prompt was prefilled";
  EXPECT_EQ(server.stop(20), 0);
}

}  // namespace
}  // namespace hyspec::test
