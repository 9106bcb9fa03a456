"""Thousands of siblings under one prefix: evictions, inserts and matches
against the reference model (reference_tree.py), whose children are a dict.

A removed child leaves a hole in its parent's sorted child array (radix.c,
"Children"), so evicting one of n siblings costs O(log n) instead of
shifting the rest; holes are refilled by inserts and squeezed out in bulk.
These runs take a parent with up to 3000 children through many removals
(at its front, where LRU evictions of keys inserted in token order fall,
and anywhere) and re-insertions, and compare after every step what each
eviction returns (the order: LRU), the sizes, and regularly the whole trees,
both LRU orders and every node's children in token order.
"""

import random

import pytest

from seeds import seeds
from tree_helpers import HAVE_C, ints, lru_paths, sizes, tree_snapshot

pytestmark = pytest.mark.skipif(not HAVE_C, reason="mambaradix._C.RadixTree is not built")

from mambaradix import _C  # noqa: E402
from reference_tree import ReferenceTree  # noqa: E402


def _children_tokens(tree) -> list:
    """Every node's children as their first tokens, in the tree's order."""
    out, stack = [], [tree.root]
    while stack:
        n = stack.pop()
        kids = list(n.children)
        out.append([ints(k.key)[0] for k in kids])
        stack.extend(kids)
    return out


class Pair:
    """The C tree and the model, driven through the same operations."""

    def __init__(self, policy: str):
        self.c = _C.RadixTree(page_size=1, chunk_size=2, lru_policy=policy)
        self.m = ReferenceTree(page_size=1, chunk_size=2, lru_policy=policy)
        self.next_kv = 1000
        self.next_state = 1

    def insert(self, key: list) -> None:
        val = list(range(self.next_kv, self.next_kv + len(key)))
        self.next_kv += len(key)
        st = self.next_state
        self.next_state += 1
        c, m = self.c.insert(key, val, st), self.m.insert(key, val, st)
        assert (c.prefix_len, c.state_existed, ints(c.duplicates)) == (m.prefix_len, m.state_existed,
                                                                     m.duplicates)

    def match(self, key: list) -> None:
        c, m = self.c.match_prefix(key), self.m.match_prefix(key)
        assert (ints(c.indices), c.state) == (m.indices, m.state)

    def evict_full(self, n: int) -> int:
        c, m = self.c.evict_full(n), self.m.evict_full(n)
        assert (c.tokens_evicted, c.states_evicted) == (m.tokens_evicted, m.states_evicted)
        assert ints(c.kv_indices) == m.kv_indices   # the victims, in eviction order
        assert ints(c.state_slots) == m.state_slots
        return c.tokens_evicted

    def compare(self, deep: bool) -> None:
        assert sizes(self.c) == sizes(self.m)
        self.c.sanity_check()
        if deep:
            cp, mp = {}, {}
            assert tree_snapshot(self.c, cp) == tree_snapshot(self.m, mp)
            assert lru_paths(self.c, "full", cp) == lru_paths(self.m, "full", mp)
            assert lru_paths(self.c, "mamba", cp) == lru_paths(self.m, "mamba", mp)
            kids = _children_tokens(self.c)
            assert kids == [sorted(k) for k in kids]
            assert sorted(map(sorted, kids)) == sorted(map(sorted, _children_tokens(self.m)))


@pytest.mark.parametrize("policy", ["consumed", "sglang"])
@pytest.mark.parametrize("order", ["ascending", "shuffled"])
@pytest.mark.parametrize("seed", seeds(2))
def test_evictions_among_thousands_of_siblings_follow_the_reference(policy: str, order: str, seed: int) -> None:
    """3000 two-token leaves under [1, 2] (inserted in token order, so LRU
    evictions empty the front of the child array, or shuffled), some
    refreshed by matches; then rounds that evict a random number of tokens,
    insert new siblings (half of them with the first token of one of the
    3000: where that one was evicted, its entry's hole is refilled), and
    match.  Every eviction returns the reference's
    KV indices and slots in its order; every few rounds the trees, LRU
    orders and child orders are compared."""
    rng = random.Random(seed)
    p = Pair(policy)
    toks = list(range(100, 3100))
    if order == "shuffled":
        rng.shuffle(toks)
    for t in toks:
        p.insert([1, 2, t, t])
    for t in rng.sample(toks, 300):
        p.match([1, 2, t, t])
    p.compare(deep=True)
    fresh = 5000
    for step in range(240):
        p.evict_full(rng.choice([1, 2, 2, 6, 20, 120]))
        if rng.random() < 0.5:
            if rng.random() < 0.5:
                t = rng.choice(toks)
            else:
                t, fresh = fresh, fresh + 1
            p.insert([1, 2, t, t, t])
        if rng.random() < 0.3:
            p.match([1, 2, rng.choice(toks), 7])
        p.compare(deep=step % 40 == 39)
    # everything goes, in the model's order
    while p.evict_full(500) > 0:
        pass
    p.compare(deep=True)
    assert sizes(p.c)[-1] == 0


def test_dump_lists_every_root_child_in_token_order() -> None:
    """mr_radix_dump pushed every child of the root onto a stack of 64
    entries: Lifecycle.dump() over a root with thousands of children wrote
    past it (the process aborted).  Each node is listed once, the root's
    children in token order, whatever their number."""
    lc = _C.Lifecycle(None, None, None, page_size=1, chunk_size=4)
    toks = list(range(1, 5001))
    random.Random(3).shuffle(toks)
    for i, t in enumerate(toks):
        lc.insert([t, t], [2 * i + 1, 2 * i + 2], i + 1)
    lines = lc.dump().splitlines()
    assert lines[0].startswith("root ") and len(lines) == 5001
    assert [int(line.split("tokens=[")[1].split()[0]) for line in lines[1:]] == list(range(1, 5001))
