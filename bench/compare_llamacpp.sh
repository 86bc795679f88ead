#!/usr/bin/env bash
# Side by side with llama.cpp on the GPU machine, on the same GGUF files:
#   llama.cpp = the source pinned by node-llama-cpp@3.22.1 (npm pack here; the device has no network),
#   built and benchmarked by ../shared/tools/llamacpp_anchor.sh on a random-weight Qwen3.5 checkpoint
#   of SHAPE that it converts (BF16) and quantizes (Q4_K_M) with that llama.cpp's own tools;
#   hyspec = `hyspec bench --backend cuda` on those two files (pp512, tg128 at depth 0/4k/16k, verify-k).
#
# Here, once:  bench/pack_llamacpp.sh   (llama.cpp source as .anchor/llama.cpp-src.tar.xz + the anchor
#              script; scripts/device/pack.sh for the hyspec build in .device/)
# There:       bench/compare_llamacpp.sh start [SHAPE]   # returns at once; the anchor runs detached
#              bench/compare_llamacpp.sh finish [SHAPE]  # waits for it, then benchmarks hyspec
# (two calls so that neither passes the 10-minute limit of one device command.)
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?start|finish}; SHAPE=${2:-9b}
W=/tmp/anchor; OUT=${OUT:-/tmp/hyspec-out}
mkdir -p "$W" "$OUT"
[ -d .device/bin ] || tar xJf .device/bin.tar.xz -C .device
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
if [ "$MODE" = start ]; then
  mkdir -p "$W/llama.cpp" && tar xJf .anchor/llama.cpp-src.tar.xz -C "$W/llama.cpp"
  # the anchor clones its first argument only when WORKDIR/llama.cpp is absent; it is present now
  A=.anchor/llamacpp_anchor.sh
  # ANCHOR_MODELS_ONLY=1: build llama.cpp and make the GGUFs, skip llama-bench (A/B sessions of hyspec
  # builds, whose GPU benches would otherwise share the GPU with llama-bench's).
  if [ "${ANCHOR_MODELS_ONLY:-0}" = 1 ]; then sed '/^\$B -m/d' "$A" > "$W/anchor_models.sh"; A=$W/anchor_models.sh; fi
  # ANCHOR_NO_SWEEP=1: llama-bench pp512/tg128 only, without the pp1..32 sweep (saves ~1 min of a call).
  if [ "${ANCHOR_NO_SWEEP:-0}" = 1 ]; then sed '/-p 1,2,4,8,16,32/d' "$A" > "$W/anchor_nosweep.sh"; A=$W/anchor_nosweep.sh; fi
  # SHAPE 35b-a3b-8l: Qwen3.5-35B-A3B's MoE layers (transformers' Qwen3_5MoeTextConfig: hidden 2048, 256
  # experts of 512, top-8, a shared expert of 512), 8 of its 40 layers (disk: ~35 GB on the way).
  if [ "$SHAPE" = 35b-a3b-8l ]; then
    sed -e 's|^kw = {"9b": {},|kw = {"35b-a3b-8l": dict(num_hidden_layers=8, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2), "9b": {},|' \
      -e 's|^cfg = tf.Qwen3_5TextConfig(\*\*kw); cfg.architectures = \["Qwen3_5ForCausalLM"\]|moe = shape.startswith("35b"); cfg = (tf.Qwen3_5MoeTextConfig if moe else tf.Qwen3_5TextConfig)(**kw); cfg.architectures = ["Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"]; print(cfg, file=sys.stderr)|' \
      -e 's|m = tf.Qwen3_5ForCausalLM(cfg)|m = (tf.Qwen3_5MoeForCausalLM if moe else tf.Qwen3_5ForCausalLM)(cfg)|' "$A" > "$W/anchor_moe.sh"
    grep -q Qwen3_5MoeForCausalLM "$W/anchor_moe.sh" && [ "$(grep -c 'moe' "$W/anchor_moe.sh")" -ge 2 ] ||
      { echo "the anchor script changed: no MoE variant made"; exit 3; }
    A=$W/anchor_moe.sh
  fi
  # ANCHOR_BF16_ONLY=1: no build, no Q4_K_M, no llama-bench: only the BF16 file, made by the anchor's own
  # recipe and converter (probe calls: ready in ~110 s).
  if [ "${ANCHOR_BF16_ONLY:-0}" = 1 ]; then
    sed -e '/^( cd llama.cpp && cmake/,/^BUILD=\$!$/d' -e '/^wait \$BUILD$/d' -e '/^\$L\/build\/bin\/llama-quantize/d' \
      -e '/^\$B -m/d' "$A" > "$W/anchor_bf16only.sh"; A=$W/anchor_bf16only.sh
  fi
  setsid nohup bash -c "bash $A .anchor/llama.cpp-src.tar.xz $W $SHAPE > $W/anchor.md 2> $W/anchor.err; echo done > $W/anchor.done" > /dev/null 2>&1 &
  echo "anchor started in $W"
  exit 0
fi
for _ in $(seq 1 110); do [ -f "$W/anchor.done" ] && break; sleep 5; done
if [ ! -f "$W/anchor.done" ]; then
  echo "anchor still running: $(ls $W) $(tail -2 $W/*.log 2>/dev/null)"; exit 3
fi
echo "== llama.cpp (llama-bench, -fa 1, -ngl 99)"; cat "$W/anchor.md"; tail -3 "$W/anchor.err"
cp "$W/anchor.md" "$OUT/llamacpp.md"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
for f in "$W/$SHAPE-q4km.gguf" "$W/$SHAPE-bf16.gguf"; do
  echo "== hyspec $(basename "$f")"
  .device/bin/hyspec bench -m "$f" --backend cuda -p 512 -n 128 -d 0,4096,16384 --verify 1,2,4,8,16,32 -c 17000 \
    --kv-type f16 2>&1 | tee -a "$OUT/hyspec.md"
done
