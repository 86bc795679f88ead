// SafetensorsFile: the DFlash drafter checkpoint, its agreement with the converted GGUF, and
// malformed inputs as one-line errors naming the file and tensor.
#include "format/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "format/gguf.h"

namespace hyspec {
namespace {

constexpr const char* kName = "bad.safetensors";

std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes, uint64_t claimed_len = UINT64_MAX) {
  std::vector<uint8_t> b(8 + header.size() + data_bytes);
  const uint64_t len = claimed_len == UINT64_MAX ? header.size() : claimed_len;
  std::memcpy(b.data(), &len, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) b[8 + header.size() + i] = static_cast<uint8_t>(i);
  return b;
}

void expect_error(const std::vector<uint8_t>& b, const std::string& want) {
  auto f = SafetensorsFile::parse(b.data(), b.size(), kName);
  ASSERT_FALSE(f.is_ok()) << "expected: " << want;
  EXPECT_EQ(f.message().rfind(std::string(kName) + ": ", 0), 0u) << f.message();
  EXPECT_EQ(f.message().find('\n'), std::string::npos) << f.message();
  EXPECT_NE(f.message().find(want), std::string::npos) << "message: " << f.message() << "\nwanted: " << want;
}

TEST(Safetensors, ReadsTheDflashCheckpoint) {
  auto r = SafetensorsFile::open(test::fixture_path("dflash-tiny/hf/model.safetensors"));
  ASSERT_TRUE(r.is_ok()) << r.message();
  const SafetensorsFile& f = **r;
  EXPECT_EQ(f.tensors().size(), 25u);  // fc, hidden_norm, norm, 2 layers x 11
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const SafetensorsTensor* fc = f.find("fc.weight");
  ASSERT_TRUE(fc);
  EXPECT_EQ(fc->dtype, SafetensorsDtype::F32);
  EXPECT_EQ(fc->shape_string(), "[128, 384]");
  EXPECT_EQ(fc->offset, 0u);
  EXPECT_EQ(fc->nbytes, 128u * 384 * 4);
  const SafetensorsTensor* k = f.find("layers.1.self_attn.k_proj.weight");
  ASSERT_TRUE(k);
  EXPECT_EQ(k->shape, (std::vector<int64_t>{64, 128}));
  // Data order, no gaps: each tensor starts where the previous one ended.
  for (size_t i = 1; i < f.tensors().size(); ++i)
    EXPECT_EQ(f.tensors()[i].offset, f.tensors()[i - 1].offset + f.tensors()[i - 1].nbytes);
  EXPECT_FALSE(f.find("lm_head.weight"));
}

// The converter copies these weights unchanged; HF [out, in] row-major is GGUF ne = [in, out].
TEST(Safetensors, WeightsAgreeWithTheConvertedGguf) {
  auto st = SafetensorsFile::open(test::fixture_path("dflash-tiny/hf/model.safetensors"));
  auto gg = GgufFile::open(test::fixture_path("dflash-tiny/dflash-tiny-f32.gguf"));
  ASSERT_TRUE(st.is_ok() && gg.is_ok());
  const std::pair<const char*, const char*> same[] = {
      {"fc.weight", "fc.weight"},
      {"layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight"},
      {"layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight"},
      {"layers.1.mlp.down_proj.weight", "blk.1.ffn_down.weight"},
      {"hidden_norm.weight", "enc.output_norm.weight"},
  };
  for (const auto& [hf, gguf] : same) {
    const SafetensorsTensor* a = (*st)->find(hf);
    const GgufTensorInfo* b = (*gg)->find_tensor(gguf);
    ASSERT_TRUE(a && b) << hf;
    ASSERT_EQ(b->type, GgmlType::F32);
    ASSERT_EQ(a->shape.size(), static_cast<size_t>(b->n_dims)) << hf;
    for (int d = 0; d < b->n_dims; ++d) EXPECT_EQ(a->shape[a->shape.size() - 1 - d], b->ne[d]) << hf;
    auto values = (*st)->read_f32(hf);
    ASSERT_TRUE(values.is_ok()) << values.message();
    ASSERT_EQ(values->size() * 4, b->nbytes);
    EXPECT_EQ(std::memcmp(values->data(), b->data, b->nbytes), 0) << hf << " vs " << gguf;
  }
}

TEST(Safetensors, ConvertsHalfPrecisionToF32) {
  // F16 [1, -2], BF16 [0.5, 3], F64 [0.25], I32 [7]
  const std::string h =
      R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},)"
      R"("d":{"dtype":"F64","shape":[1],"data_offsets":[8,16]},)"
      R"("i":{"dtype":"I32","shape":[1],"data_offsets":[16,20]}})";
  std::vector<uint8_t> b = make_file(h, 20);
  uint8_t* data = b.data() + 8 + h.size();
  const uint16_t halves[4] = {0x3C00, 0xC000, 0x3F00, 0x4040};
  std::memcpy(data, halves, 8);
  const double q = 0.25;
  std::memcpy(data + 8, &q, 8);
  const int32_t seven = 7;
  std::memcpy(data + 16, &seven, 4);
  auto f = SafetensorsFile::parse(b.data(), b.size(), "mem.safetensors");
  ASSERT_TRUE(f.is_ok()) << f.message();
  EXPECT_EQ((*f)->read_f32("h").value(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ((*f)->read_f32("b").value(), (std::vector<float>{0.5f, 3.0f}));
  EXPECT_EQ((*f)->read_f32("d").value(), (std::vector<float>{0.25f}));
  EXPECT_NE((*f)->read_f32("i").message().find("tensor 'i' is I32, not a floating-point dtype"), std::string::npos);
  EXPECT_NE((*f)->read_f32("zz").message().find("no tensor 'zz'"), std::string::npos);
  EXPECT_TRUE((*f)->metadata().empty());
}

TEST(Safetensors, EveryDtypeHasItsSize) {
  const std::pair<const char*, size_t> dtypes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                   {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  for (const auto& [name, size] : dtypes) {
    const std::string h = fmt::format(R"({{"t":{{"dtype":"{}","shape":[3],"data_offsets":[0,{}]}}}})", name, 3 * size);
    const auto b = make_file(h, 3 * size);
    auto f = SafetensorsFile::parse(b.data(), b.size(), kName);
    ASSERT_TRUE(f.is_ok()) << name << ": " << f.message();
    EXPECT_EQ(safetensors_dtype_name((*f)->find("t")->dtype), name);
    EXPECT_EQ(safetensors_dtype_size((*f)->find("t")->dtype), size);
  }
}

TEST(Safetensors, ScalarsAndEmptyTensors) {
  const std::string h = R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                        R"("e":{"dtype":"F32","shape":[0,5],"data_offsets":[4,4]}})";
  const auto b = make_file(h, 4);
  auto f = SafetensorsFile::parse(b.data(), b.size(), kName);
  ASSERT_TRUE(f.is_ok()) << f.message();
  EXPECT_EQ((*f)->find("s")->n_elements(), 1);
  EXPECT_EQ((*f)->find("e")->n_elements(), 0);
  EXPECT_TRUE((*f)->read_f32("e").value().empty());
}

TEST(Safetensors, RejectsMalformedFiles) {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  expect_error(std::vector<uint8_t>(5, 0), "not a safetensors file (only 5 bytes)");
  expect_error(make_file(ok, 16, 1 << 20), "header of 1048576 bytes extends past the end of the file");
  expect_error(make_file(R"({"t":{"dtype":"F32",)", 16), "header is not valid JSON");
  expect_error(make_file("[1, 2]", 0), "header is not a JSON object");
  expect_error(make_file(R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,32]}})", 16),
               "tensor 't': data_offsets [0, 32] extend past the data section (16 bytes)");
  expect_error(make_file(R"({"t":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", 16),
               "tensor 't': data_offsets span 16 bytes, but F32 [2, 3] needs 24");
  expect_error(make_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 16),
               "tensor 't': data_offsets [8, 0] are reversed");
  expect_error(make_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 16),
               "tensor 't': data_offsets is not a pair of counts");
  expect_error(make_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 16),
               "tensor 't': data_offsets is not a pair of counts");
  expect_error(make_file(R"({"t":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 16),
               "tensor 't': unsupported dtype 'F8_E4M3'");
  expect_error(make_file(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 16), "tensor 't': missing dtype");
  expect_error(make_file(R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", 16), "tensor 't': missing shape");
  expect_error(make_file(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 16),
               "tensor 't': shape entry -2 is not a count");
  expect_error(make_file(R"({"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 16),
               "tensor 't': shape entry 2.5 is not a count");
  expect_error(make_file(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 16),
               "tensor 't': element count overflows");
  expect_error(make_file(R"({"t":[1]})", 16), "tensor 't': entry is not an object");
  expect_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 16),
               "tensors 'a' and 'b' overlap");
  expect_error(make_file(R"({"__metadata__":{"format":1}})", 0), "__metadata__ 'format' is not a string");
  expect_error(make_file(R"({"__metadata__":[]})", 0), "__metadata__ is not an object");
}

TEST(Safetensors, EveryTruncationOfTheHeaderIsAnError) {
  const std::string h = R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const auto full = make_file(h, 16);
  for (size_t cut = 0; cut < full.size(); ++cut) {
    auto f = SafetensorsFile::parse(full.data(), cut, kName);
    EXPECT_FALSE(f.is_ok()) << "cut at " << cut;
  }
}

TEST(Safetensors, MissingFileNamesThePath) {
  auto f = SafetensorsFile::open("/nonexistent/model.safetensors");
  ASSERT_FALSE(f.is_ok());
  EXPECT_NE(f.message().find("/nonexistent/model.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace hyspec
