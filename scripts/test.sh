#!/usr/bin/env bash
# Builds hyspec (CPU preset) and runs every test; also compiles the CUDA backend when nvcc exists,
# so CUDA code never rots unbuilt (its tests run on a GPU machine: scripts/device/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export HYSPEC_FIXTURES="${HYSPEC_FIXTURES:-$(pwd)/../shared/fixtures}"
if [ ! -d "$HYSPEC_FIXTURES" ]; then
  echo "error: oracle fixtures not found at $HYSPEC_FIXTURES (set HYSPEC_FIXTURES)" >&2
  exit 1
fi
JOBS="${JOBS:-$(nproc)}"
cmake --preset cpu > /dev/null
cmake --build --preset cpu -j "$JOBS"
ctest --preset cpu -j "$JOBS" --timeout 900
NVCC="$(command -v nvcc || true)"
[ -n "$NVCC" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || NVCC=/usr/local/cuda/bin/nvcc
if [ -n "$NVCC" ]; then
  echo "== compiling the CUDA backend with $NVCC (no GPU here: CUDA tests run on a GPU machine)"
  cmake --preset cuda -DCMAKE_CUDA_COMPILER="$NVCC" -DHYSPEC_TESTS=ON -DHYSPEC_BENCH=OFF > /dev/null
  cmake --build --preset cuda -j "$JOBS" --target hyspec test_cuda_host
  echo "== host-side tests of the CUDA device decoders (no GPU needed)"
  build-cuda/tests/test_cuda_host --gtest_brief=1
else
  echo "== nvcc not found: CUDA backend not compiled"
fi
