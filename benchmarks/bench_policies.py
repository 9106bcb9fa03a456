"""Benchmark: state policies against the state pool size, beside the upper bound.

    python benchmarks/bench_policies.py [--mooncake-limit N] [--points K] [--max-running N]
                                        [--plot benchmarks/policy_sweep.png] [--json FILE]

For each workload (gsp, multiturn, agentic: the CLI's defaults; the first N
requests of the bundled Mooncake trace) it measures the state working set W
(peak state slots in use with an unbounded pool), then replays the workload
with the state pool at W/16, W/8, W/4, W/2 and W slots (never below what
max_running requests need), the KV pool large enough that states are the
bottleneck, under the sglang, consumed, utility, adaptive and belady
policies (utility and belady also with a per-path budget of 2 states), each
with and without end-of-turn states.  Beside them it computes the upper bound
on the token hit rate (mambaradix.sim.upper_bound; with --max-running 8, the
default, the unlimited-pool bound, the same at every pool size; with
--max-running 1 the pool-aware one) and stops with an AssertionError if any
run passes it.  It prints the token hit rate and the prefill FLOPs saved of
every run, checks the goals:

- under pressure (the better SGLang policy below 80% of its own big-pool hit
  rate): our best configuration >= 1.2x its token hit rate, or, where the
  best belady configuration is below 1.2x, at least half of the gap to it
  closed;
- elsewhere: never below 0.97x;

and times the Mooncake replay with utility and adaptive against sglang (goal <= 1.5x,
medians of 3 alternating runs).  "Ours" are the configurations SGLang does not
have (utility, adaptive, a per-path budget, or end-of-turn states); the
SGLang baseline is the better of sglang and consumed without them; "belady"
is the best belady configuration (Belady's rule decides evictions only: no
bound, a configuration can pass it).  CPU figures (2-core VM, noisy), fixed
seeds; the replays are deterministic, only the timings vary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

POLICIES = ("sglang", "consumed", "utility", "adaptive", "belady")
BUDGET = 2
#: every configuration replayed at each point: (label, policy, budget); each
#: also with end-of-turn states ("+eot")
CONFIGS = (("sglang", "sglang", 0), ("consumed", "consumed", 0), ("utility", "utility", 0),
           ("utility+budget", "utility", BUDGET), ("adaptive", "adaptive", 0), ("belady", "belady", 0),
           ("belady+budget", "belady", BUDGET))
FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
MAX_RUNNING = 8


def set_max_running(n: int) -> None:
    global MAX_RUNNING
    MAX_RUNNING = n


#: the generated workloads: generator in mambaradix.sim.workloads, its keywords
GENERATED = {
    "gsp": ("generated_shared_prefix", dict(num_groups=64, prompts_per_group=16, system_prompt_len=2048,
                                            question_len=128, output_len=256, request_rate=float("inf"))),
    "multiturn": ("multi_turn", dict(num_clients=64, num_rounds=8, request_length=512, output_length=64,
                                     request_rate=16.0)),
    "agentic": ("agentic_branching", dict(num_trees=8, depth=4, branching=3, system_prompt_len=2048,
                                          task_len=256, step_len=128, output_len=64,
                                          request_rate=float("inf"))),
}


def workloads(mooncake_limit: int) -> dict:
    from mambaradix.sim import workloads as wl

    out = {name: getattr(wl, gen)(**kw, seed=0) for name, (gen, kw) in GENERATED.items()}
    out["mooncake"] = wl.mooncake_conversation(limit=mooncake_limit)
    return out


def base_config(reqs) -> "object":
    from mambaradix.sim import SimConfig, apply_preset

    kv = sum(len(r.input_ids) + r.output_len + 2 for r in reqs) + (1 << 16)   # never short
    return apply_preset(SimConfig(kv_tokens=kv, state_slots=1 << 16, max_running=MAX_RUNNING,
                                  lru_policy="sglang"), "qwen3-next")


def run_one(reqs, cfg) -> dict:
    from mambaradix.sim import run

    t0 = time.perf_counter()
    m = run(reqs, cfg)
    return {"hit": m.token_hit_rate, "flops": m.prefill_flops_saved, "seconds": time.perf_counter() - t0,
            "never_used": m.states_never_used, "admitted": m.states_admitted, "alpha": m.utility_alpha,
            "state_share": m.state_memory_share}


def pool_points(work: int, fractions) -> list:
    """The state pool sizes for these fractions of the working set ``work``,
    never below what max_running requests need, distinct, ascending."""
    floor = 5 * MAX_RUNNING            # SGLang sizes about 5 slots per running request
    return sorted({max(floor, int(round(work * f))) for f in fractions})


def sweep(name: str, reqs, points: int) -> dict:
    from mambaradix.sim.bound import BoundCache

    base = base_config(reqs)
    bounds = BoundCache(reqs)
    big = run_one(reqs, base)
    from mambaradix.sim import run

    work = run(reqs, base).peak_state_slots
    slots = pool_points(work, FRACTIONS[-points:])
    rows = []
    for s in slots:
        b = bounds(dataclasses.replace(base, state_slots=s))
        row = {"slots": s, "fraction": s / work, "runs": {},
               "bound": {"hit": b.token_hit_rate, "kind": b.kind, "seconds": b.wall_seconds}}
        for label, pol, budget in CONFIGS:
            for eot in (False, True):
                cfg = dataclasses.replace(base, state_slots=s, lru_policy=pol, end_of_turn_states=eot,
                                          max_states_per_path=budget)
                run = row["runs"][f"{label}{'+eot' if eot else ''}"] = run_one(reqs, cfg)
                assert run["hit"] <= b.token_hit_rate + 1e-12, (name, s, label, eot, run["hit"], b)
        rows.append(row)
        print(f"  {name} {s} slots done", file=sys.stderr, flush=True)
    bigpool = {p: run_one(reqs, dataclasses.replace(base, lru_policy=p))["hit"] for p in ("sglang", "consumed")}
    return {"working_set": work, "big_pool": bigpool, "big_pool_sglang_run": big, "rows": rows,
            "max_running": MAX_RUNNING}


OURS = ("utility", "utility+eot", "utility+budget", "utility+budget+eot", "adaptive", "adaptive+eot", "consumed+eot",
        "sglang+eot")
BELADY = ("belady", "belady+eot", "belady+budget", "belady+budget+eot")


def judge(res: dict) -> list:
    """Per row: the SGLang baseline, our best, the best belady configuration,
    the bound and the verdict."""
    out = []
    for row in res["rows"]:
        r = row["runs"]
        sg_name = max(("sglang", "consumed"), key=lambda p: r[p]["hit"])
        sg = r[sg_name]["hit"]
        big = res["big_pool"][sg_name]
        ours_name = max(OURS, key=lambda p: r[p]["hit"])
        ours = r[ours_name]["hit"]
        belady = max(r[c]["hit"] for c in BELADY)
        fixed = r["utility+eot"]["hit"]
        pressure = sg < 0.8 * big
        ratio = ours / sg if sg > 0 else float("inf") if ours > 0 else 1.0
        gap = (ours - sg) / (belady - sg) if belady > sg else 1.0
        if pressure:
            if belady < 1.2 * sg:
                ok = gap >= 0.5
                goal = "half the gap (belady < 1.2x)"
            else:
                ok = ratio >= 1.2
                goal = ">= 1.2x"
        else:
            ok = ratio >= 0.97
            goal = ">= 0.97x"
        fixed_ratio = fixed / sg if sg > 0 else float("inf") if fixed > 0 else 1.0
        out.append(dict(slots=row["slots"], fraction=row["fraction"], sglang_best=sg_name, sglang=sg,
                        ours_best=ours_name, ours=ours, belady=belady, bound=row["bound"]["hit"],
                        bound_kind=row["bound"]["kind"], pressure=pressure, ratio=ratio,
                        gap_closed=gap, goal=goal, ok=ok, fixed=fixed, fixed_ratio=fixed_ratio))
    return out


def time_mooncake(reqs, slots: int, label: str = "utility", overrides=None, more=None) -> dict:
    """Medians of 3 alternating replays of ``reqs`` at ``slots`` state slots:
    policy sglang against the configuration ``overrides`` (SimConfig fields;
    default: lru_policy utility), named ``label``, and any further ``more``
    ({label: overrides}); "ratios" holds each over sglang."""
    base = dataclasses.replace(base_config(reqs), state_slots=slots)
    from mambaradix.sim import run

    configs = {"sglang": base, label: dataclasses.replace(base, **(overrides or {"lru_policy": "utility"}))}
    configs.update({k: dataclasses.replace(base, **o) for k, o in (more or {}).items()})
    run(reqs[:200], base)   # warm-up
    ts: dict = {k: [] for k in configs}
    for _ in range(3):
        for k, cfg in configs.items():
            t0 = time.perf_counter()
            run(reqs, cfg)
            ts[k].append(time.perf_counter() - t0)
    med = {p: statistics.median(v) for p, v in ts.items()}
    return {"slots": slots, "seconds": med, "ratio": med[label] / med["sglang"],
            "ratios": {k: med[k] / med["sglang"] for k in med if k != "sglang"}}


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 4.6), squeeze=False)
    colors = {"sglang": "tab:blue", "consumed": "tab:orange", "utility": "tab:green",
              "utility+budget": "tab:red", "adaptive": "tab:olive", "belady": "tab:purple",
              "belady+budget": "tab:brown"}
    for ax, name in zip(axes[0], names):
        res = results[name]
        xs = [row["fraction"] for row in res["rows"]]
        for label, _, _ in CONFIGS:
            for eot in (False, True):
                key = f"{label}{'+eot' if eot else ''}"
                ys = [100 * row["runs"][key]["hit"] for row in res["rows"]]
                shown = (label.replace("+budget", f" + {BUDGET} states/path")
                         + (" + end-of-turn" if eot else ""))
                ax.plot(xs, ys, marker="o" if not eot else "x", color=colors[label],
                        linestyle="-" if not eot else "--", label=shown, linewidth=1.2, markersize=4)
        if all("bound" in row for row in res["rows"]):
            kind = res["rows"][0]["bound"]["kind"]
            ax.plot(xs, [100 * row["bound"]["hit"] for row in res["rows"]], marker="^", color="black",
                    linestyle=":", linewidth=1.5, markersize=5,
                    label="upper bound" + (" (unlimited pool)" if kind == "unlimited_pool" else ""))
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"state slots / working set ({res['working_set']} slots)")
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("token hit rate (%)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=7, frameon=False)
    fig.suptitle(f"Token hit rate vs state slots (qwen3-next, pp2, chunk 64, track 256, max running "
                 f"{results_max_running(results)}, KV pool unbounded; belady = Belady's rule; upper bound: "
                 f"no policy passes it)", fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)


def results_max_running(results: dict) -> int:
    return next(iter(results.values())).get("max_running", 8)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mooncake-limit", type=int, default=2000, help="first N requests of the trace")
    ap.add_argument("--points", type=int, default=5, choices=range(1, 6), help="pool sizes per workload")
    ap.add_argument("--only", default=None, help="comma list of workloads")
    ap.add_argument("--plot", default=None, help="write the plot here (needs matplotlib)")
    ap.add_argument("--json", default=None, help="write all numbers here")
    ap.add_argument("--no-timing", action="store_true", help="skip the Mooncake cost check")
    ap.add_argument("--replot", default=None, metavar="JSON", help="only redraw --plot from a --json file")
    ap.add_argument("--max-running", type=int, default=MAX_RUNNING,
                    help="requests running at once (1: the pool-aware bound)")
    args = ap.parse_args(argv)
    if args.max_running < 1:
        ap.error(f"--max-running must be >= 1, got {args.max_running}")
    set_max_running(args.max_running)
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f)["results"], args.plot or "policy_sweep.png")
        return 0

    t0 = time.perf_counter()
    wls = workloads(args.mooncake_limit)
    if args.only:
        wls = {k: v for k, v in wls.items() if k in args.only.split(",")}
    results = {name: sweep(name, reqs, args.points) for name, reqs in wls.items()}
    verdicts = {name: judge(res) for name, res in results.items()}

    labels = [c[0] + e for c in CONFIGS for e in ("", "+eot")]
    print("| workload | slots (xW) | " + " | ".join(labels)
          + " | bound | goal | ours / SGLang | gap closed | met |")
    print("|---|---:|" + "---:|" * (len(labels) + 1) + "---|---:|---:|---|")
    for name, res in results.items():
        for row, v in zip(res["rows"], verdicts[name]):
            cells = []
            for key in labels:
                run = row["runs"][key]
                cells.append(f"{100 * run['hit']:.1f}% / {run['flops'] / 1e15:.1f}P")
            print(f"| {name} | {row['slots']} ({row['fraction']:.3g}) | " + " | ".join(cells)
                  + f" | {100 * v['bound']:.1f}% | {v['goal']} | {v['ratio']:.2f}x ({v['ours_best']} vs "
                  f"{v['sglang_best']}) | {100 * v['gap_closed']:.0f}% | {'yes' if v['ok'] else 'NO'} |")
    kinds = {row["bound"]["kind"] for res in results.values() for row in res["rows"]}
    cost = sum(row["bound"]["seconds"] for res in results.values() for row in res["rows"])
    print(f"\nbound: no policy passes it (checked); {' and '.join(sorted(kinds))} "
          f"(max running {MAX_RUNNING}); {cost:.1f} s to compute")
    print()
    for name, res in results.items():
        print(f"{name}: working set {res['working_set']} slots; big-pool hit "
              + ", ".join(f"{p} {100 * h:.1f}%" for p, h in res["big_pool"].items()))
    print()
    print("utility + end-of-turn states as one fixed configuration, vs the better SGLang policy:")
    for name in results:
        print(f"  {name}: " + ", ".join(f"{v['slots']}: {v['fixed_ratio']:.2f}x" for v in verdicts[name]))
    timing = None
    if not args.no_timing and "mooncake" in wls:
        res = results["mooncake"]
        slots = res["rows"][len(res["rows"]) // 2]["slots"]
        timing = time_mooncake(wls["mooncake"], slots, more={"adaptive": {"lru_policy": "adaptive"}})
        print(f"\nMooncake ({len(wls['mooncake'])} requests, {slots} slots) replay: sglang "
              f"{timing['seconds']['sglang']:.2f} s, utility {timing['seconds']['utility']:.2f} s "
              f"(median of 3): {timing['ratio']:.2f}x, adaptive {timing['seconds']['adaptive']:.2f} s: "
              f"{timing['ratios']['adaptive']:.2f}x (goal <= 1.5x)")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if args.plot:
        plot(results, args.plot)
        print(f"plot written to {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "verdicts": verdicts, "timing": timing}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
