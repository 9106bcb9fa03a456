"""The simulator's SGLang baseline against SGLang 0.5.23's own scheduler: per-request hit tokens.

For each workload, each of SGLang's TreeCores (python, rust) and each running limit (1, and the default
state_slots // 5), replays the same requests through ``python -m mambaradix sim``'s engine
(``mambaradix.sim.engine.replay``, policy ``sglang``, ``--semantics v0.5.23`` and, for contrast, ``v0.5.15``)
and through ``mambaradix.sglang_replay.replay`` (SGLang 0.5.23's Scheduler on CPU, its UnifiedRadixCache over
the chosen TreeCore), and compares every request's usable prefix with SGLang's ``cached_tokens``.  Prints a
Markdown table: the totals, their difference, and how many requests differ.

    python3 benchmarks/bench_fidelity_0523.py [--sglang-path DIR] [--only NAME] [--cores python,rust]
        [--max-running 1,0] [--show-diffs N]

Each case's mode is the simulator's (pp2: extra_buffer with the overlap scheduler, pp1: without it, lazy:
extra_buffer_lazy, no_buffer), run by SGLang with the matching --mamba-radix-cache-strategy.

(``--max-running 0`` stands for the default.)  SGLang 0.5.23 comes from --sglang-path, else
$MAMBARADIX_SGLANG_0523, else <repo>/.sgl0523.  Fixed seeds; the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Callable, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mambaradix.sim import engine, workloads as wl  # noqa: E402
from mambaradix.sim.types import SimConfig, default_max_running  # noqa: E402


@dataclasses.dataclass
class Case:
    """One workload under one pool: what both replays run."""

    name: str
    build: Callable[[], list]
    state_slots: int
    kv_tokens: int = 1 << 20
    track_interval: int = 256
    page_size: int = 1
    mode: str = "pp2"           # the simulator's mode; SGLang's strategy and overlap follow (STRATEGY)


def _multiturn16() -> list:
    return wl.multi_turn(num_clients=16, num_rounds=4, request_length=256, output_length=32)


#: Small workloads (each replay takes seconds), state pools small enough that states are evicted.
CASES = [
    Case("multiturn", lambda: wl.multi_turn(num_clients=6, num_rounds=3, request_length=300, output_length=40,
                                            request_rate=4, seed=1), state_slots=16),
    Case("multiturn-kv", _multiturn16, state_slots=40, kv_tokens=8192, track_interval=64),
    Case("agentic", lambda: wl.agentic_branching(num_trees=2, depth=3, branching=2, system_prompt_len=600,
                                                 task_len=100, step_len=90, output_len=30), state_slots=16),
    Case("gsp", lambda: wl.generated_shared_prefix(num_groups=8, prompts_per_group=8, system_prompt_len=1024,
                                                   question_len=64, output_len=32), state_slots=32),
    Case("mooncake", lambda: wl.mooncake_conversation(limit=40), state_slots=32),
    Case("multiturn16-p16", _multiturn16, state_slots=40, kv_tokens=6000, page_size=16),
    Case("multiturn16-lazy", _multiturn16, state_slots=40, kv_tokens=8192, track_interval=64, mode="lazy"),
    Case("multiturn16-pp1", _multiturn16, state_slots=40, track_interval=64, mode="pp1"),
    Case("multiturn16-nobuf", _multiturn16, state_slots=40, mode="no_buffer"),
]

#: SGLang's --mamba-radix-cache-strategy and overlap scheduler for each simulator mode.
STRATEGY = {"pp2": ("extra_buffer", True), "pp1": ("extra_buffer", False),
            "lazy": ("extra_buffer_lazy", True), "no_buffer": ("no_buffer", False)}


def sim_hits(reqs: list, case: Case, max_running: int, semantics: str) -> dict:
    cfg = SimConfig(state_slots=case.state_slots, kv_tokens=case.kv_tokens, track_interval=case.track_interval,
                    page_size=case.page_size, max_running=max_running, semantics=semantics, mode=case.mode)
    return {rid: int(v) for rid, v in engine.replay(reqs, cfg).prefixes.items()}


def sglang_hits(reqs: list, case: Case, max_running: int, core: str, sglang_path: Optional[str]) -> tuple:
    from mambaradix.sglang_replay import ReplayConfig, replay

    strategy, overlap = STRATEGY[case.mode]
    res = replay(reqs, ReplayConfig(tree_core=core, state_slots=case.state_slots, kv_tokens=case.kv_tokens,
                                    track_interval=case.track_interval, page_size=case.page_size,
                                    max_running=max_running, mamba_strategy=strategy, overlap=overlap),
                 sglang_path=sglang_path)
    return {r["rid"]: int(r["cached_tokens"]) for r in res.requests}, res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sglang-path", default=os.environ.get("MAMBARADIX_SGLANG_0523", os.path.join(ROOT, ".sgl0523")))
    p.add_argument("--only", choices=[c.name for c in CASES], action="append")
    p.add_argument("--cores", default="python,rust")
    p.add_argument("--max-running", default="1,0", help="comma-separated; 0: the default (state slots // 5)")
    p.add_argument("--show-diffs", type=int, default=0, help="print up to N differing requests per row (stderr)")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        reqs = case.build()
        for mr_arg in (int(x) for x in args.max_running.split(",")):
            mr = mr_arg or default_max_running(case.state_slots)
            sim = sim_hits(reqs, case, mr, "v0.5.23")
            old = sum(sim_hits(reqs, case, mr, "v0.5.15").values())
            for core in args.cores.split(","):
                t0 = time.perf_counter()
                got, res = sglang_hits(reqs, case, mr, core, args.sglang_path)
                diffs = [(r.rid, len(r.input_ids), sim.get(r.rid), got.get(r.rid)) for r in reqs
                         if sim.get(r.rid) != got.get(r.rid)]
                s_tot, g_tot = sum(sim.values()), sum(got.values())
                rel = (s_tot - g_tot) / g_tot if g_tot else 0.0
                ran = res.config.get("sglang_max_running_requests", mr)
                rows.append(f"| {case.name} | {case.mode} | {len(reqs)} | {case.state_slots} | {ran} | {core} | "
                            f"{g_tot:,} | "
                            f"{s_tot:,} | {rel:+.2%} | {len(diffs)} | {old:,} |")
                print(rows[-1] + f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
                for d in diffs[:args.show_diffs]:
                    print("   rid %s prompt %d: sim %s, sglang %s" % d, file=sys.stderr)
    print("| workload | mode | requests | state slots | max running | SGLang core | SGLang cached_tokens | "
          "sim v0.5.23 | difference | requests differing | sim v0.5.15 |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
