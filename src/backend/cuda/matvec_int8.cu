// Integer-dot matvec for Q4_K weights at decode and verify widths (1..32 tokens); opt-in
// (BackendOptions::int8_matvec, `--int8-matvec`), docs/CUDA_NOTES.md says why.
//
// The f16 tensor-core matvec (matmul.cu) decodes every 4-bit code into an f16 fragment and is
// issue-bound at ~1.45 TB/s for one token on an H100. Here the codes stay integers: activations are
// quantized once per call to int8 in blocks of 32 (scale d = max|x|/127 and the exact f32 sum s of each
// block, `quantize_q8_kernel`). Up to 4 tokens a lane owns one weight row, masks a Q4_K block's nibbles
// into words of four codes and multiplies them with dp4a (4 MACs per instruction); from 5 tokens an
// int8 mma.m16n8k32 per sub-block and 8 tokens does it. Either way the int32 sum of a 32-element
// sub-block is exact, and the sub-block then adds
//   (d*sc) * dx * isum - (dmin*m) * s
// to the output in f32, in the same order in both kernels (`add_sub_block`): every width gives the
// one-token bits. That per-output, per-sub-block epilogue is also why the mma kernel loses to the f16
// path from 8 tokens (ncu at 17 tokens: 7.5 M vs 4.2 M instructions).
//
// Layout: a block of 8 warps owns a tile of 16 rows at a time (8 gate + 8 up rows for the fused
// SwiGLU); warp ks takes the super-blocks (steps) ks, ks + 8, ... of the tile's rows, streamed
// through a private cp.async ring of `stages` slots of 16 x 144 bytes (144 = one Q4_K block; 9 x 16
// bytes, so 8 lanes reading 16 bytes of 8 rows hit distinct banks); lane (r, h) = (lane % 16,
// lane / 16) takes row r and sub-blocks 4h..4h+3 of each step. The two halves and then the 8 warps
// are summed in a fixed order, so a row's result is the same bits whatever the number of tokens
// (speculative verify rows equal decode steps), and the same in the fused SwiGLU as in a plain call.
// Bytes per call: W once + n*K*1.25 (int8 activations + scales, from L1/L2 per tile) + n*n_out*4.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch_util.h"

namespace hyspec::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;        // weight rows per tile
constexpr int kBlockBytes = 144;  // Q4_K: d, dmin (f16), scales[12], qs[128]
constexpr int kPieces = kBlockBytes / 16;


// x [n, K] f32 -> q [n, K] int8 and ds [n, K/32] {d, s}: q = round(x / d), d = max|x| / 127 over each
// 32-element block, s = sum of the block's x. A warp per block. Bytes: read 4, write 1.25 per element.
__global__ void quantize_q8_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n, int64_t K,
                                   int8_t* __restrict__ q, float2* __restrict__ ds) {
  pdl_wait();  // x belongs to the previous kernel
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t nb = K / 32, warps = int64_t(gridDim.x) * blockDim.x / 32;
  for (int64_t b = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; b < n * nb; b += warps) {
    const int64_t t = b / nb, j = b % nb;
    const float v = x[t * x_stride + j * 32 + lane];
    float amax = fabsf(v), sum = v;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    const float d = amax / 127.0f;
    q[t * K + j * 32 + lane] = static_cast<int8_t>(amax > 0.0f ? __float2int_rn(v / d) : 0);
    if (lane == 0) ds[b] = make_float2(d, sum);
  }
}

struct Int8MvArgs {
  const uint8_t* w;
  const uint8_t* w2;  // fused SwiGLU: the up weights (w = gate)
  size_t row_bytes;
  int64_t n_out, K;
  const int8_t* xq;   // [n, K]
  const float2* xds;  // [n, K/32]
  int n;
  int stages;
  float* y;
  int64_t y_stride;
};

__device__ __forceinline__ int dot8(const uint32_t (&w)[8], int4 x0, int4 x1) {
  int s = __dp4a(static_cast<int>(w[0]), x0.x, 0);
  s = __dp4a(static_cast<int>(w[1]), x0.y, s);
  s = __dp4a(static_cast<int>(w[2]), x0.z, s);
  s = __dp4a(static_cast<int>(w[3]), x0.w, s);
  s = __dp4a(static_cast<int>(w[4]), x1.x, s);
  s = __dp4a(static_cast<int>(w[5]), x1.y, s);
  s = __dp4a(static_cast<int>(w[6]), x1.z, s);
  return __dp4a(static_cast<int>(w[7]), x1.w, s);
}

// A warp's ring of cp.async slots over the (tile, step) items of a persistent block: warp ks takes
// steps ks, ks + 8, ... of tiles blockIdx.x, + gridDim.x, ...; a slot holds the 16 rows' blocks of one
// step (16 x 144 bytes), `stages - 1` steps are in flight ahead of the one being read.
template <bool SW>
struct StepRing {
  static constexpr int kOut = SW ? kRows / 2 : kRows;  // outputs per tile
  const Int8MvArgs& a;
  uint8_t* ring;
  float* red;  // after the rings: [warps][NMAX][16] partial sums
  int lane, ks, NS, cnt;
  int64_t my_tiles, total, issued = 0, i_tile;
  int i_m = 0, i_slot = 0, c_slot = 0;

  __device__ StepRing(const Int8MvArgs& args, uint8_t* smem)
      : a(args), lane(threadIdx.x & 31), ks(threadIdx.x >> 5), NS(args.stages), i_tile(blockIdx.x) {
    ring = smem + ks * NS * kRows * kBlockBytes;
    red = reinterpret_cast<float*>(smem + kWarps * NS * kRows * kBlockBytes);
    const int64_t S = a.K / 256, tiles = (a.n_out + kOut - 1) / kOut;
    my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    cnt = ks < S ? static_cast<int>((S - 1 - ks) / kWarps + 1) : 0;
    total = my_tiles * cnt;
  }
  // Row rr of a tile's slots: the weight row it holds (SW: 8 gate rows, then the same 8 up rows).
  __device__ const uint8_t* row_src(int64_t tile, int rr) const {
    if constexpr (SW) {
      const int64_t row = min(tile * kOut + (rr & 7), a.n_out - 1);
      return (rr < 8 ? a.w : a.w2) + row * static_cast<int64_t>(a.row_bytes);
    } else {
      return a.w + min(tile * kRows + rr, a.n_out - 1) * static_cast<int64_t>(a.row_bytes);
    }
  }
  __device__ void issue() {
    if (issued < total) {
      const int64_t off = (ks + int64_t{kWarps} * i_m) * kBlockBytes;
      uint8_t* slot = ring + i_slot * kRows * kBlockBytes;
#pragma unroll
      for (int it = 0; it < (kRows * kPieces + 31) / 32; ++it) {
        const int i = it * 32 + lane;
        const int rr = i / kPieces, p = i - rr * kPieces;
        if (i < kRows * kPieces) cp_async16(slot + rr * kBlockBytes + 16 * p, row_src(i_tile, rr) + off + 16 * p);
      }
      ++issued;
      if (++i_m == cnt) i_m = 0, i_tile += gridDim.x;
      if (++i_slot == NS) i_slot = 0;
    }
    cp_async_commit();  // one group per call, empty or not, so wait_group counts items
  }
  __device__ void prime() {
    for (int k = 0; k + 1 < NS; ++k) issue();
  }
  // The next step's slot (its copies have landed), after queueing the copies of a later one.
  __device__ const uint8_t* next() {
    cp_async_wait_upto(NS - 2);  // this thread's copies of the step have landed
    __syncwarp();                // ... and every lane's; the slot refilled next was read before
    issue();
    const uint8_t* slot = ring + c_slot * kRows * kBlockBytes;
    if (++c_slot == NS) c_slot = 0;
    return slot;
  }
};

// float(v) for |v| < 2^22 with an integer add and a float subtract (exact, so the same value as a
// conversion instruction, which issues at 1/8 of the float rate on sm_90).
__device__ __forceinline__ float small_int_to_float(int v) {
  return __int_as_float(v + 0x4B400000) - 12582912.0f;
}

// Scales d*sc and mins dmin*m of sub-blocks 4h..4h+3 of a Q4_K block header (its 6-bit packing).
__device__ __forceinline__ void q4k_scales(const uint8_t* blk, int h, float (&dsc)[4], float (&dmn)[4]) {
  const uint4 hdr = *reinterpret_cast<const uint4*>(blk);
  const uint32_t sc = h ? (hdr.w & 0x0f0f0f0fu) | ((hdr.y >> 2) & 0x30303030u) : hdr.y & 0x3f3f3f3fu;
  const uint32_t mn = h ? ((hdr.w >> 4) & 0x0f0f0f0fu) | ((hdr.z >> 2) & 0x30303030u) : hdr.z & 0x3f3f3f3fu;
  const float2 dmin = __half22float2(*reinterpret_cast<const half2*>(&hdr.x));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    dsc[i] = dmin.x * small_int_to_float(static_cast<int>((sc >> (8 * i)) & 0xffu));
    dmn[i] = dmin.y * small_int_to_float(static_cast<int>((mn >> (8 * i)) & 0xffu));
  }
}

// What a sub-block adds to one output: the one rounding sequence both kernels use, so the dp4a and
// the tensor-core kernel give the same bits.
__device__ __forceinline__ float add_sub_block(float acc, int isum, float dsc, float dmn, float dx, float sx) {
  acc = fmaf(small_int_to_float(isum), dsc * dx, acc);  // |isum| <= 32 * 15 * 127
  return fmaf(-dmn, sx, acc);
}

// Sum the warps' partials red[warp][token][row] in order and write the tile (SW: silu(gate) * up).
template <int NMAX, bool SW>
__device__ void write_tile(const Int8MvArgs& a, const float* red, int64_t tile) {
  constexpr int kOut = SW ? kRows / 2 : kRows;
  for (int i = threadIdx.x; i < a.n * kOut; i += kWarps * 32) {
    const int c = i / kOut, rr = i - c * kOut;
    const int64_t row = tile * kOut + rr;
    if (row >= a.n_out) continue;
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) v += red[(k * NMAX + c) * kRows + rr];
    if constexpr (SW) {
      float u = 0.0f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) u += red[(k * NMAX + c) * kRows + rr + 8];
      v = v / (1.0f + expf(-v)) * u;  // the formula of the swiglu op (elementwise.cu)
    }
    a.y[c * a.y_stride + row] = v;
  }
}

// dp4a kernel, lane = row: lane (r, h) = (lane % 16, lane / 16) takes row r and sub-blocks 4h..4h+3
// of each step. NMAX: accumulators per lane (n <= NMAX). Cheapest for one token (no idle lanes).
template <int NMAX, bool SW>
__global__ void __launch_bounds__(kWarps * 32, 2) q4k_dp4a_kernel(Int8MvArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5;
  const int r = lane & 15, h = lane >> 4;
  const int64_t nb32 = a.K / 32;
  StepRing<SW> ring(a, smem);
  float* const red = ring.red;
  const int64_t my_tiles = ring.my_tiles;
  ring.prime();
  pdl_wait();  // the activations belong to the previous kernel
  pdl_trigger();

  for (int64_t j = 0; j < my_tiles; ++j) {
    const int64_t tile = blockIdx.x + j * gridDim.x;
    float acc[NMAX];
#pragma unroll
    for (int c = 0; c < NMAX; ++c) acc[c] = 0.0f;
    for (int m = 0; m < ring.cnt; ++m) {
      const uint8_t* blk = ring.next() + r * kBlockBytes;
      const int64_t s = ks + int64_t{kWarps} * m;  // super-block of the row
      float dsc[4], dmn[4];
      q4k_scales(blk, h, dsc, dmn);
      // Sub-block 2g (g = 0..3) is the low nibbles of qs[32g .. 32g+32), 2g+1 the high ones, element l
      // in byte l: word k of the masked bytes holds elements 4k..4k+3, the order of the int8 x.
      uint32_t wq[4][8];
#pragma unroll
      for (int g = 0; g < 2; ++g)
#pragma unroll
        for (int v = 0; v < 2; ++v) {
          const uint4 u = *reinterpret_cast<const uint4*>(blk + 16 + 64 * h + 32 * g + 16 * v);
          const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            wq[2 * g][4 * v + k] = words[k] & 0x0f0f0f0fu;
            wq[2 * g + 1][4 * v + k] = (words[k] >> 4) & 0x0f0f0f0fu;
          }
        }
      const int64_t xb = s * 8 + 4 * h;  // this lane's first 32-element block
#pragma unroll
      for (int c = 0; c < NMAX; ++c) {
        if (c >= a.n) break;  // warp-uniform
        const int4* xp = reinterpret_cast<const int4*>(a.xq + c * a.K + xb * 32);
        const float4* dp = reinterpret_cast<const float4*>(a.xds + c * nb32 + xb);
        const float4 d01 = __ldg(dp), d23 = __ldg(dp + 1);
        const float dx[4] = {d01.x, d01.z, d23.x, d23.z}, sx[4] = {d01.y, d01.w, d23.y, d23.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
          acc[c] = add_sub_block(acc[c], dot8(wq[i], __ldg(xp + 2 * i), __ldg(xp + 2 * i + 1)), dsc[i], dmn[i], dx[i],
                                 sx[i]);
      }
    }
    // Sub-blocks 0-3 + 4-7 of each step, then the warps in order.
#pragma unroll
    for (int c = 0; c < NMAX; ++c) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], 16);
    if (h == 0) {
#pragma unroll
      for (int c = 0; c < NMAX; ++c)
        if (c < a.n) red[(ks * NMAX + c) * kRows + r] = acc[c];
    }
    __syncthreads();
    write_tile<NMAX, SW>(a, red, tile);
    __syncthreads();  // red is rewritten by the next tile
  }
  cp_async_wait<0>();
}

__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// Tensor-core kernel for several tokens: one int8 mma.m16n8k32 per sub-block and 8 tokens gives the
// exact integer sums of 16 rows; lane (g, t) = (lane / 4, lane % 4) then holds rows g, g+8 and tokens
// 2t, 2t+1 of each n-tile and adds them with add_sub_block in the dp4a kernel's order (sub-blocks
// 0-3 and 4-7 in two accumulators, summed at the end of the tile), so its results are the dp4a
// kernel's bits. The k order inside a sub-block is permuted (lane t's fragment columns 4t..4t+3 and
// 16+4t..16+4t+3 hold elements 8t..8t+7, weights and activations alike): each lane loads 8 contiguous
// bytes of a row's codes and of a token's int8 x.
template <int NT, bool SW>
__global__ void __launch_bounds__(kWarps * 32, 2) q4k_mma_kernel(Int8MvArgs a) {
  constexpr int NMAX = NT * 8;
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t nb32 = a.K / 32;
  StepRing<SW> ring(a, smem);
  float* const red = ring.red;
  const int64_t my_tiles = ring.my_tiles;
  ring.prime();
  pdl_wait();
  pdl_trigger();

  for (int64_t j = 0; j < my_tiles; ++j) {
    const int64_t tile = blockIdx.x + j * gridDim.x;
    float acc[2][NT][4];  // [half][n-tile][(row g, tok 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)]
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[hh][nt][0] = acc[hh][nt][1] = acc[hh][nt][2] = acc[hh][nt][3] = 0.0f;
    for (int m = 0; m < ring.cnt; ++m) {
      const uint8_t* slot = ring.next();
      const uint8_t* b0 = slot + g * kBlockBytes;
      const uint8_t* b1 = slot + (g + 8) * kBlockBytes;
      const int64_t s = ks + int64_t{kWarps} * m;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float dsc0[4], dmn0[4], dsc1[4], dmn1[4];
        q4k_scales(b0, hh, dsc0, dmn0);
        q4k_scales(b1, hh, dsc1, dmn1);
#pragma unroll
        for (int gg = 0; gg < 2; ++gg) {  // qs group 2hh + gg: sub-blocks 4hh + 2gg (low) and + 1 (high)
          const uint2 w0 = *reinterpret_cast<const uint2*>(b0 + 16 + 32 * (2 * hh + gg) + 8 * t);
          const uint2 w1 = *reinterpret_cast<const uint2*>(b1 + 16 + 32 * (2 * hh + gg) + 8 * t);
#pragma unroll
          for (int hi = 0; hi < 2; ++hi) {
            const int i = 2 * gg + hi;  // sub-block 4hh + i
            const int sh = 4 * hi;
            const uint32_t a0 = (w0.x >> sh) & 0x0f0f0f0fu, a2 = (w0.y >> sh) & 0x0f0f0f0fu;
            const uint32_t a1 = (w1.x >> sh) & 0x0f0f0f0fu, a3 = (w1.y >> sh) & 0x0f0f0f0fu;
            const int64_t xb = s * 8 + 4 * hh + i;  // 32-element block
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              if (nt * 8 >= a.n) break;  // warp-uniform
              const int tok = nt * 8 + g;
              uint2 bx = make_uint2(0u, 0u);
              if (tok < a.n) bx = __ldg(reinterpret_cast<const uint2*>(a.xq + tok * a.K + xb * 32 + 8 * t));
              int d[4];
              mma_s8(d, a0, a1, a2, a3, bx.x, bx.y);
              const int c0 = nt * 8 + 2 * t;
              float2 s0 = make_float2(0.0f, 0.0f), s1 = s0;
              if (c0 < a.n) s0 = __ldg(a.xds + c0 * nb32 + xb);
              if (c0 + 1 < a.n) s1 = __ldg(a.xds + (c0 + 1) * nb32 + xb);
              float* ac = acc[hh][nt];
              ac[0] = add_sub_block(ac[0], d[0], dsc0[i], dmn0[i], s0.x, s0.y);
              ac[1] = add_sub_block(ac[1], d[1], dsc0[i], dmn0[i], s1.x, s1.y);
              ac[2] = add_sub_block(ac[2], d[2], dsc1[i], dmn1[i], s0.x, s0.y);
              ac[3] = add_sub_block(ac[3], d[3], dsc1[i], dmn1[i], s1.x, s1.y);
            }
          }
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + 2 * t + (e & 1), rr = g + (e >= 2 ? 8 : 0);
        if (c < a.n) red[(ks * NMAX + c) * kRows + rr] = acc[0][nt][e] + acc[1][nt][e];
      }
    __syncthreads();
    write_tile<NMAX, SW>(a, red, tile);
    __syncthreads();
  }
  cp_async_wait<0>();
}


size_t q8_bytes(int64_t n, int64_t K) { return (static_cast<size_t>(n * K) + 255) / 256 * 256; }

// Ring depth: 4 stages (2 blocks per SM fit: 8 x 4 x 16 x 144 + 8 x NMAX x 16 x 4 bytes of
// partials); benchmarks may override with HYSPEC_MV8_STAGES.
int ring_stages() {
  static const int stages = std::clamp(env_int("HYSPEC_MV8_STAGES", 4), 2, 6);
  return stages;
}

template <int NMAX, auto kernel>
cudaError_t launch(Int8MvArgs a, bool sw, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(kWarps) * ring_stages() * kRows * kBlockBytes +
                      static_cast<size_t>(kWarps) * NMAX * kRows * sizeof(float);
  static const cudaError_t attr_err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr_err != cudaSuccess) return attr_err;
  a.stages = ring_stages();
  const int64_t out = sw ? kRows / 2 : kRows, tiles = (a.n_out + out - 1) / out;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, 2 * int64_t{sm_count()})));
  return launch_pdl(kernel, grid, dim3(kWarps * 32), smem, stream, true, a);
}

template <bool SW>
cudaError_t launch_for_width(Int8MvArgs a, cudaStream_t stream) {
  // Widths up to HYSPEC_MV8_DP4A (default 4) take the dp4a kernel, wider ones the tensor cores; both
  // give the same bits, so the switch is a speed choice only.
  static const int dp4a_max = env_int("HYSPEC_MV8_DP4A", 4);
  const int n = a.n;
  if (n <= dp4a_max && n <= 4) {
    if (n == 1) return launch<1, q4k_dp4a_kernel<1, SW>>(a, SW, stream);
    return launch<4, q4k_dp4a_kernel<4, SW>>(a, SW, stream);
  }
  if (n <= 8) return launch<8, q4k_mma_kernel<1, SW>>(a, SW, stream);
  if (n <= 16) return launch<16, q4k_mma_kernel<2, SW>>(a, SW, stream);
  if (n <= 24) return launch<24, q4k_mma_kernel<3, SW>>(a, SW, stream);
  if constexpr (!SW) return launch<32, q4k_mma_kernel<4, false>>(a, false, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

bool int8_matvec_supported(const WeightView& w, int64_t n) {
  return w.int8_matvec && w.type == GgmlType::Q4_K && w.n_in % 256 == 0 && n >= 1 && n <= kInt8MvMaxWidth;
}

size_t int8_matvec_scratch_bytes(const WeightView& w, int64_t n) {
  return q8_bytes(n, w.n_in) + static_cast<size_t>(n * (w.n_in / 32)) * sizeof(float2);
}

cudaError_t int8_matvec_launch(const WeightView& w, const uint8_t* up, Mat x, Mat y, void* scratch,
                               cudaStream_t stream) {
  if (!int8_matvec_supported(w, x.rows)) return cudaErrorInvalidValue;
  auto* xq = static_cast<int8_t*>(scratch);
  auto* xds = reinterpret_cast<float2*>(static_cast<char*>(scratch) + q8_bytes(x.rows, w.n_in));
  const int64_t blocks32 = x.rows * (w.n_in / 32);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((blocks32 + 7) / 8, 1024)));
  const cudaError_t err = launch_pdl(quantize_q8_kernel, grid, dim3(256), 0, stream, true,
                                     static_cast<const float*>(x.data), x.stride, x.rows, w.n_in, xq, xds);
  if (err != cudaSuccess) return err;
  Int8MvArgs a{w.data, up, w.row_bytes, w.n_out, w.n_in, xq, xds, static_cast<int>(x.rows), 0, y.data, y.stride};
  return up ? launch_for_width<true>(a, stream) : launch_for_width<false>(a, stream);
}

}  // namespace hyspec::cuda
