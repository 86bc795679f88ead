#!/usr/bin/env bash
# Decoding rates on the synthetic 9B (and the MoE: SA_MOE=1), hyspec builds and --look-ahead settings interleaved:
# t/s, the speculative and per-phase lines and the ids' md5 of the same seed. carry [".device"].
#   SA_RUNS    "BIN:LOOK_AHEAD ..." (BIN under .device/bin; default "hyspec_old:auto hyspec:off hyspec:auto")
#   SA_MODES   of "alone" (temperature alone: the server's default), "cli" (the CLI's default truncation),
#              "greedy" (default: all three)
#   SA_EXTRA   more `hyspec run` flags, e.g. "--spec ngram" (adaptive n-gram sessions)
#   SA_ROUNDS  interleaved rounds (default 3)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
RUNS=${SA_RUNS:-hyspec_old:auto hyspec:off hyspec:auto}
# runs MODEL N
runs() {
  local m=$1 n=$2
  for round in $(seq "${SA_ROUNDS:-3}"); do for r in $RUNS; do
    local b=${r%%:*} la=${r##*:}
    for name in ${SA_MODES:-alone cli greedy}; do
      local mode="--temp 0"
      [ "$name" = alone ] && mode="--temp 1 --top-k 0 --top-p 1 --min-p 0"
      [ "$name" = cli ] && mode="--temp 0.7"
      # shellcheck disable=SC2086
      ids=$(.device/bin/$b run -m "$m" --backend cuda -c 4096 -s 7 --tokens 1,2,3,4,5,6,7 -n "$n" --ids \
        --look-ahead "$la" $mode ${SA_EXTRA:-} 2> "$OUT/err.log" | md5sum | cut -c1-12)
      echo "round $round $b la=$la [$mode]: ids $ids $(grep -E '^generation' "$OUT/err.log" | grep -oE '\([0-9.]+ t/s\)')"
      grep -E "^speculative|^time per phase|^error" "$OUT/err.log" | sed 's/^/   /'
    done
  done; done
}
M=$(bash bench/synth_gguf.sh 9b .device/bin/gguf_skeleton) || exit 3
echo "== 9B"
runs "$M" 512
if [ "${SA_MOE:-0}" = 1 ]; then
  xz -T0 -dc bench/data/35b-a3b-8l-q4km.skeleton.gguf.xz > /tmp/moe.gguf && .device/bin/gguf_skeleton fill /tmp/moe.gguf > /dev/null
  echo "== MoE (35B-A3B-shaped, 8 layers)"
  runs /tmp/moe.gguf 512
  rm -f /tmp/moe.gguf
fi
