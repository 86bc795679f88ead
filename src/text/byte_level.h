// GPT-2's byte-level alphabet. Byte-level BPE vocabularies store each token as text in which every
// byte is replaced by one printable code point: bytes that are printable Latin-1 ('!'..'~',
// '¡'..'¬', '®'..'ÿ') stand for themselves, the other 68 bytes map to U+0100.. in byte order
// (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace hyspec {

// The code point that stands for `byte`.
uint32_t byte_level_codepoint(uint8_t byte);

// Appends the byte-level text (UTF-8) of raw bytes.
void byte_level_encode(std::string_view bytes, std::string& out);

// Appends the raw bytes a byte-level text stands for. Returns false when the text holds a code
// point outside the alphabet or invalid UTF-8; those parts are appended unchanged.
bool byte_level_decode(std::string_view text, std::string& out);

}  // namespace hyspec
