#!/usr/bin/env python3
"""Benchmark: evict_full's cost against the number of siblings (issue 29,
item 10).

    python3 benchmarks/bench_siblings.py [--siblings 1000 10000 100000 400000]
                                         [--k 2000] [--reps 5] [--order ascending|shuffled]

The issue's tree: n leaves [1, 2, i + 100, i + 100] under the common prefix
[1, 2] (one node with n children), inserted in token order (--order
shuffled: a fixed-seed shuffle).  Each rep times k evict_full(2) calls in a
row (each evicts the least recently used leaf: the first entry of the
parent's child array when the keys came in token order), and, on the same
tree, k inserts of new siblings and k matches of present ones.  The figures
are the medians over the reps of the microseconds per call, Python call
included.

Removing a child used to shift every entry after it in the parent's sorted
child array, so an eviction cost O(siblings) (the issue measured 312 us a
call at 400,000 siblings, 1.3 us at 1,000).  A removed child now leaves a
hole, squeezed out in bulk (radix.c, "Children"); the C test
unit_many_siblings bounds the entries moved.  This script at --reps 3 --k
500 on the 2-core VM (2026-12-05, load average about 5, noisy), us per call;
"before" is the same script run on a build of 7f9c0b0:

    siblings   evict_full(2) before   after   insert after   match after
        1000                   0.80    0.45           0.63          0.41
       10000                   2.73    0.50           0.62          0.44
      100000                  46.07    0.49           0.65          0.44
      400000                 169.66    0.56           0.64          0.46
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(C, n: int, order: str, seed: int):
    toks = list(range(n))
    if order == "shuffled":
        random.Random(seed).shuffle(toks)
    t = C.RadixTree()
    for i in toks:
        t.insert([1, 2, i + 100, i + 100], [1, 2, 2 * i + 100, 2 * i + 101], i + 2)
    return t, n


def per_call(fn, k: int) -> float:
    t0 = time.perf_counter()
    for i in range(k):
        fn(i)
    return (time.perf_counter() - t0) / k * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--siblings", type=int, nargs="+", default=[1000, 10_000, 100_000, 400_000])
    ap.add_argument("--k", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--order", choices=["ascending", "shuffled"], default="ascending")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    from mambaradix import _C as C

    warm, _ = build(C, 2000, a.order, a.seed)   # one untimed run first
    per_call(lambda i: warm.evict_full(2), 1000)
    print(f"{a.order} siblings under one prefix; median us per call over {a.reps} reps of {a.k} calls")
    head = f"{'siblings':>9} {'evict_full(2)':>14} {'insert':>8} {'match':>8}"
    print(head)
    print("-" * len(head))
    for n in a.siblings:
        t, top = build(C, n + a.reps * a.k, a.order, a.seed)
        ev, ins, mt = [], [], []
        for rep in range(a.reps):
            ev.append(per_call(lambda i: t.evict_full(2), a.k))
            base = top + rep * a.k
            ins.append(per_call(lambda i: t.insert([1, 2, base + i + 100, 7], [1, 2, 3, 4], base + i + 2), a.k))
            live = n // 2 + rep * a.k
            mt.append(per_call(lambda i: t.match_prefix([1, 2, live + i + 100, live + i + 100]), a.k))
        print(f"{n:>9} {statistics.median(ev):>14.2f} {statistics.median(ins):>8.2f} {statistics.median(mt):>8.2f}")


if __name__ == "__main__":
    main()
