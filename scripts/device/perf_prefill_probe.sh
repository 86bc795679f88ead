#!/usr/bin/env bash
# Where a 512-token prompt step's time goes, without llama.cpp (carry [".device", ".anchor"]; ~4 min):
# the anchor's random 9B in BF16 (ANCHOR_BF16_ONLY=1), then on it
#   - the step timed as the engine runs it, with the host's enqueue time beside it (HYSPEC_BENCH_ENQUEUE),
#   - the same step recorded as a graph (HYSPEC_BENCH_PREFILL_GRAPH: no host launches),
#   - the op profile (median per call: first calls load modules),
#   - nsys's CUDA API and kernel summaries where nsys is installed.
# PROBE_EARLY=FILE: a script sourced while the model is made (tests, kernel benches); PROBE_EXTRA="cmd;
# cmd": more commands at the end (eval), with $M the BF16 file and $H hyspec.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
W=/tmp/anchor H=.device/bin/hyspec M=/tmp/anchor/9b-bf16.gguf
export H M
[ -f "$M" ] || ANCHOR_BF16_ONLY=1 bash bench/compare_llamacpp.sh start 9b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}; cpus: $(nproc)"
[ -z "${PROBE_EARLY:-}" ] || { echo "== $PROBE_EARLY"; source "$PROBE_EARLY"; } 2>&1 | tee "$OUT/early.log"
while [ ! -f "$M" ] || [ ! -f "$W/anchor.done" ]; do [ "$SECONDS" -lt 300 ] || break; sleep 5; done
echo "== BF16 9B at ${SECONDS}s: $(ls -la $M 2>&1)"
[ -f "$M" ] || exit 3
bench() { echo "== hyspec $*"; "$H" bench --backend cuda "$@" 2>&1 | grep -E "^\| (model|---|.*(pp|tg|verify))|time_forward"; }
{
  HYSPEC_BENCH_ENQUEUE=1 bench -m "$M" -p 512 -n 0 -c 4096 --kv-type f16
  HYSPEC_BENCH_ENQUEUE=1 bench -m "$M" -p 512 -n 0 -c 4096 --kv-type f16 -b 256
  HYSPEC_BENCH_ENQUEUE=1 HYSPEC_BENCH_PREFILL_GRAPH=1 bench -m "$M" -p 512 -n 0 -c 4096 --kv-type f16
} 2>&1 | tee "$OUT/prefill.log"
{
  echo "== op profile, 512-token prompt (BF16)"
  HYSPEC_CUDA_PROFILE=1 "$H" bench -m "$M" --backend cuda --no-graphs -p 512 -n 0 -c 4096 --kv-type f16 2>&1 |
    grep -E "^\||HYSPEC_CUDA_PROFILE" | head -45
} 2>&1 | tee "$OUT/profile.log"
if [ -n "$NSYS" ]; then
  {
    echo "== nsys, 512-token prompt (BF16)"
    timeout 200 "$NSYS" profile -o /tmp/pp512 -t cuda,nvtx --force-overwrite true \
      "$H" bench -m "$M" --backend cuda -p 512 -n 0 -c 4096 --kv-type f16 > /tmp/nsys.log 2>&1
    tail -3 /tmp/nsys.log
    "$NSYS" stats -r cuda_api_sum,cuda_gpu_kern_sum /tmp/pp512.nsys-rep 2>&1 | head -80
  } 2>&1 | tee "$OUT/nsys.log"
fi
[ -z "${PROBE_EXTRA:-}" ] || { echo "== $PROBE_EXTRA"; eval "$PROBE_EXTRA"; } 2>&1 | tee "$OUT/extra.log"
echo "== done at ${SECONDS}s"
