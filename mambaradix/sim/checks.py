"""Checks of a configuration against itself and against a workload, with
messages a user can act on (the CLI turns them into exit code 2).

:func:`check_field` is the one rule per SimConfig field (the command line's
option parsers, ``--sweep`` values and :func:`validate_config` all apply it);
:func:`request_kv_need` is the KV a request needs to run alone, which
:func:`check_feasible` and the workload builders' ``check_request``
(:func:`request_checker`) compare with the pool before anything is built.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

import numpy as np

_INT64_MAX = 2**63 - 1

from .. import scheduler as _rules
from ..scheduler import DriverConfig
from .presets import format_bytes
from .types import SimConfig, SimRequest, _is_int

__all__ = ["ConfigError", "MODES", "POLICIES", "STATES", "DECODE_BOUNDARIES", "UTILITY_ORDERS", "SEMANTICS",
           "SLOTS_PER_REQUEST", "MAX_POOL", "TOY_MAX_BYTES", "check_field", "validate_config",
           "request_kv_need", "check_request", "request_checker", "check_feasible", "check_requests",
           "MAX_TOKEN_ID"]

MODES = ("pp2", "pp1", "lazy", "no_buffer")
POLICIES = ("sglang", "consumed", "utility", "adaptive", "belady")
STATES = ("none", "toy")
DECODE_BOUNDARIES = ("committed", "batch")
UTILITY_ORDERS = ("mru", "lru")
#: SGLang releases whose cache rules the replay can follow (the first is the default).
SEMANTICS = ("v0.5.23", "v0.5.15")

#: State slots one running request holds at its peak: the running slot plus
#: the ping-pong track slots (2 with overlap, 1 without; lazy allocates its
#: second slot only at a decode track boundary; no_buffer forks the running
#: slot into a fresh one at every cache point).  The replay admits a request
#: only with 3 slots at hand (SGLang's admission headroom), whatever the mode.
SLOTS_PER_REQUEST = {"pp2": 3, "pp1": 3, "lazy": 3, "no_buffer": 3}

#: The most units a pool may have: the C allocators' limit (MR_SLOTS_MAX;
#: slot and KV indices are int32 in SGLang's tables).
MAX_POOL = 2**31 - 2

#: What --states toy may allocate for its CPU pools (it checks the cache's
#: states on small pools; it does not measure capacity).
TOY_MAX_BYTES = 4 << 30

_INT64 = 2**63 - 1

#: The largest token id a request may hold: the cache stores ids as int32
#: (the trace loaders and RadixTree.insert refuse larger ones too).
MAX_TOKEN_ID = 2**31 - 1

# field -> ("int", low, high, None allowed) | ("float", low, low excluded, high)
#          | ("choice", options) | ("bool",)
_FIELDS: dict[str, tuple] = {
    "kv_tokens": ("int", 1, MAX_POOL, False),
    "state_slots": ("int", 1, MAX_POOL, False),
    "page_size": ("int", 1, 2**24, False),           # the C tree's limit
    "chunk_size": ("int", 1, 2**24, False),
    "chunked_prefill_size": ("int", 1, _INT64, True),
    "track_interval": ("int", 1, _INT64, False),
    "mode": ("choice", MODES),
    "lru_policy": ("choice", POLICIES),
    "match_cap": ("bool",),
    "max_running": ("int", 1, MAX_POOL, True),       # None: follows the state pool
    "states": ("choice", STATES),
    "seed": ("int", 0, _INT64, False),
    "state_bytes_per_slot": ("int", 0, _INT64, False),
    "flops_per_token": ("float", 0.0, False, math.inf),
    "max_prefill_tokens": ("int", 1, _INT64, False),
    "new_token_ratio": ("float", 0.0, False, 1.0),
    "decode_step_seconds": ("float", 0.0, True, math.inf),
    "prefill_token_seconds": ("float", 0.0, False, math.inf),
    "decode_boundary": ("choice", DECODE_BOUNDARIES + (None,)),
    "end_of_turn_states": ("bool",),
    "max_states_per_path": ("int", 0, 2**32 - 1, False),
    "utility_alpha": ("float", 0.0, False, math.inf),
    "tune_window": ("int", 0, 2**20, False),         # the C tuner's limit
    "utility_order": ("choice", UTILITY_ORDERS),
    "attn_flops_per_pos": ("float", 0.0, False, math.inf),
    "kv_bytes_per_token": ("int", 0, _INT64, False),
    "semantics": ("choice", SEMANTICS),
}


#: What a choice field is called in its error message (default: its name).
_CHOICE_NAMES = {"lru_policy": "eviction policy"}


class ConfigError(ValueError):
    """A configuration that cannot be replayed (impossible or inconsistent)."""


def check_field(name: str, value: Any) -> None:
    """Raise ConfigError unless value is a valid value of the SimConfig field
    name (its type and range; a float must be finite)."""
    rule = _FIELDS.get(name)
    if rule is None:
        raise ConfigError(f"unknown SimConfig field {name!r}")
    kind = rule[0]
    if kind == "choice":
        if value not in rule[1]:
            raise ConfigError(f"unknown {_CHOICE_NAMES.get(name, name)} {value!r} "
                              f"(choose from {', '.join(str(o) for o in rule[1] if o is not None)})")
    elif kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise ConfigError(f"{name} must be True or False, got {value!r}")
    elif kind == "int":
        _, lo, hi, none_ok = rule
        if value is None and none_ok:
            return
        if (isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral)
                or not lo <= value <= hi):
            bound = f">= {lo}" if hi == _INT64 else f"in [{lo:,}, {hi:,}]"
            raise ConfigError(f"{name} must be an integer {bound}, got {value!r}")
    else:
        _, lo, open_lo, hi = rule
        ok = (isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
              and math.isfinite(value) and (value > lo if open_lo else value >= lo) and value <= hi)
        if not ok:
            bound = f"{'>' if open_lo else '>='} {lo:g}" + ("" if hi == math.inf else f" and <= {hi:g}")
            raise ConfigError(f"{name} must be a finite number {bound}, got {value!r}")


def validate_config(config: SimConfig, where: str = "") -> None:
    """Raise ConfigError for values the cache cannot run with: every field
    (:func:`check_field`; a field's error is prefixed with where + its name,
    e.g. ``config.mode: ...``, when where is given), then the rules between
    fields."""
    if isinstance(config, SimConfig):
        config = config.resolved()
    for name in _FIELDS:
        if hasattr(config, name):
            try:
                check_field(name, getattr(config, name))
            except ConfigError as e:
                if not where:
                    raise
                raise ConfigError(f"{where}{name}: {e}") from None
    slots = SLOTS_PER_REQUEST[config.mode]
    if config.state_slots < slots:
        raise ConfigError(
            f"{config.state_slots} state slot(s) cannot run one request: mode {config.mode} "
            f"needs {slots} per running request ({where}state_slots); raise --state-slots / "
            f"--state-mem")
    if config.lru_policy == "belady" and config.states != "none":
        raise ConfigError(f"{where}lru_policy belady reads the future from the trace: it "
                          f"runs with {where}states 'none' only (--states none)")
    if config.decode_boundary == "batch" and config.mode == "lazy":
        raise ConfigError("decode_boundary batch does not fit mode lazy: its pre-allocation "
                          "relies on SGLang's committed check")
    if config.chunk_size % config.page_size:
        raise ConfigError(f"chunk_size {config.chunk_size} must be a multiple of page_size "
                          f"{config.page_size}")
    if config.mode == "no_buffer" and config.page_size != 1:
        raise ConfigError(f"mode no_buffer needs page_size 1 (as in SGLang): {where}page_size "
                          f"must be 1 in no_buffer mode, got {config.page_size}; use pp2, pp1 "
                          f"or lazy")
    if config.mode != "no_buffer" and config.track_interval % config.page_size:
        raise ConfigError(f"track_interval {config.track_interval} must be a multiple of "
                          f"page_size {config.page_size}")


def _check_token_ids(where: str, ids: Any) -> None:
    """Raise TypeError / ValueError unless ids is a 1-D sequence of integer
    token ids in [0, MAX_TOKEN_ID]."""
    try:
        arr = np.asarray(ids)
    except (TypeError, ValueError, OverflowError):
        arr = None
    if arr is None or ids is None or isinstance(ids, (str, bytes)) or arr.ndim != 1 or (
            arr.size and arr.dtype.kind not in "iu"):
        raise TypeError(f"{where} must be a 1-D array or list of integer token ids, got "
                        f"{type(ids).__name__}"
                        + (f" of dtype {arr.dtype} and shape {arr.shape}" if arr is not None
                           and arr.dtype != object else ""))
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > MAX_TOKEN_ID):
        k = int(np.argmax((arr < 0) | (arr > MAX_TOKEN_ID)))
        raise ValueError(f"{where}[{k}] is {int(arr[k])}: token ids must lie in "
                         f"[0, {MAX_TOKEN_ID}] (int32)")


def check_requests(requests: Any) -> None:
    """Raise TypeError / ValueError, naming the request and its field, unless
    requests is a list (or tuple) of SimRequest with distinct str rids,
    non-empty integer input_ids, output_len an int >= 1, arrival a finite
    number >= 0, turn an int >= 0 and output_ids (when given) at least
    output_len integer token ids."""
    if not isinstance(requests, (list, tuple)):
        raise TypeError(f"requests must be a list of SimRequest, got {type(requests).__name__}")
    seen: set = set()
    for i, r in enumerate(requests):
        if not isinstance(r, SimRequest):
            raise TypeError(f"requests[{i}] must be a SimRequest, got {type(r).__name__}")
        if not isinstance(r.rid, str):
            raise TypeError(f"requests[{i}].rid must be a str, got {r.rid!r}")
        if r.rid in seen:
            raise ValueError(f"requests[{i}]: duplicate rid {r.rid!r}")
        seen.add(r.rid)
        where = f"requests[{i}] ({r.rid!r})"
        if not r.generated_prompt:      # (a generated one is valid by construction)
            _check_token_ids(f"{where}.input_ids", r.input_ids)
        if r.prompt_len == 0:
            raise ValueError(f"{where}.input_ids is empty")
        if not _is_int(r.output_len):
            raise TypeError(f"{where}.output_len must be an integer >= 1, got {r.output_len!r}")
        if r.output_len < 1:
            raise ValueError(f"{where}.output_len must be >= 1, got {r.output_len!r}")
        a = r.arrival
        if (type(a) is not float or not 0.0 <= a < math.inf) and (
                not isinstance(a, numbers.Real) or isinstance(a, (bool, np.bool_))
                or not math.isfinite(a) or a < 0):
            raise (ValueError if isinstance(a, numbers.Real) else TypeError)(
                f"{where}.arrival must be a finite number >= 0 (seconds), got {a!r}")
        if not _is_int(r.turn) or r.turn < 0:
            raise (ValueError if _is_int(r.turn) else TypeError)(
                f"{where}.turn must be an integer >= 0, got {r.turn!r}")
        if r.output_ids is not None:
            _check_token_ids(f"{where}.output_ids", r.output_ids)
            if len(r.output_ids) < r.output_len:
                raise ValueError(f"{where}.output_ids is shorter than output_len "
                                 f"({len(r.output_ids)} < {r.output_len})")


def request_kv_need(config: SimConfig, prompt_len: Any, output_len: Any) -> Any:
    """KV tokens a request needs in the pool to run alone: the C core's rule
    (``request_kv_need`` of csrc/core/rules.h, which the reference driver
    applies too) under config's page size and overlap.  Outputs past int64
    saturate.  Works on numpy arrays too (element by element)."""
    overlap = config.mode in ("pp2", "lazy")
    clip = DriverConfig.clip_max_new_tokens

    def one(p: int, o: int) -> int:
        return _rules.request_kv_need(int(p), min(int(o), _INT64_MAX), config.page_size, clip, overlap)

    if isinstance(prompt_len, np.ndarray) or isinstance(output_len, np.ndarray):
        p, o = np.broadcast_arrays(np.asarray(prompt_len), np.asarray(output_len))
        return np.fromiter(map(one, p.ravel().tolist(), o.ravel().tolist()), dtype=np.int64,
                           count=p.size).reshape(p.shape)
    return one(prompt_len, output_len)


def _kv_pool(config: SimConfig) -> int:
    """The KV pool in whole pages (SGLang rounds its pool down to pages)."""
    return config.kv_tokens // config.page_size * config.page_size


def check_request(config: SimConfig, rid: str, prompt_len: int, output_len: int) -> None:
    """Raise ConfigError when one request cannot run in config's KV pool,
    even alone (see :func:`request_kv_need`)."""
    need = int(request_kv_need(config, prompt_len, output_len))
    pool = _kv_pool(config)
    if pool < need:
        raise ConfigError(
            f"the KV pool ({pool:,} tokens) is smaller than one request's need: {rid} has "
            f"{prompt_len:,} prompt + {output_len:,} output tokens and needs {need:,} (admission "
            f"wants its prompt, outputs and a page of headroom free, its last decode step holds "
            f"prompt and outputs, in pages of {config.page_size}); raise --kv-tokens / --kv-mem")


def request_checker(configs: Sequence[SimConfig]) -> Callable[[str, int, int], None]:
    """A ``check_request`` for the workload builders: refuses a request that
    fits none of configs' KV pools (check_feasible refuses the points it does
    not fit later), with the message of the largest pool."""
    configs = [c.resolved() for c in configs]
    largest = max(configs, key=_kv_pool)

    def check(rid: str, prompt_len: int, output_len: int) -> None:
        for c in configs:
            if _kv_pool(c) >= request_kv_need(c, prompt_len, output_len):
                return
        check_request(largest, rid, prompt_len, output_len)

    return check


def check_feasible(requests: Sequence[SimRequest], config: SimConfig) -> None:
    """Raise ConfigError when the pools cannot run even one request of the
    workload (or, with toy states, would take more memory than TOY_MAX_BYTES)."""
    validate_config(config)
    config = config.resolved()
    if not requests:
        raise ConfigError("the workload has no requests")
    lens = np.fromiter((r.prompt_len for r in requests), dtype=np.int64, count=len(requests))
    # (clipped to fit int64: the refusal below gives the request's own)
    outs = np.fromiter((min(int(r.output_len), 2**40) for r in requests), dtype=np.int64,
                       count=len(requests))
    worst = int(np.argmax(request_kv_need(config, lens, outs)))
    check_request(config, requests[worst].rid, int(lens[worst]), int(requests[worst].output_len))
    slots = SLOTS_PER_REQUEST[config.mode]
    if config.max_running * slots > config.state_slots:
        raise ConfigError(
            f"max_running {config.max_running} needs {config.max_running * slots} state slots "
            f"({slots} per running request) but the pool has {config.state_slots}; lower "
            f"--max-running or raise --state-slots")
    if config.states == "toy":
        # the drop-in's pools on CPU: the toy states and SGLang's slot
        # bookkeeping, the KV allocator's free list and owners, the request
        # rows' int32 token table (a row holds the longest request)
        rows, width = config.max_running + 2, int((lens + outs).max()) + 2
        toy = (config.state_slots + 1) * 256 + config.kv_tokens * 24 + rows * width * 4
        if toy > TOY_MAX_BYTES:
            raise ConfigError(
                f"--states toy would allocate about {format_bytes(toy)} of CPU pools "
                f"({config.state_slots:,} state slots, {config.kv_tokens:,} KV tokens, {rows} "
                f"request rows of {width:,} tokens), more than {format_bytes(TOY_MAX_BYTES)}: "
                f"toy states check the cache's states on small pools, not its capacity")
