// Moving test data into and out of backend memory, so the same model tests run on the CPU and on
// CUDA (where ops read device pointers only). Buffers live as long as the arena.
#pragma once
#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"

namespace hyspec::test {

class BackendArena {
 public:
  explicit BackendArena(Backend& b) : b_(b) {}
  template <typename T>
  T* put(const T* data, size_t n) {
    T* p = alloc<T>(n);
    if (n) b_.upload(p, data, n * sizeof(T));
    return p;
  }
  template <typename T>
  T* put(const std::vector<T>& v) { return put(v.data(), v.size()); }
  template <typename T>
  T* alloc(size_t n) {
    auto r = b_.alloc(std::max<size_t>(n, 1) * sizeof(T));
    EXPECT_TRUE(r.is_ok()) << r.message();
    buffers_.push_back(*r);
    return r->template as<T>();
  }
  // Positions 0..n-1 (a sequence from its start) in backend memory.
  const int32_t* positions(int64_t n) {
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i);
    return put(pos);
  }
  // Rows of fresh backend memory.
  Rows rows(int64_t n_rows, int64_t n_cols) { return Rows(alloc<float>(static_cast<size_t>(n_rows * n_cols)), n_rows, n_cols); }
  std::vector<float> get(Rows r) {
    std::vector<float> v(static_cast<size_t>(r.n_rows * r.n_cols));
    EXPECT_EQ(r.stride, r.n_cols) << "download of a strided view";
    b_.download(v.data(), r.data, v.size() * sizeof(float));
    return v;
  }

 private:
  Backend& b_;
  std::vector<Buffer> buffers_;
};

}  // namespace hyspec::test
