#!/usr/bin/env bash
# Here (npm reaches its registry; the GPU machine has no network): the llama.cpp source that
# node-llama-cpp@3.22.1 pins, as .anchor/llama.cpp-src.tar.xz, and ../shared/tools/llamacpp_anchor.sh
# beside it, for bench/compare_llamacpp.sh with carry [".anchor"] (6.7 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
( cd "$TMP" && npm pack -q node-llama-cpp@3.22.1 > /dev/null &&
  tar xzf node-llama-cpp-3.22.1.tgz package/llama/gitRelease.bundle &&
  git -c advice.detachedHead=false clone -q package/llama/gitRelease.bundle src )
rm -rf .anchor && mkdir -p .anchor
# The tree only (no .git; compare_llamacpp.sh unpacks it where the anchor would clone the bundle), less
# what a CUDA build of llama-bench/llama-quantize and the converter never read: docs, media, the vocab
# test GGUFs and the other backends' sources (23 MB -> 6.7 MB packed).
SKIP=(docs media benches 'models/*.gguf')
for b in sycl vulkan opencl hexagon metal et cann webgpu zdnn zendnn openvino virtgpu hip musa; do SKIP+=("ggml/src/ggml-$b"); done
git -C "$TMP/src" archive --format=tar HEAD -- . "${SKIP[@]/#/:(exclude)}" | XZ_OPT="-9 -T2" xz > .anchor/llama.cpp-src.tar.xz
cp "${HYSPEC_SHARED:-../shared}/tools/llamacpp_anchor.sh" .anchor/
du -sh .anchor
