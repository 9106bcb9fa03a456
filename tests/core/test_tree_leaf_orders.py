"""SGLang 0.5.23's leaf orders (--radix-eviction-policy) through RadixTree,
against a pure-Python model of SGLang's UnifiedTreeCore (FULL component).

The model keeps SGLang's per-node bookkeeping (last_access_time from one
counter, creation_time, hit_count, priority, the T-LRU lengths) as
sglang/srt/mem_cache/unified_cache/unified_tree_core.py updates it on insert
walks, splits and matches, and evicts as its FULL component does: a heap of
(priority, node) over the evictable leaves, built when an eviction starts, a
parent pushed when its last child goes.  The priorities are SGLang's own
EvictionStrategy classes when SGLang 0.5.23's evict_policy.py is present
(MAMBARADIX_SGLANG_0523, default .sgl0523), else the model's transcription,
which a test checks against those classes.

Large random trees (thousands of nodes) are evicted leaf by leaf, in one
call and in SGLang's one-leaf-per-call walk, with inserts, matches and locks
between calls, under every policy; the victim order must be identical.
"""

from __future__ import annotations

import heapq
import importlib.util
import os
import random

import numpy as np
import pytest

from mambaradix import _C

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SGL_EVICT_POLICY = os.path.join(os.environ.get("MAMBARADIX_SGLANG_0523", os.path.join(REPO, ".sgl0523")),
                                "sglang", "srt", "mem_cache", "evict_policy.py")

KEYED = ("lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")
# policy -> (policy_options for RadixTree, keyword arguments of SGLang's strategy class)
CONFIGS = {
    "lfu": None, "fifo": None, "mru": None, "filo": None, "priority": None,
    "slru": {"protected_threshold": 3},
    "tlru": {"threshold": 40, "next_prompt_estimate": 12},
}


# --------------------------------------------------------------------------
# Priorities: evict_policy.py's strategies, transcribed (and SGLang's own when present)

def model_priority(policy, cfg):
    cfg = cfg or {}
    if policy == "lfu":
        return lambda n: (n.hit_count, n.last_access_time)
    if policy == "fifo":
        return lambda n: n.creation_time
    if policy == "mru":
        return lambda n: -n.last_access_time
    if policy == "filo":
        return lambda n: -n.creation_time
    if policy == "priority":
        return lambda n: (n.priority, n.last_access_time)
    if policy == "slru":
        thr = cfg.get("protected_threshold", 2)
        return lambda n: (1 if n.hit_count >= thr else 0, n.last_access_time)
    if policy == "tlru":
        thr, est = cfg.get("threshold", 0), cfg.get("next_prompt_estimate", 0)

        def tlru(n):
            budget = max(n._tlru_history_len + est - thr, 0)
            return (-1 if n._tlru_cached_prefix_len - len(n.key) >= budget else 0, n.last_access_time)

        return tlru
    raise ValueError(policy)


def sglang_strategies():
    """SGLang 0.5.23's evict_policy module (it imports nothing of SGLang), or None."""
    if not os.path.isfile(SGL_EVICT_POLICY):
        return None
    spec = importlib.util.spec_from_file_location("_sgl0523_evict_policy", SGL_EVICT_POLICY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sglang_priority(mod, policy, cfg):
    cls = {"lfu": "LFUStrategy", "fifo": "FIFOStrategy", "mru": "MRUStrategy", "filo": "FILOStrategy",
           "priority": "PriorityStrategy", "slru": "SLRUStrategy", "tlru": "TLRUStrategy"}[policy]
    return getattr(mod, cls)(**(cfg or {})).get_priority


# --------------------------------------------------------------------------
# The model tree (FULL only, page_size tokens a page)

class MNode:
    def __init__(self, model, priority=0):
        self.children = {}
        self.parent = None
        self.key = []
        self.vals = []
        self.last_access_time = model.tick()
        self.creation_time = model.tick()
        self.hit_count = 0
        self.priority = priority
        self._tlru_cached_prefix_len = 0
        self._tlru_history_len = 0
        self.lock_ref = 0

    def __lt__(self, other):  # SGLang's heap tie-break after equal priorities
        return self.last_access_time < other.last_access_time


class Model:
    def __init__(self, page, priority_fn, tlru):
        self.page = page
        self.clock = 0
        self.root = MNode(self)
        self.root.key = []
        self.priority_fn = priority_fn
        self.tlru = tlru

    def tick(self):
        self.clock += 1
        return self.clock

    def _ck(self, key, pos):
        return tuple(key[pos:pos + self.page])

    def _common(self, a, b):
        n = 0
        while n < len(a) and n < len(b) and a[n] == b[n]:
            n += 1
        return n // self.page * self.page

    def _split(self, child, p):
        new = MNode(self, priority=child.priority)
        new.parent = child.parent
        new.key, new.vals = child.key[:p], child.vals[:p]
        new.hit_count = child.hit_count
        new.creation_time = child.creation_time
        if self.tlru:
            new._tlru_cached_prefix_len = new.parent._tlru_cached_prefix_len + p
            new._tlru_history_len = child._tlru_history_len
        new.parent.children[tuple(child.key[:self.page])] = new
        child.key, child.vals = child.key[p:], child.vals[p:]
        child.parent = new
        new.children = {tuple(child.key[:self.page]): child}
        new.lock_ref = child.lock_ref
        child.last_access_time = self.tick()
        return new

    def insert(self, key, vals, priority, inserted_len):
        node, pos = self.root, 0
        while pos < len(key) and self._ck(key, pos) in node.children:
            child = node.children[self._ck(key, pos)]
            child.last_access_time = self.tick()
            p = self._common(child.key, key[pos:])
            if p < len(child.key):
                child = self._split(child, p)
            child.priority = max(child.priority, priority)
            if pos + p > inserted_len:
                child.hit_count += 1
            node, pos = child, pos + p
        if pos < len(key):
            leaf = MNode(self, priority=priority)
            leaf.parent, leaf.key, leaf.vals = node, list(key[pos:]), list(vals[pos:])
            node.children[self._ck(key, pos)] = leaf
            if self.tlru:
                leaf._tlru_cached_prefix_len = node._tlru_cached_prefix_len + len(leaf.key)
                leaf._tlru_history_len = max(leaf._tlru_history_len, leaf._tlru_cached_prefix_len)
                cur = node
                while cur is not None and cur._tlru_history_len < leaf._tlru_cached_prefix_len:
                    cur._tlru_history_len = leaf._tlru_cached_prefix_len
                    cur = cur.parent
            if len(key) > inserted_len:
                leaf.hit_count += 1
            node = leaf
        return node

    def match(self, key):
        node, pos = self.root, 0
        while pos < len(key) and self._ck(key, pos) in node.children:
            child = node.children[self._ck(key, pos)]
            p = self._common(child.key, key[pos:])
            if p < len(child.key):
                node = self._split(child, p)
                break
            node, pos = child, pos + p
        t, cur = self.tick(), node
        while cur is not None:
            cur.last_access_time = t
            t -= 0.00001
            cur = cur.parent
        return node

    def lock(self, node, delta):
        while node is not self.root:
            node.lock_ref += delta
            node = node.parent

    def _evictable_leaf(self, n):
        return n is not self.root and n.parent is not None and not n.children and n.lock_ref == 0

    def evict(self, num_tokens):
        """One eviction call (SGLang's walk: a heap built at its start); the victims' values."""
        heap = []
        stack = [self.root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if self._evictable_leaf(n):
                heap.append(((False, 0, self.priority_fn(n)), n))
        heapq.heapify(heap)
        out, tokens = [], 0
        while tokens < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if not self._evictable_leaf(x):
                continue
            out.extend(x.vals)
            tokens += len(x.vals)
            parent = x.parent
            del parent.children[tuple(x.key[:self.page])]
            x.parent = None
            if self._evictable_leaf(parent):
                heapq.heappush(heap, ((False, 0, self.priority_fn(parent)), parent))
        return out


# --------------------------------------------------------------------------
# The driver: the same seeded operations on both

class Pair:
    def __init__(self, policy, page, seed, priority_fn=None):
        cfg = CONFIGS[policy]
        self.tree = _C.RadixTree(page_size=page, chunk_size=page, lru_policy=policy, policy_options=cfg,
                                 semantics="v0.5.23", kv_only=True)
        self.model = Model(page, priority_fn or model_priority(policy, cfg), tlru=policy == "tlru")
        self.page = page
        self.rng = random.Random(seed)
        self.keys = []
        self.next_val = 0
        self.locked = []   # (tree node, model node)
        self.ends = []     # (tree node, model node) where inserts ended

    def _key(self):
        rng, page = self.rng, self.page
        if self.keys and rng.random() < 0.8:
            base = rng.choice(self.keys)
            cut = rng.randrange(0, len(base) // page + 1) * page
            key = list(base[:cut])
        else:
            key = []
        key += [rng.randrange(40) for _ in range(rng.randrange(1, 6) * page)]
        return key

    def insert(self):
        key = self._key()
        vals = list(range(self.next_val, self.next_val + len(key)))
        self.next_val += len(key)
        prio = self.rng.randrange(4)
        inserted = self.rng.choice((0, 0, len(key) // 2 // self.page * self.page))
        r = self.tree.insert(np.array(key, np.int32), np.array(vals, np.int64), None, priority=prio,
                             inserted_len=inserted)
        m = self.model.insert(key, vals, prio, inserted)
        self.keys.append(key)
        if m is not self.model.root:
            self.ends.append((r.node, m))
        return r

    def lock_end(self):
        """Lock where an earlier insert ended, touching nothing (if it is still there)."""
        for _ in range(20):
            node, m = self.rng.choice(self.ends)
            if m.parent is not None:
                self.tree.inc_kv_lock(node)
                self.model.lock(m, +1)
                self.locked.append((node, m))
                return

    def match(self):
        if not self.keys:
            return None
        base = self.rng.choice(self.keys)
        key = list(base[:self.rng.randrange(0, len(base) + 1)])
        if self.rng.random() < 0.3:
            key += [self.rng.randrange(6) for _ in range(self.page)]
        r = self.tree.match_prefix(np.array(key, np.int32))
        m = self.model.match(key)
        assert r.kv_matched_len == sum(len(n.key) for n in _path(m))
        return r.node, m

    def lock_some(self):
        got = self.match()
        if got is None or got[1] is self.model.root:
            return
        node, m = got
        self.tree.inc_kv_lock(node)
        self.model.lock(m, +1)
        self.locked.append((node, m))

    def unlock_some(self):
        if self.locked:
            node, m = self.locked.pop(self.rng.randrange(len(self.locked)))
            self.tree.dec_kv_lock(node)
            self.model.lock(m, -1)

    def grow(self, ops):
        for _ in range(ops):
            r = self.rng.random()
            if r < 0.6:
                self.insert()
            elif r < 0.9:
                self.match()
            elif r < 0.96:
                self.lock_some()
            else:
                self.unlock_some()

    def evict_call(self, num_tokens):
        got = self.tree.evict_full(num_tokens).kv_indices.tolist()
        want = self.model.evict(num_tokens)
        return got, want

    def walk(self, steps):
        got = []
        for _ in range(steps):
            got += self.tree.evict_full(1).kv_indices.tolist()
        want = []
        for _ in range(steps):   # SGLang's walk: each step pops the next leaf of one heap
            want += self.model.evict(1)
        return got, want


def _path(n):
    out = []
    while n is not None and n.parent is not None:
        out.append(n)
        n = n.parent
    return out


def _first_difference(got, want):
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"first difference at {i}: got KV index {g}, SGLang's order {w}"
    return f"lengths {len(got)} vs {len(want)}"


SEED = 9023


@pytest.mark.parametrize("policy", KEYED)
@pytest.mark.parametrize("page", [1, 2])
def test_many_victims_from_a_large_tree_in_sglang_heap_order(policy, page):
    """Thousands of nodes; every leaf evicted in one call, in SGLang's order."""
    mod = sglang_strategies()
    fn = sglang_priority(mod, policy, CONFIGS[policy]) if mod is not None else None
    p = Pair(policy, page, SEED + page, fn)
    p.grow(3000)
    assert p.tree.node_count() > 2000
    for node, m in p.locked:   # unlock all: the whole tree is evictable
        p.tree.dec_kv_lock(node)
        p.model.lock(m, -1)
    p.locked.clear()
    got, want = p.evict_call(10**9)
    assert got == want, _first_difference(got, want)
    assert p.tree.node_count() == 0
    p.tree.sanity_check()


@pytest.mark.parametrize("policy", KEYED)
def test_walk_and_calls_interleaved_with_tree_changes(policy):
    """SGLang's one-leaf-per-call walk and partial evictions, with inserts,
    matches, locks and unlocks between them (each must be seen by the next
    eviction), under locks that keep some leaves."""
    mod = sglang_strategies()
    fn = sglang_priority(mod, policy, CONFIGS[policy]) if mod is not None else None
    p = Pair(policy, 1, SEED + 17, fn)
    p.grow(1500)
    victims = 0
    for rnd in range(60):
        if rnd % 3 == 0:
            got, want = p.walk(p.rng.randrange(1, 40))
        else:
            got, want = p.evict_call(p.rng.randrange(1, 120))
        assert got == want, f"round {rnd}: " + _first_difference(got, want)
        victims += len(got)
        p.tree.sanity_check()
        # a lone lock or unlock changes which leaves may go, a lone match the
        # recency order, and nothing else
        what = p.rng.random()
        if what < 0.2:
            p.lock_end()
        elif what < 0.4:
            p.unlock_some()
        elif what < 0.6:
            p.match()
        else:
            p.grow(p.rng.randrange(0, 12))
    assert victims > 1000


@pytest.mark.skipif(not os.path.isfile(SGL_EVICT_POLICY), reason=f"SGLang 0.5.23 not installed ({SGL_EVICT_POLICY})")
@pytest.mark.parametrize("policy", KEYED)
def test_model_priorities_are_sglang_strategies(policy):
    """The transcribed priorities equal SGLang's EvictionStrategy classes on the model's nodes."""
    mod = sglang_strategies()
    ours, theirs = model_priority(policy, CONFIGS[policy]), sglang_priority(mod, policy, CONFIGS[policy])
    p = Pair(policy, 1, SEED + 5)
    p.grow(400)
    stack = list(p.model.root.children.values())
    assert stack
    while stack:
        n = stack.pop()
        stack.extend(n.children.values())
        assert ours(n) == theirs(n)


def test_every_policy_of_the_table_is_accepted_and_named():
    for name in ("sglang", "consumed", "utility") + KEYED:
        assert _C.RadixTree(lru_policy=name).lru_policy == name
    assert _C.RadixTree(lru_policy="slru", policy_options={"protected_threshold": 5}).lru_policy == "slru"


@pytest.mark.parametrize("kwargs,match", [
    ({"lru_policy": "lru"}, "lru_policy must be"),
    ({"lru_policy": "slru", "policy_options": {"threshold": 1}}, "unknown keys for lru_policy 'slru'"),
    ({"lru_policy": "tlru", "policy_options": {"protected_threshold": 1}}, "unknown keys for lru_policy 'tlru'"),
    ({"lru_policy": "lfu", "policy_options": {"alpha": 1.0}}, "unknown keys for lru_policy 'lfu'"),
    ({"lru_policy": "tlru", "policy_options": {"threshold": -1}}, r"policy_options\['threshold'\]"),
    ({"lru_policy": "slru", "policy_options": {"protected_threshold": 2.5}}, "protected_threshold"),
    ({"lru_policy": "slru", "policy_options": [("protected_threshold", 2)]}, "policy_options must be a mapping"),
])
def test_bad_policy_settings_name_the_argument(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _C.RadixTree(**kwargs)


def test_insert_priority_and_inserted_len_are_checked():
    t = _C.RadixTree(lru_policy="priority", semantics="v0.5.23", kv_only=True)
    with pytest.raises(TypeError, match="priority"):
        t.insert([1, 2], [0, 1], None, priority="high")
    with pytest.raises(ValueError, match="inserted_len"):
        t.insert([1, 2], [0, 1], None, inserted_len=-1)
    assert t.node_count() == 0
    t.insert([1, 2], [0, 1], None, priority=3, inserted_len=1)
    t.sanity_check()
