#!/usr/bin/env bash
# One device call (carry [".device"]; ~7 min): the MTP drafter's observe as a recorded graph without the
# head (the first draft's logits wait for propose), against the parent build (bin/hyspec_base).
#   here: HYSPEC_DEVICE_BINS="test_model test_engine" HYSPEC_DEVICE_FIXTURES="qwen35-tiny dflash-tiny"
#   scripts/device/pack.sh, then the parent's stripped hyspec added to .device/bin.tar.xz as bin/hyspec_base.
# 1. The synthetic 9B Q4_K_M with an MTP block (its random head accepts nothing, so the adaptive engine
#    backs off to plain rounds that still observe): plain, MTP adaptive, MTP at a fixed 3 drafts, 512
#    tokens, MO_ROUNDS rounds, builds interleaved, ids compared. 2. The demo models (a trained MTP head),
#    scripts/measure_demo.py with the builds taking turns. 3. memcheck of MTP runs (graphs off and on),
#    test_model and test_engine on CUDA.
# MO_BINS: the builds to compare (default: bin/hyspec_base and bin/hyspec), e.g. a third one added to the
# bundle beside them (session 41: bin/hyspec_mid, the commit between).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
B=.device/bin/hyspec G=.device/bin/gguf_skeleton MT=/tmp/9b-mtp.gguf
read -r -a BINS <<< "${MO_BINS:-.device/bin/hyspec_base $B}"
if [ ! -f "$MT" ]; then
  xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > /tmp/sk.gguf && $G add-nextn /tmp/sk.gguf "$MT" && $G fill "$MT" && rm /tmp/sk.gguf || exit 3
fi
echo "== 9B engine runs (512 tokens)"
for r in $(seq 1 "${MO_ROUNDS:-2}"); do
  for h in "${BINS[@]}"; do
    for spec in none mtp "mtp --no-adapt --draft-max 3"; do
      # shellcheck disable=SC2086
      ids=$($h run --backend cuda -m "$MT" -c 4096 -s 1 -p "The history of the city" -n 512 --temp 0 --spec $spec \
        2>"$OUT/err.txt" | md5sum | cut -c1-12)
      echo "r$r $(basename "$h") $spec: $ids $(grep -E "^generation|^step graphs|^speculative|^time per" "$OUT/err.txt" | tr '\n' ' ')"
    done
  done
done 2>&1 | tee "$OUT/engine.log"
python3 scripts/measure_demo.py --hyspec "$(IFS=,; echo "${BINS[*]}")" --backend cuda --prompts "${PROMPTS:-24}" --adapt 2>&1 | tee "$OUT/demo.log"
M=.device/fixtures/qwen35-tiny/qwen35-tiny-f32.gguf
for graphs in --no-graphs ""; do
  for adapt in --no-adapt ""; do  # adaptive: plain stretches observed at once
    compute-sanitizer --tool memcheck --error-exitcode 9 "$B" run -m "$M" --backend cuda --spec mtp \
      --tokens 501,500,505,194,87 -n 48 --temp 0 --ids --no-stats $adapt $graphs > "$OUT/memcheck$graphs$adapt.log" 2>&1
    echo "memcheck $graphs $adapt rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck$graphs$adapt.log")"
  done
done
for t in test_model test_engine; do
  [ -x ".device/bin/$t" ] && HYSPEC_TEST_BACKEND=cuda HYSPEC_FIXTURES=.device/fixtures ".device/bin/$t" --gtest_brief=1 2>&1 |
    grep -E "^\[  (PASSED|FAILED) |tests ran" | grep -v moe | head -20
done
