#include "model/binder.h"

namespace hyspec {

Binder::Binder(Backend& backend, const GgufFile& file, bool dequant)
    : Binder(
          backend, file.path(), [&file](std::string_view n) { return file.find_tensor(n); }, dequant) {}

Binder::Binder(Backend& backend, std::string source, Lookup lookup, bool dequant)
    : backend_(backend), source_(std::move(source)), lookup_(std::move(lookup)), dequant_(dequant) {}

const GgufTensorInfo* Binder::checked(const std::string& name, std::initializer_list<int64_t> shape, bool required) {
  if (!status_.is_ok()) return nullptr;
  const GgufTensorInfo* t = lookup_(name);
  if (!t) {
    if (required) status_ = Status::errorf("{}: missing tensor '{}'", source_, name);
    return nullptr;
  }
  int d = 0;
  for (int64_t want : shape) {
    const int64_t have = d < t->n_dims ? t->ne[d] : 1;
    if (have != want) {
      std::string expect = "[";
      for (int64_t s : shape) expect += fmt::format("{}{}", expect.size() > 1 ? ", " : "", s);
      status_ = Status::errorf("{}: tensor '{}' has shape {}, expected {}]", source_, name, t->shape_string(), expect);
      return nullptr;
    }
    ++d;
  }
  for (; d < t->n_dims; ++d)
    if (t->ne[d] != 1) {
      status_ = Status::errorf("{}: tensor '{}' has shape {}, too many dimensions", source_, name, t->shape_string());
      return nullptr;
    }
  return t;
}

Weight Binder::get(const std::string& name, std::initializer_list<int64_t> shape, bool required, bool force_f32) {
  Weight w;
  const GgufTensorInfo* t = checked(name, shape, required);
  if (!t) return w;
  auto r = backend_.load_weight(*t, dequant_ || force_f32);
  if (!r) {
    status_ = r.status().with_context(source_);
    return w;
  }
  return std::move(r).value();
}

StackedProjection Binder::get_stacked(std::initializer_list<std::pair<std::string, int64_t>> parts, int64_t n_in) {
  StackedProjection sp;
  std::vector<const GgufTensorInfo*> infos;
  for (const auto& [name, n_out] : parts) {
    const GgufTensorInfo* t = checked(name, {n_in, n_out}, true);
    if (!t) return {};
    infos.push_back(t);
    sp.begin.push_back(sp.width);
    sp.width += n_out;
  }
  for (size_t i = 0; i < infos.size();) {
    size_t j = i + 1;
    while (j < infos.size() && infos[j]->type == infos[i]->type) ++j;
    GgufTensorInfo stacked = *infos[i];
    // A run of several parts: their rows copied into one host array, which a zero-copy backend keeps.
    std::shared_ptr<std::vector<uint8_t>> bytes;
    if (j - i > 1) {
      bytes = std::make_shared<std::vector<uint8_t>>(infos[i]->data, infos[i]->data + infos[i]->nbytes);
      stacked.n_dims = 2;
      for (size_t k = i + 1; k < j; ++k) {
        bytes->insert(bytes->end(), infos[k]->data, infos[k]->data + infos[k]->nbytes);
        stacked.name += "+" + infos[k]->name;
        stacked.ne[1] += infos[k]->ne[1];
      }
      stacked.nbytes = bytes->size();
      stacked.data = bytes->data();
    }
    auto r = backend_.load_weight(stacked, dequant_);
    if (!r) {
      status_ = r.status().with_context(source_);
      return {};
    }
    Weight w = std::move(r).value();
    if (bytes && !w.owner) w.owner = bytes;  // a view of our copy (CPU): keep the copy
    sp.weights.push_back(std::move(w));
    i = j;
  }
  return sp;
}

void StackedProjection::matmul(Backend& backend, Rows x, Rows out) const {
  std::vector<Backend::MatmulPart> parts;
  int64_t col = 0;
  for (const Weight& w : weights) {
    parts.push_back({&w, out.cols(col, w.n_out)});
    col += w.n_out;
  }
  backend.matmul_many(x, parts.data(), parts.size());
}

std::string blk(int i, const char* name) { return fmt::format("blk.{}.{}", i, name); }

}  // namespace hyspec
