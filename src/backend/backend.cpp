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

void Backend::qk_norm_rope_store(const QkPrepArgs& a) {
  const int64_t n = a.k.n_rows, D = a.head_dim;
  const Rows k_heads(a.k.data, n * a.n_kv_head, D);  // one head per row
  if (a.q.data) rms_norm(Rows(a.q_in.data, n * a.n_head, D, a.q_pitch), a.q_norm, D, a.eps, Rows(a.q.data, n * a.n_head, D));
  rms_norm(k_heads, a.k_norm, D, a.eps, k_heads);
  if (a.q.data) rope_neox(a.q, a.head_dim, a.n_rot, a.positions, a.freq_base);
  rope_neox(a.k, a.head_dim, a.n_rot, a.positions, a.freq_base);
  kv_store(a.k, a.v, a.kv, a.positions);
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
