// GgufWriter -> GgufFile round trips: every value type, nested arrays, alignment, tensors.
#include "format/gguf_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numbers>

#include "format/quants.h"

namespace hyspec {
namespace {

using V = GgufMetaValue;

std::unique_ptr<GgufFile> parse_ok(const std::vector<uint8_t>& bytes, const std::string& name = "mem.gguf") {
  auto f = GgufFile::parse(bytes.data(), bytes.size(), name);
  EXPECT_TRUE(f.is_ok()) << f.message();
  return f.is_ok() ? std::move(f).value() : nullptr;
}

GgufWriter writer_with_every_value_type() {
  GgufWriter w;
  EXPECT_TRUE(w.set("t.u8", V::u8(200)).is_ok());
  EXPECT_TRUE(w.set("t.i8", V::i8(-5)).is_ok());
  EXPECT_TRUE(w.set("t.u16", V::u16(60000)).is_ok());
  EXPECT_TRUE(w.set("t.i16", V::i16(-300)).is_ok());
  EXPECT_TRUE(w.set("t.u32", V::u32(4000000000u)).is_ok());
  EXPECT_TRUE(w.set("t.i32", V::i32(-2000000000)).is_ok());
  EXPECT_TRUE(w.set("t.f32", V::f32(1.5f)).is_ok());
  EXPECT_TRUE(w.set("t.bool", V::boolean(true)).is_ok());
  EXPECT_TRUE(w.set("t.string", V::string("h\xc3\xa9llo")).is_ok());
  EXPECT_TRUE(w.set("t.u64", V::u64((uint64_t{1} << 63) + 5)).is_ok());
  EXPECT_TRUE(w.set("t.i64", V::i64(-(int64_t{1} << 62))).is_ok());
  EXPECT_TRUE(w.set("t.f64", V::f64(std::numbers::pi)).is_ok());
  EXPECT_TRUE(w.set("t.strings", V::string_array({"a", "", "merge one"})).is_ok());
  EXPECT_TRUE(w.set("t.ints", V::i32_array({1, -2, 3})).is_ok());
  EXPECT_TRUE(w.set("t.floats", V::f32_array({0.25f, -8.0f})).is_ok());
  EXPECT_TRUE(w.set("t.empty", V::array(GgufValueType::UINT8, {})).is_ok());
  EXPECT_TRUE(w.set("t.nested",
                    V::array(GgufValueType::ARRAY,
                             {V::array(GgufValueType::UINT16, {V::u16(7), V::u16(8)}),
                              V::array(GgufValueType::STRING, {V::string("x")}),
                              V::array(GgufValueType::ARRAY, {V::array(GgufValueType::BOOL, {V::boolean(false)})})}))
                  .is_ok());
  return w;
}

TEST(GgufWriter, EveryValueTypeRoundTrips) {
  const GgufWriter w = writer_with_every_value_type();
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.is_ok()) << bytes.message();
  auto f = parse_ok(*bytes);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->metadata().size(), 17u);
  EXPECT_EQ(f->metadata()[0].first, "t.u8");  // file order is insertion order

  auto type_of = [&](const char* k) { return f->find(k)->type; };
  EXPECT_EQ(type_of("t.u8"), GgufValueType::UINT8);
  EXPECT_EQ(f->get_int("t.u8").value(), 200);
  EXPECT_EQ(type_of("t.i8"), GgufValueType::INT8);
  EXPECT_EQ(f->get_int("t.i8").value(), -5);
  EXPECT_EQ(type_of("t.u16"), GgufValueType::UINT16);
  EXPECT_EQ(f->get_int("t.u16").value(), 60000);
  EXPECT_EQ(type_of("t.i16"), GgufValueType::INT16);
  EXPECT_EQ(f->get_int("t.i16").value(), -300);
  EXPECT_EQ(type_of("t.u32"), GgufValueType::UINT32);
  EXPECT_EQ(f->get_int("t.u32").value(), 4000000000);
  EXPECT_EQ(type_of("t.i32"), GgufValueType::INT32);
  EXPECT_EQ(f->get_int("t.i32").value(), -2000000000);
  EXPECT_EQ(type_of("t.f32"), GgufValueType::FLOAT32);
  EXPECT_EQ(f->get_float("t.f32").value(), 1.5);
  EXPECT_EQ(type_of("t.bool"), GgufValueType::BOOL);
  EXPECT_TRUE(f->get_bool("t.bool").value());
  EXPECT_EQ(f->get_string("t.string").value(), "h\xc3\xa9llo");
  EXPECT_EQ(type_of("t.u64"), GgufValueType::UINT64);
  EXPECT_EQ(f->find("t.u64")->scalar.u, (uint64_t{1} << 63) + 5);
  EXPECT_EQ(type_of("t.i64"), GgufValueType::INT64);
  EXPECT_EQ(f->get_int("t.i64").value(), -(int64_t{1} << 62));
  EXPECT_EQ(type_of("t.f64"), GgufValueType::FLOAT64);
  EXPECT_EQ(f->get_float("t.f64").value(), std::numbers::pi);

  const auto strs = f->get_string_array("t.strings").value();
  ASSERT_EQ(strs.size(), 3u);
  EXPECT_EQ(strs[0], "a");
  EXPECT_EQ(strs[1], "");
  EXPECT_EQ(strs[2], "merge one");
  EXPECT_EQ(f->get_int_array("t.ints").value(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f->get_float_array("t.floats").value(), (std::vector<float>{0.25f, -8.0f}));
  EXPECT_EQ(f->find("t.empty")->elem_type, GgufValueType::UINT8);
  EXPECT_TRUE(f->find("t.empty")->array.empty());

  const GgufValue& nested = *f->find("t.nested");
  ASSERT_EQ(nested.elem_type, GgufValueType::ARRAY);
  ASSERT_EQ(nested.array.size(), 3u);
  EXPECT_EQ(nested.array[0].elem_type, GgufValueType::UINT16);
  ASSERT_EQ(nested.array[0].array.size(), 2u);
  EXPECT_EQ(nested.array[0].array[1].as_int(), 8);
  EXPECT_EQ(nested.array[1].array[0].str, "x");
  ASSERT_EQ(nested.array[2].array.size(), 1u);
  EXPECT_EQ(nested.array[2].array[0].elem_type, GgufValueType::BOOL);
  EXPECT_FALSE(nested.array[2].array[0].array[0].scalar.b);
}

// A file's metadata copied value by value (GgufMetaValue::from) and its tensors added by shape give
// the file's bytes again when the tensors hold zeros, from to_bytes and write_skeleton alike.
TEST(GgufWriter, CopiedValuesAndShapeTensorsWriteTheSameBytes) {
  GgufWriter w = writer_with_every_value_type();
  ASSERT_TRUE(w.add_tensor("a", GgmlType::F32, {3, 2}, std::vector<uint8_t>(24, 0)).is_ok());
  ASSERT_TRUE(w.add_tensor("b", GgmlType::Q4_K, {256, 1}, std::vector<uint8_t>(144, 0)).is_ok());
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.is_ok()) << bytes.message();
  auto f = parse_ok(*bytes);
  ASSERT_TRUE(f);
  GgufWriter copy;
  for (const auto& [key, value] : f->metadata()) ASSERT_TRUE(copy.set(key, GgufMetaValue::from(value)).is_ok()) << key;
  for (const GgufTensorInfo& t : f->tensors())
    ASSERT_TRUE(copy.add_tensor_shape(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims)).is_ok());
  EXPECT_EQ(copy.to_bytes().value(), *bytes);
  const std::string path = testing::TempDir() + "/gguf_writer_skeleton_" + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(copy.write_skeleton(path).is_ok());
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> written{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_EQ(written, *bytes);
  std::remove(path.c_str());
}

class GgufWriterAlignment : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufWriterAlignment, TensorsRoundTripAtTheRequestedAlignment) {
  const uint32_t alignment = GetParam();
  GgufWriter w;
  ASSERT_TRUE(w.set("general.architecture", V::string("test")).is_ok());
  if (alignment != 32) ASSERT_TRUE(w.set_alignment(alignment).is_ok());

  std::vector<float> small = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // [3 rows, 4 cols], 48 bytes
  ASSERT_TRUE(w.add_tensor("a.f32", GgmlType::F32, {4, 3},
                           {reinterpret_cast<const uint8_t*>(small.data()), small.size() * 4})
                  .is_ok());
  std::vector<float> q(64 * 2);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
  ASSERT_TRUE(w.add_tensor_f32("b.q8_0", GgmlType::Q8_0, {64, 2}, q).is_ok());
  const uint16_t one_half[3] = {0x3C00, 0x3800, 0xC000};  // 1, 0.5, -2 in fp16
  ASSERT_TRUE(w.add_tensor("c.f16", GgmlType::F16, {3}, {reinterpret_cast<const uint8_t*>(one_half), 6}).is_ok());

  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.is_ok()) << bytes.message();
  EXPECT_EQ(bytes->size() % alignment, 0u);
  auto f = parse_ok(*bytes);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->alignment(), alignment);
  ASSERT_EQ(f->tensors().size(), 3u);
  for (const GgufTensorInfo& t : f->tensors()) {
    EXPECT_EQ(t.offset % alignment, 0u) << t.name;
    EXPECT_EQ(static_cast<size_t>(t.data - bytes->data()) % alignment, 0u) << t.name;
  }

  const GgufTensorInfo* a = f->find_tensor("a.f32");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->type, GgmlType::F32);
  EXPECT_EQ(a->shape_string(), "[4, 3]");
  EXPECT_EQ(a->nbytes, 48u);
  EXPECT_EQ(std::memcmp(a->data, small.data(), 48), 0);

  const GgufTensorInfo* b = f->find_tensor("b.q8_0");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->type, GgmlType::Q8_0);
  EXPECT_EQ(b->n_dims, 2);
  EXPECT_EQ(b->ne[0], 64);
  EXPECT_EQ(b->ne[1], 2);
  EXPECT_EQ(b->nbytes, 4u * 34u);
  std::vector<uint8_t> expect_q(4 * 34);
  ASSERT_TRUE(quantize_row(GgmlType::Q8_0, q.data(), expect_q.data(), 128).is_ok());
  EXPECT_EQ(std::memcmp(b->data, expect_q.data(), expect_q.size()), 0);
  std::vector<float> back(128);
  ASSERT_TRUE(dequantize_row(GgmlType::Q8_0, b->data, back.data(), 128).is_ok());
  for (size_t i = 0; i < back.size(); ++i) EXPECT_NEAR(back[i], q[i], 3.0f / 127.0f * 0.6f) << i;

  const GgufTensorInfo* c = f->find_tensor("c.f16");
  ASSERT_TRUE(c);
  float cf[3];
  ASSERT_TRUE(dequantize_row(GgmlType::F16, c->data, cf, 3).is_ok());
  EXPECT_EQ(cf[0], 1.0f);
  EXPECT_EQ(cf[1], 0.5f);
  EXPECT_EQ(cf[2], -2.0f);
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufWriterAlignment, ::testing::Values(32u, 64u, 8u));

TEST(GgufWriter, FileAndMemoryOutputsAreIdentical) {
  GgufWriter w = writer_with_every_value_type();
  const float x[32] = {1.0f};
  ASSERT_TRUE(w.add_tensor_f32("t", GgmlType::Q4_0, {32}, x).is_ok());
  const auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.is_ok());
  const std::string path = (std::filesystem::temp_directory_path() / "hyspec_writer_test.gguf").string();
  ASSERT_TRUE(w.write_file(path).is_ok());
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(file, *bytes);
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.message();
  EXPECT_EQ((*f)->tensors().size(), 1u);
  std::filesystem::remove(path);
}

TEST(GgufWriter, RejectsInconsistentInput) {
  GgufWriter w;
  ASSERT_TRUE(w.set("k", V::u8(1)).is_ok());
  EXPECT_NE(w.set("k", V::u8(2)).message().find("'k' is already set"), std::string::npos);
  EXPECT_NE(w.set("mixed", V::array(GgufValueType::INT32, {V::i32(1), V::u8(2)})).message().find("element 1"),
            std::string::npos);
  EXPECT_FALSE(w.set("general.alignment", V::u32(48)).is_ok());
  EXPECT_FALSE(w.set("general.alignment", V::f32(32.0f)).is_ok());
  EXPECT_FALSE(w.set_alignment(0).is_ok());

  const uint8_t bytes[68] = {};
  EXPECT_TRUE(w.add_tensor("ok", GgmlType::Q8_0, {64}, bytes).is_ok());
  EXPECT_NE(w.add_tensor("ok", GgmlType::Q8_0, {64}, bytes).message().find("already added"), std::string::npos);
  EXPECT_NE(w.add_tensor("short", GgmlType::Q8_0, {64, 2}, bytes).message().find("needs 136"), std::string::npos);
  EXPECT_NE(w.add_tensor("odd", GgmlType::Q8_0, {48}, bytes).message().find("block size 32"), std::string::npos);
  EXPECT_FALSE(w.add_tensor("zero", GgmlType::F32, {0}, {}).is_ok());
  EXPECT_FALSE(w.add_tensor("five", GgmlType::F32, {1, 1, 1, 1, 1}, {bytes, 4}).is_ok());
  EXPECT_NE(w.write_file("/nonexistent-dir/x.gguf").message().find("/nonexistent-dir/x.gguf"), std::string::npos);
}

}  // namespace
}  // namespace hyspec
