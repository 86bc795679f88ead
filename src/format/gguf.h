// GGUF v2/v3 reader over mmap. Metadata strings and tensor data are zero-copy views into the
// mapping, valid while the GgufFile lives. Every malformed input is a Status naming file and field.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "format/ggml_types.h"
#include "util/mmap_file.h"
#include "util/status.h"

namespace hyspec {

enum class GgufValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view gguf_value_type_name(GgufValueType t);
// Bytes of one value of a scalar type; 0 for STRING, ARRAY and unknown types.
size_t gguf_scalar_size(GgufValueType t);
constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32

struct GgufValue {
  GgufValueType type = GgufValueType::UINT8;
  union {
    uint64_t u;
    int64_t i;
    double f;
    bool b;
  } scalar{};
  std::string_view str;                  // STRING
  GgufValueType elem_type = GgufValueType::UINT8;  // ARRAY
  std::vector<GgufValue> array;          // ARRAY (may nest)

  bool is_integer() const;
  bool is_number() const { return is_integer() || type == GgufValueType::FLOAT32 || type == GgufValueType::FLOAT64; }
  int64_t as_int() const;   // integers and bools; floats truncated
  double as_double() const;
};

// The block of a llama.cpp-named "blk.N.*" tensor, or -1 for the others.
int gguf_block_index(std::string_view tensor_name);

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous (input) dimension
  uint64_t offset = 0;           // relative to the data section
  size_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;  // "[128, 512]"
};

class GgufFile {
 public:
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  // Parse an in-memory buffer (fuzzing, tests); `data` must outlive the GgufFile.
  static Result<std::unique_ptr<GgufFile>> parse(const uint8_t* data, size_t size, const std::string& name);

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }
  // Where the data section begins (tensor offsets count from it); past file_size() when a file without
  // tensors ends before its alignment padding.
  size_t data_offset() const { return data_offset_; }

  // Metadata in file order and by key.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string_view> get_string(std::string_view key) const;
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;
  Result<std::vector<float>> get_float_array(std::string_view key) const;
  Result<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  // Same, with a default when the key is absent (a present key of the wrong type is still an error).
  Result<int64_t> get_int_or(std::string_view key, int64_t def) const;
  Result<double> get_float_or(std::string_view key, double def) const;
  Result<bool> get_bool_or(std::string_view key, bool def) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  Status parse_all();

  MappedFile mapping_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace hyspec
