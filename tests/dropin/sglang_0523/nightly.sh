#!/usr/bin/env bash
# Nightly: the differential test against SGLang 0.5.23's Python TreeCore with
# many more operations and several seeds (CI runs 700 ops per configuration).
#   tests/dropin/sglang_0523/nightly.sh [ops per config, default 20000] [seeds, default 5]
set -euo pipefail
cd "$(dirname "$0")/../../.."
ops=${1:-20000}
seeds=${2:-5}
for seed in $(seq 1 "$seeds"); do
    echo "== seed $seed, $ops ops per configuration"
    MAMBARADIX_SGL0523_RUN=1 MAMBARADIX_DIFF_OPS="$ops" MAMBARADIX_DIFF_SEED="$((seed * 7919))" \
        PYTHONPATH=. OMP_NUM_THREADS=1 python3 -m pytest -q -p no:cacheprovider -W ignore::UserWarning \
        tests/dropin/sglang_0523/test_unified_core.py -k "differential and not ten_thousand"
done
