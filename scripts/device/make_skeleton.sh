#!/usr/bin/env bash
# On the GPU machine, after the anchor made /tmp/anchor/9b-q4km.gguf (e.g. perf_one_call.sh's
# ONE_EXTRA="bash scripts/device/make_skeleton.sh"): its skeleton (header, zero data; tools/gguf_skeleton)
# as $OUT/<shape>-q4km.skeleton.gguf.xz, to commit as bench/data/<shape>-q4km.skeleton.gguf.xz for
# probe_kernels.sh's PROBE_SYNTH=1. Then the check that such a file times like the anchor's: a synthetic
# 9B made from the skeleton and the anchor's file, hyspec bench on each, two interleaved rounds.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
# SKELETON_SHAPE: the anchor's shape (default 9b; 35b-a3b-8l for bench/compare_llamacpp.sh's MoE shape).
SH=${SKELETON_SHAPE:-9b}
W=/tmp/anchor A=$W/$SH-q4km.gguf S=$W/$SH-q4km-synth.gguf
[ -f "$A" ] || { echo "no $A"; exit 3; }
.device/bin/gguf_skeleton skeleton "$A" "$OUT/$SH-q4km.skeleton.gguf" &&
  xz -T0 -9 -f "$OUT/$SH-q4km.skeleton.gguf" && ls -la "$OUT/$SH-q4km.skeleton.gguf.xz"
start=$SECONDS
xz -T0 -dc "$OUT/$SH-q4km.skeleton.gguf.xz" > "$S" && .device/bin/gguf_skeleton fill "$S" || exit 3
echo "== synthetic file made in $((SECONDS - start)) s"
cmp -n 4096 "$A" "$S" > /dev/null && echo "== headers' first 4 KB equal"
for round in 1 2; do
  for f in "$A" "$S"; do
    echo "== $(basename "$f"), round $round"
    .device/bin/hyspec bench --backend cuda -m "$f" -p 512 -n 64 -c 4096 --verify 15,16 --kv-type f16 2>&1 |
      grep -E "^\| .*(pp|tg|verify)" | sed 's/^| [^|]*| [^|]*| //'
  done
done
rm -f "$S"
