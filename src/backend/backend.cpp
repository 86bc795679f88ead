#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#ifdef HYSPEC_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace hyspec {

bool cuda_backend_built() {
#ifdef HYSPEC_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Result<Weight> weight_geometry(const GgufTensorInfo& t) {
  Weight w;
  w.name = t.name;
  w.type = t.type;
  w.n_in = t.ne[0];
  w.n_out = t.n_dims >= 2 ? t.ne[1] : 1;
  w.n_expert = t.n_dims >= 3 ? t.ne[2] : 1;
  if (t.n_dims > 3 && t.ne[3] != 1) return Status::errorf("tensor '{}': 4-D weights are not supported", t.name);
  HS_ASSIGN_OR_RETURN(w.row_bytes, ggml_row_bytes(t.type, w.n_in));
  return w;
}

Result<BackendKind> parse_backend_kind(const std::string& name) {
  if (name == "cpu") return BackendKind::Cpu;
  if (name == "cuda") return BackendKind::Cuda;
  return Status::errorf("unknown backend '{}' (expected cpu or cuda)", name);
}

Result<std::unique_ptr<Backend>> create_backend(BackendKind kind, const BackendOptions& options) {
  switch (kind) {
    case BackendKind::Cpu:
      return create_cpu_backend(options);
    case BackendKind::Cuda:
#ifdef HYSPEC_HAVE_CUDA
      return create_cuda_backend(options);
#else
      return Status::error("this hyspec was built without CUDA (configure with the 'cuda' preset)");
#endif
  }
  return Status::error("unknown backend kind");
}

}  // namespace hyspec
