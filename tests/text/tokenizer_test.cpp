// The Qwen3.5 tokenizer against llama.cpp's tokenizer test data (expected ids produced by HF
// tokenizers), plus special-token parsing, decoding and load errors.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "common/fixtures.h"
#include "fixture_tokenizer.h"
#include "format/gguf.h"
#include "reference_bpe.h"

namespace hyspec {
namespace {

const Tokenizer& qwen35() { return test::qwen35_tokenizer(); }

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

// The full 151k-merge table against the textbook BPE, built straight from the GGUF arrays.
TEST(Qwen35Tokenizer, EncodeMatchesTextbookBpeOnRandomMultilingualText) {
  auto gguf = GgufFile::open(test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf"));
  ASSERT_TRUE(gguf.is_ok());
  const auto tokens = (*gguf)->get_string_array("tokenizer.ggml.tokens");
  const auto merges = (*gguf)->get_string_array("tokenizer.ggml.merges");
  ASSERT_TRUE(tokens.is_ok() && merges.is_ok());
  std::map<std::string, int32_t> vocab;
  for (size_t i = 0; i < tokens->size(); ++i) vocab.emplace(std::string((*tokens)[i]), static_cast<int32_t>(i));
  const test::ReferenceBpe reference(std::move(vocab), std::vector<std::string>(merges->begin(), merges->end()));

  const std::vector<std::string> alphabet = {
      "the", "in", "ing", "tion", "a", "e", "s", "t", "th", " ", " ", "  ", "\n", "\t", "'s", "'ll", ".", ",", "!",
      "1", "9", "(", ")", "{", "_", "=", "é", "ß", "ü", "中", "文", "的", "こ", "ん", "한", "국", "д", "ы",
      "😀", "🦙", "\u200d", "🇯", "ـ", "ع", "\xcc\x81", "…", "—", "\u3000", "\r\n"};
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 24);
    for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    EXPECT_EQ(qwen35().encode(s, false), test::reference_encode(reference, s)) << "text: '" << s << "'";
  }
}

TEST(Qwen35Tokenizer, DecodeInvertsEncodeOnEveryVocabTestCase) {
  const auto cases = read_vocab_cases(test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf.inp"),
                                      test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf.out"));
  for (const VocabCase& c : cases) EXPECT_EQ(qwen35().decode(c.ids), c.text);
}

TEST(Qwen35Tokenizer, ReadsVocabularySizeAndSpecialIdsFromMetadata) {
  const Tokenizer& t = qwen35();
  EXPECT_EQ(t.n_vocab(), 151936);
  EXPECT_EQ(t.eos_id(), 151643);
  EXPECT_EQ(t.bos_id(), 151643);
  EXPECT_EQ(t.pad_id(), 151643);
  EXPECT_EQ(t.eot_id(), std::nullopt);
  EXPECT_EQ(t.mask_id(), std::nullopt);
  EXPECT_EQ(t.token_type(151644), TokenType::Control);
  EXPECT_EQ(t.token_type(151646), TokenType::UserDefined);  // [PAD151646]
  EXPECT_EQ(t.token_type(9707), TokenType::Normal);
  EXPECT_EQ(t.token_type(-1), TokenType::Undefined);
  EXPECT_EQ(t.token_type(151936), TokenType::Undefined);
}

TEST(Qwen35Tokenizer, EndOfGenerationIsEosImEndAndEndoftext) {
  const Tokenizer& t = qwen35();
  EXPECT_TRUE(t.is_end_of_generation(151643));   // <|endoftext|>, also eos
  EXPECT_TRUE(t.is_end_of_generation(151645));   // <|im_end|>
  EXPECT_FALSE(t.is_end_of_generation(151644));  // <|im_start|>
  EXPECT_FALSE(t.is_end_of_generation(198));
  EXPECT_FALSE(t.is_end_of_generation(-5));
  EXPECT_TRUE(t.is_control(151645));
  EXPECT_FALSE(t.is_control(151646));
  EXPECT_FALSE(t.is_control(9707));
}

TEST(Qwen35Tokenizer, TokenTextIsStoredFormAndTokenBytesIsDecodedForm) {
  const Tokenizer& t = qwen35();
  EXPECT_EQ(t.token_text(21927), "\xc4\xa0Hello");  // "ĠHello"
  EXPECT_EQ(t.token_bytes(21927), " Hello");
  EXPECT_EQ(t.token_text(198), "\xc4\x8a");  // "Ċ"
  EXPECT_EQ(t.token_bytes(198), "\n");
  EXPECT_EQ(t.token_text(151644), "<|im_start|>");
  EXPECT_EQ(t.token_bytes(151644), "<|im_start|>");
  // " 🦙" (20 F0 9F A6 99) is three tokens, each holding part of the character.
  EXPECT_EQ(t.token_bytes(11162), " \xf0\x9f");
  EXPECT_EQ(t.token_bytes(99), "\xa6");
  EXPECT_EQ(t.token_bytes(247), "\x99");
  EXPECT_EQ(t.token_text(-1), "");
  EXPECT_EQ(t.token_bytes(151936), "");
}

TEST(Qwen35Tokenizer, FindTokenLooksUpTheStoredText) {
  const Tokenizer& t = qwen35();
  EXPECT_EQ(t.find_token("<|im_end|>"), 151645);
  EXPECT_EQ(t.find_token("\xc4\xa0Hello"), 21927);
  EXPECT_EQ(t.find_token("Hello"), 9707);
  EXPECT_EQ(t.find_token("<|no such token|>"), std::nullopt);
  EXPECT_EQ(t.find_token(""), std::nullopt);
}

TEST(Qwen35Tokenizer, ParseSpecialTurnsChatMarkersIntoTheirIds) {
  const Tokenizer& t = qwen35();
  // The Qwen chat prefix "<|im_start|>user\n" is [151644, 872, 198] in every Qwen2-family vocabulary.
  EXPECT_EQ(t.encode("<|im_start|>user\n", true), (std::vector<int32_t>{151644, 872, 198}));
  EXPECT_EQ(t.encode("<|im_start|>assistant\n", true), (std::vector<int32_t>{151644, 77091, 198}));
  EXPECT_EQ(t.encode("Hello world<|im_end|>\n", true), (std::vector<int32_t>{9707, 1879, 151645, 198}));
  EXPECT_EQ(t.encode("<|im_start|><|im_end|><|endoftext|>", true), (std::vector<int32_t>{151644, 151645, 151643}));
  // User-defined tokens are matched too; an unterminated marker is plain text.
  EXPECT_EQ(t.encode("[PAD151646]", true), (std::vector<int32_t>{151646}));
  EXPECT_EQ(t.encode("<|im_start", true), t.encode("<|im_start", false));
}

TEST(Qwen35Tokenizer, TextAroundSpecialTokensIsEncodedAsSeparateSegments) {
  const Tokenizer& t = qwen35();
  const std::string a = " Hello, y'all!", b = "\n\n  3.14 ";
  std::vector<int32_t> expected = t.encode(a, false);
  expected.push_back(151645);
  const std::vector<int32_t> eb = t.encode(b, false);
  expected.insert(expected.end(), eb.begin(), eb.end());
  EXPECT_EQ(t.encode(a + "<|im_end|>" + b, true), expected);
}

TEST(Qwen35Tokenizer, WithoutParseSpecialMarkersAreOrdinaryText) {
  const Tokenizer& t = qwen35();
  const std::string text = "<|im_start|>user\nhi<|im_end|>[PAD151646]";
  const std::vector<int32_t> ids = t.encode(text, false);
  EXPECT_GT(ids.size(), 10u);
  for (int32_t id : ids) {
    EXPECT_EQ(t.token_type(id), TokenType::Normal) << id;
  }
  EXPECT_EQ(t.decode(ids), text);
}

TEST(Qwen35Tokenizer, InvalidUtf8IsEncodedBytewiseAndDecodesBack) {
  const Tokenizer& t = qwen35();
  const std::string cases[] = {"\xff", "abc\xfe\xff" "def", "\xc3", "caf\xc3", "\xe4\xb8 x", "\xed\xa0\x80",
                               "\xc0\xaf", std::string("a\0b", 3), "\x80\x80\x80 \xf4\x90\x80\x80"};
  for (const std::string& s : cases) {
    const std::vector<int32_t> ids = t.encode(s, false);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(t.decode(ids), s);
    EXPECT_EQ(t.encode(s, true), ids);
  }
  // A lone invalid byte is its byte token: 0xFF is stored as "ÿ".
  EXPECT_EQ(t.encode("\xff", false), (std::vector<int32_t>{*t.find_token("\xc3\xbf")}));
}

TEST(Qwen35Tokenizer, DecodeSkipsIdsOutsideTheVocabulary) {
  const std::vector<int32_t> ids = {9707, -1, 151936, 1879};
  EXPECT_EQ(qwen35().decode(ids), "Hello world");
}

TEST(Qwen35Tokenizer, ConcurrentEncodesAgreeWithSequentialOnes) {
  const Tokenizer& t = qwen35();
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i)
    texts.push_back("Sentence " + std::to_string(i * 7919) + ": the quick brown fox jumps over the lazy dog " +
                    std::string(i % 5, ' ') + "\u4f60\u597d " + std::to_string(i));
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& s : texts) expected.push_back(t.encode(s, false));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 50; ++rep)
        for (size_t i = 0; i < texts.size(); ++i)
          if (t.encode(texts[(i + w) % texts.size()], false) != expected[(i + w) % texts.size()]) ++mismatches;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace hyspec
