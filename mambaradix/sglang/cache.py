"""MambaRadixCache: SGLang v0.5.15's hybrid prefix cache over mambaradix's
C tree.

Two set-ups:
- mambaradix's own pools (HybridReqToTokenPool / TokenToKVPoolAllocator
  from this package): match, insert, eviction, caching a finished or an
  unfinished request are each one call into the C lifecycle, which also
  moves slot ownership and frees what the tree does not keep;
- SGLang's (or anyone's) pools: the C tree does the matching and hands back
  what it evicts or duplicates; this class frees them through the pools'
  own Python methods, as SGLang's class does.

The default behaviour is v0.5.15's, quirks included (a read-only match
splits a partially matched edge; chunked snapshots land relative to each
chunk's start; the input_len - 1 cap is the Req's).
"""

from __future__ import annotations

from array import array
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from .. import _C
from ._api import (
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
    RadixKey,
    Req,
    SlotIndex,
)
from ._check import count, integer, one_index, str_or_none, token_array
from .pools import (
    HybridReqToTokenPool,
    TokenToKVPoolAllocator,
    _apply_record,
    _check_last_node,
    _host_view,
    _np_index,
    _owns_record,
    _req_arg,
    _rs_of,
    _to_device,
)

__all__ = ["MambaRadixCache", "TreeNode"]

_tuple_new = tuple.__new__
_from_numpy = torch.from_numpy


def _fill_ids(req: Any) -> Tuple[Any, int]:
    """(tokens, fill_len): the request's fill ids are tokens[:fill_len].
    Our Req's are the head of its full_untruncated_fill_ids, which the C
    call reads in place (the lifecycle reads fill_len tokens); another
    request type's come from its get_fill_ids()."""
    r = req.extend_range if type(req) is Req else None
    if r is not None and type(r.end) is int and r.end >= 0:
        full = req.full_untruncated_fill_ids
        return full, min(r.end, len(full))
    t = req.get_fill_ids()
    return t, len(t)


def _slot_of(value: Any, ix: Optional[SlotIndex] = None) -> int:
    """The state slot of an insert's mamba_value: an int or a one-element
    integer tensor (SGLang's shape (1,)); anything else raises TypeError /
    ValueError.  A slot our pools handed out (a view of ix's ids) is read
    from its offset: no device read."""
    if ix is not None and type(value) is torch.Tensor and value._base is ix.ids and value.numel() == 1:
        return ix.host_value(value, "insert(): params.mamba_value")
    return one_index(value, "insert(): params.mamba_value")

try:  # inside SGLang, inherit every default its scheduler may call
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache as _SGLangBase  # type: ignore
except Exception:  # pragma: no cover - depends on the environment
    _SGLangBase = None


# Records for Lifecycle.cow over pools that are not ours: the request has a
# running slot (any id >= 1 stands for the allocator's tensor) or none.
_RS_NONE = (-1, -1, -1, -1, -1, -1, -1, 0, 1, 0, -1, 0, 0)
_RS_SLOT = (1,) + _RS_NONE[1:]


class _Base:
    """The defaults of SGLang's BasePrefixCache for a device-only cache."""

    metrics_collector = None

    def supports_fast_match_prefix(self) -> bool:
        return False

    def init_load_back(self, params: Any) -> Any:
        raise NotImplementedError()

    def ready_to_load_host_cache(self) -> Any:
        raise NotImplementedError()

    def check_hicache_events(self) -> Any:
        raise NotImplementedError()

    def flush_write_through_acks(self) -> None:
        pass

    def take_events(self) -> list:
        return []

    def supports_swa(self) -> bool:
        return False

    def supports_streaming_session(self) -> bool:
        return False

    def release_session(self, session_id: str) -> None:
        pass

    def release_radix_session(self, session_id: str) -> None:
        pass

    def release_aborted_request(self, rid: str) -> None:
        pass

    def session_held_tokens(self, active_pool_idxs: Any = None) -> int:
        return 0

    def session_held_full_tokens(self, active_pool_idxs: Any = None) -> int:
        return 0

    def session_held_swa_tokens(self, active_pool_idxs: Any = None) -> int:
        return 0

    def session_held_req_count(self, active_pool_idxs: Any = None) -> int:
        return 0

    def session_held_mamba_slots(self, active_pool_idxs: Any = None) -> int:
        return 0

    def swa_evictable_size(self) -> int:
        return 0

    def swa_protected_size(self) -> int:
        return 0

    def is_chunk_cache(self) -> bool:
        return False

    def is_tree_cache(self) -> bool:
        return not self.is_chunk_cache()


_Bases: tuple = (_SGLangBase, _Base) if _SGLangBase is not None else (_Base,)


class TreeNode:
    """A handle to a tree node with the attributes SGLang's code and tests
    read (key, value, mamba_value, parent, children, lock refs).  Two
    handles of the same node compare equal; the cache's root_node is one
    object for the life of the tree, so `node is cache.root_node` works."""

    __slots__ = ("_cache", "_id", "_gen", "__weakref__")

    def __init__(self, cache: "MambaRadixCache", node_id: int, gen: int) -> None:
        self._cache = cache
        self._id = node_id
        self._gen = gen

    def _info(self) -> tuple:
        return self._cache._lc.node_info(self._id, self._gen)

    @property
    def id(self) -> int:
        return self._id

    @property
    def valid(self) -> bool:
        return bool(self._info()[0])

    @property
    def key(self) -> RadixKey:
        if self is self._cache.root_node:
            return RadixKey(array("q"), None)
        toks, _ = self._cache._lc.node_key(self._id, self._gen)
        ns = self._info()[8]
        return RadixKey(array("q", toks.tobytes()), self._cache._ns_name(ns))

    @property
    def value(self) -> torch.Tensor:
        if self is self._cache.root_node:
            return torch.empty((0,), dtype=torch.int64, device=self._cache.device)
        _, vals = self._cache._lc.node_key(self._id, self._gen)
        return torch.from_numpy(vals).to(self._cache.device)

    @property
    def mamba_value(self) -> Optional[torch.Tensor]:
        st = self._info()[2]
        if st is None or st < 0:
            return None
        return torch.tensor([st], dtype=torch.int64, device=self._cache.device)

    @property
    def parent(self) -> Optional["TreeNode"]:
        info = self._info()
        if not info[0] or info[3] < 0:
            return None
        return self._cache._node(info[3], info[4])

    @property
    def children(self) -> Dict[Any, "TreeNode"]:
        out: Dict[Any, TreeNode] = {}
        for cid, cgen in self._cache._lc.node_children(self._id, self._gen):
            child = self._cache._node(cid, cgen)
            out[child.key.child_key(self._cache.page_size)] = child
        return out

    @property
    def full_lock_ref(self) -> int:
        return 1 if self is self._cache.root_node else int(self._info()[5])

    @property
    def mamba_lock_ref(self) -> int:
        return 1 if self is self._cache.root_node else int(self._info()[6])

    def __len__(self) -> int:
        return int(self._info()[1])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TreeNode) and other._cache is self._cache and (other._id, other._gen) == (self._id, self._gen)

    def __hash__(self) -> int:
        return hash((self._id, self._gen))

    def __repr__(self) -> str:
        return f"TreeNode(id={self._id}, gen={self._gen})"


_KEY_FIELDS = ("token_ids", "extra_key", "limit", "is_bigram")
_INIT_FIELDS = ("req_to_token_pool", "token_to_kv_pool_allocator", "page_size", "disable")


def _params_error(call: str, params: Any, want: str, e: AttributeError) -> TypeError:
    """The TypeError for a call's params (or its key) that lacks a field of
    SGLang's dataclass (want: "a MatchPrefixParams"; e: the AttributeError
    reading the field)."""
    if not hasattr(params, "key"):
        return TypeError(f"{call}(): params must be {want}, not {type(params).__name__}")
    if not all(hasattr(params.key, f) for f in _KEY_FIELDS):
        return TypeError(f"{call}(): params.key must be a RadixKey, not {type(params.key).__name__}")
    return TypeError(f"{call}(): params must be {want}: {e}")


def _chunk_size_default(page_size: int) -> int:
    return max(64, page_size)


class MambaRadixCache(*_Bases):  # type: ignore[misc]
    """SGLang v0.5.15's MambaRadixCache, over mambaradix's C tree.

    params: SGLang's CacheInitParams (or any object with its attributes).
    chunk_size: mamba_cache_chunk_size.  Inside SGLang it is read from the
      global server args; standalone from this keyword, else the pool's
      `mamba_cache_chunk_size`, else max(64, page_size).
    lru_policy: "sglang" (v0.5.15, default), "consumed" (refresh only the
      state a match uses), "utility" (FLOPs saved per byte + recency, with
      ``policy_options``: see ``mambaradix.RadixTree``) or "adaptive" (learns
      online which victim order serves the workload: docs/adaptive.md).
    track_interval: mamba_track_interval, for the decode helpers.
    end_of_turn_states: extra_buffer: a finished request keeps the state at
      its exact end (its running slot, no copy) when its length is whole pages.
    max_states_per_path: per-path state budget (None or 0: none).
    semantics: "v0.5.15" (this class's own rules, default) or "v0.5.23"
      (the tree and admission rules of SGLang 0.5.23's UnifiedRadixCache,
      for the simulator's replays of that release; see ``mambaradix.sim``).
    """

    def __init__(
        self,
        params: Any,
        *,
        chunk_size: Optional[int] = None,
        lru_policy: str = "sglang",
        track_interval: Optional[int] = None,
        end_of_turn_states: bool = False,
        policy_options: Optional[dict] = None,
        max_states_per_path: Optional[int] = None,
        semantics: str = "v0.5.15",
    ) -> None:
        for field in _INIT_FIELDS:
            if not hasattr(params, field):
                raise TypeError(f"MambaRadixCache(): params must be a CacheInitParams (it has no {field}), "
                                f"not {type(params).__name__}")
        self._policy_kw = dict(end_of_turn_states=bool(end_of_turn_states), policy_options=policy_options,
                               max_states_per_path=max_states_per_path, semantics=semantics)
        if max_states_per_path and not (isinstance(params.req_to_token_pool, HybridReqToTokenPool)
                                        and isinstance(params.token_to_kv_pool_allocator, TokenToKVPoolAllocator)):
            raise ValueError("max_states_per_path needs mambaradix's own pools (HybridReqToTokenPool, "
                             "TokenToKVPoolAllocator)")
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = integer(params.page_size, "params.page_size")
        self.disable = bool(params.disable)
        self.enable_kv_cache_events = bool(getattr(params, "enable_kv_cache_events", False))
        self.enable_mamba_extra_buffer = bool(getattr(params, "enable_mamba_extra_buffer", False))
        self.enable_mamba_extra_buffer_lazy = bool(getattr(params, "enable_mamba_extra_buffer_lazy", False))
        self.kv_event_queue: list = []
        if not self.enable_mamba_extra_buffer and self.page_size != 1:
            raise ValueError(f"MambaRadixCache without extra_buffer needs page_size 1, got {self.page_size}")
        self.mamba_cache_chunk_size = self._resolve_chunk_size(chunk_size)
        pool = self.req_to_token_pool
        if track_interval is None:
            track_interval = self._server_arg("mamba_track_interval") or getattr(pool, "mamba_track_interval", 256)
        self.mamba_track_interval = integer(track_interval, "track_interval")
        alloc = self.token_to_kv_pool_allocator
        self.device = alloc.device if alloc is not None else torch.device("cpu")
        self._on_cpu = torch.device(self.device).type == "cpu"
        self.lru_policy = lru_policy
        self._native = isinstance(pool, HybridReqToTokenPool) and isinstance(alloc, TokenToKVPoolAllocator)
        self._make_lifecycle()
        self.reset()

    # -- configuration -------------------------------------------------------

    @staticmethod
    def _server_arg(name: str) -> Any:
        try:
            from sglang.srt.server_args import get_global_server_args  # type: ignore

            return getattr(get_global_server_args(), name)
        except Exception:
            return None

    def _resolve_chunk_size(self, chunk_size: Optional[int]) -> int:
        if chunk_size is None:
            chunk_size = self._server_arg("mamba_cache_chunk_size")
        if chunk_size is None:
            chunk_size = getattr(self.req_to_token_pool, "mamba_cache_chunk_size", None)
        if chunk_size is None:
            chunk_size = _chunk_size_default(self.page_size)
        return integer(chunk_size, "chunk_size")

    def _make_lifecycle(self) -> None:
        pool = self.req_to_token_pool
        kw = dict(
            page_size=self.page_size,
            chunk_size=self.mamba_cache_chunk_size,
            lru_policy=self.lru_policy,
            extra_buffer=self.enable_mamba_extra_buffer,
            lazy=self.enable_mamba_extra_buffer_lazy,
            track_buffer_size=getattr(pool, "mamba_ping_pong_track_buffer_size", 2),
            track_interval=self.mamba_track_interval,
            **self._policy_kw,
        )
        if self._native:
            self._lc = _C.Lifecycle(pool.mamba_allocator._slots, self.token_to_kv_pool_allocator._slots, pool._rp, **kw)
            pool._lc = self._lc  # admission through the same lifecycle
            self._ix = pool._ix
        else:
            self._lc = _C.Lifecycle(**kw)
            size = getattr(getattr(pool, "mamba_pool", None), "size", 0)
            self._ix = SlotIndex(int(size or 0), self.device, kw["track_buffer_size"])

    # -- nodes and namespaces ------------------------------------------------------

    def _node(self, node_id: int, gen: int) -> TreeNode:
        """The node's handle: one per node id, made again when the id names
        a newer node (another generation).  A handle is only (cache, id,
        generation), so handing out the same one again is as good as a new
        one, and cheaper."""
        h = self._handles.get(node_id)
        if h is None or h._gen != gen:
            h = self._handles[node_id] = TreeNode(self, node_id, gen)
        return h

    def _ns(self, extra_key: Optional[str], create: bool = True, name: str = "key.extra_key") -> int:
        """The namespace id of an extra_key in the tree's table (0: none; -1:
        a name never inserted, when not create).  SGLang's extra_key is a str
        or None: anything else raises TypeError naming `name`."""
        if extra_key is None:
            return 0
        if type(extra_key) is not str:
            str_or_none(extra_key, name)
        return self._lc.namespace(extra_key, create)

    def _ns_name(self, ns: int) -> Optional[str]:
        return self._lc.namespace_name(ns)

    @staticmethod
    def _tokens(key: RadixKey) -> Any:
        t = key.raw_token_ids()
        return t

    # -- SGLang API: basics ----------------------------------------------------------

    def supports_mamba(self) -> bool:
        return True

    def reset(self) -> None:
        """Drop every node (the scheduler clears the pools afterwards)."""
        self._lc.reset()
        rid, rgen = self._lc.root()
        self.root_node = TreeNode(self, rid, rgen)
        self._handles: Dict[int, TreeNode] = {rid: self.root_node}

    def sanity_check(self) -> None:
        """Tree invariants and, with own pools, pool accounting against the
        tree (InvariantError naming the broken rule)."""
        if not self.disable:
            self._lc.check()

    def evictable_size(self) -> Tuple[int, int]:
        raise NotImplementedError("use full_evictable_size() and mamba_evictable_size()")

    def protected_size(self) -> Tuple[int, int]:
        raise NotImplementedError("use full_protected_size() and mamba_protected_size()")

    def full_evictable_size(self) -> int:
        return self._lc.sizes()[0]

    def full_protected_size(self) -> int:
        return self._lc.sizes()[1]

    def mamba_evictable_size(self) -> int:
        return self._lc.sizes()[2]

    def mamba_protected_size(self) -> int:
        return self._lc.sizes()[3]

    def total_size(self) -> Tuple[int, int]:
        s = self._lc.sizes()
        return s[0] + s[1], s[2] + s[3]

    def pretty_print(self) -> None:
        print(self._lc.dump())
        t, m = self.total_size()
        print(f"#full_tokens: {t}, #mamba_num: {m}")

    def available_and_evictable_str(self) -> str:
        avail = self.token_to_kv_pool_allocator.available_size()
        ev = self.full_evictable_size()
        return (
            f"Available full tokens: {avail + ev} (full_available_size={avail} + full_evictable_size={ev})\n"
            f"Full LRU list evictable size: {ev}\n"
        )

    def all_values_flatten(self) -> torch.Tensor:
        vals = [n.value for n in self._walk() if n is not self.root_node]
        return torch.cat(vals) if vals else torch.tensor([])

    def all_mamba_values_flatten(self) -> torch.Tensor:
        vals = [n.mamba_value for n in self._walk() if n.mamba_value is not None]
        return torch.cat(vals) if vals else torch.tensor([])

    def _walk(self) -> List[TreeNode]:
        out, stack = [], [self.root_node]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(self._node(i, g) for i, g in self._lc.node_children(n._id, n._gen))
        return out

    def state_traffic(self) -> dict:
        """State copies (cow, forks) vs slots donated without a copy."""
        return self._lc.stats()

    # -- locks -------------------------------------------------------------------------

    def _own_node(self, node: Any, call: str) -> None:
        """node must be a TreeNode of this cache (SGLang's lock calls take
        no None: its cache reads the node's fields)."""
        if type(node) is not TreeNode:
            raise TypeError(f"{call}(): node must be a TreeNode, not {type(node).__name__}")
        if node._cache is not self:
            raise ValueError(f"{call}(): node {node._id} is a node of another cache")

    def inc_lock_ref(self, node: TreeNode) -> IncLockRefResult:
        if type(node) is not TreeNode or node._cache is not self:
            self._own_node(node, "inc_lock_ref")
        if not self.disable and node is not self.root_node:
            self._lc.lock(node._id, node._gen)
        return IncLockRefResult()

    def dec_lock_ref(self, node: TreeNode, params: Optional[DecLockRefParams] = None) -> DecLockRefResult:
        if type(node) is not TreeNode or node._cache is not self:
            self._own_node(node, "dec_lock_ref")
        if not self.disable and node is not self.root_node:
            self._lc.unlock(node._id, node._gen)
        return DecLockRefResult()

    # -- match ---------------------------------------------------------------------------

    def _empty(self) -> torch.Tensor:
        return torch.empty((0,), dtype=torch.int64, device=self.device)

    def _indices(self, a: np.ndarray) -> torch.Tensor:
        if self._on_cpu:   # a tensor over the array: no copy
            return torch.from_numpy(a)
        return _to_device(a, self.device)

    def _apply(self, req: Any, rs: Any) -> None:
        _apply_record(req, rs, self._ix)

    def _keep_running(self, req: Any, running: int, drop: bool) -> None:
        """A finished request's running slot as SGLang leaves it: None,
        unless the tree took it (no_buffer), then still pointing at it."""
        if drop:
            req.mamba_pool_idx = None
        elif _owns_record(req):
            req._rs.running = running

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """KV indices of the longest cached prefix whose state is cached,
        and its node.  With cow_mamba and a hit, the request gets a running
        slot (if it has none) and records the node's slot as its
        copy-on-write source."""
        if self.disable:
            return self._empty_match()
        try:
            key = params.key
            plain = (key.extra_key is None and key.limit is None and not key.is_bigram
                     and (not params.cow_mamba or params.req is None))
        except AttributeError as e:
            raise _params_error("match_prefix", params, "a MatchPrefixParams", e) from None
        if plain:
            # the usual call: a whole key in the default namespace, no
            # copy-on-write.  One C call with no keyword (parsing them costs);
            # len(key), a Python method of SGLang's RadixKey, is not asked:
            # an empty key gets the C call's empty match at the root, which
            # is the result _match_general gives it
            try:
                idx, nid, ngen, _, branching, _ = self._lc.match(key.token_ids)
            except TypeError:   # a key C does not read (an empty tensor): the general path decides
                plain = False
        if not plain:
            m = self._match_general(params, key)
            if m is None:
                return self._empty_match()
            idx, nid, ngen, branching = m
        node = self._node(nid, ngen)
        # MatchResult(device_indices, last_device_node, last_host_node,
        # best_match_node, mamba_branching_seqlen=...), built as the tuple it
        # is; the index tensor is _indices(idx), inline
        return _tuple_new(MatchResult, (_from_numpy(idx) if self._on_cpu else _to_device(idx, self.device),
                                        node, node, node, 0, 0, 0, None if branching < 0 else branching, None))

    def _empty_match(self) -> MatchResult:
        r = self.root_node
        return MatchResult(self._empty(), r, r, r)

    def _match_general(self, params: MatchPrefixParams, key: Any) -> Optional[Tuple[np.ndarray, int, int, int]]:
        """match_prefix for any key and copy-on-write: (indices, node id,
        node generation, branching length), or None for the empty match at
        the root without asking the tree (an empty key, a namespace never
        inserted)."""
        # a negative limit: SGLang's RadixKey has a negative length then
        limit = -1 if key.limit is None else count(key.limit, "match_prefix(): key.limit")
        tokens = token_array(key.token_ids, "match_prefix(): key.token_ids")
        ns = self._ns(key.extra_key, create=False, name="match_prefix(): key.extra_key")
        if len(key) == 0:
            return None
        if ns < 0:  # a namespace never inserted: nothing can match
            return None
        req = params.req
        cow = bool(params.cow_mamba) and req is not None
        if self._native and cow:
            rs = _rs_of(req)
            owner = int(req.req_pool_idx) if req.req_pool_idx is not None else -2
            try:
                idx, nid, ngen, state, branching, _ = self._lc.match(
                    tokens, ns=ns, cow=True, owner=owner, limit=limit, rs=rs
                )
            except BaseException:
                # failed once the record had its running slot and source
                # (building the result): the request keeps them, as
                # SGLang's Req does; its fields and row map follow
                self._apply(req, rs)
                if owner >= 1:
                    self.req_to_token_pool._sync_maps_to_device([owner])
                raise
            if state >= 0:  # the record has the running slot and the source
                self._apply(req, rs)
                if owner >= 1:  # the row's map has the running slot
                    self.req_to_token_pool._sync_maps_to_device([owner])
        else:
            idx, nid, ngen, state, branching, _ = self._lc.match(tokens, ns=ns, limit=limit)
            if cow:
                self._foreign_cow(req, nid, ngen)
        return idx, nid, ngen, branching

    def _foreign_cow(self, req: Req, nid: int, ngen: int) -> None:
        """match_prefix's copy-on-write over pools that are not ours: the
        lifecycle decides (Lifecycle.cow); a running slot it asks for comes from
        the pool's allocator and stays the tensor the allocator gave (the
        lifecycle only learns that the request has one)."""
        has_slot = req.mamba_pool_idx is not None
        rs, need = self._lc.cow(_C.ReqState(_RS_SLOT if has_slot else _RS_NONE), nid, ngen)
        if need:
            # the matched node stays while a state is evicted for its copy
            dst = self._alloc_mamba_slot(protect=(nid, ngen))
            req.mamba_pool_idx = dst[0]
            rs, _ = self._lc.cow(rs, nid, ngen, _RS_SLOT[0])
        if rs.cow_src < 0:
            return
        if _owns_record(req):
            req._rs.cow_src = rs.cow_src
            req._ix = self._ix
        else:
            req.mamba_cow_src_index = self._ix.slot1(rs.cow_src)
        req.mamba_needs_clear = bool(rs.needs_clear)

    # -- insert / evict --------------------------------------------------------------------

    def insert(self, params: InsertParams) -> InsertResult:
        if self.disable:
            return InsertResult(prefix_len=0, mamba_exist=False)
        try:
            key, value, mamba_value, prev = params.key, params.value, params.mamba_value, params.prev_prefix_len
            tokens, limit, extra = key.token_ids, key.limit, key.extra_key
        except AttributeError as e:
            raise _params_error("insert", params, "an InsertParams", e) from None
        if mamba_value is None:
            raise ValueError("insert(): params.mamba_value must be a state slot tensor, not None")
        # raw_token_ids() only when a limit cuts (as match_prefix reads keys)
        if limit is not None:
            # a negative limit: SGLang's RadixKey has a negative length then, and its insert raises
            count(limit, "insert(): key.limit")
            tokens = key.raw_token_ids()
        if type(tokens) is not array:
            tokens = token_array(tokens, "insert(): key.token_ids")
        if value is None:
            value = torch.tensor(list(tokens), dtype=torch.int64)
        state = _slot_of(mamba_value, self._ix)
        # SGLang passes a protected length past a shorter cached key (the
        # tracked length); the tree's own prefix then covers the whole key.
        if type(prev) is not int or prev < 0:
            prev = count(prev, "insert(): params.prev_prefix_len")
        ns = 0 if extra is None else self._ns(extra, name="insert(): key.extra_key")
        n = len(tokens)
        if n == 0:
            return InsertResult(prefix_len=0, mamba_exist=True)
        prev = min(prev, n)
        if self._native or type(value) is not torch.Tensor:
            pl, existed, nid, ngen, dups = self._lc.insert(
                tokens, _np_index(value, name="insert(): params.value"), state, ns=ns, prev_prefix_len=prev
            )
            if not self._native and dups.size:
                self._free_foreign(dups, dups[:0])
        else:
            # the duplicates are value[prev:prefix_len]: that slice of the
            # caller's tensor goes to the allocator, as SGLang frees it
            view = _host_view(value) if self._on_cpu else None   # a device's values: no view to try
            pl, existed, nid, ngen, _ = self._lc.insert(
                tokens, _np_index(value, name="insert(): params.value") if view is None else view, state,
                ns=ns, prev_prefix_len=prev, duplicates=False,
            )
            if pl > prev:
                # a CPU tensor's slice is made through its numpy view (the
                # same memory, several times cheaper than torch's slicing);
                # with pages, a slice per node (kv_free_ends), as SGLang frees them
                ends = (pl - prev,) if self.page_size == 1 else self._lc.kv_free_ends.tolist()
                at = prev
                for end in ends:
                    upto = prev + end
                    self.token_to_kv_pool_allocator.free(
                        value[at:upto] if view is None else _from_numpy(view[at:upto]))
                    at = upto
        node = self._node(nid, ngen)
        # InsertResult(prefix_len, total_len, last_device_node, mamba_exist):
        # positional, which the dataclass's __init__ takes faster than keywords
        return InsertResult(pl, 0, node, bool(existed))

    def evict(self, params: EvictParams) -> EvictResult:
        if self.disable:
            return EvictResult()
        try:
            num_tokens, mamba_num, swa = params.num_tokens, params.mamba_num, params.swa_num_tokens
        except AttributeError:
            raise TypeError(f"evict(): params must be an EvictParams, not {type(params).__name__}") from None
        # SGLang's evict skips a count <= 0; no SGLang caller passes a negative one
        count(swa, "evict(): params.swa_num_tokens")   # no SWA component: checked, nothing to evict
        t, s = self._evict(count(num_tokens, "evict(): params.num_tokens"),
                           count(mamba_num, "evict(): params.mamba_num"))
        return EvictResult(num_tokens_evicted=t, mamba_num_evicted=s)

    def _evict(self, num_tokens: int, num_states: int) -> Tuple[int, int]:
        t = s = 0
        if num_tokens > 0:
            t, s1, kv, st = self._lc.evict(num_tokens, 0)
            self._free_foreign(kv, st)
        if num_states > 0:
            t2, s, kv, st = self._lc.evict(0, num_states)
            self._free_foreign(kv, st)
        return t, s

    def _free_foreign(self, kv: np.ndarray, st: np.ndarray) -> None:
        """Frees what the lifecycle's last call handed out (kv: its KV
        array, st: its state slots).  A paged allocator gets the KV in the
        lifecycle's free calls (kv_free_ends: SGLang's, a node's, a tail's,
        the duplicates'), since each call's pages go, sorted, to the head
        of its free list; a token allocator appends, so one call does."""
        if self._native:
            return
        if kv.size:
            free = self.token_to_kv_pool_allocator.free
            if self.page_size == 1:
                free(self._indices(kv))
            else:
                start = 0
                for end in self._lc.kv_free_ends.tolist():
                    free(self._indices(kv[start:end]))
                    start = end
        if st.size:
            self.req_to_token_pool.mamba_allocator.free(self._indices(st))

    def evict_full(self, full_num_tokens: int) -> int:
        if self.disable:
            return 0
        n = count(full_num_tokens, "evict_full(): full_num_tokens")
        return self._evict(n, 0)[0] if n else 0

    def evict_mamba(self, mamba_num: int) -> int:
        if self.disable:
            return 0
        n = count(mamba_num, "evict_mamba(): mamba_num")
        return self._evict(0, n)[1] if n else 0

    def _alloc_mamba_slot(self, protect: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        slot = self._take_mamba_slot(protect)
        if slot is None:
            raise RuntimeError("no state slot even after evicting every unlocked cached state")
        return slot

    def _take_mamba_slot(self, protect: Optional[Tuple[int, int]] = None) -> Optional[torch.Tensor]:
        """One slot from the pool's allocator, or None; when none is free,
        the lifecycle evicts one cached state (keeping ``protect``, a node
        handle, and its path) and hands back what the allocators must free,
        then the allocator is asked again."""
        alloc = self.req_to_token_pool.mamba_allocator
        slot = alloc.alloc(1)
        if slot is None:
            _, _, kv, st = self._lc.evict(0, 1, protect=protect)
            self._free_foreign(kv, st)
            slot = alloc.alloc(1)
        return slot

    # -- caching requests ----------------------------------------------------------------------

    def _committed_len(self, req: Req, kwargs: dict) -> int:
        n = kwargs.get("kv_len_to_handle")
        if n is not None:
            return count(n, "cache_finished_req(): kv_len_to_handle")
        return int(req.pop_committed_kv_cache())

    def cache_finished_req(self, req: Req, is_insert: bool = True, **kwargs: Any) -> None:
        """Cache a finished request: the tree keeps the newest snapshot
        (extra_buffer) or the running slot (no_buffer); the tail KV and
        every other slot of the request are freed; its lock is dropped."""
        _req_arg(req, "cache_finished_req")
        ns = self._ns(req.extra_key, name="cache_finished_req(): req.extra_key")   # before the request changes
        if kwargs.get("kv_len_to_handle") is None and getattr(req, "kv_committed_freed", False):
            self._committed_len(req, kwargs)    # a double finish: its own error (nothing changes)
        if req.req_pool_idx is None:
            raise ValueError(f"cache_finished_req(): request {req.rid!r} holds no request row")
        if (self._native and not self.disable
                and ((req._rs.running < 0) if _owns_record(req) else (req.mamba_pool_idx is None))):
            raise _C.OwnershipError(f"cache_finished_req(): request {req.rid!r} holds no state slot (finished twice?)")
        if not self.disable:
            _check_last_node(req, self)
        committed = self._committed_len(req, kwargs)    # (pops the request's committed KV: checks first)
        pool = self.req_to_token_pool
        if self.disable:
            kv = pool.req_to_token[req.req_pool_idx, :committed]
            self.token_to_kv_pool_allocator.free(kv.to(torch.int64))
            pool.free_mamba_cache(req)
            return
        rs = _rs_of(req, with_node=True, cache=self)
        if not self._native:
            return self._foreign_cache_finished(req, rs, is_insert, committed, ns)
        running = rs.running
        # the key is origin_input_ids + output_ids, read without the sum
        self._lc.cache_finished(
            int(req.req_pool_idx), rs, req.origin_input_ids, committed, ns=ns,
            is_insert=bool(is_insert), tail=req.output_ids,
        )
        drop = self.enable_mamba_extra_buffer or pool.mamba_allocator._slots.owner(running) != "tree"
        self._keep_running(req, running, drop)
        if self.enable_mamba_extra_buffer:
            req.mamba_ping_pong_track_buffer = None
            req.mamba_next_track_idx = None

    def cache_unfinished_req(self, req: Req, chunked: bool = False, **kwargs: Any) -> None:
        """Cache a running request's prefix (end of a prefill chunk / of the
        prefill): with extra_buffer the newest snapshot slot is donated and
        the request's buffer gets a fresh slot (no copy); without, the
        running state is forked.  The request then points at the tree's KV
        indices and holds its lock on the new node."""
        _req_arg(req, "cache_unfinished_req")
        pool = self.req_to_token_pool
        if not self._native:
            return self._foreign_cache_unfinished(req, chunked)
        token_ids, fill = _fill_ids(req)
        row = int(req.req_pool_idx)
        if self.disable or self._lc.unfinished_cache_len(_rs_of(req), fill) < 0:
            req.prefix_indices = pool.req_to_token[row, : req.extend_range.end].to(torch.int64)
            return
        ns = self._ns(req.extra_key, name="cache_unfinished_req(): req.extra_key")
        rs = _rs_of(req, with_node=True, cache=self)
        _, prefix, fs, fd = self._lc.cache_unfinished(row, rs, token_ids, fill, ns=ns)
        if fs >= 0:
            pool.mamba_pool.copy_from(self._ix.slot1(fs), self._ix.slot1(fd))
        self._apply(req, rs)
        pool._sync_maps_to_device([row])
        pool.sync_device()
        req.prefix_indices = self._indices(prefix)
        req.cache_protected_len = rs.protected_len
        req.mamba_last_track_seqlen = None
        req.last_node = self._node(rs.node_id, rs.node_gen)

    # -- the same two operations over someone else's pools -------------------------
    # The C lifecycle decides (tree-only mode); what the pools' allocators must
    # free comes back as two arrays (_free_foreign frees them as SGLang does).

    def _foreign_cache_finished(self, req: Req, rs: Any, is_insert: bool, committed: int, ns: int) -> None:
        pool = self.req_to_token_pool
        kv = _np_index(pool.req_to_token[req.req_pool_idx, :committed], True)
        running = rs.running
        _, kv_free, st_free = self._lc.cache_finished(
            rs, req.origin_input_ids + req.output_ids, kv, ns=ns, is_insert=bool(is_insert)
        )
        self._free_foreign(kv_free, st_free)
        # the request's fields as SGLang's free_mamba_cache leaves them: a
        # no_buffer request whose running slot the tree took keeps pointing at it
        self._keep_running(req, running, self.enable_mamba_extra_buffer or bool((st_free == running).any()))
        if self.enable_mamba_extra_buffer:
            req.mamba_ping_pong_track_buffer = None
            req.mamba_next_track_idx = None

    def _foreign_cache_unfinished(self, req: Req, chunked: bool) -> None:
        pool = self.req_to_token_pool
        token_ids = req.get_fill_ids()
        row = req.req_pool_idx
        if self.disable or self._lc.unfinished_cache_len(_rs_of(req), len(token_ids)) < 0:
            req.prefix_indices = pool.req_to_token[row, : req.extend_range.end].to(torch.int64)
            return
        kv = _np_index(pool.req_to_token[row, : len(token_ids)], True)
        ns = self._ns(req.extra_key, name="cache_unfinished_req(): req.extra_key")
        # everything read from the request before the slot is taken: a refusal leaves it free
        keep = pool.get_mamba_ping_pong_keep_idx(req) if self.enable_mamba_extra_buffer else -1
        rs = _rs_of(req, with_node=True, cache=self)
        fresh = self._alloc_mamba_slot()  # evicts a cached state when none is free, as SGLang does
        p = rs.protected_len
        try:
            _, prefix, fs, fd, kv_free, st_free, end = self._lc.cache_unfinished(
                rs, token_ids, kv, int(fresh[0]), ns=ns
            )
        except BaseException:
            pool.mamba_allocator.free(fresh)
            raise
        if fs >= 0:
            pool.mamba_pool.copy_from(self._ix.slot1(fs), self._ix.slot1(fd))
        if self.enable_mamba_extra_buffer:
            # the tree took the newest snapshot's slot; the buffer gets the fresh one
            pool.set_mamba_ping_pong_slot(req, keep, fresh[0])
        self._free_foreign(kv_free, st_free)
        # the row must hold prefix[:protected_len]: past `end` it already
        # does (the tree took the row's own indices), so only the
        # duplicates the tree replaced are written
        if end > p:
            pool.write((row, slice(p, end)), _to_device(prefix[p:end], pool.req_to_token.device).to(pool.req_to_token.dtype))
        req.prefix_indices = self._indices(prefix)
        req.cache_protected_len = rs.protected_len
        req.mamba_last_track_seqlen = None
        req.last_node = self._node(rs.node_id, rs.node_gen)

    # -- tracking helpers for a driver (ScheduleBatch's mamba parts) ----------------

    def prepare_extend_track(self, req: Req, prefix_len: int, extend_len: int) -> Tuple[int, bool, int]:
        """The prefill tracking decision for one request: (track_slot,
        track_mask, track_seqlen); records mamba_last_track_seqlen and
        flips the ping-pong index as SGLang's ScheduleBatch does."""
        _req_arg(req, "prepare_extend_track")
        rs = _rs_of(req)
        _, slot, mask, seqlen = self._lc.prepare_extend(int(req.req_pool_idx or 0), rs,
                                                        count(prefix_len, "prepare_extend_track(): prefix_len"),
                                                        count(extend_len, "prepare_extend_track(): extend_len"))
        self._apply(req, rs)
        return slot, mask, seqlen

    def decode_track(self, req: Req, seq_len: int) -> Tuple[int, bool]:
        """Before a decode forward (seq_len includes the new token): the
        track slot and mask (seq_len % mamba_track_interval == 0); the lazy
        buffer borrows its second slot here (SGLang's prepare_for_decode)."""
        _req_arg(req, "decode_track")
        pool = self.req_to_token_pool
        if not self._native:
            return self._foreign_decode_track(req, count(seq_len, "decode_track(): seq_len"))
        rs = _rs_of(req)
        tracks = rs.track0, rs.track1
        seq_len = count(seq_len, "decode_track(): seq_len")
        _, slot, mask = self._lc.decode_prepare(int(req.req_pool_idx or 0), rs, seq_len)
        self._apply(req, rs)
        if (rs.track0, rs.track1) != tracks and req.req_pool_idx is not None:  # lazy borrow
            pool._sync_maps_to_device([int(req.req_pool_idx)])
        return slot, mask

    def _foreign_decode_track(self, req: Req, seq_len: int) -> Tuple[int, bool]:
        pool = self.req_to_token_pool
        if req.mamba_ping_pong_track_buffer is None:
            return -1, False
        rs = _rs_of(req)
        tracks = rs.track0, rs.track1
        _, slot, mask, need = self._lc.decode_prepare(rs, seq_len)
        if need:  # lazy mode borrows a slot at this boundary: one from SGLang's allocator
            fresh = self._take_mamba_slot()
            if fresh is not None:
                _, slot, mask, _ = self._lc.decode_prepare(rs, seq_len, int(fresh[0]))
        self._set_foreign_tracks(req, rs, tracks)
        req.mamba_next_track_idx = rs.next_track
        return int(slot), bool(mask)

    def _set_foreign_tracks(self, req: Any, rs: Any, before: tuple) -> None:
        """The track entries a tree-only call changed, through SGLang's pool
        (its map row follows)."""
        pool = self.req_to_token_pool
        for j, v in enumerate((rs.track0, rs.track1)):
            if v != before[j]:
                pool.set_mamba_ping_pong_slot(req, j, v)

    def decode_track_done(self, req: Req, finished: bool = False) -> bool:
        """After a decode result: at a boundary (kv_committed_len a multiple
        of the interval) record the tracked length and flip the ping-pong
        index (lazy: return the borrowed slot, or mark a finished request
        not insertable).  Returns True at a boundary."""
        _req_arg(req, "decode_track_done")
        pool = self.req_to_token_pool
        if not self._native:
            rs = _rs_of(req)
            tracks = rs.track0, rs.track1
            _, at, st_free = self._lc.decode_finish(rs, int(req.kv_committed_len), bool(finished))
            self._free_foreign(st_free[:0], st_free)
            self._set_foreign_tracks(req, rs, tracks)  # lazy: the borrowed slot given back
            if at:
                req.mamba_last_track_seqlen = rs.last_track_seqlen
                req.mamba_next_track_idx = rs.next_track
                req.mamba_lazy_is_insert = bool(rs.lazy_is_insert)
            return bool(at)
        rs = _rs_of(req)
        _, at = self._lc.decode_finish(int(req.req_pool_idx or 0), rs, int(req.kv_committed_len), bool(finished))
        self._apply(req, rs)
        return bool(at)

