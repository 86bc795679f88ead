// CPU attention over the KV cache: softmax(q·Kᵀ * scale) V per query row and head, GQA.
//
// Work is cut into (query tile, KV head) items. A tile holds ~8 query rows that share one KV head:
// the `group` q-heads of that KV head for a few consecutive tokens. The tile kernel
// (f32_kernels.h) reads each key and value row once per pair of query rows, so K/V traffic drops
// ~8x against one row at a time. Cost per (query row, key): 2·head_dim MACs (scores and PV) plus
// one exp; K/V bytes per item: kv_len · 2 · head_dim · 4.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "format/quants.h"
#include "util/half.h"

namespace hyspec::cpu {

namespace {

// The slot of (position pos, kv head kvh) in one half (keys or values) of a cache.
uint8_t* slot(const KvLayer& kv, void* base, int64_t pos, int kvh) {
  return static_cast<uint8_t*>(base) + static_cast<size_t>(pos) * kv.row_bytes() +
         static_cast<size_t>(kvh) * kv.head_bytes();
}

// A slot as head_dim f32 values (backend.h: KvLayer), exactly: a 16-bit value widens, a Q8_0 code times
// its block's f16 scale is exact in f32 (7 + 11 significant bits).
void widen_slot(const KvLayer& kv, const uint8_t* s, float* y, const F32Kernels& k) {
  const int64_t d = kv.head_dim;
  switch (kv.type) {
    case GgmlType::F16: k.f16_to_f32(reinterpret_cast<const uint16_t*>(s), d, y); break;
    case GgmlType::BF16:  // a shift: the loop vectorizes as it is
      for (int64_t i = 0; i < d; ++i) y[i] = bf16_to_fp32(reinterpret_cast<const uint16_t*>(s)[i]);
      break;
    case GgmlType::Q8_0:
      for (int64_t b = 0; b < d / 32; ++b) {
        uint16_t h;
        std::memcpy(&h, s + d + 2 * b, 2);
        const float scale = fp16_to_fp32(h);
        for (int64_t i = 32 * b; i < 32 * b + 32; ++i) y[i] = scale * static_cast<float>(static_cast<int8_t>(s[i]));
      }
      break;
    default: std::memcpy(y, s, static_cast<size_t>(d) * sizeof(float)); break;
  }
}

// head_dim values into a slot, rounded as the cache type stores them (backend.h: KvLayer).
void store_slot(const KvLayer& kv, const float* x, uint8_t* s) {
  const int64_t d = kv.head_dim;
  switch (kv.type) {
    case GgmlType::F16:
    case GgmlType::BF16: {
      uint16_t (*round)(float) = kv.type == GgmlType::F16 ? fp32_to_fp16 : fp32_to_bf16;
      for (int64_t i = 0; i < d; ++i) {
        const uint16_t h = round(x[i]);
        std::memcpy(s + 2 * i, &h, 2);
      }
      break;
    }
    case GgmlType::Q8_0: {
      // ggml's own q8_0 blocks (format/quants.cpp: d:f16, 32 codes), then codes first, scales after.
      uint8_t blocks[34];
      for (int64_t b = 0; b < d / 32; ++b) {
        (void)quantize_row(GgmlType::Q8_0, x + 32 * b, blocks, 32);  // cannot fail: Q8_0, 32 values
        std::memcpy(s + d + 2 * b, blocks, 2);
        std::memcpy(s + 32 * b, blocks + 2, 32);
      }
      std::memset(s + d + d / 16, 0, kv.head_bytes() - static_cast<size_t>(d + d / 16));  // the padding
      break;
    }
    default: std::memcpy(s, x, static_cast<size_t>(d) * sizeof(float)); break;
  }
}

// ns per (query row, key, head dim) on one AVX2 core: 2 MACs at ~12 MAC/ns.
constexpr double kNsPerRowKeyDim = 0.17;
constexpr int kTileRows = 8;

// The readable per-row form, for head sizes the tile kernel does not take (head_dim % 8 != 0).
void attention_rows(const AttentionArgs& a, int64_t t, int h) {
  const int d = a.head_dim;
  const int kvh = h / (a.n_head / a.n_kv_head);
  const int64_t last_pos = a.positions[a.q.n_rows - 1];
  const int64_t kv_len = std::min<int64_t>(a.kv.capacity, (a.causal ? a.positions[t] : last_pos) + 1);
  const float* q = a.q.row(t) + static_cast<int64_t>(h) * d;
  std::vector<float> scores(kv_len), acc(d, 0.0f), kf(d), vf(d);
  const F32Kernels& kern = f32_kernels();
  float mx = -INFINITY;
  for (int64_t j = 0; j < kv_len; ++j) {
    widen_slot(a.kv, slot(a.kv, a.kv.k, j, kvh), kf.data(), kern);
    float s = 0;
    for (int i = 0; i < d; ++i) s += q[i] * kf[i];
    scores[j] = s * a.scale;
    mx = std::max(mx, scores[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < kv_len; ++j) {
    widen_slot(a.kv, slot(a.kv, a.kv.v, j, kvh), vf.data(), kern);
    scores[j] = std::exp(scores[j] - mx);
    sum += scores[j];
    for (int i = 0; i < d; ++i) acc[i] += scores[j] * vf[i];
  }
  float* out = a.out.row(t) + static_cast<int64_t>(h) * d;
  for (int i = 0; i < d; ++i) out[i] = static_cast<float>(acc[i] / sum);
}

}  // namespace

void kv_store(Rows k, Rows v, KvLayer kv, const int32_t* positions) {
  const int n_kv_head = static_cast<int>(kv.width / kv.head_dim);
  for (int64_t t = 0; t < k.n_rows; ++t) {
    const int64_t pos = positions[t];
    if (pos < 0 || pos >= kv.capacity) continue;  // the engine bounds positions; never write outside
    for (int h = 0; h < n_kv_head; ++h) {
      store_slot(kv, k.row(t) + h * kv.head_dim, slot(kv, kv.k, pos, h));
      store_slot(kv, v.row(t) + h * kv.head_dim, slot(kv, kv.v, pos, h));
    }
  }
}

void attention(ThreadPool& pool, const AttentionArgs& a, const F32Kernels& k) {
  const int64_t n = a.q.n_rows;
  if (n <= 0) return;
  const int d = a.head_dim;
  const int group = a.n_head / a.n_kv_head;
  const int64_t last_pos = a.positions[n - 1];
  auto kv_len_of = [&](int64_t t) {
    return std::max<int64_t>(1, std::min<int64_t>(a.kv.capacity, (a.causal ? a.positions[t] : last_pos) + 1));
  };
  const double ns_per_row = static_cast<double>(kv_len_of(n - 1)) * d * kNsPerRowKeyDim;
  if (d % 8 != 0) {
    parallel_for_cost(pool, n * a.n_head, ns_per_row, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) attention_rows(a, i / a.n_head, static_cast<int>(i % a.n_head));
    });
    return;
  }
  const int tile_tokens = std::max(1, kTileRows / group);
  const int64_t n_tiles = (n + tile_tokens - 1) / tile_tokens;
  const int64_t items = n_tiles * a.n_kv_head;
  auto work = [&](int64_t b, int64_t e, int) {
    const size_t max_rows = static_cast<size_t>(tile_tokens) * group;
    std::vector<const float*> rows_q(max_rows);
    std::vector<float*> rows_out(max_rows);
    std::vector<int64_t> rows_len(max_rows);
    for (int64_t item = b; item < e; ++item) {
      // Latest tiles first: under causal masking they cost the most, and the pool hands out parts in
      // order, so the cheap ones are left to even out the threads at the end.
      const int64_t tile = n_tiles - 1 - item / a.n_kv_head;
      const int kvh = static_cast<int>(item % a.n_kv_head);
      const int64_t t0 = tile * tile_tokens, t1 = std::min(n, t0 + tile_tokens);
      int m = 0;
      int64_t max_len = 1;
      for (int64_t t = t0; t < t1; ++t)
        for (int g = 0; g < group; ++g, ++m) {
          const int64_t h = static_cast<int64_t>(kvh) * group + g;
          rows_q[m] = a.q.row(t) + h * d;
          rows_out[m] = a.out.row(t) + h * d;
          rows_len[m] = kv_len_of(t);
          max_len = std::max(max_len, rows_len[m]);
        }
      AttentionTile tt;
      tt.m = m;
      tt.d = d;
      tt.q = rows_q.data();
      tt.out = rows_out.data();
      tt.kv_len = rows_len.data();
      tt.scale = a.scale;
      if (a.kv.type != GgmlType::F32) {
        // Widen this head's keys and values once for the whole tile.
        float* buf = scratch_floats(static_cast<size_t>(2 * max_len * d), 2);
        for (int64_t j = 0; j < max_len; ++j) {
          widen_slot(a.kv, slot(a.kv, a.kv.k, j, kvh), buf + j * d, k);
          widen_slot(a.kv, slot(a.kv, a.kv.v, j, kvh), buf + (max_len + j) * d, k);
        }
        tt.k = buf;
        tt.v = buf + max_len * d;
        tt.kv_stride = d;
      } else {
        tt.k = static_cast<const float*>(a.kv.k) + static_cast<int64_t>(kvh) * d;
        tt.v = static_cast<const float*>(a.kv.v) + static_cast<int64_t>(kvh) * d;
        tt.kv_stride = a.kv.width;
      }
      k.attention_tile(tt, scratch_floats(attention_scratch_floats(m, d, max_len), 1));
    }
  };
  parallel_for_cost(pool, items, ns_per_row * tile_tokens * group, work);
}

}  // namespace hyspec::cpu
