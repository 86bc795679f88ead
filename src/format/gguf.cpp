#include "format/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace hyspec {
namespace {

constexpr uint64_t kMaxArrayLength = uint64_t{1} << 32;
constexpr int kMaxNesting = 8;

// Bounds-checked little-endian cursor over the mapping.
class Cursor {
 public:
  Cursor(const uint8_t* base, size_t size) : base_(base), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  bool read(void* out, size_t n) {
    if (n > size_ - pos_) return false;
    std::memcpy(out, base_ + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool read(T& v) { return read(&v, sizeof(T)); }
  bool read_string(std::string_view& s, uint32_t version) {
    uint64_t len = 0;
    if (version == 1) {
      uint32_t l32;
      if (!read(l32)) return false;
      len = l32;
    } else if (!read(len)) {
      return false;
    }
    if (len > size_ - pos_) return false;
    s = std::string_view(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return true;
  }

 private:
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
};


bool read_value(Cursor& c, GgufValueType t, uint32_t version, int depth, GgufValue& v, std::string& err) {
  v.type = t;
  switch (t) {
    case GgufValueType::UINT8: { uint8_t x; if (!c.read(x)) break; v.scalar.u = x; return true; }
    case GgufValueType::INT8: { int8_t x; if (!c.read(x)) break; v.scalar.i = x; return true; }
    case GgufValueType::UINT16: { uint16_t x; if (!c.read(x)) break; v.scalar.u = x; return true; }
    case GgufValueType::INT16: { int16_t x; if (!c.read(x)) break; v.scalar.i = x; return true; }
    case GgufValueType::UINT32: { uint32_t x; if (!c.read(x)) break; v.scalar.u = x; return true; }
    case GgufValueType::INT32: { int32_t x; if (!c.read(x)) break; v.scalar.i = x; return true; }
    case GgufValueType::UINT64: { uint64_t x; if (!c.read(x)) break; v.scalar.u = x; return true; }
    case GgufValueType::INT64: { int64_t x; if (!c.read(x)) break; v.scalar.i = x; return true; }
    case GgufValueType::FLOAT32: { float x; if (!c.read(x)) break; v.scalar.f = x; return true; }
    case GgufValueType::FLOAT64: { double x; if (!c.read(x)) break; v.scalar.f = x; return true; }
    case GgufValueType::BOOL: {
      uint8_t x;
      if (!c.read(x)) break;
      if (x > 1) { err = fmt::format("bool value {} is neither 0 nor 1", x); return false; }
      v.scalar.b = x != 0;
      return true;
    }
    case GgufValueType::STRING:
      if (!c.read_string(v.str, version)) break;
      return true;
    case GgufValueType::ARRAY: {
      if (depth >= kMaxNesting) { err = "arrays nested too deeply"; return false; }
      uint32_t et;
      uint64_t n;
      if (!c.read(et)) break;
      if (version == 1) { uint32_t n32; if (!c.read(n32)) break; n = n32; }
      else if (!c.read(n)) break;
      if (et > static_cast<uint32_t>(GgufValueType::FLOAT64)) {
        err = fmt::format("unknown array element type {}", et);
        return false;
      }
      if (n > kMaxArrayLength) { err = fmt::format("array length {} is implausible", n); return false; }
      v.elem_type = static_cast<GgufValueType>(et);
      // Reject lengths the remaining bytes cannot hold before allocating: an element takes at
      // least its scalar size, a string its 8-byte length, an array its 12-byte header.
      const size_t min_elem = gguf_scalar_size(v.elem_type) ? gguf_scalar_size(v.elem_type)
                              : v.elem_type == GgufValueType::STRING ? 8 : 12;
      if (n > c.remaining() / min_elem) {
        err = fmt::format("array of {} {} elements does not fit in the remaining {} bytes", n,
                          gguf_value_type_name(v.elem_type), c.remaining());
        return false;
      }
      v.array.clear();
      v.array.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) {
        GgufValue e;
        if (!read_value(c, v.elem_type, version, depth + 1, e, err)) {
          if (err.empty()) err = fmt::format("truncated inside array element {} of {}", i, n);
          return false;
        }
        v.array.push_back(std::move(e));
      }
      return true;
    }
    default:
      err = fmt::format("unknown value type {}", static_cast<uint32_t>(t));
      return false;
  }
  if (err.empty()) err = "file truncated";
  return false;
}

}  // namespace

std::string_view gguf_value_type_name(GgufValueType t) {
  static constexpr std::string_view names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                               "bool", "string", "array", "uint64", "int64", "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "unknown";
}

int gguf_block_index(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  int n = 0;
  size_t i = 4;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) n = n * 10 + (name[i] - '0');
  return i < name.size() && name[i] == '.' ? n : -1;
}

size_t gguf_scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16: case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32: case GgufValueType::INT32: case GgufValueType::FLOAT32: return 4;
    case GgufValueType::UINT64: case GgufValueType::INT64: case GgufValueType::FLOAT64: return 8;
    default: return 0;
  }
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::UINT16: case GgufValueType::INT16:
    case GgufValueType::UINT32: case GgufValueType::INT32: case GgufValueType::UINT64: case GgufValueType::INT64:
      return true;
    default:
      return false;
  }
}

int64_t GgufValue::as_int() const {
  switch (type) {
    case GgufValueType::UINT8: case GgufValueType::UINT16: case GgufValueType::UINT32: case GgufValueType::UINT64:
      return static_cast<int64_t>(scalar.u);
    case GgufValueType::BOOL: return scalar.b ? 1 : 0;
    case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: return static_cast<int64_t>(scalar.f);
    default: return scalar.i;
  }
}

double GgufValue::as_double() const {
  if (type == GgufValueType::FLOAT32 || type == GgufValueType::FLOAT64) return scalar.f;
  return static_cast<double>(as_int());
}

std::string GgufTensorInfo::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < n_dims; ++d) s += fmt::format("{}{}", d ? ", " : "", ne[d]);
  return s + "]";
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  HS_ASSIGN_OR_RETURN(MappedFile m, MappedFile::open(path));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->mapping_ = std::move(m);
  f->base_ = f->mapping_.data();
  f->size_ = f->mapping_.size();
  f->name_ = path;
  HS_RETURN_IF_ERROR(f->parse_all());
  return f;
}

Result<std::unique_ptr<GgufFile>> GgufFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->base_ = data;
  f->size_ = size;
  f->name_ = name;
  HS_RETURN_IF_ERROR(f->parse_all());
  return f;
}

Status GgufFile::parse_all() {
  const std::string& fn = name_;
  Cursor c(base_, size_);
  uint32_t magic = 0;
  if (!c.read(magic)) return Status::errorf("{}: not a GGUF file (only {} bytes)", fn, size_);
  if (magic != kGgufMagic) return Status::errorf("{}: not a GGUF file (bad magic 0x{:08x})", fn, magic);
  if (!c.read(version_)) return Status::errorf("{}: truncated header (version)", fn);
  if (version_ < 2 || version_ > 3)
    return Status::errorf("{}: unsupported GGUF version {} (supported: 2, 3)", fn, version_);
  uint64_t n_tensors = 0, n_kv = 0;
  if (!c.read(n_tensors) || !c.read(n_kv)) return Status::errorf("{}: truncated header (counts)", fn);
  // Each tensor info needs at least 8+4+4+8 bytes, each kv at least 8+4 bytes.
  if (n_tensors > size_ / 24) return Status::errorf("{}: tensor count {} exceeds what the file can hold", fn, n_tensors);
  if (n_kv > size_ / 12) return Status::errorf("{}: metadata count {} exceeds what the file can hold", fn, n_kv);

  kv_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string_view key;
    if (!c.read_string(key, version_)) return Status::errorf("{}: truncated in metadata key #{}", fn, i);
    uint32_t t = 0;
    if (!c.read(t)) return Status::errorf("{}: truncated in metadata '{}' (type)", fn, key);
    if (t > static_cast<uint32_t>(GgufValueType::FLOAT64))
      return Status::errorf("{}: metadata '{}' has unknown value type {}", fn, key, t);
    GgufValue v;
    std::string err;
    if (!read_value(c, static_cast<GgufValueType>(t), version_, 0, v, err))
      return Status::errorf("{}: metadata '{}': {}", fn, key, err);
    std::string k(key);
    if (kv_index_.count(k)) return Status::errorf("{}: duplicate metadata key '{}'", fn, key);
    kv_index_.emplace(k, kv_.size());
    kv_.emplace_back(std::move(k), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (!a->is_integer()) return Status::errorf("{}: general.alignment is not an integer", fn);
    const int64_t al = a->as_int();
    if (al <= 0 || (al & (al - 1)) != 0 || al > (1 << 20))
      return Status::errorf("{}: general.alignment {} is not a power of two", fn, al);
    alignment_ = static_cast<size_t>(al);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo ti;
    std::string_view name;
    if (!c.read_string(name, version_)) return Status::errorf("{}: truncated in tensor info #{}", fn, i);
    ti.name = std::string(name);
    uint32_t n_dims = 0;
    if (!c.read(n_dims)) return Status::errorf("{}: tensor '{}': truncated (n_dims)", fn, ti.name);
    if (n_dims == 0 || n_dims > 4) return Status::errorf("{}: tensor '{}': {} dimensions (1..4 allowed)", fn, ti.name, n_dims);
    ti.n_dims = static_cast<int>(n_dims);
    uint64_t total = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = 0;
      if (!c.read(ne)) return Status::errorf("{}: tensor '{}': truncated (dims)", fn, ti.name);
      if (ne == 0 || ne > (uint64_t{1} << 40))
        return Status::errorf("{}: tensor '{}': dimension {} = {} is invalid", fn, ti.name, d, ne);
      if (total > std::numeric_limits<uint64_t>::max() / ne / 8)
        return Status::errorf("{}: tensor '{}': element count overflows", fn, ti.name);
      total *= ne;
      ti.ne[d] = static_cast<int64_t>(ne);
    }
    uint32_t type = 0;
    if (!c.read(type)) return Status::errorf("{}: tensor '{}': truncated (type)", fn, ti.name);
    const GgmlTypeTraits tr = ggml_type_traits(type);
    if (tr.block_size == 0) return Status::errorf("{}: tensor '{}': unknown GGML type id {}", fn, ti.name, type);
    ti.type = static_cast<GgmlType>(type);
    if (ti.ne[0] % tr.block_size != 0)
      return Status::errorf("{}: tensor '{}': row length {} is not a multiple of the {} block size {}", fn, ti.name,
                            ti.ne[0], tr.name, tr.block_size);
    ti.nbytes = static_cast<size_t>(total / tr.block_size * tr.type_size);
    if (!c.read(ti.offset)) return Status::errorf("{}: tensor '{}': truncated (offset)", fn, ti.name);
    if (ti.offset % alignment_ != 0)
      return Status::errorf("{}: tensor '{}': offset {} is not aligned to {}", fn, ti.name, ti.offset, alignment_);
    if (tensor_index_.count(ti.name)) return Status::errorf("{}: duplicate tensor name '{}'", fn, ti.name);
    tensor_index_.emplace(ti.name, tensors_.size());
    tensors_.push_back(std::move(ti));
  }

  const size_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  data_offset_ = data_start;
  if (n_tensors > 0 && data_start > size_)
    return Status::errorf("{}: truncated before the tensor data section", fn);
  for (GgufTensorInfo& ti : tensors_) {
    if (ti.offset > size_ - std::min(size_, data_start) || ti.nbytes > size_ - data_start - ti.offset)
      return Status::errorf("{}: tensor '{}' ({} bytes at offset {}) extends past the end of the file ({} bytes): "
                            "file truncated?", fn, ti.name, ti.nbytes, ti.offset, size_);
    ti.data = base_ + data_start + ti.offset;
  }
  // Tensors must not share bytes: sorted by offset, each ends before the next begins.
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const GgufTensorInfo& ti : tensors_) by_offset.push_back(&ti);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& prev = *by_offset[i - 1];
    if (prev.offset + prev.nbytes > by_offset[i]->offset)
      return Status::errorf("{}: tensors '{}' (offset {}, {} bytes) and '{}' (offset {}) overlap", fn, prev.name,
                            prev.offset, prev.nbytes, by_offset[i]->name, by_offset[i]->offset);
  }
  return Status::ok();
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
Status missing(const std::string& fn, std::string_view key) {
  return Status::errorf("{}: missing metadata key '{}'", fn, key);
}
Status wrong_type(const std::string& fn, std::string_view key, const GgufValue& v, std::string_view want) {
  return Status::errorf("{}: metadata '{}' is {}, expected {}", fn, key, gguf_value_type_name(v.type), want);
}
}  // namespace

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(name_, key);
  if (!v->is_integer() && v->type != GgufValueType::BOOL) return wrong_type(name_, key, *v, "an integer");
  return v->as_int();
}

Result<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(name_, key);
  if (!v->is_number()) return wrong_type(name_, key, *v, "a number");
  return v->as_double();
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(name_, key);
  if (v->type != GgufValueType::BOOL) return wrong_type(name_, key, *v, "a bool");
  return v->scalar.b;
}

Result<std::string_view> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(name_, key);
  if (v->type != GgufValueType::STRING) return wrong_type(name_, key, *v, "a string");
  return v->str;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(name_, key);
  if (v->type != GgufValueType::ARRAY || !(v->array.empty() || v->array[0].is_integer() ||
                                           v->elem_type == GgufValueType::BOOL))
    return wrong_type(name_, key, *v, "an integer array");
  std::vector<int64_t> out;
  out.reserve(v->array.size());
  for (const GgufValue& e : v->array) out.push_back(e.as_int());
  return out;
}

Result<std::vector<float>> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(name_, key);
  if (v->type != GgufValueType::ARRAY || !(v->array.empty() || v->array[0].is_number()))
    return wrong_type(name_, key, *v, "a number array");
  std::vector<float> out;
  out.reserve(v->array.size());
  for (const GgufValue& e : v->array) out.push_back(static_cast<float>(e.as_double()));
  return out;
}

Result<std::vector<std::string_view>> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(name_, key);
  if (v->type != GgufValueType::ARRAY || v->elem_type != GgufValueType::STRING)
    return wrong_type(name_, key, *v, "a string array");
  std::vector<std::string_view> out;
  out.reserve(v->array.size());
  for (const GgufValue& e : v->array) out.push_back(e.str);
  return out;
}

Result<int64_t> GgufFile::get_int_or(std::string_view key, int64_t def) const {
  return has(key) ? get_int(key) : Result<int64_t>(def);
}
Result<double> GgufFile::get_float_or(std::string_view key, double def) const {
  return has(key) ? get_float(key) : Result<double>(def);
}
Result<bool> GgufFile::get_bool_or(std::string_view key, bool def) const {
  return has(key) ? get_bool(key) : Result<bool>(def);
}

}  // namespace hyspec
