// The CUDA backend: every op of backend.h on one CUDA stream, weights uploaded once in their GGML
// type, steps recorded as CUDA graphs. Errors (a failing CUDA call, an unsupported shape or type)
// are recorded and reported by synchronize(); ops never abort.
#pragma once
#include <memory>

#include "backend/backend.h"

namespace hyspec {

// Fails with a message when no CUDA device is usable (no driver, no device, bad ordinal).
Result<std::unique_ptr<Backend>> create_cuda_backend(const BackendOptions& options);

}  // namespace hyspec
