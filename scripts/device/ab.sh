#!/usr/bin/env bash
# A/B of two hyspec builds in one device call (carry [".device", ".anchor"]): .device/bin holds the new
# build (hyspec, test_backend) and the old one as hyspec_old, test_backend_old, e.g. made here with
#   git stash; cmake --build build-cuda --target hyspec test_backend; strip -o /tmp/oldbin/hyspec_old ...;
#   git stash pop; HYSPEC_DEVICE_BINS=test_backend HYSPEC_DEVICE_FIXTURES= scripts/device/pack.sh
#   (then add /tmp/oldbin/* to .device/bin.tar.xz)
# There: the anchor makes the 9B GGUFs (no llama-bench) while the CUDA tests of the new build and the
# interleaved matvec kernel benches run; then hyspec bench on 9B Q4_K_M, old / new / new with AB_ENV
# (e.g. "HYSPEC_NORM_QUANTIZE=0"), interleaved, AB_ROUNDS times.
set -uo pipefail
cd "$(dirname "$0")/../.."
D=.device
[ -d "$D/bin" ] || tar xJf "$D/bin.tar.xz" -C "$D"
export LD_LIBRARY_PATH="$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OUT=${OUT:-/tmp/hyspec-out}; mkdir -p "$OUT"
ANCHOR_MODELS_ONLY=1 bash bench/compare_llamacpp.sh start 9b
echo "== test_backend (cuda)"
HYSPEC_TEST_BACKEND=cuda timeout 300 "$D/bin/test_backend" --gtest_brief=1 2>&1 | grep -E "^\[  (PASSED|FAILED)  \]|Failure$|Expected|Which is|where" | head -30
echo "== matvec kernel benches, old / new interleaved (GB/s)"
for type in Q4_K Q6_K; do
  for b in test_backend_old test_backend test_backend_old test_backend; do
    echo "-- $b"
    HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_TYPE=$type HYSPEC_BENCH_WIDTHS=1,2,3,8,16,17,24,32 \
      timeout 120 "$D/bin/$b" --gtest_filter='CudaBench.MatmulDecode:CudaBench.MatmulSwiGlu' 2>&1 | grep -E "^\| |BENCH swiglu"
  done
done | tee "$OUT/kernels_ab.md"
for _ in $(seq 1 100); do [ -f /tmp/anchor/anchor.done ] && break; sleep 5; done
M=/tmp/anchor/9b-q4km.gguf
[ -f "$M" ] || { echo "no 9B model: $(tail -3 /tmp/anchor/anchor.err)"; exit 3; }
echo "== hyspec bench 9B Q4_K_M: old / new / new with ${AB_ENV:-(nothing)}"
for round in $(seq 1 "${AB_ROUNDS:-2}"); do
  for v in old new ab; do
    bin="$D/bin/hyspec"; envs=""
    [ "$v" = old ] && bin="$D/bin/hyspec_old"
    [ "$v" = ab ] && { [ -n "${AB_ENV:-}" ] || continue; envs=$AB_ENV; }
    echo "-- round $round: $v"
    env $envs "$bin" bench -m "$M" --backend cuda -p 0 -n 128 --verify 1,4,8,16 -c 4096 --kv-type f16 2>&1 |
      grep -E "tg128|verify" | awk -F'|' '{print $4, $5, $6, $7}'
  done
done | tee "$OUT/e2e_ab.md"
