"""A pure-Python reference model of `mambaradix.RadixTree`.

Written from the description of SGLang v0.5.15's MambaRadixCache tree
(match / split / insert / lock / evict and the two LRU lists), plus the
deliberate differences of mambaradix (see `csrc/core/radix.h`):

* the tree never frees indices: insert returns the caller's duplicate KV
  indices, evictions return the KV indices and state slots they release;
* a lock taken on a tombstone records that it took no state reference, and
  an unlock releases such a lock before one that holds the state;
* `evict_mamba` never picks a leaf whose KV is locked;
* a tombstone leaf left behind because it was locked is evicted by
  `evict_full` like any other leaf once it is unlocked;
* empty keys never create nodes; unlocking a node that is not locked raises
  ValueError; with page_size > 1 a match uses whole pages only and an
  inserted key must be whole pages.

The model favours plain, checkable code over speed: dicts, lists and an
OrderedDict per LRU list (its last entry is the most recently used).  The
differential tests drive it and the C tree through the same operations and
compare every result; the benchmarks use it as the baseline.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple, Optional

POLICIES = ("consumed", "sglang")


class RefStaleNodeError(ValueError):
    """A node handle of the model that was removed, or belongs to another model."""


class RefNode:
    """One node: an edge of tokens with their KV indices, and maybe a state."""

    __slots__ = (
        "tree",
        "key",
        "value",
        "state",
        "parent",
        "child_map",
        "full_lock",
        "state_lock",
        "nostate_lock",
        "extra_key",
        "alive",
    )

    def __init__(self, tree, key, value, state, parent, extra_key):
        self.tree = tree
        self.key = key  # list of token ids (the edge)
        self.value = value  # list of KV indices, one per edge token
        self.state = state  # state slot or None (tombstone / root)
        self.parent = parent
        self.child_map = {}  # child key -> RefNode
        self.full_lock = 0
        self.state_lock = 0  # locks taken while the node had a state
        self.nostate_lock = 0  # locks taken while the node was a tombstone
        self.extra_key = extra_key
        self.alive = True

    # The same read-only view as mambaradix.Node, so that tests written for
    # the C tree can run against the model too.
    @property
    def valid(self) -> bool:
        return self.alive

    @property
    def is_root(self) -> bool:
        return self.parent is None and self.alive and self is self.tree.root

    @property
    def full_lock_ref(self) -> int:
        return self.full_lock

    @property
    def state_lock_ref(self) -> int:
        return self.state_lock

    @property
    def prefix_len(self) -> int:
        n = 0
        node = self
        while node.parent is not None:
            n += len(node.key)
            node = node.parent
        return n

    @property
    def path(self) -> tuple:
        """(extra_key, all tokens from the root to the end of this node)."""
        parts = []
        node = self
        while node.parent is not None:
            parts.append(node.key)
            node = node.parent
        tokens = []
        for part in reversed(parts):
            tokens.extend(part)
        return (self.extra_key, tuple(tokens))

    @property
    def children(self) -> list:
        return sorted(self.child_map.values(), key=_sort_key)

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        if self.parent is None:
            return "RefNode(root)"
        return "RefNode(path=%r, state=%r, full_lock=%d, state_lock=%d)" % (
            self.path,
            self.state,
            self.full_lock,
            self.state_lock,
        )


class RefMatch(NamedTuple):
    indices: list
    node: RefNode
    state: Optional[int]
    kv_matched_len: int
    branching_seqlen: Optional[int]


class RefInsert(NamedTuple):
    prefix_len: int
    state_existed: bool
    node: RefNode
    duplicates: list


class RefEvict(NamedTuple):
    tokens_evicted: int
    states_evicted: int
    kv_indices: list
    state_slots: list


def _as_int(x: Any, what: str) -> int:
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise TypeError("%s must be an int, not %s" % (what, type(x).__name__))
    return x.__index__()


def _as_ints(xs: Any, what: str, lo: int, hi: int) -> list:
    """xs as a list of Python ints in [lo, hi]; TypeError / ValueError
    naming `what` otherwise."""
    if hasattr(xs, "tolist") and hasattr(xs, "dtype"):  # a numpy array
        if xs.dtype.kind not in "iu":
            raise TypeError("%s must hold integers" % what)
        if xs.ndim != 1:
            raise ValueError("%s must be 1-dimensional" % what)
        out = xs.tolist()
    else:
        out = list(xs)
        if not set(map(type, out)) <= {int}:
            out = [_as_int(t, what) for t in out]
    if out and (min(out) < lo or max(out) > hi):
        raise ValueError("%s: a value is out of the range [%d, %d]" % (what, lo, hi))
    return out


def _as_tokens(key: Any, what: str) -> list:
    return _as_ints(key, what, -(2**31), 2**31 - 1)


class ReferenceTree:
    """The model.  Same method names and results as mambaradix.RadixTree;
    results hold lists instead of numpy arrays and RefNode instead of Node."""

    # False: trust that keys and values are lists of ints in range (the
    # benchmark times the algorithm, not the argument checks).
    check_inputs = True

    def __init__(self, page_size: int = 1, chunk_size: Optional[int] = None, lru_policy: str = "consumed"):
        page_size = _as_int(page_size, "page_size")
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if chunk_size is None:
            chunk_size = max(64, page_size)
        chunk_size = _as_int(chunk_size, "chunk_size")
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        if chunk_size % page_size != 0 and page_size % chunk_size != 0:
            raise ValueError("one of page_size and chunk_size must divide the other")
        if lru_policy not in POLICIES:
            raise ValueError("lru_policy must be 'consumed' or 'sglang'")
        self.page_size = page_size
        self.chunk_size = chunk_size
        self.lru_policy = lru_policy
        self.reset()

    # ------------------------------------------------------------------
    # Lifetime

    def reset(self) -> None:
        """Drops every node; handles of the root stay valid (it is the same
        root), every other handle becomes stale."""
        old = getattr(self, "_full_lru", None)
        if old is not None:
            for node in old:
                node.alive = False
            self.root.child_map = {}
        else:
            self.root = RefNode(self, [], [], None, None, None)
        self._full_lru = OrderedDict()  # node -> None; last = most recently used
        self._state_lru = OrderedDict()
        self._full_evictable = 0
        self._full_protected = 0
        self._state_evictable = 0
        self._state_protected = 0
        # tombstones left childless because they were locked (see I8)
        self._orphans = set()

    # ------------------------------------------------------------------
    # LRU helpers (an OrderedDict's end is the MRU side)

    def _full_mru(self, node: RefNode) -> None:
        self._full_lru.move_to_end(node)

    def _state_mru(self, node: RefNode) -> None:
        assert node.state is not None
        self._state_lru.move_to_end(node)

    def _path_to_root(self, node: RefNode) -> list:
        """node, parent, ..., up to (excluding) the root."""
        out = []
        while node.parent is not None:
            out.append(node)
            node = node.parent
        return out

    def _refresh_path(self, node: RefNode, state_list: bool) -> None:
        """Make node and its ancestors the most recently used entries, in the
        order node, parent, grandparent, ... (the state list moves only the
        ones that have a state)."""
        chain = self._path_to_root(node)
        for n in reversed(chain):
            if state_list:
                if n.state is not None:
                    self._state_lru.move_to_end(n)
            else:
                self._full_lru.move_to_end(n)

    # ------------------------------------------------------------------
    # Keys

    def _tokens(self, key: Any) -> list:
        if self.check_inputs:
            return _as_tokens(key, "key")
        return key if type(key) is list else list(key)

    def _child_key(self, extra_key, tokens: list, pos: int) -> tuple:
        return (extra_key, tuple(tokens[pos : pos + self.page_size]))

    def _common_len(self, edge: list, tokens: list, pos: int) -> int:
        """Common prefix length of edge and tokens[pos:], in whole pages."""
        n = min(len(edge), len(tokens) - pos)
        if tokens[pos : pos + n] == edge[:n]:
            i = n
        else:
            i = 0
            while i < n and edge[i] == tokens[pos + i]:
                i += 1
        return i - i % self.page_size

    def _check_node(self, node: Any, what: str = "node") -> RefNode:
        if not isinstance(node, RefNode):
            raise TypeError("%s must be a node" % what)
        if not node.alive or node.tree is not self:
            raise RefStaleNodeError("%s: the node was removed from the tree (stale handle)" % what)
        return node

    # ------------------------------------------------------------------
    # Split

    def _split(self, child: RefNode, at: int) -> RefNode:
        """Cut child's edge after `at` tokens; the new upper node (a tombstone)
        is returned, child keeps the lower part, its state and its locks."""
        parent = child.parent
        ck = self._child_key(child.extra_key, child.key, 0)
        upper = RefNode(self, child.key[:at], child.value[:at], None, parent, child.extra_key)
        upper.full_lock = child.full_lock
        parent.child_map[ck] = upper
        child.key = child.key[at:]
        child.value = child.value[at:]
        child.parent = upper
        upper.child_map[self._child_key(child.extra_key, child.key, 0)] = child
        # full list: child, then upper, are the most recent
        del self._full_lru[child]
        self._full_lru[upper] = None
        self._full_lru[child] = None
        if self.lru_policy == "sglang" and child.state is not None:
            del self._state_lru[child]
            self._state_lru[child] = None
        return upper

    # ------------------------------------------------------------------
    # Match

    def match_prefix(self, key: Any, extra_key: Optional[str] = None) -> RefMatch:
        if extra_key is not None and not isinstance(extra_key, str):
            raise TypeError("extra_key must be a str or None")
        tokens = self._tokens(key)
        n = len(tokens) - len(tokens) % self.page_size
        if n < len(tokens):
            tokens = tokens[:n]  # whole pages only
        node = self.root
        pos = 0
        while pos < n:
            child = node.child_map.get(self._child_key(extra_key, tokens, pos))
            if child is None:
                break
            p = self._common_len(child.key, tokens, pos)
            pos += p
            if p < len(child.key):
                node = self._split(child, p)
                break
            node = child
        best = node
        while best.parent is not None and best.state is None:
            best = best.parent
        best_len = best.prefix_len
        indices = []
        for n_ in reversed(self._path_to_root(best)):
            indices.extend(n_.value)
        # LRU refresh
        self._refresh_path(best, state_list=False)
        if self.lru_policy == "sglang":
            self._refresh_path(best, state_list=True)
        elif best.parent is not None:
            self._state_mru(best)
        branching = None
        if pos > best_len:
            aligned = pos // self.chunk_size * self.chunk_size
            if aligned > 0:
                branching = aligned
        return RefMatch(indices, best, best.state, pos, branching)

    # ------------------------------------------------------------------
    # Insert

    def insert(
        self,
        key: Any,
        value: Any,
        state: int,
        *,
        extra_key: Optional[str] = None,
        prev_prefix_len: int = 0,
    ) -> RefInsert:
        if extra_key is not None and not isinstance(extra_key, str):
            raise TypeError("extra_key must be a str or None")
        tokens = self._tokens(key)
        values = _as_ints(value, "value", 0, 2**63 - 1) if self.check_inputs else list(value)
        state = _as_int(state, "state")
        prev_prefix_len = _as_int(prev_prefix_len, "prev_prefix_len")
        if len(values) != len(tokens):
            raise ValueError("value: length %d differs from the key's %d" % (len(values), len(tokens)))
        if len(tokens) % self.page_size != 0:
            raise ValueError("key: length %d is not a multiple of page_size" % len(tokens))
        if state < 0:
            raise ValueError("state must be >= 0")
        if prev_prefix_len < 0:
            raise ValueError("prev_prefix_len must be >= 0")
        if not tokens:
            return RefInsert(0, True, self.root, [])
        policy_sglang = self.lru_policy == "sglang"
        node = self.root
        pos = 0
        while pos < len(tokens):
            child = node.child_map.get(self._child_key(extra_key, tokens, pos))
            if child is None:
                break
            self._full_mru(child)
            if policy_sglang and child.state is not None:
                self._state_mru(child)
            p = self._common_len(child.key, tokens, pos)
            pos += p
            if p < len(child.key):
                node = self._split(child, p)
                break
            node = child
        prefix_len = pos
        duplicates = values[min(prev_prefix_len, prefix_len) : prefix_len]
        if pos < len(tokens):
            leaf = RefNode(self, tokens[pos:], values[pos:], state, node, extra_key)
            node.child_map[self._child_key(extra_key, tokens, pos)] = leaf
            self._full_lru[leaf] = None
            self._state_lru[leaf] = None
            self._full_evictable += len(leaf.key)
            self._state_evictable += 1
            return RefInsert(prefix_len, False, leaf, duplicates)
        if node.state is None:
            # revive a tombstone
            node.state = state
            self._full_mru(node)
            self._state_lru[node] = None
            self._state_evictable += 1
            return RefInsert(prefix_len, False, node, duplicates)
        self._full_mru(node)
        if policy_sglang:
            self._state_mru(node)
        return RefInsert(prefix_len, True, node, duplicates)

    # ------------------------------------------------------------------
    # Locks

    def inc_lock_ref(self, node: RefNode) -> None:
        node = self._check_node(node)
        if node.parent is None:
            return
        if node.state is not None:
            if node.state_lock == 0:
                self._state_evictable -= 1
                self._state_protected += 1
            node.state_lock += 1
        else:
            node.nostate_lock += 1
        n = node
        while n.parent is not None:
            if n.full_lock == 0:
                self._full_evictable -= len(n.key)
                self._full_protected += len(n.key)
            n.full_lock += 1
            n = n.parent

    def dec_lock_ref(self, node: RefNode) -> None:
        node = self._check_node(node)
        if node.parent is None:
            return
        if node.state_lock + node.nostate_lock == 0:
            raise ValueError("node: not locked")
        # Locks cannot be told apart: release one that took no state
        # reference first (the state stays protected as long as possible).
        if node.nostate_lock > 0:
            node.nostate_lock -= 1
        else:
            node.state_lock -= 1
            if node.state_lock == 0:
                self._state_protected -= 1
                self._state_evictable += 1
        n = node
        while n.parent is not None:
            n.full_lock -= 1
            if n.full_lock == 0:
                self._full_protected -= len(n.key)
                self._full_evictable += len(n.key)
            n = n.parent

    # ------------------------------------------------------------------
    # Eviction

    def _detach(self, node: RefNode) -> None:
        parent = node.parent
        ck = self._child_key(node.extra_key, node.key, 0)
        assert parent.child_map[ck] is node
        del parent.child_map[ck]
        del self._full_lru[node]
        self._orphans.discard(node)
        node.alive = False

    def _remove_leaf(self, x: RefNode, kv: list, slots: list) -> tuple:
        """Removes the unlocked leaf x with its KV and state, then every
        tombstone above it left childless and unlocked.  Returns (tokens,
        states) released; appends them to kv / slots in release order."""
        assert not x.child_map and x.full_lock == 0 and x.state_lock == 0
        kv.extend(x.value)
        tokens = len(x.key)
        states = 0
        if x.state is not None:
            slots.append(x.state)
            del self._state_lru[x]
            self._state_evictable -= 1
            states = 1
        self._full_evictable -= len(x.key)
        self._detach(x)
        p = x.parent
        while p.parent is not None and p.state is None and not p.child_map and p.full_lock == 0:
            kv.extend(p.value)
            tokens += len(p.key)
            self._full_evictable -= len(p.key)
            self._detach(p)
            p = p.parent
        if p.parent is not None and p.state is None and not p.child_map:
            self._orphans.add(p)  # kept because it is locked
        return tokens, states

    def evict_full(self, num_tokens: int) -> RefEvict:
        num_tokens = _as_int(num_tokens, "num_tokens")
        if num_tokens < 0:
            raise ValueError("num_tokens must be >= 0")
        kv, slots = [], []
        tokens = states = 0
        while tokens < num_tokens:
            victim = None
            for node in self._full_lru:  # LRU first
                if not node.child_map and node.full_lock == 0:
                    victim = node
                    break
            if victim is None:
                break
            t, s = self._remove_leaf(victim, kv, slots)
            tokens += t
            states += s
        return RefEvict(tokens, states, kv, slots)

    def evict_mamba(self, num_states: int) -> RefEvict:
        num_states = _as_int(num_states, "num_states")
        if num_states < 0:
            raise ValueError("num_states must be >= 0")
        kv, slots = [], []
        tokens = states = 0
        while states < num_states:
            victim = None
            for node in self._state_lru:  # LRU first
                if node.state_lock == 0 and (node.child_map or node.full_lock == 0):
                    victim = node
                    break
            if victim is None:
                break
            if victim.child_map:
                slots.append(victim.state)
                victim.state = None
                del self._state_lru[victim]
                self._state_evictable -= 1
                states += 1
            else:
                t, s = self._remove_leaf(victim, kv, slots)
                tokens += t
                states += s
        return RefEvict(tokens, states, kv, slots)

    # ------------------------------------------------------------------
    # Sizes and inspection

    def full_evictable_size(self) -> int:
        return self._full_evictable

    def full_protected_size(self) -> int:
        return self._full_protected

    def mamba_evictable_size(self) -> int:
        return self._state_evictable

    def mamba_protected_size(self) -> int:
        return self._state_protected

    def total_size(self) -> tuple:
        return (self._full_evictable + self._full_protected, self._state_evictable + self._state_protected)

    def node_count(self) -> int:
        return len(self._full_lru)

    def lru_order(self, which: str = "full") -> list:
        """Nodes of an LRU list, most recently used first."""
        if which == "full":
            return list(reversed(self._full_lru))
        if which == "mamba":
            return list(reversed(self._state_lru))
        raise ValueError("which must be 'full' or 'mamba'")

    def nodes(self) -> list:
        """Every node, root first, depth first in child-key order."""
        out = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children))
        return out

    def sanity_check(self) -> None:
        """Verifies the model's invariants; raises AssertionError naming one."""
        root = self.root

        def fail(msg):
            raise AssertionError("reference model: " + msg)

        if root.key or root.value or root.state is not None or root.parent is not None:
            fail("I1 root is not empty")
        if root in self._full_lru or root in self._state_lru:
            fail("I1 root in an LRU list")
        seen = []
        stack = [root]
        while stack:
            node = stack.pop()
            if not node.alive:
                fail("I9 dead node reachable")
            for ck, child in node.child_map.items():
                if child.parent is not node:
                    fail("I2 bad parent pointer")
                if not child.key or len(child.key) % self.page_size:
                    fail("I2 empty or unaligned edge")
                if len(child.key) != len(child.value):
                    fail("I2 key/value lengths differ")
                if ck != self._child_key(child.extra_key, child.key, 0):
                    fail("I2 child registered under a wrong key")
                if node.parent is not None and child.extra_key != node.extra_key:
                    fail("I3 namespace differs from the parent's")
                seen.append(child)
                stack.append(child)
        if set(seen) != set(self._full_lru) or len(seen) != len(self._full_lru):
            fail("I4 full LRU list != all nodes")
        with_state = [n for n in seen if n.state is not None]
        if set(with_state) != set(self._state_lru) or len(with_state) != len(self._state_lru):
            fail("I4 state LRU list != nodes with a state")
        fe = fp = se = sp = 0
        for n in seen:
            kids = sum(c.full_lock for c in n.child_map.values())
            if n.full_lock != n.state_lock + n.nostate_lock + kids:
                fail("I5 full lock of %r != own locks + children's" % (n,))
            if min(n.full_lock, n.state_lock, n.nostate_lock) < 0:
                fail("I5 negative lock count")
            if n.state_lock > 0 and n.state is None:
                fail("I6 state lock on a tombstone")
            if n.full_lock > 0:
                fp += len(n.key)
            else:
                fe += len(n.key)
            if n.state is not None:
                if n.state_lock > 0:
                    sp += 1
                else:
                    se += 1
            if not n.child_map and n.state is None and n not in self._orphans:
                fail("I8 tombstone leaf %r that no locked cascade left" % (n,))
        if (fe, fp, se, sp) != (
            self._full_evictable,
            self._full_protected,
            self._state_evictable,
            self._state_protected,
        ):
            fail(
                "I7 counters %r != definitions %r"
                % (
                    (self._full_evictable, self._full_protected, self._state_evictable, self._state_protected),
                    (fe, fp, se, sp),
                )
            )


def _sort_key(node: RefNode) -> tuple:
    return (node.extra_key is not None, node.extra_key or "", node.key[0])
