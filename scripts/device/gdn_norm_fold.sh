#!/usr/bin/env bash
# The gated norm folded into a verify step's GDN recurrence (session 39), in one device call (carry
# [".device"], packed with HYSPEC_DEVICE_BINS=test_backend): its backend tests (and memcheck/racecheck of
# them), the synthetic 9B Q4_K_M's greedy ids with and without the fold (plain and MTP drafts of 15 and 16),
# then hyspec bench with HYSPEC_GDN_NORM_FOLD=0 and 1 interleaved, ROUNDS times.
cd "$(dirname "$0")/../.." && source scripts/device/device_env.sh
B=.device/bin
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
HYSPEC_TEST_BACKEND=cuda timeout 300 $B/test_backend --gtest_brief=1 \
  --gtest_filter='*GatedNormFolded*:*GatedDeltaNet*:*Norm*:*Captured*' 2>&1 | grep -E "^\[  (PASSED|FAILED)|Failure|error" | head -30
for tool in memcheck racecheck; do
  echo "== $tool"
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $B/test_backend \
    --gtest_filter='Matvec/CudaMatmulTest.GatedNormFolded*/int8' 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" | head -4
done
xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > /tmp/9b.gguf && $B/gguf_skeleton add-nextn /tmp/9b.gguf /tmp/9b-mtp.gguf > /dev/null &&
  $B/gguf_skeleton fill /tmp/9b-mtp.gguf > /dev/null || exit 3
M=/tmp/9b-mtp.gguf
for f in 1 0; do
  for spec in "" "--spec mtp --no-adapt --draft-max 15" "--spec mtp --no-adapt --draft-max 16"; do
    # shellcheck disable=SC2086
    echo "fold $f ${spec:-plain}: $(HYSPEC_GDN_NORM_FOLD=$f $B/hyspec run --backend cuda -m $M -c 4096 -s 1 \
      -p "The history of the city" -n 128 --temp 0 $spec 2>/dev/null | md5sum | cut -c1-12)"
  done
done
for r in $(seq "${ROUNDS:-5}"); do
  for f in 0 1 "1 81920"; do set -- $f
    echo "round $r fold $f: $(HYSPEC_GDN_NORM_FOLD=$1 HYSPEC_GDN_NORM_SMEM=${2:-0} $B/hyspec bench -m $M --backend cuda -c 4096 --kv-type f16 \
      -p 0 -n 64 --verify ${VERIFY:-8,15,16} 2>/dev/null | awk -F'|' '{printf "%s ", $6}')"
  done
done
