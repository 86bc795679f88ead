#!/usr/bin/env bash
# Here (no GPU), after scripts/device/pack.sh: add builds of other git refs to .device/bin.tar.xz as
# bin/hyspec_NAME and bin/test_backend_NAME, for A/B runs against the packed build in one device call
# (probe_kernels.sh with PROBE_EARLY / PROBE_EXTRA scripts that call them). For each NAME=REF, src/ and
# tests/ are taken from REF, the CUDA build is rebuilt incrementally (minutes when only a kernel file
# differs) and the two binaries are stripped in; src/ and tests/ are back at HEAD afterwards. Needs them
# clean. NAME=OTHER:VAR=VALUE adds no build (each costs ~7 MB of the 64 MiB carry) but two scripts running
# variant OTHER's binaries (OTHER is built first; "." is the packed build) with VAR=VALUE set: a switch
# inside one build.
#   scripts/device/pack_variants.sh pairs=next/verify-attention-pairs gm=pairs:HYSPEC_ATTN_PAIRS=0
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f .device/bin.tar.xz ] || { echo "no .device/bin.tar.xz: run scripts/device/pack.sh first" >&2; exit 1; }
[ -z "$(git status --porcelain -- src tests)" ] || { echo "src/ or tests/ has changes or untracked files; commit or stash them" >&2; exit 1; }
for spec in "$@"; do
  case "$spec" in *=*:*=*) continue ;; *=?*) ;; *) echo "expected NAME=REF or NAME=OTHER:VAR=VALUE, got '$spec'" >&2; exit 1 ;; esac
  git rev-parse --verify -q "${spec#*=}^{commit}" > /dev/null || { echo "unknown ref '${spec#*=}'" >&2; exit 1; }
done
restore() { git checkout -q HEAD -- src tests && git clean -fdq -- src tests; }
trap restore EXIT
rm -rf .device/bin && tar xJf .device/bin.tar.xz -C .device
for spec in "$@"; do
  name=${spec%%=*} ref=${spec#*=}
  case "$ref" in *:*=*) continue ;; esac
  echo "== $name: src/ of $ref ($(git rev-parse --short "$ref"))"
  git checkout -q "$ref" -- src tests
  cmake --build --preset cuda -j "$(nproc)" --target hyspec test_backend > /dev/null
  strip -o ".device/bin/hyspec_$name" build-cuda/hyspec
  strip -o ".device/bin/test_backend_$name" build-cuda/tests/test_backend
  restore
done
for spec in "$@"; do
  name=${spec%%=*} rest=${spec#*=}
  case "$rest" in *:*=*) ;; *) continue ;; esac
  other=${rest%%:*} setting=${rest#*:}
  for b in hyspec test_backend; do
    target=${b}_$other
    [ "$other" = . ] && target=$b  # the packed build
    [ -f ".device/bin/$target" ] || { echo "no $target for $name" >&2; exit 1; }
    printf '#!/bin/sh\nexport %s\nexec "$(dirname "$0")/%s" "$@"\n' "$setting" "$target" > ".device/bin/${b}_$name"
    chmod +x ".device/bin/${b}_$name"
  done
done
# Adjacent in one xz stream: the binaries' identical CUDA kernels are stored once where they fit its window.
(cd .device && tar cf - bin | XZ_OPT="-9 -T2" xz > bin.tar.xz.new && mv bin.tar.xz.new bin.tar.xz && rm -rf bin)
ls -la .device/bin.tar.xz
