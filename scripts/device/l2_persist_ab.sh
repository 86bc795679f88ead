#!/usr/bin/env bash
# One device call (carry [".device"]; ~8 min): the L2 persisting window over a sequence's GDN states
# (Backend::keep_resident) on the synthetic 9B Q4_K_M with an MTP block. One binary switches it
# (HYSPEC_L2_PERSIST=0 against the default), beside the parent build carried as bin/hyspec_base.
# Session 41 measured d3dec1e with it and reverted the window (dbccbd2: slower at every set-aside); on
# later code HYSPEC_L2_PERSIST does nothing, and the script compares two builds' defaults.
#   here: HYSPEC_DEVICE_BINS="test_model test_engine" HYSPEC_DEVICE_FIXTURES="qwen35-tiny dflash-tiny"
#   scripts/device/pack.sh, then the parent's stripped hyspec added to .device/bin.tar.xz as bin/hyspec_base.
# 1. The device's L2 limits. 2. Greedy ids of each build (plain, MTP drafts of 15). 3. `hyspec bench`
# interleaved (L2P_ROUNDS rounds): pp512, tg64, verify 1/15/16 at depth 0 (F16 cache), then tg64 at
# depth 0 and 16384 with a Q8_0 cache. 4. n-gram and MTP runs of the engine (the adaptive draft length).
# 5. test_model and test_engine on CUDA.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
A=.device/bin/hyspec_base B=.device/bin/hyspec G=.device/bin/gguf_skeleton MT=/tmp/9b-mtp.gguf
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python3 - <<'PY'
import ctypes
rt = ctypes.CDLL("libcudart.so.13")
for name, attr in [("L2 bytes", 38), ("max persisting L2 bytes", 108), ("max access-policy window bytes", 109)]:
    v = ctypes.c_int(0)
    rt.cudaDeviceGetAttribute(ctypes.byref(v), attr, 0)
    print(f"{name}: {v.value} ({v.value / 2**20:.1f} MiB)")
PY
if [ ! -f "$MT" ]; then
  xz -T0 -dc bench/data/9b-q4km.skeleton.gguf.xz > /tmp/sk.gguf && $G add-nextn /tmp/sk.gguf "$MT" && $G fill "$MT" && rm /tmp/sk.gguf || exit 3
fi
variants=("base:$A" "off:env HYSPEC_L2_PERSIST=0 $B" "on:$B")
echo "== greedy ids"
for v in "${variants[@]}"; do
  for spec in none "mtp --draft-max 15"; do
    # shellcheck disable=SC2086
    printf '%s %-20s %s\n' "${v%%:*}" "$spec" "$(${v#*:} run --backend cuda -m "$MT" -c 4096 -s 1 -p "The history of the city" \
      -n 128 --temp 0 --spec $spec 2>/dev/null | md5sum | cut -c1-12)"
  done
done
for r in $(seq 1 "${L2P_ROUNDS:-3}"); do
  for v in "${variants[@]}"; do
    echo "== round $r ${v%%:*} depth 0, F16 cache"
    # shellcheck disable=SC2086
    ${v#*:} bench -m "$MT" --backend cuda -c 4096 --kv-type f16 -p 512 -n 64 --verify 1,15,16 2>&1 | grep -E "^\| .*(pp|tg|verify)"
  done
done 2>&1 | tee "$OUT/bench.log"
for r in 1 2; do
  for v in "${variants[@]}"; do
    echo "== round $r ${v%%:*} depth 0 and 16384, Q8_0 cache"
    # shellcheck disable=SC2086
    ${v#*:} bench -m "$MT" --backend cuda -c 16600 --kv-type q8_0 -p 0 -n 64 -d 0,16384 2>&1 | grep -E "^\| .*tg"
  done
done 2>&1 | tee "$OUT/bench16k.log"
echo "== engine runs (512 tokens; ids, speed)"
for v in "${variants[@]}"; do
  for spec in "ngram" "ngram --no-adapt --draft-max 15" "mtp"; do
    # shellcheck disable=SC2086
    ids=$(${v#*:} run --backend cuda -m "$MT" -c 4096 -s 1 -p "The history of the city" -n 512 --temp 0 --spec $spec \
      2>"$OUT/err.txt" | md5sum | cut -c1-12)
    echo "${v%%:*} $spec: $ids $(grep -E "^generation|^speculative" "$OUT/err.txt" | tr '\n' ' ')"
  done
done 2>&1 | tee "$OUT/engine.log"
for t in test_model test_engine; do
  [ ! -x ".device/bin/$t" ] || HYSPEC_TEST_BACKEND=cuda HYSPEC_FIXTURES=.device/fixtures ".device/bin/$t" --gtest_brief=1 2>&1 |
    grep -E "^\[  (PASSED|FAILED) |tests ran|Failure" | head -20
done
