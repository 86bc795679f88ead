#include "server/responses.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

namespace hyspec::server {

using ojson = nlohmann::ordered_json;

namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>", kToolCallOpen = "<tool_call>";

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  for (size_t len = std::min(tag.size() - 1, text.size()); len > 0; --len)
    if (text.substr(text.size() - len) == tag.substr(0, len)) return len;
  return 0;
}

std::string_view rstrip(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Bytes at the end of `buf` to hold back: a partial `tag` and the whitespace before it (trailing
// whitespace is dropped when the section ends, as the template strips it). At the end: the
// trailing whitespace only.
size_t held_back(std::string_view buf, std::string_view tag, bool final) {
  const size_t partial = final || tag.empty() ? 0 : partial_tag_suffix(buf, tag);
  const size_t body = rstrip(buf.substr(0, buf.size() - partial)).size();
  return buf.size() - body;
}

ojson bytes_array(std::string_view s) {
  ojson a = ojson::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

ojson chat_logprobs(const Tokenizer& tok, const std::vector<EmittedLogprobs>& lps) {
  ojson content = ojson::array();
  for (const EmittedLogprobs& lp : lps) {
    const std::string_view piece = tok.bytes_view(lp.token.id);
    ojson top = ojson::array();
    for (const TokenLogprob& t : lp.top) {
      const std::string_view p = tok.bytes_view(t.id);
      top.push_back({{"token", std::string(p)}, {"logprob", t.logprob}, {"bytes", bytes_array(p)}});
    }
    content.push_back({{"token", std::string(piece)}, {"logprob", lp.token.logprob}, {"bytes", bytes_array(piece)},
                       {"top_logprobs", std::move(top)}});
  }
  return ojson{{"content", std::move(content)}};
}

// The legacy completions shape; `offset` is the text offset of the first token, advanced past all.
ojson completion_logprobs(const Tokenizer& tok, const std::vector<EmittedLogprobs>& lps, size_t& offset) {
  ojson tokens = ojson::array(), token_logprobs = ojson::array(), top = ojson::array(), offsets = ojson::array();
  for (const EmittedLogprobs& lp : lps) {
    const std::string_view piece = tok.bytes_view(lp.token.id);
    tokens.push_back(std::string(piece));
    token_logprobs.push_back(lp.token.logprob);
    ojson alternatives = ojson::object();
    for (const TokenLogprob& t : lp.top) alternatives[std::string(tok.bytes_view(t.id))] = t.logprob;
    top.push_back(std::move(alternatives));
    offsets.push_back(offset);
    offset += piece.size();
  }
  return ojson{{"tokens", std::move(tokens)}, {"token_logprobs", std::move(token_logprobs)},
               {"top_logprobs", std::move(top)}, {"text_offset", std::move(offsets)}};
}

ojson usage_json(const ResponseContext& ctx, const StreamEvent& final) {
  const SessionStats& st = final.stats;
  return ojson{{"prompt_tokens", final.prompt_tokens},
               {"completion_tokens", final.completion_tokens},
               {"total_tokens", final.prompt_tokens + final.completion_tokens},
               {"hyspec",
                {{"spec_method", ctx.spec_method},
                 {"draft_proposed", st.drafted},
                 {"draft_accepted", st.accepted},
                 {"speculative_rounds", st.spec_rounds},
                 {"mean_acceptance_length", st.mean_acceptance_length()}}}};
}

const char* finish_reason(FinishReason r, bool tool_calls) {
  if (tool_calls) return "tool_calls";
  return r == FinishReason::Stop ? "stop" : "length";
}

ojson tool_calls_json(const std::vector<ToolCall>& calls, bool streaming) {
  ojson out = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    ojson call = ojson::object();
    if (streaming) call["index"] = i;
    call["id"] = random_id("call_");
    call["type"] = "function";
    call["function"] = {{"name", calls[i].name}, {"arguments", dump_json(calls[i].arguments)}};
    out.push_back(std::move(call));
  }
  return out;
}

// The tool calls of a reply's tool-call section; on failure the section is returned as text.
std::vector<ToolCall> parse_tool_section(const std::string& section, const ChatTemplateOptions& options,
                                         std::string& unparsed) {
  if (section.empty()) return {};
  ChatTemplateOptions o = options;
  o.add_generation_prompt = false;  // the section holds no reasoning
  auto parsed = parse_assistant_output(section, o);
  if (!parsed.is_ok() || parsed->tool_calls.empty()) {
    unparsed = section;
    return {};
  }
  return std::move(parsed->tool_calls);
}

bool starts_in_reasoning(const CompletionRequest& r) {
  return r.template_options.add_generation_prompt && r.template_options.enable_thinking != false;
}

}  // namespace

std::string dump_json(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

std::string random_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

// ---- ReplySplitter ----------------------------------------------------------------------------

ReplySplitter::ReplySplitter(bool starts_in_reasoning, bool parse_tool_calls)
    : state_(starts_in_reasoning ? State::Reasoning : State::Start), parse_tool_calls_(parse_tool_calls) {}

ReplySplitter::Delta ReplySplitter::push(std::string_view text) {
  buf_ += text;
  Delta d;
  process(d, false);
  return d;
}

ReplySplitter::Delta ReplySplitter::finish() {
  Delta d;
  process(d, true);
  return d;
}

void ReplySplitter::process(Delta& d, bool final) {
  const auto emit = [&](std::string& out, bool& started, std::string_view text) {
    if (!started) {
      const size_t first = text.find_first_not_of(" \t\r\n");
      text = first == std::string_view::npos ? std::string_view() : text.substr(first);
      started = !text.empty();
    }
    out += text;
  };
  for (;;) {
    switch (state_) {
      case State::Start: {  // before any content: an opening <think> starts reasoning
        const size_t first = buf_.find_first_not_of(" \t\r\n");
        if (first == std::string::npos && !final) return;
        const std::string_view rest = first == std::string::npos ? std::string_view() : std::string_view(buf_).substr(first);
        if (rest.starts_with(kThinkOpen)) {
          buf_.erase(0, first + kThinkOpen.size());
          state_ = State::Reasoning;
          continue;
        }
        if (!final && kThinkOpen.starts_with(rest)) return;
        state_ = State::Content;
        continue;
      }
      case State::Reasoning: {
        const size_t close = buf_.find(kThinkClose);
        if (close != std::string::npos) {
          emit(d.reasoning, reasoning_started_, rstrip(std::string_view(buf_).substr(0, close)));
          buf_.erase(0, close + kThinkClose.size());
          state_ = State::Content;
          continue;
        }
        const size_t keep = held_back(buf_, kThinkClose, final);
        emit(d.reasoning, reasoning_started_, std::string_view(buf_).substr(0, buf_.size() - keep));
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::Content: {
        const size_t call = parse_tool_calls_ ? buf_.find(kToolCallOpen) : std::string::npos;
        if (call != std::string::npos) {
          emit(d.content, content_started_, rstrip(std::string_view(buf_).substr(0, call)));
          tools_ = buf_.substr(call);
          buf_.clear();
          state_ = State::Tools;
          return;
        }
        const size_t keep = held_back(buf_, parse_tool_calls_ ? kToolCallOpen : std::string_view(), final);
        emit(d.content, content_started_, std::string_view(buf_).substr(0, buf_.size() - keep));
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::Tools:
        tools_ += buf_;
        buf_.clear();
        return;
    }
  }
}

// ---- whole responses --------------------------------------------------------------------------

void Generation::add(const StreamEvent& e) {
  text += e.text;
  tokens.insert(tokens.end(), e.tokens.begin(), e.tokens.end());
  logprobs.insert(logprobs.end(), e.logprobs.begin(), e.logprobs.end());
  if (e.final) final = e;
}

ojson completion_response(const ResponseContext& ctx, const Generation& g) {
  const CompletionRequest& req = *ctx.request;
  ojson choice = ojson::object();
  choice["index"] = 0;
  bool has_tool_calls = false;
  if (req.endpoint == Endpoint::Chat) {
    ReplySplitter splitter(starts_in_reasoning(req), req.parse_tool_calls);
    ReplySplitter::Delta a = splitter.push(g.text), b = splitter.finish();
    std::string unparsed;
    const auto calls = parse_tool_section(splitter.tool_section(), req.template_options, unparsed);
    const std::string content(rstrip(a.content + b.content + unparsed));
    const std::string reasoning(rstrip(a.reasoning + b.reasoning));
    has_tool_calls = !calls.empty();
    ojson message = {{"role", "assistant"}};
    message["content"] = content.empty() && has_tool_calls ? ojson(nullptr) : ojson(content);
    if (!reasoning.empty()) message["reasoning_content"] = reasoning;
    if (has_tool_calls) message["tool_calls"] = tool_calls_json(calls, false);
    choice["message"] = std::move(message);
    choice["logprobs"] = req.logprobs >= 0 ? chat_logprobs(*ctx.tokenizer, g.logprobs) : ojson(nullptr);
  } else {
    size_t offset = 0;
    choice["text"] = g.text;
    choice["logprobs"] = req.logprobs >= 0 ? completion_logprobs(*ctx.tokenizer, g.logprobs, offset) : ojson(nullptr);
  }
  choice["finish_reason"] = finish_reason(g.final.finish, has_tool_calls);
  if (req.return_token_ids) choice["token_ids"] = g.tokens;
  ojson out = {{"id", ctx.id},
               {"object", req.endpoint == Endpoint::Chat ? "chat.completion" : "text_completion"},
               {"created", ctx.created},
               {"model", ctx.model},
               {"choices", ojson::array({std::move(choice)})},
               {"usage", usage_json(ctx, g.final)}};
  if (req.return_token_ids) out["prompt_token_ids"] = ctx.prompt_ids;
  return out;
}

// ---- streams ----------------------------------------------------------------------------------

StreamFormatter::StreamFormatter(ResponseContext ctx)
    : ctx_(std::move(ctx)), splitter_(starts_in_reasoning(*ctx_.request), ctx_.request->parse_tool_calls) {}

ojson StreamFormatter::chunk(ojson choice) const {
  const bool chat = ctx_.request->endpoint == Endpoint::Chat;
  ojson c = {{"id", ctx_.id},
             {"object", chat ? "chat.completion.chunk" : "text_completion"},
             {"created", ctx_.created},
             {"model", ctx_.model},
             {"choices", choice.is_null() ? ojson::array() : ojson::array({std::move(choice)})}};
  if (ctx_.request->include_usage) c["usage"] = nullptr;
  return c;
}

ojson StreamFormatter::chat_delta_choice(ojson delta, const StreamEvent* e) const {
  ojson choice = {{"index", 0}, {"delta", std::move(delta)}};
  choice["logprobs"] = e && ctx_.request->logprobs >= 0 ? chat_logprobs(*ctx_.tokenizer, e->logprobs) : ojson(nullptr);
  choice["finish_reason"] = nullptr;
  if (e && ctx_.request->return_token_ids) choice["token_ids"] = e->tokens;
  return choice;
}

std::string StreamFormatter::begin() {
  if (ctx_.request->endpoint != Endpoint::Chat) return "";
  return frame(chunk(chat_delta_choice({{"role", "assistant"}, {"content", ""}}, nullptr)));
}

std::string StreamFormatter::on_event(const StreamEvent& e) {
  const CompletionRequest& req = *ctx_.request;
  std::string out;
  if (!e.error.empty()) return error_frames(ApiError{e.error_status, e.error, "server_error", "", ""});
  bool has_tool_calls = false;
  if (req.endpoint == Endpoint::Chat) {
    ReplySplitter::Delta d = splitter_.push(e.text);
    std::string unparsed;
    std::vector<ToolCall> calls;
    if (e.final) {
      ReplySplitter::Delta rest = splitter_.finish();
      d.reasoning += rest.reasoning;
      d.content += rest.content;
      calls = parse_tool_section(splitter_.tool_section(), req.template_options, unparsed);
      d.content += unparsed;
    }
    if (!d.reasoning.empty() || !d.content.empty() || !e.tokens.empty()) {
      ojson delta = ojson::object();
      if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
      if (!d.content.empty() || d.reasoning.empty()) delta["content"] = d.content;
      out += frame(chunk(chat_delta_choice(std::move(delta), &e)));
    }
    if (!calls.empty()) {
      has_tool_calls = true;
      out += frame(chunk(chat_delta_choice({{"tool_calls", tool_calls_json(calls, true)}}, nullptr)));
    }
    if (e.final) {
      ojson last = chat_delta_choice(ojson::object(), nullptr);
      last["finish_reason"] = finish_reason(e.finish, has_tool_calls);
      out += frame(chunk(std::move(last)));
    }
  } else {
    ojson choice = {{"index", 0}, {"text", e.text}};
    choice["logprobs"] = req.logprobs >= 0 ? completion_logprobs(*ctx_.tokenizer, e.logprobs, text_offset_) : ojson(nullptr);
    choice["finish_reason"] = e.final ? ojson(finish_reason(e.finish, false)) : ojson(nullptr);
    if (req.return_token_ids) choice["token_ids"] = e.tokens;
    if (!e.text.empty() || !e.tokens.empty() || e.final) out += frame(chunk(std::move(choice)));
  }
  if (e.final) {
    if (req.include_usage) {
      ojson u = chunk(nullptr);
      u["usage"] = usage_json(ctx_, e);
      out += frame(u);
    }
    out += "data: [DONE]\n\n";
  }
  return out;
}

std::string StreamFormatter::error_frames(const ApiError& e) {
  return "data: " + dump_json(error_json(e)) + "\n\ndata: [DONE]\n\n";
}

}  // namespace hyspec::server
