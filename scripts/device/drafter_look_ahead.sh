#!/usr/bin/env bash
# Adaptive MTP and DFlash sessions on the 9B with random drafters (drafters.sh's models: every draft rejected, so
# the sessions back off into long plain stretches), --look-ahead off and auto interleaved, greedy and sampled under
# temperature alone: the ids' md5 (greedy: plain decoding's), t/s and the per-phase line. carry [".device"], ~3 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
export DRAFTERS_MAIN=0 DRAFTERS_EXTRA='
  for r in 1 2 3; do for la in off auto; do for spec in "none" "mtp" "dflash --draft-model $D9"; do
    for t in "--temp 0" "--temp 1 --top-k 0 --top-p 1 --min-p 0"; do
      ids=$($H run --backend cuda -m $MT -c 4096 -s 1 --tokens 1,2,3,4,5,6,7 -n 512 --ids --spec $spec --look-ahead $la $t \
        2> $OUT/e.log | md5sum | cut -c1-12)
      echo "r$r la=$la [${spec%% *} $t]: ids $ids $(grep -E "^generation" $OUT/e.log | grep -oE "\([0-9.]+ t/s\)")"
      grep -E "^time per phase|^error" $OUT/e.log | sed "s/^/   /"
    done
  done; done; done'
bash scripts/device/drafters.sh
