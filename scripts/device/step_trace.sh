#!/usr/bin/env bash
# Where a step's time goes along the PDL chain (carry [".device"]): .device/bin holds hyspec and hyspec_trace
# (a -DHYSPEC_STEP_TRACE=ON build), the synthetic 9B Q4_K_M is filled from its skeleton, and the trace build
# prints the last graph step's kernels (step_trace.h) for a decode step at depth 0 and at TRACE_DEPTH, and a
# verify step of TRACE_VERIFY rows; each to $OUT/trace_*.md. Then the plain build's steps with HYSPEC_PROFILE_SKIP
# 0/1/2 (everything; the weight matmuls alone; all but them) and the trace build untraced, two rounds.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
D=.device M=/tmp/9b.gguf
xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > "$M" && "$D/bin/gguf_skeleton" fill "$M" > /dev/null || exit 3
DEPTH=${TRACE_DEPTH:-16384}
trace() {  # name, bench arguments
  local name=$1; shift
  HYSPEC_STEP_TRACE=1 HYSPEC_STEP_TRACE_STEPS=2 "$D/bin/hyspec_trace" bench -m "$M" --backend cuda "$@" > "$OUT/trace_$name.md" 2>&1
  echo "== $name: $(grep -E "^STEP (trace|total|[0-9]+ unaligned)" "$OUT/trace_$name.md" | tr '\n' ' ')"
}
trace decode -p 0 -n 32 -c 4096 --kv-type f16
trace decode_q8 -p 0 -n 32 -c 4096 --kv-type q8_0
trace depth -p 0 -n 32 -d "$DEPTH" -c $((DEPTH + 216)) --kv-type q8_0
trace verify -p 0 -n 0 --verify "${TRACE_VERIFY:-15}" -c 4096 --kv-type f16
echo "== tg128 (ms a step): plain build with HYSPEC_PROFILE_SKIP 0 / 1 (matmuls alone) / 2 (all but matmuls), trace build untraced"
for round in 1 2; do
  for skip in 0 1 2; do
    echo "-- round $round skip $skip $(HYSPEC_PROFILE_SKIP=$skip "$D/bin/hyspec" bench -m "$M" --backend cuda -p 0 -n 128 \
      --verify 15 -c 4096 --kv-type f16 2>&1 | grep -E "tg128|verify" | awk -F'|' '{printf "%s %s;", $4, $5}')"
  done
  echo "-- round $round trace build $("$D/bin/hyspec_trace" bench -m "$M" --backend cuda -p 0 -n 128 --verify 15 -c 4096 \
    --kv-type f16 2>&1 | grep -E "tg128|verify" | awk -F'|' '{printf "%s %s;", $4, $5}')"
done | tee "$OUT/profile_skip.md"
