#!/usr/bin/env bash
# The synthetic Qwen3.5 GGUF of the device benches, made at /tmp/SHAPE.gguf and its path printed: the repo's 9B
# Q4_K_M skeleton (made by llama.cpp's llama-quantize) filled with random weights of its types (9b), or that
# skeleton first resized to the llamacpp anchor's 27B shape with llama.cpp's Q4_K_M types by layer (27b;
# `gguf_skeleton resize`, 16.5 GB). Used by scripts/device/ab.sh (AB_SYNTH) and bench/compare_llamacpp_synth.sh:
#   M=$(bash bench/synth_gguf.sh 9b|27b PATH/TO/gguf_skeleton) || exit 3
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPE=${1:?9b|27b} G=${2:?gguf_skeleton} M=/tmp/${1:-}.gguf
case "$SHAPE" in
  9b) xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > "$M" ;;
  27b)
    xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > /tmp/9b-skeleton.gguf
    "$G" resize /tmp/9b-skeleton.gguf "$M" 5120 17408 64 24 48 >&2
    rm /tmp/9b-skeleton.gguf ;;
  *) echo "synth_gguf.sh: shape 9b or 27b, not '$SHAPE'" >&2; exit 2 ;;
esac
"$G" fill "$M" >&2
echo "$M"
