#!/usr/bin/env bash
# Speculative rounds of two builds, interleaved (carry [".device"], the older `hyspec` added to the bundle as
# hyspec_old): the demo models' held-out prompts (scripts/measure_demo.py, the full draft length and the
# adaptive one: acceptance, tokens/s, identical outputs), then the 9B with a random MTP block and a random DFlash
# drafter under forced speculation (--no-adapt: every draft rejected, so a round is its draft and verify).
#   SR_PROMPTS  held-out prompts (default 8)
#   SR_ROUNDS   interleaved rounds on the 9B (default 2)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
B=.device/bin/hyspec_old,.device/bin/hyspec
echo "== demo models, --no-adapt"
python3 scripts/measure_demo.py --hyspec "$B" --backend cuda --prompts "${SR_PROMPTS:-8}"
echo "== demo models, adaptive"
python3 scripts/measure_demo.py --hyspec "$B" --backend cuda --prompts "${SR_PROMPTS:-8}" --adapt
echo "== 9B, random drafters, forced speculation"
DRAFTERS_MAIN=0 DRAFTERS_EXTRA='for r in $(seq '"${SR_ROUNDS:-2}"'); do for H in .device/bin/hyspec_old .device/bin/hyspec; do
  echo "-- round $r: $H"; gen -n 256 --temp 0 --spec mtp --no-adapt --draft-max 6
  gen -n 256 --temp 0 --spec dflash --draft-model "$D9" --no-adapt; done; done' bash scripts/device/drafters.sh
