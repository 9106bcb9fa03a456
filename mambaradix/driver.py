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
  lazy mode's second slot at decode boundaries: the C lifecycle's calls
  (``prepare_extend``, ``decode_prepare``, ``decode_finish``
  of a tree-only ``_C.Lifecycle`` of the driver's mode) on each request's
  fields, so they are the same over our pools and over SGLang's;
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

The loop and every scheduling decision are :class:`mambaradix.scheduler.Scheduler`'s
(shared with the simulator's state-free replay); this module is its backend
over the drop-in objects.  The decision functions (:func:`match_key_limit`,
:func:`prefill_track_point`, :func:`decode_track_due`,
:func:`chunk_continuation`, :func:`state_headroom`) and :class:`DriverConfig`
are re-exported from there.

torch is imported lazily: the drop-in objects hold torch tensors.
"""

from __future__ import annotations

import types
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from . import _C
from .scheduler import (MODES, STATE_FACTOR, STATE_FACTOR_LAZY, Batch, DriverConfig,  # noqa: F401
                        Scheduler, chunk_continuation, decode_kv_need, decode_track_due, extend_kv_need,
                        match_key_limit, ping_pong_other, prefill_track_point, request_kv_need, retract_victim,
                        state_headroom)

# ---------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------
#: Token ids lie in [0, TOKEN_LIMIT): vocabulary ids, as in the simulator's
#: traces; the tree keeps them as int32.
TOKEN_LIMIT = 1 << 31


def _int_arg(name: str, v: Any) -> int:
    """``v`` as an int >= 1: a Python or numpy integer, never a bool."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if v < 1:
        raise ValueError(f"{name} must be >= 1, got {v}")
    return int(v)


def _token_ids(name: str, rid: str, ids: Any) -> list:
    """``ids`` (a sequence of ints, an integer array or tensor) as a list of
    token ids, each an int in [0, TOKEN_LIMIT)."""
    what = f"{name} of request {rid!r}"
    if isinstance(ids, (str, bytes, bytearray)) or not hasattr(ids, "__len__"):
        raise TypeError(f"{what} must be a sequence of int token ids, not {type(ids).__name__}")
    if hasattr(ids, "__array__") and not isinstance(ids, (list, tuple, range, array)):
        a = np.asarray(ids)
        if a.ndim != 1:
            raise ValueError(f"{what} must be 1-dimensional, not {a.ndim}-dimensional")
        if a.dtype.kind not in "iu":
            raise TypeError(f"{what} must hold int token ids, not {a.dtype}")
        out = a.tolist()
    else:
        out = list(ids)
        if not all(type(t) is int for t in out):
            for i, t in enumerate(out):
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                    raise TypeError(f"{name}[{i}] of request {rid!r} must be an int token id, "
                                    f"not {type(t).__name__}")
            out = [int(t) for t in out]
    if out and (min(out) < 0 or max(out) >= TOKEN_LIMIT):
        i, t = next((i, t) for i, t in enumerate(out) if not 0 <= t < TOKEN_LIMIT)
        raise ValueError(f"{name}[{i}] = {t} of request {rid!r} is out of range "
                         f"[0, {TOKEN_LIMIT - 1}]")
    return out


# ---------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------
@dataclass
class DriverRequest:
    """A request to run.

    rid: its id (a str, unique in a driver).
    input_ids: prompt token ids (ints in [0, 2**31), not empty).
    output_len: tokens to decode (>= 1).
    extra_key: the cache namespace (a str) or None.
    output_ids: the tokens it decodes (default: deterministic pseudo tokens).
    """

    rid: str
    input_ids: Sequence[int]
    output_len: int = 1
    extra_key: Optional[str] = None
    output_ids: Optional[Sequence[int]] = None

    def __post_init__(self) -> None:
        self._checked()

    def _checked(self) -> tuple[list, Optional[list]]:
        """The prompt and the given outputs as lists of ints, after checking
        every field (TypeError or ValueError naming it)."""
        if not isinstance(self.rid, str):
            raise TypeError(f"rid must be a str, not {type(self.rid).__name__}")
        n = _int_arg(f"output_len of request {self.rid!r}", self.output_len)
        if self.extra_key is not None and not isinstance(self.extra_key, str):
            raise TypeError(f"extra_key of request {self.rid!r} must be a str or None, "
                            f"not {type(self.extra_key).__name__}")
        prompt = _token_ids("input_ids", self.rid, self.input_ids)
        if not prompt:
            raise ValueError(f"input_ids of request {self.rid!r} must not be empty")
        outs = None
        if self.output_ids is not None:
            outs = _token_ids("output_ids", self.rid, self.output_ids)
            if len(outs) < n:
                raise ValueError(f"output_ids of request {self.rid!r} shorter than output_len "
                                 f"({len(outs)} < {n})")
        return prompt, outs


def request_needs(config: DriverConfig, prompt_len: int, output_len: int) -> tuple[int, int]:
    """What a request needs to run at all, alone in the pools: (KV tokens,
    positions of its request row).

    KV: admission (SGLang's PrefillAdder) takes a request only while its new
    tokens + ``min(output_len, clip_max_new_tokens)`` + a page stay below the
    available + evictable KV, and its decode steps hold every position it
    writes, in whole pages.  Positions: the prompt and every output but the
    last, and the last too under the overlap scheduler (the batch after the
    one that finishes a request still decodes it)."""
    kv = request_kv_need(prompt_len, output_len, config.page_size, config.clip_max_new_tokens,
                         config.overlap)
    return kv, prompt_len + output_len - (0 if config.overlap else 1)


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
    """Driver-side bookkeeping of one request, with the attributes the
    scheduler reads (see :mod:`mambaradix.scheduler`) mapped onto the Req."""

    __slots__ = ("spec", "req", "tokens", "epoch", "finished", "abort", "record", "_is_insert",
                 "admitted", "in_run", "prompt_len", "output_len")

    def __init__(self, spec: DriverRequest, req: Any, tokens: list, record: RequestRecord):
        self.spec = spec
        self.req = req
        self.tokens = tokens          # prompt + planned outputs (+2 spare)
        self.epoch = 0
        self.finished = False
        self.abort = False            # aborted while chunked or running: finishes next
        self.record = record
        self._is_insert = True
        self.admitted = False
        self.in_run = False
        self.prompt_len = len(req.origin_input_ids)
        self.output_len = int(spec.output_len)

    @property
    def n_out(self) -> int:
        return len(self.req.output_ids)

    @property
    def prefix_len(self) -> int:
        return len(self.req.prefix_indices)

    @property
    def ext_end(self) -> int:
        return self.req.extend_range.end

    @property
    def committed(self) -> int:
        return self.req.kv_committed_len

    @property
    def inflight(self) -> int:
        return getattr(self.req, "inflight_middle_chunks", 0)

    @inflight.setter
    def inflight(self, v: int) -> None:
        self.req.inflight_middle_chunks = v

    @property
    def is_insert(self) -> bool:
        return self._is_insert

    @is_insert.setter
    def is_insert(self, v: bool) -> None:
        self._is_insert = v
        if hasattr(self.req, "mamba_lazy_is_insert"):
            self.req.mamba_lazy_is_insert = v


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
#: The Req fields a retracted request starts again from (SGLang's
#: reset_for_retract and free_mamba_cache).
_RETRACT_RESET = (
    ("last_node", None), ("cache_protected_len", 0), ("extend_range", None),
    ("inflight_middle_chunks", 0), ("mamba_pool_idx", None),
    ("mamba_ping_pong_track_buffer", None), ("mamba_next_track_idx", None),
    ("mamba_last_track_seqlen", None), ("mamba_branching_seqlen", None),
    ("mamba_cow_src_index", None), ("mamba_needs_clear", False), ("kv_allocated_len", 0),
    ("kv_committed_len", 0))


class SchedulerDriver(Scheduler):
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

        if not isinstance(config, DriverConfig):
            raise TypeError(f"SchedulerDriver: config must be a DriverConfig, "
                            f"not {type(config).__name__}")
        kv_page = int(getattr(token_to_kv_pool_allocator, "page_size", 1))
        if kv_page != config.page_size:
            raise ValueError(f"SchedulerDriver: token_to_kv_pool_allocator has page_size "
                             f"{kv_page} but config.page_size is {config.page_size} (use a "
                             f"PagedTokenToKVPoolAllocator of the same page size)")
        super().__init__(config)
        self._torch = torch
        self.tree_cache = tree_cache
        self.req_to_token_pool = req_to_token_pool
        self.allocator = token_to_kv_pool_allocator
        self.api = api if api is not None else sglang_api()
        self.model = model
        self.on_extend = on_extend
        self.on_step = on_step
        self.alloc_req_slots = alloc_req_slots
        # the tracking transitions (prefill track point, ping-pong flips, the
        # lazy buffer's second slot) are the C lifecycle's, applied to each
        # request's fields: a tree-only Lifecycle of this mode, whatever
        # cache and pools (ours or SGLang's) the driver runs over
        self._rules = _C.Lifecycle(page_size=config.page_size, chunk_size=config.chunk_size,
                                   extra_buffer=config.extra_buffer, lazy=config.lazy,
                                   track_buffer_size=self.pp_size,
                                   track_interval=config.track_interval)
        self.infos: dict[str, _Info] = {}
        self._live: dict[str, _Info] = {}
        self.records: dict[str, RequestRecord] = {}
        self.step_count = 0
        self.stats = {"prefill_batches": 0, "decode_steps": 0, "retractions": 0,
                      "cow_copies": 0, "clears": 0}
        # the pools' sizes, for submit(): whole KV pages, request row width
        size = getattr(token_to_kv_pool_allocator, "size", None)
        self.kv_tokens = None if size is None else int(size) // self.page * self.page
        ctx = getattr(req_to_token_pool, "max_context_len", None)
        if ctx is None and hasattr(req_to_token_pool, "req_to_token"):
            ctx = req_to_token_pool.req_to_token.shape[1]
        self.max_context_len = None if ctx is None else int(ctx)

    # ------------------------------------------------------------- public API
    def submit(self, request: DriverRequest) -> None:
        """Queue a request (arrival order).  Refused (nothing queued) when a
        field is bad, the id is taken, or the request could not run even
        alone in the pools (see :func:`request_needs`)."""
        if not isinstance(request, DriverRequest):
            raise TypeError(f"submit(): request must be a DriverRequest, "
                            f"not {type(request).__name__}")
        prompt, given = request._checked()
        if request.rid in self.infos:
            raise ValueError(f"duplicate request id {request.rid!r}")
        n_out = int(request.output_len)
        kv, positions = request_needs(self.config, len(prompt), n_out)
        sizes = f"prompt {len(prompt)} + output {n_out} tokens"
        if self.max_context_len is not None and positions > self.max_context_len:
            lag = " (the overlap scheduler decodes one step past the last output)"
            raise ValueError(f"request {request.rid!r} can never run: {sizes} take {positions} "
                             f"positions of its request row{lag if self.config.overlap else ''}, "
                             f"over max_context_len {self.max_context_len}")
        if self.kv_tokens is not None and kv > self.kv_tokens:
            raise ValueError(f"request {request.rid!r} can never run: {sizes} need {kv} KV tokens "
                             f"alone in the pool (admission counts prompt + min(output, "
                             f"clip_max_new_tokens) + page_size {self.page} + 1, decoding holds "
                             f"every position in whole pages), the KV pool has {self.kv_tokens}")
        outs = (given[:n_out] if given is not None
                else [pseudo_token(request.rid, k) for k in range(n_out)])
        spare = [pseudo_token(request.rid, n_out + k) for k in range(2)]
        req = _make_req(self.api, request.rid, prompt, n_out, request.extra_key)
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
        else:
            info.abort = True  # finishes (and is cached) at its next result

    def live_requests(self) -> list[Any]:
        """Reqs that may own pool resources (not finished)."""
        return [i.req for i in self._live.values()]

    def run(self, max_steps: int = 10_000_000) -> None:
        """Step until every request finished, at most ``max_steps`` steps
        (>= 1) in this call.  RuntimeError when it would not end: past
        max_steps, or when the first waiting request can not be admitted with
        nothing else in flight (nothing would change at the next step)."""
        limit = _int_arg("run(): max_steps", max_steps)
        steps = 0
        while not self.idle:
            if steps >= limit:
                raise RuntimeError(f"run(): not idle after max_steps={limit} steps "
                                   f"({len(self.waiting)} waiting, {len(self.running)} running)")
            before = self.last_batch      # processed by this step (overlap scheduler)
            batch = self.step()
            steps += 1
            if (batch is None and before is None and self.waiting and not self.running
                    and self.chunked is None and not self.result_queue):
                x = self.waiting[0]
                self.batch_is_full = False      # a later run() tries to admit it again
                raise RuntimeError(
                    f"run(): request {x.spec.rid!r} (prompt {x.prompt_len}, output "
                    f"{x.output_len}) can not be admitted with nothing else running: KV "
                    f"available {self._kv_available()} + evictable {self._kv_evictable()}, "
                    f"{self._free_rows()} free request rows")

    def step(self) -> Optional[Batch]:
        """One scheduler iteration (SGLang's event loop body)."""
        self.step_count += 1
        batch = super().step()
        if self.on_step is not None:
            self.on_step(self)
        return batch

    # ------------------------------------------------------------- requests
    def _set_fill(self, info: _Info) -> None:
        req = info.req
        req.full_untruncated_fill_ids = array("q", list(req.origin_input_ids)
                                              + list(req.output_ids))

    _refresh_fill = _set_fill

    def _set_extend(self, info: _Info, end: int) -> None:
        info.req.set_extend_range(len(info.req.prefix_indices), end)

    def _finish(self, info: _Info) -> None:
        info.finished = True
        if info.in_run:
            info.in_run = False
            self.need_filter = True
        self._live.pop(info.spec.rid, None)
        info.record.finished_step = self.step_count
        info.record.output = list(info.req.output_ids)

    def _append_output(self, info: _Info) -> None:
        req = info.req
        k = len(req.output_ids)
        req.output_ids.append(info.tokens[len(req.origin_input_ids) + k])

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

    def _cache_unfinished(self, info: _Info, chunked: bool) -> None:
        self.tree_cache.cache_unfinished_req(info.req, chunked=chunked)

    # ------------------------------------------------------------- KV pool
    def _free_rows(self) -> int:
        return self.req_to_token_pool.available_size()

    def _kv_available(self) -> int:
        return self.allocator.available_size()

    def _kv_evictable(self) -> int:
        return self.tree_cache.full_evictable_size()

    def _evict_kv(self, num_tokens: int) -> None:
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
        page = self.page
        if page == 1:
            return self._alloc_tokens(ext_total)
        self._evict_tokens(extend_kv_need(ext_total, len(reqs), page))
        prefix = torch.tensor([len(r.prefix_indices) for r in reqs], dtype=torch.int64)
        seq = torch.tensor([r.extend_range.end for r in reqs], dtype=torch.int64)
        last = torch.tensor([int(r.prefix_indices[-1]) if len(r.prefix_indices) else -1
                             for r in reqs], dtype=torch.int64)
        out = self.allocator.alloc_extend(prefix, prefix, seq, seq, last, ext_total)
        if out is None:
            raise RuntimeError(f"KV pool exhausted allocating {ext_total} tokens in pages of "
                               f"{page} (available {self.allocator.available_size()})")
        return out

    def _alloc_decode(self) -> Any:
        """KV for one decode step (SGLang's alloc_for_decode)."""
        torch = self._torch
        page = self.page
        if page == 1:
            return self._alloc_tokens(len(self.running))
        self._evict_tokens(decode_kv_need(len(self.running), page))
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

    # ------------------------------------------------------------- admission
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

    def _touch_prefix(self, info: _Info) -> None:
        self._set_fill(info)
        key = self.api.RadixKey(array("q", info.req.full_untruncated_fill_ids), info.req.extra_key)
        self.tree_cache.match_prefix(self.api.MatchPrefixParams(key=key))

    def _lock(self, info: _Info) -> None:
        self.tree_cache.inc_lock_ref(info.req.last_node)

    def _unlock(self, info: _Info) -> None:
        self.tree_cache.dec_lock_ref(info.req.last_node)

    def _drop_match(self, info: _Info) -> None:
        req = info.req
        req.mamba_cow_src_index = None
        req.mamba_needs_clear = False
        if req.mamba_pool_idx is not None:
            self.req_to_token_pool.mamba_allocator.free(req.mamba_pool_idx.reshape(1))
            req.mamba_pool_idx = None

    def _admission_begin(self, n: int) -> None:
        group = getattr(self.req_to_token_pool.mamba_allocator, "alloc_group_begin", None)
        if group is not None:
            group(n)

    def _admission_end(self) -> None:
        end = getattr(self.req_to_token_pool.mamba_allocator, "alloc_group_end", None)
        if end is not None:
            end()

    def _prepare_extend(self, infos: list) -> Batch:
        torch = self._torch
        cfg = self.config
        pool = self.req_to_token_pool
        batch = Batch("extend")
        for info in infos:
            if not info.admitted:
                info.admitted = True
                info.record.prefix_len = len(info.req.prefix_indices)
                info.record.branching_seqlen = info.req.mamba_branching_seqlen
                info.record.admitted_step = self.step_count
            info.record.chunks += 1
        reqs = [i.req for i in infos]
        if self.alloc_req_slots is not None:
            self.alloc_req_slots(pool, reqs, self.tree_cache)
        else:
            # state-slot headroom, then request slots (HybridReqToTokenPool.alloc)
            # (0.5.23: the pool's admission takes the slots wanted, its own rule)
            evict = (state_headroom(pool.mamba_allocator.available_size(), len(reqs), cfg.lazy)
                     if cfg.semantics == "v0.5.15" else 0)
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
                rs, before = self._record(info)
                _, track_slot, mask, _ = self._rules.prepare_extend(0, rs, P, E)
                self._apply_record(info, rs, before)
                if mask:
                    track = (rs.last_track_seqlen - P, int(track_slot))
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
        self.stats["prefill_batches"] += 1
        return batch

    # ------------------------------------------------------------- decode
    def _leave_running(self, info: _Info) -> None:
        self.running.remove(info)
        info.in_run = False

    def _reset_for_retry(self, info: _Info) -> None:
        req = info.req
        req.prefix_indices = self._torch.empty((0,), dtype=self._torch.int64)
        for name, value in _RETRACT_RESET:
            setattr(req, name, value)
        if hasattr(req, "mamba_lazy_is_insert"):
            req.mamba_lazy_is_insert = True
        info.record.retractions += 1
        self.stats["retractions"] += 1

    def _prepare_decode(self) -> Batch:
        torch = self._torch
        cfg = self.config
        pool = self.req_to_token_pool
        batch = Batch("decode")
        out = self._alloc_decode()
        for k, info in enumerate(self.running):
            req = info.req
            pos = req.kv_committed_len          # position of the input token
            pool.write((req.req_pool_idx, slice(pos, pos + 1)), out[k:k + 1].to(torch.int32))
            req.kv_committed_len += 1
            req.kv_allocated_len += 1
            track = None
            if (cfg.extra_buffer and req.mamba_ping_pong_track_buffer is not None
                    and decode_track_due(req.kv_committed_len, cfg.track_interval)):
                track = self._decode_prepare(info, req.kv_committed_len)
            batch.items.append((info, info.epoch, (pos, track, int(req.mamba_pool_idx))))
        self.stats["decode_steps"] += 1
        return batch

    # ------------------------------------------------------------- tracking
    def _record(self, info: _Info) -> tuple:
        """info's tracking fields as a lifecycle record, with its track
        buffer as it stands (to tell what a call changed)."""
        req = info.req
        buf = req.mamba_ping_pong_track_buffer
        nt = req.mamba_next_track_idx
        tracks = (-1, -1)
        if buf is not None and nt is not None:
            tracks = tuple(int(v) for v in buf.tolist()) + (-1,) * (2 - len(buf))
        else:
            nt = -1
        lt = req.mamba_last_track_seqlen
        br = req.mamba_branching_seqlen
        run = req.mamba_pool_idx
        rs = _C.ReqState((-1 if run is None else int(run), tracks[0], tracks[1], int(nt),
                          -1 if lt is None else int(lt), -1 if br is None else int(br),
                          -1, 0, int(info.is_insert), 0, -1, 0, 0))
        return rs, tracks

    def _apply_record(self, info: _Info, rs: Any, before: tuple) -> None:
        """What a tracking call changed, back into info's Req: the track
        entries through the pool (its map row follows), the ping-pong index,
        the tracked length and the lazy insert flag."""
        req = info.req
        for j, v in enumerate((rs.track0, rs.track1)):
            if v != before[j]:
                self.req_to_token_pool.set_mamba_ping_pong_slot(req, j, v)
        if rs.next_track >= 0:
            req.mamba_next_track_idx = rs.next_track
        lt = rs.last_track_seqlen
        req.mamba_last_track_seqlen = None if lt < 0 else lt
        if not rs.lazy_is_insert:
            info.is_insert = False

    def _decode_prepare(self, info: _Info, seq_len: int) -> Optional[int]:
        """The lifecycle's decode_prepare: the track slot of a decode step
        that reaches a boundary (None otherwise); in lazy mode the step
        borrows the second track slot, from the allocator (one cached state
        evicted when none is free; without a slot it goes on unborrowed)."""
        rs, before = self._record(info)
        _, slot, mask, need = self._rules.decode_prepare(rs, seq_len)
        if need:
            alloc = self.req_to_token_pool.mamba_allocator
            fresh = alloc.alloc(1)
            if fresh is None:
                self.tree_cache.evict(self.api.EvictParams(num_tokens=0, mamba_num=1))
                fresh = alloc.alloc(1)
            if fresh is not None:
                _, slot, mask, _ = self._rules.decode_prepare(rs, seq_len, int(fresh[0]))
        self._apply_record(info, rs, before)
        return int(slot) if mask else None

    def _decode_finish(self, info: _Info, seq: int, done: bool) -> None:
        rs, before = self._record(info)
        _, _, st_free = self._rules.decode_finish(rs, seq, done)
        if st_free.size:
            # the lazy buffer's older slot: freed as the buffer held it
            buf = info.req.mamba_ping_pong_track_buffer
            self.req_to_token_pool.mamba_allocator.free(
                self._torch.as_tensor(st_free).to(device=buf.device, dtype=buf.dtype))
        self._apply_record(info, rs, before)

    def _process_decode(self, batch: Batch) -> None:
        committed = self.config.decode_boundary == "committed"
        for info, epoch, data in batch.items:
            req = info.req
            if info.epoch != epoch or info.finished:
                continue
            self._append_output(info)
            done = info.abort or len(req.output_ids) >= info.output_len
            seq = req.kv_committed_len if committed else data[0] + 1
            self._decode_result(info, seq, done,
                                self.config.extra_buffer
                                and req.mamba_ping_pong_track_buffer is not None)

    # ------------------------------------------------------------- forward
    def _forward(self, batch: Batch) -> None:
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

    if not isinstance(config, DriverConfig):
        raise TypeError(f"build_dropin(): config must be a DriverConfig, not {type(config).__name__}")
    kv_tokens = _int_arg("build_dropin(): kv_tokens", kv_tokens)
    state_slots = _int_arg("build_dropin(): state_slots", state_slots)
    max_context_len = _int_arg("build_dropin(): max_context_len", max_context_len)
    rows = (config.max_running + 2 if req_rows is None
            else _int_arg("build_dropin(): req_rows", req_rows))
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
    pool = sg.HybridReqToTokenPool(
        size=rows, mamba_size=state_slots, max_context_len=max_context_len,
        device="cpu", cache_params=params, mamba_layer_ids=list(range(layers)),
        enable_mamba_extra_buffer=config.extra_buffer,
        enable_mamba_extra_buffer_lazy=config.lazy,
        enable_overlap_schedule=config.overlap,
        mamba_cache_chunk_size=config.chunk_size,
        mamba_track_interval=config.track_interval)
    if config.page_size == 1:
        alloc = sg.TokenToKVPoolAllocator(kv_tokens, dtype=torch.bfloat16, device="cpu",
                                          kvcache=None, need_sort=False)
    else:
        alloc = sg.PagedTokenToKVPoolAllocator(kv_tokens, config.page_size,
                                               dtype=torch.bfloat16, device="cpu",
                                               kvcache=None, need_sort=False)
    init = sg.CacheInitParams(disable=False, req_to_token_pool=pool,
                              token_to_kv_pool_allocator=alloc, page_size=config.page_size,
                              enable_mamba_extra_buffer=config.extra_buffer,
                              enable_mamba_extra_buffer_lazy=config.lazy)
    cache = sg.MambaRadixCache(init, chunk_size=config.chunk_size, lru_policy=lru_policy,
                               track_interval=config.track_interval, semantics=config.semantics,
                               **cache_options)
    if model is not None:
        model.bind_pool(pool.mamba_pool)
    return DropIn(cache, pool, alloc, api_from_module(sg), model)
