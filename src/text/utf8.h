// UTF-8 helpers shared by the tokenizer, the stream decoder and the CLI. Never throw; invalid
// bytes are reported, not rejected.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace hyspec {

// Bytes in the sequence a lead byte starts: 1..4; 0 for a continuation byte or a byte that never
// starts a valid sequence (0xC0, 0xC1, 0xF5..0xFF).
int utf8_sequence_length(uint8_t lead);

// Decodes the code point at s[pos]. Returns the bytes consumed (>= 1 when pos < s.size()) and sets
// `cp`; an invalid or truncated sequence consumes 1 byte and sets cp = -1.
size_t utf8_decode(std::string_view s, size_t pos, int32_t& cp);

// Appends the UTF-8 encoding of a code point (0..0x10FFFF).
void utf8_append(std::string& out, uint32_t cp);

// Length of the longest prefix of `s` that does not end inside a character which more bytes could
// still complete. Invalid bytes count as complete (they will never become valid), so only a
// trailing, well-formed but truncated sequence is excluded.
size_t utf8_complete_prefix(std::string_view s);

}  // namespace hyspec
