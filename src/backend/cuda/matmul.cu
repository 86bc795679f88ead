// Matmul over GGML weight types, and embedding lookup.
//
// y[t][r] = sum_i W[r][i] x[t][i]   W: [n_out, K] in its stored type, x: [n, K] f32, y: [n, n_out] f32.
//
// Widths n <= 32 (decode, speculative verify): the streaming tensor-core matvec `mmv_kernel`. A block
// of 8 warps owns a tile of RW (16 or 32) weight rows at a time; its warps split K into steps of
// kStepChunks 32-element chunks (one block of a K-quant, 128-272 bytes of a row). Each warp streams
// the bytes of its steps through a private ring of `stages` shared-memory slots with 16-byte
// cp.async copies (the 16-byte aligned cover of each row's byte range, so data keeps its address
// mod 16 and the per-type decoders of quant_blocks.cuh read it unchanged), several steps ahead of
// the one it decodes: the bytes in flight per SM no longer sit in registers. Decoding: the warp's 4
// lane-quads each turn one chunk of 16 rows into f16 A fragments of mma.m16n8k16 and multiply them
// with up to 32 activation rows (B fragments, 8 tokens per n-tile, read as f32 and converted on the
// fly in the type's chunk order, or pre-converted to f16 in fragment order for n > 4); BF16 weights
// skip the decode: their bits are the A fragments of the bf16 MMA, with x rounded to bf16. Every weight
// byte is read once per call whatever n is; the warps reduce through shared memory per tile. The
// grid is persistent (as many blocks as fit), the ring runs on across tiles, and the kernel is
// launched with programmatic dependent launch: it starts streaming weights while the previous
// kernel finishes and waits for it only before reading activations.
// MoE experts run the same kernel per expert: batched (blockIdx.y = one (token, slot) pair, width 1)
// for one-token steps, grouped (blockIdx.y = expert, its rows of a step grouped by the router, in
// 16-row token tiles) for several; both give every row the bits of a width-1 call.
// Widths n > 32 (prefill): activations converted to f16 in chunk order (prep_activations_kernel),
// weight row tiles decoded to f16 (dequant_tile_kernel), multiplied with cuBLAS (f32 accumulate).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>
#include <type_traits>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch_util.h"
#include "backend/cuda/quant_blocks.cuh"
#include "backend/cuda/tensor_core.cuh"

namespace hyspec::cuda {
namespace {

constexpr int kMmvMaxWidth = 32;
constexpr int kFusedWidth = 4;  // widths up to this read f32 activations directly (no prep launch)
constexpr int kMmvWarps = 8;

template <typename F>
bool with_type(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::F32: f(TypeF32{}); return true;
    case GgmlType::F16: f(TypeF16{}); return true;
    case GgmlType::BF16: f(TypeBF16{}); return true;
    case GgmlType::Q8_0: f(TypeQ8_0{}); return true;
    case GgmlType::Q4_0: f(TypeQ4_0{}); return true;
    case GgmlType::Q4_K: f(TypeQ4_K{}); return true;
    case GgmlType::Q5_K: f(TypeQ5_K{}); return true;
    case GgmlType::Q6_K: f(TypeQ6_K{}); return true;
    case GgmlType::Q4_1: f(TypeQ4_1{}); return true;
    case GgmlType::Q5_0: f(TypeQ5_0{}); return true;
    case GgmlType::Q5_1: f(TypeQ5_1{}); return true;
    case GgmlType::IQ4_NL: f(TypeIQ4_NL{}); return true;
    case GgmlType::Q2_K: f(TypeQ2_K{}); return true;
    case GgmlType::Q3_K: f(TypeQ3_K{}); return true;
    case GgmlType::IQ4_XS: f(TypeIQ4_XS{}); return true;
    case GgmlType::IQ2_XXS: f(TypeIQ2_XXS{}); return true;
    case GgmlType::IQ2_XS: f(TypeIQ2_XS{}); return true;
    case GgmlType::IQ2_S: f(TypeIQ2_S{}); return true;
    case GgmlType::IQ3_XXS: f(TypeIQ3_XXS{}); return true;
    case GgmlType::IQ3_S: f(TypeIQ3_S{}); return true;
    case GgmlType::IQ1_S: f(TypeIQ1_S{}); return true;
    case GgmlType::IQ1_M: f(TypeIQ1_M{}); return true;
    default: return false;
  }
}

// The tensor-core paths need whole 32-element chunks; F32 weights always take the exact path.
bool fast_path(const WeightView& w) { return w.n_in % 32 == 0 && w.type != GgmlType::F32; }

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// ---- activations -> f16 (bf16 for BF16 weights) in chunk order -------------------------------
// xh[r][j] = x[r][block(j) + perm(j % kBlock)]; bytes: read 4K, write 2K per row.
template <class T>
__global__ void prep_activations_kernel(const float* __restrict__ x, int64_t x_stride, int64_t rows, int64_t K,
                                        void* __restrict__ xh) {
  const int64_t half_k = K / 2;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < rows * half_k;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / half_k, j = (idx % half_k) * 2;
    const int64_t blk = j / T::kBlock * T::kBlock;
    const int jj = static_cast<int>(j % T::kBlock);
    const float* xr = x + r * x_stride + blk;
    if constexpr (std::is_same_v<T, TypeBF16>)
      static_cast<__nv_bfloat162*>(xh)[idx] = __floats2bfloat162_rn(xr[T::perm(jj)], xr[T::perm(jj + 1)]);
    else
      static_cast<half2*>(xh)[idx] = __floats2half2_rn(xr[T::perm(jj)], xr[T::perm(jj + 1)]);
  }
}


struct MmvArgs {
  const uint8_t* w;
  size_t row_bytes;
  size_t expert_bytes;          // bytes between experts (batched mode)
  const int32_t* expert_ids;    // batched mode when non-null: blockIdx.y = batch b, width 1
  int x_div;                    // batched mode: activation row = b / x_div
  int64_t n_out, K;
  const float* x;               // [n, K] f32, 16-byte aligned rows (read when xh is null)
  int64_t x_stride;
  const __half* xh;             // activations in fragment order (prep_fragments_kernel), or null
  int64_t n_pad;                // tokens in xh (n rounded up to 8)
  int n;                        // tokens (<= 32)
  int stages;                   // ring slots per warp (2..8)
  const uint8_t* w2;            // fused SwiGLU: the up weights (w = gate), same type and shape
  // Grouped mode when non-null: blockIdx.y = expert e, whose rows of x and y are [offsets[e],
  // offsets[e+1]) (xh holds all of them); tiles = (row tile, token tile of NT*8 rows) pairs.
  const int32_t* group_offsets;
  float* y;
  int64_t y_stride;
};

// Shared-memory layout of the streaming matvec for type T: a row's bytes of one step (SB) start at
// any 2-byte alignment, so their 16-byte aligned cover takes up to P pieces; a row slot (RS) adds
// room for the aligned-word over-read of the kA2 decoders and avoids a multiple of 256 bytes.
template <class T>
struct StreamShape {
  static constexpr int C = T::kStepChunks;
  static constexpr int SB = C * 32 / T::kBlock * T::kBlockBytes;
  static constexpr int P = (SB + 30) / 16;
  static constexpr int RS0 = 16 * P + (T::kA2 ? 16 : 0);
  static constexpr int RS = RS0 % 256 == 0 ? RS0 + 16 : RS0;
  static_assert(C % 4 == 0 && (C * 32) % T::kBlock == 0, "a step is whole blocks and whole lane-quad rounds");
};

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) { return as_u32(__floats2half2_rn(lo, hi)); }

// BF16 weights multiply as stored on bf16 MMAs, so their activations are bf16 too (as in the prompt
// GEMM); every other type decodes to f16 and takes f16 activations.
template <class T>
constexpr bool kBf16Mma = std::is_same_v<T, TypeBF16>;
template <class T>
__device__ __forceinline__ uint32_t pack_x(float lo, float hi) {
  if constexpr (kBf16Mma<T>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    __builtin_memcpy(&u, &v, 4);
    return u;
  } else {
    return pack_h2(lo, hi);
  }
}

// B fragments of chunk c for one f32 activation row, in T's chunk order: each aligned group of 4
// chunk positions is one float4 of the row (kSwizzle: order {0,2,1,3}). For every type,
// perm(32*cb + j) = perm(32*cb) + perm(j), so the 8 offsets are compile-time constants.
template <class T>
__device__ __forceinline__ void load_b(const float* __restrict__ xr, int64_t c, uint32_t (&b)[16]) {
  constexpr int kChunks = T::kBlock / 32;
  const float* base = xr + c / kChunks * T::kBlock + T::perm(static_cast<int>(c % kChunks) * 32);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(base + T::perm(4 * i)));
    if constexpr (T::kSwizzle) {
      b[2 * i] = pack_x<T>(f.x, f.z), b[2 * i + 1] = pack_x<T>(f.y, f.w);
    } else {
      b[2 * i] = pack_x<T>(f.x, f.y), b[2 * i + 1] = pack_x<T>(f.z, f.w);
    }
  }
}

// Activations for widths > kFusedWidth, converted once per matmul to f16 in the order the B
// fragments are read: 16-byte piece k (chunk positions 8k..8k+7) of chunk 4s+t of token tok at
// piece index ((4s + k) * n_pad + tok) * 4 + t, so each load instruction of a warp reads 512
// contiguous bytes. Pad tokens and chunks past K are zeros. Bytes: read 4nK, write 2nK.
template <class T>
__global__ void prep_fragments_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n, int64_t n_pad,
                                      int64_t K, __half* __restrict__ xh) {
  pdl_wait();  // x belongs to the previous kernel
  pdl_trigger();
  constexpr int kChunks = T::kBlock / 32;
  const int64_t n_chunks = K / 32, pieces = (n_chunks + 3) / 4 * 4 * n_pad * 4;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < pieces;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(idx % 4);
    const int64_t tok = idx / 4 % n_pad, sk = idx / 4 / n_pad;
    const int k = static_cast<int>(sk % 4);
    const int64_t c = sk / 4 * 4 + t;
    float v[8] = {};
    if (tok < n && c < n_chunks) {
      const float* base = x + tok * x_stride + c / kChunks * T::kBlock + T::perm(static_cast<int>(c % kChunks) * 32);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = base[T::perm(8 * k + e)];
    }
    reinterpret_cast<uint4*>(xh)[idx] =
        make_uint4(pack_x<T>(v[0], v[1]), pack_x<T>(v[2], v[3]), pack_x<T>(v[4], v[5]), pack_x<T>(v[6], v[7]));
  }
}

// Bytes of x in fragment order for n_pad tokens of K elements, and its conversion (one launch).
size_t fragments_bytes(int64_t n_pad, int64_t K) { return static_cast<size_t>(n_pad) * ((K / 32 + 3) / 4) * 128 * 2; }
template <class T>
cudaError_t prep_fragments(Mat x, int64_t n_pad, int64_t K, __half* xh, cudaStream_t stream) {
  const int64_t pieces = (K / 32 + 3) / 4 * 4 * n_pad * 4;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(pieces, 256), 4096));
  return launch_pdl(prep_fragments_kernel<T>, dim3(blocks), dim3(256), 0, stream, x.data, x.stride, x.rows, n_pad, K,
                    xh);
}

// Streaming tensor-core matvec, see the top of the file. Block = kMmvWarps warps; tile = RW rows
// (RW/16 row groups per warp, which share each B fragment load); warp ks takes the steps ks,
// ks + 8, ... of every tile the block owns (tiles blockIdx.x, + gridDim.x, ...).
// Per call: bytes = W once + n*K*(4 or 2)*(n_out/RW) from L2 (activations) + n*n_out*4; FLOPs =
// 2*n_out*K*8*NT on the tensor cores (n padded to n-tiles of 8). Decoding costs ~2 ALU ops per
// weight, so the kernel is bound by the weight bytes for n <= 32 when enough of them are in flight:
// 8 warps x (stages-1) x RW rows x SB bytes per block (Q4_K, RW=16, 4 stages: 55 KB).
// Lane (g, t) = (lane/4, lane%4): A rows g and g+8 of each row group, chunk 4*u + t of the step;
// B token 8*nt + g.
// Two blocks per SM (<= 128 registers) up to 16 tokens; one above (4 n-tiles of accumulators and B
// fragments for two row groups spill at 128).
template <int NT>
constexpr int mmv_min_blocks() {
  return NT >= 4 ? 1 : 2;
}

// SW (fused SwiGLU): each row group holds 8 gate rows (A rows g) and the same 8 up rows (A rows
// g+8), so a lane ends with gate and up of the same output in acc[..][0,1] and [2,3]; a tile covers
// RW/2 outputs and y = silu(gate x) * (up x).
template <class T, int NT, int RW, bool SW, int MB = mmv_min_blocks<NT>()>
__global__ void __launch_bounds__(kMmvWarps * 32, MB) mmv_kernel(MmvArgs a) {
  using SS = StreamShape<T>;
  // Types whose blocks are a multiple of 16 bytes (Q4_K, Q5_K, F16, BF16) have every row and step
  // 16-byte aligned: the copies need no cover arithmetic.
  constexpr bool kAligned = T::kBlockBytes % 16 == 0 && SS::SB % 16 == 0;
  constexpr int C = SS::C, SB = SS::SB, P = SS::P, RS = SS::RS, RGW = RW / 16;
  constexpr int kOut = SW ? RW / 2 : RW;  // outputs per tile
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int NS = a.stages;
  uint8_t* const ring = smem + ks * NS * RW * RS;
  float* const red = reinterpret_cast<float*>(smem + kMmvWarps * NS * RW * RS);  // [warps][RGW*NT*4][32]
  const uint8_t* w = a.w;
  const uint8_t* w2 = a.w2;
  const float* x = a.x;
  float* y = a.y;
  int n = a.n;
  const bool grouped = a.group_offsets != nullptr;
  int64_t tok0 = 0, token_tiles = 1;  // grouped: the expert's first row and its tiles of NT*8 rows
  if (a.expert_ids) {  // the expert ids come from the previous kernel
    pdl_wait();
    const int b = blockIdx.y;
    w += static_cast<size_t>(a.expert_ids[b]) * a.expert_bytes;
    if (w2) w2 += static_cast<size_t>(a.expert_ids[b]) * a.expert_bytes;
    x += static_cast<int64_t>(b / a.x_div) * a.x_stride;
    y += b * a.y_stride;
    n = 1;
  } else if (grouped) {  // so do the group offsets
    pdl_wait();
    const int e = blockIdx.y;
    tok0 = a.group_offsets[e];
    n = a.group_offsets[e + 1] - static_cast<int>(tok0);
    w += static_cast<size_t>(e) * a.expert_bytes;
    if (w2) w2 += static_cast<size_t>(e) * a.expert_bytes;
    token_tiles = (n + NT * 8 - 1) / (NT * 8);
  }
  const int64_t n_chunks = a.K / 32, S = (n_chunks + C - 1) / C;
  const int64_t row_tiles = (a.n_out + kOut - 1) / kOut, tiles = row_tiles * token_tiles;
  const int64_t my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int cnt = ks < S ? static_cast<int>((S - 1 - ks) / kMmvWarps + 1) : 0;  // steps per tile
  const int64_t total = my_tiles * cnt;

  // Row r of a tile's slots: the weight row it holds.
  auto row_tile = [&](int64_t tile) -> int64_t {
    return grouped ? static_cast<int64_t>(static_cast<int>(tile) % static_cast<int>(row_tiles)) : tile;
  };
  auto row_src = [&](int64_t tile, int r) -> const uint8_t* {
    const int64_t rt = row_tile(tile);
    if constexpr (SW) {
      const int64_t row = min(rt * kOut + 8 * (r >> 4) + (r & 7), a.n_out - 1);
      return ((r & 15) < 8 ? w : w2) + row * static_cast<int64_t>(a.row_bytes);
    } else {
      return w + min(rt * RW + r, a.n_out - 1) * static_cast<int64_t>(a.row_bytes);
    }
  };
  // Copy cursor: item `issued` = step ks + 8*i_m of tile i_tile, into slot i_slot.
  int64_t issued = 0, i_tile = blockIdx.x;
  int i_m = 0, i_slot = 0;
  auto issue = [&]() {
    if (issued < total) {
      const int64_t off = (ks + int64_t{kMmvWarps} * i_m) * SB;
      const int64_t len = min(static_cast<int64_t>(SB), static_cast<int64_t>(a.row_bytes) - off);
      uint8_t* slot = ring + i_slot * RW * RS;
      if constexpr (kAligned) {
        constexpr int PA = SB / 16;
#pragma unroll
        for (int it = 0; it < (RW * PA + 31) / 32; ++it) {
          const int i = it * 32 + lane;
          const int r = i / PA, p = i - r * PA;
          if (i < RW * PA && 16 * p < len) cp_async16(slot + r * RS + 16 * p, row_src(i_tile, r) + off + 16 * p);
        }
      } else {
#pragma unroll
        for (int it = 0; it < (RW * P + 31) / 32; ++it) {
          const int i = it * 32 + lane;
          if (i < RW * P) {
            const int r = i / P, p = i - r * P;
            const uint8_t* src = row_src(i_tile, r) + off;
            const uint8_t* a0 = src - (reinterpret_cast<uintptr_t>(src) & 15);
            if (a0 + 16 * p < src + len) cp_async16(slot + r * RS + 16 * p, a0 + 16 * p);
          }
        }
      }
      ++issued;
      if (++i_m == cnt) i_m = 0, i_tile += gridDim.x;
      if (++i_slot == NS) i_slot = 0;
    }
    cp_async_commit();  // one group per call, empty or not, so wait_group counts items
  };
  for (int k = 0; k + 1 < NS; ++k) issue();
  if (!a.expert_ids && !grouped) pdl_wait();  // x, xh and y belong to earlier kernels
  pdl_trigger();

  int c_slot = 0;
  for (int64_t j = 0; j < my_tiles; ++j) {
    const int64_t tile = blockIdx.x + j * gridDim.x, rt = row_tile(tile);
    // Grouped: this tile's rows of x and y start at tb; nn of them are the expert's.
    const int64_t tt = grouped ? tile / row_tiles : 0, tb = tok0 + tt * NT * 8;
    const int nn = grouped ? min(NT * 8, n - static_cast<int>(tt) * NT * 8) : n;
    float acc[RGW][NT][4];
#pragma unroll
    for (int q = 0; q < RGW; ++q)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[q][nt][0] = acc[q][nt][1] = acc[q][nt][2] = acc[q][nt][3] = 0.0f;
    // Misalignment (mod 16) of rows g and g+8 of each row group; the step offsets add to it.
    int mis[RGW][2];
#pragma unroll
    for (int q = 0; q < RGW; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        mis[q][h] = kAligned ? 0 : static_cast<int>(reinterpret_cast<uintptr_t>(row_src(tile, 16 * q + g + 8 * h)) & 15);
    for (int m = 0; m < cnt; ++m) {
      cp_async_wait_upto(NS - 2);  // this thread's copies of the step have landed
      __syncwarp();                // ... and every lane's; the slot refilled next was read at m-1
      issue();
      const uint8_t* slot = ring + c_slot * RW * RS;
      if (++c_slot == NS) c_slot = 0;
      const int64_t s = ks + int64_t{kMmvWarps} * m;
      const int off16 = kAligned ? 0 : static_cast<int>((s * SB) & 15);
#pragma unroll
      for (int u = 0; u < C / 4; ++u) {
        const int cl = 4 * u + t;
        const int64_t c = s * C + cl;
        const bool valid = c < n_chunks;
        uint32_t b[NT][16];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int tok = nt * 8 + g;
          if (nt * 8 < nn && valid && a.xh) {  // (grouped: rows past nn belong to other experts, unused)
            const uint4* piece = reinterpret_cast<const uint4*>(a.xh) + ((c >> 2) * 4 * a.n_pad + tb + tok) * 4 + t;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const uint4 v = piece[k * a.n_pad * 4];
              b[nt][4 * k] = v.x, b[nt][4 * k + 1] = v.y, b[nt][4 * k + 2] = v.z, b[nt][4 * k + 3] = v.w;
            }
          } else if (nt * 8 < nn && valid && tok < nn) {
            load_b<T>(x + tok * a.x_stride, c, b[nt]);
          } else {
#pragma unroll
            for (int k = 0; k < 16; ++k) b[nt][k] = 0u;
          }
        }
#pragma unroll
        for (int q = 0; q < RGW; ++q) {
          half2 A0[16], A1[16];
          // BF16: the stored bits are the A fragments (F16's chunk reader copies them unconverted).
          using Reader = std::conditional_t<kBf16Mma<T>, TypeF16, T>;
          if (valid) {
            Reader::chunk(slot + (16 * q + g) * RS + ((mis[q][0] + off16) & 15), cl, A0);
            Reader::chunk(slot + (16 * q + g + 8) * RS + ((mis[q][1] + off16) & 15), cl, A1);
          } else {
#pragma unroll
            for (int k = 0; k < 16; ++k) A0[k] = A1[k] = __float2half2_rn(0.0f);
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            if (nt * 8 >= nn) break;  // warp-uniform
#pragma unroll
            for (int i = 0; i < 8; ++i)
              mma_16816<std::conditional_t<kBf16Mma<T>, __nv_bfloat16, __half>>(
                  acc[q][nt], as_u32(A0[2 * i]), as_u32(A1[2 * i]), as_u32(A0[2 * i + 1]), as_u32(A1[2 * i + 1]),
                  b[nt][2 * i], b[nt][2 * i + 1]);
          }
        }
      }
    }

    // Sum the warps' partials in a fixed order (deterministic) and write the tile.
    constexpr int kVals = RGW * NT * 4 * 32;
#pragma unroll
    for (int q = 0; q < RGW; ++q)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[ks * kVals + ((q * NT + nt) * 4 + e) * 32 + lane] = acc[q][nt][e];
    __syncthreads();
    for (int i = threadIdx.x; i < kVals; i += kMmvWarps * 32) {
      const int ln = i & 31, e = (i >> 5) & 3, nt = (i >> 7) % NT, q = i / (128 * NT);
      const int tok = nt * 8 + 2 * (ln & 3) + (e & 1);
      if constexpr (SW) {
        const int64_t row = rt * kOut + 8 * q + (ln >> 2);
        if (e < 2 && row < a.n_out && tok < nn) {
          float vg = 0.0f, vu = 0.0f;
#pragma unroll
          for (int k = 0; k < kMmvWarps; ++k) vg += red[k * kVals + i], vu += red[k * kVals + i + 64];
          y[(tb + tok) * a.y_stride + row] = vg / (1.0f + expf(-vg)) * vu;
        }
      } else {
        const int64_t row = rt * RW + 16 * q + (ln >> 2) + (e >= 2 ? 8 : 0);
        if (row < a.n_out && tok < nn) {
          float v = 0.0f;
#pragma unroll
          for (int k = 0; k < kMmvWarps; ++k) v += red[k * kVals + i];
          y[(tb + tok) * a.y_stride + row] = v;
        }
      }
    }
    __syncthreads();  // red is rewritten by the next tile
  }
  cp_async_wait<0>();  // nothing is left in flight (only empty groups remain)
}

// Exact f32 path: F32 weights (norm-sized vectors, MoE routers, small projections such as
// ssm_beta: exact like the CPU, so expert choices agree) and float rows that are not whole
// 32-element chunks. A block of kExactWarps warps per (row, group of 8 tokens; blockIdx.y): warp s
// sums slice s of K (lane l: elements 4l..4l+3 of each 128, in order), the slices are added in order,
// so a row's bits do not depend on the number of tokens. W is read ceil(n/8) times (from L2 after the
// first), and a prompt's token groups run in parallel. Splitting K over the block's warps keeps the
// loads of a short row in flight at once: a warp per row walked K in a chain of dependent loads (a
// 2048 x 128 MoE router 20 us, its 2048 x 1 shared-expert gate as long, for 1 MB and 8 KB).
// Bytes: W once per 8 tokens, x per block from L1/L2. A second weight of the same rows' shape (`second`:
// blocks n_out.. of the grid) shares the launch: a MoE router and its shared expert's gate.
constexpr int kExactWarps = 8;
struct ExactSecond {
  const uint8_t* w = nullptr;
  float* y = nullptr;
  int64_t y_stride = 0;
};
template <class T>
__global__ void __launch_bounds__(kExactWarps * 32) matmul_exact_kernel(
    const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_out, int64_t K, const float* __restrict__ x,
    int64_t x_stride, int64_t n, float* y, int64_t y_stride, const int32_t* __restrict__ expert_ids,
    size_t expert_bytes, int x_div, ExactSecond second) {
  __shared__ float partial[kExactWarps][8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t row = blockIdx.x;
  if (row >= n_out) {  // the second weight's row
    row -= n_out;
    w = second.w, y = second.y, y_stride = second.y_stride;
  }
  pdl_wait();  // x (and the expert ids) belong to the previous kernels
  pdl_trigger();
  if (expert_ids) {  // batched experts: blockIdx.y = batch b, one activation row each
    const int b = blockIdx.y;
    w += static_cast<size_t>(expert_ids[b]) * expert_bytes;
    x += static_cast<int64_t>(b / x_div) * x_stride;
    y += b * y_stride;
    n = 1;
  } else {  // blockIdx.y = group of 8 tokens
    const int64_t t0 = static_cast<int64_t>(blockIdx.y) * 8;
    x += t0 * x_stride;
    y += t0 * y_stride;
    n = min(n - t0, int64_t{8});
  }
  const int tn = static_cast<int>(n);
  const uint8_t* wr = w + row * row_bytes;
  const int64_t slice = (K + 4 * kExactWarps - 1) / (4 * kExactWarps) * 4;  // a multiple of 4
  const int64_t k0 = warp * slice, k1 = min(K, k0 + slice);
  // Vector loads where everything is whole aligned float4s; the same elements in the same order.
  const bool vec = std::is_same_v<T, TypeF32> && K % 4 == 0 && row_bytes % 16 == 0 &&
                   (reinterpret_cast<uintptr_t>(wr) & 15) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
                   x_stride % 4 == 0;
  float acc[8] = {};
#pragma unroll 4
  for (int64_t c = k0 + 4 * lane; c < k1; c += 128) {
    float wv[4], xv[8][4];
    if (vec) {
      const float4 w4 = *reinterpret_cast<const float4*>(wr + c * 4);
      wv[0] = w4.x, wv[1] = w4.y, wv[2] = w4.z, wv[3] = w4.w;
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        if (t >= tn) break;
        const float4 x4 = *reinterpret_cast<const float4*>(x + t * x_stride + c);
        xv[t][0] = x4.x, xv[t][1] = x4.y, xv[t][2] = x4.z, xv[t][3] = x4.w;
      }
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) wv[e] = c + e < k1 ? T::value(wr, c + e) : 0.0f;
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        if (t >= tn) break;
#pragma unroll
        for (int e = 0; e < 4; ++e) xv[t][e] = c + e < k1 ? x[t * x_stride + c + e] : 0.0f;
      }
    }
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      if (t >= tn) break;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t] = fmaf(wv[e], xv[t][e], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    float s = acc[t];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) partial[warp][t] = s;
  }
  __syncthreads();
  if (threadIdx.x < tn) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kExactWarps; ++k) s += partial[k][threadIdx.x];
    y[threadIdx.x * y_stride + row] = s;
  }
}

template <class T>
cudaError_t launch_exact(const WeightView& w, const float* x, int64_t x_stride, int64_t n, float* y, int64_t y_stride,
                         unsigned groups, const int32_t* expert_ids, int x_div, cudaStream_t stream,
                         ExactSecond second = {}, int64_t second_rows = 0) {
  const size_t expert_bytes = static_cast<size_t>(w.n_out) * w.row_bytes;
  return launch_pdl(matmul_exact_kernel<T>, dim3(static_cast<unsigned>(w.n_out + second_rows), groups),
                    dim3(kExactWarps * 32), 0, stream, w.data, w.row_bytes, w.n_out, w.n_in, x, x_stride, n, y,
                    y_stride, expert_ids, expert_bytes, x_div, second);
}

// Prefill: rows [r0, r0+rows) decoded to f16 in chunk order. Bytes: read the tile once, write 2 B/elem.
// A thread decodes one chunk (64 bytes of f16); a warp's 32 consecutive chunks leave through shared
// memory so that each store instruction writes 512 contiguous bytes (direct 64-byte-strided stores
// left the kernel bound by half-filled L2 sector writes). Launched with 256 threads.
template <class T>
__global__ void dequant_tile_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t r0, int64_t rows,
                                    int64_t n_chunks, __half* __restrict__ out) {
  __shared__ uint4 stage[8][32 * 4];
  const int lane = threadIdx.x & 31;
  uint4* my = stage[threadIdx.x >> 5];
  const int64_t total = rows * n_chunks;
  // Warp-uniform loop: the warp's chunks are idx0 .. idx0 + 31.
  for (int64_t idx0 = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) & ~int64_t{31}; idx0 < total;
       idx0 += int64_t(gridDim.x) * blockDim.x) {
    const int64_t idx = idx0 + lane;
    if (idx < total) {
      const int64_t r = idx / n_chunks, c = idx % n_chunks;
      half2 a[16];
      T::chunk(w + (r0 + r) * row_bytes, c, a);
      const uint32_t* v = reinterpret_cast<const uint32_t*>(a);
#pragma unroll
      for (int k = 0; k < 4; ++k) my[4 * lane + k] = make_uint4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    }
    __syncwarp();
    // Chunk idx0 + i is output chunk idx0 + i (the tile is [rows][n_chunks] chunks, row-major).
    uint4* dst = reinterpret_cast<uint4*>(out + idx0 * 32);
    const int64_t pieces = min(int64_t{32}, total - idx0) * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (32 * k + lane < pieces) dst[32 * k + lane] = my[32 * k + lane];
    __syncwarp();  // my is rewritten next round
  }
}

// out[t][i] = table[tokens[t]][i]; reads one row per token.
template <class T>
__global__ void embed_kernel(const uint8_t* __restrict__ table, size_t row_bytes, int64_t n_rows, int64_t K,
                             const int32_t* __restrict__ tokens, float* out, int64_t out_stride) {
  const int64_t t = blockIdx.y;
  const int64_t id = tokens[t];
  const bool valid = id >= 0 && id < n_rows;  // out-of-range ids give zeros, as on the CPU
  const uint8_t* row = table + (valid ? id : 0) * row_bytes;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < K; i += int64_t(gridDim.x) * blockDim.x)
    out[t * out_stride + i] = valid ? T::value(row, i) : 0.0f;
}

template <class T>
cudaError_t prep_activations(const float* x, int64_t x_stride, int64_t rows, int64_t K, void* xh,
                             cudaStream_t stream) {
  const int64_t total = rows * K / 2;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(total, 256), 65535));
  prep_activations_kernel<T><<<blocks, 256, 0, stream>>>(x, x_stride, rows, K, xh);
  return cudaGetLastError();
}

struct DeviceSmem {
  int per_sm = 0, per_block_optin = 0, reserved = 0;
};
const DeviceSmem& device_smem() {
  static const DeviceSmem d = [] {
    DeviceSmem r;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&r.per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    cudaDeviceGetAttribute(&r.per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaDeviceGetAttribute(&r.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev);
    return r;
  }();
  return d;
}

// Ring depth and blocks per SM of one instantiation: two blocks per SM (16 warps to decode) when
// three or more stages fit in half the SM's shared memory, else one block with up to 8 stages.
// HYSPEC_MMV_STAGES / HYSPEC_MMV_BLOCKS override (benchmarks).
struct MmvConfig {
  int stages = 0, blocks_per_sm = 0;
  size_t smem = 0;
  cudaError_t err = cudaSuccess;
};
template <class T, int NT, int RW, bool SW, int MB>
const MmvConfig& mmv_config() {
  static const MmvConfig cfg = [] {
    MmvConfig c;
    const DeviceSmem& d = device_smem();
    const size_t set = size_t{kMmvWarps} * RW * StreamShape<T>::RS;  // one slot for every warp
    const size_t red = size_t{kMmvWarps} * (RW / 16) * NT * 4 * 32 * sizeof(float);
    const size_t half = static_cast<size_t>(d.per_sm / 2 - d.reserved);
    const int two = half > red ? static_cast<int>((half - red) / set) : 0;
    const int one = static_cast<int>((static_cast<size_t>(d.per_block_optin) - red) / set);
    const size_t third = static_cast<size_t>(d.per_sm / 3 - d.reserved);
    const int three = third > red ? static_cast<int>((third - red) / set) : 0;
    c.blocks_per_sm = MB >= 3 ? 3 : std::min(MB, env_int("HYSPEC_MMV_BLOCKS", two >= 3 ? 2 : 1));
    const int fit = c.blocks_per_sm >= 3 ? three : c.blocks_per_sm >= 2 ? two : one;
    // Measured on H100 (Q4_K, docs/CUDA_NOTES.md): 3 stages beat 5 (the smaller carve-out leaves L1
    // room for the activations) and 2 blocks per SM beat 1.
    c.stages = std::clamp(env_int("HYSPEC_MMV_STAGES", std::min(fit, c.blocks_per_sm >= 2 ? 3 : 4)), 2, 8);
    c.smem = c.stages * set + red;
    c.err = cudaFuncSetAttribute(mmv_kernel<T, NT, RW, SW, MB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(c.smem));
    return c;
  }();
  return cfg;
}

// grid_y > 0: batched experts (one tile per block, blockIdx.y = batch entry); else a persistent grid.
template <class T, int NT, int RW, bool SW = false, int MB = mmv_min_blocks<NT>()>
cudaError_t launch_mmv(MmvArgs a, unsigned grid_y, cudaStream_t stream, unsigned grid_x = 0) {
  const MmvConfig& c = mmv_config<T, NT, RW, SW, MB>();
  if (c.err != cudaSuccess) return c.err;
  a.stages = c.stages;
  const int64_t tiles = (a.n_out + (SW ? RW / 2 : RW) - 1) / (SW ? RW / 2 : RW);
  static const int forced_grid = env_int("HYSPEC_MMV_GRID", 0);
  const int64_t slots = forced_grid > 0 ? forced_grid : int64_t{c.blocks_per_sm} * sm_count();
  // Expert batches (grid_y: one row of blocks per (token, slot)) share the SM slots: a block walks
  // several tiles, its weight ring streaming across them, instead of one short tile each.
  const int64_t per_y = grid_y ? std::max<int64_t>(1, (slots + grid_y - 1) / grid_y) : slots;
  const dim3 grid(grid_x ? grid_x : static_cast<unsigned>(std::min(tiles, per_y)), grid_y ? grid_y : 1);
  return launch_pdl(mmv_kernel<T, NT, RW, SW, MB>, grid, dim3(kMmvWarps * 32), c.smem, stream, a);
}

// x as 16-byte aligned rows: x itself, or a copy in `staging`.
Mat aligned_rows(Mat x, float* staging, cudaStream_t stream, cudaError_t& err) {
  if ((reinterpret_cast<uintptr_t>(x.data) & 15) == 0 && x.stride % 4 == 0) return x;
  err = cudaMemcpy2DAsync(staging, x.cols * sizeof(float), x.data, x.stride * sizeof(float), x.cols * sizeof(float),
                          x.rows, cudaMemcpyDeviceToDevice, stream);
  return Mat{staging, x.rows, x.cols, x.cols};
}

// Tiles of 16 rows up to 24 tokens (two blocks per SM); 32 rows above (each B fragment load serves
// two row groups, which halves the activation traffic from L2). 32-row tiles at 16 tokens ran at one
// block per SM and measured slower (docs/CUDA_NOTES.md).
// up: fused SwiGLU with these up weights (w = gate), widths <= 24.
template <class T>
cudaError_t mmv(const WeightView& w, Mat x, Mat y, void* scratch, cudaStream_t stream, const uint8_t* up = nullptr) {
  cudaError_t err = cudaSuccess;
  MmvArgs a{w.data, w.row_bytes, 0, nullptr, 1, w.n_out, w.n_in, x.data, x.stride, nullptr, 0,
            static_cast<int>(x.rows), 0, up, nullptr, y.data, y.stride};
  if (x.rows <= kFusedWidth) {
    const Mat xa = aligned_rows(x, static_cast<float*>(scratch), stream, err);
    if (err != cudaSuccess) return err;
    a.x = xa.data, a.x_stride = xa.stride;
  } else {
    a.n_pad = padded_tokens(x.rows);
    a.xh = static_cast<const __half*>(scratch);
    if ((err = prep_fragments<T>(x, a.n_pad, w.n_in, static_cast<__half*>(scratch), stream)) != cudaSuccess) return err;
  }
  if (up) {
    if (x.rows <= 8) return launch_mmv<T, 1, 16, true>(a, 0, stream);
    return x.rows <= 16 ? launch_mmv<T, 2, 16, true>(a, 0, stream) : launch_mmv<T, 3, 16, true>(a, 0, stream);
  }
  // Benchmark switch: three blocks per SM (<= 85 registers) up to 8 tokens.
  static const bool three = env_int("HYSPEC_MMV_BLOCKS", 0) == 3;
  if (x.rows <= 8) return three ? launch_mmv<T, 1, 16, false, 3>(a, 0, stream) : launch_mmv<T, 1, 16>(a, 0, stream);
  if (x.rows <= 16) return launch_mmv<T, 2, 16>(a, 0, stream);
  // 17-24 rows (a 16-draft verify: 17): three n-tiles of 16-row tiles, or for Q6_K the 32-token kernel
  // (H100, 17 rows: Q6_K 0.66-0.83 -> 0.74-0.90 TB/s; Q4_K, Q5_K, Q8_0 lose 8-30% with it).
  // HYSPEC_MMV_WIDE17=0/1 forces either (benchmarks). All widths give the same bits per row.
  static const int wide17 = env_int("HYSPEC_MMV_WIDE17", -1);
  const bool wide = wide17 >= 0 ? wide17 != 0 : std::is_same_v<T, TypeQ6_K>;
  if (x.rows <= 24 && !wide) return launch_mmv<T, 3, 16>(a, 0, stream);
  return launch_mmv<T, 4, 32>(a, 0, stream);
}

// Rows of the f16 weight tile kept for cuBLAS: at most HYSPEC_GEMM_TILE_MB (default 64) MiB.
size_t tile_bytes() {
  static const size_t bytes = static_cast<size_t>(std::clamp(env_int("HYSPEC_GEMM_TILE_MB", 64), 1, 1024)) << 20;
  return bytes;
}

int64_t tile_rows(const WeightView& w) {
  const int64_t r = static_cast<int64_t>(tile_bytes() / (static_cast<size_t>(w.n_in) * 2));
  return std::max<int64_t>(16, std::min<int64_t>(r / 16 * 16, w.n_out));
}

// F16 and BF16 weights are cuBLAS operands as stored: no tile is decoded (a BF16 prompt step used
// to spend as long converting weights to f16 as multiplying). Their activations are converted to the
// weights' type (prep_activations): for BF16 that rounds x to 8 mantissa bits (~1e-3 relative per
// product sum, what a bf16 model computes natively; the decode/verify matvec does the same).
template <class T>
constexpr bool kGemmInPlace = std::is_same_v<T, TypeF16> || std::is_same_v<T, TypeBF16>;

template <class T>
cudaError_t gemm(const WeightView& w, Mat x, Mat y, __half* xh, __half* tile, cublasHandle_t cublas,
                 cudaStream_t stream) {
  constexpr bool kBf16 = std::is_same_v<T, TypeBF16>;
  cudaError_t err = prep_activations<T>(x.data, x.stride, x.rows, w.n_in, xh, stream);
  if (err != cudaSuccess) return err;
  const cudaDataType_t ab = kBf16 ? CUDA_R_16BF : CUDA_R_16F;
  const int64_t n_chunks = w.n_in / 32, step = kGemmInPlace<T> ? w.n_out : tile_rows(w);
  const float one = 1.0f, zero = 0.0f;
  for (int64_t r0 = 0; r0 < w.n_out; r0 += step) {
    const int64_t rows = std::min(step, w.n_out - r0);
    const void* a = tile;
    if constexpr (kGemmInPlace<T>) {
      a = w.data;
    } else {
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(rows * n_chunks, 256), 65535));
      dequant_tile_kernel<T><<<blocks, 256, 0, stream>>>(w.data, w.row_bytes, r0, rows, n_chunks, tile);
      if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
    // Column-major view: C[rows x n] = A^T[rows x K] * xh[K x n], C = y + r0 with ldc = y.stride.
    const cublasStatus_t st = cublasGemmEx(
        cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(x.rows), static_cast<int>(w.n_in),
        &one, a, ab, static_cast<int>(w.n_in), xh, ab, static_cast<int>(w.n_in), &zero, y.data + r0, CUDA_R_32F,
        static_cast<int>(y.stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  }
  return cudaSuccess;
}

}  // namespace

bool matmul_type_supported(GgmlType t) {
  return with_type(t, [](auto) {});
}

cudaError_t prepare_weight_type(GgmlType t) {
  const bool grids = t == GgmlType::IQ2_XXS || t == GgmlType::IQ2_XS || t == GgmlType::IQ2_S ||
                     t == GgmlType::IQ3_XXS || t == GgmlType::IQ3_S || t == GgmlType::IQ1_S || t == GgmlType::IQ1_M;
  if (!grids) return cudaSuccess;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  static std::mutex mutex;
  static std::set<int> done;  // devices whose copies are filled
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count(device)) return cudaSuccess;
  auto put = [](const auto& symbol, const auto& table) {
    static_assert(sizeof(symbol) == sizeof(table), "a device codebook has its host table's layout");
    return cudaMemcpyToSymbol(symbol, table.data(), sizeof(table));
  };
  for (const cudaError_t e : {put(d_iq2xxs_grid, iq::kIq2xxsGrid), put(d_iq2xs_grid, iq::kIq2xsGrid),
                              put(d_iq2s_grid, iq::kIq2sGrid), put(d_iq3xxs_grid, iq::kIq3xxsGrid),
                              put(d_iq3s_grid, iq::kIq3sGrid), put(d_iq1s_grid, iq::kIq1sGrid),
                              put(d_even_parity_signs, iq::kEvenParitySigns)})
    if (e != cudaSuccess) return e;
  done.insert(device);
  return cudaSuccess;
}

// Steps of kInt8MvMaxWidth < n <= kInt8MvChunkedMaxWidth rows (verify-32 is 33) run the int8 matvec in
// ceil(n / 32) balanced chunks, reading the weights once per chunk: on the 9B Q4_K_M a 33-row step took
// 15.7 ms through the prompt GEMM (every weight dequantized to f16 first), 5.4x a decode step; chunks
// also keep every row bit-identical to a one-token step.
constexpr int64_t kInt8MvChunkedMaxWidth = 2 * kInt8MvMaxWidth;
int64_t int8_chunk_rows(const WeightView& w, int64_t n) {
  if (n <= kInt8MvMaxWidth || n > kInt8MvChunkedMaxWidth || !int8_matvec_supported(w, kInt8MvMaxWidth)) return 0;
  const int64_t chunks = (n + kInt8MvMaxWidth - 1) / kInt8MvMaxWidth;
  return (n + chunks - 1) / chunks;
}

size_t matmul_scratch_bytes(const WeightView& w, int64_t n) {
  if (!fast_path(w)) return 0;
  if (int8_matvec_supported(w, n)) return int8_matvec_scratch_bytes(w, n);
  if (const int64_t rows = int8_chunk_rows(w, n)) return int8_matvec_scratch_bytes(w, rows);
  if (n <= kFusedWidth) return static_cast<size_t>(n * w.n_in) * sizeof(float);  // staging of unaligned x
  if (n <= kMmvMaxWidth) return fragments_bytes(padded_tokens(n), w.n_in);
  const bool in_place = w.type == GgmlType::F16 || w.type == GgmlType::BF16;
  return align_up(static_cast<size_t>(n * w.n_in) * 2, 256) + (in_place ? 0 : static_cast<size_t>(tile_rows(w) * w.n_in) * 2);
}

cudaError_t matmul_exact_pair_launch(const WeightView& a, Mat ya, const WeightView& b, Mat yb, Mat x,
                                     cudaStream_t stream) {
  if (fast_path(a) || fast_path(b) || a.type != b.type || a.n_in != b.n_in || a.row_bytes != b.row_bytes ||
      x.cols != a.n_in || ya.rows != x.rows || yb.rows != x.rows)
    return cudaErrorNotSupported;
  if (x.rows == 0) return cudaSuccess;
  cudaError_t err = cudaErrorInvalidValue;
  with_type(a.type, [&](auto tag) {
    err = launch_exact<decltype(tag)>(a, x.data, x.stride, x.rows, ya.data, ya.stride,
                                      static_cast<unsigned>((x.rows + 7) / 8), nullptr, 1, stream,
                                      ExactSecond{b.data, yb.data, yb.stride}, b.n_out);
  });
  return err;
}

cudaError_t matmul_launch(const WeightView& w, Mat x, Mat y, MatmulScratch scratch, cublasHandle_t cublas,
                          cudaStream_t stream, const QuantizedX* qx) {
  cudaError_t err = cudaErrorInvalidValue;
  if (x.rows == 0) return cudaSuccess;
  if (!fast_path(w)) {
    with_type(w.type, [&](auto tag) {
      using T = decltype(tag);
      err = launch_exact<T>(w, x.data, x.stride, x.rows, y.data, y.stride, static_cast<unsigned>((x.rows + 7) / 8),
                            nullptr, 1, stream);
    });
    return err;
  }
  if (int8_matvec_supported(w, x.rows)) return int8_matvec_launch(w, nullptr, x, y, scratch.data, stream, qx);
  if (const int64_t rows = int8_chunk_rows(w, x.rows)) {
    for (int64_t r0 = 0; r0 < x.rows; r0 += rows) {
      const int64_t m = std::min(rows, x.rows - r0);
      err = int8_matvec_launch(w, nullptr, Mat{x.data + r0 * x.stride, m, x.cols, x.stride},
                               Mat{y.data + r0 * y.stride, m, y.cols, y.stride}, scratch.data, stream);
      if (err != cudaSuccess) return err;
    }
    return err;
  }
  auto* xh = static_cast<__half*>(scratch.data);
  with_type(w.type, [&](auto tag) {
    using T = decltype(tag);
    if (x.rows <= kMmvMaxWidth) {
      if constexpr (!std::is_same_v<T, TypeF32>) err = mmv<T>(w, x, y, scratch.data, stream);  // F32: exact path
    } else {
      auto* tile = reinterpret_cast<__half*>(static_cast<char*>(scratch.data) +
                                             align_up(static_cast<size_t>(x.rows * w.n_in) * 2, 256));
      err = gemm<T>(w, x, y, xh, tile, cublas, stream);
    }
  });
  return err;
}

bool matmul_swiglu_supported(const WeightView& gate, const WeightView& up, int64_t n) {
  return gate.type == up.type && gate.n_in == up.n_in && gate.n_out == up.n_out && gate.row_bytes == up.row_bytes &&
         fast_path(gate) && n >= 1 && n <= kMmvSwiGluMaxWidth;
}

cudaError_t matmul_swiglu_launch(const WeightView& gate, const WeightView& up, Mat x, Mat y, MatmulScratch scratch,
                                 cudaStream_t stream, const QuantizedX* qx) {
  if (!matmul_swiglu_supported(gate, up, x.rows)) return cudaErrorInvalidValue;
  if (int8_matvec_supported(gate, x.rows)) return int8_matvec_launch(gate, up.data, x, y, scratch.data, stream, qx);
  cudaError_t err = cudaErrorInvalidValue;
  with_type(gate.type, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, TypeF32>) err = mmv<T>(gate, x, y, scratch.data, stream, up.data);
  });
  return err;
}

// Grouped expert matmul: tiles of 16 rows of an expert's run (NT = 2). xh holds every row plus one
// tile of zero rows, which the last tile of the last expert may read.
constexpr int kGroupedNT = 2;
int64_t grouped_rows_padded(int64_t n_rows) { return padded_tokens(n_rows) + kGroupedNT * 8; }

bool matmul_grouped_supported(const WeightView& w) { return fast_path(w); }

size_t matmul_grouped_scratch_bytes(const WeightView& w, int64_t n_rows) {
  return fragments_bytes(grouped_rows_padded(n_rows), w.n_in);
}

cudaError_t matmul_grouped_launch(const WeightView& w, const uint8_t* up, const int32_t* offsets, int n_experts,
                                  Mat x, Mat y, void* scratch, cudaStream_t stream) {
  if (x.rows == 0) return cudaSuccess;
  if (!fast_path(w) || n_experts < 1 || n_experts > 65535) return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  with_type(w.type, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, TypeF32>) {
      auto* xh = static_cast<__half*>(scratch);
      const int64_t n_pad = grouped_rows_padded(x.rows);
      if ((err = prep_fragments<T>(x, n_pad, w.n_in, xh, stream)) != cudaSuccess) return;
      MmvArgs a{w.data, w.row_bytes, static_cast<size_t>(w.n_out) * w.row_bytes, nullptr, 1, w.n_out, w.n_in,
                x.data, x.stride, xh, n_pad, 0, 0, up, offsets, y.data, y.stride};
      // Blocks per expert: a quarter of its row tiles by default (HYSPEC_MOE_BLOCKS_PER_EXPERT).
      const int64_t row_tiles = (w.n_out + (up ? 7 : 15)) / (up ? 8 : 16);
      static const int forced = env_int("HYSPEC_MOE_BLOCKS_PER_EXPERT", 0);
      const auto per_expert =
          static_cast<unsigned>(std::clamp<int64_t>(forced > 0 ? forced : (row_tiles + 3) / 4, 1, row_tiles));
      err = up ? launch_mmv<T, kGroupedNT, 16, true>(a, static_cast<unsigned>(n_experts), stream, per_expert)
               : launch_mmv<T, kGroupedNT, 16>(a, static_cast<unsigned>(n_experts), stream, per_expert);
    }
  });
  return err;
}

size_t matmul_experts_scratch_bytes(const WeightView& w, int64_t n_x_rows) {
  return static_cast<size_t>(n_x_rows * w.n_in) * sizeof(float);  // staging of unaligned x
}

cudaError_t matmul_experts_launch(const WeightView& w, const uint8_t* up, const int32_t* expert_ids, int64_t n_batch,
                                  int x_div, Mat x, Mat y, MatmulScratch scratch, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  if (n_batch == 0) return cudaSuccess;
  with_type(w.type, [&](auto tag) {
    using T = decltype(tag);
    err = cudaSuccess;
    if (!fast_path(w) && up) {
      err = cudaErrorInvalidValue;
      return;
    }
    if (!fast_path(w)) {  // F32 experts (dequantized models): exact, like the CPU
      const int64_t slice = 65535 / x_div * x_div;
      for (int64_t b0 = 0; b0 < n_batch && err == cudaSuccess; b0 += slice) {
        const int64_t nb = std::min<int64_t>(slice, n_batch - b0);
        err = launch_exact<T>(w, x.data + (b0 / x_div) * x.stride, x.stride, 1, y.data + b0 * y.stride, y.stride,
                              static_cast<unsigned>(nb), expert_ids + b0, x_div, stream);
      }
      return;
    }
    const Mat xa = aligned_rows(x, static_cast<float*>(scratch.data), stream, err);
    if (err != cudaSuccess) return;
    // gridDim.y is at most 65535: launch x_div-aligned slices of the batch.
    const int64_t slice = 65535 / x_div * x_div;
    for (int64_t b0 = 0; b0 < n_batch && err == cudaSuccess; b0 += slice) {
      const int64_t nb = std::min<int64_t>(slice, n_batch - b0);
      MmvArgs a{w.data,  w.row_bytes, static_cast<size_t>(w.n_out) * w.row_bytes, expert_ids + b0, x_div, w.n_out,
                w.n_in,  xa.data + (b0 / x_div) * xa.stride, xa.stride, nullptr, 0, 1, 0, up, nullptr,
                y.data + b0 * y.stride, y.stride};
      if constexpr (!std::is_same_v<T, TypeF32>)
        err = up ? launch_mmv<T, 1, 16, true>(a, static_cast<unsigned>(nb), stream)
                 : launch_mmv<T, 1, 16>(a, static_cast<unsigned>(nb), stream);
    }
  });
  return err;
}

cudaError_t embed_launch(const WeightView& table, const int32_t* tokens, Mat out, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  if (out.rows == 0) return cudaSuccess;
  with_type(table.type, [&](auto tag) {
    using T = decltype(tag);
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(blocks_for(table.n_in, 256), 64)),
                    static_cast<unsigned>(out.rows));
    embed_kernel<T><<<grid, 256, 0, stream>>>(table.data, table.row_bytes, table.n_out, table.n_in, tokens, out.data,
                                              out.stride);
    err = cudaGetLastError();
  });
  return err;
}

}  // namespace hyspec::cuda
