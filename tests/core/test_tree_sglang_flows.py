"""SGLang's MambaRadixCache unit-test flows, re-created on our tree.

The flows and their numbers are those of SGLang v0.5.15's
`test_mamba_unittest.py` (a KV pool of 128 tokens, 20 state slots,
mamba_cache_chunk_size 64).  SGLang's cache frees duplicate KV indices and
evicted slots itself; ours hands them back, so each test keeps two small
allocators (free lists of indices 1..N, as SGLang's) and frees what the tree
returns; the allocators' `available_size()` numbers are then SGLang's.

Every flow runs on the C tree and on the reference model, under both LRU
policies unless the policies give different results (then each policy's
expected order is asserted).
"""

import pytest

from tree_helpers import IMPLS, Allocator, ints, make_tree, node_path, tree_snapshot

POLICIES = ["consumed", "sglang"]
KV_SIZE = 128
STATE_SLOTS = 20


class Cache:
    """The tree plus a KV allocator and a state-slot allocator, used the way
    SGLang's cache uses its pools."""

    def __init__(self, impl, policy, page_size=1, chunk_size=64):
        self.tree = make_tree(impl, page_size=page_size, chunk_size=chunk_size, lru_policy=policy)
        self.kv = Allocator(KV_SIZE)
        self.slots = Allocator(STATE_SLOTS)
        self.evicted = [0, 0]  # tokens, states

    def new_req(self):
        """A request: SGLang's make_dummy_req() takes one state slot."""
        return self.slots.alloc(1)[0]

    def insert(self, key, slot=None, prev_prefix_len=0, extra_key=None):
        if slot is None:
            slot = self.new_req()
        value = self.kv.alloc(len(key))
        res = self.tree.insert(key, value, slot, extra_key=extra_key, prev_prefix_len=prev_prefix_len)
        self.kv.free(res.duplicates)
        if res.state_existed:
            self.slots.free([slot])
        return res, value

    def evict_full(self, n):
        res = self.tree.evict_full(n)
        self.evicted[0] += res.tokens_evicted
        self.evicted[1] += res.states_evicted
        self.kv.free(res.kv_indices)
        self.slots.free(res.state_slots)
        return res

    def evict_mamba(self, n):
        res = self.tree.evict_mamba(n)
        self.evicted[0] += res.tokens_evicted
        self.evicted[1] += res.states_evicted
        self.kv.free(res.kv_indices)
        self.slots.free(res.state_slots)
        return res

    def check(self, leaked_kv=0):
        """SGLang's idle pool invariants: every index is free or held by the
        tree (leaked_kv: indices the test allocated and knowingly dropped)."""
        self.tree.sanity_check()
        full_tokens, states = self.tree.total_size()
        assert self.kv.available_size() + full_tokens + leaked_kv == self.kv.size
        assert full_tokens == self.tree.full_evictable_size() + self.tree.full_protected_size()
        assert self.slots.available_size() + states == self.slots.size
        assert states == self.tree.mamba_evictable_size() + self.tree.mamba_protected_size()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
def test_mamba_radix_cache_1(impl, policy):
    c = Cache(impl, policy)
    tree = c.tree
    assert c.kv.available_size() == 128 and c.slots.available_size() == 20

    r1, kv1 = c.insert([1, 2, 3])
    assert (r1.prefix_len, r1.state_existed) == (0, False)
    assert ints(kv1) == [1, 2, 3] and r1.node.state == 1
    c.check()

    r2, kv2 = c.insert([1, 2, 3, 4, 5, 6, 7])
    assert (r2.prefix_len, r2.state_existed) == (3, False)
    assert ints(r2.duplicates) == kv2[:3] == [4, 5, 6]
    assert c.kv.available_size() == 128 - 7
    c.check()

    r3, _ = c.insert([10, 11, 12])
    assert r3.prefix_len == 0
    r4, kv4 = c.insert([1, 2, 3, 4, 5, 60, 70])
    assert (r4.prefix_len, r4.state_existed) == (5, False)
    assert ints(r4.duplicates) == kv4[:5]
    assert c.kv.available_size() == 128 - 12
    assert c.slots.available_size() == 16
    c.check()
    # B was split into a tombstone [4, 5] over [6, 7] (req2) and [60, 70] (req4)
    snap = [(row[1], row[3]) for row in tree_snapshot(tree)]
    assert snap == [
        ((), None),
        ((1, 2, 3), 1),
        ((1, 2, 3, 4, 5), None),
        ((1, 2, 3, 4, 5, 6, 7), 2),
        ((1, 2, 3, 4, 5, 60, 70), 4),
        ((10, 11, 12), 3),
    ]

    # The least recently used leaf is C = [10, 11, 12].
    ev = c.evict_full(1)
    assert ev.tokens_evicted >= 1
    assert (ev.tokens_evicted, ev.states_evicted) == (3, 1)
    assert ints(ev.kv_indices) == [11, 12, 13] and ints(ev.state_slots) == [3]
    c.check()

    # The least recently used state is A's = [1, 2, 3]: internal, so only
    # its state goes (a tombstone keeps its KV).
    ev = c.evict_mamba(1)
    assert ev.states_evicted >= 1
    assert (ev.tokens_evicted, ev.states_evicted) == (0, 1)
    assert ints(ev.kv_indices) == [] and ints(ev.state_slots) == [1]
    c.check()

    m = tree.match_prefix([1, 2, 3, 4, 5])
    assert len(m.indices) == 0
    assert m.node.is_root and m.state is None
    assert (m.kv_matched_len, m.branching_seqlen) == (5, None)

    m = tree.match_prefix([1, 2, 3, 4, 5, 60, 70])
    assert len(m.indices) == 7 and len(m.node.key) == 2
    assert ints(m.indices) == [1, 2, 3, 7, 8, 19, 20] and m.state == 4

    m = tree.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert len(m.indices) == 7 and len(m.node.key) == 2
    assert ints(m.indices) == [1, 2, 3, 7, 8, 9, 10] and m.state == 2
    assert m.kv_matched_len == 7 and m.branching_seqlen is None

    # The match of [1..7] refreshed [6, 7]: the LRU state is now D = [60, 70],
    # a leaf, evicted with its KV.
    ev = c.evict_mamba(1)
    assert (ev.tokens_evicted, ev.states_evicted) == (2, 1)
    assert ints(ev.kv_indices) == [19, 20] and ints(ev.state_slots) == [4]
    c.check()

    m = tree.match_prefix([1, 2, 3, 4, 5, 60, 70])
    assert len(m.indices) == 0 and len(m.node.key) == 0 and m.node.is_root

    # SGLang's COW source: the node whose state a hit would copy.
    m = tree.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert m.state == 2 and m.node.state == 2 and len(m.indices) == 7
    assert c.kv.available_size() == 128 - 7 and c.slots.available_size() == 19
    c.check()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
def test_insert_prev_prefix_len(impl, policy):
    c = Cache(impl, policy)
    avail0 = c.kv.available_size()

    res, _ = c.insert([1, 2, 3])
    assert res.prefix_len == 0
    assert c.kv.available_size() == avail0 - 3

    res, _ = c.insert([1, 2, 3, 4, 5, 6, 7], prev_prefix_len=0)
    assert res.prefix_len == 3
    assert c.kv.available_size() == avail0 - 7

    # The first 2 indices are the caller's locked prefix (the tree's own in
    # SGLang's scheduler): not reported, so here they stay allocated.
    res, val = c.insert([1, 2, 3, 4, 5, 6, 7, 8], prev_prefix_len=2)
    assert res.prefix_len == 7
    assert ints(res.duplicates) == val[2:7]
    assert c.kv.available_size() == avail0 - 7 - 3

    res, val = c.insert(list(range(1, 10)), prev_prefix_len=8)
    assert res.prefix_len == 8
    assert ints(res.duplicates) == []
    assert c.kv.available_size() == avail0 - 7 - 3 - 9
    c.check(leaked_kv=2 + 8)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
def test_mamba_lru_match_refreshes_only_used_node(impl, policy):
    """SGLang PR #31643's test.  It passes under "consumed"; under v0.5.15's
    policy ("sglang") a match refreshes every state on its path, so the last
    assertion of the original fails there and the v0.5.15 order is asserted
    instead."""
    c = Cache(impl, policy)
    tree = c.tree
    c.insert([1, 2, 3])
    c.insert([1, 2, 3, 4, 5, 6])
    c.insert([7, 8, 9])
    c.insert([7, 8, 9, 10, 11, 12])
    a1 = (None, (1, 2, 3))
    b1 = (None, (1, 2, 3, 4, 5, 6))
    a2 = (None, (7, 8, 9))
    b2 = (None, (7, 8, 9, 10, 11, 12))

    def order():
        return [node_path(n) for n in tree.lru_order("mamba")]

    # inserts refresh the new node's state only, under both policies: b1's
    # insert walked through a1 without refreshing it
    assert order() == [b2, a2, b1, a1]

    tree.match_prefix([1, 2, 3, 4, 5, 6])
    tree.match_prefix([7, 8, 9, 10, 11, 12])
    o = order()
    assert o.index(a1) > o.index(a2)
    if policy == "consumed":
        assert o == [b2, b1, a2, a1]
    else:
        assert o == [b2, a2, b1, a1]

    tree.match_prefix([1, 2, 3, 4, 5, 6])
    o = order()
    assert o[0] == b1
    if policy == "consumed":
        assert o.index(a1) > o.index(a2)
        assert o == [b1, b2, a2, a1]
    else:
        # v0.5.15: the match made a1 recent too, so a1 now outlives a2
        assert o.index(a1) < o.index(a2)
        assert o == [b1, a1, b2, a2]
    c.check()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
def test_kv_events_flow_eviction_counts(impl, policy):
    """test_mamba_radix_cache_kv_events without the events: an internal state
    eviction frees no KV; then one full eviction removes the leaf and the
    tombstone above it (all 5 tokens)."""
    c = Cache(impl, policy)
    tree = c.tree
    _, kv_a = c.insert([1, 2, 3])
    _, kv_b = c.insert([1, 2, 3, 4, 5])
    ev = c.evict_mamba(1)
    assert (ev.tokens_evicted, ev.states_evicted) == (0, 1)
    assert ints(ev.kv_indices) == []
    c.check()
    ev = c.evict_full(1)
    assert ev.tokens_evicted >= 1
    assert (ev.tokens_evicted, ev.states_evicted) == (5, 1)
    # leaf [4, 5] first, then the tombstone [1, 2, 3] of the cascade
    assert ints(ev.kv_indices) == kv_b[3:] + kv_a
    assert sorted(ints(ev.kv_indices)) == sorted(kv_a + kv_b[3:])
    assert tree.total_size() == (0, 0) and tree.node_count() == 0
    c.check()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
def test_kv_events_split_flow(impl, policy):
    """test_mamba_radix_cache_kv_events_split_hash without the events: the
    second insert splits [1, 2, 3, 4] after 2 tokens and stores only [5, 6]."""
    c = Cache(impl, policy)
    tree = c.tree
    _, kv1 = c.insert([1, 2, 3, 4])
    res, kv2 = c.insert([1, 2, 5, 6])
    assert (res.prefix_len, res.state_existed) == (2, False)
    assert ints(res.duplicates) == kv2[:2]
    assert ints(res.node.key) == [5, 6] and ints(res.node.value) == kv2[2:]
    rows = [(r[1], r[2], r[3]) for r in tree_snapshot(tree)]
    assert rows == [
        ((), [], None),
        ((1, 2), kv1[:2], None),
        ((1, 2, 3, 4), kv1[2:], 1),
        ((1, 2, 5, 6), kv2[2:], 2),
    ]
    assert tree.node_count() == 3
    c.check()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
def test_split_upper_half_is_unusable_tombstone(impl, policy):
    """A partial match splits the edge even though a match only reads; the
    upper half has no state, so its KV is not usable."""
    c = Cache(impl, policy)
    tree = c.tree
    c.insert([1, 2, 3, 4, 5, 6])
    m = tree.match_prefix([1, 2, 3, 9])
    assert len(m.indices) == 0 and m.node.is_root
    assert m.kv_matched_len == 3 and m.branching_seqlen is None
    assert tree.node_count() == 2
    rows = [(r[1], r[3]) for r in tree_snapshot(tree)]
    assert rows == [((), None), ((1, 2, 3), None), ((1, 2, 3, 4, 5, 6), 1)]
    # an identical prompt capped at len - 1 never hits (SGLang #21158)
    m = tree.match_prefix([1, 2, 3, 4, 5])
    assert len(m.indices) == 0 and m.kv_matched_len == 5
    c.check()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
def test_branching_seqlen(impl, policy):
    c = Cache(impl, policy)
    tree = c.tree
    c.kv = Allocator(2048)
    a = [1] * 256 + [2] * 256
    c.insert(a)
    m = tree.match_prefix([1] * 256 + [3] * 256)
    assert m.node.is_root and len(m.indices) == 0
    assert (m.kv_matched_len, m.branching_seqlen) == (256, 256)
    m = tree.match_prefix([1] * 300 + [3] * 5)
    assert (m.kv_matched_len, m.branching_seqlen) == (256, 256)
    m = tree.match_prefix([1] * 63)
    assert (m.kv_matched_len, m.branching_seqlen) == (63, None)
    m = tree.match_prefix([1] * 200)
    assert (m.kv_matched_len, m.branching_seqlen) == (200, 192)
    # a hit exactly at a state: no branching point
    m = tree.match_prefix(a)
    assert len(m.indices) == 512 and (m.kv_matched_len, m.branching_seqlen) == (512, None)
    # a state at 200: matching 1^256 2^... goes deeper (256 + 100) than it
    c.insert([1] * 200)
    m = tree.match_prefix([1] * 256 + [2] * 100)
    assert len(m.indices) == 200 and m.node.prefix_len == 200
    assert (m.kv_matched_len, m.branching_seqlen) == (356, 320)


# The seed document's worked example, replayed through the tree the way
# SGLang's scheduler uses it (prefill without chunking, one output token,
# chunk 64).  Each request is 256-token runs of one value.
EXAMPLE = [(1, 2), (1, 3), (1, 4), (1, 2, 5), (1, 4, 5), (1, 3, 5), (1, 3), (1, 3)]


def _prompt(runs):
    out = []
    for v in runs:
        out.extend([v] * 256)
    return out


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("cap", [True, False])
def test_worked_example_extra_buffer(impl, policy, cap):
    """extra_buffer: the prefill snapshots P + (E // C) * C, or the branching
    point when the match reported one; the finished request caches the
    snapshot.  SGLang caps the matched key at input_len - 1."""
    c = Cache(impl, policy)
    c.kv = Allocator(8192)
    tree = c.tree
    C = 64
    hits = []
    for runs in EXAMPLE:
        prompt = _prompt(runs)
        key = prompt[:-1] if cap else prompt
        m = tree.match_prefix(key)
        P = len(m.indices)
        hits.append(P)
        E = len(prompt) - P
        B = m.branching_seqlen
        if B is not None and P < B < P + E and (B - P) % C == 0:
            cache_len = B
        elif E >= C:
            cache_len = P + E // C * C
        else:
            cache_len = 0
        if cache_len:
            # the request's KV: the matched prefix is the tree's own
            value = ints(m.indices) + c.kv.alloc(cache_len - P)
            slot = c.new_req()
            res = tree.insert(prompt[:cache_len], value, slot, prev_prefix_len=P)
            c.kv.free(res.duplicates)
            if res.state_existed:
                c.slots.free([slot])
        tree.sanity_check()
    if cap:
        assert hits == [0, 0, 256, 512, 512, 256, 256, 448]
    else:
        assert hits == [0, 0, 256, 512, 512, 256, 256, 512]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
def test_worked_example_no_buffer(impl, policy):
    """no_buffer: the finished request inserts its whole prompt with its
    running state; identical prompts (capped key) never hit."""
    c = Cache(impl, policy)
    c.kv = Allocator(8192)
    tree = c.tree
    hits = []
    for runs in EXAMPLE:
        prompt = _prompt(runs)
        m = tree.match_prefix(prompt[:-1])
        P = len(m.indices)
        hits.append(P)
        value = ints(m.indices) + c.kv.alloc(len(prompt) - P)
        slot = c.new_req()
        res = tree.insert(prompt, value, slot, prev_prefix_len=P)
        c.kv.free(res.duplicates)
        if res.state_existed:
            c.slots.free([slot])
        tree.sanity_check()
    assert hits == [0, 0, 0, 512, 512, 512, 0, 0]
    # every KV index is free or in the tree
    assert c.kv.available_size() + tree.total_size()[0] == 8192
    assert c.slots.available_size() + tree.total_size()[1] == STATE_SLOTS


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
def test_scheduler_like_flow_keeps_pools_consistent(impl, policy):
    """Requests that match, lock, insert with prev_prefix_len = the locked
    prefix (the tree's own indices), unlock; evictions under pressure.  At
    every idle point each index is free or the tree's."""
    import random

    rng = random.Random(7)
    c = Cache(impl, policy)
    c.kv = Allocator(600)
    c.slots = Allocator(12)
    tree = c.tree
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(5, 40))] for _ in range(6)]
    for step in range(300):
        prompt = rng.choice(prefixes) + [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
        m = tree.match_prefix(prompt)
        P = len(m.indices)
        tree.inc_lock_ref(m.node)
        # room for the new tokens and one slot (SGLang evicts before alloc)
        need = len(prompt) - P
        if c.kv.available_size() < need:
            c.evict_full(need - c.kv.available_size())
        if c.slots.available_size() < 1:
            c.evict_mamba(1)
        if c.kv.available_size() < need or c.slots.available_size() < 1:
            tree.dec_lock_ref(m.node)
            continue
        value = ints(m.indices) + c.kv.alloc(need)
        slot = c.slots.alloc(1)[0]
        res = tree.insert(prompt, value, slot, prev_prefix_len=P)
        c.kv.free(res.duplicates)
        if res.state_existed:
            c.slots.free([slot])
        tree.dec_lock_ref(m.node)
        c.check()
    assert tree.full_protected_size() == 0 and tree.mamba_protected_size() == 0
    assert c.evicted[0] > 0 and c.evicted[1] > 0


# ----------------------------------------------------------------------
# mambaradix's hazard fixes (not in SGLang): locks on tombstones, locked
# leaves and tombstone leaves left behind by a locked cascade.


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
def test_evict_mamba_skips_leaf_locked_after_revive(impl, policy):
    """P = [1, 2] is locked while a tombstone, then revived.  evict_mamba(2)
    evicts the leaf X below it; P is then a leaf whose KV is locked, so it
    must be skipped (its state is not locked), not evicted."""
    tree = make_tree(impl, lru_policy=policy)
    x = tree.insert([1, 2, 3, 4], [10, 11, 12, 13], 1).node
    tree.match_prefix([1, 2, 9])  # split: P = [1, 2] (tombstone) over X = [3, 4]
    p = x.parent
    assert p.state is None and ints(p.key) == [1, 2]
    tree.inc_lock_ref(p)  # a lock taken on the tombstone: no state reference
    res = tree.insert([1, 2], [20, 21], 2)  # revives P
    assert res.node == p and p.state == 2 and p.state_lock_ref == 0
    assert tree.mamba_evictable_size() == 2

    ev = tree.evict_mamba(2)
    assert (ev.tokens_evicted, ev.states_evicted) == (2, 1)
    assert ints(ev.kv_indices) == [12, 13] and ints(ev.state_slots) == [1]
    assert p.valid and p.state == 2 and p.full_lock_ref == 1
    assert tree.total_size() == (2, 1)
    assert (tree.full_evictable_size(), tree.full_protected_size()) == (0, 2)
    tree.sanity_check()
    # unlocked, P is an ordinary leaf again
    tree.dec_lock_ref(p)
    ev = tree.evict_mamba(1)
    assert (ev.tokens_evicted, ev.states_evicted) == (2, 1)
    assert tree.total_size() == (0, 0)
    tree.sanity_check()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
def test_lock_on_tombstone_then_revive_then_unlock(impl, policy):
    tree = make_tree(impl, lru_policy=policy)
    x = tree.insert([1, 2, 3], [1, 2, 3], 1).node
    tree.match_prefix([1, 9])
    p = x.parent  # tombstone [1]
    tree.inc_lock_ref(p)
    assert (p.full_lock_ref, p.state_lock_ref) == (1, 0)
    assert tree.mamba_protected_size() == 0
    tree.insert([1], [7], 2)  # revive: the state is not protected by that lock
    assert tree.mamba_evictable_size() == 2 and tree.mamba_protected_size() == 0
    tree.inc_lock_ref(p)  # this lock takes the state
    assert (p.full_lock_ref, p.state_lock_ref) == (2, 1)
    assert tree.mamba_protected_size() == 1
    # the first unlock releases the lock that took no state reference
    tree.dec_lock_ref(p)
    assert (p.full_lock_ref, p.state_lock_ref) == (1, 1)
    assert tree.mamba_protected_size() == 1
    tree.dec_lock_ref(p)
    assert (p.full_lock_ref, p.state_lock_ref) == (0, 0)
    assert tree.mamba_protected_size() == 0 and tree.full_protected_size() == 0
    with pytest.raises(ValueError):
        tree.dec_lock_ref(p)
    tree.sanity_check()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("impl", IMPLS)
def test_locked_tombstone_leaf_is_evicted_once_unlocked(impl, policy):
    """A cascade stops at a locked tombstone, which stays as a leaf; once
    unlocked, evict_full removes it like a leaf (and cascades above it)."""
    tree = make_tree(impl, lru_policy=policy)
    c = tree.insert([1, 2, 3], [1, 2, 3], 1).node
    tree.match_prefix([1, 9])  # tombstone [1] over [2, 3]
    tree.match_prefix([1, 2, 8])  # tombstone [2] over [3]
    mid = c.parent
    top = mid.parent
    assert ints(top.key) == [1] and ints(mid.key) == [2] and ints(c.key) == [3]
    tree.inc_lock_ref(mid)
    ev = tree.evict_mamba(1)  # the leaf [3] goes; [2] is locked, so it stays
    assert (ev.tokens_evicted, ev.states_evicted) == (1, 1)
    assert mid.valid and not mid.children and mid.state is None
    tree.sanity_check()
    assert tree.evict_full(10).tokens_evicted == 0  # still locked
    tree.dec_lock_ref(mid)
    tree.sanity_check()
    ev = tree.evict_full(1)
    assert (ev.tokens_evicted, ev.states_evicted) == (2, 0)
    assert ints(ev.kv_indices) == [2, 1] and ints(ev.state_slots) == []
    assert not mid.valid and not top.valid
    assert tree.node_count() == 0 and tree.total_size() == (0, 0)
    tree.sanity_check()


@pytest.mark.parametrize("impl", IMPLS)
def test_evict_mamba_never_picks_full_locked_leaf(impl):
    """A locked leaf is skipped; evict_mamba looks further toward the most
    recently used end."""
    tree = make_tree(impl)
    a = tree.insert([1, 2], [1, 2], 1).node
    b = tree.insert([5, 6], [5, 6], 2).node
    tree.inc_lock_ref(a)
    ev = tree.evict_mamba(1)
    assert ints(ev.state_slots) == [2] and b.valid is False and a.valid
    assert tree.evict_mamba(1).states_evicted == 0
    tree.sanity_check()
