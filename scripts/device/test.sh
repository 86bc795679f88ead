#!/usr/bin/env bash
# On the GPU machine: every test binary on the CPU backend and again with HYSPEC_TEST_BACKEND=cuda
# (fixture tests on both: CUDA within 2e-3 of transformers/CPU on the f32 fixtures), compute-sanitizer
# memcheck on one decode and one verify step, then the benchmark table on the tiny fixtures.
#
# The GPU machine lacks our Debian dev packages, so the CUDA build is made elsewhere and carried:
#   scripts/device/pack.sh          (here: build-cuda, its shared libraries and the fixtures -> .device/)
#   run: scripts/device/test.sh     (carry [".device"])
set -uo pipefail
cd "$(dirname "$0")/../.."
D=.device
export LD_LIBRARY_PATH="$D/lib:/usr/local/cuda/lib64:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
export HYSPEC_FIXTURES="${HYSPEC_FIXTURES:-$PWD/$D/fixtures}"
OUT="${OUT:-/tmp/hyspec-out}"
[ -d "$D/bin" ] || tar xJf "$D/bin.tar.xz" -C "$D"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
status=0
summary=""
for backend in cpu cuda; do
  for t in "$D"/bin/test_*; do
    name=$(basename "$t")
    # test_server spawns the carried `hyspec serve` (HYSPEC_BIN), on the GPU for the cuda pass; the
    # node client e2e test runs where CI runs it.
    HYSPEC_BIN="$PWD/$D/bin/hyspec" HYSPEC_TEST_BACKEND=$backend timeout 300 "$t" --gtest_brief=1 > "$OUT/$name-$backend.log" 2>&1
    rc=$?
    line=$(grep -E "^\[  (PASSED|FAILED)  \]" "$OUT/$name-$backend.log" | head -2 | tr '\n' ' ')
    summary+=$(printf '%-14s %-5s rc=%d %s' "$name" "$backend" "$rc" "$line")$'\n'
    [ $rc -eq 0 ] || { status=1; grep -E "Failure|FAILED|error" "$OUT/$name-$backend.log" | head -20; }
  done
done
M="$HYSPEC_FIXTURES/qwen35-tiny/qwen35-tiny-f32.gguf"
echo "== compute-sanitizer memcheck: prefill, decode and verify steps (MTP drafts, CUDA graphs off and on)"
for graphs in --no-graphs ""; do
  compute-sanitizer --tool memcheck --error-exitcode 9 "$D/bin/hyspec" run -m "$M" --backend cuda --spec mtp \
    --tokens 501,500,505,194,87 -n 6 --temp 0 --ids --no-stats --no-adapt $graphs > "$OUT/memcheck$graphs.log" 2>&1
  rc=$?
  summary+="memcheck $graphs rc=$rc $(grep -E 'ERROR SUMMARY' "$OUT/memcheck$graphs.log")"$'\n'
  [ $rc -eq 0 ] || { status=1; tail -20 "$OUT/memcheck$graphs.log"; }
done
echo "== benchmarks (tiny fixtures)"
for m in qwen35-tiny/qwen35-tiny-q8_0.gguf qwen35moe-tiny/qwen35moe-tiny-q8_0.gguf; do
  "$D/bin/hyspec" bench -m "$HYSPEC_FIXTURES/$m" --backend cuda -p 512 -n 128 --verify 1,4,16 2>&1 | tee -a "$OUT/bench.md"
done
echo "== summary"
printf '%s' "$summary"
exit $status
