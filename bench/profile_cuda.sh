#!/usr/bin/env bash
# Where a step's GPU time goes, op by op (HYSPEC_CUDA_PROFILE, src/backend/cuda/op_profiler.h): one
# `hyspec bench` per step kind (prefill of 512, decode, verify-16), unrecorded (--no-graphs) so every
# op is bracketed by events. On the GPU machine, after bench/compare_llamacpp.sh made the files:
#   bench/profile_cuda.sh /tmp/anchor/9b-q4km.gguf [/tmp/anchor/9b-bf16.gguf ...]
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d .device/bin ] || tar xJf .device/bin.tar.xz -C .device
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
for m in "$@"; do
  for step in "-p 512 -n 0" "-p 0 -n 32" "-p 0 -n 0 --verify 16"; do
    echo "== $(basename "$m"): $step"
    # shellcheck disable=SC2086
    HYSPEC_CUDA_PROFILE=1 .device/bin/hyspec bench -m "$m" --backend cuda --no-graphs --kv-type f16 -c 4096 $step 2>&1 |
      grep -E "^\| (model|---|.*(pp|tg|verify))|HYSPEC_CUDA_PROFILE|^\| [a-z_]+ " | head -40
  done
done
