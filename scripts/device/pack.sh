#!/usr/bin/env bash
# Here (no GPU): put the CUDA build, the shared libraries the GPU machine lacks and the fixtures the
# device tests read into .device/ (git-ignored), for `run` with carry [".device"] (64 MiB in all).
set -euo pipefail
cd "$(dirname "$0")/../.."
FIX="${HYSPEC_FIXTURES:-$(pwd)/../shared/fixtures}"
rm -rf .device && mkdir -p .device/bin .device/lib .device/fixtures
# (tests on: scripts/test.sh configures the same build dir with HYSPEC_TESTS=OFF)
cmake --preset cuda -DHYSPEC_TESTS=ON > /dev/null
# HYSPEC_DEVICE_BINS picks fewer test binaries (each ~3.5 MB packed): the side-by-side run carries .anchor
# (8.5 MB) too, e.g. HYSPEC_DEVICE_BINS="test_backend test_model test_server" with two fixture sets.
BINS="${HYSPEC_DEVICE_BINS-test_backend test_model test_engine test_util test_server}"
# shellcheck disable=SC2086
cmake --build --preset cuda -j "$(nproc)" --target hyspec gguf_skeleton $BINS
strip -o .device/bin/hyspec build-cuda/hyspec
strip -o .device/bin/gguf_skeleton build-cuda/gguf_skeleton  # probe_kernels.sh's PROBE_SYNTH
for b in $BINS; do strip -o ".device/bin/$b" "build-cuda/tests/$b"; done
# Libraries from Debian packages that an Ubuntu CUDA image does not have.
for lib in libfmt.so.9 libpcre2-8.so.0 libcpp-httplib.so.0.11; do cp -L "/usr/lib/x86_64-linux-gnu/$lib" .device/lib/; done
# The fixtures the model and engine tests read (not the tokenizer or quant ones: text/format tests stay on CI).
# HYSPEC_DEVICE_FIXTURES picks fewer (the tree now holds the 25 MB demo models, and tree + carry must
# stay under 64 MiB: the bench-only bundle takes "qwen35-tiny" or "").
for d in ${HYSPEC_DEVICE_FIXTURES-qwen35-tiny qwen35moe-tiny dflash-tiny quants}; do cp -r "$FIX/$d" .device/fixtures/; done
# Binaries travel compressed (the working tree that travels is capped at 64 MiB); test.sh unpacks them.
# xz -9's 64 MiB window spans the next binaries, so their identical CUDA kernels (the fatbin is ~20 MB of
# each) are stored once: 4 binaries pack to ~13 MB instead of ~47 MB with the default -6.
XZ_OPT="-9 -T2" tar cJf .device/bin.tar.xz -C .device bin && rm -rf .device/bin
du -sh .device
