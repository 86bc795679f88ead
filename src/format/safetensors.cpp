#include "format/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "util/half.h"

namespace hyspec {
namespace {

// The reference implementation refuses headers above 100 MB; so do we, before parsing.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeInfo {
  std::string_view name;
  SafetensorsDtype dtype;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {"F64", SafetensorsDtype::F64, 8}, {"F32", SafetensorsDtype::F32, 4}, {"F16", SafetensorsDtype::F16, 2},
    {"BF16", SafetensorsDtype::BF16, 2}, {"I64", SafetensorsDtype::I64, 8}, {"I32", SafetensorsDtype::I32, 4},
    {"I16", SafetensorsDtype::I16, 2},   {"I8", SafetensorsDtype::I8, 1},   {"U8", SafetensorsDtype::U8, 1},
    {"BOOL", SafetensorsDtype::BOOL, 1},
};

// A JSON number that is a non-negative integer (nlohmann keeps 1.0 as a float: not accepted).
bool as_count(const nlohmann::json& j, uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

}  // namespace

std::string_view safetensors_dtype_name(SafetensorsDtype t) {
  for (const DtypeInfo& d : kDtypes)
    if (d.dtype == t) return d.name;
  return "?";
}

size_t safetensors_dtype_size(SafetensorsDtype t) {
  for (const DtypeInfo& d : kDtypes)
    if (d.dtype == t) return d.size;
  return 0;
}

int64_t SafetensorsTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsTensor::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  HS_ASSIGN_OR_RETURN(MappedFile m, MappedFile::open(path));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->mapping_ = std::move(m);
  f->base_ = f->mapping_.data();
  f->size_ = f->mapping_.size();
  f->name_ = path;
  HS_RETURN_IF_ERROR(f->parse_all());
  return f;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::parse(const uint8_t* data, size_t size,
                                                                const std::string& name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->base_ = data;
  f->size_ = size;
  f->name_ = name;
  HS_RETURN_IF_ERROR(f->parse_all());
  return f;
}

Status SafetensorsFile::parse_all() {
  const std::string& fn = name_;
  if (size_ < 8) return Status::errorf("{}: not a safetensors file (only {} bytes)", fn, size_);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base_, 8);
  if (header_len > size_ - 8)
    return Status::errorf("{}: header of {} bytes extends past the end of the file ({} bytes)", fn, header_len, size_);
  if (header_len > kMaxHeaderBytes) return Status::errorf("{}: header of {} bytes is too large", fn, header_len);
  const auto* hbegin = reinterpret_cast<const char*>(base_ + 8);
  const nlohmann::json header = nlohmann::json::parse(hbegin, hbegin + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return Status::errorf("{}: header is not valid JSON", fn);
  if (!header.is_object()) return Status::errorf("{}: header is not a JSON object", fn);

  const size_t data_start = 8 + static_cast<size_t>(header_len);
  const size_t data_size = size_ - data_start;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") {
      if (!entry.is_object()) return Status::errorf("{}: __metadata__ is not an object", fn);
      for (const auto& [mk, mv] : entry.items()) {
        if (!mv.is_string()) return Status::errorf("{}: __metadata__ '{}' is not a string", fn, mk);
        metadata_.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    if (!entry.is_object()) return Status::errorf("{}: tensor '{}': entry is not an object", fn, key);
    SafetensorsTensor t;
    t.name = key;

    const auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) return Status::errorf("{}: tensor '{}': missing dtype", fn, key);
    const std::string& dname = dt->get_ref<const std::string&>();
    const DtypeInfo* info = nullptr;
    for (const DtypeInfo& d : kDtypes)
      if (d.name == dname) info = &d;
    if (!info) return Status::errorf("{}: tensor '{}': unsupported dtype '{}'", fn, key, dname);
    t.dtype = info->dtype;

    const auto sh = entry.find("shape");
    if (sh == entry.end() || !sh->is_array()) return Status::errorf("{}: tensor '{}': missing shape", fn, key);
    uint64_t n_elements = 1;
    for (const nlohmann::json& d : *sh) {
      uint64_t dim = 0;
      if (!as_count(d, dim)) return Status::errorf("{}: tensor '{}': shape entry {} is not a count", fn, key,
                              d.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      if (dim != 0 && n_elements > std::numeric_limits<uint64_t>::max() / 8 / dim)
        return Status::errorf("{}: tensor '{}': element count overflows", fn, key);
      n_elements *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }

    const auto off = entry.find("data_offsets");
    uint64_t begin = 0, end = 0;
    if (off == entry.end() || !off->is_array() || off->size() != 2 || !as_count((*off)[0], begin) ||
        !as_count((*off)[1], end))
      return Status::errorf("{}: tensor '{}': data_offsets is not a pair of counts", fn, key);
    if (begin > end) return Status::errorf("{}: tensor '{}': data_offsets [{}, {}] are reversed", fn, key, begin, end);
    if (end > data_size)
      return Status::errorf("{}: tensor '{}': data_offsets [{}, {}] extend past the data section ({} bytes): "
                            "file truncated?", fn, key, begin, end, data_size);
    const uint64_t want = n_elements * info->size;
    if (end - begin != want)
      return Status::errorf("{}: tensor '{}': data_offsets span {} bytes, but {} {} needs {}", fn, key, end - begin,
                            dname, t.shape_string(), want);
    t.offset = static_cast<size_t>(begin);
    t.nbytes = static_cast<size_t>(want);
    t.data = base_ + data_start + t.offset;
    tensors_.push_back(std::move(t));
  }

  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.offset < b.offset; });
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (i > 0 && tensors_[i - 1].offset + tensors_[i - 1].nbytes > tensors_[i].offset)
      return Status::errorf("{}: tensors '{}' and '{}' overlap", fn, tensors_[i - 1].name, tensors_[i].name);
    index_.emplace(tensors_[i].name, i);  // JSON object keys are unique after parsing
  }
  return Status::ok();
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<std::vector<float>> SafetensorsFile::read_f32(std::string_view name) const {
  const SafetensorsTensor* t = find(name);
  if (!t) return Status::errorf("{}: no tensor '{}'", name_, name);
  const size_t n = static_cast<size_t>(t->n_elements());
  std::vector<float> out(n);
  const uint8_t* p = t->data;
  switch (t->dtype) {
    case SafetensorsDtype::F32:
      if (n) std::memcpy(out.data(), p, n * 4);
      break;
    case SafetensorsDtype::F16:
    case SafetensorsDtype::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = t->dtype == SafetensorsDtype::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
      }
      break;
    case SafetensorsDtype::F64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      break;
    default:
      return Status::errorf("{}: tensor '{}' is {}, not a floating-point dtype", name_, name,
                            safetensors_dtype_name(t->dtype));
  }
  return out;
}

}  // namespace hyspec
