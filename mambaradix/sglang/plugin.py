"""SGLang plugin: makes the ``"mambaradix"`` TreeCore available in every SGLang process, with no code.

``pip install mambaradix`` declares ``load`` under SGLang's general plugin group (``sglang.srt.plugins``),
which SGLang's scheduler, engine and worker processes run at start-up (``sglang.srt.plugins.load_plugins``).
It only registers the backend; selecting it stays SGLang's own switch::

    SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=mambaradix python -m sglang.launch_server ...

``SGLANG_PLUGINS`` (SGLang's comma-separated allow-list) must name ``mambaradix`` when it is set.

Settings come from the environment of the process that builds the cache, read when a cache is built, and
from ``mambaradix.sglang.unified.register()``'s keywords, which take precedence.  Each resolved setting is
logged once per process, with where it came from.  A value that cannot be read raises ``ValueError``
naming the variable when the cache is built.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, NamedTuple


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off")


def _state_policy(text: str) -> str:
    """A name of the C tree's policy table (mambaradix.RadixTree's lru_policy), passed through as it is."""
    from .. import _C

    name = text.strip()
    try:
        _C.RadixTree(lru_policy=name, semantics="v0.5.23")
    except ValueError as e:
        raise ValueError(f"expected a policy of the tree's table ({e})") from None
    return name


def _utility_order(text: str) -> str:
    t = text.strip().lower()
    if t not in ("mru", "lru"):
        raise ValueError("expected mru or lru")
    return t


def _count(text: str) -> int:
    try:
        n = int(text.strip())
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError("expected an integer >= 0")
    return n


class Setting(NamedTuple):
    env: str
    parse: Callable[[str], Any]
    default: Any
    doc: str


#: Every setting of the TreeCore: keyword of register() -> (environment variable, reader, default, meaning).
SETTINGS: dict[str, Setting] = {
    "fast_match_prefix": Setting(
        "MAMBARADIX_FAST_MATCH_PREFIX", _bool, False,
        "answer True to supports_fast_match_prefix(): the scheduler matches every waiting request each round "
        "and skips its touch_prefix refresh (off: the scheduler behaves as with SGLang's own cores)"),
    "state_policy": Setting(
        "MAMBARADIX_STATE_POLICY", _state_policy, None,
        "the tree's state policy, any name of its policy table: utility (FLOPs saved per byte + recency, "
        "its weight tuned online, as the simulator's --policy utility), consumed (SGLang 0.5.23's LRU), ...; "
        "unset: SGLang's --radix-eviction-policy (which must then be lru)"),
    "utility_order": Setting(
        "MAMBARADIX_UTILITY_ORDER", _utility_order, "mru",
        "the utility policy's initial recency order among states of like FLOPs per byte, mru or lru "
        "(then tuned online; the simulator's --utility-order)"),
    "end_of_turn_states": Setting(
        "MAMBARADIX_END_OF_TURN_STATES", _bool, False,
        "extra_buffer modes: a finished request leaves the state at its exact end in the tree (its running "
        "slot, no copy) while the state pool has room, through a MAMBA component of mambaradix's "
        "(the simulator's --end-of-turn-states)"),
    "path_state_budget": Setting(
        "MAMBARADIX_PATH_STATE_BUDGET", _count, 0,
        "per-path state budget: a new state drops the deepest one above it while its path holds more than "
        "N states (0: none; the simulator's --max-states-per-path)"),
}


def check(name: str, value: Any) -> Any:
    """value as register()'s keyword ``name`` takes it (the type of the setting's default, or a str for
    state_policy), read as its variable is; TypeError / ValueError naming the keyword."""
    s = SETTINGS[name]
    want = str if s.default is None else type(s.default)
    if isinstance(value, bool) != (want is bool) or not isinstance(value, want):
        article = "an" if want is int else "a"
        raise TypeError(f"{name} must be {article} {want.__name__}, not {type(value).__name__}")
    try:
        return s.parse(str(int(value)) if want is bool else str(value))
    except ValueError as e:
        raise ValueError(f"{name}={value!r}: {e}") from None


def resolve(overrides: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, tuple[Any, str]]:
    """Each setting's value and its source ("register()", the variable's name, or "default")."""
    out: dict[str, tuple[Any, str]] = {}
    for name, s in SETTINGS.items():
        if name in overrides:
            out[name] = (overrides[name], "register()")
        elif s.env in environ:
            try:
                out[name] = (s.parse(environ[s.env]), s.env)
            except ValueError as e:
                raise ValueError(f"{s.env}={environ[s.env]!r}: {e}") from None
        else:
            out[name] = (s.default, "default")
    return out


def describe(resolved: Mapping[str, tuple[Any, str]]) -> str:
    return ", ".join(f"{name}={value!r} ({source})" for name, (value, source) in resolved.items())


def load() -> None:
    """The entry point SGLang runs: registers the backend (idempotent)."""
    from .unified import register

    register()
