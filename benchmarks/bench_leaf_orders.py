#!/usr/bin/env python3
"""Benchmark: evicting k leaves from a large tree under SGLang 0.5.23's leaf
orders (--radix-eviction-policy) against LRU, the leaf heap against the scan
it replaced.

    python3 benchmarks/bench_leaf_orders.py [--nodes 10000 100000] [--k 1000]
                                            [--reps 5] [--no-baseline]

A RadixTree (semantics v0.5.23, attention-only) is filled with random
shared-prefix keys until it holds n nodes (fixed seed, random priorities
and matches in between), then k leaves are evicted the way SGLang's
UnifiedRadixCache does it: one evict_full(1) call a leaf (its eviction walk
asks the TreeCore for one node a step).  The figure is the median over
--reps fresh trees of the microseconds per victim; one small untimed run
warms up first.

The baseline ("scan") is the same source built with -DMR_LEAF_SCAN_ONLY=1:
each victim scans the whole full LRU list, as the keyed orders did before
the heap.  The script builds it into a temporary directory (about a minute)
and runs the same measurement there in a subprocess, so both columns come
from one run.  lru (the 'consumed' policy) never used either path: its two
columns show the noise.  CPU figures on a 2-core VM, noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = ("consumed", "lfu", "priority", "tlru", "mru")
OPTIONS = {"tlru": {"threshold": 64, "next_prompt_estimate": 16}}


def build_tree(C, policy, nodes, seed):
    import numpy as np

    t = C.RadixTree(page_size=1, chunk_size=1, lru_policy=policy, policy_options=OPTIONS.get(policy),
                    semantics="v0.5.23", kv_only=True)
    rng = random.Random(seed)
    keys, nxt = [], 0
    while t.node_count() < nodes:
        if keys and rng.random() < 0.85:
            base = rng.choice(keys)
            key = base[:rng.randrange(len(base) + 1)]
        else:
            key = []
        key = key + [rng.randrange(50000) for _ in range(rng.randrange(4, 16))]
        t.insert(np.array(key, np.int32), np.arange(nxt, nxt + len(key), dtype=np.int64), None,
                 priority=rng.randrange(4), inserted_len=0)
        nxt += len(key)
        keys.append(key)
        if rng.random() < 0.3:
            m = rng.choice(keys)
            t.match_prefix(np.array(m[:rng.randrange(1, len(m) + 1)], np.int32), indices=False)
    return t


def measure(nodes_list, k, reps):
    """{(policy, n): median us per victim} for the mambaradix on sys.path."""
    from mambaradix import _C as C

    for policy in POLICIES:   # warm-up
        t = build_tree(C, policy, 500, 1)
        for _ in range(50):
            t.evict_full(1)
    out = {}
    for n in nodes_list:
        for policy in POLICIES:
            per = []
            for rep in range(reps):
                t = build_tree(C, policy, n, 1000 + rep)
                t0 = time.perf_counter()
                for _ in range(k):
                    t.evict_full(1)
                per.append((time.perf_counter() - t0) / k * 1e6)
            out[f"{policy}/{n}"] = statistics.median(per)
    return out


def build_baseline(dest):
    """This source with MR_LEAF_SCAN_ONLY=1, as an importable mambaradix under dest."""
    env = dict(os.environ, MAMBARADIX_CUDA="0", CFLAGS=(os.environ.get("CFLAGS", "") + " -DMR_LEAF_SCAN_ONLY=1"))
    lib, tmp = os.path.join(dest, "lib"), os.path.join(dest, "tmp")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", lib, "--build-temp", tmp],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    pkg = os.path.join(dest, "pkg")
    shutil.copytree(os.path.join(ROOT, "mambaradix"), os.path.join(pkg, "mambaradix"),
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for root, _, files in os.walk(lib):
        for f in files:
            if f.endswith(".so"):
                rel = os.path.relpath(os.path.join(root, f), lib)
                shutil.copy(os.path.join(root, f), os.path.join(pkg, rel))
    return pkg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-baseline", action="store_true", help="only the current build (no scan column)")
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._child:
        import mambaradix

        assert "mr-leafscan-" in mambaradix.__file__, mambaradix.__file__   # the baseline build
        print(json.dumps(measure(a.nodes, a.k, a.reps)))
        return
    sys.path.insert(0, ROOT)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    base = None
    if not a.no_baseline:
        with tempfile.TemporaryDirectory(prefix="mr-leafscan-") as d:
            pkg = build_baseline(d)
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", "--k", str(a.k), "--reps",
                                str(a.reps), "--nodes", *map(str, a.nodes)],
                               env=dict(os.environ, PYTHONPATH=pkg), check=True, capture_output=True, text=True)
            base = json.loads(r.stdout.strip().splitlines()[-1])
    heap = measure(a.nodes, a.k, a.reps)
    print(f"evicting k={a.k} leaves, one evict_full(1) call each (SGLang's walk); "
          f"median us per victim over {a.reps} trees")
    head = f"{'nodes':>8} {'policy':>9} {'scan (before)':>14} {'heap (after)':>13} {'speed-up':>9}"
    print(head)
    print("-" * len(head))
    for n in a.nodes:
        for p in POLICIES:
            h = heap[f"{p}/{n}"]
            if base is None:
                print(f"{n:>8} {p:>9} {'-':>14} {h:>13.2f} {'-':>9}")
            else:
                b = base[f"{p}/{n}"]
                print(f"{n:>8} {p:>9} {b:>14.2f} {h:>13.2f} {b / h:>8.1f}x")


if __name__ == "__main__":
    main()
