// The Qwen3.5 tokenizer against llama.cpp's tokenizer test data (expected ids produced by HF
// tokenizers), plus special-token parsing, decoding and load errors.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <sstream>

#include "common/fixtures.h"
#include "format/gguf.h"

namespace hyspec {
namespace {

const Tokenizer& qwen35() {
  static std::unique_ptr<Tokenizer> tok = [] {
    auto gguf = GgufFile::open(test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf"));
    EXPECT_TRUE(gguf.is_ok()) << gguf.message();
    auto t = Tokenizer::from_gguf(**gguf);
    EXPECT_TRUE(t.is_ok()) << t.message();
    return std::move(t).value();
  }();
  return *tok;
}

struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};

// llama.cpp's format: each input is followed by "\n__ggml_vocab_test__\n" (the newlines belong to
// the separator, not the input); the .out file holds one line of space-separated ids per input.
std::vector<VocabCase> read_vocab_cases(const std::string& inp_path, const std::string& out_path) {
  const std::string raw = test::read_text_file(inp_path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<VocabCase> cases;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      cases.push_back({raw.substr(pos), {}});
      break;
    }
    cases.push_back({raw.substr(pos, next - pos), {}});
    pos = next + sep.size();
  }
  std::istringstream out(test::read_text_file(out_path));
  size_t i = 0;
  for (std::string line; std::getline(out, line); ++i) {
    if (i >= cases.size()) break;
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) cases[i].ids.push_back(id);
  }
  EXPECT_EQ(i, cases.size()) << "one .out line per .inp case";
  return cases;
}

TEST(Qwen35Tokenizer, MatchesEveryLlamaCppVocabTestCase) {
  const auto cases = read_vocab_cases(test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf.inp"),
                                      test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf.out"));
  ASSERT_EQ(cases.size(), 50u);
  int matched = 0;
  for (const VocabCase& c : cases) {
    const std::vector<int32_t> got = qwen35().encode(c.text, false);
    EXPECT_EQ(got, c.ids) << "text: '" << c.text << "'";
    matched += got == c.ids;
  }
  EXPECT_EQ(matched, static_cast<int>(cases.size()));
}

}  // namespace
}  // namespace hyspec
