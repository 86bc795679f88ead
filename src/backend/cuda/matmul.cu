// Matmul over GGML weight types, and embedding lookup.
//
// y[t][r] = sum_i W[r][i] x[t][i]   W: [n_out, K] in its stored type, x: [n, K] f32, y: [n, n_out] f32.
//
// Widths n <= 32 (decode, speculative verify): the tensor-core matvec `mmv_kernel`. A warp owns 16
// weight rows; each step, its 4 lane-quads each decode one 32-element chunk of those rows straight
// from the quant blocks into f16 registers (the A fragments of mma.m16n8k16) and multiply them with
// up to 32 activation rows (B fragments, 8 tokens per n-tile, read as f32 and converted on the fly in
// the type's chunk order). Every weight byte is read once per call whatever n is; the warps of a
// block split K and reduce through shared memory. One launch per matmul.
// Widths n > 32 (prefill): activations converted to f16 in chunk order (prep_activations_kernel),
// weight row tiles decoded to f16 (dequant_tile_kernel), multiplied with cuBLAS (f32 accumulate).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_blocks.cuh"

namespace hyspec::cuda {
namespace {

constexpr int kMmvMaxWidth = 32;
constexpr int kFusedWidth = 4;  // widths up to this read f32 activations directly (no prep launch)
constexpr int kRowsPerWarp = 16;

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
    default: return false;
  }
}

// The tensor-core paths need whole 32-element chunks; F32 weights always take the exact path.
bool fast_path(const WeightView& w) { return w.n_in % 32 == 0 && w.type != GgmlType::F32; }

int sm_count() {
  static int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 1;
  }();
  return n;
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// ---- activations -> f16 in chunk order -------------------------------------------------------
// xh[r][j] = x[r][block(j) + perm(j % kBlock)]; bytes: read 4K, write 2K per row.
template <class T>
__global__ void prep_activations_kernel(const float* __restrict__ x, int64_t x_stride, int64_t rows, int64_t K,
                                        __half* __restrict__ xh) {
  const int64_t half_k = K / 2;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < rows * half_k;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / half_k, j = (idx % half_k) * 2;
    const int64_t blk = j / T::kBlock * T::kBlock;
    const int jj = static_cast<int>(j % T::kBlock);
    const float* xr = x + r * x_stride + blk;
    reinterpret_cast<half2*>(xh + r * K)[j / 2] = __floats2half2_rn(xr[T::perm(jj)], xr[T::perm(jj + 1)]);
  }
}

__device__ __forceinline__ void mma_16816(float (&d)[4], half2 a0, half2 a1, half2 a2, half2 a3, half2 b0, half2 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(as_u32(a0)), "r"(as_u32(a1)), "r"(as_u32(a2)), "r"(as_u32(a3)), "r"(as_u32(b0)), "r"(as_u32(b1)));
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
  int rg;                       // row groups (of 16 rows) per block; the other warps split K
  float* y;
  int64_t y_stride;
};

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) { return as_u32(__floats2half2_rn(lo, hi)); }

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
      b[2 * i] = pack_h2(f.x, f.z), b[2 * i + 1] = pack_h2(f.y, f.w);
    } else {
      b[2 * i] = pack_h2(f.x, f.y), b[2 * i + 1] = pack_h2(f.z, f.w);
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
        make_uint4(pack_h2(v[0], v[1]), pack_h2(v[2], v[3]), pack_h2(v[4], v[5]), pack_h2(v[6], v[7]));
  }
}

// Tensor-core matvec, see the top of the file. A block has `rg` row groups of 16 rows; its other
// warps split K (warp = rg-index + rg * k-split). Each step a warp decodes 4 chunks (one per
// lane-quad) of its 16 rows, while the raw bytes of its next step are already in flight.
// Per call: bytes = W once + n*K*4 per block (activations, L2/L1) + n*n_out*4; FLOPs =
// 2*n_out*K*8*NT (padded to n-tiles of 8) on the tensor cores. Decoding costs ~2 ALU ops per
// weight, so the kernel is bound by the weight bytes for n <= 32.
// Lane (g, t) = (lane/4, lane%4): A rows g and g+8 of the warp's 16, chunk 4*step + t; B token 8*nt + g.
template <class T, int NT>
__global__ void __launch_bounds__(256) mmv_kernel(MmvArgs a) {
  extern __shared__ float red[];  // [n_warps][NT*4][32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int RG = a.rg, KS = n_warps / RG, rg = warp % RG, ks = warp / RG;
  const int g = lane >> 2, t = lane & 3;
  const uint8_t* w = a.w;
  const float* x = a.x;
  float* y = a.y;
  int n = a.n;
  if (a.expert_ids) {
    const int b = blockIdx.y;
    w += static_cast<size_t>(a.expert_ids[b]) * a.expert_bytes;
    x += static_cast<int64_t>(b / a.x_div) * a.x_stride;
    y += b * a.y_stride;
    n = 1;
  }
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * RG + rg) * kRowsPerWarp;
  const uint8_t* w0 = w + min(row0 + g, a.n_out - 1) * a.row_bytes;
  const uint8_t* w1 = w + min(row0 + g + 8, a.n_out - 1) * a.row_bytes;
  const int64_t n_chunks = a.K / 32, n_steps = (n_chunks + 3) / 4;

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

  typename T::Raw r0, r1;
  if (ks < n_steps && 4 * ks + t < n_chunks) {
    T::load(w0, 4 * ks + t, r0);
    T::load(w1, 4 * ks + t, r1);
  }
  for (int64_t s = ks; s < n_steps; s += KS) {
    const int64_t c = 4 * s + t, c_next = c + 4 * KS;
    const bool valid = c < n_chunks;
    typename T::Raw q0, q1;
    if (s + KS < n_steps && c_next < n_chunks) {
      T::load(w0, c_next, q0);
      T::load(w1, c_next, q1);
    }
    half2 A0[16], A1[16];
    if (valid) {
      T::decode(w0, r0, c, A0);
      T::decode(w1, r1, c, A1);
    } else {
#pragma unroll
      for (int m = 0; m < 16; ++m) A0[m] = A1[m] = __float2half2_rn(0.0f);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt * 8 >= n) break;  // warp-uniform
      const int tok = nt * 8 + g;
      uint32_t b[16];
      if (a.xh) {
        const uint4* piece = reinterpret_cast<const uint4*>(a.xh) + (s * 4 * a.n_pad + tok) * 4 + t;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint4 v = piece[k * a.n_pad * 4];
          b[4 * k] = v.x, b[4 * k + 1] = v.y, b[4 * k + 2] = v.z, b[4 * k + 3] = v.w;
        }
      } else if (tok < n && valid) {
        load_b<T>(x + tok * a.x_stride, c, b);
      } else {
#pragma unroll
        for (int k = 0; k < 16; ++k) b[k] = 0u;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i)
        mma_16816(acc[nt], A0[2 * i], A1[2 * i], A0[2 * i + 1], A1[2 * i + 1], as_half2(b[2 * i]),
                  as_half2(b[2 * i + 1]));
    }
    r0 = q0;
    r1 = q1;
  }

#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * NT * 4 + nt * 4 + e) * 32 + lane] = acc[nt][e];
  __syncthreads();
  if (ks != 0) return;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = 0.0f;
      for (int k = 0; k < KS; ++k) v += red[((k * RG + rg) * NT * 4 + nt * 4 + e) * 32 + lane];
      const int64_t row = row0 + g + (e >= 2 ? 8 : 0);
      const int tok = nt * 8 + 2 * t + (e & 1);
      if (row < a.n_out && tok < n) y[tok * a.y_stride + row] = v;
    }
  }
}

// Exact f32 path: F32 weights (norm-sized vectors, MoE routers: exact like the CPU, so expert
// choices agree) and float rows that are not whole 32-element chunks. A warp per row, 8 tokens per
// pass over the row: W is read ceil(n/8) times (from L2 after the first).
template <class T>
__global__ void matmul_exact_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_out, int64_t K,
                                    const float* __restrict__ x, int64_t x_stride, int64_t n, float* y,
                                    int64_t y_stride, const int32_t* __restrict__ expert_ids, size_t expert_bytes,
                                    int x_div) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (row >= n_out) return;
  if (expert_ids) {  // batched experts: blockIdx.y = batch b, one activation row each
    const int b = blockIdx.y;
    w += static_cast<size_t>(expert_ids[b]) * expert_bytes;
    x += static_cast<int64_t>(b / x_div) * x_stride;
    y += b * y_stride;
    n = 1;
  }
  const uint8_t* wr = w + row * row_bytes;
  for (int64_t t0 = 0; t0 < n; t0 += 8) {
    const int tn = n - t0 < 8 ? static_cast<int>(n - t0) : 8;
    float acc[8] = {};
    for (int64_t i = lane; i < K; i += 32) {
      const float wv = T::value(wr, i);
#pragma unroll
      for (int t = 0; t < 8; ++t)
        if (t < tn) acc[t] += wv * x[(t0 + t) * x_stride + i];
    }
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      float s = acc[t];
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0 && t < tn) y[(t0 + t) * y_stride + row] = s;
    }
  }
}

// Prefill: rows [r0, r0+rows) decoded to f16 in chunk order. Bytes: read the tile once, write 2 B/elem.
template <class T>
__global__ void dequant_tile_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t r0, int64_t rows,
                                    int64_t n_chunks, __half* __restrict__ out) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < rows * n_chunks;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / n_chunks, c = idx % n_chunks;
    half2 a[16];
    T::chunk(w + (r0 + r) * row_bytes, c, a);
    uint4* dst = reinterpret_cast<uint4*>(out + (r * n_chunks + c) * 32);
    const uint32_t* v = reinterpret_cast<const uint32_t*>(a);
#pragma unroll
    for (int k = 0; k < 4; ++k) dst[k] = make_uint4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
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
cudaError_t prep_activations(const float* x, int64_t x_stride, int64_t rows, int64_t K, __half* xh,
                             cudaStream_t stream) {
  const int64_t total = rows * K / 2;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(total, 256), 65535));
  prep_activations_kernel<T><<<blocks, 256, 0, stream>>>(x, x_stride, rows, K, xh);
  return cudaGetLastError();
}

template <class T, int NT>
cudaError_t launch_mmv(const MmvArgs& a, unsigned grid_y, int n_warps, cudaStream_t stream) {
  const int64_t rows_per_block = int64_t{kRowsPerWarp} * a.rg;
  const dim3 grid(static_cast<unsigned>((a.n_out + rows_per_block - 1) / rows_per_block), grid_y);
  const size_t smem = static_cast<size_t>(n_warps) * NT * 4 * 32 * sizeof(float);
  mmv_kernel<T, NT><<<grid, n_warps * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// Blocks of 8 warps: one row group per block, 8 warps over K (most warps in flight for the weight
// stream). Row groups > 1 share activation chunks through L1; measured no faster on H100 at n <= 32
// (docs/CUDA_NOTES.md), kept for benchmarking through HYSPEC_MMV_RG.
struct MmvShape {
  int rg, n_warps;
};
MmvShape mmv_shape(int64_t n_out, int64_t K, int64_t n, int64_t grid_y) {
  static const int forced_rg = env_int("HYSPEC_MMV_RG", 0);
  int rg = forced_rg > 0 ? forced_rg : 1;
  while (rg > 1 && (n_out + 16 * rg - 1) / (16 * rg) * grid_y < sm_count()) rg /= 2;
  const int64_t steps = (K / 32 + 3) / 4;
  const int ks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(8 / rg, steps)));
  return {rg, rg * ks};
}

// x as 16-byte aligned rows: x itself, or a copy in `staging`.
Mat aligned_rows(Mat x, float* staging, cudaStream_t stream, cudaError_t& err) {
  if ((reinterpret_cast<uintptr_t>(x.data) & 15) == 0 && x.stride % 4 == 0) return x;
  err = cudaMemcpy2DAsync(staging, x.cols * sizeof(float), x.data, x.stride * sizeof(float), x.cols * sizeof(float),
                          x.rows, cudaMemcpyDeviceToDevice, stream);
  return Mat{staging, x.rows, x.cols, x.cols};
}

template <class T>
cudaError_t mmv(const WeightView& w, Mat x, Mat y, void* scratch, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  const MmvShape sh = mmv_shape(w.n_out, w.n_in, x.rows, 1);
  MmvArgs a{w.data, w.row_bytes, 0, nullptr, 1, w.n_out, w.n_in, x.data, x.stride, nullptr, 0,
            static_cast<int>(x.rows), sh.rg, y.data, y.stride};
  if (x.rows <= kFusedWidth) {
    const Mat xa = aligned_rows(x, static_cast<float*>(scratch), stream, err);
    if (err != cudaSuccess) return err;
    a.x = xa.data, a.x_stride = xa.stride;
  } else {
    a.n_pad = (x.rows + 7) / 8 * 8;
    a.xh = static_cast<const __half*>(scratch);
    const int64_t pieces = (w.n_in / 32 + 3) / 4 * 4 * a.n_pad * 4;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(pieces, 256), 4096));
    prep_fragments_kernel<T><<<blocks, 256, 0, stream>>>(x.data, x.stride, x.rows, a.n_pad, w.n_in,
                                                         static_cast<__half*>(scratch));
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  if (x.rows <= 8) return launch_mmv<T, 1>(a, 1, sh.n_warps, stream);
  if (x.rows <= 16) return launch_mmv<T, 2>(a, 1, sh.n_warps, stream);
  return launch_mmv<T, 4>(a, 1, sh.n_warps, stream);
}

// Rows of the f16 weight tile kept for cuBLAS: at most kTileBytes.
constexpr size_t kTileBytes = size_t(64) << 20;

int64_t tile_rows(const WeightView& w) {
  const int64_t r = static_cast<int64_t>(kTileBytes / (static_cast<size_t>(w.n_in) * 2));
  return std::max<int64_t>(16, std::min<int64_t>(r / 16 * 16, w.n_out));
}

template <class T>
cudaError_t gemm(const WeightView& w, Mat x, Mat y, __half* xh, __half* tile, cublasHandle_t cublas,
                 cudaStream_t stream) {
  cudaError_t err = prep_activations<T>(x.data, x.stride, x.rows, w.n_in, xh, stream);
  if (err != cudaSuccess) return err;
  const int64_t n_chunks = w.n_in / 32, step = tile_rows(w);
  const float one = 1.0f, zero = 0.0f;
  for (int64_t r0 = 0; r0 < w.n_out; r0 += step) {
    const int64_t rows = std::min(step, w.n_out - r0);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(rows * n_chunks, 256), 65535));
    dequant_tile_kernel<T><<<blocks, 256, 0, stream>>>(w.data, w.row_bytes, r0, rows, n_chunks, tile);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    // Column-major view: C[rows x n] = tile^T[rows x K] * xh[K x n], C = y + r0 with ldc = y.stride.
    const cublasStatus_t st = cublasGemmEx(
        cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(x.rows), static_cast<int>(w.n_in),
        &one, tile, CUDA_R_16F, static_cast<int>(w.n_in), xh, CUDA_R_16F, static_cast<int>(w.n_in), &zero,
        y.data + r0, CUDA_R_32F, static_cast<int>(y.stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  }
  return cudaSuccess;
}

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

bool matmul_type_supported(GgmlType t) {
  return with_type(t, [](auto) {});
}

size_t matmul_scratch_bytes(const WeightView& w, int64_t n) {
  if (!fast_path(w)) return 0;
  if (n <= kFusedWidth) return static_cast<size_t>(n * w.n_in) * sizeof(float);  // staging of unaligned x
  if (n <= kMmvMaxWidth) return static_cast<size_t>((n + 7) / 8 * 8) * ((w.n_in / 32 + 3) / 4) * 128 * 2;
  return align_up(static_cast<size_t>(n * w.n_in) * 2, 256) + static_cast<size_t>(tile_rows(w) * w.n_in) * 2;
}

cudaError_t matmul_launch(const WeightView& w, Mat x, Mat y, MatmulScratch scratch, cublasHandle_t cublas,
                          cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  if (x.rows == 0) return cudaSuccess;
  if (!fast_path(w)) {
    with_type(w.type, [&](auto tag) {
      using T = decltype(tag);
      const unsigned blocks = blocks_for(w.n_out * 32, 128);
      matmul_exact_kernel<T><<<blocks, 128, 0, stream>>>(w.data, w.row_bytes, w.n_out, w.n_in, x.data, x.stride,
                                                          x.rows, y.data, y.stride, nullptr, 0, 1);
      err = cudaGetLastError();
    });
    return err;
  }
  auto* xh = static_cast<__half*>(scratch.data);
  with_type(w.type, [&](auto tag) {
    using T = decltype(tag);
    if (x.rows <= kMmvMaxWidth) {
      err = mmv<T>(w, x, y, scratch.data, stream);
    } else {
      auto* tile = reinterpret_cast<__half*>(static_cast<char*>(scratch.data) +
                                             align_up(static_cast<size_t>(x.rows * w.n_in) * 2, 256));
      err = gemm<T>(w, x, y, xh, tile, cublas, stream);
    }
  });
  return err;
}

size_t matmul_experts_scratch_bytes(const WeightView& w, int64_t n_x_rows) {
  return static_cast<size_t>(n_x_rows * w.n_in) * sizeof(float);  // staging of unaligned x
}

cudaError_t matmul_experts_launch(const WeightView& w, const int32_t* expert_ids, int64_t n_batch, int x_div, Mat x,
                                  Mat y, MatmulScratch scratch, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  if (n_batch == 0) return cudaSuccess;
  with_type(w.type, [&](auto tag) {
    using T = decltype(tag);
    err = cudaSuccess;
    if (!fast_path(w)) {  // F32 experts (dequantized models): exact, like the CPU
      const int64_t slice = 65535 / x_div * x_div;
      for (int64_t b0 = 0; b0 < n_batch && err == cudaSuccess; b0 += slice) {
        const int64_t nb = std::min<int64_t>(slice, n_batch - b0);
        const dim3 grid(blocks_for(w.n_out * 32, 128), static_cast<unsigned>(nb));
        matmul_exact_kernel<T><<<grid, 128, 0, stream>>>(w.data, w.row_bytes, w.n_out, w.n_in,
                                                         x.data + (b0 / x_div) * x.stride, x.stride, 1,
                                                         y.data + b0 * y.stride, y.stride, expert_ids + b0,
                                                         static_cast<size_t>(w.n_out) * w.row_bytes, x_div);
        err = cudaGetLastError();
      }
      return;
    }
    const Mat xa = aligned_rows(x, static_cast<float*>(scratch.data), stream, err);
    if (err != cudaSuccess) return;
    // gridDim.y is at most 65535: launch x_div-aligned slices of the batch.
    const int64_t slice = 65535 / x_div * x_div;
    for (int64_t b0 = 0; b0 < n_batch && err == cudaSuccess; b0 += slice) {
      const int64_t nb = std::min<int64_t>(slice, n_batch - b0);
      const MmvShape sh = mmv_shape(w.n_out, w.n_in, 1, nb);
      MmvArgs a{w.data,  w.row_bytes, static_cast<size_t>(w.n_out) * w.row_bytes, expert_ids + b0, x_div, w.n_out,
                w.n_in,  xa.data + (b0 / x_div) * xa.stride, xa.stride, nullptr, 0, 1, sh.rg,
                y.data + b0 * y.stride, y.stride};
      err = launch_mmv<T, 1>(a, static_cast<unsigned>(nb), sh.n_warps, stream);
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
