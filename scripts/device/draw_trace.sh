#!/usr/bin/env bash
# Where a look-ahead draw's time goes (carry [".device"]): .device/bin holds hyspec_trace (a -DHYSPEC_STEP_TRACE=ON
# build) and any builds to compare; each runs a session of the synthetic 9B under greedy decoding, temperature alone
# and the CLI's cuts with the step trace on. Prints the ids' md5, the rate, the time the argmax/draw/feed kernels
# hold the PDL chain (STEPSUM, step_trace.h) and the draw kernels' per-block timelines of their last launch
# (TRACE, elementwise.cu's DrawMark); each session's whole output goes to $OUT/dt_BIN_MODE.log.
#   DT_BINS   builds under .device/bin (default hyspec_trace)
#   DT_MODES  of "greedy", "alone", "cli" (default all three)
#   DT_ROUNDS rounds (default 1)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
M=$(bash bench/synth_gguf.sh 9b .device/bin/gguf_skeleton) || exit 3
for round in $(seq "${DT_ROUNDS:-1}"); do
  for b in ${DT_BINS:-hyspec_trace}; do
    for name in ${DT_MODES:-greedy alone cli}; do
      mode="--temp 0"
      [ "$name" = alone ] && mode="--temp 1 --top-k 0 --top-p 1 --min-p 0"
      [ "$name" = cli ] && mode="--temp 0.7"
      log="$OUT/dt_${b}_$name.log"
      # shellcheck disable=SC2086
      HYSPEC_STEP_TRACE=1 HYSPEC_STEP_TRACE_STEPS=3 .device/bin/$b run -m "$M" --backend cuda -c 4096 -s 7 \
        --tokens 1,2,3,4,5,6,7 -n 256 --ids $mode > "$log.ids" 2> "$log"
      ids=$(grep -vE "^(STEP|TRACE)" "$log.ids" | md5sum | cut -c1-12)
      echo "== round $round $b $name: ids $ids $(grep -E '^generation' "$log" | grep -oE '\([0-9.]+ t/s\)')"
      grep -E "^STEPSUM \| (argmax|draw|top_k|feed)" "$log.ids" | sed 's/^/   /'
      grep -E "^TRACE" "$log.ids" | sed 's/^/   /'
      cat "$log.ids" >> "$log" && rm -f "$log.ids"
    done
  done
done
