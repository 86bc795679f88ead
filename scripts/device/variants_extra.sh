# PROBE_EXTRA for scripts/device/probe_kernels.sh (sourced at the end, $M4 the 9B Q4_K_M file): `hyspec
# bench` of the packed build and each variant V in VARIANTS (default: every .device/bin/hyspec_V), two
# interleaved rounds, with VARIANT_BENCH (default: tg64 at depth 0 and 16384 and verify-16 at both, F16
# and Q8_0 caches, capacity 16600).
VARIANTS=${VARIANTS:-$(cd .device/bin && ls hyspec_* 2> /dev/null | sed 's/^hyspec_//' | tr '\n' ' ')}
for round in 1 2; do
  for v in "" $VARIANTS; do
    for kv in f16 q8_0; do
      echo "== hyspec ${v:-(packed build)} $kv, round $round"
      .device/bin/hyspec${v:+_$v} bench --backend cuda -m "$M4" ${VARIANT_BENCH:--p 0 -n 64 -d 0,16384 -c 16600 --verify 16 --verify-at-depth} \
        --kv-type $kv 2>&1 | grep -E "^\| .*(pp|tg|verify)" | sed 's/^| [^|]*| [^|]*| //'
    done
  done
done
