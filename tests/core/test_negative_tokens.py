"""RadixTree.negative_tokens(): the negative tokens the tree's keys still hold.

The 0.5.23 TreeCore stores ids outside int32 (multimodal pad ids) as negative stand-ins and frees a
stand-in once no key holds it, so the scan must see every key of every node and nothing evicted.  The
reference is a plain list of the keys inserted, less the ones evicted, read back through the node API."""

from __future__ import annotations

import random

import numpy as np

import mambaradix._C as C


def _keys_in_tree(tree) -> list:
    out, stack = [], [tree.root]
    while stack:
        n = stack.pop()
        out.append(np.asarray(n.key, dtype=np.int64))
        stack.extend(n.children)
    return out


def test_negative_tokens_are_those_of_the_live_keys():
    rng = random.Random(4)
    tree = C.RadixTree(page_size=1, semantics="v0.5.23")
    next_kv = 1
    for step in range(300):
        key = [rng.choice([1, 2, 3, -1 - rng.randrange(40)]) for _ in range(rng.randint(1, 12))]
        n = len(key)
        tree.insert(np.array(key, dtype=np.int64), np.arange(next_kv, next_kv + n), None)
        next_kv += n
        if step % 7 == 6:
            tree.evict_full(rng.randint(1, 30))
        got = tree.negative_tokens()
        want = [k[i] for k in _keys_in_tree(tree) for i in range(len(k))
                if k[i] < 0 and (i == 0 or k[i] != k[i - 1])]
        assert got.dtype == np.int64
        assert sorted(got.tolist()) == sorted(want)
    assert tree.node_count() > 0
    tree.reset()
    assert tree.negative_tokens().tolist() == []
