// The OpenAI request bodies of /v1/chat/completions and /v1/completions, validated into what the
// engine runs, and OpenAI's error shape. Unknown fields are ignored; a known field with a wrong
// type or value is a 400 that names it.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "text/chat_template.h"

namespace hyspec::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field; "" gives null
  std::string code;   // "" gives null
};
// {"error": {"message", "type", "param", "code"}}
nlohmann::ordered_json error_json(const ApiError& e);

enum class Endpoint { Chat, Completion };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::string model;
  // Chat: the messages and how to render them; tool calls are parsed from the reply when the
  // request gave tools and tool_choice allows calling them.
  nlohmann::ordered_json messages;
  ChatTemplateOptions template_options;
  bool parse_tool_calls = false;
  // Completion: the prompt as text, or as token ids.
  std::string prompt;
  std::optional<std::vector<int32_t>> prompt_ids;
  // Generation.
  std::optional<int64_t> max_tokens;  // absent: up to the end of the context
  SamplingParams sampling;
  bool seed_given = false;
  std::vector<std::string> stop;
  int logprobs = -1;  // -1: off; else the number of top alternatives per token
  bool stream = false, include_usage = false;
  // hyspec extensions
  bool speculative = true;        // false: plain decoding for this request
  bool ignore_eos = false;        // keep generating past end-of-generation tokens
  bool return_token_ids = false;  // choices[i].token_ids (and prompt_token_ids)
};

// Fills `out` from a parsed JSON body; returns the first problem found.
std::optional<ApiError> parse_request(const nlohmann::ordered_json& body, Endpoint endpoint, CompletionRequest& out);

}  // namespace hyspec::server
