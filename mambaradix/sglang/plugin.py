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
}


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
