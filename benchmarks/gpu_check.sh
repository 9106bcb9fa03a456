#!/usr/bin/env bash
# gpu_check.sh - the GPU checks of the state kernels, in one run, from the
# repository root on a CUDA machine:
#
#   bash benchmarks/gpu_check.sh
#
#   1. install the wheels carried in .whl/ (fla-core 0.6.0 and einops for
#      the realism test; pytest and its dependencies, which the GPU
#      machine may lack) into /tmp/site, without a registry.  .whl/ is not
#      tracked: fill it where a registry is reachable, then carry it to the
#      GPU machine with the checkout (the device tool: carry [".whl"]):
#        python3 -m pip download --no-deps -d .whl "fla-core==0.6.0" einops \
#            pytest pluggy iniconfig packaging
#      and run with a command timeout above the budget, e.g. 560 s for the
#      default MR_GPU_BUDGET of 520;
#   2. build the extension in place with CUDA (MAMBARADIX_CUDA=1);
#   3. pytest: tests/tensor/test_kernels_gpu.py tests/tensor/test_dlpack.py, the drop-in
#      batch under torch.cuda's sync debug mode
#      (tests/dropin/test_dropin_no_sync_gpu.py), its kernels on torch's current
#      stream (tests/dropin/test_dropin_streams_gpu.py), and the documentation's GPU
#      code blocks (tests/package/test_docs.py -m cuda);
#   4. the benchmark at full size (Qwen3-Next shapes, 256 slots, ~20 GB);
#   5. pytest tests/tensor/test_fla_realism.py (FLA's chunked gated delta rule);
#   6. compute-sanitizer memcheck, then racecheck, over a short GPU test
#      selection.
#
# Every stage has its own timeout and the whole run a budget
# (MR_GPU_BUDGET seconds, default 520); a failed or cut stage is reported
# and the next one still runs, except that without a usable CUDA device
# (the info stage) the run stops there: every GPU test would only skip.
# A pytest stage's first failure is named in the summary (a kernel fault
# is sticky: the tests after it in the same process fail too).  Logs go to $OUT (or ./gpu_check_logs); a
# summary table is printed last.
set -u

START=$(date +%s)
BUDGET=${MR_GPU_BUDGET:-520}
LOGS=${OUT:-./gpu_check_logs}
mkdir -p "$LOGS"
SUMMARY="$LOGS/summary.txt"
: > "$SUMMARY"
export PYTHONUNBUFFERED=1
export FLA_DISABLE_BACKEND_DISPATCH=1

# stage NAME TIMEOUT CMD... : runs CMD with min(TIMEOUT, budget left - 5)
# seconds, logs to $LOGS/NAME.log, records status and duration.
stage() {
    local name=$1 limit=$2
    shift 2
    [ -n "${NO_GPU:-}" ] && return 0   # the info stage found no usable device
    local now left t0 rc status
    now=$(date +%s)
    left=$((BUDGET - (now - START) - 5))
    if [ "$left" -lt 15 ]; then
        printf '%-12s %-8s %5ss  %s\n' "$name" "SKIPPED" 0 "(budget spent)" >> "$SUMMARY"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name (timeout ${limit}s): $*"
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        124|137) status=TIMEOUT ;;
        5) status=NO-TESTS ;;   # pytest: everything skipped or deselected
        *) status="FAIL($rc)" ;;
    esac
    tail -n 25 "$LOGS/$name.log"
    printf '%-12s %-8s %5ss  %s\n' "$name" "$status" "$(( $(date +%s) - t0 ))" \
        "$(grep -E '[0-9]+ (passed|failed)|ERROR SUMMARY|error' "$LOGS/$name.log" | tail -n 1 | cut -c1-90)" \
        >> "$SUMMARY"
    local first
    first=$(grep -m1 -E '^(FAILED|ERROR) ' "$LOGS/$name.log" | cut -c1-110)
    [ -n "$first" ] && printf '%-12s %-8s %5s   first: %s\n' "" "" "" "$first" >> "$SUMMARY"
    return 0
}

# ---- 1. wheels -----------------------------------------------------------
if ls .whl/*.whl > /dev/null 2>&1; then
    stage wheels 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
    printf '%-12s %-8s %5ss  %s\n' wheels SKIPPED 0 "(no .whl/: the FLA realism test will skip)" >> "$SUMMARY"
fi

# ---- 2. build ------------------------------------------------------------
stage build 180 env MAMBARADIX_CUDA=1 NVCC_THREADS=4 python3 setup.py build_ext --inplace --force
stage info 30 python3 -c "
import mambaradix, torch
print('mambaradix cuda_compiled', mambaradix.cuda_compiled, 'devices', mambaradix.cuda_device_count())
print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda')
import pytest; print('pytest', pytest.__version__)
assert mambaradix.cuda_compiled, 'the extension was built without CUDA'
assert torch.cuda.is_available() and mambaradix.cuda_device_count() > 0, 'no CUDA device visible'
try:
    import fla; print('fla', fla.__version__)
except Exception as e:
    print('fla unavailable:', e)
try:
    import cupy; print('cupy', cupy.__version__)
except Exception as e:
    print('cupy unavailable:', e)
"

if ! grep -qE '^info +ok ' "$SUMMARY"; then
    printf '%-12s %-8s %5ss  %s\n' gpu SKIPPED 0 "(no CUDA build, device or pytest: see $LOGS/info.log)" \
        >> "$SUMMARY"
    NO_GPU=1
fi

# ---- 3. tests ------------------------------------------------------------
stage pytest 150 python3 -m pytest -q -rs -p no:cacheprovider tests/tensor/test_kernels_gpu.py tests/tensor/test_dlpack.py
# the drop-in's per-request path over pools on the GPU: no host-device sync
stage nosync 60 python3 -m pytest -q -rs -p no:cacheprovider tests/dropin/test_dropin_no_sync_gpu.py \
    tests/dropin/test_dropin_streams_gpu.py
# the README's GPU code blocks (```python gpu), through the docs test
stage docs 60 python3 -m pytest -q -rs -p no:cacheprovider tests/package/test_docs.py -m cuda

# ---- 4. benchmark --------------------------------------------------------
stage bench 120 python3 benchmarks/bench_state_copy.py --iters 10 --reps 5 --warmup 2 \
    --json "$LOGS/bench.json"

# ---- 5. FLA realism (Triton compiles and autotunes FLA's kernels first) --
MR_REALISM_OUT="$LOGS/fla_realism.json" stage fla 200 \
    python3 -m pytest -q -rs -s -p no:cacheprovider tests/tensor/test_fla_realism.py

# ---- 6. sanitizers -------------------------------------------------------
SAN_K="allocated_cuda_pool or out_of_range or misaligned or (copy_slots_cuda and spec0) or (clear_slots_cuda and spec1) or (track_decode_cuda and spec2) or (snapshot_ssm_cuda and torch64) or (snapshot_conv_cuda and dtype0) or (write_req_to_token_cuda and tdtype0 and vdtype0)"
if command -v compute-sanitizer > /dev/null 2>&1; then
    SAN=compute-sanitizer
elif [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    SAN=/usr/local/cuda/bin/compute-sanitizer
else
    SAN=""
fi
if [ -n "${NO_GPU:-}" ]; then
    :
elif [ -n "$SAN" ]; then
    # Without torch's caching allocator every tensor is its own cudaMalloc,
    # so memcheck sees an access past any tensor's end.
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 stage memcheck 100 "$SAN" --tool memcheck --error-exitcode 99 --print-limit 20 \
        python3 -m pytest -q -p no:cacheprovider tests/tensor/test_kernels_gpu.py -k "$SAN_K"
    stage racecheck 75 "$SAN" --tool racecheck --error-exitcode 99 --print-limit 20 \
        python3 -m pytest -q -p no:cacheprovider tests/tensor/test_kernels_gpu.py -k "write_req_to_token_cuda or (copy_slots_cuda and spec0)"
else
    printf '%-12s %-8s %5ss  %s\n' sanitizer SKIPPED 0 "(compute-sanitizer not found)" >> "$SUMMARY"
fi

# ---- summary -------------------------------------------------------------
echo
echo "=== benchmark"
if [ -f "$LOGS/bench.log" ]; then
    grep -E '^(#|op|copy|clear|track)' "$LOGS/bench.log" | tail -n 20
fi
echo
echo "=== FLA realism"
if [ -f "$LOGS/fla_realism.json" ]; then
    python3 - "$LOGS/fla_realism.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"h {r['h_dtype']} -> pool {r['pool_dtype']}, T={r['T']} H={r['H']} K={r['K']} V={r['V']}")
for p in r["points"]:
    print(f"pos {p['position']:4d}: snapshot vs exact state rel {p['snapshot_vs_exact_state_rel']:.2e} "
          f"(max {p['snapshot_vs_exact_state_max_abs']:.2e}); resume o rel {p['resume_o_rel']:.2e} "
          f"(max {p['resume_o_max_abs']:.2e}); final state rel {p['resume_final_state_rel']:.2e}; "
          f"exact-state resume o rel {p['exact_resume_o_rel']:.2e}")
EOF
else
    echo "(no results: see $LOGS/fla.log)"
fi
echo
echo "=== summary ($(( $(date +%s) - START ))s total, logs in $LOGS)"
cat "$SUMMARY"
[ -z "${NO_GPU:-}" ]
