// libFuzzer target: encode arbitrary bytes with the real Qwen3.5 vocabulary, with and without
// special-token parsing, and stream-decode the result. Properties (trap on violation):
//   - decode(encode(x, parse_special=false)) == x, and every id is a normal in-vocabulary token;
//   - decode(encode(x, parse_special=true)) == x as well (special tokens decode to their text);
//   - the stream decoder's chunks concatenate to x and no chunk boundary falls inside a valid
//     UTF-8 character of x.
// The vocabulary comes from $HYSPEC_FIXTURES/tokenizer/ggml-vocab-qwen35.gguf, by default
// ../shared/fixtures relative to the source tree.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace {

std::string vocab_path() {
  const char* env = std::getenv("HYSPEC_FIXTURES");
  const std::filesystem::path root =
      env && *env ? std::filesystem::path(env)
                  : std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "shared/fixtures";
  return (root / "tokenizer/ggml-vocab-qwen35.gguf").string();
}

const hyspec::Tokenizer& tokenizer() {
  static std::unique_ptr<hyspec::Tokenizer> tok = [] {
    const std::string path = vocab_path();
    auto gguf = hyspec::GgufFile::open(path);
    if (!gguf) {
      std::fprintf(stderr, "tokenizer_fuzz: %s (set HYSPEC_FIXTURES)\n", gguf.message().c_str());
      std::abort();
    }
    auto t = hyspec::Tokenizer::from_gguf(**gguf);
    if (!t) {
      std::fprintf(stderr, "tokenizer_fuzz: %s\n", t.message().c_str());
      std::abort();
    }
    return std::move(t).value();
  }();
  return *tok;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

// inside[i]: byte i continues a valid multi-byte character of `s` (a boundary there would split it).
std::vector<bool> inside_characters(std::string_view s) {
  std::vector<bool> inside(s.size() + 1, false);
  for (size_t i = 0; i < s.size();) {
    int32_t cp;
    const size_t n = hyspec::utf8_decode(s, i, cp);
    for (size_t k = 1; k < n; ++k) inside[i + k] = true;
    i += n;
  }
  return inside;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const hyspec::Tokenizer& t = tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  const std::vector<int32_t> plain = t.encode(text, false);
  check(t.decode(plain) == text);
  for (int32_t id : plain) check(t.token_type(id) == hyspec::TokenType::Normal);

  const std::vector<int32_t> special = t.encode(text, true);
  check(t.decode(special) == text);

  const std::vector<bool> inside = inside_characters(text);
  hyspec::TokenStreamDecoder stream(t);
  std::string streamed;
  for (int32_t id : special) {
    streamed += stream.push(id);
    check(streamed.size() <= text.size() && !inside[streamed.size()]);
  }
  streamed += stream.flush();
  check(streamed == text);
  return 0;
}
