// GGUF v3 writer: metadata (every value type, arrays of arrays, string arrays) and tensors
// (name, GGML type, dims, raw bytes), laid out with general.alignment (default 32), written to a
// file or to memory. What it writes, GgufFile reads back unchanged.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "format/ggml_types.h"
#include "format/gguf.h"
#include "util/status.h"

namespace hyspec {

// An owned metadata value (GgufValue is a view into a mapping; this one carries its data).
class GgufMetaValue {
 public:
  static GgufMetaValue u8(uint8_t v) { return scalar(GgufValueType::UINT8, v); }
  static GgufMetaValue i8(int8_t v) { return signed_scalar(GgufValueType::INT8, v); }
  static GgufMetaValue u16(uint16_t v) { return scalar(GgufValueType::UINT16, v); }
  static GgufMetaValue i16(int16_t v) { return signed_scalar(GgufValueType::INT16, v); }
  static GgufMetaValue u32(uint32_t v) { return scalar(GgufValueType::UINT32, v); }
  static GgufMetaValue i32(int32_t v) { return signed_scalar(GgufValueType::INT32, v); }
  static GgufMetaValue u64(uint64_t v) { return scalar(GgufValueType::UINT64, v); }
  static GgufMetaValue i64(int64_t v) { return signed_scalar(GgufValueType::INT64, v); }
  static GgufMetaValue f32(float v);
  static GgufMetaValue f64(double v);
  static GgufMetaValue boolean(bool v) { return scalar(GgufValueType::BOOL, v ? 1 : 0); }
  static GgufMetaValue string(std::string v);
  // An array whose elements all have type `elem` (checked when writing). Arrays may nest.
  static GgufMetaValue array(GgufValueType elem, std::vector<GgufMetaValue> elems);
  static GgufMetaValue string_array(const std::vector<std::string>& v);
  static GgufMetaValue i32_array(const std::vector<int32_t>& v);
  static GgufMetaValue f32_array(const std::vector<float>& v);

  // A copy of a value read from a file.
  static GgufMetaValue from(const GgufValue& v);

  GgufValueType type() const { return type_; }

 private:
  friend class GgufWriter;
  static GgufMetaValue scalar(GgufValueType t, uint64_t bits);
  static GgufMetaValue signed_scalar(GgufValueType t, int64_t v) { return scalar(t, static_cast<uint64_t>(v)); }

  GgufValueType type_ = GgufValueType::UINT8;
  uint64_t bits_ = 0;  // scalars: the value's little-endian bit pattern, zero-extended
  std::string str_;
  GgufValueType elem_type_ = GgufValueType::UINT8;
  std::vector<GgufMetaValue> elems_;
};

class GgufWriter {
 public:
  // Metadata keeps insertion order. Setting `general.alignment` (an integer power of two)
  // changes the tensor data alignment; set_alignment does it as uint32.
  Status set(std::string key, GgufMetaValue value);
  Status set_alignment(uint32_t alignment);

  // A tensor of shape ne (ne[0] contiguous, 1..4 dims) whose bytes are exactly
  // ggml_row_bytes(type, ne[0]) * ne[1] * ... ; the bytes are copied.
  Status add_tensor(std::string name, GgmlType type, std::vector<int64_t> ne, std::span<const uint8_t> data);
  // Quantizes f32 data [ne[1]..., ne[0]] to `type` (see quantize_row) and adds it.
  Status add_tensor_f32(std::string name, GgmlType type, std::vector<int64_t> ne, std::span<const float> data);

  // A tensor known by its shape alone: the file holds zeros for it (write_skeleton: a hole).
  Status add_tensor_shape(std::string name, GgmlType type, std::vector<int64_t> ne);

  size_t alignment() const { return alignment_; }
  Result<std::vector<uint8_t>> to_bytes() const;
  // Writes to `path` (replaced if present); the error names the path.
  Status write_file(const std::string& path) const;
  // The header, then the data section as a hole to the file's full size (a sparse file: tensors read
  // as zeros); for files whose tensors were added by shape, as tools/gguf_skeleton makes them.
  Status write_skeleton(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;  // empty for a tensor added by shape
    size_t nbytes;
  };
  Status check_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne, size_t& nbytes) const;
  std::vector<uint8_t> header_bytes() const;
  template <typename Sink>
  Status serialize(Sink& sink) const;

  std::vector<std::pair<std::string, GgufMetaValue>> kv_;
  std::vector<Tensor> tensors_;
  size_t alignment_ = 32;
};

}  // namespace hyspec
