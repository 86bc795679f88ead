// Activation preparation and run-time dispatch of the CPU dot kernels (quant_dot_scalar.cpp,
// quant_dot_avx2.cpp). Preparation is O(n) once per matmul row against O(n * n_out) dot work, but
// with small weights (n_out of a few hundred) a scalar quantizer (a libm roundf per element) costs
// as much as the dots, so Q8_0 and Q8_K have AVX2 quantizers, bit-identical to the scalar ones
// (quantize_row's Q8_0 and quantize_q8_k below); Q8_1 (Q4_1/Q5_1 weights) stays scalar.
#include "backend/cpu/quant_dot.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>

#include "backend/cpu/quant_dot_kernels.h"
#include "format/quants.h"
#include "util/half.h"

namespace hyspec::cpu {
namespace {

enum class ActKind { None, F32, Q8_0, Q8_1, Q8_K };

// Which activation format each weight type dots against (llama.cpp's vec_dot_type, except that
// F16/BF16 weights keep f32 activations: converting the activation would only lose precision).
ActKind act_kind(GgmlType wt) {
  switch (wt) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16: return ActKind::F32;
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q8_0:
    case GgmlType::IQ4_NL:
    case GgmlType::MXFP4: return ActKind::Q8_0;
    case GgmlType::Q4_1:
    case GgmlType::Q5_1: return ActKind::Q8_1;  // these need Σx per block for their offset m
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ1_S:
    case GgmlType::IQ1_M:
    case GgmlType::IQ2_XXS:
    case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S:
    case GgmlType::IQ3_XXS:
    case GgmlType::IQ3_S:
    case GgmlType::IQ4_XS: return ActKind::Q8_K;
    default: return ActKind::None;
  }
}

// quantize_row_q8_1_ref: Q8_0 (d = amax/127 stored as fp16, codes = roundf(x / d) with the
// unrounded reciprocal) plus s = fp16(d * Σ codes), d unrounded. Q8_0 itself is quantize_row's.
void quantize_q8_1(const float* x, int64_t n, ActQ8_1* y) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
      sum += y[b].qs[j];
    }
    y[b].d = fp32_to_fp16(d);
    y[b].s = fp32_to_fp16(static_cast<float>(sum) * d);
  }
}

// quantize_row_q8_K_ref: scale from the signed extreme (d = max / -127, kept in f32), codes
// rounded half to even and clamped at 127, plus per-16 code sums for the kernels' offset terms.
void quantize_q8_k(const float* x, int64_t n, ActQ8_K* y) {
  for (int64_t b = 0; b < n / 256; ++b, x += 256) {
    float max = 0, amax = 0;
    for (int j = 0; j < 256; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (amax == 0) {
      std::memset(&y[b], 0, sizeof(ActQ8_K));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < 256; ++j) {
      const int v = static_cast<int>(std::nearbyint(iscale * x[j]));  // default mode: half to even
      y[b].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[b].qs[16 * g + l];
      y[b].bsums[g] = static_cast<int16_t>(sum);
    }
    y[b].d = 1.0f / iscale;
  }
}

// The kernel tables are switches (a jump table each); looking one up per row costs nothing next to
// a row's dot.
bool avx2_ready() {
  static const bool available = dot_isa_available(DotIsa::Avx2);
  return available;
}

bool avx512_ready() {
  static const bool available = dot_isa_available(DotIsa::Avx512);
  return available;
}

// Whether `isa` names a SIMD path this CPU runs (Avx512 implies Avx2).
bool runs(DotIsa isa) {
  return isa == DotIsa::Scalar || (isa == DotIsa::Avx2 && avx2_ready()) || (isa == DotIsa::Avx512 && avx512_ready());
}

DotKernel kernel_for(DotIsa isa, GgmlType wt) {
  if (isa == DotIsa::Scalar) return scalar_dot_kernel(wt);
  return runs(isa) ? avx2_dot_kernel(wt) : nullptr;
}

DotIsa active_isa() {
  static const DotIsa isa = detect_dot_isa();
  return isa;
}

}  // namespace

size_t prepared_row_bytes(GgmlType wt, int64_t n) {
  switch (act_kind(wt)) {
    case ActKind::F32: return static_cast<size_t>(n) * sizeof(float);
    case ActKind::Q8_0: return static_cast<size_t>(n / 32) * sizeof(ActQ8_0);
    case ActKind::Q8_1: return static_cast<size_t>(n / 32) * sizeof(ActQ8_1);
    case ActKind::Q8_K: return static_cast<size_t>(n / 256) * sizeof(ActQ8_K);
    case ActKind::None: break;
  }
  return 0;
}

void prepare_activation_row(GgmlType wt, const float* x, int64_t n, void* out) {
  prepare_activation_row_on(active_isa(), wt, x, n, out);
}

void prepare_activation_row_on(DotIsa isa, GgmlType wt, const float* x, int64_t n, void* out) {
  switch (act_kind(wt)) {
    case ActKind::F32: std::memcpy(out, x, static_cast<size_t>(n) * sizeof(float)); return;
    case ActKind::Q8_0:
      if (isa != DotIsa::Scalar && runs(isa)) {
        avx2_quantize_q8_0()(x, n, out);
      } else {
        (void)quantize_row(GgmlType::Q8_0, x, out, n);  // ActQ8_0 == BlockQ8_0
      }
      return;
    case ActKind::Q8_1: quantize_q8_1(x, n, static_cast<ActQ8_1*>(out)); return;
    case ActKind::Q8_K:
      if (isa != DotIsa::Scalar && runs(isa)) {
        avx2_quantize_q8_k()(x, n, out);
      } else {
        quantize_q8_k(x, n, static_cast<ActQ8_K*>(out));
      }
      return;
    case ActKind::None: return;
  }
}

bool vec_dot_supported(GgmlType wt) { return act_kind(wt) != ActKind::None; }

DotIsa detect_dot_isa() {
  const char* forced = std::getenv("HYSPEC_CPU_ISA");
  if (forced && std::string_view(forced) == "scalar") return DotIsa::Scalar;
  if (dot_isa_available(DotIsa::Avx512) && !(forced && std::string_view(forced) == "avx2")) return DotIsa::Avx512;
  return dot_isa_available(DotIsa::Avx2) ? DotIsa::Avx2 : DotIsa::Scalar;
}

bool dot_isa_available(DotIsa isa) {
  if (isa == DotIsa::Scalar) return true;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (isa == DotIsa::Avx2) return avx2;
  return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

const char* vec_dot_isa() {
  switch (active_isa()) {
    case DotIsa::Avx512: return "avx512";
    case DotIsa::Avx2: return "avx2";
    case DotIsa::Scalar: break;
  }
  return "scalar";
}

float vec_dot_on(DotIsa isa, GgmlType wt, const void* w_row, const void* act, int64_t n) {
  const DotKernel k = kernel_for(isa, wt);
  return k ? k(w_row, act, n) : std::numeric_limits<float>::quiet_NaN();
}

float vec_dot(GgmlType wt, const void* w_row, const void* act, int64_t n) {
  return vec_dot_on(active_isa(), wt, w_row, act, n);
}

void vec_dot_tile_on(DotIsa isa, GgmlType wt, const void* w, size_t w_stride, const void* act, size_t act_stride,
                     int64_t n, int rows, int cols, float* out, int64_t out_stride) {
  if (isa != DotIsa::Scalar && runs(isa)) {
    DotTileKernel tile = isa == DotIsa::Avx512 ? avx512_dot_tile_kernel(wt) : nullptr;
    if (!tile) tile = avx2_dot_tile_kernel(wt);
    if (tile) {
      tile(w, w_stride, act, act_stride, n, rows, cols, out, out_stride);
      return;
    }
  }
  const DotKernel k = kernel_for(isa, wt);
  if (!k) return;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(act);
  constexpr int kCols = 8;  // activation rows kept hot against each weight row
  for (int c0 = 0; c0 < cols; c0 += kCols)
    for (int r = 0; r < rows; ++r)
      for (int c = c0; c < std::min(cols, c0 + kCols); ++c) out[c * out_stride + r] = k(wb + r * w_stride, ab + c * act_stride, n);
}

void vec_dot_tile(GgmlType wt, const void* w, size_t w_stride, const void* act, size_t act_stride, int64_t n, int rows,
                  int cols, float* out, int64_t out_stride) {
  vec_dot_tile_on(active_isa(), wt, w, w_stride, act, act_stride, n, rows, cols, out, out_stride);
}

}  // namespace hyspec::cpu
