// UTF-8 helpers and the GPT-2 byte alphabet.
#include "text/utf8.h"

#include <gtest/gtest.h>

#include "text/byte_level.h"

namespace hyspec {
namespace {

TEST(Utf8, CompletePrefixHoldsBackOnlyATruncatedValidSequence) {
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("a\xe4"), 1u);          // 中 = E4 B8 AD, 1 of 3 bytes
  EXPECT_EQ(utf8_complete_prefix("a\xe4\xb8"), 1u);      // 2 of 3
  EXPECT_EQ(utf8_complete_prefix("a\xe4\xb8\xad"), 4u);  // complete
  EXPECT_EQ(utf8_complete_prefix("\xf0\x9f\x98"), 0u);   // 😀 = F0 9F 98 80, 3 of 4
  EXPECT_EQ(utf8_complete_prefix("\xff"), 1u);           // never valid
  EXPECT_EQ(utf8_complete_prefix("a\x80"), 2u);          // stray continuation byte
  EXPECT_EQ(utf8_complete_prefix("\xe0\x80"), 2u);       // E0 80 is overlong: cannot complete
  EXPECT_EQ(utf8_complete_prefix("\xed\xa0"), 2u);       // surrogate: cannot complete
  EXPECT_EQ(utf8_complete_prefix("\xf4\x90"), 2u);       // above U+10FFFF: cannot complete
  EXPECT_EQ(utf8_complete_prefix("\xe4" "a"), 2u);       // broken by ASCII: released
}

TEST(Utf8, DecodeReportsCodePointsAndRejectsMalformedSequences) {
  int32_t cp;
  EXPECT_EQ(utf8_decode("\xe4\xb8\xad", 0, cp), 3u);
  EXPECT_EQ(cp, 0x4E2D);
  EXPECT_EQ(utf8_decode("\xf0\x9f\x98\x80", 0, cp), 4u);
  EXPECT_EQ(cp, 0x1F600);
  EXPECT_EQ(utf8_decode("\xc0\xaf", 0, cp), 1u);
  EXPECT_EQ(cp, -1);
  EXPECT_EQ(utf8_decode("\xe4\xb8", 0, cp), 1u);
  EXPECT_EQ(cp, -1);
  std::string s;
  utf8_append(s, 0x1F600);
  EXPECT_EQ(s, "\xf0\x9f\x98\x80");
}

TEST(ByteLevel, MapsBytesToGpt2Alphabet) {
  EXPECT_EQ(byte_level_codepoint(' '), 0x120u);   // Ġ
  EXPECT_EQ(byte_level_codepoint('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(byte_level_codepoint('A'), uint32_t('A'));
  EXPECT_EQ(byte_level_codepoint(0xAD), 0x143u);  // soft hyphen, the last unprintable byte
  EXPECT_EQ(byte_level_codepoint(0xFF), 0xFFu);
  std::string all, text, back;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  byte_level_encode(all, text);
  EXPECT_TRUE(byte_level_decode(text, back));
  EXPECT_EQ(back, all);
  back.clear();
  EXPECT_FALSE(byte_level_decode("a\xe4\xb8\xad", back));  // 中 is not in the alphabet: kept as is
  EXPECT_EQ(back, "a\xe4\xb8\xad");
}

}  // namespace
}  // namespace hyspec
