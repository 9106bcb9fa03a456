"""SGLang v0.5.15's scheduler loop, written once for every front end.

:class:`Scheduler` is the event loop of SGLang's ``Scheduler`` with a
``MambaRadixCache``: admission like ``PrefillAdder`` (the KV budget with the
running requests' reserved decode tokens, ``max_prefill_tokens``,
``chunked_prefill_size``, the second budget check under the match's lock),
chunked prefill, continuous batching, the decode memory check and
retraction, the overlap scheduler's one-step lag (batch N+1 is prepared before
batch N's results are processed), and when a decode result is a request's
track boundary or finish.  It never touches a pool or a tree itself: a backend
supplies the primitives (match, lock, release, cache a request, allocate for a
batch, evict) and the bookkeeping of a request.  No lifecycle transition is
written here: the prefill and decode track points, the ping-pong index flips
and the lazy mode's second track slot at decode boundaries are the C
lifecycle's calls (``Lifecycle.prepare_extend``, ``decode_prepare``,
``decode_finish``), which each backend makes on a request's record.

Two backends:

- :class:`mambaradix.driver.SchedulerDriver` calls the drop-in cache and pool
  objects with SGLang's names (``match_prefix``, ``cache_unfinished_req``,
  ``HybridReqToTokenPool.alloc`` ...), and optionally runs a toy model's
  forward passes;
- the simulator's state-free replay (``mambaradix.sim.engine``) runs the same
  loop over the native tree with the pools kept as counters, and overrides the
  decode batch with its aggregated form (a decode step costs O(requests it
  changes), runs of steps that change nothing are applied in one go).

A request object of either backend exposes the same attributes to the loop:
``prompt_len``, ``output_len``, ``n_out`` (outputs so far), ``prefix_len``,
``ext_end``, ``epoch``, ``finished``, ``in_run`` (in the running batch),
``abort``, ``inflight`` (prefill chunks launched but not processed),
``is_insert`` (False once the lifecycle marked it not to insert), ``committed``.

The decision functions (:func:`match_key_limit`, :func:`prefill_track_point`,
:func:`decode_track_due`, :func:`chunk_continuation`, :func:`state_headroom`,
:func:`ping_pong_other`, :func:`keep_index`, :func:`end_of_turn`,
:func:`finish_cache_len`, and the KV evictions' :func:`extend_kv_need`,
:func:`decode_kv_need`, :func:`kv_evict`) are the C core's (``csrc/core/rules.h``, bound in
``csrc/py/py_rules.c``): the C lifecycle applies the same functions, so each
rule has one home.
"""

from __future__ import annotations

import numbers
import operator
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

from ._C import (chunk_continuation, decode_kv_need, decode_track_due, end_of_turn,  # noqa: F401
                 extend_kv_need, finish_cache_len, keep_index, kv_evict, match_key_limit, ping_pong_other,
                 prefill_track_point, request_kv_need, slots_per_req, state_headroom)

MODES = ("pp2", "pp1", "lazy", "no_buffer")

_in_run = operator.attrgetter("in_run")



# ---------------------------------------------------------------------------
# decision functions: the C core's (csrc/core/rules.h), which the C lifecycle
# applies too; here for the loop, the driver and the replay engine
# ---------------------------------------------------------------------------

#: State slots a request may need while it runs (running + ping-pong pair), the
#: eviction headroom factor of SGLang's alloc_req_slots; lazy holds one less.
STATE_FACTOR = slots_per_req(False)
STATE_FACTOR_LAZY = slots_per_req(True)


# ---------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------
@dataclass
class DriverConfig:
    """How the scheduler schedules (the driver's and the simulator's).

    mode: "pp2" (extra_buffer + overlap scheduler), "pp1" (extra_buffer without
      overlap), "lazy" (extra_buffer_lazy, overlap) or "no_buffer" (no overlap).
    chunk_size: mamba_cache_chunk_size C.
    track_interval: mamba_track_interval (decode snapshots).
    chunked_prefill_size: prompt tokens per prefill step (None: no chunking).
    max_running: max requests in the running batch (max_running_requests).
    max_prefill_tokens: prompt tokens per prefill batch (only binding without
      chunking, as in SGLang).
    match_cap: cap the match key at ``fill_len - 1`` as SGLang does.
    page_size: KV page size (1 in no_buffer mode); the KV allocator must have
      the same (a PagedTokenToKVPoolAllocator above 1).
    new_token_ratio: share of each running request's remaining output that
      admission reserves (SGLang starts at 0.7 and decays; 1.0 never retracts).
    decode_boundary: how a decode result decides that a track boundary was
      crossed.  "committed" (SGLang v0.5.15): ``kv_committed_len % interval
      == 0`` when the result is processed; under the overlap scheduler that
      length already counts the next decode batch, so the check fires one
      step early, and fires twice when a prefill batch runs between two
      decode batches (the second flip leaves ``keep`` on the stale track
      slot).  "batch": the length of the batch whose result it is (the
      direction of SGLang's later fixes); it never fires twice.  Not for
      mode "lazy", whose pre-allocation flips the index when the boundary
      batch is prepared: there SGLang's early check is the consistent one
      (a request finishing just before a boundary must register it).
    semantics: which SGLang release's cache rules the C lifecycle follows
      ("v0.5.15" or "v0.5.23", see ``mambaradix.sim.SimConfig``); under
      "v0.5.23" the state headroom before a batch's slot allocation is the
      lifecycle's admission rule alone (slots wanted, not a fixed factor).
    """

    mode: str = "pp2"
    chunk_size: int = 64
    track_interval: int = 256
    chunked_prefill_size: Optional[int] = None
    max_running: int = 64
    max_prefill_tokens: int = 16384
    match_cap: bool = True
    page_size: int = 1
    new_token_ratio: float = 1.0
    clip_max_new_tokens: int = 4096
    decode_boundary: str = "committed"
    semantics: str = "v0.5.15"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.semantics not in ("v0.5.15", "v0.5.23"):
            raise ValueError(f"semantics must be 'v0.5.15' or 'v0.5.23', got {self.semantics!r}")
        if self.decode_boundary not in ("committed", "batch"):
            raise ValueError(f"decode_boundary must be 'committed' or 'batch', "
                             f"got {self.decode_boundary!r}")
        if self.decode_boundary == "batch" and self.mode == "lazy":
            raise ValueError("decode_boundary='batch' does not fit mode 'lazy': its "
                             "pre-allocation at prepare time relies on SGLang's check")
        for name in ("chunk_size", "track_interval", "max_running", "max_prefill_tokens",
                     "page_size", "clip_max_new_tokens"):
            setattr(self, name, _positive_int(name, getattr(self, name)))
        if self.chunked_prefill_size is not None:
            self.chunked_prefill_size = _positive_int("chunked_prefill_size (or None)",
                                                      self.chunked_prefill_size)
        if not isinstance(self.match_cap, bool):
            raise TypeError(f"match_cap must be a bool, not {type(self.match_cap).__name__}")
        r = self.new_token_ratio
        if isinstance(r, bool) or not isinstance(r, numbers.Real):
            raise TypeError(f"new_token_ratio must be a number, not {type(r).__name__}")
        if not 0.0 <= r <= 1.0:     # NaN too
            raise ValueError(f"new_token_ratio must lie in [0, 1], got {r!r}")
        self.new_token_ratio = float(r)
        if self.mode == "no_buffer" and self.page_size != 1:
            raise ValueError("page_size must be 1 in no_buffer mode")
        if self.chunk_size % self.page_size:
            raise ValueError(f"chunk_size {self.chunk_size} must be a multiple of page_size "
                             f"{self.page_size}")
        if self.track_interval % self.page_size:
            raise ValueError(f"track_interval {self.track_interval} must be a multiple of "
                             f"page_size {self.page_size}")

    @property
    def extra_buffer(self) -> bool:
        return self.mode != "no_buffer"

    @property
    def lazy(self) -> bool:
        return self.mode == "lazy"

    @property
    def overlap(self) -> bool:
        return self.mode in ("pp2", "lazy")


def _positive_int(name: str, v: Any) -> int:
    """``v`` as an int >= 1: a Python or numpy integer, never a bool."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return int(v)


def retract_victim(running: list) -> Any:
    """The running request decode retraction takes next (SGLang's
    retract_decode sorts by (outputs, -prompt length), largest first, and
    pops the end): the fewest outputs, then the longest prompt, then the
    latest in the batch."""
    return min(reversed(running), key=lambda x: (x.n_out, -x.prompt_len))


class TimeModel:
    """The simulator's clock: a decode step takes ``decode_step_seconds``, a
    prefill batch ``max(decode_step_seconds, tokens * prefill_token_seconds)``."""

    __slots__ = ("step", "per_token")

    def __init__(self, decode_step_seconds: float, prefill_token_seconds: float) -> None:
        self.step = float(decode_step_seconds)
        self.per_token = float(prefill_token_seconds)

    def extend_seconds(self, tokens: int) -> float:
        return max(self.step, tokens * self.per_token)


class Batch:
    """A launched batch: ``kind`` "extend" or "decode", ``items`` whose first
    two fields are (request, the epoch it was scheduled in), and for the
    simulator's aggregated decode the batch number ``bid``."""

    __slots__ = ("kind", "items", "bid")

    def __init__(self, kind: str, items: Optional[list] = None, bid: int = -1) -> None:
        self.kind = kind
        self.items: list = [] if items is None else items
        self.bid = bid


class Scheduler:
    """The loop.  Subclasses implement the primitives named in the methods
    that raise NotImplementedError (see the module docstring)."""

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self.page = int(config.page_size)
        self.overlap = bool(config.overlap)
        self.pp_size = 2 if self.overlap else 1
        self.waiting: list = []
        self.running: list = []
        self.chunked: Any = None
        self.batch_is_full = False
        self.last_batch: Optional[Batch] = None
        self.result_queue: deque = deque()
        self.need_filter = False      # a running request finished or left
        # SGLang 0.5.23 skips the decode a finishing request would run under
        # the overlap scheduler (enable_skip_finishing_decode)
        self.v0523 = config.semantics == "v0.5.23"
        self.skip_finishing = self.overlap and self.v0523
        self.touch_calls = 0          # admission passes that reached calc_priority (0.5.23)

    # ------------------------------------------------------------- the loop
    @property
    def idle(self) -> bool:
        return (not self.waiting and not self.running and self.chunked is None
                and not self.result_queue and self.last_batch is None)

    def step(self) -> Optional[Batch]:
        """One scheduler iteration (SGLang's event loop body): with the
        overlap scheduler the new batch is launched before the previous
        batch's results are processed."""
        batch = self._get_next_batch()
        if self.overlap:
            if batch is not None:
                self._forward(batch)
                self.result_queue.append(batch)
            if self.last_batch is not None:
                self._process(self.result_queue.popleft())
        elif batch is not None:
            self._forward(batch)
            self._process(batch)
        self.last_batch = batch
        return batch

    def _get_next_batch(self) -> Optional[Batch]:
        ch = self.chunked
        if ch is not None and ch.abort:
            self._release(ch, False)
            self._finish(ch)
            self.chunked = None
        ch = self.chunked
        if ch is not None and ch.ext_end > ch.prefix_len:
            self._cache_unfinished(ch, True)
        lb = self.last_batch
        if lb is not None and lb.kind == "extend":
            # the last prefill batch joins the running batch
            before = len(self.running)
            for it in lb.items:
                x, epoch = it[0], it[1]
                if x.finished or x is ch or x.epoch != epoch or x.in_run:
                    continue
                self._join(x)
            if len(self.running) == before and lb.items:
                self.batch_is_full = False
        if self.v0523:
            # SGLang 0.5.23 drops finished requests from the running batch at
            # every step, before admission (v0.5.15: in the decode update)
            if self.need_filter:
                before = len(self.running)
                self.running = list(filter(_in_run, self.running))
                self.need_filter = False
                if len(self.running) < before:
                    self.batch_is_full = False
            if not self.running:
                self.batch_is_full = False
        new = self._get_new_prefill_batch()
        if new is not None:
            return new
        if not self.running:
            return None
        return self._update_running_batch()

    # ------------------------------------------------------------- admission
    def _num_allocatable(self) -> int:
        n = self.config.max_running - len(self.running)
        rows = self._free_rows()
        return n if n < rows else rows

    def _rem_total_tokens(self, offset: float) -> float:
        return self._kv_available() + self._kv_evictable() - offset

    def _reserved_offset(self) -> float:
        """Decode tokens admission reserves for the running requests:
        ``new_token_ratio`` of each one's remaining outputs (clipped)."""
        cfg = self.config
        off = 0.0
        for x in self.running:
            left = max(x.output_len - x.n_out, 0)
            off += min(left, cfg.clip_max_new_tokens) * cfg.new_token_ratio
        return off

    def _get_new_prefill_batch(self) -> Optional[Batch]:
        """SGLang's get_new_batch_prefill with PrefillAdder: the chunked
        request first, then waiting requests in order until one does not fit."""
        cfg = self.config
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return None
        if self._num_allocatable() <= 0 and self.chunked is None:
            self.batch_is_full = True
            return None
        if self.v0523 and self.waiting:
            # SGLang 0.5.23's calc_priority under fcfs with LRU eviction: every
            # 32nd call walks the first 128 waiting requests' prefixes, the
            # queue's head last, refreshing their recency in the tree
            if self.touch_calls % 32 == 0:
                for x in reversed(self.waiting[:128]):
                    self._touch_prefix(x)
            self.touch_calls += 1
        page = self.page
        clip = cfg.clip_max_new_tokens
        total_off = self._reserved_offset()
        cur_off = 0.0
        rem_input = float(cfg.max_prefill_tokens)
        rem_chunk = cfg.chunked_prefill_size
        can_run: list = []
        new_chunked: Any = None

        if self.chunked is not None:
            x = self.chunked
            self._refresh_fill(x)
            rem = (int(min(rem_chunk, self._rem_total_tokens(total_off))) if rem_chunk is not None
                   else int(self._rem_total_tokens(total_off)))
            if rem <= 0:
                rem = rem_chunk if rem_chunk is not None else 1
            P = x.prefix_len
            n, truncated = chunk_continuation(P, x.prompt_len + x.n_out - P, rem, page)
            self._set_extend(x, P + n)
            can_run.append(x)
            e = -(-n // page) * page
            total_off += e + (0 if truncated else min(x.output_len, clip)) + page
            cur_off += e + page
            rem_input -= e
            if rem_chunk is not None:
                rem_chunk -= e
            self.chunked = x if truncated else None

        n_taken = 0
        self._admission_begin(len(self.waiting))
        try:
            for x in self.waiting:
                if self.batch_is_full or len(can_run) >= self._num_allocatable():
                    self.batch_is_full = True
                    break
                self._match(x)
                # PrefillAdder.add_one_req
                P = x.prefix_len
                fill_len = x.prompt_len + x.n_out
                cand = fill_len - P
                total = cand + min(max(x.output_len - x.n_out, 0), clip) + page
                real_input = -(-cand // page) * page
                status = "continue"
                added = -1
                if total >= self._rem_total_tokens(total_off):
                    status = "no_token"
                elif rem_chunk is None and can_run and real_input >= rem_input:
                    status = "other"
                elif self._locked_short(x, total, total_off):
                    status = "no_token"
                elif rem_chunk is None or real_input <= rem_chunk:
                    self._set_extend(x, fill_len)
                    added = real_input
                    max_new = min(x.output_len, clip)
                else:
                    # a new chunked request: cut at the chunk budget, on a page
                    trunc = (rem_chunk // page * page + P) // page * page - P
                    if trunc <= 0:
                        status = "other"
                    else:
                        self._set_extend(x, P + trunc)
                        added = trunc
                        max_new = 0
                        new_chunked = x
                if added >= 0:
                    can_run.append(x)
                    n_taken += 1
                    self._lock(x)
                    e = -(-added // page) * page
                    total_off += e + max_new + page
                    cur_off += e + page
                    rem_input -= e
                    if rem_chunk is not None:
                        rem_chunk -= e
                    self._on_added(x)
                    if (self._rem_total_tokens(total_off) <= 0
                            or self._rem_total_tokens(cur_off) <= 0):
                        status = "no_token"
                    elif rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                        status = "other"
                if status != "continue":
                    if status == "no_token":
                        self.batch_is_full = True
                    if not can_run or can_run[-1] is not x:
                        self._drop_match(x)
                    break
        finally:
            self._admission_end()
        if not can_run:
            return None
        if n_taken:
            # admitted requests are a prefix of the waiting queue
            del self.waiting[:n_taken]
        if new_chunked is not None:
            self.chunked = new_chunked
        if self.chunked is not None:
            self.chunked.inflight += 1
        return self._prepare_extend(can_run)

    def _locked_short(self, x: Any, total: int, total_off: float) -> bool:
        """PrefillAdder's second budget check with the match locked: locking
        takes the matched path out of the evictable KV."""
        self._lock(x)
        try:
            return total >= self._rem_total_tokens(total_off)
        finally:
            self._unlock(x)

    # ------------------------------------------------------------- tracking
    def _decode_result(self, x: Any, seq: int, done: bool, tracked: bool) -> None:
        """A decode result of request x that brought it to ``seq`` tokens (as
        ``decode_boundary`` counts them): at a track boundary of a request
        tracked in this batch, the lifecycle's decode_finish
        (``_decode_finish``: it registers the snapshot, and in lazy mode
        frees the older slot or marks a finishing request whose boundary was
        not pre-allocated as not to insert); a finished request is released
        (cached unless the lifecycle marked it not to insert) and finished.
        Only a boundary makes the call: elsewhere it changes nothing."""
        if tracked and decode_track_due(seq, self.config.track_interval):
            self._decode_finish(x, seq, done)
        if done:
            self._release(x, x.is_insert)
            self._finish(x)

    # ------------------------------------------------------------- decode
    def _update_running_batch(self) -> Optional[Batch]:
        before = len(self.running)
        if self.need_filter:
            self.running = list(filter(_in_run, self.running))
            self.need_filter = False
            if len(self.running) < before:
                self.batch_is_full = False
        finishing = self._finishing_inflight() if self.skip_finishing else ()
        if finishing:
            # SGLang 0.5.23's overlap loop: a request whose in-flight result
            # ends its output leaves the batch now, not one decode later; it
            # stays in_run until that result is processed
            self.running = [x for x in self.running if id(x) not in finishing]
        if not self.running:
            if self.v0523:
                self.batch_is_full = False
            return None
        if finishing and not self._check_decode_mem():
            # their KV comes back when the in-flight result is processed:
            # no retraction, the rest decodes next step
            self.batch_is_full = False
            return None
        if len(self.running) < before:
            self.batch_is_full = False
        while not self._check_decode_mem():
            if len(self.running) == 1:
                raise RuntimeError("KV pool too small to decode a single request: "
                                   "raise kv_tokens")
            self._materialise(self.running)
            self._retract(retract_victim(self.running))
            self.batch_is_full = False
        return self._prepare_decode()

    def _finishing_inflight(self) -> Any:
        """The running requests whose result in flight (the one batch the
        overlap loop has not processed) gives their last output
        (SGLang's _reqs_finishing_inflight): a set of their id()s."""
        if len(self.result_queue) != 1:
            return ()
        ends = {id(x) for x, epoch in ((it[0], it[1]) for it in self.result_queue[0].items)
                if x.epoch == epoch and x.inflight <= 0 and x.n_out + 1 >= x.output_len}
        if not ends:
            return ()
        return {id(x) for x in self.running if id(x) in ends}

    def _decode_tokens_needed(self) -> int:
        """KV tokens the next decode step takes (SGLang's
        new_tokens_required_next_decode): one each, or with pages a whole
        page for each request whose next token starts one."""
        page = self.page
        if page == 1:
            return len(self.running)
        return page * sum(1 for x in self.running if x.committed % page == 0)

    def _check_decode_mem(self) -> bool:
        n = self._decode_tokens_needed()
        self._evict_tokens(n)
        return self._kv_available() >= n

    def _evict_tokens(self, n: int) -> None:
        evict = kv_evict(self._kv_available(), n, self.v0523)   # 0.5.23: only the shortfall
        if evict:
            self._evict_kv(evict)

    def _retract(self, x: Any) -> None:
        """Decode retraction: the request gives back everything (nothing is
        cached) and waits again from scratch."""
        self._leave_running(x)
        self._release(x, False)
        self._reset_for_retry(x)
        x.epoch += 1
        self.waiting.append(x)

    # ------------------------------------------------------------- results
    def _process(self, batch: Batch) -> None:
        if batch.kind == "extend":
            self._process_extend(batch)
        else:
            self._process_decode(batch)

    def _process_extend(self, batch: Batch) -> None:
        for it in batch.items:
            x, epoch = it[0], it[1]
            if x.epoch != epoch:
                continue
            if x.finished and x.inflight <= 0:
                continue
            if x.inflight > 0:          # a middle chunk: no output yet
                x.inflight -= 1
                continue
            if x.finished:
                continue
            self._append_output(x)
            if x.abort or x.n_out >= x.output_len:
                self._release(x, True)
                self._finish(x)
            else:
                self._cache_unfinished(x, False)

    # ------------------------------------------------------------- backend
    def _join(self, x: Any) -> None:
        """x enters the running batch."""
        x.in_run = True
        self.running.append(x)

    def _forward(self, batch: Batch) -> None:
        """The batch's forward pass (nothing by default)."""

    def _refresh_fill(self, x: Any) -> None:
        """Before the chunked request's next chunk is sized."""

    def _admission_begin(self, n: int) -> None:
        """Before the waiting queue is scanned (n requests)."""

    def _admission_end(self) -> None:
        """After the scan (also when it raised)."""

    def _on_added(self, x: Any) -> None:
        """x was added to the prefill batch."""

    def _materialise(self, xs: list) -> None:
        """Bring the requests' counters up to date before they are compared."""

    def _free_rows(self) -> int:
        raise NotImplementedError

    def _kv_available(self) -> int:
        raise NotImplementedError

    def _kv_evictable(self) -> int:
        raise NotImplementedError

    def _evict_kv(self, n: int) -> None:
        raise NotImplementedError

    def _set_extend(self, x: Any, end: int) -> None:
        raise NotImplementedError

    def _match(self, x: Any) -> None:
        raise NotImplementedError

    def _touch_prefix(self, x: Any) -> None:
        """A tree walk of a waiting request's tokens (its prompt and outputs,
        uncapped), as a match makes it (splits, recency), using nothing."""
        raise NotImplementedError

    def _lock(self, x: Any) -> None:
        raise NotImplementedError

    def _unlock(self, x: Any) -> None:
        raise NotImplementedError

    def _drop_match(self, x: Any) -> None:
        """A matched request was not admitted: its copy-on-write slot goes back."""
        raise NotImplementedError

    def _prepare_extend(self, xs: list) -> Batch:
        raise NotImplementedError

    def _prepare_decode(self) -> Batch:
        raise NotImplementedError

    def _process_decode(self, batch: Batch) -> None:
        raise NotImplementedError

    def _append_output(self, x: Any) -> None:
        raise NotImplementedError

    def _cache_unfinished(self, x: Any, chunked: bool) -> None:
        raise NotImplementedError

    def _release(self, x: Any, is_insert: bool) -> None:
        raise NotImplementedError

    def _finish(self, x: Any) -> None:
        raise NotImplementedError

    def _leave_running(self, x: Any) -> None:
        raise NotImplementedError

    def _decode_finish(self, x: Any, seq: int, done: bool) -> None:
        """The C lifecycle's decode_finish on x's record (seq tokens; done:
        this result finishes it)."""
        raise NotImplementedError

    def _reset_for_retry(self, x: Any) -> None:
        raise NotImplementedError
