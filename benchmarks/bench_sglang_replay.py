"""sglang-replay across TreeCores: token hit rate, scheduler CPU time per request, toy-state mismatches.

Runs ``python -m mambaradix sglang-replay ... --json`` (SGLang 0.5.23's own scheduler on CPU) for each
workload, state pool and TreeCore, three times each in fresh processes, and prints a Markdown table: the
hit rate (the same in every repeat, or the table says so), the median scheduler time and the mismatches
summed over the repeats.  Every command is printed (stderr) as it runs.

    python3 benchmarks/bench_sglang_replay.py [--sglang-path DIR] [--repeats N] [--only NAME]

SGLang 0.5.23 comes from --sglang-path, else $MAMBARADIX_SGLANG_0523, else <repo>/.sgl0523.
"""

from __future__ import annotations

import argparse
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


def run(argv: list, env: dict) -> dict:
    print("$ " + shlex.join(argv), file=sys.stderr, flush=True)
    r = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"exit {r.returncode}: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sglang-path", default=os.environ.get("MAMBARADIX_SGLANG_0523",
                                                           os.path.join(ROOT, ".sgl0523")))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", choices=[w[0] for w in WORKLOADS])
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
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
