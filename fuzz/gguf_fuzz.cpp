// libFuzzer target: GgufFile::parse on arbitrary bytes must return a value or an error, never
// crash, and every accessor of a parsed file must stay in bounds (ASan/UBSan watch it).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "format/gguf.h"
#include "format/quants.h"

namespace {

// Reads every byte a value views (strings, nested elements) so ASan sees any out-of-bounds view.
uint64_t touch(const hyspec::GgufValue& v) {
  uint64_t h = static_cast<uint64_t>(v.type) + v.scalar.u;
  for (char c : v.str) h = h * 31 + static_cast<unsigned char>(c);
  for (const hyspec::GgufValue& e : v.array) h += touch(e);
  if (v.is_number()) h += static_cast<uint64_t>(v.as_int()) + static_cast<uint64_t>(v.as_double() != 0.0);
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = hyspec::GgufFile::parse(data, size, "fuzz.gguf");
  if (!parsed) return 0;
  const hyspec::GgufFile& f = **parsed;
  volatile uint64_t sink = f.version() + f.alignment() + f.file_size();

  for (const auto& [key, value] : f.metadata()) {
    sink = sink + touch(value) + (f.find(key) == &value);
    // Every typed getter, whatever the stored type: each returns a value or an error.
    sink = sink + f.get_int(key).is_ok() + f.get_float(key).is_ok() + f.get_bool(key).is_ok();
    sink = sink + f.get_string(key).is_ok() + f.get_int_or(key, 0).is_ok() + f.get_float_or(key, 0).is_ok();
    sink = sink + f.get_bool_or(key, false).is_ok();
    if (auto a = f.get_int_array(key)) sink = sink + a->size();
    if (auto a = f.get_float_array(key)) sink = sink + a->size();
    if (auto a = f.get_string_array(key))
      for (std::string_view s : *a) sink = sink + s.size();
  }

  std::vector<float> row;
  for (const hyspec::GgufTensorInfo& t : f.tensors()) {
    sink = sink + (f.find_tensor(t.name) == &t) + t.shape_string().size() + static_cast<uint64_t>(t.n_elements());
    uint64_t sum = 0;
    for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
    sink = sink + sum;
    // Decode the first row: exercises the block decoders on arbitrary bytes.
    if (t.ne[0] <= (int64_t{1} << 16)) {
      row.resize(static_cast<size_t>(t.ne[0]));
      sink = sink + hyspec::dequantize_row(t.type, t.data, row.data(), t.ne[0]).is_ok();
    }
  }
  return 0;
}
