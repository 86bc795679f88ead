#!/usr/bin/env bash
# Sampled decoding on the synthetic 9B, two hyspec builds interleaved (SA_BINS, default "hyspec_old hyspec"
# under .device/bin): t/s and the ids' md5 of the same seed under temperature alone (the server's default),
# the CLI's default truncation and greedy. carry [".device"].
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
M=$(bash bench/synth_gguf.sh 9b .device/bin/gguf_skeleton) || exit 3
for round in 1 2 3; do for b in ${SA_BINS:-hyspec_old hyspec}; do
  for mode in "--temp 1 --top-k 0 --top-p 1 --min-p 0" "--temp 0.7" "--temp 0"; do
    ids=$(.device/bin/$b run -m "$M" --backend cuda -c 4096 -s 7 --tokens 1,2,3,4,5,6,7 -n 512 --ids $mode 2> "$OUT/err.log" |
      md5sum | cut -c1-12)
    echo "round $round $b [$mode]: ids $ids $(grep -E '^generation' "$OUT/err.log" | grep -oE '\([0-9.]+ t/s\)')"
  done
done; done
