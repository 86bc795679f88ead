#!/usr/bin/env bash
# Here: a CPU-only, statically linked llama-quantize from the pinned llama.cpp source
# (.anchor/llama.cpp-src.tar.xz, bench/pack_llamacpp.sh) as .anchor/llama-quantize (~3 MB), so that a
# probe call can make the anchor's Q4_K_M without building llama.cpp with CUDA there (~4 min): the
# quantization is ggml's CPU code either way, so the file is the one the anchor makes. ~15 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${LQ_BUILD_DIR:-/tmp/llama-quantize-src}
rm -rf "$SRC" && mkdir -p "$SRC" && tar xJf .anchor/llama.cpp-src.tar.xz -C "$SRC"
cmake -S "$SRC" -B "$SRC/build" -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release > "$SRC/cmake.log"
cmake --build "$SRC/build" -j "$(nproc)" --target llama-quantize > "$SRC/build.log"
strip -o .anchor/llama-quantize "$SRC/build/bin/llama-quantize"
ls -la .anchor/llama-quantize
