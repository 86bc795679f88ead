#!/usr/bin/env bash
# On the GPU machine (e.g. while bench/compare_llamacpp.sh's anchor runs): the CUDA side of the suite
# (every carried test binary with HYSPEC_TEST_BACKEND=cuda, test_server against the carried `hyspec
# serve`; fixtures absent from the bundle fail visibly), compute-sanitizer on decode/verify steps and
# the kernels, and the kernel benches (f16 and int8 matvec, attention, GDN).
set -uo pipefail
cd "$(dirname "$0")/../.."
D=.device
[ -d "$D/bin" ] || tar xJf "$D/bin.tar.xz" -C "$D"
export LD_LIBRARY_PATH="$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export HYSPEC_FIXTURES="${HYSPEC_FIXTURES:-$PWD/$D/fixtures}" HYSPEC_BIN="$PWD/$D/bin/hyspec"
for t in "$D"/bin/test_*; do
  echo "== $(basename "$t") (cuda)"
  r=$(HYSPEC_TEST_BACKEND=cuda timeout 300 "$t" --gtest_brief=1 2>&1 | grep -E "^\[  (PASSED|FAILED)  \]" | sort -u)
  echo "$r" | grep PASSED; echo "failed: $(echo "$r" | grep -c "FAILED  \] [A-Za-z]")"; echo "$r" | grep "FAILED  \] [A-Za-z]" | head -25
done
M="$HYSPEC_FIXTURES/qwen35-tiny/qwen35-tiny-f32.gguf"
if [ -f "$M" ]; then
  for graphs in --no-graphs ""; do
    echo "== memcheck: prefill, MTP decode and verify steps $graphs"
    compute-sanitizer --tool memcheck --error-exitcode 9 "$D/bin/hyspec" run -m "$M" --backend cuda --spec mtp \
      --tokens 501,500,505,194,87 -n 6 --temp 0 --ids --no-stats --no-adapt $graphs 2>&1 | grep -E "ERROR SUMMARY"
  done
fi
if [ -x "$D/bin/test_backend" ]; then
  echo "== memcheck/racecheck: GDN, conv, norms, attention, matmul"
  # racecheck is ~50x slower than a plain run: the attention tests go in a run of their own, the
  # verify-row test only (every decode kernel and KV type), so that a timeout there hides nothing else.
  # SC_SANITIZER_S: seconds per sanitizer run (200; the racecheck of $RC ran past 200 s in session 25).
  MC='CudaBackendTest.GatedDelta*:CudaBackendTest.*Conv*:CudaBackendTest.*Norm*:CudaBackendTest.Attention*:CudaBackendTest.KvStore*:Matvec/CudaMatmulTest.MatvecRows*:Matvec/CudaMatmulTest.MatmulOfNorm*'
  RC='CudaBackendTest.GatedDelta*:CudaBackendTest.*Conv*:CudaBackendTest.*Norm*:Matvec/CudaMatmulTest.MatvecRows*:Matvec/CudaMatmulTest.MatmulOfNorm*'
  # The verify-row test's racecheck runs on one-set attention blocks (HYSPEC_ATTN_PAIRS=0): racecheck
  # flags accesses in the paired ones that barriers order, as it does on the race-free kernel of
  # racecheck_named_barriers.cu (run last here, where nvcc is installed); memcheck covers both forms.
  set -f  # the filters' * are gtest's
  for run in "memcheck $MC" "racecheck $RC" "racecheck CudaBackendTest.AttentionVerifyRows*"; do
    set -- $run
    HYSPEC_ATTN_PAIRS=$([ "$1 $2" = "racecheck CudaBackendTest.AttentionVerifyRows*" ] && echo 0 || echo 1) timeout "${SC_SANITIZER_S:-200}" compute-sanitizer --tool "$1" \
      --error-exitcode 9 "$D/bin/test_backend" --gtest_filter="$2" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" | head -4
    echo "$1 ${2:0:40}... rc=${PIPESTATUS[0]}"
  done
  set +f
  if command -v nvcc > /dev/null && nvcc -O2 -arch=sm_90 -lineinfo -o /tmp/racecheck_nb scripts/device/racecheck_named_barriers.cu; then
    echo "== racecheck on a race-free kernel with named barriers (a hazard here is the tool's)"
    compute-sanitizer --tool racecheck /tmp/racecheck_nb 1 0 2>&1 | grep -E "RACECHECK SUMMARY"
  fi
fi
# SC_BENCH=0: no kernel benches (perf_session.sh start, whose llama-bench must have the GPU alone).
[ "${SC_BENCH:-1}" = 1 ] && bash scripts/device/kernel_benches.sh
