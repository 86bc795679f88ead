// GgufFile: every malformed input is a one-line error naming the file (built with GgufWriter and
// byte surgery), and the real fixtures parse with the expected contents.
#include "format/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "common/fixtures.h"
#include "format/gguf_writer.h"
#include "format/quants.h"

namespace hyspec {
namespace {

using V = GgufMetaValue;
using Bytes = std::vector<uint8_t>;
constexpr const char* kName = "surgery.gguf";

// Two F32 tensors of 8 elements (32 bytes each): the file ends exactly where the last tensor ends.
Bytes small_file(uint32_t alignment = 32) {
  GgufWriter w;
  EXPECT_TRUE(w.set("general.architecture", V::string("test")).is_ok());
  if (alignment != 32) EXPECT_TRUE(w.set_alignment(alignment).is_ok());
  EXPECT_TRUE(w.set("key.aa", V::u32(7)).is_ok());
  EXPECT_TRUE(w.set("key.ab", V::array(GgufValueType::STRING, {V::string("x"), V::string("yz")})).is_ok());
  EXPECT_TRUE(w.set("key.flag", V::boolean(true)).is_ok());
  const float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::span<const uint8_t> b(reinterpret_cast<const uint8_t*>(x), sizeof(x));
  EXPECT_TRUE(w.add_tensor("tensor.a", GgmlType::F32, {8}, b).is_ok());
  EXPECT_TRUE(w.add_tensor("tensor.b", GgmlType::F32, {4, 2}, b).is_ok());
  return w.to_bytes().value();
}

// Position just past the first occurrence of `s` in the file (where a key's type or a tensor's
// n_dims follows its name).
size_t after(const Bytes& b, std::string_view s) {
  auto it = std::search(b.begin(), b.end(), s.begin(), s.end());
  EXPECT_NE(it, b.end()) << "'" << s << "' not in file";
  return static_cast<size_t>(it - b.begin()) + s.size();
}
template <typename T>
void poke(Bytes& b, size_t pos, T v) {
  std::memcpy(b.data() + pos, &v, sizeof(T));
}
// Tensor info field positions after the name: n_dims u32, ne[n] u64, type u32, offset u64.
size_t dim_pos(const Bytes& b, std::string_view name, int d) { return after(b, name) + 4 + 8 * d; }
size_t type_pos(const Bytes& b, std::string_view name, int n_dims) { return after(b, name) + 4 + 8 * n_dims; }
size_t offset_pos(const Bytes& b, std::string_view name, int n_dims) { return type_pos(b, name, n_dims) + 4; }

// Parses and expects a one-line error that names the file and contains `want`.
void expect_error(const Bytes& b, const std::string& want, size_t size = SIZE_MAX) {
  auto f = GgufFile::parse(b.data(), std::min(size, b.size()), kName);
  ASSERT_FALSE(f.is_ok()) << "expected an error containing: " << want;
  const std::string& m = f.message();
  EXPECT_EQ(m.rfind(std::string(kName) + ": ", 0), 0u) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_NE(m.find(want), std::string::npos) << "message: " << m << "\nwanted: " << want;
}

// llama.cpp's block naming: "blk.N." and a tensor name after it; anything else is not a block's.
TEST(GgufNames, BlockIndexOfBlkTensorsOnly) {
  EXPECT_EQ(gguf_block_index("blk.0.attn_q.weight"), 0);
  EXPECT_EQ(gguf_block_index("blk.63.ffn_down.weight"), 63);
  EXPECT_EQ(gguf_block_index("blk.12.nextn.eh_proj.weight"), 12);
  EXPECT_EQ(gguf_block_index("token_embd.weight"), -1);
  EXPECT_EQ(gguf_block_index("blk.x.attn_q.weight"), -1);
  EXPECT_EQ(gguf_block_index("blk.3"), -1);
  EXPECT_EQ(gguf_block_index("blk."), -1);
  EXPECT_EQ(gguf_block_index("blk3.attn_q.weight"), -1);
}

TEST(GgufRead, SmallFileIsValid) {
  const Bytes b = small_file();
  auto f = GgufFile::parse(b.data(), b.size(), kName);
  ASSERT_TRUE(f.is_ok()) << f.message();
  EXPECT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ((*f)->get_int("key.aa").value(), 7);
  const GgufTensorInfo* t = (*f)->find_tensor("tensor.b");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->data + t->nbytes, b.data() + b.size());  // ends at EOF: every cut truncates data
}

TEST(GgufRead, BadMagic) {
  Bytes b = small_file();
  b[0] = 'X';
  expect_error(b, "not a GGUF file (bad magic");
  expect_error(b, "not a GGUF file (only 3 bytes)", 3);
}

TEST(GgufRead, UnsupportedVersion) {
  Bytes b = small_file();
  poke<uint32_t>(b, 4, 4);
  expect_error(b, "unsupported GGUF version 4");
  poke<uint32_t>(b, 4, 1);
  expect_error(b, "unsupported GGUF version 1");
}

TEST(GgufRead, EveryTruncationIsAnError) {
  const Bytes b = small_file();
  for (size_t cut = 0; cut < b.size(); ++cut) {
    auto f = GgufFile::parse(b.data(), cut, kName);
    ASSERT_FALSE(f.is_ok()) << "a file cut at " << cut << " of " << b.size() << " bytes parsed";
    EXPECT_EQ(f.message().rfind(std::string(kName) + ": ", 0), 0u) << f.message();
    EXPECT_EQ(f.message().find('\n'), std::string::npos) << f.message();
  }
}

TEST(GgufRead, TruncationMessagesSayWhere) {
  const Bytes b = small_file();
  expect_error(b, "truncated header", 6);
  expect_error(b, "tensor count 2 exceeds what the file can hold", 30);
  expect_error(b, "metadata 'general.architecture': file truncated", 60);  // inside the value
  expect_error(b, "extends past the end of the file", b.size() - 1);
}

TEST(GgufRead, TensorDataPastEndOfFile) {
  Bytes b = small_file();
  poke<uint64_t>(b, offset_pos(b, "tensor.b", 2), 4096);
  expect_error(b, "tensor 'tensor.b' (32 bytes at offset 4096) extends past the end of the file");
}

TEST(GgufRead, DimensionProductOverflow) {
  Bytes b = small_file();
  poke<uint64_t>(b, dim_pos(b, "tensor.b", 0), uint64_t{1} << 40);
  poke<uint64_t>(b, dim_pos(b, "tensor.b", 1), uint64_t{1} << 40);
  expect_error(b, "tensor 'tensor.b': element count overflows");
}

TEST(GgufRead, ImplausibleDimension) {
  Bytes b = small_file();
  poke<uint64_t>(b, dim_pos(b, "tensor.a", 0), ~uint64_t{0});
  expect_error(b, "tensor 'tensor.a': dimension 0 = 18446744073709551615 is invalid");
}

TEST(GgufRead, ZeroDimension) {
  Bytes b = small_file();
  poke<uint64_t>(b, dim_pos(b, "tensor.b", 1), 0);
  expect_error(b, "tensor 'tensor.b': dimension 1 = 0 is invalid");
}

TEST(GgufRead, DimensionCountOutOfRange) {
  Bytes b = small_file();
  poke<uint32_t>(b, after(b, "tensor.a"), 5);
  expect_error(b, "tensor 'tensor.a': 5 dimensions (1..4 allowed)");
  poke<uint32_t>(b, after(b, "tensor.a"), 0);
  expect_error(b, "tensor 'tensor.a': 0 dimensions");
}

TEST(GgufRead, UnknownGgmlTypeId) {
  Bytes b = small_file();
  poke<uint32_t>(b, type_pos(b, "tensor.a", 1), 99);
  expect_error(b, "tensor 'tensor.a': unknown GGML type id 99");
}

TEST(GgufRead, RowNotAMultipleOfTheBlockSize) {
  Bytes b = small_file();
  poke<uint32_t>(b, type_pos(b, "tensor.a", 1), static_cast<uint32_t>(GgmlType::Q8_0));
  expect_error(b, "tensor 'tensor.a': row length 8 is not a multiple of the Q8_0 block size 32");
}

TEST(GgufRead, UnknownMetadataValueType) {
  Bytes b = small_file();
  poke<uint32_t>(b, after(b, "key.aa"), 13);
  expect_error(b, "metadata 'key.aa' has unknown value type 13");
}

TEST(GgufRead, UnknownArrayElementType) {
  Bytes b = small_file();
  poke<uint32_t>(b, after(b, "key.ab") + 4, 42);
  expect_error(b, "metadata 'key.ab': unknown array element type 42");
}

TEST(GgufRead, ArrayLongerThanTheFile) {
  Bytes b = small_file();
  poke<uint64_t>(b, after(b, "key.ab") + 8, uint64_t{1} << 31);
  expect_error(b, "metadata 'key.ab': array of 2147483648 string elements does not fit");
}

TEST(GgufRead, BoolThatIsNeitherZeroNorOne) {
  Bytes b = small_file();
  b[after(b, "key.flag") + 4] = 2;
  expect_error(b, "metadata 'key.flag': bool value 2 is neither 0 nor 1");
}

TEST(GgufRead, DuplicateTensorNames) {
  Bytes b = small_file();
  b[after(b, "tensor.b") - 1] = 'a';
  expect_error(b, "duplicate tensor name 'tensor.a'");
}

TEST(GgufRead, DuplicateMetadataKeys) {
  Bytes b = small_file();
  b[after(b, "key.ab") - 1] = 'a';
  expect_error(b, "duplicate metadata key 'key.aa'");
}

TEST(GgufRead, MisalignedTensorOffset) {
  Bytes b = small_file();
  poke<uint64_t>(b, offset_pos(b, "tensor.b", 2), 16);
  expect_error(b, "tensor 'tensor.b': offset 16 is not aligned to 32");
}

TEST(GgufRead, OverlappingTensors) {
  Bytes b = small_file();
  poke<uint64_t>(b, offset_pos(b, "tensor.b", 2), 0);
  expect_error(b, "tensors 'tensor.a' (offset 0, 32 bytes) and 'tensor.b' (offset 0) overlap");
}

TEST(GgufRead, BadGeneralAlignment) {
  Bytes b = small_file(64);
  {
    auto f = GgufFile::parse(b.data(), b.size(), kName);
    ASSERT_TRUE(f.is_ok()) << f.message();
    EXPECT_EQ((*f)->alignment(), 64u);
  }
  const size_t value = after(b, "general.alignment") + 4;
  poke<uint32_t>(b, value, 48);
  expect_error(b, "general.alignment 48 is not a power of two");
  poke<uint32_t>(b, value, 0);
  expect_error(b, "general.alignment 0 is not a power of two");
  poke<uint32_t>(b, value - 4, static_cast<uint32_t>(GgufValueType::FLOAT32));
  expect_error(b, "general.alignment is not an integer");
}

TEST(GgufRead, CountsLargerThanTheFile) {
  Bytes b = small_file();
  poke<uint64_t>(b, 8, uint64_t{1} << 40);
  expect_error(b, "tensor count 1099511627776 exceeds what the file can hold");
  b = small_file();
  poke<uint64_t>(b, 16, uint64_t{1} << 40);
  expect_error(b, "metadata count 1099511627776 exceeds what the file can hold");
}

TEST(GgufRead, MissingFileNamesThePath) {
  auto f = GgufFile::open("/nonexistent/model.gguf");
  ASSERT_FALSE(f.is_ok());
  EXPECT_NE(f.message().find("/nonexistent/model.gguf"), std::string::npos) << f.message();
}

TEST(GgufRead, TypedGettersReportTheKeyAndType) {
  const Bytes b = small_file();
  auto f = GgufFile::parse(b.data(), b.size(), kName);
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ((*f)->get_string("key.aa").message(), "surgery.gguf: metadata 'key.aa' is uint32, expected a string");
  EXPECT_EQ((*f)->get_int("nope").message(), "surgery.gguf: missing metadata key 'nope'");
  EXPECT_EQ((*f)->get_int_or("nope", 5).value(), 5);
  EXPECT_FALSE((*f)->get_int_array("key.ab").is_ok());
  EXPECT_EQ((*f)->get_string_array("key.ab").value().size(), 2u);
}

// ---- real files ------------------------------------------------------------------------------

TEST(GgufFixtures, Qwen35TinyQ8_0) {
  auto r = GgufFile::open(test::fixture_path("qwen35-tiny/qwen35-tiny-q8_0.gguf"));
  ASSERT_TRUE(r.is_ok()) << r.message();
  const GgufFile& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture").value(), "qwen35");
  EXPECT_EQ(f.get_int("qwen35.block_count").value(), 9);  // 8 layers + the nextn block
  EXPECT_EQ(f.get_int("qwen35.embedding_length").value(), 128);
  EXPECT_EQ(f.get_int("qwen35.nextn_predict_layers").value(), 1);
  EXPECT_EQ(f.get_int_array("qwen35.rope.dimension_sections").value(), (std::vector<int64_t>{3, 3, 2, 0}));
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").value().size(), 512u);
  EXPECT_EQ(f.tensors().size(), 124u);

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  ASSERT_TRUE(embd);
  EXPECT_EQ(embd->type, GgmlType::Q8_0);
  EXPECT_EQ(embd->shape_string(), "[128, 512]");
  EXPECT_EQ(embd->nbytes, 512u * 4 * 34);
  const GgufTensorInfo* qkv = f.find_tensor("blk.0.attn_qkv.weight");
  ASSERT_TRUE(qkv);
  EXPECT_EQ(qkv->shape_string(), "[128, 256]");
  const GgufTensorInfo* conv = f.find_tensor("blk.0.ssm_conv1d.weight");
  ASSERT_TRUE(conv);
  EXPECT_EQ(conv->type, GgmlType::F32);
  EXPECT_EQ(conv->shape_string(), "[4, 256]");
  ASSERT_TRUE(f.find_tensor("blk.8.nextn.eh_proj.weight"));
  EXPECT_EQ(f.find_tensor("blk.3.attn_q.weight")->shape_string(), "[128, 512]");
  EXPECT_FALSE(f.find_tensor("blk.3.attn_qkv.weight"));  // layer 3 is full attention
}

// The q8_0 file's token embedding is the f32 file's quantized by llama.cpp: re-quantizing the
// f32 rows with our Q8_0 gives the same bytes.
TEST(GgufFixtures, Q8_0EmbeddingMatchesOurQuantizationOfTheF32File) {
  auto q = GgufFile::open(test::fixture_path("qwen35-tiny/qwen35-tiny-q8_0.gguf"));
  auto f = GgufFile::open(test::fixture_path("qwen35-tiny/qwen35-tiny-f32.gguf"));
  ASSERT_TRUE(q.is_ok() && f.is_ok());
  const GgufTensorInfo* tq = (*q)->find_tensor("token_embd.weight");
  const GgufTensorInfo* tf = (*f)->find_tensor("token_embd.weight");
  ASSERT_TRUE(tq && tf);
  ASSERT_EQ(tf->type, GgmlType::F32);
  ASSERT_EQ(tf->n_elements(), tq->n_elements());
  std::vector<uint8_t> mine(tq->nbytes);
  ASSERT_TRUE(quantize_row(GgmlType::Q8_0, reinterpret_cast<const float*>(tf->data), mine.data(), tf->n_elements())
                  .is_ok());
  EXPECT_EQ(std::memcmp(mine.data(), tq->data, tq->nbytes), 0);
}

TEST(GgufFixtures, Qwen35MoeTinyQ8_0) {
  auto r = GgufFile::open(test::fixture_path("qwen35moe-tiny/qwen35moe-tiny-q8_0.gguf"));
  ASSERT_TRUE(r.is_ok()) << r.message();
  const GgufFile& f = **r;
  EXPECT_EQ(f.get_string("general.architecture").value(), "qwen35moe");
  EXPECT_EQ(f.get_int("qwen35moe.expert_count").value(), 8);
  EXPECT_EQ(f.get_int("qwen35moe.expert_used_count").value(), 2);
  EXPECT_EQ(f.tensors().size(), 169u);
  const GgufTensorInfo* exps = f.find_tensor("blk.0.ffn_down_exps.weight");
  ASSERT_TRUE(exps);
  EXPECT_EQ(exps->n_dims, 3);
  EXPECT_EQ(exps->shape_string(), "[64, 128, 8]");
}

TEST(GgufFixtures, DflashTinyF32) {
  auto r = GgufFile::open(test::fixture_path("dflash-tiny/dflash-tiny-f32.gguf"));
  ASSERT_TRUE(r.is_ok()) << r.message();
  const GgufFile& f = **r;
  EXPECT_EQ(f.get_string("general.architecture").value(), "dflash");
  EXPECT_EQ(f.get_int_array("dflash.target_layers").value(), (std::vector<int64_t>{2, 4, 6}));
  EXPECT_EQ(f.get_int("tokenizer.ggml.mask_token_id").value(), 507);
  EXPECT_EQ(f.tensors().size(), 25u);
  EXPECT_EQ(f.find_tensor("fc.weight")->shape_string(), "[384, 128]");
}

// The vocabulary-only file: no tensors, a large string array. (Its vocabulary has 151936 entries,
// with the qwen35 pre-tokenizer.)
TEST(GgufFixtures, Qwen35VocabularyOnly) {
  auto r = GgufFile::open(test::fixture_path("tokenizer/ggml-vocab-qwen35.gguf"));
  ASSERT_TRUE(r.is_ok()) << r.message();
  const GgufFile& f = **r;
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre").value(), "qwen35");
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens").value();
  EXPECT_EQ(tokens.size(), 151936u);
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type").value().size(), tokens.size());
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges").value().size(), 151387u);
  EXPECT_EQ(tokens[151643], "<|endoftext|>");
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id").value(), 151643);
}

}  // namespace
}  // namespace hyspec
