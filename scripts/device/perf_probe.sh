#!/usr/bin/env bash
# A measuring call without llama.cpp (carry [".device", ".anchor"]; ~6 min): the anchor's random 9B made
# and converted to BF16 by its own recipe and converter, no build (ANCHOR_BF16_ONLY=1), then
#   - decode-attention kernel benches at ctx 16384 (caches rotated past L2) under each PROBE_ATTN variant,
#   - the op profile of a 512-token prompt step on the BF16 9B (HYSPEC_CUDA_PROFILE, --no-graphs),
#   - tg at depth 0 and 16384 on the BF16 9B under each PROBE_ATTN variant (the attention's depth cost).
# PROBE_ATTN: variants as "NAME:ENV=V,ENV=V ..." (default: the Q8_0 decode kernel's layouts).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -d .device/bin ] || tar xJf .device/bin.tar.xz -C .device
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OUT=${OUT:-/tmp/hyspec-out}
mkdir -p "$OUT"
W=/tmp/anchor H=.device/bin/hyspec M=/tmp/anchor/9b-bf16.gguf
ANCHOR_BF16_ONLY=1 bash bench/compare_llamacpp.sh start 9b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
VARIANTS=${PROBE_ATTN:-"w4x1: w4x2:HYSPEC_ATTN_BLOCKS_PER_SM=2 w8x1:HYSPEC_ATTN_WARPS=8"}
with_variant() {  # NAME:ENV=V,... then a command
  local v=$1; shift
  local envs=${v#*:}
  # shellcheck disable=SC2046
  env $(echo "$envs" | tr ',' ' ') "$@"
}
{
  echo "== CUDA attention tests (each variant)"
  for v in $VARIANTS; do
    echo "-- ${v%%:*}"
    with_variant "$v" env HYSPEC_TEST_BACKEND=cuda timeout 120 .device/bin/test_backend --gtest_brief=1 \
      --gtest_filter='CudaBackendTest.Attention*:CudaBackendTest.KvStore*:CudaBackendTest.QkNorm*' 2>&1 |
      grep -E "PASSED|FAILED" | sort -u
  done
  echo "== attention benches at ctx 16384, caches rotated past L2"
  for v in $VARIANTS; do
    echo "-- ${v%%:*}"
    with_variant "$v" env HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_CTX=16384 timeout 120 .device/bin/test_backend \
      --gtest_filter='CudaBench.AttentionAndGdnDecode' 2>&1 | grep -E "BENCH attention"
  done
} 2>&1 | tee "$OUT/attention.log"
while [ ! -f "$W/anchor.done" ] && [ "$SECONDS" -lt 360 ]; do sleep 5; done
echo "== BF16 9B at ${SECONDS}s: $(ls -la $M 2>&1)"; tail -3 "$W/anchor.err"
[ -f "$M" ] || exit 3
{
  echo "== op profile, 512-token prompt (BF16)"
  HYSPEC_CUDA_PROFILE=1 "$H" bench -m "$M" --backend cuda --no-graphs -p 512 -n 0 -c 4096 --kv-type f16 2>&1 |
    grep -E "^\||HYSPEC_CUDA_PROFILE" | head -70
} 2>&1 | tee "$OUT/profile.log"
bench() { echo "== hyspec $*"; "$H" bench --backend cuda "$@" 2>&1 | grep -E "^\| (model|---|.*(pp|tg|verify))"; }
{
  bench -m "$M" -p 512 -n 64 -d 0,16384 -c 17000 --kv-type f16
  for v in $VARIANTS; do
    [ "$SECONDS" -lt 540 ] || { echo "== no time for ${v%%:*}"; break; }
    echo "-- ${v%%:*}"
    with_variant "$v" bash -c "$(declare -f bench); H=$H; bench -m $M -p 0 -n 64 -d 0,16384 -c 17000 --kv-type q8_0"
  done
} 2>&1 | tee "$OUT/depth.log"
echo "== done at ${SECONDS}s"
