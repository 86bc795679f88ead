// Softmax attention over the KV cache, GQA, causal or block (non-causal) mode, KV in f32, f16 or bf16.
//
// out[t, h] = sum_j softmax_j(scale * q[t,h] . K[j, h/G]) V[j, h/G] over the visible keys j:
// causal: j <= positions[t]; block mode: j <= positions[n-1]. G = n_head / n_kv_head.
//
// Steps of up to kDecodeMaxRows rows (decode and speculative verify) run a decode kernel,
// attention_decode_mma_kernel (tensor cores) for F16/BF16 KV where the device grants its shared memory,
// else attention_decode_kernel (SIMT), whose result for a query is bit-identical whatever other
// rows share the step: speculative decoding is lossless only if a verify row gets exactly the
// decode step's logits. Their blocks take 8 query vectors each (a query group; DecodeBlock gives the
// grid's order) and one split of the key range; the splits are fixed slices of the KV capacity (not of
// the step's keys), so a query sees the same tiles, in the same order, in a decode step and in any
// verify block: tiles and splits past its own last key add exact zeros (p = 0, rescale factor e^0 = 1).
// Longer steps (prompts) run attention_prompt_mma_kernel (tensor cores) for F16/BF16/Q8_0 KV, else attention_kernel (flash-attention
// style, online softmax, SIMT; F32 KV and devices without the shared memory): a block of 128 threads takes 16 query
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
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/launch_util.h"
#include "backend/cuda/tensor_core.cuh"
#ifdef HYSPEC_ATTN_TRACE
#include "backend/cuda/timeline.cuh"
#endif

namespace hyspec::cuda {

// ---- The decode kernels' timeline (cmake -DHYSPEC_ATTN_TRACE=ON; compiled out otherwise) ----
// Thread 0 of each block stores %globaltimer at the phases below, the last launch's values kept
// (attention_trace_report). PERFORMANCE.md "Session 33" read a 16K decode step's attention with it.
enum AttnMark { kMarkStart, kMarkWaited, kMarkQStaged, kMarkLoopDone, kMarkWarpsMerged, kMarkCounted, kMarkMerged,
                kMarkMergeFenced, kMarkMergeMl, kMarkMergeWeights, kMarkCount };
#ifdef HYSPEC_ATTN_TRACE
__device__ BlockTimeline<4096, kMarkCount> g_attn_trace;
__device__ __forceinline__ void attn_mark(AttnMark m) {
  timeline_mark(g_attn_trace, blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), m);
}
void attention_trace_report(const char* label) {
  const char* const names[kMarkCount] = {"start", "waited", "q staged", "loop done", "warps merged", "counted",
                                         "merged", "merge: fenced", "merge: ml", "merge: weights"};
  timeline_report(g_attn_trace, names, label);
}
#else
__device__ __forceinline__ void attn_mark(AttnMark) {}
#endif

namespace {

constexpr int kQueries = 16;  // query vectors per block
constexpr int kKeys = 32;     // keys per tile
constexpr int kThreads = 128;

struct AttnArgs {
  Mat q, out;
  const void* k;
  const void* v;
  int64_t kv_capacity, row_bytes, head_bytes;  // slot of (position p, kv head h): k + p * row_bytes + h * head_bytes
  const int32_t* positions;
  int n, group, n_kv;
  float scale;
  bool causal;
  int n_splits;
  int chunk_tiles; // decode kernel: key tiles per split (a fixed slice of the key room, decode_key_room)
  float* part_o;   // [n_splits, n_kv, M, D]
  float* part_ml;  // [n_splits, n_kv, M, 2]
  bool kv_major;   // decode kernels: grid (kv heads, splits, group blocks) instead of (group blocks, kv heads, splits)
};

template <int D>
constexpr size_t attention_smem() {
  // Q [16][D+4], K and V tiles [32][D+4] (f32), P [16][32].
  return (static_cast<size_t>(kQueries + 2 * kKeys) * (D + 4) + kQueries * kKeys) * sizeof(float);
}

// 16 bytes of K/V (16 Q8_0 codes of one block, 8 16-bit elements or 4 floats) to f32 in shared memory;
// scale: the Q8_0 block's.
template <typename KV>
__device__ __forceinline__ void store_as_f32(float* dst, const uint4& raw, float scale) {
  if constexpr (kIsQ8<KV>) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      reinterpret_cast<float4*>(dst)[j] = make_float4(scale * code_at(w[j], 0), scale * code_at(w[j], 1),
                                                      scale * code_at(w[j], 2), scale * code_at(w[j], 3));
  } else if constexpr (sizeof(KV) == 2) {
    const float2 a = widen_pair<KV>(raw.x), b = widen_pair<KV>(raw.y), c = widen_pair<KV>(raw.z),
                 d = widen_pair<KV>(raw.w);
    reinterpret_cast<float4*>(dst)[0] = make_float4(a.x, a.y, b.x, b.y);
    reinterpret_cast<float4*>(dst)[1] = make_float4(c.x, c.y, d.x, d.y);
  } else {
    reinterpret_cast<uint4*>(dst)[0] = raw;
  }
}

// KV is float, __half, __nv_bfloat16 or Q8Slot. The next K/V tile is fetched into registers while this one is computed.
template <int D, typename KV>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttnArgs a) {
  constexpr int LD = D + 4;  // row pitch: float4-aligned, consecutive rows 4 banks apart
  constexpr int J = D / 32;  // float4 output slices per thread
  constexpr int kElem = kIsQ8<KV> ? 1 : static_cast<int>(sizeof(KV));  // bytes per element (Q8_0: the code)
  constexpr int kVec = 16 / kElem;                                       // elements per 16-byte load
  constexpr int kPieces = kKeys * D / kVec;                              // 16-byte loads per tile and tensor
  constexpr int kLoads = (kPieces + kThreads - 1) / kThreads;           // per thread
  static_assert(kPieces % kThreads == 0 || kLoads == 1);
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

  const uint8_t* kbase = static_cast<const uint8_t*>(a.k) + kvh * a.head_bytes;
  const uint8_t* vbase = static_cast<const uint8_t*>(a.v) + kvh * a.head_bytes;
  uint4 kr[kLoads], vr[kLoads];
  float ksc[kLoads], vsc[kLoads];  // Q8_0: the pieces' block scales
  auto fetch = [&](int kt) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int idx = tid + i * kThreads, key = idx / (D / kVec), d = idx % (D / kVec) * kVec;
      kr[i] = vr[i] = make_uint4(0u, 0u, 0u, 0u);  // keys past the range must be zeros, not garbage
      ksc[i] = vsc[i] = 0.0f;
      if ((kPieces % kThreads == 0 || idx < kPieces) && kt + key < k1) {
        const int64_t row = static_cast<int64_t>(kt + key) * a.row_bytes;
        kr[i] = __ldg(reinterpret_cast<const uint4*>(kbase + row + d * kElem));
        vr[i] = __ldg(reinterpret_cast<const uint4*>(vbase + row + d * kElem));
        if constexpr (kIsQ8<KV>) ksc[i] = q8_scale(kbase + row, D, d / 32), vsc[i] = q8_scale(vbase + row, D, d / 32);
      }
    }
  };
  if (k0 < k1) fetch(k0);

  for (int kt = k0; kt < k1; kt += kKeys) {
    __syncthreads();  // previous tile fully consumed
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int idx = tid + i * kThreads, key = idx / (D / kVec), d = idx % (D / kVec) * kVec;
      if (kPieces % kThreads != 0 && idx >= kPieces) continue;
      store_as_f32<KV>(Ks + key * LD + d, kr[i], ksc[i]);
      store_as_f32<KV>(Vs + key * LD + d, vr[i], vsc[i]);
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
    } else {  // every score masked or NaN (a NaN query): NaN weights keep the output NaN
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        s[jj] = s[jj] == -INFINITY ? 0.0f : s[jj];
        psum += s[jj];
      }
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
    const float inv = l_run != 0.0f ? 1.0f / l_run : 0.0f;  // NaN sums stay NaN
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
    dst[d] = denom != 0.0f ? acc / denom : 0.0f;
  }
}

// Decode/verify attention (steps of up to kDecodeMaxRows rows). A block (4 warps) takes one kv
// head, kDecodeQueries of its query vectors (G*n / 8 groups, see DecodeBlock; decode of every Qwen3.5
// size is one group) and one split of the key range (a fixed slice of the capacity, see the top of the
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

// The tensor-core decode kernel for 16-bit KV, unless HYSPEC_ATTN_MMA=0 (benchmarks of the SIMT one).
bool decode_mma_enabled() {
  static const bool v = env_int("HYSPEC_ATTN_MMA", 1) != 0;
  return v;
}

// Steps of up to kDecodeMaxRows rows take the decode kernel, while its merge counters (one per kv
// head and query group) fit.
bool uses_decode_kernel(int64_t rows, int group, int n_kv) {
  const int64_t groups = (rows * group + kDecodeQueries - 1) / kDecodeQueries;
  return rows <= kDecodeMaxRows && n_kv * groups <= kAttentionMaxKvHeads;
}

constexpr int kMaxSplits = 256;
constexpr int kDecodeSplitKeys = 512;  // keys per decode split at most (attention_splits)
// Shared memory of the last block's split merge (finish_decode_block).
constexpr size_t kDecodeMergeBytes = (2 * kDecodeQueries * kMaxSplits + kDecodeQueries) * sizeof(float);

template <int D, typename KV>
struct DecodeSmem {
  static constexpr int kSlot = slot_bytes<KV, D>();
  static constexpr int kRowBytes = kSlot + 16;  // padded: lane = key is conflict-free for 16-bit and f32 rows
  static constexpr int kPieces = kSlot / 16;    // 16-byte pieces per row
  static constexpr size_t kTile = size_t{kDecodeKeys} * kRowBytes;          // K or V of one tile
  // 2 stages x (K, V); after the loop, the split merge's work area
  static constexpr size_t kQ = std::max(4 * kTile, kDecodeMergeBytes);
  static constexpr size_t kScores = kQ + sizeof(float) * kDecodeQueries * D;
  static constexpr size_t kP = kScores + sizeof(float) * kDecodeWarps * kDecodeQueries * kDecodeKeys;
  static constexpr size_t kMisc = kP + sizeof(float) * kDecodeKeys * kDecodeQueries;
  static constexpr size_t kBytes = kMisc + sizeof(float) * 3 * kDecodeQueries;
};

// Elements i and i + 1 (i even) of a slot (shared memory) as f32.
template <typename KV, int D>
__device__ __forceinline__ float2 kv_pair(const uint8_t* slot, int i) {
  if constexpr (kIsQ8<KV>) {
    const uint32_t u = *reinterpret_cast<const uint16_t*>(slot + i);
    const float sc = q8_scale(slot, D, i / 32);
    return make_float2(sc * code_at(u, 0), sc * code_at(u, 1));
  } else if constexpr (sizeof(KV) == 2) {
    return widen_pair<KV>(*reinterpret_cast<const uint32_t*>(slot + 2 * i));
  } else {
    return *reinterpret_cast<const float2*>(slot + 4 * i);
  }
}

// A barrier of query set `set`'s 128 threads (named barriers 1 and 2 in a paired block), or of the block.
// Not bar.sync: that is barrier.sync.aligned, whose every thread of the block must execute the same
// barrier instruction, while a set finishes (and syncs) only when it has queries in this split.
// compute-sanitizer's racecheck reports hazards in the paired blocks, with either form, that are not
// races: its model of barriers goes wrong once warps have run different numbers of named-barrier
// instances (as the pairs' loops do), and it flags accesses that a __syncthreads orders
// (scripts/device/racecheck_named_barriers.cu shows it on a race-free kernel).
template <int kSets>
__device__ __forceinline__ void set_sync(int set) {
  if constexpr (kSets == 1) {
    __syncthreads();
  } else {
    asm volatile("barrier.sync %0, %1;" ::"r"(1 + set), "r"(kDecodeWarps * 32) : "memory");
  }
}

// A decode block (query group block x, kv head y, split z of the grid (x, y, z): the groups of one kv head
// and split are launched together, so a verify step's 2-9 groups read that split's K/V from DRAM once and
// from L2 after; in kv-head-major order (kv head, split, group block), each group's wave re-read every
// split from DRAM as an F16 cache at 16K outgrows L2: a 9B verify-16 step at depth 16384 6.09 -> 5.67 ms.
// A Q8_0 cache (36 MB a layer at 16K) ran its verify steps 1.3% faster in kv-head-major order, so
// a.kv_major keeps it there; H100, session 24): its M query vectors (local index m = global - q0) and the
// keys [k0, k1) of its split. Splits are fixed slices of the key room (chunk_tiles tiles each: the capacity,
// or the step's key bound, decode_key_room); n_eff of them reach into these queries' keys: the launch
// provides for the room, and the others exit at once and take no part in the merge.
struct DecodeBlock {
  const AttnArgs* a;
  int kvh, group, split, q0, M, n_eff, k0, k1;
  __device__ int row(int m) const { return (q0 + m) / a->group; }
  __device__ int head(int m) const { return kvh * a->group + (q0 + m) % a->group; }
  __device__ int limit(int m) const { return a->causal ? a->positions[row(m)] : a->positions[a->n - 1]; }  // last key seen
};
// The block's index among the blocks of query groups (a paired block holds two groups).
__device__ int group_block(const AttnArgs& a) { return static_cast<int>(a.kv_major ? blockIdx.z : blockIdx.x); }
// Query group `group` (past the last group: M = 0 and no keys).
__device__ DecodeBlock decode_block(const AttnArgs& a, int group) {
  const int kvh = static_cast<int>(a.kv_major ? blockIdx.x : blockIdx.y);
  const int split = static_cast<int>(a.kv_major ? blockIdx.y : blockIdx.z);
  DecodeBlock b{&a, kvh, group, split, group * kDecodeQueries, 0, 0, 0, 0};
  b.M = max(0, min(kDecodeQueries, a.n * a.group - b.q0));
  int kend = 0;
#pragma unroll
  for (int m = 0; m < kDecodeQueries; ++m)
    if (m < b.M) kend = max(kend, b.limit(m) + 1);
  kend = static_cast<int>(kend < a.kv_capacity ? kend : a.kv_capacity);
  const int chunk = a.chunk_tiles * kDecodeKeys;
  // Past the splits (a key bound below the step's keys: a caller's bug) the last block reads the rest, so
  // that every key is still read and every counter reset.
  b.n_eff = min(max(1, (kend + chunk - 1) / chunk), a.n_splits);
  b.k0 = b.split * chunk;
  b.k1 = b.split + 1 == b.n_eff ? kend : min(kend, b.k0 + chunk);
  return b;
}

// The end of a decode block: its unnormalised
// output o_s [Q][D] and (max, sum) ml_s [2][Q] are in shared memory. With one split, out = o / sum;
// with several, every block writes its partial and the last block of its (kv head, query group) to
// finish (a self-resetting counter) merges them: out = sum_z e^(m_z - M) o_z / sum_z e^(m_z - M) l_z.
// The (max, sum) pairs go through shared memory `work` (kDecodeMergeBytes; o_s and ml_s may alias
// it) first, so the sums over splits are independent L2 loads, not chains.
// kSets == 2 (paired blocks, see attention_decode_mma_kernel): each set of 128 threads finishes its own
// query group, with barriers of its own (set_sync).
// kThreads: a set's threads (a block of 8 warps on one query group, kSplitD == 2: 256).
template <int D, int kSets = 1, int kThreads = kDecodeWarps * 32>
__device__ void finish_decode_block(const AttnArgs& a, const DecodeBlock& blk, unsigned* counters, const float* o_s,
                                    const float* ml_s, void* work, int set = 0) {
  static_assert(kSets == 1 || kThreads == kDecodeWarps * 32, "paired sets have 128 threads each");
  constexpr int Q = kDecodeQueries, kThreadsPerBlock = kThreads;
  __shared__ int s_last[kSets];
  const int tid = static_cast<int>(threadIdx.x) % kThreadsPerBlock, kvh = blk.kvh, q0 = blk.q0, M = blk.M,
            z = blk.split, n_eff = blk.n_eff;
  const int M_all = a.n * a.group;
  auto out_of = [&](int m) {
    return a.out.data + static_cast<int64_t>(blk.row(m)) * a.out.stride + static_cast<int64_t>(blk.head(m)) * D;
  };
  auto slot_of = [&](int zz, int m) { return (static_cast<int64_t>(zz) * a.n_kv + kvh) * M_all + q0 + m; };
  if (n_eff == 1) {
    attn_mark(kMarkCounted);
    for (int i = tid; i < M * D; i += kThreadsPerBlock) {
      const int m = i / D, d = i % D;
      const float l = ml_s[Q + m], inv = l != 0.0f ? 1.0f / l : 0.0f;  // a NaN query's NaN sum stays NaN
      out_of(m)[d] = o_s[i] * inv;
    }
    return;
  }
  for (int i = tid; i < M * D / 4; i += kThreadsPerBlock)
    reinterpret_cast<float4*>(a.part_o + slot_of(z, i / (D / 4)) * D)[i % (D / 4)] = reinterpret_cast<const float4*>(o_s)[i];
  if (tid < M) a.part_ml[slot_of(z, tid) * 2] = ml_s[tid], a.part_ml[slot_of(z, tid) * 2 + 1] = ml_s[Q + tid];
  const int n_groups = (M_all + Q - 1) / Q;
  unsigned* counter = counters + kvh * n_groups + blk.group;
  __threadfence();
  set_sync<kSets>(set);
  if (tid == 0) s_last[set] = atomicAdd(counter, 1u) == static_cast<unsigned>(n_eff - 1);
  set_sync<kSets>(set);
  attn_mark(kMarkCounted);
  if (!s_last[set]) return;
  __threadfence();
  attn_mark(kMarkMergeFenced);
  // The split maxima and sums first, all loads in parallel; then per query (a warp) the weights
  // e^(m_z - M) and the denominator: lane z takes splits z, z + 32, ... and a fixed xor-shuffle tree sums
  // the lanes (every lane gets the same bits; splits past a query's keys add exact zeros, so a verify
  // row merges to the decode step's bits). A thread per query walking the splits took ~1 us at 33.
  float* wz = static_cast<float*>(work);  // [Q][n_eff] maxima, then weights
  float* wl = wz + Q * n_eff;             // [Q][n_eff] sums; wl[Q * n_eff + m] = 1 / den
  for (int i = tid; i < M * n_eff; i += 2 * kThreadsPerBlock) {  // both loads before the stores
    const int i2 = i + kThreadsPerBlock;
    const float2 ml = __ldcg(reinterpret_cast<const float2*>(a.part_ml + slot_of(i % n_eff, i / n_eff) * 2));
    float2 ml2 = make_float2(0.0f, 0.0f);
    if (i2 < M * n_eff) ml2 = __ldcg(reinterpret_cast<const float2*>(a.part_ml + slot_of(i2 % n_eff, i2 / n_eff) * 2));
    wz[i] = ml.x, wl[i] = ml.y;
    if (i2 < M * n_eff) wz[i2] = ml2.x, wl[i2] = ml2.y;
  }
  set_sync<kSets>(set);
  attn_mark(kMarkMergeMl);
  const int lane = tid & 31;
  for (int m = tid >> 5; m < M; m += kThreadsPerBlock / 32) {
    float gmax = -INFINITY;
    for (int zz = lane; zz < n_eff; zz += 32) gmax = fmaxf(gmax, wz[m * n_eff + zz]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) gmax = fmaxf(gmax, __shfl_xor_sync(0xffffffffu, gmax, o));
    float den = 0.0f;
    for (int zz = lane; zz < n_eff; zz += 32) {
      const float f = gmax == -INFINITY ? 0.0f : expf(wz[m * n_eff + zz] - gmax);
      den += f * wl[m * n_eff + zz];
      wz[m * n_eff + zz] = f;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
    if (lane == 0) wl[Q * n_eff + m] = den != 0.0f ? 1.0f / den : 0.0f;
  }
  set_sync<kSets>(set);
  attn_mark(kMarkMergeWeights);
  // out = sum_z w_z o_z / den, z ascending. A thread takes kItems float4 outputs at once and loads
  // kBatch splits of each before adding them: the partials' L2 round trips overlap (two outputs walked one
  // after the other, 8 splits at a time, waited on ~10 round trips at 33 splits).
  constexpr int kItems = 2, kBatch = 8;
  const int items = M * D / 4;
  for (int i0 = tid; i0 < items; i0 += kItems * kThreadsPerBlock) {
    float4 acc[kItems];
#pragma unroll
    for (int u = 0; u < kItems; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int z0 = 0; z0 < n_eff; z0 += kBatch) {
      float4 v[kItems][kBatch];
#pragma unroll
      for (int u = 0; u < kItems; ++u) {
        const int i = i0 + u * kThreadsPerBlock, m = i / (D / 4), d4 = i % (D / 4);
#pragma unroll
        for (int k = 0; k < kBatch; ++k)
          if (i < items && z0 + k < n_eff)
            v[u][k] = __ldcg(reinterpret_cast<const float4*>(a.part_o + slot_of(z0 + k, m) * D) + d4);
      }
#pragma unroll
      for (int u = 0; u < kItems; ++u) {
        const int m = (i0 + u * kThreadsPerBlock) / (D / 4);
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
          if (i0 + u * kThreadsPerBlock >= items || z0 + k >= n_eff) break;
          const float w = wz[m * n_eff + z0 + k];
          acc[u].x += w * v[u][k].x, acc[u].y += w * v[u][k].y, acc[u].z += w * v[u][k].z, acc[u].w += w * v[u][k].w;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      const int i = i0 + u * kThreadsPerBlock, m = i / (D / 4), d4 = i % (D / 4);
      if (i >= items) break;
      const float inv = wl[Q * n_eff + m];
      reinterpret_cast<float4*>(out_of(m))[d4] =
          make_float4(acc[u].x * inv, acc[u].y * inv, acc[u].z * inv, acc[u].w * inv);
    }
  }
  if (tid == 0) *counter = 0u;  // ready for the next launch (stream order)
  attn_mark(kMarkMerged);
}

template <int D, typename KV>
__global__ void __launch_bounds__(kDecodeWarps * 32) attention_decode_kernel(AttnArgs a, unsigned* counters) {
  pdl_wait();  // K, V and Q belong to the previous kernels (launched with PDL: only its start overlaps them)
  pdl_trigger();
  using L = DecodeSmem<D, KV>;
  constexpr int Q = kDecodeQueries, TK = kDecodeKeys, RB = L::kRowBytes;
  constexpr int DW = D / kDecodeWarps;             // score dims per warp
  constexpr int VEC = kIsQ8<KV> ? 8 : 16 / sizeof(KV);  // elements per load (Q8_0: 8 codes, 8 bytes)
  constexpr int kElem = kIsQ8<KV> ? 1 : static_cast<int>(sizeof(KV));
  constexpr int NG = 2 * kDecodeWarps * 32 / D;    // P.V: query groups (threads per dim pair)
  constexpr int QPT = (Q + NG - 1) / NG;           // queries per thread in P.V
  static_assert(DW % VEC == 0 && NG >= 1 && Q % NG == 0);
  extern __shared__ __align__(16) uint8_t sm[];
  float* q_s = reinterpret_cast<float*>(sm + L::kQ);           // [Q][D], scaled
  float* sp_s = reinterpret_cast<float*>(sm + L::kScores);     // [warp][Q][TK] partial scores
  float* p_s = reinterpret_cast<float*>(sm + L::kP);           // [TK][Q] probabilities of the tile
  float* misc = reinterpret_cast<float*>(sm + L::kMisc);       // alpha[Q], m[Q], l[Q]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const DecodeBlock blk = decode_block(a, group_block(a));
  if (blk.split >= blk.n_eff) return;
  const int kvh = blk.kvh, M = blk.M, k0 = blk.k0, k1 = blk.k1;

  const uint8_t* kbase = static_cast<const uint8_t*>(a.k) + kvh * a.head_bytes;
  const uint8_t* vbase = static_cast<const uint8_t*>(a.v) + kvh * a.head_bytes;
  const int64_t pitch = a.row_bytes;
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
      const int row = blk.row(m), head = blk.head(m);
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
    lim[j] = m < M ? blk.limit(m) : -1;
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
      const uint8_t* kslot = ks + lane * RB;
      const uint8_t* krow = kslot + warp * DW * kElem;
#pragma unroll 4
      for (int d0 = 0; d0 < DW; d0 += VEC) {
        float kf[VEC];
        if constexpr (kIsQ8<KV>) {
          const uint2 raw = *reinterpret_cast<const uint2*>(krow + d0);
          const float sc = q8_scale(kslot, D, (warp * DW + d0) / 32);
#pragma unroll
          for (int j = 0; j < 4; ++j) kf[j] = sc * code_at(raw.x, j), kf[4 + j] = sc * code_at(raw.y, j);
        } else if constexpr (sizeof(KV) == 2) {
          const uint4 raw = *reinterpret_cast<const uint4*>(krow + d0 * sizeof(KV));
          const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float2 f = widen_pair<KV>(w[j]);
            kf[2 * j] = f.x, kf[2 * j + 1] = f.y;
          }
        } else {
          const uint4 raw = *reinterpret_cast<const uint4*>(krow + d0 * sizeof(KV));
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
      float p, alpha = 1.0f;
      if (m_new != -INFINITY) {
        p = sv == -INFINITY ? 0.0f : expf(sv - m_new);
        alpha = expf(m_run[j] - m_new);
      } else {
        p = sv == -INFINITY ? 0.0f : sv;  // masked, or NaN (a NaN query): its NaN weights keep the output NaN
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
#pragma unroll 8
    for (int key = 0; key < TK; ++key) {
      const float2 v = kv_pair<KV, D>(vs + key * RB, 2 * pair);
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

  // The block's result to shared memory (the K/V stages are free now): output, then (max, sum).
  __syncthreads();
  float* o_s = reinterpret_cast<float*>(sm);  // [Q][D]
#pragma unroll
  for (int i = 0; i < QPT; ++i) {
    const int m = grp + NG * i;
    if (m < M) o_s[m * D + 2 * pair] = o[i][0], o_s[m * D + 2 * pair + 1] = o[i][1];
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int m = warp + kDecodeWarps * j;
    if (m < Q && lane == 0) misc[Q + m] = m_run[j], misc[2 * Q + m] = l_run[j];
  }
  __syncthreads();
  finish_decode_block<D>(a, blk, counters, o_s, misc + Q, sm);
}

// Decode/verify attention on tensor cores, F16 or BF16 KV (T). Same blocks, splits and merge as
// attention_decode_kernel (a block: one kv head, one split, kDecodeQueries query vectors), but each
// warp walks the split on its own: steps of 16 keys (warp w takes steps w, w+4, ...), K and V of
// its next two steps copied into its own shared-memory stages with cp.async while this one runs,
// and its own online softmax; the four warps merge once at the end, in a fixed order.
// Per step: S = Q.K^T and O += P.V as m16n8k16 MMAs (f32 accumulation). The 16 A rows are the 8
// queries split in two T parts, rows 0-7 = hi and 8-15 = lo (x = hi + lo to ~2^-22 in f16, ~2^-16 in
// bf16), for Q and for P, so the products keep (near) f32 precision against the exact keys and values
// (BF16: ~1e-5 relative per product, inside the 1e-4 parity with the CPU); a lane ends with the
// scores of its query g for keys 2t, 2t+1, 2t+8, 2t+9 (hi + lo rows summed in the lane), which is
// the A-fragment layout of P for the P.V product: no shuffles besides the row max.
// A query's result depends only on its own rows, its tiles and the fixed split/step order, so a
// verify row gets a decode step's bits (masked keys add exact zeros: p = 0, rescale factor 1).
// Budget (one kv head, D=256): bytes = 1 KB per key read once; MMA FLOPs = 2 * 2 * 16 * D per key
// (Q hi/lo x 8 queries padded to 16 rows), ~0.1 of the tensor cores at HBM speed.
constexpr int kMmaStepKeys = 16;

// v as T, and the T of what is left (hi + lo ~ v), packed as two 16-bit halves of a word each: for
// two values a and b, pack(a, b) holds a in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float a, float b) {
  const T ta = to_cache<T>(a), tb = to_cache<T>(b);
  uint16_t ua, ub;
  __builtin_memcpy(&ua, &ta, 2);
  __builtin_memcpy(&ub, &tb, 2);
  return static_cast<uint32_t>(ua) | static_cast<uint32_t>(ub) << 16;
}

// e^x by the SFU's 2^x with subnormal results flushed to zero. __expf is the same MUFU.EX2 on x log2(e),
// but without flushing it guards every call against a subnormal result (a compare, a branch, a halving and
// a squaring: five such regions a Q8_0 decode warp-step, ~13% of the loop's stall samples under ncu,
// session 50). Weights below 2^-126 of a row's maximum become 0 instead of a subnormal.
__device__ __forceinline__ float exp_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269504088896341f));
  return y;
}

// One 16-key step of a warp's online softmax over an MMA score fragment (lane (g, t): query g, keys
// ks + 2t + {0, 1} + {0, 8}): keys at or past k1 or after lim get weight 0, (m_run, l_run) advance (l_run
// sums this lane's keys only), the output fragments o are rescaled when the maximum moved, p gets the
// weights.
template <int NT>
__device__ __forceinline__ void softmax_step(float (&s)[4], int ks, int t, int k1, int lim, float& m_run,
                                             float& l_run, float (&o)[NT][4], float (&p)[4]) {
  float mx = -INFINITY;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int key = ks + 2 * t + (e & 1) + 8 * (e >> 1);
    if (key >= k1 || key > lim) s[e] = -INFINITY;
    mx = fmaxf(mx, s[e]);
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m_run, mx);
  // Without branches: the fast exponential (exp_ftz: an FMUL and MUFU.EX2; expf's range handling and the branches
  // around it took ~60 of a Q8_0 decode warp's ~750 instructions a step), e^-inf = +0 for masked keys, and a
  // factor of exactly 1 where the maximum did not move (masked steps stay exact no-ops). Where every score
  // is masked or NaN (a NaN query: fmaxf skips NaN) the NaN weights keep the output NaN.
  const bool live = m_new != -INFINITY;
  const float alpha = live && m_run != m_new ? exp_ftz(m_run - m_new) : 1.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) p[e] = live ? exp_ftz(s[e] - m_new) : (s[e] == -INFINITY ? 0.0f : s[e]);
  l_run = l_run * alpha + ((p[0] + p[1]) + (p[2] + p[3]));
  m_run = m_new;
  if (__any_sync(0xffffffffu, alpha != 1.0f)) {  // once the maxima settle, most steps skip this
#pragma unroll
    for (int j = 0; j < NT; ++j) o[j][0] *= alpha, o[j][1] *= alpha, o[j][2] *= alpha, o[j][3] *= alpha;
  }
}

// Weights x as the P.V product's A fragment: row g = hi, row g+8 = lo (x ~ hi + lo in T); keys 2t, 2t+1
// (a0, a1) and 2t+8, 2t+9 (a2, a3).
template <typename T>
__device__ __forceinline__ void split_hi_lo(const float (&x)[4], uint32_t (&pa)[4]) {
  pa[0] = pack_pair<T>(x[0], x[1]), pa[2] = pack_pair<T>(x[2], x[3]);
  const float2 f01 = widen_pair<T>(pa[0]), f23 = widen_pair<T>(pa[2]);
  pa[1] = pack_pair<T>(x[0] - f01.x, x[1] - f01.y), pa[3] = pack_pair<T>(x[2] - f23.x, x[3] - f23.y);
}

// A 16-key step's scores on 16-bit K rows (ldmatrix row address k_rows, see the kernels): q_frag(kk, qa)
// gives the Q hi/lo A fragment of dims 16 kk..; even and odd dim blocks accumulate apart (two
// independent MMA chains per key half); s[e] as in softmax_step.
template <int D, typename T, class QFrag>
__device__ __forceinline__ void scores_16bit(float (&s)[4], const uint8_t* k_rows, QFrag&& q_frag) {
  float c[2][2][4] = {};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t qa[4], kb[4];
    q_frag(kk, qa);
    ldmatrix_x4(kb, k_rows + 32 * kk);
    mma_16816<T>(c[kk & 1][0], qa[0], qa[1], qa[2], qa[3], kb[0], kb[1]);
    mma_16816<T>(c[kk & 1][1], qa[0], qa[1], qa[2], qa[3], kb[2], kb[3]);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int h = e >> 1, j = e & 1;  // key half, key of the pair
    s[e] = (c[0][h][j] + c[0][h][j + 2]) + (c[1][h][j] + c[1][h][j + 2]);
  }
}

// o += P.V for a 16-key step on 16-bit V rows (ldmatrix_trans row address v_rows), P split hi/lo.
// kParts == 2: o holds the output dims of half `part` only (a warp of a kSplitD == 2 block).
template <int D, typename T, int NT, int kParts = 1>
__device__ __forceinline__ void pv_16bit(float (&o)[NT][4], const float (&p)[4], const uint8_t* v_rows, int part = 0) {
  static_assert(NT * kParts == D / 8, "o holds the part's n-tiles");
  uint32_t pa[4];
  split_hi_lo<T>(p, pa);
  constexpr int kSlices = D / 16 / kParts;
#pragma unroll
  for (int kk = 0; kk < kSlices; ++kk) {
    uint32_t vb[4];
    ldmatrix_x4_trans(vb, v_rows + 32 * (part * kSlices + kk));
    mma_16816<T>(o[2 * kk], pa[0], pa[1], pa[2], pa[3], vb[0], vb[1]);
    mma_16816<T>(o[2 * kk + 1], pa[0], pa[1], pa[2], pa[3], vb[2], vb[3]);
  }
}

// The same two products on staged Q8_0 rows (q8_slot_bytes(D) apart; codes_to_half2 makes their f16 B
// fragments exactly). Scores: per block of 32 dims, the hi/lo rows' sums of its two 16-dim MMAs times the
// key's block scale; K's dims are permuted within each 16-dim slice (MMA column 2t, 2t+1, 2t+8, 2t+9 =
// stored dim 4t..4t+3: Q must be stored in that order, see q8_q_column), q_frag(sl, qa) gives slice sl.
__device__ __forceinline__ int q8_q_column(int d) {
  return (d & ~15) + 2 * ((d & 15) >> 2) + (d & 1) + 8 * ((d >> 1) & 1);
}

// Query value v of dim d as the MMA A rows of its query r: T hi in row r, the T of what is left in row
// r + 8, of 16 rows of pitch P at rows (Q8_0 caches: at d's MMA column, see q8_q_column).
template <typename T, bool kQ8>
__device__ __forceinline__ void store_q_hi_lo(uint8_t* rows, int P, int r, int d, float v) {
  const T hi = to_cache<T>(v);
  const int col = kQ8 ? q8_q_column(d) : d;
  *reinterpret_cast<T*>(rows + r * P + 2 * col) = hi;
  *reinterpret_cast<T*>(rows + (r + 8) * P + 2 * col) = to_cache<T>(v - static_cast<float>(hi));
}

template <int D, class QFrag>
__device__ __forceinline__ void scores_q8(float (&s)[4], const uint8_t* kd, int g, int t, QFrag&& q_frag) {
  constexpr int R = q8_slot_bytes(D);
  float acc[2][2] = {};  // [key half][key of the pair]
#pragma unroll 2
  for (int b = 0; b < D / 32; ++b) {
    float c[2][2][4] = {};
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int sl = 2 * b + u;  // 16-dim slice
      uint32_t qa[4], kb[4];
      q_frag(sl, qa);
      // keys g and 8 + g: stored dims 4t..4t+3 of the slice = MMA columns 2t, 2t+1 | 2t+8, 2t+9
      codes_to_half2(*reinterpret_cast<const uint32_t*>(kd + g * R + 16 * sl + 4 * t), kb[0], kb[1]);
      codes_to_half2(*reinterpret_cast<const uint32_t*>(kd + (8 + g) * R + 16 * sl + 4 * t), kb[2], kb[3]);
      mma_16816(c[u][0], qa[0], qa[1], qa[2], qa[3], kb[0], kb[1]);
      mma_16816(c[u][1], qa[0], qa[1], qa[2], qa[3], kb[2], kb[3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        acc[h][j] += q8_scale(kd + (8 * h + 2 * t + j) * R, D, b) *
                     ((c[0][h][j] + c[0][h][j + 2]) + (c[1][h][j] + c[1][h][j + 2]));
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) s[e] = acc[e >> 1][e & 1];
}

// The decode kernel's scores on Q8_0 caches take the key codes as stored, as the int8 B operand of
// mma.m16n8k32: a query is two int8 digits per block of 32 dims, q ~ sq * (256 hi + lo) with
// |256 hi + lo| <= kQDigits (the block's largest |q| to ~1.5e-5: small beside the cache's own 8-bit codes,
// ~4e-3 of a block's largest |k|), hi in A rows 0-7 and lo in rows 8-15.
// Per 32 dims and 8 keys that is one MMA and two 32-bit loads; the f16 form (scores_q8, kept by the
// prompt kernel) took two MMAs, four loads and four 4-code conversions. The integer dots are exact, so a
// query's scores depend on its own digits only: verify rows keep the decode step's bits.
// Shared memory (q8_digits_bytes): the A fragments [D/32][32 lanes] (16 bytes each), then sq [D/32][8].
constexpr float kQDigits = 32639.0f;
constexpr int q8_digit_scales_at(int D) { return D / 32 * 32 * 16; }
constexpr int q8_digits_bytes(int D) { return q8_digit_scales_at(D) + D / 32 * kDecodeQueries * 4; }

// Q (pre-scaled, kDecodeQueries vectors of the block; absent ones are zeros) -> digits: two threads per
// (query, 32-dim block), each loading its 16 dims before any store (one L2 round trip).
template <int D>
__device__ __forceinline__ void stage_q_digits(uint8_t* q_sm, const AttnArgs& a, const DecodeBlock& blk, int tid) {
  constexpr int NB = D / 32;
  static_assert(kDecodeQueries * NB * 2 <= kDecodeWarps * 32, "one pass of two threads per (query, block)");
  const int p = tid >> 1, half = tid & 1, qm = p / NB, b = p % NB;
  const bool valid = p < kDecodeQueries * NB;
  const float* src = valid && qm < blk.M ? a.q.data + static_cast<int64_t>(blk.row(qm)) * a.q.stride +
                                               static_cast<int64_t>(blk.head(qm)) * D + 32 * b + 16 * half
                                         : nullptr;
  float v[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = src ? src[i] * a.scale : 0.0f;
  float mx = 0.0f;
  bool finite = true;
#pragma unroll
  for (int i = 0; i < 16; ++i) mx = fmaxf(mx, fabsf(v[i])), finite = finite && isfinite(v[i]);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the pair's threads are neighbouring lanes
  finite = __shfl_xor_sync(0xffffffffu, static_cast<int>(finite), 1) != 0 && finite;
  if (!valid) return;
  const float inv = mx > 0.0f ? kQDigits / mx : 0.0f;
  uint32_t* frag = reinterpret_cast<uint32_t*>(q_sm);
  // Lane (qm, t)'s words 2 half (hi) and 2 half + 1 (lo): dims 16 half + 4t .. + 3 of the block.
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    uint32_t hi = 0, lo = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = __float2int_rn(v[4 * t + e] * inv), h = (r + 128) >> 8, l = r - h * 256;
      hi |= static_cast<uint32_t>(h & 0xff) << (8 * e);
      lo |= static_cast<uint32_t>(l & 0xff) << (8 * e);
    }
    *reinterpret_cast<uint2*>(frag + (b * 32 + 4 * qm + t) * 4 + 2 * half) = make_uint2(hi, lo);
  }
  // A non-finite q (fmaxf skips NaN) makes its block's scale NaN: the query's scores and output turn NaN,
  // as with f32 arithmetic, instead of finite values from meaningless digits.
  float* const sq = reinterpret_cast<float*>(q_sm + q8_digit_scales_at(D));
  if (half == 0) sq[b * kDecodeQueries + qm] = finite ? mx / kQDigits : __int_as_float(0x7fc00000);
}

// Key half h of a 16-key step's scores on staged Q8_0 rows from the digits (lane (g, t): keys 8h + 2t + j,
// s[j]): per block of 32 dims, dot = 256 * (hi row) + (lo row) exactly, times sq and the key's block scale. A
// kSplitD == 2 pair's warps take one half each and trade them; scores_q8_digits forms both (the same bits).
template <int D>
__device__ __forceinline__ void scores_q8_digits_half(float (&s)[2], const uint8_t* kd, const uint8_t* q_sm, int g, int t,
                                                      int h) {
  constexpr int R = q8_slot_bytes(D), NB = D / 32;
  const uint4* frag = reinterpret_cast<const uint4*>(q_sm) + 4 * g + t;
  const float* sq_g = reinterpret_cast<const float*>(q_sm + q8_digit_scales_at(D)) + g;
  const uint8_t* row = kd + (8 * h + g) * R + 4 * t;  // key 8h + g: B column g
  const uint8_t* sc_rows = kd + (8 * h + 2 * t) * R;  // keys 8h + 2t + j: the lane's C columns
  float acc[2] = {};
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const uint4 qa = frag[b * 32];
    const float sq = sq_g[b * kDecodeQueries];
    int c[4];
    mma_s8(c, qa.x, qa.y, qa.z, qa.w, *reinterpret_cast<const uint32_t*>(row + 32 * b),
           *reinterpret_cast<const uint32_t*>(row + 32 * b + 16));
#pragma unroll
    for (int j = 0; j < 2; ++j)
      acc[j] += q8_scale(sc_rows + j * R, D, b) * (sq * static_cast<float>(c[j] * 256 + c[j + 2]));
  }
  s[0] = acc[0], s[1] = acc[1];
}

// A 16-key step's scores (s[e] as in softmax_step): both key halves.
template <int D>
__device__ __forceinline__ void scores_q8_digits(float (&s)[4], const uint8_t* kd, const uint8_t* q_sm, int g, int t) {
  float lo[2], hi[2];
  scores_q8_digits_half<D>(lo, kd, q_sm, g, t, 0);
  scores_q8_digits_half<D>(hi, kd, q_sm, g, t, 1);
  s[0] = lo[0], s[1] = lo[1], s[2] = hi[0], s[3] = hi[1];
}

// o += P.V on staged Q8_0 rows: per block of 32 output dims, P times the value rows' scales, split hi/lo;
// V's output dims are permuted within each block (n-tile 4b + jj, column c = dim 32b + 4c + jj: see
// out_dims) so that lane (g, t) reads word g of block b of its four key rows and transposes their bytes.
// kParts == 2: o holds the output dims of half `part` only (blocks part * D / 64 ..., as pv_16bit).
template <int D, int NT, int kParts = 1>
__device__ __forceinline__ void pv_q8(float (&o)[NT][4], const float (&p)[4], const uint8_t* vd, int g, int t,
                                      int part = 0) {
  static_assert(NT * kParts == D / 8, "o holds the part's n-tiles");
  constexpr int R = q8_slot_bytes(D), kBlocks = D / 32 / kParts;
#pragma unroll
  for (int bl = 0; bl < kBlocks; ++bl) {
    const int b = part * kBlocks + bl;  // the value rows' block; o's n-tiles 4 bl ...
    float pb[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) pb[e] = p[e] * q8_scale(vd + (8 * (e >> 1) + 2 * t + (e & 1)) * R, D, b);
    uint32_t pa[4];
    split_hi_lo<__half>(pb, pa);
    // Word g of block b of key rows 2t, 2t+1, 2t+8, 2t+9, bytes transposed: x[jj] = dim 32b + 4g + jj
    // of the four keys, the B fragments of n-tile 4b + jj.
    auto word = [&](int r) { return *reinterpret_cast<const uint32_t*>(vd + r * R + 32 * b + 4 * g); };
    const uint32_t w0 = word(2 * t), w1 = word(2 * t + 1), w2 = word(2 * t + 8), w3 = word(2 * t + 9);
    const uint32_t t01 = __byte_perm(w0, w1, 0x5140), t23 = __byte_perm(w2, w3, 0x5140);  // bytes 0, 1
    const uint32_t u01 = __byte_perm(w0, w1, 0x7362), u23 = __byte_perm(w2, w3, 0x7362);  // bytes 2, 3
    const uint32_t x[4] = {__byte_perm(t01, t23, 0x5410), __byte_perm(t01, t23, 0x7632),
                           __byte_perm(u01, u23, 0x5410), __byte_perm(u01, u23, 0x7632)};
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      uint32_t vb0, vb1;
      codes_to_half2(x[jj], vb0, vb1);
      mma_16816<__half>(o[4 * bl + jj], pa[0], pa[1], pa[2], pa[3], vb0, vb1);
    }
  }
}

// The output dims of n-tile j, columns 2t and 2t + 1 (the o fragment's pairs): 8j + 2t and 8j + 2t + 1, or
// for Q8_0 caches (pv_q8's order) 32 (j / 4) + 8t + j % 4 and that + 4.
template <bool kQ8>
__device__ __forceinline__ int2 out_dims(int j, int t) {
  if constexpr (kQ8) {
    const int d = 32 * (j >> 2) + 8 * t + (j & 3);
    return make_int2(d, d + 4);
  } else {
    return make_int2(8 * j + 2 * t, 8 * j + 2 * t + 1);
  }
}

// S: copy stages per warp (S - 1 steps in flight); 3, or 4 for Q8_0 caches (decode_stages_q8).
// kSets: query groups per block (2: paired blocks, whose warps w and w + 4 share warp w's stages).
template <int D, bool kQ8, int S, int kSets = 1>
struct MmaDecodeSmem {
  static constexpr int kPitch = D * 2 + 16;  // bytes per f16 row: ldmatrix rows land 4 banks apart
  static constexpr int kRaw = kQ8 ? q8_slot_bytes(D) : kPitch;        // bytes per staged cache row
  static constexpr size_t kStage = size_t{2} * kMmaStepKeys * kRaw;   // K and V of one step
  static constexpr int kStages = S;
  static constexpr size_t kWarp = kStages * kStage;
  static constexpr size_t kQ = size_t{kDecodeWarps} * kWarp;         // Q hi/lo rows [sets][16][kPitch]
  static constexpr size_t kBytes = kQ + size_t{kSets} * 16 * kPitch;
  // After the loop the stages hold the warps' results: o [warps][Q][kORow], (m, l) [warps][Q][2], then
  // the block's o [Q][D] and (m, l) [2][Q]. kORow pads a row so that a warp's stores of its fragments hit
  // 32 banks (rows D apart put the 8 queries of a lane group on one bank: 8-way conflicts, ~1 us a block):
  // Q8_0's scalar stores at dims 8t + c of query g land on bank g + 8t + c, 16-bit caches' float2 stores
  // at 2t of query g on 8g + 2t per half warp.
  static constexpr int kORow = D + (kQ8 ? 1 : 8);
  static constexpr size_t kWarpMl = size_t{kDecodeWarps} * kDecodeQueries * kORow * 4;
  static constexpr size_t kBlockO = kWarpMl + size_t{kDecodeWarps} * kDecodeQueries * 2 * 4;
  static constexpr size_t kBlockMl = kBlockO + size_t{kDecodeQueries} * D * 4;
  static constexpr size_t kSetResults = (kBlockMl + 2 * kDecodeQueries * 4 + 15) / 16 * 16;  // a set's results
  static_assert(kSets * kSetResults <= kQ, "results fit in the stages");
  // The split merge's work area: the block's shared memory, or in a pair each set's results' space (the
  // sets merge at the same time).
  static_assert(kDecodeMergeBytes <= (kSets == 1 ? kBytes : kSetResults), "the split merge fits");
};

// C: the cache's type (__half, __nv_bfloat16, or Q8Slot). With a Q8_0 cache the scores take the key codes
// as stored, as int8 B fragments against Q's two int8 digits per 32 dims (scores_q8_digits), and P.V
// turns the value codes into the f16 B fragments in registers, exactly (codes_to_half2), with the value
// rows' block scales applied to P per 32 output dims before its hi/lo split. For that a lane's fragment
// values must be bytes of one word: V's output dims are permuted within each 32-dim block (n-tile 4b + jj,
// column c = dim 32b + 4c + jj), so that lane (g, t) reads word g of block b of its four key rows and
// transposes their bytes. Without widened copies a Q8_0 stage needs half the shared memory of an f16
// one (see decode_stages_q8 for their number). kStages: copy stages per warp (MmaDecodeSmem).
// Session 20 measured 8 warps per block walking 8 step sequences for Q8_0 caches (217 KB, one block per
// SM): the 9B Q4_K_M at depth 16384 ran 0.939x of depth 0 instead of 0.927x (H100), but 16-row verify
// steps at 16K took 179 us per layer instead of 151 (H200 kernel bench), and a verify row must get a
// decode step's bits, so every launch walks kDecodeWarps sequences (kSplitD adds warps without more).
// kSets == 2 (paired blocks, verify steps of two or more query groups): 8 warps, set s = warps 4s..4s+3
// on query group 2 blockIdx.x + s. Warps w and w + 4 walk the same steps of the same split (the steps
// warp w of a one-set block walks) and share warp w's stages: warp w copies the K rows, warp w + 4 the V
// rows, and a named barrier per pair and step (pair_sync) makes both halves visible to both. Each warp's
// arithmetic is a one-set block's warp's, so every query gets the same bits; the split's K/V is copied
// once for 16 queries, and an SM holds 8 warps where an F16 one-set block (202 KB) leaves it 4. The
// pair walks the keys of both groups' split ([k0, max k1)); a group's steps past its own k1 are masked
// whole (exact no-ops: weight 0, rescale factor 1), as a verify block's earlier rows' are.
// Unaligned (barrier.sync, see set_sync): the pairs' loops run different numbers of steps.
__device__ __forceinline__ void pair_sync(int w) {
  asm volatile("barrier.sync %0, %1;" ::"r"(3 + w), "r"(64) : "memory");
}

// kSplitD == 2 (launches of one query group, head dim 256): 8 warps on one query group. Warps w and w + 4
// walk the steps of a one-set block's warp w and share its stages as a pair does (warp w copies the K rows,
// warp w + 4 the V rows, pair_sync per step); both run the step's softmax on the same scores (with a Q8_0
// cache each forms one key half of them and they trade halves behind a second pair_sync: scores_q8_digits_half;
// H200, 9B at depth 16384 -0.3%, session 49), and each adds P.V into half of the output dims (warp w: dims of
// V blocks 0-3, w + 4: 4-7). Every output dim
// gets the same operations in the same order as in a one-set block, so decode steps keep the verify
// steps' bits, with half the P.V work per warp and two warps per scheduler where a step's dependent chain
// (MMAs, softmax, conversions) held one. H100, 9B Q4_K_M with a Q8_0 cache: decode 2.626 -> 2.610 ms; at
// depth 16384 unchanged (the K/V stream at ~2 TB/s there, the prologue's copies included; PERFORMANCE.md
// "Session 33" and "Session 34").
template <int D, typename C, int kStages, int kSets, int kSplitD = 1>
__global__ void __launch_bounds__(kDecodeWarps * 32 * kSets * kSplitD, 1)
    attention_decode_mma_kernel(AttnArgs a, unsigned* counters) {
  static_assert(kSets == 1 || kSets == 2, "one query group per block, or a pair");
  static_assert(kSplitD == 1 || (kSplitD == 2 && kSets == 1), "dims split over warp pairs: one query group");
  constexpr bool kPaired = kSets == 2 || kSplitD == 2;  // warps w and w + 4 share warp w's stages
  constexpr int kThreads = kDecodeWarps * 32 * kSplitD;  // a set's threads
  // A split past the queries' keys exits before waiting on the previous kernel: the positions it reads
  // are step inputs that no kernel writes, and the launch provides blocks for the whole capacity, so at
  // a short context most blocks are such splits (they would otherwise hold an SM's shared memory until
  // the previous kernel ended).
  attn_mark(kMarkStart);
  const int set = kSets == 1 ? 0 : static_cast<int>(threadIdx.x) / (kDecodeWarps * 32);
  const DecodeBlock blk = decode_block(a, group_block(a) * kSets + set);
  int k1_all = blk.k1, n_eff_all = blk.n_eff;  // over the block's sets
  if constexpr (kSets == 2) {
    const DecodeBlock other = decode_block(a, group_block(a) * 2 + 1 - set);
    k1_all = max(k1_all, other.k1), n_eff_all = max(n_eff_all, other.n_eff);
  }
  if (blk.split >= n_eff_all) return;
  pdl_wait();  // as attention_decode_kernel
  pdl_trigger();
  attn_mark(kMarkWaited);
  constexpr bool kQ8 = kIsQ8<C>;
  using T = std::conditional_t<kQ8, __half, C>;  // the MMAs' operand type
  using L = MmaDecodeSmem<D, kQ8, kStages, kSets>;
  constexpr int Q = kDecodeQueries, SK = kMmaStepKeys, P = L::kPitch, R = L::kRaw, NT = D / 8 / kSplitD;
  constexpr int kPieces = (kQ8 ? R : D * 2) / 16;  // 16-byte pieces per K or V row
  static_assert(Q == 8, "the 16 MMA rows are 8 queries x (hi, lo)");
  extern __shared__ __align__(16) uint8_t sm[];
  const int tid = static_cast<int>(threadIdx.x) % kThreads, lane = tid & 31;
  // warp: the steps walked (and stages used); part: which of a pair's two copies (and, kSplitD == 2, which
  // half of the output dims) this warp takes.
  const int warp = (tid >> 5) % kDecodeWarps, part = kSets == 2 ? set : tid >> 5 >= kDecodeWarps;
  const int g = lane >> 2, t = lane & 3;
  const int kvh = blk.kvh, M = blk.M, k0 = blk.k0, k1 = blk.k1;

  const uint8_t* kbase = static_cast<const uint8_t*>(a.k) + kvh * a.head_bytes;
  const uint8_t* vbase = static_cast<const uint8_t*>(a.v) + kvh * a.head_bytes;
  const int64_t pitch = a.row_bytes;
  uint8_t* const stages = sm + warp * L::kWarp;
  // Keys past k1_all copy row k1_all-1: finite data that the mask gives weight 0. A pair's warps copy
  // one of K and V each.
  // Lane piece i = 32 it + lane of a step is 16 bytes at (i % kPieces) * 16 of row i / kPieces: its offset
  // from the step's first row is set once (src_off), so that a step that ends before k1_all (all but the
  // last) costs one 64-bit add a copy; the clamped form (a 64-bit multiply, a minimum and the branch on
  // the pair's part a copy) was ~13 instructions a copy, ~120 of a warp's step.
  constexpr int kRounds = (SK * kPieces + 31) / 32;
  uint32_t src_off[kRounds];
#pragma unroll
  for (int it = 0; it < kRounds; ++it) {
    const int i = it * 32 + lane;
    src_off[it] = static_cast<uint32_t>(i / kPieces * pitch + i % kPieces * 16);
  }
  const uint8_t* const src_base = kPaired && part == 1 ? vbase : kbase;  // a paired warp's K or V
  auto issue = [&](int ks, int stage) {  // one commit group per call
    uint8_t* kd = stages + stage * L::kStage;
    uint8_t* vd = kd + SK * R;
    uint8_t* const dst_base = kPaired && part == 1 ? vd : kd;
    // (Q8_0 rows are kPieces whole pieces: piece i lands at 16 i)
    auto dst_of = [&](int i) { return R == kPieces * 16 ? 16 * i : i / kPieces * R + i % kPieces * 16; };
    if (ks + SK <= k1_all) {  // (warp-uniform)
      const int64_t step = static_cast<int64_t>(ks) * pitch;
      const uint8_t* src = src_base + step;
      const uint8_t* vsrc = vbase + step;
      // (Opaque to the compiler, which otherwise folds the step into every copy's address again: a wide
      // multiply-add and a 64-bit add a copy.)
      asm("" : "+l"(src), "+l"(vsrc));
#pragma unroll
      for (int it = 0; it < kRounds; ++it) {
        const int i = it * 32 + lane;
        if (SK * kPieces % 32 != 0 && i >= SK * kPieces) break;
        cp_async16(dst_base + dst_of(i), src + src_off[it]);
        if (!kPaired) cp_async16(vd + dst_of(i), vsrc + src_off[it]);
      }
    } else {
#pragma unroll
      for (int it = 0; it < kRounds; ++it) {
        const int i = it * 32 + lane, r = i / kPieces, pc = i % kPieces;
        if (SK * kPieces % 32 != 0 && i >= SK * kPieces) break;
        const int64_t off = min(ks + r, k1_all - 1) * pitch + pc * 16;
        cp_async16(dst_base + dst_of(i), src_base + off);
        if (!kPaired) cp_async16(vd + dst_of(i), vbase + off);
      }
    }
    cp_async_commit();
  };
  constexpr int kStride = SK * kDecodeWarps;  // keys between a warp's steps
  int ks = k0 + SK * warp;
  // Q, pre-scaled, as T hi (rows 0-7) and lo (rows 8-15), or for Q8_0 caches as int8 digits
  // (stage_q_digits); absent queries are zero rows. A thread takes dims of one query and issues all its
  // loads before its first store: one L2 round trip. (A loop of
  // load-then-store per element waited on 16 of them, with two divisions each: ncu put 13% of the
  // 16K-key Q8_0 step's stall samples on it.) The first 128 threads of a set stage them.
  uint8_t* const q_sm = sm + L::kQ + set * 16 * P;
  if constexpr (kQ8) {
    static_assert(q8_digits_bytes(D) + (kSplitD == 2 ? kDecodeWarps * 64 * 8 : 0) <= 16 * P,
                  "the digits (and a split-dims pair's traded scores) fit the Q rows' space");
    if (kSplitD == 1 || tid < kDecodeWarps * 32) stage_q_digits<D>(q_sm, a, blk, tid);
  } else if (kSplitD == 1 || tid < kDecodeWarps * 32) {
    constexpr int kTpq = kDecodeWarps * 32 / Q, kPer = D / kTpq;  // threads per query, dims per thread
    static_assert(kDecodeWarps * 32 % Q == 0 && D % kTpq == 0, "whole queries per thread group");
    const int qm = tid / kTpq, qd = tid % kTpq;
    const float* qsrc =
        qm < M ? a.q.data + static_cast<int64_t>(blk.row(qm)) * a.q.stride + static_cast<int64_t>(blk.head(qm)) * D : nullptr;
    float qv[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) qv[j] = qsrc ? qsrc[qd + kTpq * j] * a.scale : 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) store_q_hi_lo<T, kQ8>(q_sm, P, qm, qd + kTpq * j, qv[j]);
  }
  // The first steps' copies after Q's loads: queued behind the copies, Q's L2 round trip took ~6 us of a
  // 16K step's prologue (session 33's trace). H200, 9B Q4_K_M, Q8_0 cache at depth 16384: 2.345 -> 2.322 ms
  // a step; F16 caches and depth 0 unchanged.
  for (int st = 0; st + 1 < L::kStages; ++st) {
    if (ks + st * kStride < k1_all) {
      issue(ks + st * kStride, st);
    } else {
      cp_async_commit();  // empty groups keep wait_group's count
    }
  }
  __syncthreads();
  attn_mark(kMarkQStaged);

  const int lim = g < M ? blk.limit(g) : -1;
  float m_run = -INFINITY, l_run = 0.0f;  // query g; l_run sums this lane's keys only
  float o[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  // ldmatrix row addresses: A (Q) matrices {rows 0-7, 8-15} x {dims +0, +8}; K as B: {keys 0-7 x
  // dims +0, +8, keys 8-15 x ...}; V as B (transposed): {keys 0-7, 8-15} x {dims +0, +8}.
  const int r8 = lane & 7, hi8 = (lane >> 3) & 1, hi16 = lane >> 4;
  const uint8_t* q_row = q_sm + (r8 + 8 * hi8) * P + 16 * hi16;
  const int k_off = (r8 + 8 * hi16) * P + 16 * hi8, v_off = (r8 + 8 * hi8) * P + 16 * hi16;

  for (int stage = 0; ks < k1_all; ks += kStride, stage = stage + 1 == L::kStages ? 0 : stage + 1) {
    constexpr int kAhead = L::kStages - 1;
    auto issue_ahead = [&] {
      if (ks + kAhead * kStride < k1_all) {
        issue(ks + kAhead * kStride, stage == 0 ? kAhead : stage - 1);
      } else {
        cp_async_commit();
      }
    };
    if constexpr (!kPaired) {
      issue_ahead();
      cp_async_wait<L::kStages - 1>();
      __syncwarp();
    } else {
      // This warp's half of the step landed, then the partner's (the barrier); both are past the previous
      // step, whose slot the next copy refills.
      cp_async_wait<L::kStages - 2>();
      pair_sync(warp);
      issue_ahead();
    }
    const uint8_t* kd = stages + stage * L::kStage;  // the cache rows as stored
    const uint8_t* vd = kd + SK * R;
    const uint8_t* kh = kd;  // K and V as T rows of pitch P (16-bit caches)
    const uint8_t* vh = vd;
    float s[4];
    if constexpr (kQ8 && kSplitD == 2) {
      // This warp's key half, the partner's through shared memory (one slot a pair: a warp writes it again
      // only after the next step's pair_sync, which the partner reaches after its read here).
      float mine[2];
      scores_q8_digits_half<D>(mine, kd, q_sm, g, t, part);
      float2* trade = reinterpret_cast<float2*>(q_sm + q8_digits_bytes(D)) + warp * 64;
      trade[part * 32 + lane] = make_float2(mine[0], mine[1]);
      pair_sync(warp);
      const float2 theirs = trade[(1 - part) * 32 + lane];
      s[0] = part ? theirs.x : mine[0], s[1] = part ? theirs.y : mine[1];
      s[2] = part ? mine[0] : theirs.x, s[3] = part ? mine[1] : theirs.y;
    } else if constexpr (kQ8) {
      scores_q8_digits<D>(s, kd, q_sm, g, t);
    } else {
      scores_16bit<D, T>(s, kh + k_off, [&](int kk, uint32_t (&qa)[4]) { ldmatrix_x4(qa, q_row + 32 * kk); });
    }
    float p[4];
    softmax_step(s, ks, t, k1, lim, m_run, l_run, o, p);
    if constexpr (kQ8) {
      pv_q8<D, NT, kSplitD>(o, p, vd, g, t, kSplitD == 2 ? part : 0);
    } else {
      pv_16bit<D, T, NT, kSplitD>(o, p, vh + v_off, kSplitD == 2 ? part : 0);
    }
    if constexpr (!kPaired) __syncwarp();  // every lane is done with this stage before the next step refills it
  }
  cp_async_wait<0>();
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);

  // Merge the warps in a fixed order: M = max_w m_w, o = sum_w e^(m_w - M) o_w, l likewise (w: the steps
  // walked; with kSplitD == 2 each of a pair's warps holds half of o and the same (m, l)).
  __syncthreads();  // every warp is done with its stages
  attn_mark(kMarkLoopDone);
  uint8_t* const res = sm + set * L::kSetResults;  // this set's results
  float* wo = reinterpret_cast<float*>(res);
  float* wml = reinterpret_cast<float*>(res + L::kWarpMl);
  float* o_s = reinterpret_cast<float*>(res + L::kBlockO);
  float* ml_s = reinterpret_cast<float*>(res + L::kBlockMl);
  const int j0 = kSplitD == 2 ? part * NT : 0;  // this warp's first n-tile
  constexpr int kORow = L::kORow;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    float* row = wo + (warp * Q + g) * kORow;
    const int2 dd = out_dims<kQ8>(j0 + j, t);
    if constexpr (kQ8) {
      row[dd.x] = o[j][0] + o[j][2], row[dd.y] = o[j][1] + o[j][3];
    } else {  // dd.y = dd.x + 1, dd.x even
      *reinterpret_cast<float2*>(row + dd.x) = make_float2(o[j][0] + o[j][2], o[j][1] + o[j][3]);
    }
  }
  if (t == 0 && (kSplitD == 1 || part == 0)) wml[(warp * Q + g) * 2] = m_run, wml[(warp * Q + g) * 2 + 1] = l_run;
  __syncthreads();
  if (tid < Q) {
    float mx = -INFINITY;
    for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, wml[(w * Q + tid) * 2]);
    float l = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float f = mx == -INFINITY ? 0.0f : expf(wml[(w * Q + tid) * 2] - mx);
      l += f * wml[(w * Q + tid) * 2 + 1];
      wml[(w * Q + tid) * 2 + 1] = f;  // the weight replaces the sum
    }
    ml_s[tid] = mx, ml_s[Q + tid] = l;
  }
  __syncthreads();
  for (int i = tid; i < M * D; i += kThreads) {
    const int m = i / D, d = i % D;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) v += wml[(w * Q + m) * 2 + 1] * wo[(w * Q + m) * kORow + d];
    o_s[i] = v;
  }
  __syncthreads();
  attn_mark(kMarkWarpsMerged);
  // A set without queries, or whose queries' keys end before this split, has nothing to write.
  if (kSets == 1 || (M > 0 && blk.split < blk.n_eff))
    finish_decode_block<D, kSets, kThreads>(a, blk, counters, o_s, ml_s, res, set);
}

// Prompt steps (more than kDecodeMaxRows rows) on tensor cores, F16, BF16 or Q8_0 KV (C; Q8_0 through
// scores_q8/pv_q8 as in the decode kernel, f16 operands): a block takes one kv
// head, kPromptWarps * 8 consecutive query vectors (row t, head g in t-major order: 16 tokens of a GQA
// group of 4) and one split of its keys (grid.z; the split boundaries from the block's own last key, as
// attention_kernel's, merged by attention_combine_kernel). The block stages K and V in steps of 16 keys
// (a ring of three, cp.async, every warp reading each stage); each warp owns 8 query vectors, as hi/lo
// T rows of the MMA A operand (see attention_decode_mma_kernel: the products keep ~f32 precision), its
// online softmax and its output (D/8 n-tiles in registers), and skips the steps past its queries' last
// key (causal). Budget (512-token prompt, 9B: 16 heads of 256, 4 kv heads): 2 * 2 * 16 * 256 * 512^2 / 2
// MMA FLOPs per layer (hi/lo doubles them) = 4.3 GFLOP, K/V from L2 once per block (16 tokens).
// H200 (kernel bench, 9B shape): 512 tokens after 16384 cached 1.51 ms (SIMT kernel 11.5 ms), after 1024
// 250 us: ~90 TFLOP/s, latency-bound at 8 warps per SM (one block: 118 KB of shared memory, 255 registers).
constexpr int kPromptWarps = 8;
constexpr int kPromptQueries = kPromptWarps * kDecodeQueries;  // query vectors per block

template <int D, bool kQ8>
struct PromptSmem {
  static constexpr int kPitch = D * 2 + 16;                          // bytes per 16-bit row (ldmatrix: 4 banks apart)
  static constexpr int kRaw = kQ8 ? q8_slot_bytes(D) : kPitch;       // bytes per staged cache row
  static constexpr size_t kStage = size_t{2} * kMmaStepKeys * kRaw;  // K and V of one step
  static constexpr int kStages = 3;
  static constexpr size_t kQ = kStages * kStage;                     // then Q hi/lo rows [warps][16][kPitch]
  static constexpr size_t kBytes = kQ + size_t{kPromptWarps} * 16 * kPitch;
};

template <int D, typename C>
__global__ void __launch_bounds__(kPromptWarps * 32, 1) attention_prompt_mma_kernel(AttnArgs a) {
  constexpr bool kQ8 = kIsQ8<C>;
  using T = std::conditional_t<kQ8, __half, C>;  // the MMAs' operand type
  using L = PromptSmem<D, kQ8>;
  constexpr int SK = kMmaStepKeys, P = L::kPitch, R = L::kRaw, NT = D / 8;
  constexpr int kPieces = (kQ8 ? R : D * 2) / 16;  // 16-byte pieces per K or V row
  constexpr int kThreadsPerBlock = kPromptWarps * 32;
  extern __shared__ __align__(16) uint8_t sm[];
  __shared__ int s_kend;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int kvh = blockIdx.x, z = blockIdx.z, M = a.n * a.group;
  const int m0 = blockIdx.y * kPromptQueries + warp * kDecodeQueries;  // this warp's first query vector
  auto row_of = [&](int m) { return m / a.group; };
  auto head_of = [&](int m) { return kvh * a.group + m % a.group; };
  auto limit_of = [&](int m) { return m < M ? (a.causal ? a.positions[row_of(m)] : a.positions[a.n - 1]) : -1; };
  const int lim = limit_of(m0 + g);  // lane's query g
  int warp_lim = lim;                // the warp's last key
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) warp_lim = max(warp_lim, __shfl_xor_sync(0xffffffffu, warp_lim, o));
  if (tid == 0) s_kend = 0;
  __syncthreads();
  if (lane == 0) atomicMax(&s_kend, warp_lim + 1);

  // Q, pre-scaled, as T hi (rows 0-7) and lo (rows 8-15) per warp; absent queries are zero rows.
  uint8_t* const q_all = sm + L::kQ;
  for (int i = tid; i < kPromptQueries * D; i += kThreadsPerBlock) {
    const int w = i / (kDecodeQueries * D), r = i / D % kDecodeQueries, d = i % D;
    const int m = blockIdx.y * kPromptQueries + w * kDecodeQueries + r;
    const float v = m < M ? a.q.data[static_cast<int64_t>(row_of(m)) * a.q.stride + static_cast<int64_t>(head_of(m)) * D + d] * a.scale
                          : 0.0f;
    store_q_hi_lo<T, kQ8>(q_all + w * 16 * P, P, r, d, v);
  }
  __syncthreads();
  const int kend = static_cast<int>(s_kend < a.kv_capacity ? s_kend : a.kv_capacity);
  const int chunk = ((kend + a.n_splits - 1) / a.n_splits + SK - 1) / SK * SK;
  const int k0 = z * chunk, k1 = min(kend, k0 + chunk);

  const uint8_t* kbase = static_cast<const uint8_t*>(a.k) + kvh * a.head_bytes;
  const uint8_t* vbase = static_cast<const uint8_t*>(a.v) + kvh * a.head_bytes;
  // Keys past k1 copy row k1-1: finite data that the mask gives weight 0.
  auto issue = [&](int ks, int stage) {
    uint8_t* kd = sm + stage * L::kStage;
    uint8_t* vd = kd + SK * R;
    for (int i = tid; i < SK * kPieces; i += kThreadsPerBlock) {
      const int r = i / kPieces, pc = i % kPieces;
      const int64_t off = min(ks + r, k1 - 1) * a.row_bytes + pc * 16;
      cp_async16(kd + r * R + pc * 16, kbase + off);
      cp_async16(vd + r * R + pc * 16, vbase + off);
    }
  };
  for (int st = 0; st + 1 < L::kStages; ++st) {
    if (k0 + st * SK < k1) issue(k0 + st * SK, st);
    cp_async_commit();  // empty groups keep wait_group's count
  }

  float m_run = -INFINITY, l_run = 0.0f;  // query g; l_run sums this lane's keys only
  float o[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  const int r8 = lane & 7, hi8 = (lane >> 3) & 1, hi16 = lane >> 4;
  const uint8_t* q_row = q_all + warp * 16 * P + (r8 + 8 * hi8) * P + 16 * hi16;
  const int k_off = (r8 + 8 * hi16) * P + 16 * hi8, v_off = (r8 + 8 * hi8) * P + 16 * hi16;

  // The warp's Q fragments stay in registers for the whole key range (H200, 512 tokens after 16384:
  // 1.72 -> 1.51 ms with the one-barrier step; D = 256 spills 4 bytes).
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qa[kk], q_row + 32 * kk);

  int stage = 0;
  for (int ks = k0; ks < k1; ks += SK, stage = stage + 1 == L::kStages ? 0 : stage + 1) {
    constexpr int kAhead = L::kStages - 1;
    cp_async_wait<L::kStages - 2>();
    // This step's K and V have landed for every warp, and every warp is done with the previous step,
    // whose stage the next copy refills.
    __syncthreads();
    if (ks + kAhead * SK < k1) issue(ks + kAhead * SK, stage == 0 ? kAhead : stage - 1);
    cp_async_commit();
    if (ks <= warp_lim) {  // warp-uniform: steps wholly past the warp's queries add nothing
      const uint8_t* kd = sm + stage * L::kStage;
      const uint8_t* vd = kd + SK * R;
      auto q_frag = [&](int kk, uint32_t (&q)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = qa[kk][i];
      };
      float s[4], p[4];
      if constexpr (kQ8) {
        scores_q8<D>(s, kd, g, t, q_frag);
      } else {
        scores_16bit<D, T>(s, kd + k_off, q_frag);
      }
      softmax_step(s, ks, t, k1, lim, m_run, l_run, o, p);
      if constexpr (kQ8) {
        pv_q8<D>(o, p, vd, g, t);
      } else {
        pv_16bit<D, T>(o, p, vd + v_off);
      }
    }
  }
  cp_async_wait<0>();
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  const int m = m0 + g;
  if (m >= M) return;
  if (a.n_splits == 1) {
    const float inv = l_run != 0.0f ? 1.0f / l_run : 0.0f;  // NaN sums stay NaN
    float* dst = a.out.data + static_cast<int64_t>(row_of(m)) * a.out.stride + static_cast<int64_t>(head_of(m)) * D;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int2 dd = out_dims<kQ8>(j, t);
      dst[dd.x] = (o[j][0] + o[j][2]) * inv, dst[dd.y] = (o[j][1] + o[j][3]) * inv;
    }
  } else {
    const int64_t slot = (static_cast<int64_t>(z) * a.n_kv + kvh) * M + m;
    float* dst = a.part_o + slot * D;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int2 dd = out_dims<kQ8>(j, t);
      dst[dd.x] = o[j][0] + o[j][2], dst[dd.y] = o[j][1] + o[j][3];
    }
    if (t == 0) a.part_ml[slot * 2] = m_run, a.part_ml[slot * 2 + 1] = l_run;
  }
}

// The prompt kernel on tensor cores for F16/BF16/Q8_0 caches where the device grants its shared memory
// and neither HYSPEC_ATTN_MMA nor HYSPEC_ATTN_PROMPT_MMA is 0; else attention_kernel runs.
bool prompt_mma_enabled() {
  static const bool v = env_int("HYSPEC_ATTN_PROMPT_MMA", 1) != 0;
  return v && decode_mma_enabled();
}

// Whether the device grants `kernel` `bytes` of dynamic shared memory (sm_86/89 have 99 KB); a refusal is
// not sticky and is cleared, so the caller's SIMT kernel takes over.
template <typename Kernel>
bool grants_smem(Kernel kernel, size_t bytes) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) == cudaSuccess)
    return true;
  cudaGetLastError();
  return false;
}

template <int D, typename KV>
cudaError_t launch_prompt_mma(const AttnArgs& a, cudaStream_t stream) {
  constexpr size_t smem = PromptSmem<D, kIsQ8<KV>>::kBytes;
  static const bool usable = prompt_mma_enabled() && grants_smem(attention_prompt_mma_kernel<D, KV>, smem);
  if (!usable) return cudaErrorNotSupported;
  const int M = a.n * a.group;
  const dim3 grid(a.n_kv, (M + kPromptQueries - 1) / kPromptQueries, a.n_splits);
  attention_prompt_mma_kernel<D, KV><<<grid, kPromptWarps * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

// Copy stages per warp of the Q8_0 decode kernel for launches of one query group (decode, verify-1):
// 4 (144 KB, one block per SM, three steps in flight). Those launches have one block per SM anyway, and the
// 9B Q4_K_M at depth 16384 of 16600 took 2.980 ms a step instead of 3.025 (H100). Wider launches keep 3
// (113 KB, two blocks per SM: 16-row verify at 16K, kernel bench, 127 us with 3 against 174 with 4).
// Stages only pace the copies: every count gives the same bits. HYSPEC_ATTN_Q8_STAGES=3 overrides.
int decode_stages_q8() {
  static const int v = env_int("HYSPEC_ATTN_Q8_STAGES", 4) == 3 ? 3 : 4;
  return v;
}

// The decode kernels' grid for `blocks` blocks of query groups (see DecodeBlock).
dim3 decode_grid(const AttnArgs& a, int blocks) {
  const auto kv = static_cast<unsigned>(a.n_kv), splits = static_cast<unsigned>(a.n_splits);
  return a.kv_major ? dim3(kv, splits, static_cast<unsigned>(blocks)) : dim3(static_cast<unsigned>(blocks), kv, splits);
}

// The tensor-core decode kernel with S stages; cudaErrorNotSupported where the device does not grant its
// shared memory or HYSPEC_ATTN_MMA=0. One launch: the kernel merges its own splits.
template <int D, typename KV, int S, int kSets = 1, int kSplitD = 1>
cudaError_t launch_mma_stages(const AttnArgs& a, int groups, unsigned* counters, cudaStream_t stream) {
  constexpr size_t smem = MmaDecodeSmem<D, kIsQ8<KV>, S, kSets>::kBytes;
  static const bool usable =
      decode_mma_enabled() && grants_smem(attention_decode_mma_kernel<D, KV, S, kSets, kSplitD>, smem);
  if (!usable) return cudaErrorNotSupported;
  return launch_pdl(attention_decode_mma_kernel<D, KV, S, kSets, kSplitD>, decode_grid(a, (groups + kSets - 1) / kSets),
                    dim3(kDecodeWarps * 32 * kSets * kSplitD), smem, stream, a, counters);
}

// Launches of one query group (decode, verify-1) with head dim 256 take 8 warps, the output dims split
// over warp pairs (attention_decode_mma_kernel's kSplitD), unless HYSPEC_ATTN_SPLIT_DIMS=0.
bool decode_split_dims_enabled() {
  static const bool v = env_int("HYSPEC_ATTN_SPLIT_DIMS", 1) != 0;
  return v;
}

// Paired blocks (two query groups each, attention_decode_mma_kernel) for launches of two or more groups
// (verify steps) with a 16-bit cache, head dim 256 only (template instantiations), unless
// HYSPEC_ATTN_PAIRS=0. A 9B verify-16 step at depth 16384 with an F16 cache: 5.67 -> 5.28 ms; with a Q8_0
// cache 5.32 -> 5.43 (H100, session 24), so Q8_0 caches keep one group per block.
bool decode_pairs_enabled() {
  static const bool v = env_int("HYSPEC_ATTN_PAIRS", 1) != 0;
  return v;
}

template <int D, typename KV>
cudaError_t launch_mma(const AttnArgs& a, int groups, unsigned* counters, cudaStream_t stream) {
  if constexpr (D == 256) {
    if (groups == 1 && decode_split_dims_enabled()) {
      constexpr int kStages = kIsQ8<KV> ? 4 : 3;  // the 4-warp launches' defaults (HYSPEC_ATTN_Q8_STAGES: theirs only)
      const cudaError_t e = launch_mma_stages<D, KV, kStages, 1, 2>(a, groups, counters, stream);
      if (e != cudaErrorNotSupported) return e;
    }
  }
  if constexpr (D == 256 && !kIsQ8<KV>) {
    if (groups >= 2 && decode_pairs_enabled())
      if (const cudaError_t e = launch_mma_stages<D, KV, 3, 2>(a, groups, counters, stream); e != cudaErrorNotSupported)
        return e;
  }
  if constexpr (kIsQ8<KV>) {
    if (groups == 1 && decode_stages_q8() == 4)
      if (const cudaError_t e = launch_mma_stages<D, KV, 4>(a, groups, counters, stream); e != cudaErrorNotSupported)
        return e;
  }
  return launch_mma_stages<D, KV, 3>(a, groups, counters, stream);
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
    const int groups = (M + kDecodeQueries - 1) / kDecodeQueries;
    AttnArgs ad = a;
    ad.kv_major = kIsQ8<KV> && groups >= 2;  // see DecodeBlock
    // The tensor-core kernel for F16/BF16/Q8_0 KV, where the device grants its shared memory (sm_86/89 have
    // 99 KB: the SIMT kernel runs there); HYSPEC_ATTN_MMA=0 picks the SIMT kernel (benchmarks).
    if constexpr (sizeof(KV) == 2 || kIsQ8<KV>) {
      if (const cudaError_t e = launch_mma<D, KV>(ad, groups, counters, stream); e != cudaErrorNotSupported)
        return e;
    }
    return launch_pdl(attention_decode_kernel<D, KV>, decode_grid(ad, groups), dim3(kDecodeWarps * 32), smem, stream, ad,
                      counters);
  } else {
    cudaError_t e = cudaErrorNotSupported;
    if constexpr (sizeof(KV) == 2 || kIsQ8<KV>) e = launch_prompt_mma<D, KV>(a, stream);
    if (e == cudaErrorNotSupported) {
      const dim3 grid(a.n_kv, (M + kQueries - 1) / kQueries, a.n_splits);
      attention_kernel<D, KV><<<grid, kThreads, attention_smem<D>(), stream>>>(a);
    } else if (e != cudaSuccess) {
      return e;
    }
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || a.n_splits == 1) return err;
  attention_combine_kernel<<<a.n_kv * M, std::min(D, 256), 0, stream>>>(a, D);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch(const AttnArgs& a, GgmlType kv_type, unsigned* counters, cudaStream_t stream) {
  return with_cache_type(kv_type, [&](auto kv) { return launch_kv<D, decltype(kv)>(a, counters, stream); });
}

}  // namespace

bool attention_head_dim_supported(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

// The keys the decode kernels lay their splits over: the capacity, or the step's key bound below it
// (AttentionArgs::max_keys). A split is then a fixed slice of that room, so that steps of one bound give a
// row the same bits at any width, and a short context in a long-capacity cache gets a short context's
// splits: H200, 9B, F16 cache, capacity 131072, 512-key splits: a depth-0 step 1.959 ms against 1.915 at
// capacity 4096 (blocks for 256 splits a kv head, the ones past the keys exiting at once), and a session's
// first 1024 tokens 2.5% slower (one or two blocks a kv head walking 512 keys, where a 4096-key cache's 33
// splits walk 128 each).
namespace {
int64_t decode_key_room(const AttentionParams& p) {
  return p.max_keys > 0 ? std::min(p.max_keys, p.kv.capacity) : p.kv.capacity;
}
}  // namespace

int attention_splits(const AttentionParams& p, int n_sm) {
  const int64_t M = p.q.rows * (p.n_head / p.n_kv_head);
  // The decode kernel's split count must not depend on the step's width (see the top of the file).
  const bool decode = uses_decode_kernel(p.q.rows, p.n_head / p.n_kv_head, p.n_kv_head);
  const bool prompt_mma = !decode && p.kv.type != GgmlType::F32 && prompt_mma_enabled();
  const int64_t per_block = prompt_mma ? kPromptQueries : kQueries;
  const int64_t base = p.n_kv_head * (decode ? 1 : (M + per_block - 1) / per_block);
  if (base >= n_sm) return 1;
  // Blocks per SM to aim for: 2 (SIMT kernels), or 1 for the tensor-core decode kernel (F16, BF16 and
  // Q8_0 caches): one wave of longer splits. Kernel bench at ctx 16384 with caches rotated past L2
  // (session 20, H200), Q8_0 one row: 31.6 us at 1 per SM, 35.9 at 2 (HYSPEC_ATTN_BLOCKS_PER_SM overrides).
  static const int per_sm_env = env_int("HYSPEC_ATTN_BLOCKS_PER_SM", 0);
  const bool mma = decode && p.kv.type != GgmlType::F32 && decode_mma_enabled();
  const int per_sm = per_sm_env >= 1 ? per_sm_env : mma ? 1 : 2;
  const int64_t want = (int64_t{per_sm} * n_sm + base - 1) / base;
  // Each split should keep its warps busy: 2 tiles (tiled kernel) or one tile of keys (decode).
  const int64_t room = decode ? decode_key_room(p) : p.kv.capacity;
  const int64_t max_useful = std::max<int64_t>(
      1, decode ? (room + kDecodeKeys * decode_min_tiles() - 1) / (kDecodeKeys * decode_min_tiles()) : room / (2 * kKeys));
  // And the decode kernel's splits hold at most kDecodeSplitKeys keys (HYSPEC_ATTN_SPLIT_KEYS overrides):
  // a session's capacity is its whole context, and one wave of capacity-long splits left a short context
  // to one or two blocks per kv head. H100, 9B Q4_K_M, capacity 32768: decode at depth 1024 / 4096 took
  // 3.012 / 3.042 ms a step, 2.923 / 2.960 with 512-key splits (2.910 / 2.926 with 256, but those ran
  // F16 at depth 16384 of 16600 in two waves: 3.181 against 3.086 ms).
  static const int split_keys = env_int("HYSPEC_ATTN_SPLIT_KEYS", kDecodeSplitKeys);
  const int64_t by_keys = decode && split_keys > 0 ? (room + split_keys - 1) / split_keys : 1;
  return static_cast<int>(std::clamp<int64_t>(std::max(std::min(want, max_useful), by_keys), 1, kMaxSplits));
}

size_t attention_scratch_bytes(const AttentionParams& p, int n_splits) {
  if (n_splits <= 1) return 0;
  const int64_t M = p.q.rows * (p.n_head / p.n_kv_head);
  return static_cast<size_t>(n_splits) * p.n_kv_head * M * (p.head_dim + 2) * sizeof(float);
}

cudaError_t attention_launch(const AttentionParams& p, int n_splits, float* scratch, cudaStream_t stream) {
  if (p.q.rows == 0) return cudaSuccess;
  const int64_t M = p.q.rows * (p.n_head / p.n_kv_head);
  // The decode kernel's splits: n_splits equal slices of the step's key room (decode_key_room), whole tiles.
  const int64_t cap_tiles = (decode_key_room(p) + kDecodeKeys - 1) / kDecodeKeys;
  const int chunk_tiles = static_cast<int>(std::max<int64_t>(1, (cap_tiles + n_splits - 1) / n_splits));
  AttnArgs a{p.q, p.out, p.k, p.v, p.kv.capacity, p.kv.row_bytes, p.kv.head_bytes, p.positions,
             static_cast<int>(p.q.rows), p.n_head / p.n_kv_head, p.n_kv_head, p.scale, p.causal, n_splits, chunk_tiles, scratch,
             scratch ? scratch + static_cast<int64_t>(n_splits) * p.n_kv_head * M * p.head_dim : nullptr, false};
  switch (p.head_dim) {
    case 32: return launch<32>(a, p.kv.type, p.counters, stream);
    case 64: return launch<64>(a, p.kv.type, p.counters, stream);
    case 128: return launch<128>(a, p.kv.type, p.counters, stream);
    case 256: return launch<256>(a, p.kv.type, p.counters, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace hyspec::cuda
