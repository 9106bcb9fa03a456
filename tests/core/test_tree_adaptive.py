"""The adaptive state policy against a pure-Python model of its decisions.

The model reads the tree only through the public node API (the state list's
order, locks, keys, node ids) and keeps the policy's own memory itself: the
three orders' weights, the ghosts of evicted states (on a tombstone, or in
the direct-mapped table under the ancestor that survived a removed leaf),
the marks on overruled picks, and the per-node counts of used and wasted
child states that decide a probation admission.  Random inserts, matches,
locks and evictions run on both; after every step the victim, the weights,
the counters and the admitted state's place in the state list must agree.
"""

from __future__ import annotations

import random

import pytest

import mambaradix
from mambaradix import _C

FLOOR = 0.01
GHOST_BITS = 13
M64 = (1 << 64) - 1


def ghost_slot(nid: int, gen: int, tok: int) -> int:
    h = ((nid * 0x9E3779B97F4A7C15) & M64) ^ ((gen * 0xC2B2AE3D27D4EB4F) & M64) \
        ^ (((tok & 0xFFFFFFFF) * 0x165667B19E3779F9) & M64)
    return h >> (64 - GHOST_BITS)


def ident(n) -> tuple:
    return (n.id, n.gen)


class AdaptiveModel:
    """The documented rules of lru_policy="adaptive" (docs/adaptive.md)."""

    def __init__(self, tree, costs: dict | None = None, window: int = 1024) -> None:
        self.tree = tree
        self.costs = costs
        self.window = window
        self.w = [1 / 3, 1 / 3, 1 / 3]
        self.clock = 0
        self.doubt: dict = {}     # identity -> (mask, time)
        self.gown: dict = {}      # identity -> (mask, time): own state evicted, tombstone kept
        self.table: dict = {}     # slot -> (id, gen, tok, mask, time)
        self.used: dict = {}      # identity -> kid_used
        self.wasted: dict = {}    # identity -> kid_wasted
        self.reused: set = set()
        self.ghost_hits = self.doubt_hits = self.probation = 0
        self.choices = [0, 0, 0]

    # -- the orders -------------------------------------------------------
    def eff(self, n) -> float:
        a, span = n.parent, len(n.key)
        while not a.is_root and a.state is None:
            span += len(a.key)
            a = a.parent
        if not self.costs:
            return float(span)
        c = self.costs
        start = 0 if a.is_root else a.prefix_len
        flops = c["flops_per_token"] * span + c["attn_flops_per_pos"] * (start + n.prefix_len - 1.0) * span / 2.0
        return flops / (c["state_bytes"] if c["state_bytes"] > 0 else 1.0)

    def picks(self) -> list:
        order = self.tree.lru_order("mamba")                  # most recent first
        lru_first = [n for n in reversed(order) if n.can_evict_state][:self.window]
        if not lru_first:
            return [None, None, None]
        effs = [self.eff(n) for n in lru_first]
        value = lru_first[min(range(len(effs)), key=lambda i: (effs[i], i))]
        mru = next(n for n in order if n.can_evict_state)
        return [lru_first[0], mru, value]

    def victim(self):
        v = self.picks()
        lead = max(range(3), key=lambda e: (self.w[e], -e))
        x = v[lead]
        mask = 0
        if x is not None:
            self.choices[lead] += 1
            for e in range(3):
                if v[e] == x:
                    mask |= 1 << e
                elif v[e] is not None:
                    m, _ = self.doubt.get(ident(v[e]), (0, 0))
                    self.doubt[ident(v[e])] = (m | (1 << e), self.clock)
        return x, mask

    # -- learning ---------------------------------------------------------
    def penalize(self, mask: int, age: int) -> None:
        if mask in (0, 7):
            return
        states = float(self.tree.total_size()[1])
        loss = states / (states + float(age)) if states > 0.0 else 0.0
        s = 0.0
        for e in range(3):
            if mask & (1 << e):
                self.w[e] *= 1.0 - loss / 2.0
            s += self.w[e]
        self.w = [max(x / s, FLOOR) for x in self.w]

    def on_match(self, key: list, m) -> None:
        best, kv = m.node, m.kv_node
        if not best.is_root and ident(best) not in self.reused:
            self.reused.add(ident(best))
            p = ident(best.parent)
            self.used[p] = self.used.get(p, 0) + 1
        hit = False
        if m.kv_matched_len < len(key):
            tok = key[m.kv_matched_len]
            e = self.table.get(ghost_slot(kv.id, kv.gen, tok))
            if e is not None and e[:3] == (kv.id, kv.gen, tok):
                hit = True
                self.ghost_hits += 1
                self.used[ident(kv)] = self.used.get(ident(kv), 0) + 1
                self.penalize(e[3], self.clock - e[4])
                del self.table[ghost_slot(kv.id, kv.gen, tok)]
        if not hit:
            n = kv
            while n != best and not n.is_root:
                g = self.gown.pop(ident(n), None)
                if g is not None:
                    self.ghost_hits += 1
                    p = ident(n.parent)
                    self.used[p] = self.used.get(p, 0) + 1
                    self.penalize(g[0], self.clock - g[1])
                    break
                n = n.parent
        if not best.is_root and ident(best) in self.doubt:
            mask, t = self.doubt.pop(ident(best))
            self.doubt_hits += 1
            self.penalize(mask, self.clock - t)

    def admitted(self, node) -> bool:
        """A state was attached to node: True when on probation."""
        self.doubt.pop(ident(node), None)
        self.gown.pop(ident(node), None)
        self.reused.discard(ident(node))
        p = ident(node.parent)
        if self.wasted.get(p, 0) >= 2 * self.used.get(p, 0) + 2:
            self.probation += 1
            return True
        return False

    def evicted(self, x, mask: int, path: list) -> None:
        """x's state was evicted; path: (node, first token) of x and its
        ancestors as they were before, root excluded."""
        was_reused = ident(x) in self.reused
        self.reused.discard(ident(x))
        self.doubt.pop(ident(x), None)
        if not was_reused:
            parent = path[1][0] if len(path) > 1 else self.tree.root
            self.wasted[ident(parent)] = self.wasted.get(ident(parent), 0) + 1
        if x.valid:                                          # internal: a tombstone
            self.gown[ident(x)] = (mask, self.clock)
        else:                                                # the leaf and its tombstone chain went
            gone = [n for n, _ in path if not n.valid]
            up = path[len(gone)][0] if len(gone) < len(path) else self.tree.root
            tok = path[len(gone) - 1][1]
            self.table[ghost_slot(up.id, up.gen, tok)] = (up.id, up.gen, tok, mask, self.clock)
        self.clock += 1

    def check(self) -> None:
        s = self.tree.policy_stats()
        assert list(s["adaptive_weights"]) == self.w
        assert list(s["adaptive_choices"]) == self.choices
        assert (s["ghost_hits"], s["doubt_hits"], s["admissions_probation"]) == \
            (self.ghost_hits, self.doubt_hits, self.probation)


def _path(n) -> list:
    """(node, first token) of n and its ancestors, root excluded: read before
    an eviction may remove them."""
    out = []
    while not n.is_root:
        out.append((n, int(n.key[0])))
        n = n.parent
    return out


def _run(seed: int, steps: int, costs: dict | None, window: int = 1024, cap: int = 10) -> AdaptiveModel:
    rng = random.Random(seed)
    opts = dict(costs or {}, evict_window=window)
    tree = mambaradix.RadixTree(page_size=1, chunk_size=4, lru_policy="adaptive", policy_options=opts)
    model = AdaptiveModel(tree, costs, window)
    bases = [[rng.randint(1, 6) for _ in range(rng.randint(6, 40))] for _ in range(5)]
    locked: list = []
    slot = 1
    for step in range(steps):
        b = rng.choice(bases)
        key = b[:rng.randint(1, len(b))] + [rng.randint(1, 6) for _ in range(rng.choice((0, 0, 3, 10)))]
        r = rng.random()
        if r < 0.4:
            res = tree.insert(key, list(range(len(key))), slot)
            slot += 1
            if not res.state_existed:
                order = tree.lru_order("mamba")
                if model.admitted(res.node):
                    assert order[-1] == res.node, step
                else:
                    assert order[0] == res.node, step
        elif r < 0.65:
            m = tree.match_prefix(key)
            model.on_match(key, m)
        elif r < 0.7:
            m = tree.match_prefix(key)
            model.on_match(key, m)
            if not m.node.is_root:
                tree.inc_lock_ref(m.node)
                locked.append(m.node)
        elif r < 0.75 and locked:
            tree.dec_lock_ref(locked.pop(rng.randrange(len(locked))))
        elif r < 0.78:
            tree.evict_full(rng.randint(1, 8))               # KV victims: no ghosts
        while tree.total_size()[1] > cap:
            x, mask = model.victim()
            if x is None:
                break
            want, path = x.state, _path(x)
            got = tree.evict_mamba(1)
            assert got.state_slots.tolist() == [want], step
            model.evicted(x, mask, path)
        tree.sanity_check()
        model.check()
    return model


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_adaptive_matches_the_model_step_by_step(seed: int) -> None:
    m = _run(seed, 1500, None)
    # every mechanism ran: each order led, both kinds of evidence, probation
    assert m.ghost_hits > 20 and m.doubt_hits > 20 and m.probation > 0
    assert sum(c > 0 for c in m.choices) >= 2


def test_adaptive_matches_the_model_with_costs_and_a_window() -> None:
    costs = {"flops_per_token": 3.0, "attn_flops_per_pos": 0.5, "state_bytes": 40.0, "kv_bytes_per_token": 1.0}
    m = _run(7, 1200, costs, window=3)
    assert m.ghost_hits > 10 and m.doubt_hits > 10


def test_adaptive_keeps_the_invariants_under_random_ops() -> None:
    """Random operations of every kind, both semantics, page size 2: the tree
    invariants hold after each, and the weights stay a floored distribution."""
    rng = random.Random(5)
    for sem in ("v0.5.15", "v0.5.23"):
        tree = mambaradix.RadixTree(page_size=2, chunk_size=4, lru_policy="adaptive", semantics=sem)
        locked: list = []

        def lock(key):
            m = tree.match_prefix(key)
            if not m.node.is_root:
                tree.inc_lock_ref(m.node)
                locked.append(m.node)

        def unlock(_key):
            n = locked.pop(rng.randrange(len(locked))) if locked else None
            if n is not None and n.valid:
                tree.dec_lock_ref(n)

        ops = {
            lambda k, i: tree.insert(k, list(range(len(k))), i + 1): 40,
            lambda k, i: tree.match_prefix(k): 20,
            lambda k, i: lock(k): 8,
            lambda k, i: unlock(k): 7,
            lambda k, i: tree.evict_mamba(rng.randint(1, 3)): 15,
            lambda k, i: tree.evict_full(rng.randint(1, 10)): 10,
        }
        for i in range(1500):
            key = [rng.randint(1, 4) for _ in range(2 * rng.randint(1, 12))]
            rng.choices(list(ops), weights=list(ops.values()))[0](key, i)
            tree.sanity_check()
        s = tree.policy_stats()
        assert abs(sum(s["adaptive_weights"]) - 1.0) < 0.05 and min(s["adaptive_weights"]) >= FLOOR
        assert s["ghost_hits"] + s["doubt_hits"] > 0
        tree.reset()
        assert tree.policy_stats()["adaptive_weights"] == (1 / 3, 1 / 3, 1 / 3)


def test_adaptive_stays_lru_where_lru_is_right() -> None:
    """Each key is reused once soon after its insert (a chat's next turn):
    LRU keeps exactly those, and the adaptive policy hits as often."""
    rng = random.Random(4)
    trees = [mambaradix.RadixTree(page_size=1, lru_policy=p) for p in ("consumed", "adaptive")]
    hits = [0, 0]
    keys = [[5000 + i] + [rng.randint(1, 50) for _ in range(12)] for i in range(400)]
    for i, k in enumerate(keys):
        for j, t in enumerate(trees):
            t.insert(k, list(range(len(k))), i + 1)
            if i >= 2:
                hits[j] += t.match_prefix(keys[i - 2] + [1]).state is not None
            extra = t.total_size()[1] - 4
            if extra > 0:
                t.evict_mamba(extra)
    assert hits[0] > 300
    assert hits[1] >= hits[0] - 2


def test_adaptive_name_is_accepted_by_the_trees() -> None:
    assert mambaradix.RadixTree(lru_policy="adaptive").lru_policy == "adaptive"
    lc = _C.Lifecycle(lru_policy="adaptive")
    assert lc is not None
    with pytest.raises(ValueError, match="adaptive"):
        mambaradix.RadixTree(lru_policy="adaptiv")
    with pytest.raises(ValueError, match="unknown keys"):
        mambaradix.RadixTree(lru_policy="adaptive", policy_options={"ghosts": 1})
