#!/usr/bin/env bash
# Where the GDN recurrence's token loop waits (carry [".device"]; HYSPEC_DEVICE_BINS="test_backend"
# HYSPEC_DEVICE_FIXTURES="" scripts/device/pack.sh): the kernel bench of gdn_kernel on 9B shapes (16 k /
# 32 v heads of 128) at 1, 8 and 16 tokens for each build GP_VARIANTS ("base V ...": test_backend_V in
# .device/bin, base = test_backend), rounds interleaved; then ncu's per-instruction view (SASS, executed
# instructions, sampled stall reasons) and warp-state summary of one 16-token launch recording updates
# (a verify step's mode) and one 1-token launch of the first variant, as CSV/text in $OUT.
# GP_NCU=0 skips ncu; GP_EXTRA="cmd; cmd" runs more at the end.
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv,noheader
V=${GP_VARIANTS:-base}
bin() { [ "$1" = base ] && echo .device/bin/test_backend || echo ".device/bin/test_backend_$1"; }
for round in 1 2 3; do
  for v in $V; do
    for n in 1 8 16; do
      for mode in none updates; do
        r=$(HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_CTX=1 HYSPEC_BENCH_GDN_N=$n HYSPEC_BENCH_GDN_MODE=$mode timeout 60 "$(bin "$v")" \
          --gtest_filter=CudaBench.AttentionAndGdnDecode 2>&1 | grep -E "BENCH gdn")
        echo "round $round $v: $r"
      done
    done
  done
done | tee "$OUT/gdn_bench.txt"
if [ "${GP_NCU:-1}" = 1 ]; then
  first=${V%% *}
  for cfg in 16:updates 1:none; do
    n=${cfg%%:*} mode=${cfg##*:} rep=/tmp/gdn_ncu_${n}_${mode}
    HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_CTX=1 HYSPEC_BENCH_GDN_N=$n HYSPEC_BENCH_GDN_MODE=$mode \
      timeout 200 /usr/local/cuda/bin/ncu --kernel-name "regex:gdn_kernel" --launch-skip 5 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats \
      --section Occupancy --section SchedulerStats --section MemoryWorkloadAnalysis -f -o "$rep" \
      "$(bin "$first")" --gtest_filter=CudaBench.AttentionAndGdnDecode > /dev/null 2>&1
    /usr/local/cuda/bin/ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/gdn_source_${n}_${mode}.csv" 2>&1
    /usr/local/cuda/bin/ncu --import "$rep.ncu-rep" --print-details all > "$OUT/gdn_details_${n}_${mode}.txt" 2>&1
    echo "== ncu gdn_kernel n=$n $mode"
    grep -iE "duration|registers|achieved occupancy|issue slot|warp cycles per issued|stall|eligible|shared" "$OUT/gdn_details_${n}_${mode}.txt" | head -40
  done
fi
[ -z "${GP_EXTRA:-}" ] || { echo "== extra at ${SECONDS}s"; eval "$GP_EXTRA"; } 2>&1 | tee "$OUT/extra.md"
echo "== done at ${SECONDS}s"
