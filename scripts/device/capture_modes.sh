#!/usr/bin/env bash
# One device call (carry [".device"], ~6 min): the verify step's GDN capture modes (f32, f16, updates)
# on the anchor's random 9B Q4_K_M skeleton (bench/data): verify-k, the rollback after it, and greedy
# MTP generation (random weights: every draft rejected, so every round rolls back), whose ids must not
# depend on the lossless modes. First the CUDA tests of the updates path and their memcheck.
#   here: HYSPEC_DEVICE_BINS="test_backend test_model test_engine" \
#         HYSPEC_DEVICE_FIXTURES="qwen35-tiny dflash-tiny" scripts/device/pack.sh
# Logs in $OUT.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
export HYSPEC_FIXTURES=$PWD/.device/fixtures HYSPEC_TEST_BACKEND=cuda
B=.device/bin SK=/tmp/9b.gguf MT=/tmp/9b-mtp.gguf
memcheck() { compute-sanitizer --tool memcheck --error-exitcode 9 "$@"; }
{
  $B/test_backend --gtest_brief=1 --gtest_filter='CudaBackendTest.GatedDelta*:CudaBackendTest.CopyMany*:CpuOps.GatedDelta*'
  $B/test_model --gtest_brief=1 --gtest_filter='-*moe*:*DecodeWeightBytes*'
  $B/test_engine --gtest_brief=1 --gtest_filter='-*moe*'
  memcheck $B/test_backend --gtest_brief=1 --gtest_filter='CudaBackendTest.GatedDeltaNetUpdates*'
  memcheck $B/test_engine --gtest_brief=1 --gtest_filter='*SpecLossless*dense_mtp:*SpecLossless*dense_dflash'
} > "$OUT/tests.log" 2>&1
grep -E "PASSED|FAILED|ERROR SUMMARY|tests ran" "$OUT/tests.log"
xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > "$SK" && $B/gguf_skeleton add-nextn "$SK" "$MT" && $B/gguf_skeleton fill "$MT" ||
  exit 3
for round in 1 2; do
  for c in f32 f16 updates; do
    $B/hyspec bench --backend cuda -m "$MT" -p 0 -n 64 -c 4096 --verify ${CAPTURE_VERIFY:-1,4,8,15,16} -r 5 \
      --capture-type $c 2>/dev/null | grep -E "tg64|verify|rollback" | sed "s/^/$c r$round /"
  done
done | tee "$OUT/bench.log"
gen() { "$B/hyspec" run --backend cuda -m "$MT" -c 4096 -s 1 -p "The history of the city" -n 256 --temp 0 "$@"; }
for c in f32 updates; do
  for dm in 1 3 6 15; do
    echo "== $c draft-max $dm: $(gen --spec mtp --no-adapt --draft-max $dm --capture-type $c 2> /tmp/gen.log | md5sum | cut -c1-12)"
    grep -E "^generation|^speculative|^time per phase" /tmp/gen.log
  done
done 2>&1 | tee "$OUT/gen.log"
