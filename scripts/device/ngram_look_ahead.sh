#!/usr/bin/env bash
# Adaptive n-gram sessions with --look-ahead off and auto, interleaved (look-ahead runs their plain rounds: the
# two that open a sequence and the back-off stretches), on the synthetic 9B and the MoE, greedy and sampled
# under temperature alone: t/s, the ids' md5 (the same with and without), the speculative and per-phase lines.
# One device call (~3 min), carry [".device"]. NL_RUNS: "BIN:LOOK_AHEAD ..." (BIN under .device/bin; default
# "hyspec:off hyspec:auto"); NL_ROUNDS (default 3); NL_MODES: "greedy sampled" (default both); NL_MOE=0 skips the MoE.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
# runs MODEL N: NL_ROUNDS interleaved rounds.
runs() {
  local m=$1 n=$2
  for round in $(seq "${NL_ROUNDS:-3}"); do for r in ${NL_RUNS:-hyspec:off hyspec:auto}; do
    local b=${r%%:*} la=${r##*:}
    for name in ${NL_MODES:-greedy sampled}; do
      local mode="--temp 0"
      [ "$name" = sampled ] && mode="--temp 1 --top-k 0 --top-p 1 --min-p 0"
      ids=$(.device/bin/$b run -m "$m" --backend cuda -c 4096 -s 7 --tokens 1,2,3,4,5,6,7 -n "$n" --ids --spec ngram \
        --look-ahead "$la" $mode 2> "$OUT/err.log" | md5sum | cut -c1-12)
      echo "round $round $b la=$la [$mode]: ids $ids $(grep -E '^generation' "$OUT/err.log" | grep -oE '\([0-9.]+ t/s\)')"
      grep -E "^speculative|^time per phase|^error" "$OUT/err.log" | sed 's/^/   /'
    done
  done; done
}
M=$(bash bench/synth_gguf.sh 9b .device/bin/gguf_skeleton) || exit 3
echo "== 9B"
runs "$M" 512
[ "${NL_MOE:-1}" = 1 ] || exit 0
xz -T0 -dc bench/data/35b-a3b-8l-q4km.skeleton.gguf.xz > /tmp/moe.gguf && .device/bin/gguf_skeleton fill /tmp/moe.gguf > /dev/null
echo "== MoE (35B-A3B-shaped, 8 layers)"
runs /tmp/moe.gguf 512
rm -f /tmp/moe.gguf
