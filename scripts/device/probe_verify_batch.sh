#!/usr/bin/env bash
# One-off probe (session 20): verify-16 on the anchor's 9B Q4_K_M at the CUDA default batch (512) against -b 256,
# two rounds, then Q3_K_M with both engines. carry [".device", ".anchor"].
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -d .device/bin ] || tar xJf .device/bin.tar.xz -C .device
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
W=/tmp/anchor H=.device/bin/hyspec
ANCHOR_MODELS_ONLY=1 bash bench/compare_llamacpp.sh start 9b
while [ ! -f "$W/anchor.done" ] && [ "$SECONDS" -lt 480 ]; do sleep 5; done
echo "models at ${SECONDS}s"; ls $W/*.gguf
b() { echo "-- $*"; "$H" bench --backend cuda "$@" 2>&1 | grep -E "tg|verify"; }
for r in 1 2; do
  b -m $W/9b-q4km.gguf -p 0 -n 32 --verify 16 -c 17000 --kv-type f16
  b -m $W/9b-q4km.gguf -p 0 -n 32 --verify 16 -c 17000 --kv-type f16 -b 256
done
q=Q3_K_M; f=$W/9b-$q.gguf
"$W/llama.cpp/build/bin/llama-quantize" "$W/9b-bf16.gguf" "$f" "$q" > /dev/null 2>&1 && {
  "$W/llama.cpp/build/bin/llama-bench" -m "$f" -p 0 -n 128 -r 3 -fa 1 -ngl 99 2>&1 | grep -E "^\|"
  b -m "$f" -p 0 -n 128 --verify 16 -c 4096 --kv-type f16; }
echo "done at ${SECONDS}s"
