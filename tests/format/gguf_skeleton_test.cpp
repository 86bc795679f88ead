// tools/gguf_skeleton: a skeleton keeps the header byte for byte with a zero data section; a fill gives
// every tensor finite, model-sized weights, the same bytes for the same seed; resize gives a qwen35 file
// at another shape with llama.cpp's layer-dependent types.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/fixtures.h"
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

// A directory for one test's files, removed when the test ends (after a failed ASSERT too).
struct ScratchDir {
  std::string path;
  explicit ScratchDir(const std::string& name)
      : path(testing::TempDir() + "/" + name + "_" + std::to_string(getpid())) {
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

test::CommandResult run(const std::string& args) {
  return test::run_command(std::string("'") + GGUF_SKELETON_BINARY + "' " + args);
}

TEST(GgufSkeleton, KeepsTheHeaderAndFillsEveryTensorWithFiniteWeights) {
  const ScratchDir scratch("gguf_skeleton");
  const std::string& dir = scratch.path;
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
}

// add-nextn: the same metadata and tensors (data offsets kept), block_count + 1, nextn_predict_layers 1,
// the last full-attention block's tensors copied as the new block's with the nextn tensors, the file as
// long as its tensors; fill then makes it a model file.
TEST(GgufSkeleton, AddNextnAppendsAnMtpBlock) {
  const ScratchDir scratch("gguf_nextn");
  const std::string& dir = scratch.path;
  const std::string in = dir + "/in.gguf", out = dir + "/out.gguf";
  GgufWriter w;
  ASSERT_TRUE(w.set("general.architecture", GgufMetaValue::string("qwen35")).is_ok());
  ASSERT_TRUE(w.set("qwen35.block_count", GgufMetaValue::u32(2)).is_ok());
  ASSERT_TRUE(w.set("qwen35.embedding_length", GgufMetaValue::u32(256)).is_ok());
  ASSERT_TRUE(w.set("qwen35.rope.freq_base", GgufMetaValue::f32(1e7f)).is_ok());
  ASSERT_TRUE(w.set("qwen35.attention.recurrent_layers", GgufMetaValue::array(GgufValueType::BOOL,
                    {GgufMetaValue::boolean(true), GgufMetaValue::boolean(false)})).is_ok());
  ASSERT_TRUE(w.set("tokenizer.ggml.tokens", GgufMetaValue::string_array({"a", "b"})).is_ok());
  struct T {
    const char* name;
    GgmlType type;
    int64_t n_in, n_out;
  };
  const T tensors[] = {{"token_embd.weight", GgmlType::Q8_0, 256, 2}, {"blk.0.attn_qkv.weight", GgmlType::Q4_K, 256, 3},
                       {"blk.1.attn_norm.weight", GgmlType::F32, 256, 1}, {"blk.1.attn_q.weight", GgmlType::Q4_K, 256, 4},
                       {"blk.1.attn_output.weight", GgmlType::Q5_K, 512, 256}, {"output.weight", GgmlType::Q6_K, 256, 2}};
  for (const T& t : tensors) {
    const size_t bytes = ggml_row_bytes(t.type, t.n_in).value() * static_cast<size_t>(t.n_out);
    ASSERT_TRUE(w.add_tensor(t.name, t.type, {t.n_in, t.n_out}, std::vector<uint8_t>(bytes, 1)).is_ok());
  }
  ASSERT_TRUE(w.write_file(in).is_ok());

  const auto made = run("add-nextn '" + in + "' '" + out + "'");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto a = GgufFile::open(in), b = GgufFile::open(out);
  ASSERT_TRUE(a.is_ok()) << a.message();
  ASSERT_TRUE(b.is_ok()) << b.message();
  EXPECT_EQ((*b)->get_int("qwen35.block_count").value(), 3);
  EXPECT_EQ((*b)->get_int("qwen35.nextn_predict_layers").value(), 1);
  EXPECT_EQ((*b)->get_float("qwen35.rope.freq_base").value(), 1e7f);
  EXPECT_EQ((*b)->get_string_array("tokenizer.ggml.tokens").value(), (std::vector<std::string_view>{"a", "b"}));
  EXPECT_EQ((*b)->metadata().size(), (*a)->metadata().size() + 1);
  ASSERT_EQ((*b)->tensors().size(), (*a)->tensors().size() + 3 + 3);
  for (size_t i = 0; i < (*a)->tensors().size(); ++i) {
    const GgufTensorInfo &x = (*a)->tensors()[i], &y = (*b)->tensors()[i];
    EXPECT_EQ(y.name, x.name);
    EXPECT_EQ(y.type, x.type);
    EXPECT_EQ(y.shape_string(), x.shape_string());
    EXPECT_EQ(y.offset, x.offset) << x.name;
  }
  for (const char* name : {"attn_norm.weight", "attn_q.weight", "attn_output.weight"}) {
    const GgufTensorInfo* x = (*a)->find_tensor(std::string("blk.1.") + name);
    const GgufTensorInfo* y = (*b)->find_tensor(std::string("blk.2.") + name);
    ASSERT_TRUE(y) << name;
    EXPECT_EQ(y->type, x->type);
    EXPECT_EQ(y->shape_string(), x->shape_string());
  }
  const GgufTensorInfo* eh = (*b)->find_tensor("blk.2.nextn.eh_proj.weight");
  ASSERT_TRUE(eh);
  EXPECT_EQ(eh->shape_string(), "[512, 256]");
  EXPECT_EQ(eh->type, GgmlType::Q5_K);
  ASSERT_TRUE((*b)->find_tensor("blk.2.nextn.enorm.weight") && (*b)->find_tensor("blk.2.nextn.hnorm.weight"));
  const GgufTensorInfo& end = (*b)->tensors().back();
  EXPECT_EQ((*b)->file_size(), (*b)->data_offset() + (end.offset + end.nbytes + 31) / 32 * 32);
  const auto filled = run("fill '" + out + "' 3");
  EXPECT_EQ(filled.exit_code, 0) << filled.output;
  const auto again = run("add-nextn '" + out + "' '" + dir + "/twice.gguf'");
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.output.find("nextn block(s) already"), std::string::npos) << again.output;
}

// dflash-for: a drafter's header for a target's width (the layout DflashModel::load reads: fc over 5 taps,
// 11 tensors a layer, output_norm; the target's head borrowed), a skeleton that fill makes a file of.
TEST(GgufSkeleton, DflashForWritesADrafterOfTheTargetsWidth) {
  const ScratchDir scratch("gguf_dflash");
  const std::string& dir = scratch.path;
  const std::string target = dir + "/target.gguf", out = dir + "/drafter.gguf";
  GgufWriter w;
  ASSERT_TRUE(w.set("general.architecture", GgufMetaValue::string("qwen35")).is_ok());
  ASSERT_TRUE(w.set("qwen35.block_count", GgufMetaValue::u32(8)).is_ok());
  ASSERT_TRUE(w.set("qwen35.embedding_length", GgufMetaValue::u32(256)).is_ok());
  ASSERT_TRUE(w.set("qwen35.feed_forward_length", GgufMetaValue::u32(512)).is_ok());
  ASSERT_TRUE(w.set("tokenizer.ggml.eos_token_id", GgufMetaValue::u32(7)).is_ok());
  ASSERT_TRUE(w.write_file(target).is_ok());
  const auto made = run("dflash-for '" + target + "' '" + out + "' 2");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto f = GgufFile::open(out);
  ASSERT_TRUE(f.is_ok()) << f.message();
  EXPECT_EQ((*f)->get_string("general.architecture").value(), "dflash");
  EXPECT_EQ((*f)->get_int("dflash.block_count").value(), 2);
  EXPECT_EQ((*f)->get_int("tokenizer.ggml.mask_token_id").value(), 7);
  const auto taps = (*f)->get_int_array("dflash.target_layers").value();
  ASSERT_EQ(taps.size(), 5u);
  EXPECT_TRUE(std::is_sorted(taps.begin(), taps.end()) && taps.front() >= 1 && taps.back() <= 8);
  EXPECT_EQ((*f)->tensors().size(), 2u + 2 * 11 + 1);
  EXPECT_EQ((*f)->find_tensor("fc.weight")->shape_string(), "[1280, 256]");
  EXPECT_EQ((*f)->find_tensor("blk.1.ffn_down.weight")->shape_string(), "[512, 256]");
  EXPECT_EQ((*f)->find_tensor("blk.0.attn_k.weight")->shape_string(), "[256, 1024]");
  EXPECT_EQ(run("fill '" + out + "'").exit_code, 0);
}

}  // namespace
struct Listed {
  std::string name, type, shape;
  bool operator==(const Listed&) const = default;
};
std::vector<Listed> tensor_list(const GgufFile& f) {
  std::vector<Listed> v;
  for (const GgufTensorInfo& t : f.tensors()) v.push_back({t.name, std::string(ggml_type_name(t.type)), t.shape_string()});
  return v;
}

// resize on the anchor's 9B Q4_K_M (bench/data: llama.cpp's converter and llama-quantize made it) to the
// anchor's 27B shape: the metadata of that shape, 48 recurrent and 16 full-attention blocks in the 9B's
// tensor order, and Q6_K for attn_qkv / attn_v and ffn_down exactly in llama.cpp's use_more_bits layers
// of 64 (0-7, 10, 13, ..., 55, 56-63); the 9B at its own shape is the 9B.
TEST(GgufSkeleton, ResizeMakesThe27BOfThe9BWithLlamaCppsTypes) {
  const ScratchDir scratch("gguf_resize");
  const std::string& dir = scratch.path;
  const std::string nine = dir + "/9b.gguf", same = dir + "/same.gguf", big = dir + "/27b.gguf";
  // (sparse: the 5.6 GB of zeros after the header take no room)
  const auto unpacked = test::run_command("xz -dc '" + test::source_dir() + "/bench/data/9b-q4km.skeleton.gguf.xz' | dd of='" +
                                          nine + "' bs=1M iflag=fullblock conv=sparse status=none");
  ASSERT_EQ(unpacked.exit_code, 0) << unpacked.output;
  const auto kept = run("resize '" + nine + "' '" + same + "' 4096 12288 32 16 32");
  ASSERT_EQ(kept.exit_code, 0) << kept.output;
  auto a = GgufFile::open(nine), b = GgufFile::open(same);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_TRUE(tensor_list(**b) == tensor_list(**a));
  EXPECT_EQ((*b)->metadata().size(), (*a)->metadata().size());

  const auto made = run("resize '" + nine + "' '" + big + "' 5120 17408 64 24 48");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto f = GgufFile::open(big);
  ASSERT_TRUE(f.is_ok()) << f.message();
  const GgufFile& g = **f;
  EXPECT_EQ(g.get_int("qwen35.block_count").value(), 64);
  EXPECT_EQ(g.get_int("qwen35.embedding_length").value(), 5120);
  EXPECT_EQ(g.get_int("qwen35.feed_forward_length").value(), 17408);
  EXPECT_EQ(g.get_int("qwen35.attention.head_count").value(), 24);
  EXPECT_EQ(g.get_int("qwen35.attention.head_count_kv").value(), 4);
  EXPECT_EQ(g.get_int("qwen35.ssm.time_step_rank").value(), 48);
  EXPECT_EQ(g.get_int("qwen35.ssm.inner_size").value(), 6144);
  EXPECT_EQ(g.get_string_array("tokenizer.ggml.tokens").value().size(), 248320u);
  ASSERT_EQ(g.tensors().size(), 3u + 48 * 14 + 16 * 11);
  EXPECT_EQ(g.find_tensor("output.weight")->shape_string(), "[5120, 248320]");
  EXPECT_EQ(g.find_tensor("blk.0.attn_qkv.weight")->shape_string(), "[5120, 10240]");
  EXPECT_EQ(g.find_tensor("blk.0.ssm_conv1d.weight")->shape_string(), "[4, 10240]");
  EXPECT_EQ(g.find_tensor("blk.0.ssm_out.weight")->shape_string(), "[6144, 5120]");
  EXPECT_EQ(g.find_tensor("blk.62.ssm_alpha.weight")->shape_string(), "[5120, 48]");
  EXPECT_EQ(g.find_tensor("blk.63.attn_q.weight")->shape_string(), "[5120, 12288]");
  EXPECT_EQ(g.find_tensor("blk.63.attn_output.weight")->shape_string(), "[6144, 5120]");
  EXPECT_EQ(g.find_tensor("blk.3.ffn_down.weight")->shape_string(), "[17408, 5120]");
  EXPECT_EQ(g.find_tensor("blk.3.attn_qkv.weight"), nullptr);
  const std::vector<int> more = {0,  1,  2,  3,  4,  5,  6,  7,  10, 13, 16, 19, 22, 25, 28, 31,
                                 34, 37, 40, 43, 46, 49, 52, 55, 56, 57, 58, 59, 60, 61, 62, 63};
  for (int i = 0; i < 64; ++i) {
    const bool q6 = std::find(more.begin(), more.end(), i) != more.end();
    const GgufTensorInfo* wv = g.find_tensor(fmt::format("blk.{}.{}.weight", i, (i + 1) % 4 ? "attn_qkv" : "attn_v"));
    ASSERT_TRUE(wv) << i;
    EXPECT_EQ(wv->type, q6 ? GgmlType::Q6_K : GgmlType::Q4_K) << wv->name;
    EXPECT_EQ(g.find_tensor(fmt::format("blk.{}.ffn_down.weight", i))->type, q6 ? GgmlType::Q6_K : GgmlType::Q4_K) << i;
    EXPECT_EQ(g.find_tensor(fmt::format("blk.{}.ffn_up.weight", i))->type, GgmlType::Q4_K) << i;
  }
  EXPECT_EQ(g.find_tensor("output.weight")->type, GgmlType::Q6_K);
  const auto not_qwen = run("resize '" + test::fixture_path("dflash-tiny/dflash-tiny-f32.gguf") + "' '" + dir + "/x.gguf' 256 512 4 4 4");
  EXPECT_NE(not_qwen.exit_code, 0);
  EXPECT_NE(not_qwen.output.find("not qwen35"), std::string::npos) << not_qwen.output;
}

// resize on a fixture with an MTP block (the converter's order: the trunk, output_norm, then the nextn
// block): the trunk replaced, the nextn block renumbered after it, and the result a model hyspec runs,
// MTP speculation included, once filled.
TEST(GgufSkeleton, ResizeKeepsTheMtpBlockAndMakesAModel) {
  const ScratchDir scratch("gguf_resize_mtp");
  const std::string out = scratch.path + "/t12.gguf";
  const std::string in = test::fixture_path("qwen35-tiny/qwen35-tiny-f32.gguf");
  const auto made = run("resize '" + in + "' '" + out + "' 192 384 12 6 6");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto f = GgufFile::open(out);
  ASSERT_TRUE(f.is_ok()) << f.message();
  const GgufFile& g = **f;
  EXPECT_EQ(g.get_int("qwen35.block_count").value(), 13);
  EXPECT_EQ(g.get_int("qwen35.nextn_predict_layers").value(), 1);
  EXPECT_EQ(g.find_tensor("blk.12.nextn.eh_proj.weight")->shape_string(), "[384, 192]");
  EXPECT_EQ(g.find_tensor("blk.12.attn_q.weight")->shape_string(), "[192, 768]");
  EXPECT_EQ(g.find_tensor("blk.11.attn_q.weight")->shape_string(), "[192, 768]");
  EXPECT_EQ(g.find_tensor("blk.10.attn_qkv.weight")->shape_string(), "[192, 320]");
  EXPECT_EQ(g.find_tensor("blk.10.ssm_norm.weight")->shape_string(), "[32]");
  EXPECT_EQ(g.find_tensor("blk.8.nextn.eh_proj.weight"), nullptr);
  size_t norm_at = 0, mtp_at = 0;
  for (size_t i = 0; i < g.tensors().size(); ++i) {
    if (g.tensors()[i].name == "output_norm.weight") norm_at = i;
    if (g.tensors()[i].name.starts_with("blk.12.") && !mtp_at) mtp_at = i;
  }
  EXPECT_LT(norm_at, mtp_at);
  ASSERT_EQ(run("fill '" + out + "'").exit_code, 0);
  const auto ran = test::run_command(std::string("'") + HYSPEC_BINARY + "' run -m '" + out +
                                     "' --backend cpu --tokens 1,2,3 -n 4 --temp 0 --ids --no-stats --spec mtp");
  EXPECT_EQ(ran.exit_code, 0) << ran.output;
}

}  // namespace hyspec
