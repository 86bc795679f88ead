// The tokenizers of the fixture GGUFs, loaded once per test binary.
#pragma once
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "common/fixtures.h"
#include "format/gguf.h"
#include "text/tokenizer.h"

namespace hyspec::test {

// `relative`: a GGUF under the fixtures directory. Loading failures fail the test.
inline const Tokenizer& fixture_tokenizer(const std::string& relative) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  std::unique_ptr<Tokenizer>& t = loaded[relative];
  if (!t) {
    auto gguf = GgufFile::open(fixture_path(relative));
    if (!gguf) throw std::runtime_error(gguf.message());
    auto tok = Tokenizer::from_gguf(**gguf);
    if (!tok) throw std::runtime_error(tok.message());
    t = std::move(tok).value();
  }
  return *t;
}

inline const Tokenizer& qwen35_tokenizer() { return fixture_tokenizer("tokenizer/ggml-vocab-qwen35.gguf"); }
inline const Tokenizer& tiny_tokenizer() { return fixture_tokenizer("qwen35-tiny/qwen35-tiny-f32.gguf"); }

}  // namespace hyspec::test
