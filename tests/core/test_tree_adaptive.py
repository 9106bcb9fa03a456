"""The adaptive state policy against a pure-Python model of its decisions.

The model reads the tree only through the public node API (the state list's
order, locks, keys, children, node ids) and keeps the policy's own memory
itself: each state's uses and priority (GreedyDual-Size-Frequency: the
inflation L when its uses were set plus uses times the prefill the state
spares as the tree stands at the eviction, at most what it spared then),
L, the
supersession of a state by a new one below it on an unbranched path, the
ghosts of evicted states (on a tombstone, or in the direct-mapped table under
the ancestor that survived a removed leaf), the per-node counts of used and
wasted child states that decide a handover, the tree's counts of matches
that found a ghost or a state, which decide a probation admission, and its
counts of ghost hits on the upper and the lower state of a supersession,
which decide whether a state no match used hands its value over.  Random inserts,
matches, locks and evictions run on both; after every step the victim, L, the
counters and the admitted state's place in the state list must agree.
"""

from __future__ import annotations

import random

import pytest

import mambaradix
from mambaradix import _C

GHOST_BITS = 13
THRASH_WINDOW = 4096
PAIR_WINDOW = 256
UPPER, LOWER, PLAIN = "upper", "lower", "plain"
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
        self.L = 0.0
        self.uses: dict = {}      # identity -> uses of its state (f)
        self.base: dict = {}      # identity -> L when its uses were last set
        self.prob: set = set()    # identities admitted on probation, not used since
        self.cap: dict = {}       # identity -> its value when its uses were last set
        self.floor: dict = {}     # identity -> the least its value counts (handed over at supersession)
        self.gown: dict = {}      # identity whose own state was evicted, tombstone kept -> ghost kind
        self.past: dict = {}      # such a tombstone's identity -> the evicted state's uses
        self.table: dict = {}     # slot -> (id, gen, tok, ghost kind)
        self.used: dict = {}      # identity -> kid_used
        self.wasted: dict = {}    # identity -> kid_wasted
        self.reused: set = set()
        self.forked: set = set()  # identities that have had two children at once
        self.ghost_hits = self.probation = self.superseded = self.restored = self.handed = 0
        self.wanted = self.found = 0   # recent matches that found a ghost / used a state and found none
        self.parted = self.continued = 0   # recent ghost hits of an upper / a lower state (ghost_kind)
        self.pair_halvings = self.handed_unused = self.kept_unused = 0
        self.halvings = 0
        self.held = 0   # handovers another request's lock kept from happening

    # -- the value of a state ---------------------------------------------
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

    def victim(self):
        order = self.tree.lru_order("mamba")                  # most recent first
        lru_first = [n for n in reversed(order) if n.can_evict_state][:self.window]
        if not lru_first:
            return None
        x = min(lru_first, key=self.prio)                   # min keeps the first of equals
        self.L = max(self.L, self.prio(x))
        return x

    def prio(self, n) -> float:
        """h = L0 + f * v, v the value as the tree stands now, at most its
        value when f was last set, at least the value a used state it
        superseded handed it (on probation: L0)."""
        i = ident(n)
        if i in self.prob:
            return self.base[i]
        return self.base[i] + self.uses[i] * max(min(self.eff(n), self.cap[i]), self.floor.get(i, 0.0))

    # -- what a match, an admission and an eviction change ------------------
    def above_superseded(self, node):
        """The state node supersedes: the nearest state above it when neither
        it nor any node between them ever had two children at once."""
        a, branched = node.parent, False
        while not a.is_root and a.state is None:
            branched |= ident(a) in self.forked
            a = a.parent
        return None if a.is_root or branched or ident(a) in self.forked else a

    def ghost_kind(self, x) -> str:
        """Before x's state is evicted: UPPER when a state below it, on a
        path of single children that never had two, supersedes it; LOWER
        when it supersedes one above; PLAIN otherwise."""
        c = x
        while len(list(c.children)) == 1 and ident(c) not in self.forked:
            c = list(c.children)[0]
            if c.state is not None:
                return UPPER
        return LOWER if self.above_superseded(x) is not None else PLAIN

    def ghost_hit(self, kind: str) -> None:
        self.ghost_hits += 1
        self.wanted += 1
        self.parted += kind == UPPER
        self.continued += kind == LOWER
        if self.parted + self.continued >= PAIR_WINDOW:
            self.parted //= 2
            self.continued //= 2
            self.pair_halvings += 1

    def on_match(self, key: list, m) -> None:
        best, kv = m.node, m.kv_node
        if not best.is_root:
            i = ident(best)
            self.uses[i] += 1
            self.base[i] = self.L
            self.cap[i] = self.eff(best)
            self.prob.discard(i)
            if i not in self.reused:
                self.reused.add(i)
                p = ident(best.parent)
                self.used[p] = self.used.get(p, 0) + 1
        if self.wanted + self.found >= THRASH_WINDOW:
            self.wanted //= 2
            self.found //= 2
            self.halvings += 1
        if m.kv_matched_len < len(key):
            tok = key[m.kv_matched_len]
            slot = ghost_slot(kv.id, kv.gen, tok)
            if self.table.get(slot, ())[:3] == (kv.id, kv.gen, tok):
                self.ghost_hit(self.table.pop(slot)[3])
                self.used[ident(kv)] = self.used.get(ident(kv), 0) + 1
                return
        n = kv
        while n != best and not n.is_root:
            if ident(n) in self.gown:
                self.ghost_hit(self.gown.pop(ident(n)))
                p = ident(n.parent)
                self.used[p] = self.used.get(p, 0) + 1
                return
            n = n.parent
        self.found += not best.is_root

    def see_forks(self) -> None:
        """Nodes with two children now (only an insert adds children: called after each)."""
        todo = [self.tree.root]
        while todo:
            n = todo.pop()
            kids = list(n.children)
            if len(kids) > 1:
                self.forked.add(ident(n))
            todo.extend(kids)

    def admitted(self, node) -> bool:
        """A state was attached to node: True when on probation."""
        i = ident(node)
        self.gown.pop(i, None)
        self.reused.discard(i)
        self.see_forks()
        a = self.above_superseded(node)
        self.floor.pop(i, None)
        handed = None
        supersedes = a is not None
        if supersedes:
            ia = ident(a)
            first = not self.used.get(ia, 0) and not self.wasted.get(ia, 0)
            self.held += ia in self.reused and first and a.full_lock_ref > 1
            # requests continue past superseded states more than they part
            # above the states that superseded them
            past = self.continued >= 2 * self.parted + 4
            self.kept_unused += ia not in self.reused and not past
            if (a.full_lock_ref <= 1 and first) if ia in self.reused else past:
                # a used state that no other request runs from, with no state
                # below it before (or, while requests go on past, one no match
                # used) hands the new one its value (as it counts now)
                self.handed_unused += ia not in self.reused
                self.floor[i] = max(min(self.eff(a), self.cap[ia]), self.floor.get(ia, 0.0))
                handed = ia
            self.uses[ia] = 1
            self.base[ia] = self.L
            self.prob.discard(ia)
            self.cap[ia] = self.eff(a)
            self.superseded += 1
        self.uses[i] = max(1, self.past.pop(i, 1))   # a tombstone's: the evicted state's uses
        self.restored += self.uses[i] > 1
        self.base[i] = self.L
        self.cap[i] = self.eff(node)
        self.prob.discard(i)
        if handed is not None:
            # and counts at most the new state's own value until a match uses it
            self.floor.pop(handed, None)
            self.cap[handed] = min(self.cap[handed], self.cap[i])
            self.handed += 1
        # the pool thrashes (reuses find ghosts more than twice as often as
        # states): a state that supersedes nothing goes first unless used
        if not supersedes and self.wanted >= 2 * self.found + 2:
            self.probation += 1
            self.prob.add(i)
            return True
        return False

    def evicted(self, x, path: list, kind: str) -> None:
        """x's state was evicted; path: (node, first token) of x and its
        ancestors as they were before, root excluded; kind: its ghost_kind
        before."""
        was_reused = ident(x) in self.reused
        self.reused.discard(ident(x))
        uses = self.uses.pop(ident(x))
        del self.base[ident(x)]
        self.prob.discard(ident(x))
        del self.cap[ident(x)]
        self.floor.pop(ident(x), None)
        if not was_reused:
            parent = path[1][0] if len(path) > 1 else self.tree.root
            self.wasted[ident(parent)] = self.wasted.get(ident(parent), 0) + 1
        if x.valid:                                          # internal: a tombstone
            self.gown[ident(x)] = kind
            self.past[ident(x)] = uses
        else:                                                # the leaf and its tombstone chain went
            gone = [n for n, _ in path if not n.valid]
            up = path[len(gone)][0] if len(gone) < len(path) else self.tree.root
            tok = path[len(gone) - 1][1]
            self.table[ghost_slot(up.id, up.gen, tok)] = (up.id, up.gen, tok, kind)

    def check(self) -> None:
        s = self.tree.policy_stats()
        assert s["adaptive_inflation"] == self.L
        assert (s["ghost_hits"], s["states_superseded"], s["admissions_probation"], s["unused_handovers"]) == \
            (self.ghost_hits, self.superseded, self.probation, self.handed_unused)


def _path(n) -> list:
    """(node, first token) of n and its ancestors, root excluded: read before
    an eviction may remove them."""
    out = []
    while not n.is_root:
        out.append((n, int(n.key[0])))
        n = n.parent
    return out


def _run(seed: int, steps: int, costs: dict | None, window: int = 1024, cap: int = 10,
         locks: float = 0.05, cycle: int = 0, turns: int = 0) -> AdaptiveModel:
    """Random operations; with cycle, two of every three 300 steps are a cyclic
    reuse of that many keys (a match, then an insert one token deeper), more
    than the pool holds: the pool thrashes and its new states go on
    probation.  With turns, two of every three 300 steps are that many
    conversations taking turns: a match past the last turn's end, the
    prompt's state a few tokens deeper, then the answer's two tokens below
    it (a state no match used, superseded at once)."""
    rng = random.Random(seed)
    opts = dict(costs or {}, evict_window=window)
    tree = mambaradix.RadixTree(page_size=1, chunk_size=4, lru_policy="adaptive", policy_options=opts)
    model = AdaptiveModel(tree, costs, window)
    bases = [[rng.randint(1, 6) for _ in range(rng.randint(6, 40))] for _ in range(5)]
    ring = [[100 + i] + [rng.randint(1, 6) for _ in range(rng.randint(3, 12))] for i in range(cycle or turns)]
    locked: list = []
    slot = 1
    for step in range(steps):
        b = rng.choice(bases)
        key = b[:rng.randint(1, len(b))] + [rng.randint(1, 6) for _ in range(rng.choice((0, 0, 3, 10)))]
        r = rng.random()
        if cycle and (step // 300) % 3 != 0:
            j = step // 2 % cycle
            key = ring[j]
            r = 0.0 if step % 2 else 0.5                       # a match, then the insert
            if r == 0.0:
                key = key + [rng.randint(1, 6)]
                ring[j] = key
        elif turns and (step // 300) % 3 != 0:
            j, phase = step // 3 % turns, step % 3
            key = ring[j] + [rng.randint(1, 6) for _ in range(rng.randint(2, 6) if phase == 1 else phase)]
            if phase == 0:
                key = key + [7]                                # a match goes on past the last turn
                r = 0.5
            else:
                ring[j] = key                                  # the prompt's state, then the answer's
                r = 0.0
        if r < 0.4:
            res = tree.insert(key, list(range(len(key))), slot)
            slot += 1
            model.see_forks()
            if not res.state_existed:
                order = tree.lru_order("mamba")
                if model.admitted(res.node):
                    assert order[-1] == res.node, step
                else:
                    assert order[0] == res.node, step
        elif r < 0.65:
            m = tree.match_prefix(key)
            model.on_match(key, m)
        elif r < 0.65 + locks:
            m = tree.match_prefix(key)
            model.on_match(key, m)
            if not m.node.is_root:
                tree.inc_lock_ref(m.node)
                locked.append(m.node)
        elif r < 0.65 + 2 * locks and locked:
            tree.dec_lock_ref(locked.pop(rng.randrange(len(locked))))
        elif r < 0.68 + 2 * locks:
            tree.evict_full(rng.randint(1, 8))               # KV victims: no ghosts
        while tree.total_size()[1] > cap:
            x = model.victim()
            if x is None:
                break
            want, path, kind = x.state, _path(x), model.ghost_kind(x)
            got = tree.evict_mamba(1)
            assert got.state_slots.tolist() == [want], step
            model.evicted(x, path, kind)
        tree.sanity_check()
        model.check()
    return model


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_adaptive_matches_the_model_step_by_step(seed: int) -> None:
    m = _run(seed, 1500, None)
    # every mechanism ran: ghosts, supersession, states used more than once
    assert m.ghost_hits > 20 and m.superseded > 20 and m.restored > 0 and m.handed > 10
    assert max(m.uses.values()) > 2 and m.L > 0


@pytest.mark.parametrize("seed", [1, 2])
def test_adaptive_matches_the_model_when_the_pool_thrashes(seed: int) -> None:
    """Phases of cyclic reuse over more keys than the pool holds: matches
    find ghosts more than twice as often as states, and the new states that
    supersede nothing are admitted on probation (the model places each)."""
    m = _run(seed, 1500, None, cycle=24)
    assert m.probation > 100 and m.wanted > 2 * m.found + 2 and m.superseded > 20


def test_adaptive_thrash_counts_are_halved() -> None:
    """Past THRASH_WINDOW matches the two counts are halved: old evidence
    fades, as the model halves them."""
    m = _run(4, 12000, None, cycle=24)
    assert m.halvings >= 1 and m.probation > 500


@pytest.mark.parametrize("seed", [1, 2])
def test_adaptive_matches_the_model_when_requests_go_on_past_the_answers(seed: int) -> None:
    """Conversations whose next turn continues past the last answer's state:
    matches find the ghosts of evicted lower states of a supersession more
    than twice as often as upper ones, and the states no match used hand
    their value to the answer states below them (the model decides each)."""
    m = _run(seed, 3000, None, turns=12)
    assert m.handed_unused > 50 and m.kept_unused > 50 and m.continued >= 2 * m.parted + 4


def test_adaptive_pair_counts_are_halved() -> None:
    """Past PAIR_WINDOW ghost hits on either state of a supersession both
    counts are halved, as the model halves them."""
    m = _run(4, 20000, None, turns=6)
    assert m.pair_halvings >= 2 and m.handed_unused > 1000 and m.kept_unused > 20


def test_adaptive_matches_the_model_with_many_locks() -> None:
    """Locks held often: handovers that another request's lock holds back."""
    m = _run(14, 3000, None, locks=0.15)
    assert m.held > 5 and m.handed > 50


def test_adaptive_matches_the_model_with_costs_and_a_window() -> None:
    costs = {"flops_per_token": 3.0, "attn_flops_per_pos": 0.5, "state_bytes": 40.0, "kv_bytes_per_token": 1.0}
    m = _run(7, 1200, costs, window=3)
    assert m.ghost_hits > 10 and m.superseded > 10 and m.handed > 5


def test_adaptive_keeps_the_invariants_under_random_ops() -> None:
    """Random operations of every kind, both semantics, page size 2: the tree
    invariants hold after each, and the inflation only rises."""
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
        last = 0.0
        for i in range(1500):
            key = [rng.randint(1, 4) for _ in range(2 * rng.randint(1, 12))]
            rng.choices(list(ops), weights=list(ops.values()))[0](key, i)
            tree.sanity_check()
            L = tree.policy_stats()["adaptive_inflation"]
            assert L >= last
            last = L
        s = tree.policy_stats()
        assert s["ghost_hits"] > 0 and s["states_superseded"] > 0 and last > 0
        tree.reset()
        assert tree.policy_stats()["adaptive_inflation"] == 0.0


def test_adaptive_stays_lru_where_lru_is_right() -> None:
    """A chat: each conversation's next turn comes two turns of others later,
    reuses the state at the end of its last turn and caches its own below it.
    LRU keeps exactly the states about to be reused, and the adaptive policy
    (the used state superseded by the next turn's) hits as often."""
    rng = random.Random(4)
    trees = [mambaradix.RadixTree(page_size=1, lru_policy=p) for p in ("consumed", "adaptive")]
    hits = [0, 0]
    convs = [[5000 + i] + [rng.randint(1, 50) for _ in range(12)] for i in range(400)]
    turns = [[1] + [rng.randint(1, 50) for _ in range(8)] for _ in range(400)]
    for j, t in enumerate(trees):
        latest = []
        for i, k in enumerate(convs):
            if i >= 2:
                old = latest[i - 2]
                hits[j] += t.match_prefix(old + [1]).state is not None
                latest[i - 2] = old + turns[i]
                t.insert(latest[i - 2], list(range(len(latest[i - 2]))), 2 * i + 1)
            t.insert(k, list(range(len(k))), 2 * i + 2)
            latest.append(k)
            extra = t.total_size()[1] - 4
            if extra > 0:
                t.evict_mamba(extra)
    assert hits[0] > 390
    assert hits[1] >= hits[0] - 2


def test_adaptive_name_is_accepted_by_the_trees() -> None:
    assert mambaradix.RadixTree(lru_policy="adaptive").lru_policy == "adaptive"
    lc = _C.Lifecycle(lru_policy="adaptive")
    assert lc is not None
    with pytest.raises(ValueError, match="adaptive"):
        mambaradix.RadixTree(lru_policy="adaptiv")
    with pytest.raises(ValueError, match="unknown keys"):
        mambaradix.RadixTree(lru_policy="adaptive", policy_options={"ghosts": 1})
