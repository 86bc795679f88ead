// A KV cache built by the tests from the layout that backend.h describes (KvLayer, kv_head_bytes), not
// by kv_store: the bytes every backend's kv_store must reproduce, and the values attention must see.
// 16-bit types round with util/half.h; Q8_0 blocks come from format/quants (ggml's reference rounding,
// bit-exact with gguf-py), and their values from its dequantizer.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "format/quants.h"
#include "util/half.h"

namespace hyspec::test {

struct KvCacheBytes {
  std::vector<uint8_t> k, v;   // [positions][row_bytes]
  std::vector<float> kf, vf;   // what each element holds, [positions][width]
  KvLayer layer(GgmlType type, int64_t capacity, int64_t width, int64_t head_dim) {
    return KvLayer{k.data(), v.data(), type, capacity, width, head_dim};
  }
};

// Positions x.size() / width of keys k and values v (f32, [positions][width]) as a cache of `type`.
inline KvCacheBytes encode_kv_cache(GgmlType type, const std::vector<float>& k, const std::vector<float>& v,
                                    int64_t width, int64_t head_dim) {
  KvCacheBytes c;
  const size_t slot = kv_head_bytes(type, head_dim);
  EXPECT_NE(slot, 0u) << ggml_type_name(type) << " head_dim " << head_dim;
  const int64_t heads = width / head_dim, n_pos = static_cast<int64_t>(k.size()) / width;
  const size_t row = slot * static_cast<size_t>(heads);
  auto encode = [&](const std::vector<float>& x, std::vector<uint8_t>& bytes, std::vector<float>& held) {
    bytes.assign(static_cast<size_t>(n_pos) * row, 0);
    held.resize(x.size());
    for (int64_t p = 0; p < n_pos; ++p)
      for (int64_t h = 0; h < heads; ++h) {
        const float* src = x.data() + p * width + h * head_dim;
        float* got = held.data() + p * width + h * head_dim;
        uint8_t* dst = bytes.data() + static_cast<size_t>(p) * row + static_cast<size_t>(h) * slot;
        for (int64_t i = 0; i < head_dim; ++i) {
          if (type == GgmlType::F32) {
            std::memcpy(dst + 4 * i, &src[i], 4);
            got[i] = src[i];
          } else if (type == GgmlType::F16 || type == GgmlType::BF16) {
            const uint16_t u = type == GgmlType::F16 ? fp32_to_fp16(src[i]) : fp32_to_bf16(src[i]);
            std::memcpy(dst + 2 * i, &u, 2);
            got[i] = type == GgmlType::F16 ? fp16_to_fp32(u) : bf16_to_fp32(u);
          }
        }
        if (type != GgmlType::Q8_0) continue;
        for (int64_t b = 0; b < head_dim / 32; ++b) {  // codes of block b at 32b, its f16 scale at head_dim + 2b
          uint8_t block[34];
          EXPECT_TRUE(quantize_row(GgmlType::Q8_0, src + 32 * b, block, 32).is_ok());
          EXPECT_TRUE(dequantize_row(GgmlType::Q8_0, block, got + 32 * b, 32).is_ok());
          std::memcpy(dst + head_dim + 2 * b, block, 2);
          std::memcpy(dst + 32 * b, block + 2, 32);
        }
      }
  };
  encode(k, c.k, c.kf);
  encode(v, c.v, c.vf);
  return c;
}

}  // namespace hyspec::test
