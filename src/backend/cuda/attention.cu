// Softmax attention over the KV cache, GQA, causal or block (non-causal) mode, KV in f32 or f16.
//
// out[t, h] = sum_j softmax_j(scale * q[t,h] . K[j, h/G]) V[j, h/G] over the visible keys j:
// causal: j <= positions[t]; block mode: j <= positions[n-1]. G = n_head / n_kv_head.
//
// Two kernels. Steps of up to kDecodeMaxRows rows (decode and speculative verify) run
// attention_decode_kernel, whose result for a query is bit-identical whatever other rows share the
// step: speculative decoding is lossless only if a verify row gets exactly the decode step's
// logits. Its blocks take 8 query vectors each (grid.z = query groups) and one split of the key
// range; the splits are fixed slices of the KV capacity (not of the step's keys), so a query sees
// the same tiles, in the same order, in a decode step and in any verify block: tiles and splits
// past its own last key add exact zeros (p = 0, rescale factor e^0 = 1). Longer steps (prompts) run
// attention_kernel (flash-attention style, online softmax): a block of 128 threads takes 16 query
// vectors that share a kv head (the G heads of consecutive rows, so K/V tiles are read once for all
// of them) and one split of the key range, loops over tiles of 32 keys staged in shared memory
// (f32), and keeps each query's running max, sum and output in registers (8 threads per query, D/8
// output values each); a second kernel merges the split partials. Split boundaries are computed on
// the device from the positions, so a captured graph stays correct as the context grows.
// Budget (decode, one kv head): bytes = kv_len * D * 2 * sizeof(kv) once; FLOPs = 4 * 16 * kv_len * D
// per query block (the 16 slots are padded with idle queries when G*n < 16; the tiles are
// bandwidth-bound for G*n <= 16 either way).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "backend/cuda/async_copy.cuh"
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
  int chunk_tiles; // decode kernel: key tiles per split (a fixed slice of the capacity)
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

// Decode/verify attention (steps of up to kDecodeMaxRows rows). A block (4 warps) takes one kv
// head, kDecodeQueries of its query vectors (grid.z: G*n / 8 groups; decode of every Qwen3.5 size is
// one group) and one split of the key range (a fixed slice of the capacity, see the top of the
// file), and walks it in tiles of 32 keys: the K and V rows of the next tile are copied into shared
// memory with cp.async (16-byte pieces, one load round per tile) while this one is computed.
// Scores: warp w takes a quarter of the head dims, lane = key, q (f32, pre-scaled) read from shared
// memory as broadcasts; the four partial dots are summed per (query, key), an online softmax runs
// per query (one warp per query), then P.V with each thread owning two output dims of its queries.
// With several splits every block writes its partial (max, sum, output) and the last block of a
// (kv head, query group) to finish (a self-resetting counter) merges them, so one launch does the
// whole op.
// Budget (one kv head, n=1, G=4, D=256, f16): bytes = 1 KB per key (K+V), read once; FLOPs = 4*G*D
// per key; the capacity is split so that every SM gets blocks once the context fills it: a short
// context is one split per kv head, latency-bound (a copy round + ~2K instructions per warp and
// tile), long ones stream at HBM speed.
constexpr int kDecodeQueries = 8;
constexpr int kDecodeMaxRows = 32;  // the widest verify step (as the matmul's streaming path)
constexpr int kDecodeWarps = 4;
constexpr int kDecodeKeys = 32;  // keys per tile
// Tiles per split at least, which caps the split count (shorter splits cost more to merge);
// HYSPEC_ATTN_MIN_TILES overrides.
int decode_min_tiles() {
  static const int v = [] {
    const char* e = std::getenv("HYSPEC_ATTN_MIN_TILES");
    const int t = e && *e ? std::atoi(e) : 2;
    return t >= 1 ? t : 1;
  }();
  return v;
}

// Steps of up to kDecodeMaxRows rows take the decode kernel, while its merge counters (one per kv
// head and query group) fit.
bool uses_decode_kernel(int64_t rows, int group, int n_kv) {
  const int64_t groups = (rows * group + kDecodeQueries - 1) / kDecodeQueries;
  return rows <= kDecodeMaxRows && n_kv * groups <= kAttentionMaxKvHeads;
}

template <int D, typename KV>
struct DecodeSmem {
  static constexpr int kRowBytes = D * static_cast<int>(sizeof(KV)) + 16;  // padded: lane = key is conflict-free
  static constexpr int kPieces = D * static_cast<int>(sizeof(KV)) / 16;    // 16-byte pieces per row
  static constexpr size_t kTile = size_t{kDecodeKeys} * kRowBytes;          // K or V of one tile
  static constexpr size_t kQ = 4 * kTile;                                   // 2 stages x (K, V)
  static constexpr size_t kScores = kQ + sizeof(float) * kDecodeQueries * D;
  static constexpr size_t kP = kScores + sizeof(float) * kDecodeWarps * kDecodeQueries * kDecodeKeys;
  static constexpr size_t kMisc = kP + sizeof(float) * kDecodeKeys * kDecodeQueries;
  static constexpr size_t kBytes = kMisc + sizeof(float) * 3 * kDecodeQueries;
};

template <typename KV>
__device__ __forceinline__ float2 kv_pair(const uint8_t* p) {  // two consecutive elements as f32
  if constexpr (sizeof(KV) == 2) {
    return __half22float2(*reinterpret_cast<const half2*>(p));
  } else {
    return *reinterpret_cast<const float2*>(p);
  }
}

template <int D, typename KV>
__global__ void __launch_bounds__(kDecodeWarps * 32) attention_decode_kernel(AttnArgs a, unsigned* counters) {
  using L = DecodeSmem<D, KV>;
  constexpr int Q = kDecodeQueries, TK = kDecodeKeys, RB = L::kRowBytes;
  constexpr int DW = D / kDecodeWarps;             // score dims per warp
  constexpr int VEC = 16 / sizeof(KV);             // elements per 16-byte piece
  constexpr int NG = 2 * kDecodeWarps * 32 / D;    // P.V: query groups (threads per dim pair)
  constexpr int QPT = (Q + NG - 1) / NG;           // queries per thread in P.V
  static_assert(DW % VEC == 0 && NG >= 1 && Q % NG == 0);
  extern __shared__ __align__(16) uint8_t sm[];
  float* q_s = reinterpret_cast<float*>(sm + L::kQ);           // [Q][D], scaled
  float* sp_s = reinterpret_cast<float*>(sm + L::kScores);     // [warp][Q][TK] partial scores
  float* p_s = reinterpret_cast<float*>(sm + L::kP);           // [TK][Q] probabilities of the tile
  float* misc = reinterpret_cast<float*>(sm + L::kMisc);       // alpha[Q], m[Q], l[Q]
  __shared__ int s_last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kvh = blockIdx.x, z = blockIdx.y, qg = blockIdx.z;
  const int M_all = a.n * a.group;   // query vectors of this kv head in the step
  const int q0 = qg * Q;             // this block's first one; local index m = global - q0
  const int M = min(Q, M_all - q0);  // this block's count
  // Local query m: row and head in the step, and its last visible key.
  auto row_of = [&](int m) { return (q0 + m) / a.group; };
  auto head_of = [&](int m) { return kvh * a.group + (q0 + m) % a.group; };
  auto limit_of = [&](int m) { return a.causal ? a.positions[row_of(m)] : a.positions[a.n - 1]; };

  int kend = 0;
#pragma unroll
  for (int m = 0; m < Q; ++m)
    if (m < M) kend = max(kend, limit_of(m) + 1);
  kend = static_cast<int>(kend < a.kv_capacity ? kend : a.kv_capacity);
  // Splits in use: those that reach into this group's keys (the launch provides for the capacity);
  // the rest exit at once and take no part in the merge.
  const int chunk = a.chunk_tiles * TK;
  const int n_eff = max(1, (kend + chunk - 1) / chunk);
  if (z >= n_eff) return;
  const int k0 = z * chunk, k1 = min(kend, k0 + chunk);
  unsigned* counter = counters + kvh * gridDim.z + qg;

  const uint8_t* kbase = static_cast<const uint8_t*>(a.k) + static_cast<int64_t>(kvh) * D * sizeof(KV);
  const uint8_t* vbase = static_cast<const uint8_t*>(a.v) + static_cast<int64_t>(kvh) * D * sizeof(KV);
  const int64_t pitch = a.kv_width * static_cast<int64_t>(sizeof(KV));
  // Keys past k1 copy row k1-1: finite data that the mask gives weight 0.
  auto issue_tile = [&](int kt, int stage) {
    uint8_t* ks = sm + stage * 2 * L::kTile;
    uint8_t* vs = ks + L::kTile;
    for (int i = tid; i < TK * L::kPieces; i += kDecodeWarps * 32) {
      const int r = i / L::kPieces, pc = i % L::kPieces;
      const int64_t off = min(kt + r, k1 - 1) * pitch + pc * 16;
      cp_async16(ks + r * RB + pc * 16, kbase + off);
      cp_async16(vs + r * RB + pc * 16, vbase + off);
    }
    cp_async_commit();
  };
  if (k0 < k1) issue_tile(k0, 0);

  for (int i = tid; i < Q * D; i += kDecodeWarps * 32) {
    const int m = i / D, d = i % D;
    float v = 0.0f;
    if (m < M) {
      const int row = row_of(m), head = head_of(m);
      v = a.q.data[static_cast<int64_t>(row) * a.q.stride + static_cast<int64_t>(head) * D + d] * a.scale;
    }
    q_s[i] = v;
  }
  // Softmax state: warp w owns queries w and w + 4 (lane-replicated).
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  int lim[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int m = warp + kDecodeWarps * j;
    lim[j] = m < M ? limit_of(m) : -1;
  }
  const int pair = tid % (D / 2), grp = tid / (D / 2);
  float o[QPT][2];
#pragma unroll
  for (int i = 0; i < QPT; ++i) o[i][0] = o[i][1] = 0.0f;

  int stage = 0;
  for (int kt = k0; kt < k1; kt += TK, stage ^= 1) {
    cp_async_wait<0>();
    __syncthreads();  // tile kt visible to all; the other stage and p_s/sp_s are free
    if (kt + TK < k1) issue_tile(kt + TK, stage ^ 1);
    const uint8_t* ks = sm + stage * 2 * L::kTile;
    const uint8_t* vs = ks + L::kTile;
    {  // partial scores: keys = lanes, dims [warp*DW, +DW)
      float s[Q];
#pragma unroll
      for (int m = 0; m < Q; ++m) s[m] = 0.0f;
      const uint8_t* krow = ks + lane * RB + warp * DW * sizeof(KV);
#pragma unroll 4
      for (int d0 = 0; d0 < DW; d0 += VEC) {
        float kf[VEC];
        const uint4 raw = *reinterpret_cast<const uint4*>(krow + d0 * sizeof(KV));
        if constexpr (sizeof(KV) == 2) {
          const half2* h = reinterpret_cast<const half2*>(&raw);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float2 f = __half22float2(h[j]);
            kf[2 * j] = f.x, kf[2 * j + 1] = f.y;
          }
        } else {
          kf[0] = __uint_as_float(raw.x), kf[1] = __uint_as_float(raw.y), kf[2] = __uint_as_float(raw.z),
          kf[3] = __uint_as_float(raw.w);
        }
#pragma unroll
        for (int m = 0; m < Q; ++m) {
          if (m >= M) break;  // uniform
#pragma unroll
          for (int e = 0; e < VEC; e += 4) {
            const float4 qv = *reinterpret_cast<const float4*>(q_s + m * D + warp * DW + d0 + e);
            s[m] += qv.x * kf[e] + qv.y * kf[e + 1] + qv.z * kf[e + 2] + qv.w * kf[e + 3];
          }
        }
      }
#pragma unroll
      for (int m = 0; m < Q; ++m)
        if (m < M) sp_s[(warp * Q + m) * TK + lane] = s[m];
    }
    __syncthreads();
    // Online softmax: warp w, queries w and w+4; lane = key.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int m = warp + kDecodeWarps * j;
      if (m >= M) continue;  // warp-uniform
      const int key = kt + lane;
      float sv = 0.0f;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) sv += sp_s[(w * Q + m) * TK + lane];
      if (key >= k1 || key > lim[j]) sv = -INFINITY;
      float mx = sv;
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m_run[j], mx);
      float p = 0.0f, alpha = 1.0f;
      if (m_new != -INFINITY) {
        p = sv == -INFINITY ? 0.0f : expf(sv - m_new);
        alpha = expf(m_run[j] - m_new);
      }
      float ps = p;
      for (int off = 16; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
      l_run[j] = l_run[j] * alpha + ps;
      m_run[j] = m_new;
      p_s[lane * Q + m] = p;
      if (lane == 0) misc[m] = alpha;
    }
    __syncthreads();
    // P.V: this thread's dims 2*pair, 2*pair+1 of queries grp + NG*i.
#pragma unroll
    for (int i = 0; i < QPT; ++i) {
      const int m = grp + NG * i;
      if (m < M) {
        const float al = misc[m];
        o[i][0] *= al, o[i][1] *= al;
      }
    }
    const uint8_t* vcol = vs + 2 * pair * sizeof(KV);
#pragma unroll 8
    for (int key = 0; key < TK; ++key) {
      const float2 v = kv_pair<KV>(vcol + key * RB);
#pragma unroll
      for (int i = 0; i < QPT; ++i) {
        const int m = grp + NG * i;
        if (m < M) {
          const float p = p_s[key * Q + m];
          o[i][0] += p * v.x, o[i][1] += p * v.y;
        }
      }
    }
  }

  // Final (max, sum) of each query to shared memory.
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int m = warp + kDecodeWarps * j;
    if (m < Q && lane == 0) misc[Q + m] = m_run[j], misc[2 * Q + m] = l_run[j];
  }
  __syncthreads();
  if (n_eff == 1) {
#pragma unroll
    for (int i = 0; i < QPT; ++i) {
      const int m = grp + NG * i;
      if (m >= M) continue;
      const float l = misc[2 * Q + m], inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int row = row_of(m), head = head_of(m);
      float* dst = a.out.data + static_cast<int64_t>(row) * a.out.stride + static_cast<int64_t>(head) * D + 2 * pair;
      dst[0] = o[i][0] * inv, dst[1] = o[i][1] * inv;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < QPT; ++i) {
    const int m = grp + NG * i;
    if (m >= M) continue;
    const int64_t slot = (static_cast<int64_t>(z) * a.n_kv + kvh) * M_all + q0 + m;
    *reinterpret_cast<float2*>(a.part_o + slot * D + 2 * pair) = make_float2(o[i][0], o[i][1]);
    if (pair == 0) a.part_ml[slot * 2] = misc[Q + m], a.part_ml[slot * 2 + 1] = misc[2 * Q + m];
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(counter, 1u) == static_cast<unsigned>(n_eff - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // Last block of this kv head: out = sum_z e^(m_z - M) o_z / sum_z e^(m_z - M) l_z. The (max, sum)
  // pairs go through shared memory first (the K/V stages are free now), so the sum over splits is
  // independent L2 loads, not a chain.
  float* wz = reinterpret_cast<float*>(sm);  // [Q][n_eff] weights e^(m_z - M), then 1/den in [Q*n_eff + m]
  for (int i = tid; i < M * n_eff; i += kDecodeWarps * 32) {
    const int m = i / n_eff, zz = i % n_eff;
    wz[i] = __ldcg(a.part_ml + ((static_cast<int64_t>(zz) * a.n_kv + kvh) * M_all + q0 + m) * 2);
  }
  __syncthreads();
  if (tid < M) {
    float gmax = -INFINITY;
    for (int zz = 0; zz < n_eff; ++zz) gmax = fmaxf(gmax, wz[tid * n_eff + zz]);
    float den = 0.0f;
    for (int zz = 0; zz < n_eff; ++zz) {
      const float f = gmax == -INFINITY ? 0.0f : expf(wz[tid * n_eff + zz] - gmax);
      den += f * __ldcg(a.part_ml + ((static_cast<int64_t>(zz) * a.n_kv + kvh) * M_all + q0 + tid) * 2 + 1);
      wz[tid * n_eff + zz] = f;
    }
    wz[Q * n_eff + tid] = den > 0.0f ? 1.0f / den : 0.0f;
  }
  __syncthreads();
  for (int i = tid; i < M * D; i += kDecodeWarps * 32) {
    const int m = i / D, d = i % D;
    float acc = 0.0f;
#pragma unroll 8
    for (int zz = 0; zz < n_eff; ++zz)
      acc += wz[m * n_eff + zz] * __ldcg(a.part_o + ((static_cast<int64_t>(zz) * a.n_kv + kvh) * M_all + q0 + m) * D + d);
    const int row = row_of(m), head = head_of(m);
    a.out.data[static_cast<int64_t>(row) * a.out.stride + static_cast<int64_t>(head) * D + d] =
        acc * wz[Q * n_eff + m];
  }
  if (tid == 0) *counter = 0u;  // ready for the next launch (stream order)
}

template <int D, typename KV>
cudaError_t launch_kv(const AttnArgs& a, unsigned* counters, cudaStream_t stream) {
  static const cudaError_t attr = cudaFuncSetAttribute(
      attention_kernel<D, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(attention_smem<D>()));
  if (attr != cudaSuccess) return attr;
  const int M = a.n * a.group;
  if (uses_decode_kernel(a.n, a.group, a.n_kv)) {
    constexpr size_t smem = DecodeSmem<D, KV>::kBytes;
    static const cudaError_t dattr = cudaFuncSetAttribute(
        attention_decode_kernel<D, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (dattr != cudaSuccess) return dattr;
    const dim3 grid(a.n_kv, a.n_splits, (M + kDecodeQueries - 1) / kDecodeQueries);
    attention_decode_kernel<D, KV><<<grid, kDecodeWarps * 32, smem, stream>>>(a, counters);
    return cudaGetLastError();  // merges its own splits
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
cudaError_t launch(const AttnArgs& a, unsigned* counters, cudaStream_t stream) {
  return a.kv_f16 ? launch_kv<D, __half>(a, counters, stream) : launch_kv<D, float>(a, counters, stream);
}

}  // namespace

bool attention_head_dim_supported(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

int attention_splits(const AttentionParams& p, int n_sm) {
  const int64_t M = p.q.rows * (p.n_head / p.n_kv_head);
  // The decode kernel's split count must not depend on the step's width (see the top of the file).
  const bool decode = uses_decode_kernel(p.q.rows, p.n_head / p.n_kv_head, p.n_kv_head);
  const int64_t base = p.n_kv_head * (decode ? 1 : (M + kQueries - 1) / kQueries);
  if (base >= n_sm) return 1;
  // Blocks per SM to aim for: 2 (HYSPEC_ATTN_BLOCKS_PER_SM overrides, benchmarks).
  static const int per_sm = [] {
    const char* e = std::getenv("HYSPEC_ATTN_BLOCKS_PER_SM");
    const int v = e && *e ? std::atoi(e) : 2;
    return v >= 1 ? v : 1;
  }();
  const int64_t want = (int64_t{per_sm} * n_sm + base - 1) / base;
  // Each split should keep its warps busy: 2 tiles (tiled kernel) or one tile of keys (decode).
  const int64_t max_useful = std::max<int64_t>(
      1, decode ? (p.kv_capacity + kDecodeKeys * decode_min_tiles() - 1) / (kDecodeKeys * decode_min_tiles())
                : p.kv_capacity / (2 * kKeys));
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
  // The decode kernel's splits: n_splits equal slices of the capacity, whole tiles.
  const int64_t cap_tiles = (p.kv_capacity + kDecodeKeys - 1) / kDecodeKeys;
  const int chunk_tiles = static_cast<int>(std::max<int64_t>(1, (cap_tiles + n_splits - 1) / n_splits));
  AttnArgs a{p.q, p.out, p.k, p.v, p.kv_f16, p.kv_width, p.kv_capacity, p.positions, static_cast<int>(p.q.rows),
             p.n_head / p.n_kv_head, p.n_kv_head, p.scale, p.causal, n_splits, chunk_tiles, scratch,
             scratch ? scratch + static_cast<int64_t>(n_splits) * p.n_kv_head * M * p.head_dim : nullptr};
  switch (p.head_dim) {
    case 32: return launch<32>(a, p.counters, stream);
    case 64: return launch<64>(a, p.counters, stream);
    case 128: return launch<128>(a, p.counters, stream);
    case 256: return launch<256>(a, p.counters, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace hyspec::cuda
