#include "text/bpe_cache.h"

namespace hyspec {

bool BpeCache::lookup(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() > kMaxPieceBytes) return false;
  Shard& shard = shards_[shard_of(Hash{}(piece))];
  std::lock_guard<std::mutex> lock(shard.mutex);
  const auto it = shard.map.find(piece);
  if (it == shard.map.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void BpeCache::insert(std::string_view piece, std::span<const int32_t> ids) const {
  if (piece.size() > kMaxPieceBytes) return;
  Shard& shard = shards_[shard_of(Hash{}(piece))];
  std::lock_guard<std::mutex> lock(shard.mutex);
  if (shard.map.size() >= kMaxEntriesPerShard) shard.map.clear();
  shard.map.try_emplace(std::string(piece), ids.begin(), ids.end());
}

}  // namespace hyspec
