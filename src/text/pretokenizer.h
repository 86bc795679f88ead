// Splits text into the pieces that BPE encodes independently, with a PCRE2 regex in UTF + UCP mode
// (JIT-compiled when the platform has it). Invalid UTF-8 is accepted: bytes the regex cannot match
// become pieces of their own, so the pieces always cover the input exactly.
// Immutable after create(); split() may be called from any number of threads.
#pragma once
#include <memory>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace hyspec {

class Pretokenizer {
 public:
  // The regex of `tokenizer.ggml.pre = qwen35` (QWEN35.md). Its `\s` is spelled out as Unicode
  // White_Space, which is what Oniguruma (the engine of HF tokenizers) matches; PCRE2's `\s` would
  // also match U+180E.
  static const char* const kQwen35Pattern;

  static Result<std::unique_ptr<Pretokenizer>> create(std::string_view pattern);
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // Replaces `pieces` with consecutive, non-empty views into `text` whose concatenation is `text`.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  struct Regex;
  explicit Pretokenizer(std::unique_ptr<Regex> re);
  std::unique_ptr<Regex> re_;
};

}  // namespace hyspec
