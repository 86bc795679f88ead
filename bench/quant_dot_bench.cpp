// CPU dot kernels: a single-threaded 4096 x 4096 matrix-vector product per weight type and path,
// reported as GB/s of weight bytes streamed (the activation is prepared once, outside the timing,
// as a matmul does). Weights tile the fixture blocks (real quantized data, valid scales) of
// ../shared/fixtures/quants; F32 uses random values.
//
//   build/bench/bench_quant_dot --benchmark_filter=avx2   (or scalar, or a type name)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/quant_dot.h"
#include "format/ggml_types.h"

namespace {

using hyspec::GgmlType;
using hyspec::cpu::DotIsa;

constexpr int64_t kRows = 4096, kCols = 4096;

const GgmlType kTypes[] = {
    GgmlType::F32,    GgmlType::F16,     GgmlType::BF16,   GgmlType::Q8_0,    GgmlType::Q4_0,   GgmlType::Q4_1,
    GgmlType::Q5_0,   GgmlType::Q5_1,    GgmlType::IQ4_NL, GgmlType::MXFP4,   GgmlType::Q2_K,   GgmlType::Q3_K,
    GgmlType::Q4_K,   GgmlType::Q5_K,    GgmlType::Q6_K,   GgmlType::IQ4_XS,  GgmlType::IQ1_S,  GgmlType::IQ1_M,
    GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S,  GgmlType::IQ3_XXS, GgmlType::IQ3_S,
};

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// kRows rows of type t; empty when the fixture is missing.
std::vector<uint8_t> weight_matrix(GgmlType t) {
  const size_t bytes = hyspec::ggml_row_bytes(t, kCols).value() * kRows;
  std::vector<uint8_t> w(bytes);
  if (t == GgmlType::F32) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (size_t i = 0; i < bytes / 4; ++i) reinterpret_cast<float*>(w.data())[i] = normal(rng);
    return w;
  }
  const char* env = std::getenv("HYSPEC_FIXTURES");
  const std::string root = env && *env ? env : HYSPEC_DEFAULT_FIXTURES;
  const std::vector<uint8_t> blocks = read_file(root + "/quants/" + std::string(hyspec::ggml_type_name(t)) + ".blocks");
  if (blocks.empty()) return {};
  for (size_t i = 0; i < bytes; ++i) w[i] = blocks[i % blocks.size()];
  if (t == GgmlType::MXFP4) {
    // The fixture's exponents are random bytes, many far outside a real model's (2^-10 .. 2^0),
    // and subnormal block scales would time the FPU's slow path rather than the kernel.
    for (size_t i = 0; i < bytes; i += 17) w[i] = static_cast<uint8_t>(118 + (i / 17) % 10);
  }
  return w;
}

void bm_matvec(benchmark::State& state, GgmlType t, DotIsa isa) {
  if (!hyspec::cpu::dot_isa_available(isa)) {
    state.SkipWithError("ISA not available on this CPU");
    return;
  }
  const std::vector<uint8_t> w = weight_matrix(t);
  if (w.empty()) {
    state.SkipWithError("fixture blocks missing (set HYSPEC_FIXTURES)");
    return;
  }
  const size_t row_bytes = w.size() / kRows;
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kCols);
  for (float& v : x) v = normal(rng);
  std::vector<float> act(hyspec::cpu::prepared_row_bytes(t, kCols) / sizeof(float) + 1);
  hyspec::cpu::prepare_activation_row(t, x.data(), kCols, act.data());
  std::vector<float> y(kRows);
  for (auto _ : state) {
    for (int64_t r = 0; r < kRows; ++r)
      y[r] = hyspec::cpu::vec_dot_on(isa, t, w.data() + r * row_bytes, act.data(), kCols);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.size()));
  state.counters["weight_MiB"] = static_cast<double>(w.size()) / (1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  for (DotIsa isa : {DotIsa::Avx2, DotIsa::Scalar}) {
    for (GgmlType t : kTypes) {
      const std::string name = std::string("matvec_4096x4096/") + std::string(hyspec::ggml_type_name(t)) +
                               (isa == DotIsa::Avx2 ? "/avx2" : "/scalar");
      benchmark::RegisterBenchmark(name.c_str(), bm_matvec, t, isa)->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
