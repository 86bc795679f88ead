// libFuzzer target: SafetensorsFile::parse on arbitrary bytes never crashes; every tensor view
// of a parsed file stays in bounds.
#include <cstddef>
#include <cstdint>

#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = hyspec::SafetensorsFile::parse(data, size, "fuzz.safetensors");
  if (!parsed) return 0;
  const hyspec::SafetensorsFile& f = **parsed;
  volatile uint64_t sink = f.metadata().size();
  for (const hyspec::SafetensorsTensor& t : f.tensors()) {
    sink = sink + (f.find(t.name) == &t) + t.shape_string().size();
    for (size_t i = 0; i < t.nbytes; ++i) sink = sink + t.data[i];
    if (t.n_elements() <= (int64_t{1} << 16))
      if (auto v = f.read_f32(t.name)) sink = sink + v->size();
  }
  return 0;
}
