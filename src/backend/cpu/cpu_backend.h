// The CPU backend: the readable reference implementation of backend.h, multithreaded, with SIMD
// dot products (quant_dot.h) for every weight type. Weights are zero-copy views into the mmap.
#pragma once
#include <memory>

#include "backend/backend.h"

namespace hyspec {

Result<std::unique_ptr<Backend>> create_cpu_backend(const BackendOptions& options);

}  // namespace hyspec
