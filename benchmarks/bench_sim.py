"""Benchmark: replay the whole Mooncake conversation trace state-free.

    python benchmarks/bench_sim.py [--limit N] [--state-slots S] [--kv-tokens K] [--json]
    python benchmarks/bench_sim.py --baseline PATH [--runs 3] [--semantics v0.5.15]

Loads the trace bundled with the package (12,031 requests, ~145M prompt
tokens), replays it through the C cache with ``states="none"`` and prints
where the time went: loading the trace, the Python driver and the C cache
(the engine's ``SimMetrics.wall_seconds``).  The prompts stay hash blocks
until the replay needs them, so "load" is reading the file and "replay"
includes expanding the blocks into tokens.  The target is <= 5 s on one core
for the whole trace; on a busy machine read the CPU time line.

``--baseline PATH`` compares this checkout with another one (built in place,
e.g. ``git worktree add /tmp/base COMMIT`` and ``setup.py build_ext
--inplace`` there): each run is a fresh process importing one checkout's
package, the two alternate, ``--runs`` times each, and the table gives the
medians of the process's wall time, its CPU time (user + system) and its
maximum resident set (``ru_maxrss`` of the finished child, the figure
``/usr/bin/time -f %M`` prints), then the speedups and the memory ratio.
Every count of the two replays' metrics must agree (the script fails
otherwise).  A checkout whose SimConfig has no ``semantics`` knows only the
v0.5.15 rules, which both sides then run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]

TARGET_SECONDS = 5.0
#: what --baseline asks of this checkout against the baseline's
TARGET_SPEEDUP = 1.8
TARGET_MEMORY_RATIO = 0.6


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    ap.add_argument("--state-slots", type=int, default=1024)
    ap.add_argument("--kv-tokens", type=int, default=1 << 21)
    ap.add_argument("--max-running", type=int, default=64)
    ap.add_argument("--policy", default="sglang", choices=("sglang", "consumed"))
    ap.add_argument("--semantics", default=None,
                    help="SGLang release whose cache rules apply (default: the checkout's own)")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    ap.add_argument("--baseline", metavar="PATH", default=None,
                    help="compare with the checkout at PATH (see the module docstring)")
    ap.add_argument("--runs", type=int, default=3, help="with --baseline: runs of each side")
    ap.add_argument("--code", metavar="PATH", default=None, help=argparse.SUPPRESS)
    return ap


def measure(args: argparse.Namespace) -> dict:
    """Load and replay the trace with the package of ``args.code`` (default
    this checkout): timings, workload size and every metric."""
    sys.path.insert(0, str(Path(args.code).resolve()) if args.code else str(ROOT))
    from mambaradix.sim import SimConfig, apply_preset, run, workloads

    c0 = time.process_time()
    t0 = time.perf_counter()
    requests = workloads.mooncake_conversation(limit=args.limit)
    t_load = time.perf_counter() - t0
    c_load = time.process_time() - c0
    stats = workloads.workload_stats(requests)

    fields = {f.name for f in dataclasses.fields(SimConfig)}
    kw = dict(kv_tokens=args.kv_tokens, state_slots=args.state_slots,
              max_running=args.max_running, lru_policy=args.policy, states="none")
    if args.semantics is not None:
        if "semantics" not in fields and args.semantics != "v0.5.15":
            raise SystemExit(f"{args.code or ROOT}: this checkout knows only the v0.5.15 rules")
        if "semantics" in fields:
            kw["semantics"] = args.semantics
    config = apply_preset(SimConfig(**kw), "qwen3-next")
    t1 = time.perf_counter()
    c1 = time.process_time()
    m = run(requests, config)
    t_run = time.perf_counter() - t1
    c_run = time.process_time() - c1

    ws = m.wall_seconds
    cache = float(ws.get("cache", 0.0))
    metrics = dataclasses.asdict(m)
    metrics.pop("wall_seconds", None)
    total = t_load + t_run
    return {
        "code": str(Path(args.code).resolve()) if args.code else str(ROOT),
        "semantics": getattr(config, "semantics", "v0.5.15"),
        "requests": stats["requests"],
        "prompt_tokens": stats["prompt_tokens"],
        "load_seconds": t_load,
        "driver_seconds": float(ws.get("driver", t_run - cache)),
        "cache_seconds": cache,
        "replay_seconds": t_run,
        "total_seconds": total,
        "cpu_seconds": c_load + c_run,
        "load_cpu_seconds": c_load,
        "prompt_tokens_per_second": stats["prompt_tokens"] / total if total else 0.0,
        "token_hit_rate": m.token_hit_rate,
        "kv_hit_rate": m.kv_hit_rate,
        "target_seconds": TARGET_SECONDS,
        "cpus": os.cpu_count(),
        "metrics": metrics,
    }


def print_single(args: argparse.Namespace, r: dict) -> None:
    print(f"Mooncake conversation trace: {r['requests']:,} requests, "
          f"{r['prompt_tokens']:,} prompt tokens (states=none, {args.state_slots} slots, "
          f"{args.kv_tokens:,} KV tokens, policy {args.policy}, rules {r['semantics']})")
    print(f"  load trace      {r['load_seconds']:7.2f} s")
    print(f"  Python driver   {r['driver_seconds']:7.2f} s  (with expanding the prompts)")
    print(f"  C cache         {r['cache_seconds']:7.2f} s")
    print(f"  total           {r['total_seconds']:7.2f} s  ({r['prompt_tokens_per_second'] / 1e6:.1f}M "
          f"prompt tokens/s; target <= {TARGET_SECONDS:.0f} s for the whole trace)")
    print(f"  CPU time        {r['cpu_seconds']:7.2f} s  (wall time above this means the machine "
          f"was busy)")
    print(f"  token hit rate {100 * r['token_hit_rate']:.1f}%, KV hit rate {100 * r['kv_hit_rate']:.1f}%")


def _child(args: argparse.Namespace, code: Path, semantics: str | None) -> dict:
    """One fresh process measuring ``code``: its JSON plus wall time, CPU
    time and maximum resident set of the whole process."""
    cmd = [sys.executable, str(HERE), "--json", "--code", str(code),
           "--state-slots", str(args.state_slots), "--kv-tokens", str(args.kv_tokens),
           "--max-running", str(args.max_running), "--policy", args.policy]
    if args.limit is not None:
        cmd += ["--limit", str(args.limit)]
    if semantics is not None:
        cmd += ["--semantics", semantics]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, cwd=str(code))
    out = proc.stdout.read() if proc.stdout is not None else b""
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{code}: the measuring process failed (exit {proc.returncode})")
    res = json.loads(out)
    res["process_wall_seconds"] = wall
    res["process_cpu_seconds"] = ru.ru_utime + ru.ru_stime
    res["max_rss_bytes"] = ru.ru_maxrss * 1024        # Linux reports KiB
    return res


def compare(args: argparse.Namespace) -> int:
    base = Path(args.baseline).resolve()
    if not (base / "mambaradix").is_dir():
        raise SystemExit(f"--baseline {args.baseline}: no mambaradix package there")
    if args.runs < 1:
        raise SystemExit(f"--runs must be >= 1, got {args.runs}")
    runs: dict = {"baseline": [], "this": []}
    semantics = args.semantics
    for i in range(args.runs):
        b = _child(args, base, semantics)
        semantics = b["semantics"]          # both sides run the rules the baseline ran
        runs["baseline"].append(b)
        runs["this"].append(_child(args, ROOT, semantics))
    mb, mt = runs["baseline"][0]["metrics"], runs["this"][0]["metrics"]
    common = sorted(set(mb) & set(mt))
    differ = [k for k in common if mb[k] != mt[k]]
    for side in runs.values():
        for r in side[1:]:
            differ += [k for k in common if r["metrics"][k] != side[0]["metrics"][k]]

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    rows = [("process wall (s)", "process_wall_seconds", "{:.2f}"),
            ("process CPU (s)", "process_cpu_seconds", "{:.2f}"),
            ("load + replay (s)", "total_seconds", "{:.2f}"),
            ("max RSS (MB)", "max_rss_bytes", "{:.0f}")]
    first = runs["this"][0]
    load = os.getloadavg()
    print(f"Mooncake conversation trace: {first['requests']:,} requests, {first['prompt_tokens']:,} "
          f"prompt tokens (states=none, {args.state_slots} slots, {args.kv_tokens:,} KV tokens, "
          f"policy {args.policy}, rules {semantics}); medians of {args.runs} runs each, "
          f"alternating, each a fresh process; load average now {load[0]:.2f}")
    print(f"  baseline: {base}\n  this:     {ROOT}")
    print(f"| {'':18} | {'baseline':>9} | {'this':>9} | {'this / baseline':>15} |")
    print(f"|{'-' * 20}|{'-' * 11}|{'-' * 11}|{'-' * 17}|")
    ratios = {}
    for label, key, fmt in rows:
        scale = 1e-6 if key == "max_rss_bytes" else 1.0
        b, t = med("baseline", key), med("this", key)
        ratios[key] = t / b if b else float("nan")
        print(f"| {label:18} | {fmt.format(b * scale):>9} | {fmt.format(t * scale):>9} | "
              f"{ratios[key]:>15.3f} |")
    speed = 1.0 / ratios["process_wall_seconds"]
    speed_cpu = 1.0 / ratios["process_cpu_seconds"]
    mem = ratios["max_rss_bytes"]
    print(f"speedup {speed:.2f}x wall, {speed_cpu:.2f}x CPU (goal >= {TARGET_SPEEDUP}x); peak memory "
          f"{100 * mem:.0f}% of the baseline's (goal <= {100 * TARGET_MEMORY_RATIO:.0f}%)")
    print(f"metrics: {len(common) - len(set(differ))} of {len(common)} common fields identical "
          f"(token hit rate {100 * first['token_hit_rate']:.2f}%); only in one side: "
          f"{', '.join(sorted(set(mb) ^ set(mt))) or 'none'}")
    if args.json:
        json.dump({"runs": runs, "speedup_wall": speed, "speedup_cpu": speed_cpu,
                   "memory_ratio": mem, "differ": sorted(set(differ))}, sys.stdout, indent=2)
        print()
    if differ:
        print(f"METRICS DIFFER: {', '.join(sorted(set(differ)))}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.baseline is not None:
        return compare(args)
    result = measure(args)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print_single(args, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
