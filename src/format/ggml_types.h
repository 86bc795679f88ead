// GGML tensor element types as stored in GGUF: ids, block geometry, names.
// A weight row of n elements occupies n / block_size * type_size bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "util/status.h"

namespace hyspec {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct GgmlTypeTraits {
  std::string_view name;
  uint32_t block_size = 0;  // elements per block (0: unknown id)
  uint32_t type_size = 0;   // bytes per block
  bool dequantizable = false;  // hyspec can turn it into f32 (every type a model weight may use)
};

// Traits for a raw id; block_size == 0 when the id is not a known GGML type.
GgmlTypeTraits ggml_type_traits(uint32_t id);
inline GgmlTypeTraits ggml_type_traits(GgmlType t) { return ggml_type_traits(static_cast<uint32_t>(t)); }
inline std::string_view ggml_type_name(GgmlType t) { return ggml_type_traits(t).name; }

// Bytes of a row of n elements; error when n is not a multiple of the block size.
Result<size_t> ggml_row_bytes(GgmlType t, int64_t n);

}  // namespace hyspec
