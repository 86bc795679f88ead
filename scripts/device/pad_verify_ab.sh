#!/usr/bin/env bash
# One device call (carry [".device"]): verify steps padded to whole 8-row tiles (`--pad-verify auto`, the
# default on CUDA with graphs) against the same build with `--pad-verify off`, and the tests that cover it.
#   here: HYSPEC_DEVICE_FIXTURES="qwen35-tiny dflash-tiny quants" scripts/device/pack.sh (every test binary:
#   the MoE fixture does not fit beside them, its cases run in CI), or HYSPEC_DEVICE_BINS="test_engine"
#   with "qwen35-tiny dflash-tiny" for PV_STEPS="engine_tests moe" (the MoE fixture does not fit there either).
# PV_STEPS (default "tests dense demo"):
#   tests         scripts/device/test.sh (every test binary, CPU and CUDA, memcheck, tiny benches)
#   engine_tests  test_engine on CUDA, and memcheck of adaptive n-gram / MTP runs (padded, graphs on)
#   dense         the synthetic 9B Q4_K_M with an MTP block (random weights: its greedy text falls into a loop
#                 that n-gram drafts follow; its MTP head accepts nothing): plain, n-gram adaptive / fixed 15 /
#                 fixed 7, MTP adaptive, padded and not, PV_ROUNDS rounds, ids compared, graphs recorded
#   demo          the demo models (trained drafters): scripts/measure_demo.py --adapt, the two forms taking
#                 turns on every prompt
#   moe           the 35B-A3B-shaped 8-layer Q4_K_M with an MTP block: plain, n-gram and MTP adaptive, padded
#                 and not (a padded row repeats the last draft, so it routes to that draft's experts)
# Session 41's build (pad off by default, `--pad-verify` a flag) ran the first three with the forms swapped.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
B=$PWD/.device/bin/hyspec G=.device/bin/gguf_skeleton MT=/tmp/9b-mtp.gguf U=/tmp/hyspec_unpadded
STEPS=" ${PV_STEPS:-tests dense demo} "
printf '#!/bin/sh\nexec %s "$@" --pad-verify off\n' "$B" > $U && chmod +x $U
has() { [[ "$STEPS" == *" $1 "* ]]; }
if has tests; then
  OUT=$OUT/test scripts/device/test.sh > "$OUT/test.log" 2>&1
  echo "test.sh rc=$?"; sed -n '/== summary/,$p' "$OUT/test.log"
fi
if has engine_tests; then
  HYSPEC_TEST_BACKEND=cuda HYSPEC_FIXTURES=.device/fixtures .device/bin/test_engine --gtest_brief=1 2>&1 |
    grep -E "^\[  (PASSED|FAILED) |tests ran"
  M=.device/fixtures/qwen35-tiny/qwen35-tiny-f32.gguf
  for spec in ngram mtp; do
    compute-sanitizer --tool memcheck --error-exitcode 9 "$B" run -m "$M" --backend cuda --spec $spec \
      --tokens 501,500,505,194,87 -n 64 --temp 0 --ids > "$OUT/memcheck_$spec.log" 2>&1
    echo "memcheck padded $spec rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_$spec.log") $(grep -E 'padded' "$OUT/memcheck_$spec.log")"
  done
fi
# $1 label, $2 model, $3 tokens, the specs after: every spec unpadded then padded, PV_ROUNDS rounds.
engine_runs() {
  local label=$1 model=$2 n=$3; shift 3
  for r in $(seq 1 "${PV_ROUNDS:-2}"); do
    for spec in "$@"; do
      for h in "$U" "$B"; do
        # shellcheck disable=SC2086
        ids=$($h run --backend cuda -m "$model" -c 4096 -s 1 -p "The history of the city" -n "$n" --temp 0 --spec $spec \
          2>"$OUT/err.txt" | md5sum | cut -c1-12)
        echo "$label r$r $(basename "$h") $spec: $ids $(grep -E "^generation|^step graphs|^speculative|^verify rows" "$OUT/err.txt" | tr '\n' ' ')"
      done
    done
  done
}
if has dense; then
  if [ ! -f "$MT" ]; then
    xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > /tmp/sk.gguf && $G add-nextn /tmp/sk.gguf "$MT" && $G fill "$MT" && rm /tmp/sk.gguf || exit 3
  fi
  engine_runs 9B "$MT" 512 none ngram "ngram --no-adapt --draft-max 15" "ngram --no-adapt --draft-max 7" mtp 2>&1 |
    tee "$OUT/engine.log"
fi
if has demo; then
  python3 scripts/measure_demo.py --hyspec "$U,$B" --backend cuda --prompts "${PROMPTS:-24}" --adapt 2>&1 | tee "$OUT/demo.log"
fi
if has moe; then
  xz -T0 -dc bench/data/35b-a3b-8l-q4km.skeleton.gguf.xz > /tmp/moe-skel.gguf && $G add-nextn /tmp/moe-skel.gguf /tmp/moe.gguf &&
    $G fill /tmp/moe.gguf > /dev/null || exit 3
  engine_runs MoE /tmp/moe.gguf 512 none ngram "ngram --no-adapt --draft-max 15" mtp 2>&1 | tee "$OUT/moe.log"
fi
