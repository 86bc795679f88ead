# PROBE_EARLY for scripts/device/probe_kernels.sh (sourced on the GPU machine while the model is made):
# for each build variant V in VARIANTS (default: every .device/bin/test_backend_V that
# scripts/device/pack_variants.sh added), the CUDA tests matching VARIANT_TESTS (default: the attention
# tests), then in two interleaved rounds, the packed build against each variant, the attention kernel
# benches at VARIANT_CTX keys (default 16384; one row, 8 and 16 rows).
VARIANTS=${VARIANTS:-$(cd .device/bin && ls test_backend_* 2> /dev/null | sed 's/^test_backend_//' | tr '\n' ' ')}
export HYSPEC_FIXTURES=$PWD/.device/fixtures
for v in $VARIANTS; do
  echo "-- tests of $v: ${VARIANT_TESTS:-*Attention*}"
  HYSPEC_TEST_BACKEND=cuda timeout 300 .device/bin/test_backend_"$v" --gtest_brief=1 --gtest_filter="${VARIANT_TESTS:-*Attention*}" 2>&1 |
    grep -E "^\[  (PASSED|FAILED)|FAILED  \]|Failure" | head -20
done
for round in 1 2; do
  for v in "" $VARIANTS; do
    echo "-- attention kernel bench ${v:-(packed build)}, round $round"
    HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_CTX=${VARIANT_CTX:-16384} timeout 150 .device/bin/test_backend${v:+_$v} \
      --gtest_filter=CudaBench.AttentionAndGdnDecode 2>&1 | grep -E "BENCH attention" | grep -v "n=512"
  done
done
