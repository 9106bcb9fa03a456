#!/usr/bin/env python3
"""Radix tree benchmark: mambaradix.RadixTree against the pure-Python
reference model (tests/core/reference_tree.py), through the Python API.

Median microseconds per call of match_prefix, insert, evict_full and
evict_mamba on
  (a) generated shared-prefix prompts: G groups x P prompts, each a group
      system prompt plus a question;
  (b) the Mooncake conversation trace: every hash id expands into 512
      deterministic pseudo-tokens (the last block cut to input_length);
      each request is matched and then inserted (as a finished request),
      with KV and state capacities that force evictions;
plus the match of a cached 8K-token prefix passed as a numpy int32 array,
and the tree's memory per cached token.  All timings are CPU timings of
this machine, one thread.

    python3 benchmarks/bench_tree.py [--requests N] [--trace PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path[:0] = [os.path.join(ROOT, "tests", d) for d in ("", "core")]

from mambaradix import RadixTree  # noqa: E402
from reference_tree import ReferenceTree  # noqa: E402

class FastReferenceTree(ReferenceTree):
    """The reference model without its argument checks (the inputs here are
    valid lists of ints), so that the baseline times the tree algorithm."""

    check_inputs = False


DEFAULT_TRACE = os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "mooncake_conversation_trace.jsonl"))
BLOCK = 512

now = time.perf_counter_ns


class Timings:
    """Per-call times in ns, by (workload, operation, implementation)."""

    def __init__(self):
        self.t = {}

    def add(self, workload, op, impl, ns):
        self.t.setdefault((workload, op), {}).setdefault(impl, []).append(ns)

    def rows(self):
        for (workload, op), by_impl in self.t.items():
            yield workload, op, by_impl.get("C"), by_impl.get("ref"), by_impl.get("ref-fast")


# --------------------------------------------------------------------------
# Workloads


def shared_prefix_prompts(groups, per_group, system_len, question_len, seed):
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(groups):
        system = rng.integers(0, 150_000, size=system_len, dtype=np.int32)
        for _ in range(per_group):
            q = rng.integers(0, 150_000, size=question_len, dtype=np.int32)
            prompts.append(np.concatenate([system, q]))
    order = np.random.default_rng(seed + 1).permutation(len(prompts))
    return [prompts[i] for i in order]


def _mix64(x):
    """splitmix64 finaliser on a uint64 array."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def block_tokens(hash_id):
    """The 512 pseudo-token ids of one hash id (deterministic, in [0, 2^31))."""
    j = np.arange(BLOCK, dtype=np.uint64)
    x = _mix64((np.uint64(hash_id) << np.uint64(16)) | j)
    return (x & np.uint64(0x7FFFFFFF)).astype(np.int32)


def mooncake_prompts(path, n):
    prompts = []
    cache = {}
    with open(path) as f:
        for line in f:
            if len(prompts) >= n:
                break
            rec = json.loads(line)
            blocks = []
            for h in rec["hash_ids"]:
                if h not in cache:
                    cache[h] = block_tokens(h)
                blocks.append(cache[h])
            toks = np.concatenate(blocks)[: rec["input_length"]] if blocks else np.zeros(0, np.int32)
            prompts.append(toks)
    return prompts


# --------------------------------------------------------------------------
# Runners (the same call sequence on both implementations)


def run_shared_prefix(impl_name, cls, prompts, keys, rounds, tm):
    wl = "shared-prefix"
    for rnd in range(rounds + 1):  # round 0 is the warm-up
        rec = rnd > 0
        t = cls(page_size=1, lru_policy="consumed")
        next_kv = 1
        for i, key in enumerate(keys):
            val = np.arange(next_kv, next_kv + len(key), dtype=np.int64)
            v = val if impl_name == "C" else val.tolist()
            next_kv += len(key)
            t0 = now()
            t.insert(key, v, i + 1)
            dt = now() - t0
            if rec:
                tm.add(wl, "insert", impl_name, dt)
        for key in keys:
            t0 = now()
            m = t.match_prefix(key)
            dt = now() - t0
            if rec:
                tm.add(wl, "match_prefix (hit)", impl_name, dt)
            assert len(m.indices) == len(key)
        if impl_name == "C" and rec:
            for p in prompts:
                lk = p.tolist()
                t0 = now()
                t.match_prefix(lk)
                tm.add(wl, "match_prefix, list key", "C", now() - t0)
        if rnd == rounds:
            mem = (t.memory_bytes(), t.total_size()[0]) if impl_name == "C" else None
        # evictions: states first (internal tombstones / leaves), then KV
        for _ in range(len(keys) // 4):
            t0 = now()
            t.evict_mamba(1)
            dt = now() - t0
            if rec:
                tm.add(wl, "evict_mamba(1)", impl_name, dt)
        while t.total_size()[0] > 0:
            t0 = now()
            t.evict_full(2048)
            dt = now() - t0
            if rec:
                tm.add(wl, "evict_full(2048)", impl_name, dt)
    return mem


def run_mooncake(impl_name, cls, keys, rounds, tm, kv_cap, state_cap):
    wl = "mooncake"
    mem = None
    for rnd in range(rounds + 1):
        rec = rnd > 0
        t = cls(page_size=1, lru_policy="consumed")
        next_kv = 1
        for i, key in enumerate(keys):
            t0 = now()
            m = t.match_prefix(key)
            dt = now() - t0
            if rec:
                tm.add(wl, "match_prefix", impl_name, dt)
            plen = len(m.indices)
            need = len(key) - plen
            total, states = t.total_size()
            if total + need > kv_cap:
                t0 = now()
                t.evict_full(total + need - kv_cap)
                dt = now() - t0
                if rec:
                    tm.add(wl, "evict_full (to capacity)", impl_name, dt)
            if states + 1 > state_cap:
                t0 = now()
                t.evict_mamba(states + 1 - state_cap)
                dt = now() - t0
                if rec:
                    tm.add(wl, "evict_mamba (to capacity)", impl_name, dt)
            val = np.arange(next_kv, next_kv + len(key), dtype=np.int64)
            next_kv += len(key)
            v = val if impl_name == "C" else val.tolist()
            t0 = now()
            t.insert(key, v, i + 1, prev_prefix_len=0)
            dt = now() - t0
            if rec:
                tm.add(wl, "insert", impl_name, dt)
        if rnd == rounds and impl_name == "C":
            mem = (t.memory_bytes(), t.total_size()[0])
    return mem


def bench_8k(rounds, calls):
    """Median us of matching a cached 8192-token prefix (numpy int32 key)."""
    rng = np.random.default_rng(5)
    key = rng.integers(0, 150_000, size=8192, dtype=np.int32)
    t = RadixTree(page_size=1)
    t.insert(key, np.arange(8192, dtype=np.int64), 1)
    # a few other branches, so the root has company
    for i in range(63):
        other = rng.integers(0, 150_000, size=2048, dtype=np.int32)
        t.insert(other, np.arange(10_000 + i * 2048, 10_000 + (i + 1) * 2048, dtype=np.int64), 2 + i)
    out = {}
    for name, k in (("int32 array", key), ("int64 array", key.astype(np.int64)), ("list", key.tolist())):
        samples = []
        for _ in range(calls // 10):  # warm-up
            t.match_prefix(k)
        for _ in range(rounds):
            for _ in range(calls):
                t0 = now()
                t.match_prefix(k)
                samples.append(now() - t0)
        out[name] = statistics.median(samples) / 1000
    ref = FastReferenceTree(page_size=1)
    ref.insert(key.tolist(), list(range(8192)), 1)
    lk = key.tolist()
    samples = []
    for _ in range(max(50, calls // 20)):
        t0 = now()
        ref.match_prefix(lk)
        samples.append(now() - t0)
    out["model-nc (list)"] = statistics.median(samples) / 1000
    ref = ReferenceTree(page_size=1)
    ref.insert(key.tolist(), list(range(8192)), 1)
    samples = []
    for _ in range(max(50, calls // 20)):
        t0 = now()
        ref.match_prefix(lk)
        samples.append(now() - t0)
    out["model (list)"] = statistics.median(samples) / 1000
    return out


# --------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=DEFAULT_TRACE, help="Mooncake trace JSONL (default: %(default)s)")
    ap.add_argument("--requests", type=int, default=400, help="first N trace requests (default %(default)s)")
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--per-group", type=int, default=16)
    ap.add_argument("--system-len", type=int, default=2048)
    ap.add_argument("--question-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    ap.add_argument("--kv-capacity", type=int, default=1_000_000, help="KV tokens the trace replay may cache")
    ap.add_argument("--state-capacity", type=int, default=48, help="states the trace replay may cache")
    ap.add_argument("--calls-8k", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-reference", action="store_true", help="time only the C tree")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.groups, args.per_group, args.requests, args.rounds, args.calls_8k = 8, 4, 40, 1, 2000

    print("mambaradix radix tree benchmark -- CPU timings (%s, Python %s, numpy %s), one thread" % (
        platform.processor() or platform.machine(), platform.python_version(), np.__version__))
    print("median microseconds per call through the Python API; 'speedup' = reference model / C")
    print("C: numpy int32 keys, int64 values; model: tests/core/reference_tree.py with Python lists")
    print()

    tm = Timings()
    impls = [("C", RadixTree)]
    if not args.no_reference:
        impls += [("ref", ReferenceTree), ("ref-fast", FastReferenceTree)]

    prompts = shared_prefix_prompts(args.groups, args.per_group, args.system_len, args.question_len, args.seed)
    mem_a = None
    for name, cls in impls:
        keys = prompts if name == "C" else [p.tolist() for p in prompts]
        m = run_shared_prefix(name, cls, prompts, keys, args.rounds, tm)
        mem_a = m or mem_a
    print("(a) shared prefix: %d groups x %d prompts, system %d + question %d tokens"
          % (args.groups, args.per_group, args.system_len, args.question_len))

    mem_b = None
    have_trace = os.path.exists(args.trace)
    if have_trace:
        mprompts = mooncake_prompts(args.trace, args.requests)
        ntok = sum(len(p) for p in mprompts)
        for name, cls in impls:
            keys = mprompts if name == "C" else [p.tolist() for p in mprompts]
            m = run_mooncake(name, cls, keys, args.rounds, tm, args.kv_capacity, args.state_capacity)
            mem_b = m or mem_b
        print("(b) Mooncake trace: first %d requests (%d prompt tokens), KV capacity %d tokens, %d states"
              % (len(mprompts), ntok, args.kv_capacity, args.state_capacity))
    else:
        print("(b) Mooncake trace not found at %s: skipped" % args.trace)
    print()

    hdr = "%-14s %-26s %6s %9s %11s %9s %11s %9s" % (
        "workload", "operation", "calls", "C us", "model us", "speedup", "model-nc us", "speedup")
    print(hdr)
    print("-" * len(hdr))
    for workload, op, c, r, f in tm.rows():
        cm = statistics.median(c) / 1000 if c else float("nan")
        cols = []
        for x in (r, f):
            xm = statistics.median(x) / 1000 if x else None
            cols += ["%.2f" % xm if xm is not None else "-", "%.1fx" % (xm / cm) if xm is not None else "-"]
        print("%-14s %-26s %6d %9.2f %11s %9s %11s %9s" % (workload, op, len(c or []), cm, *cols))
    print("model: the reference model as the tests use it (argument checks on);")
    print("model-nc: the same without argument checks (inputs are valid lists), i.e. the tree algorithm alone")
    print()

    res8 = bench_8k(args.rounds, args.calls_8k)
    print("cached 8192-token prefix, match_prefix (target <= 5 us with an int32 array):")
    for name, us in res8.items():
        print("  %-26s %9.2f us" % (name, us))
    print()
    for label, mem in (("(a) shared prefix", mem_a), ("(b) Mooncake", mem_b)):
        if mem and mem[1]:
            print("tree memory %s: %d bytes for %d cached tokens = %.2f bytes/token (target <= 16, page_size 1)"
                  % (label, mem[0], mem[1], mem[0] / mem[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
