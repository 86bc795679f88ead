#!/usr/bin/env bash
# Here (no GPU), after scripts/device/pack.sh: add builds of other git refs to .device/bin.tar.xz as
# bin/hyspec_NAME and bin/test_backend_NAME, for A/B runs against the packed build in one device call
# (probe_kernels.sh with PROBE_EARLY / PROBE_EXTRA scripts that call them). For each NAME=REF, src/ is
# taken from REF, the CUDA build is rebuilt incrementally (minutes when only a kernel file differs) and
# the two binaries are stripped in; src/ is back at HEAD afterwards. Needs src/ clean.
#   scripts/device/pack_variants.sh gm=next/verify-attention-group-major pairs=next/verify-attention-pairs
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f .device/bin.tar.xz ] || { echo "no .device/bin.tar.xz: run scripts/device/pack.sh first" >&2; exit 1; }
[ -z "$(git status --porcelain -- src)" ] || { echo "src/ has changes or untracked files; commit or stash them" >&2; exit 1; }
for spec in "$@"; do
  case "$spec" in *=?*) ;; *) echo "expected NAME=REF, got '$spec'" >&2; exit 1 ;; esac
  git rev-parse --verify -q "${spec#*=}^{commit}" > /dev/null || { echo "unknown ref '${spec#*=}'" >&2; exit 1; }
done
restore() { git checkout -q HEAD -- src && git clean -fdq -- src; }
trap restore EXIT
rm -rf .device/bin && tar xJf .device/bin.tar.xz -C .device
for spec in "$@"; do
  name=${spec%%=*} ref=${spec#*=}
  echo "== $name: src/ of $ref ($(git rev-parse --short "$ref"))"
  git checkout -q "$ref" -- src
  cmake --build --preset cuda -j "$(nproc)" --target hyspec test_backend > /dev/null
  strip -o ".device/bin/hyspec_$name" build-cuda/hyspec
  strip -o ".device/bin/test_backend_$name" build-cuda/tests/test_backend
  restore
done
# Adjacent in one xz stream: the binaries' identical CUDA kernels are stored once where they fit its window.
(cd .device && tar cf - bin | XZ_OPT="-9 -T2" xz > bin.tar.xz.new && mv bin.tar.xz.new bin.tar.xz && rm -rf bin)
ls -la .device/bin.tar.xz
