// The server's text path without HTTP: stop strings across token boundaries (TextStream), the chat
// reply split into reasoning / content / tool calls (ReplySplitter, responses), fed model-like text.
#include <gtest/gtest.h>

#include <memory>

#include "common/fixtures.h"
#include "format/gguf.h"
#include "server/responses.h"
#include "server/text_stream.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace hyspec::server {
namespace {

using ojson = nlohmann::ordered_json;

const Tokenizer& tiny_tokenizer() {
  static std::unique_ptr<Tokenizer> tok = [] {
    auto file = GgufFile::open(test::fixture_path("qwen35-tiny/qwen35-tiny-q8_0.gguf"));
    EXPECT_TRUE(file.is_ok()) << file.message();
    auto t = Tokenizer::from_gguf(**file);
    EXPECT_TRUE(t.is_ok()) << t.message();
    return std::move(t).value();
  }();
  return *tok;
}

bool valid_utf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    int32_t cp = 0;
    pos += utf8_decode(s, pos, cp);
    if (cp < 0) return false;
  }
  return true;
}

struct Streamed {
  std::vector<std::string> chunks;  // text released after each token
  std::string text;
  std::vector<int32_t> tokens;
  bool stopped = false;
};

// Feeds the tokens of `text` one by one, taking what is released after each.
Streamed stream_text(const std::string& text, std::vector<std::string> stop) {
  const Tokenizer& tok = tiny_tokenizer();
  TextStream ts(tok, std::move(stop));
  Streamed out;
  for (int32_t id : tok.encode(text, false)) {
    out.stopped = ts.push(id, nullptr);
    StreamEvent e;
    ts.take(e);
    out.chunks.push_back(e.text);
    out.text += e.text;
    out.tokens.insert(out.tokens.end(), e.tokens.begin(), e.tokens.end());
    if (out.stopped) break;
  }
  if (!out.stopped) {
    ts.finish();
    StreamEvent e;
    ts.take(e);
    out.chunks.push_back(e.text);
    out.text += e.text;
    out.tokens.insert(out.tokens.end(), e.tokens.begin(), e.tokens.end());
  }
  return out;
}

TEST(TextStream, StopStringSpanningTokensEndsTheTextBeforeIt) {
  const std::string text = "Hello world, this is the end of it all";
  ASSERT_GT(tiny_tokenizer().encode("the end", false).size(), 1u) << "the stop string must span tokens";
  const Streamed s = stream_text(text, {"the end"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "Hello world, this is ");
  // The released tokens are those that contributed text before the stop string.
  EXPECT_EQ(tiny_tokenizer().decode(s.tokens).substr(0, s.text.size()), s.text);
}

TEST(TextStream, NoPrefixOfAStopStringIsReleasedBeforeItIsRuledOut) {
  // "wor" could start "world!" until "ld," arrives; it must be held, then released whole.
  const std::string text = "Hello world, and more";
  const Streamed s = stream_text(text, {"world!"});
  EXPECT_FALSE(s.stopped);
  EXPECT_EQ(s.text, text);
  std::string so_far;
  for (const std::string& c : s.chunks) {
    so_far += c;
    // Whatever is released ends before "w" or after the whole "world," was seen.
    EXPECT_TRUE(so_far.size() <= 6 || so_far.size() >= 12) << "released a possible stop prefix: '" << so_far << "'";
  }
}

TEST(TextStream, StopStringAtTheVeryStartReleasesNothing) {
  const Streamed s = stream_text("STOP now", {"STOP"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "");
  EXPECT_TRUE(s.tokens.empty());
}

TEST(TextStream, EarliestOfSeveralStopStringsWins) {
  const Streamed s = stream_text("one two three four", {"four", "two"});
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "one ");
}

TEST(TextStream, ChunksNeverSplitAUtf8Character) {
  const std::string text = "héllo wörld 😁 ñ 我";
  const Streamed s = stream_text(text, {});
  EXPECT_EQ(s.text, text);
  for (const std::string& c : s.chunks) EXPECT_TRUE(valid_utf8(c)) << "chunk '" << c << "'";
}

TEST(TextStream, WithoutStopStringsEveryTokenIsReleasedAtOnce) {
  const std::string text = "plain text streams token by token";
  const Streamed s = stream_text(text, {});
  EXPECT_EQ(s.text, text);
  EXPECT_EQ(s.tokens, tiny_tokenizer().encode(text, false));
  size_t non_empty = 0;
  for (const std::string& c : s.chunks) non_empty += !c.empty();
  EXPECT_EQ(non_empty, s.tokens.size());
}

// ---- the chat reply -----------------------------------------------------------------------------

ReplySplitter::Delta split_char_by_char(const std::string& text, bool thinking, bool tools, std::string* section) {
  ReplySplitter sp(thinking, tools);
  ReplySplitter::Delta all;
  for (char c : text) {
    auto d = sp.push(std::string(1, c));
    all.reasoning += d.reasoning;
    all.content += d.content;
  }
  auto d = sp.finish();
  all.reasoning += d.reasoning;
  all.content += d.content;
  if (section) *section = sp.tool_section();
  return all;
}

TEST(ReplySplitter, SplitsReasoningAtTheClosingThinkTagEvenWhenItArrivesByteByByte) {
  std::string section;
  const auto d = split_char_by_char("\nLet me think.\n</think>\n\nThe answer is 4.", true, false, &section);
  EXPECT_EQ(d.reasoning, "Let me think.");
  EXPECT_EQ(d.content, "The answer is 4.");
  EXPECT_EQ(section, "");
}

TEST(ReplySplitter, AReplyThatOpensThinkStartsReasoning) {
  const auto d = split_char_by_char("<think>\nhmm\n</think>\nok", false, false, nullptr);
  EXPECT_EQ(d.reasoning, "hmm");
  EXPECT_EQ(d.content, "ok");
  const auto plain = split_char_by_char("<thin but not a tag", false, false, nullptr);
  EXPECT_EQ(plain.content, "<thin but not a tag");
}

TEST(ReplySplitter, ToolCallSectionIsKeptOutOfTheContent) {
  std::string section;
  const auto d = split_char_by_char("Sure.\n<tool_call>\n<function=f>\n</function>\n</tool_call>", false, true, &section);
  EXPECT_EQ(d.content, "Sure.");
  EXPECT_EQ(section, "<tool_call>\n<function=f>\n</function>\n</tool_call>");
  // Without tools the same text is all content.
  const auto no_tools = split_char_by_char("Sure.\n<tool_call>", false, false, nullptr);
  EXPECT_EQ(no_tools.content, "Sure.\n<tool_call>");
}

const char* kWeatherTools = R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
  "required": ["city"]}}}])";

const std::string kToolReply =
    "\nI should call the tool.\n</think>\n\nLet me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

CompletionRequest tool_request(bool stream) {
  CompletionRequest r;
  r.endpoint = Endpoint::Chat;
  r.template_options.tools = ojson::parse(kWeatherTools);
  r.parse_tool_calls = true;
  r.stream = stream;
  return r;
}

TEST(ChatResponse, ModelToolCallBecomesOpenAiToolCallsWithTypedArguments) {
  const CompletionRequest req = tool_request(false);
  ResponseContext ctx;
  ctx.request = &req;
  ctx.tokenizer = &tiny_tokenizer();
  ctx.id = "chatcmpl-test";
  ctx.model = "tiny";
  Generation g;
  StreamEvent e;
  e.text = kToolReply;
  e.final = true;
  e.finish = FinishReason::Stop;
  g.add(e);
  const ojson out = completion_response(ctx, g);
  const ojson& choice = out["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], "Let me check.");
  EXPECT_EQ(choice["message"]["reasoning_content"], "I should call the tool.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const ojson& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(ojson::parse(call["function"]["arguments"].get<std::string>()), ojson::parse(R"({"city": "Paris", "days": 3})"));
}

TEST(ChatResponse, UnterminatedToolCallStaysContentWithTheGenerationFinishReason) {
  const CompletionRequest req = tool_request(false);
  ResponseContext ctx;
  ctx.request = &req;
  ctx.tokenizer = &tiny_tokenizer();
  Generation g;
  StreamEvent e;
  e.text = "\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
  e.final = true;
  e.finish = FinishReason::Length;
  g.add(e);
  const ojson out = completion_response(ctx, g);
  EXPECT_EQ(out["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(out["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(out["choices"][0]["message"]["content"], "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar");
}

TEST(ChatStream, StreamedToolCallArrivesAsOneToolCallsDeltaAfterReasoningAndContent) {
  const CompletionRequest req = tool_request(true);
  ResponseContext ctx;
  ctx.request = &req;
  ctx.tokenizer = &tiny_tokenizer();
  StreamFormatter f(ctx);
  std::string sse = f.begin();
  for (size_t i = 0; i < kToolReply.size(); i += 3) {
    StreamEvent e;
    e.text = kToolReply.substr(i, 3);
    sse += f.on_event(e);
  }
  StreamEvent last;
  last.final = true;
  last.finish = FinishReason::Stop;
  sse += f.on_event(last);

  std::string reasoning, content, finish;
  ojson calls;
  size_t pos = 0;
  bool done = false;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    const std::string payload = sse.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    const ojson chunk = ojson::parse(payload);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    const ojson& delta = chunk["choices"][0]["delta"];
    if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"].get<std::string>();
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (delta.contains("tool_calls")) calls = delta["tool_calls"];
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(reasoning, "I should call the tool.");
  EXPECT_EQ(content, "Let me check.");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(finish, "tool_calls");
}

}  // namespace
}  // namespace hyspec::server
