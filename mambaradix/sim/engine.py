"""The simulator's replay engine: runs a workload through the cache with the
scheduler's rules and measures what the cache saves.

``run(requests, config, progress=None) -> SimMetrics``.

Both paths are backends of one loop, :class:`mambaradix.scheduler.Scheduler`
(admission like SGLang's PrefillAdder, chunked prefill, continuous batching,
retraction, the overlap scheduler's one-step lag in pp2 / lazy modes, track
points, lazy pre-allocation):

- ``states="none"`` (``_Replay``, the scheduler's state-free mode): the C
  lifecycle (``_C.Lifecycle`` in its tree-only mode, as under the drop-in over
  SGLang's own pools) with the pools kept as counters (no tensors, no torch).
  KV indices and state slots carry no data here, so only their counts are
  tracked: ``cache_unfinished_req`` and ``cache_finished_req`` (insert,
  re-match, lock move, donation, end-of-turn state, per-path budget, freeing
  what the tree does not keep) are the lifecycle's calls, which hand back what
  the pools must free; matches, locks and evictions run on the same tree
  through ``Lifecycle.tree_view()``, whose node API the belady policy
  reads.  With ``page_size`` > 1 the KV pool moves in whole pages as SGLang's
  paged allocator does: a request holds ``ceil(len / page)`` pages past its
  cached prefix, and evictions before a prefill or decode batch follow
  alloc_for_extend / alloc_for_decode (the same rules as the driver's).
  Decode batches are aggregated: runs of decode steps in which nothing can
  change (no request finishes,
  reaches a track boundary or needs an eviction, and no request can be
  admitted) are applied in one go; everything else is stepped one scheduler
  iteration at a time.
- ``states="toy"``: the same replay for the metrics, then the workload again
  through :class:`~mambaradix.driver.SchedulerDriver` over
  ``mambaradix.sglang`` with the :class:`~mambaradix.toy_model.ToyRecurrentModel`
  on CPU tensors.  Every state restored by a hit is compared with the toy
  model's from-scratch recomputation of the matched prefix (an
  ``AssertionError`` names the request on a mismatch), and every request's
  usable prefix must equal the state-free replay's.

Time model (:class:`~mambaradix.scheduler.TimeModel`): a decode step takes
``decode_step_seconds``; a prefill batch takes
``max(decode_step_seconds, tokens * prefill_token_seconds)``.  A request joins
the waiting queue once the clock reaches its ``arrival``.

Token accounting (every prompt token is counted exactly once; per request, at
its first admission; ``L`` = prompt length):

- ``state_usable_tokens`` U: the usable prefix the match returned (KV *and* a
  state at its end): the tokens the prefill skips.
- ``kv_matched_tokens`` M: tokens whose KV the match found (``kv_matched_len``,
  through tombstones and into a split edge), ``U <= M``.
- ``lost_alignment``: ``M - max(U, floor(M / C) * C)``: KV matched past the
  last multiple of the chunk size C, where no snapshot can sit in extra_buffer
  mode.
- ``lost_no_state``: ``max(U, floor(M / C) * C) - U``: KV matched on the chunk
  grid but no state at its end (tombstones left by splits, states evicted or
  never tracked).
- ``lost_eviction``: ``min(S, cap) - M``: tokens that were cached by earlier
  requests (S = the longest prefix of the prompt ever inserted into the tree
  before this admission) and within the match cap, whose KV was evicted since.
- ``lost_match_cap``: ``S - min(S, cap)``, ``cap = L - 1`` with
  ``match_cap`` (else L): tokens seen before but outside the match key.
- never seen: ``L - S``.

so ``prompt_tokens == state_usable + lost_no_state + lost_alignment +
lost_eviction + lost_match_cap + never_seen_tokens``.

Other metrics: ``state_hits`` (requests with U > 0); ``full_evictions``
(evict_full calls that released something); ``state_evictions`` (states
released by evict_mamba); ``kv_tokens_evicted`` (by either); state bytes
``copied`` (copy-on-write at hits and no_buffer forks) and ``donated`` (slots
handed to the tree without a copy), times ``state_bytes_per_slot``;
``peak_state_slots`` / ``peak_kv_tokens`` in use; ``prefill_flops_saved`` =
U x ``flops_per_token``; ``per_turn_hit_rate`` (turn -> U / L over that turn's
requests); ``wall_seconds`` split into "cache" (time in tree calls), "driver"
(the rest of the replay), "toy" (toy-model run) and "total".
"""

from __future__ import annotations

import bisect
import gc
import heapq
import operator
import time
from collections import deque
from typing import Any, Callable, Optional, Tuple

import numpy as np

from .. import _C

from ..scheduler import Batch, DriverConfig, Scheduler, TimeModel, decode_kv_need, extend_kv_need, match_key_limit
from .checks import check_feasible, check_requests, validate_config
from .types import SimConfig, SimMetrics, SimRequest
from .workloads import prefix_bounds

__all__ = ["run", "never_seen_tokens", "ReplayResult", "replay", "step_limit"]

_MODES = ("pp2", "pp1", "lazy", "no_buffer")
_ReqState = _C.ReqState
_POLICIES = ("sglang", "consumed", "utility", "adaptive", "belady")


def tree_options(config: SimConfig) -> dict:
    """Keyword arguments of RadixTree / MambaRadixCache for config's state
    policy: lru_policy (belady runs over "consumed" touches and picks
    its victims itself), the utility policy's model costs and the per-path
    budget."""
    pol = config.lru_policy
    kw: dict = {"lru_policy": "consumed" if pol == "belady" else pol}
    if pol == "sglang" and config.semantics == "v0.5.23":
        kw["lru_policy"] = "consumed"   # 0.5.23's Mamba LRU refreshes only the state a match uses
    budget = int(getattr(config, "max_states_per_path", 0) or 0)
    if budget:
        kw["max_states_per_path"] = budget
    if pol == "adaptive":   # its value order weighs FLOPs saved per byte
        kw["policy_options"] = {k: float(getattr(config, f, 0.0)) for k, f in (
            ("flops_per_token", "flops_per_token"), ("attn_flops_per_pos", "attn_flops_per_pos"),
            ("state_bytes", "state_bytes_per_slot"), ("kv_bytes_per_token", "kv_bytes_per_token"))}
        # its snapshot placement leaves a chunked prefill's chunk ends alone
        kw["policy_options"]["chunked_prefill_size"] = int(getattr(config, "chunked_prefill_size", 0) or 0)
    if pol == "utility":
        kw["policy_options"] = {
            "alpha": float(getattr(config, "utility_alpha", 0.0)),
            "flops_per_token": float(getattr(config, "flops_per_token", 0.0)),
            "attn_flops_per_pos": float(getattr(config, "attn_flops_per_pos", 0.0)),
            "state_bytes": float(getattr(config, "state_bytes_per_slot", 0)),
            "kv_bytes_per_token": float(getattr(config, "kv_bytes_per_token", 0)),
            "tune_window": int(getattr(config, "tune_window", 0)),
            "mru": int(getattr(config, "utility_order", "lru") == "mru"),
        }
    return kw


_by_seq = operator.attrgetter("seq")


def _distance_bucket(d: int) -> int:
    """Upper bound of d's replay-distance bucket: 64, 128, 256, ..."""
    b = 64
    while b < d:
        b *= 2
    return b


_HASH_B = np.uint64(0x100000001B3)


class _Future:
    """The trace's prompts, for the belady policy: the next request (in
    arrival order, not admitted yet) whose match key starts with a given
    path.  Prefixes are compared by a polynomial hash mod 2**64."""

    def __init__(self, requests: list, match_cap: bool) -> None:
        self.n = len(requests)
        maxlen = max((r.prompt_len for r in requests), default=1)
        self.pw = np.cumprod(np.concatenate([[np.uint64(1)], np.full(maxlen, _HASH_B, dtype=np.uint64)]),
                             dtype=np.uint64)[:maxlen]
        parts, starts, lens = [], [], []
        pos = 0
        for r in requests:
            toks = np.asarray(r.input_ids, dtype=np.int64).astype(np.uint64) + np.uint64(1)
            with np.errstate(over="ignore"):
                h = np.cumsum(toks * self.pw[:len(toks)], dtype=np.uint64) + self._seed(r.extra_key)
            parts.append(h)
            starts.append(pos)
            lens.append(len(toks) - 1 if match_cap else len(toks))
            pos += len(toks)
        self.flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.lens = np.asarray(lens, dtype=np.int64)
        self.admitted = np.zeros(self.n, dtype=bool)
        self.tables: dict = {}
        self.ptr: dict = {}
        self.paths: dict = {}

    @staticmethod
    def _seed(ns: Any) -> np.uint64:
        if ns is None:
            return np.uint64(0)
        import zlib
        return np.uint64(zlib.crc32(str(ns).encode()) * 2654435761)

    def path_of(self, node: Any) -> tuple:
        got = self.paths.get(node)
        if got is None:
            keys = []
            x = node
            while x is not None and not x.is_root:
                keys.append(x.key)
                x = x.parent
            toks = np.concatenate(keys[::-1]).astype(np.int64).astype(np.uint64) + np.uint64(1)
            L = len(toks)
            h = np.uint64(0)
            if L <= len(self.pw):
                with np.errstate(over="ignore"):
                    h = np.sum(toks * self.pw[:L], dtype=np.uint64) + self._seed(node.extra_key)
            got = self.paths[node] = (L, h)
        return got

    def _prefix_hash(self, node: Any, length: int) -> Optional[np.uint64]:
        """Hash of the first ``length`` tokens of node's path (length > its
        parent's path length)."""
        parent = node.parent
        if parent is None or parent.is_root:
            start, h = 0, self._seed(node.extra_key)
        else:
            start, h = self.path_of(parent)
        n = length - start
        if n <= 0 or length > len(self.pw):
            return None
        toks = node.key[:n].astype(np.int64).astype(np.uint64) + np.uint64(1)
        with np.errstate(over="ignore"):
            return np.uint64(h + np.sum(toks * self.pw[start:length], dtype=np.uint64))

    def next_use(self, node: Any, chunk: int = 0) -> float:
        """The next use of node's state; for a leaf (chunk > 0) also of the
        KV its eviction removes: a request that matches a chunk past the
        nearest surviving ancestor would have checkpointed there."""
        L, h = self.path_of(node)
        nu = self._next(L, h)
        if chunk > 0 and not node.children:
            top = node
            while (not top.parent.is_root and top.parent.state is None
                   and len(top.parent.children) == 1):
                top = top.parent
            A = 0 if top.parent.is_root else top.parent.prefix_len
            Lk = min(L, (A // chunk + 1) * chunk)
            x = node
            while not x.parent.is_root and x.parent.prefix_len >= Lk:
                x = x.parent
            hk = self._prefix_hash(x, Lk)
            if hk is not None:
                nu = min(nu, self._next(Lk, hk))
        return nu

    def _next(self, L: int, h: Any) -> float:
        if L > len(self.pw) or L == 0:
            return float("inf")
        tab = self.tables.get(L)
        if tab is None:
            idx = np.nonzero(self.lens >= L)[0]
            hs = self.flat[self.starts[idx] + L - 1]
            order = np.lexsort((idx, hs))
            tab = self.tables[L] = (hs[order], idx[order])
        hs, ids = tab
        lo = int(np.searchsorted(hs, h, "left"))
        hi = int(np.searchsorted(hs, h, "right"))
        key = (L, int(h))
        i = max(lo, self.ptr.get(key, lo))
        while i < hi and self.admitted[ids[i]]:
            i += 1
        self.ptr[key] = i
        return float(ids[i]) if i < hi else float("inf")


def never_seen_tokens(m: SimMetrics) -> int:
    """Prompt tokens no earlier request had cached, from the other counts."""
    return (m.prompt_tokens - m.state_usable_tokens - m.lost_no_state - m.lost_alignment
            - m.lost_eviction - m.lost_match_cap)


def _pseudo_outputs(rid: str, n: int) -> np.ndarray:
    """Deterministic pseudo output tokens of request ``rid`` (int32, 1..150000)."""
    return _pseudo_outputs_many([rid], [n])[0]


def _pseudo_outputs_many(rids: list, ns: list) -> tuple:
    """``_pseudo_outputs(rids[i], ns[i])`` for every i in one pass: (the
    concatenation, start offsets).  Token j of request rid is splitmix64's
    mix of ``fnv1a64(rid) + j * 0x9E3779B97F4A7C15`` mod 150000, plus 1
    (``mambaradix._C.pseudo_tokens``)."""
    return _C.pseudo_tokens(rids, ns, PSEUDO_VOCAB)


#: pseudo output tokens lie in [1, PSEUDO_VOCAB]
PSEUDO_VOCAB = 150000


def _validate(requests: list, config: SimConfig) -> None:
    """The configuration's fields and rules (checks.validate_config), then
    every request's fields (checks.check_requests), before anything is built."""
    if not isinstance(config, SimConfig):
        raise TypeError(f"config must be a SimConfig, got {type(config).__name__}")
    validate_config(config, where="config.")
    check_requests(requests)


def _driver_config(config: SimConfig) -> DriverConfig:
    return DriverConfig(mode=config.mode, chunk_size=config.chunk_size,
                        track_interval=config.track_interval,
                        chunked_prefill_size=config.chunked_prefill_size,
                        max_running=config.max_running,
                        max_prefill_tokens=int(getattr(config, "max_prefill_tokens", 16384)),
                        match_cap=config.match_cap, page_size=config.page_size,
                        new_token_ratio=float(getattr(config, "new_token_ratio", 1.0)),
                        decode_boundary=decode_boundary_of(config),
                        semantics=config.semantics)


def decode_boundary_of(config: SimConfig) -> str:
    """The decode track check a replay runs: ``config.decode_boundary``, or
    when it is None the semantics' own (``SimConfig.resolved``)."""
    db = getattr(config, "decode_boundary", None)
    if db is None and isinstance(config, SimConfig):
        db = config.resolved().decode_boundary
    return str(db or "committed")


# ---------------------------------------------------------------------------
# state-free replay over the native tree
# ---------------------------------------------------------------------------
class _R:
    """One request in the state-free replay."""

    __slots__ = ("rid", "sim", "tokens", "outs", "prompt_len", "output_len", "ns", "n_out", "prefix_len",
                 "node", "rs", "committed", "allocated", "ext_end", "inflight", "epoch",
                 "finished", "admitted", "row", "abort", "chunks", "in_run",
                 "j0", "c_base", "o_base", "seq", "res_key", "seen", "shadow_n", "aidx", "nsid")

    def __init__(self, sim: SimRequest, outs: np.ndarray) -> None:
        self.rid = sim.rid
        self.sim = sim
        # prompt + outputs + two spare tokens, made at the first match
        # (_Replay._tokens) and dropped when the request finishes
        self.tokens: Optional[np.ndarray] = None
        self.outs: Optional[np.ndarray] = outs     # the outputs and spares until then
        self.prompt_len = sim.prompt_len
        self.output_len = int(sim.output_len)
        self.ns = sim.extra_key
        self.n_out = 0
        self.ext_end = 0
        self.epoch = 0
        self.finished = False
        self.admitted = False
        self.row = False
        self.abort = False
        self.chunks = 0
        # running-batch bookkeeping: while in_run, committed and n_out are derived
        # from the decode batch counters (see _Replay._sync)
        self.in_run = False
        self.j0: Optional[int] = None
        self.c_base = 0
        self.o_base = 0
        self.seq = 0
        self.res_key = 0
        self.seen = 0                 # tokens of it the shadow tree holds (or will: _seen)
        self.shadow_n = 0             # the longest key of it inserted into the shadow
        self.aidx = 0                 # index in arrival order
        self.nsid = 0                 # the Lifecycle's namespace id of ns
        self.restart()

    def restart(self) -> None:
        """The state of a request that holds nothing (new, or retracted)."""
        self.prefix_len = 0
        self.node: Any = None         # the node its match found (a Node), which admission locks
        self.inflight = 0
        # the lifecycle's record of it (state slot ids, -1 = none; ping-pong
        # index, tracked and branching lengths, copy-on-write source, the
        # locked node): the C calls read and update it in place
        self.rs = _ReqState()
        self.committed = 0
        self.allocated = 0

    @property
    def is_insert(self) -> bool:
        """False once the lifecycle marked it not to insert (lazy mode)."""
        return bool(self.rs.lazy_is_insert)


class ReplayResult:
    """Metrics plus per-request usable prefixes (rid -> tokens) of a replay."""

    def __init__(self, metrics: SimMetrics, prefixes: dict, steps: int = 0) -> None:
        self.metrics = metrics
        self.prefixes = prefixes
        self.steps = steps      # scheduler iterations the replay took


def step_limit(requests: list, config: SimConfig) -> int:
    """The most scheduler iterations a replay may take before it is declared
    stuck: 16 times the steps of running the requests one after another
    (prefill chunks, outputs, the overlap lag), plus one per arrival."""
    chunk = int(config.max_prefill_tokens)
    if config.chunked_prefill_size:
        chunk = min(chunk, int(config.chunked_prefill_size))
    chunk = max(chunk, 1)
    serial = sum(-(-r.prompt_len // chunk) + int(r.output_len) + 3 for r in requests)
    return 16 * serial + 1000


class _Replay(Scheduler):
    """The scheduler's state-free backend: the C lifecycle over counted
    pools (tree-only, values=False): every take, free and eviction of KV,
    state slots and rows is a call into it."""

    # Its attributes and the loop's live in slots: the loop reads them at
    # every step, and an instance dict of this many keys is not a shared-key
    # one, whose reads the interpreter specialises (about 5% of a replay).
    # (The base class keeps a dict for anything else.)
    __slots__ = (
        "_pending_match", "agg_j0", "agg_len", "agg_long", "agg_n", "agg_obase", "batch_is_full",
        "batch_mode", "bucket", "bucket_keys", "cfg", "check_every_step", "chunked", "clock", "config",
        "copies", "dcfg", "distance", "extra_buffer", "fin_at", "fin_heap", "fin_last",
        "future", "in_order", "interval", "key_bounds", "kv_total", "last_batch", "lazy", "lc",
        "live", "m", "max_steps", "n_done", "n_submitted", "n_total", "need_filter", "next_bid", "out_at",
        "out_from", "outs", "overlap", "page", "page_due", "pending", "pending_join", "pp_size",
        "prefixes", "prep_id", "progress", "res_id", "result_queue", "running",
        "seq", "shadow", "skip_finishing", "skipped", "slots_total", "steps",
        "t_cache", "time", "token_bufs", "touch_calls", "tree", "turn_prompt", "turn_usable", "unseen",
        "v0523", "waiting")

    def __init__(self, requests: list, config: SimConfig, progress: Optional[Callable],
                 check_every_step: bool = False) -> None:
        import mambaradix

        self.cfg = config
        self.dcfg = _driver_config(config)
        super().__init__(self.dcfg)
        self.time = TimeModel(config.decode_step_seconds, config.prefill_token_seconds)
        self.progress = progress
        self.check_every_step = check_every_step
        # every cache step (cache_unfinished / cache_finished with their
        # insert, re-match, lock move, donation, end-of-turn and per-path
        # budget), admission with its headroom, KV eviction and the slots
        # the ping-pong moves take is the C lifecycle's, over pools it
        # counts: KV tokens (whole pages with a paged allocator, as SGLang's
        # holds them), state slots and request rows
        self.kv_total = int(config.kv_tokens) // self.page * self.page
        self.slots_total = int(config.state_slots)
        self.lc = mambaradix._C.Lifecycle(
            page_size=config.page_size, chunk_size=config.chunk_size,
            extra_buffer=self.dcfg.extra_buffer, lazy=self.dcfg.lazy,
            track_buffer_size=self.pp_size, track_interval=int(self.dcfg.track_interval),
            end_of_turn_states=bool(getattr(config, "end_of_turn_states", False)),
            semantics=config.semantics, values=False,
            counts=(self.kv_total, self.slots_total, int(config.max_running) + 2), **tree_options(config))
        # the same tree for matches, locks, evictions and the policies' node API
        self.tree = self.lc.tree_view()
        self.distance: dict = {}
        self.n_submitted = 0
        # keys only: the shadow measures prefixes, it holds no KV
        self.shadow = mambaradix.RadixTree(page_size=config.page_size, chunk_size=config.chunk_size,
                                           lru_policy="consumed", values=False)
        self.unseen: dict = {}        # id -> request whose shadow insert waits (_seen)
        self.token_bufs: dict = {}    # log2 size -> free token buffers (_tokens)
        self.t_cache = 0.0
        # requests in the decode aggregates by the residue (mod page) of the
        # decode batches that start a new page for them
        self.page_due = [0] * self.page
        self.m = SimMetrics()
        self.turn_usable: dict = {}
        self.turn_prompt: dict = {}
        self.copies = 0
        self.clock = 0.0
        order = sorted(range(len(requests)), key=lambda i: (float(requests[i].arrival), i))
        self.pending: deque = deque(requests[i] for i in order)
        # pseudo outputs, made in blocks of requests in arrival order (_outputs)
        self.in_order = list(self.pending)
        # how much of a request's key the shadow needs: no other prompt
        # matches past its bound (None: all of it)
        self.key_bounds = prefix_bounds(self.in_order)
        self.outs = np.zeros(0, dtype=np.int32)
        self.out_at = np.zeros(1, dtype=np.int64)
        self.out_from = 0
        self.future = (_Future([requests[i] for i in order], config.match_cap)
                       if config.lru_policy == "belady" else None)
        if self.future is not None:
            # (replay() sets it back to None: the policy refers to the replay)
            self.lc.set_victims(self._belady_victim)
        self.n_total = len(requests)
        self.n_done = 0
        self.prefixes: dict = {}
        self.live: list[_R] = []
        self.extra_buffer = self.dcfg.extra_buffer
        self.lazy = self.dcfg.lazy
        self.interval = int(self.dcfg.track_interval)
        self.overlap = self.dcfg.overlap
        self.batch_mode = self.dcfg.decode_boundary == "batch"
        # _fast_forward: a span may end with a batch that finishes requests
        self.fin_last = not self.skip_finishing and not self.lazy
        # decode batches are numbered; prep_id / res_id: the last prepared /
        # processed one.  A running request's committed KV and outputs follow
        # from them, so a decode step costs O(requests it changes).
        self.next_bid = 0
        self.prep_id = -1
        self.res_id = -1
        self.pending_join: list[_R] = []
        self.fin_at: dict = {}
        self.bucket: dict = {}
        self.bucket_keys: list = []   # the bucket's residues, sorted
        self.seq = 0
        self.agg_len = 0
        self.agg_obase = 0
        self.agg_j0 = 0
        self.agg_n = 0
        self.agg_long = 0
        self.fin_heap: list = []
        self.skipped: list = []       # requests the next decode batch skips (skip_finishing)
        self.steps = 0
        self.max_steps = step_limit(requests, config)

    #: Pseudo output tokens made at once (_outputs): enough requests to pass
    #: it, so that the arrays stay small whatever the workload's outputs.
    OUTPUT_BLOCK = 1 << 16

    def _outputs(self, k: int) -> np.ndarray:
        """The pseudo outputs (and two spare tokens) of the k-th request in
        arrival order: made in one pass for it and the requests after it
        until OUTPUT_BLOCK tokens, when it is past the last block."""
        i = k - self.out_from
        if i + 1 >= len(self.out_at):
            rids, counts, total = [], [], 0
            for j in range(k, len(self.in_order)):
                if total >= self.OUTPUT_BLOCK:
                    break
                r = self.in_order[j]
                n = 0 if r.output_ids is not None else int(r.output_len) + 2
                rids.append(r.rid)
                counts.append(n)
                total += n
            self.outs, self.out_at = _pseudo_outputs_many(rids, counts)
            self.out_from, i = k, 0
        return self.outs[self.out_at[i]:self.out_at[i + 1]]

    def _belady_victim(self, protect: Optional[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
        """Belady (the lifecycle's victim policy, set_victims): the evictable
        state whose next use (the next request not admitted yet whose match
        key starts with its path) lies furthest ahead; never-used states
        first, least recently used among equals.  ``protect`` (a node handle
        or None) is the node the evicting call keeps: never a victim."""
        fut = self.future
        inf = float("inf")
        best, best_next = None, -1.0
        for x in reversed(self.tree.lru_order("mamba")):
            if not x.can_evict_state:  # the tree's rule, as its own eviction decides
                continue
            if protect is not None and (x.id, x.gen) == protect:
                continue
            nu = fut.next_use(x, self.cfg.chunk_size)
            if nu > best_next:
                best, best_next = x, nu
                if nu == inf:
                    break
        return None if best is None else (best.id, best.gen)

    def _ceil_page(self, n: int) -> int:
        return -(-n // self.page) * self.page

    def _alloc_kv(self, n: int, evict_below: Optional[int] = None) -> None:
        """Take n KV tokens, first evicting when fewer than ``evict_below``
        (default n) are free (SGLang evicts for an estimate with pages)."""
        try:
            self.lc.take_kv(n, evict_below)
        except RuntimeError as e:
            raise RuntimeError(f"KV pool exhausted allocating {n} tokens "
                               f"(free {self.lc.kv_free}): raise kv_tokens") from e

    @staticmethod
    def _slot_ids(rs: Any) -> list:
        """The state slots a record holds."""
        return [x for x in (rs.running, rs.track0, rs.track1) if x > 0]

    def _seen(self, r: _R, n: int) -> None:
        """The shadow tree holds every key ever inserted (it never evicts).
        Only a match reads it, so a request's inserts wait for the next
        match and go in as one, its longest: a chunked prefill re-inserts
        its growing prefix from the root, which would cost its length times
        its chunks."""
        if n > r.seen:
            r.seen = n
            self.unseen[id(r)] = r

    def _flush_seen(self) -> None:
        """The inserts _seen deferred, before the shadow is read."""
        for r in self.unseen.values():
            self._shadow_insert(r)
        self.unseen.clear()

    def _shadow_insert(self, r: _R) -> None:
        n = r.seen
        if self.key_bounds is not None:
            bound = self.key_bounds[r.aidx]
            if bound is not None and bound < n:
                n = bound       # no other prompt matches past it (prefix_bounds)
        if n > r.shadow_n:      # (the shadow never evicts: a key it holds stays)
            r.shadow_n = n
            self.shadow.insert(r.tokens[:n], None, 1, extra_key=r.ns)

    # ----------------------------------------------------------- cache ops
    def _cache_unfinished(self, r: _R, chunked: bool) -> None:
        """cache_unfinished_req through the lifecycle, which takes the fresh
        slot (extra_buffer: it replaces the donated snapshot; no_buffer: the
        fork) from the counted pool, or with nothing tracked caches nothing
        and leaves the request all its KV."""
        fill_len = r.ext_end
        extra = self.extra_buffer
        t0 = time.perf_counter()
        try:
            res = self.lc.cache_unfinished(r.rs, r.tokens, fill_len, 0, ns=r.nsid, prefix=False)
        except RuntimeError as e:
            raise RuntimeError("state pool exhausted donating a track slot (every cached "
                               "state is locked): raise state_slots or lower "
                               "max_running (SGLang sizes about 5 slots per request)" if extra else
                               "state pool exhausted forking a state: raise state_slots") from e
        self._seen(r, res.cache_len)
        self.t_cache += time.perf_counter() - t0
        if not extra:
            self.copies += 1              # SGLang forks before its insert (no_buffer caches always)
        r.prefix_len = fill_len          # tree part + request-owned rest

    def _cache_finished(self, r: _R, is_insert: bool) -> None:
        """cache_finished_req through the lifecycle: what it frees goes back to
        the counted pools."""
        t0 = time.perf_counter()
        res = self.lc.cache_finished(r.rs, r.tokens, r.committed, ns=r.nsid, is_insert=is_insert)
        if is_insert:
            self._seen(r, res.cache_len)    # the shadow's record of every key
        self.t_cache += time.perf_counter() - t0
        r.node = None

    def _release(self, r: _R, is_insert: bool) -> None:
        if r.in_run:
            self._leave(r)
        if not r.row:
            if r.rs.running >= 0:
                self.lc.free_states(r.rs)
            return
        self._cache_finished(r, is_insert)
        self.lc.free_row(r.committed, r.allocated)
        r.row = False

    def _finish(self, r: _R) -> None:
        # its last insert into the shadow now, so that its tokens can go
        # (the shadow never evicts, so when it goes in changes no match)
        if self.unseen.pop(id(r), None) is not None:
            t0 = time.perf_counter()
            self._shadow_insert(r)
            self.t_cache += time.perf_counter() - t0
        self._drop_tokens(r)
        r.finished = True
        self.n_done += 1
        if self.progress is not None:
            self.progress(self.n_done, self.n_total)

    # ----------------------------------------------------------- match
    def _tokens(self, r: _R) -> np.ndarray:
        """r's token ids (prompt, outputs, two spares), made when first
        needed (waiting requests hold only their outputs) in a buffer of
        the pool that finished requests give back (_drop_tokens): memory
        already touched, not fresh pages for every request."""
        L = r.prompt_len
        outs = r.outs
        n = L + len(outs)
        size = (n - 1).bit_length()
        free = self.token_bufs.get(size)
        tokens = (free.pop() if free else np.empty(1 << size, dtype=np.int32))[:n]
        r.sim.write_prompt(tokens[:L])
        tokens[L:] = outs
        r.tokens = tokens
        r.outs = None
        return tokens

    def _drop_tokens(self, r: _R) -> None:
        """r's token buffer back to the pool (the trees keep copies of keys)."""
        tokens = r.tokens
        if tokens is not None:
            buf = tokens.base
            self.token_bufs.setdefault(len(buf).bit_length() - 1, []).append(buf)
            r.tokens = None
        r.outs = None

    def _match(self, r: _R) -> None:
        fill_len = r.prompt_len + r.n_out
        limit = match_key_limit(fill_len, self.dcfg.match_cap)
        tokens = r.tokens if r.tokens is not None else self._tokens(r)
        t0 = time.perf_counter()
        m = self.tree.match_prefix(tokens[:limit], extra_key=r.ns, indices=False)
        seen = 0
        if not r.admitted:
            if self.unseen:
                self._flush_seen()
            seen = self.shadow.cached_len(tokens[:fill_len], r.ns)
            r.seen = max(r.seen, seen)
        self.t_cache += time.perf_counter() - t0
        node = m.node
        r.prefix_len = node.prefix_len
        r.node = node
        rs = r.rs
        br = m.branching_seqlen
        rs.branching_seqlen = -1 if br is None else br
        rs.protected_len = r.prefix_len
        # the copy-on-write step (the lifecycle's rule; the slot is ours)
        try:
            self.lc.cow(rs, node.id, node.gen)
        except RuntimeError as e:
            raise RuntimeError("state pool exhausted at a hit: raise state_slots") from e
        self._pending_match = (m.kv_matched_len, seen)

    def _touch_prefix(self, r: _R) -> None:
        tokens = r.tokens if r.tokens is not None else self._tokens(r)
        t0 = time.perf_counter()
        self.tree.match_prefix(tokens[:r.prompt_len + r.n_out], extra_key=r.ns, indices=False)
        self.t_cache += time.perf_counter() - t0

    # ----------------------------------------------------------- the loop
    def run(self) -> None:
        pending = self.pending
        fast_forward = self._fast_forward
        step = self._step
        submit = self._submit
        max_steps = self.max_steps
        while True:
            while pending and pending[0].arrival <= self.clock:
                submit(pending.popleft())
            if (not self.waiting and not self.running and self.chunked is None
                    and not self.result_queue and self.last_batch is None):     # idle
                if pending:
                    self.clock = max(self.clock, float(pending[0].arrival))
                    continue
                break
            self.steps += 1
            if self.steps > max_steps:
                raise RuntimeError(
                    f"the replay made no progress: {self.n_total - self.n_done} of "
                    f"{self.n_total} requests unfinished after {self.max_steps:,} scheduler steps "
                    f"({len(self.waiting)} waiting, {len(self.running)} running; "
                    f"free KV {self.lc.kv_free:,} of {self.kv_total:,}, free state slots "
                    f"{self.lc.slots_free} of {self.slots_total})")
            if fast_forward():
                continue
            step()
            if self.check_every_step:
                self.check()

    def _submit(self, sim: SimRequest) -> None:
        if sim.output_ids is not None:
            outs = np.concatenate([np.asarray(sim.output_ids[:sim.output_len], dtype=np.int32),
                                   _pseudo_outputs(sim.rid + "#spare", 2)])
        else:
            # the outputs and two spare tokens (decoded by an overlap step
            # after the request finished)
            outs = self._outputs(self.n_submitted)
        r = _R(sim, outs)
        r.nsid = 0 if sim.extra_key is None else self.tree.namespace(sim.extra_key)
        r.aidx = self.n_submitted
        self.n_submitted += 1
        self.waiting.append(r)
        if self.check_every_step:
            self.live.append(r)

    def _step(self) -> None:
        if self.step() is None:
            # nothing ran: let time pass to the next arrival (or one step)
            if self.pending:
                self.clock = max(self.clock + self.time.step, float(self.pending[0].arrival))
            else:
                self.clock += self.time.step

    # ----------------------------------------------------------- scheduler hooks
    def _free_rows(self) -> int:
        return self.lc.rows_free

    def _kv_available(self) -> int:
        return self.lc.kv_free

    def _kv_evictable(self) -> int:
        return self.tree.full_evictable_size()

    def _evict_kv(self, n: int) -> None:
        t0 = time.perf_counter()
        self.lc.evict(n, 0)
        self.t_cache += time.perf_counter() - t0

    def _set_extend(self, r: _R, end: int) -> None:
        r.ext_end = end

    def _lock(self, r: _R) -> None:
        t0 = time.perf_counter()
        self.tree.inc_lock_ref(r.node)
        self.t_cache += time.perf_counter() - t0

    def _unlock(self, r: _R) -> None:
        t0 = time.perf_counter()
        self.tree.dec_lock_ref(r.node)
        self.t_cache += time.perf_counter() - t0

    def _on_added(self, r: _R) -> None:
        # the lock admission took on the matched node is the record's, which
        # the cache calls move and drop
        rs = r.rs
        rs.node_id = r.node.id
        rs.node_gen = r.node.gen
        rs.locked = 1
        if not r.admitted:
            self._account_admission(r, *self._pending_match)

    def _drop_match(self, r: _R) -> None:
        rs = r.rs
        rs.cow_src = -1
        rs.needs_clear = 0
        if rs.running >= 0:
            self.lc.free_states(rs)

    def _append_output(self, r: _R) -> None:
        if r.in_run and r.j0 is not None:
            # already in a decode batch (overlap): its outputs are derived
            r.o_base += 1
            self.agg_obase += 1
            self._sync(r)
            self._add_fin(r)
        else:
            r.n_out += 1

    def _materialise(self, rs: list) -> None:
        for r in rs:
            self._sync(r)

    def _leave_running(self, r: _R) -> None:
        self._leave(r)
        self.running = [x for x in self.running if x is not r]
        self.pending_join = [x for x in self.pending_join if x is not r]

    def _reset_for_retry(self, r: _R) -> None:
        r.restart()

    def _join(self, r: _R) -> None:
        r.in_run = True
        r.j0 = None
        self.seq += 1
        r.seq = self.seq
        self.running.append(r)
        self.pending_join.append(r)


    def _account_admission(self, r: _R, kv_m: int, seen: int) -> None:
        m = self.m
        L = r.prompt_len
        U = r.prefix_len
        C = self.cfg.chunk_size
        cap = match_key_limit(L, self.dcfg.match_cap)
        kv_m = min(kv_m, L)
        seen = max(min(seen, L), kv_m)
        grid = max(U, (kv_m // C) * C)
        m.requests += 1
        m.prompt_tokens += L
        m.kv_matched_tokens += kv_m
        m.state_usable_tokens += U
        m.lost_alignment += kv_m - grid
        m.lost_no_state += grid - U
        m.lost_eviction += min(seen, cap) - kv_m
        m.lost_match_cap += seen - min(seen, cap)
        m.never_seen_tokens += L - seen
        if kv_m > U:
            b = _distance_bucket(kv_m - U)
            self.distance[b] = self.distance.get(b, 0) + kv_m - U
        if self.future is not None:
            self.future.admitted[r.aidx] = True
        if U > 0:
            m.state_hits += 1
        t = int(r.sim.turn)
        self.turn_usable[t] = self.turn_usable.get(t, 0) + U
        self.turn_prompt[t] = self.turn_prompt.get(t, 0) + L
        self.prefixes[r.rid] = U
        r.admitted = True

    def _prepare_extend(self, rs: list) -> Batch:
        d = self.dcfg
        # HybridReqToTokenPool.alloc: the slots each request wants are the
        # lifecycle's rule (admit, numbering them from the counted pool's
        # ids); take_admission evicts the state headroom and takes them
        need_rows = 0
        need_slots = 0
        ext_total = 0
        items = []
        admit = self.lc.admit
        for r in rs:
            if not r.row:
                need_rows += 1
            need_slots += admit(r.rs)[1]
            ext_total += r.ext_end - r.prefix_len
        try:
            self.lc.take_admission(len(rs), need_slots, need_rows)
        except RuntimeError as e:
            raise RuntimeError(f"state pool exhausted admitting {len(rs)} requests "
                               f"(need {need_slots}, free {self.lc.slots_free}): "
                               f"raise state_slots") from e
        for r in rs:
            r.row = True
        if self.page == 1:
            self._alloc_kv(ext_total)
        else:
            # alloc_extend: the rest of each request's last page, then whole
            # pages; eviction first for the tokens plus a page per request
            pages = sum(self._ceil_page(r.ext_end) - self._ceil_page(r.prefix_len) for r in rs)
            self._alloc_kv(pages, evict_below=extend_kv_need(ext_total, len(rs), self.page))
        prepare = self.lc.prepare_extend if d.extra_buffer else None
        for r in rs:
            P = r.prefix_len
            end = r.ext_end
            r.committed = end
            r.allocated = end
            rec = r.rs
            if prepare is not None:
                prepare(0, rec, P, end - P)
            # the forward runs the copy-on-write (or clears the fresh slot)
            if rec.cow_src >= 0:
                self.copies += 1
                rec.cow_src = -1
                rec.needs_clear = 0
            elif rec.needs_clear:
                rec.needs_clear = 0
            r.chunks += 1
            items.append((r, r.epoch))
        self.clock += self.time.extend_seconds(ext_total)
        return Batch("extend", items)

    # ----------------------------------------------------------- running batch
    def _reserved_offset(self) -> float:
        """Decode tokens admission reserves for the running requests:
        sum of min(remaining outputs, clip) * new_token_ratio (O(1) from
        aggregates unless an output is longer than the clip)."""
        d = self.dcfg
        if self.agg_long:
            total = 0.0
            for r in self.running:
                self._sync(r)
                total += min(max(r.output_len - r.n_out, 0), d.clip_max_new_tokens)
            return total * d.new_token_ratio
        # sum over requests with j0 of (output_len - o_base - (res_id - j0 + 1))
        rem = (self.agg_len - self.agg_obase - self.agg_n * (self.res_id + 1) + self.agg_j0)
        for r in self.pending_join:
            if r.in_run:
                rem += max(r.output_len - r.n_out, 0)
        return rem * d.new_token_ratio

    def _agg(self, r: _R, sign: int) -> None:
        self.agg_len += sign * r.output_len
        self.agg_obase += sign * r.o_base
        self.agg_j0 += sign * r.j0
        self.agg_n += sign
        if self.page > 1:
            self.page_due[(r.j0 - r.c_base) % self.page] += sign
        if r.output_len > self.dcfg.clip_max_new_tokens:
            self.agg_long += sign

    def _add_fin(self, r: _R) -> None:
        fin = r.j0 + (r.output_len - r.o_base) - 1
        lst = self.fin_at.get(fin)
        if lst is None:
            lst = self.fin_at[fin] = []
            heapq.heappush(self.fin_heap, fin)
        lst.append((r, r.j0, r.o_base))

    def _finishing_inflight(self) -> Any:
        """The scheduler's rule, with the aggregated decode batch: its
        requests that finish at it are those fin_at lists under its number.
        They are kept (``skipped``) for this step's KV and pre-allocation."""
        self.skipped = []
        q = self.result_queue[0] if len(self.result_queue) == 1 else None
        if q is None or q.kind != "decode":
            got = super()._finishing_inflight()
            if got:
                self.skipped = [r for r in self.running if id(r) in got]
            return got
        for r, j0, o_base in self.fin_at.get(q.bid, ()):
            if r.in_run and r.j0 == j0 and r.o_base == o_base:
                self.skipped.append(r)
        return {id(r) for r in self.skipped}

    def _skipped_due(self, b: int) -> int:
        """Skipped requests whose decode in batch b would start a KV page."""
        page = self.page
        return sum(1 for r in self.skipped if r.in_run and r.j0 is not None
                   and (b - r.j0 + r.c_base) % page == 0)

    def _sync(self, r: _R) -> None:
        """Materialise a running request's committed KV length and outputs
        (with skip_finishing, no decode past the batch that finishes it)."""
        j0 = r.j0
        if j0 is not None and r.in_run:
            last = self.prep_id
            if self.skip_finishing:
                last = min(last, j0 + r.output_len - r.o_base - 1)
            done = last - j0 + 1        # decode steps it ran (none yet: <= 0)
            r.committed = r.allocated = r.c_base + done if done > 0 else r.c_base
            done = self.res_id - j0 + 1
            r.n_out = r.o_base + done if done > 0 else r.o_base

    def _leave(self, r: _R) -> None:
        self._sync(r)
        r.in_run = False
        if r.j0 is not None:
            self._agg(r, -1)
            b = self.bucket.get(r.res_key)
            if b is not None:
                b.discard(r)
                if not b:
                    del self.bucket[r.res_key]
                    self.bucket_keys.remove(r.res_key)
        r.j0 = None
        self.need_filter = True

    def _decode_tokens_needed(self) -> int:
        """KV tokens the next decode batch takes: one per request, or with
        pages a page for each request whose next token starts one (batch b
        does for an aggregated request when b = j0 - c_base mod page)."""
        page = self.page
        if page == 1:
            return len(self.running)
        n = self.page_due[self.next_bid % page] - (self._skipped_due(self.next_bid) if self.skipped else 0)
        n += sum(1 for r in self.pending_join if r.in_run and r.committed % page == 0)
        return n * page

    def _prepare_decode(self) -> Batch:
        b = self.next_bid
        self.next_bid += 1
        interval = self.interval
        for r in self.pending_join:
            if not r.in_run:
                continue
            r.j0 = b
            r.c_base = r.committed
            r.o_base = r.n_out
            r.res_key = (b - 1 - r.c_base) % interval
            got = self.bucket.get(r.res_key)
            if got is None:
                got = self.bucket[r.res_key] = set()
                bisect.insort(self.bucket_keys, r.res_key)
            got.add(r)
            self._agg(r, +1)
            self._add_fin(r)
        self.pending_join = []
        skipped = self.skipped
        if self.page == 1:
            self._alloc_kv(len(self.running))
        else:
            due_pages = self.page_due[b % self.page] - (self._skipped_due(b) if skipped else 0)
            self._alloc_kv(self.page * due_pages, evict_below=decode_kv_need(len(self.running), self.page))
        self.prep_id = b
        if self.extra_buffer and self.lazy:
            due = self.bucket.get(b % interval)
            if due:
                for r in sorted(due, key=lambda x: x.seq):
                    if not (skipped and r in skipped):
                        self._decode_prepare(r, r.c_base + (b - r.j0 + 1))
        self.skipped = []
        self.clock += self.time.step
        return Batch("decode", bid=b)

    def _decode_prepare(self, r: _R, seq_len: int) -> None:
        """The lifecycle's decode_prepare for a decode step that reaches a
        boundary in lazy mode: the second track slot it borrows comes from
        the counted pool (a state evicted when none is free)."""
        self.lc.decode_prepare(r.rs, seq_len)

    def _decode_finish(self, r: _R, seq: int, done: bool) -> None:
        self.lc.decode_finish(r.rs, seq, done)

    def _process_decode(self, batch: Batch) -> None:
        """The requests this decode result changes: those it finishes and
        those at a track boundary (the others' counters are derived)."""
        b = batch.bid
        self.res_id = b
        affected: dict = {}
        fins = self.fin_at.pop(b, None)
        if fins is not None:
            for r, j0, o_base in fins:
                if r.in_run and r.j0 == j0 and r.o_base == o_base:
                    affected[id(r)] = r
        batch_mode = self.batch_mode
        extra = self.extra_buffer
        if extra:
            boundary = self.bucket.get((b if batch_mode else self.prep_id) % self.interval)
            if boundary:
                for r in boundary:
                    if r.j0 is not None and r.j0 <= b:
                        affected[id(r)] = r
        if not affected:
            return
        todo = affected.values() if len(affected) == 1 else sorted(affected.values(), key=_by_seq)
        for r in todo:
            if not r.in_run:
                continue
            self._sync(r)
            seq = r.c_base + (b - r.j0 + 1) if batch_mode else r.committed
            self._decode_result(r, seq, r.n_out >= r.output_len, extra and r.j0 <= b)

    def _fast_forward(self) -> bool:
        """Apply k decode steps at once when nothing but counters, track
        points and (last) finishes happens in them: no request can be
        admitted (nothing waits, or the batch is full), none arrives that
        could be, the KV pool needs no eviction.  The results that change
        requests are processed in order, each with the batch counters its
        step would have had: a track boundary (extra_buffer, not lazy)
        changes only its requests' track records; a batch that finishes
        requests ends the span, as their release ends its step (not under
        0.5.23's overlap loop, where a finishing request leaves the batch
        before its result, nor in lazy mode, whose pre-allocation at a
        boundary takes slots: there the span stops before either)."""
        if self.chunked is not None or self.pending_join or self.need_filter:
            return False
        lb = self.last_batch
        if lb is None or lb.kind != "decode" or not self.running:
            return False
        if self.waiting and not self.batch_is_full:
            return False
        overlap = self.overlap
        rq = self.result_queue
        if overlap and (len(rq) != 1 or rq[0].kind != "decode"):
            return False
        P = self.prep_id
        bs = len(self.running)
        page = self.page
        # no eviction in the k steps: a request takes at most k + page - 1
        # tokens in them, and a step evicts below bs * page free with pages
        k = self.lc.kv_free // bs - (1 if page == 1 else 2 * page)
        if k < 2:
            return False
        if self.pending and not self.batch_is_full:
            # (an arrival far away, 1e308 s, gives an infinite quotient)
            k = min(k, int(min((float(self.pending[0].arrival) - self.clock) / self.time.step,
                               2.0**62)) - 1)
        heap = self.fin_heap
        fin_at = self.fin_at
        res = self.res_id
        while heap and (heap[0] not in fin_at or heap[0] <= res):
            f = heapq.heappop(heap)
            if f <= res:
                fin_at.pop(f, None)
        # a span may end with the first batch that finishes requests (their
        # release is the last thing its step does) unless a finishing
        # request leaves the batch before its result (0.5.23's overlap
        # loop) or lazy pre-allocation is due
        fin_last = self.fin_last
        if heap:
            k = min(k, heap[0] - res - (0 if fin_last else 2))
        if k < 2:
            return False
        lag = 1 if overlap else 0
        fold: list = []
        if self.extra_buffer and self.bucket:
            interval = self.interval
            batch_mode = self.batch_mode
            if self.lazy:
                if overlap and batch_mode and (P % interval) in self.bucket:
                    return False        # batch P's result (still to process) is a boundary
                # the nearest boundary after P: the first residue from P + 1 on, circularly
                keys = self.bucket_keys
                i = bisect.bisect_left(keys, (P + 1) % interval)
                d = ((keys[i] if i < len(keys) else keys[0]) - P) % interval or interval
                k = min(k, d - 2)
                if k < 2:
                    return False
            else:
                # the results the span processes: P .. P+k-1 with the
                # overlap (batch b's with P+1 prepared), else P+1 .. P+k;
                # batch b's boundary residue is b's, or in the committed
                # check the prepared batch's
                shift = 0 if batch_mode else lag
                fold = self._boundaries(P + 1 - lag + shift, k)
                if shift:
                    fold = [b - shift for b in fold]
        if res + k in fin_at:
            if not fold or fold[-1] != res + k:
                fold.append(res + k)
        # the k decode batches' KV, peaks and clock first: a finish, the
        # last result processed, gives back what the span took
        if page == 1:
            self.lc.take_kv(k * bs, 0)
        else:
            # batches P+1 .. P+k, each a page for the requests of its residue
            self.lc.take_kv(page * sum(n * ((P + k - r0) // page - (P - r0) // page)
                                       for r0, n in enumerate(self.page_due) if n), 0)
        step = self.time.step
        for _ in range(k):          # the same float sums as k single steps
            self.clock += step
        batch = Batch("decode", bid=P + k)
        if overlap:
            rq[0] = batch
        self.last_batch = batch
        for b in fold:
            self.prep_id = b + lag
            self.next_bid = b + lag + 1
            self._process_decode(Batch("decode", bid=b))
        self.next_bid = P + k + 1
        self.prep_id = P + k
        self.res_id = res + k
        return True

    def _boundaries(self, lo: int, k: int) -> list:
        """The batches b in lo .. lo+k-1 whose residue b mod interval is a
        bucket's (running requests at a track boundary there), in order."""
        interval = self.interval
        keys = self.bucket_keys
        if k >= interval:
            return sorted(b for key in keys for b in range(lo + (key - lo) % interval, lo + k, interval))
        start = lo % interval
        end = start + k             # residues start .. end-1, wrapping past interval
        i = bisect.bisect_left(keys, start)
        j = bisect.bisect_left(keys, end)
        got = [lo + key - start for key in keys[i:j]]
        if end > interval:
            got += [lo + interval - start + key for key in keys[:bisect.bisect_left(keys, end - interval)]]
        return got

    # ----------------------------------------------------------- checks
    def check(self) -> None:
        """Pool accounting: free + request-owned + tree-owned == total."""
        t_kv, t_states = self.tree.total_size()
        req_kv = 0
        req_slots = 0
        for r in self.live:
            if r.finished:
                continue
            self._sync(r)
            if r.row:
                req_kv += self._ceil_page(r.allocated) - r.rs.protected_len
            req_slots += len(self._slot_ids(r.rs))
        kv_free, slots_free = self.lc.kv_free, self.lc.slots_free
        if kv_free + req_kv + t_kv != self.kv_total:
            raise AssertionError(f"KV accounting: free {kv_free} + requests {req_kv} + "
                                 f"tree {t_kv} != {self.kv_total}")
        if slots_free + req_slots + t_states != self.slots_total:
            raise AssertionError(f"state accounting: free {slots_free} + requests "
                                 f"{req_slots} + tree {t_states} != {self.slots_total}")
        self.live = [r for r in self.live if not r.finished]

    def metrics(self) -> SimMetrics:
        m = self.m
        per = int(getattr(self.cfg, "state_bytes_per_slot", 0))
        m.state_bytes_copied = self.copies * per
        c = self.lc.counts()
        m.state_bytes_donated = c["donated"] * per
        m.peak_kv_tokens = c["peak_kv"]
        m.peak_state_slots = c["peak_slots"]
        m.full_evictions = c["full_evictions"]
        m.kv_tokens_evicted = c["kv_evicted"]
        m.state_evictions = c["states_evicted"]
        m.prefill_flops_saved = float(m.state_usable_tokens) * float(
            getattr(self.cfg, "flops_per_token", 0.0))
        m.per_turn_hit_rate = {t: (self.turn_usable[t] / self.turn_prompt[t]
                                   if self.turn_prompt[t] else 0.0)
                               for t in sorted(self.turn_prompt)}
        m.replay_distance = {b: self.distance[b] for b in sorted(self.distance)}
        ps = self.tree.policy_stats()
        m.states_admitted = int(ps["states_admitted"])
        m.states_never_used = int(ps["states_admitted"] - ps["states_used"])
        m.states_trimmed = int(ps["states_trimmed"])
        if self.cfg.lru_policy == "utility":
            m.final_utility_alpha = float(ps["alpha"])
            m.final_utility_order = "mru" if ps["mru"] else "lru"
            m.utility_tunes = int(ps["tunes"])
        if self.cfg.lru_policy == "adaptive":
            m.adaptive_inflation = float(ps["adaptive_inflation"])
            m.adaptive_ghost_hits = int(ps["ghost_hits"])
            m.adaptive_superseded = int(ps["states_superseded"])
            m.adaptive_unused_handovers = int(ps["unused_handovers"])
            m.admissions_probation = int(ps["admissions_probation"])
            m.adaptive_placements = int(ps["placements"])
            m.adaptive_end_placements = int(ps["end_placements"])
        sb = float(m.peak_state_slots) * per
        kb = float(m.peak_kv_tokens) * float(getattr(self.cfg, "kv_bytes_per_token", 0))
        m.state_memory_share = sb / (sb + kb) if sb + kb > 0 else 0.0
        return m


def replay(requests: list, config: SimConfig, progress: Optional[Callable] = None,
           check_every_step: bool = False) -> ReplayResult:
    """The state-free replay; ``check_every_step`` verifies the pool
    accounting after every scheduler iteration (slow; for tests).  Raises
    ConfigError (a ValueError) when the pools cannot hold the workload, as
    the command line does."""
    if isinstance(config, SimConfig):
        config = config.resolved()
    _validate(requests, config)
    check_feasible(requests, config)
    t0 = time.perf_counter()
    rp = _Replay(list(requests), config, progress, check_every_step)
    # the replay makes no reference cycles: the cyclic collector, which
    # would walk the trace's objects again and again, rests until it ends
    collecting = gc.isenabled()
    gc.disable()
    try:
        rp.run()
    finally:
        rp.lc.set_victims(None)
        if collecting:
            gc.enable()
    if check_every_step:
        rp.check()
    m = rp.metrics()
    total = time.perf_counter() - t0
    m.wall_seconds = {"cache": rp.t_cache, "driver": total - rp.t_cache, "total": total}
    return ReplayResult(m, dict(rp.prefixes), rp.steps)


# ---------------------------------------------------------------------------
# toy-model replay through the driver and mambaradix.sglang
# ---------------------------------------------------------------------------
def _toy_replay(requests: list, config: SimConfig) -> tuple[dict, int, int]:
    """Replays through SchedulerDriver over mambaradix.sglang with the toy
    model.  Every prefill forward compares the state the request resumes from
    (after the deferred copy-on-write or clear) with the toy model's
    recomputation of that prefix.  Returns (rid -> usable prefix, hits checked,
    mismatching states)."""
    from .. import driver as drv
    from ..toy_model import ToyRecurrentModel

    model = ToyRecurrentModel(seed=int(config.seed))
    dcfg = _driver_config(config)
    max_len = max(r.prompt_len + int(r.output_len) + 2 for r in requests) if requests else 1
    setup = drv.build_dropin(dcfg, kv_tokens=int(config.kv_tokens),
                             state_slots=int(config.state_slots), max_context_len=max_len,
                             model=model, **tree_options(config),
                             end_of_turn_states=bool(getattr(config, "end_of_turn_states", False)))
    memo: dict = {}
    counts = {"checked": 0, "bad": 0}

    def on_extend(rid: str, slot: int, prefix: np.ndarray, kind: str) -> None:
        key = prefix.tobytes()
        want = memo.get(key)
        if want is None:
            want = memo[key] = model.state_of(prefix)
        counts["checked"] += 1
        if not model.read_state(slot).equals(want):
            counts["bad"] += 1

    d = drv.SchedulerDriver(dcfg, setup.tree_cache, setup.req_to_token_pool, setup.allocator,
                            api=setup.api, model=model, on_extend=on_extend)
    order = sorted(range(len(requests)), key=lambda i: (float(requests[i].arrival), i))
    tm = TimeModel(config.decode_step_seconds, config.prefill_token_seconds)
    step_s = tm.step
    clock = 0.0
    idx = 0
    while idx < len(order) or not d.idle:
        while idx < len(order) and float(requests[order[idx]].arrival) <= clock:
            s = requests[order[idx]]
            outs = (None if s.output_ids is None
                    else np.asarray(s.output_ids[:s.output_len]).tolist())
            if outs is None:
                outs = _pseudo_outputs(s.rid, int(s.output_len)).tolist()
            d.submit(drv.DriverRequest(s.rid, np.asarray(s.input_ids).tolist(),
                                       int(s.output_len), s.extra_key, outs))
            idx += 1
        if d.idle and idx < len(order):
            clock = max(clock, float(requests[order[idx]].arrival))
            continue
        d.step()
        # the state-free replay's clock, step for step
        b = d.last_batch
        if b is None:
            if idx < len(order):
                clock = max(clock + step_s, float(requests[order[idx]].arrival))
            else:
                clock += step_s
        elif b.kind == "extend":
            clock += tm.extend_seconds(sum(data[1] - data[0] for _, _, data in b.items))
        else:
            clock += step_s
    return ({rid: rec.prefix_len for rid, rec in d.records.items()}, counts["checked"],
            counts["bad"])


def run(requests: list, config: SimConfig,
        progress: Optional[Callable[[int, int], None]] = None) -> SimMetrics:
    """Replays ``requests`` under ``config`` and returns the metrics (see the
    module docstring for every definition)."""
    if isinstance(config, SimConfig):
        config = config.resolved()
    res = replay(requests, config, progress)
    m = res.metrics
    if config.states == "toy":
        t0 = time.perf_counter()
        got, checked, bad = _toy_replay(list(requests), config)
        for rid, want in res.prefixes.items():
            if got.get(rid) != want:
                raise AssertionError(f"request {rid}: usable prefix {got.get(rid)} through "
                                     f"mambaradix.sglang, {want} in the state-free replay")
        m.state_mismatches = bad
        m.wall_seconds["toy"] = time.perf_counter() - t0
        m.wall_seconds["total"] += m.wall_seconds["toy"]
    return m
