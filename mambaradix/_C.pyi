"""Type stubs of the native module `mambaradix._C` (the radix tree part).

Keys are token ids: any sequence of ints, or a buffer (numpy int32/int64,
array('i'), array('q')); int32 buffers are read without a copy.  KV index
results are numpy int64 arrays.  Node handles stay safe after the node is
split or evicted: a removed node raises StaleNodeError when used.
"""

from typing import Any, Callable, Literal, Optional, Sequence, Union, overload

import numpy as np
import numpy.typing as npt

from .tensor import StatePool as StatePool
from .tensor import Tensor as Tensor
from .tensor import write_req_to_token as write_req_to_token

_Key = Union[Sequence[int], npt.NDArray[np.integer], Any]
_Values = Union[Sequence[int], npt.NDArray[np.int64], Any]

cuda_compiled: bool
"""True when the module was built with its CUDA kernels."""

def cuda_device_count() -> int:
    """Number of CUDA devices visible; 0 without a GPU, a driver, or a CUDA build."""

def hash_blocks_write(keys: npt.NDArray[np.uint32], mults: npt.NDArray[np.uint32], first: int,
                      vocab_size: int, out: npt.NDArray[np.int32]) -> None:
    """The simulator's hash-block tokens into ``out`` (1-D C-contiguous
    int32): token j of block b is ``(keys[b] * mults[j] mod 2**32) *
    vocab_size >> 32``, from block ``first`` on (``len(mults)`` is the block
    size)."""

class Error(Exception):
    """Base class of mambaradix's own errors."""

class StaleNodeError(Error, ValueError):
    """A node handle refers to a node that was evicted, or to another tree."""

class InvariantError(Error, AssertionError):
    """sanity_check() found a broken invariant (the message names it)."""

class Node:
    """A handle to one tree node.  Equal handles compare and hash equal."""

    @property
    def id(self) -> int: ...
    @property
    def valid(self) -> bool:
        """False once the node was removed from its tree."""
    @property
    def is_root(self) -> bool: ...
    @property
    def key(self) -> npt.NDArray[np.int32]:
        """Copy of the node's edge tokens (empty for the root)."""
    @property
    def value(self) -> npt.NDArray[np.int64]:
        """Copy of the KV indices of the edge tokens."""
    @property
    def state(self) -> Optional[int]:
        """The state slot at the end of this node, None for a tombstone or the root."""
    @property
    def parent(self) -> Optional["Node"]: ...
    @property
    def children(self) -> list["Node"]: ...
    @property
    def full_lock_ref(self) -> int: ...
    @property
    def state_lock_ref(self) -> int: ...
    @property
    def can_evict_state(self) -> bool:
        """True when a state eviction may take this node's state now (the tree's rule)."""
    @property
    def prefix_len(self) -> int:
        """Tokens from the root to the end of this node."""
    @property
    def extra_key(self) -> Optional[str]: ...
    @property
    def hits(self) -> int:
        """Inserts that walked through or created the node (SGLang 0.5.23's hit_count)."""
    def __len__(self) -> int:
        """Edge length in tokens."""

class MatchResult:
    """Result of RadixTree.match_prefix (a named tuple)."""

    indices: Optional[npt.NDArray[np.int64]]   # None with match_prefix(indices=False)
    """KV indices of the usable prefix: root to the deepest node with a state."""
    node: Node
    """That node (the root when nothing usable matched)."""
    state: Optional[int]
    """Its state slot, None at the root."""
    kv_matched_len: int
    """Tokens whose KV matched, through tombstones and a split edge."""
    branching_seqlen: Optional[int]
    """kv_matched_len aligned down to chunk_size when the KV match goes deeper
    than `node` (and the aligned value is > 0); else None."""
    kv_node: Node
    """The deepest node whose KV matched (attribute only: not unpacked)."""

class InsertResult:
    """Result of RadixTree.insert (a named tuple)."""

    prefix_len: int
    """Tokens of the key that were already in the tree."""
    state_existed: bool
    """True when the node at the key's end already had a state: the caller
    keeps its slot (and frees it)."""
    node: Node
    """The node that ends at the key's end (the root for an empty key)."""
    duplicates: npt.NDArray[np.int64]
    """The caller's KV indices for tokens already cached, beyond
    prev_prefix_len: the caller must free them."""

class EvictResult:
    """Result of RadixTree.evict_full / evict_mamba (a named tuple)."""

    tokens_evicted: int
    states_evicted: int
    kv_indices: npt.NDArray[np.int64]
    """KV indices released by the tree, for the caller to free."""
    state_slots: npt.NDArray[np.int64]
    """State slots released by the tree, for the caller to free."""

class RadixTree:
    """SGLang MambaRadixCache's tree in C.

    page_size: tokens per page (>= 1); matches and splits are per page, and
      inserted keys must be whole pages.
    chunk_size: alignment of branching lengths (default max(64, page_size));
      one of page_size and chunk_size must divide the other.
    lru_policy: "consumed" (default; a match refreshes only the node whose
      state is used, SGLang PR #31643), "sglang" (v0.5.15: every state on
      the matched path, and states on insert walks and splits), "utility"
      (Marconi-style: FLOPs saved per byte plus recency; policy_options has
      its parameters), "adaptive" (touches as "consumed"; GreedyDual-Size-
      Frequency over the prefill a state spares: docs/adaptive.md), or one of SGLang 0.5.23's leaf orders for the KV
      victim (--radix-eviction-policy; touches as "consumed"): "lfu" (fewest
      hits first), "fifo" (oldest node), "mru" (most recently used), "filo"
      (newest node), "priority" (lowest insert priority), "slru" (hits below
      policy_options["protected_threshold"], default 2, first) or "tlru"
      (leaves past the branch's budget first; policy_options "threshold" and
      "next_prompt_estimate", default 0); ties go to the least recently used.
      evict_full takes their victims from a heap of the evictable leaves,
      O(log n) a victim.
    Flags (check_ownership, kv_only, values, and indices= below) take True /
    False or a numpy.bool_; anything else is TypeError.
    check_ownership: track the KV indices and state slots the tree holds;
      insert() then raises ValueError (tree unchanged) for a KV index past
      prev_prefix_len or a state slot the tree already holds, an index listed
      twice, or a prev_prefix_len longer than the key.  Off by default, as
      SGLang accepts all of these.
    values: False keeps keys only, no KV index per token (a third of the
      memory, for trees that only measure prefixes, such as the simulator's
      record of every key seen): insert() takes value=None, match_prefix()
      and insert() return None for the indices and the duplicates,
      Node.value is None, evictions count tokens and return no KV indices,
      and path_indices() raises ValueError.
    """

    def __init__(
        self,
        page_size: int = 1,
        chunk_size: Optional[int] = None,
        lru_policy: Literal["consumed", "sglang", "utility", "adaptive", "lfu", "fifo", "mru", "filo",
                            "priority", "slru", "tlru"] = "consumed",
        *,
        check_ownership: bool = False,
        policy_options: Optional[dict[str, float]] = None,
        max_states_per_path: Optional[int] = None,
        semantics: Literal["v0.5.15", "v0.5.23"] = "v0.5.15",
        kv_only: bool = False,
        values: bool = True,
    ) -> None:
        """semantics="v0.5.23": SGLang 0.5.23's tree rules (state None on
        insert; no cascade through stateless ancestors on eviction).
        kv_only: the whole KV match is usable (attention-only trees)."""
    @property
    def page_size(self) -> int: ...
    @property
    def chunk_size(self) -> int: ...
    @property
    def lru_policy(self) -> str: ...
    @property
    def root(self) -> Node: ...
    def match_prefix(self, key: _Key, extra_key: Optional[str] = None, *,
                     indices: bool = True) -> MatchResult:
        """Longest usable cached prefix of key (truncated to whole pages).

        Splits a partially matched node (the upper half has no state) and
        refreshes the LRU lists, as SGLang does.  indices=False: the result's
        indices are None (no copy)."""
    def cached_len(self, key: _Key, extra_key: Optional[str] = None) -> int:
        """How many leading tokens of key the tree holds under extra_key (whole
        pages): match_prefix's kv_matched_len without its effects (no split,
        no recency touched).  An extra_key never seen holds nothing."""
    def match_node(self, node: Node) -> int:
        """The effects of match_prefix on the key that ends exactly at node
        (which has a state), without reading the key; returns its prefix
        length."""
    def insert(
        self,
        key: _Key,
        value: Optional[_Values],
        state: Optional[int],
        *,
        extra_key: Optional[str] = None,
        prev_prefix_len: int = 0,
        priority: int = 0,
        inserted_len: int = 0,
    ) -> InsertResult:
        """Insert key with its KV indices and the state slot at its end
        (None: no state, semantics="v0.5.23" only).  priority and
        inserted_len feed the leaf orders: the nodes walked or created keep
        the highest priority inserted through them ("priority"), and count a
        hit ("lfu", "slru") when they end past inserted_len."""
    def inc_kv_lock(self, node: Node) -> None:
        """Lock only the KV of node's path, never its state."""
    def dec_kv_lock(self, node: Node) -> None:
        """Undo one inc_kv_lock(node); ValueError if node holds none (a lock of
        inc_lock_ref is undone by dec_lock_ref)."""
    def dec_state_lock(self, node: Node) -> None:
        """Release the state part of one inc_lock_ref(node), keeping its KV
        part as one inc_kv_lock(node) lock; ValueError if node holds no lock
        of inc_lock_ref."""
    def path_indices(self, node: Node) -> npt.NDArray[np.int64]:
        """KV indices of the path root..node, in token order."""
    def evict_path_states(self, node: Node, cap: int) -> npt.NDArray[np.int64]:
        """Drop the shallowest states beyond cap on the path to node (KV kept);
        returns their slots to free (SGLang 0.5.23's mamba_max_states_per_path)."""
    def evict_full(self, num_tokens: int, /, *, indices: bool = True) -> EvictResult:
        """Evict LRU unlocked leaves until num_tokens KV tokens are released.
        indices=False: kv_indices is empty (the tokens are only counted)."""
    def evict_mamba(self, num_states: int, /, *, indices: bool = True) -> EvictResult:
        """Evict LRU unlocked states (internal nodes become tombstones).
        indices=False: kv_indices is empty (the tokens are only counted)."""
    def inc_lock_ref(self, node: Node) -> None: ...
    def dec_lock_ref(self, node: Node) -> None:
        """Undo one inc_lock_ref(node); ValueError if node holds no such lock
        (a lock of inc_kv_lock is undone by dec_kv_lock, under both semantics)."""
    def full_evictable_size(self) -> int: ...
    def full_protected_size(self) -> int: ...
    def mamba_evictable_size(self) -> int: ...
    def mamba_protected_size(self) -> int: ...
    def total_size(self) -> tuple[int, int]:
        """(KV tokens, states) held by the tree."""
    def node_count(self) -> int:
        """Non-root nodes."""
    def memory_bytes(self) -> int:
        """Bytes of memory the tree holds."""
    def sanity_check(self) -> None:
        """Verify every invariant; raises InvariantError naming the broken one."""
    def reset(self) -> None:
        """Drop every node (pool slots are not freed: clear the pools)."""
    def pretty_print(self) -> str:
        """Readable dump, one node a line."""
    def lru_order(self, which: Literal["full", "mamba"] = "full") -> list[Node]:
        """Nodes of an LRU list, most recently used first."""
    def namespace(self, extra_key: Optional[str], /, create: bool = True) -> int:
        """extra_key's namespace id (None: 0), as insert / match_prefix assign
        them (-1 for a name never seen when not create): the ``ns`` of the
        Lifecycle calls when this is its tree_view()."""
    def namespace_name(self, ns: int, /) -> Optional[str]:
        """The extra_key of a namespace id (None: 0 or an id never assigned)."""

# ---------------------------------------------------------------------------
# Pools and the request lifecycle (csrc/slot_alloc.c, req_pool.c,
# lifecycle.c; binding py_pools.c, py_lifecycle.c)

_RsTuple = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int]
"""A request's cache-side state as a tuple, -1 = None: (running, track0,
track1, next_track, last_track_seqlen, branching_seqlen, cow_src,
needs_clear, lazy_is_insert, protected_len, node_id, node_gen, locked)."""

class ReqState:
    """One request's cache-side record (the C struct the per-request calls
    update in place; a call given a ReqState returns that same object).  It
    lives in this object until ``Lifecycle.admit`` gives the request a row,
    then in that ReqPool row (``row``; the track entries are the row of the
    pool's track map), until ``ReqPool.free`` or ``Lifecycle.cache_finished``
    hands it back.  A handle whose row was freed behind its back raises
    ReferenceError.  While not in a row its buffer is the two track entries,
    int64 (``torch.frombuffer(rs, dtype=torch.int64)``); in a row,
    BufferError."""

    def __init__(self, rs: Optional[_RsTuple] = None) -> None: ...
    running: int
    track0: int
    track1: int
    next_track: int
    last_track_seqlen: int
    branching_seqlen: int
    cow_src: int
    needs_clear: int
    lazy_is_insert: int
    protected_len: int
    node_id: int
    node_gen: int
    locked: int
    @property
    def row(self) -> int: ...
    def astuple(self) -> _RsTuple: ...
    def reset(self) -> None: ...

_Rs = Union[ReqState, _RsTuple]
"""A ReqState (updated in place and returned) or a tuple (a new one is
returned)."""

class OwnershipError(Error, ValueError):
    """A slot, token or row was freed twice, or by someone who does not own it."""

class SlotAllocator:
    """FIFO allocator of units 1..size (size >= 1; 0 reserved) recording every unit's
    owner: free, held by a caller, a request row, or the prefix tree.  With
    page_size > 1 it hands out whole pages and size counts tokens."""

    def __init__(self, size: int, page_size: int = 1) -> None: ...
    @property
    def size(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    def alloc(self, n: int, owner: Optional[int] = None) -> Optional[npt.NDArray[np.int64]]: ...
    def free(self, indices: _Values) -> None:
        """OwnershipError: already free, or owned by the tree; ValueError: out
        of range or listed twice.  The message names the entry and why:
        "free(): indices[3] = 5000 is out of range [1, 1025)"."""
    def release_tree(self, indices: _Values) -> None: ...
    def transfer(self, indices: _Values, to: Union[int, Literal["tree", "held"]]) -> None: ...
    def available_size(self) -> int: ...
    def owner(self, index: int) -> Union[int, str]: ...
    def counts(self) -> dict[str, int]: ...
    def check(self) -> None: ...
    def clear(self) -> None: ...
    def alloc_group_begin(self, n: int) -> None: ...
    def alloc_group_end(self) -> None: ...

class ReqPool:
    """Request rows 1..size (size >= 1; row 0 = padding), the int32 req-to-token table
    and the row -> state slot maps, as zero-copy numpy views."""

    def __init__(self, size: int, max_context_len: int, track_buffer_size: int = 2) -> None: ...
    table: npt.NDArray[np.int32]
    state_map: npt.NDArray[np.int32]
    track_map: npt.NDArray[np.int64]
    size: int
    max_context_len: int
    track_buffer_size: int
    def alloc(self, n: int) -> Optional[npt.NDArray[np.int64]]: ...
    def free(self, row: int) -> None: ...
    def record(self, row: int) -> ReqState: ...
    def in_use(self, row: int) -> bool: ...
    def write(self, row: int, start: int, values: _Values) -> None: ...
    def mark_dirty(self, row: int, start: int, end: int) -> None: ...
    def take_dirty(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
    def available_size(self) -> int: ...
    def clear(self) -> None: ...
    def check(self) -> None: ...

class UnfinishedResult(tuple):
    """Result of Lifecycle.cache_unfinished: unpacks to (rs,
    prefix_indices, fork_src, fork_dst, kv_to_free, slots_to_free,
    table_end); cache_len and kv_free_ends by name."""

    rs: _Rs
    prefix_indices: Optional[npt.NDArray[np.int64]]
    fork_src: int
    fork_dst: int
    kv_to_free: npt.NDArray[np.int64]
    slots_to_free: npt.NDArray[np.int64]
    table_end: int
    cache_len: int
    """Tokens the call inserted into the tree (0: none)."""
    kv_free_ends: npt.NDArray[np.int64]

class FinishedResult(tuple):
    """Result of Lifecycle.cache_finished: unpacks to (rs,
    kv_to_free, slots_to_free); cache_len and kv_free_ends by name."""

    rs: _Rs
    kv_to_free: npt.NDArray[np.int64]
    slots_to_free: npt.NDArray[np.int64]
    cache_len: int
    """Tokens the call inserted into the tree (0: none)."""
    kv_free_ends: npt.NDArray[np.int64]

class Lifecycle:
    """A prefix tree plus SGLang v0.5.15's request lifecycle over the pools
    (or a tree whose evictions are handed back, with no pools)."""

    def __init__(
        self,
        state_allocator: Optional[SlotAllocator] = None,
        kv_allocator: Optional[SlotAllocator] = None,
        req_pool: Optional[ReqPool] = None,
        *,
        page_size: int = 1,
        chunk_size: int = 64,
        lru_policy: Literal["sglang", "consumed", "utility", "adaptive"] = "sglang",
        extra_buffer: bool = False,
        lazy: bool = False,
        track_buffer_size: int = 2,
        track_interval: int = 256,
        end_of_turn_states: bool = False,
        policy_options: Optional[dict[str, float]] = None,
        max_states_per_path: Optional[int] = None,
        semantics: Literal["v0.5.15", "v0.5.23"] = "v0.5.15",
        values: bool = True,
        counts: Optional[tuple[int, int, int]] = None,
    ) -> None:
        """values=False (no pools): the tree keeps keys only; the cache
        calls take kv as a count and hand out KV indices that are 0.
        counts=(kv_tokens, state_slots, rows) with values=False: pools the
        Lifecycle counts itself (every free goes back to them; the calls
        given no fresh slot take one from them)."""
    page_size: int
    chunk_size: int
    has_pools: bool
    # counted pools (None when not counted)
    kv_free: Optional[int]
    slots_free: Optional[int]
    rows_free: Optional[int]
    def take_kv(self, n: int, /, evict_below: Optional[int] = None) -> None:
        """Take n KV tokens, evicting first by the release's rule when fewer
        than evict_below (default n) are free; RuntimeError when short."""
    def take_admission(self, n_reqs: int, slots: int, rows: int, /) -> None:
        """A batch's rows and the slots admit() numbered, after the state
        headroom eviction; RuntimeError when short."""
    def free_row(self, committed_len: int, allocated_len: int, /) -> None:
        """A finished request's row, and its KV past committed_len."""
    def set_victims(self, policy: Optional[Callable[[Optional[tuple[int, int]]], Optional[tuple[int, int]]]],
                    /) -> None:
        """Every state eviction takes the victims policy(protect) names."""
    def counts(self) -> dict[str, int]:
        """Totals, free counts, peaks, eviction and donation counters."""
    # tree-only: where each free call of the last handed-out KV array ends
    kv_free_ends: npt.NDArray[np.int64]
    # tree
    def match(self, key: _Key, *, ns: int = 0, cow: bool = False, running: int = -1, owner: int = -2,
              limit: int = -1, rs: Optional[ReqState] = None) -> tuple[npt.NDArray[np.int64], int, int, int, int, int]: ...
    def insert(self, key: _Key, value: _Values, state: int, *, ns: int = 0, prev_prefix_len: int = 0,
               duplicates: bool = True) -> tuple[int, bool, int, int, Optional[npt.NDArray[np.int64]]]: ...
    def evict(self, num_tokens: int = 0, num_states: int = 0, /, *, protect: Optional[tuple[int, int]] = None
              ) -> tuple[int, int, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Evict LRU leaves for num_tokens KV tokens, then LRU states for
        num_states; protect, a node handle (node_id, node_gen), is locked
        meanwhile: its state and its path's KV stay (SGLang's match_prefix
        keeps the matched node so while it evicts for a copy-on-write slot).
        Returns (tokens_evicted, states_evicted, kv_indices, state_slots);
        without pools the arrays are what the caller's allocators must free
        (empty with pools: already freed).  StaleNodeError for a removed
        node."""
    def lock(self, node_id: int, node_gen: int, /) -> None: ...
    def unlock(self, node_id: int, node_gen: int, /) -> None: ...
    def node_info(self, node_id: int, node_gen: int, /) -> tuple: ...
    def node_key(self, node_id: int, node_gen: int, /) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
    def node_children(self, node_id: int, node_gen: int, /) -> list[tuple[int, int]]: ...
    def lru(self, which: int = 0, /) -> list[tuple[int, int]]: ...
    def root(self) -> tuple[int, int]: ...
    def sizes(self) -> tuple[int, int, int, int, int]: ...
    def check(self) -> None: ...
    def reset(self) -> None: ...
    def dump(self) -> str: ...
    def stats(self) -> dict[str, int]: ...
    def namespace(self, extra_key: Optional[str], /, create: bool = True) -> int:
        """The ``ns`` of extra_key for this Lifecycle's calls (RadixTree.namespace)."""
    def namespace_name(self, ns: int, /) -> Optional[str]:
        """The extra_key of a namespace id (None: 0 or an id never assigned)."""
    def tree_view(self) -> RadixTree:
        """A RadixTree over this (tree-only) Lifecycle's tree; keeps it alive."""
    # per request; with pools (row, rs, ...), without pools (rs, ...): what the caller's
    # allocators must free comes back per call (kv: the request's KV indices, or their
    # number with values=False)
    def alloc_state(self, *, owner: int = -2) -> int: ...
    @overload
    def admit(self, rows: Sequence[int], rs_list: Sequence[_Rs], *, headroom: bool = False) -> Optional[tuple[list[int], list[_Rs]]]: ...
    @overload
    def admit(self, rs: _Rs, fresh: Union[Sequence[int], int] = (), /) -> tuple[_Rs, int]:
        """fresh a sequence: need (none given) or 0; fresh an int (a slot
        counter): the slots taken are fresh, fresh + 1, ...; returns how many."""
    def prepare_extend(self, row: int, rs: _Rs, prefix_len: int, extend_len: int, /) -> tuple[_Rs, int, bool, int]: ...
    @overload
    def decode_prepare(self, row: int, rs: _Rs, seq_len: int, /) -> tuple[_Rs, int, bool]: ...
    @overload
    def decode_prepare(self, rs: _Rs, seq_len: int, fresh: int = -1, /) -> tuple[_Rs, int, bool, bool]: ...
    @overload
    def decode_finish(self, row: int, rs: _Rs, committed_len: int, finished: bool, /) -> tuple[_Rs, bool]: ...
    @overload
    def decode_finish(self, rs: _Rs, committed_len: int, finished: bool, /) -> tuple[_Rs, bool, npt.NDArray[np.int64]]: ...
    @overload
    def cache_unfinished(self, row: int, rs: _Rs, tokens: _Key, fill_len: int, /, *, ns: int = 0) -> tuple[_Rs, npt.NDArray[np.int64], int, int]: ...
    @overload
    def cache_unfinished(self, rs: _Rs, tokens: _Key, kv: Union[_Values, int], fresh: int, /, *, ns: int = 0, prefix: bool = True) -> UnfinishedResult: ...
    @overload
    def cache_finished(self, row: int, rs: _Rs, tokens: _Key, committed_len: int, /, *, ns: int = 0, is_insert: bool = True) -> _Rs: ...
    @overload
    def cache_finished(self, rs: _Rs, tokens: _Key, kv: Union[_Values, int], /, *, ns: int = 0, is_insert: bool = True, state_available: int = -1) -> FinishedResult: ...
    def free_states(self, rs: _Rs, /, *, keep: int = -1) -> _Rs: ...
    def cow(self, rs: _Rs, node_id: int, node_gen: int, fresh: int = -1, /) -> tuple[_Rs, bool]: ...
    # one call per batch; a refused call (None, or an exception) changes nothing:
    # whether it fits is decided, counting what eviction could free, before anything is evicted
    def prefill_batch(self, keys: Sequence[_Key], /, *, ns: Optional[Sequence[int]] = None) -> Optional[dict[str, npt.NDArray[Any]]]: ...
    def unfinished_batch(self, rows: _Values, keys: Sequence[_Key], /, *, ns: Optional[Sequence[int]] = None) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
    def decode_batch(self, rows: _Values, /) -> Optional[tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]]: ...
    def finish_batch(self, rows: _Values, keys: Sequence[_Key], /, *, ns: Optional[Sequence[int]] = None, is_insert: bool = True) -> None: ...


# ---------------------------------------------------------------------------
# SGLang 0.5.23 TreeCore's hot calls (binding py_unified.c; built and bound by
# mambaradix.sglang.unified, not a public API)

class UnifiedCore:
    """The C side of mambaradix.sglang.unified's TreeCore over one RadixTree:
    each method reads SGLang's parameter objects and builds its result objects
    (the classes are handed over once).  `policy` is SGLang's
    --radix-eviction-policy name (lru, lfu, fifo, mru, filo, priority, slru,
    tlru), set on the empty tree; `order` is (slru protected_threshold, tlru
    threshold, tlru next_prompt_estimate)."""

    def __init__(self, tree: RadixTree, core: Any, classes: tuple[Any, ...], templates: tuple[dict[str, Any], dict[str, Any], dict[str, Any]],
                 to_tensor: Any, empty_tensor: Any, has_mamba: bool, events: bool, page_size: int, chunk: int,
                 path_cap: int, policy: str = "lru", order: tuple[int, int, int] = (2, 0, 0)) -> None: ...
    def match_prefix(self, params: Any, /) -> Any: ...
    def begin_insert(self, params: Any, /) -> Any: ...
    def end_insert(self) -> list[Any]: ...
    def has_ongoing_insert(self) -> bool: ...
    def collect_full_device_indices(self, from_node_id: int, until_node_id: int, /) -> Any: ...
    def path_device_indices(self, node_id: int, /) -> Any: ...
    def inc_lock_ref(self, node_id: int, skip_lock_components: Sequence[Any] = ()) -> Any: ...
    def dec_lock_ref(self, node_id: int, params: Any, skip_swa: bool = False) -> Any: ...
    def node(self, node_id: int, /) -> Node: ...
    def tree_insert(self, tokens: npt.NDArray[np.int64], values: npt.NDArray[np.int64], state: Optional[int],
                    extra_key: Optional[str], prev_prefix_len: int, inserted_len: int, priority: int, /) -> tuple[int, bool, Node, int]: ...
