// Generated tokens -> the text a client may see, as early as possible: the streaming detokenizer
// never splits a UTF-8 character, and text that could be the start of a stop string is held back
// until it is known not to be one, so a stop string never leaks, even in part, even when it spans
// tokens. Tokens (and their logprobs) are released with the text they produced.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "server/channel.h"
#include "text/tokenizer.h"

namespace hyspec::server {

class TextStream {
 public:
  // `stop`: stop strings (empty ones are ignored). The tokenizer must outlive the stream.
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop);

  // One generated token that is not an end-of-generation token; `logprobs` may be null. Returns
  // true when a stop string is now complete: generation must end here; the text before the stop
  // string is released and nothing after it ever is.
  bool push(int32_t id, const EmittedLogprobs* logprobs);
  // Generation ended without a stop string: release everything held back.
  void finish();
  // Moves what was released since the previous call into the event's text, tokens and logprobs.
  void take(StreamEvent& event);
  bool stopped() const { return stopped_; }

 private:
  struct Pending {
    int32_t id;
    // The token's bytes in text_ (empty while the decoder holds them); start < 0 when part of them
    // was already taken.
    int64_t start, end;
    bool has_logprobs;
    EmittedLogprobs logprobs;
  };
  void release_tokens_ending_by(size_t offset);
  size_t held_suffix() const;  // bytes at the end of text_ that could begin a stop string

  TokenStreamDecoder decoder_;
  std::vector<std::string> stop_;
  std::string text_;      // decoded text not yet taken
  size_t released_ = 0;   // text_[0, released_) is released
  std::deque<Pending> pending_;
  StreamEvent out_;       // released, not yet taken (text excluded: it lives in text_)
  bool stopped_ = false;
};

}  // namespace hyspec::server
