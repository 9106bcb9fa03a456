"""What a replay shows a person: a terminal table, a JSON document, a plot.

* :func:`format_report` -- the table of one run: hit rates (KV-matched vs
  state-usable tokens, requests that reused a state), tokens lost by reason,
  evictions, state bytes copied vs donated, peak pool use, prefill FLOPs
  saved, per-turn hit rates and where the wall time went.
* :func:`format_sweep` -- one line per configuration of a sweep.
* :func:`metrics_to_dict` / :func:`config_to_dict` -- the same for machines.
* :func:`plot_sweep` -- hit rate against a swept parameter (needs matplotlib).

Each takes, where one was computed, the upper bound on the token hit rate
(:func:`mambaradix.sim.upper_bound`): a row of the report, a column of the
sweep, ``upper_bound_*`` keys of the metrics (absent without one), markers on
the plot.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .presets import PRESET_ATTRS, ModelPreset, format_bytes
from .types import SimConfig, SimMetrics

if TYPE_CHECKING:  # pragma: no cover
    from .bound import BoundResult
    from .sweep import SweepPoint

__all__ = [
    "MissingDependency",
    "metrics_to_dict",
    "bound_to_dict",
    "bound_line",
    "config_to_dict",
    "flops_saved",
    "format_report",
    "format_sweep",
    "plot_sweep",
    "format_count",
    "DEFAULT_DEVICE_TFLOPS",
    "prefill_estimates",
    "format_estimates",
    "write_csv",
]

#: Sustained prefill throughput assumed per GPU, in TFLOP/s: about 40% of an
#: H100 / H200's dense bf16 peak (989 TFLOP/s).
DEFAULT_DEVICE_TFLOPS = 400.0


class MissingDependency(RuntimeError):
    """An optional package (matplotlib) is needed and not installed."""


def _rate(num: float, den: float) -> float:
    return num / den if den else 0.0


def _pct(num: float, den: float) -> str:
    return f"{100.0 * _rate(num, den):5.1f}%"


def format_count(n: float) -> str:
    """12345678 -> "12.3M"; small numbers stay exact."""
    n = float(n)
    if abs(n) < 10_000:
        return f"{n:,.0f}"
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"  # pragma: no cover


def _format_flops(f: float) -> str:
    for div, unit in ((1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP")):
        if f >= div:
            return f"{f / div:.2f} {unit}"
    return f"{f:.3g} FLOP"


def config_to_dict(config: SimConfig) -> dict[str, Any]:
    """The config's fields (the decode boundary resolved: the semantics' own
    when left None; max_running as the replay ran it: SGLang 0.5.23 caps it by
    the state pool, and ``max_running_asked`` then gives the value asked),
    plus the model attributes a preset set on it."""
    d = dataclasses.asdict(config)
    if isinstance(config, SimConfig):
        r = config.resolved()
        if d.get("decode_boundary") is None:
            d["decode_boundary"] = r.decode_boundary
        if config.max_running is not None and r.max_running != config.max_running:
            d["max_running"], d["max_running_asked"] = r.max_running, config.max_running
    for k in PRESET_ATTRS:
        d.setdefault(k, getattr(config, k, None))
    return d


def flops_saved(metrics: SimMetrics, preset: Optional[ModelPreset]) -> float:
    """Prefill FLOPs the cache saved: the engine's figure when it computed one,
    else the preset's position-independent cost times the reused tokens."""
    if metrics.prefill_flops_saved:
        return float(metrics.prefill_flops_saved)
    if preset is not None:
        return preset.flops_per_token * metrics.state_usable_tokens
    return 0.0


def bound_to_dict(bound: "BoundResult") -> dict[str, Any]:
    """The upper bound's keys of a replay's metrics: ``upper_bound_token_hit_rate``
    (no state policy reaches more), ``upper_bound_kind`` ("pool_aware":
    served one at a time, the state pool counted; "unlimited_pool": several
    running, the pool not counted), ``upper_bound_hit_tokens``,
    ``upper_bound_exact`` and ``upper_bound_seconds`` (what computing it took)."""
    return {"upper_bound_token_hit_rate": bound.token_hit_rate,
            "upper_bound_kind": bound.kind,
            "upper_bound_hit_tokens": int(bound.hit_tokens),
            "upper_bound_exact": bool(bound.exact),
            "upper_bound_seconds": float(bound.wall_seconds)}


def bound_line(bound: "BoundResult") -> str:
    """What the upper bound is, in words: which bound, and its cost."""
    if bound.pool_aware:
        what = f"pool-aware: one request at a time, <= {bound.capacity:,} states at an admission"
    else:
        what = "unlimited pool: max running > 1"
    return f"no state policy reuses more ({what}; computed in {bound.wall_seconds:.2f} s)"


def metrics_to_dict(metrics: SimMetrics, preset: Optional[ModelPreset] = None,
                    bound: Optional["BoundResult"] = None) -> dict[str, Any]:
    """All SimMetrics fields plus the derived rates, JSON-ready; with bound,
    its keys too (:func:`bound_to_dict`)."""
    d = dataclasses.asdict(metrics)
    d["per_turn_hit_rate"] = {str(k): float(v) for k, v in sorted(metrics.per_turn_hit_rate.items(),
                                                                     key=lambda kv: int(kv[0]))}
    d["wall_seconds"] = {str(k): float(v) for k, v in metrics.wall_seconds.items()}
    d["token_hit_rate"] = metrics.token_hit_rate
    d["kv_hit_rate"] = metrics.kv_hit_rate
    d["state_hit_rate"] = metrics.state_hit_rate
    d["prefill_flops_saved"] = flops_saved(metrics, preset)
    if bound is not None:
        d.update(bound_to_dict(bound))
    return d


def prefill_estimates(metrics: SimMetrics, flops_per_token: float, device_tflops: float,
                      tp: int = 1) -> dict[str, Any]:
    """Prefill compute time with and without the cache, from the model's FLOPs
    per prompt token and an assumed sustained throughput of ``device_tflops``
    per GPU on ``tp`` GPUs.  Compute only: no queueing, no attention term, no
    decode; the time to first token is the mean prefill time of a request."""
    rate = float(device_tflops) * 1e12 * int(tp)
    full = metrics.prompt_tokens * float(flops_per_token) / rate
    saved = metrics.state_usable_tokens * float(flops_per_token) / rate
    n = max(metrics.requests, 1)
    return {
        "device_tflops": float(device_tflops), "tp": int(tp),
        "flops_per_token": float(flops_per_token),
        "assumption": (f"prefill runs at {device_tflops:g} TFLOP/s per GPU on {tp} GPU(s), "
                       f"{flops_per_token / 1e9:g} GFLOP per prompt token (attention not "
                       f"counted); compute only, no queueing"),
        "prefill_seconds_without_cache": full,
        "prefill_seconds_with_cache": full - saved,
        "prefill_seconds_saved": saved,
        "mean_ttft_seconds_without_cache": full / n,
        "mean_ttft_seconds_with_cache": (full - saved) / n,
    }


def _seconds(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:,.2f} s"


def format_estimates(est: dict[str, Any]) -> list[str]:
    """The report's lines for :func:`prefill_estimates`."""
    return [
        "estimated prefill time (assumed: " + est["assumption"] + ")",
        f"  prefill time saved     {_seconds(est['prefill_seconds_saved'])} of "
        f"{_seconds(est['prefill_seconds_without_cache'])}",
        f"  mean time to first token  {_seconds(est['mean_ttft_seconds_with_cache'])} with the "
        f"cache, {_seconds(est['mean_ttft_seconds_without_cache'])} without",
    ]


def write_csv(points: Sequence["SweepPoint"], path: str,
              preset: Optional[ModelPreset] = None) -> None:
    """One row per replay: the swept parameters, then every scalar of
    :func:`metrics_to_dict` (per-turn rates and wall times as JSON text; the
    upper bound's columns where the points have one); an ``error`` column,
    when a replay failed, holds why (its metrics are empty)."""
    import csv
    import json

    rows = []
    for p in points:
        row: dict[str, Any] = dict(p.params)
        if p.metrics is None:
            row["error"] = p.error
            rows.append(row)
            continue
        for k, v in metrics_to_dict(p.metrics, preset, p.bound).items():
            row[k] = json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
        rows.append(row)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def wall_total(metrics: SimMetrics) -> float:
    """Seconds the replay took: the engine's "total" when it reports one,
    else the sum of its phases."""
    ws = metrics.wall_seconds
    return float(ws["total"]) if "total" in ws else float(sum(ws.values()))


def _table(rows: Sequence[tuple[str, str, str]], indent: str = "  ") -> list[str]:
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return [f"{indent}{a:<{w0}}  {b:>{w1}}  {c}".rstrip() for a, b, c in rows]


def _config_lines(config: SimConfig, preset: Optional[ModelPreset], tp: int,
                  asked: Optional[int] = None) -> list[str]:
    """The report's config lines; asked: max_running as given, before SGLang's cap."""
    cps = "off" if config.chunked_prefill_size is None else str(config.chunked_prefill_size)
    running = str(config.max_running)
    if asked is not None and asked != config.max_running:
        running += f" (SGLang's cap for {config.state_slots} state slots; {asked} asked)"
    lines = [
        f"  KV pool {format_count(config.kv_tokens)} tokens, {config.state_slots} state slots, "
        f"page {config.page_size}, chunk {config.chunk_size}, "
        f"track interval {config.track_interval}",
        f"  SGLang {getattr(config, 'semantics', 'v0.5.15')} semantics, "
        f"mode {config.mode}, policy {config.lru_policy}, match cap "
        f"{'on' if config.match_cap else 'off'}, max running {running}, "
        f"chunked prefill {cps}, states {config.states}",
    ]
    if preset is not None:
        # the config's costs: the preset's, unless set (or swept) explicitly
        state_b = config.state_bytes_per_slot
        kv_b = config.kv_bytes_per_token
        lines.append(
            f"  model {preset.name} tp={tp}: state {format_bytes(state_b)}/slot "
            f"(pool {format_bytes(state_b * config.state_slots)}), KV {format_bytes(kv_b)}/token "
            f"(pool {format_bytes(kv_b * config.kv_tokens)})")
    return lines


def format_report(
    metrics: SimMetrics,
    config: SimConfig,
    *,
    workload: Optional[dict[str, Any]] = None,
    preset: Optional[ModelPreset] = None,
    tp: int = 1,
    extra_times: Optional[dict[str, float]] = None,
    device_tflops: Optional[float] = None,
    bound: Optional["BoundResult"] = None,
) -> str:
    """The terminal report of one replay.

    workload: a description (``name`` and the sizes of
    :func:`workloads.workload_stats`); extra_times: phases timed outside the
    engine (e.g. building the workload), shown with the engine's own;
    device_tflops: with a preset, adds the estimated prefill time saved and
    time to first token at that assumed throughput (see prefill_estimates);
    bound: the upper bound on the token hit rate (``upper_bound``), a row
    under the token hit rate.
    """
    if not isinstance(metrics, SimMetrics):
        raise TypeError(f"metrics must be a SimMetrics (what run() returns), got "
                        f"{type(metrics).__name__}")
    asked = config.max_running if isinstance(config, SimConfig) else None
    config = config.resolved() if isinstance(config, SimConfig) else config
    m = metrics
    out: list[str] = []
    if workload:
        name = workload.get("name", "workload")
        out.append(f"{name}: {workload.get('requests', m.requests):,} requests, "
                   f"{format_count(workload.get('prompt_tokens', m.prompt_tokens))} prompt tokens, "
                   f"{format_count(workload.get('output_tokens', 0))} output tokens")
        if workload.get("description"):
            out.append(f"  {workload['description']}")
    out.append("config:")
    out.extend(_config_lines(config, preset, tp, asked))
    out.append("")

    P = m.prompt_tokens
    out.append("hit rates")
    out.extend(_table([
        ("token hit rate", _pct(m.state_usable_tokens, P).strip(),
         "prompt tokens reused: KV matched and a state at the match end"),
        *([("upper bound", _pct(bound.hit_tokens, bound.prompt_tokens).strip(), bound_line(bound))]
          if bound is not None else []),
        ("KV hit rate", _pct(m.kv_matched_tokens, P).strip(),
         "prompt tokens whose KV was in the tree, with or without a state"),
        ("state hit rate", _pct(m.state_hits, m.requests).strip(),
         f"requests that reused a state ({m.state_hits:,} of {m.requests:,})"),
    ]))
    out.append("")

    lost = [
        ("lost: no state at the match end", m.lost_no_state),
        ("lost: chunk alignment", m.lost_alignment),
        ("lost: evicted since cached", m.lost_eviction),
        ("lost: match cap (input_len - 1)", m.lost_match_cap),
    ]
    cold = getattr(m, "never_seen_tokens", 0) or (P - m.state_usable_tokens
                                                   - sum(v for _, v in lost))
    rows = [("reused (KV + state)", f"{m.state_usable_tokens:,}", _pct(m.state_usable_tokens, P))]
    rows += [(k, f"{v:,}", _pct(v, P)) for k, v in lost]
    if cold >= 0:
        rows.append(("never cached before (cold)", f"{cold:,}", _pct(cold, P)))
    rows.append(("prompt tokens", f"{P:,}", ""))
    out.append("where the prompt tokens went")
    out.extend(_table(rows))
    out.append("")

    out.append("evictions and pools")
    pool_rows = [
        ("full evictions", f"{m.full_evictions:,}", "evict_full calls that freed KV"),
        ("state evictions", f"{m.state_evictions:,}", "states released by evict_mamba"),
        ("KV tokens evicted", f"{m.kv_tokens_evicted:,}", "by either"),
        ("peak state slots in use", f"{m.peak_state_slots:,}", f"of {config.state_slots:,}"),
        ("peak KV tokens in use", f"{m.peak_kv_tokens:,}", f"of {config.kv_tokens:,}"),
        ("state bytes copied", format_bytes(m.state_bytes_copied), "copy-on-write at hits, forks"),
        ("state bytes donated", format_bytes(m.state_bytes_donated),
         "snapshots handed to the tree without a copy"),
    ]
    pool_rows.append(("states admitted", f"{getattr(m, 'states_admitted', 0):,}",
                      f"{getattr(m, 'states_never_used', 0):,} never used by a match"))
    if getattr(m, "states_trimmed", 0):
        pool_rows.append(("states trimmed", f"{m.states_trimmed:,}", "by the per-path budget"))
    pool_rows.append(("states' share of memory", f"{100 * getattr(m, 'state_memory_share', 0.0):.1f}%",
                      "peak state bytes / (peak state + KV bytes)"))
    if config.lru_policy == "adaptive" and m.adaptive_inflation is not None:
        pool_rows.append(("adaptive inflation", f"{m.adaptive_inflation:.4g}",
                          f"the highest victim priority; {m.adaptive_superseded} states superseded "
                          f"({getattr(m, 'adaptive_unused_handovers', 0)} unused ones handing their value over), "
                          f"{m.adaptive_ghost_hits} ghost hits, {m.admissions_probation} states admitted on "
                          f"probation, {getattr(m, 'adaptive_placements', 0)} junctions predicted "
                          f"({getattr(m, 'adaptive_end_placements', 0)} of them end snapshots moved up)"))
    if config.lru_policy == "utility" and m.final_utility_alpha is not None:
        pool_rows.append(("utility alpha", f"{config.utility_alpha:g} -> {m.final_utility_alpha:g}",
                          f"configured -> after {m.utility_tunes} re-tunings; recency order "
                          f"{config.utility_order} -> {m.final_utility_order}"))
    if config.states == "toy":
        pool_rows.append(("toy states that differed", f"{getattr(m, 'state_mismatches', 0):,}",
                          "restored states checked against a recomputation"))
    out.extend(_table(pool_rows))
    out.append("")

    dist = getattr(m, "replay_distance", {}) or {}
    if dist:
        out.append("tokens recomputed for want of a state at the KV match end, by replay distance")
        out.extend(_table([(f"<= {b:,} tokens", f"{t:,}", "") for b, t in dist.items()]))
        out.append("")

    fl = flops_saved(m, preset)
    if preset is not None:
        out.append(f"prefill FLOPs saved for {preset.name}: {_format_flops(fl)} "
                   f"({config.flops_per_token / 1e9:.1f} GFLOP per reused token, attention "
                   f"not counted)")
        out.append("")
        if device_tflops:
            out.extend(format_estimates(prefill_estimates(m, config.flops_per_token,
                                                          device_tflops, tp)))
            out.append("")
    elif fl:
        out.append(f"prefill FLOPs saved: {_format_flops(fl)}")
        out.append("")

    if len(m.per_turn_hit_rate) > 1:
        out.append("token hit rate per turn")
        turns = sorted(m.per_turn_hit_rate.items(), key=lambda kv: int(kv[0]))
        out.append("  " + "  ".join(f"{int(t):>5}" for t, _ in turns[:16]))
        out.append("  " + "  ".join(f"{100 * v:4.0f}%" for _, v in turns[:16]))
        if len(turns) > 16:
            out.append(f"  ({len(turns) - 16} more turns in --json)")
        out.extend(PER_TURN_NOTE)
        out.append("")

    times = dict(extra_times or {})
    times.update((k, v) for k, v in m.wall_seconds.items() if k != "total")
    if times:
        total = sum(times.get(k, 0.0) for k in (extra_times or {})) + wall_total(m)
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in times.items())
        out.append(f"wall time {total:.2f} s: {parts}")
    return "\n".join(out)


#: What the per-turn hit rates are, printed under them.
PER_TURN_NOTE = [
    "  (the share of each turn's prompt tokens its requests reused. Turn 0 has nothing to reuse;",
    "  a later turn hits its conversation only if the state its previous turn left survived the",
    "  requests in between, so the rates follow the evictions (\"lost: evicted since cached\")",
    "  and can rise and fall from turn to turn)",
]


def _point_label(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def format_sweep(points: Sequence["SweepPoint"], preset: Optional[ModelPreset] = None) -> str:
    """One line per swept configuration; a point whose replay failed shows
    "failed" and its error on the line below."""
    keys = list(points[0].params) if points else []
    bounds = [p.bound for p in points if p.metrics is not None and p.bound is not None]
    header = keys + ["token hit"] + (["bound"] if bounds else []) + [
        "KV hit", "state hit", "lost:no-state", "lost:evict", "state evict", "peak slots", "wall s"]
    rows = []
    errors = {}
    for p in points:
        m = p.metrics
        if m is None:
            errors[len(rows)] = p.error
            rows.append([str(p.params[k]) for k in keys] + ["failed"] + ["-"] * (len(header) - len(keys) - 1))
            continue
        P = m.prompt_tokens
        shown = ([_pct(p.bound.hit_tokens, p.bound.prompt_tokens).strip() if p.bound else "-"]
                 if bounds else [])
        rows.append([str(p.params[k]) for k in keys] + [
            _pct(m.state_usable_tokens, P).strip(), *shown, _pct(m.kv_matched_tokens, P).strip(),
            _pct(m.state_hits, m.requests).strip(), _pct(m.lost_no_state, P).strip(),
            _pct(m.lost_eviction, P).strip(), f"{m.state_evictions:,}",
            f"{m.peak_state_slots:,}", f"{wall_total(m):.2f}",
        ])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if i in errors:
            lines.append(f"    ^ failed: {errors[i]}")
    if bounds:
        kinds = {b.pool_aware for b in bounds}
        which = ("pool-aware (one request at a time)" if kinds == {True} else
                 "unlimited pool (max running > 1)" if kinds == {False} else
                 "pool-aware where max running is 1, else unlimited pool")
        cost = sum(b.wall_seconds for b in {id(b): b for b in bounds}.values())
        lines.append(f"bound: no state policy passes it; {which}; computed in {cost:.2f} s")
    return "\n".join(lines)


def _is_numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def plot_sweep(points: Sequence["SweepPoint"], path: str, *, x: Optional[str] = None,
               title: Optional[str] = None, xlabel: Optional[str] = None) -> None:
    """Token hit rate (solid) and KV hit rate (dashed) against the swept
    parameter x (default: the first one); one line per combination of the
    other swept parameters; where the points have an upper bound, it too
    (dotted, with markers; one black line when every combination has the
    same).  Writes a PNG to path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependency(
            "--plot needs matplotlib: pip install matplotlib "
            "(or pip install 'mambaradix[sim]')") from None
    points = [p for p in points if p.metrics is not None]   # failed replays have no rates
    if not points:
        raise ValueError("nothing to plot")
    keys = list(points[0].params)
    if x is None:
        x = keys[0] if keys else "state_slots"
    if x not in keys and not hasattr(points[0].config, x):
        raise ValueError(f"cannot plot against {x!r}: it is neither swept nor a SimConfig field")
    others = [k for k in keys if k != x]
    series: dict[tuple, list["SweepPoint"]] = {}
    for p in points:
        series.setdefault(tuple(p.params[k] for k in others), []).append(p)

    def x_of(p: "SweepPoint") -> Any:
        """The point's x: its swept value, else its config's (x not swept)."""
        return p.params[x] if x in p.params else getattr(p.config, x)

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    xs_all = [x_of(p) for p in points]
    numeric = _is_numeric(xs_all)
    categories = list(dict.fromkeys(xs_all))
    bound_lines: dict[tuple, tuple] = {}     # (x, bound, kind)s -> the first series' color, label
    for i, (combo, pts) in enumerate(series.items()):
        if numeric:
            pts = sorted(pts, key=x_of)
        xs = [x_of(p) for p in pts]
        if not numeric:
            xs = [categories.index(v) for v in xs]
        label = " ".join(f"{k}={v}" for k, v in zip(others, combo)) or "token hit rate"
        color = f"C{i % 10}"
        ax.plot(xs, [100 * p.metrics.token_hit_rate for p in pts], marker="o", color=color,
                label=label)
        ax.plot(xs, [100 * p.metrics.kv_hit_rate for p in pts], linestyle="--", color=color,
                alpha=0.5, label=f"{label} (KV matched)" if others else "KV matched")
        with_bound = [(x_, p.bound) for x_, p in zip(xs, pts) if p.bound is not None]
        if with_bound:
            line = tuple((x_, 100 * b.token_hit_rate, b.pool_aware) for x_, b in with_bound)
            bound_lines.setdefault(line, (color, label))
    for line, (color, label) in bound_lines.items():
        kinds = {k for _, _, k in line}
        name = ("upper bound" if kinds == {True} else "upper bound (unlimited pool)"
                if kinds == {False} else "upper bound (unlimited pool where max running > 1)")
        if len(bound_lines) > 1:
            name = f"{label}: {name}"
        else:
            color = "black"
        ax.plot([x_ for x_, _, _ in line], [y for _, y, _ in line], linestyle=":", marker="^",
                color=color, linewidth=1.2, markersize=5, label=name)
    if numeric:
        span = [v for v in xs_all if v > 0]
        if span and max(span) / min(span) >= 16:
            ax.set_xscale("log", base=2)
        ticks = sorted(set(xs_all))
        if len(ticks) <= 12:
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{v:g}" for v in ticks])
            ax.minorticks_off()
    else:
        ax.set_xticks(range(len(categories)))
        ax.set_xticklabels([str(c) for c in categories])
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel("prompt tokens served from cache (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

