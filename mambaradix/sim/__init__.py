"""Trace simulator: replays workloads through the real C cache.

    from mambaradix.sim import run, SimConfig, apply_preset, workloads
    reqs = workloads.multi_turn(num_clients=64, num_rounds=6)
    config = apply_preset(SimConfig(state_slots=256, max_running=32), "qwen3-next", tp=4)
    metrics = run(reqs, config)
    print(metrics.token_hit_rate, metrics.lost_eviction, metrics.state_bytes_donated)

``SimConfig()`` has the command line's defaults.  Each running request holds
up to 3 state slots and locks the state it matched, so ``max_running`` left at
None follows the pool (``state_slots // 5``, at most 64); a larger one can make
the replay stop with a RuntimeError when the pool runs dry.  ``run`` refuses a
configuration that cannot serve the workload (``ConfigError``) before it
replays, as the command line does.

``run`` (the replay engine, :mod:`mambaradix.sim.engine`) is imported on first
use, so ``import mambaradix.sim`` stays light and never imports torch.
:func:`upper_bound` (:mod:`mambaradix.sim.bound`, docs/bound.md) bounds the
token hit rate any state policy can reach on a workload.
:func:`sweep` replays one workload under several configurations; the
command line is ``python -m mambaradix sim`` (:mod:`mambaradix.sim.cli`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import presets, workloads
from .presets import PRESETS, ModelPreset, apply_preset, get_preset
from .types import SimConfig, SimMetrics, SimRequest

# Bound here, after the submodule of the same name loaded, so that
# mambaradix.sim.sweep is the function whatever was imported before.
from .sweep import sweep  # noqa: E402  (isort: skip)

if TYPE_CHECKING:  # pragma: no cover
    from .bound import BoundResult, upper_bound
    from .engine import run
    from .report import format_report, metrics_to_dict

__all__ = [
    "run",
    "sweep",
    "SimConfig",
    "SimMetrics",
    "SimRequest",
    "ModelPreset",
    "PRESETS",
    "get_preset",
    "apply_preset",
    "presets",
    "workloads",
    "format_report",
    "metrics_to_dict",
    "upper_bound",
    "BoundResult",
]

_LAZY = {
    "run": ("engine", "run"),
    "format_report": ("report", "format_report"),
    "metrics_to_dict": ("report", "metrics_to_dict"),
    "upper_bound": ("bound", "upper_bound"),
    "BoundResult": ("bound", "BoundResult"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
