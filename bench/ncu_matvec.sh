#!/usr/bin/env bash
# ncu's view of one matvec kernel launch from CudaBench.MatmulDecode (throughput, stall reasons,
# occupancy, memory tables), for tuning the decode/verify matvecs. On the GPU machine:
#   bench/ncu_matvec.sh TYPE WIDTH SHAPE [KERNEL_REGEX] [INT8]
# SHAPE: 0 = 4096x4096, 1 = 4096x12288, 2 = 12288x4096, 3 = 4096x8192 (the bench's order); INT8=0
# profiles the f16 matvec. Each shape replays 21 graphs of 32 matvecs, so SHAPE picks the launch.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d .device/bin ] || tar xJf .device/bin.tar.xz -C .device
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
TYPE=${1:?type}; W=${2:?width}; SHAPE=${3:-1}; RE=${4:-mma|dp4a|matvec}; INT8=${5:-1}
HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_INT8=$INT8 HYSPEC_BENCH_TYPE=$TYPE HYSPEC_BENCH_WIDTHS=$W \
  timeout 240 /usr/local/cuda/bin/ncu --kernel-name "regex:$RE" --launch-skip $((SHAPE * 672 + 40)) --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section LaunchStats --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis \
  --print-details all \
  .device/bin/test_backend --gtest_filter=CudaBench.MatmulDecode 2>&1 | grep -v "^BENCH\|^\[" 
