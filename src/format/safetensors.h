// safetensors reader over mmap: an 8-byte little-endian header length, a JSON header mapping
// tensor names to {dtype, shape, data_offsets} (plus an optional "__metadata__" of strings), then
// the data. Tensor data are zero-copy views into the mapping, valid while the file object lives.
// Every malformed input is a Status naming the file and the tensor or field.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/mmap_file.h"
#include "util/status.h"

namespace hyspec {

enum class SafetensorsDtype { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };
std::string_view safetensors_dtype_name(SafetensorsDtype t);
size_t safetensors_dtype_size(SafetensorsDtype t);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::F32;
  std::vector<int64_t> shape;  // row-major: shape.back() is contiguous (GGUF ne reversed)
  size_t offset = 0;           // relative to the data section
  size_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping; unaligned in general

  int64_t n_elements() const;
  std::string shape_string() const;  // "[128, 384]"
};

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Parse an in-memory buffer (tests, fuzzing); `data` must outlive the object.
  static Result<std::unique_ptr<SafetensorsFile>> parse(const uint8_t* data, size_t size, const std::string& name);

  const std::string& path() const { return name_; }
  // Tensors in data order (by offset).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }

  // The tensor's elements as f32 in row-major order (F32, F16, BF16, F64; other dtypes error).
  Result<std::vector<float>> read_f32(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  Status parse_all();

  MappedFile mapping_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

}  // namespace hyspec
