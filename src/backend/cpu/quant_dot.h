// Dot products of a weight row in any GGML type with an activation row, for the CPU matmul.
// Activations are first "prepared" once per matmul for the weight type (e.g. quantized to Q8_0 /
// Q8_K blocks so the inner loop is an int8 dot, as llama.cpp does), then dotted against many rows.
// AVX2/FMA paths are selected at run time; a scalar path runs everywhere and is the reference.
#pragma once
#include <cstddef>
#include <cstdint>

#include "format/ggml_types.h"

namespace hyspec::cpu {

// Bytes of one prepared activation row of n elements for weights of type wt.
size_t prepared_row_bytes(GgmlType wt, int64_t n);
// Prepare one activation row (n f32 values) for dots with rows of type wt.
void prepare_activation_row(GgmlType wt, const float* x, int64_t n, void* out);
// Σ_i W[i] x[i] over n elements: w_row in type wt, act prepared by prepare_activation_row.
float vec_dot(GgmlType wt, const void* w_row, const void* act, int64_t n);
// True when vec_dot supports wt (every type ggml_type_traits marks dequantizable).
bool vec_dot_supported(GgmlType wt);
// Which SIMD path vec_dot uses on this machine ("avx2" or "scalar").
const char* vec_dot_isa();

}  // namespace hyspec::cpu
