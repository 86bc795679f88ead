// Python's text semantics that jinja2 chat templates rely on, byte for byte: str.strip(), str() of a
// scalar, and json.dumps(x, ensure_ascii=False) (transformers' `tojson` filter). Strings are UTF-8.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "util/status.h"

namespace hyspec {

// str.strip(): drops leading and trailing Unicode whitespace (Python's isspace set: ASCII \t\n\v\f\r
// and space, \x1c-\x1f, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
// U+3000). Bytes that are not valid UTF-8 count as non-whitespace. Returns a view into `s`.
std::string_view py_strip(std::string_view s);

// repr(float) / str(float): shortest round-trip digits, "1.0", "1e-05", "1e+16", "inf", "nan".
std::string py_float_repr(double v);

// str(v) for a scalar: strings as they are, True/False, None, ints, floats as py_float_repr.
// Objects and arrays are refused (their str() is Python's repr, which this module does not mirror).
Result<std::string> py_str(const nlohmann::ordered_json& v);

// Appends json.dumps(v, ensure_ascii=False): keys in insertion order, ", " and ": " separators,
// non-ASCII kept, control characters as \uXXXX (lowercase hex), NaN/Infinity spelt as Python does.
// Refuses binary values, which JSON text never produces.
Status append_py_json(std::string& out, const nlohmann::ordered_json& v);

}  // namespace hyspec
