"""sglang-replay across TreeCores: token hit rate, scheduler CPU time per request, toy-state mismatches.

Runs ``python -m mambaradix sglang-replay ... --json`` (SGLang 0.5.23's own scheduler on CPU) for each
workload, state pool and TreeCore, three times each in fresh processes, and prints a Markdown table: the
hit rate (the same in every repeat, or the table says so), the median scheduler time and the mismatches
summed over the repeats.  Every command is printed (stderr) as it runs.

    python3 benchmarks/bench_sglang_replay.py [--sglang-path DIR] [--repeats N] [--only NAME]

``--policies`` compares instead the mambaradix TreeCore in the configuration the README recommends
(RECOMMENDED: one for every workload) with SGLang's default (the Rust core, lru), on POLICY_WORKLOADS at
several state pools, the biggest one where states are not the bottleneck: per pool, both hit rates, their
ratio, SGLang's hit rate as a share of its biggest pool's (the pressure), the median scheduler CPU time per
request of each and the mismatches; then the goals (>= 1.2x where SGLang's default is below 80% of its
big-pool hit rate, >= 0.99x everywhere), with each point that misses one named.

    python3 benchmarks/bench_sglang_replay.py --policies [--repeats N] [--only NAME]

SGLang 0.5.23 comes from --sglang-path, else $MAMBARADIX_SGLANG_0523, else <repo>/.sgl0523.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, workload options, state pool under pressure, big state pool); --max-running 8 everywhere
WORKLOADS = [
    ("multiturn", "--workload multiturn --num-clients 16 --num-rounds 4 --request-length 256 --output-length 32",
     40, 512),
    ("gsp", "--workload gsp --gsp-num-groups 8 --gsp-prompts-per-group 8 --gsp-system-prompt-len 1024 "
            "--gsp-question-len 64 --gsp-output-len 32", 32, 512),
    ("mooncake", "--workload mooncake --limit 200", 32, 512),
]
CORES = ("python", "rust", "mambaradix")

#: The mambaradix TreeCore's recommended configuration (sglang-replay options).
RECOMMENDED = "--state-policy adaptive"
# (name, workload options, state pools: the last is the big one); --max-running 8 everywhere
POLICY_WORKLOADS = [
    ("multiturn", "--workload multiturn --num-clients 16 --num-rounds 4 --request-length 256 --output-length 32",
     (24, 40, 64, 512)),
    ("agentic", "--workload agentic --agent-trees 4 --agent-depth 3 --agent-branching 2", (24, 40, 64, 512)),
    ("gsp", "--workload gsp --gsp-num-groups 8 --gsp-prompts-per-group 8 --gsp-system-prompt-len 1024 "
            "--gsp-question-len 64 --gsp-output-len 32", (24, 32, 48, 512)),
    ("mooncake", "--workload mooncake --limit 120", (6, 10, 24, 512)),
]
PRESSURE, GOAL_PRESSED, GOAL_ALL = 0.8, 1.2, 0.99


def run(argv: list, env: dict) -> dict:
    print("$ " + shlex.join(argv), file=sys.stderr, flush=True)
    r = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"exit {r.returncode}: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def _replays_in_process(args, work, options: str, runs: list, slots: int) -> list:
    """Each of ``runs`` ((core, extra sglang-replay options)) replayed ``args.repeats`` times in this process
    through mambaradix.sglang_replay.replay (what the command runs, without a process start per run), the
    runs taking turns (ABBA...) so that each sees the machine's load alike.  Per run: (hit rate, median
    scheduler us / request, median tree-cache us / request, mismatches summed, requests).  The equivalent
    commands are printed."""
    from mambaradix.sglang_replay import cli, replay

    configs = []
    for core, extra in runs:
        argv = ["--sglang-path", args.sglang_path, *options.split(), "--tree-core", core, "--state-slots",
                str(slots), "--max-running", "8", *extra.split()]
        print("$ python -m mambaradix sglang-replay " + shlex.join(argv), file=sys.stderr, flush=True)
        configs.append(cli._config(cli.build_parser().parse_args(argv)))
    results = [[] for _ in runs]
    for rep in range(args.repeats):
        order = range(len(runs)) if rep % 2 == 0 else reversed(range(len(runs)))
        for i in order:
            results[i].append(replay(work, configs[i], sglang_path=args.sglang_path))
            gc.collect()   # a replay's scheduler and pools are cycles: free them before the next is built
    out = []
    for rs in results:
        hits = {round(r.token_hit_rate, 9) for r in rs}
        if len(hits) != 1:
            raise SystemExit(f"the hit rate varied over the repeats: {sorted(hits)}")
        us = statistics.median(r.scheduler_us_per_request for r in rs)
        cache_us = statistics.median(r.tree_cache_us_per_request for r in rs)
        out.append((rs[0].token_hit_rate, us, cache_us, sum(r.toy_state_mismatches for r in rs), len(rs[0].requests)))
    return out


def policies(args) -> None:
    import logging

    from mambaradix.sglang_replay import cli, env as replay_env

    replay_env.load(args.sglang_path)
    logging.disable(logging.WARNING)
    rows, misses = [], []
    sched, cache = [0.0, 0.0], [0.0, 0.0]      # summed over the points: SGLang's default, ours
    for name, options, pools in POLICY_WORKLOADS:
        if args.only and name != args.only:
            continue
        work, _ = cli.build_workload(cli.build_parser().parse_args(options.split()))
        # the baseline and ours take turns, so both see the same load on a shared machine
        res = {s: _replays_in_process(args, work, options, [("rust", ""), ("mambaradix", args.config)], s)
               for s in pools}
        big = res[pools[-1]][0][0]
        for s in pools:
            (h0, us0, c0, bad0, n), (h1, us1, c1, bad1, _) = res[s]
            sched[0] += us0 * n
            sched[1] += us1 * n
            cache[0] += c0 * n
            cache[1] += c1 * n
            ratio = h1 / h0 if h0 else float("inf") if h1 else 1.0
            pressure = h0 / big if big else 1.0
            goal = GOAL_PRESSED if pressure < PRESSURE else GOAL_ALL
            if ratio < goal:
                misses.append(f"{name} at {s} slots: {ratio:.2f}x (goal {goal}x)")
            rows.append(f"| {name} ({n} req) | {s} | {pressure:.0%} | {h0:.4f} | {h1:.4f} | {ratio:.2f}x | "
                        f"{us0:,.0f} | {us1:,.0f} | {c0:,.0f} | {c1:,.0f} | {bad0 + bad1} |")
            print(rows[-1], file=sys.stderr, flush=True)
    print(f"mambaradix TreeCore `{args.config}` vs SGLang's default (Rust core, lru); --max-running 8, "
          f"extra_buffer, overlap scheduler")
    print()
    print("| workload | state slots | SGLang's hit / its big pool's | hit rate SGLang default | hit rate ours | "
          f"ratio | scheduler us/req SGLang (median of {args.repeats}) | scheduler us/req ours | "
          "of which tree cache, SGLang | tree cache, ours | toy-state mismatches |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print()
    print(f"scheduler CPU time summed over the points (requests x median us / request): ours / SGLang's default "
          f"{sched[1] / sched[0]:.3f}x; inside the tree cache {cache[1] / cache[0]:.3f}x "
          f"({cache[0] / 1e6:.2f} s and {cache[1] / 1e6:.2f} s of {sched[0] / 1e6:.1f} s and {sched[1] / 1e6:.1f} s)")
    print(f"goals: >= {GOAL_PRESSED}x where SGLang's default is below {PRESSURE:.0%} of its big-pool hit rate, "
          f">= {GOAL_ALL}x everywhere: " + ("all met" if not misses else "missed at " + "; ".join(misses)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sglang-path", default=os.environ.get("MAMBARADIX_SGLANG_0523",
                                                           os.path.join(ROOT, ".sgl0523")))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--policies", action="store_true",
                   help="the recommended mambaradix configuration vs SGLang's default (see above)")
    p.add_argument("--only", choices=sorted({w[0] for w in WORKLOADS + POLICY_WORKLOADS}))
    p.add_argument("--config", default=RECOMMENDED,
                   help=f"with --policies: the mambaradix TreeCore's sglang-replay options (default: {RECOMMENDED!r})")
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    if args.policies:
        # in this process: the TreeCore's settings come from --config alone
        for k in [k for k in os.environ if k.startswith("MAMBARADIX_") and k != "MAMBARADIX_SGLANG_0523"]:
            del os.environ[k]
        os.environ["OMP_NUM_THREADS"] = "1"
        sys.path.insert(0, ROOT)
        policies(args)
        return
    rows = []
    for name, options, small, big in WORKLOADS:
        if args.only and name != args.only:
            continue
        for slots in (small, big):
            for core in CORES:
                argv = [sys.executable, "-m", "mambaradix", "sglang-replay", "--sglang-path", args.sglang_path,
                        *options.split(), "--tree-core", core, "--state-slots", str(slots), "--max-running", "8",
                        "--json"]
                docs = [run(argv, env) for _ in range(args.repeats)]
                hits = {round(d["metrics"]["token_hit_rate"], 6) for d in docs}
                us = statistics.median(d["metrics"]["scheduler_us_per_request"] for d in docs)
                bad = sum(d["metrics"]["toy_state_mismatches"] for d in docs)
                m = docs[0]["metrics"]
                rows.append(f"| {name} ({m['requests']} req) | {slots} | {core} | "
                            f"{m['token_hit_rate']:.4f}{'' if len(hits) == 1 else ' (varies)'} | "
                            f"{us:,.0f} | {bad} |")
                print(rows[-1], file=sys.stderr, flush=True)
    print("| workload | state slots | tree core | token hit rate | scheduler us / request (median of "
          f"{args.repeats}) | toy-state mismatches |")
    print("|---|---:|---|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
