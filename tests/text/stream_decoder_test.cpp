// TokenStreamDecoder: streamed output never splits a UTF-8 character and loses no byte.
#include <gtest/gtest.h>

#include "fixture_tokenizer.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace hyspec {
namespace {

const Tokenizer& qwen35() { return test::qwen35_tokenizer(); }
const Tokenizer& tiny() { return test::tiny_tokenizer(); }

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    int32_t cp;
    i += utf8_decode(s, i, cp);
    if (cp < 0) return false;
  }
  return true;
}

// Pushes every token; returns the chunks (flush last).
std::vector<std::string> stream(const Tokenizer& t, const std::vector<int32_t>& ids) {
  TokenStreamDecoder d(t);
  std::vector<std::string> chunks;
  for (int32_t id : ids) chunks.push_back(d.push(id));
  chunks.push_back(d.flush());
  return chunks;
}

TEST(TokenStreamDecoder, ChineseAndEmojiSplitAcrossTokensArriveWhole) {
  const std::string text = "你好，世界！🦙 emoji 😀🎉👩‍💻 and ✅ café 🇯🇵";
  const std::vector<int32_t> ids = qwen35().encode(text, false);
  int split_tokens = 0;  // tokens that are not whole characters: what the decoder must handle
  for (int32_t id : ids) split_tokens += !valid_utf8(qwen35().token_bytes(id));
  ASSERT_GT(split_tokens, 3);
  const std::vector<std::string> chunks = stream(qwen35(), ids);
  std::string joined;
  for (const std::string& c : chunks) {
    EXPECT_TRUE(valid_utf8(c)) << c;
    joined += c;
  }
  EXPECT_EQ(chunks.back(), "");  // nothing held at the end of valid text
  EXPECT_EQ(joined, text);
}

TEST(TokenStreamDecoder, ByteTokensOfOneCharacterYieldItOnTheLastByte) {
  // The tiny vocabulary has no merges for non-ASCII: 中 (E4 B8 AD) and 😀 are one token per byte.
  EXPECT_EQ(stream(tiny(), tiny().encode("中", false)), (std::vector<std::string>{"", "", "中", ""}));
  EXPECT_EQ(stream(tiny(), tiny().encode("a😀", false)), (std::vector<std::string>{"a", "", "", "", "😀", ""}));
}

TEST(TokenStreamDecoder, FlushReturnsAnUnfinishedCharacter) {
  const std::vector<int32_t> ids = tiny().encode("中", false);
  TokenStreamDecoder d(tiny());
  EXPECT_EQ(d.push(ids[0]), "");
  EXPECT_EQ(d.push(ids[1]), "");
  EXPECT_EQ(d.flush(), "\xe4\xb8");
  EXPECT_EQ(d.flush(), "");
}

TEST(TokenStreamDecoder, InvalidBytesPassThroughAtOnce) {
  TokenStreamDecoder d(tiny());
  EXPECT_EQ(d.push(tiny().encode("\xff", false)[0]), "\xff");
  EXPECT_EQ(d.push(tiny().encode("\xe4", false)[0]), "");
  EXPECT_EQ(d.push(tiny().encode("a", false)[0]), "\xe4" "a");  // the lead byte can no longer complete
  EXPECT_EQ(d.flush(), "");
}

TEST(TokenStreamDecoder, SpecialTokensStreamAsTheirTextAndUnknownIdsAsNothing) {
  TokenStreamDecoder d(qwen35());
  EXPECT_EQ(d.push(151645), "<|im_end|>");
  EXPECT_EQ(d.push(-1), "");
  EXPECT_EQ(d.push(1 << 30), "");
  EXPECT_EQ(d.flush(), "");
}

}  // namespace
}  // namespace hyspec
