"""The adaptive policy's snapshot placement against a pure-Python model.

The model keeps the tree as the set of its page-aligned key prefixes (the
KV), the prefixes that end at a state, and the branches the inserts began
(where each parted from the tree), and applies the documented rule
(docs/adaptive.md, "Snapshot placement"; csrc/core/radix.c, "Adaptive
placement"): per match, a predicted junction where the match has none past
its state (or, failing one, the end snapshot moved up for requests that part
a little above states: end-relative placement), then the match's own
observation.  Random inserts and matches of shared-prefix keys run on both,
with no eviction; after every match the branching length and the placement
counts must agree.
"""

from __future__ import annotations

import random

import pytest

import mambaradix
from mambaradix import _C

PB = 512          # depth buckets
MARGIN = 4
WINDOW = 4096     # observations between halvings
NB = 64           # end-relative buckets: partings up to NB steps above a state
NEAR_MIN = 2      # partings seen before an end snapshot moves for them


class PlaceModel:
    def __init__(self, page: int, chunk: int, chunked_prefill: int = 0) -> None:
        self.page, self.chunk, self.step = page, chunk, max(page, chunk)
        self.chunked_prefill = chunked_prefill   # the scheduler's budget (0: none)
        self.refused = 0                         # predictions a chunked extend ruled out
        self.kv: set = {()}
        self.kids: dict = {}        # prefix -> next pages below it
        self.states: set = set()
        self.heads: dict = {}       # first page of a branch -> [top, shared (1 + bucket, 0: none), continued,
        #                             ended at the junction predicted where it began]
        self.placed_at: dict = {}   # prefix -> the junction the last placement there predicted
        self.x: dict = {}           # prefix -> [branches begun there and parted from, and continued]
        self.hist = [0] * PB
        self.near = [0] * NB        # partings r steps above the first state below them, by r // step
        self.ends = 0               # branches continued past their whole path
        self.events = 0
        self.halvings = 0
        self.placed = 0
        self.placed_end = 0

    def _walk(self, key: list) -> int:
        L, P = len(key) // self.page * self.page, self.page
        k = 0
        while k < L and tuple(key[:k + P]) in self.kv:
            k += P
        return k

    def insert(self, key: list) -> None:
        L, P = len(key) // self.page * self.page, self.page
        k = self._walk(key)
        if k < L:
            self.heads[tuple(key[:k + P])] = [k, 0, False, self.placed_at.get(tuple(key[:k])) == L]
            for i in range(k, L, P):
                self.kids.setdefault(tuple(key[:i]), set()).add(tuple(key[i:i + P]))
                self.kv.add(tuple(key[:i + P]))
        if L > 0:
            self.states.add(tuple(key[:L]))

    def _head(self, key: list, k: int) -> list:
        for t in range(k - self.page, -1, -self.page):
            h = self.heads.get(tuple(key[:t + self.page]))
            if h is not None and h[0] == t:
                return h
        raise AssertionError("no branch")

    def _place(self, s: int, k: int, L: int, key: list) -> int:
        step = self.step
        xs = self.x.get(tuple(key[:k]), [0, 0])
        if s % step or xs[0] == 0:
            return 0
        s0, e = s // step, L // step
        if e < s0 + 2:
            return 0
        if self.chunked_prefill and len(key) - s > self.chunked_prefill:
            self.refused += 1       # several extends: the junction would take a chunk end's place
            return 0
        sg = [0] * (PB + 1)
        for b in range(PB - 1, -1, -1):
            sg[b] = sg[b + 1] + self.hist[b]
        a, c = xs[0], xs[1] + 1

        def bucket(p: int) -> int:
            return -(-(p - k) // step)

        ge = (c * sg[0] + a * sg[min(bucket(e * step), PB - 1)]) * (e - s0)
        best, gbest = 0, 0
        for j in range(s0 + 1, e):
            xb = bucket(j * step)
            if xb >= PB - 1:
                break
            g = a * sg[xb] * (j - s0)
            if g > gbest:
                best, gbest = j, g
        if best == 0 or gbest <= MARGIN * ge:
            return 0
        return best * step

    def _place_end(self, s: int, k: int, L: int) -> int:
        step = self.step
        if s % step:
            return 0
        s0, e = s // step, L // step
        n = best = gbest = 0
        j = 1
        while j < NB and e > s0 + j + 1 and (e - j) * step > k:
            n += self.near[j - 1]
            gain, cost = n * (e - j - s0), MARGIN * self.ends * j
            if n >= NEAR_MIN and gain > cost and gain - cost > gbest:
                best, gbest = j, gain - cost
            j += 1
        return (e - best) * step if best else 0

    def _observe_end(self, key: list, k: int, head: list) -> None:
        """A parting at k, the branch's first: the first state below it on the
        tree's unbranched path, r tokens down, counts (in bucket ceil(r / step)
        - 1: a snapshot that many steps and one up serves it) when r < k - top
        and r <= NB steps."""
        path, top = tuple(key[:k]), head[0]
        if len(self.kids.get(path, ())) != 1 or k <= top or head[1] != 0:
            return
        reach, r = NB * self.step, 0
        while len(self.kids.get(path, ())) == 1:
            path += next(iter(self.kids[path]))
            r += self.page
            if path in self.states:
                if r < k - top and r <= reach:
                    self.near[(r - 1) // self.step] += 1
                return
            if r >= reach:
                return

    def _observe(self, key: list, k: int) -> None:
        if k > 0:
            h = self._head(key, k)
            self._observe_end(key, k, h)
            X = self.x.setdefault(tuple(key[:h[0]]), [0, 0])
            if self.kids.get(tuple(key[:k])) or h[3]:
                rb = min((k - h[0]) // self.step, PB - 1)
                if h[1] == 0:
                    X[0] += 1
                if h[1] < rb + 1:
                    if h[1] > 0 and self.hist[h[1] - 1] > 0:
                        self.hist[h[1] - 1] -= 1
                    self.hist[rb] += 1
                    h[1] = rb + 1
            elif not h[2]:
                h[2] = True
                X[1] += 1
                self.ends += 1
        self.events += 1
        if self.events >= WINDOW:
            self.hist = [v >> 1 for v in self.hist]
            self.near = [v >> 1 for v in self.near]
            self.ends >>= 1
            self.events = 0
            self.halvings += 1

    def match(self, key: list) -> tuple:
        """(branching_seqlen or None, kv_matched_len, prefix_len)."""
        L = len(key) // self.page * self.page
        k = self._walk(key)
        s = max((i for i in range(0, k + 1, self.page) if i > 0 and tuple(key[:i]) in self.states), default=0)
        br = None
        if k > s and k // self.chunk * self.chunk > 0:
            br = k // self.chunk * self.chunk
        if k < L:
            if br is None or br <= s:
                p = self._place(s, k, L, key)
                if not p:
                    p = self._place_end(s, k, L)
                    self.placed_end += p > 0
                if p:
                    br = p
                    self.placed += 1
                    self.placed_at[tuple(key[:k])] = p
            self._observe(key, k)
        return br, k, s


def _keys(rng: random.Random, page: int, chunk: int, steps: int, cuts: bool = False):
    """Shared-prefix traffic: groups of a system prompt (2-5 steps) under the
    root or under one of a few tenant prefixes (a state at a whole number of
    steps, then a shared header of fewer pages than a step, so that a match
    ends past its state off the step grid), requests under a group, some
    next turns of a group's later request, some keys of no group.  cuts:
    also keys that part from a group's prompt midway (another version of
    it), which split the branches predicted junctions ended."""
    groups: list = []
    done: list = []
    step = max(page, chunk)
    tok = 1000

    def fresh(n: int) -> list:
        nonlocal tok
        tok += n
        return list(range(tok - n, tok))

    tenants: list = [[]]
    for _ in range(3):
        base = fresh(step * rng.randint(1, 3))
        yield base                                         # leaves a state at the base
        tenants.append(base + fresh(page * rng.randint(0, step // page - 1)))
    for _ in range(steps):
        r = rng.random()
        if r < 0.15 or not groups:
            groups.append(rng.choice(tenants) + fresh(step * rng.randint(2, 5)))
            yield groups[-1] + fresh(page * rng.randint(1, 10))   # a group's first: not continued
            continue
        elif r < 0.8:
            key = rng.choice(groups[-6:]) + fresh(page * rng.randint(1, 10))
        elif cuts and r < 0.87:
            g = rng.choice(groups[-6:])
            key = g[:page * rng.randint(1, len(g) // page - 1)] + fresh(page * rng.randint(1, 10))
        elif r < 0.95 and done:
            key = rng.choice(done[-20:]) + fresh(page * rng.randint(1, 6))
        else:
            yield fresh(page * rng.randint(1, 20))      # no group, never continued
            continue
        yield key
        done.append(key)


@pytest.mark.parametrize("page,chunk,seed,steps,cuts,cps", [
    (1, 4, 1, 1500, False, 0), (1, 4, 2, 1500, False, 0), (1, 8, 3, 1500, False, 0), (16, 16, 8, 1500, False, 0),
    (16, 32, 5, 1500, False, 0), (4, 2, 6, 1500, False, 0), (1, 4, 9, 5000, False, 0), (1, 4, 11, 2000, True, 0),
    (16, 16, 14, 2000, True, 0), (4, 8, 13, 2000, True, 0), (1, 4, 21, 1500, False, 27),
    (16, 16, 22, 2000, True, 140)])
def test_placement_matches_the_model_step_by_step(page: int, chunk: int, seed: int, steps: int, cuts: bool,
                                                  cps: int) -> None:
    """The long run passes the first halvings of the evidence; with cuts, splits move a branch's head;
    cps: a chunked prefill budget, which rules out the predictions for longer extends."""
    rng = random.Random(seed)
    tree = mambaradix.RadixTree(page_size=page, chunk_size=chunk, lru_policy="adaptive",
                                policy_options={"chunked_prefill_size": cps})
    model = PlaceModel(page, chunk, cps)
    slot = 1
    placed_seen = warm = off_grid = 0
    for i, key in enumerate(_keys(rng, page, chunk, steps, cuts)):
        for _ in range(rng.choice((1, 1, 2))):           # a scheduler may match a waiting request again
            m = tree.match_prefix(key)
            want = model.match(key)
            assert (m.branching_seqlen, m.kv_matched_len, len(m.indices)) == want, (i, key)
            stats = tree.policy_stats()
            assert (stats["placements"], stats["end_placements"]) == (model.placed, model.placed_end), i
        br, k, s = want
        if br is not None and br > k:
            placed_seen += 1
            warm += s > 0
            off_grid += k % max(page, chunk) != 0
            # the predicted junction is where SGLang's branching rule snapshots
            assert br % chunk == 0 and br % page == 0 and (br - s) % chunk == 0 and s < br < len(key)
            pt = _C.prefill_track_point(s, len(key) + 1 - s, chunk, br)
            assert pt == br
            tree.insert(key[:br], list(range(br)), slot)
            model.insert(key[:br])
            slot += 1
        if rng.random() < (0.5 if cuts else 0.8):   # (a predicted junction's branch left a leaf more often)
            tree.insert(key, list(range(len(key))), slot)
            model.insert(key)
            slot += 1
        tree.sanity_check()
    assert placed_seen >= 5 and model.placed >= 5 and model.halvings >= (steps > 3000)
    assert (model.refused >= 5) == (cps > 0)
    assert warm > 0 and (off_grid > 0 or page > 1)     # a state above; a KV match off the step grid


def test_placement_is_the_adaptive_policy_only() -> None:
    """The same traffic under every other policy: no branching length past
    the KV match, the placement count stays 0."""
    for policy in ("sglang", "consumed", "utility", "lfu", "mru", "slru", "tlru"):
        rng = random.Random(1)
        tree = mambaradix.RadixTree(page_size=1, chunk_size=4, lru_policy=policy)
        for i, key in enumerate(_keys(rng, 1, 4, 400)):
            m = tree.match_prefix(key)
            assert m.branching_seqlen is None or m.branching_seqlen <= m.kv_matched_len
            tree.insert(key, list(range(len(key))), i + 1)
        assert tree.policy_stats()["placements"] == 0


def test_reset_forgets_the_placement_evidence() -> None:
    rng = random.Random(2)
    tree = mambaradix.RadixTree(page_size=1, chunk_size=4, lru_policy="adaptive")
    keys = list(_keys(rng, 1, 4, 500))
    for i, key in enumerate(keys):
        tree.match_prefix(key)
        tree.insert(key, list(range(len(key))), i + 1)
    assert tree.policy_stats()["placements"] > 0
    tree.reset()
    model = PlaceModel(1, 4)
    for i, key in enumerate(keys[:200]):
        m = tree.match_prefix(key)
        assert m.branching_seqlen == model.match(key)[0], i
        tree.insert(key, list(range(len(key))), i + 1)
        model.insert(key)


@pytest.mark.parametrize("page,chunk", [(1, 4), (16, 16), (4, 8)])
def test_an_unused_junction_leaves_the_prefill_snapshot_at_its_end(page: int, chunk: int) -> None:
    """A prompt's KV match goes past its state to a document's end, where a
    state was cached and evicted before any match used it.  SGLang's rule
    would take its prefill's snapshot there; the end snapshot spares more
    than 4 times as much, so the match gives no branching length and the
    prefill snapshots at its extend's last chunk boundary (toy cases in
    test_adaptive_rules.py).  Had a match used the junction's state, the
    junction stays, as it does for a prompt ending close below it."""
    step = max(page, chunk)
    inst, doc = list(range(1, 2 * step + 1)), list(range(500, 500 + 2 * step))
    for used in (False, True):
        tree = mambaradix.RadixTree(page_size=page, chunk_size=chunk, lru_policy="adaptive")
        tree.insert(inst, list(range(len(inst))), 1)
        first = inst + doc + list(range(900, 900 + 12 * step))
        tree.insert(first, list(range(len(first))), 2)
        held = tree.match_prefix(inst + doc + [7] * step).node      # a request runs from the instruction's state
        tree.inc_lock_ref(held)
        tree.insert(inst + doc, list(range(len(inst + doc))), 3)   # the junction SGLang's rule snapshots
        if used:
            assert tree.match_prefix(inst + doc + [8] * step).node.state == 3
        assert tree.evict_mamba(1).state_slots.tolist() == [3]
        key = inst + doc + list(range(2000, 2000 + 10 * step + page))
        m = tree.match_prefix(key)
        s, j = len(inst), len(inst + doc)
        assert (len(m.indices), m.kv_matched_len) == (s, j)
        assert m.node.state == 1 and m.branching_seqlen == (j if used else None)
        point = _C.prefill_track_point(s, len(key) + 1 - s, chunk, m.branching_seqlen)
        assert point == (j if used else s + (len(key) + 1 - s) // chunk * chunk)
        near = inst + doc + list(range(3000, 3000 + 2 * step))       # its end spares 2 steps more, not 8
        assert tree.match_prefix(near).branching_seqlen == j
