#!/usr/bin/env bash
# One device call timing the model drafters on 9B shapes (carry [".device"]; ~2 min): the anchor's
# Q4_K_M 9B skeleton (bench/data) with an MTP block added (gguf_skeleton add-nextn) and a 5-layer Q8_0
# DFlash drafter for it (gguf_skeleton dflash-for), random weights, so every draft is rejected: what a
# round costs beside its verify step. Then sampled and greedy generation on the same target.
#   here: HYSPEC_DEVICE_BINS="" HYSPEC_DEVICE_FIXTURES="" scripts/device/pack.sh
# DRAFTERS_EXTRA: commands eval'd at the end ($H hyspec, $MT the target, $D9 the drafter); DRAFTERS_MAIN=0 runs
# only those. Logs in $OUT.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
H=.device/bin/hyspec G=.device/bin/gguf_skeleton MT=/tmp/9b-mtp.gguf D9=/tmp/9b-dflash.gguf
export H MT D9
if [ ! -f "$MT" ]; then
  xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > /tmp/sk.gguf && $G add-nextn /tmp/sk.gguf "$MT" && $G fill "$MT" &&
    $G dflash-for /tmp/sk.gguf "$D9" && $G fill "$D9" && rm /tmp/sk.gguf || exit 3
fi
gen() { echo "== run $*"; "$H" run --backend cuda -m "$MT" -c 4096 -s 1 -p "The history of the city" "$@" 2>&1 >/dev/null |
  grep -E "^generation|^speculative|^time per phase"; }
[ "${DRAFTERS_MAIN:-1}" = 0 ] || {
  gen -n 512 --temp 0
  gen -n 512 --temp 0.7                                       # the CLI's top-k 40, top-p 0.95, min-p 0.05
  gen -n 512 --temp 1 --top-k 0 --top-p 1 --min-p 0           # the server's default: temperature alone
  gen -n 512 --temp 0.7 --top-k 20 --top-p 0.8 --min-p 0
  for dv in 0 151643 65536 32768; do
    gen -n 256 --temp 0 --spec mtp --no-adapt --draft-max 1 --draft-vocab $dv
    gen -n 256 --temp 0 --spec mtp --no-adapt --draft-max 6 --draft-vocab $dv
  done
  for dv in 0 151643 65536; do gen -n 256 --temp 0 --spec dflash --draft-model "$D9" --no-adapt --draft-vocab $dv; done
} 2>&1 | tee "$OUT/drafters.log"
[ -z "${DRAFTERS_EXTRA:-}" ] || { echo "== $DRAFTERS_EXTRA"; eval "$DRAFTERS_EXTRA"; } 2>&1 | tee "$OUT/extra.log"
