"""Benchmark: the offline upper bound on the token hit rate beside the policies.

    python benchmarks/bench_bound.py [--scale F] [--mooncake-limit N] [--fractions 1/16,1/4,1]
                                     [--page-size P] [--mode M] [--only gsp,multiturn]

For each built-in workload (gsp, multiturn, agentic as benchmarks/bench_policies.py
builds them, their client / group / tree counts times --scale; the first N
requests of the bundled Mooncake trace) it measures the state working set W
(peak state slots in use with an unbounded pool), then at state pools of
--fractions of W (at least 3 slots) prints the bound (mambaradix.sim.bound,
docs/bound.md), the unlimited-pool bound and the token hit rate of the
sglang, consumed, utility and belady policies, and asserts that no policy
passes the bound.  Requests are served one at a time (max_running=1), the
configuration the pool-aware bound is proven for; the KV pool is never short.
Last, it times the bound on the first 1500 requests of Mooncake.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

POLICIES = ("sglang", "consumed", "utility", "belady")


def workloads(scale: float, mooncake_limit: int) -> dict:
    """bench_policies.py's workloads with their counts times ``scale``."""
    from mambaradix.sim import workloads as wl

    def n(x: int) -> int:
        return max(2, round(x * scale))

    inf = float("inf")
    return {
        "gsp": wl.generated_shared_prefix(n(64), 16, 2048, 128, 256, request_rate=inf, seed=0),
        "multiturn": wl.multi_turn(n(64), 8, 512, 64, request_rate=16.0, seed=0),
        "agentic": wl.agentic_branching(n(8), 4, 3, 2048, 256, 128, 64, request_rate=inf, seed=0),
        "mooncake": wl.mooncake_conversation(limit=mooncake_limit),
    }


def base_config(reqs, page_size: int, mode: str):
    from mambaradix.sim import SimConfig, apply_preset

    kv = sum(len(r.input_ids) + r.output_len + 2 for r in reqs) + (1 << 16)   # never short
    return apply_preset(SimConfig(kv_tokens=kv, state_slots=1 << 16, max_running=1, page_size=page_size,
                                  mode=mode), "qwen3-next")


def measure(name: str, reqs, fractions: list, page_size: int, mode: str) -> list:
    """Rows (slots, bound, policies' hit rates) for one workload; asserts the bound."""
    from mambaradix.sim import run
    from mambaradix.sim.bound import upper_bound

    base = base_config(reqs, page_size, mode)
    work = run(reqs, base).peak_state_slots
    rows = []
    for s in sorted({max(3, int(work * f)) for f in fractions}):
        cfg = dataclasses.replace(base, state_slots=s)
        b = upper_bound(reqs, cfg)
        hits = {p: run(reqs, dataclasses.replace(cfg, lru_policy=p)).token_hit_rate for p in POLICIES}
        for p, h in hits.items():
            assert h <= b.token_hit_rate, f"{name} at {s} slots: {p} {h:.4f} > bound {b.token_hit_rate:.4f}"
        rows.append(dict(slots=s, fraction=s / work, bound=b, hits=hits))
        print(f"  {name} {s} slots done", file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=0.25, help="client / group / tree counts times F")
    ap.add_argument("--mooncake-limit", type=int, default=300, help="first N requests of the trace")
    ap.add_argument("--fractions", default="1/16,1/4,1", help="state pools, as fractions of W")
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--mode", default="pp2", choices=("pp2", "pp1", "lazy", "no_buffer"))
    ap.add_argument("--only", default=None, help="comma list of workloads")
    ap.add_argument("--no-timing", action="store_true", help="skip timing the bound on Mooncake 1500")
    args = ap.parse_args(argv)
    if not 0 < args.scale <= 1:
        ap.error("--scale must be in (0, 1]")
    fractions = [float(Fraction(f)) for f in args.fractions.split(",")]

    from mambaradix.sim import SimConfig, workloads as wl
    from mambaradix.sim.bound import upper_bound

    t0 = time.perf_counter()
    wls = workloads(args.scale, args.mooncake_limit)
    if args.only:
        wls = {k: v for k, v in wls.items() if k in args.only.split(",")}
    print(f"served one at a time (max_running=1), mode {args.mode}, page {args.page_size}, "
          "KV pool never short; token hit rates")
    print("| workload | requests | slots (xW) | bound | unlimited | " + " | ".join(POLICIES) + " |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(POLICIES))
    for name, reqs in wls.items():
        for row in measure(name, reqs, fractions, args.page_size, args.mode):
            b = row["bound"]
            cells = " | ".join(f"{100 * row['hits'][p]:.1f}%" for p in POLICIES)
            print(f"| {name} | {len(reqs)} | {row['slots']} ({row['fraction']:.3g}) | "
                  f"{100 * b.token_hit_rate:.1f}% | {100 * b.unlimited_token_hit_rate:.1f}% | {cells} |")
    print("no policy passed the bound")
    if not args.no_timing:
        reqs = wl.mooncake_conversation(limit=1500)
        for slots in (64, 256):
            b = upper_bound(reqs, SimConfig(state_slots=slots, max_running=1))
            print(f"bound on Mooncake 1500 at {slots} slots: {100 * b.token_hit_rate:.1f}% "
                  f"(unlimited {100 * b.unlimited_token_hit_rate:.1f}%), {b.candidates} candidate hits, "
                  f"{b.wall_seconds:.2f} s")
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
