#!/usr/bin/env bash
# One device call (carry [".device"], ~3 min): the Qwen3.5-35B-A3B-shaped 8-layer Q4_K_M from its skeleton in
# the repo (bench/data, made by bench/compare_llamacpp.sh's 35b-a3b-8l anchor; random weights of the file's
# types), with an MTP block added (gguf_skeleton add-nextn: a copy of the last full-attention MoE block).
#   - greedy generation, plain and with MTP drafts (random weights: every draft rejected, so every round
#     verifies and rolls back): the ids must be the same;
#   - hyspec bench (decode, verify-k), MOE_RUNS (default all three): int8 (the default), no-side (the
#     shared expert in line, HYSPEC_SIDE_STREAM=0), f16 (--f16-matvec), env:VAR=VALUE (the default
#     with that setting), bin:NAME (.device/bin/hyspec_NAME: pack_variants.sh);
#   - ncu's GPU time per kernel of decode and verify-16 steps (bench/kernel_times.sh).
#   here: HYSPEC_DEVICE_BINS="test_backend" HYSPEC_DEVICE_FIXTURES="" scripts/device/pack.sh (MOE_KT=0: no ncu)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
B=.device/bin SK=/tmp/moe-skel.gguf M=/tmp/moe.gguf
xz -T0 -dc bench/data/35b-a3b-8l-q4km.skeleton.gguf.xz > "$SK" && $B/gguf_skeleton add-nextn "$SK" "$M" &&
  $B/gguf_skeleton fill "$M" > /dev/null || exit 3
gen() { "$B/hyspec" run --backend cuda -m "$M" -c 4096 -s 1 -p "The history of the city" -n 128 --temp 0 "$@"; }
{
  echo "== plain: $(gen 2> /tmp/gen.log | md5sum | cut -c1-12)"; grep -E "^generation" /tmp/gen.log
  for dm in 3 15; do
    echo "== mtp draft-max $dm: $(gen --spec mtp --no-adapt --draft-max $dm 2> /tmp/gen.log | md5sum | cut -c1-12)"
    grep -E "^generation|^speculative" /tmp/gen.log
  done
} 2>&1 | tee "$OUT/moe_gen.log"
for round in 1 2; do
  for v in ${MOE_RUNS:-int8 no-side f16}; do
    echo "-- round $round $v"
    f=; [ $v = f16 ] && f=--f16-matvec
    setting=HYSPEC_SIDE_STREAM=$([ $v = no-side ] && echo 0 || echo 1)
    h=$B/hyspec
    case $v in env:*) setting=${v#env:} ;; bin:*) h=$B/hyspec_${v#bin:} ;; esac
    env "$setting" $h bench --backend cuda -m "$M" -p 512 -n 128 \
      -c 4096 --verify 1,4,8,15,16 $f 2>/dev/null | grep -E "pp512|tg128|verify" | cut -d'|' -f4-7
  done
done 2>&1 | tee "$OUT/moe_bench.log"
[ "${MOE_KT:-1}" = 0 ] && exit 0
echo "== decode (us/call; the calls span ~3 steps)"; bash bench/kernel_times.sh "$M" 200 400
echo "== verify-16"; KT_BENCH="-p 0 -n 0 --verify 16" bash bench/kernel_times.sh "$M" 300 400
