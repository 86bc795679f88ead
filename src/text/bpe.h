// Byte-pair merging over token ids. A vocabulary's merge list "A B" (in rank order) becomes rules
// (id(A), id(B)) -> id(AB); a piece starts as one token per byte and the lowest-ranked adjacent pair
// is merged until no adjacent pair has a rule (leftmost first among equal ranks, as HF tokenizers).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace hyspec {

class MergeTable {
 public:
  struct Rule {
    int32_t left;
    int32_t right;
    int32_t result;
  };
  // Rules in rank order (index = rank). A pair listed twice keeps its first (lowest) rank.
  explicit MergeTable(const std::vector<Rule>& rules);
  MergeTable() = default;

  // Rank of the rule for (left, right), or -1; `result` receives the merged id.
  int32_t find(int32_t left, int32_t right, int32_t& result) const;
  size_t size() const { return n_rules_; }

  // Reusable buffers for merge(); one per thread.
  struct Scratch {
    struct Symbol {
      int32_t id;    // -1 once merged into its left neighbour
      int32_t prev;  // index, -1 at the start
      int32_t next;  // index, -1 at the end
    };
    struct Candidate {
      int32_t rank, left, right, left_id, right_id, result;
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };
  // Merges `ids` in place: [n_initial] -> [n_merged].
  void merge(std::vector<int32_t>& ids, Scratch& scratch) const;

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t key(int32_t l, int32_t r) { return (uint64_t(uint32_t(l)) << 32) | uint32_t(r); }
  size_t slot(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ull) >> shift_; }

  // Open addressing, linear probing; key and value side by side so a probe is one cache line.
  struct Slot {
    uint64_t key;
    int32_t rank;
    int32_t result;
  };
  std::vector<Slot> slots_;
  // Rules between ids below kDense, looked up directly: a piece starts as byte tokens, which
  // byte-level vocabularies number 0..255, so the first round of lookups stays in this table.
  static constexpr int32_t kDense = 256;
  struct DenseRule {
    int32_t rank;
    int32_t result;
  };
  std::vector<DenseRule> dense_;  // [kDense * kDense]
  int shift_ = 64;
  size_t mask_ = 0;
  size_t n_rules_ = 0;
};

}  // namespace hyspec
