#!/usr/bin/env bash
# ncu's view of one decode-attention launch from CudaBench.AttentionAndGdnDecode (speed of light, memory,
# occupancy, scheduler and warp-state sections, plus per-instruction SASS as CSV in $OUT), to see what a
# split waits on. On the GPU machine:
#   bench/ncu_attention.sh KV CTX ROWS      e.g. bench/ncu_attention.sh Q8_0 16384 1
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d .device/bin ] || tar xJf .device/bin.tar.xz -C .device
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
KV=${1:?kv type}; CTX=${2:?ctx}; ROWS=${3:-1}
OUT=${OUT:-/tmp/hyspec-out}; mkdir -p "$OUT"
REP=/tmp/ncu_attn_${KV}_${CTX}_${ROWS}
HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_KV=$KV HYSPEC_BENCH_CTX=$CTX HYSPEC_BENCH_ROWS=$ROWS \
  timeout 240 /usr/local/cuda/bin/ncu --kernel-name "regex:attention_decode" --launch-skip 20 --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section SchedulerStats --section WarpStateStats --section SourceCounters -f -o "$REP" \
  .device/bin/test_backend --gtest_filter=CudaBench.AttentionAndGdnDecode > /dev/null 2>&1
/usr/local/cuda/bin/ncu --import "$REP.ncu-rep" --page source --csv --print-source sass \
  > "$OUT/attn_source_${KV}_${CTX}_${ROWS}.csv" 2> /dev/null
/usr/local/cuda/bin/ncu --import "$REP.ncu-rep" --print-details all 2>&1 |
  grep -iE "duration|throughput|stall|warp cycles|occupancy|registers|shared memory|grid size|block size|waves|issued|eligible|active warps|hit rate|dram" | head -60
