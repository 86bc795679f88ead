// Python semantics the chat template depends on; expected values are CPython 3.11's output.
#include "text/python_text.h"

#include <gtest/gtest.h>

#include <limits>

namespace hyspec {
namespace {

using Json = nlohmann::ordered_json;

TEST(PyFloatRepr, MatchesCPythonRepr) {
  const std::pair<double, const char*> cases[] = {
      {0.0, "0.0"}, {-0.0, "-0.0"}, {1.0, "1.0"}, {100.0, "100.0"},
      {1234567890123456.0, "1234567890123456.0"}, {1e16, "1e+16"}, {1e17, "1e+17"}, {0.0001, "0.0001"},
      {0.00001, "1e-05"}, {1.5e-07, "1.5e-07"}, {3.141592653589793, "3.141592653589793"}, {2.5e300, "2.5e+300"},
      {0.1, "0.1"}, {5e-324, "5e-324"}, {1.7976931348623157e308, "1.7976931348623157e+308"},
      {123456789.125, "123456789.125"}, {-2.5, "-2.5"}, {9007199254740993.0, "9007199254740992.0"}, {0.3, "0.3"},
      {std::numeric_limits<double>::infinity(), "inf"}};
  for (const auto& [value, expected] : cases) EXPECT_EQ(py_float_repr(value), expected) << expected;
}

TEST(PyStrip, StripsPythonUnicodeWhitespaceOnly) {
  EXPECT_EQ(py_strip(" \xe3\x80\x80\xc2\xa0\x1c x \xe2\x80\x8b\xe2\x80\xa8"), "x \xe2\x80\x8b");  // U+200B is not space
  EXPECT_EQ(py_strip("\t\n\v\f\r "), "");
  EXPECT_EQ(py_strip("\xc2\x85y\xe1\x9a\x80"), "y");  // U+0085, U+1680
  EXPECT_EQ(py_strip("\xff x \xff"), "\xff x \xff");  // invalid UTF-8 is not whitespace
}

TEST(PyStr, PrintsScalarsAsPythonDoes) {
  EXPECT_EQ(py_str(Json(true)).value(), "True");
  EXPECT_EQ(py_str(Json(nullptr)).value(), "None");
  EXPECT_EQ(py_str(Json(-7)).value(), "-7");
  EXPECT_EQ(py_str(Json(18446744073709551615ull)).value(), "18446744073709551615");
  EXPECT_EQ(py_str(Json(2.0)).value(), "2.0");
  EXPECT_EQ(py_str(Json("as is")).value(), "as is");
  EXPECT_FALSE(py_str(Json::array()).is_ok());
}

TEST(AppendPyJson, MatchesJsonDumpsWithoutAsciiEscaping) {
  const Json value = Json::parse(
      R"({"a\"\\\n\t\b\f\r\u0001\u001f\u007f é": [1, 2.0, true, null, {}, []], "z": {"y": 1, "x": 2}})");
  std::string out;
  ASSERT_TRUE(append_py_json(out, value).is_ok());
  EXPECT_EQ(out,
            "{\"a\\\"\\\\\\n\\t\\b\\f\\r\\u0001\\u001f\x7f \xc3\xa9\": [1, 2.0, true, null, {}, []], "
            "\"z\": {\"y\": 1, \"x\": 2}}");
}

}  // namespace
}  // namespace hyspec
