"""Workloads for the trace simulator: lists of :class:`SimRequest`.

Synthetic generators (all deterministic for a given ``seed``):

* :func:`generated_shared_prefix` -- SGLang ``bench_serving``'s
  ``generated-shared-prefix`` dataset: G groups, each with one system prompt
  shared by P questions; optional Zipf popularity of the groups.
* :func:`multi_turn` -- SGLang ``bench_multiturn.py``: N clients x R rounds;
  every turn's prompt is the whole conversation so far (previous prompts and
  outputs) plus a new user message.
* :func:`agentic_branching` -- trees of agent trajectories: each step extends
  its parent's context (parent prompt + parent output + a new observation) and
  siblings fork from the same parent, so whole trajectories are shared.

Session generators, which time their own sessions (Poisson starts,
Gamma-distributed think times) and take lengths as an int or a pair
``(lo, hi)`` drawn uniformly:

* :func:`agent_sessions` -- agent tasks over one shared system prompt whose
  steps sometimes back up and retry from an earlier step's history.
* :func:`rag_queries` -- retrieval queries: a shared instruction, k documents
  of a Zipf-popular corpus in a shuffled order, a question; follow-ups.
* :func:`multi_tenant` -- chat sessions over a few tenants' system prompts
  (Zipf traffic), their turns interleaved by think times.
* :func:`long_document_qa` -- questions about a few long documents, spread
  over time, with follow-ups.

Trace files (plain or gzip'd JSONL):

* :func:`load_mooncake` -- the Mooncake (FAST'25) trace format
  ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``.
  Each hash id stands for one block of ``block_size`` (512) tokens; every id is
  expanded into ``block_size`` deterministic pseudo-token ids (a hash of the id
  and the position in the block), and the last block is cut so the prompt has
  exactly ``input_length`` tokens.  Equal leading hash ids therefore give
  equal leading tokens, and different ids give different tokens.
* :func:`load_token_trace` -- explicit token ids, one request a line::

      {"input_ids": [1, 2, 3], "output_len": 16, "arrival": 0.5,
       "extra_key": null, "session": "c7", "turn": 2,
       "output_ids": [9, 9], "rid": "c7-2"}

  ``input_ids`` (a non-empty list of ints >= 0) and ``output_len`` (an int
  >= 1) are required, unless ``output_ids`` is given, in which case
  ``output_len`` defaults to its length.  ``arrival`` (seconds, default 0),
  ``extra_key`` (string or null), ``session`` (string or int), ``turn`` (int
  >= 0, default 0) and ``rid`` (default ``"line-N"``) are optional.  Blank
  lines are skipped.  :func:`save_token_trace` writes this format.

:func:`load_trace` picks the format from the first record's keys.  Every
malformed line raises :class:`TraceFormatError` naming the file and line.

Every builder checks sizes before it builds: ``check_request(rid, prompt_len,
output_len)``, when given, is called for each request before its tokens are
made (:func:`mambaradix.sim.checks.request_checker` refuses one that no KV
pool of the run can hold), and a workload whose token ids and requests would
take more than ``max_bytes`` (:func:`workload_bytes`, default
:data:`DEFAULT_MAX_BYTES`) is refused before it is built (a generator) or at
the line that crosses it (a trace).

The Mooncake conversation trace (12,031 requests, one hour of a production
chat service) ships with the package: :func:`mooncake_conversation`.
"""

from __future__ import annotations

import gc
import gzip
import heapq
import itertools
import json
import math
import numbers
import os
import zlib
from importlib import resources
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np

from .. import _C
from .checks import check_requests
from .presets import format_bytes
from .types import SimRequest

__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "MOONCAKE_BLOCK_SIZE",
    "WorkloadError",
    "TraceFormatError",
    "generated_shared_prefix",
    "multi_turn",
    "agentic_branching",
    "agent_sessions",
    "rag_queries",
    "multi_tenant",
    "long_document_qa",
    "LengthRange",
    "MAX_SECONDS",
    "load_mooncake",
    "mooncake_conversation",
    "bundled_mooncake_path",
    "expand_hash_blocks",
    "HashBlocks",
    "HashBlockPrompt",
    "HashBlockRequest",
    "prefix_bounds",
    "load_token_trace",
    "save_token_trace",
    "load_trace",
    "detect_trace_format",
    "workload_stats",
    "workload_bytes",
    "DEFAULT_MAX_BYTES",
    "RequestCheck",
]

#: Token ids are drawn from [0, DEFAULT_VOCAB_SIZE) unless told otherwise
#: (2**17: below the vocabularies of the models the presets describe).
DEFAULT_VOCAB_SIZE = 131_072

#: Tokens per hash id in the Mooncake traces.
MOONCAKE_BLOCK_SIZE = 512

PathLike = Union[str, "os.PathLike[str]"]

#: ``check_request(rid, prompt_len, output_len)``: raises (a ValueError) when
#: the request cannot run; see mambaradix.sim.checks.request_checker.
RequestCheck = Callable[[str, int, int], None]

#: The most memory a workload may take unless told otherwise (token ids at
#: 4 bytes, and about BYTES_PER_REQUEST a request): 4 GiB, seven times the
#: bundled Mooncake trace.  A replay needs about as much again.
DEFAULT_MAX_BYTES = 4 << 30

#: What one request costs besides its token ids (the SimRequest, its arrays'
#: headers, its rid), measured at about 0.9 KiB.
BYTES_PER_REQUEST = 1024


class WorkloadError(ValueError):
    """A workload cannot be built from the given parameters or file."""


class TraceFormatError(WorkloadError):
    """A trace file has a malformed record; the message names file and line."""

    def __init__(self, path: str, lineno: int, reason: str) -> None:
        super().__init__(f"{path}:{lineno}: {reason}")
        self.path = path
        self.lineno = lineno
        self.reason = reason


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def workload_bytes(tokens: int, requests: int) -> int:
    """The memory a workload of ``tokens`` token ids and ``requests`` requests takes."""
    return 4 * int(tokens) + BYTES_PER_REQUEST * int(requests)


def _check_size(what: str, tokens: int, requests: int, max_bytes: Optional[int]) -> None:
    """WorkloadError when a workload of this size would take more than max_bytes."""
    if max_bytes is None:
        return
    need = workload_bytes(tokens, requests)
    if need > max_bytes:
        raise WorkloadError(
            f"{what} would take about {format_bytes(need)} ({tokens:,} token ids, {requests:,} "
            f"requests), more than the limit of {format_bytes(max_bytes)} (max_bytes; "
            f"--max-workload-mem on the command line)")


def _check_int(name: str, value: Any, lo: int, hi: Optional[int] = None) -> None:
    """TypeError unless value is an integer (a bool is not; numpy's are),
    WorkloadError unless it lies in [lo, hi]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise WorkloadError(f"{name} must be an integer {bound}, got {value!r}")


def _check_real(name: str, value: Any, lo: float, hi: float = math.inf, *,
                above: bool = False, inf_ok: bool = False) -> None:
    """TypeError unless value is a real number (not a bool), WorkloadError
    unless it is finite (or +inf when inf_ok) and > lo (above) or >= lo, <= hi."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    ok = ((math.isfinite(value) or (inf_ok and value == math.inf))
          and (value > lo if above else value >= lo) and value <= hi)
    if not ok:
        bound = (f"in [{lo:g}, {hi:g}]" if hi != math.inf
                 else f"{'>' if above else '>='} {lo:g}" + (" (or inf)" if inf_ok else ""))
        raise WorkloadError(f"{name} must be a {'number' if inf_ok else 'finite number'} "
                            f"{bound}, got {value!r}")


def _check_positive(**values: Any) -> None:
    for name, value in values.items():
        _check_int(name, value, 1)


def _check_common(range_ratio: Any, request_rate: Any, vocab_size: Any, seed: Any,
                  system_prompt_len: Any = 0) -> None:
    """The generators' shared arguments."""
    _check_int("system_prompt_len", system_prompt_len, 0)
    _check_ratio(range_ratio)
    if request_rate is not None:
        _check_real("request_rate", request_rate, 0.0, above=True, inf_ok=True)
    _check_vocab(vocab_size)
    _check_int("seed", seed, 0)


def _check_ratio(range_ratio: float) -> None:
    _check_real("range_ratio", range_ratio, 0.0, 1.0)


def _check_vocab(vocab_size: int) -> None:
    _check_int("vocab_size", vocab_size, 2, 2**31)


def _random_lens(rng: np.random.Generator, full: int, range_ratio: float, n: int) -> np.ndarray:
    """n lengths uniform in [max(1, floor(full * range_ratio)), full], as SGLang's
    benchmark datasets draw them (range_ratio 1 gives the fixed length)."""
    low = max(1, int(full * range_ratio))
    if low >= full:
        return np.full(n, full, dtype=np.int64)
    return rng.integers(low, full + 1, size=n, dtype=np.int64)


def _random_tokens(rng: np.random.Generator, n: int, vocab_size: int) -> np.ndarray:
    return rng.integers(0, vocab_size, size=int(n), dtype=np.int32)


def _arrivals(rng: np.random.Generator, n: int, request_rate: float) -> np.ndarray:
    """Poisson arrival times at request_rate req/s (all 0 for an infinite rate)."""
    if request_rate is None or math.isinf(request_rate):
        return np.zeros(n, dtype=np.float64)
    if not request_rate > 0:
        raise WorkloadError(f"request_rate must be > 0 (or inf), got {request_rate!r}")
    arrivals = np.cumsum(rng.exponential(1.0 / request_rate, size=n))
    if n and not math.isfinite(arrivals[-1]):
        raise WorkloadError(f"request_rate {request_rate!r} is too small: the arrivals overflow "
                            f"to inf seconds")
    return arrivals


# --------------------------------------------------------------------------
# generated shared prefix (SGLang bench_serving --dataset-name generated-shared-prefix)
# --------------------------------------------------------------------------


def generated_shared_prefix(
    num_groups: int = 64,
    prompts_per_group: int = 16,
    system_prompt_len: int = 2048,
    question_len: int = 128,
    output_len: int = 256,
    *,
    range_ratio: float = 1.0,
    group_distribution: str = "uniform",
    zipf_alpha: Optional[float] = None,
    ordered: bool = False,
    request_rate: float = math.inf,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    check_request: Optional[RequestCheck] = None,
    max_bytes: Optional[int] = DEFAULT_MAX_BYTES,
) -> list[SimRequest]:
    """SGLang's ``generated-shared-prefix`` workload with random token ids.

    Each of ``num_groups`` groups has one system prompt of ``system_prompt_len``
    tokens; ``num_groups * prompts_per_group`` requests are made, each the
    system prompt of its group followed by its own question of
    ``question_len`` tokens, decoding ``output_len`` tokens.  The defaults are
    SGLang's (64 x 16, 2048 + 128 tokens, 256 out).

    range_ratio < 1 draws every length uniformly in
    ``[length * range_ratio, length]``.  ``group_distribution="zipf"`` draws
    each request's group with probability proportional to
    ``1 / rank ** zipf_alpha`` (group 0 the hottest) instead of giving every
    group exactly ``prompts_per_group`` requests.  The requests are shuffled
    unless ``ordered`` (a bool); ``request_rate`` spaces them as a Poisson process.

    rid is ``"gsp-<group>-<index>"`` and ``session`` the group (``"g<group>"``).
    check_request and max_bytes: see the module docstring.
    """
    _check_positive(num_groups=num_groups, prompts_per_group=prompts_per_group,
                    system_prompt_len=system_prompt_len, question_len=question_len,
                    output_len=output_len)
    _check_common(range_ratio, request_rate, vocab_size, seed)
    if not isinstance(ordered, (bool, np.bool_)):
        raise TypeError(f"ordered must be True or False, got {ordered!r}")
    if group_distribution not in ("uniform", "zipf"):
        raise WorkloadError(
            f"group_distribution must be 'uniform' or 'zipf', got {group_distribution!r}")
    if zipf_alpha is not None:
        if group_distribution != "zipf":
            raise WorkloadError(f"zipf_alpha applies with group_distribution='zipf' only, got "
                                f"zipf_alpha={zipf_alpha!r} with {group_distribution!r}")
        _check_real("zipf_alpha", zipf_alpha, 0.0, above=True)
    elif group_distribution == "zipf":
        zipf_alpha = 1.0

    total = num_groups * prompts_per_group
    # system prompts, questions, and each request's prompt (at most)
    _check_size("the generated-shared-prefix workload",
                num_groups * system_prompt_len + total * (system_prompt_len + 2 * question_len),
                total, max_bytes)
    rng = np.random.default_rng(seed)
    sys_lens = _random_lens(rng, system_prompt_len, range_ratio, num_groups)
    q_lens = _random_lens(rng, question_len, range_ratio, total)
    out_lens = _random_lens(rng, output_len, range_ratio, total)
    if group_distribution == "uniform":
        groups = np.repeat(np.arange(num_groups), prompts_per_group)
    else:
        # A separate generator, so the token pool is the same as in uniform mode.
        groups = np.random.default_rng([seed, 1]).choice(
            num_groups, size=total, replace=True, p=_zipf_probs(num_groups, zipf_alpha))
    if check_request is not None:
        for slot in range(total):
            g = int(groups[slot])
            check_request(f"gsp-{g}-{slot}", int(sys_lens[g] + q_lens[slot]), int(out_lens[slot]))
    system_prompts = [_random_tokens(rng, n, vocab_size) for n in sys_lens]
    questions = _random_tokens(rng, int(q_lens.sum()), vocab_size)
    q_offsets = np.concatenate(([0], np.cumsum(q_lens)))

    order = np.arange(total) if ordered else rng.permutation(total)
    arrivals = _arrivals(rng, total, request_rate)
    requests = []
    for pos, slot in enumerate(order):
        g = int(groups[slot])
        question = questions[q_offsets[slot]:q_offsets[slot + 1]]
        requests.append(SimRequest(
            rid=f"gsp-{g}-{slot}",
            input_ids=np.concatenate((system_prompts[g], question)),
            output_len=int(out_lens[slot]),
            arrival=float(arrivals[pos]),
            session=f"g{g}",
        ))
    return requests


# --------------------------------------------------------------------------
# multi-turn chat (SGLang benchmark/hicache/bench_multiturn.py)
# --------------------------------------------------------------------------


def multi_turn(
    num_clients: int = 256,
    num_rounds: int = 5,
    request_length: int = 512,
    output_length: int = 64,
    *,
    system_prompt_len: int = 0,
    range_ratio: float = 1.0,
    request_rate: float = 16.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    check_request: Optional[RequestCheck] = None,
    max_bytes: Optional[int] = DEFAULT_MAX_BYTES,
) -> list[SimRequest]:
    """Multi-turn conversations as SGLang's ``bench_multiturn.py`` makes them.

    ``num_clients`` clients each hold a conversation of ``num_rounds`` turns.
    Turn 0's prompt is an optional system prompt shared by all clients
    (``system_prompt_len`` tokens; 0 for none, as in SGLang) followed by a
    ``request_length``-token user message; turn r's prompt is turn r-1's
    prompt, turn r-1's output (``output_length`` tokens, fixed in
    ``output_ids`` so the replay decodes exactly them) and a new user message.

    Requests come round by round, the clients in the same order every round,
    so one client's consecutive turns are ``num_clients`` requests apart (as
    in the benchmark, where a client re-queues when its answer arrives).
    Arrivals are a Poisson process at ``request_rate`` req/s (inf: all at 0).
    The defaults are the benchmark's (256 clients, 5 rounds, 512 / 64).

    rid is ``"mt-<client>-<turn>"``, ``session`` ``"c<client>"``, ``turn`` the round.
    check_request and max_bytes: see the module docstring.
    """
    _check_positive(num_clients=num_clients, num_rounds=num_rounds,
                    request_length=request_length, output_length=output_length)
    _check_common(range_ratio, request_rate, vocab_size, seed, system_prompt_len)
    # a client's prompts (turn r: system + r + 1 messages + r answers) and answers, at most
    R = num_rounds
    per_client = (R * system_prompt_len + request_length * R * (R + 1) // 2
                  + output_length * R * (R - 1) // 2 + R * output_length)
    _check_size("the multi-turn workload", num_clients * per_client, num_clients * R, max_bytes)
    rng = np.random.default_rng(seed)
    system = _random_tokens(rng, system_prompt_len, vocab_size)
    histories: list[np.ndarray] = [system] * num_clients
    arrivals = _arrivals(rng, num_clients * num_rounds, request_rate)
    requests = []
    for r in range(num_rounds):
        msg_lens = _random_lens(rng, request_length, range_ratio, num_clients)
        out_lens = _random_lens(rng, output_length, range_ratio, num_clients)
        for c in range(num_clients):
            if check_request is not None:
                check_request(f"mt-{c}-{r}", len(histories[c]) + int(msg_lens[c]), int(out_lens[c]))
            prompt = np.concatenate((histories[c], _random_tokens(rng, msg_lens[c], vocab_size)))
            output = _random_tokens(rng, out_lens[c], vocab_size)
            requests.append(SimRequest(
                rid=f"mt-{c}-{r}",
                input_ids=prompt,
                output_len=int(out_lens[c]),
                arrival=float(arrivals[r * num_clients + c]),
                session=f"c{c}",
                turn=r,
                output_ids=output,
            ))
            histories[c] = np.concatenate((prompt, output))
    return requests


# --------------------------------------------------------------------------
# agentic branching
# --------------------------------------------------------------------------


def agentic_branching(
    num_trees: int = 8,
    depth: int = 4,
    branching: int = 3,
    system_prompt_len: int = 2048,
    task_len: int = 256,
    step_len: int = 128,
    output_len: int = 64,
    *,
    range_ratio: float = 1.0,
    request_rate: float = math.inf,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    check_request: Optional[RequestCheck] = None,
    max_bytes: Optional[int] = DEFAULT_MAX_BYTES,
) -> list[SimRequest]:
    """Trees of agent trajectories that fork from shared histories.

    Every tree (one agent task) starts with a request whose prompt is a system
    prompt shared by all trees (``system_prompt_len`` tokens) and the task's own
    description (``task_len``).  Each request decodes ``output_len`` tokens
    (fixed in ``output_ids``); it then has ``branching`` children, whose
    prompts are the parent's prompt, the parent's output and a child-specific
    observation of ``step_len`` tokens (a tool result, a sampled plan): the
    children share the whole parent trajectory and diverge after it.  Trees
    are ``depth`` levels deep, so each holds ``sum(branching**d for d < depth)``
    requests.

    Requests come level by level (all roots, then all children, ...), trees
    interleaved, so every parent precedes its children.  rid is
    ``"ag-<tree>-<path>"`` (path: child indices joined by "."), ``session`` is
    ``"t<tree>"`` and ``turn`` the level.  check_request and max_bytes: see
    the module docstring.
    """
    _check_positive(num_trees=num_trees, depth=depth, branching=branching,
                    task_len=task_len, step_len=step_len, output_len=output_len)
    _check_common(range_ratio, request_rate, vocab_size, seed, system_prompt_len)
    _check_agentic_size(num_trees, depth, branching, system_prompt_len + task_len,
                        step_len + output_len, output_len, max_bytes)
    rng = np.random.default_rng(seed)
    system = _random_tokens(rng, system_prompt_len, vocab_size)
    # (tree, path, context before this request's new tokens, new tokens)
    level: list[tuple[int, str, np.ndarray, np.ndarray]] = [
        (t, "0", system, _random_tokens(rng, _random_lens(rng, task_len, range_ratio, 1)[0],
                                         vocab_size))
        for t in range(num_trees)
    ]
    requests: list[SimRequest] = []
    for d in range(depth):
        next_level = []
        for tree, path, context, new in level:
            n_out = int(_random_lens(rng, output_len, range_ratio, 1)[0])
            if check_request is not None:
                check_request(f"ag-{tree}-{path}", len(context) + len(new), n_out)
            prompt = np.concatenate((context, new))
            output = _random_tokens(rng, n_out, vocab_size)
            requests.append(SimRequest(
                rid=f"ag-{tree}-{path}", input_ids=prompt, output_len=n_out,
                session=f"t{tree}", turn=d, output_ids=output))
            if d + 1 < depth:
                history = np.concatenate((prompt, output))
                lens = _random_lens(rng, step_len, range_ratio, branching)
                for k in range(branching):
                    next_level.append((tree, f"{path}.{k}", history,
                                       _random_tokens(rng, lens[k], vocab_size)))
        level = next_level
    arrivals = _arrivals(rng, len(requests), request_rate)
    for req, t in zip(requests, arrivals):
        req.arrival = float(t)
    return requests


def _check_agentic_size(trees: int, depth: int, branching: int, root: int, step: int,
                        out: int, max_bytes: Optional[int]) -> None:
    """_check_size for agentic_branching: level d holds trees * branching**d
    requests, each a prompt of root + d * step tokens and its output, and (but
    the last level) the history its children share.  Summed level by level,
    stopping at the first level past the limit (branching**depth can be
    astronomical)."""
    if max_bytes is None:
        return
    tokens = requests = 0
    n = trees
    for d in range(depth):
        requests += n
        tokens += n * (2 if d + 1 < depth else 1) * (root + d * step + out)
        if workload_bytes(tokens, requests) > max_bytes:
            raise WorkloadError(
                f"the agentic workload would take more than the limit of "
                f"{format_bytes(max_bytes)} (max_bytes; --max-workload-mem on the command line): "
                f"its first {d + 1} of {depth:,} levels alone hold {requests:,} requests and "
                f"{tokens:,} token ids")
        n *= branching


# --------------------------------------------------------------------------
# session workloads: agent sessions, RAG, multi-tenant chat, long documents
# --------------------------------------------------------------------------

#: A length parameter: a fixed int, or (lo, hi), drawn uniformly in [lo, hi].
LengthRange = Union[int, "tuple[int, int]"]

#: The longest time parameter (a think time or step gap, seconds): 10**9 s,
#: about 32 years, so arrival times stay finite however many add up.
MAX_SECONDS = 1e9


def _check_range(name: str, value: Any, lo: int) -> tuple[int, int]:
    """(lo, hi) from an int or a pair of ints; TypeError / WorkloadError
    unless every bound is an integer >= lo and the pair is ordered."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise WorkloadError(f"{name} must be an integer or a pair (lo, hi), got {value!r}")
        a, b = value
        _check_int(f"{name}[0]", a, lo)
        _check_int(f"{name}[1]", b, lo)
        if a > b:
            raise WorkloadError(f"{name} must be a pair (lo, hi) with lo <= hi, got {value!r}")
        return int(a), int(b)
    _check_int(name, value, lo)
    return int(value), int(value)


def _check_seconds(name: str, value: Any) -> None:
    _check_real(name, value, 0.0, MAX_SECONDS)


def _check_rate(name: str, value: Any) -> None:
    _check_real(name, value, 1.0 / MAX_SECONDS, above=True)


def _check_followups(followup_prob: Any, max_turns: Any) -> None:
    _check_real("followup_prob", followup_prob, 0.0, 1.0)
    _check_int("max_turns", max_turns, 1)


def _check_timing(rate_name: str, rate: Any, think_time: Any, vocab_size: Any, seed: Any) -> None:
    """The session generators' shared arguments: an arrival rate (per
    second), a mean think time (seconds), the vocabulary and the seed."""
    _check_rate(rate_name, rate)
    _check_seconds("think_time", think_time)
    _check_vocab(vocab_size)
    _check_int("seed", seed, 0)


def _draw(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    """A length uniform in [lo, hi]."""
    return int(rng.integers(bounds[0], bounds[1] + 1))


def _gap(rng: np.random.Generator, mean: float, shape: float = 2.0) -> float:
    """A think time or step gap: Gamma-distributed with the given mean and
    shape (2: rarely near 0, sometimes several times the mean)."""
    return float(rng.gamma(shape, mean / shape)) if mean > 0 else 0.0


def _zipf_probs(n: int, alpha: float) -> np.ndarray:
    """Probabilities proportional to 1 / rank ** alpha, rank 1 (index 0) first."""
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** alpha
    return weights / weights.sum()


def _followup_turns(rng: np.random.Generator, prob: float, max_turns: int) -> int:
    """1 + the follow-ups: each further turn comes with probability prob, up
    to max_turns turns in all."""
    turns = 1
    while turns < max_turns and rng.random() < prob:
        turns += 1
    return turns


class _Plan:
    """A workload planned as segments of token ids (a system prompt, a
    document, a tool result, an answer): every request is a list of segments
    and one output segment.  Lengths come first, so every request is checked
    and the whole workload sized before any token is drawn; then each segment
    gets its own random tokens, and a prompt that lists a segment holds
    exactly those tokens (shared prefixes are shared segments)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.lens: list[int] = []
        # rid, prompt segments, output segment, arrival, session, turn
        self.reqs: list[tuple[str, tuple[int, ...], int, float, str, int]] = []

    def segment(self, n: int) -> int:
        """A new segment of n tokens (its id)."""
        self.lens.append(int(n))
        return len(self.lens) - 1

    def request(self, rid: str, parts: Sequence[int], output_len: int, arrival: float,
                session: str, turn: int) -> int:
        """Add a request; returns its output segment (for the next turn's history)."""
        out = self.segment(output_len)
        self.reqs.append((rid, tuple(parts), out, float(arrival), session, turn))
        return out

    def chat(self, rng: np.random.Generator, rid: str, session: str, parts: list[int],
             turns: int, message_len: tuple[int, int], output_len: tuple[int, int], start: float,
             think_time: float) -> None:
        """A conversation of turns after the prefix parts: each turn's prompt
        is the prefix, every earlier message and answer, and a new message;
        turn k + 1 arrives a think time after turn k."""
        t = start
        for turn in range(turns):
            parts = parts + [self.segment(_draw(rng, message_len))]
            out = self.request(f"{rid}-{turn}", parts, _draw(rng, output_len), t, session, turn)
            parts = parts + [out]
            t += _gap(rng, think_time)

    def build(self, rng: np.random.Generator, vocab_size: int,
              check_request: Optional[RequestCheck], max_bytes: Optional[int]) -> list[SimRequest]:
        """The requests in arrival order (ties keep planning order)."""
        lens = self.lens
        order = sorted(range(len(self.reqs)), key=lambda i: self.reqs[i][3])
        prompt_lens = [sum(lens[p] for p in parts) for _, parts, _, _, _, _ in self.reqs]
        last = max((r[3] for r in self.reqs), default=0.0)
        if not math.isfinite(last):
            raise WorkloadError(f"{self.what}: the arrival times overflow to inf seconds")
        if check_request is not None:
            for i in order:
                rid, _, out, _, _, _ = self.reqs[i]
                check_request(rid, prompt_lens[i], lens[out])
        _check_size(self.what, sum(prompt_lens) + sum(lens), len(self.reqs), max_bytes)
        tokens = _random_tokens(rng, sum(lens), vocab_size)
        starts = np.concatenate(([0], np.cumsum(lens, dtype=np.int64)))
        segs = [tokens[starts[k]:starts[k + 1]] for k in range(len(lens))]
        requests = []
        for i in order:
            rid, parts, out, arrival, session, turn = self.reqs[i]
            requests.append(SimRequest(
                rid=rid, input_ids=np.concatenate([segs[p] for p in parts]),
                output_len=lens[out], arrival=arrival, session=session, turn=turn,
                output_ids=segs[out]))
        return requests


def agent_sessions(
    num_tasks: int = 48,
    active: int = 12,
    steps: LengthRange = (6, 24),
    system_prompt_len: int = 3000,
    task_len: LengthRange = (400, 2000),
    tool_len: LengthRange = (80, 2500),
    output_len: LengthRange = (60, 400),
    *,
    backtrack_prob: float = 0.15,
    backtrack_after: int = 3,
    max_backtrack: int = 3,
    step_gap: float = 10.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    check_request: Optional[RequestCheck] = None,
    max_bytes: Optional[int] = DEFAULT_MAX_BYTES,
) -> list[SimRequest]:
    """Agent sessions whose tool steps sometimes back up and retry.

    ``num_tasks`` tasks share one system prompt (``system_prompt_len``
    tokens); each has its own description (``task_len``) and ``steps``
    steps, one request each.  A step's prompt is the task's history (system
    prompt, description, then every kept step's tool result and output) plus
    a new tool result (``tool_len``); it decodes ``output_len`` tokens (fixed
    in ``output_ids``) and is kept in the history.  From step
    ``backtrack_after`` on (0-based: after that many steps), a step backs up
    with probability ``backtrack_prob``: it drops the last b kept steps (b
    uniform in [1, min(max_backtrack, kept steps)]) and retries from there,
    so its prompt is the history up to that earlier step plus a new tool
    result -- it shares the prefix of an earlier step, not of the latest.
    Lengths given as (lo, hi) are drawn uniformly in [lo, hi].

    Time: ``active`` tasks run at once; each starts when an earlier one ends
    (the first ``active`` within one gap of 0), and its steps come
    ``step_gap`` seconds apart on average (Gamma, shape 4), so the arrival
    order interleaves the running tasks.  The defaults (48 tasks, about 700
    requests, 10M prompt tokens) stress states in the middle of a long
    history: a retried step needs the state where an older step ended.

    rid is ``"agent-<task>-<step>"``, ``session`` ``"task<task>"``, ``turn``
    the step.  check_request and max_bytes: see the module docstring.
    """
    _check_int("num_tasks", num_tasks, 1)
    _check_int("active", active, 1)
    steps_r = _check_range("steps", steps, 1)
    _check_int("system_prompt_len", system_prompt_len, 0)
    task_r = _check_range("task_len", task_len, 1)
    tool_r = _check_range("tool_len", tool_len, 1)
    out_r = _check_range("output_len", output_len, 1)
    _check_real("backtrack_prob", backtrack_prob, 0.0, 1.0)
    _check_int("backtrack_after", backtrack_after, 1)
    _check_int("max_backtrack", max_backtrack, 1)
    _check_seconds("step_gap", step_gap)
    _check_vocab(vocab_size)
    _check_int("seed", seed, 0)
    what = "the agent workload"
    fewest = num_tasks * steps_r[0]
    # a lower bound (fewest requests, shortest segments) before planning
    _check_size(what, fewest * (system_prompt_len + task_r[0] + tool_r[0] + out_r[0]), fewest,
                 max_bytes)
    rng = np.random.default_rng(seed)
    plan = _Plan(what)
    system = [plan.segment(system_prompt_len)] if system_prompt_len else []
    slots = [(float(rng.uniform(0.0, step_gap)), s) for s in range(active)]
    heapq.heapify(slots)
    for task in range(num_tasks):
        t, slot = heapq.heappop(slots)
        prefix = system + [plan.segment(_draw(rng, task_r))]
        kept: list[tuple[int, int]] = []          # (tool result, output) of the kept steps
        for step in range(_draw(rng, steps_r)):
            if step >= backtrack_after and kept and rng.random() < backtrack_prob:
                back = int(rng.integers(1, min(max_backtrack, len(kept)) + 1))
                del kept[-back:]
            tool = plan.segment(_draw(rng, tool_r))
            parts = prefix + [seg for pair in kept for seg in pair] + [tool]
            out = plan.request(f"agent-{task}-{step}", parts, _draw(rng, out_r), t,
                               f"task{task}", step)
            kept.append((tool, out))
            t += _gap(rng, step_gap, 4.0)
        heapq.heappush(slots, (t, slot))
    return plan.build(rng, vocab_size, check_request, max_bytes)


def rag_queries(
    num_docs: int = 200,
    doc_len: LengthRange = (300, 2000),
    docs_per_query: int = 5,
    num_queries: int = 400,
    instruction_len: int = 600,
    question_len: LengthRange = (20, 120),
    output_len: LengthRange = (50, 300),
    *,
    zipf_alpha: float = 1.0,
    followup_prob: float = 0.3,
    max_turns: int = 3,
    query_rate: float = 2.0,
    think_time: float = 20.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    check_request: Optional[RequestCheck] = None,
    max_bytes: Optional[int] = DEFAULT_MAX_BYTES,
) -> list[SimRequest]:
    """Retrieval-augmented queries over one shared set of documents.

    A corpus of ``num_docs`` documents (``doc_len`` tokens each).  Each of
    ``num_queries`` queries retrieves ``docs_per_query`` distinct documents,
    drawn with Zipf popularity (document i with probability proportional to
    ``1 / (i + 1) ** zipf_alpha``) and put in a random order of their own;
    its prompt is an instruction prefix shared by all queries
    (``instruction_len``), the documents, and a question (``question_len``).
    A query goes on to a follow-up turn with probability ``followup_prob``
    (again after each, up to ``max_turns`` turns): its prompt is the previous
    prompt, the answer (``output_len``, fixed in ``output_ids``) and a new
    question.  Queries arrive as a Poisson process at ``query_rate`` per
    second; a follow-up comes ``think_time`` seconds after its turn on average
    (Gamma, shape 2).

    Popular documents recur, but rarely at the same place in a prompt: past
    the instruction, two queries share a prefix only when they begin with the
    same document, and the KV of a document cannot be reused after a
    different one.  rid is ``"rag-<query>-<turn>"``, ``session``
    ``"q<query>"``.  check_request and max_bytes: see the module docstring.
    """
    _check_int("num_docs", num_docs, 1)
    doc_r = _check_range("doc_len", doc_len, 1)
    _check_int("docs_per_query", docs_per_query, 1)
    if docs_per_query > num_docs:
        raise WorkloadError(f"docs_per_query ({docs_per_query}) must be at most num_docs "
                            f"({num_docs}): a query retrieves distinct documents")
    _check_int("num_queries", num_queries, 1)
    _check_int("instruction_len", instruction_len, 0)
    q_r = _check_range("question_len", question_len, 1)
    out_r = _check_range("output_len", output_len, 1)
    _check_real("zipf_alpha", zipf_alpha, 0.0)
    _check_followups(followup_prob, max_turns)
    _check_timing("query_rate", query_rate, think_time, vocab_size, seed)
    what = "the rag workload"
    # a lower bound (fewest requests, shortest segments) before planning
    _check_size(what, num_docs * doc_r[0] + num_queries * (
        instruction_len + docs_per_query * doc_r[0] + 2 * q_r[0] + out_r[0]), num_queries,
        max_bytes)
    rng = np.random.default_rng(seed)
    plan = _Plan(what)
    instruction = [plan.segment(instruction_len)] if instruction_len else []
    docs = [plan.segment(_draw(rng, doc_r)) for _ in range(num_docs)]
    probs = _zipf_probs(num_docs, zipf_alpha)
    arrivals = np.cumsum(rng.exponential(1.0 / query_rate, size=num_queries))
    for q in range(num_queries):
        picked = rng.choice(num_docs, size=docs_per_query, replace=False, p=probs)
        rng.shuffle(picked)
        plan.chat(rng, f"rag-{q}", f"q{q}", instruction + [docs[d] for d in picked],
                  _followup_turns(rng, followup_prob, max_turns), q_r, out_r,
                  float(arrivals[q]), think_time)
    return plan.build(rng, vocab_size, check_request, max_bytes)


def multi_tenant(
    num_tenants: int = 12,
    num_sessions: int = 400,
    system_prompt_len: LengthRange = (500, 4000),
    turns: LengthRange = (1, 8),
    message_len: LengthRange = (30, 600),
    output_len: LengthRange = (50, 400),
    *,
    zipf_alpha: float = 1.0,
    session_rate: float = 1.0,
    think_time: float = 30.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    check_request: Optional[RequestCheck] = None,
    max_bytes: Optional[int] = DEFAULT_MAX_BYTES,
) -> list[SimRequest]:
    """Chat sessions of several tenants, each with its own system prompt.

    ``num_tenants`` system prompts (``system_prompt_len`` tokens each);
    ``num_sessions`` sessions, each of one tenant drawn with Zipf popularity
    (tenant i with probability proportional to ``1 / (i + 1) ** zipf_alpha``)
    and of ``turns`` turns.  A turn's prompt is the tenant's system prompt,
    the session's earlier messages and answers, and a new message
    (``message_len``); the answer (``output_len``) is fixed in
    ``output_ids``.  Sessions start as a Poisson process at ``session_rate``
    per second, and a session's next turn comes a think time after its last
    (mean ``think_time`` seconds, Gamma with shape 2), so the turns of many
    sessions interleave: a session's state has to survive the other
    sessions' turns in between, and a hot tenant's prefix competes with many
    conversations.

    rid is ``"tn-<tenant>-<session>-<turn>"``, ``session`` ``"s<session>"``.
    check_request and max_bytes: see the module docstring.
    """
    _check_int("num_tenants", num_tenants, 1)
    _check_int("num_sessions", num_sessions, 1)
    sys_r = _check_range("system_prompt_len", system_prompt_len, 1)
    turns_r = _check_range("turns", turns, 1)
    msg_r = _check_range("message_len", message_len, 1)
    out_r = _check_range("output_len", output_len, 1)
    _check_real("zipf_alpha", zipf_alpha, 0.0)
    _check_timing("session_rate", session_rate, think_time, vocab_size, seed)
    what = "the tenants workload"
    fewest = num_sessions * turns_r[0]
    # a lower bound (fewest requests, shortest segments) before planning
    _check_size(what, num_tenants * sys_r[0] + fewest * (sys_r[0] + msg_r[0] + out_r[0]),
                 fewest, max_bytes)
    rng = np.random.default_rng(seed)
    plan = _Plan(what)
    prompts = [plan.segment(_draw(rng, sys_r)) for _ in range(num_tenants)]
    tenants = rng.choice(num_tenants, size=num_sessions, p=_zipf_probs(num_tenants, zipf_alpha))
    starts = np.cumsum(rng.exponential(1.0 / session_rate, size=num_sessions))
    for s in range(num_sessions):
        tenant = int(tenants[s])
        plan.chat(rng, f"tn-{tenant}-{s}", f"s{s}", [prompts[tenant]], _draw(rng, turns_r),
                  msg_r, out_r, float(starts[s]), think_time)
    return plan.build(rng, vocab_size, check_request, max_bytes)


def long_document_qa(
    num_docs: int = 8,
    doc_len: LengthRange = (8000, 32000),
    questions_per_doc: int = 10,
    system_prompt_len: int = 256,
    question_len: LengthRange = (20, 200),
    output_len: LengthRange = (50, 500),
    *,
    followup_prob: float = 0.4,
    max_turns: int = 3,
    question_rate: float = 0.2,
    think_time: float = 30.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    check_request: Optional[RequestCheck] = None,
    max_bytes: Optional[int] = DEFAULT_MAX_BYTES,
) -> list[SimRequest]:
    """Questions about a few long documents, spread over time.

    ``num_docs`` documents of ``doc_len`` tokens, each asked
    ``questions_per_doc`` questions.  A question's prompt is a system prompt
    shared by all (``system_prompt_len``), its document and the question
    (``question_len``).  The questions of all documents come in a random
    order, as a Poisson process at ``question_rate`` per second; each goes on
    to a follow-up turn with probability ``followup_prob`` (again after each,
    up to ``max_turns`` turns), a think time later (mean ``think_time``
    seconds, Gamma with shape 2), whose prompt is the previous prompt, the
    answer (``output_len``, fixed in ``output_ids``) and a new question.

    Every question re-reads its whole document, so what a question reuses
    is set by the last state before the document's end that the cache kept
    (where an earlier prompt ended or a prefill chunk did) and by whether it
    survived the minutes since the document was last asked about.  rid is
    ``"ld-<doc>-<question>-<turn>"``, ``session`` ``"d<doc>q<question>"``.
    check_request and max_bytes: see the module docstring.
    """
    _check_int("num_docs", num_docs, 1)
    doc_r = _check_range("doc_len", doc_len, 1)
    _check_int("questions_per_doc", questions_per_doc, 1)
    _check_int("system_prompt_len", system_prompt_len, 0)
    q_r = _check_range("question_len", question_len, 1)
    out_r = _check_range("output_len", output_len, 1)
    _check_followups(followup_prob, max_turns)
    _check_timing("question_rate", question_rate, think_time, vocab_size, seed)
    what = "the longdoc workload"
    fewest = num_docs * questions_per_doc
    # a lower bound (fewest requests, shortest segments) before planning
    _check_size(what, num_docs * doc_r[0] + fewest * (
        system_prompt_len + doc_r[0] + 2 * q_r[0] + out_r[0]), fewest, max_bytes)
    rng = np.random.default_rng(seed)
    plan = _Plan(what)
    system = [plan.segment(system_prompt_len)] if system_prompt_len else []
    docs = [plan.segment(_draw(rng, doc_r)) for _ in range(num_docs)]
    asked = rng.permutation(np.repeat(np.arange(num_docs), questions_per_doc))
    arrivals = np.cumsum(rng.exponential(1.0 / question_rate, size=len(asked)))
    count = [0] * num_docs
    for i, d in enumerate(asked):
        d = int(d)
        q, count[d] = count[d], count[d] + 1
        plan.chat(rng, f"ld-{d}-{q}", f"d{d}q{q}", system + [docs[d]],
                  _followup_turns(rng, followup_prob, max_turns), q_r, out_r,
                  float(arrivals[i]), think_time)
    return plan.build(rng, vocab_size, check_request, max_bytes)


# --------------------------------------------------------------------------
# trace files
# --------------------------------------------------------------------------


def _open_bytes(path: PathLike) -> IO[bytes]:
    """Open a JSONL file for reading, gunzipping it when it is gzip'd."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            magic = f.read(2)
    except OSError as e:
        raise WorkloadError(f"cannot read trace {path}: {e.strerror or e}") from None
    if magic == b"\x1f\x8b":
        return gzip.open(p, "rb")
    return open(p, "rb")


def _max_line(max_bytes: Optional[int]) -> Optional[int]:
    """The longest trace line read: parsing a line of JSON numbers takes up to
    about 8 bytes per byte of text (a list slot and an int each, then the
    array), so lines are kept to max_bytes / 8."""
    return None if max_bytes is None else max(max_bytes // 8, 1 << 20)


def _records(path: PathLike, max_line: Optional[int] = _max_line(DEFAULT_MAX_BYTES)
             ) -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line; malformed JSON and a
    line longer than max_line bytes raise."""
    name = str(path)
    with _open_bytes(path) as f:
        try:
            lineno = 0
            while True:
                raw = f.readline(-1 if max_line is None else max_line + 2)
                if not raw:
                    break
                lineno += 1
                if max_line is not None and len(raw.rstrip(b"\r\n")) > max_line:
                    raise TraceFormatError(name, lineno, f"the line is longer than {max_line:,} "
                                                         f"bytes, an eighth of the workload's memory "
                                                         f"limit (max_bytes, --max-workload-mem)")
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise TraceFormatError(name, lineno, f"not UTF-8 text (byte {e.start + 1} "
                                                         f"of the line; a binary file?)") from None
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise TraceFormatError(name, lineno, f"not valid JSON ({e.msg})") from None
                except (ValueError, RecursionError) as e:   # a 5000-digit number, deep nesting
                    raise TraceFormatError(name, lineno, f"not valid JSON ({e})") from None
                if not isinstance(obj, dict):
                    raise TraceFormatError(name, lineno,
                                           f"expected a JSON object, got {type(obj).__name__}")
                yield lineno, obj
        except (EOFError, gzip.BadGzipFile, OSError, zlib.error) as e:
            raise WorkloadError(f"cannot read trace {name}: {e}") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v))


def _mix32(x: np.ndarray) -> np.ndarray:
    """A bijective 32-bit integer mixer (xorshift-multiply rounds) of a uint32
    array: distinct inputs give distinct outputs."""
    x = x.astype(np.uint32, copy=True)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


#: The longest hash block expand_hash_blocks makes (Mooncake's are 512 tokens).
MAX_BLOCK_SIZE = 1 << 20


def _check_block_size(block_size: Any) -> None:
    _check_int("block_size", block_size, 1, MAX_BLOCK_SIZE)


def expand_hash_blocks(hash_ids: np.ndarray, block_size: int = MOONCAKE_BLOCK_SIZE,
                       vocab_size: int = DEFAULT_VOCAB_SIZE, seed: int = 0) -> np.ndarray:
    """Pseudo-token ids of hash-id blocks: an int32 array ``(len(hash_ids), block_size)``.

    Row i holds the tokens of block ``hash_ids[i]``; they depend only on the
    id, the position in the block, ``vocab_size`` and ``seed``.  Token
    ``(h, j)`` is the top bits of the 32-bit product ``a(h) * m(j)``, scaled
    into ``[0, vocab_size)``, where ``a`` is a bijective mix of the id (so
    different ids below 2**32 never share a whole block) and ``m(j)`` an odd
    per-position multiplier; two different ids agree at a given position with
    probability about ``1 / vocab_size``.  One pass over the output (in C), so the
    12k-request Mooncake trace (148M tokens) expands in a fraction of a second.
    """
    _check_block_size(block_size)
    _check_vocab(vocab_size)
    _check_int("seed", seed, 0)
    arr = np.asarray(hash_ids)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TypeError(f"hash_ids must be a 1-D array of integers, got dtype {arr.dtype} and "
                        f"shape {arr.shape}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 2**63 - 1):
        k = int(np.argmax((arr < 0) | (arr > 2**63 - 1)))
        raise WorkloadError(f"hash_ids[{k}] is {int(arr[k])}: hash ids must lie in [0, 2**63)")
    blocks = HashBlocks(arr, block_size, vocab_size, seed)
    out = np.empty((len(arr), block_size), dtype=np.int32)
    blocks.write(0, out.reshape(-1))
    return out


class HashBlocks:
    """The pseudo tokens of a sequence of hash-id blocks (the rule of
    :func:`expand_hash_blocks`), written on demand: ``write(first, out)``
    fills ``out`` with the tokens from block ``first`` on.  Keeps 4 bytes per
    block (its mixed id), not 4 per token.  Arguments are not checked here
    (expand_hash_blocks and load_mooncake check them)."""

    __slots__ = ("keys", "mults", "block_size", "vocab_size", "_distinct")

    def __init__(self, hash_ids: np.ndarray, block_size: int, vocab_size: int, seed: int) -> None:
        ids = np.asarray(hash_ids).astype(np.int64).view(np.uint64)
        folded = ((ids ^ (ids >> np.uint64(32))) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        self.keys = _mix32(folded + np.uint32((seed * 0x9E3779B9) & 0xFFFFFFFF))
        self.mults = _mix32(np.arange(block_size, dtype=np.uint32) + np.uint32(0x5BD1E995)
                            + np.uint32((seed * 0x85EBCA6B) & 0xFFFFFFFF)) | np.uint32(1)
        self.block_size = int(block_size)
        self.vocab_size = int(vocab_size)
        self._distinct: Optional[bool] = None

    def write(self, first: int, out: np.ndarray) -> None:
        """The tokens of blocks ``first``, ``first + 1``, ... into the int32
        array ``out`` (its length need not be a whole number of blocks): the
        multiply-high of :func:`expand_hash_blocks`, in one C pass
        (``_C.hash_blocks_write``)."""
        if out.flags.c_contiguous and out.dtype == np.int32 and out.ndim == 1:
            _C.hash_blocks_write(self.keys, self.mults, first, self.vocab_size, out)
        else:
            tmp = np.empty(out.size, dtype=np.int32)
            _C.hash_blocks_write(self.keys, self.mults, first, self.vocab_size, tmp)
            out[...] = tmp.reshape(out.shape)

    def rows_distinct(self) -> bool:
        """Whether blocks with different mixed ids always differ in some
        token, so that a block's id stands for its tokens (cached).

        Token j of id a lies in bucket floor(x * vocab / 2**32) of
        x = a * m(j) mod 2**32, so two ids a, a + d agree at j only when
        d * m(j) mod 2**32 lies within W = ceil(2**32 / vocab) of 0.  The
        d allowed at j = 0 are m(0)**-1 * e for |e| < W (m(0) is odd); the
        rows are distinct when none of them, d != 0, stays allowed at every
        position.  A vocabulary too small to enumerate them answers False."""
        got = self._distinct
        if got is None:
            got = self._distinct = self._check_rows_distinct()
        return got

    def _check_rows_distinct(self) -> bool:
        width = -(-(1 << 32) // self.vocab_size)
        if width > 1 << 22:
            return False
        mask = np.uint64(0xFFFFFFFF)
        m = self.mults.astype(np.uint64)
        inv = pow(int(m[0]), -1, 1 << 32)
        e = np.concatenate((np.arange(1, width, dtype=np.uint64),
                            np.uint64(1 << 32) - np.arange(1, width, dtype=np.uint64)))
        d = (e * np.uint64(inv)) & mask
        lo, hi = np.uint64(width), np.uint64((1 << 32) - width)
        for j in range(1, self.block_size):
            x = (d * m[j]) & mask
            d = d[(x < lo) | (x > hi)]
            if not d.size:
                return True
        return False


class HashBlockPrompt:
    """A prompt given as hash blocks: ``length`` tokens from block ``first``
    of ``blocks`` on (the last block cut)."""

    __slots__ = ("blocks", "first", "length")

    def __init__(self, blocks: HashBlocks, first: int, length: int) -> None:
        self.blocks = blocks
        self.first = int(first)
        self.length = int(length)


class HashBlockRequest(SimRequest):
    """A request whose prompt is kept as hash blocks (a Mooncake record):
    ``input_ids`` makes its int32 token array on each read, so a trace of
    145M prompt tokens holds 4 bytes a block instead of 4 a token.  Built
    with ``input_ids=HashBlockPrompt(...)``; assigning an array to
    ``input_ids`` makes it an ordinary prompt."""

    @property  # type: ignore[override]
    def input_ids(self) -> np.ndarray:
        src = self._prompt
        if not isinstance(src, HashBlockPrompt):
            return src
        out = np.empty(src.length, dtype=np.int32)
        src.blocks.write(src.first, out)
        return out

    @input_ids.setter
    def input_ids(self, value: Any) -> None:
        self._prompt = value

    @property
    def prompt_len(self) -> int:
        src = self._prompt
        return src.length if isinstance(src, HashBlockPrompt) else len(src)

    @property
    def generated_prompt(self) -> bool:
        return isinstance(self._prompt, HashBlockPrompt)

    def write_prompt(self, out: np.ndarray) -> None:
        src = self._prompt
        if isinstance(src, HashBlockPrompt):
            src.blocks.write(src.first, out)
        else:
            out[...] = src


def prefix_bounds(requests: Sequence[SimRequest]) -> Optional[list]:
    """For each request, a length that no other request's prompt shares
    with its tokens (prompt, then whatever follows it): ``LCP(tokens_i,
    prompt_j) < bounds[i]`` for every j != i, or None where there is no
    such bound.  None (no bounds at all) unless every request is a
    :class:`HashBlockRequest` over one :class:`HashBlocks` whose distinct
    blocks differ in some token (``rows_distinct``).

    Two prompts agree on their first c whole blocks (equal ids) and then
    either differ in block c, which lies in both (distinct blocks differ
    before its end), or one of them ends before block c does: so LCP <
    block_size * (c + 1) where c is the longest run of whole blocks i
    shares with any other request, unless i's whole blocks are all shared
    (no bound then).  The longest run is found between neighbours of the
    requests sorted by their whole blocks' ids.  The replay's record of
    every key seen stores a key only up to its bound: no later prompt can
    match past it."""
    srcs = [getattr(r, "_prompt", None) for r in requests]
    if not srcs or not all(isinstance(p, HashBlockPrompt) for p in srcs):
        return None
    blocks = srcs[0].blocks
    if any(p.blocks is not blocks for p in srcs) or not blocks.rows_distinct():
        return None
    bs = blocks.block_size
    keys = blocks.keys
    firsts = np.fromiter((p.first for p in srcs), dtype=np.int64, count=len(srcs))
    lens = np.fromiter((p.length // bs for p in srcs), dtype=np.int64, count=len(srcs))
    order = np.array(sorted(range(len(srcs)), key=lambda i: keys[firsts[i]:firsts[i] + lens[i]].tobytes()),
                     dtype=np.int64)
    # each neighbour pair (a, b) in that order: its common run c, the first
    # block where they differ (or the shorter length), all pairs in one pass
    a, b = order[:-1], order[1:]
    n = np.minimum(lens[a], lens[b])
    pair = np.repeat(np.arange(len(a)), n)
    at = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    differs = keys[firsts[a][pair] + at] != keys[firsts[b][pair] + at]
    c = n.copy()
    hit = pair[differs]
    np.minimum.at(c, hit, at[differs])
    shared = np.zeros(len(srcs), dtype=np.int64)
    np.maximum.at(shared, a, c)
    np.maximum.at(shared, b, c)
    return [bs * (int(k) + 1) if k < m else None for k, m in zip(shared.tolist(), lens.tolist())]


def load_mooncake(
    path: PathLike,
    *,
    limit: Optional[int] = None,
    block_size: int = MOONCAKE_BLOCK_SIZE,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    time_scale: float = 1e-3,
    seed: int = 0,
    check_request: Optional[RequestCheck] = None,
    max_bytes: Optional[int] = DEFAULT_MAX_BYTES,
) -> list[SimRequest]:
    """Read a Mooncake-format trace and expand it into token-level requests.

    ``limit`` keeps the first N records.  Arrival = ``timestamp * time_scale``
    (the traces give milliseconds).  An ``output_length`` of 0 (a prefill-only
    request) is refused: every replayed request decodes at least one token.
    Each hash id becomes ``block_size`` pseudo-tokens
    (:func:`expand_hash_blocks`); the last block is cut so the prompt has
    exactly ``input_length`` tokens, which must lie in
    ``((len(hash_ids) - 1) * block_size, len(hash_ids) * block_size]``.
    check_request and max_bytes (counting the expanded blocks): see the module
    docstring; both are applied line by line, before anything is expanded.

    The prompts stay hash blocks (:class:`HashBlockRequest`): each read of a
    request's ``input_ids`` expands its blocks into a new array.
    rid is ``"mc-<record index>"``.
    """
    if limit is not None:
        _check_int("limit", limit, 1)
    _check_block_size(block_size)
    _check_vocab(vocab_size)
    _check_real("time_scale", time_scale, 0.0, above=True)
    _check_int("seed", seed, 0)
    # the records make no reference cycles: the cyclic collector, which
    # would walk the lists already read again and again, rests until the end
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _load_mooncake(path, limit, block_size, vocab_size, time_scale, seed, check_request,
                              max_bytes)
    finally:
        if collecting:
            gc.enable()


def _load_mooncake(path: PathLike, limit: Optional[int], block_size: int, vocab_size: int,
                   time_scale: float, seed: int, check_request: Optional[RequestCheck],
                   max_bytes: Optional[int]) -> list[SimRequest]:
    name = str(path)
    ids_parts: list[list[int]] = []
    input_lens: list[int] = []
    output_lens: list[int] = []
    stamps: list[float] = []
    linenos: list[int] = []
    blocks = 0
    for lineno, rec in _records(path, _max_line(max_bytes)):
        if limit is not None and len(input_lens) >= limit:
            break
        for key in ("input_length", "output_length", "hash_ids"):
            if key not in rec:
                raise TraceFormatError(name, lineno, f"missing field {key!r}")
        n_in, n_out, hids = rec["input_length"], rec["output_length"], rec["hash_ids"]
        ts = rec.get("timestamp", 0)
        if not _is_int(n_in) or n_in < 1:
            raise TraceFormatError(name, lineno, f"input_length must be an int >= 1, got {n_in!r}")
        if not _is_int(n_out) or n_out < 0:
            raise TraceFormatError(name, lineno,
                                   f"output_length must be an int >= 1, got {n_out!r}")
        if n_out == 0:
            raise TraceFormatError(name, lineno,
                                   "output_length 0 (a prefill-only request) cannot be replayed: "
                                   "every simulated request decodes at least one token; drop the "
                                   "line or give it output_length >= 1")
        # type() rather than isinstance(): bools are not ids (checked per line
        # here, the sign below over the whole trace at once).
        if not isinstance(hids, list) or not hids or set(map(type, hids)) != {int}:
            raise TraceFormatError(name, lineno, "hash_ids must be a non-empty list of ints >= 0")
        if not _is_number(ts) or ts < 0:
            raise TraceFormatError(name, lineno, f"timestamp must be a number >= 0, got {ts!r}")
        if not (len(hids) - 1) * block_size < n_in <= len(hids) * block_size:
            raise TraceFormatError(
                name, lineno,
                f"input_length {n_in} does not fit {len(hids)} blocks of {block_size} tokens")
        _check_line(name, lineno, check_request, f"mc-{len(input_lens)}", n_in, n_out)
        blocks += len(hids)
        _check_line_size(name, lineno, blocks * block_size, len(input_lens) + 1, max_bytes)
        ids_parts.append(hids)
        linenos.append(lineno)
        input_lens.append(n_in)
        output_lens.append(n_out)
        stamps.append(float(ts))
    if not input_lens:
        raise WorkloadError(f"trace {name} has no requests")

    counts = np.fromiter((len(h) for h in ids_parts), dtype=np.int64, count=len(ids_parts))
    try:
        flat_ids = np.fromiter(itertools.chain.from_iterable(ids_parts), dtype=np.int64,
                               count=int(counts.sum()))
    except OverflowError:
        flat_ids = None
    ends = np.cumsum(counts)
    if flat_ids is None or flat_ids.min() < 0:
        bad = next(i for i, part in enumerate(ids_parts) if min(part) < 0 or max(part) >= 2**63)
        raise TraceFormatError(name, linenos[bad], "hash_ids must be a non-empty list of ints >= 0")
    blocks = HashBlocks(flat_ids, block_size, vocab_size, seed)
    starts = np.concatenate(([0], ends[:-1])).tolist()
    return [
        HashBlockRequest(
            rid=f"mc-{i}",
            input_ids=HashBlockPrompt(blocks, starts[i], input_lens[i]),
            output_len=output_lens[i],
            arrival=stamps[i] * time_scale,
        )
        for i in range(len(input_lens))
    ]


def bundled_mooncake_path() -> Path:
    """Path of the Mooncake conversation trace shipped with the package."""
    res = resources.files("mambaradix.sim") / "data" / "mooncake_conversation_trace.jsonl.gz"
    return Path(str(res))


def mooncake_conversation(limit: Optional[int] = None, **kwargs: Any) -> list[SimRequest]:
    """The bundled Mooncake conversation trace (12,031 requests, ~145M prompt
    tokens), expanded by :func:`load_mooncake` (its keywords apply)."""
    return load_mooncake(bundled_mooncake_path(), limit=limit, **kwargs)


def _int_list(name: str, lineno: int, field: str, value: Any, allow_empty: bool) -> np.ndarray:
    if not isinstance(value, list) or (not value and not allow_empty):
        raise TraceFormatError(name, lineno, f"{field} must be a non-empty list of ints")
    try:
        arr = np.array(value, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise TraceFormatError(name, lineno, f"{field} must be a list of ints") from None
    if arr.ndim != 1 or (arr.size and not all(_is_int(v) for v in value)):
        raise TraceFormatError(name, lineno, f"{field} must be a list of ints")
    if arr.size and (arr.min() < 0 or arr.max() > 2**31 - 1):
        raise TraceFormatError(name, lineno, f"{field} values must lie in [0, 2**31)")
    return arr.astype(np.int32)


_TOKEN_FIELDS = {"input_ids", "output_len", "arrival", "extra_key", "session", "turn",
                 "output_ids", "rid"}


def load_token_trace(path: PathLike, *, limit: Optional[int] = None,
                     check_request: Optional[RequestCheck] = None,
                     max_bytes: Optional[int] = DEFAULT_MAX_BYTES) -> list[SimRequest]:
    """Read the explicit token-id JSONL format (see the module docstring;
    check_request and max_bytes are applied line by line)."""
    if limit is not None:
        _check_int("limit", limit, 1)
    name = str(path)
    requests: list[SimRequest] = []
    rid_lines: dict[str, int] = {}
    tokens = 0
    for lineno, rec in _records(path, _max_line(max_bytes)):
        if limit is not None and len(requests) >= limit:
            break
        unknown = sorted(set(rec) - _TOKEN_FIELDS)
        if unknown:
            raise TraceFormatError(name, lineno, f"unknown field(s) {', '.join(unknown)}")
        if "input_ids" not in rec:
            raise TraceFormatError(name, lineno, "missing field 'input_ids'")
        input_ids = _int_list(name, lineno, "input_ids", rec["input_ids"], allow_empty=False)
        output_ids = None
        if rec.get("output_ids") is not None:
            output_ids = _int_list(name, lineno, "output_ids", rec["output_ids"],
                                   allow_empty=False)
        out_len = rec.get("output_len", None if output_ids is None else len(output_ids))
        if out_len is None:
            raise TraceFormatError(name, lineno, "missing field 'output_len'")
        if not _is_int(out_len) or out_len < 1:
            raise TraceFormatError(name, lineno, f"output_len must be an int >= 1, got {out_len!r}")
        if output_ids is not None and len(output_ids) != out_len:
            raise TraceFormatError(
                name, lineno, f"output_ids has {len(output_ids)} tokens, output_len is {out_len}")
        arrival = rec.get("arrival", 0.0)
        if not _is_number(arrival) or arrival < 0:
            raise TraceFormatError(name, lineno, f"arrival must be a number >= 0, got {arrival!r}")
        extra_key = rec.get("extra_key")
        if extra_key is not None and not isinstance(extra_key, str):
            raise TraceFormatError(name, lineno, "extra_key must be a string or null")
        session = rec.get("session")
        if session is not None:
            if not (isinstance(session, str) or _is_int(session)):
                raise TraceFormatError(name, lineno, "session must be a string, an int or null")
            session = str(session)
        turn = rec.get("turn", 0)
        if not _is_int(turn) or turn < 0:
            raise TraceFormatError(name, lineno, f"turn must be an int >= 0, got {turn!r}")
        rid = rec.get("rid", f"line-{lineno}")
        if not isinstance(rid, str):
            raise TraceFormatError(name, lineno, "rid must be a string")
        if rid in rid_lines:
            raise TraceFormatError(name, lineno, f"rid {rid!r} is also line {rid_lines[rid]}'s")
        rid_lines[rid] = lineno
        _check_line(name, lineno, check_request, rid, len(input_ids), out_len)
        tokens += len(input_ids) + (0 if output_ids is None else len(output_ids))
        _check_line_size(name, lineno, tokens, len(requests) + 1, max_bytes)
        requests.append(SimRequest(rid=rid, input_ids=input_ids, output_len=out_len,
                                   arrival=float(arrival), extra_key=extra_key,
                                   session=session, turn=turn, output_ids=output_ids))
    if not requests:
        raise WorkloadError(f"trace {name} has no requests")
    return requests


def save_token_trace(requests: Sequence[SimRequest], path: PathLike) -> None:
    """Write requests in the explicit token-id format (gzip'd if path ends in .gz);
    every request is checked first (checks.check_requests), so a bad one
    leaves no file."""
    check_requests(requests)
    opener: Callable[..., IO[str]]
    opener = (lambda p: gzip.open(p, "wt", encoding="utf-8")) if str(path).endswith(".gz") \
        else (lambda p: open(p, "w", encoding="utf-8"))
    with opener(path) as f:
        for r in requests:
            rec: dict[str, Any] = {"rid": r.rid, "input_ids": np.asarray(r.input_ids).tolist(),
                                   "output_len": int(r.output_len), "arrival": float(r.arrival)}
            if r.extra_key is not None:
                rec["extra_key"] = r.extra_key
            if r.session is not None:
                rec["session"] = r.session
            if r.turn:
                rec["turn"] = int(r.turn)
            if r.output_ids is not None:
                rec["output_ids"] = np.asarray(r.output_ids).tolist()
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def _check_line(name: str, lineno: int, check: Optional[RequestCheck], rid: str, prompt_len: int,
                output_len: int) -> None:
    """check_request for a trace line: its refusal names the file and line."""
    if check is not None:
        try:
            check(rid, prompt_len, output_len)
        except ValueError as e:
            raise WorkloadError(f"{name}:{lineno}: {e}") from None


def _check_line_size(name: str, lineno: int, tokens: int, requests: int,
                     max_bytes: Optional[int]) -> None:
    """_check_size for a trace read up to this line."""
    try:
        _check_size("the trace up to this line", tokens, requests, max_bytes)
    except WorkloadError as e:
        raise WorkloadError(f"{name}:{lineno}: {e}") from None


def detect_trace_format(path: PathLike, max_bytes: Optional[int] = DEFAULT_MAX_BYTES) -> str:
    """"mooncake" or "tokens", from the keys of the first record."""
    for lineno, rec in _records(path, _max_line(max_bytes)):
        if "hash_ids" in rec:
            return "mooncake"
        if "input_ids" in rec:
            return "tokens"
        raise TraceFormatError(str(path), lineno,
                               "unknown record format: expected 'hash_ids' (Mooncake) "
                               "or 'input_ids' (token ids)")
    raise WorkloadError(f"trace {path} has no requests")


def load_trace(path: PathLike, fmt: str = "auto", *, limit: Optional[int] = None,
               check_request: Optional[RequestCheck] = None,
               max_bytes: Optional[int] = DEFAULT_MAX_BYTES, **kwargs: Any) -> list[SimRequest]:
    """Load a trace file: ``fmt`` is "mooncake", "tokens" or "auto" (detect).
    Extra keywords go to :func:`load_mooncake`."""
    if fmt == "auto":
        fmt = detect_trace_format(path, max_bytes)
    if fmt == "mooncake":
        return load_mooncake(path, limit=limit, check_request=check_request, max_bytes=max_bytes,
                             **kwargs)
    if fmt == "tokens":
        if kwargs:
            raise WorkloadError(f"options {sorted(kwargs)} apply to Mooncake traces only")
        return load_token_trace(path, limit=limit, check_request=check_request,
                                max_bytes=max_bytes)
    raise WorkloadError(f"unknown trace format {fmt!r} (mooncake, tokens or auto)")


def workload_stats(requests: Sequence[SimRequest]) -> dict[str, Any]:
    """Sizes of a workload: requests, prompt / output tokens, sessions, turns."""
    check_requests(requests)
    lens = np.fromiter((r.prompt_len for r in requests), dtype=np.int64, count=len(requests))
    outs = np.fromiter((r.output_len for r in requests), dtype=np.int64, count=len(requests))
    sessions = {r.session for r in requests if r.session is not None}
    return {
        "requests": len(requests),
        "prompt_tokens": int(lens.sum()),
        "output_tokens": int(outs.sum()),
        "mean_prompt": float(lens.mean()) if len(lens) else 0.0,
        "max_prompt": int(lens.max()) if len(lens) else 0,
        "max_request": int((lens + outs).max()) if len(lens) else 0,
        "sessions": len(sessions),
        "max_turn": max((r.turn for r in requests), default=0),
    }
