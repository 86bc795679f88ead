// Request validation (parse_request): every known field's type and range, unknown fields ignored.
#include <gtest/gtest.h>

#include "server/protocol.h"

namespace hyspec::server {
namespace {

using ojson = nlohmann::ordered_json;

std::optional<ApiError> parse(const std::string& body, Endpoint endpoint, CompletionRequest* out = nullptr) {
  CompletionRequest r;
  auto err = parse_request(ojson::parse(body), endpoint, r);
  if (out) *out = r;
  return err;
}

struct BadCase {
  std::string body;
  std::string param;  // the field the 400 must name
};

TEST(ParseRequest, WrongTypesAndValuesAre400NamingTheField) {
  const std::vector<BadCase> chat = {
      {R"({})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": -0.1})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 2.5})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})", "top_p"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_p": 1.01})", "top_p"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_k": -2})", "top_k"},
      {R"({"messages": [{"role": "user", "content": "x"}], "min_p": 1.5})", "min_p"},
      {R"({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 2.5})", "presence_penalty"},
      {R"({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": "no"})", "frequency_penalty"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3})", "max_completion_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 2})", "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 0})", "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "seed": "x"})", "seed"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": 5})", "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": ["a", 1]})", "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", "stream"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": true, "stream_options": {"include_usage": 1}})",
       "stream_options.include_usage"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": "no"}})",
       "chat_template_kwargs.enable_thinking"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})", "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 10}})", "logit_bias"},
      {R"({"messages": [{"role": "user", "content": "x"}], "speculative": "off"})", "speculative"},
      {R"({"messages": [{"role": "user", "content": "x"}], "model": 7})", "model"},
  };
  for (const BadCase& c : chat) {
    const auto err = parse(c.body, Endpoint::Chat);
    ASSERT_TRUE(err.has_value()) << c.body;
    EXPECT_EQ(err->status, 400) << c.body;
    EXPECT_EQ(err->param, c.param) << c.body << ": " << err->message;
    EXPECT_EQ(err->type, "invalid_request_error");
    EXPECT_FALSE(err->message.empty());
  }
  const std::vector<BadCase> completion = {
      {R"({})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": ["a", "b"]})", "prompt"},
      {R"({"prompt": [1, -2]})", "prompt"},
      {R"({"prompt": "x", "logprobs": true})", "logprobs"},
      {R"({"prompt": "x", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "x", "echo": true})", "echo"},
      {R"({"prompt": "x", "best_of": 3})", "best_of"},
  };
  for (const BadCase& c : completion) {
    const auto err = parse(c.body, Endpoint::Completion);
    ASSERT_TRUE(err.has_value()) << c.body;
    EXPECT_EQ(err->param, c.param) << c.body << ": " << err->message;
  }
  EXPECT_EQ(parse("[1, 2]", Endpoint::Chat)->status, 400);
}

TEST(ParseRequest, UnknownFieldsAreIgnoredAndKnownOnesRead) {
  CompletionRequest r;
  const auto err = parse(R"({"messages": [{"role": "user", "content": "x"}], "frobnicate": {"a": 1},
      "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 40, "min_p": 0.1, "seed": 42,
      "presence_penalty": 0.5, "frequency_penalty": -0.5, "stop": "END", "stream": true,
      "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3, "speculative": false,
      "chat_template_kwargs": {"enable_thinking": false, "other": 1}, "tool_choice": "auto", "user": "u"})",
                         Endpoint::Chat, &r);
  ASSERT_FALSE(err.has_value()) << err->message;
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_FALSE(r.speculative);
  EXPECT_EQ(r.template_options.enable_thinking, false);
  EXPECT_FALSE(r.parse_tool_calls) << "no tools given";
}

TEST(ParseRequest, DefaultsFollowOpenAi) {
  CompletionRequest r;
  ASSERT_FALSE(parse(R"({"prompt": "x"})", Endpoint::Completion, &r).has_value());
  EXPECT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.logprobs, -1);
  EXPECT_TRUE(r.speculative);
  ASSERT_FALSE(parse(R"({"prompt": [[1, 2, 3]]})", Endpoint::Completion, &r).has_value());
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
}

TEST(ParseRequest, ToolChoiceNoneHidesTheToolsAndParsesNoCalls) {
  CompletionRequest r;
  const std::string tools = R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])";
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": "x"}], "tools": )" + tools + "}", Endpoint::Chat, &r));
  EXPECT_TRUE(r.parse_tool_calls);
  EXPECT_TRUE(r.template_options.tools.is_array());
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "none", "tools": )" + tools + "}",
                     Endpoint::Chat, &r));
  EXPECT_FALSE(r.parse_tool_calls);
  EXPECT_TRUE(r.template_options.tools.is_null());
}

TEST(ErrorJson, HasOpenAiShape) {
  const auto j = error_json(ApiError{400, "bad", "invalid_request_error", "temperature", ""});
  EXPECT_EQ(j.dump(), R"({"error":{"message":"bad","type":"invalid_request_error","param":"temperature","code":null}})");
}

}  // namespace
}  // namespace hyspec::server
