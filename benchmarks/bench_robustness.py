"""Benchmark: a candidate state policy against SGLang's better one, on every workload and pool size.

    python benchmarks/bench_robustness.py [--candidate SPEC ...] [--seeds 0,1,2] [--held-out]
                                          [--quick] [--only agent,rag] [--max-running N]
                                          [--no-timing] [--json FILE]

A candidate is a policy name and the simulator's own options for it, e.g.
``--candidate utility``, ``--candidate "utility --end-of-turn-states"`` or
``--candidate "utility --end-of-turn-states --max-states-per-path 2 --utility-order lru"``
(``--candidate`` may be given several times; the default is ``adaptive``).  A
policy name this build does not accept is reported and replaced by
``utility``, with the same options.

Workloads: gsp, multiturn and agentic as benchmarks/bench_policies.py makes
them, the first 2000 requests of the bundled Mooncake trace, and agent, rag,
tenants and longdoc with their generators' defaults (the simulator's command
line defaults).  For each trace it measures the state working set W (peak
state slots in use with an unbounded pool) and replays it with the state pool
at W/16, W/8, W/4, W/2 and W (never below what max_running requests need;
the KV pool never short) under sglang, consumed and each candidate; beside
them the upper bound on the token hit rate (mambaradix.sim.bound: pool-aware
with --max-running 1, else the unlimited-pool bound; no run may pass it,
asserted).  Per point it reports

- ratio: the candidate's token hit rate over the better of sglang and
  consumed at that point ("SGLang");
- gap closed: (candidate - SGLang) / (bound - SGLang) (100% when the bound
  is SGLang's own rate: there is no gap);
- pressure: SGLang below 80% of its own policy's hit rate at W; the goal
  there is ratio >= 1.2x or at least half the gap closed, elsewhere
  ratio >= 0.99x;

then, per candidate, the worst ratio over all points, a pass/fail line per
goal, and one row per workload (its worst ratio, goals met).  ``--seeds`` generates the synthetic workloads once per seed
(Mooncake's structure does not depend on the seed: it runs once).
``--held-out`` adds traces the defaults never produce: each synthetic
workload with seed 1000 + s and other shape parameters (HELD_OUT: other
lengths, counts, branching, popularity, timing), and a Mooncake window past
the default one; their worst ratio and goals are reported separately.
Last, the cost: the Mooncake replay (first 2000 requests, W/4 slots) with
each candidate against sglang, medians of 3 alternating runs (goal <= 1.5x).

``--quick``: the workloads' counts halved (Mooncake: 1000 requests) and
pools at W/16, W/4 and W only.  CPU figures (2-core VM); the replays are
deterministic, only the timings vary.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_policies as bp  # noqa: E402

#: SGLang's own state policies; the baseline at a point is the better of them there
SGLANG_POLICIES = ("sglang", "consumed")
#: a point is under pressure when SGLang is below this share of its rate at W
PRESSURE = 0.8
#: goals: under pressure ratio >= RATIO_GOAL or gap closed >= GAP_GOAL; elsewhere ratio >= KEEP_GOAL
RATIO_GOAL, GAP_GOAL, KEEP_GOAL = 1.2, 0.5, 0.99
COST_GOAL = 1.5
FALLBACK = "utility"
QUICK_SCALE = 0.5
QUICK_FRACTIONS = (1 / 16, 1 / 4, 1.0)
MOONCAKE_LIMIT, QUICK_MOONCAKE_LIMIT = 2000, 1000
MOONCAKE_RECORDS = 12031            # requests in the bundled trace
HELD_OUT_SEED = 1000

# ---------------------------------------------------------------------------
# candidates
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A state policy configuration: policy, end-of-turn states, per-path
    budget (0: none) and, for utility, the initial recency order."""

    policy: str
    eot: bool = False
    budget: int = 0
    order: Optional[str] = None
    fallback_from: Optional[str] = None     # the policy asked for, when this build refused it

    @property
    def label(self) -> str:
        return (self.policy + ("+eot" if self.eot else "") + (f"+budget{self.budget}" if self.budget else "")
                + (f"+{self.order}" if self.order else ""))

    def overrides(self) -> dict:
        """The SimConfig fields this candidate sets."""
        out = {"lru_policy": self.policy, "end_of_turn_states": self.eot, "max_states_per_path": self.budget}
        if self.order:
            out["utility_order"] = self.order
        return out

    @classmethod
    def parse(cls, spec: str) -> "Candidate":
        """``POLICY [--end-of-turn-states] [--max-states-per-path N] [--utility-order mru|lru]``."""
        words = shlex.split(spec)
        if not words or words[0].startswith("-"):
            raise ValueError(f"--candidate must start with a policy name, got {spec!r}")
        ap = argparse.ArgumentParser(prog=f"--candidate {words[0]}", add_help=False, exit_on_error=False)
        ap.add_argument("--end-of-turn-states", action="store_true")
        ap.add_argument("--max-states-per-path", type=int, default=0)
        ap.add_argument("--utility-order", choices=("mru", "lru"), default=None)
        try:
            opts, rest = ap.parse_known_args(words[1:])
        except argparse.ArgumentError as e:
            raise ValueError(f"--candidate {spec!r}: {e}") from None
        if rest:
            raise ValueError(f"--candidate {spec!r}: unknown option(s) {' '.join(rest)} (known: "
                             f"--end-of-turn-states, --max-states-per-path N, --utility-order mru|lru)")
        if opts.max_states_per_path < 0:
            raise ValueError(f"--candidate {spec!r}: --max-states-per-path must be >= 0")
        return cls(words[0], opts.end_of_turn_states, opts.max_states_per_path, opts.utility_order)


def accepted(cand: Candidate) -> Candidate:
    """``cand`` when this build accepts its policy; else the same options with
    FALLBACK as the policy (fallback_from says which was refused), after a
    message on stderr."""
    from mambaradix.sim import SimConfig
    from mambaradix.sim.checks import ConfigError, validate_config

    try:
        validate_config(SimConfig(**cand.overrides()))
        return cand
    except ConfigError as e:
        if cand.policy == FALLBACK:
            raise
        print(f"candidate policy {cand.policy!r} is not accepted by this build ({e}); measuring "
              f"{FALLBACK!r} with the same options in its place", file=sys.stderr, flush=True)
        return dataclasses.replace(cand, policy=FALLBACK, fallback_from=cand.policy)


# ---------------------------------------------------------------------------
# the goals (pure: tested on hand-made tables)
# ---------------------------------------------------------------------------


def ratio_of(x: float, base: float) -> float:
    """x / base; inf when base is 0 and x is not, 1 when both are 0."""
    if base > 0:
        return x / base
    return float("inf") if x > 0 else 1.0


def judge_point(hits: dict, at_w: dict, cand: float, bound: float) -> dict:
    """One point's verdict for a candidate.  hits, at_w: SGLang's policies'
    token hit rates at this point and with the pool at W; cand: the
    candidate's rate here; bound: the upper bound here."""
    best = max(SGLANG_POLICIES, key=lambda p: hits[p])      # a tie goes to sglang
    sg = hits[best]
    pressure = sg < PRESSURE * at_w[best]
    ratio = ratio_of(cand, sg)
    gap = (cand - sg) / (bound - sg) if bound > sg else 1.0
    if pressure:
        ok = ratio >= RATIO_GOAL or gap >= GAP_GOAL
        goal = f">= {RATIO_GOAL}x or >= {GAP_GOAL:.0%} gap"
    else:
        ok = ratio >= KEEP_GOAL
        goal = f">= {KEEP_GOAL}x"
    return dict(sglang_best=best, sglang=sg, candidate=cand, bound=bound, pressure=pressure, ratio=ratio,
                gap_closed=gap, goal=goal, ok=ok)


def summarize(points: list) -> dict:
    """points: (where, verdict) pairs.  The worst ratio and where, and per
    goal how many points met it and which did not."""
    out: dict = {"points": len(points)}
    if points:
        where, v = min(points, key=lambda p: p[1]["ratio"])
        out.update(worst_ratio=v["ratio"], worst_at=where)
    for kind, under in (("pressure", True), ("elsewhere", False)):
        mine = [(w, v) for w, v in points if v["pressure"] == under]
        out[kind] = dict(total=len(mine), met=sum(v["ok"] for _, v in mine),
                         missed=[w for w, v in mine if not v["ok"]])
        out[kind]["passed"] = out[kind]["met"] == out[kind]["total"]
    return out


# ---------------------------------------------------------------------------
# workloads
# ---------------------------------------------------------------------------

#: the session workloads: generator in mambaradix.sim.workloads, its count keywords
#: (scaled by --quick and by HELD_OUT's "counts"); their other arguments are its defaults
SESSION = {
    "agent": ("agent_sessions", {}, ("num_tasks",)),
    "rag": ("rag_queries", {}, ("num_docs", "num_queries")),
    "tenants": ("multi_tenant", {}, ("num_sessions",)),
    "longdoc": ("long_document_qa", {}, ("num_docs",)),
}
#: count keywords of bench_policies.GENERATED's workloads
GENERATED_COUNTS = {"gsp": ("num_groups",), "multiturn": ("num_clients",), "agentic": ("num_trees",)}

#: the held-out shapes: counts times "counts", the other keywords replaced
HELD_OUT = {
    "gsp": dict(counts=0.75, prompts_per_group=24, system_prompt_len=3072, question_len=96, output_len=192,
                range_ratio=0.5),
    "multiturn": dict(counts=1.25, num_rounds=10, request_length=384, output_length=128,
                      system_prompt_len=256, range_ratio=0.5, request_rate=12.0),
    "agentic": dict(counts=1.5, depth=5, branching=2, system_prompt_len=1536, task_len=384, step_len=192,
                    output_len=96, range_ratio=0.5),
    "agent": dict(counts=0.75, active=16, steps=(4, 30), system_prompt_len=2000, task_len=(300, 1500),
                  tool_len=(60, 3200), output_len=(40, 500), backtrack_prob=0.25, max_backtrack=4,
                  step_gap=6.0),
    "rag": dict(counts=0.75, doc_len=(500, 2500), docs_per_query=4, instruction_len=400, zipf_alpha=1.2,
                followup_prob=0.4, query_rate=3.0, think_time=15.0),
    "tenants": dict(counts=0.75, num_tenants=20, system_prompt_len=(800, 6000), turns=(2, 10),
                    message_len=(20, 800), output_len=(40, 500), zipf_alpha=0.8, session_rate=1.5,
                    think_time=45.0),
    "longdoc": dict(counts=1.5, doc_len=(6000, 24000), questions_per_doc=8, followup_prob=0.5,
                    question_rate=0.3, think_time=20.0),
}
WORKLOADS = ("gsp", "multiturn", "agentic", "mooncake", "agent", "rag", "tenants", "longdoc")


def generator_args(name: str, quick: bool, held_out: bool) -> tuple:
    """(generator name, keywords without the seed) of a synthetic workload."""
    if name in SESSION:
        gen, kw, counts = SESSION[name]
    else:
        gen, kw = bp.GENERATED[name]
        counts = GENERATED_COUNTS[name]
    kw = dict(kw)
    scale = QUICK_SCALE if quick else 1.0
    if held_out:
        shape = dict(HELD_OUT[name])
        scale *= shape.pop("counts")
        kw.update(shape)
    if scale != 1.0:
        import inspect

        from mambaradix.sim import workloads as wl

        defaults = inspect.signature(getattr(wl, gen)).parameters
        for c in counts:
            kw[c] = max(2, round(kw.get(c, defaults[c].default) * scale))
    return gen, kw


def mooncake_window(start: int, limit: int) -> list:
    """Records [start, start + limit) of the bundled Mooncake trace, their
    timestamps shifted to begin at 0."""
    from mambaradix.sim import workloads as wl

    if start == 0:
        return wl.mooncake_conversation(limit=limit)
    with gzip.open(wl.bundled_mooncake_path(), "rt") as f:
        lines = [line for line in f if line.strip()]
    if start + limit > len(lines):
        raise ValueError(f"Mooncake window [{start}, {start + limit}) is past the trace's "
                         f"{len(lines)} requests")
    recs = [json.loads(line) for line in lines[start:start + limit]]
    t0 = recs[0]["timestamp"]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as tmp:
        for r in recs:
            tmp.write(json.dumps(dict(r, timestamp=r["timestamp"] - t0)) + "\n")
        tmp.flush()
        return wl.load_mooncake(tmp.name)


def traces(names, seeds, quick: bool, held_out: bool) -> list:
    """(workload, trace, builder) of every trace of the table: each synthetic
    workload once per seed; Mooncake once (defaults: its first requests), or
    once per seed in a window past them (held out)."""
    from mambaradix.sim import workloads as wl

    limit = QUICK_MOONCAKE_LIMIT if quick else MOONCAKE_LIMIT
    out = []
    for name in names:
        if name == "mooncake":
            span = MOONCAKE_RECORDS - 2 * limit + 1       # held out: windows past the first one
            starts = [limit + (s * limit) % span for s in seeds] if held_out else [0]
            for start in dict.fromkeys(starts):
                out.append((name, f"requests {start}-{start + limit - 1}",
                            lambda start=start: mooncake_window(start, limit)))
            continue
        gen, kw = generator_args(name, quick, held_out)
        for s in seeds:
            seed = HELD_OUT_SEED + s if held_out else s
            out.append((name, f"seed {seed}",
                        lambda gen=gen, kw=kw, seed=seed: getattr(wl, gen)(**kw, seed=seed)))
    return out


# ---------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------


def measure(name: str, trace: str, reqs, fractions, cands: list) -> list:
    """The rows of one trace: per pool size the hit rates of SGLang's
    policies and of each candidate, and the bound (asserted)."""
    from mambaradix.sim import run
    from mambaradix.sim.bound import BoundCache

    base = bp.base_config(reqs)
    bounds = BoundCache(reqs)
    work = run(reqs, base).peak_state_slots
    slots = bp.pool_points(work, fractions)
    w_slots = bp.pool_points(work, (1.0,))[0]

    def hits_at(s: int) -> dict:
        cfg = dataclasses.replace(base, state_slots=s)
        h = {p: run(reqs, dataclasses.replace(cfg, lru_policy=p)).token_hit_rate for p in SGLANG_POLICIES}
        for c in cands:
            h[c.label] = run(reqs, dataclasses.replace(cfg, **c.overrides())).token_hit_rate
        return h

    hits = {s: hits_at(s) for s in slots}
    at_w = {p: (hits.get(w_slots) or hits_at(w_slots))[p] for p in SGLANG_POLICIES}
    rows = []
    for s, h in hits.items():
        b = bounds(dataclasses.replace(base, state_slots=s))
        for k, v in h.items():
            assert v <= b.token_hit_rate + 1e-12, (name, trace, s, k, v, b)
        rows.append(dict(workload=name, trace=trace, requests=len(reqs), working_set=work, slots=s,
                         fraction=s / work, hits=h, at_w=at_w, bound=b.token_hit_rate, bound_kind=b.kind,
                         bound_seconds=b.wall_seconds,
                         verdicts={c.label: judge_point(h, at_w, h[c.label], b.token_hit_rate)
                                   for c in cands}))
    print(f"  {name} {trace}: {len(reqs)} requests, W {work}, {len(rows)} points", file=sys.stderr,
          flush=True)
    return rows


def table(rows: list, fractions, cands: list) -> list:
    """Measure every trace of ``rows`` (traces()' output) at these
    fractions of its working set; returns the rows of all."""
    out = []
    for name, trace, build in rows:
        out.extend(measure(name, trace, build(), fractions, cands))
    return out


def fmt_ratio(r: float) -> str:
    return "inf" if r == float("inf") else f"{r:.3f}x"


def print_table(title: str, rows: list, cands: list) -> None:
    """One markdown row per point: SGLang's two policies, the bound, whether
    it is a pressure point, then per candidate its rate, ratio, gap closed
    and whether it met its goal."""
    print(f"\n{title}")
    print("| workload | trace | slots (xW) | sglang | consumed | bound | pressure | "
          + " | ".join(f"{c.label} | ratio | gap closed | met" for c in cands) + " |")
    print("|---|---|---:|---:|---:|---:|---|" + "---:|---:|---:|---|" * len(cands))
    for row in rows:
        cells = []
        for c in cands:
            v = row["verdicts"][c.label]
            cells.append(f"{100 * v['candidate']:.1f}% | {fmt_ratio(v['ratio'])} "
                         f"| {100 * v['gap_closed']:.0f}% | {'yes' if v['ok'] else 'NO'}")
        pressure = next(iter(row["verdicts"].values()))["pressure"]
        print(f"| {row['workload']} | {row['trace']} | {row['slots']} ({row['fraction']:.3g}) "
              f"| {100 * row['hits']['sglang']:.1f}% | {100 * row['hits']['consumed']:.1f}% "
              f"| {100 * row['bound']:.1f}% | {'yes' if pressure else 'no'} | " + " | ".join(cells) + " |")


def where_of(row: dict) -> str:
    return f"{row['workload']} {row['trace']} at {row['slots']} slots ({row['fraction']:.3g} W)"


def summary_lines(title: str, rows: list, label: str) -> tuple:
    """The summary of one candidate over rows, and its printed lines: the
    worst ratio, then per goal PASS / FAIL with the points that missed it,
    counted per workload (every one is in the summary)."""
    s = summarize([(where_of(r), r["verdicts"][label]) for r in rows])
    lines = [f"{title}: worst ratio {fmt_ratio(s['worst_ratio'])} ({s['worst_at']}) over {s['points']} "
             f"points"]
    for kind, under, goal in (("pressure", True, f">= {RATIO_GOAL}x or >= {GAP_GOAL:.0%} of the gap closed"),
                              ("elsewhere", False, f">= {KEEP_GOAL}x")):
        g = s[kind]
        missed: dict = {}
        for r in rows:
            v = r["verdicts"][label]
            if v["pressure"] == under and not v["ok"]:
                missed.setdefault(r["workload"], []).append(v["ratio"])
        text = "; missed: " + ", ".join(f"{w} {len(x)} (worst {fmt_ratio(min(x))})"
                                        for w, x in missed.items())
        count = f"{g['met']}/{g['total']} met" if g["total"] else "none"
        lines.append(f"    {'PASS' if g['passed'] else 'FAIL'} {kind} points ({goal}): {count}"
                     f"{text if missed else ''}")
    return s, lines


def per_workload(tables: dict, label: str) -> dict:
    """summarize() per trace set and workload; prints one markdown row per
    workload: the worst ratio over its seeds and pools and where, and the
    goals met per kind of point, per trace set."""
    out = {where: {} for where in tables}
    for where, rows in tables.items():
        for r in rows:
            out[where].setdefault(r["workload"], []).append(
                (f"{r['trace']}, {r['fraction']:.3g} W", r["verdicts"][label]))
        out[where] = {w: summarize(points) for w, points in out[where].items()}
    sets = list(tables)
    print(f"\n{label} per workload (worst ratio over seeds and pools; goals met / points):")
    print("| workload | " + " | ".join(f"{w.replace('_', '-')}: worst ratio | pressure | elsewhere"
                                     for w in sets) + " |")
    print("|---|" + "---|---:|---:|" * len(sets))
    for name in out[sets[0]]:
        cells = []
        for where in sets:
            g = out[where].get(name)
            cells.append("-|-|-" if g is None else
                         f"{fmt_ratio(g['worst_ratio'])} ({g['worst_at']}) | "
                         + " | ".join(f"{g[k]['met']}/{g[k]['total']}" for k in ("pressure", "elsewhere")))
        print(f"| {name} | " + " | ".join(cells) + " |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidate", action="append", default=None, metavar="SPEC",
                    help='policy and its options, e.g. "utility --end-of-turn-states" (repeatable; '
                         'default: adaptive)')
    ap.add_argument("--seeds", default="0", help="comma list of seeds of the synthetic workloads")
    ap.add_argument("--held-out", action="store_true",
                    help="also the held-out traces (other seeds and shapes)")
    ap.add_argument("--quick", action="store_true", help="counts / 2, Mooncake 1000, pools W/16, W/4, W")
    ap.add_argument("--only", default=None, help="comma list of workloads")
    ap.add_argument("--max-running", type=int, default=bp.MAX_RUNNING,
                    help="requests running at once (1: the pool-aware bound)")
    ap.add_argument("--no-timing", action="store_true", help="skip the Mooncake cost check")
    ap.add_argument("--json", default=None, help="write all numbers here")
    args = ap.parse_args(argv)
    try:
        cands = [Candidate.parse(spec) for spec in (args.candidate or ["adaptive"])]
    except ValueError as e:
        ap.error(str(e))
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        seeds = [-1]
    if any(s < 0 for s in seeds):
        ap.error(f"--seeds: expected a comma list of integers >= 0, got {args.seeds!r}")
    names = WORKLOADS if args.only is None else tuple(args.only.split(","))
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        ap.error(f"--only: unknown workload(s) {', '.join(unknown)} (known: {', '.join(WORKLOADS)})")
    if args.max_running < 1:
        ap.error(f"--max-running must be >= 1, got {args.max_running}")
    bp.set_max_running(args.max_running)
    fractions = QUICK_FRACTIONS if args.quick else bp.FRACTIONS
    cands = [accepted(c) for c in cands]
    labels = [c.label for c in cands]
    if len(set(labels)) != len(labels):
        ap.error(f"--candidate: the same configuration twice ({', '.join(labels)}; a policy this build "
                 f"refuses is measured as {FALLBACK})")

    t0 = time.perf_counter()
    tables = {"defaults": table(traces(names, seeds, args.quick, False), fractions, cands)}
    if args.held_out:
        tables["held_out"] = table(traces(names, seeds, args.quick, True), fractions, cands)
    kinds = sorted({r["bound_kind"] for rows in tables.values() for r in rows})
    summaries: dict = {c.label: {} for c in cands}
    for where, rows in tables.items():
        print_table(where.replace("_", "-") + " traces", rows, cands)
    print(f"\nbound: {' and '.join(kinds)} (max running {bp.MAX_RUNNING}"
          f"{'' if bp.MAX_RUNNING == 1 else '; --max-running 1 for the pool-aware one'}); "
          f"no run passes it (checked); seeds {args.seeds}{' (quick)' if args.quick else ''}")
    for c in cands:
        print(f"\ncandidate {c.label}" + (f" (in place of {c.fallback_from!r}, not accepted by this build)"
                                          if c.fallback_from else ""))
        for where, rows in tables.items():
            summaries[c.label][where], lines = summary_lines(f"  {where.replace('_', '-')}", rows, c.label)
            print("\n".join(lines))
        summaries[c.label]["per_workload"] = per_workload(tables, c.label)
    timing = {}
    if not args.no_timing:
        reqs = mooncake_window(0, MOONCAKE_LIMIT)
        from mambaradix.sim import run

        slots = bp.pool_points(run(reqs, bp.base_config(reqs)).peak_state_slots, (1 / 4,))[0]
        print()
        for c in cands:
            t = timing[c.label] = bp.time_mooncake(reqs, slots, c.label, c.overrides())
            t["passed"] = t["ratio"] <= COST_GOAL
            print(f"{'PASS' if t['passed'] else 'FAIL'} cost: Mooncake ({len(reqs)} requests, {slots} slots) "
                  f"replay: sglang {t['seconds']['sglang']:.2f} s, {c.label} {t['seconds'][c.label]:.2f} s "
                  f"(medians of 3): {t['ratio']:.2f}x (goal <= {COST_GOAL}x)")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv[1:] if argv is None else list(argv), "max_running": bp.MAX_RUNNING,
                       "bound_kinds": kinds, "candidates": [dataclasses.asdict(c) | {"label": c.label}
                                                            for c in cands],
                       "tables": tables, "summaries": summaries, "timing": timing}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
