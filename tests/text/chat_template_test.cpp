// The Qwen3.5 chat template against jinja2's rendering of Qwen3.5-4B.jinja: the shared fixture cases
// and the branch cases of tests/text/chat_template_oracle_cases.json (tools/chat_template_oracle.py),
// then the reply parser.
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include "common/fixtures.h"

namespace hyspec {
namespace {

using Json = nlohmann::ordered_json;

struct OracleCase {
  std::string name;
  Json spec;
};

std::vector<OracleCase> load_cases(const std::string& path) {
  const Json file = Json::parse(test::read_text_file(path));
  std::vector<OracleCase> cases;
  for (const Json& c : file.at("cases")) cases.push_back({c.at("name").get<std::string>(), c});
  return cases;
}

ChatTemplateOptions options_of(const Json& spec) {
  ChatTemplateOptions options;
  options.add_generation_prompt = spec.value("add_generation_prompt", true);
  if (spec.contains("enable_thinking")) options.enable_thinking = spec["enable_thinking"].get<bool>();
  if (spec.contains("tools")) options.tools = spec["tools"];
  options.add_vision_id = spec.value("add_vision_id", false);
  return options;
}

class ChatTemplateMatchesJinja : public ::testing::TestWithParam<OracleCase> {};

TEST_P(ChatTemplateMatchesJinja, RendersByteIdenticalOrRaisesTheSameError) {
  const Json& spec = GetParam().spec;
  const auto rendered = render_chat_template(spec.at("messages"), options_of(spec));
  if (spec.contains("error")) {
    ASSERT_FALSE(rendered.is_ok()) << "jinja2 raised, but we rendered:\n" << rendered.value();
    const std::string template_message = spec["error"].get<std::string>();  // "" when not raise_exception
    EXPECT_NE(rendered.message().find(template_message), std::string::npos) << rendered.message();
  } else {
    ASSERT_TRUE(rendered.is_ok()) << rendered.message();
    EXPECT_EQ(rendered.value(), spec.at("expected").get<std::string>());
  }
}

std::string case_name(const ::testing::TestParamInfo<OracleCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(SharedFixture, ChatTemplateMatchesJinja,
                         ::testing::ValuesIn(load_cases(test::fixture_path("tokenizer/chat_template_cases.json"))),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Branches, ChatTemplateMatchesJinja,
                         ::testing::ValuesIn(load_cases(test::source_dir() + "/tests/text/chat_template_oracle_cases.json")),
                         case_name);

const Json kWeatherTool = Json::parse(R"({"type": "function", "function": {"name": "get_weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
  "metric": {"type": "boolean"}, "lat": {"type": "number"}, "hours": {"type": "array"},
  "where": {"type": "object"}, "note": {"type": ["null", "string"]}}}}})");

std::string render(const Json& messages, ChatTemplateOptions options = {}) {
  auto rendered = render_chat_template(messages, options);
  EXPECT_TRUE(rendered.is_ok()) << rendered.message();
  return rendered.is_ok() ? rendered.value() : std::string();
}

// ---- template branches, stated as properties ---------------------------------------------------

TEST(ChatTemplate, SecondSystemMessageIsRejectedWithTheTemplatesMessage) {
  const Json messages = Json::parse(R"([{"role": "system", "content": "a"}, {"role": "system", "content": "b"},
                                        {"role": "user", "content": "q"}])");
  const auto rendered = render_chat_template(messages, {});
  ASSERT_FALSE(rendered.is_ok());
  EXPECT_EQ(rendered.message(), "messages[1]: System message must be at the beginning.");
}

TEST(ChatTemplate, ConsecutiveToolResponsesShareOneUserTurn) {
  const Json messages = Json::parse(R"([{"role": "user", "content": "q"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a", "arguments": {}}}]},
    {"role": "tool", "content": "A"}, {"role": "tool", "content": "B"}])");
  EXPECT_EQ(render(messages),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=a>\n"
            "</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nA\n</tool_response>\n"
            "<tool_response>\nB\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n");
}

TEST(ChatTemplate, ReasoningIsKeptOnlyAfterTheLastUserQuery) {
  Json messages = Json::parse(R"([{"role": "user", "content": "q1"},
    {"role": "assistant", "content": "a1", "reasoning_content": "r1"}])");
  ChatTemplateOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(render(messages, no_prompt),
            "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>\n");
  messages.push_back(Json::parse(R"({"role": "user", "content": "q2"})"));
  EXPECT_EQ(render(messages, no_prompt),
            "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n");
}

TEST(ChatTemplate, WrappedToolResponseInAUserMessageDoesNotEndTheAgenticStep) {
  const Json messages = Json::parse(R"([{"role": "user", "content": "q"},
    {"role": "assistant", "content": "a", "reasoning_content": "r"},
    {"role": "user", "content": "<tool_response>\nx\n</tool_response>"}])");
  EXPECT_NE(render(messages).find("<think>\nr\n</think>\n\na"), std::string::npos);
}

TEST(ChatTemplate, ToolCallArgumentsAsJsonStringRenderLikeTheObject) {
  const Json as_object = Json::parse(R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"z": 1.50, "a": [true, null], "s": "x"}}}]}])");
  Json as_string = as_object;
  as_string[1]["tool_calls"][0]["function"]["arguments"] = R"({"z": 1.50, "a": [true, null], "s": "x"})";
  const std::string expected = render(as_object);
  EXPECT_NE(expected.find("<parameter=z>\n1.5\n</parameter>\n<parameter=a>\n[true, null]\n</parameter>"), std::string::npos);
  EXPECT_EQ(render(as_string), expected);
}

TEST(ChatTemplate, ToolCallArgumentsThatAreNotAnObjectAreRejected) {
  Json messages = Json::parse(R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
    "tool_calls": [{"function": {"name": "f", "arguments": "[1, 2]"}}]}])");
  EXPECT_FALSE(render_chat_template(messages, {}).is_ok());
  messages[1]["tool_calls"][0]["function"]["arguments"] = "{not json";
  EXPECT_FALSE(render_chat_template(messages, {}).is_ok());
}

TEST(ChatTemplate, ToolsAreSerialisedInTheKeyOrderGiven) {
  ChatTemplateOptions options;
  options.tools = Json::array({Json::parse(R"({"type": "function", "function": {"name": "z", "description": "d"}})")});
  EXPECT_NE(render(Json::parse(R"([{"role": "user", "content": "q"}])"), options)
                .find("\n{\"type\": \"function\", \"function\": {\"name\": \"z\", \"description\": \"d\"}}\n</tools>"),
            std::string::npos);
}

TEST(ChatTemplate, ToolsThatAreNotAListAreRejected) {
  ChatTemplateOptions options;
  options.tools = Json::parse(R"({"type": "function"})");
  EXPECT_FALSE(render_chat_template(Json::parse(R"([{"role": "user", "content": "q"}])"), options).is_ok());
}

// ---- parse_assistant_output ---------------------------------------------------------------------

ChatTemplateOptions prompt_with(std::optional<bool> thinking, Json tools = nullptr) {
  ChatTemplateOptions options;
  options.enable_thinking = thinking;
  options.tools = std::move(tools);
  return options;
}

TEST(ParseAssistantOutput, ThinkingReplyRunsAsReasoningUntilCloseTag) {
  const auto parsed = parse_assistant_output("Rayleigh.\n</think>\n\nBlue light scatters more.", prompt_with({}));
  ASSERT_TRUE(parsed.is_ok()) << parsed.message();
  EXPECT_EQ(parsed->reasoning_content, "Rayleigh.");
  EXPECT_EQ(parsed->content, "Blue light scatters more.");
  EXPECT_TRUE(parsed->tool_calls.empty());
}

TEST(ParseAssistantOutput, ReplyCutShortWhileThinkingIsAllReasoning) {
  const auto parsed = parse_assistant_output("Let me think about", prompt_with(true));
  ASSERT_TRUE(parsed.is_ok());
  EXPECT_EQ(parsed->reasoning_content, "Let me think about");
  EXPECT_EQ(parsed->content, "");
}

TEST(ParseAssistantOutput, ReplyWithThinkingOffIsAllContent) {
  const auto parsed = parse_assistant_output("Just the answer.", prompt_with(false));
  ASSERT_TRUE(parsed.is_ok());
  EXPECT_EQ(parsed->reasoning_content, "");
  EXPECT_EQ(parsed->content, "Just the answer.");
}

TEST(ParseAssistantOutput, ParameterValuesTakeTheTypesOfTheToolSchema) {
  const std::string text =
      "Checking.\n</think>\n\nOn it.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=lat>\n48.85\n</parameter>\n"
      "<parameter=hours>\n[1, 2]\n</parameter>\n<parameter=where>\n{\"x\": \"y\"}\n</parameter>\n"
      "<parameter=note>\nNone\n</parameter>\n<parameter=unknown>\n7\n</parameter>\n</function>\n</tool_call>";
  const auto parsed = parse_assistant_output(text, prompt_with({}, Json::array({kWeatherTool})));
  ASSERT_TRUE(parsed.is_ok()) << parsed.message();
  EXPECT_EQ(parsed->reasoning_content, "Checking.");
  EXPECT_EQ(parsed->content, "On it.");
  ASSERT_EQ(parsed->tool_calls.size(), 1u);
  EXPECT_EQ(parsed->tool_calls[0].name, "get_weather");
  EXPECT_EQ(parsed->tool_calls[0].arguments,
            Json::parse(R"({"city": "42", "days": 3, "metric": true, "lat": 48.85, "hours": [1, 2],
                            "where": {"x": "y"}, "note": null, "unknown": "7"})"));
}

TEST(ParseAssistantOutput, ValueThatDoesNotFitItsTypeStaysAString) {
  const auto parsed = parse_assistant_output(
      "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>",
      prompt_with(false, Json::array({kWeatherTool})));
  ASSERT_TRUE(parsed.is_ok());
  EXPECT_EQ(parsed->tool_calls.at(0).arguments, Json::parse(R"({"days": "three"})"));
}

TEST(ParseAssistantOutput, MultilineValuesAndSeveralCallsAreRead) {
  const auto parsed = parse_assistant_output(
      "<tool_call>\n<function=write>\n<parameter=text>\nline 1\nline 2\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=now>\n</function>\n</tool_call>",
      prompt_with(false));
  ASSERT_TRUE(parsed.is_ok()) << parsed.message();
  ASSERT_EQ(parsed->tool_calls.size(), 2u);
  EXPECT_EQ(parsed->tool_calls[0].arguments, Json::parse(R"({"text": "line 1\nline 2"})"));
  EXPECT_EQ(parsed->tool_calls[1].name, "now");
  EXPECT_EQ(parsed->tool_calls[1].arguments, Json::object());
}

TEST(ParseAssistantOutput, JsonToolCallBodyIsAccepted) {
  const auto parsed = parse_assistant_output(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
      prompt_with(false));
  ASSERT_TRUE(parsed.is_ok()) << parsed.message();
  ASSERT_EQ(parsed->tool_calls.size(), 1u);
  EXPECT_EQ(parsed->tool_calls[0].name, "get_weather");
  EXPECT_EQ(parsed->tool_calls[0].arguments, Json::parse(R"({"city": "Paris", "days": 2})"));
}

TEST(ParseAssistantOutput, UnterminatedOrUnreadableToolCallIsAnError) {
  EXPECT_FALSE(parse_assistant_output("<tool_call>\n<function=f>\n", prompt_with(false)).is_ok());
  EXPECT_FALSE(parse_assistant_output("<tool_call>\nf(1)\n</tool_call>", prompt_with(false)).is_ok());
  EXPECT_FALSE(parse_assistant_output("<tool_call>\n{\"arguments\": {}}\n</tool_call>", prompt_with(false)).is_ok());
}

// The assistant turn that render_chat_template writes for `assistant`, between
// "<|im_start|>assistant\n" and "<|im_end|>\n".
std::string rendered_turn(const Json& assistant, const Json& tools) {
  ChatTemplateOptions options;
  options.add_generation_prompt = false;
  options.tools = tools;
  const Json messages = Json::array({Json::parse(R"({"role": "user", "content": "q"})"), assistant});
  const std::string all = render(messages, options);
  const std::string open = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n";
  const size_t at = all.find(open);
  EXPECT_NE(at, std::string::npos);
  EXPECT_TRUE(all.ends_with("<|im_end|>\n"));
  return all.substr(at + open.size(), all.size() - at - open.size() - std::string("<|im_end|>\n").size());
}

TEST(ParseAssistantOutput, ParsingARenderedAssistantTurnGivesBackTheMessage) {
  const Json tools = Json::array({kWeatherTool});
  const Json assistants = Json::parse(R"([
    {"role": "assistant", "content": "Plain answer.", "reasoning_content": "Short thought."},
    {"role": "assistant", "content": "", "reasoning_content": "", "tool_calls": []},
    {"role": "assistant", "content": "Let me look.", "reasoning_content": "Need weather.\nTwo lines.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments":
       {"city": "São Paulo", "days": 3, "metric": false, "lat": -23.5, "hours": [6, 12.5], "where": {"a": [1, {"b": null}]},
        "note": null}}}]},
    {"role": "assistant", "content": "", "reasoning_content": "Two at once.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "multi\nline\n"}}},
                    {"type": "function", "function": {"name": "now", "arguments": {}}}]}])");
  for (const Json& assistant : assistants) {
    SCOPED_TRACE(assistant.dump());
    const std::string turn = rendered_turn(assistant, tools);
    const auto parsed = parse_assistant_output(turn, prompt_with({}, tools));
    ASSERT_TRUE(parsed.is_ok()) << parsed.message();
    EXPECT_EQ(parsed->reasoning_content, assistant["reasoning_content"].get<std::string>());
    EXPECT_EQ(parsed->content, assistant["content"].get<std::string>());
    const Json calls = assistant.value("tool_calls", Json::array());
    ASSERT_EQ(parsed->tool_calls.size(), calls.size());
    for (size_t k = 0; k < calls.size(); ++k) {
      EXPECT_EQ(parsed->tool_calls[k].name, calls[k]["function"]["name"].get<std::string>());
      EXPECT_EQ(parsed->tool_calls[k].arguments, calls[k]["function"]["arguments"]);
    }
    // And the parsed message renders to the same turn.
    Json again = {{"role", "assistant"}, {"content", parsed->content}, {"reasoning_content", parsed->reasoning_content}};
    for (const ToolCall& call : parsed->tool_calls) {
      again["tool_calls"].push_back({{"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    }
    EXPECT_EQ(rendered_turn(again, tools), turn);
  }
}

}  // namespace
}  // namespace hyspec
