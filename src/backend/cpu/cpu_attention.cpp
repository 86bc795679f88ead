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
#include "util/half.h"

namespace hyspec::cpu {

namespace {

// Element idx of a cache row set of `type` (F32, F16 or BF16) as f32.
float cache_value(const void* base, GgmlType type, int64_t idx) {
  switch (type) {
    case GgmlType::F16: return fp16_to_fp32(static_cast<const uint16_t*>(base)[idx]);
    case GgmlType::BF16: return bf16_to_fp32(static_cast<const uint16_t*>(base)[idx]);
    default: return static_cast<const float*>(base)[idx];
  }
}

// bf16 -> f32 is a shift: the loop vectorizes as it is.
void bf16_row_to_f32(const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(x[i]);
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
  std::vector<float> scores(kv_len), acc(d, 0.0f);
  auto at = [&](const void* base, int64_t j, int i) {
    return cache_value(base, a.kv.type, j * a.kv.width + static_cast<int64_t>(kvh) * d + i);
  };
  float mx = -INFINITY;
  for (int64_t j = 0; j < kv_len; ++j) {
    float s = 0;
    for (int i = 0; i < d; ++i) s += q[i] * at(a.kv.k, j, i);
    scores[j] = s * a.scale;
    mx = std::max(mx, scores[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < kv_len; ++j) {
    scores[j] = std::exp(scores[j] - mx);
    sum += scores[j];
    for (int i = 0; i < d; ++i) acc[i] += scores[j] * at(a.kv.v, j, i);
  }
  float* out = a.out.row(t) + static_cast<int64_t>(h) * d;
  for (int i = 0; i < d; ++i) out[i] = static_cast<float>(acc[i] / sum);
}

}  // namespace

void kv_store(Rows k, Rows v, KvLayer kv, const int32_t* positions) {
  for (int64_t t = 0; t < k.n_rows; ++t) {
    const int64_t pos = positions[t];
    if (pos < 0 || pos >= kv.capacity) continue;  // the engine bounds positions; never write outside
    if (kv.type == GgmlType::F16 || kv.type == GgmlType::BF16) {
      uint16_t* kd = static_cast<uint16_t*>(kv.k) + pos * kv.width;
      uint16_t* vd = static_cast<uint16_t*>(kv.v) + pos * kv.width;
      uint16_t (*round)(float) = kv.type == GgmlType::F16 ? fp32_to_fp16 : fp32_to_bf16;
      for (int64_t i = 0; i < kv.width; ++i) {
        kd[i] = round(k.row(t)[i]);
        vd[i] = round(v.row(t)[i]);
      }
    } else {
      std::memcpy(static_cast<float*>(kv.k) + pos * kv.width, k.row(t), static_cast<size_t>(kv.width) * sizeof(float));
      std::memcpy(static_cast<float*>(kv.v) + pos * kv.width, v.row(t), static_cast<size_t>(kv.width) * sizeof(float));
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
      if (a.kv.type == GgmlType::F16 || a.kv.type == GgmlType::BF16) {
        // Widen this head's keys and values once for the whole tile.
        float* buf = scratch_floats(static_cast<size_t>(2 * max_len * d), 2);
        auto widen = a.kv.type == GgmlType::F16 ? k.f16_to_f32 : bf16_row_to_f32;
        for (int64_t j = 0; j < max_len; ++j) {
          const int64_t off = j * a.kv.width + static_cast<int64_t>(kvh) * d;
          widen(static_cast<const uint16_t*>(a.kv.k) + off, d, buf + j * d);
          widen(static_cast<const uint16_t*>(a.kv.v) + off, d, buf + (max_len + j) * d);
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
