// The qwen35 pre-tokenizer regex on hand-split examples, one per branch of the pattern.
#include "text/pretokenizer.h"

#include <gtest/gtest.h>

namespace hyspec {
namespace {

std::vector<std::string> split(std::string_view text) {
  static auto pre = Pretokenizer::create(Pretokenizer::kQwen35Pattern);
  EXPECT_TRUE(pre.is_ok()) << pre.message();
  std::vector<std::string_view> pieces;
  (*pre)->split(text, pieces);
  return {pieces.begin(), pieces.end()};
}

using Pieces = std::vector<std::string>;

TEST(Qwen35Pretokenizer, SplitsWordsWithTheirLeadingSpaceOrPunctuation) {
  EXPECT_EQ(split("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(split("f(self)"), (Pieces{"f", "(self", ")"}));
  EXPECT_EQ(split("\xc3\xa9t\xc3\xa9"), (Pieces{"\xc3\xa9t\xc3\xa9"}));  // été: letters
  // A combining mark (U+0301) continues a word, as \p{M} is in the letter class.
  EXPECT_EQ(split("e\xcc\x81t\xcc\x81 x"), (Pieces{"e\xcc\x81t\xcc\x81", " x"}));
}

TEST(Qwen35Pretokenizer, SplitsContractionsCaseInsensitively) {
  EXPECT_EQ(split("I'm we'LL they'Re"), (Pieces{"I", "'m", " we", "'LL", " they", "'Re"}));
}

TEST(Qwen35Pretokenizer, SplitsNumbersIntoSingleDigits) {
  EXPECT_EQ(split("x123"), (Pieces{"x", "1", "2", "3"}));
  EXPECT_EQ(split("\xd9\xa3\xd9\xa4"), (Pieces{"\xd9\xa3", "\xd9\xa4"}));  // Arabic-Indic digits
}

TEST(Qwen35Pretokenizer, KeepsPunctuationRunsWithTrailingNewlines) {
  EXPECT_EQ(split("ok!!!\n\nnext"), (Pieces{"ok", "!!!\n\n", "next"}));
  EXPECT_EQ(split("a ):\n"), (Pieces{"a", " ):\n"}));
}

TEST(Qwen35Pretokenizer, LeavesOneSpaceBeforeAWordAndGroupsNewlines) {
  EXPECT_EQ(split("    Hello"), (Pieces{"   ", " Hello"}));
  EXPECT_EQ(split("x  \n y"), (Pieces{"x", "  \n", " y"}));
  EXPECT_EQ(split("a\n\n\nb"), (Pieces{"a", "\n\n\n", "b"}));
  EXPECT_EQ(split("end   "), (Pieces{"end", "   "}));
  EXPECT_EQ(split("\t\t3"), (Pieces{"\t", "\t", "3"}));
}

TEST(Qwen35Pretokenizer, WhiteSpaceIsUnicodeWhiteSpaceNotPcreDefault) {
  // U+0085 (NEL) and U+3000 are white space: "!" and the space are separate pieces.
  EXPECT_EQ(split("x!\xc2\x85"), (Pieces{"x", "!", "\xc2\x85"}));
  EXPECT_EQ(split("x!\xe3\x80\x80"), (Pieces{"x", "!", "\xe3\x80\x80"}));
  // U+180E is no longer white space (Unicode 6.3); it joins the punctuation run.
  EXPECT_EQ(split("x!\xe1\xa0\x8e"), (Pieces{"x", "!\xe1\xa0\x8e"}));
}

TEST(Qwen35Pretokenizer, InvalidUtf8BytesBecomeTheirOwnPiecesAndNothingIsLost) {
  EXPECT_EQ(split("a\xff" "b"), (Pieces{"a", "\xff", "b"}));
  EXPECT_EQ(split("\xe4\xb8"), (Pieces{"\xe4\xb8"}));
  EXPECT_EQ(split(std::string_view("\0 x", 3)), (Pieces{std::string("\0", 1), " x"}));
  EXPECT_EQ(split(""), Pieces{});
}

TEST(Qwen35Pretokenizer, LongWhitespaceRunsDoNotExhaustTheMatcher) {
  const std::string spaces(1 << 20, ' ');
  const std::vector<std::string> pieces = split(spaces + "x");
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].size(), spaces.size() - 1);
  EXPECT_EQ(pieces[1], " x");
}

}  // namespace
}  // namespace hyspec
