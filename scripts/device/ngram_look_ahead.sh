#!/usr/bin/env bash
# Adaptive n-gram sessions with --look-ahead off and auto, interleaved (look-ahead runs their plain rounds: the
# two that open a sequence and the back-off stretches), on the synthetic 9B and the MoE, greedy and sampled
# under temperature alone: t/s, the ids' md5 (the same with and without), the speculative and per-phase lines.
# One device call (~3 min), carry [".device"]; NL_BINS: hyspec builds under .device/bin (default "hyspec").
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
# runs MODEL N: three interleaved rounds.
runs() {
  local m=$1 n=$2
  for round in 1 2 3; do for b in ${NL_BINS:-hyspec}; do for la in off auto; do
    for mode in "--temp 0" "--temp 1 --top-k 0 --top-p 1 --min-p 0"; do
      ids=$(.device/bin/$b run -m "$m" --backend cuda -c 4096 -s 7 --tokens 1,2,3,4,5,6,7 -n "$n" --ids --spec ngram \
        --look-ahead "$la" $mode 2> "$OUT/err.log" | md5sum | cut -c1-12)
      echo "round $round $b la=$la [$mode]: ids $ids $(grep -E '^generation' "$OUT/err.log" | grep -oE '\([0-9.]+ t/s\)')"
      grep -E "^speculative|^time per phase|^error" "$OUT/err.log" | sed 's/^/   /'
    done
  done; done; done
}
M=$(bash bench/synth_gguf.sh 9b .device/bin/gguf_skeleton) || exit 3
echo "== 9B"
runs "$M" 512
xz -T0 -dc bench/data/35b-a3b-8l-q4km.skeleton.gguf.xz > /tmp/moe.gguf && .device/bin/gguf_skeleton fill /tmp/moe.gguf > /dev/null
echo "== MoE (35B-A3B-shaped, 8 layers)"
runs /tmp/moe.gguf 512
rm -f /tmp/moe.gguf
