#!/usr/bin/env bash
# Side by side with llama.cpp in ONE device call, on the synthetic GGUF that ab.sh's AB_SYNTH makes: the repo's 9B
# Q4_K_M skeleton (made by llama.cpp's llama-quantize) filled with random weights, or resized to the anchor's 27B
# shape with llama.cpp's Q4_K_M types by layer (`gguf_skeleton resize`, checked against llama-quantize's choices by
# GgufSkeleton.ResizeMakesThe27BOfThe9BWithLlamaCppsTypes). Both engines read the same file. Unlike
# bench/compare_llamacpp.sh (the anchor's checkpoint, converter and quantizer, two calls with the ~490 s llama.cpp
# build on the device), llama-bench is built here, once, and carried:
#   bench/compare_llamacpp_synth.sh build   # here: .anchor/llama-bench.xz from .anchor/llama.cpp-src.tar.xz
#                                            # (bench/pack_llamacpp.sh), CUDA sm_90, static; ~25 min on 2 cores
#   bench/compare_llamacpp_synth.sh run 27b # there: SHAPE 9b or 27b (~25 s for the 27B on an H200)
# The carry: [".device", ".anchor/llama-bench.xz"], .device from `HYSPEC_DEVICE_BINS="" HYSPEC_DEVICE_FIXTURES=""
# scripts/device/pack.sh` (hyspec and gguf_skeleton, ~21 MB) and the 41 MB llama-bench: with the tree that is past
# the 64 MiB the device takes unless the 25 MB demo models under models/ are moved aside for the call.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?build|run}
if [ "$MODE" = build ]; then
  set -e
  SRC=${LLAMA_BUILD_DIR:-/tmp/llama.cpp-synth}
  mkdir -p "$SRC" && tar xJf .anchor/llama.cpp-src.tar.xz -C "$SRC"
  cmake -S "$SRC" -B "$SRC/build" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_BUILD_TYPE=Release > "$SRC/cmake.log"
  cmake --build "$SRC/build" -j "$(nproc)" --target llama-bench > "$SRC/build.log"
  strip -o "$SRC/llama-bench" "$SRC/build/bin/llama-bench"
  XZ_OPT="-9 -T2" xz -c "$SRC/llama-bench" > .anchor/llama-bench.xz
  ls -la .anchor/llama-bench.xz
  exit 0
fi
SHAPE=${2:-27b}
D=.device; OUT=${OUT:-/tmp/hyspec-out}; mkdir -p "$OUT"
[ -d "$D/bin" ] || tar xJf "$D/bin.tar.xz" -C "$D"
export LD_LIBRARY_PATH="$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
if [ ! -x /tmp/llama-bench ]; then
  [ -f .anchor/llama-bench.xz ] || { echo "no .anchor/llama-bench.xz: run '$0 build' here and carry it" >&2; exit 2; }
  xz -dc .anchor/llama-bench.xz > /tmp/llama-bench.part && chmod +x /tmp/llama-bench.part && mv /tmp/llama-bench.part /tmp/llama-bench || exit 3
fi
M=$(bash bench/synth_gguf.sh "$SHAPE" "$D/bin/gguf_skeleton") || exit 3
echo "== $(basename "$M") made and filled after ${SECONDS}s"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
echo "== llama.cpp (llama-bench -ngl 99 -fa 1)"
/tmp/llama-bench -m "$M" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o md 2> "$OUT/llama-bench.err" | grep '^|' | tee "$OUT/llamacpp_synth.md" ||
  tail -5 "$OUT/llama-bench.err"
echo "== hyspec bench"
"$D/bin/hyspec" bench -m "$M" --backend cuda -p 512 -n 128 --verify 1,4,16 -c 4096 --kv-type f16 2>&1 | tee "$OUT/hyspec_synth.md"
