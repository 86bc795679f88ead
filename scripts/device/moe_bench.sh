#!/usr/bin/env bash
# One device call (carry [".device"]): the MoE and matmul CUDA tests on the MoE fixture, memcheck of the
# MoE and exact-matvec tests, the MoE layer bench, and ncu GPU time of each kernel of a one-token layer.
#   here: HYSPEC_DEVICE_BINS="test_backend test_model test_engine" HYSPEC_DEVICE_FIXTURES="qwen35moe-tiny" scripts/device/pack.sh
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
export HYSPEC_FIXTURES=$PWD/.device/fixtures HYSPEC_TEST_BACKEND=cuda
B=.device/bin
$B/test_backend --gtest_brief=1 --gtest_filter='*CudaMatmulTest.*:CudaBackendTest.Moe*:CudaBackendTest.MatmulRows*:-*Fixture*' 2>&1 | grep -E "FAILED|PASSED|Failure" | head
$B/test_model --gtest_brief=1 --gtest_filter='*/1:MtpFixture*' 2>&1 | grep -E "FAILED|PASSED" | head
$B/test_engine --gtest_brief=1 --gtest_filter='*moe*' 2>&1 | grep -E "FAILED|PASSED" | head
compute-sanitizer --tool memcheck $B/test_backend --gtest_brief=1 --gtest_filter='CudaBackendTest.MoeFfnMatchesCpu:CudaBackendTest.MatmulRows*' 2>&1 | tail -2
HYSPEC_CUDA_BENCH=1 $B/test_backend --gtest_filter='CudaBench.MoeFfn' 2>&1 | grep BENCH
HYSPEC_CUDA_BENCH=1 timeout 200 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv --launch-count 6 \
  $B/test_backend --gtest_filter='CudaBench.MoeFfn' > /tmp/ncu.csv 2>/dev/null
python3 - <<'PY'
import csv
rows=[r for r in csv.reader(open('/tmp/ncu.csv')) if len(r)>10]
h=rows[0]; k=h.index("Kernel Name"); v=h.index("Metric Value"); u=h.index("Metric Unit")
for r in rows[1:]: print(r[k][:60], "|", r[v], r[u])
PY
