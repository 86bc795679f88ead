#!/usr/bin/env bash
# Here (no GPU): whether an edit changed a CUDA file's machine code. Compiles src/backend/cuda/FILE.cu as it is
# in the working tree and as it is at REF (default HEAD), each with its own side's headers (so a header edit
# shows in every file that includes it), to sm_90 cubins (the build's flags, no -lineinfo) and
# compares every kernel's .text section byte for byte: prints the kernels whose code differs, and those only
# one side has. PTX is no guide (a blank line renumbers its registers; CUDA_NOTES "Left to do", session 35).
#   scripts/sass_diff.sh matvec_int8 [REF]
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?"usage: scripts/sass_diff.sh FILE (under src/backend/cuda, without .cu) [REF]"}
ref=${2:-HEAD}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/a" "$tmp/b"
git archive "$ref" src | tar -x -C "$tmp/a"
cp -r src "$tmp/b/"
[ -f "$tmp/a/src/backend/cuda/$name.cu" ] || { echo "no src/backend/cuda/$name.cu at $ref" >&2; exit 1; }
pids=()
for v in a b; do
  /usr/local/cuda/bin/nvcc -I"$tmp/$v/src" -O3 -DNDEBUG -arch=sm_90 -cubin --expt-relaxed-constexpr -std=c++17 \
    "$tmp/$v/src/backend/cuda/$name.cu" -o "$tmp/$v.cubin" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done  # (set -e: a failed compile stops here)
python3 - "$tmp/a.cubin" "$tmp/b.cubin" <<'PY'
import re, subprocess, sys

def kernels(path):
    """Kernel name (its anonymous-namespace tag removed) -> the bytes of its .text section."""
    data = open(path, "rb").read()
    out = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\.text\.\S+)\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m:
            name = re.sub(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]{8}", "(anon)::", m.group(1))
            off, size = int(m.group(2), 16), int(m.group(3), 16)
            found[name] = data[off:off + size]
    return found

a, b = kernels(sys.argv[1]), kernels(sys.argv[2])
same = [k for k in a if k in b and a[k] == b[k]]
for k in sorted(k for k in a if k in b and a[k] != b[k]):
    print(f"differs  {len(a[k]):7d} -> {len(b[k]):7d} bytes  {k}")
for k in sorted(set(a) - set(b)):
    print(f"only REF {len(a[k]):7d} bytes  {k}")
for k in sorted(set(b) - set(a)):
    print(f"only now {len(b[k]):7d} bytes  {k}")
print(f"{len(same)} kernels byte-identical, {len(set(a) & set(b)) - len(same)} differ, "
      f"{len(set(a) - set(b))} only at REF, {len(set(b) - set(a))} only now")
PY
