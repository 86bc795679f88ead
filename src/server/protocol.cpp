#include "server/protocol.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace hyspec::server {

using ojson = nlohmann::ordered_json;

ojson error_json(const ApiError& e) {
  ojson err = ojson::object();
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? ojson(nullptr) : ojson(e.param);
  err["code"] = e.code.empty() ? ojson(nullptr) : ojson(e.code);
  return ojson{{"error", err}};
}

namespace {

const char* json_type_name(const ojson& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// Reads known fields one by one; the first problem is kept and later reads do nothing. A field
// that is absent or null keeps its default.
class FieldReader {
 public:
  explicit FieldReader(const ojson& body) : body_(body) {}
  std::optional<ApiError> error;

  const ojson* find(const char* key) const {
    auto it = body_.find(key);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }
  void fail(const std::string& param, std::string message, const std::string& code = "") {
    if (!error) error = ApiError{400, std::move(message), "invalid_request_error", param, code};
  }
  bool type_error(const char* key, const ojson& v, const char* expected) {
    fail(key, fmt::format("Invalid type for '{}': expected {}, but got {} instead.", key, expected, json_type_name(v)),
         "invalid_type");
    return false;
  }

  bool boolean(const char* key, bool& out) {
    const ojson* v = find(key);
    if (error || !v) return false;
    if (!v->is_boolean()) return type_error(key, *v, "a boolean");
    out = v->get<bool>();
    return true;
  }
  bool string(const char* key, std::string& out) {
    const ojson* v = find(key);
    if (error || !v) return false;
    if (!v->is_string()) return type_error(key, *v, "a string");
    out = v->get<std::string>();
    return true;
  }
  // A number in [lo, hi] (lo excluded when lo_open).
  bool number(const char* key, double& out, double lo, double hi, bool lo_open = false) {
    const ojson* v = find(key);
    if (error || !v) return false;
    if (!v->is_number()) return type_error(key, *v, "a number");
    const double x = v->get<double>();
    if (!std::isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi) {
      fail(key, fmt::format("Invalid '{}': expected a value in {}{}, {}], but got {} instead.", key, lo_open ? "(" : "[",
                            lo, hi, v->dump()), "invalid_value");
      return false;
    }
    out = x;
    return true;
  }
  bool number(const char* key, float& out, double lo, double hi, bool lo_open = false) {
    double x = 0;
    if (!number(key, x, lo, hi, lo_open)) return false;
    out = static_cast<float>(x);
    return true;
  }
  bool integer(const char* key, int64_t& out, int64_t lo, int64_t hi) {
    const ojson* v = find(key);
    if (error || !v) return false;
    if (!v->is_number_integer() && !(v->is_number_float() && v->get<double>() == std::floor(v->get<double>())))
      return type_error(key, *v, "an integer");
    const double x = v->get<double>();
    if (x < static_cast<double>(lo) || x > static_cast<double>(hi)) {
      fail(key, fmt::format("Invalid '{}': expected an integer in [{}, {}], but got {} instead.", key, lo, hi, v->dump()),
           "invalid_value");
      return false;
    }
    out = v->is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), INT64_MAX))
                                   : v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(x);
    return true;
  }
  void unsupported(const std::string& param, const std::string& what) {
    fail(param, fmt::format("{} is not supported by this server.", what), "unsupported_value");
  }

 private:
  const ojson& body_;
};

void read_common(FieldReader& r, CompletionRequest& out) {
  r.string("model", out.model);
  int64_t n = 1;
  if (r.integer("n", n, 1, 128) && n != 1) r.unsupported("n", "n > 1 (several choices per request)");
  int64_t best_of = 1;
  if (r.integer("best_of", best_of, 1, 128) && best_of != 1) r.unsupported("best_of", "best_of > 1");
  int64_t max_tokens = 0;
  if (r.integer("max_tokens", max_tokens, 1, INT32_MAX)) out.max_tokens = max_tokens;
  if (out.endpoint == Endpoint::Chat && r.integer("max_completion_tokens", max_tokens, 1, INT32_MAX))
    out.max_tokens = max_tokens;
  SamplingParams& sp = out.sampling;
  sp.temperature = 1.0f;  // OpenAI's default
  r.number("temperature", sp.temperature, 0, 2);
  r.number("top_p", sp.top_p, 0, 1, /*lo_open=*/true);
  int64_t top_k = 0;
  if (r.integer("top_k", top_k, -1, INT32_MAX)) sp.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  r.number("min_p", sp.min_p, 0, 1);
  r.number("presence_penalty", sp.presence_penalty, -2, 2);
  r.number("frequency_penalty", sp.frequency_penalty, -2, 2);
  r.number("repetition_penalty", sp.repeat_penalty, 0, 10, /*lo_open=*/true);
  int64_t seed = 0;
  if (r.integer("seed", seed, INT64_MIN, INT64_MAX)) {
    sp.seed = static_cast<uint64_t>(seed);
    out.seed_given = true;
  }
  if (const ojson* stop = r.find("stop"); stop && !r.error) {
    if (stop->is_string()) {
      out.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array() && stop->size() <= 16) {
      for (const ojson& s : *stop) {
        if (!s.is_string()) {
          r.type_error("stop", s, "a string or an array of strings");
          break;
        }
        out.stop.push_back(s.get<std::string>());
      }
    } else if (stop->is_array()) {
      r.fail("stop", "Invalid 'stop': at most 16 stop strings are supported.", "invalid_value");
    } else {
      r.type_error("stop", *stop, "a string or an array of strings");
    }
  }
  r.boolean("stream", out.stream);
  if (const ojson* so = r.find("stream_options"); so && !r.error) {
    if (!so->is_object()) {
      r.type_error("stream_options", *so, "an object");
    } else if (!out.stream) {
      r.fail("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
    } else {
      FieldReader sr(*so);
      sr.boolean("include_usage", out.include_usage);
      if (sr.error && !r.error) r.fail("stream_options.include_usage", sr.error->message, sr.error->code);
    }
  }
  if (const ojson* bias = r.find("logit_bias"); bias && !r.error) {
    if (!bias->is_object()) r.type_error("logit_bias", *bias, "an object");
    else if (!bias->empty()) r.unsupported("logit_bias", "logit_bias");
  }
  if (const ojson* rf = r.find("response_format"); rf && !r.error) {
    if (!rf->is_object()) r.type_error("response_format", *rf, "an object");
    else if (rf->value("type", std::string("text")) != "text") r.unsupported("response_format", "A structured response_format");
  }
  std::string user;
  r.string("user", user);
  r.boolean("speculative", out.speculative);
  r.boolean("ignore_eos", out.ignore_eos);
  r.boolean("return_token_ids", out.return_token_ids);
}

void read_chat(FieldReader& r, CompletionRequest& out) {
  const ojson* messages = r.find("messages");
  if (!r.error && !messages) r.fail("messages", "Missing required parameter: 'messages'.", "missing_required_parameter");
  else if (!r.error && !messages->is_array()) r.type_error("messages", *messages, "an array");
  else if (!r.error && messages->empty()) r.fail("messages", "'messages' must contain at least one message.", "invalid_value");
  else if (!r.error) {
    for (size_t i = 0; i < messages->size() && !r.error; ++i) {
      const ojson& m = (*messages)[i];
      if (!m.is_object()) r.type_error("messages", m, "an object for each message");
      else if (!m.contains("role") || !m["role"].is_string())
        r.fail(fmt::format("messages[{}].role", i), fmt::format("Missing or invalid 'messages[{}].role'.", i));
    }
    if (!r.error) out.messages = *messages;
  }
  bool logprobs = false;
  r.boolean("logprobs", logprobs);
  int64_t top = 0;
  const bool top_given = r.integer("top_logprobs", top, 0, 20);
  if (top_given && !logprobs) r.fail("top_logprobs", "'top_logprobs' requires 'logprobs' to be true.");
  out.logprobs = logprobs ? static_cast<int>(top) : -1;

  ChatTemplateOptions& t = out.template_options;
  t.add_generation_prompt = true;
  if (const ojson* tools = r.find("tools"); tools && !r.error) {
    if (!tools->is_array()) {
      r.type_error("tools", *tools, "an array");
    } else {
      for (size_t i = 0; i < tools->size() && !r.error; ++i) {
        const ojson& tool = (*tools)[i];
        const bool ok = tool.is_object() && tool.value("type", std::string("function")) == "function" &&
                        tool.contains("function") && tool["function"].is_object() &&
                        tool["function"].contains("name") && tool["function"]["name"].is_string();
        if (!ok) r.fail(fmt::format("tools[{}]", i), fmt::format("Invalid 'tools[{}]': expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}.", i));
      }
      if (!r.error && !tools->empty()) t.tools = *tools;
    }
  }
  bool call_tools = !t.tools.is_null();
  if (const ojson* choice = r.find("tool_choice"); choice && !r.error) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "none") call_tools = false;
      else if (c == "required") r.unsupported("tool_choice", "tool_choice 'required' (no constrained decoding)");
      else if (c != "auto") r.fail("tool_choice", fmt::format("Invalid 'tool_choice': '{}' (none, auto).", c), "invalid_value");
    } else if (choice->is_object()) {
      r.unsupported("tool_choice", "Forcing a named tool (no constrained decoding)");
    } else {
      r.type_error("tool_choice", *choice, "a string or an object");
    }
  }
  // tool_choice "none": the model is not shown the tools and nothing is parsed as a call.
  if (!call_tools) t.tools = nullptr;
  out.parse_tool_calls = call_tools;
  if (const ojson* kw = r.find("chat_template_kwargs"); kw && !r.error) {
    if (!kw->is_object()) {
      r.type_error("chat_template_kwargs", *kw, "an object");
    } else {
      FieldReader kr(*kw);
      bool thinking = true;
      if (kr.boolean("enable_thinking", thinking)) t.enable_thinking = thinking;
      if (kr.error && !r.error) r.fail("chat_template_kwargs.enable_thinking", kr.error->message, kr.error->code);
    }
  }
}

void read_completion(FieldReader& r, CompletionRequest& out) {
  const ojson* prompt = r.find("prompt");
  const auto token_ids = [&](const ojson& arr) -> std::optional<std::vector<int32_t>> {
    std::vector<int32_t> ids;
    for (const ojson& v : arr) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) return std::nullopt;
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    return ids;
  };
  if (!r.error && !prompt) {
    r.fail("prompt", "Missing required parameter: 'prompt'.", "missing_required_parameter");
  } else if (!r.error && prompt->is_string()) {
    out.prompt = prompt->get<std::string>();
  } else if (!r.error && prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
    out.prompt_ids = token_ids(*prompt);
    if (!out.prompt_ids) r.fail("prompt", "Invalid 'prompt': token ids must be non-negative integers.", "invalid_value");
  } else if (!r.error && prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    out.prompt = (*prompt)[0].get<std::string>();
  } else if (!r.error && prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_array()) {
    out.prompt_ids = token_ids((*prompt)[0]);
    if (!out.prompt_ids) r.fail("prompt", "Invalid 'prompt': token ids must be non-negative integers.", "invalid_value");
  } else if (!r.error && prompt->is_array() && prompt->size() > 1) {
    r.unsupported("prompt", "More than one prompt per request");
  } else if (!r.error) {
    r.type_error("prompt", *prompt, "a string, an array of token ids, or an array with one of those");
  }
  int64_t logprobs = -1;
  if (r.integer("logprobs", logprobs, 0, 20)) out.logprobs = static_cast<int>(logprobs);
  bool echo = false;
  if (r.boolean("echo", echo) && echo) r.unsupported("echo", "echo");
  std::string suffix;
  if (r.string("suffix", suffix) && !suffix.empty()) r.unsupported("suffix", "suffix");
}

}  // namespace

std::optional<ApiError> parse_request(const ojson& body, Endpoint endpoint, CompletionRequest& out) {
  if (!body.is_object()) return ApiError{400, "The request body must be a JSON object.", "invalid_request_error", "", ""};
  out = CompletionRequest{};
  out.endpoint = endpoint;
  FieldReader r(body);
  if (endpoint == Endpoint::Chat) read_chat(r, out);
  else read_completion(r, out);
  read_common(r, out);
  return r.error;
}

}  // namespace hyspec::server
