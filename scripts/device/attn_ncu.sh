#!/usr/bin/env bash
# On the device (carry [".device"]): ncu's warp-state, scheduler, memory and source views of one decode
# attention launch at depth (the 9B from the repo's skeleton, random weights, a tg step at depth AN_DEPTH with
# an AN_KV cache): what holds the split-K loop there (PERFORMANCE.md, session 50).
#   AN_BIN=hyspec_base AN_KV=q8_0 AN_DEPTH=16384 bash scripts/device/attn_ncu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
D=.device
[ -d "$D/bin" ] || tar xJf "$D/bin.tar.xz" -C "$D"
export LD_LIBRARY_PATH="$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-/tmp/hyspec-out}; mkdir -p "$OUT"
BIN=$D/bin/${AN_BIN:-hyspec} KV=${AN_KV:-q8_0} DEPTH=${AN_DEPTH:-16384}
M=/tmp/9b.gguf
[ -f "$M" ] || { xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > "$M" && "$D/bin/gguf_skeleton" fill "$M" > /dev/null; } || exit 3
rep=/tmp/attn_ncu_${KV}_${DEPTH}
# The decode steps' attention launches (8 a step on the 9B); the first steps are skipped (warm-up, capture).
timeout 400 /usr/local/cuda/bin/ncu --kernel-name "regex:attention_decode_mma" --launch-skip "${AN_SKIP:-40}" --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats --section Occupancy \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables -f -o "$rep" \
  "$BIN" bench -m "$M" --backend cuda -p 0 -n 16 -d "$DEPTH" -c $((DEPTH + 216)) --kv-type "$KV" > "$OUT/attn_ncu_bench.txt" 2>&1
echo "ncu rc $?"
/usr/local/cuda/bin/ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/attn_source_${KV}_${DEPTH}.csv" 2>&1
/usr/local/cuda/bin/ncu --import "$rep.ncu-rep" --print-details all > "$OUT/attn_details_${KV}_${DEPTH}.txt" 2>&1
echo "== ncu $(basename "$BIN") attention_decode_mma at depth $DEPTH, $KV cache"
grep -iE "attention_decode|duration|registers|achieved occupancy|issue slot|issued warp|warp cycles per issued|stall|eligible|active warps|dram throughput|L2 hit|shared" \
  "$OUT/attn_details_${KV}_${DEPTH}.txt" | head -60
