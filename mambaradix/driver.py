"""A reference scheduler loop over the drop-in cache API.

:class:`SchedulerDriver` admits, prefills (optionally in chunks), decodes,
tracks, caches and finishes requests the way SGLang v0.5.15's scheduler does
with a ``MambaRadixCache``, in the ``extra_buffer`` modes (ping-pong buffer of
2 with the overlap scheduler, of 1 without it, and ``extra_buffer_lazy``) and in
``no_buffer`` mode.  It only calls the cache and pool objects it is given, with
SGLang's names (``match_prefix(MatchPrefixParams)``, ``cache_unfinished_req``,
``cache_finished_req``, ``evict(EvictParams)``, ``HybridReqToTokenPool.alloc``,
``mamba_allocator``, ``mamba_pool.copy_from`` ...), so it drives
``mambaradix.sglang`` and, where the sglang wheel imports, SGLang's own classes.

What is modelled (and how it maps to SGLang's scheduler):

- continuous batching: a waiting queue in arrival order, a running (decode)
  batch of at most ``max_running`` requests, one chunked-prefill request at a
  time; a step runs a prefill batch if one can be formed, else one decode step
  (one token per running request);
- admission like ``PrefillAdder``: KV tokens available + evictable must cover
  the new tokens plus the reserved decode tokens of every running request
  (``new_token_ratio`` of their remaining outputs), ``max_prefill_tokens`` per
  batch, ``chunked_prefill_size`` per step; a rejected request gives back the
  copy-on-write slot its match allocated;
- state-slot headroom before the request slots are allocated: when fewer than
  ``num_reqs * factor`` slots are free (factor 3, lazy 2), states are evicted;
- the track points of prefill (``P + (E // C) * C``, or the branching point)
  and decode (every ``track_interval`` tokens), the ping-pong index flips, the
  lazy mode's second slot at decode boundaries;
- the overlap scheduler (pp2 and lazy): batch N+1 is prepared and launched
  before batch N's results are processed, so decode boundaries are detected
  from ``kv_committed_len`` one step ahead, requests finished by batch N are
  still in batch N+1, and the two-buffer ownership rules matter;
- the forward pass of a :class:`~mambaradix.toy_model.ToyRecurrentModel`
  (optional): deferred clears and copy-on-writes first, then each request's
  running slot advances over its new tokens and track points are written into
  the track slots; decode boundaries copy running -> track slot;
- aborts (waiting, chunked or running requests) and decode retraction when the
  KV pool runs out;
- paged KV (``page_size`` > 1, a ``PagedTokenToKVPoolAllocator``): extend and
  decode take KV through ``alloc_extend`` / ``alloc_decode`` with each
  request's last KV index, evicting first for the batch plus a page per
  request as SGLang's alloc_for_extend / alloc_for_decode do; the decode
  memory check counts a page for each request whose next token starts one.

Windows where SGLang v0.5.15 hands the tree a snapshot from another position
(reproduced here, shown by tests/sim/test_driver.py, and visible in the
simulator's toy mode as ``state_mismatches``):

- pp2: the decode boundary check on ``kv_committed_len`` fires twice when a
  prefill batch runs right after the boundary decode batch, so ``keep``
  names the older track slot (``decode_boundary="batch"`` avoids it);
- lazy: a prefill whose first decode step is a boundary is cached after that
  step's pre-allocation flipped ``next``, so the prefill key gets the
  boundary snapshot; and a boundary whose registration is missed (a prefill
  batch in between) leaves ``next`` on the new snapshot while
  ``mamba_last_track_seqlen`` stays at the previous boundary.

The pure decision functions at the top (:func:`match_key_limit`,
:func:`prefill_track_point`, :func:`decode_track_due`,
:func:`chunk_continuation`, :func:`state_headroom`)
are shared with the simulator's state-free replay engine.

torch is imported lazily: the drop-in objects hold torch tensors.
"""

from __future__ import annotations

import types
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

MODES = ("pp2", "pp1", "lazy", "no_buffer")

#: State slots a request may need while it runs (running + ping-pong pair), the
#: eviction headroom factor of SGLang's alloc_req_slots; lazy holds one less.
STATE_FACTOR = 3
STATE_FACTOR_LAZY = 2


# ---------------------------------------------------------------------------
# decision functions shared with the replay engine
# ---------------------------------------------------------------------------
def match_key_limit(fill_len: int, match_cap: bool) -> int:
    """Tokens of the request's fill ids the prefix match may cover: SGLang caps
    it at ``fill_len - 1`` (one token must be computed to produce logits)."""
    if fill_len < 0:
        raise ValueError(f"fill_len must be >= 0, got {fill_len}")
    return max(fill_len - 1, 0) if match_cap else fill_len


def prefill_track_point(prefix_len: int, extend_len: int, chunk_size: int,
                        branching_seqlen: Optional[int]) -> Optional[int]:
    """The sequence length whose state an extend of ``extend_len`` tokens after
    ``prefix_len`` cached ones snapshots in extra_buffer mode, or None.

    Tracked when ``extend_len >= chunk_size``: normally ``prefix_len +
    (extend_len // chunk_size) * chunk_size``; when the match reported a
    branching point ``B`` with ``prefix_len < B < prefix_len + extend_len`` and
    ``(B - prefix_len) % chunk_size == 0``, the state at ``B`` instead."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    if extend_len < chunk_size:
        return None
    end = prefix_len + extend_len
    aligned = prefix_len + (extend_len // chunk_size) * chunk_size
    if (branching_seqlen is not None and prefix_len < branching_seqlen < end
            and (branching_seqlen - prefix_len) % chunk_size == 0):
        aligned = branching_seqlen
    return aligned


def decode_track_due(seq_len: int, interval: int) -> bool:
    """A decode step that brings a request to ``seq_len`` tokens snapshots its
    state when ``seq_len`` is a multiple of ``mamba_track_interval``."""
    return seq_len % interval == 0


def chunk_continuation(prefix_len: int, cand: int, budget: int, page_size: int) -> tuple:
    """How much of its remaining ``cand`` tokens the chunked request prefills
    next, given ``budget`` tokens (SGLang's add_chunked_req):
    ``(extend_len, truncated)``.

    A cut (``truncated``) ends on a page boundary: SGLang v0.5.15 cuts at
    ``budget`` wherever it falls, so with pages a later snapshot can land off
    the page grid, where its ``cache_unfinished_req`` asserts; later versions
    round the cut down (``floor_chunked_tokens``).  Here it is rounded down to
    a page, or up to the next page when that would leave nothing."""
    n = min(cand, budget)
    if page_size > 1 and n < cand:
        end = (prefix_len + n) // page_size * page_size
        if end <= prefix_len:
            end = (prefix_len // page_size + 1) * page_size
        n = min(end - prefix_len, cand)
    return n, n < cand


def state_headroom(available: int, num_reqs: int, lazy: bool) -> int:
    """States to evict before allocating request slots for ``num_reqs``
    requests when only ``available`` slots are free (SGLang's alloc_req_slots):
    ``max(0, num_reqs * factor - available)`` when short, else 0."""
    need = num_reqs * (STATE_FACTOR_LAZY if lazy else STATE_FACTOR)
    return need - available if available < need else 0


# ---------------------------------------------------------------------------
# configuration and requests
# ---------------------------------------------------------------------------
@dataclass
class DriverConfig:
    """How the driver schedules.

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

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.decode_boundary not in ("committed", "batch"):
            raise ValueError(f"decode_boundary must be 'committed' or 'batch', "
                             f"got {self.decode_boundary!r}")
        if self.decode_boundary == "batch" and self.mode == "lazy":
            raise ValueError("decode_boundary='batch' does not fit mode 'lazy': its "
                             "pre-allocation at prepare time relies on SGLang's check")
        for name in ("chunk_size", "track_interval", "max_running", "max_prefill_tokens",
                     "page_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.chunked_prefill_size is not None and (
                not isinstance(self.chunked_prefill_size, int) or self.chunked_prefill_size <= 0):
            raise ValueError(f"chunked_prefill_size must be None or a positive int, "
                             f"got {self.chunked_prefill_size!r}")
        if self.mode == "no_buffer" and self.page_size != 1:
            raise ValueError("page_size must be 1 in no_buffer mode")

    @property
    def extra_buffer(self) -> bool:
        return self.mode != "no_buffer"

    @property
    def lazy(self) -> bool:
        return self.mode == "lazy"

    @property
    def overlap(self) -> bool:
        return self.mode in ("pp2", "lazy")


@dataclass
class DriverRequest:
    """A request to run.

    input_ids: prompt token ids.
    output_len: tokens to decode (>= 1).
    output_ids: the tokens it decodes (default: deterministic pseudo tokens).
    """

    rid: str
    input_ids: Sequence[int]
    output_len: int = 1
    extra_key: Optional[str] = None
    output_ids: Optional[Sequence[int]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.output_len, (int, np.integer)) or self.output_len < 1:
            raise ValueError(f"output_len must be an int >= 1, got {self.output_len!r}")
        if len(self.input_ids) < 1:
            raise ValueError(f"input_ids of request {self.rid!r} must not be empty")
        if self.output_ids is not None and len(self.output_ids) < self.output_len:
            raise ValueError(f"output_ids of request {self.rid!r} shorter than output_len")


def pseudo_token(rid: str, k: int) -> int:
    """Deterministic pseudo output token ``k`` of request ``rid``."""
    h = 1469598103934665603
    for ch in f"{rid}#{k}".encode():
        h = ((h ^ ch) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return int(h % 150000) + 1


@dataclass
class RequestRecord:
    """What happened to one request (filled in as it runs)."""

    rid: str
    prompt_len: int
    prefix_len: Optional[int] = None      # usable prefix at first admission
    branching_seqlen: Optional[int] = None
    admitted_step: Optional[int] = None
    finished_step: Optional[int] = None
    aborted: bool = False
    retractions: int = 0
    chunks: int = 0
    output: list = field(default_factory=list)


class _Info:
    """Driver-side bookkeeping of one request."""

    __slots__ = ("spec", "req", "tokens", "epoch", "finished", "abort_pending",
                 "record", "is_insert", "admitted")

    def __init__(self, spec: DriverRequest, req: Any, tokens: list, record: RequestRecord):
        self.spec = spec
        self.req = req
        self.tokens = tokens          # prompt + planned outputs (+2 spare)
        self.epoch = 0
        self.finished = False
        self.abort_pending = False
        self.record = record
        self.is_insert = True
        self.admitted = False


class _Batch:
    """A launched batch: its requests (with the epoch they were scheduled in)
    and what its forward pass does."""

    __slots__ = ("kind", "items", "chunked")

    def __init__(self, kind: str) -> None:
        self.kind = kind              # "extend" | "decode"
        self.items: list = []         # (info, epoch, forward data)
        self.chunked: Optional[_Info] = None


# ---------------------------------------------------------------------------
# API namespace helpers
# ---------------------------------------------------------------------------
def sglang_api() -> types.SimpleNamespace:
    """The parameter classes and Req factory of ``mambaradix.sglang``."""
    from . import sglang as m  # type: ignore[attr-defined]

    return api_from_module(m)


def api_from_module(m: Any) -> types.SimpleNamespace:
    """Build the driver's API namespace from a module exposing SGLang's names
    (``RadixKey``, ``MatchPrefixParams``, ``EvictParams``, ``Req`` and, if
    present, ``SamplingParams``)."""
    ns = types.SimpleNamespace(
        RadixKey=m.RadixKey, MatchPrefixParams=m.MatchPrefixParams,
        EvictParams=m.EvictParams, Req=m.Req,
        SamplingParams=getattr(m, "SamplingParams", None))
    return ns


def _make_req(api: Any, rid: str, input_ids: list, max_new_tokens: int,
              extra_key: Optional[str]) -> Any:
    factory = getattr(api, "make_req", None)
    if factory is not None:
        return factory(rid, input_ids, max_new_tokens, extra_key)
    ids = array("q", input_ids)
    sp = None
    if api.SamplingParams is not None:
        sp = api.SamplingParams(max_new_tokens=max_new_tokens, temperature=0)
    try:
        req = api.Req(rid=rid, origin_text="", origin_input_ids=ids, sampling_params=sp,
                      extra_key=extra_key)
    except TypeError:
        req = api.Req(rid, "", ids, sp)
        req.extra_key = extra_key
    return req


# ---------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------
class SchedulerDriver:
    """Runs requests through a cache and its pools the way SGLang's scheduler does.

    tree_cache: the ``MambaRadixCache`` (ours or SGLang's).
    req_to_token_pool: its ``HybridReqToTokenPool``.
    token_to_kv_pool_allocator: its KV allocator.
    api: namespace with ``RadixKey``, ``MatchPrefixParams``, ``EvictParams``,
      ``Req`` (and optional ``SamplingParams`` or a ``make_req(rid, ids,
      max_new_tokens, extra_key)`` factory); default :func:`sglang_api`.
    model: a bound :class:`~mambaradix.toy_model.ToyRecurrentModel` to run the
      forward passes on the pool's state tensors (None: no state math).
    on_extend: called as ``on_extend(rid, slot, prefix_tokens, kind)`` in each
      extend forward after the deferred copy-on-write/clear and before the
      request's tokens run; ``kind`` is "hit" (state restored from the tree),
      "fresh" (cleared slot) or "continue" (next prefill chunk).
    on_step: called after every step with the driver (for invariant checks).
    alloc_req_slots: the scheduler's admission, called as
      ``alloc_req_slots(req_to_token_pool, reqs, tree_cache)`` (SGLang's own
      function, for example); default: the state headroom eviction below,
      then ``req_to_token_pool.alloc``.
    """

    def __init__(self, config: DriverConfig, tree_cache: Any, req_to_token_pool: Any,
                 token_to_kv_pool_allocator: Any, api: Any = None, model: Any = None,
                 on_extend: Optional[Callable[[str, int, np.ndarray, str], None]] = None,
                 on_step: Optional[Callable[["SchedulerDriver"], None]] = None,
                 alloc_req_slots: Optional[Callable[[Any, list, Any], Any]] = None) -> None:
        import torch  # the drop-in objects are torch based

        kv_page = int(getattr(token_to_kv_pool_allocator, "page_size", 1))
        if kv_page != config.page_size:
            raise ValueError(f"SchedulerDriver: token_to_kv_pool_allocator has page_size "
                             f"{kv_page} but config.page_size is {config.page_size} (use a "
                             f"PagedTokenToKVPoolAllocator of the same page size)")
        self._torch = torch
        self.config = config
        self.tree_cache = tree_cache
        self.req_to_token_pool = req_to_token_pool
        self.allocator = token_to_kv_pool_allocator
        self.api = api if api is not None else sglang_api()
        self.model = model
        self.on_extend = on_extend
        self.on_step = on_step
        self.alloc_req_slots = alloc_req_slots
        self.waiting: list[_Info] = []
        self.running: list[_Info] = []
        self.chunked: Optional[_Info] = None
        self.batch_is_full = False
        self.last_batch: Optional[_Batch] = None
        self.result_queue: deque = deque()
        self.infos: dict[str, _Info] = {}
        self._live: dict[str, _Info] = {}
        self.records: dict[str, RequestRecord] = {}
        self.step_count = 0
        self.stats = {"prefill_batches": 0, "decode_steps": 0, "retractions": 0,
                      "cow_copies": 0, "clears": 0}

    # ------------------------------------------------------------- public API
    def submit(self, request: DriverRequest) -> None:
        """Queue a request (arrival order)."""
        if request.rid in self.infos:
            raise ValueError(f"duplicate request id {request.rid!r}")
        prompt = [int(t) for t in request.input_ids]
        if request.output_ids is not None:
            outs = [int(t) for t in request.output_ids[:request.output_len]]
        else:
            outs = [pseudo_token(request.rid, k) for k in range(request.output_len)]
        spare = [pseudo_token(request.rid, request.output_len + k) for k in range(2)]
        req = _make_req(self.api, request.rid, prompt, request.output_len, request.extra_key)
        if getattr(req, "extra_key", None) != request.extra_key:
            req.extra_key = request.extra_key
        rec = RequestRecord(request.rid, len(prompt))
        info = _Info(request, req, prompt + outs + spare, rec)
        self.infos[request.rid] = info
        self._live[request.rid] = info
        self.records[request.rid] = rec
        self.waiting.append(info)

    def abort(self, rid: str) -> None:
        """Abort a request wherever it is (as SGLang's abort_request does)."""
        info = self.infos.get(rid)
        if info is None:
            raise KeyError(f"unknown request id {rid!r}")
        if info.finished:
            return
        info.record.aborted = True
        if info in self.waiting:
            self.waiting.remove(info)
            self._release(info, is_insert=False)
            self._finish(info)
        elif info is self.chunked:
            info.abort_pending = True
        else:
            info.abort_pending = True  # finishes (and is cached) at its next result

    @property
    def idle(self) -> bool:
        return (not self.waiting and not self.running and self.chunked is None
                and not self.result_queue and self.last_batch is None)

    def live_requests(self) -> list[Any]:
        """Reqs that may own pool resources (not finished)."""
        return [i.req for i in self._live.values()]

    def run(self, max_steps: int = 10_000_000) -> None:
        """Step until every request finished."""
        while not self.idle:
            if self.step_count >= max_steps:
                raise RuntimeError(f"not idle after {max_steps} steps")
            self.step()

    # ------------------------------------------------------------- one step
    def step(self) -> None:
        """One scheduler iteration (SGLang's event loop body)."""
        self.step_count += 1
        batch = self._get_next_batch()
        if self.config.overlap:
            if batch is not None:
                self._forward(batch)
                self.result_queue.append(batch)
            if self.last_batch is not None:
                self._process(self.result_queue.popleft())
        elif batch is not None:
            self._forward(batch)
            self._process(batch)
        self.last_batch = batch
        if self.on_step is not None:
            self.on_step(self)

    # ------------------------------------------------------------- helpers
    def _fill(self, info: _Info) -> list:
        req = info.req
        return list(req.origin_input_ids) + list(req.output_ids)

    def _set_fill(self, info: _Info) -> None:
        req = info.req
        req.full_untruncated_fill_ids = array("q", list(req.origin_input_ids)
                                              + list(req.output_ids))

    def _finish(self, info: _Info) -> None:
        info.finished = True
        self._live.pop(info.spec.rid, None)
        info.record.finished_step = self.step_count
        info.record.output = list(info.req.output_ids)

    def _release(self, info: _Info, is_insert: bool) -> None:
        """SGLang's release_kv_cache."""
        req = info.req
        if req.req_pool_idx is None:
            if req.mamba_pool_idx is not None:
                self.req_to_token_pool.mamba_allocator.free(req.mamba_pool_idx.reshape(1))
                req.mamba_pool_idx = None
            return
        self.tree_cache.cache_finished_req(req, is_insert=is_insert)
        if req.req_pool_idx is None:
            return
        start = req.kv_committed_len
        end = req.kv_allocated_len
        if hasattr(req, "pop_overallocated_kv_cache"):
            start, end = req.pop_overallocated_kv_cache()
        if start < end:
            self.allocator.free(
                self.req_to_token_pool.req_to_token[req.req_pool_idx, start:end].to(
                    self._torch.int64))
        self.req_to_token_pool.free(req)

    def _evict_tokens(self, num_tokens: int) -> None:
        if self.allocator.available_size() < num_tokens:
            self.tree_cache.evict(self.api.EvictParams(num_tokens=num_tokens))

    def _alloc_tokens(self, num_tokens: int) -> Any:
        self._evict_tokens(num_tokens)
        out = self.allocator.alloc(num_tokens)
        if out is None:
            raise RuntimeError(f"KV pool exhausted allocating {num_tokens} tokens "
                               f"(available {self.allocator.available_size()})")
        return out

    def _alloc_extend(self, reqs: list, ext_total: int) -> Any:
        """KV for an extend batch (SGLang's alloc_for_extend): token by token
        at page size 1; with pages, ``alloc_extend`` fills each request's last
        partial page (after its last KV index) and then takes whole pages,
        after evicting for the batch's tokens plus a page per request."""
        torch = self._torch
        page = self.config.page_size
        if page == 1:
            return self._alloc_tokens(ext_total)
        self._evict_tokens(ext_total + len(reqs) * page)
        prefix = torch.tensor([len(r.prefix_indices) for r in reqs], dtype=torch.int64)
        seq = torch.tensor([r.extend_range.end for r in reqs], dtype=torch.int64)
        last = torch.tensor([int(r.prefix_indices[-1]) if len(r.prefix_indices) else -1
                             for r in reqs], dtype=torch.int64)
        out = self.allocator.alloc_extend(prefix, prefix, seq, seq, last, ext_total)
        if out is None:
            raise RuntimeError(f"KV pool exhausted allocating {ext_total} tokens in pages of "
                               f"{page} (available {self.allocator.available_size()})")
        return out

    def _decode_tokens_needed(self) -> int:
        """KV tokens the next decode step takes (SGLang's
        new_tokens_required_next_decode): one each, or with pages a whole
        page for each request whose next token starts one."""
        page = self.config.page_size
        if page == 1:
            return len(self.running)
        return page * sum(1 for i in self.running if i.req.kv_committed_len % page == 0)

    def _alloc_decode(self) -> Any:
        """KV for one decode step (SGLang's alloc_for_decode)."""
        torch = self._torch
        page = self.config.page_size
        if page == 1:
            return self._alloc_tokens(len(self.running))
        self._evict_tokens(len(self.running) * page)
        table = self.req_to_token_pool.req_to_token
        reqs = [i.req for i in self.running]
        last = torch.tensor([int(table[r.req_pool_idx, r.kv_committed_len - 1]) for r in reqs],
                            dtype=torch.int64)
        seq = torch.tensor([r.kv_committed_len + 1 for r in reqs], dtype=torch.int64)
        out = self.allocator.alloc_decode(seq, seq, last)
        if out is None:
            raise RuntimeError(f"KV pool exhausted allocating a decode step in pages of {page} "
                               f"(available {self.allocator.available_size()})")
        return out

    def _match(self, info: _Info) -> None:
        """Req.init_next_round_input with the tree (copy-on-write match)."""
        req = info.req
        self._set_fill(info)
        fill = req.full_untruncated_fill_ids
        limit = match_key_limit(len(fill), self.config.match_cap)
        key = self.api.RadixKey(array("q", fill[:limit]), req.extra_key)
        res = self.tree_cache.match_prefix(
            self.api.MatchPrefixParams(key=key, cow_mamba=True, req=req))
        req.prefix_indices = res.device_indices
        req.last_node = res.last_device_node
        req.mamba_branching_seqlen = res.mamba_branching_seqlen
        cpl = getattr(res, "cache_protected_len", None)
        req.cache_protected_len = len(req.prefix_indices) if cpl is None else cpl

    # ------------------------------------------------------------- scheduling
    def _get_next_batch(self) -> Optional[_Batch]:
        # pending abort of the chunked request
        if self.chunked is not None and self.chunked.abort_pending:
            info = self.chunked
            self._release(info, is_insert=False)
            self._finish(info)
            self.chunked = None
        exclude: set = set()
        if self.chunked is not None:
            exclude.add(id(self.chunked))
            req = self.chunked.req
            if req.extend_range.end > len(req.prefix_indices):
                self.tree_cache.cache_unfinished_req(req, chunked=True)
        if self.last_batch is not None and self.last_batch.kind == "extend":
            before = len(self.running)
            seen = {id(i) for i in self.running}
            for info, epoch, _ in self.last_batch.items:
                if (info.finished or id(info) in exclude or info.epoch != epoch
                        or id(info) in seen):
                    continue
                self.running.append(info)
                seen.add(id(info))
            if len(self.running) == before and self.last_batch.items:
                self.batch_is_full = False
        new = self._get_new_prefill_batch()
        if new is not None:
            return new
        if not self.running:
            return None
        return self._update_running_batch()

    def _num_allocatable(self) -> int:
        return min(self.config.max_running - len(self.running),
                   self.req_to_token_pool.available_size())

    def _rem_total_tokens(self, offset: float) -> float:
        return (self.allocator.available_size() + self.tree_cache.full_evictable_size()
                - offset)

    def _reserved_offset(self) -> float:
        cfg = self.config
        off = 0.0
        for info in self.running:
            req = info.req
            left = max(info.spec.output_len - len(req.output_ids), 0)
            off += min(left, cfg.clip_max_new_tokens) * cfg.new_token_ratio
        return off

    def _get_new_prefill_batch(self) -> Optional[_Batch]:
        cfg = self.config
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return None
        if self._num_allocatable() <= 0 and self.chunked is None:
            self.batch_is_full = True
            return None
        page = cfg.page_size
        total_off = self._reserved_offset()
        cur_off = 0.0
        rem_input = float(cfg.max_prefill_tokens)
        rem_chunk = cfg.chunked_prefill_size
        can_run: list[_Info] = []
        new_chunked: Optional[_Info] = None

        def ceil_page(n: int) -> int:
            return -(-n // page) * page

        def charge(extend_len: int, max_new: int) -> None:
            nonlocal total_off, cur_off, rem_input, rem_chunk
            extend_len = ceil_page(extend_len)
            total_off += extend_len + max_new + page
            cur_off += extend_len + page
            rem_input -= extend_len
            if rem_chunk is not None:
                rem_chunk -= extend_len

        def budget_ok() -> str:
            if (self._rem_total_tokens(total_off) <= 0
                    or self._rem_total_tokens(cur_off) <= 0):
                return "no_token"
            if rem_input <= 0:
                return "other"
            if rem_chunk is not None and rem_chunk <= 0:
                return "other"
            return "continue"

        if self.chunked is not None:
            info = self.chunked
            req = info.req
            self._set_fill(info)
            rem = (int(min(rem_chunk, self._rem_total_tokens(total_off)))
                   if rem_chunk is not None else int(self._rem_total_tokens(total_off)))
            if rem <= 0:
                rem = rem_chunk if rem_chunk is not None else 1
            cand = len(req.full_untruncated_fill_ids) - len(req.prefix_indices)
            n, truncated = chunk_continuation(len(req.prefix_indices), cand, rem, page)
            req.set_extend_range(len(req.prefix_indices), len(req.prefix_indices) + n)
            can_run.append(info)
            charge(n, 0 if truncated else min(info.spec.output_len, cfg.clip_max_new_tokens))
            self.chunked = info if truncated else None

        group = getattr(self.req_to_token_pool.mamba_allocator, "alloc_group_begin", None)
        if group is not None:
            group(len(self.waiting))
        try:
            for info in list(self.waiting):
                if len(can_run) >= self._num_allocatable():
                    self.batch_is_full = True
                if self.batch_is_full:
                    break
                req = info.req
                self._match(info)
                res = self._add_one(info, can_run, total_off, cur_off, rem_input, rem_chunk,
                                    page)
                if res[0] == "added" or res[0] == "added_chunked":
                    _, ext, max_new = res
                    can_run.append(info)
                    self.tree_cache.inc_lock_ref(req.last_node)
                    charge(ext, max_new)
                    if res[0] == "added_chunked":
                        new_chunked = info
                    status = budget_ok()
                else:
                    status = res[0]
                if status != "continue":
                    if status == "no_token":
                        self.batch_is_full = True
                    if not can_run or can_run[-1] is not info:
                        req.mamba_cow_src_index = None
                        req.mamba_needs_clear = False
                        if req.mamba_pool_idx is not None:
                            self.req_to_token_pool.mamba_allocator.free(
                                req.mamba_pool_idx.reshape(1))
                            req.mamba_pool_idx = None
                    break
        finally:
            end = getattr(self.req_to_token_pool.mamba_allocator, "alloc_group_end", None)
            if end is not None:
                end()
        if not can_run:
            return None
        run_ids = {id(i) for i in can_run}
        self.waiting = [i for i in self.waiting if id(i) not in run_ids]
        if new_chunked is not None:
            self.chunked = new_chunked
        batch = _Batch("extend")
        batch.chunked = self.chunked
        if self.chunked is not None:
            self.chunked.req.inflight_middle_chunks = getattr(
                self.chunked.req, "inflight_middle_chunks", 0) + 1
        for info in can_run:
            if not info.admitted:
                info.admitted = True
                info.record.prefix_len = len(info.req.prefix_indices)
                info.record.branching_seqlen = info.req.mamba_branching_seqlen
                info.record.admitted_step = self.step_count
            info.record.chunks += 1
        self._prepare_extend(batch, can_run)
        self.stats["prefill_batches"] += 1
        return batch

    def _add_one(self, info: _Info, can_run: list, total_off: float, cur_off: float,
                 rem_input: float, rem_chunk: Optional[int], page: int) -> tuple:
        """PrefillAdder.add_one_req: ("added", extend_len, max_new),
        ("added_chunked", extend_len, 0) or a rejection status."""
        cfg = self.config
        req = info.req
        fill_len = len(req.full_untruncated_fill_ids)
        prefix_len = len(req.prefix_indices)
        max_new = min(max(info.spec.output_len - len(req.output_ids), 0),
                      cfg.clip_max_new_tokens)
        cand = fill_len - prefix_len
        total = cand + max_new + page
        real_input = -(-cand // page) * page
        if total >= self._rem_total_tokens(total_off):
            return ("no_token",)
        if rem_chunk is None and can_run and real_input >= rem_input:
            return ("other",)
        # under the (temporary) lock the evictable size can only shrink
        self.tree_cache.inc_lock_ref(req.last_node)
        try:
            if total >= self._rem_total_tokens(total_off):
                return ("no_token",)
        finally:
            self.tree_cache.dec_lock_ref(req.last_node)
        if rem_chunk is None or real_input <= rem_chunk:
            req.set_extend_range(prefix_len, fill_len)
            return ("added", real_input, min(info.spec.output_len, cfg.clip_max_new_tokens))
        trunc = rem_chunk // page * page
        if trunc <= 0:
            return ("other",)
        now = (trunc + prefix_len) // page * page
        trunc = now - prefix_len
        if trunc <= 0:
            return ("other",)
        req.set_extend_range(prefix_len, prefix_len + trunc)
        return ("added_chunked", trunc, 0)

    def _prepare_extend(self, batch: _Batch, infos: list[_Info]) -> None:
        torch = self._torch
        cfg = self.config
        pool = self.req_to_token_pool
        reqs = [i.req for i in infos]
        if self.alloc_req_slots is not None:
            self.alloc_req_slots(pool, reqs, self.tree_cache)
        else:
            # state-slot headroom, then request slots (HybridReqToTokenPool.alloc)
            evict = state_headroom(pool.mamba_allocator.available_size(), len(reqs), cfg.lazy)
            if evict > 0:
                self.tree_cache.evict(self.api.EvictParams(num_tokens=0, mamba_num=evict))
            if pool.alloc(reqs) is None:
                raise RuntimeError("request slots exhausted: lower max_running")
        ext_total = sum(r.extend_range.end - len(r.prefix_indices) for r in reqs)
        out = self._alloc_extend(reqs, ext_total)
        pt = 0
        for info in infos:
            req = info.req
            P = len(req.prefix_indices)
            end = req.extend_range.end
            E = end - P
            if P:
                pool.write((req.req_pool_idx, slice(0, P)), req.prefix_indices.to(torch.int32))
            pool.write((req.req_pool_idx, slice(P, end)), out[pt:pt + E].to(torch.int32))
            pt += E
            req.kv_committed_len = end
            req.kv_allocated_len = end
            if hasattr(req, "kv_committed_freed"):
                req.kv_committed_freed = False
            if hasattr(req, "kv_overallocated_freed"):
                req.kv_overallocated_freed = False
            track = None
            if cfg.extra_buffer:
                buf = req.mamba_ping_pong_track_buffer
                track_slot = int(buf[req.mamba_next_track_idx])
                point = prefill_track_point(P, E, cfg.chunk_size, req.mamba_branching_seqlen)
                if point is not None:
                    if not cfg.lazy:
                        req.mamba_next_track_idx = pool.get_mamba_ping_pong_other_idx(
                            req.mamba_next_track_idx)
                    req.mamba_last_track_seqlen = point
                    track = (point - P, track_slot)
            # deferred copy-on-write / clear (executed by the forward pass)
            kind = "continue"
            cow = None
            if req.mamba_cow_src_index is not None:
                cow = (int(req.mamba_cow_src_index.reshape(-1)[0]), int(req.mamba_pool_idx))
                req.mamba_cow_src_index = None
                req.mamba_needs_clear = False
                kind = "hit"
            elif req.mamba_needs_clear:
                cow = (None, int(req.mamba_pool_idx))
                req.mamba_needs_clear = False
                kind = "fresh"
            elif P == 0 and info.record.chunks == 1:
                kind = "fresh"
            batch.items.append((info, info.epoch,
                                (P, end, track, cow, kind, int(req.mamba_pool_idx))))

    def _check_decode_mem(self) -> bool:
        n = self._decode_tokens_needed()
        self._evict_tokens(n)
        return self.allocator.available_size() >= n

    def _update_running_batch(self) -> Optional[_Batch]:
        before = len(self.running)
        self.running = [i for i in self.running if not i.finished]
        if len(self.running) < before:
            self.batch_is_full = False
        if not self.running:
            return None
        while not self._check_decode_mem():
            if len(self.running) == 1:
                raise RuntimeError("KV pool too small to decode a single request")
            victim = max(self.running, key=lambda i: (len(i.req.output_ids),
                                                      -len(i.req.origin_input_ids)))
            self._retract(victim)
            self.batch_is_full = False
        return self._prepare_decode()

    def _retract(self, info: _Info) -> None:
        req = info.req
        self.running.remove(info)
        self._release(info, is_insert=False)
        req.prefix_indices = self._torch.empty((0,), dtype=self._torch.int64)
        req.last_node = None
        req.cache_protected_len = 0
        req.extend_range = None
        req.inflight_middle_chunks = 0
        req.mamba_pool_idx = None
        req.mamba_ping_pong_track_buffer = None
        req.mamba_next_track_idx = None
        req.mamba_last_track_seqlen = None
        req.mamba_branching_seqlen = None
        req.mamba_cow_src_index = None
        req.mamba_needs_clear = False
        req.kv_allocated_len = 0
        req.kv_committed_len = 0
        if hasattr(req, "mamba_lazy_is_insert"):
            req.mamba_lazy_is_insert = True
        info.epoch += 1
        info.record.retractions += 1
        self.stats["retractions"] += 1
        self.waiting.append(info)

    def _prepare_decode(self) -> _Batch:
        torch = self._torch
        cfg = self.config
        pool = self.req_to_token_pool
        batch = _Batch("decode")
        out = self._alloc_decode()
        for k, info in enumerate(self.running):
            req = info.req
            pos = req.kv_committed_len          # position of the input token
            pool.write((req.req_pool_idx, slice(pos, pos + 1)), out[k:k + 1].to(torch.int32))
            req.kv_committed_len += 1
            req.kv_allocated_len += 1
            seq_len = req.kv_committed_len
            track = None
            if cfg.extra_buffer:
                due = decode_track_due(seq_len, cfg.track_interval)
                if cfg.lazy and due:
                    self._lazy_prealloc(req)
                if due:
                    track = int(req.mamba_ping_pong_track_buffer[req.mamba_next_track_idx])
            batch.items.append((info, info.epoch, (pos, track, int(req.mamba_pool_idx))))
        self.stats["decode_steps"] += 1
        return batch

    def _lazy_prealloc(self, req: Any) -> None:
        pool = self.req_to_token_pool
        buf = req.mamba_ping_pong_track_buffer
        other = 1 - req.mamba_next_track_idx
        if int(buf[other]) != -1:
            return
        slot = pool.mamba_allocator.alloc(1)
        if slot is None:
            self.tree_cache.evict(self.api.EvictParams(num_tokens=0, mamba_num=1))
            slot = pool.mamba_allocator.alloc(1)
        if slot is not None:
            pool.set_mamba_ping_pong_slot(req, other, slot[0])
            req.mamba_next_track_idx = other

    # ------------------------------------------------------------- forward
    def _forward(self, batch: _Batch) -> None:
        torch = self._torch
        mpool = self.req_to_token_pool.mamba_pool
        if batch.kind == "extend":
            clears = [c[1] for _, _, d in batch.items if (c := d[3]) is not None and c[0] is None]
            cows = [c for _, _, d in batch.items if (c := d[3]) is not None and c[0] is not None]
            if clears:
                mpool.clear_slots(torch.tensor(clears, dtype=torch.int64))
                self.stats["clears"] += len(clears)
            if cows:
                mpool.copy_from(torch.tensor([c[0] for c in cows], dtype=torch.int64),
                                torch.tensor([c[1] for c in cows], dtype=torch.int64))
                self.stats["cow_copies"] += len(cows)
            for info, _, (P, end, track, cow, kind, slot) in batch.items:
                if self.on_extend is not None:
                    self.on_extend(info.spec.rid, slot,
                                   np.asarray(info.tokens[:P], dtype=np.int64), kind)
                if self.model is not None:
                    snaps = [track] if track is not None else []
                    self.model.advance(slot, info.tokens[P:end], snaps)
        else:
            if self.model is None or not batch.items:
                return
            self.model.decode([slot for _, _, (_, _, slot) in batch.items],
                              [info.tokens[pos] for info, _, (pos, _, _) in batch.items],
                              [-1 if t is None else t for _, _, (_, t, _) in batch.items])

    # ------------------------------------------------------------- results
    def _process(self, batch: _Batch) -> None:
        cfg = self.config
        if batch.kind == "extend":
            for info, epoch, _ in batch.items:
                req = info.req
                if info.epoch != epoch:
                    continue
                inflight = getattr(req, "inflight_middle_chunks", 0)
                if info.finished and inflight <= 0:
                    continue
                if inflight > 0:
                    req.inflight_middle_chunks = inflight - 1
                    continue
                if info.finished:
                    continue
                self._append_output(info)
                if self._finished_now(info):
                    self._release(info, is_insert=True)
                    self._finish(info)
                else:
                    self.tree_cache.cache_unfinished_req(req)
            return
        for info, epoch, data in batch.items:
            req = info.req
            if info.epoch != epoch or info.finished:
                continue
            self._append_output(info)
            done = self._finished_now(info)
            if cfg.extra_buffer and req.mamba_ping_pong_track_buffer is not None:
                seq = (req.kv_committed_len if cfg.decode_boundary == "committed"
                       else data[0] + 1)
                if decode_track_due(seq, cfg.track_interval):
                    req.mamba_last_track_seqlen = seq
                    if cfg.lazy:
                        self._lazy_post_boundary(info, done)
                    else:
                        req.mamba_next_track_idx = (
                            self.req_to_token_pool.get_mamba_ping_pong_other_idx(
                                req.mamba_next_track_idx))
            if done:
                is_insert = info.is_insert if cfg.lazy else True
                self._release(info, is_insert=is_insert)
                self._finish(info)

    def _lazy_post_boundary(self, info: _Info, done: bool) -> None:
        req = info.req
        pool = self.req_to_token_pool
        other = 1 - req.mamba_next_track_idx
        buf = req.mamba_ping_pong_track_buffer
        if int(buf[other]) != -1:
            pool.mamba_allocator.free(buf[other].reshape(1).clone())
            pool.set_mamba_ping_pong_slot(req, other, -1)
        elif done:
            info.is_insert = False
            if hasattr(req, "mamba_lazy_is_insert"):
                req.mamba_lazy_is_insert = False

    def _append_output(self, info: _Info) -> None:
        req = info.req
        k = len(req.output_ids)
        req.output_ids.append(info.tokens[len(req.origin_input_ids) + k])

    def _finished_now(self, info: _Info) -> bool:
        if info.abort_pending:
            return True
        return len(info.req.output_ids) >= info.spec.output_len


# ---------------------------------------------------------------------------
# building mambaradix.sglang's cache and pools
# ---------------------------------------------------------------------------
@dataclass
class DropIn:
    """A cache with its pools, ready for :class:`SchedulerDriver`."""

    tree_cache: Any
    req_to_token_pool: Any
    allocator: Any
    api: Any
    model: Any = None


def build_dropin(config: DriverConfig, *, kv_tokens: int, state_slots: int,
                 max_context_len: int, model: Any = None, lru_policy: str = "sglang",
                 req_rows: Optional[int] = None, **cache_options: Any) -> DropIn:
    """``mambaradix.sglang``'s ``MambaRadixCache`` over its own
    ``HybridReqToTokenPool`` and ``TokenToKVPoolAllocator`` on CPU, configured
    for ``config``'s mode.  With a toy ``model`` the state pool holds int64
    tensors of the model's shapes and the model is bound to them; without
    one, a minimal state of one int64 per slot.  cache_options go to
    ``MambaRadixCache`` (end_of_turn_states, policy_options,
    max_states_per_path)."""
    import torch

    from . import sglang as sg  # type: ignore[attr-defined]

    for name, v in (("kv_tokens", kv_tokens), ("state_slots", state_slots),
                    ("max_context_len", max_context_len)):
        if not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if model is not None:
        layers = model.num_layers
        conv_shape, temporal_shape = model.conv_shape, model.temporal_shape
    else:
        layers, conv_shape, temporal_shape = 1, (1,), (1,)
    shape = sg.Mamba2StateShape(conv=[conv_shape], temporal=temporal_shape,
                                intermediate_size=1, conv_dim=conv_shape[0],
                                ssm_state_size=temporal_shape[0], num_heads=1, head_dim=1,
                                state_size=temporal_shape[0], conv_kernel=conv_shape[0] + 1)
    params = sg.Mamba2CacheParams(shape=shape, layers=list(range(layers)),
                                  dtype=sg.Mamba2StateDType(conv=torch.int64,
                                                            temporal=torch.int64))
    rows = req_rows if req_rows is not None else config.max_running + 2
    pool = sg.HybridReqToTokenPool(
        size=rows, mamba_size=int(state_slots), max_context_len=int(max_context_len),
        device="cpu", cache_params=params, mamba_layer_ids=list(range(layers)),
        enable_mamba_extra_buffer=config.extra_buffer,
        enable_mamba_extra_buffer_lazy=config.lazy,
        enable_overlap_schedule=config.overlap,
        mamba_cache_chunk_size=config.chunk_size,
        mamba_track_interval=config.track_interval)
    if config.page_size == 1:
        alloc = sg.TokenToKVPoolAllocator(int(kv_tokens), dtype=torch.bfloat16, device="cpu",
                                          kvcache=None, need_sort=False)
    else:
        alloc = sg.PagedTokenToKVPoolAllocator(int(kv_tokens), config.page_size,
                                               dtype=torch.bfloat16, device="cpu",
                                               kvcache=None, need_sort=False)
    init = sg.CacheInitParams(disable=False, req_to_token_pool=pool,
                              token_to_kv_pool_allocator=alloc, page_size=config.page_size,
                              enable_mamba_extra_buffer=config.extra_buffer,
                              enable_mamba_extra_buffer_lazy=config.lazy)
    cache = sg.MambaRadixCache(init, chunk_size=config.chunk_size, lru_policy=lru_policy,
                               track_interval=config.track_interval, **cache_options)
    if model is not None:
        model.bind_pool(pool.mamba_pool)
    return DropIn(cache, pool, alloc, api_from_module(sg), model)
