"""RadixTree.match_node(node): the effects of match_prefix on the key that
ends at node, without reading the key (what cache_unfinished_req's match
after its insert does; the simulator uses it).

The reference is match_prefix itself: two trees take the same random
inserts, evictions and locks; after each insert one of them runs
match_prefix(key) and the other match_node(insert's node).  Every
observable must stay the same: both LRU orders, the sizes, the policy
counters (states used, the tuner's work), and what later evictions take.
"""

import numpy as np
import pytest

import mambaradix
from seeds import seeds


def _state(tree):
    return ([n.prefix_len for n in tree.lru_order("full")],
            [n.prefix_len for n in tree.lru_order("mamba")],
            tree.total_size(), tree.full_evictable_size(),
            {k: v for k, v in tree.policy_stats().items() if k != "alpha"})


@pytest.mark.parametrize("policy", ["sglang", "consumed", "utility"])
@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("seed", seeds())
def test_match_node_equals_match_prefix_after_insert(policy, page, seed):
    rng = np.random.default_rng(seed)
    kw = dict(page_size=page, chunk_size=4 * page, lru_policy=policy)
    if policy == "utility":
        kw["policy_options"] = {"alpha": 1.0, "flops_per_token": 1.0, "state_bytes": 1.0,
                                "kv_bytes_per_token": 1.0, "tune_window": 8}
    a, b = mambaradix.RadixTree(**kw), mambaradix.RadixTree(**kw)
    bases = [rng.integers(1, 50, size=64, dtype=np.int32) for _ in range(4)]
    slot = 0
    for _ in range(300):
        op = rng.integers(0, 10)
        if op < 7:
            base = bases[rng.integers(0, len(bases))]
            n = int(rng.integers(1, 16)) * page
            key = base[:n].copy()
            if rng.random() < 0.3:
                key[-page:] = rng.integers(1, 50, size=page)
            slot += 1
            vals = np.arange(slot * 100, slot * 100 + n, dtype=np.int64)
            ra = a.insert(key, vals, slot)
            rb = b.insert(key, vals, slot)
            assert (ra.prefix_len, ra.state_existed) == (rb.prefix_len, rb.state_existed)
            m = a.match_prefix(key)
            assert len(m.indices) == n and m.node == ra.node
            assert b.match_node(rb.node) == n
        elif op < 9:
            k = int(rng.integers(1, 40))
            if op == 7:
                ea, eb = a.evict_full(k), b.evict_full(k)
            else:
                ea, eb = a.evict_mamba(max(1, k // 8)), b.evict_mamba(max(1, k // 8))
            assert (ea.tokens_evicted, ea.states_evicted) == (eb.tokens_evicted, eb.states_evicted)
        else:
            base = bases[rng.integers(0, len(bases))]
            ma, mb = a.match_prefix(base[:32]), b.match_prefix(base[:32])
            assert len(ma.indices) == len(mb.indices)
        assert _state(a) == _state(b)


def test_match_node_refuses_a_node_without_state():
    t = mambaradix.RadixTree(page_size=1, chunk_size=4)
    key = np.arange(1, 9, dtype=np.int32)
    t.insert(key, np.arange(8, dtype=np.int64), 1)
    t.insert(np.array([1, 2, 3, 4, 9, 9], dtype=np.int32), np.arange(6, dtype=np.int64), 2)
    upper = t.match_prefix(key[:4]).kv_node          # the split's stateless upper half
    assert upper.state is None
    with pytest.raises(ValueError, match="no state"):
        t.match_node(upper)
    assert t.match_node(t.root) == 0


@pytest.mark.parametrize("seed", seeds())
def test_match_prefix_without_indices_matches_the_same(seed):
    """match_prefix(indices=False) is the same match (same splits, LRU
    effects, result fields) without the copy of the path's indices."""
    rng = np.random.default_rng(seed)
    a, b = (mambaradix.RadixTree(page_size=1, chunk_size=4) for _ in range(2))
    base = rng.integers(1, 20, size=40, dtype=np.int32)
    for i in range(60):
        n = int(rng.integers(1, 40))
        key = base[:n].copy()
        key[-1] = rng.integers(1, 20)
        if i % 2:
            for t in (a, b):
                t.insert(key, np.arange(n, dtype=np.int64), i + 1)
        else:
            ma, mb = a.match_prefix(key), b.match_prefix(key, indices=False)
            assert mb.indices is None and len(ma.indices) == mb.node.prefix_len
            assert (ma.node.prefix_len, ma.state, ma.kv_matched_len, ma.branching_seqlen) == \
                (mb.node.prefix_len, mb.state, mb.kv_matched_len, mb.branching_seqlen)
        assert _state(a) == _state(b)
