#!/usr/bin/env bash
# The 17-token Q4_K/Q5_K matvec as two MMA n-tiles and a dp4a token (q4k_mma_body's X1, session 39) against a
# third n-tile (HYSPEC_MV_X1=0), in one device call (carry [".device"], packed with HYSPEC_DEVICE_BINS=test_backend):
# the matvec tests, the kernel benches at 16 and 17 tokens, the synthetic 9B Q4_K_M's greedy ids (plain and MTP
# drafts of 15 and 16) with either, then hyspec bench rounds interleaved (ROUNDS, default 5).
cd "$(dirname "$0")/../.." && source scripts/device/device_env.sh
B=.device/bin
nvidia-smi --query-gpu=name --format=csv,noheader
HYSPEC_TEST_BACKEND=cuda timeout 300 $B/test_backend --gtest_brief=1 \
  --gtest_filter='*Matvec*:*Matmul*:*SwiGlu*:*Swiglu*:*Fold*:*Moe*:-CudaBench*:*Fixture*' 2>&1 |
  grep -E "^\[  (PASSED|FAILED)|Failure|n=17" | head -20
for x in 0 1; do
  echo "== kernel bench, HYSPEC_MV_X1=$x"
  HYSPEC_MV_X1=$x HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_TYPE=Q4_K HYSPEC_BENCH_WIDTHS=16,17 $B/test_backend \
    --gtest_filter='CudaBench.MatmulDecode:CudaBench.MatmulSwiGlu' 2>&1 | grep BENCH | head -12
done
xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > /tmp/9b.gguf && $B/gguf_skeleton add-nextn /tmp/9b.gguf /tmp/9b-mtp.gguf > /dev/null &&
  $B/gguf_skeleton fill /tmp/9b-mtp.gguf > /dev/null || exit 3
M=/tmp/9b-mtp.gguf
for x in 1 0; do
  for spec in "" "--spec mtp --no-adapt --draft-max 15" "--spec mtp --no-adapt --draft-max 16"; do
    # shellcheck disable=SC2086
    echo "x1 $x ${spec:-plain}: $(HYSPEC_MV_X1=$x $B/hyspec run --backend cuda -m $M -c 4096 -s 1 \
      -p "The history of the city" -n 128 --temp 0 $spec 2>/dev/null | md5sum | cut -c1-12)"
  done
done
for r in $(seq "${ROUNDS:-5}"); do
  for x in 0 1; do
    echo "round $r x1 $x: $(HYSPEC_MV_X1=$x $B/hyspec bench -m $M --backend cuda -c 4096 --kv-type f16 \
      -p 0 -n 64 --verify ${VERIFY:-15,16} 2>/dev/null | awk -F'|' '{printf "%s ", $6}')"
  done
done
