"""Node.can_evict_state: the tree's own rule for which states an eviction
may take, for policies decided outside the tree (the simulator's
belady one).  Checked two ways on random locked trees: against a
Python model of the rule (a state not locked, on an internal node or a leaf
whose KV is not locked; v0.5.23 takes a KV-locked leaf's state too), and
against what the tree's eviction really does (evict_mamba's victim is the
least recently used state it allows; evict_node_state takes exactly the
states it allows)."""

from __future__ import annotations

import random

import pytest

import mambaradix


def _model(x, v0523: bool) -> bool:
    return x.state is not None and x.state_lock_ref == 0 and (bool(x.children) or x.full_lock_ref == 0 or v0523)


def _tree(rng: random.Random, semantics: str, policy: str):
    tree = mambaradix.RadixTree(page_size=1, chunk_size=1, lru_policy=policy, semantics=semantics)
    kv, slot = 1, 1
    for _ in range(40):
        key = [rng.randint(1, 3) for _ in range(rng.randint(1, 7))]
        tree.insert(key, list(range(kv, kv + len(key))), slot)
        kv += len(key)
        slot += 1
    return tree


def _lock_some(rng: random.Random, tree, locks: list) -> None:
    nodes = [n for n in tree.lru_order("full") if rng.random() < 0.3]
    for n in nodes:
        kind = "kv" if rng.random() < 0.5 else "full"
        (tree.inc_kv_lock if kind == "kv" else tree.inc_lock_ref)(n)
        locks.append((kind, n))


def _unlock_some(rng: random.Random, tree, locks: list) -> None:
    for i in sorted(rng.sample(range(len(locks)), (len(locks) + 1) // 2), reverse=True):
        kind, n = locks.pop(i)
        (tree.dec_kv_lock if kind == "kv" else tree.dec_lock_ref)(n)


@pytest.mark.parametrize("semantics", ["v0.5.15", "v0.5.23"])
@pytest.mark.parametrize("policy", ["consumed", "sglang", "utility"])
@pytest.mark.parametrize("seed", range(4))
def test_can_evict_state_is_what_the_eviction_takes(semantics, policy, seed):
    rng = random.Random(seed)
    v0523 = semantics == "v0.5.23"
    tree = _tree(rng, semantics, policy)
    locks: list = []
    _lock_some(rng, tree, locks)
    refused = taken = kv_locked_leaves = 0
    while True:
        order = list(reversed(tree.lru_order("mamba")))  # least recently used first
        ok = [x.can_evict_state for x in order]
        assert ok == [_model(x, v0523) for x in order]
        kv_locked_leaves += sum(1 for x in order if not x.children and x.full_lock_ref and not x.state_lock_ref)
        assert tree.root.can_evict_state is False
        for x in order:  # a state the rule refuses, evict_node_state refuses too
            if not x.can_evict_state:
                with pytest.raises(ValueError, match="unlocked state"):
                    tree.evict_node_state(x)
                refused += 1
        allowed = [x.state for x in order if x.can_evict_state]
        if not allowed:
            assert tree.evict_mamba(1).states_evicted == 0
            if not locks:
                break
            _unlock_some(rng, tree, locks)
            continue
        if rng.random() < 0.5:
            r = tree.evict_mamba(1)
            got = r.state_slots.tolist()
            if policy == "utility":  # scores its window: any state the rule allows
                assert len(got) == 1 and got[0] in allowed
            else:
                assert got == allowed[:1]  # the least recently used one it allows
        else:
            pick = rng.choice(allowed)
            x = next(x for x in order if x.state == pick)
            assert tree.evict_node_state(x).state_slots.tolist() == [pick]
        taken += 1
        tree.sanity_check()
    assert taken >= 10 and refused >= 1 and kv_locked_leaves >= 1  # where the two semantics differ
