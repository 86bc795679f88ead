// Memo of BPE results per pre-token piece: natural text repeats its words, so most pieces are
// found here instead of being merged again. Thread-safe (sharded, one mutex per shard); a shard
// that reaches its entry limit is emptied, which bounds the memory to a few MiB.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hyspec {

class BpeCache {
 public:
  // Pieces longer than this are not cached: they rarely repeat.
  static constexpr size_t kMaxPieceBytes = 48;

  // Appends the cached ids of `piece` to `out` and returns true, or returns false.
  bool lookup(std::string_view piece, std::vector<int32_t>& out) const;
  void insert(std::string_view piece, std::span<const int32_t> ids) const;

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  static constexpr size_t kShards = 64;
  static constexpr size_t kMaxEntriesPerShard = 2048;
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
  };
  static size_t shard_of(size_t hash) { return (hash >> 20) % kShards; }
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace hyspec
