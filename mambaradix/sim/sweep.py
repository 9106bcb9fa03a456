"""Replay one workload under several configurations.

    from mambaradix.sim import sweep, SimConfig, workloads
    reqs = workloads.multi_turn(num_clients=64, num_rounds=6)
    points = sweep(reqs, SimConfig(max_running=12), model="qwen3-next",
                   state_slots=[64, 128, 256], lru_policy=["sglang", "consumed"])
    for p in points:
        print(p.params, p.metrics.token_hit_rate)

The grid is the product of the keyword lists, in keyword order (the last one
varies fastest).  Every key must be a :class:`SimConfig` field but ``seed``
(:data:`UNSWEEPABLE`).  The model preset is applied to ``base`` first, so a
swept model cost (``flops_per_token``, ``state_bytes_per_slot``,
``kv_bytes_per_token``, ``attn_flops_per_pos``) overrides the preset's.
``on_error="record"`` keeps going past a point whose replay fails: its
``metrics`` is None and ``error`` says why.  ``bound=True`` also computes, at
each point, the upper bound on the token hit rate (``SweepPoint.bound``, a
:class:`bound.BoundResult`; see :func:`mambaradix.sim.upper_bound`).
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence, Union

from .presets import ModelPreset, apply_preset
from .types import SimConfig, SimMetrics, SimRequest

if TYPE_CHECKING:  # pragma: no cover
    from .bound import BoundResult

__all__ = ["SweepPoint", "sweep", "config_fields", "config_field_type", "points_to_rows",
           "UNSWEEPABLE"]

#: SimConfig fields a sweep refuses, and why.
UNSWEEPABLE = {
    "seed": "the workload is built once, before the sweep, from its own seed (the config's seeds "
            "only the toy model): replay one workload per seed instead (--seed)",
}


@dataclass
class SweepPoint:
    """One configuration of a sweep and what its replay measured (metrics),
    or, when the replay failed and the sweep went on, why (error); bound: the
    upper bound on its token hit rate, when asked for."""

    params: dict[str, Any]
    config: SimConfig
    metrics: Optional[SimMetrics]
    error: Optional[str] = None
    bound: Optional["BoundResult"] = None


def config_fields() -> list[str]:
    """Names of the SimConfig fields, in declaration order."""
    return [f.name for f in dataclasses.fields(SimConfig)]


def config_field_type(name: str) -> Any:
    """The resolved type annotation of a SimConfig field (e.g. int, Optional[int])."""
    return typing.get_type_hints(SimConfig)[name]


def _check_names(names: Iterable[str]) -> None:
    known = config_fields()
    for name in names:
        if name not in known:
            raise ValueError(f"unknown SimConfig parameter {name!r} (known: {', '.join(known)})")
        if name in UNSWEEPABLE:
            raise ValueError(f"{name} cannot be swept: {UNSWEEPABLE[name]}")


def sweep(
    requests: Sequence[SimRequest],
    base: Optional[SimConfig] = None,
    *,
    model: Union[ModelPreset, str, None] = None,
    tp: Optional[int] = None,
    run: Optional[Callable[..., SimMetrics]] = None,
    on_point: Optional[Callable[[SweepPoint], None]] = None,
    on_error: str = "raise",
    bound: bool = False,
    **grid: Sequence[Any],
) -> list[SweepPoint]:
    """Replay ``requests`` once per point of the grid over ``base``.

    model, tp: a model preset (or its name) whose state size and FLOPs per
      token the replays report bytes and FLOPs with (see
      :func:`presets.apply_preset`), applied to base before the grid's values;
      tp (default 1) applies with model only.
    run: the replay function (default :func:`mambaradix.sim.run`).
    on_point: called after each replay (e.g. to print progress).
    on_error: "raise" (a point's ValueError or RuntimeError stops the sweep)
      or "record" (the point keeps the error and the sweep goes on).
    bound: also compute each point's upper bound on the token hit rate
      (``SweepPoint.bound``; points with the same bound share one
      computation).  It needs SciPy where the pool binds.
    """
    base = base if base is not None else SimConfig()
    if not isinstance(base, SimConfig):
        raise TypeError(f"base must be a SimConfig, got {type(base).__name__}")
    if model is None and tp is not None:
        raise ValueError("tp applies with model= only (it sizes the model's state and KV per GPU)")
    if on_error not in ("raise", "record"):
        raise ValueError(f"on_error must be 'raise' or 'record', got {on_error!r}")
    if not isinstance(bound, bool):
        raise TypeError(f"bound must be True or False, got {bound!r}")
    _check_names(grid)
    for name, values in grid.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise ValueError(f"sweep values of {name!r} must be a list, got {values!r}")
        grid[name] = list(values)
        if not grid[name]:
            raise ValueError(f"sweep values of {name!r} are empty: give at least one")
    if run is None:
        from .engine import run as engine_run

        run = engine_run
    if model is not None:
        base = apply_preset(base, model, 1 if tp is None else tp)
    bounds = None
    if bound:
        from .bound import BoundCache

        bounds = BoundCache(list(requests))
    names = list(grid)
    points = []
    for combo in itertools.product(*(grid[n] for n in names)):
        params = dict(zip(names, combo))
        # resolved per point: max_running left at None follows each point's pool
        config = dataclasses.replace(base, **params).resolved()
        try:
            point = SweepPoint(params=params, config=config, metrics=run(list(requests), config))
            if bounds is not None:
                point.bound = bounds(config)
        except (ValueError, RuntimeError) as e:
            if on_error == "raise":
                raise
            point = SweepPoint(params=params, config=config, metrics=None, error=str(e))
        points.append(point)
        if on_point is not None:
            on_point(point)
    return points


def points_to_rows(points: Sequence[SweepPoint]) -> list[dict[str, Any]]:
    """Flat dicts (swept parameters, then rates and counters) for tables and
    data frames; a failed point's row has its error instead."""
    from .report import wall_total     # (imported on use: importing the package stays light)

    rows = []
    for p in points:
        m = p.metrics
        row = dict(p.params)
        if m is None:
            row["error"] = p.error
            rows.append(row)
            continue
        row.update(
            token_hit_rate=m.token_hit_rate, kv_hit_rate=m.kv_hit_rate,
            state_hit_rate=m.state_hit_rate, lost_no_state=m.lost_no_state,
            lost_alignment=m.lost_alignment, lost_eviction=m.lost_eviction,
            lost_match_cap=m.lost_match_cap, state_evictions=m.state_evictions,
            full_evictions=m.full_evictions, peak_state_slots=m.peak_state_slots,
            wall_seconds=wall_total(m),
        )
        if p.bound is not None:
            row.update(upper_bound_token_hit_rate=p.bound.token_hit_rate,
                       upper_bound_kind=p.bound.kind)
        rows.append(row)
    return rows
