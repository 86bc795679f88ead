#!/usr/bin/env bash
# On the GPU machine: the demo models (models/) on CUDA — speculative vs plain greedy on held-out
# prompts (scripts/measure_demo.py: acceptance, tokens/s, and a non-zero exit on any divergence),
# the bench table of the demo target, and the verify-vs-decode bit-identity test of the dense
# fixture on CUDA. Needs the bundle of scripts/device/pack.sh (HYSPEC_DEVICE_FIXTURES="qwen35-tiny"
# is enough); run with carry [".device"].
set -uo pipefail
cd "$(dirname "$0")/../.."
D=.device
export LD_LIBRARY_PATH="$D/lib:/usr/local/cuda/lib64:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
export HYSPEC_FIXTURES="${HYSPEC_FIXTURES:-$PWD/$D/fixtures}"
PROMPTS=${PROMPTS:-16}
[ -d "$D/bin" ] || tar xJf "$D/bin.tar.xz" -C "$D"
status=0
echo "== verify rows vs decode steps, CUDA (dense fixture)"
HYSPEC_TEST_BACKEND=cuda "$D/bin/test_model" --gtest_filter='Fixtures/Qwen35Fixture.VerifyRows*/0' 2>&1 | grep -E "differing|OK|FAILED|PASSED" | head -20
echo "== demo models, CUDA: $PROMPTS held-out prompts, fixed then adaptive draft length"
python3 scripts/measure_demo.py --hyspec "$D/bin/hyspec" --backend cuda --prompts "$PROMPTS" || status=1
python3 scripts/measure_demo.py --hyspec "$D/bin/hyspec" --backend cuda --prompts "$PROMPTS" --adapt || status=1
echo "== hyspec bench, demo target, CUDA"
"$D/bin/hyspec" bench -m models/qwen35-demo-q8_0.gguf --backend cuda -p 512 -n 128 --verify 1,2,4,8,16 2>&1
exit $status
