#include "server/text_stream.h"

#include <algorithm>

namespace hyspec::server {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop) : decoder_(tokenizer) {
  for (auto& s : stop)
    if (!s.empty()) stop_.push_back(std::move(s));
}

size_t TextStream::held_suffix() const {
  size_t held = 0;
  const std::string_view open = std::string_view(text_).substr(released_);
  for (const std::string& s : stop_) {
    for (size_t len = std::min(s.size() - 1, open.size()); len > held; --len) {
      if (open.substr(open.size() - len) == std::string_view(s).substr(0, len)) {
        held = len;
        break;
      }
    }
  }
  return held;
}

void TextStream::release_tokens_ending_by(size_t offset) {
  while (!pending_.empty() && pending_.front().end <= static_cast<int64_t>(offset)) {
    out_.tokens.push_back(pending_.front().id);
    if (pending_.front().has_logprobs) out_.logprobs.push_back(std::move(pending_.front().logprobs));
    pending_.pop_front();
  }
}

bool TextStream::push(int32_t id, const EmittedLogprobs* logprobs) {
  if (stopped_) return true;
  const auto start = static_cast<int64_t>(text_.size());
  text_ += decoder_.push(id);
  pending_.push_back({id, start, static_cast<int64_t>(text_.size()), logprobs != nullptr,
                      logprobs ? *logprobs : EmittedLogprobs{}});
  // Text before released_ held no stop-string prefix, so a complete stop string starts after it.
  size_t hit = std::string::npos;
  for (const std::string& s : stop_) hit = std::min(hit, text_.find(s, released_));
  if (hit != std::string::npos) {
    text_.resize(hit);
    released_ = hit;
    // Tokens that contributed text before the stop string are part of the output; the rest are not.
    while (!pending_.empty() && pending_.front().start < static_cast<int64_t>(hit)) {
      pending_.front().end = std::min<int64_t>(pending_.front().end, static_cast<int64_t>(hit));
      release_tokens_ending_by(hit);
    }
    pending_.clear();
    stopped_ = true;
    return true;
  }
  released_ = text_.size() - held_suffix();
  release_tokens_ending_by(released_);
  return false;
}

void TextStream::finish() {
  if (stopped_) return;
  text_ += decoder_.flush();
  released_ = text_.size();
  if (!pending_.empty()) pending_.back().end = static_cast<int64_t>(text_.size());
  release_tokens_ending_by(released_);
}

void TextStream::take(StreamEvent& event) {
  event.text.append(text_, 0, released_);
  text_.erase(0, released_);
  for (Pending& p : pending_) {
    p.start -= static_cast<int64_t>(released_);
    p.end -= static_cast<int64_t>(released_);
  }
  released_ = 0;
  event.tokens.insert(event.tokens.end(), out_.tokens.begin(), out_.tokens.end());
  for (auto& lp : out_.logprobs) event.logprobs.push_back(std::move(lp));
  out_.tokens.clear();
  out_.logprobs.clear();
}

}  // namespace hyspec::server
