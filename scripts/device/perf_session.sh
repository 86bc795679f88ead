#!/usr/bin/env bash
# The measured part of a CUDA performance session in two back-to-back device calls (one would pass the
# 10-minute limit of a command), with carry [".device", ".anchor"]:
#   here:  bench/pack_llamacpp.sh (once), then
#          HYSPEC_DEVICE_BINS="test_backend test_model test_server" HYSPEC_DEVICE_FIXTURES="qwen35-tiny dflash-tiny" \
#            scripts/device/pack.sh          (tree + .device + .anchor stay under the 64 MiB a call carries)
#   there: scripts/device/perf_session.sh start    # llama.cpp's anchor detached, then session_checks.sh (~4 min)
#          scripts/device/perf_session.sh finish   # both 9B files side by side, kernel times of verify-16 and decode
#          (PERF_AB="VAR=value ...": also decode and verify-4/16 with and without those variables, interleaved;
#           PERF_SAME_OUTPUT="VAR=value": greedy ids of the 9B with and without them, compared;
#           PERF_KV_BF16=0, PERF_KV_Q8=0, PERF_KT_VERIFY=0, PERF_KERNELS=0, PERF_KT_DECODE=0 skip the BF16 and
#           Q8_0 KV benches, the verify-16 kernel times, the kernel benches and the decode kernel times;
#           PERF_NATIVE_QUANTS="Q3_K_M IQ4_XS" quantizes the 9B to those with llama-quantize and benches
#           llama.cpp and hyspec on them)
# The anchor's files live in /tmp/anchor, so `finish` must follow while the machine is still warm (30 s).
# session_checks.sh's benches must end before the anchor's llama-bench starts (~5 min in), or both
# read low: add nothing GPU-heavy to `start`.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:?start|finish}
[ -d .device/bin ] || tar xJf .device/bin.tar.xz -C .device
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OUT=${OUT:-/tmp/hyspec-out}
if [ "$MODE" = start ]; then
  bash bench/compare_llamacpp.sh start 9b
  if [ "${PERF_CHECKS:-1}" = 1 ]; then
    SC_BENCH=0 bash scripts/device/session_checks.sh 2>&1 | tee "$OUT/checks.log"
  else  # the tests ran earlier: the attention bench at 16K (before the anchor's llama-bench), then wait for it
    for b in 0 1 3; do
      echo "== attention at ctx 16384, HYSPEC_ATTN_BLOCKS_PER_SM=$b (0: default)"
      HYSPEC_ATTN_BLOCKS_PER_SM=$b HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_CTX=16384 timeout 100 .device/bin/test_backend \
        --gtest_filter='CudaBench.AttentionAndGdnDecode' 2>&1 | grep -E "BENCH|^\|" | head -30
    done | tee "$OUT/attn16k.log"
    while [ ! -f /tmp/anchor/anchor.done ] && [ "$SECONDS" -lt 550 ]; do sleep 5; done  # inside the 600 s of a call
    cat /tmp/anchor/anchor.md
  fi
  exit 0
fi
bash bench/compare_llamacpp.sh finish 9b
if [ -n "${PERF_AB:-}" ]; then  # e.g. PERF_AB="VAR=value": decode and verify without and with it
  for round in 1 2; do
    for ab in "$PERF_AB" ""; do
      echo "== A/B round $round: ${ab:-default}"
      env $ab .device/bin/hyspec bench -m /tmp/anchor/9b-q4km.gguf --backend cuda -p 0 -n 128 --verify 4,16 -c 4096 \
        --kv-type f16 2>&1 | grep -E "tg128|verify"
    done
  done | tee "$OUT/ab.md"
fi
if [ -n "${PERF_SAME_OUTPUT:-}" ]; then  # e.g. "HYSPEC_DEFER_NORM=0": greedy ids with and without those variables
  for ab in "$PERF_SAME_OUTPUT" ""; do
    env $ab .device/bin/hyspec run -m /tmp/anchor/9b-q4km.gguf --backend cuda --tokens 11,22,33,44,55,66,77 -n 48 \
      --temp 0 --ids --no-stats > "$OUT/ids_$([ -n "$ab" ] && echo variant || echo default).txt" 2>&1
  done
  echo "== greedy ids, ${PERF_SAME_OUTPUT} vs default: $(cmp -s "$OUT/ids_variant.txt" "$OUT/ids_default.txt" && echo identical || echo DIFFERENT)"
  head -c 400 "$OUT/ids_default.txt"; echo
fi
if [ "${PERF_PROFILE:-0}" = 1 ]; then  # GPU time per op of a 512-token prefill, both files
  for f in /tmp/anchor/9b-bf16.gguf /tmp/anchor/9b-q4km.gguf; do
    echo "== op profile, pp512: $(basename "$f")"
    HYSPEC_CUDA_PROFILE=1 timeout 120 .device/bin/hyspec bench -m "$f" --backend cuda --no-graphs --kv-type f16 -c 4096 \
      -p 512 -n 0 2>&1 | grep -E "^\| (model|---|.*pp)|HYSPEC_CUDA_PROFILE|^\| [a-z_]+ " | head -40
  done | tee "$OUT/profile_pp512.md"
fi
if [ -n "${PERF_Q8_BLOCKS:-}" ]; then  # decode attention blocks per SM with a Q8_0 cache, at depth 0 and 16384
  for b in $PERF_Q8_BLOCKS; do
    echo "== Q8_0 KV, HYSPEC_ATTN_BLOCKS_PER_SM=$b"
    HYSPEC_ATTN_BLOCKS_PER_SM=$b .device/bin/hyspec bench -m /tmp/anchor/9b-q4km.gguf --backend cuda -p 0 -n 128 \
      -d 0,16384 -c 17000 --kv-type q8_0 2>&1 | grep -E "tg128"
  done | tee "$OUT/q8_blocks.md"
fi
[ "${PERF_MEMCHECK:-1}" = 1 ] && echo "== memcheck: 9B prefill and decode steps (real shapes: the fixtures are tiny)" &&
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 .device/bin/hyspec run -m /tmp/anchor/9b-q4km.gguf \
  --backend cuda --tokens 11,22,33 -n 3 --temp 0 --ids --no-stats --no-graphs 2>&1 | grep -E "ERROR SUMMARY|rror"
if [ "${PERF_KERNELS:-1}" = 1 ]; then
  echo "== kernel benches"
  bash scripts/device/kernel_benches.sh 2>&1 | tee "$OUT/benches.log"
fi
if [ "${PERF_KV_BF16:-1}" = 1 ]; then
  echo "== BF16 KV cache at depth 0 and 16384 (the side-by-side above: F16)"
  .device/bin/hyspec bench -m /tmp/anchor/9b-q4km.gguf --backend cuda -p 0 -n 128 -d 0,16384 --verify 16 -c 17000 \
    --kv-type bf16 2>&1 | tee "$OUT/kv_bf16.md"
fi
if [ "${PERF_KV_Q8:-1}" = 1 ]; then  # CUDA_NOTES, "Q8_0 KV cache"
  echo "== Q8_0 KV cache: memcheck of 9B steps, then depth 0 and 16384 (the side-by-side above: F16)"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 .device/bin/hyspec run \
    -m /tmp/anchor/9b-q4km.gguf --backend cuda --kv-type q8_0 --tokens 11,22,33 -n 3 --temp 0 --ids --no-stats \
    --no-graphs 2>&1 | grep -E "ERROR SUMMARY|rror"
  .device/bin/hyspec bench -m /tmp/anchor/9b-q4km.gguf --backend cuda -p 512 -n 128 -d 0,16384 \
    --verify 16 -c 17000 --kv-type q8_0 2>&1 | tee "$OUT/kv_q8_0.md"
fi
for q in ${PERF_NATIVE_QUANTS:-}; do  # CUDA_NOTES, "Weight types"
  f=/tmp/anchor/9b-$q.gguf
  /tmp/anchor/llama.cpp/build/bin/llama-quantize /tmp/anchor/9b-bf16.gguf "$f" "$q" > /tmp/anchor/quant-$q.log 2>&1 ||
    { echo "llama-quantize $q failed: $(tail -2 /tmp/anchor/quant-$q.log)"; continue; }
  echo "== $q: llama.cpp, then hyspec"
  /tmp/anchor/llama.cpp/build/bin/llama-bench -m "$f" -p 512 -n 128 -fa 1 -ngl 99 2>&1 | grep -E "^\|"
  .device/bin/hyspec bench -m "$f" --backend cuda -p 512 -n 128 --verify 16 -c 4096 \
    --kv-type f16 2>&1 | grep -E "^\| (model|---|.*(pp|tg|verify))"
  rm -f "$f"
done | tee "$OUT/native_quants.md"
if [ "${PERF_KT_VERIFY:-1}" = 1 ]; then
  echo "== GPU time per kernel of a verify-16 step (ncu)"
  KT_BENCH="-p 0 -n 0 --verify 16" KT_STEPS=9 bash bench/kernel_times.sh /tmp/anchor/9b-q4km.gguf 0 20000 | tee "$OUT/kt_verify16.md"
fi
if [ "${PERF_KT_DECODE:-1}" = 1 ]; then
  echo "== GPU time per kernel of decode steps (ncu)"
  bash bench/kernel_times.sh /tmp/anchor/9b-q4km.gguf | tee "$OUT/kt_decode.md"
fi
