"""Inserts that would hand the tree a KV index or a state slot it already
holds (a later eviction would return it twice: a double free), or a
prev_prefix_len longer than the key.  RadixTree checks them with
check_ownership=True; Lifecycle always checks them.

The reference is a plain Python model of what the tree holds: every index a
successful insert stored past the cached prefix, the state when the end node
had none, minus everything evictions returned."""

from __future__ import annotations

import random

import numpy as np
import pytest

import mambaradix
from mambaradix import _C


def held_by_walk(tree):
    """(KV indices, state slots) stored in the tree's nodes, by walking it."""
    kv, states = [], []
    todo = list(tree.root.children)
    while todo:
        n = todo.pop()
        kv.extend(int(v) for v in n.value)
        if n.state is not None:
            states.append(int(n.state))
        todo.extend(n.children)
    return kv, states


def cached_by_walk(tree, key, page):
    """Tokens of key the tree already holds (whole pages), walking its nodes."""
    node, pos = tree.root, 0
    while pos < len(key):
        for child in node.children:
            ck = child.key.tolist()
            p = 0
            while p < min(len(ck), len(key) - pos) and ck[p] == key[pos + p]:
                p += 1
            p = p // page * page
            if p:
                break
        else:
            return pos
        pos += p
        if p < len(ck):
            return pos
        node = child
    return pos


def test_prev_prefix_len_past_the_key_is_refused_with_the_option_only():
    plain = mambaradix.RadixTree()
    plain.insert([1, 2, 3, 4], [10, 11, 12, 13], 1, prev_prefix_len=99)   # SGLang accepts it
    t = mambaradix.RadixTree(check_ownership=True)
    with pytest.raises(ValueError, match="prev_prefix_len 99 exceeds the key's 4 tokens"):
        t.insert([1, 2, 3, 4], [10, 11, 12, 13], 1, prev_prefix_len=99)
    assert t.node_count() == plain.node_count() - 1
    r = t.insert([1, 2, 3, 4], [10, 11, 12, 13], 1, prev_prefix_len=4)
    assert r.prefix_len == 0 and not r.state_existed


def test_same_state_or_kv_under_two_keys_is_refused_and_the_tree_is_unchanged():
    t = mambaradix.RadixTree(check_ownership=True)
    t.insert([1, 2, 3, 4], [10, 11, 12, 13], 7)
    before = (t.pretty_print(), t.total_size())
    with pytest.raises(ValueError, match="state 7 is already in the tree"):
        t.insert([5, 6, 7, 8], [20, 21, 22, 23], 7)
    with pytest.raises(ValueError, match=r"value\[2\] = 12 is already in the tree"):
        t.insert([5, 6, 7, 8], [20, 21, 12, 23], 8)
    with pytest.raises(ValueError, match=r"value\[3\] = 20 is listed twice"):
        t.insert([5, 6, 7, 8], [20, 21, 22, 20], 8)
    assert (t.pretty_print(), t.total_size()) == before
    t.sanity_check()
    # the tree's own prefix, declared as such, is fine; past it, only new indices
    r = t.insert([1, 2, 3, 4, 9, 9], [10, 11, 12, 13, 30, 31], 8, prev_prefix_len=4)
    assert r.prefix_len == 4 and len(r.duplicates) == 0
    with pytest.raises(ValueError, match=r"value\[1\] = 11 is already in the tree"):
        t.insert([1, 2, 9, 9], [10, 11, 40, 41], 9, prev_prefix_len=1)


def test_evicted_indices_and_slots_can_be_inserted_again():
    t = mambaradix.RadixTree(check_ownership=True)
    t.insert([1, 2], [10, 11], 3)
    ev = t.evict_full(2)
    assert sorted(ev.kv_indices.tolist()) == [10, 11] and ev.state_slots.tolist() == [3]
    t.insert([5, 6], [10, 11], 3)
    t.reset()
    t.insert([5, 6], [10, 11], 3)
    t.sanity_check()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("page", [1, 2])
def test_random_inserts_and_evictions_never_hand_out_twice(seed, page):
    """Random keys that share prefixes, values and slots drawn from small
    ranges (so collisions are frequent), random prev_prefix_len and
    evictions.  An insert must fail exactly when the model says it reuses
    something the tree holds; what the tree holds always equals the model;
    evictions never return what they already returned."""
    rng = random.Random(seed)
    t = mambaradix.RadixTree(page_size=page, chunk_size=4, check_ownership=True)
    kv_held: set[int] = set()
    st_held: set[int] = set()
    refused = accepted = 0
    for _ in range(400):
        if rng.random() < 0.2:
            ev = t.evict_full(rng.randrange(1, 8)) if rng.random() < 0.5 else t.evict_mamba(1)
            kv_out, st_out = ev.kv_indices.tolist(), ev.state_slots.tolist()
            assert len(set(kv_out)) == len(kv_out) and set(kv_out) <= kv_held
            assert len(set(st_out)) == len(st_out) and set(st_out) <= st_held
            kv_held -= set(kv_out)
            st_held -= set(st_out)
        else:
            n = page * rng.randrange(1, 4)
            key = [rng.randrange(3) for _ in range(n)]
            val = [rng.randrange(40) for _ in range(n)]
            state = rng.randrange(12)
            prev = rng.choice([0, 0, rng.randrange(n + 3)])
            mine = min(prev, cached_by_walk(t, key, page))   # the tree's own prefix
            bad = (prev > n or state in st_held or any(v in kv_held for v in val[mine:])
                   or len(set(val[mine:])) != len(val[mine:]))
            if bad:
                with pytest.raises(ValueError):
                    t.insert(key, val, state, prev_prefix_len=prev)
                refused += 1
            else:
                r = t.insert(key, val, state, prev_prefix_len=prev)
                kv_held |= set(val[r.prefix_len:])
                if not r.state_existed:
                    st_held.add(state)
                accepted += 1
        kv, states = held_by_walk(t)
        assert sorted(kv) == sorted(kv_held) and sorted(states) == sorted(st_held)
        t.sanity_check()
    assert refused > 20 and accepted > 20


def _lifecycle(kv_size=64, slots=8):
    kv = _C.SlotAllocator(kv_size)
    st = _C.SlotAllocator(slots)
    lc = _C.Lifecycle(st, kv, _C.ReqPool(4, 64, 2), chunk_size=4)
    return lc, kv, st


def test_lifecycle_refuses_tree_owned_kv_past_the_locked_prefix():
    lc, kv, st = _lifecycle()
    idx = kv.alloc(4)
    s1, s2 = st.alloc(1)[0], st.alloc(1)[0]
    lc.insert([1, 2, 3, 4], idx, s1)
    lc.check()
    with pytest.raises(_C.OwnershipError, match="owned by the prefix tree"):
        lc.insert([5, 6, 7, 8], idx, s2)                 # the same KV under another key
    with pytest.raises(_C.OwnershipError, match="owned by the prefix tree"):
        lc.insert([5, 6, 7, 8], kv.alloc(4), s1)         # the same state under another key
    with pytest.raises(ValueError, match="prev_prefix_len 99 exceeds the key's 4 tokens"):
        lc.insert([1, 2, 3, 4], idx, s2, prev_prefix_len=99)
    lc.check()
    # the tree's own prefix declared as prev_prefix_len, then new indices: fine
    more = kv.alloc(2)
    pl, existed, *_ = lc.insert([1, 2, 3, 4, 9, 9], np.concatenate([idx, more]), s2, prev_prefix_len=4)
    assert pl == 4 and not existed
    lc.check()


@pytest.mark.parametrize("seed", range(3))
def test_counting_evictions_forget_what_they_released(seed):
    """evict_full / evict_mamba with indices=False hand back no KV indices,
    yet the check forgets every index they released: one that left the
    tree's nodes (walked before and after) goes in again under a new key,
    while one still in a node is refused."""
    rng = random.Random(seed)
    t = mambaradix.RadixTree(chunk_size=4, check_ownership=True)
    next_kv, next_state, reinserted = 0, 0, 0
    for step in range(200):
        if rng.random() < 0.3:
            before, _ = held_by_walk(t)
            if rng.random() < 0.5:
                ev = t.evict_full(rng.randrange(1, 6), indices=False)
            else:
                ev = t.evict_mamba(1, indices=False)
            after, _ = held_by_walk(t)
            assert ev.kv_indices.tolist() == [] and ev.tokens_evicted == len(before) - len(after)
            gone = sorted(set(before) - set(after))
            if gone:
                t.insert([1000 + step], [gone[0]], 10_000 + step)
                reinserted += 1
            if after:
                with pytest.raises(ValueError, match="already in the tree"):
                    t.insert([5000 + step], [after[0]], 20_000 + step)
        else:
            n = rng.randrange(1, 4)
            key = [rng.randrange(3) for _ in range(n)]
            t.insert(key, list(range(next_kv, next_kv + n)), next_state)
            next_kv += n
            next_state += 1
        t.sanity_check()
    assert reinserted > 10
