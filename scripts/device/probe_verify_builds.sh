#!/usr/bin/env bash
# One-off probe (session 20): verify-16 on the anchor's 9B Q4_K_M under several hyspec builds, interleaved,
# to find which change moved it. Here: strip each build to /tmp/var/hyspec_NAME, then
#   (cd /tmp/var && XZ_OPT="-9 -T2" tar cJf $REPO/.device/var.tar.xz hyspec_*)   (xz -9 stores the shared
# CUDA kernels once), with .device/lib from scripts/device/pack.sh; carry [".device", ".anchor"].
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .device/var && tar xJf .device/var.tar.xz -C .device/var
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
W=/tmp/anchor
ANCHOR_MODELS_ONLY=1 bash bench/compare_llamacpp.sh start 9b
while [ ! -f "$W/anchor.done" ] && [ "$SECONDS" -lt 480 ]; do sleep 5; done
echo "models at ${SECONDS}s"
for r in 1 2; do
  for v in .device/var/hyspec_*; do
    echo "-- round $r: $(basename "$v")"
    "$v" bench --backend cuda -m $W/9b-q4km.gguf -p 0 -n 32 --verify 4,16 -c 17000 --kv-type f16 -b 256 2>&1 | grep -E "tg|verify"
  done
done
echo "done at ${SECONDS}s"
