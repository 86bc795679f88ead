#!/usr/bin/env bash
# GPU time per kernel of recorded decode steps, measured by ncu (each kernel node of the replayed CUDA
# graphs timed on its own, so launch gaps and PDL overlap are not in it; ncu also locks clocks lower
# than the boost clock). Complements bench/profile_cuda.sh, whose event brackets inflate small ops.
# On the GPU machine, after bench/compare_llamacpp.sh made the files:
#   bench/kernel_times.sh /tmp/anchor/9b-q4km.gguf [ncu --launch-skip] [--launch-count]
# KT_BENCH replaces the bench arguments (default: 16 decode steps), e.g. KT_BENCH="-p 0 -n 0 --verify 16"
# for verify steps; KT_STEPS divides the totals into per-step times; KT_KV (default f16) and KT_CTX
# (default 1024) set the cache type and capacity, e.g. KT_KV=q8_0 KT_CTX=17000 to set a Q8_0 step beside
# an F16 one. KT_BIN runs another build (default .device/bin/hyspec).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d .device/bin ] || tar xJf .device/bin.tar.xz -C .device
export LD_LIBRARY_PATH=".device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
M=${1:?model}; SKIP=${2:-600}; COUNT=${3:-900}
CSV=$(mktemp)
timeout 300 /usr/local/cuda/bin/ncu --graph-profiling node --metrics gpu__time_duration.sum --csv \
  --launch-skip "$SKIP" --launch-count "$COUNT" \
  "${KT_BIN:-.device/bin/hyspec}" bench -m "$M" --backend cuda ${KT_BENCH:--p 0 -n 16} -c "${KT_CTX:-1024}" --kv-type "${KT_KV:-f16}" > "$CSV" 2>/dev/null
python3 - "$CSV" "${KT_STEPS:-1}" <<'PY'
import collections, csv, re, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
ki, vi, ui = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
agg = collections.defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    name = re.sub(r"<.*", "", re.sub(r"\(.*", "", r[ki]))[:60]
    agg[name][0] += 1
    agg[name][1] += float(r[vi].replace(",", "")) * scale.get(r[ui], float("nan"))
total = sum(t for _, t in agg.values())
steps = float(sys.argv[2])
print(f"{len(rows) - 1} kernels, {total:.0f} us, {total / steps:.0f} us per step of {steps:g}")
print("| kernel | calls | us | us/call | us/step | share |\n| --- | ---: | ---: | ---: | ---: | ---: |")
for name, (calls, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:20]:
    print(f"| {name} | {calls} | {t:.0f} | {t / calls:.2f} | {t / steps:.0f} | {100 * t / total:.1f}% |")
PY
rm -f "$CSV"
