#!/usr/bin/env bash
# One device call (carry [".device"]; ~5 min): the adaptive draft length of two builds side by side.
#   here: HYSPEC_DEVICE_BINS="" HYSPEC_DEVICE_FIXTURES="" scripts/device/pack.sh, then a second build's
#   stripped hyspec added to .device/bin.tar.xz as bin/hyspec_base (A); B is the packed build.
# 1. The demo models (real acceptance): scripts/measure_demo.py --adapt, the two builds taking turns on
#    every prompt and drafter. 2. The 9B Q4_K_M skeleton with an MTP block (random weights, whose greedy
#    text falls into a loop): greedy runs plain / n-gram (adaptive at most 15, 16, 32; fixed 15) / MTP
#    (AB_MORE_SPECS adds more), both builds, two rounds, ids compared. 3. Its verify steps by width
#    (AB_NO_BENCH=1 skips them).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
A=.device/bin/hyspec_base B=.device/bin/hyspec G=.device/bin/gguf_skeleton MT=/tmp/9b-mtp.gguf
python3 scripts/measure_demo.py --hyspec "$A,$B" --backend cuda --prompts "${PROMPTS:-24}" --adapt 2>&1 | tee "$OUT/demo_ab.log"
if [ ! -f "$MT" ]; then
  xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > /tmp/sk.gguf && $G add-nextn /tmp/sk.gguf "$MT" && $G fill "$MT" && rm /tmp/sk.gguf || exit 3
fi
for round in 1 2; do
  for h in "$A" "$B"; do
    for spec in "none" "ngram" "ngram --draft-max 16" "ngram --draft-max 32" "mtp" "ngram --no-adapt --draft-max 15" \
      ${AB_MORE_SPECS:-}; do
      echo "== round $round $h --spec $spec"
      # shellcheck disable=SC2086
      "$h" run --backend cuda -m "$MT" -c 4096 -s 1 -p "The history of the city" -n 512 --temp 0 --spec $spec \
        2>"$OUT/err.txt" | md5sum | cut -c1-12
      grep -E "^generation|^speculative|^acceptance" "$OUT/err.txt"
    done
  done
done 2>&1 | tee "$OUT/9b_ab.log"
[ -n "${AB_NO_BENCH:-}" ] || "$B" bench -m "$MT" --backend cuda -c 4096 --kv-type f16 -p 0 -n 32 \
  --verify 1,2,3,4,5,6,7,8,9,10,12,15,16,17,20,23,24,25,32 2>&1 | tee "$OUT/9b_verify.log"
# The engine tests on CUDA when the bundle has them (HYSPEC_DEVICE_BINS="test_engine", fixtures
# "qwen35-tiny dflash-tiny": with the MoE one the bundle passes 64 MiB, and its 4 cases fail).
[ ! -x .device/bin/test_engine ] || HYSPEC_TEST_BACKEND=cuda HYSPEC_FIXTURES=.device/fixtures .device/bin/test_engine 2>&1 |
  grep -E "^\[  (PASSED|FAILED) |tests ran"
