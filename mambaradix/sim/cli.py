"""``python -m mambaradix sim``: replay a workload through the cache and report.

With no arguments it replays a built-in multi-turn chat workload (64 clients x
8 rounds of 512-token messages and 64-token answers, in the shape of SGLang's
``bench_multiturn``) through the C cache with the default configuration and
prints the report.  Exit codes: 0 on
success, 2 for a user error (bad flag, malformed trace, unknown preset,
impossible pool sizes: one message, no traceback), 1 for anything else.

Everything is checked before the first replay: each option's value (SimConfig
fields by :func:`checks.check_field`), every sweep point's configuration, each
request against the KV pool and the workload's size against
--max-workload-mem as it is built.  A sweep point whose replay then fails is
reported in the table, the JSON and the CSV with its error, and the sweep goes
on; the exit code is 2 only when every point failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import itertools
import json
import math
import os
import re
import shlex
import sys
import time
import typing
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from . import workloads as wl
from .checks import (DECODE_BOUNDARIES, MAX_POOL, MODES, POLICIES, SLOTS_PER_REQUEST, STATES,
                     UTILITY_ORDERS, ConfigError, check_feasible, check_field, request_checker,
                     validate_config)
from .presets import PRESETS, ModelPreset, apply_preset, format_bytes, get_preset, parse_size
from .report import (DEFAULT_DEVICE_TFLOPS, MissingDependency, config_to_dict, format_report,
                     format_sweep, metrics_to_dict, plot_sweep, prefill_estimates, write_csv)
from .sweep import UNSWEEPABLE, SweepPoint, config_field_type, config_fields
from .types import POLICY_ALIASES, SimConfig, SimMetrics, SimRequest, default_max_running

__all__ = ["main", "build_parser", "UserError"]

#: Generated workloads with their own session timing and LO-HI length ranges.
SESSION_WORKLOADS = ("agent", "rag", "tenants", "longdoc")

WORKLOADS = ("multiturn", "gsp", "agentic", "mooncake") + SESSION_WORKLOADS

#: --bound's default limit on the workload's requests, and the size from
#: which a line on stderr says the bound is being computed.
BOUND_MAX_REQUESTS = 100_000
BOUND_NOTE_REQUESTS = 10_000

#: Sweepable names besides the SimConfig fields: sizes turned into slots /
#: tokens by the model preset.
SIZE_PARAMS = {"state_mem": "state_slots", "kv_mem": "kv_tokens"}


class UserError(Exception):
    """An error in what the user asked for: reported as one line, exit code 2."""


# --------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------


_INT64 = 2**63 - 1


def _parse_int(text: str) -> int:
    """An integer from "512", "1_000_000" or "1e6" (an exact integer in
    e-notation); ValueError for anything else."""
    t = text.strip().replace("_", "")
    try:
        return int(t)
    except ValueError:
        v = float(t)
        if not (math.isfinite(v) and v.is_integer()):
            raise ValueError(text) from None
        return int(v)


def _int_opt(lo: int, hi: int = _INT64) -> Callable[[str], int]:
    """An option parser for integers in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            value = _parse_int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}")
        if value > hi:
            raise argparse.ArgumentTypeError(f"expected an integer <= {hi:,}, got {text!r}")
        return value
    return parse


def _float_opt(lo: float, above: bool, hi: float = math.inf) -> Callable[[str], float]:
    """An option parser for finite numbers > lo (above) or >= lo, and <= hi."""
    want = f"a finite number {'>' if above else '>='} {lo:g}" + (
        f" and <= {hi:g}" if hi < math.inf else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if not math.isfinite(value) or not (value > lo if above else value >= lo) or value > hi:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return value
    return parse


def _field_opt(name: str) -> Callable[[str], Any]:
    """An option parser for the SimConfig field name: its type, then
    checks.check_field (the rule --sweep values and the API follow too)."""
    def parse(text: str) -> Any:
        try:
            value = _convert(name, text, none_words=False)
            check_field(name, value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value
    return parse


_positive_int = _int_opt(1)
_nonneg_int = _int_opt(0)


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or inf, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0 or inf, got {text!r}")
    return value


#: Former policy names the arguments used (run_cli notes each on stderr once).
_renamed: set = set()


def _policy(text: str) -> str:
    """A state policy's name, a former one (POLICY_ALIASES) turned into the
    current one; argparse checks the choices."""
    if text in POLICY_ALIASES:
        _renamed.add(text)
        return POLICY_ALIASES[text]
    return text


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def build_parser(prog: str = "python -m mambaradix sim") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Replay a workload through mambaradix's C prefix cache and report how "
                    "much of it the cache serves, what that costs and why tokens are lost.",
        epilog="Examples:\n"
               "  %(prog)s                                   # built-in multi-turn chat\n"
               "  %(prog)s --workload mooncake --state-mem 8GiB --tp 4\n"
               "  %(prog)s --workload gsp --sweep state_slots=32,64,128,256 --plot hit.png\n"
               "  %(prog)s --trace my.jsonl --json > result.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=WORKLOADS, default=None,
                   help="built-in workload (default: multiturn); mooncake is the bundled "
                        "Mooncake conversation trace; agent, rag, tenants and longdoc time their "
                        "own sessions (docs/simulator.md has a table)")
    w.add_argument("--trace", metavar="FILE",
                   help="replay a trace file: Mooncake JSONL (hash_ids) or token-id JSONL "
                        "(input_ids), optionally gzip'd")
    w.add_argument("--trace-format", choices=("auto", "mooncake", "tokens"), default="auto")
    w.add_argument("--limit", type=_positive_int, metavar="N",
                   help="replay only the first N requests")
    w.add_argument("--seed", type=_nonneg_int, default=0, metavar="N",
                   help="seed of the workload and the replay")
    w.add_argument("--request-rate", type=_rate, metavar="R",
                   help="arrival rate in requests/s for multiturn, gsp and agentic (inf: all "
                        "at once)")
    w.add_argument("--range-ratio", type=_ratio, default=1.0, metavar="R",
                   help="multiturn, gsp and agentic lengths are uniform in [len*ratio, len] "
                        "(default 1: fixed)")

    g = p.add_argument_group("generated shared prefix (--workload gsp; SGLang's defaults)")
    g.add_argument("--gsp-num-groups", type=_positive_int, metavar="N", default=64)
    g.add_argument("--gsp-prompts-per-group", type=_positive_int, metavar="N", default=16)
    g.add_argument("--gsp-system-prompt-len", type=_positive_int, metavar="N", default=2048)
    g.add_argument("--gsp-question-len", type=_positive_int, metavar="N", default=128)
    g.add_argument("--gsp-output-len", type=_positive_int, metavar="N", default=256)
    g.add_argument("--gsp-group-distribution", choices=("uniform", "zipf"), default="uniform")
    g.add_argument("--gsp-zipf-alpha", type=_float_opt(0.0, True), default=None, metavar="A",
                   help="Zipf exponent of group popularity (default 1.0 with zipf)")
    g.add_argument("--gsp-ordered", action="store_true",
                   help="keep each group's requests together instead of shuffling")

    m = p.add_argument_group(
        "multi-turn chat (--workload multiturn, the default; SGLang's bench_multiturn runs "
        "256 clients x 5 rounds)")
    m.add_argument("--num-clients", type=_positive_int, metavar="N", default=64)
    m.add_argument("--num-rounds", type=_positive_int, metavar="N", default=8)
    m.add_argument("--request-length", type=_positive_int, metavar="N", default=512,
                   help="tokens of each new user message")
    m.add_argument("--output-length", type=_positive_int, metavar="N", default=64)
    m.add_argument("--system-prompt-len", type=_nonneg_int, metavar="N", default=0,
                   help="system prompt shared by all clients (default 0)")

    a = p.add_argument_group("agentic branching (--workload agentic)")
    a.add_argument("--agent-trees", type=_positive_int, metavar="N", default=8,
                   help="independent tasks")
    a.add_argument("--agent-depth", type=_positive_int, metavar="N", default=4,
                   help="levels per tree")
    a.add_argument("--agent-branching", type=_positive_int, metavar="N", default=3,
                   help="children per step")
    a.add_argument("--agent-system-len", type=_nonneg_int, metavar="N", default=2048)
    a.add_argument("--agent-task-len", type=_positive_int, metavar="N", default=256)
    a.add_argument("--agent-step-len", type=_positive_int, metavar="N", default=128)
    a.add_argument("--agent-output-len", type=_positive_int, metavar="N", default=64)
    _add_session_options(p)

    c = p.add_argument_group("cache configuration")
    c.add_argument("--model", default="qwen3-next",
                   help=f"model preset sizing states, KV and FLOPs ({', '.join(PRESETS)})")
    c.add_argument("--tp", type=_positive_int, metavar="N", default=1,
                   help="tensor-parallel degree")
    kv = c.add_mutually_exclusive_group()
    kv.add_argument("--kv-tokens", type=_field_opt("kv_tokens"), metavar="N",
                    help="KV pool size in tokens")
    kv.add_argument("--kv-mem", type=_size, metavar="SIZE",
                    help="KV pool size in bytes per GPU (e.g. 40GiB), sized by --model/--tp")
    st = c.add_mutually_exclusive_group()
    st.add_argument("--state-slots", type=_field_opt("state_slots"), metavar="N",
                    help="recurrent-state slots in the pool")
    st.add_argument("--state-mem", type=_size, metavar="SIZE",
                    help="state pool in bytes per GPU (e.g. 8GiB), sized by --model/--tp")
    c.add_argument("--page-size", type=_field_opt("page_size"), metavar="N")
    c.add_argument("--chunk-size", type=_field_opt("chunk_size"), metavar="N",
                   help="mamba cache chunk size: cached lengths are multiples of it")
    c.add_argument("--track-interval", type=_field_opt("track_interval"), metavar="N",
                   help="decode snapshot interval")
    c.add_argument("--mode", choices=MODES, help="state tracking: ping-pong 2/1, lazy, no_buffer")
    c.add_argument("--policy", choices=POLICIES, dest="lru_policy", type=_policy,
                   help="eviction policy: sglang (v0.5.15 LRU), consumed (refresh only the used "
                        "state), utility (FLOPs saved per byte + recency, alpha tuned online), "
                        "adaptive (GreedyDual-Size-Frequency over the prefill a state spares) or "
                        "belady (Belady's rule, reads the trace's future; clairvoyant is its "
                        "deprecated name)")
    c.add_argument("--end-of-turn-states", action="store_true", default=None,
                   help="a finished request leaves the state at its exact end in the tree "
                        "(its running slot, no copy) instead of the last track snapshot")
    c.add_argument("--max-states-per-path", type=_field_opt("max_states_per_path"), metavar="N",
                   help="per-path state budget: a path keeps at most N states, forks' states aside (0: none)")
    c.add_argument("--utility-alpha", type=_field_opt("utility_alpha"), metavar="A",
                   help="utility policy: initial weight of FLOPs saved per byte against recency (default 16, then tuned)")
    c.add_argument("--tune-window", type=_field_opt("tune_window"), metavar="N",
                   help="utility policy: re-tune alpha every N insertions (default 64; 0: fixed)")
    c.add_argument("--utility-order", choices=UTILITY_ORDERS,
                   help="utility policy: initial recency order among states of like FLOPs per byte: mru "
                        "(default) evicts the most recently used first, which keeps a fixed subset alive "
                        "when more conversations cycle than the pool holds; lru is Marconi's (then tuned)")
    c.add_argument("--no-match-cap", action="store_true",
                   help="let a match cover the whole prompt (SGLang caps it at input_len - 1)")
    c.add_argument("--max-running", type=_field_opt("max_running"), metavar="N",
                   help="max requests running at once (default: state slots // 5, at most 64)")
    c.add_argument("--chunked-prefill-size", type=_nonneg_int, metavar="N",
                   help="prompt tokens prefilled per request per step (0: off)")
    c.add_argument("--max-prefill-tokens", type=_field_opt("max_prefill_tokens"), metavar="N",
                   help="prompt tokens per prefill batch (SGLang's --max-prefill-tokens)")
    c.add_argument("--semantics", choices=("v0.5.23", "v0.5.15"),
                   help="which SGLang release's cache and scheduling rules the sglang baseline follows: "
                        "v0.5.23 (UnifiedRadixCache, the default) or v0.5.15 (MambaRadixCache)")
    c.add_argument("--decode-boundary", choices=DECODE_BOUNDARIES,
                   help="decode track boundary check: committed (SGLang v0.5.15's) or batch (cannot fire "
                        "twice under the overlap scheduler, SGLang 0.5.23's); default: the --semantics' own")
    c.add_argument("--states", choices=STATES,
                   help="none: slots only (fast); toy: real toy states, every hit verified")
    c.add_argument("--sweep", action="append", default=[], metavar="PARAM=V1,V2,...",
                   help="replay once per value (repeat for a grid); PARAM is a SimConfig field "
                        "(state_slots, kv_tokens, chunk_size, track_interval, lru_policy, mode, "
                        "flops_per_token, ...; not seed) or state_mem / kv_mem")

    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    o.add_argument("--bound", action="store_true",
                   help="also compute the upper bound on the token hit rate that no state policy "
                        "can pass (docs/bound.md): a report row, a sweep column, the plot, and "
                        "metrics.upper_bound_token_hit_rate / upper_bound_kind in --json and the "
                        "CSV; pool-aware with --max-running 1, else the unlimited-pool bound; "
                        "needs SciPy")
    o.add_argument("--bound-max-requests", type=_positive_int, default=BOUND_MAX_REQUESTS,
                   metavar="N",
                   help="--bound refuses a workload of more requests: its cost grows faster than "
                        "the workload (about 50 s at 80,000 requests on 2 cores)")
    o.add_argument("--plot", metavar="FILE.png",
                   help="plot hit rate against the (first) swept parameter; without --sweep, "
                        "against the state pool from 1/8 to 4x --state-slots (needs matplotlib)")
    o.add_argument("--csv", metavar="FILE",
                   help="write a table to FILE: one row per replay, the swept parameters and "
                        "every metric")
    o.add_argument("--save-trace", metavar="FILE",
                   help="write the workload to FILE as token-id JSONL (gzip'd if it ends in "
                        ".gz), which --trace replays")
    o.add_argument("--device-tflops", type=_float_opt(0.0, True), default=DEFAULT_DEVICE_TFLOPS,
                   metavar="T",
                   help="sustained prefill TFLOP/s assumed per GPU for the estimated prefill "
                        "time saved and time to first token (400: about 40%% of an H100 / "
                        "H200's dense bf16 peak)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    o.add_argument("--max-workload-mem", type=_size, default=wl.DEFAULT_MAX_BYTES, metavar="SIZE",
                   help="the most memory the workload may take (4 bytes a token id, about 1 KiB a "
                        "request); a bigger one is refused before it is built, and a replay needs "
                        "about as much again (default: 4GiB)")
    o.add_argument("--list-presets", action="store_true", help="list the model presets and exit")
    _show_defaults(p)
    return p


#: Defaults shown by --help for options whose parser default is None.
_HELP_DEFAULTS = {
    "workload": "multiturn", "trace": "none", "limit": "all requests",
    "request_rate": "16 for multiturn, inf (all at once) for gsp and agentic",
    "gsp_zipf_alpha": "1.0 with zipf", "kv_mem": "none: --kv-tokens",
    "state_mem": "none: --state-slots", "max_running": "state slots // 5, at most 64",
    "plot": "none", "csv": "none", "save_trace": "none", "sweep": "none",
}


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Append "(default: ...)" to every option's help that does not give it:
    the parser's default, else SimConfig's (options left None fall back to
    it), else _HELP_DEFAULTS."""
    fields = {f.name: f for f in dataclasses.fields(SimConfig)}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        help_text = action.help or ""
        if "default" in help_text:
            continue
        if action.dest in _HELP_DEFAULTS:
            shown = _HELP_DEFAULTS[action.dest]
        elif action.nargs == 0:
            shown = "off"
        elif action.default is not None:
            shown = str(action.default)
        elif action.dest in fields:
            shown = str(fields[action.dest].default)
        else:
            shown = "none"
        shown = shown.replace("%", "%%")
        action.help = f"{help_text} (default: {shown})" if help_text else f"default: {shown}"


# --------------------------------------------------------------------------
# session workloads (agent, rag, tenants, longdoc): options and builders
# --------------------------------------------------------------------------


def _range_opt(lo: int) -> Callable[[str], tuple[int, int]]:
    """An option parser for a length range: "LO-HI" (uniform in [LO, HI]) or
    "N" (fixed), integers >= lo."""
    want = f"N or LO-HI (integers >= {lo})"

    def parse(text: str) -> tuple[int, int]:
        parts = text.split("-")
        try:
            if len(parts) > 2:
                raise ValueError(text)
            values = [_parse_int(part) for part in parts]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if min(values) < lo:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        if values[0] > values[-1]:
            raise argparse.ArgumentTypeError(f"expected LO <= HI, got {text!r}")
        return values[0], values[-1]
    return parse


_seconds = _float_opt(0.0, False, wl.MAX_SECONDS)
_per_second = _float_opt(1.0 / wl.MAX_SECONDS, False)
_alpha = _float_opt(0.0, False)


def _add_turn_options(group: Any, prefix: str, followup: Optional[float],
                      max_turns: Optional[int], rate: float, what: str, think: float) -> None:
    """--PREFIX-followup and --PREFIX-max-turns (unless followup is None),
    --PREFIX-rate (what arrives per second) and --PREFIX-think."""
    if followup is not None:
        group.add_argument(f"--{prefix}-followup", type=_ratio, metavar="P", default=followup,
                           help="probability of a follow-up turn (after each turn)")
        group.add_argument(f"--{prefix}-max-turns", type=_positive_int, metavar="N",
                           default=max_turns)
    group.add_argument(f"--{prefix}-rate", type=_per_second, metavar="R", default=rate,
                       help=f"{what} per second (Poisson)")
    group.add_argument(f"--{prefix}-think", type=_seconds, metavar="S", default=think,
                       help="mean seconds of think time before a session's next turn")


def _add_session_options(p: argparse.ArgumentParser) -> dict[str, str]:
    """Add the option groups of the session workloads (lengths as N or
    LO-HI); returns each option's dest -> its workload."""
    a = p.add_argument_group(
        "agent sessions with backtracking tool steps (--workload agent; lengths N or LO-HI)")
    a.add_argument("--agent-tasks", type=_positive_int, metavar="N", default=48)
    a.add_argument("--agent-active", type=_positive_int, metavar="N", default=12,
                   help="tasks running at once")
    a.add_argument("--agent-steps", type=_range_opt(1), metavar="LO-HI", default="6-24",
                   help="steps (requests) per task")
    a.add_argument("--agent-prefix-len", type=_nonneg_int, metavar="N", default=3000,
                   help="system prompt shared by all tasks")
    a.add_argument("--agent-desc-len", type=_range_opt(1), metavar="LO-HI", default="400-2000",
                   help="each task's description")
    a.add_argument("--agent-tool-len", type=_range_opt(1), metavar="LO-HI", default="80-2500",
                   help="each step's tool result")
    a.add_argument("--agent-reply-len", type=_range_opt(1), metavar="LO-HI", default="60-400",
                   help="each step's output")
    a.add_argument("--agent-backtrack", type=_ratio, metavar="P", default=0.15,
                   help="probability that a step backs up 1 to --agent-backtrack-max steps")
    a.add_argument("--agent-backtrack-after", type=_positive_int, metavar="N", default=3,
                   help="steps before the first that may back up")
    a.add_argument("--agent-backtrack-max", type=_positive_int, metavar="N", default=3)
    a.add_argument("--agent-step-gap", type=_seconds, metavar="S", default=10.0,
                   help="mean seconds between a task's steps")

    r = p.add_argument_group("RAG over a shared document set (--workload rag; lengths N or LO-HI)")
    r.add_argument("--rag-docs", type=_positive_int, metavar="N", default=200,
                   help="documents in the corpus")
    r.add_argument("--rag-doc-len", type=_range_opt(1), metavar="LO-HI", default="300-2000")
    r.add_argument("--rag-k", type=_positive_int, metavar="N", default=5,
                   help="documents retrieved per query")
    r.add_argument("--rag-queries", type=_positive_int, metavar="N", default=400)
    r.add_argument("--rag-prefix-len", type=_nonneg_int, metavar="N", default=600,
                   help="instruction prefix shared by all queries")
    r.add_argument("--rag-question-len", type=_range_opt(1), metavar="LO-HI", default="20-120")
    r.add_argument("--rag-output-len", type=_range_opt(1), metavar="LO-HI", default="50-300")
    r.add_argument("--rag-zipf-alpha", type=_alpha, metavar="A", default=1.0,
                   help="Zipf exponent of document popularity (0: uniform)")
    _add_turn_options(r, "rag", 0.3, 3, 2.0, "queries", 20.0)

    t = p.add_argument_group("multi-tenant chat (--workload tenants; lengths N or LO-HI)")
    t.add_argument("--tenants", type=_positive_int, metavar="N", default=12,
                   help="tenants, each with its own system prompt")
    t.add_argument("--tenant-sessions", type=_positive_int, metavar="N", default=400)
    t.add_argument("--tenant-prompt-len", type=_range_opt(1), metavar="LO-HI", default="500-4000",
                   help="each tenant's system prompt")
    t.add_argument("--tenant-turns", type=_range_opt(1), metavar="LO-HI", default="1-8",
                   help="turns per session")
    t.add_argument("--tenant-msg-len", type=_range_opt(1), metavar="LO-HI", default="30-600")
    t.add_argument("--tenant-output-len", type=_range_opt(1), metavar="LO-HI", default="50-400")
    t.add_argument("--tenant-zipf-alpha", type=_alpha, metavar="A", default=1.0,
                   help="Zipf exponent of tenant popularity (0: uniform)")
    _add_turn_options(t, "tenant", None, None, 1.0, "sessions started", 30.0)

    d = p.add_argument_group("long-document QA (--workload longdoc; lengths N or LO-HI)")
    d.add_argument("--longdoc-docs", type=_positive_int, metavar="N", default=8)
    d.add_argument("--longdoc-len", type=_range_opt(1), metavar="LO-HI", default="8000-32000",
                   help="tokens per document")
    d.add_argument("--longdoc-questions", type=_positive_int, metavar="N", default=10,
                   help="questions per document")
    d.add_argument("--longdoc-prefix-len", type=_nonneg_int, metavar="N", default=256,
                   help="system prompt shared by all questions")
    d.add_argument("--longdoc-question-len", type=_range_opt(1), metavar="LO-HI", default="20-200")
    d.add_argument("--longdoc-output-len", type=_range_opt(1), metavar="LO-HI", default="50-500")
    _add_turn_options(d, "longdoc", 0.4, 3, 0.2, "first questions", 30.0)
    return {action.dest: name
            for name, group in (("agent", a), ("rag", r), ("tenants", t), ("longdoc", d))
            for action in group._group_actions}


#: A length option of each session workload, for messages.
_RANGE_EXAMPLE = {"agent": "--agent-tool-len 80-2500", "rag": "--rag-doc-len 300-2000",
                  "tenants": "--tenant-msg-len 30-600", "longdoc": "--longdoc-len 8000-32000"}

#: The options that time each session workload's arrivals.
_SESSION_TIMING = {"agent": "--agent-active and --agent-step-gap",
                   "rag": "--rag-rate and --rag-think",
                   "tenants": "--tenant-rate and --tenant-think",
                   "longdoc": "--longdoc-rate and --longdoc-think"}


def _span(bounds: tuple[int, int]) -> str:
    lo, hi = bounds
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _build_session_workload(args: argparse.Namespace, name: str, limits: dict[str, Any]
                            ) -> tuple[list[SimRequest], dict[str, Any]]:
    """One of SESSION_WORKLOADS from its options; they time their own
    arrivals, so --request-rate is refused."""
    if args.request_rate is not None:
        raise UserError(f"--request-rate applies to multiturn, gsp and agentic: --workload {name} "
                        f"times its own arrivals ({_SESSION_TIMING[name]})")
    if name == "agent":
        reqs = wl.agent_sessions(
            args.agent_tasks, args.agent_active, args.agent_steps, args.agent_prefix_len,
            args.agent_desc_len, args.agent_tool_len, args.agent_reply_len,
            backtrack_prob=args.agent_backtrack, backtrack_after=args.agent_backtrack_after,
            max_backtrack=args.agent_backtrack_max, step_gap=args.agent_step_gap,
            seed=args.seed, **limits)
        return reqs, {"name": "agent sessions with backtracking",
                      "description": f"{args.agent_tasks} tasks ({args.agent_active} at once) of "
                                     f"{_span(args.agent_steps)} steps, shared prompt "
                                     f"{args.agent_prefix_len}, tool results "
                                     f"{_span(args.agent_tool_len)}, outputs "
                                     f"{_span(args.agent_reply_len)}, backtrack "
                                     f"p={args.agent_backtrack:g}"}
    if name == "rag":
        if args.rag_k > args.rag_docs:
            raise UserError(f"--rag-k {args.rag_k} is more than --rag-docs {args.rag_docs}: a "
                            f"query retrieves distinct documents")
        reqs = wl.rag_queries(
            args.rag_docs, args.rag_doc_len, args.rag_k, args.rag_queries, args.rag_prefix_len,
            args.rag_question_len, args.rag_output_len, zipf_alpha=args.rag_zipf_alpha,
            followup_prob=args.rag_followup, max_turns=args.rag_max_turns,
            query_rate=args.rag_rate, think_time=args.rag_think, seed=args.seed, **limits)
        return reqs, {"name": "RAG over a shared document set",
                      "description": f"{args.rag_queries} queries x {args.rag_k} of "
                                     f"{args.rag_docs} documents ({_span(args.rag_doc_len)} "
                                     f"tokens, Zipf {args.rag_zipf_alpha:g}, shuffled), prefix "
                                     f"{args.rag_prefix_len}, follow-up p={args.rag_followup:g}"}
    if name == "tenants":
        reqs = wl.multi_tenant(
            args.tenants, args.tenant_sessions, args.tenant_prompt_len, args.tenant_turns,
            args.tenant_msg_len, args.tenant_output_len, zipf_alpha=args.tenant_zipf_alpha,
            session_rate=args.tenant_rate, think_time=args.tenant_think, seed=args.seed,
            **limits)
        return reqs, {"name": "multi-tenant chat",
                      "description": f"{args.tenant_sessions} sessions of "
                                     f"{_span(args.tenant_turns)} turns over {args.tenants} "
                                     f"tenants (Zipf {args.tenant_zipf_alpha:g}, prompts "
                                     f"{_span(args.tenant_prompt_len)}), think "
                                     f"{args.tenant_think:g} s"}
    reqs = wl.long_document_qa(
        args.longdoc_docs, args.longdoc_len, args.longdoc_questions, args.longdoc_prefix_len,
        args.longdoc_question_len, args.longdoc_output_len, followup_prob=args.longdoc_followup,
        max_turns=args.longdoc_max_turns, question_rate=args.longdoc_rate,
        think_time=args.longdoc_think, seed=args.seed, **limits)
    return reqs, {"name": "long-document QA",
                  "description": f"{args.longdoc_docs} documents of {_span(args.longdoc_len)} "
                                 f"tokens x {args.longdoc_questions} questions, follow-up "
                                 f"p={args.longdoc_followup:g}"}


# --------------------------------------------------------------------------
# workload and configuration from the arguments
# --------------------------------------------------------------------------


def _build_workload(args: argparse.Namespace, check: wl.RequestCheck
                    ) -> tuple[list[SimRequest], dict[str, Any]]:
    """The requests and a description of them; check (each request against
    the KV pools) and --max-workload-mem apply before anything is built."""
    limits = {"check_request": check, "max_bytes": args.max_workload_mem}
    rate = args.request_rate
    if rate is not None and (args.trace or args.workload == "mooncake"):
        raise UserError("--request-rate applies to generated workloads; a trace keeps its own "
                        "arrival times")
    if args.trace:
        if args.workload:
            raise UserError("give either --workload or --trace, not both")
        reqs = wl.load_trace(args.trace, args.trace_format, limit=args.limit, **limits)
        desc = {"name": f"trace {args.trace}", "description": ""}
        return reqs, desc
    name = args.workload or "multiturn"
    if name == "mooncake":
        reqs = wl.mooncake_conversation(limit=args.limit, **limits)
        desc = {"name": "Mooncake conversation trace",
                "description": "bundled FAST'25 trace, 512-token hash blocks expanded to "
                               "pseudo-tokens"}
        return reqs, desc
    if name in SESSION_WORKLOADS:
        reqs, desc = _build_session_workload(args, name, limits)
    elif name == "gsp":
        reqs = wl.generated_shared_prefix(
            args.gsp_num_groups, args.gsp_prompts_per_group, args.gsp_system_prompt_len,
            args.gsp_question_len, args.gsp_output_len, range_ratio=args.range_ratio,
            group_distribution=args.gsp_group_distribution, zipf_alpha=args.gsp_zipf_alpha,
            ordered=args.gsp_ordered, request_rate=math.inf if rate is None else rate,
            seed=args.seed, **limits)
        dist = args.gsp_group_distribution
        if dist == "zipf":
            dist += f"(alpha={args.gsp_zipf_alpha or 1.0})"
        desc = {"name": "generated shared prefix",
                "description": f"{args.gsp_num_groups} groups x {args.gsp_prompts_per_group} "
                               f"prompts ({dist}), system prompt {args.gsp_system_prompt_len} + "
                               f"question {args.gsp_question_len} tokens, output "
                               f"{args.gsp_output_len}"}
    elif name == "multiturn":
        reqs = wl.multi_turn(
            args.num_clients, args.num_rounds, args.request_length, args.output_length,
            system_prompt_len=args.system_prompt_len, range_ratio=args.range_ratio,
            request_rate=16.0 if rate is None else rate, seed=args.seed, **limits)
        desc = {"name": "multi-turn chat",
                "description": f"{args.num_clients} clients x {args.num_rounds} rounds, "
                               f"{args.request_length}-token messages, {args.output_length}-token "
                               f"answers, each turn = history + answer + new message"}
    else:
        reqs = wl.agentic_branching(
            args.agent_trees, args.agent_depth, args.agent_branching, args.agent_system_len,
            args.agent_task_len, args.agent_step_len, args.agent_output_len,
            range_ratio=args.range_ratio, request_rate=math.inf if rate is None else rate,
            seed=args.seed, **limits)
        desc = {"name": "agentic branching",
                "description": f"{args.agent_trees} trees, depth {args.agent_depth}, "
                               f"branching {args.agent_branching}, system prompt "
                               f"{args.agent_system_len}, steps of {args.agent_step_len} + "
                               f"{args.agent_output_len} output tokens"}
    if args.limit is not None:
        reqs = reqs[:args.limit]
    return reqs, desc


def default_slot_sweep(state_slots: int, max_running: Optional[int]) -> list[int]:
    """State pools --plot sweeps when no --sweep is given: 1/8 to 4 times the
    configured pool, each large enough to run (max_running x 3 slots, or 5
    slots when max_running follows the pool)."""
    floor = 5 if max_running is None else SLOTS_PER_REQUEST["pp2"] * max_running
    sizes = {max(floor, int(state_slots * f)) for f in (0.125, 0.25, 0.5, 1, 2, 4)}
    return sorted(sizes)


def _units_from_bytes(nbytes: int, per: int, what: str, unit: str, preset: ModelPreset,
                      tp: int, option: str) -> int:
    """How many slots (tokens) of per bytes a pool of nbytes (option's) holds."""
    if per <= 0:
        raise UserError(f"a {what} given in bytes needs a {unit} size above 0 (the model costs "
                        f"set it to {per})")
    if nbytes < per:
        raise UserError(f"a {what} of {format_bytes(nbytes)} holds no {unit}: one {unit.split()[-1]} of "
                        f"{preset.name} at tp={tp} is {format_bytes(per)}")
    n = nbytes // per
    if n > MAX_POOL:
        raise UserError(f"a {what} of {format_bytes(nbytes)} holds {n:,} {unit}s of "
                        f"{format_bytes(per)}, more than a pool may have ({MAX_POOL:,}); lower "
                        f"{option}")
    return n


def _slots_from_bytes(nbytes: int, config: SimConfig, preset: ModelPreset, tp: int) -> int:
    return _units_from_bytes(nbytes, config.state_bytes_per_slot, "state pool", "state slot",
                             preset, tp, "--state-mem")


def _tokens_from_bytes(nbytes: int, config: SimConfig, preset: ModelPreset, tp: int) -> int:
    return _units_from_bytes(nbytes, config.kv_bytes_per_token, "KV pool", "token", preset, tp,
                             "--kv-mem")


#: Options that set a SimConfig field of the same name.
_CONFIG_OPTIONS = ("page_size", "chunk_size", "track_interval", "mode", "lru_policy", "max_running",
                   "states", "max_prefill_tokens", "decode_boundary", "end_of_turn_states",
                   "max_states_per_path", "utility_alpha", "tune_window", "utility_order", "semantics")

#: SimConfig fields the other options set, and those options.
_FIELD_OPTIONS = {"kv_tokens": ("kv_tokens", "kv_mem"), "state_slots": ("state_slots", "state_mem"),
                  "match_cap": ("no_match_cap",), "chunked_prefill_size": ("chunked_prefill_size",),
                  **{name: (name,) for name in _CONFIG_OPTIONS}}


def _build_config(args: argparse.Namespace, preset: ModelPreset,
                  grid: dict[str, list[Any]]) -> SimConfig:
    """The base configuration: the options over SimConfig's defaults, the
    model's costs, pool sizes in bytes turned into slots and tokens (by each
    sweep point instead when the grid sweeps their size, see _grid_configs)."""
    cfg: dict[str, Any] = {"seed": args.seed}
    for name in _CONFIG_OPTIONS:
        value = getattr(args, name)
        if value is not None:
            cfg[name] = value
    if args.kv_tokens is not None:
        cfg["kv_tokens"] = args.kv_tokens
    if args.state_slots is not None:
        cfg["state_slots"] = args.state_slots
    if args.no_match_cap:
        cfg["match_cap"] = False
    if args.chunked_prefill_size is not None:
        cfg["chunked_prefill_size"] = args.chunked_prefill_size or None
    config = apply_preset(SimConfig(**cfg), preset, args.tp)
    if args.kv_mem is not None and "kv_bytes_per_token" not in grid:
        config = dataclasses.replace(
            config, kv_tokens=_tokens_from_bytes(args.kv_mem, config, preset, args.tp))
    if args.state_mem is not None and "state_bytes_per_slot" not in grid:
        config = dataclasses.replace(
            config, state_slots=_slots_from_bytes(args.state_mem, config, preset, args.tp))
    if args.max_running is None:
        config = dataclasses.replace(config, max_running=default_max_running(config.state_slots))
    return config


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(name: str, text: str, none_words: bool = True) -> Any:
    """text as a value of the SimConfig field name (its type only; ranges are
    checks.check_field's).  none_words: "none", "off" or nothing give None
    for a field that may be None (a --sweep value), and so does "0" for
    chunked_prefill_size (0: off, as its option says)."""
    tp = config_field_type(name)
    args = typing.get_args(tp)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if optional else tp
    t = text.strip()
    if optional and none_words and (t.lower() in ("none", "off", "")
                                    or (t == "0" and name == "chunked_prefill_size")):
        return None
    if base is bool:
        if t.lower() in _TRUE:
            return True
        if t.lower() in _FALSE:
            return False
        raise ValueError(f"{name} takes true/false, got {text!r}")
    if base is int:
        try:
            return _parse_int(t)
        except ValueError:
            raise ValueError(f"{name} takes integers, got {text!r}") from None
    if base is float:
        try:
            return float(t)
        except ValueError:
            raise ValueError(f"{name} takes numbers, got {text!r}") from None
    return t


def _parse_value(name: str, text: str) -> Any:
    """A --sweep value converted to the SimConfig field's type (a size for
    state_mem / kv_mem) and checked."""
    if name in SIZE_PARAMS:
        return parse_size(text)
    if name == "lru_policy":
        text = _policy(text.strip())
    value = _convert(name, text)
    check_field(name, value)
    return value


def parse_sweeps(specs: Sequence[str]) -> dict[str, list[Any]]:
    """{"state_slots": [32, 64]} from ["state_slots=32,64"]; UserError if bad."""
    grid: dict[str, list[Any]] = {}
    known = config_fields()
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip().replace("-", "_")
        if name == "policy":
            name = "lru_policy"
        if not sep or not values.strip():
            raise UserError(f"--sweep takes PARAM=V1,V2,..., got {spec!r}")
        if name not in known and name not in SIZE_PARAMS:
            raise UserError(f"--sweep: unknown parameter {name!r} (SimConfig fields: "
                            f"{', '.join(k for k in known if k not in UNSWEEPABLE)}; or "
                            f"{', '.join(SIZE_PARAMS)})")
        if name in UNSWEEPABLE:
            raise UserError(f"--sweep: {name} cannot be swept: {UNSWEEPABLE[name]}")
        if name in grid:
            raise UserError(f"--sweep: {name} given twice")
        grid[name] = []
        for text in values.split(","):
            try:
                grid[name].append(_parse_value(name, text))
            except ValueError as e:
                raise UserError(f"--sweep {name}={text.strip()}: {e}") from None
    targets = [SIZE_PARAMS.get(n, n) for n in grid]
    if len(set(targets)) != len(targets):
        raise UserError("--sweep: state_mem and state_slots (or kv_mem and kv_tokens) "
                        "set the same thing; sweep one of them")
    return grid


def _grid_configs(base: SimConfig, grid: dict[str, list[Any]], preset: ModelPreset,
                  args: argparse.Namespace) -> list[tuple[dict[str, Any], SimConfig]]:
    """(shown parameters, config) per grid point, each validated (the error
    names the point).  The swept values go over base, which carries the
    model's costs, so a swept cost overrides the preset's; pools given in
    bytes (--state-mem / --kv-mem or swept) take each point's slot and token
    sizes; max_running, unless given, follows each point's state pool."""
    out = []
    names = list(grid)
    for combo in itertools.product(*(grid[n] for n in names)):
        params = dict(zip(names, combo))
        shown = {k: (format_bytes(v) if k in SIZE_PARAMS else v) for k, v in params.items()}
        where = " ".join(f"{k}={v}" for k, v in shown.items())
        try:
            config = dataclasses.replace(
                base, **{k: v for k, v in params.items() if k not in SIZE_PARAMS})
            state_mem = params.get("state_mem", args.state_mem)
            kv_mem = params.get("kv_mem", args.kv_mem)
            changes: dict[str, Any] = {}
            if kv_mem is not None and ("kv_mem" in params or "kv_bytes_per_token" in params):
                changes["kv_tokens"] = _tokens_from_bytes(kv_mem, config, preset, args.tp)
            if state_mem is not None and ("state_mem" in params
                                          or "state_bytes_per_slot" in params):
                changes["state_slots"] = _slots_from_bytes(state_mem, config, preset, args.tp)
            if (args.max_running is None and "max_running" not in params
                    and ("state_slots" in changes or "state_slots" in params)):
                changes["max_running"] = default_max_running(
                    changes.get("state_slots", config.state_slots))
            config = dataclasses.replace(config, **changes)
            validate_config(config)
        except (UserError, ConfigError) as e:
            raise UserError(f"{where}: {e}" if where else str(e)) from None
        out.append((shown, config))
    return out


#: Options that only mean something for one workload (their dest -> it).
_WORKLOAD_OPTIONS = {
    **{d: "gsp" for d in ("gsp_num_groups", "gsp_prompts_per_group", "gsp_system_prompt_len",
                          "gsp_question_len", "gsp_output_len", "gsp_group_distribution",
                          "gsp_zipf_alpha", "gsp_ordered")},
    **{d: "multiturn" for d in ("num_clients", "num_rounds", "request_length", "output_length",
                                "system_prompt_len")},
    **{d: "agentic" for d in ("agent_trees", "agent_depth", "agent_branching", "agent_system_len",
                              "agent_task_len", "agent_step_len", "agent_output_len")},
    **_add_session_options(argparse.ArgumentParser(add_help=False)),
}


def _finite(obj: Any) -> Any:
    """obj with every non-finite float (an estimate at a vanishing
    --device-tflops) replaced by None, so --json prints standard JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _given(argv: list[str]) -> set[str]:
    """The dests of the options argv gives (not left at their defaults)."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def _flag(dest: str) -> str:
    """The option that sets dest (--policy for lru_policy)."""
    return {a.dest: a.option_strings[-1] for a in build_parser()._actions
            if a.option_strings}.get(dest, "--" + dest.replace("_", "-"))


def _check_options(args: argparse.Namespace, given: set[str], grid: dict[str, list[Any]]) -> None:
    """UserError for an option that would be ignored: one of another
    workload's, a utility-policy option with no utility replay, a --sweep of
    a field an option also sets."""
    workload = "trace" if args.trace else (args.workload or "multiturn")
    for dest in sorted(given):
        owner = _WORKLOAD_OPTIONS.get(dest)
        if owner is not None and owner != workload:
            raise UserError(f"{_flag(dest)} applies to --workload {owner}, not "
                            f"{'--trace' if workload == 'trace' else workload}")
    if "range_ratio" in given and workload in ("trace", "mooncake"):
        raise UserError("--range-ratio applies to generated workloads; a trace keeps its lengths")
    if "range_ratio" in given and workload in SESSION_WORKLOADS:
        raise UserError(f"--range-ratio applies to multiturn, gsp and agentic: --workload {workload} "
                        f"takes its lengths as ranges LO-HI (e.g. {_RANGE_EXAMPLE[workload]})")
    if "trace_format" in given and not args.trace:
        raise UserError("--trace-format applies to --trace")
    if "gsp_zipf_alpha" in given and args.gsp_group_distribution != "zipf":
        raise UserError("--gsp-zipf-alpha applies to --gsp-group-distribution zipf")
    modes = grid.get("mode", [args.mode or SimConfig.mode])
    if "end_of_turn_states" in given and all(mode == "no_buffer" for mode in modes):
        raise UserError("--end-of-turn-states applies to the extra_buffer modes (pp2, pp1, lazy): "
                        "no_buffer always keeps the state at a finished request's end")
    policies = grid.get("lru_policy", [args.lru_policy or SimConfig.lru_policy])
    for dest in ("utility_alpha", "tune_window", "utility_order"):
        if dest in given and "utility" not in policies:
            raise UserError(f"{_flag(dest)} applies to --policy utility")
    for name in grid:
        field = SIZE_PARAMS.get(name, name)
        for dest in _FIELD_OPTIONS.get(field, ()):
            if dest in given:
                raise UserError(f"--sweep {name} and {_flag(dest)} both set {field}: give one")


# --------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------


class _Progress:
    """Adapter from the engine's progress reports to a tqdm bar when tqdm is
    installed and stderr is a terminal; otherwise, on long runs, a plain
    progress line on stderr every PLAIN_EVERY seconds after PLAIN_AFTER."""

    PLAIN_AFTER = 5.0
    PLAIN_EVERY = 10.0

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self._bar = None
        self._plain = False
        self._desc = desc or "replay"
        self._total = total
        self._done = 0
        self._t0 = time.monotonic()
        self._last: Optional[float] = None
        if not enabled:
            return
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=self._desc, unit="req", leave=False,
                                 delay=1.0, file=sys.stderr, dynamic_ncols=True)
                return
        self._plain = True

    def __call__(self, done: int, total: Optional[int] = None) -> None:
        if self._bar is not None:
            if total is not None and total != self._bar.total:
                self._bar.total = total
            self._bar.update(done - self._bar.n)
        elif self._plain:
            self._done = done
            if total is not None:
                self._total = total
            self._plain_line()

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)
        elif self._plain:
            self._done += n
            self._plain_line()

    def _plain_line(self) -> None:
        now = time.monotonic()
        if now - self._t0 < self.PLAIN_AFTER or (
                self._last is not None and now - self._last < self.PLAIN_EVERY):
            return
        self._last = now
        pct = 100.0 * self._done / self._total if self._total else 0.0
        print(f"{self._desc}: {self._done:,} of {self._total:,} requests done ({pct:.0f}%), "
              f"{now - self._t0:.0f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _bounds(reqs: list[SimRequest]) -> Any:
    from .bound import BoundCache  # imported here: only --bound needs it

    return BoundCache(reqs)


def _bound_of(bounds: Any, config: SimConfig, label: str, n: int, progress: bool) -> Any:
    """config's upper bound (computed once per distinct bound); a large
    workload's computation is announced on stderr, and timed."""
    note = progress and n >= BOUND_NOTE_REQUESTS and not bounds.has(config)
    if note:
        print(f"computing the upper bound over {n:,} requests{f' ({label})' if label else ''}",
              file=sys.stderr, flush=True)
    try:
        b = bounds(config)
    except ImportError as e:
        raise UserError(f"--bound: {e}") from None
    if note:
        print(f"  upper bound {100 * b.token_hit_rate:.1f}% in {b.wall_seconds:.1f} s",
              file=sys.stderr, flush=True)
    return b


def _engine_run() -> Callable[..., SimMetrics]:
    from . import engine  # imported here: the workloads and reports never need it

    return engine.run


def _run_one(run: Callable[..., SimMetrics], reqs: list[SimRequest], config: SimConfig,
             desc: str, progress: bool) -> SimMetrics:
    bar = _Progress(len(reqs), desc, progress)
    try:
        return run(reqs, config, progress=bar)
    finally:
        bar.close()


def _document(args: argparse.Namespace, workload: dict[str, Any], preset: ModelPreset,
              base: SimConfig, points: list[SweepPoint], setup: dict[str, float],
              meta: dict[str, Any]) -> dict:
    def estimates(p: SweepPoint) -> dict[str, Any]:
        return prefill_estimates(p.metrics, p.config.flops_per_token, args.device_tflops, args.tp)

    doc: dict[str, Any] = dict(meta)
    doc.update({
        "workload": workload,
        "model": {"name": preset.name, "tp": args.tp,
                  "state_bytes_per_slot": preset.state_bytes_per_slot(args.tp),
                  "kv_bytes_per_token": preset.kv_bytes_per_token(args.tp),
                  "flops_per_token": preset.flops_per_token},
        "setup_seconds": setup,
    })
    if len(points) == 1 and not points[0].params:
        doc["config"] = config_to_dict(points[0].config)
        doc["metrics"] = metrics_to_dict(points[0].metrics, preset, points[0].bound)
        doc["estimates"] = estimates(points[0])
    else:
        doc["config"] = config_to_dict(base)
        doc["sweep"] = [{"params": p.params, "config": config_to_dict(p.config),
                         "metrics": metrics_to_dict(p.metrics, preset, p.bound),
                         "estimates": estimates(p)} if p.metrics is not None else
                        {"params": p.params, "config": config_to_dict(p.config), "error": p.error}
                        for p in points]
    return doc


_NEGATIVE = re.compile(r"-[0-9.]")


def _join_negative_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """["--state-mem", "-8GiB"] -> ["--state-mem=-8GiB"]: argparse takes a
    value starting with "-" for an option unless it is a plain negative
    number, and would say "expected one argument" instead of checking it."""
    takes_value = {opt for a in parser._actions if a.option_strings and a.nargs != 0
                   for opt in a.option_strings}
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in takes_value and i + 1 < len(argv) and _NEGATIVE.match(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _check_output(path: str, flag: str, formats: Optional[Sequence[str]] = None) -> None:
    """UserError unless path can be written (and, with formats, has one of
    their extensions): checked before any replay runs."""
    p = Path(path)
    if formats is not None:
        ext = p.suffix.lower().lstrip(".")
        if ext not in formats:
            raise UserError(f"{flag} {path}: unsupported format "
                            f"{repr(ext) if ext else '(no extension)'}; use one of "
                            f"{', '.join('.' + f for f in formats)}")
    if p.is_dir():
        raise UserError(f"{flag} {path}: is a directory")
    parent = p.parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UserError(f"{flag} {path}: not writable")


def run_cli(argv: Optional[Sequence[str]] = None) -> int:
    """Parse argv, run, print; return the exit code (raises UserError)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    meta = {"mambaradix_version": _version(),
            "command": shlex.join(["python", "-m", "mambaradix", "sim", *argv]),
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    argv = _join_negative_values(parser, argv)
    _renamed.clear()
    args = parser.parse_args(argv)
    if args.list_presets:
        for p in PRESETS.values():
            sizes = ", ".join(f"tp{t} {format_bytes(p.state_bytes_per_slot(t))}"
                              for t in (1, 2, 4, 8))
            print(f"{p.name:14s} {p.description}\n{'':14s} state/slot: {sizes}; KV/token "
                  f"{format_bytes(p.kv_bytes_per_token(1))} at tp1; "
                  f"{p.flops_per_token / 1e9:.0f} GFLOP/token + attention")
        return 0
    try:
        preset = get_preset(args.model)
        preset.check_tp(args.tp)
    except ValueError as e:
        raise UserError(str(e)) from None
    grid = parse_sweeps(args.sweep)
    for old in sorted(_renamed):
        print(f"mambaradix sim: policy {old!r} is deprecated; it is named "
              f"{POLICY_ALIASES[old]!r}", file=sys.stderr)
    given = _given(argv)
    _check_options(args, given, grid)
    if "bound_max_requests" in given and not args.bound:
        raise UserError("--bound-max-requests applies to --bound")
    if args.plot:
        try:
            importlib.import_module("matplotlib")  # fail before the replays, not after
            have_mpl = True
        except ImportError:
            have_mpl = False
        if not have_mpl:
            raise UserError("--plot needs matplotlib, which is not installed "
                            "(pip install matplotlib)")
        from matplotlib.backend_bases import FigureCanvasBase

        _check_output(args.plot, "--plot", sorted(FigureCanvasBase.get_supported_filetypes()))
    for flag, path in (("--csv", args.csv), ("--save-trace", args.save_trace)):
        if path:
            _check_output(path, flag)

    # every configuration first: the workload is built against their KV pools
    base = _build_config(args, preset, grid)
    if args.plot and not grid:
        grid = {"state_slots": default_slot_sweep(base.state_slots,
                                                  None if args.max_running is None
                                                  else base.max_running)}
    configs = _grid_configs(base, grid, preset, args)
    if args.bound and any(c.max_running == 1 for _, c in configs):
        try:
            importlib.import_module("scipy.optimize")  # the pool-aware bound's LP, checked first
        except ImportError:
            raise UserError("--bound with --max-running 1 solves a linear program with SciPy, "
                            "which is not installed (pip install scipy)") from None

    t0 = time.perf_counter()
    try:
        reqs, workload = _build_workload(args, request_checker([c for _, c in configs]))
    except (wl.WorkloadError, ConfigError) as e:
        raise UserError(str(e)) from None
    except MemoryError:
        raise UserError("out of memory building the workload: make it smaller or lower "
                        "--max-workload-mem") from None
    setup = {"workload": time.perf_counter() - t0}
    workload.update(wl.workload_stats(reqs))
    if args.save_trace:
        try:
            wl.save_token_trace(reqs, args.save_trace)
        except OSError as e:
            raise UserError(f"cannot write {args.save_trace}: {e.strerror or e}") from None
        print(f"workload written to {args.save_trace} ({len(reqs):,} requests)", file=sys.stderr)
    if args.bound and len(reqs) > args.bound_max_requests:
        raise UserError(f"--bound: the workload has {len(reqs):,} requests, more than "
                        f"--bound-max-requests {args.bound_max_requests:,}; the bound's cost grows "
                        f"faster than the workload (about 50 s at 80,000 requests on 2 cores): "
                        f"raise --bound-max-requests, or bound fewer requests (--limit)")

    for params, config in configs:
        try:
            check_feasible(reqs, config)
        except ConfigError as e:
            where = " ".join(f"{k}={v}" for k, v in params.items())
            raise UserError(f"{where}: {e}" if where else str(e)) from None

    run = _engine_run()
    bounds = _bounds(reqs) if args.bound else None
    points: list[SweepPoint] = []
    for params, config in configs:
        label = " ".join(f"{k}={v}" for k, v in params.items())
        try:
            metrics = _run_one(run, reqs, config, label, not args.no_progress and not args.json)
        except (ImportError, ValueError, RuntimeError) as e:
            if isinstance(e, ImportError):
                if config.states != "toy":
                    raise
                error = (f"--states toy needs torch and the SGLang drop-in of this package, "
                         f"which cannot be imported here ({e}); use --states none")
            else:
                # The engine's own checks, and pools that run dry mid-replay.
                error = (f"the replay stopped{f' ({label})' if label else ''}: {e} (state slots "
                         f"{config.state_slots}, max running {config.max_running}, KV tokens "
                         f"{config.kv_tokens:,})")
            if not grid:
                raise UserError(error) from None
            points.append(SweepPoint(params=params, config=config, metrics=None, error=error))
            continue
        points.append(SweepPoint(params=params, config=config, metrics=metrics))
        if bounds is not None:
            points[-1].bound = _bound_of(bounds, config, label, len(reqs), not args.no_progress)
        if grid and not args.json and not args.no_progress and sys.stderr.isatty():
            print(f"  {label}: token hit {100 * metrics.token_hit_rate:.1f}%", file=sys.stderr)
    done = [p for p in points if p.metrics is not None]

    if args.json:
        json.dump(_finite(_document(args, workload, preset, base, points, setup, meta)),
                  sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    elif not grid:
        print(format_report(points[0].metrics, points[0].config, workload=workload,
                            preset=preset, tp=args.tp, extra_times=setup,
                            device_tflops=args.device_tflops, bound=points[0].bound))
    else:
        print(f"{workload['name']}: {workload['requests']:,} requests, "
              f"{workload['prompt_tokens']:,} prompt tokens; model {preset.name} tp={args.tp}")
        print(format_sweep(points, preset))
    if args.csv:
        try:
            write_csv(points, args.csv, preset)
        except OSError as e:
            raise UserError(f"cannot write {args.csv}: {e.strerror or e}") from None
        if not args.json:
            print(f"table written to {args.csv}")
    if args.plot and done:
        try:
            title = f"{workload['name']} ({preset.name}, tp={args.tp})"
            x = next(iter(points[0].params))
            slot_b = format_bytes(preset.state_bytes_per_slot(args.tp))
            token_b = format_bytes(preset.kv_bytes_per_token(args.tp))
            xlabel = {"state_slots": f"state slots ({slot_b} each)",
                      "kv_tokens": f"KV pool tokens ({token_b} each)",
                      "state_mem": "state pool per GPU", "kv_mem": "KV pool per GPU"}.get(x, x)
            plot_sweep(points, args.plot, x=x, title=title, xlabel=xlabel)
        except MissingDependency as e:
            raise UserError(str(e)) from None
        except OSError as e:
            raise UserError(f"cannot write {args.plot}: {e.strerror or e}") from None
        if not args.json:
            print(f"plot written to {args.plot}")
    failed = len(points) - len(done)
    if failed and not done:
        raise UserError("every replay of the sweep failed (their errors are in the output)")
    if failed:
        print(f"mambaradix sim: {failed} of {len(points)} replays of the sweep failed; their "
              f"errors are in the output", file=sys.stderr)
    return 0


def _version() -> str:
    from .. import __version__

    return __version__


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point: run_cli with user errors turned into a message and exit code 2."""
    try:
        return run_cli(argv)
    except UserError as e:
        print(f"mambaradix sim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mambaradix sim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
