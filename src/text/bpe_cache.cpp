#include "text/bpe_cache.h"

#include <cstring>

namespace hyspec {

BpeCache::BpeCache() {
  for (Shard& s : shards_) s.slots.resize(kSlotsPerShard);
}

// Multiply-xorshift over 8-byte words; pieces are short, so this beats a general string hash.
uint64_t BpeCache::hash(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0x94D049BB133111EBull;
  return h ^ (h >> 29);
}

bool BpeCache::lookup(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty() || piece.size() > kMaxPieceBytes) return false;
  const uint64_t h = hash(piece);
  Shard& shard = shards_[h % kShards];
  std::lock_guard<std::mutex> lock(shard.mutex);
  const Slot& slot = shard.slots[(h / kShards) % kSlotsPerShard];
  if (slot.hash != h || slot.piece != piece) return false;
  out.insert(out.end(), slot.ids.begin(), slot.ids.end());
  return true;
}

void BpeCache::insert(std::string_view piece, std::span<const int32_t> ids) const {
  if (piece.empty() || piece.size() > kMaxPieceBytes) return;
  const uint64_t h = hash(piece);
  Shard& shard = shards_[h % kShards];
  std::lock_guard<std::mutex> lock(shard.mutex);
  Slot& slot = shard.slots[(h / kShards) % kSlotsPerShard];
  slot.hash = h;
  slot.piece.assign(piece);
  slot.ids.assign(ids.begin(), ids.end());
}

}  // namespace hyspec
