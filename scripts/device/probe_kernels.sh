#!/usr/bin/env bash
# One device call for kernel work without building llama.cpp (carry [".device", ".anchor"]; ~6 min; with
# PROBE_SYNTH=1 below, carry [".device"] and ~3 min):
#   1. the anchor's random BF16 9B (ANCHOR_BF16_ONLY=1, ~110 s), quantized to Q4_K_M by the CPU-only
#      llama-quantize carried as .anchor/llama-quantize (bench/build_llama_quantize.sh: ggml's own
#      quantization, the file the anchor makes);
#   2. meanwhile PROBE_EARLY, a script sourced (CUDA tests, kernel benches, ncu of single launches);
#   3. on the Q4_K_M file: hyspec bench (tg128 at depth 0 and 16384 with F16 and Q8_0 caches, verify
#      1/4/16) and, unless PROBE_KT=0, ncu's GPU time per kernel of decode and verify-16 steps;
#   4. PROBE_EXTRA: commands eval'd at the end ($M4 the Q4_K_M file, $M16 the BF16 one, $H hyspec).
# Logs in $OUT.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
W=/tmp/anchor H=.device/bin/hyspec M16=/tmp/anchor/9b-bf16.gguf M4=/tmp/anchor/9b-q4km.gguf
export H M16 M4
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
# PROBE_SYNTH=1: the 9B Q4_K_M from the anchor file's skeleton in the repo (its exact header, random weights:
# tools/gguf_skeleton) in ~20 s instead of ~190 s; for A/Bs of hyspec builds only (no BF16 file, $M16 unset).
SK=bench/data/9b-q4km.skeleton.gguf.xz
if [ "${PROBE_SYNTH:-0}" = 1 ] && [ ! -f "$M4" ]; then
  [ -f "$SK" ] || { echo "PROBE_SYNTH=1 needs $SK"; exit 3; }
  mkdir -p "$W" && xz -T0 -dc "$SK" > "$M4.tmp" && .device/bin/gguf_skeleton fill "$M4.tmp" && mv "$M4.tmp" "$M4"
  echo "== synthetic Q4_K_M at ${SECONDS}s"; M16=
fi
if [ ! -f "$M4" ]; then
  [ -f "$M16" ] || ANCHOR_BF16_ONLY=1 bash bench/compare_llamacpp.sh start 9b
  setsid nohup bash -c "while [ ! -f $W/anchor.done ]; do sleep 2; done; \
    .anchor/llama-quantize $M16 $M4.tmp Q4_K_M $(nproc) > $W/quant.log 2>&1 && mv $M4.tmp $M4; echo done > $W/quant.done" \
    > /dev/null 2>&1 &
fi
[ -z "${PROBE_EARLY:-}" ] || { echo "== $PROBE_EARLY"; source "$PROBE_EARLY"; } 2>&1 | tee "$OUT/early.log"
while [ ! -f "$M4" ] && [ ! -f "$W/quant.done" ]; do [ "$SECONDS" -lt 420 ] || break; sleep 3; done
echo "== Q4_K_M 9B at ${SECONDS}s: $(ls -la "$M4" 2>&1)"; tail -2 "$W/quant.log" 2>/dev/null
[ -f "$M4" ] || { tail -5 "$W/anchor.err"; exit 3; }
bench() { echo "== hyspec bench $*"; "$H" bench --backend cuda "$@" 2>&1 | grep -E "^\| (model|---|.*(pp|tg|verify))"; }
{
  bench -m "$M4" -p 0 -n 128 --verify 1,4,16 -c 4096 --kv-type f16
  bench -m "$M4" -p 0 -n 64 -d 0,16384 -c 16600 --kv-type f16
  bench -m "$M4" -p 0 -n 64 -d 0,16384 -c 16600 --kv-type q8_0
} 2>&1 | tee "$OUT/bench.log"
if [ "${PROBE_KT:-1}" != 0 ]; then
  { echo "== GPU time per kernel, decode (16 steps)"; KT_STEPS=16 bash bench/kernel_times.sh "$M4" 600 900
    echo "== GPU time per kernel, verify-16 (9 steps)"; KT_BENCH="-p 0 -n 0 --verify 16" KT_STEPS=9 bash bench/kernel_times.sh "$M4" 0 20000
  } 2>&1 | tee "$OUT/kernel_times.log"
fi
[ -z "${PROBE_EXTRA:-}" ] || { echo "== $PROBE_EXTRA"; eval "$PROBE_EXTRA"; } 2>&1 | tee "$OUT/extra.log"
echo "== done at ${SECONDS}s"
