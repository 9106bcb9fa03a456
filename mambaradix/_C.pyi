"""Type stubs of the native module `mambaradix._C` (the radix tree part).

Keys are token ids: any sequence of ints, or a buffer (numpy int32/int64,
array('i'), array('q')); int32 buffers are read without a copy.  KV index
results are numpy int64 arrays.  Node handles stay safe after the node is
split or evicted: a removed node raises StaleNodeError when used.
"""

from typing import Any, Literal, Optional, Sequence, Union

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
    def prefix_len(self) -> int:
        """Tokens from the root to the end of this node."""
    @property
    def extra_key(self) -> Optional[str]: ...
    def __len__(self) -> int:
        """Edge length in tokens."""

class MatchResult:
    """Result of RadixTree.match_prefix (a named tuple)."""

    indices: npt.NDArray[np.int64]
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
      state is used, SGLang PR #31643) or "sglang" (v0.5.15: every state on
      the matched path, and states on insert walks and splits).
    """

    def __init__(
        self,
        page_size: int = 1,
        chunk_size: Optional[int] = None,
        lru_policy: Literal["consumed", "sglang"] = "consumed",
    ) -> None: ...
    @property
    def page_size(self) -> int: ...
    @property
    def chunk_size(self) -> int: ...
    @property
    def lru_policy(self) -> str: ...
    @property
    def root(self) -> Node: ...
    def match_prefix(self, key: _Key, extra_key: Optional[str] = None) -> MatchResult:
        """Longest usable cached prefix of key (truncated to whole pages).

        Splits a partially matched node (the upper half has no state) and
        refreshes the LRU lists, as SGLang does."""
    def insert(
        self,
        key: _Key,
        value: _Values,
        state: int,
        *,
        extra_key: Optional[str] = None,
        prev_prefix_len: int = 0,
    ) -> InsertResult:
        """Insert key with its KV indices and the state slot at its end."""
    def evict_full(self, num_tokens: int) -> EvictResult:
        """Evict LRU unlocked leaves until num_tokens KV tokens are released."""
    def evict_mamba(self, num_states: int) -> EvictResult:
        """Evict LRU unlocked states (internal nodes become tombstones)."""
    def inc_lock_ref(self, node: Node) -> None: ...
    def dec_lock_ref(self, node: Node) -> None:
        """Undo one inc_lock_ref(node); ValueError if node is not locked."""
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
