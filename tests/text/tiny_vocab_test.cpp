// The tiny fixture's 512-token vocabulary against the HF tokenizer.json it was converted from. HF
// tokenizers cannot run here, so the oracle is a textbook BPE written in this file from the
// definition (string symbols, tokenizer.json's merges and vocab, GPT-2's byte alphabet rebuilt
// here), plus ids derived by hand from the merge list.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "common/fixtures.h"
#include "fixture_tokenizer.h"
#include "reference_bpe.h"
#include "format/gguf.h"
#include "text/pretokenizer.h"
#include "text/tokenizer.h"

namespace hyspec {
namespace {

const Tokenizer& tiny() { return test::tiny_tokenizer(); }

struct TokenizerJson {
  std::map<std::string, int32_t> vocab, added;
  std::vector<std::string> merges;
};

const TokenizerJson& tokenizer_json() {
  static const TokenizerJson tj = [] {
    TokenizerJson t;
    const nlohmann::json j = test::read_json_file(test::fixture_path("qwen35-tiny/tokenizer.json"));
    for (const auto& [text, id] : j["model"]["vocab"].items()) t.vocab[text] = id.get<int32_t>();
    // Newer tokenizer.json files store a merge as ["A", "B"], older ones as "A B".
    for (const auto& m : j["model"]["merges"])
      t.merges.push_back(m.is_array() ? m[0].get<std::string>() + " " + m[1].get<std::string>() : m.get<std::string>());
    for (const auto& a : j["added_tokens"]) t.added[a["content"].get<std::string>()] = a["id"].get<int32_t>();
    return t;
  }();
  return tj;
}

const test::ReferenceBpe& reference() {
  static const test::ReferenceBpe r(tokenizer_json().vocab, tokenizer_json().merges);
  return r;
}

std::vector<int32_t> reference_encode(std::string_view text) { return test::reference_encode(reference(), text); }

std::vector<std::string> corpus() {
  std::vector<std::string> texts = {
      "def forward(self, x):\n    return self.linear(x) + None\n",
      "class Module(object):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, name='value'):\n",
      "        if not isinstance(key, str):\n            raise TypeError('key')\n",
      "for i in range(10):\n\tprint(i, end=\", \")\n",
      "The quick brown fox jumps over the lazy dog. It's 3.14159!",
      "   leading and trailing   \n\n\n   ",
      "日本語のテキストと中文混合 mixed with English, ümlauts and café.",
      "emoji 😀🎉 and 👩‍💻 ZWJ sequences",
      "I'm sure they'll say we've READ it'S fine, 'd 'LL",
      "x == y != z >= 0 ## #### ---- ******",
      "\r\n\r\n \r \n",
      "",
  };
  // Random strings over an alphabet that exercises every regex branch and many merges.
  const std::vector<std::string> alphabet = {"a", "e", "l", "f", "s", "t", "r", "n", "i", "o", "d", " ", " ",
                                             "  ", "\n", "\t", "_", "(", ")", ":", "'", "\"", "1", "2", "é",
                                             "中", "😀", "self", "None", "def", "    ", ".", ","};
  std::mt19937 rng(42);
  for (int i = 0; i < 400; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 40);
    for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    texts.push_back(s);
  }
  return texts;
}

TEST(TinyVocab, GgufVocabularyEqualsTokenizerJson) {
  const Tokenizer& t = tiny();
  ASSERT_EQ(t.n_vocab(), static_cast<int32_t>(tokenizer_json().vocab.size() + tokenizer_json().added.size()));
  for (const auto& [text, id] : tokenizer_json().vocab) EXPECT_EQ(t.token_text(id), text) << id;
  for (const auto& [text, id] : tokenizer_json().added) {
    EXPECT_EQ(t.token_text(id), text);
    EXPECT_EQ(t.token_type(id), TokenType::Control);
  }
  EXPECT_EQ(reference().n_merges(), 251u);
}

TEST(TinyVocab, EncodeMatchesTextbookBpeOverTokenizerJsonMerges) {
  for (const std::string& s : corpus()) EXPECT_EQ(tiny().encode(s, false), reference_encode(s)) << "text: " << s;
}

TEST(TinyVocab, EncodeMatchesHandDerivedIds) {
  const Tokenizer& t = tiny();
  // "   " "Ġdef" "Ġf" "(self" "):Ċ": ĠĠ+Ġ=258; d+e, de+f, Ġ+def=340; Ġ+f=284;
  // s+e, l+f, se+lf, (+self=357; :+Ċ, )+:Ċ=306.
  EXPECT_EQ(t.encode("    def f(self):\n", false), (std::vector<int32_t>{258, 340, 284, 357, 306}));
  // "Ġthe": Ġ+t (rank 8), h+e (17), Ġt+he = 292. "Ġself": s+e (5) before Ġ+s (49), then l+f,
  // se+lf, Ġ+self = 293.
  EXPECT_EQ(t.encode(" the self", false), (std::vector<int32_t>{292, 293}));
  // "return": r+e, u+r, ur+n, t+urn -> "re" 263 "turn" 312 (only "Ġre"+"turn" is a merge).
  // "ĠNone": o+n, on+e, N+one, Ġ+None = 396.
  EXPECT_EQ(t.encode("return None", false), (std::vector<int32_t>{263, 312, 396}));
  // Digits are single pieces; '1' is byte token 16.
  EXPECT_EQ(t.encode("11", false), (std::vector<int32_t>{16, 16}));
}

TEST(TinyVocab, SpecialTokensParseOnlyWhenAsked) {
  const Tokenizer& t = tiny();
  // "user": s+e (5) is the only applicable merge: u, se, r.
  EXPECT_EQ(t.encode("<|im_start|>user<|im_end|>", true), (std::vector<int32_t>{508, 84, 261, 81, 509}));
  EXPECT_EQ(t.encode("<think>\n</think>", true), (std::vector<int32_t>{510, 198, 511}));
  const std::vector<int32_t> plain = t.encode("<|im_start|>user<|im_end|>", false);
  for (int32_t id : plain) EXPECT_LT(id, 507);
  EXPECT_EQ(t.decode(plain), "<|im_start|>user<|im_end|>");
  EXPECT_EQ(t.eos_id(), 509);
  EXPECT_EQ(t.pad_id(), 507);
  EXPECT_TRUE(t.is_end_of_generation(509));
  EXPECT_TRUE(t.is_end_of_generation(507));
}

TEST(TinyVocab, EveryEncodedIdIsAByteTokenOrAMergeResult) {
  std::set<int32_t> reachable;
  for (int b = 0; b < 256; ++b) reachable.insert(b);  // the byte alphabet is ids 0..255 here
  for (const auto& [text, id] : reference().vocab()) {
    if (id >= 256) reachable.insert(id);  // every token above the bytes is some merge's result
  }
  for (const std::string& s : corpus()) {
    for (int32_t id : tiny().encode(s, false)) EXPECT_TRUE(reachable.count(id) && id < 507) << id;
  }
}

TEST(TinyVocab, DecodeInvertsEncode) {
  for (const std::string& s : corpus()) EXPECT_EQ(tiny().decode(tiny().encode(s, false)), s);
}

}  // namespace
}  // namespace hyspec
