#!/usr/bin/env bash
# The side-by-side of PERFORMANCE.md in ONE device call (carry [".device", ".anchor"]), for sessions whose
# warm machine may go back between two calls (perf_session.sh's start/finish need it kept): the anchor
# detached (llama.cpp build, the 9B files, llama-bench pp512/tg128 alone on the GPU; its pp1..32 sweep
# left out for time), the CUDA tests and kernel benches while it builds (probe_early_tests.sh), then hyspec on the same
# files, most wanted first; every result is teed under $OUT, so a call cut at its limit still returns them.
#   ONE_NATIVE="IQ4_XS ...": then llama-quantize those and bench both engines, while the call's time lasts.
#   ONE_EXTRA="cmd; cmd": more commands at the end (eval; bench ARGS runs hyspec bench, $W the files).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -d .device/bin ] || tar xJf .device/bin.tar.xz -C .device
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OUT=${OUT:-/tmp/hyspec-out}
W=/tmp/anchor H=.device/bin/hyspec
ANCHOR_NO_SWEEP=1 bash bench/compare_llamacpp.sh start 9b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
source scripts/device/probe_early_tests.sh 2>&1 | tee "$OUT/tests.log"
while [ ! -f "$W/anchor.done" ] && [ "$SECONDS" -lt 500 ]; do sleep 5; done
echo "== llama.cpp (llama-bench -ngl 99 -fa 1 -r 3), at ${SECONDS}s"; cat "$W/anchor.md"; tail -2 "$W/anchor.err"
cp "$W/anchor.md" "$OUT/llamacpp.md" 2>/dev/null
bench() { echo "== hyspec $*"; "$H" bench --backend cuda "$@" 2>&1 | grep -E "^\| (model|---|.*(pp|tg|verify))"; }
{
  for kv in q8_0 f16; do bench -m "$W/9b-q4km.gguf" -p 512 -n 128 -d 0,16384 --verify 1,4,16 --verify-at-depth -c 17000 --kv-type $kv; done
  bench -m "$W/9b-bf16.gguf" -p 512 -n 128 --verify 16 -c 4096 --kv-type f16
} | tee "$OUT/hyspec.md"
for q in ${ONE_NATIVE:-}; do
  [ "$SECONDS" -lt 430 ] || { echo "== $q: no time left"; break; }
  f=$W/9b-$q.gguf
  "$W/llama.cpp/build/bin/llama-quantize" "$W/9b-bf16.gguf" "$f" "$q" > "$W/quant-$q.log" 2>&1 || { echo "quantize $q failed"; continue; }
  echo "== $q: llama.cpp, then hyspec"
  "$W/llama.cpp/build/bin/llama-bench" -m "$f" -p 0 -n 128 -r 3 -fa 1 -ngl 99 2>&1 | grep -E "^\|"
  bench -m "$f" -p 0 -n 128 --verify 16 -c 4096 --kv-type f16
done | tee "$OUT/native.md"
[ -z "${ONE_EXTRA:-}" ] || { echo "== extra at ${SECONDS}s: $ONE_EXTRA"; eval "$ONE_EXTRA"; } 2>&1 | tee "$OUT/extra.md"
echo "== done at ${SECONDS}s"
