// Qwen3.5-4B.jinja, statement by statement, and the parser of the replies it asks for. Where jinja2
// semantics matter (undefined members, Python's `in`, str.strip, str(), tojson) the helpers say so.
#include "text/chat_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "text/python_text.h"

namespace hyspec {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kToolsHeader =
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr std::string_view kToolsFooter =
    "\n</tools>"
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> "
    "block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be "
    "specified\n- You may provide optional reasoning for your function call in natural language "
    "BEFORE the function call, but NOT after\n- If there is no function call available, answer the "
    "question like normal with your current knowledge and do not tell the user about function "
    "calls\n</IMPORTANT>";

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";

// `obj.key` as jinja2 reads it: an object's member, or undefined (nullptr) for anything else.
const Json* member(const Json* obj, const char* key) {
  if (obj == nullptr || !obj->is_object()) return nullptr;
  const auto it = obj->find(key);
  return it == obj->end() ? nullptr : &*it;
}

bool is_string_equal(const Json* v, std::string_view s) {
  return v != nullptr && v->is_string() && v->get_ref<const std::string&>() == s;
}

// message.role; "" when undefined or not a string (it then equals no role the template knows).
std::string_view role_of(const Json& message) {
  const Json* role = member(&message, "role");
  return role != nullptr && role->is_string() ? std::string_view(role->get_ref<const std::string&>())
                                              : std::string_view();
}

// Python's `needle in value` for a content part that is an object (key), a string (substring) or
// an array (element); the caller has refused every other type, on which Python raises TypeError.
bool py_contains(const Json& value, const char* needle) {
  if (value.is_object()) return value.contains(needle);
  if (value.is_string()) return value.get_ref<const std::string&>().find(needle) != std::string::npos;
  for (const Json& element : value) {
    if (is_string_equal(&element, needle)) return true;
  }
  return false;
}

std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}

std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

struct ThinkSplit {
  std::string_view reasoning, content;
};

// The template's split of an assistant text that contains </think>:
//   reasoning = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
//   content   = text.split('</think>')[-1].lstrip('\n')
std::optional<ThinkSplit> split_think(std::string_view text) {
  const size_t close = text.find(kThinkClose);
  if (close == std::string_view::npos) return std::nullopt;
  std::string_view reasoning = rstrip_newlines(text.substr(0, close));
  if (const size_t open = reasoning.rfind(kThinkOpen); open != std::string_view::npos) {
    reasoning.remove_prefix(open + kThinkOpen.size());
  }
  return ThinkSplit{lstrip_newlines(reasoning),
                    lstrip_newlines(text.substr(text.rfind(kThinkClose) + kThinkClose.size()))};
}

// Tool-call arguments as an object: the object itself, or a JSON string that encodes one.
Result<Json> arguments_object(const Json& arguments) {
  if (arguments.is_object()) return arguments;
  if (arguments.is_string()) {
    Json decoded = Json::parse(arguments.get_ref<const std::string&>(), nullptr, /*allow_exceptions=*/false);
    if (decoded.is_object()) return decoded;
    return Status::error("arguments string is not a JSON object");
  }
  return Status::errorf("arguments must be an object or a JSON-encoded object, not {}", arguments.type_name());
}

class Renderer {
 public:
  Renderer(const Json& messages, const ChatTemplateOptions& options) : messages_(messages), options_(options) {}

  Result<std::string> run() {
    // {%- if not messages %}
    if (messages_.is_null() || (messages_.is_array() && messages_.empty())) {
      return Status::error("No messages provided.");
    }
    if (!messages_.is_array()) return Status::errorf("messages must be an array, not {}", messages_.type_name());
    HS_RETURN_IF_ERROR(render_system_turn());
    HS_ASSIGN_OR_RETURN(const size_t last_query, last_query_index());
    for (size_t i = 0; i < messages_.size(); ++i) {
      HS_RETURN_IF_ERROR(render_message(i, last_query).with_context(fmt::format("messages[{}]", i)));
    }
    if (options_.add_generation_prompt) {
      out_ += "<|im_start|>assistant\n";
      out_ += options_.enable_thinking == false ? "<think>\n\n</think>\n\n" : "<think>\n";
    }
    return std::move(out_);
  }

 private:
  // macro render_content(content, do_vision_count, is_system_content), before its |trim.
  Result<std::string> render_content(const Json* content, bool count_vision, bool is_system) {
    if (content == nullptr || content->is_null()) return std::string();
    if (content->is_string()) return content->get<std::string>();
    if (!content->is_array()) return Status::error("Unexpected content type.");
    std::string out;
    for (const Json& item : *content) {
      if (!item.is_object() && !item.is_string() && !item.is_array()) {
        return Status::errorf("content part of type {} is neither an object nor a string", item.type_name());
      }
      const Json* type = member(&item, "type");
      if (py_contains(item, "image") || py_contains(item, "image_url") || is_string_equal(type, "image")) {
        if (is_system) return Status::error("System message cannot contain images.");
        if (count_vision) ++image_count_;
        if (options_.add_vision_id) out += fmt::format("Picture {}: ", image_count_);
        out += "<|vision_start|><|image_pad|><|vision_end|>";
      } else if (py_contains(item, "video") || is_string_equal(type, "video")) {
        if (is_system) return Status::error("System message cannot contain videos.");
        if (count_vision) ++video_count_;
        if (options_.add_vision_id) out += fmt::format("Video {}: ", video_count_);
        out += "<|vision_start|><|video_pad|><|vision_end|>";
      } else if (py_contains(item, "text")) {
        // item.text of a string or array part is undefined and prints as nothing.
        if (const Json* text = member(&item, "text")) {
          HS_ASSIGN_OR_RETURN(const std::string printed, py_str(*text));
          out += printed;
        }
      } else {
        return Status::error("Unexpected item type in content.");
      }
    }
    return out;
  }

  Result<std::string> stripped_content(const Json& message, bool count_vision, bool is_system) {
    HS_ASSIGN_OR_RETURN(const std::string raw, render_content(member(&message, "content"), count_vision, is_system));
    return std::string(py_strip(raw));
  }

  // The leading system turn: the tool list (when tools is a non-empty list) plus messages[0] when
  // it is a system message.
  Status render_system_turn() {
    const Json& tools = options_.tools;
    if (!tools.is_null() && !tools.is_array()) {
      return Status::errorf("tools must be an array of tool definitions, not {}", tools.type_name());
    }
    const bool system_first = role_of(messages_[0]) == "system";
    std::string system;
    if (system_first) {
      auto content = stripped_content(messages_[0], false, true);
      if (!content) return content.status().with_context("messages[0]");
      system = std::move(content.value());
    }
    if (!tools.empty()) {
      out_ += kToolsHeader;
      for (const Json& tool : tools) {
        out_ += '\n';
        HS_RETURN_IF_ERROR(append_py_json(out_, tool).with_context("tools"));
      }
      out_ += kToolsFooter;
      if (!system.empty()) out_ += "\n\n" + system;
      out_ += "<|im_end|>\n";
    } else if (system_first) {
      out_ += "<|im_start|>system\n" + system + "<|im_end|>\n";
    }
    return Status::ok();
  }

  // ns.last_query_index: the last user message that is not a wrapped tool response.
  Result<size_t> last_query_index() {
    for (size_t k = messages_.size(); k-- > 0;) {
      if (role_of(messages_[k]) != "user") continue;
      auto content = stripped_content(messages_[k], false, false);
      if (!content) return content.status().with_context(fmt::format("messages[{}]", k));
      const std::string_view c = content.value();
      if (!(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))) return k;
    }
    return Status::error("No user query found in messages.");
  }

  Status render_message(size_t i, size_t last_query) {
    const Json& message = messages_[i];
    HS_ASSIGN_OR_RETURN(std::string content, stripped_content(message, true, false));
    const std::string_view role = role_of(message);
    if (role == "system") {
      if (i != 0) return Status::error("System message must be at the beginning.");
    } else if (role == "user") {
      out_ += "<|im_start|>user\n" + content + "<|im_end|>\n";
    } else if (role == "assistant") {
      return render_assistant(message, std::move(content), i > last_query);
    } else if (role == "tool") {
      // Consecutive tool messages share one user turn. loop.previtem is undefined for the first
      // message, so a leading tool message opens no turn.
      if (i > 0 && role_of(messages_[i - 1]) != "tool") out_ += "<|im_start|>user";
      out_ += "\n<tool_response>\n" + content + "\n</tool_response>";
      if (i + 1 == messages_.size() || role_of(messages_[i + 1]) != "tool") out_ += "<|im_end|>\n";
    } else {
      return Status::error("Unexpected message role.");
    }
    return Status::ok();
  }

  // Turns after the last user query (the current agentic step) keep their reasoning in a
  // <think> block; earlier turns drop it.
  Status render_assistant(const Json& message, std::string content, bool keep_reasoning) {
    std::string reasoning;
    const Json* reasoning_field = member(&message, "reasoning_content");
    if (reasoning_field != nullptr && reasoning_field->is_string()) {
      reasoning = reasoning_field->get<std::string>();
    } else if (const auto split = split_think(content)) {
      reasoning = split->reasoning;
      content = std::string(split->content);
    }
    out_ += "<|im_start|>assistant\n";
    if (keep_reasoning) out_ += "<think>\n" + std::string(py_strip(reasoning)) + "\n</think>\n\n";
    out_ += content;
    HS_RETURN_IF_ERROR(render_tool_calls(member(&message, "tool_calls"), !py_strip(content).empty()));
    out_ += "<|im_end|>\n";
    return Status::ok();
  }

  Status render_tool_calls(const Json* calls, bool after_content) {
    if (calls != nullptr && calls->is_string() && !calls->get_ref<const std::string&>().empty()) {
      return Status::error("tool_calls must be an array of tool calls, not a string");
    }
    if (calls == nullptr || !calls->is_array()) return Status::ok();  // the template skips the rest
    for (size_t k = 0; k < calls->size(); ++k) {
      const Json* call = &(*calls)[k];
      if (const Json* function = member(call, "function")) call = function;
      const Json* name = member(call, "name");
      if (name == nullptr || !name->is_string()) {
        return Status::errorf("tool_calls[{}]: the function name is missing or not a string", k);
      }
      out_ += k > 0 ? "\n<tool_call>\n<function=" : after_content ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=";
      out_ += name->get_ref<const std::string&>() + ">\n";
      if (const Json* arguments = member(call, "arguments")) {
        HS_RETURN_IF_ERROR(render_arguments(*arguments).with_context(fmt::format("tool_calls[{}]", k)));
      }
      out_ += "</function>\n</tool_call>";
    }
    return Status::ok();
  }

  // {%- for args_name, args_value in tool_call.arguments|items %}: objects and arrays as tojson,
  // everything else as Python's str().
  Status render_arguments(const Json& arguments) {
    HS_ASSIGN_OR_RETURN(const Json object, arguments_object(arguments));
    for (const auto& [name, value] : object.items()) {
      out_ += kParameterOpen;
      out_ += name + ">\n";
      if (value.is_object() || value.is_array()) {
        HS_RETURN_IF_ERROR(append_py_json(out_, value));
      } else {
        HS_ASSIGN_OR_RETURN(const std::string printed, py_str(value));
        out_ += printed;
      }
      out_ += "\n</parameter>\n";
    }
    return Status::ok();
  }

  const Json& messages_;
  const ChatTemplateOptions& options_;
  int image_count_ = 0;  // namespace image_count / video_count: numbering across the whole chat
  int video_count_ = 0;
  std::string out_;
};

// ---- parse_assistant_output -------------------------------------------------------------------

// The JSON-schema "type" of parameter `param` of function `function` in OpenAI `tools` (entries
// {"type":"function","function":{...}} or bare function objects); nullptr when not given.
const Json* parameter_type(const Json& tools, std::string_view function, const std::string& param) {
  if (!tools.is_array()) return nullptr;
  for (const Json& tool : tools) {
    const Json* spec = member(&tool, "function");
    if (spec == nullptr) spec = &tool;
    if (!is_string_equal(member(spec, "name"), function)) continue;
    const Json* properties = member(member(spec, "parameters"), "properties");
    return member(member(properties, param.c_str()), "type");
  }
  return nullptr;
}

// The template printed the value with Python's str() (scalars) or json.dumps (objects, arrays);
// read it back as `type`, or nothing when the text is not of that type.
std::optional<Json> read_as(std::string_view text, std::string_view type) {
  if (type == "boolean") {
    if (text == "True" || text == "true") return Json(true);
    if (text == "False" || text == "false") return Json(false);
    return std::nullopt;
  }
  if (type == "null") {
    if (text == "None" || text == "null") return Json(nullptr);
    return std::nullopt;
  }
  if (type != "integer" && type != "number" && type != "object" && type != "array") return std::nullopt;
  Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  const bool fits = type == "integer"  ? value.is_number_integer()
                    : type == "number" ? value.is_number()
                    : type == "object" ? value.is_object()
                                       : value.is_array();
  if (!fits) return std::nullopt;
  return value;
}

Json typed_value(std::string_view text, const Json* type) {
  if (type != nullptr && type->is_string()) {
    if (auto value = read_as(text, type->get_ref<const std::string&>())) return std::move(*value);
  } else if (type != nullptr && type->is_array()) {  // a union such as ["integer", "null"]
    for (const Json& option : *type) {
      if (!option.is_string()) continue;
      if (auto value = read_as(text, option.get_ref<const std::string&>())) return std::move(*value);
    }
  }
  return Json(std::string(text));
}

// {"name": ..., "arguments": {...} or "{...}"}
Result<ToolCall> parse_json_tool_call(std::string_view body) {
  const Json call = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  const Json* name = member(&call, "name");
  if (name == nullptr || !name->is_string()) return Status::error("JSON tool call has no \"name\" string");
  ToolCall out{name->get<std::string>()};
  if (const Json* arguments = member(&call, "arguments")) {
    HS_ASSIGN_OR_RETURN(out.arguments, arguments_object(*arguments));
  }
  return out;
}

// <function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>. A missing </parameter>
// ends the value at the next <parameter= or at </function>.
Result<ToolCall> parse_xml_tool_call(std::string_view body, const Json& tools) {
  body.remove_prefix(kFunctionOpen.size());
  const size_t name_end = body.find('>');
  if (name_end == std::string_view::npos) return Status::error("unterminated <function= tag");
  ToolCall out{std::string(body.substr(0, name_end))};
  std::string_view inner = body.substr(name_end + 1);
  if (const size_t end = inner.find(kFunctionClose); end != std::string_view::npos) inner = inner.substr(0, end);
  for (size_t at = inner.find(kParameterOpen); at != std::string_view::npos; at = inner.find(kParameterOpen)) {
    inner.remove_prefix(at + kParameterOpen.size());
    const size_t param_end = inner.find('>');
    if (param_end == std::string_view::npos) return Status::error("unterminated <parameter= tag");
    const std::string param(inner.substr(0, param_end));
    inner.remove_prefix(param_end + 1);
    const size_t close = inner.find(kParameterClose);
    const size_t end = std::min({close, inner.find(kParameterOpen), inner.size()});
    std::string_view value = inner.substr(0, end);
    if (value.starts_with('\n')) value.remove_prefix(1);  // the template writes "\n" + value + "\n"
    if (value.ends_with('\n')) value.remove_suffix(1);
    out.arguments[param] = typed_value(value, parameter_type(tools, out.name, param));
    inner.remove_prefix(end == close ? end + kParameterClose.size() : end);
  }
  return out;
}

Result<ToolCall> parse_tool_call(std::string_view body, const Json& tools) {
  body = py_strip(body);
  if (body.starts_with(kFunctionOpen)) return parse_xml_tool_call(body, tools);
  if (body.starts_with('{')) return parse_json_tool_call(body);
  return Status::error("tool call is neither <function=...> nor a JSON object");
}

}  // namespace

Result<std::string> render_chat_template(const nlohmann::ordered_json& messages,
                                         const ChatTemplateOptions& options) {
  return Renderer(messages, options).run();
}

Result<ParsedAssistant> parse_assistant_output(std::string_view text, const ChatTemplateOptions& prompt_options) {
  ParsedAssistant out;
  const bool opened_think = prompt_options.add_generation_prompt && prompt_options.enable_thinking != false;
  std::string_view reasoning;
  std::string_view rest = text;
  if (const auto split = split_think(text)) {
    reasoning = split->reasoning;
    rest = split->content;
  } else if (opened_think || py_strip(text).starts_with(kThinkOpen)) {
    reasoning = py_strip(text);  // cut short while thinking
    if (reasoning.starts_with(kThinkOpen)) reasoning.remove_prefix(kThinkOpen.size());
    rest = {};
  }
  out.reasoning_content = py_strip(reasoning);

  size_t at = rest.find(kCallOpen);
  out.content = py_strip(rest.substr(0, at));
  for (size_t k = 0; at != std::string_view::npos; ++k, at = rest.find(kCallOpen, at)) {
    const size_t body = at + kCallOpen.size();
    const size_t end = rest.find(kCallClose, body);
    if (end == std::string_view::npos) return Status::errorf("tool call {}: unterminated <tool_call>", k);
    auto call = parse_tool_call(rest.substr(body, end - body), prompt_options.tools);
    if (!call) return call.status().with_context(fmt::format("tool call {}", k));
    out.tool_calls.push_back(std::move(call.value()));
    at = end + kCallClose.size();
  }
  return out;
}

}  // namespace hyspec
