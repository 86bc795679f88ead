#!/usr/bin/env bash
# One device call checking the backend's own draws and the rounds built on them (carry [".device"] from
# HYSPEC_DEVICE_BINS="test_backend test_engine test_server" HYSPEC_DEVICE_FIXTURES="qwen35-tiny dflash-tiny
# qwen35moe-tiny quants" scripts/device/pack.sh; ~5 min): the draw/argmax/summary tests on CUDA, memcheck and
# racecheck of draw_top_k's test, test_engine and test_server on CUDA, and memcheck of look-ahead sampled runs
# (top-k cuts) and of greedy MTP and DFlash rounds fed with drafts on the device. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/hyspec-out}
mkdir -p "$OUT"
D=.device; [ -d $D/bin ] || tar xJf $D/bin.tar.xz -C $D
export LD_LIBRARY_PATH=$D/lib:/usr/local/cuda/lib64 HYSPEC_FIXTURES=$PWD/$D/fixtures HYSPEC_BIN=$PWD/$D/bin/hyspec
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F=$D/fixtures
HYSPEC_TEST_BACKEND=cuda timeout 120 $D/bin/test_backend --gtest_filter='*Draw*:*Argmax*:*LogitSummary*:*Select*:*FeedToken*:*CopyRow*' > $OUT/tb.log 2>&1; echo "tb: $(tail -1 $OUT/tb.log)"
HYSPEC_TEST_BACKEND=cuda timeout 150 $CS --tool memcheck $D/bin/test_backend --gtest_filter='CudaBackendTest.DrawTopK*' > $OUT/mc_tb.log 2>&1; echo "memcheck draw_top_k: $(grep -E 'ERROR SUMMARY' $OUT/mc_tb.log) $(tail -1 $OUT/mc_tb.log | head -c 100)"
HYSPEC_TEST_BACKEND=cuda timeout 200 $CS --tool racecheck $D/bin/test_backend --gtest_filter='CudaBackendTest.DrawTopK*' > $OUT/rc_tb.log 2>&1; echo "racecheck draw_top_k: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' $OUT/rc_tb.log) rc=$?"
HYSPEC_TEST_BACKEND=cuda timeout 150 $D/bin/test_engine --gtest_brief=1 > $OUT/te.log 2>&1; echo "te: $(tail -1 $OUT/te.log)"
HYSPEC_TEST_BACKEND=cuda timeout 150 $D/bin/test_server --gtest_brief=1 > $OUT/ts.log 2>&1; echo "ts: $(tail -1 $OUT/ts.log)"
M=$F/qwen35-tiny/qwen35-tiny-f32.gguf
for args in "--temp 0.7 --look-ahead on" "--temp 0.9 --top-k 5 --top-p 0.8 --look-ahead on" "--temp 0 --spec mtp" "--temp 0 --spec dflash --draft-model $F/dflash-tiny/dflash-tiny-f32.gguf"; do
  timeout 100 $CS --tool memcheck $D/bin/hyspec run -m $M --backend cuda -c 512 -s 3 -p "hello there" -n 48 $args > $OUT/mc_run.log 2>&1
  echo "memcheck run [$args]: $(grep -E 'ERROR SUMMARY' $OUT/mc_run.log) $(grep -E '^generation' $OUT/mc_run.log | head -c 60)"
done
