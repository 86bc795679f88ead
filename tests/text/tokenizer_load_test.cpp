// Loading a tokenizer from hand-built GGUF metadata: a minimal valid vocabulary, and one error per
// way the tokenizer.ggml.* keys can be wrong, each naming the key.
#include <gtest/gtest.h>

#include <cstring>

#include "format/gguf.h"
#include "text/byte_level.h"
#include "text/tokenizer.h"

namespace hyspec {
namespace {

// GGUF v3 metadata-only file builder.
class GgufBuilder {
 public:
  GgufBuilder& str(const std::string& key, const std::string& v) {
    key_(key, 8);
    string_(v);
    return *this;
  }
  GgufBuilder& u32(const std::string& key, uint32_t v) {
    key_(key, 4);
    pod(v);
    return *this;
  }
  GgufBuilder& strings(const std::string& key, const std::vector<std::string>& v) {
    key_(key, 9);
    pod(uint32_t{8});
    pod(uint64_t(v.size()));
    for (const std::string& s : v) string_(s);
    return *this;
  }
  GgufBuilder& i32s(const std::string& key, const std::vector<int32_t>& v) {
    key_(key, 9);
    pod(uint32_t{5});
    pod(uint64_t(v.size()));
    for (int32_t x : v) pod(x);
    return *this;
  }
  std::string bytes() const {
    std::string h = "GGUF";
    const uint32_t version = 3;
    const uint64_t n_tensors = 0, n = n_kv_;
    h.append(reinterpret_cast<const char*>(&version), 4);
    h.append(reinterpret_cast<const char*>(&n_tensors), 8);
    h.append(reinterpret_cast<const char*>(&n), 8);
    return h + body_;
  }

 private:
  template <typename T>
  void pod(T v) {
    body_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void string_(const std::string& s) {
    pod(uint64_t(s.size()));
    body_ += s;
  }
  void key_(const std::string& k, uint32_t type) {
    string_(k);
    pod(type);
    ++n_kv_;
  }
  std::string body_;
  uint64_t n_kv_ = 0;
};

std::string byte_token(int b) {
  const char c = static_cast<char>(b);
  std::string s;
  byte_level_encode(std::string_view(&c, 1), s);
  return s;
}

// 256 byte tokens (id = byte), "ab" (256) from the one merge "a b", "<|im_end|>" (257, control).
struct MiniVocab {
  std::string model = "gpt2", pre = "qwen35";
  std::vector<std::string> tokens, merges = {"a b"};
  std::vector<int32_t> types;
  MiniVocab() {
    for (int b = 0; b < 256; ++b) tokens.push_back(byte_token(b));
    tokens.push_back("ab");
    tokens.push_back("<|im_end|>");
    types.assign(tokens.size(), 1);
    types.back() = 3;
  }
  GgufBuilder builder() const {
    GgufBuilder g;
    g.str("general.architecture", "qwen35").str("tokenizer.ggml.model", model).str("tokenizer.ggml.pre", pre);
    g.strings("tokenizer.ggml.tokens", tokens).i32s("tokenizer.ggml.token_type", types);
    g.strings("tokenizer.ggml.merges", merges);
    return g;
  }
};

// Holds the bytes alive while parsing; returns the tokenizer or its error.
Result<std::unique_ptr<Tokenizer>> load(const GgufBuilder& g) {
  const std::string bytes = g.bytes();
  auto gguf = GgufFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mini.gguf");
  if (!gguf) return gguf.status();
  return Tokenizer::from_gguf(**gguf);
}

std::string load_error(const GgufBuilder& g) {
  auto t = load(g);
  return t ? std::string("(loaded)") : t.message();
}

TEST(TokenizerLoad, MinimalVocabularyLoadsAndOutlivesItsGguf) {
  MiniVocab v;
  auto t = load(v.builder().u32("tokenizer.ggml.eos_token_id", 257));
  ASSERT_TRUE(t.is_ok()) << t.message();
  EXPECT_EQ((*t)->n_vocab(), 258);
  EXPECT_EQ((*t)->encode("abc", false), (std::vector<int32_t>{256, 'c'}));
  EXPECT_EQ((*t)->encode("ab<|im_end|>", true), (std::vector<int32_t>{256, 257}));
  EXPECT_EQ((*t)->eos_id(), 257);
  EXPECT_TRUE((*t)->is_end_of_generation(257));
  EXPECT_EQ((*t)->token_text(256), "ab");
}

TEST(TokenizerLoad, GgufWithoutTokenizerKeysNamesTheMissingKey) {
  GgufBuilder g;
  g.str("general.architecture", "qwen35");
  EXPECT_EQ(load_error(g), "mini.gguf: missing metadata key 'tokenizer.ggml.model'");
}

TEST(TokenizerLoad, UnsupportedModelOrPreTokenizerIsAnError) {
  MiniVocab v;
  v.model = "llama";
  EXPECT_EQ(load_error(v.builder()),
            "mini.gguf: tokenizer.ggml.model is 'llama', hyspec supports only 'gpt2' (byte-level BPE)");
  v = MiniVocab();
  v.pre = "llama-bpe";
  EXPECT_EQ(load_error(v.builder()), "mini.gguf: tokenizer.ggml.pre is 'llama-bpe', hyspec supports only 'qwen35'");
}

TEST(TokenizerLoad, TokenTypeLengthMustMatchTokens) {
  MiniVocab v;
  v.types.pop_back();
  EXPECT_EQ(load_error(v.builder()),
            "mini.gguf: tokenizer.ggml.token_type has 257 entries but tokenizer.ggml.tokens has 258");
  v = MiniVocab();
  v.types[3] = 9;
  EXPECT_EQ(load_error(v.builder()), "mini.gguf: tokenizer.ggml.token_type[3] = 9 is not a token type (0..6)");
}

TEST(TokenizerLoad, MergesMustNameVocabularyTokens) {
  MiniVocab v;
  v.merges = {"a b", "ab c"};  // "abc" is not a token
  EXPECT_EQ(load_error(v.builder()),
            "mini.gguf: tokenizer.ggml.merges[1] = 'ab c': 'abc' is not in tokenizer.ggml.tokens");
  v.merges = {"ab"};
  EXPECT_EQ(load_error(v.builder()), "mini.gguf: tokenizer.ggml.merges[0] = 'ab' is not of the form 'A B'");
  v = MiniVocab();
  v.tokens['!'] = "!!";  // byte 0x21 loses its token
  EXPECT_EQ(load_error(v.builder()), "mini.gguf: tokenizer.ggml.tokens has no token for byte 0x21 ('!')");
}

TEST(TokenizerLoad, SpecialIdsMustBeInsideTheVocabulary) {
  MiniVocab v;
  EXPECT_EQ(load_error(v.builder().u32("tokenizer.ggml.eos_token_id", 258)),
            "mini.gguf: tokenizer.ggml.eos_token_id = 258 is outside the vocabulary [0, 258)");
  EXPECT_EQ(load_error(v.builder().str("tokenizer.ggml.bos_token_id", "1")),
            "mini.gguf: metadata 'tokenizer.ggml.bos_token_id' is string, expected an integer");
}

TEST(TokenizerLoad, MissingTokensOrMergesNameTheKey) {
  GgufBuilder g;
  g.str("tokenizer.ggml.model", "gpt2").str("tokenizer.ggml.pre", "qwen35");
  EXPECT_EQ(load_error(g), "mini.gguf: missing metadata key 'tokenizer.ggml.tokens'");
  MiniVocab v;
  GgufBuilder no_merges;
  no_merges.str("tokenizer.ggml.model", "gpt2").str("tokenizer.ggml.pre", "qwen35").strings("tokenizer.ggml.tokens",
                                                                                              v.tokens);
  EXPECT_EQ(load_error(no_merges), "mini.gguf: missing metadata key 'tokenizer.ggml.merges'");
}

}  // namespace
}  // namespace hyspec
