# Sourced by perf_one_call.sh, and by perf_prefill_probe.sh (PROBE_EARLY), while the anchor makes the model: the CUDA tests of the
# carried binaries (fixtures under .device/fixtures; the MoE fixture's cases fail when it is not
# carried), then the prompt-op, GDN and attention kernel benches under each of PROBE_VARIANTS
# (space-separated ENV=V[,ENV=V]; "-" = the defaults).
echo "-- CUDA tests"
export HYSPEC_FIXTURES=$PWD/.device/fixtures
for t in test_backend test_model test_engine; do
  [ -x .device/bin/$t ] || continue
  # A failure's lines up to its message (the case it names), in order.
  HYSPEC_TEST_BACKEND=cuda timeout 300 .device/bin/$t --gtest_brief=1 2>&1 | grep -E -A5 "^\[  (PASSED|FAILED)|FAILED  \]|Failure" | grep -v moe | head -40
done
for v in ${PROBE_VARIANTS:--}; do
  echo "-- prompt-op, GDN and attention benches: $v"
  # shellcheck disable=SC2046
  env $( [ "$v" = - ] || echo "$v" | tr ',' ' ') HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_CTX=16384 timeout 150 .device/bin/test_backend \
    --gtest_filter='CudaBench.AttentionAndGdnDecode' 2>&1 | grep -E "BENCH (prompt|gdn n=512|attention)"
  # shellcheck disable=SC2046
  env $( [ "$v" = - ] || echo "$v" | tr ',' ' ') HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_CTX=1024 timeout 100 .device/bin/test_backend \
    --gtest_filter='CudaBench.AttentionAndGdnDecode' 2>&1 | grep -E "BENCH attention F16 ctx=1024 +n=512"
done
