// Writes a small seed corpus for the fuzz targets: shrunken copies of real GGUF files (same
// metadata, every tensor cut to one block), one GGUF holding a block of every dequantizable type
// (from the quant fixtures), a 64-aligned GGUF, and a few safetensors files.
// Usage: gguf_seeds OUT_DIR FIXTURES_DIR MODEL.gguf...
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/gguf_writer.h"

namespace {

using hyspec::GgufMetaValue;
using hyspec::GgufValueType;

GgufMetaValue to_meta(const hyspec::GgufValue& v) {
  switch (v.type) {
    case GgufValueType::UINT8: return GgufMetaValue::u8(static_cast<uint8_t>(v.scalar.u));
    case GgufValueType::INT8: return GgufMetaValue::i8(static_cast<int8_t>(v.scalar.i));
    case GgufValueType::UINT16: return GgufMetaValue::u16(static_cast<uint16_t>(v.scalar.u));
    case GgufValueType::INT16: return GgufMetaValue::i16(static_cast<int16_t>(v.scalar.i));
    case GgufValueType::UINT32: return GgufMetaValue::u32(static_cast<uint32_t>(v.scalar.u));
    case GgufValueType::INT32: return GgufMetaValue::i32(static_cast<int32_t>(v.scalar.i));
    case GgufValueType::UINT64: return GgufMetaValue::u64(v.scalar.u);
    case GgufValueType::INT64: return GgufMetaValue::i64(v.scalar.i);
    case GgufValueType::FLOAT32: return GgufMetaValue::f32(static_cast<float>(v.scalar.f));
    case GgufValueType::FLOAT64: return GgufMetaValue::f64(v.scalar.f);
    case GgufValueType::BOOL: return GgufMetaValue::boolean(v.scalar.b);
    case GgufValueType::STRING: return GgufMetaValue::string(std::string(v.str));
    case GgufValueType::ARRAY: {
      std::vector<GgufMetaValue> elems;
      for (const hyspec::GgufValue& e : v.array) elems.push_back(to_meta(e));
      return GgufMetaValue::array(v.elem_type, std::move(elems));
    }
  }
  return GgufMetaValue::u8(0);
}

bool check(const hyspec::Status& st) {
  if (!st.is_ok()) std::fprintf(stderr, "error: %s\n", st.message().c_str());
  return st.is_ok();
}

std::vector<uint8_t> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool shrink(const std::string& path, const std::filesystem::path& out) {
  auto f = hyspec::GgufFile::open(path);
  if (!check(f.status())) return false;
  hyspec::GgufWriter w;
  for (const auto& [key, value] : (*f)->metadata())
    if (!check(w.set(key, to_meta(value)))) return false;
  for (const hyspec::GgufTensorInfo& t : (*f)->tensors()) {
    const hyspec::GgmlTypeTraits tr = hyspec::ggml_type_traits(t.type);
    std::vector<int64_t> ne(static_cast<size_t>(t.n_dims), 1);
    ne[0] = tr.block_size;
    if (!check(w.add_tensor(t.name, t.type, ne, {t.data, tr.type_size}))) return false;
  }
  return check(w.write_file((out / ("shrunk-" + std::filesystem::path(path).filename().string())).string()));
}

bool every_quant_type(const std::filesystem::path& fixtures, const std::filesystem::path& out) {
  hyspec::GgufWriter w;
  if (!check(w.set("general.architecture", GgufMetaValue::string("seed")))) return false;
  for (uint32_t id = 0; id < 64; ++id) {
    const hyspec::GgmlTypeTraits tr = hyspec::ggml_type_traits(id);
    if (!tr.dequantizable || id == 0) continue;
    const std::vector<uint8_t> blocks = read_file(fixtures / "quants" / (std::string(tr.name) + ".blocks"));
    if (blocks.size() < tr.type_size) {
      std::fprintf(stderr, "error: no quant fixture for %s\n", std::string(tr.name).c_str());
      return false;
    }
    const std::string name = "q." + std::string(tr.name);
    if (!check(w.add_tensor(name, static_cast<hyspec::GgmlType>(id), {tr.block_size}, {blocks.data(), tr.type_size})))
      return false;
  }
  const float x[4] = {1.0f, -2.0f, 0.5f, 0.0f};
  if (!check(w.add_tensor("f32", hyspec::GgmlType::F32, {2, 2}, {reinterpret_cast<const uint8_t*>(x), 16})))
    return false;
  return check(w.write_file((out / "every-quant-type.gguf").string()));
}

bool aligned_64(const std::filesystem::path& out) {
  hyspec::GgufWriter w;
  const float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const bool ok = check(w.set_alignment(64)) &&
                  check(w.set("nested", GgufMetaValue::array(GgufValueType::ARRAY,
                                                             {GgufMetaValue::i32_array({1, 2}),
                                                              GgufMetaValue::string_array({"a", "b"})}))) &&
                  check(w.set("f64", GgufMetaValue::f64(0.5))) &&
                  check(w.add_tensor("a", hyspec::GgmlType::F32, {8}, {reinterpret_cast<const uint8_t*>(x), 32})) &&
                  check(w.add_tensor("b", hyspec::GgmlType::F16, {8}, {reinterpret_cast<const uint8_t*>(x), 16}));
  return ok && check(w.write_file((out / "aligned-64.gguf").string()));
}

bool safetensors(const std::filesystem::path& out) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]},"c":{"dtype":"I64","shape":[],"data_offsets":[24,32]}})";
  std::vector<uint8_t> b(8 + header.size() + 32, 0x3f);
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  std::ofstream o(out / "small.safetensors", std::ios::binary);
  o.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  return static_cast<bool>(o);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR FIXTURES_DIR MODEL.gguf...\n", argv[0]);
    return 2;
  }
  const std::filesystem::path out = argv[1], fixtures = argv[2];
  std::filesystem::create_directories(out);
  bool ok = every_quant_type(fixtures, out) && aligned_64(out) && safetensors(out);
  for (int i = 3; ok && i < argc; ++i) ok = shrink(argv[i], out);
  return ok ? 0 : 1;
}
