#include "model/binder.h"

namespace hyspec {

Binder::Binder(Backend& backend, const GgufFile& file, bool dequant)
    : Binder(
          backend, file.path(), [&file](std::string_view n) { return file.find_tensor(n); }, dequant) {}

Binder::Binder(Backend& backend, std::string source, Lookup lookup, bool dequant)
    : backend_(backend), source_(std::move(source)), lookup_(std::move(lookup)), dequant_(dequant) {}

Weight Binder::get(const std::string& name, std::initializer_list<int64_t> shape, bool required, bool force_f32) {
  Weight w;
  if (!status_.is_ok()) return w;
  const GgufTensorInfo* t = lookup_(name);
  if (!t) {
    if (required) status_ = Status::errorf("{}: missing tensor '{}'", source_, name);
    return w;
  }
  int d = 0;
  for (int64_t want : shape) {
    const int64_t have = d < t->n_dims ? t->ne[d] : 1;
    if (have != want) {
      std::string expect = "[";
      for (int64_t s : shape) expect += fmt::format("{}{}", expect.size() > 1 ? ", " : "", s);
      status_ = Status::errorf("{}: tensor '{}' has shape {}, expected {}]", source_, name, t->shape_string(), expect);
      return w;
    }
    ++d;
  }
  for (; d < t->n_dims; ++d)
    if (t->ne[d] != 1) {
      status_ = Status::errorf("{}: tensor '{}' has shape {}, too many dimensions", source_, name, t->shape_string());
      return w;
    }
  auto r = backend_.load_weight(*t, dequant_ || force_f32);
  if (!r) {
    status_ = r.status().with_context(source_);
    return w;
  }
  return std::move(r).value();
}

std::string blk(int i, const char* name) { return fmt::format("blk.{}.{}", i, name); }

}  // namespace hyspec
