#include "text/python_text.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>

namespace hyspec {
namespace {

bool py_isspace(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20);
  switch (cp) {
    case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f: case 0x205f:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200a;
  }
}

// Decodes the code point that starts at s[i]; returns its length in bytes, 0 when not valid UTF-8.
// Only the lengths matter for whitespace (all of it is 1-3 bytes), so overlong forms are not policed.
size_t decode_utf8(std::string_view s, size_t i, uint32_t& cp) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xe ? 3 : (b >> 3) == 0x1e ? 4 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  cp = len == 1 ? b : b & (0x7f >> len);
  for (size_t k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 0x2) return 0;
    cp = (cp << 6) | (c & 0x3f);
  }
  return len;
}

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

}  // namespace

std::string_view py_strip(std::string_view s) {
  uint32_t cp = 0;
  size_t begin = 0;
  while (begin < s.size()) {
    const size_t len = decode_utf8(s, begin, cp);
    if (len == 0 || !py_isspace(cp)) break;
    begin += len;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;  // back up to the lead byte of the last code point
    while (start > begin && end - start < 4 && (static_cast<unsigned char>(s[start]) >> 6) == 0x2) --start;
    const size_t len = decode_utf8(s, start, cp);
    if (len != end - start || !py_isspace(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  // Shortest round-trip digits from to_chars ("-d.ddde+XX"), laid out by CPython's repr rules:
  // exponent form when the decimal point sits more than 16 digits right or 4 left of the digits.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits(1, sci[0]);
  if (e > 1) digits.append(sci.substr(2, e - 2));
  const int decpt = std::atoi(std::string(sci.substr(e + 1)).c_str()) + 1;
  const int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) out.append(".").append(digits, 1);
    const int x = decpt - 1;
    out += x < 0 ? "e-" : "e+";
    if (std::abs(x) < 10) out += '0';
    out += std::to_string(std::abs(x));
  } else if (decpt <= 0) {
    out.append("0.").append(static_cast<size_t>(-decpt), '0').append(digits);
  } else if (decpt >= n) {
    out.append(digits).append(static_cast<size_t>(decpt - n), '0').append(".0");
  } else {
    out.append(digits, 0, static_cast<size_t>(decpt)).append(".").append(digits, static_cast<size_t>(decpt));
  }
  return out;
}

Result<std::string> py_str(const nlohmann::ordered_json& v) {
  using value_t = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case value_t::string: return v.get_ref<const std::string&>();
    case value_t::boolean: return std::string(v.get<bool>() ? "True" : "False");
    case value_t::null: return std::string("None");
    case value_t::number_integer: return std::to_string(v.get<int64_t>());
    case value_t::number_unsigned: return std::to_string(v.get<uint64_t>());
    case value_t::number_float: return py_float_repr(v.get<double>());
    default: return Status::errorf("cannot print a JSON {} as Python's str() would", v.type_name());
  }
}

Status append_py_json(std::string& out, const nlohmann::ordered_json& v) {
  using value_t = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : v.items()) {
        if (!first) out += ", ";
        first = false;
        append_json_string(out, key);
        out += ": ";
        HS_RETURN_IF_ERROR(append_py_json(out, value));
      }
      out += '}';
      return Status::ok();
    }
    case value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        HS_RETURN_IF_ERROR(append_py_json(out, v[i]));
      }
      out += ']';
      return Status::ok();
    }
    case value_t::string: append_json_string(out, v.get_ref<const std::string&>()); return Status::ok();
    case value_t::boolean: out += v.get<bool>() ? "true" : "false"; return Status::ok();
    case value_t::null: out += "null"; return Status::ok();
    case value_t::number_integer: out += std::to_string(v.get<int64_t>()); return Status::ok();
    case value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); return Status::ok();
    case value_t::number_float: {
      const double d = v.get<double>();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
      else out += py_float_repr(d);
      return Status::ok();
    }
    default: return Status::errorf("cannot serialise a JSON {} value", v.type_name());
  }
}

}  // namespace hyspec
