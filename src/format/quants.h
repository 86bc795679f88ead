// Reference dequantization (and quantization where hyspec writes the type) of GGML block types.
// Bit-exact with gguf-py's numpy dequantization (../shared/fixtures/quants).
#pragma once
#include <cstdint>

#include "format/ggml_types.h"
#include "util/status.h"

namespace hyspec {

// dst[0..n) = dequantized src (n elements, a multiple of the type's block size).
// Errors on types hyspec cannot dequantize and on n not a multiple of the block size.
Status dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Quantize n f32 values (multiple of the block size) into dst (ggml_row_bytes(type, n) bytes).
// Supported: F32, F16, BF16, Q8_0, Q4_0 (writer, converter and tests use these); others error.
Status quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace hyspec
