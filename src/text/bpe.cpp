#include "text/bpe.h"

#include <algorithm>

namespace hyspec {

MergeTable::MergeTable(const std::vector<Rule>& rules) {
  size_t capacity = 16;
  while (capacity < rules.size() + rules.size() / 2) capacity *= 2;  // load factor <= 2/3
  slots_.assign(capacity, Slot{kEmpty, -1, -1});
  mask_ = capacity - 1;
  shift_ = 64 - __builtin_ctzll(capacity);
  for (size_t rank = 0; rank < rules.size(); ++rank) {
    const Rule& r = rules[rank];
    const uint64_t k = key(r.left, r.right);
    size_t i = slot(k);
    while (slots_[i].key != kEmpty && slots_[i].key != k) i = (i + 1) & mask_;
    if (slots_[i].key == k) continue;
    slots_[i] = Slot{k, static_cast<int32_t>(rank), r.result};
    ++n_rules_;
  }
  dense_.assign(size_t(kDense) * kDense, DenseRule{-1, -1});
  for (const Slot& s : slots_) {
    if (s.key == kEmpty) continue;
    const auto left = static_cast<int32_t>(s.key >> 32), right = static_cast<int32_t>(s.key & 0xFFFFFFFFu);
    if (left < kDense && right < kDense) dense_[size_t(left) * kDense + right] = DenseRule{s.rank, s.result};
  }
}

int32_t MergeTable::find(int32_t left, int32_t right, int32_t& result) const {
  if (slots_.empty()) return -1;
  if (uint32_t(left) < uint32_t(kDense) && uint32_t(right) < uint32_t(kDense)) {
    const DenseRule& d = dense_[size_t(left) * kDense + right];
    result = d.result;
    return d.rank;
  }
  const uint64_t k = key(left, right);
  for (size_t i = slot(k);; i = (i + 1) & mask_) {
    if (slots_[i].key == k) {
      result = slots_[i].result;
      return slots_[i].rank;
    }
    if (slots_[i].key == kEmpty) return -1;
  }
}

void MergeTable::merge(std::vector<int32_t>& ids, Scratch& scratch) const {
  const int32_t n = static_cast<int32_t>(ids.size());
  if (n < 2) return;
  auto& sym = scratch.symbols;
  auto& heap = scratch.heap;
  sym.resize(n);
  heap.clear();
  // Min-heap on (rank, left position): the lowest rank first, the leftmost among equals.
  const auto later = [](const Scratch::Candidate& a, const Scratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  const auto push_pair = [&](int32_t l, int32_t r) {
    int32_t result;
    const int32_t rank = find(sym[l].id, sym[r].id, result);
    if (rank < 0) return;
    heap.push_back({rank, l, r, sym[l].id, sym[r].id, result});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i < n; ++i) sym[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1};
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i, i + 1);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Scratch::Candidate c = heap.back();
    heap.pop_back();
    // Stale when either side has merged since the candidate was queued.
    if (sym[c.left].id != c.left_id || sym[c.right].id != c.right_id || sym[c.left].next != c.right) continue;
    sym[c.left].id = c.result;
    sym[c.right].id = -1;
    sym[c.left].next = sym[c.right].next;
    if (sym[c.right].next >= 0) sym[sym[c.right].next].prev = c.left;
    if (sym[c.left].prev >= 0) push_pair(sym[c.left].prev, c.left);
    if (sym[c.left].next >= 0) push_pair(c.left, sym[c.left].next);
  }
  ids.clear();
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids.push_back(sym[i].id);
}

}  // namespace hyspec
