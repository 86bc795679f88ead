// A textbook byte-level BPE, written from the definition for use as a test oracle: symbols are
// strings in GPT-2's byte alphabet (rebuilt here, not taken from src/), the lowest-ranked adjacent
// pair is merged (leftmost among equals) until no pair has a rank. Slow and obviously correct.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/pretokenizer.h"

namespace hyspec::test {

// UTF-8 of a code point below U+10000 (the byte alphabet ends at U+0143).
inline std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

class ReferenceBpe {
 public:
  // `vocab`: token text -> id; `merges`: "A B" in rank order.
  ReferenceBpe(std::map<std::string, int32_t> vocab, const std::vector<std::string>& merges)
      : vocab_(std::move(vocab)) {
    int rank = 0;
    for (const std::string& m : merges) {
      const size_t space = m.find(' ');
      ranks_.emplace(std::make_pair(m.substr(0, space), m.substr(space + 1)), rank++);
    }
    // GPT-2: printable Latin-1 bytes stand for themselves, the rest take U+0100.. in byte order.
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      byte_char_[b] = utf8(printable ? b : 256 + n++);
    }
  }

  std::vector<int32_t> encode_piece(std::string_view piece) const {
    std::vector<std::string> sym;
    for (char c : piece) sym.push_back(byte_char_[static_cast<uint8_t>(c)]);
    for (;;) {
      int best = -1, best_rank = 1 << 30;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        const auto it = ranks_.find({sym[i], sym[i + 1]});
        if (it != ranks_.end() && it->second < best_rank) best_rank = it->second, best = static_cast<int>(i);
      }
      if (best < 0) break;
      sym[best] += sym[best + 1];
      sym.erase(sym.begin() + best + 1);
    }
    std::vector<int32_t> ids;
    for (const std::string& s : sym) ids.push_back(vocab_.at(s));
    return ids;
  }

  const std::map<std::string, int32_t>& vocab() const { return vocab_; }
  size_t n_merges() const { return ranks_.size(); }

 private:
  std::map<std::string, int32_t> vocab_;
  std::map<std::pair<std::string, std::string>, int> ranks_;
  std::string byte_char_[256];
};

// Splits with hyspec's pre-tokenizer (tested on its own in pretokenizer_test.cpp and by the
// llama.cpp vocab cases) and merges each piece with the reference.
inline std::vector<int32_t> reference_encode(const ReferenceBpe& bpe, std::string_view text) {
  static auto pre = Pretokenizer::create(Pretokenizer::kQwen35Pattern);
  std::vector<std::string_view> pieces;
  (*pre)->split(text, pieces);
  std::vector<int32_t> ids;
  for (std::string_view p : pieces) {
    const std::vector<int32_t> piece_ids = bpe.encode_piece(p);
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  }
  return ids;
}

}  // namespace hyspec::test
