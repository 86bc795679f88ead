// OpenAI response bodies and SSE chunks from what the engine thread streamed: the chat reply split
// into reasoning, content and tool calls (incrementally for streams), logprobs in the chat and the
// completions shapes, usage with hyspec's draft statistics.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "server/channel.h"
#include "server/protocol.h"
#include "text/tokenizer.h"

namespace hyspec::server {

// JSON text; invalid UTF-8 (a token's partial character in logprobs) becomes U+FFFD.
std::string dump_json(const nlohmann::ordered_json& j);
// prefix + 24 random hex digits ("chatcmpl-...", "call_...").
std::string random_id(std::string_view prefix);

// Splits a chat reply as it arrives into reasoning (until </think>), content, and the tool-call
// section (from the first <tool_call>, only when tool calls are parsed). Text that could be the
// start of </think> or <tool_call> is held back until it is known; leading whitespace of the
// reasoning and of the content is dropped. A reply that starts with <think> opens reasoning.
class ReplySplitter {
 public:
  ReplySplitter(bool starts_in_reasoning, bool parse_tool_calls);
  struct Delta {
    std::string reasoning, content;
  };
  Delta push(std::string_view text);
  Delta finish();  // releases what is held back (the tool-call section stays in tool_section())
  const std::string& tool_section() const { return tools_; }

 private:
  enum class State { Start, Reasoning, Content, Tools };
  void process(Delta& d, bool final);
  State state_;
  bool parse_tool_calls_;
  bool reasoning_started_ = false, content_started_ = false;
  std::string buf_, tools_;
};

// One request's identity in its responses.
struct ResponseContext {
  const CompletionRequest* request = nullptr;
  const Tokenizer* tokenizer = nullptr;
  std::string id;       // chatcmpl-... / cmpl-...
  int64_t created = 0;  // unix seconds
  std::string model;
  std::string spec_method;  // what decoded this request: none, ngram, mtp, dflash
  std::vector<int32_t> prompt_ids;
};

// Everything generated for one request, gathered from its events.
struct Generation {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<EmittedLogprobs> logprobs;
  StreamEvent final;
  void add(const StreamEvent& e);
};

nlohmann::ordered_json completion_response(const ResponseContext& ctx, const Generation& g);

// The SSE frames ("data: {...}\n\n") of one streamed response.
class StreamFormatter {
 public:
  explicit StreamFormatter(ResponseContext ctx);
  std::string begin();                          // chat: the assistant-role chunk
  std::string on_event(const StreamEvent& e);   // text, then for the final event: finish, usage, [DONE]
  static std::string error_frames(const ApiError& e);  // an error object, then [DONE]

 private:
  nlohmann::ordered_json chunk(nlohmann::ordered_json choice) const;
  std::string frame(const nlohmann::ordered_json& j) const { return "data: " + dump_json(j) + "\n\n"; }
  nlohmann::ordered_json chat_delta_choice(nlohmann::ordered_json delta, const StreamEvent* e) const;
  ResponseContext ctx_;
  ReplySplitter splitter_;
  size_t text_offset_ = 0;  // completions logprobs: bytes of text sent before this chunk
};

}  // namespace hyspec::server
