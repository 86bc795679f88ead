#!/usr/bin/env bash
# A/B of hyspec builds in one device call (carry [".device", ".anchor"]): .device/bin holds each
# variant V as hyspec_V and optionally test_*_V (AB_VARIANTS="V1 V2 ...", the first the baseline),
# e.g. made here with `git stash` / a build-time switch, `strip -o /tmp/var/hyspec_V build-cuda/hyspec`,
# then HYSPEC_DEVICE_BINS=test_backend HYSPEC_DEVICE_FIXTURES=quants scripts/device/pack.sh and the
# variants added to .device/bin.tar.xz (scripts/device/pack_variants.sh NAME=REF does that for git refs). A variant may be a script that runs another with environment
# variables set (HYSPEC_FUSED_OPS=0 exec "$(dirname "$0")/hyspec" "$@"), or a symbolic link.
# There: the anchor makes the 9B GGUFs (no llama-bench) while each variant's CUDA tests (test_backend's
# filtered by AB_TESTS) and the interleaved matvec kernel benches (AB_KERNELS=0: none; AB_KERNEL_TYPES and
# AB_KERNEL_WIDTHS pick types and widths, HYSPEC_BENCH_SHAPES="KxN,..." the shapes) run; then hyspec
# bench on 9B Q4_K_M, variants interleaved, AB_ROUNDS times (verify widths AB_VERIFY); AB_NCU="TYPE:WIDTH:SHAPE
# ..." adds ncu's per-instruction view of the last variant. Every variant's greedy ids on the 9B (F16 and Q8_0
# caches) come first: a change that keeps the bits keeps them. AB_DEPTH="16384" adds tg64 at depth 0 and
# at that depth (capacity AB_CTX, default depth + 216) for each cache type of AB_KV (default "f16 q8_0"), interleaved too (and with
# AB_VERIFY_AT_DEPTH="16" verify-16 steps at both depths);
# AB_MOE=1 the synthetic MoE's ids and steps; AB_LOSSLESS=1 each variant's ngram speculation's ids; AB_MEMCHECK_9B=1 memcheck of the last variant's 9B decode.
set -uo pipefail
cd "$(dirname "$0")/../.."
D=.device
[ -d "$D/bin" ] || tar xJf "$D/bin.tar.xz" -C "$D"
export LD_LIBRARY_PATH="$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OUT=${OUT:-/tmp/hyspec-out}; mkdir -p "$OUT"
export HYSPEC_FIXTURES="${HYSPEC_FIXTURES:-$PWD/$D/fixtures}"
V=${AB_VARIANTS:?variants}
for v in $V; do  # (the packed build is hyspec: a baseline named base needs its own hyspec_base, a build or a link)
  [ -x "$D/bin/hyspec_$v" ] || { echo "ab.sh: no $D/bin/hyspec_$v for variant $v" >&2; exit 2; }
done
# A gtest run's outcome: the PASSED count and how many failed first, then the failed tests' names and the first
# lines of their failure messages (the whole output in $OUT/NAME.log).
summary() {
  local log="$OUT/$1.log" r
  cat > "$log"
  r=$(grep -E "^\[  (PASSED|FAILED)  \]" "$log" | sort -u)
  echo "$r" | grep PASSED; echo "failed: $(echo "$r" | grep -c "FAILED  \] [A-Za-z]")"; echo "$r" | grep "FAILED  \] [A-Za-z]" | head -25
  grep -A3 -E "Failure$|: Failure" "$log" | head -40
}
# AB_SYNTH=1: the 9B from the anchor file's skeleton in the repo, filled with random weights of its
# types (fill on all cores since session 54, ~20 s serial before; no .anchor in the carry), instead of the anchor's converter and llama-quantize.
# AB_SYNTH=27b: that skeleton resized to the anchor's 27B shape (gguf_skeleton resize: llama.cpp's
# Q4_K_M types by layer; 16.5 GB) and filled; the greedy ids then have no reference but each other's.
if [ "${AB_SYNTH:-0}" = 1 ]; then
  M=$(bash bench/synth_gguf.sh 9b "$D/bin/gguf_skeleton") || exit 3
elif [ "${AB_SYNTH:-0}" = 27b ]; then
  M=$(bash bench/synth_gguf.sh 27b "$D/bin/gguf_skeleton") || exit 3
else
  M=/tmp/anchor/9b-q4km.gguf
  ANCHOR_MODELS_ONLY=1 bash bench/compare_llamacpp.sh start 9b
fi
[ "${AB_SYNTH:-0}" = 0 ] || echo "== $(basename "$M") made and filled after ${SECONDS}s"
for v in $V; do  # (a variant may come without test binaries; AB_TESTS filters test_backend's)
  for t in "$D"/bin/test_*_"$v"; do
    [ -x "$t" ] || continue
    filter='*'
    [ "$(basename "$t")" = "test_backend_$v" ] && filter=${AB_TESTS:=Matvec/*:CudaBackendTest.*Norm*:CudaBackendTest.Captured*}
    echo "== $(basename "$t") (cuda): $filter"
    HYSPEC_TEST_BACKEND=cuda timeout 200 "$t" --gtest_brief=1 --gtest_filter="$filter" 2>&1 | summary "$(basename "$t")"
  done
done
# AB_MEMCHECK=1: compute-sanitizer on the last variant's MTP decode and verify steps (the f32 fixture,
# graphs off and on) and on its backend tests AB_SANITIZE_TESTS.
last=${V##* }
if [ "${AB_MEMCHECK:-0}" = 1 ]; then
  for graphs in --no-graphs ""; do
    echo "== memcheck ($last): prefill, MTP decode and verify steps $graphs"
    compute-sanitizer --tool memcheck --error-exitcode 9 "$D/bin/hyspec_$last" run -m "$HYSPEC_FIXTURES/qwen35-tiny/qwen35-tiny-f32.gguf" \
      --backend cuda --spec mtp --tokens 501,500,505,194,87 -n 6 --temp 0 --ids --no-stats --no-adapt $graphs 2>&1 | grep -E "ERROR SUMMARY"
  done
  # AB_SANITIZE_TESTS: the backend tests of the change (default: the fused ops'), under memcheck and racecheck
  for tool in memcheck racecheck; do
    echo "== $tool ($last): ${AB_SANITIZE_TESTS:=CudaBackendTest.QkNorm*}"
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "$D/bin/test_backend_$last" \
      --gtest_filter="$AB_SANITIZE_TESTS" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" | head -4
  done
fi
echo "== matvec kernel benches, variants interleaved (GB/s)"
[ "${AB_KERNELS:-1}" = 0 ] || for type in ${AB_KERNEL_TYPES:-Q4_K Q6_K}; do
  for v in $V; do
    [ -x "$D/bin/test_backend_$v" ] || continue
    echo "-- $v"
    HYSPEC_CUDA_BENCH=1 HYSPEC_BENCH_TYPE=$type HYSPEC_BENCH_WIDTHS=${AB_KERNEL_WIDTHS:-1,2,3,8,16,17,24,32} \
      timeout 120 "$D/bin/test_backend_$v" --gtest_filter='CudaBench.MatmulDecode:CudaBench.MatmulSwiGlu' 2>&1 |
      grep -E "^\| |BENCH swiglu $type"
  done
done | tee "$OUT/kernels_ab.md"
if [ "${AB_SYNTH:-0}" = 0 ]; then
  while [ ! -f /tmp/anchor/anchor.done ] && [ "$SECONDS" -lt 560 ]; do sleep 5; done
  # (a model still being written would fail every bench below)
  [ -f /tmp/anchor/anchor.done ] && [ -f "$M" ] || { echo "no 9B model after ${SECONDS}s: $(tail -3 /tmp/anchor/anchor.err)"; exit 3; }
fi
echo "== greedy ids of each variant (48 tokens; F16 and Q8_0 caches)"
for v in $V; do for kv in f16 q8_0; do
  echo "$v $kv $("$D/bin/hyspec_$v" run -m "$M" --backend cuda --kv-type $kv --tokens 1,2,3,4,5,6,7 -n 48 --temp 0 --ids \
    --no-stats 2>/dev/null | md5sum | cut -c1-12)"
done; done
# AB_LOSSLESS=1: each variant's ngram speculation (15 drafts a round, no adaptation) against plain decoding's ids
# on a repeating prompt (96 tokens, both caches): a lossless build prints plain decoding's md5 (764fcb8da670).
if [ "${AB_LOSSLESS:-0}" = 1 ]; then
  echo "== ngram speculation's ids (96 tokens; F16 and Q8_0 caches)"
  for v in $V; do for kv in f16 q8_0; do
    echo "$v $kv $("$D/bin/hyspec_$v" run -m "$M" --backend cuda --kv-type $kv --tokens 1,2,3,4,5,6,7,1,2,3,4,5,6,7,1,2,3,4,5,6,7 \
      -n 96 --temp 0 --ids --no-stats --spec ngram --draft-max 15 --no-adapt 2>/dev/null | md5sum | cut -c1-12)"
  done; done
fi
echo "== hyspec bench $(basename "$M" .gguf) (tg128, verify-k: t/s, ms/step, x tg step)"
for round in $(seq 1 "${AB_ROUNDS:-2}"); do
  for v in $V; do
    echo "-- round $round: $v"
    "$D/bin/hyspec_$v" bench -m "$M" --backend cuda -p 0 -n 128 --verify "${AB_VERIFY:-1,4,8,16}" -c 4096 --kv-type f16 2>&1 |
      grep -E "tg128|verify|rror" | awk -F'|' '{print (NF > 1 ? $4 " " $5 " " $6 " " $7 : $0)}'
  done
done | tee "$OUT/e2e_ab.md"
if [ -n "${AB_DEPTH:-}" ]; then
  echo "== hyspec bench $(basename "$M" .gguf), tg64 at depth 0 and $AB_DEPTH (ms a step), per cache type"
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for v in $V; do for kv in ${AB_KV:-f16 q8_0}; do
      echo "-- round $round: $v $kv $("$D/bin/hyspec_$v" bench -m "$M" --backend cuda -p 0 -n 64 -d "0,$AB_DEPTH" \
        -c "${AB_CTX:-$((AB_DEPTH + 216))}" --kv-type "$kv" 2>&1 | grep -E "tg64" | awk -F'|' '{printf "%s ", $6}')"
    done; done
  done | tee "$OUT/depth_ab.md"
  # AB_VERIFY_AT_DEPTH="16": verify-k steps at depth 0 and AB_DEPTH too (ms a step), per cache type, interleaved.
  if [ -n "${AB_VERIFY_AT_DEPTH:-}" ]; then
    echo "== hyspec bench $(basename "$M" .gguf), verify-$AB_VERIFY_AT_DEPTH at depth 0 and $AB_DEPTH (ms a step)"
    for round in $(seq 1 "${AB_ROUNDS:-2}"); do
      for v in $V; do for kv in ${AB_KV:-f16 q8_0}; do
        echo "-- round $round: $v $kv $("$D/bin/hyspec_$v" bench -m "$M" --backend cuda -p 0 -n 0 --verify "$AB_VERIFY_AT_DEPTH" \
          -d "0,$AB_DEPTH" -c "${AB_CTX:-$((AB_DEPTH + 216))}" --kv-type "$kv" --verify-at-depth 2>&1 | grep -E "verify" |
          awk -F'|' '{printf "%s ", $6}')"
      done; done
    done | tee "$OUT/verify_depth_ab.md"
  fi
fi
# AB_MOE=1: the synthetic 35B-A3B-shaped 8-layer MoE too: each variant's greedy ids, then tg128 and verify-15.
if [ "${AB_MOE:-0}" = 1 ]; then
  xz -T0 -dc bench/data/35b-a3b-8l-q4km.skeleton.gguf.xz > /tmp/moe.gguf && "$D/bin/gguf_skeleton" fill /tmp/moe.gguf > /dev/null
  echo "== MoE (35B-A3B-shaped, 8 layers): greedy ids, tg128 and verify-15 (t/s, ms/step, x tg step)"
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do for v in $V; do
    [ "$round" = 1 ] && echo "$v ids $("$D/bin/hyspec_$v" run -m /tmp/moe.gguf --backend cuda --tokens 1,2,3,4,5,6,7 -n 48 \
      --temp 0 --ids --no-stats 2>/dev/null | md5sum | cut -c1-12)"
    echo "-- round $round: $v $("$D/bin/hyspec_$v" bench -m /tmp/moe.gguf --backend cuda -p 0 -n 128 --verify 15 -c 4096 2>&1 |
      grep -E "tg128|verify" | awk -F'|' '{printf "%s %s %s;", $4, $5, $6}')"
  done; done | tee "$OUT/moe_ab.md"
fi
# AB_MEMCHECK_9B=1: compute-sanitizer memcheck on the last variant's 9B decode (3-token prompt, 4 tokens; graphs on, off).
if [ "${AB_MEMCHECK_9B:-0}" = 1 ]; then
  for graphs in "" --no-graphs; do
    echo "== memcheck ($last): 9B prefill + decode $graphs"
    timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$D/bin/hyspec_$last" run -m "$M" --backend cuda \
      --tokens 1,2,3 -n 4 --temp 0 --ids --no-stats $graphs 2>&1 | grep -E "ERROR SUMMARY"
  done
fi
for spec in ${AB_NCU:-}; do
  IFS=: read -r ty w sh <<< "$spec"
  echo "== ncu source view ($last) $ty n=$w shape $sh"
  cp "$D/bin/test_backend_$last" "$D/bin/test_backend"
  bash bench/ncu_source.sh "$ty" "$w" "$sh" 2>&1 | tail -3
done
