#!/usr/bin/env bash
# On the GPU machine: the kernel benches of test_backend (int8 and f16 matvec by width, fused SwiGLU,
# attention by KV type and depth, GDN), after scripts/device/pack.sh (carry [".device"]).
set -uo pipefail
cd "$(dirname "$0")/../.."
D=.device
[ -d "$D/bin" ] || tar xJf "$D/bin.tar.xz" -C "$D"
export LD_LIBRARY_PATH="$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
[ -x "$D/bin/test_backend" ] || { echo "no test_backend in $D/bin"; exit 0; }
echo "== benches"
for v in 0 1; do
  HYSPEC_BENCH_INT8=$v HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_TYPE=Q4_K HYSPEC_BENCH_WIDTHS=1,2,4,8,16,17,32 \
    timeout 120 "$D/bin/test_backend" --gtest_filter='CudaBench.Matmul*' 2>&1 | grep -E "^\| |BENCH swiglu Q4_K"
done
HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_TYPE=Q6_K HYSPEC_BENCH_WIDTHS=1,2,4,8,16,17,32 \
  timeout 120 "$D/bin/test_backend" --gtest_filter='CudaBench.MatmulDecode' 2>&1 | grep -E "^\| "
HYSPEC_CUDA_BENCH=1 timeout 120 "$D/bin/test_backend" --gtest_filter='CudaBench.AttentionAndGdnDecode' 2>&1 | grep -E "BENCH|^\|" | head -50
