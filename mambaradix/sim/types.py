"""Data types shared by the simulator's parts: workloads produce SimRequest
lists, the engine replays them under a SimConfig and returns SimMetrics.

These are plain dataclasses so a notebook can build, inspect and sweep them.
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings
from dataclasses import dataclass, field
from typing import Optional

import numpy as np


@dataclass
class SimRequest:
    """One request of a workload.

    input_ids: the prompt's token ids (int32 array).
    output_len: tokens to decode (>= 1).
    arrival: arrival time in seconds from the start (requests are admitted in
      arrival order; ties keep list order).
    extra_key: cache namespace (LoRA id / cache salt); None for the default.
    session: conversation / client id for multi-turn workloads (None if n/a).
    turn: 0-based turn number within the session.
    output_ids: the tokens the request decodes, when the workload fixes them
      (multi-turn workloads feed them into the next turn's prompt); None lets
      the engine generate deterministic pseudo tokens.
    """

    rid: str
    input_ids: np.ndarray
    output_len: int
    arrival: float = 0.0
    extra_key: Optional[str] = None
    session: Optional[str] = None
    turn: int = 0
    output_ids: Optional[np.ndarray] = None

    @property
    def prompt_len(self) -> int:
        """The prompt's length (without building a generated prompt)."""
        return len(self.input_ids)

    @property
    def generated_prompt(self) -> bool:
        """True when input_ids is made on each read from a compact
        description whose token ids are valid by construction (a Mooncake
        record's hash blocks): validation does not scan it."""
        return False

    def write_prompt(self, out: np.ndarray) -> None:
        """Write the prompt's token ids into ``out`` (``prompt_len`` long):
        a generated prompt is made there, without an array of its own."""
        out[...] = self.input_ids


#: Former names of state policies, and their names now (accepted, with a
#: DeprecationWarning, by SimConfig and the command line).
POLICY_ALIASES = {"clairvoyant": "belady"}


@dataclass
class SimConfig:
    """How the cache and the batching model are configured for one replay.

    kv_tokens: size of the KV token pool (tokens).
    state_slots: number of recurrent-state slots in the pool.
    page_size: KV page size (tokens).
    chunk_size: mamba cache chunk size C (tracked lengths are multiples of it).
    chunked_prefill_size: max prompt tokens prefilled per request per step
      (None: whole prompt in one step).
    track_interval: decode snapshot interval (mamba_track_interval).
    mode: "pp2" (extra_buffer with overlap), "pp1" (extra_buffer, no overlap),
      "lazy" (extra_buffer_lazy) or "no_buffer".
    lru_policy: "sglang" (v0.5.15), "consumed", "utility" (Marconi-style
      FLOPs-per-byte + recency, alpha tuned online), "adaptive" (GreedyDual-
      Size-Frequency over the prefill a state spares) or "belady" (Belady's rule:
      evicts the state whose next use lies furthest ahead in the trace; the
      state-free replay only; no bound on the hit rate, see
      ``mambaradix.sim.upper_bound``).  "clairvoyant", belady's former name,
      is accepted with a DeprecationWarning and stored as "belady".
    match_cap: cap the match key at input_len - 1 as SGLang does.
    max_running: max requests decoding at once (continuous batching); None
      (the default, as on the command line): ``default_max_running(state_slots)``,
      i.e. state_slots // 5, at least 1, at most 64.  Under v0.5.23 rules a
      larger value is capped as SGLang caps it (``sglang_running_cap``:
      state_slots // 5 in pp2, // 4 in pp1 and lazy, // 3 in no_buffer).
    states: "none" (no state tensors: fast) or "toy" (the toy recurrent model
      on CPU; every hit is checked against a from-scratch recomputation).
    state_bytes_per_slot: bytes of one recurrent-state slot (all layers), for
      the copied / donated byte counts.
    flops_per_token: prefill FLOPs of one prompt token, for the FLOPs saved.
      Both default to the command line's default model, qwen3-next at TP 1
      (``apply_preset`` sets them for another model).
    max_prefill_tokens, new_token_ratio: admission limits (SGLang's
      --max-prefill-tokens; the reserved share of running requests' outputs).
    decode_step_seconds, prefill_token_seconds: the engine's clock; a prefill
      batch takes max(decode_step_seconds, tokens * prefill_token_seconds).
    semantics: which SGLang release's cache rules the replay follows:
      "v0.5.23" (UnifiedRadixCache over its TreeCore: a node lives as long as
      its KV, so evicting a leaf's state keeps the KV above it; a match
      refreshes only the state it uses) or "v0.5.15" (MambaRadixCache).
    decode_boundary: how decode track boundaries are detected (see
      mambaradix.driver.DriverConfig): "committed" is SGLang v0.5.15's check,
      "batch" the one that cannot fire twice under the overlap scheduler
      (pp2 / pp1 only), as SGLang 0.5.23 does; None (the default): the
      semantics' own (filled in by ``resolved()``).
    """

    kv_tokens: int = 1 << 20
    state_slots: int = 256
    page_size: int = 1
    chunk_size: int = 64
    chunked_prefill_size: Optional[int] = 8192
    track_interval: int = 256
    mode: str = "pp2"
    lru_policy: str = "sglang"
    match_cap: bool = True
    max_running: Optional[int] = None          # None: default_max_running(state_slots)
    states: str = "none"
    seed: int = 0
    # model costs (the front end fills these from a model preset)
    state_bytes_per_slot: int = 77_266_944   # one Qwen3-Next state at TP1
    flops_per_token: float = 6.0e9           # prefill FLOPs of a token (Qwen3-Next: 2 x 3B active)
    # batching and time model of the replay engine
    max_prefill_tokens: int = 16384          # prompt tokens per prefill batch
    new_token_ratio: float = 1.0             # share of remaining outputs admission reserves
    decode_step_seconds: float = 0.02        # one decode step of the running batch
    prefill_token_seconds: float = 2e-5      # per prompt token of a prefill batch
    decode_boundary: Optional[str] = None    # "committed" (v0.5.15), "batch"; None: the semantics' own
    semantics: str = "v0.5.23"               # SGLang release whose cache rules apply: "v0.5.23" or "v0.5.15"
    # beyond SGLang (see docs/simulator.md, "State policies")
    end_of_turn_states: bool = False         # keep the state at a finished request's exact end
    max_states_per_path: int = 0             # per-path state budget (0: none)
    utility_alpha: float = 16.0              # lru_policy="utility": initial alpha
    tune_window: int = 64                    # lru_policy="utility": re-tune alpha every N inserts (0: fixed)
    utility_order: str = "mru"               # lru_policy="utility": initial recency order, "mru" or "lru"
    attn_flops_per_pos: float = 196_608.0    # attention FLOPs per token per earlier token (Qwen3-Next TP1)
    kv_bytes_per_token: int = 24_576         # bytes of KV per token (Qwen3-Next TP1)

    def __post_init__(self) -> None:
        if isinstance(self.lru_policy, str) and self.lru_policy in POLICY_ALIASES:
            new = POLICY_ALIASES[self.lru_policy]
            warnings.warn(f"lru_policy {self.lru_policy!r} is deprecated: it is named {new!r}",
                          DeprecationWarning, stacklevel=3)
            self.lru_policy = new

    def resolved(self) -> "SimConfig":
        """This configuration with its derived defaults filled in (the
        replay and the command line both run the resolved one)."""
        changes: dict = {}
        if self.max_running is None:
            changes["max_running"] = default_max_running(self.state_slots)
        if self.semantics == "v0.5.23":
            running = changes.get("max_running", self.max_running)
            cap = sglang_running_cap(self.state_slots, self.mode)
            if cap is not None and _is_int(running) and running > cap:
                changes["max_running"] = cap
        if self.decode_boundary is None:
            # the semantics' own check: 0.5.23 reads the batch's lengths
            # (lazy keeps the committed check its pre-allocation relies on)
            changes["decode_boundary"] = ("batch" if self.semantics == "v0.5.23" and self.mode != "lazy"
                                          else "committed")
        return dataclasses.replace(self, **changes) if changes else self


#: The most requests the default configuration runs at once.
MAX_RUNNING_CAP = 64

#: State slots per running request in SGLang 0.5.23's sizing (its
#: kv_cache_configurator: a ratio of 3, plus extra_buffer's tracking slots,
#: 2 under the overlap scheduler, 1 without it or in lazy mode).
SGLANG_SLOTS_PER_RUNNING = {"pp2": 5, "pp1": 4, "lazy": 4, "no_buffer": 3}


def _is_int(value) -> bool:
    """An integer, bool and numpy bool excluded (the simulator's checks share it)."""
    return type(value) is int or (isinstance(value, numbers.Integral)
                                  and not isinstance(value, (bool, np.bool_)))


def sglang_running_cap(state_slots, mode) -> Optional[int]:
    """The most requests SGLang 0.5.23 runs at once with this state pool:
    it caps max_running_requests at state_slots // its slots per running
    request (SGLANG_SLOTS_PER_RUNNING), with a warning; below one request it
    refuses to start, where the simulator still runs one.  None for a value
    that validate_config refuses."""
    ratio = SGLANG_SLOTS_PER_RUNNING.get(mode) if isinstance(mode, str) else None
    if ratio is None or not _is_int(state_slots) or state_slots < 1:
        return None
    return max(1, int(state_slots) // ratio)


def default_max_running(state_slots: int) -> int:
    """Running requests allowed when max_running is not given: each holds up
    to 3 state slots and locks the cached state it matched, so a pool of S
    slots runs at most S // 5 at once (at least 1, at most 64), which leaves
    the tree room to take snapshots."""
    if isinstance(state_slots, (bool, np.bool_)) or not isinstance(state_slots, numbers.Integral):
        return MAX_RUNNING_CAP  # validate_config reports the bad state_slots
    return max(1, min(MAX_RUNNING_CAP, int(state_slots) // 5))


@dataclass
class SimMetrics:
    """What a replay measured.  Token counts are prompt tokens."""

    requests: int = 0
    prompt_tokens: int = 0
    kv_matched_tokens: int = 0        # tokens whose KV was found in the tree
    state_usable_tokens: int = 0      # tokens actually reused (KV + state at the end)
    state_hits: int = 0               # requests that reused a state
    lost_no_state: int = 0            # KV matched beyond the last state on the path
    lost_alignment: int = 0           # lost because snapshots sit on the chunk grid
    lost_eviction: int = 0            # once cached (by an earlier request), evicted since
    lost_match_cap: int = 0           # the input_len - 1 cap
    never_seen_tokens: int = 0        # no earlier request had cached them
    full_evictions: int = 0           # evict_full calls that released something
    state_evictions: int = 0          # states released by evict_mamba
    kv_tokens_evicted: int = 0
    state_bytes_copied: int = 0       # copy-on-write and forks
    state_bytes_donated: int = 0      # snapshot slots handed to the tree without a copy
    peak_state_slots: int = 0
    peak_kv_tokens: int = 0
    state_mismatches: int = 0         # toy mode: restored states that differ from the recomputation
    prefill_flops_saved: float = 0.0
    per_turn_hit_rate: dict = field(default_factory=dict)  # turn -> usable/prompt
    # tokens recomputed because no state stood at the KV match end, by the
    # distance back to the last usable state: bucket upper bound -> tokens
    replay_distance: dict = field(default_factory=dict)
    states_admitted: int = 0          # states the tree took (new or revived node)
    states_never_used: int = 0        # of those, never used by a match
    states_trimmed: int = 0           # dropped by the per-path budget
    state_memory_share: float = 0.0   # peak state bytes / (peak state + peak KV bytes)
    # lru_policy="utility" only (None otherwise): where the online tuner left
    # alpha and the recency order (they start at SimConfig's utility_alpha
    # and utility_order), and how many times it re-tuned them
    final_utility_alpha: Optional[float] = None
    final_utility_order: Optional[str] = None   # "mru" or "lru"
    utility_tunes: int = 0
    # lru_policy="adaptive" only (None / 0 otherwise): its final inflation L
    # (the highest victim priority), the matches that wanted an evicted state
    # (a ghost hit), the states whose uses a new state below them superseded
    # (and of those, the ones no match had used that handed their value over),
    # the states admitted on probation, the matches that proposed a
    # predicted junction (adaptive placement) and, of those, the end
    # snapshots moved up (end-relative placement)
    adaptive_inflation: Optional[float] = None
    adaptive_ghost_hits: int = 0
    adaptive_superseded: int = 0
    adaptive_unused_handovers: int = 0
    admissions_probation: int = 0
    adaptive_placements: int = 0
    adaptive_end_placements: int = 0
    wall_seconds: dict = field(default_factory=dict)       # phase -> seconds

    @property
    def utility_alpha(self) -> Optional[float]:
        """final_utility_alpha (the name before it said "final")."""
        return self.final_utility_alpha

    @property
    def utility_order(self) -> Optional[str]:
        """final_utility_order (the name before it said "final")."""
        return self.final_utility_order

    @property
    def token_hit_rate(self) -> float:
        return self.state_usable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def kv_hit_rate(self) -> float:
        return self.kv_matched_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def state_hit_rate(self) -> float:
        return self.state_hits / self.requests if self.requests else 0.0
