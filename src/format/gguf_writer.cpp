#include "format/gguf_writer.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include <unistd.h>

#include "format/quants.h"

namespace hyspec {

static_assert(std::endian::native == std::endian::little, "GGUF is written in host byte order (little-endian)");

namespace {

constexpr uint32_t kGgufVersion = 3;

class VectorSink {
 public:
  explicit VectorSink(std::vector<uint8_t>& out) : out_(out) {}
  void put(const void* p, size_t n) {
    if (n == 0) return;
    const size_t old = out_.size();
    out_.resize(old + n);
    std::memcpy(out_.data() + old, p, n);
  }
  Status status() const { return Status::ok(); }

 private:
  std::vector<uint8_t>& out_;
};

class FileSink {
 public:
  FileSink(std::FILE* f, const std::string& path) : f_(f), path_(path) {}
  void put(const void* p, size_t n) {
    if (failed_ || n == 0) return;
    if (std::fwrite(p, 1, n, f_) != n) {
      failed_ = true;
      errno_ = errno;
    }
  }
  Status status() const {
    return failed_ ? Status::errorf("{}: write failed: {}", path_, std::strerror(errno_)) : Status::ok();
  }

 private:
  std::FILE* f_;
  const std::string& path_;
  bool failed_ = false;
  int errno_ = 0;
};

template <typename Sink, typename T>
void put_pod(Sink& s, T v) {
  s.put(&v, sizeof(T));
}

template <typename Sink>
void put_string(Sink& s, std::string_view str) {
  put_pod<Sink, uint64_t>(s, str.size());
  s.put(str.data(), str.size());
}

template <typename Sink>
void put_padding(Sink& s, size_t& pos, size_t alignment) {
  static const uint8_t zeros[256] = {};
  size_t pad = (alignment - pos % alignment) % alignment;
  pos += pad;
  while (pad > 0) {
    const size_t n = std::min(pad, sizeof(zeros));
    s.put(zeros, n);
    pad -= n;
  }
}

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

bool valid_alignment(int64_t a) { return a > 0 && a <= (1 << 20) && (a & (a - 1)) == 0; }

}  // namespace

GgufMetaValue GgufMetaValue::scalar(GgufValueType t, uint64_t bits) {
  GgufMetaValue v;
  v.type_ = t;
  const size_t n = gguf_scalar_size(t);
  v.bits_ = n == 8 ? bits : bits & ((uint64_t{1} << (8 * n)) - 1);
  return v;
}

GgufMetaValue GgufMetaValue::f32(float x) { return scalar(GgufValueType::FLOAT32, std::bit_cast<uint32_t>(x)); }
GgufMetaValue GgufMetaValue::f64(double x) { return scalar(GgufValueType::FLOAT64, std::bit_cast<uint64_t>(x)); }

GgufMetaValue GgufMetaValue::string(std::string s) {
  GgufMetaValue v;
  v.type_ = GgufValueType::STRING;
  v.str_ = std::move(s);
  return v;
}

GgufMetaValue GgufMetaValue::array(GgufValueType elem, std::vector<GgufMetaValue> elems) {
  GgufMetaValue v;
  v.type_ = GgufValueType::ARRAY;
  v.elem_type_ = elem;
  v.elems_ = std::move(elems);
  return v;
}

GgufMetaValue GgufMetaValue::string_array(const std::vector<std::string>& strs) {
  std::vector<GgufMetaValue> e;
  e.reserve(strs.size());
  for (const std::string& s : strs) e.push_back(string(s));
  return array(GgufValueType::STRING, std::move(e));
}

GgufMetaValue GgufMetaValue::i32_array(const std::vector<int32_t>& xs) {
  std::vector<GgufMetaValue> e;
  e.reserve(xs.size());
  for (int32_t x : xs) e.push_back(i32(x));
  return array(GgufValueType::INT32, std::move(e));
}

GgufMetaValue GgufMetaValue::f32_array(const std::vector<float>& xs) {
  std::vector<GgufMetaValue> e;
  e.reserve(xs.size());
  for (float x : xs) e.push_back(f32(x));
  return array(GgufValueType::FLOAT32, std::move(e));
}

GgufMetaValue GgufMetaValue::from(const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::INT8:
    case GgufValueType::INT16:
    case GgufValueType::INT32:
    case GgufValueType::INT64: return signed_scalar(v.type, v.scalar.i);
    case GgufValueType::FLOAT32: return f32(static_cast<float>(v.scalar.f));
    case GgufValueType::FLOAT64: return f64(v.scalar.f);
    case GgufValueType::BOOL: return boolean(v.scalar.b);
    case GgufValueType::STRING: return string(std::string(v.str));
    case GgufValueType::ARRAY: {
      std::vector<GgufMetaValue> e;
      e.reserve(v.array.size());
      for (const GgufValue& x : v.array) e.push_back(from(x));
      return array(v.elem_type, std::move(e));
    }
    default: return scalar(v.type, v.scalar.u);
  }
}

Status GgufWriter::set(std::string key, GgufMetaValue value) {
  // Element types must match the declared one, recursively; depth as the reader allows (8).
  struct Checker {
    const std::string& key;
    Status check(const GgufMetaValue& v, int depth) const {
      if (v.type_ != GgufValueType::ARRAY) return Status::ok();
      if (depth >= 8) return Status::errorf("metadata '{}': arrays nested too deeply", key);
      for (size_t i = 0; i < v.elems_.size(); ++i) {
        if (v.elems_[i].type_ != v.elem_type_)
          return Status::errorf("metadata '{}': array element {} is {}, the array holds {}", key, i,
                                gguf_value_type_name(v.elems_[i].type_), gguf_value_type_name(v.elem_type_));
        HS_RETURN_IF_ERROR(check(v.elems_[i], depth + 1));
      }
      return Status::ok();
    }
  };
  HS_RETURN_IF_ERROR((Checker{key}.check(value, 0)));
  if (key == "general.alignment") {
    const bool is_int = value.type_ != GgufValueType::FLOAT32 && value.type_ != GgufValueType::FLOAT64 &&
                        value.type_ != GgufValueType::BOOL && gguf_scalar_size(value.type_) != 0;
    if (!is_int || !valid_alignment(static_cast<int64_t>(value.bits_)))
      return Status::error("metadata 'general.alignment' must be an integer power of two up to 2^20");
    alignment_ = static_cast<size_t>(value.bits_);
  }
  for (auto& [k, v] : kv_) {
    if (k == key) return Status::errorf("metadata '{}' is already set", key);
  }
  kv_.emplace_back(std::move(key), std::move(value));
  return Status::ok();
}

Status GgufWriter::set_alignment(uint32_t alignment) {
  if (!valid_alignment(alignment))
    return Status::errorf("alignment {} is not a power of two up to 2^20", alignment);
  for (auto& [k, v] : kv_) {
    if (k == "general.alignment") {
      v = GgufMetaValue::u32(alignment);
      alignment_ = alignment;
      return Status::ok();
    }
  }
  return set("general.alignment", GgufMetaValue::u32(alignment));
}

Status GgufWriter::check_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne,
                                size_t& nbytes) const {
  if (name.empty()) return Status::error("tensor with an empty name");
  for (const Tensor& t : tensors_)
    if (t.name == name) return Status::errorf("tensor '{}' is already added", name);
  if (ne.empty() || ne.size() > 4) return Status::errorf("tensor '{}': {} dimensions (1..4 allowed)", name, ne.size());
  int64_t rows = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] <= 0) return Status::errorf("tensor '{}': dimension {} = {} is invalid", name, d, ne[d]);
    if (d > 0) rows *= ne[d];
  }
  Result<size_t> row = ggml_row_bytes(type, ne[0]);
  if (!row) return row.status().with_context(fmt::format("tensor '{}'", name));
  nbytes = *row * static_cast<size_t>(rows);
  return Status::ok();
}

Status GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<int64_t> ne, std::span<const uint8_t> data) {
  size_t expected = 0;
  HS_RETURN_IF_ERROR(check_tensor(name, type, ne, expected));
  if (data.size() != expected)
    return Status::errorf("tensor '{}': {} bytes given, {} data of this shape needs {}", name, data.size(),
                          ggml_type_name(type), expected);
  tensors_.push_back(
      Tensor{std::move(name), type, std::move(ne), std::vector<uint8_t>(data.begin(), data.end()), expected});
  return Status::ok();
}

Status GgufWriter::add_tensor_shape(std::string name, GgmlType type, std::vector<int64_t> ne) {
  size_t nbytes = 0;
  HS_RETURN_IF_ERROR(check_tensor(name, type, ne, nbytes));
  tensors_.push_back(Tensor{std::move(name), type, std::move(ne), {}, nbytes});
  return Status::ok();
}

Status GgufWriter::add_tensor_f32(std::string name, GgmlType type, std::vector<int64_t> ne, std::span<const float> data) {
  if (ne.empty()) return Status::errorf("tensor '{}': no dimensions", name);
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  if (n <= 0 || static_cast<size_t>(n) != data.size())
    return Status::errorf("tensor '{}': {} floats given for {} elements", name, data.size(), n);
  Result<size_t> row = ggml_row_bytes(type, ne[0]);
  if (!row) return row.status().with_context(fmt::format("tensor '{}'", name));
  const int64_t rows = n / ne[0];
  std::vector<uint8_t> bytes(*row * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const Status st = quantize_row(type, data.data() + r * ne[0], bytes.data() + static_cast<size_t>(r) * *row, ne[0]);
    if (!st) return st.with_context(fmt::format("tensor '{}'", name));
  }
  return add_tensor(std::move(name), type, std::move(ne), bytes);
}

std::vector<uint8_t> GgufWriter::header_bytes() const {
  struct ValueWriter {
    VectorSink& s;
    void put(const GgufMetaValue& v) {
      switch (v.type_) {
        case GgufValueType::STRING: put_string(s, v.str_); break;
        case GgufValueType::ARRAY:
          put_pod<VectorSink, uint32_t>(s, static_cast<uint32_t>(v.elem_type_));
          put_pod<VectorSink, uint64_t>(s, v.elems_.size());
          for (const GgufMetaValue& e : v.elems_) put(e);
          break;
        default: s.put(&v.bits_, gguf_scalar_size(v.type_)); break;
      }
    }
  };
  // The header is assembled in memory (it is small) so the data offsets follow from its size.
  std::vector<uint8_t> header;
  VectorSink hs(header);
  put_pod<VectorSink, uint32_t>(hs, kGgufMagic);
  put_pod<VectorSink, uint32_t>(hs, kGgufVersion);
  put_pod<VectorSink, uint64_t>(hs, tensors_.size());
  put_pod<VectorSink, uint64_t>(hs, kv_.size());
  ValueWriter vw{hs};
  for (const auto& [key, value] : kv_) {
    put_string(hs, key);
    put_pod<VectorSink, uint32_t>(hs, static_cast<uint32_t>(value.type_));
    vw.put(value);
  }
  size_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(hs, t.name);
    put_pod<VectorSink, uint32_t>(hs, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put_pod<VectorSink, uint64_t>(hs, static_cast<uint64_t>(d));
    put_pod<VectorSink, uint32_t>(hs, static_cast<uint32_t>(t.type));
    put_pod<VectorSink, uint64_t>(hs, offset);
    offset = align_up(offset + t.nbytes, alignment_);
  }
  return header;
}

template <typename Sink>
Status GgufWriter::serialize(Sink& sink) const {
  const std::vector<uint8_t> header = header_bytes();
  sink.put(header.data(), header.size());
  size_t pos = header.size();  // bytes written so far, for the alignment padding
  if (!tensors_.empty()) put_padding(sink, pos, alignment_);
  static const uint8_t zeros[4096] = {};
  for (const Tensor& t : tensors_) {
    if (t.data.empty())  // added by shape
      for (size_t done = 0; done < t.nbytes; done += sizeof(zeros))
        sink.put(zeros, std::min(sizeof(zeros), t.nbytes - done));
    else
      sink.put(t.data.data(), t.data.size());
    pos += t.nbytes;
    put_padding(sink, pos, alignment_);
  }
  return sink.status();
}

Result<std::vector<uint8_t>> GgufWriter::to_bytes() const {
  std::vector<uint8_t> out;
  VectorSink sink(out);
  HS_RETURN_IF_ERROR(serialize(sink));
  return out;
}

Status GgufWriter::write_skeleton(const std::string& path) const {
  std::vector<uint8_t> header = header_bytes();
  size_t size = tensors_.empty() ? header.size() : align_up(header.size(), alignment_);
  header.resize(size, 0);  // the padding before the data section
  for (const Tensor& t : tensors_) size = align_up(size + t.nbytes, alignment_);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return Status::errorf("{}: cannot create: {}", path, std::strerror(errno));
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  ok = std::fflush(f) == 0 && ok;
  ok = ok && ::ftruncate(::fileno(f), static_cast<off_t>(size)) == 0;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) return Status::errorf("{}: write failed: {}", path, std::strerror(errno));
  return Status::ok();
}

Status GgufWriter::write_file(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return Status::errorf("{}: cannot create: {}", path, std::strerror(errno));
  FileSink sink(f, path);
  Status st = serialize(sink);
  if (std::fclose(f) != 0 && st.is_ok()) st = Status::errorf("{}: write failed: {}", path, std::strerror(errno));
  return st;
}

}  // namespace hyspec
