// CPU attention over the KV cache: softmax(q·K^T * scale) V per query row and head, GQA.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "util/half.h"

namespace hyspec::cpu {

namespace {
inline void load_row(const KvLayer& kv, const void* base, int64_t pos, int64_t offset, int64_t n, float* out) {
  if (kv.type == GgmlType::F16) {
    const uint16_t* p = static_cast<const uint16_t*>(base) + pos * kv.width + offset;
    for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_fp32(p[i]);
  } else {
    std::memcpy(out, static_cast<const float*>(base) + pos * kv.width + offset, static_cast<size_t>(n) * sizeof(float));
  }
}
}  // namespace

void kv_store(Rows k, Rows v, KvLayer kv, const int32_t* positions) {
  for (int64_t t = 0; t < k.n_rows; ++t) {
    const int64_t pos = positions[t];
    if (pos < 0 || pos >= kv.capacity) continue;  // the engine bounds positions; never write outside
    if (kv.type == GgmlType::F16) {
      uint16_t* kd = static_cast<uint16_t*>(kv.k) + pos * kv.width;
      uint16_t* vd = static_cast<uint16_t*>(kv.v) + pos * kv.width;
      for (int64_t i = 0; i < kv.width; ++i) {
        kd[i] = fp32_to_fp16(k.row(t)[i]);
        vd[i] = fp32_to_fp16(v.row(t)[i]);
      }
    } else {
      std::memcpy(static_cast<float*>(kv.k) + pos * kv.width, k.row(t), static_cast<size_t>(kv.width) * sizeof(float));
      std::memcpy(static_cast<float*>(kv.v) + pos * kv.width, v.row(t), static_cast<size_t>(kv.width) * sizeof(float));
    }
  }
}

void attention(ThreadPool& pool, const AttentionArgs& a) {
  const int64_t n = a.q.n_rows;
  const int d = a.head_dim;
  const int group = a.n_head / a.n_kv_head;
  const int64_t last_pos = n > 0 ? a.positions[n - 1] : 0;
  auto work = [&](int64_t b, int64_t e, int) {
    for (int64_t item = b; item < e; ++item) {
      const int64_t t = item / a.n_head;
      const int h = static_cast<int>(item % a.n_head);
      const int kvh = h / group;
      const int64_t kv_len = std::min<int64_t>(a.kv.capacity, (a.causal ? a.positions[t] : last_pos) + 1);
      const float* q = a.q.row(t) + static_cast<int64_t>(h) * d;
      float* scores = scratch_floats(static_cast<size_t>(kv_len) + 2 * d, 1);
      float* kvrow = scores + kv_len;
      float* acc = kvrow + d;
      float mx = -INFINITY;
      for (int64_t j = 0; j < kv_len; ++j) {
        load_row(a.kv, a.kv.k, j, static_cast<int64_t>(kvh) * d, d, kvrow);
        float s = 0;
        for (int i = 0; i < d; ++i) s += q[i] * kvrow[i];
        scores[j] = s * a.scale;
        mx = std::max(mx, scores[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < kv_len; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
      }
      std::fill_n(acc, d, 0.0f);
      for (int64_t j = 0; j < kv_len; ++j) {
        load_row(a.kv, a.kv.v, j, static_cast<int64_t>(kvh) * d, d, kvrow);
        const float p = scores[j];
        for (int i = 0; i < d; ++i) acc[i] += p * kvrow[i];
      }
      float* out = a.out.row(t) + static_cast<int64_t>(h) * d;
      const float inv = static_cast<float>(1.0 / sum);
      for (int i = 0; i < d; ++i) out[i] = acc[i] * inv;
    }
  };
  const int64_t items = n * a.n_head;
  if (items * (last_pos + 1) * d < (1 << 14)) {
    work(0, items, 0);
  } else {
    pool.parallel_for(items, work);
  }
}

}  // namespace hyspec::cpu
