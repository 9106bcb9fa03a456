"""Checks of a configuration against itself and against a workload, with
messages a user can act on (the CLI turns them into exit code 2)."""

from __future__ import annotations

from typing import Sequence

from ..driver import DriverConfig
from .types import SimConfig, SimRequest

__all__ = ["ConfigError", "MODES", "POLICIES", "STATES", "DECODE_BOUNDARIES", "SLOTS_PER_REQUEST",
           "validate_config", "check_feasible"]

MODES = ("pp2", "pp1", "lazy", "no_buffer")
POLICIES = ("sglang", "consumed", "utility", "clairvoyant")
STATES = ("none", "toy")
DECODE_BOUNDARIES = ("committed", "batch")

#: State slots one running request holds at its peak: the running slot plus
#: the ping-pong track slots (2 with overlap, 1 without; lazy allocates its
#: second slot only at a decode track boundary; no_buffer forks the running
#: slot into a fresh one at every cache point).  The replay admits a request
#: only with 3 slots at hand (SGLang's admission headroom), whatever the mode.
SLOTS_PER_REQUEST = {"pp2": 3, "pp1": 3, "lazy": 3, "no_buffer": 3}


class ConfigError(ValueError):
    """A configuration that cannot be replayed (impossible or inconsistent)."""


def validate_config(config: SimConfig) -> None:
    """Raise ConfigError for values the cache cannot run with."""
    if isinstance(config, SimConfig):
        config = config.resolved()
    if config.mode not in MODES:
        raise ConfigError(f"unknown mode {config.mode!r} (choose from {', '.join(MODES)})")
    if config.lru_policy not in POLICIES:
        raise ConfigError(
            f"unknown eviction policy {config.lru_policy!r} (choose from {', '.join(POLICIES)})")
    if config.states not in STATES:
        raise ConfigError(f"unknown states {config.states!r} (choose from {', '.join(STATES)})")
    if config.lru_policy == "clairvoyant" and config.states != "none":
        raise ConfigError("policy clairvoyant reads the future from the trace: it runs with "
                          "--states none only")
    budget = getattr(config, "max_states_per_path", 0)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ConfigError(f"max_states_per_path must be an integer >= 0, got {budget!r}")
    boundary = getattr(config, "decode_boundary", "committed")
    if boundary not in DECODE_BOUNDARIES:
        raise ConfigError(f"unknown decode_boundary {boundary!r} "
                          f"(choose from {', '.join(DECODE_BOUNDARIES)})")
    for name in ("kv_tokens", "state_slots", "page_size", "chunk_size", "track_interval",
                 "max_running"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    cps = config.chunked_prefill_size
    if cps is not None and (isinstance(cps, bool) or not isinstance(cps, int) or cps < 1):
        raise ConfigError(f"chunked_prefill_size must be an integer >= 1 or None, got {cps!r}")
    if config.chunk_size % config.page_size:
        raise ConfigError(f"chunk_size {config.chunk_size} must be a multiple of page_size "
                          f"{config.page_size}")
    if config.mode == "no_buffer" and config.page_size != 1:
        raise ConfigError("mode no_buffer needs page_size 1 (as in SGLang); use pp2, pp1 or lazy")
    if config.mode != "no_buffer" and config.track_interval % config.page_size:
        raise ConfigError(f"track_interval {config.track_interval} must be a multiple of "
                          f"page_size {config.page_size}")


def check_feasible(requests: Sequence[SimRequest], config: SimConfig) -> None:
    """Raise ConfigError when the pools cannot hold even one request."""
    validate_config(config)
    config = config.resolved()
    if not requests:
        raise ConfigError("the workload has no requests")
    page = config.page_size
    # Admission (SGLang's PrefillAdder) takes a request only while its
    # remaining prompt, its outputs (clipped) and a page of headroom stay
    # below the free plus evictable KV: a cold request needs more than that.
    clip = DriverConfig.clip_max_new_tokens

    def need_of(r: SimRequest) -> int:
        return -(-len(r.input_ids) // page) * page + min(int(r.output_len), clip) + page

    worst = max(requests, key=need_of)
    need = need_of(worst)
    if config.kv_tokens // page * page <= need:
        raise ConfigError(
            f"the KV pool ({config.kv_tokens:,} tokens) is smaller than one request's need: "
            f"{worst.rid} has {len(worst.input_ids):,} prompt + {worst.output_len:,} output "
            f"tokens, and admission needs more than {need:,} free (a page of headroom, page size "
            f"{page}); raise --kv-tokens / --kv-mem")
    slots = SLOTS_PER_REQUEST[config.mode]
    if config.state_slots < slots:
        raise ConfigError(
            f"{config.state_slots} state slot(s) cannot run one request: mode {config.mode} "
            f"needs {slots} per running request; raise --state-slots / --state-mem")
    if config.max_running * slots > config.state_slots:
        raise ConfigError(
            f"max_running {config.max_running} needs {config.max_running * slots} state slots "
            f"({slots} per running request) but the pool has {config.state_slots}; lower "
            f"--max-running or raise --state-slots")
