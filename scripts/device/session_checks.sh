#!/usr/bin/env bash
# On the GPU machine, while bench/compare_llamacpp.sh's anchor runs: the CUDA side of the suite
# (every test binary with HYSPEC_TEST_BACKEND=cuda; fixtures absent from the bundle fail visibly),
# compute-sanitizer on the new kernels, and the kernel benches (f16 and int8 matvec, GDN).
set -uo pipefail
cd "$(dirname "$0")/../.."
D=.device
[ -d "$D/bin" ] || tar xJf "$D/bin.tar.xz" -C "$D"
export LD_LIBRARY_PATH="$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export HYSPEC_FIXTURES="${HYSPEC_FIXTURES:-$PWD/$D/fixtures}"
for t in test_backend test_model test_engine; do
  echo "== $t (cuda)"
  HYSPEC_TEST_BACKEND=cuda timeout 200 "$D/bin/$t" --gtest_brief=1 2>&1 | grep -E "Failure|FAILED|PASSED|SKIPPED \]|Expected|actual|error" | head -20
done
echo "== memcheck/racecheck: GDN, add_rms_norm, attention, matmul"
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --error-exitcode 9 "$D/bin/test_backend" \
    --gtest_filter='CudaBackendTest.GatedDelta*:CudaBackendTest.AddRmsNorm*:CudaBackendTest.Attention*:Matvec/CudaMatmulTest.MatvecRows*' 2>&1 |
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" | head -4
done
echo "== benches"
for v in 0 1; do
  HYSPEC_BENCH_INT8=$v HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_TYPE=Q4_K HYSPEC_BENCH_WIDTHS=1,2,4,8,16,17,32 \
    timeout 120 "$D/bin/test_backend" --gtest_filter='CudaBench.Matmul*' 2>&1 | grep -E "^\| |BENCH swiglu Q4_K"
done
HYSPEC_CUDA_BENCH=1 timeout 120 "$D/bin/test_backend" --gtest_filter='CudaBench.AttentionAndGdnDecode' 2>&1 | grep -E "BENCH|^\|" | head -30
