// Matmul over GGML weight types, and embedding lookup.
//
// y[t][r] = sum_i W[r][i] x[t][i]   W: [n_out, K] in its stored type, x: [n, K] f32, y: [n, n_out] f32.
//
// Widths n <= 32 (decode, speculative verify): the tensor-core matvec `mmv_kernel`. A warp owns 16
// weight rows; each step, its 4 lane-quads each decode one 32-element chunk of those rows straight
// from the quant blocks into f16 registers (the A fragments of mma.m16n8k16) and multiply them with
// up to 32 activation rows (B fragments, 8 tokens per n-tile). Every weight byte is read once per
// call whatever n is; the warps of a block split K and reduce through shared memory.
// Activations are first converted to f16 in the per-type chunk order (prep_activations_kernel).
// Widths n > 32 (prefill): weight row tiles are decoded to f16 (dequant_tile_kernel) and multiplied
// with cuBLAS (f16 inputs, f32 accumulate).
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_blocks.cuh"

namespace hyspec::cuda {
namespace {

constexpr int kMmvMaxWidth = 32;
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
  const __half* xh;             // [n, K] f16, chunk order
  int n;                        // tokens (<= 32)
  float* y;
  int64_t y_stride;
};

// Tensor-core matvec, see the top of the file. Per call: bytes = W once + n*K*2 (f16 activations,
// re-read per block from L2) + n*n_out*4; FLOPs = 2*n_out*K*8*NT (padded to n-tiles of 8), which the
// tensor cores absorb: decoding a weight costs ~2 ALU ops per element, so the kernel is bound by the
// weight bytes for every n <= 32.
// Lane (g, t) = (lane/4, lane%4): A rows g and g+8 of the warp's 16, chunk 4*step + t; B token 8*nt + g.
template <class T, int NT>
__global__ void __launch_bounds__(512) mmv_kernel(MmvArgs a) {
  extern __shared__ float red[];  // [n_warps][NT*4][32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const uint8_t* w = a.w;
  const __half* xh = a.xh;
  float* y = a.y;
  int n = a.n;
  if (a.expert_ids) {
    const int b = blockIdx.y;
    w += static_cast<size_t>(a.expert_ids[b]) * a.expert_bytes;
    xh += static_cast<int64_t>(b / a.x_div) * a.K;
    y += b * a.y_stride;
    n = 1;
  }
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRowsPerWarp;
  const uint8_t* w0 = w + min(row0 + g, a.n_out - 1) * a.row_bytes;
  const uint8_t* w1 = w + min(row0 + g + 8, a.n_out - 1) * a.row_bytes;
  const int64_t n_chunks = a.K / 32, n_steps = (n_chunks + 3) / 4;

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

  for (int64_t s = warp; s < n_steps; s += n_warps) {
    const int64_t c = 4 * s + t;
    half2 A0[16], A1[16];
    if (c < n_chunks) {
      T::chunk(w0, c, A0);
      T::chunk(w1, c, A1);
    } else {
#pragma unroll
      for (int m = 0; m < 16; ++m) A0[m] = A1[m] = __float2half2_rn(0.0f);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt * 8 >= n) break;  // warp-uniform
      const int tok = nt * 8 + g;
      uint4 B[4] = {};
      if (tok < n && c < n_chunks) {
        const uint4* src = reinterpret_cast<const uint4*>(xh + tok * a.K + c * 32);
#pragma unroll
        for (int k = 0; k < 4; ++k) B[k] = src[k];
      }
      const uint32_t* b = reinterpret_cast<const uint32_t*>(B);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        mma_16816(acc[nt], A0[2 * i], A1[2 * i], A0[2 * i + 1], A1[2 * i + 1], as_half2(b[2 * i]),
                  as_half2(b[2 * i + 1]));
    }
  }

#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * NT * 4 + nt * 4 + e) * 32 + lane] = acc[nt][e];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = 0.0f;
      for (int wi = 0; wi < n_warps; ++wi) v += red[(wi * NT * 4 + nt * 4 + e) * 32 + lane];
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
                                    int64_t y_stride) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (row >= n_out) return;
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
  const dim3 grid(static_cast<unsigned>((a.n_out + kRowsPerWarp - 1) / kRowsPerWarp), grid_y);
  const size_t smem = static_cast<size_t>(n_warps) * NT * 4 * 32 * sizeof(float);
  mmv_kernel<T, NT><<<grid, n_warps * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

// Enough warps in flight to cover memory latency, without more warps than K steps.
int mmv_warps(int64_t n_out, int64_t K, int64_t grid_y) {
  const int64_t blocks = (n_out + kRowsPerWarp - 1) / kRowsPerWarp * grid_y;
  const int64_t steps = (K / 32 + 3) / 4;
  int64_t w = (static_cast<int64_t>(sm_count()) * 32 + blocks - 1) / blocks;
  w = std::clamp<int64_t>(w, 4, 16);
  return static_cast<int>(std::max<int64_t>(1, std::min(w, steps)));
}

template <class T>
cudaError_t mmv(const WeightView& w, Mat x, Mat y, __half* xh, cudaStream_t stream) {
  cudaError_t err = prep_activations<T>(x.data, x.stride, x.rows, w.n_in, xh, stream);
  if (err != cudaSuccess) return err;
  MmvArgs a{w.data, w.row_bytes, 0, nullptr, 1, w.n_out, w.n_in, xh, static_cast<int>(x.rows), y.data, y.stride};
  const int n_warps = mmv_warps(w.n_out, w.n_in, 1);
  if (x.rows <= 8) return launch_mmv<T, 1>(a, 1, n_warps, stream);
  if (x.rows <= 16) return launch_mmv<T, 2>(a, 1, n_warps, stream);
  return launch_mmv<T, 4>(a, 1, n_warps, stream);
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
  size_t bytes = align_up(static_cast<size_t>(n * w.n_in) * 2, 256);
  if (n > kMmvMaxWidth) bytes += static_cast<size_t>(tile_rows(w) * w.n_in) * 2;
  return bytes;
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
                                                            x.rows, y.data, y.stride);
      err = cudaGetLastError();
    });
    return err;
  }
  auto* xh = static_cast<__half*>(scratch.data);
  with_type(w.type, [&](auto tag) {
    using T = decltype(tag);
    if (x.rows <= kMmvMaxWidth) {
      err = mmv<T>(w, x, y, xh, stream);
    } else {
      auto* tile = reinterpret_cast<__half*>(static_cast<char*>(scratch.data) +
                                             align_up(static_cast<size_t>(x.rows * w.n_in) * 2, 256));
      err = gemm<T>(w, x, y, xh, tile, cublas, stream);
    }
  });
  return err;
}

size_t matmul_experts_scratch_bytes(const WeightView& w, int64_t n_x_rows) {
  return align_up(static_cast<size_t>(n_x_rows * w.n_in) * 2, 256);
}

cudaError_t matmul_experts_launch(const WeightView& w, const int32_t* expert_ids, int64_t n_batch, int x_div, Mat x,
                                  Mat y, MatmulScratch scratch, cudaStream_t stream) {
  cudaError_t err = cudaErrorInvalidValue;
  if (n_batch == 0) return cudaSuccess;
  auto* xh = static_cast<__half*>(scratch.data);
  with_type(w.type, [&](auto tag) {
    using T = decltype(tag);
    err = prep_activations<T>(x.data, x.stride, x.rows, w.n_in, xh, stream);
    if (err != cudaSuccess) return;
    const int n_warps = mmv_warps(w.n_out, w.n_in, n_batch);
    // gridDim.y is at most 65535: launch x_div-aligned slices of the batch.
    const int64_t slice = 65535 / x_div * x_div;
    for (int64_t b0 = 0; b0 < n_batch && err == cudaSuccess; b0 += slice) {
      const int64_t nb = std::min<int64_t>(slice, n_batch - b0);
      MmvArgs a{w.data, w.row_bytes, static_cast<size_t>(w.n_out) * w.row_bytes, expert_ids + b0, x_div,
                w.n_out, w.n_in, xh + (b0 / x_div) * w.n_in, 1, y.data + b0 * y.stride, y.stride};
      err = launch_mmv<T, 1>(a, static_cast<unsigned>(nb), n_warps, stream);
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
