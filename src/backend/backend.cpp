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
