#include "text/utf8.h"

namespace hyspec {
namespace {

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// The second byte of a sequence has a narrower range for some lead bytes: this excludes overlong
// forms (E0, F0), surrogates (ED) and code points above U+10FFFF (F4).
bool valid_second_byte(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return is_continuation(b);
  }
}

}  // namespace

int utf8_sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

size_t utf8_decode(std::string_view s, size_t pos, int32_t& cp) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  const int len = utf8_sequence_length(p[0]);
  cp = -1;
  if (len == 0 || static_cast<size_t>(len) > avail) return 1;
  if (len == 1) {
    cp = p[0];
    return 1;
  }
  if (!valid_second_byte(p[0], p[1])) return 1;
  for (int i = 2; i < len; ++i)
    if (!is_continuation(p[i])) return 1;
  static constexpr uint8_t kLeadMask[5] = {0, 0, 0x1F, 0x0F, 0x07};
  int32_t v = p[0] & kLeadMask[len];
  for (int i = 1; i < len; ++i) v = (v << 6) | (p[i] & 0x3F);
  cp = v;
  return static_cast<size_t>(len);
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t utf8_complete_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  // A truncated sequence is at most 3 bytes: a lead byte and up to 2 continuation bytes.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t start = n - back;
    if (is_continuation(p[start])) continue;
    const int len = utf8_sequence_length(p[start]);
    if (len <= static_cast<int>(back)) return n;  // complete, ASCII, or an invalid lead byte
    if (back >= 2 && !valid_second_byte(p[start], p[start + 1])) return n;  // can never complete
    return start;
  }
  return n;  // only continuation bytes at the end: stray, never completed
}

}  // namespace hyspec
