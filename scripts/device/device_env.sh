# Sourced by the device probes: the repository root as working directory, the carried build unpacked,
# its libraries on the path, and $OUT (what comes back from the device) made.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[ -d .device/bin ] || tar xJf .device/bin.tar.xz -C .device
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OUT=${OUT:-/tmp/hyspec-out}
mkdir -p "$OUT"
