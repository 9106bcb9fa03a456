"""The batch API, before and after, in one process (CPU): this tree's C module
against another built checkout's, on bench_lifecycle.py's workloads
(shared-prefix and the Mooncake conversation trace).

Both modules are loaded side by side (each as the ``_C`` of its own package
name), and each round runs ``bench_lifecycle.run_batch`` on fresh pools with
either module, in alternating order: ``prefill_batch``,
``unfinished_batch`` over the requests and their two output tokens,
``decode_batch``, ``finish_batch``, batches of --batch requests, the pools
built before the timer.  A line says so when the two report different hit
tokens (their evictions differ, so the work does too).  The table
gives each side's median us per request and the median of the per-round
ratios (other / this): on a shared machine this reads a change that two
separate runs minutes apart cannot.

With --ops, the per-operation C calls come first: the tree-only
``Lifecycle`` that the drop-in runs over SGLang's own pools, its ``match``
of a miss, ``insert`` and ``match`` of a hit, on bench_dropin.py's
per-operation keys (64 groups x 16 prompts of 2048 shared + 128 own tokens,
``array('q')``, and as many prompts that share nothing), every key and
value built before the timer, so a call reads them cold as a scheduler's
does; medians over the calls of a pass on a fresh lifecycle, the sides
alternating pass by pass.  A last row times the insert over the module's
own pools, its values straight from the KV allocator, as the drop-in over
those pools inserts them in bench_dropin.py's per-operation pass.

With --floor, each round also times bench_dropin.py's memory_floor() (the
least data any implementation of the per-request work moves, bulk numpy
copies; the prefix lengths of an untimed batch run) and the table gives
floor / batch for each side: the share of that bound the batch API reaches
(medians, and from each side's fastest round).

With --steady W, each run first serves W requests untimed on its fresh
pools (the W requests before the timed ones in the workload), then times
--requests more: a lifecycle in steady state, its tree full and evicting,
the pages of its tree and rows mapped and recycled.  Without it, a run
times pools built a moment before, and each page the run writes first
(the tree's nodes, the rows) may take a page fault: how many depends on
what the process allocated and freed before (malloc's mmap and trim
thresholds move with it), from none to about 30 a Mooncake request.

  python3 benchmarks/bench_batch_ab.py OTHER_CHECKOUT [--rounds 9] [--requests 300] [--batch 8] [--ops] [--floor]
                                       [--steady W]

OTHER_CHECKOUT must hold a built module (``python3 setup.py build_ext
--inplace`` there).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import statistics
import sys
import time
import types
from array import array

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_lifecycle import (mooncake_workload, op_prompts, run_batch,  # noqa: E402
                             shared_prefix_workload)

TRACE = os.path.join(ROOT, "..", "shared", "data", "mooncake_conversation_trace.jsonl")


def load_module(tag: str, checkout: str):
    """The checkout's built mambaradix/_C as the module ``tag._C``."""
    found = sorted(glob.glob(os.path.join(checkout, "mambaradix", "_C*.so")))
    if not found:
        raise SystemExit(f"no built mambaradix/_C*.so in {checkout}: run setup.py build_ext --inplace there")
    sys.modules[tag] = types.ModuleType(tag)
    spec = importlib.util.spec_from_file_location(tag + "._C", found[0])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def op_keys(groups: int = 64, per_group: int = 16, shared: int = 2048, own: int = 128):
    """bench_dropin.py's per-operation keys and each prompt's KV indices
    (int64, disjoint)."""
    prompts, misses = op_prompts(groups, per_group, shared, own)
    n = shared + own
    values = [np.arange(1 + i * n, 1 + (i + 1) * n, dtype=np.int64) for i in range(len(prompts))]
    return prompts, misses, values


def ops_pass(C, prompts, misses, values):
    """One pass on a fresh tree-only lifecycle: median us of each call;
    then the insert over the module's own pools (own_insert_pass)."""
    lc = C.Lifecycle(chunk_size=64, extra_buffer=True)
    clock = time.perf_counter_ns
    out = {}
    for op in ("match miss", "insert", "match hit"):
        ts = []
        if op == "insert":
            for i, (k, v) in enumerate(zip(prompts, values)):
                t0 = clock()
                lc.insert(k, v, i + 1, duplicates=False)
                ts.append(clock() - t0)
        else:
            for k in (misses if op == "match miss" else prompts):
                t0 = clock()
                lc.match(k)
                ts.append(clock() - t0)
        out[op] = statistics.median(ts) / 1e3
    out["insert, own pools"] = own_insert_pass(C, prompts)
    return out


def own_insert_pass(C, prompts) -> float:
    """The insert over the module's own pools, as bench_dropin.py's
    per-operation pass of the drop-in over them makes it: each value
    straight from the KV allocator (HELD), each state slot its own, the
    duplicates freed inside one free group.  Median us."""
    n = len(prompts)
    kv = C.SlotAllocator(sum(len(p) for p in prompts) + 64)
    st = C.SlotAllocator(n + 8)
    lc = C.Lifecycle(st, kv, C.ReqPool(8, max(len(p) for p in prompts) + 8, 2), chunk_size=64,
                     extra_buffer=True)
    values = [kv.alloc(len(p)) for p in prompts]
    slots = [int(st.alloc(1)[0]) for _ in prompts]
    clock = time.perf_counter_ns
    ts = []
    kv.free_group_begin()
    for k, v, s in zip(prompts, values, slots):
        t0 = clock()
        lc.insert(k, v, s)
        ts.append(clock() - t0)
    kv.free_group_end()
    return statistics.median(ts) / 1e3


def ops_table(mods, rounds: int) -> None:
    prompts, misses, values = op_keys()
    for side in ("other", "this"):   # warm-up
        ops_pass(mods[side], prompts, misses, values)
    times = {side: {} for side in mods}
    ratios = {}
    for i in range(rounds):
        got = {}
        for side in (("other", "this") if i % 2 == 0 else ("this", "other")):
            got[side] = ops_pass(mods[side], prompts, misses, values)
            for op, us in got[side].items():
                times[side].setdefault(op, []).append(us)
        for op in got["this"]:
            ratios.setdefault(op, []).append(got["other"][op] / got["this"][op])
    print(f"{'C call':18} {'other us':>9} {'this us':>8} {'other / this':>13} {'ratio range':>14}")
    for op, rs in ratios.items():
        print(f"{op:18} {statistics.median(times['other'][op]):9.2f} {statistics.median(times['this'][op]):8.2f} "
              f"{statistics.median(rs):12.2f}x {min(rs):6.2f}-{max(rs):.2f}x")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("other", help="a built checkout to compare against")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ops", action="store_true", help="also the per-operation C calls (first)")
    ap.add_argument("--floor", action="store_true", help="also memory_floor() and floor / batch")
    ap.add_argument("--steady", type=int, default=0, metavar="W",
                    help="serve W requests untimed first, on the same pools (a multiple of --batch)")
    args = ap.parse_args()
    if args.steady % args.batch != 0:
        ap.error("--steady must be a multiple of --batch")
    warm = args.steady
    memory_floor = None
    if args.floor:
        from bench_dropin import memory_floor  # noqa: E402 (torch and SGLang's wheel: only when asked)
    mods = {"other": load_module("mr_other", os.path.abspath(args.other)), "this": load_module("mr_this", ROOT)}
    if args.ops:
        ops_table(mods, args.rounds)
    workloads = [("shared-prefix", shared_prefix_workload(warm + args.requests))]
    if os.path.exists(TRACE):
        workloads.append(("mooncake", mooncake_workload(TRACE, warm + args.requests)))
    print(f"{'workload':14} {'other us/req':>13} {'this us/req':>12} {'other / this':>13} {'ratio range':>14}"
          + (f" {'floor us':>9} {'floor/other':>12} {'floor/this':>11}" if args.floor else ""))
    for name, reqs in workloads:
        reqs = [array("q", r) for r in reqs]
        total = sum(len(r) for r in reqs[warm:])   # the pools of a run of the timed requests alone
        cfg = {"kv": max(400_000, min(total // 4, 4_000_000)), "states": 192, "rows": 64,
               "ctx": max(len(r) for r in reqs) + 8}
        times = {"other": [], "this": [], "floor": []}
        ratios, hits = [], {}
        # memory_floor()'s P: each timed request's prefix_len in an untimed run
        plens = run_batch(reqs, cfg, args.batch, C=mods["this"], warm=warm)["prefix_lens"] if args.floor else None
        for i in range(args.rounds):
            if args.floor:
                times["floor"].append(memory_floor(reqs[warm:], plens, cfg, args.batch, 1))
            got = {}
            for side in (("other", "this") if i % 2 == 0 else ("this", "other")):
                r = run_batch(reqs, cfg, args.batch, C=mods[side], warm=warm)
                got[side], hits[side] = r["seconds"] / r["requests"] * 1e6, r["hits"]
                times[side].append(got[side])
            ratios.append(got["other"] / got["this"])
        med = {side: statistics.median(ts) if ts else 0.0 for side, ts in times.items()}
        print(f"{name:14} {med['other']:13.1f} {med['this']:12.1f} "
              f"{statistics.median(ratios):12.2f}x {min(ratios):6.2f}-{max(ratios):.2f}x"
              + (f" {med['floor']:9.2f} {med['floor'] / med['other']:12.2f} {med['floor'] / med['this']:11.2f}"
                 if args.floor else ""))
        if args.floor:
            # on a loaded machine a round's wall time includes the time the process waited for a core:
            # the fastest round of each is the closer reading of its own cost
            best = {side: min(ts) for side, ts in times.items()}
            print(f"  fastest rounds: other {best['other']:.1f}, this {best['this']:.1f}, floor {best['floor']:.2f} us: "
                  f"floor/other {best['floor'] / best['other']:.2f}, floor/this {best['floor'] / best['this']:.2f}")
        if hits["other"] != hits["this"]:
            print(f"  hit tokens differ: {hits['other']} (other) vs {hits['this']} (this): the two builds evict "
                  "differently, so they do not do the same work")


if __name__ == "__main__":
    main()
