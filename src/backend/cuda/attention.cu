// Softmax attention over the KV cache, GQA, causal or block (non-causal) mode, KV in f32 or f16.
//
// out[t, h] = sum_j softmax_j(scale * q[t,h] . K[j, h/G]) V[j, h/G] over the visible keys j:
// causal: j <= positions[t]; block mode: j <= positions[n-1]. G = n_head / n_kv_head.
//
// One kernel serves decode, verify and prefill (flash-attention style, online softmax): a block of
// 128 threads takes 16 query vectors that share a kv head (the G heads of consecutive rows, so K/V
// tiles are read once for all of them) and one split of the key range, loops over tiles of 32 keys
// staged in shared memory (f32), and keeps each query's running max, sum and output in registers
// (8 threads per query, D/8 output values each). When there are few query blocks (decode), the key
// range is split across blocks (split-K) and a second kernel merges the partial (max, sum, output)
// triples. The split boundaries are computed on the device from the positions, so a captured graph
// stays correct as the context grows.
// Budget (decode, one kv head): bytes = kv_len * D * 2 * sizeof(kv) once; FLOPs = 4 * 16 * kv_len * D
// per query block (the 16 slots are padded with idle queries when G*n < 16; the tiles are
// bandwidth-bound for G*n <= 16 either way).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/kernels.h"

namespace hyspec::cuda {
namespace {

constexpr int kQueries = 16;  // query vectors per block
constexpr int kKeys = 32;     // keys per tile
constexpr int kThreads = 128;

struct AttnArgs {
  Mat q, out;
  const void* k;
  const void* v;
  bool kv_f16;
  int64_t kv_width, kv_capacity;
  const int32_t* positions;
  int n, group, n_kv;
  float scale;
  bool causal;
  int n_splits;
  float* part_o;   // [n_splits, n_kv, M, D]
  float* part_ml;  // [n_splits, n_kv, M, 2]
};

template <int D>
constexpr size_t attention_smem() {
  // Q [16][D+4], K and V tiles [32][D+4] (f32), P [16][32].
  return (static_cast<size_t>(kQueries + 2 * kKeys) * (D + 4) + kQueries * kKeys) * sizeof(float);
}

// 16 bytes of K/V (8 halves or 4 floats) to f32 in shared memory.
__device__ __forceinline__ void store_as_f32(float* dst, const uint4& raw, bool f16) {
  if (f16) {
    const half2* h = reinterpret_cast<const half2*>(&raw);
    const float2 a = __half22float2(h[0]), b = __half22float2(h[1]), c = __half22float2(h[2]), d = __half22float2(h[3]);
    reinterpret_cast<float4*>(dst)[0] = make_float4(a.x, a.y, b.x, b.y);
    reinterpret_cast<float4*>(dst)[1] = make_float4(c.x, c.y, d.x, d.y);
  } else {
    reinterpret_cast<uint4*>(dst)[0] = raw;
  }
}

// KV is __half or float. The next K/V tile is fetched into registers while this one is computed.
template <int D, typename KV>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttnArgs a) {
  constexpr int LD = D + 4;  // row pitch: float4-aligned, consecutive rows 4 banks apart
  constexpr int J = D / 32;  // float4 output slices per thread
  constexpr int kVec = 16 / sizeof(KV);                    // elements per 16-byte load
  constexpr int kLoads = kKeys * D / kVec / kThreads;      // 16-byte loads per thread per tile and tensor
  static_assert(kLoads >= 1 && kKeys * D % (kVec * kThreads) == 0);
  extern __shared__ float smem[];
  float* Qs = smem;
  float* Ks = Qs + kQueries * LD;
  float* Vs = Ks + kKeys * LD;
  float* Ps = Vs + kKeys * LD;
  __shared__ int s_kend;

  const int tid = threadIdx.x, qi = tid >> 3, l8 = tid & 7;
  const int kvh = blockIdx.x, z = blockIdx.z;
  const int M = a.n * a.group;
  const int m = blockIdx.y * kQueries + qi;
  const bool valid_q = m < M;
  const int row = valid_q ? m / a.group : 0;
  const int head = kvh * a.group + (valid_q ? m % a.group : 0);
  const int lim = valid_q ? (a.causal ? a.positions[row] : a.positions[a.n - 1]) : -1;

  if (tid == 0) s_kend = 0;
  __syncthreads();
  if (l8 == 0 && valid_q) atomicMax(&s_kend, lim + 1);
  // Q tile, pre-scaled.
  {
    const float* src = a.q.data + static_cast<int64_t>(row) * a.q.stride + static_cast<int64_t>(head) * D;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int d = l8 * 4 + 32 * j;
      float4 v = valid_q ? *reinterpret_cast<const float4*>(src + d) : make_float4(0.f, 0.f, 0.f, 0.f);
      v.x *= a.scale, v.y *= a.scale, v.z *= a.scale, v.w *= a.scale;
      *reinterpret_cast<float4*>(Qs + qi * LD + d) = v;
    }
  }
  __syncthreads();
  const int kend = static_cast<int>(s_kend < a.kv_capacity ? s_kend : a.kv_capacity);
  const int chunk = ((kend + a.n_splits - 1) / a.n_splits + kKeys - 1) / kKeys * kKeys;
  const int k0 = z * chunk, k1 = min(kend, k0 + chunk);

  float m_run = -INFINITY, l_run = 0.0f;
  float4 o[J];
#pragma unroll
  for (int j = 0; j < J; ++j) o[j] = make_float4(0.f, 0.f, 0.f, 0.f);

  const KV* kbase = static_cast<const KV*>(a.k) + static_cast<int64_t>(kvh) * D;
  const KV* vbase = static_cast<const KV*>(a.v) + static_cast<int64_t>(kvh) * D;
  uint4 kr[kLoads], vr[kLoads];
  auto fetch = [&](int kt) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int idx = tid + i * kThreads, key = idx / (D / kVec), d = idx % (D / kVec) * kVec;
      kr[i] = vr[i] = make_uint4(0u, 0u, 0u, 0u);  // keys past the range must be zeros, not garbage
      if (kt + key < k1) {
        const int64_t off = static_cast<int64_t>(kt + key) * a.kv_width + d;
        kr[i] = __ldg(reinterpret_cast<const uint4*>(kbase + off));
        vr[i] = __ldg(reinterpret_cast<const uint4*>(vbase + off));
      }
    }
  };
  if (k0 < k1) fetch(k0);

  for (int kt = k0; kt < k1; kt += kKeys) {
    __syncthreads();  // previous tile fully consumed
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int idx = tid + i * kThreads, key = idx / (D / kVec), d = idx % (D / kVec) * kVec;
      store_as_f32(Ks + key * LD + d, kr[i], sizeof(KV) == 2);
      store_as_f32(Vs + key * LD + d, vr[i], sizeof(KV) == 2);
    }
    __syncthreads();
    if (kt + kKeys < k1) fetch(kt + kKeys);

    // Scores of query qi against keys l8 + 8*jj.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
      const float4 qv = *reinterpret_cast<const float4*>(Qs + qi * LD + d);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const float4 kv = *reinterpret_cast<const float4*>(Ks + (l8 + 8 * jj) * LD + d);
        s[jj] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
      }
    }
    float tmax = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int key = kt + l8 + 8 * jj;
      if (key >= k1 || key > lim) s[jj] = -INFINITY;
      tmax = fmaxf(tmax, s[jj]);
    }
    for (int off = 4; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
    const float m_new = fmaxf(m_run, tmax);
    float alpha = 1.0f, psum = 0.0f;
    if (m_new != -INFINITY) {
      alpha = expf(m_run - m_new);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        s[jj] = expf(s[jj] - m_new);
        psum += s[jj];
      }
    } else {
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) s[jj] = 0.0f;
    }
    for (int off = 4; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
    l_run = l_run * alpha + psum;
    m_run = m_new;
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) Ps[qi * kKeys + l8 + 8 * jj] = s[jj];
    __syncwarp();
#pragma unroll
    for (int j = 0; j < J; ++j) o[j].x *= alpha, o[j].y *= alpha, o[j].z *= alpha, o[j].w *= alpha;
#pragma unroll 4
    for (int key = 0; key < kKeys; ++key) {
      const float p = Ps[qi * kKeys + key];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const float4 vv = *reinterpret_cast<const float4*>(Vs + key * LD + l8 * 4 + 32 * j);
        o[j].x += p * vv.x, o[j].y += p * vv.y, o[j].z += p * vv.z, o[j].w += p * vv.w;
      }
    }
  }

  if (!valid_q) return;
  if (a.n_splits == 1) {
    const float inv = l_run > 0.0f ? 1.0f / l_run : 0.0f;
    float* dst = a.out.data + static_cast<int64_t>(row) * a.out.stride + static_cast<int64_t>(head) * D;
#pragma unroll
    for (int j = 0; j < J; ++j)
      *reinterpret_cast<float4*>(dst + l8 * 4 + 32 * j) = make_float4(o[j].x * inv, o[j].y * inv, o[j].z * inv, o[j].w * inv);
  } else {
    const int64_t slot = (static_cast<int64_t>(z) * a.n_kv + kvh) * M + m;
    float* dst = a.part_o + slot * D;
#pragma unroll
    for (int j = 0; j < J; ++j) *reinterpret_cast<float4*>(dst + l8 * 4 + 32 * j) = o[j];
    if (l8 == 0) a.part_ml[slot * 2] = m_run, a.part_ml[slot * 2 + 1] = l_run;
  }
}

// Merge the split partials of one query vector: out = sum_z e^(m_z - M) o_z / sum_z e^(m_z - M) l_z.
__global__ void attention_combine_kernel(AttnArgs a, int D) {
  const int M = a.n * a.group;
  const int kvh = blockIdx.x / M, m = blockIdx.x % M;
  float gmax = -INFINITY;
  for (int z = 0; z < a.n_splits; ++z)
    gmax = fmaxf(gmax, a.part_ml[((static_cast<int64_t>(z) * a.n_kv + kvh) * M + m) * 2]);
  float denom = 0.0f;
  for (int z = 0; z < a.n_splits; ++z) {
    const int64_t slot = (static_cast<int64_t>(z) * a.n_kv + kvh) * M + m;
    denom += expf(a.part_ml[slot * 2] - gmax) * a.part_ml[slot * 2 + 1];
  }
  const int row = m / a.group, head = kvh * a.group + m % a.group;
  float* dst = a.out.data + static_cast<int64_t>(row) * a.out.stride + static_cast<int64_t>(head) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int z = 0; z < a.n_splits; ++z) {
      const int64_t slot = (static_cast<int64_t>(z) * a.n_kv + kvh) * M + m;
      acc += expf(a.part_ml[slot * 2] - gmax) * a.part_o[slot * D + d];
    }
    dst[d] = denom > 0.0f ? acc / denom : 0.0f;
  }
}

// Decode/verify attention for at most kDecodeQueries query vectors per kv head (G*n <= 8: decode of
// every Qwen3.5 size, MTP verify). The tiled kernel above is bound by shared-memory bandwidth here
// (16 query slots, mostly idle); this one reads K and V straight from global memory, once:
// a warp takes 32 keys at a time, lane = key for the scores (its K row against the queries, which
// sit in shared memory and are read as broadcasts), then lane = 8 output dims for P.V (V rows are read
// coalesced, p broadcast by shuffle). Four warps split the block's key range and merge their
// (max, sum, output) through shared memory; blocks split the context as in the tiled kernel.
// Budget (one kv head, n=1, G=4, D=256, f16): bytes = 1 KB per key; FLOPs = 4*G*D per key on the
// FMA pipes, ~2.5K instructions per warp per 32 keys, so the kernel is bound by the K/V bytes.
constexpr int kDecodeQueries = 8;
constexpr int kDecodeWarps = 4;

template <typename KV, int N>
__device__ __forceinline__ void load_as_f32(const KV* p, float (&out)[N]) {
  if constexpr (sizeof(KV) == 2 && N % 8 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 8) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p + i));
      const half2* h = reinterpret_cast<const half2*>(&raw);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(h[j]);
        out[i + 2 * j] = f.x, out[i + 2 * j + 1] = f.y;
      }
    }
  } else if constexpr (sizeof(KV) == 4 && N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(p + i));
      out[i] = f.x, out[i + 1] = f.y, out[i + 2] = f.z, out[i + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if constexpr (sizeof(KV) == 2)
        out[i] = __half2float(p[i]);
      else
        out[i] = p[i];
    }
  }
}

template <int D, typename KV>
__global__ void __launch_bounds__(kDecodeWarps * 32) attention_decode_kernel(AttnArgs a) {
  constexpr int Q = kDecodeQueries, DPL = D / 32, KVEC = 16 / sizeof(KV);
  __shared__ __align__(16) float q_s[Q][D];
  __shared__ float part_o[kDecodeWarps][Q][D];
  __shared__ float part_ml[kDecodeWarps][Q][2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kvh = blockIdx.x, z = blockIdx.y;
  const int M = a.n * a.group;
  for (int i = threadIdx.x; i < Q * D; i += blockDim.x) {
    const int m = i / D, d = i % D;
    float v = 0.0f;
    if (m < M) {
      const int row = m / a.group, head = kvh * a.group + m % a.group;
      v = a.q.data[static_cast<int64_t>(row) * a.q.stride + static_cast<int64_t>(head) * D + d] * a.scale;
    }
    q_s[m][d] = v;
  }
  int lim[Q];
  int kend = 0;
#pragma unroll
  for (int m = 0; m < Q; ++m) {
    lim[m] = m < M ? (a.causal ? a.positions[m / a.group] : a.positions[a.n - 1]) : -1;
    kend = max(kend, lim[m] + 1);
  }
  kend = static_cast<int>(kend < a.kv_capacity ? kend : a.kv_capacity);
  const int chunk = ((kend + a.n_splits - 1) / a.n_splits + 31) / 32 * 32;
  const int k0 = z * chunk, k1 = min(kend, k0 + chunk);
  __syncthreads();

  const KV* kbase = static_cast<const KV*>(a.k) + static_cast<int64_t>(kvh) * D;
  const KV* vbase = static_cast<const KV*>(a.v) + static_cast<int64_t>(kvh) * D + lane * DPL;
  float m_run[Q], l_run[Q], o[Q][DPL];
#pragma unroll
  for (int m = 0; m < Q; ++m) {
    m_run[m] = -INFINITY, l_run[m] = 0.0f;
#pragma unroll
    for (int d = 0; d < DPL; ++d) o[m][d] = 0.0f;
  }
  for (int kb = k0 + warp * 32; kb < k1; kb += kDecodeWarps * 32) {
    const int key = kb + lane;
    const bool kvalid = key < k1;
    float s[Q];
#pragma unroll
    for (int m = 0; m < Q; ++m) s[m] = 0.0f;
    const KV* kr = kbase + static_cast<int64_t>(kvalid ? key : k0) * a.kv_width;
#pragma unroll 8
    for (int d0 = 0; d0 < D; d0 += KVEC) {
      float kf[KVEC];
      load_as_f32<KV, KVEC>(kr + d0, kf);
#pragma unroll
      for (int m = 0; m < Q; ++m) {
        if (m >= M) break;  // uniform
#pragma unroll
        for (int e = 0; e < KVEC; e += 4) {
          const float4 qv = *reinterpret_cast<const float4*>(&q_s[m][d0 + e]);
          s[m] += qv.x * kf[e] + qv.y * kf[e + 1] + qv.z * kf[e + 2] + qv.w * kf[e + 3];
        }
      }
    }
    float p[Q];
#pragma unroll
    for (int m = 0; m < Q; ++m) {
      p[m] = 0.0f;
      if (m >= M) continue;
      const float sv = kvalid && key <= lim[m] ? s[m] : -INFINITY;
      float mx = sv;
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m_run[m], mx);
      if (m_new == -INFINITY) continue;  // no visible key yet (uniform)
      p[m] = sv == -INFINITY ? 0.0f : expf(sv - m_new);
      float ps = p[m];
      for (int off = 16; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
      const float alpha = expf(m_run[m] - m_new);
      l_run[m] = l_run[m] * alpha + ps;
      m_run[m] = m_new;
#pragma unroll
      for (int d = 0; d < DPL; ++d) o[m][d] *= alpha;
    }
    const int nk = min(32, k1 - kb);
#pragma unroll 8
    for (int j = 0; j < nk; ++j) {
      float v[DPL];
      load_as_f32<KV, DPL>(vbase + static_cast<int64_t>(kb + j) * a.kv_width, v);
#pragma unroll
      for (int m = 0; m < Q; ++m) {
        if (m >= M) break;
        const float pj = __shfl_sync(0xffffffffu, p[m], j);
#pragma unroll
        for (int d = 0; d < DPL; ++d) o[m][d] += pj * v[d];
      }
    }
  }

#pragma unroll
  for (int m = 0; m < Q; ++m) {
#pragma unroll
    for (int d = 0; d < DPL; ++d) part_o[warp][m][lane * DPL + d] = o[m][d];
    if (lane == 0) part_ml[warp][m][0] = m_run[m], part_ml[warp][m][1] = l_run[m];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < M * D; i += blockDim.x) {
    const int m = i / D, d = i % D;
    float gmax = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) gmax = fmaxf(gmax, part_ml[w][m][0]);
    float acc = 0.0f, l = 0.0f;
    if (gmax != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        const float f = expf(part_ml[w][m][0] - gmax);
        acc += f * part_o[w][m][d];
        l += f * part_ml[w][m][1];
      }
    }
    if (a.n_splits == 1) {
      const int row = m / a.group, head = kvh * a.group + m % a.group;
      a.out.data[static_cast<int64_t>(row) * a.out.stride + static_cast<int64_t>(head) * D + d] = l > 0.0f ? acc / l : 0.0f;
    } else {
      const int64_t slot = (static_cast<int64_t>(z) * a.n_kv + kvh) * M + m;
      a.part_o[slot * D + d] = acc;
      if (d == 0) a.part_ml[slot * 2] = gmax, a.part_ml[slot * 2 + 1] = l;
    }
  }
}

template <int D, typename KV>
cudaError_t launch_kv(const AttnArgs& a, cudaStream_t stream) {
  static const cudaError_t attr = cudaFuncSetAttribute(
      attention_kernel<D, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(attention_smem<D>()));
  if (attr != cudaSuccess) return attr;
  const int M = a.n * a.group;
  if (M <= kDecodeQueries) {
    attention_decode_kernel<D, KV><<<dim3(a.n_kv, a.n_splits), kDecodeWarps * 32, 0, stream>>>(a);
  } else {
    const dim3 grid(a.n_kv, (M + kQueries - 1) / kQueries, a.n_splits);
    attention_kernel<D, KV><<<grid, kThreads, attention_smem<D>(), stream>>>(a);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || a.n_splits == 1) return err;
  attention_combine_kernel<<<a.n_kv * M, std::min(D, 256), 0, stream>>>(a, D);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch(const AttnArgs& a, cudaStream_t stream) {
  return a.kv_f16 ? launch_kv<D, __half>(a, stream) : launch_kv<D, float>(a, stream);
}

}  // namespace

bool attention_head_dim_supported(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

int attention_splits(const AttentionParams& p, int n_sm) {
  const int64_t M = p.q.rows * (p.n_head / p.n_kv_head);
  const bool decode = M <= kDecodeQueries;
  const int64_t base = p.n_kv_head * (decode ? 1 : (M + kQueries - 1) / kQueries);
  if (base >= n_sm) return 1;
  // Decode blocks are latency-bound: aim at 4 blocks per SM; the tiled kernel fills 2 per SM.
  const int64_t want = ((decode ? 4 : 2) * n_sm + base - 1) / base;
  // Each split should keep its warps busy: 2 tiles (tiled kernel) or 16 keys per warp (decode).
  const int64_t max_useful = std::max<int64_t>(1, p.kv_capacity / (decode ? kDecodeWarps * 16 : 2 * kKeys));
  return static_cast<int>(std::clamp<int64_t>(std::min(want, max_useful), 1, 256));
}

size_t attention_scratch_bytes(const AttentionParams& p, int n_splits) {
  if (n_splits <= 1) return 0;
  const int64_t M = p.q.rows * (p.n_head / p.n_kv_head);
  return static_cast<size_t>(n_splits) * p.n_kv_head * M * (p.head_dim + 2) * sizeof(float);
}

cudaError_t attention_launch(const AttentionParams& p, int n_splits, float* scratch, cudaStream_t stream) {
  if (p.q.rows == 0) return cudaSuccess;
  const int64_t M = p.q.rows * (p.n_head / p.n_kv_head);
  AttnArgs a{p.q, p.out, p.k, p.v, p.kv_f16, p.kv_width, p.kv_capacity, p.positions, static_cast<int>(p.q.rows),
             p.n_head / p.n_kv_head, p.n_kv_head, p.scale, p.causal, n_splits, scratch,
             scratch ? scratch + static_cast<int64_t>(n_splits) * p.n_kv_head * M * p.head_dim : nullptr};
  switch (p.head_dim) {
    case 32: return launch<32>(a, stream);
    case 64: return launch<64>(a, stream);
    case 128: return launch<128>(a, stream);
    case 256: return launch<256>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace hyspec::cuda
