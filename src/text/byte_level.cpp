#include "text/byte_level.h"

#include <array>

#include "text/utf8.h"

namespace hyspec {
namespace {

bool stands_for_itself(uint32_t b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Alphabet {
  std::array<uint32_t, 256> codepoint{};
  static constexpr uint32_t kMaxCodepoint = 0x100 + 68;
  std::array<int16_t, kMaxCodepoint> byte{};  // -1: not in the alphabet

  Alphabet() {
    byte.fill(-1);
    uint32_t next = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      codepoint[b] = stands_for_itself(b) ? b : next++;
      byte[codepoint[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

uint32_t byte_level_codepoint(uint8_t byte) { return alphabet().codepoint[byte]; }

void byte_level_encode(std::string_view bytes, std::string& out) {
  const Alphabet& a = alphabet();
  for (char c : bytes) utf8_append(out, a.codepoint[static_cast<uint8_t>(c)]);
}

bool byte_level_decode(std::string_view text, std::string& out) {
  const Alphabet& a = alphabet();
  bool ok = true;
  for (size_t i = 0; i < text.size();) {
    int32_t cp;
    const size_t n = utf8_decode(text, i, cp);
    if (cp >= 0 && static_cast<uint32_t>(cp) < Alphabet::kMaxCodepoint && a.byte[cp] >= 0) {
      out += static_cast<char>(a.byte[cp]);
    } else {
      out.append(text.substr(i, n));
      ok = false;
    }
    i += n;
  }
  return ok;
}

}  // namespace hyspec
