// Dot products of a weight row in any GGML type with an activation row, for the CPU matmul.
// Activations are first "prepared" once per matmul for the weight type (e.g. quantized to Q8_0 /
// Q8_K blocks so the inner loop is an int8 dot, as llama.cpp does), then dotted against many rows.
// AVX2+FMA+F16C paths are selected at run time; a scalar path runs everywhere and is the reference.
// Thread-safe: all state is immutable after first use.
#pragma once
#include <cstddef>
#include <cstdint>

#include "format/ggml_types.h"

namespace hyspec::cpu {

// n is a multiple of wt's block size (ggml_row_bytes checks it when a weight is bound).

// Bytes of one prepared activation row of n elements for weights of type wt (0: unsupported).
size_t prepared_row_bytes(GgmlType wt, int64_t n);
// Prepare one activation row (n f32 values) for dots with rows of type wt. out: 4-byte aligned.
// F32/F16/BF16 weights: a copy of x. 32-blocks: Q8_0 (Q8_1 for Q4_1/Q5_1). 256-blocks: Q8_K.
// Rounding follows llama.cpp's quantize_row_q8_0/q8_1/q8_K reference, so dots equal llama.cpp's.
void prepare_activation_row(GgmlType wt, const float* x, int64_t n, void* out);
// Σ_i W[i] x[i] over n elements: w_row in type wt, act prepared by prepare_activation_row.
// NaN for an unsupported type.
float vec_dot(GgmlType wt, const void* w_row, const void* act, int64_t n);
// The matmul's inner loop: dots of `rows` weight rows (w_stride bytes apart) with `cols` prepared
// activation rows (act_stride bytes apart), out[c * out_stride + r] = W_r · act_c. Types with a
// tile kernel (Q8_0 on AVX2) load each weight block once per few activation rows and each
// activation block once per few weight rows; the others run vec_dot per pair. Unsupported: no-op.
void vec_dot_tile(GgmlType wt, const void* w, size_t w_stride, const void* act, size_t act_stride, int64_t n,
                  int rows, int cols, float* out, int64_t out_stride);
// True when vec_dot supports wt (every type ggml_type_traits marks dequantizable).
bool vec_dot_supported(GgmlType wt);
// Which SIMD path the CPU kernels use on this machine ("avx512", "avx2" or "scalar").
const char* vec_dot_isa();

// Explicit paths, for tests and benchmarks that compare them on one machine. Avx512 is the Avx2
// path with AVX-512 VNNI tile kernels where they exist (Q8_0); everything else runs AVX2 code.
enum class DotIsa { Scalar, Avx2, Avx512 };
// The path the kernels use (chosen once, at first use): the best this CPU runs, capped by
// HYSPEC_CPU_ISA=scalar|avx2 when set.
DotIsa detect_dot_isa();
// True when this CPU and build can run `isa`.
bool dot_isa_available(DotIsa isa);
// vec_dot on a chosen path; NaN when the path is unavailable or wt unsupported.
float vec_dot_on(DotIsa isa, GgmlType wt, const void* w_row, const void* act, int64_t n);
// vec_dot_tile and prepare_activation_row on a chosen path (no-op when it is unavailable). Every
// path prepares bit-identical activations.
void vec_dot_tile_on(DotIsa isa, GgmlType wt, const void* w, size_t w_stride, const void* act, size_t act_stride,
                     int64_t n, int rows, int cols, float* out, int64_t out_stride);
void prepare_activation_row_on(DotIsa isa, GgmlType wt, const float* x, int64_t n, void* out);

}  // namespace hyspec::cpu
