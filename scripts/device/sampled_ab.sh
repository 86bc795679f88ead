#!/usr/bin/env bash
# Sampled decoding on the synthetic 9B (and the MoE: SA_MOE=1), hyspec builds and --look-ahead settings
# interleaved: t/s, the per-phase line and the ids' md5 of the same seed under temperature alone (the
# server's default), the CLI's default truncation and greedy. SA_RUNS: "BIN:LOOK_AHEAD ..." (BIN under
# .device/bin; default "hyspec_old:auto hyspec:off hyspec:auto"). carry [".device"].
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
RUNS=${SA_RUNS:-hyspec_old:auto hyspec:off hyspec:auto}
# runs MODEL N: three interleaved rounds of every run and mode.
runs() {
  local m=$1 n=$2
  for round in 1 2 3; do for r in $RUNS; do
    local b=${r%%:*} la=${r##*:}
    for mode in "--temp 1 --top-k 0 --top-p 1 --min-p 0" "--temp 0.7" "--temp 0"; do
      ids=$(.device/bin/$b run -m "$m" --backend cuda -c 4096 -s 7 --tokens 1,2,3,4,5,6,7 -n "$n" --ids \
        --look-ahead "$la" $mode 2> "$OUT/err.log" | md5sum | cut -c1-12)
      echo "round $round $b la=$la [$mode]: ids $ids $(grep -E '^generation' "$OUT/err.log" | grep -oE '\([0-9.]+ t/s\)')"
      grep -E "^time per phase|^error" "$OUT/err.log" | sed 's/^/   /'
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
