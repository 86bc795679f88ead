// Memo of BPE results per pre-token piece: natural text repeats its words, so most pieces are
// found here instead of being merged again. A direct-mapped cache (a new piece evicts the one in
// its slot), sharded with one mutex per shard so concurrent encodes rarely contend; memory is
// bounded by kShards * kSlotsPerShard entries of at most kMaxPieceBytes bytes.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hyspec {

class BpeCache {
 public:
  // Pieces longer than this are not cached: they rarely repeat.
  static constexpr size_t kMaxPieceBytes = 48;

  BpeCache();
  // Appends the cached ids of `piece` to `out` and returns true, or returns false.
  bool lookup(std::string_view piece, std::vector<int32_t>& out) const;
  void insert(std::string_view piece, std::span<const int32_t> ids) const;

 private:
  static constexpr size_t kShards = 32;
  static constexpr size_t kSlotsPerShard = 2048;
  struct Slot {
    uint64_t hash = 0;
    std::string piece;  // empty: unused (the empty piece is never cached)
    std::vector<int32_t> ids;
  };
  struct Shard {
    std::mutex mutex;
    std::vector<Slot> slots;
  };
  static uint64_t hash(std::string_view s);
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace hyspec
