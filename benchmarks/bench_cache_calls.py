"""The C lifecycle's per-token calls on their own, through `_C.Lifecycle`
(CPU): no scheduler, no torch, keys and values built before the timer.

  insert/own    Lifecycle.insert over our pools (SlotAllocator, ReqPool):
                64 groups x 16 prompts of 2048 shared + 128 own tokens,
                prev_prefix_len=0 (the first of a group inserts 2176 new
                tokens, the others free 2048 duplicates and store 128)
  insert/tree   the same on a tree-only Lifecycle (SGLang's pools own the
                indices), duplicates=False
  finish/tree   cache_finished of 200 requests of 14,000 tokens
                (array('q') keys) with int32 KV rows, as SGLang's
                req_to_token table holds them

Each cell is the median time of one call over a pass on a fresh
Lifecycle; the table gives the fastest and the median of --rounds passes
(the first pass is a warm-up and not counted).

  python3 benchmarks/bench_cache_calls.py [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from array import array

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mambaradix import _C  # noqa: E402

GROUPS, PER_GROUP, SHARED, OWN = 64, 16, 2048, 128
FIN_REQS, FIN_LEN = 200, 14000


def _prompts(rng):
    out = []
    for _ in range(GROUPS):
        head = rng.integers(1, 50000, size=SHARED).tolist()
        for _ in range(PER_GROUP):
            out.append(array("q", head + rng.integers(1, 50000, size=OWN).tolist()))
    return out


def insert_pass(prompts, own: bool) -> float:
    n = len(prompts)
    if own:
        state, kv = _C.SlotAllocator(n + 8), _C.SlotAllocator(n * (SHARED + OWN) + 64)
        lc = _C.Lifecycle(state, kv, _C.ReqPool(8, SHARED + OWN + 8), chunk_size=64, extra_buffer=True)
        vals = [kv.alloc(len(p)) for p in prompts]
        slots = [int(state.alloc(1)[0]) for _ in prompts]
    else:
        lc = _C.Lifecycle(chunk_size=64, extra_buffer=True)
        vals = [np.arange(i * (SHARED + OWN), (i + 1) * (SHARED + OWN), dtype=np.int64) for i in range(n)]
        slots = list(range(1, n + 1))
    ins, ts = lc.insert, []
    for p, v, s in zip(prompts, vals, slots):
        t0 = time.perf_counter_ns()
        ins(p, v, s, duplicates=False)
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1e3


def finish_pass(keys, rows) -> float:
    lc = _C.Lifecycle(chunk_size=64)
    ts = []
    for k, kv in zip(keys, rows):
        rs = _C.ReqState((5, -1, -1, -1, -1, -1, -1, 0, 1, 0, -1, 0, 0))
        t0 = time.perf_counter_ns()
        lc.cache_finished(rs, k, kv)
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    prompts = _prompts(rng)
    keys = [array("q", rng.integers(1, 50000, size=FIN_LEN).tolist()) for _ in range(FIN_REQS)]
    rows = [np.arange(i * FIN_LEN, (i + 1) * FIN_LEN, dtype=np.int32) for i in range(FIN_REQS)]
    cells = {
        "insert/own": lambda: insert_pass(prompts, True),
        "insert/tree": lambda: insert_pass(prompts, False),
        "finish/tree": lambda: finish_pass(keys, rows),
    }
    print(f"us per call (CPU), fastest / median of {args.rounds} passes after a warm-up")
    print(f"{'call':14}{'fastest':>10}{'median':>10}")
    for name, run in cells.items():
        run()
        got = [run() for _ in range(args.rounds)]
        print(f"{name:14}{min(got):10.2f}{statistics.median(got):10.2f}")


if __name__ == "__main__":
    main()
