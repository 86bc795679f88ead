#!/usr/bin/env bash
# One device call (carry [".device"]; ~7 min): when a session records its step graphs. HYSPEC_GRAPH_AFTER=N
# records a step's graph at its N-th run (the runs before go eagerly); one binary, N = 1 (record at first
# use) against 2, on the synthetic 9B Q4_K_M with an MTP block and on the demo models.
#   here: HYSPEC_DEVICE_BINS="test_engine" HYSPEC_DEVICE_FIXTURES="qwen35-tiny dflash-tiny" scripts/device/pack.sh
# 1. The 9B (random weights: greedy text that loops; its MTP head accepts nothing): plain, n-gram adaptive,
#    n-gram at a fixed 15, MTP, 512 tokens, GA_ROUNDS rounds, ids compared, graphs recorded and their time.
# 2. The demo models (real acceptance), scripts/measure_demo.py with the two settings taking turns.
# 3. test_engine on CUDA with N = 2 (steps run eagerly before their graph exists).
# GA_L2="8 24": also `hyspec bench` with HYSPEC_L2_PERSIST at those MiB against 0 (Backend::keep_resident).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
B=.device/bin/hyspec G=.device/bin/gguf_skeleton MT=/tmp/9b-mtp.gguf
if [ ! -f "$MT" ]; then
  xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > /tmp/sk.gguf && $G add-nextn /tmp/sk.gguf "$MT" && $G fill "$MT" && rm /tmp/sk.gguf || exit 3
fi
for n in 1 2; do printf '#!/bin/sh\nHYSPEC_GRAPH_AFTER=%s exec %s/%s "$@"\n' "$n" "$PWD" "$B" > ".device/bin/hyspec_g$n"; chmod +x ".device/bin/hyspec_g$n"; done
echo "== 9B engine runs (512 tokens)"
for r in $(seq 1 "${GA_ROUNDS:-2}"); do
  for n in 1 2; do
    for spec in none ngram "ngram --no-adapt --draft-max 15" mtp; do
      # shellcheck disable=SC2086
      ids=$(HYSPEC_GRAPH_AFTER=$n $B run --backend cuda -m "$MT" -c 4096 -s 1 -p "The history of the city" -n 512 --temp 0 \
        --spec $spec 2>"$OUT/err.txt" | md5sum | cut -c1-12)
      echo "r$r after=$n $spec: $ids $(grep -E "^generation|^step graphs|^speculative|^time per" "$OUT/err.txt" | tr '\n' ' ')"
    done
  done
done 2>&1 | tee "$OUT/engine.log"
for l2 in ${GA_L2:-}; do
  for v in 0 "$l2" 0 "$l2"; do
    echo "== HYSPEC_L2_PERSIST=$v"
    HYSPEC_L2_PERSIST=$v $B bench -m "$MT" --backend cuda -c 4096 --kv-type f16 -p 512 -n 64 --verify 15 2>&1 | grep -E "^\| .*(pp|tg|verify)"
  done
done 2>&1 | tee "$OUT/l2.log"
python3 scripts/measure_demo.py --hyspec ".device/bin/hyspec_g1,.device/bin/hyspec_g2" --backend cuda \
  --prompts "${PROMPTS:-16}" --adapt 2>&1 | tee "$OUT/demo.log"
HYSPEC_GRAPH_AFTER=2 HYSPEC_TEST_BACKEND=cuda HYSPEC_FIXTURES=.device/fixtures .device/bin/test_engine --gtest_brief=1 2>&1 |
  grep -E "^\[  (PASSED|FAILED) |tests ran" | head -20
