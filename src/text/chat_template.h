// The Qwen3.5 chat template (Qwen3.5-4B.jinja), written out in C++, and the parser for the replies it
// asks for. render_chat_template is byte-identical to transformers' apply_chat_template (jinja2,
// trim_blocks + lstrip_blocks, tojson = json.dumps(ensure_ascii=False)) for every input the
// template renders, and fails with the template's own message where it raises.
//
// JSON is nlohmann::ordered_json: the template prints tools and tool-call arguments in the order
// their keys were written, which nlohmann::json (sorted keys) would lose. Parse requests with
// nlohmann::ordered_json::parse.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace hyspec {

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // absent = the template's default (thinking on)
  // OpenAI `tools`: null or an array of tool definitions ({"type":"function","function":{...}}),
  // printed as they are into the system turn.
  nlohmann::ordered_json tools;
  bool add_vision_id = false;  // "Picture N: " / "Video N: " before each image / video
};

// `messages`: an array of OpenAI chat messages: {"role": system|user|assistant|tool,
// "content": string | null | [parts]}, parts {"type":"text","text":...}, {"type":"image_url",...},
// {"type":"image"...}, {"type":"video"...}; assistant messages may carry "reasoning_content" and
// "tool_calls" ([{"type":"function","function":{"name":..., "arguments": {...}}}]).
//
// One departure from the bare template: tool-call `arguments` given as a JSON string (the OpenAI
// wire form) are decoded to the object first, as serving stacks do; the template itself would
// raise on a string. Malformed input (unknown role, system message not first, no user query,
// non-object arguments, ...) is an error, never a best-effort prompt.
Result<std::string> render_chat_template(const nlohmann::ordered_json& messages,
                                         const ChatTemplateOptions& options);

// ---- the reverse direction: the model's reply -----------------------------------------------

struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
};

struct ParsedAssistant {
  std::string reasoning_content;  // stripped, as the template stores it in history
  std::string content;            // stripped; the text before the first <tool_call>
  std::vector<ToolCall> tool_calls;
};

// Splits what the model generated after a prompt rendered with `prompt_options` into reasoning,
// content and tool calls. The text ends before <|im_end|>. With add_generation_prompt and thinking
// on, the prompt opened <think>, so the text is reasoning until </think> (all of it, if the reply
// was cut short); otherwise reasoning is an optional leading <think>...</think>, split with the
// template's own rule for assistant history.
//
// Tool calls are the template's format,
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
// or a JSON body {"name": ..., "arguments": {...}} between the same tags. VALUE text becomes a JSON
// value by the parameter's "type" in `prompt_options.tools` (integer, number, boolean, null, object,
// array); without a type it stays a string. Text between or after tool calls is dropped (the
// template tells the model to write none). An unterminated or unreadable tool call is an error.
// For an assistant turn rendered by render_chat_template, parsing gives back its reasoning,
// content and tool calls.
Result<ParsedAssistant> parse_assistant_output(std::string_view text,
                                               const ChatTemplateOptions& prompt_options);

}  // namespace hyspec
