// tools/gguf_skeleton: a skeleton keeps the header byte for byte with a zero data section; a fill gives
// every tensor finite, model-sized weights, the same bytes for the same seed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/process.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/quants.h"

namespace hyspec {
namespace {

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

test::CommandResult run(const std::string& args) {
  return test::run_command(std::string("'") + GGUF_SKELETON_BINARY + "' " + args);
}

TEST(GgufSkeleton, KeepsTheHeaderAndFillsEveryTensorWithFiniteWeights) {
  const std::string dir = testing::TempDir() + "/gguf_skeleton_" + std::to_string(getpid());
  ASSERT_EQ(test::run_command("mkdir -p '" + dir + "'").exit_code, 0);
  const std::string in = dir + "/in.gguf", sk = dir + "/sk.gguf";
  GgufWriter w;
  ASSERT_TRUE(w.set("general.architecture", GgufMetaValue::string("qwen35")).is_ok());
  struct T {
    const char* name;
    GgmlType type;
    int64_t n_in, n_out;
  };
  const T tensors[] = {{"blk.0.attn_norm.weight", GgmlType::F32, 256, 1}, {"blk.0.ssm_a", GgmlType::F32, 32, 1},
                       {"blk.0.attn_qkv.weight", GgmlType::Q4_K, 512, 3},  {"blk.0.ssm_out.weight", GgmlType::Q5_K, 256, 2},
                       {"blk.0.ffn_down.weight", GgmlType::Q6_K, 768, 2},  {"blk.0.attn_v.weight", GgmlType::Q3_K, 256, 2},
                       {"blk.0.ffn_up.weight", GgmlType::IQ4_XS, 256, 2},  {"token_embd.weight", GgmlType::Q8_0, 256, 3},
                       {"output.weight", GgmlType::F16, 256, 2},           {"blk.0.ffn_gate.weight", GgmlType::BF16, 256, 2}};
  for (const T& t : tensors) {
    const size_t bytes = ggml_row_bytes(t.type, t.n_in).value() * static_cast<size_t>(t.n_out);
    const std::vector<uint8_t> data(bytes, 0xff);  // NaN as f16/f32 scales: a fill that misses a field shows
    ASSERT_TRUE(w.add_tensor(t.name, t.type, {t.n_in, t.n_out}, data).is_ok());
  }
  ASSERT_TRUE(w.write_file(in).is_ok());

  const auto made = run("skeleton '" + in + "' '" + sk + "'");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto in_bytes = read_all(in), sk_bytes = read_all(sk);
  ASSERT_EQ(sk_bytes.size(), in_bytes.size());
  auto file = GgufFile::parse(in_bytes.data(), in_bytes.size(), in);
  ASSERT_TRUE(file.is_ok()) << file.message();
  const size_t data_start = (*file)->data_offset();
  ASSERT_EQ((*file)->tensors()[0].data, in_bytes.data() + data_start + (*file)->tensors()[0].offset);
  EXPECT_TRUE(std::equal(sk_bytes.begin(), sk_bytes.begin() + static_cast<std::ptrdiff_t>(data_start), in_bytes.begin()));
  EXPECT_TRUE(std::all_of(sk_bytes.begin() + static_cast<std::ptrdiff_t>(data_start), sk_bytes.end(),
                          [](uint8_t b) { return b == 0; }));

  const auto filled_once = run("fill '" + sk + "' 5");
  ASSERT_EQ(filled_once.exit_code, 0) << filled_once.output;
  const auto once = read_all(sk);
  ASSERT_EQ(run("fill '" + sk + "' 5").exit_code, 0);
  EXPECT_EQ(read_all(sk), once) << "same seed, same bytes";
  auto filled = GgufFile::open(sk);
  ASSERT_TRUE(filled.is_ok()) << filled.message();
  for (const GgufTensorInfo& t : (*filled)->tensors()) {
    std::vector<float> v(static_cast<size_t>(t.n_elements()));
    ASSERT_TRUE(dequantize_row(t.type, t.data, v.data(), t.n_elements()).is_ok()) << t.name;
    float peak = 0;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << t.name;
      peak = std::max(peak, std::fabs(x));
    }
    EXPECT_GT(peak, 0.0f) << t.name;
    if (t.type != GgmlType::F32) EXPECT_LT(peak, 0.5f) << t.name;  // F32 vectors by role, below
    if (t.name == "blk.0.attn_norm.weight") EXPECT_EQ(v[0], 1.0f);
    if (t.name == "blk.0.ssm_a")
      for (float x : v) EXPECT_TRUE(x >= -2.0f && x <= -0.5f) << x;
  }
  test::run_command("rm -rf '" + dir + "'");
}

}  // namespace
}  // namespace hyspec
