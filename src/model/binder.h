// Binds model weights by GGUF tensor name, checking presence and shape. Every model loader uses it,
// whatever the tensors come from: a GGUF file, or an HF directory translated to GGUF names and
// layouts (model/dflash_hf.cpp). The first error is kept; later calls return empty weights.
#pragma once
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "format/gguf.h"

namespace hyspec {

// Projections of one input, stacked row-wise: part i's outputs are columns [begin[i], begin[i] + n_out)
// of one [n, width] result. Consecutive parts of one stored type share a backend weight, so they cost
// one matmul (one pass over the input) instead of one each, and the runs go to the backend as one
// matmul_many; a row's result does not depend on the rows stacked with it.
struct StackedProjection {
  std::vector<Weight> weights;  // one per run of same-type parts
  std::vector<int64_t> begin;   // first output column of each part
  int64_t width = 0;            // outputs of all parts

  // out: [n, width] (x.n_cols == n_in)
  void matmul(Backend& backend, Rows x, Rows out) const;
  // Part i's columns of a [n, width] result.
  Rows part(Rows out, size_t i) const {
    return out.cols(begin[i], (i + 1 < begin.size() ? begin[i + 1] : width) - begin[i]);
  }
};

class Binder {
 public:
  using Lookup = std::function<const GgufTensorInfo*(std::string_view name)>;

  Binder(Backend& backend, const GgufFile& file, bool dequant);
  // `source` names the origin in error messages (a path).
  Binder(Backend& backend, std::string source, Lookup lookup, bool dequant);

  // shape: GGUF dims, input first ([n_in, n_out(, n_expert)]); trailing dims of 1 may be omitted.
  // force_f32: convert at load whatever the stored type (norm vectors read through Weight::f32()).
  Weight get(const std::string& name, std::initializer_list<int64_t> shape, bool required = true,
             bool force_f32 = false);
  // Tensors [n_in, n_out_i] of one input, bound as a StackedProjection (parts in the order given).
  StackedProjection get_stacked(std::initializer_list<std::pair<std::string, int64_t>> parts, int64_t n_in);
  // The tensor's record without binding it (null when absent): for shapes the metadata does not give.
  const GgufTensorInfo* find(std::string_view name) const { return lookup_(name); }
  const std::string& source() const { return source_; }
  const Status& status() const { return status_; }
  // Keep an error found by the caller (metadata that contradicts the tensors).
  void fail(Status s) {
    if (status_.is_ok()) status_ = std::move(s);
  }

 private:
  const GgufTensorInfo* checked(const std::string& name, std::initializer_list<int64_t> shape, bool required);

  Backend& backend_;
  std::string source_;
  Lookup lookup_;
  bool dequant_;
  Status status_;
};

// "blk.<i>.<name>": the GGUF name of a per-layer tensor.
std::string blk(int i, const char* name);

}  // namespace hyspec
