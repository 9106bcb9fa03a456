"""Drives the C tree and the reference model through the same operations and
compares every result (used by test_tree_differential.py)."""

from __future__ import annotations

import random

import numpy as np

from reference_tree import ReferenceTree, RefStaleNodeError
from tree_helpers import RadixTree, StaleNodeError, ints, lru_paths, node_path, sizes, tree_snapshot

_STALE = tuple(t for t in (StaleNodeError, RefStaleNodeError) if t is not None)
_UNSET = object()
EXTRA_KEYS = [None, None, None, None, "a", "b"]


class Divergence(AssertionError):
    pass


class Differ:
    """One C tree and one model, fed the same operations.

    page_size / chunk_size / lru_policy configure both trees; alphabet is the
    number of distinct tokens (small, so that prefixes collide and splits
    happen); max_pages bounds key lengths (in pages); max_tokens bounds the
    tree (an eviction is forced above it); deep_every: every that many
    operations the whole trees and both LRU orders are compared too.
    values=False: the C tree keeps keys only (RadixTree(values=False)); its
    indices and duplicates must be None, its evictions must return no KV
    indices, and everything else must match the model (which keeps values).
    hide_indices: the share of the C tree's evictions called with
    indices=False (their counts and state slots must still match)."""

    def __init__(
        self,
        seed,
        page_size=1,
        chunk_size=None,
        lru_policy="consumed",
        alphabet=3,
        max_pages=10,
        max_tokens=120,
        deep_every=1,
        c_factory=None,
        values=True,
        hide_indices=0.0,
    ):
        self.rng = random.Random(seed)
        self.page = page_size
        kw = dict(page_size=page_size, chunk_size=chunk_size, lru_policy=lru_policy)
        self.native = c_factory is None
        self.values = values
        self.hide_indices = hide_indices
        self.c = (c_factory or RadixTree)(**kw, **({} if values else {"values": False}))
        self.m = ReferenceTree(**kw)
        self.alphabet = alphabet
        self.max_pages = max_pages
        self.max_tokens = max_tokens
        self.deep_every = deep_every
        self.next_kv = 1
        self.next_slot = 1
        self.keys = []  # recent keys, for prefixes that collide
        self.locks = []  # (model node, C node) locked once each
        self.handles = []  # (model node, C node) seen in results
        self.ops = 0
        self.log = []  # the last operations, for a divergence report
        self.counts = {}
        self.stats = {}  # how often interesting cases happened
        if page_size > 1:
            base = [self.rng.randrange(alphabet) for _ in range(page_size)]
            atoms = [base]
            for _ in range(3):  # pages that differ from base at one position
                a = list(base)
                j = self.rng.randrange(page_size)
                a[j] = (a[j] + 1) % max(2, alphabet)
                atoms.append(a)
            atoms.append([self.rng.randrange(alphabet) for _ in range(page_size)])
            self.atoms = atoms

    # ------------------------------------------------------------------
    # Inputs

    def _fresh_pages(self, n):
        if self.page == 1:
            return [self.rng.randrange(self.alphabet) for _ in range(n)]
        out = []
        for _ in range(n):
            out.extend(self.rng.choice(self.atoms))
        return out

    def gen_key(self, for_match=False):
        rng = self.rng
        if self.keys and rng.random() < 0.65:
            base = rng.choice(self.keys)
            cut = rng.randrange(len(base) // self.page + 1) * self.page
            if rng.random() < 0.3 and cut < len(base):
                cut = len(base)
            key = base[:cut] + self._fresh_pages(rng.randrange(0, 4))
            key = key[: self.max_pages * self.page]
        else:
            key = self._fresh_pages(rng.randrange(0, self.max_pages + 1))
        if for_match and self.page > 1 and rng.random() < 0.3:
            key = key + [rng.randrange(self.alphabet) for _ in range(rng.randrange(1, self.page))]
        if not for_match and key:
            self.keys.append(key)
            if len(self.keys) > 40:
                self.keys.pop(0)
        return key

    def key_form(self, key):
        """The key in a random accepted input form."""
        r = self.rng.random()
        if r < 0.4:
            return key
        if r < 0.6:
            return np.asarray(key, dtype=np.int32)
        if r < 0.75:
            return np.asarray(key, dtype=np.int64)
        if r < 0.85:
            return tuple(key)
        arr = np.zeros(2 * len(key) + 1, dtype=np.int32)
        arr[::2][: len(key)] = key  # a non-contiguous view
        return arr[: 2 * len(key) : 2]

    # ------------------------------------------------------------------
    # Comparison helpers

    def fail(self, what, c_val, m_val):
        tail = "\n".join(self.log[-25:])
        raise Divergence(
            "divergence after %d ops at %s:\n  C:     %r\n  model: %r\nlast ops:\n%s" % (self.ops, what, c_val, m_val, tail)
        )

    def same(self, what, c_val, m_val):
        if c_val != m_val:
            self.fail(what, c_val, m_val)

    def both(self, what, c_call, m_call):
        """Runs both calls; they must both succeed or raise alike."""
        c_exc = m_exc = None
        c_res = m_res = None
        try:
            c_res = c_call()
        except Exception as e:  # noqa: BLE001
            c_exc = e
        try:
            m_res = m_call()
        except Exception as e:  # noqa: BLE001
            m_exc = e
        if (c_exc is None) != (m_exc is None):
            self.fail(what + " (exception)", repr(c_exc), repr(m_exc))
        if c_exc is not None:
            c_kind = "stale" if isinstance(c_exc, _STALE) else type(c_exc).__name__
            m_kind = "stale" if isinstance(m_exc, RefStaleNodeError) else type(m_exc).__name__
            self.same(what + " (exception type)", c_kind, m_kind)
            return None, None
        return c_res, m_res

    def note(self, what):
        self.stats[what] = self.stats.get(what, 0) + 1

    def check_array(self, what, arr):
        if self.native and (not isinstance(arr, np.ndarray) or arr.dtype != np.int64 or arr.ndim != 1):
            self.fail(what + " type", (type(arr), getattr(arr, "dtype", None)), "1-D numpy int64")

    def check_handle(self, what, c_node, m_node):
        self.same(what + " handle valid", c_node.valid, m_node.alive)
        if m_node.alive:
            self.same(what + " node", node_path(c_node), m_node.path)
            self.same(what + " node state", c_node.state, m_node.state)

    # ------------------------------------------------------------------
    # Operations

    def op_match(self, key=None, extra=_UNSET):
        if key is None:
            key = self.gen_key(for_match=True)
        if extra is _UNSET:
            extra = self.rng.choice(EXTRA_KEYS)
        self.log.append("match %r extra=%r" % (key, extra))
        c, m = self.both("match", lambda: self.c.match_prefix(self.key_form(key), extra), lambda: self.m.match_prefix(key, extra))
        if c is None:
            return
        self.note("match_hit" if m.node.parent is not None else "match_miss")
        if m.branching_seqlen is not None:
            self.note("match_branching")
        if self.values:
            self.check_array("match indices", c.indices)
            self.same("match indices", ints(c.indices), m.indices)
        else:
            self.same("match indices", c.indices, None)
        self.same("match node", node_path(c.node), m.node.path)
        self.same("match state", c.state, m.state)
        self.same("match kv_matched_len", c.kv_matched_len, m.kv_matched_len)
        self.same("match branching_seqlen", c.branching_seqlen, m.branching_seqlen)
        self.handles.append((m.node, c.node))

    def op_insert(self, key=None, extra=_UNSET, prev=None):
        rng = self.rng
        if key is None:
            key = self.gen_key()
        if extra is _UNSET:
            extra = rng.choice(EXTRA_KEYS)
        value = list(range(self.next_kv, self.next_kv + len(key)))
        self.next_kv += len(key)
        slot = self.next_slot
        self.next_slot += 1
        if prev is None:
            prev = 0 if rng.random() < 0.7 else rng.randrange(len(key) + 3)
        self.log.append("insert %r extra=%r prev=%d slot=%d kv0=%d" % (key, extra, prev, slot, value[0] if value else -1))
        vform = value if rng.random() < 0.5 else np.asarray(value, dtype=np.int64)
        if not self.values:
            vform = None
        c, m = self.both(
            "insert",
            lambda: self.c.insert(self.key_form(key), vform, slot, extra_key=extra, prev_prefix_len=prev),
            lambda: self.m.insert(key, value, slot, extra_key=extra, prev_prefix_len=prev),
        )
        if c is None:
            self.note("insert_error")
            return
        if m.state_existed:
            self.note("insert_exists")
        elif m.prefix_len == len(key):
            self.note("insert_revive")
        if m.duplicates:
            self.note("insert_duplicates")
        self.same("insert prefix_len", c.prefix_len, m.prefix_len)
        self.same("insert state_existed", bool(c.state_existed), m.state_existed)
        self.same("insert node", node_path(c.node), m.node.path)
        if self.values:
            self.check_array("insert duplicates", c.duplicates)
            self.same("insert duplicates", ints(c.duplicates), m.duplicates)
        else:
            self.same("insert duplicates", c.duplicates, None)
        self.handles.append((m.node, c.node))

    def _evict_kw(self):
        """indices=False for a share of the C tree's evictions."""
        if self.hide_indices > 0 and self.rng.random() < self.hide_indices:
            return {"indices": False}
        return {}

    def _compare_evict(self, what, c, m, kw):
        self.check_array(what + " kv_indices", c.kv_indices)
        self.check_array(what + " state_slots", c.state_slots)
        self.same(what + " tokens", c.tokens_evicted, m.tokens_evicted)
        self.same(what + " states", c.states_evicted, m.states_evicted)
        shown = self.values and kw.get("indices", True)
        self.same(what + " kv_indices", ints(c.kv_indices), m.kv_indices if shown else [])
        self.same(what + " state_slots", ints(c.state_slots), m.state_slots)

    def op_evict_full(self, n=None):
        if n is None:
            n = self.rng.choice([0, 1, 1, 2, 3, 5, 8, 20]) * self.page
        kw = self._evict_kw()
        self.log.append("evict_full %d %r" % (n, kw))
        c, m = self.both("evict_full", lambda: self.c.evict_full(n, **kw), lambda: self.m.evict_full(n))
        if c is not None:
            if len(m.kv_indices) > 0 and m.states_evicted < 1:
                self.note("evict_full_tombstone_leaf")
            self._compare_evict("evict_full", c, m, kw)

    def op_evict_mamba(self, n=None):
        if n is None:
            n = self.rng.choice([0, 1, 1, 1, 2, 3])
        kw = self._evict_kw()
        self.log.append("evict_mamba %d %r" % (n, kw))
        c, m = self.both("evict_mamba", lambda: self.c.evict_mamba(n, **kw), lambda: self.m.evict_mamba(n))
        if c is not None:
            if m.states_evicted > 0 and not m.kv_indices:
                self.note("evict_mamba_internal")
            if m.kv_indices:
                self.note("evict_mamba_leaf")
            self._compare_evict("evict_mamba", c, m, kw)

    def _c_node_of(self, m_node):
        """The C node at the model node's path."""
        if m_node.parent is None:
            return self.c.root
        extra, tokens = m_node.path
        node = self.c.root
        pos = 0
        while pos < len(tokens):
            for child in node.children:
                k = child.key
                if child.extra_key == extra and int(k[0]) == tokens[pos]:
                    if ints(k) == list(tokens[pos : pos + len(k)]):
                        node = child
                        pos += len(k)
                        break
            else:
                self.fail("find node", None, m_node.path)
        return node

    def _pick_pair(self, which=None):
        """A (model node, C node) pair: which = None (random), or an int
        choosing among the recent handles, the root and every node."""
        rng = self.rng
        if which is not None:
            order = self.m.lru_order("full")
            recent = self.handles[-4:]
            which %= len(recent) + 1 + len(order)
            if which < len(recent):
                return recent[which]
            if which == len(recent):
                return self.m.root, self.c.root
            m_node = order[which - len(recent) - 1]
            return m_node, self._c_node_of(m_node)
        r = rng.random()
        if r < 0.35 and self.handles:
            m_node, c_node = rng.choice(self.handles[-8:])
            return m_node, c_node
        order = self.m.lru_order("full")
        if r < 0.4 or not order:
            return self.m.root, self.c.root
        m_node = rng.choice(order)
        return m_node, self._c_node_of(m_node)

    def op_lock(self, which=None):
        m_node, c_node = self._pick_pair(which)
        self.log.append("lock %r" % (m_node,))
        if m_node.alive and m_node.parent is not None and m_node.state is None:
            self.note("lock_tombstone")
        self.both("inc_lock_ref", lambda: self.c.inc_lock_ref(c_node), lambda: self.m.inc_lock_ref(m_node))
        if m_node.alive:
            self.locks.append((m_node, c_node))
        else:
            self.note("lock_stale")

    def op_unlock(self, held=None, which=None):
        """held: index of a held lock to release; else which: any node (may
        not be locked: then both must raise ValueError)."""
        rng = self.rng
        if held is None and which is None:
            if self.locks and rng.random() < 0.85:
                held = rng.randrange(len(self.locks))
        if held is not None and self.locks:
            m_node, c_node = self.locks.pop(held % len(self.locks))
        else:
            m_node, c_node = self._pick_pair(which)
        self.log.append("unlock %r" % (m_node,))
        if m_node.alive and m_node.parent is not None and m_node.state_lock + m_node.nostate_lock == 0:
            self.note("unlock_unlocked")
        if m_node.alive and m_node.nostate_lock > 0 and m_node.state is not None:
            self.note("unlock_revived")
        self.both("dec_lock_ref", lambda: self.c.dec_lock_ref(c_node), lambda: self.m.dec_lock_ref(m_node))

    def op_reset(self):
        self.log.append("reset")
        self.c.reset()
        self.m.reset()
        self.locks = []

    def op_check_handles(self):
        for m_node, c_node in self.handles[-10:]:
            self.check_handle("handle", c_node, m_node)
            if m_node.alive and m_node.parent is not None:
                self.same("handle locks", (c_node.full_lock_ref, c_node.state_lock_ref), (m_node.full_lock, m_node.state_lock))
                self.same("handle prefix_len", c_node.prefix_len, m_node.prefix_len)
        if len(self.handles) > 60:
            del self.handles[:-30]

    # ------------------------------------------------------------------

    OPS = [
        ("insert", 34),
        ("match", 30),
        ("lock", 8),
        ("unlock", 8),
        ("evict_full", 7),
        ("evict_mamba", 8),
        ("check_handles", 4),
        ("reset", 0.15),
    ]

    def step(self):
        names = [o[0] for o in self.OPS]
        weights = [o[1] for o in self.OPS]
        op = self.rng.choices(names, weights)[0]
        if len(self.locks) > 8 and op == "lock":
            op = "unlock"
        getattr(self, "op_" + op)()
        if self.m._orphans:
            self.note("orphan_tombstone_leaf")
        self.counts[op] = self.counts.get(op, 0) + 1
        self.ops += 1
        if self.m.total_size()[0] > self.max_tokens:
            self.op_evict_full(self.m.total_size()[0] - self.max_tokens // 2)
        self.compare()
        if len(self.log) > 200:
            del self.log[:100]

    def compare(self, deep=None):
        self.same("sizes", sizes(self.c), sizes(self.m))
        try:
            self.c.sanity_check()
        except AssertionError as e:
            self.fail("C sanity_check", str(e), "ok")
        self.m.sanity_check()
        if deep or (deep is None and self.ops % self.deep_every == 0):
            cp, mp = {}, {}
            ct, mt = tree_snapshot(self.c, cp), tree_snapshot(self.m, mp)
            if not self.values:   # the C nodes hold no values: compare the rest
                ct = [r[:2] + r[3:] for r in ct]
                mt = [r[:2] + r[3:] for r in mt]
            self.same("tree", ct, mt)
            self.same("full LRU order", lru_paths(self.c, "full", cp), lru_paths(self.m, "full", mp))
            self.same("state LRU order", lru_paths(self.c, "mamba", cp), lru_paths(self.m, "mamba", mp))

    def run(self, n_ops):
        for _ in range(n_ops):
            self.step()
        # drain: release every lock, then evict everything
        for m_node, c_node in self.locks:
            self.both("dec_lock_ref", lambda: self.c.dec_lock_ref(c_node), lambda: self.m.dec_lock_ref(m_node))
        self.locks = []
        self.compare(deep=True)
        self.op_evict_full(10**9)
        self.compare(deep=True)
        self.same("drained", self.c.total_size(), (0, 0))
        return self.ops
