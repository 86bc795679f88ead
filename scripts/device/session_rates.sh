#!/usr/bin/env bash
# What a session pays per token beside the bench's step, with and without look-ahead decoding, and whether a
# long capacity costs the 9B, the 27B and the MoE anything (ids and rates at -c 4096 against -c 131072). One
# device call (~2 min), carry [".device"] from `HYSPEC_DEVICE_BINS="" HYSPEC_DEVICE_FIXTURES="" scripts/device/pack.sh`:
#   bash scripts/device/session_rates.sh   (SR_BINS="new old": several hyspec builds under .device/bin,
#                                           interleaved; SR_LOOK_AHEAD="off auto": the --look-ahead settings
#                                           each runs, interleaved; SR_27B=0 / SR_MOE=0 skip those models)
# Prints, per run: the ids' md5 (first 12), `hyspec run`'s generation, graph and per-phase lines.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
D=.device
BINS=${SR_BINS:-hyspec}
LA=${SR_LOOK_AHEAD:-off auto}
# run NAME MODEL CTX N [extra hyspec run flags]: one greedy run of the repeating 7-token prompt.
run() {
  local bin=$1 m=$2 c=$3 n=$4; shift 4
  local ids
  ids=$("$D/bin/$bin" run -m "$m" --backend cuda -c "$c" --tokens 1,2,3,4,5,6,7,1,2,3,4,5,6,7 -n "$n" --temp 0 --ids \
    "$@" 2> "$OUT/err.log" | md5sum | cut -c1-12)
  echo "-- $bin -c $c -n $n $* : ids $ids"
  grep -E "^generation|^step graphs|^time per phase|^speculative|^error" "$OUT/err.log" | sed 's/^/   /'
}
M9=$(bash bench/synth_gguf.sh 9b "$D/bin/gguf_skeleton") || exit 3
echo "== 9B: bench tg128 (graph replays with a sync each) against session runs of 1024 tokens"
for round in 1 2 3; do for b in $BINS; do
  echo "-- round $round $b: $("$D/bin/$b" bench -m "$M9" --backend cuda -p 0 -n 128 -c 4096 2>&1 | grep tg128 |
    awk -F'|' '{printf "%s t/s %s ms", $5, $6}')"
  for la in $LA; do
    run "$b" "$M9" 4096 1024 --look-ahead "$la"
    [ "$round" = 1 ] && run "$b" "$M9" 131072 1024 --look-ahead "$la"
  done
done; done
for b in $BINS; do
  run "$b" "$M9" 131072 256 --spec ngram --draft-max 15 --no-adapt
  for la in $LA; do run "$b" "$M9" 131072 256 --look-ahead "$la"; done
done
if [ "${SR_MOE:-1}" = 1 ]; then
  xz -T0 -dc bench/data/35b-a3b-8l-q4km.skeleton.gguf.xz > /tmp/moe.gguf && "$D/bin/gguf_skeleton" fill /tmp/moe.gguf > /dev/null
  echo "== MoE (35B-A3B-shaped, 8 layers)"
  for b in $BINS; do for c in 4096 131072; do for la in $LA; do
    run "$b" /tmp/moe.gguf "$c" 512 --look-ahead "$la"
  done; done; done
  rm -f /tmp/moe.gguf
fi
if [ "${SR_27B:-1}" = 1 ]; then
  rm -f "$M9"
  M27=$(bash bench/synth_gguf.sh 27b "$D/bin/gguf_skeleton") || exit 3
  echo "== 27B"
  for b in $BINS; do
    for c in 4096 131072; do for la in $LA; do run "$b" "$M27" "$c" 256 --look-ahead "$la"; done; done
    run "$b" "$M27" 131072 256 --spec ngram --draft-max 15 --no-adapt
  done
fi
