"""RadixTree(values=False), the keys-only tree, and evictions that only count
(evict_full / evict_mamba with indices=False).

The prefix lengths are checked against a brute force over every key
inserted (the longest common prefix, whole pages), written from the
definition, not from the tree; tests/core/test_tree_differential.py runs
both against the reference model operation by operation."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tree_helpers import HAVE_C

pytestmark = pytest.mark.skipif(not HAVE_C, reason="mambaradix._C.RadixTree is not built")

from mambaradix import RadixTree  # noqa: E402
from seeds import seeds  # noqa: E402


def _lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _key(rng, keys, page, alphabet=3, max_pages=12):
    """A fresh key, often an earlier key's prefix plus a fresh tail (so that
    inserts split edges at every depth)."""
    n = rng.randint(1, max_pages) * page
    if keys and rng.random() < 0.7:
        base = rng.choice(keys)
        cut = rng.randint(0, len(base))
        key = list(base[:cut])
    else:
        key = []
    while len(key) < n:
        key.append(rng.randrange(alphabet))
    return key[:n]


@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("seed", seeds(2))
def test_prefix_lengths_match_a_brute_force_over_every_key_seen(page, seed):
    """After each insert, kv_matched_len of random queries (an inserted key
    with a changed tail, or fresh tokens) is the longest common prefix with
    any key inserted so far, aligned down to a page; memory is 4 bytes a
    token plus the nodes, against 12 in a tree with values."""
    rng = random.Random(seed)
    t = RadixTree(page_size=page, chunk_size=page, values=False)
    v = RadixTree(page_size=page, chunk_size=page)
    keys: list = []
    next_kv = 1
    for step in range(300):
        key = _key(rng, keys, page)
        r = t.insert(key, None, 1)
        rv = v.insert(key, np.arange(next_kv, next_kv + len(key)), 1)
        next_kv += len(key)
        assert r.duplicates is None
        assert r.prefix_len == max((_lcp(key, k) for k in keys), default=0) // page * page
        assert (r.prefix_len, r.state_existed) == (rv.prefix_len, rv.state_existed)
        keys.append(key)
        for _ in range(3):
            q = list(rng.choice(keys))
            if rng.random() < 0.5 and q:
                q[rng.randrange(len(q))] = 7
            q += [rng.randrange(3) for _ in range(rng.randrange(3))]
            m = t.match_prefix(q)
            v.match_prefix(q)   # the same splits
            assert m.indices is None
            want = max(_lcp(q, k) for k in keys) // page * page
            assert m.kv_matched_len == want, (step, q)
        t.sanity_check()
    tokens = t.total_size()[0]
    assert tokens == v.total_size()[0] and t.node_count() == v.node_count()
    assert v.memory_bytes() - t.memory_bytes() == 8 * tokens


def test_keys_only_calls_that_would_need_values():
    t = RadixTree(values=False)
    r = t.insert([1, 2, 3], None, 5)
    assert r.node.value is None
    assert t.root.value.tolist() == []
    with pytest.raises(ValueError, match="value must be None"):
        t.insert([1, 2, 4], [7, 8, 9], 6)
    with pytest.raises(ValueError, match="values=False"):
        t.path_indices(r.node)
    with pytest.raises(ValueError, match="check_ownership"):
        RadixTree(values=False, check_ownership=True)
    with pytest.raises(TypeError):
        RadixTree().evict_full(1, False)   # indices is keyword-only
    e = t.evict_full(10)
    assert (e.tokens_evicted, e.states_evicted, e.kv_indices.tolist(), e.state_slots.tolist()) == (3, 1, [], [5])
    t.sanity_check()


def test_counting_eviction_with_check_ownership_forgets_what_it_released():
    """check_ownership=True: evict_full(indices=False) returns no indices but
    the tree forgets them, so inserting the same KV indices again is
    accepted; a tree still holding them refuses them."""
    t = RadixTree(check_ownership=True)
    t.insert([1, 2, 3, 4], np.arange(10, 14), 1)
    with pytest.raises(ValueError, match="already in the tree"):
        t.insert([5, 6], [10, 11], 2)
    e = t.evict_full(4, indices=False)
    assert (e.tokens_evicted, e.states_evicted, e.kv_indices.tolist(), e.state_slots.tolist()) == (4, 1, [], [1])
    t.insert([5, 6, 7, 8], np.arange(10, 14), 1)
    e = t.evict_mamba(1, indices=False)
    assert (e.tokens_evicted, e.kv_indices.tolist(), e.state_slots.tolist()) == (4, [], [1])
    t.sanity_check()


@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("seed", seeds(2))
def test_cached_len_is_the_longest_common_prefix_and_changes_nothing(page, seed):
    """cached_len(key, extra_key) is the longest common prefix with any key
    inserted under that extra_key, aligned down to a page (the brute force
    over every key), also after evictions (then what match_prefix reports);
    it splits nothing, touches no recency and makes no namespace."""
    rng = random.Random(seed)
    t = RadixTree(page_size=page, chunk_size=page, values=False)
    keys: dict = {None: [], "a": []}
    for step in range(200):
        ns = rng.choice([None, "a"])
        key = _key(rng, keys[ns], page)
        t.insert(key, None, 1, extra_key=ns)
        keys[ns].append(key)
        for _ in range(3):
            qns = rng.choice([None, "a"])
            q = list(rng.choice(keys[qns] or keys[ns]))
            if rng.random() < 0.5 and q:
                q[rng.randrange(len(q))] = 7
            q += [rng.randrange(3) for _ in range(rng.randrange(3))]
            nodes, order = t.node_count(), [n.id for n in t.lru_order("full")]
            got = t.cached_len(np.asarray(q, dtype=np.int64), qns)
            want = max((_lcp(q, k) for k in keys[qns]), default=0) // page * page
            assert got == want, (step, q, qns)
            assert t.node_count() == nodes and [n.id for n in t.lru_order("full")] == order
    assert t.cached_len([0, 1, 2], "never-seen") == 0
    assert t.namespace_name(1) == "a" and t.cached_len([], None) == 0
    assert t.namespace_name(2) is None and t.namespace("never-seen", create=False) == -1   # made no id
    # after evictions the tree no longer holds every key: match_prefix's length
    t.evict_full(t.total_size()[0] // 2)
    for ns in (None, "a"):
        for k in keys[ns][:50] + keys[None][:10]:
            assert t.cached_len(k, extra_key=ns) == t.match_prefix(k, extra_key=ns).kv_matched_len
    with pytest.raises(TypeError, match="extra_key"):
        t.cached_len([1, 2], 5)
    with pytest.raises((TypeError, ValueError), match="key"):
        t.cached_len([1, "x"])
