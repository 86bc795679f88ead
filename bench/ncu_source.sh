#!/usr/bin/env bash
# ncu's per-instruction view (SASS with executed instructions and sampled stall reasons) of one matvec
# launch from CudaBench.MatmulDecode, as CSV in $OUT, to see which instructions the warps wait on.
# On the GPU machine:
#   bench/ncu_source.sh TYPE WIDTH SHAPE [KERNEL_REGEX]     (arguments as bench/ncu_matvec.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d .device/bin ] || tar xJf .device/bin.tar.xz -C .device
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
TYPE=${1:?type}; W=${2:?width}; SHAPE=${3:-1}; RE=${4:-mma|dp4a|matvec}
OUT=${OUT:-/tmp/hyspec-out}; mkdir -p "$OUT"
REP=/tmp/ncu_source_${TYPE}_${W}_${SHAPE}
HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_TYPE=$TYPE HYSPEC_BENCH_WIDTHS=$W \
  timeout 240 /usr/local/cuda/bin/ncu --kernel-name "regex:$RE" --launch-skip $((SHAPE * 672 + 40)) --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight -f -o "$REP" \
  .device/bin/test_backend --gtest_filter=CudaBench.MatmulDecode > /dev/null 2>&1
/usr/local/cuda/bin/ncu --import "$REP.ncu-rep" --page source --csv --print-source sass \
  > "$OUT/source_${TYPE}_${W}_${SHAPE}.csv" 2> "$OUT/source_${TYPE}_${W}_${SHAPE}.err"
/usr/local/cuda/bin/ncu --import "$REP.ncu-rep" --print-details all 2>&1 | grep -iE "duration|throughput|stall|warp cycles" | head -20
wc -l "$OUT/source_${TYPE}_${W}_${SHAPE}.csv"; head -c 600 "$OUT/source_${TYPE}_${W}_${SHAPE}.err"
