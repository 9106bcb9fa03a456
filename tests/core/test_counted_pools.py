"""The Lifecycle's counted pools (``Lifecycle(counts=...)``): KV tokens,
state slots and request rows as counts the C lifecycle keeps, for the
simulator.

Reference: a pure-Python model of those pools over an uncounted tree-only
Lifecycle (``values=False``), which hands every free back to its caller:
the model frees what comes back (KV in whole pages), numbers the slots it
hands out with its own counter, evicts as SGLang's scheduler does
(``evict_from_tree_cache``: v0.5.15 all of the wanted tokens when short,
v0.5.23 the shortfall; the state headroom before ``alloc_req_slots``:
v0.5.15 three (lazy: two) slots a request, v0.5.23 the slots the requests
take) and evicts a state, keeping the matched node, before a slot is taken
from an empty pool.  The same random requests go through both; after every
step the free counts, the trees and the request records must agree."""

from __future__ import annotations

import random

import numpy as np
import pytest

from mambaradix import _C

SEEDS = (1, 5, 9)


def _lc(mode: str, page: int, sem: str, counts=None) -> _C.Lifecycle:
    return _C.Lifecycle(page_size=page, chunk_size=4 * page, extra_buffer=mode != "no_buffer",
                        lazy=mode == "lazy", track_buffer_size=1 if mode == "pp1" else 2,
                        track_interval=8 * page, semantics=sem, values=False, counts=counts)


class _Model:
    """Counted pools kept in Python over an uncounted Lifecycle."""

    def __init__(self, lc: _C.Lifecycle, kv: int, slots: int, rows: int, page: int, sem: str, lazy: bool,
                 victims=None) -> None:
        self.lc, self.page, self.v0523, self.lazy = lc, page, sem == "v0.5.23", lazy
        self.kv_total = kv // page * page
        self.kv_free, self.slots_free, self.rows_free = self.kv_total, slots, rows
        self.sid = 0
        self.donated = 0
        self.victims = victims          # a policy picking state victims (None: the tree's)
        self.view = lc.tree_view()

    def ceil(self, n: int) -> int:
        return -(-n // self.page) * self.page

    def evict_states(self, n: int, protect=None) -> None:
        if self.victims is None:
            _, _, kvf, stf = self.lc.evict(0, n, protect=protect)
            self.kv_free += len(kvf)
            self.slots_free += len(stf)
            return
        view = self.view
        for _ in range(n):
            v = self.victims(view, protect)
            if v is None:
                return
            r = view.evict_node_state(v)
            self.kv_free += r.tokens_evicted
            self.slots_free += r.states_evicted

    def slot(self, protect=None) -> int:
        if self.slots_free <= 0:
            self.evict_states(1, protect)
        if self.slots_free <= 0:
            raise RuntimeError("no slot")
        self.slots_free -= 1
        self.sid += 1
        return self.sid

    def kv(self, n: int) -> None:
        short = self.kv_free < n
        evict = (n - self.kv_free if self.v0523 else n) if short else 0
        if evict:
            _, _, kvf, stf = self.lc.evict(evict, 0)
            self.kv_free += len(kvf)
            self.slots_free += len(stf)
        if self.kv_free < n:
            raise RuntimeError("no KV")
        self.kv_free -= n

    def admit(self, rs) -> None:
        need = self.lc.admit(rs, self.sid + 1)[1]
        self.sid += need
        if self.rows_free < 1:
            raise RuntimeError("no row")
        wants = need if self.v0523 else (2 if self.lazy else 3)
        if self.slots_free < wants:
            self.evict_states(wants - self.slots_free)
        if self.slots_free < need:
            raise RuntimeError("no slots")
        self.slots_free -= need
        self.rows_free -= 1

    def frees(self, res, finished: bool, held: tuple, extra: bool) -> None:
        """A cache call's frees; a slot the request held before it that is
        neither freed nor in its record now is the tree's (donated; an
        unfinished no_buffer request's fork is a copy, not its own)."""
        rs, kvf, stf = (res[0], res[1], res[2]) if finished else (res[0], res[4], res[5])
        self.kv_free += self.ceil(len(kvf)) if finished else len(kvf)
        self.slots_free += len(stf)
        now = () if finished else (rs.running, rs.track0, rs.track1)
        if (finished or extra) and any(x > 0 and x not in stf.tolist() and x not in now for x in held):
            self.donated += 1


def _mru(view, protect):
    """A victim policy other than the tree's LRU: the most recently used
    evictable state."""
    for x in view.lru_order("mamba"):
        if x.can_evict_state and (protect is None or (x.id, x.gen) != protect):
            return x
    return None


def _drive(seed: int, mode: str, page: int, sem: str, policy) -> int:
    """Random requests through both; returns how many steps ran."""
    rng = random.Random(seed)
    kv, slots, rows = 90 * page, 14, 4
    lc = _lc(mode, page, sem, counts=(kv, slots, rows))
    ref = _lc(mode, page, sem)
    model = _Model(ref, kv, slots, rows, page, sem, mode == "lazy", policy)
    if policy is not None:
        view = lc.tree_view()
        def victims(protect):
            x = policy(view, protect)
            return None if x is None else (x.id, x.gen)
        lc.set_victims(victims)
    views = (lc.tree_view(), ref.tree_view())
    C = 4 * page
    stems = [[rng.randint(1, 6) for _ in range(rng.randint(C, 5 * C))] for _ in range(3)]
    live = []           # [rs_counted, rs_ref, tokens, committed, output_left]
    steps = 0

    def both(f, g):
        """f on the counted Lifecycle, g on the model: both succeed or both
        run out of room."""
        try:
            g()
        except RuntimeError:
            with pytest.raises(RuntimeError):
                f()
            return False
        f()
        return True

    def same() -> None:
        assert (lc.kv_free, lc.slots_free, lc.rows_free) == (model.kv_free, model.slots_free, model.rows_free)
        assert lc.counts()["donated"] == model.donated
        assert lc.sizes() == ref.sizes()
        for a, b, *_ in live:
            assert a.astuple() == b.astuple()
        lc.check()

    for _ in range(150):
        steps += 1
        if len(live) < 3 and rng.random() < 0.5:
            toks = np.array(rng.choice(stems) + [rng.randint(1, 6) for _ in range(rng.randint(1, 3 * C))],
                            np.int32)
            a, b = _C.ReqState(), _C.ReqState()
            nodes = []
            for x, l in ((a, lc), (b, ref)):
                m = views[l is ref].match_prefix(toks[:len(toks) - 1], indices=False)
                x.protected_len = m.node.prefix_len
                x.branching_seqlen = -1 if m.branching_seqlen is None else m.branching_seqlen
                nodes.append(m.node)
            assert (nodes[0].id, nodes[0].gen) == (nodes[1].id, nodes[1].gen)
            node = nodes[1]

            def ref_cow():
                if ref.cow(b, node.id, node.gen)[1]:
                    ref.cow(b, node.id, node.gen, model.slot((node.id, node.gen)))
            if not both(lambda: lc.cow(a, node.id, node.gen), ref_cow):
                break
            # the scheduler locks the matched node before the batch's admission
            for x, l in ((a, lc), (b, ref)):
                l.lock(node.id, node.gen)
                x.node_id, x.node_gen, x.locked = node.id, node.gen, 1
            if not both(lambda: (lc.take_admission(1, lc.admit(a)[1], 1)), lambda: model.admit(b)):
                break
            P = a.protected_len
            end = min(len(toks), P + rng.choice((C, 2 * C, len(toks))))
            if not both(lambda: lc.take_kv(model.ceil(end) - model.ceil(P)),
                        lambda: model.kv(model.ceil(end) - model.ceil(P))):
                break
            lc.prepare_extend(0, a, P, end - P)
            ref.prepare_extend(0, b, P, end - P)
            live.append([a, b, toks, end, rng.randint(1, 3 * C)])
        elif live:
            i = rng.randrange(len(live))
            a, b, toks, committed, left = live[i]
            if committed < len(toks) and rng.random() < 0.7:
                # the prompt's next chunk, after caching what was prefilled
                if ref.unfinished_cache_len(b, committed) >= 0:
                    def ref_unfinished():
                        held = (b.running, b.track0, b.track1)
                        res = ref.cache_unfinished(b, toks, committed, model.slot(), prefix=False)
                        model.frees(res, False, held, mode != "no_buffer")
                    if not both(lambda: lc.cache_unfinished(a, toks, committed, 0, prefix=False),
                                ref_unfinished):
                        break
                end = min(len(toks), committed + C)
                if not both(lambda: lc.take_kv(model.ceil(end) - model.ceil(committed)),
                            lambda: model.kv(model.ceil(end) - model.ceil(committed))):
                    break
                lc.prepare_extend(0, a, committed, end - committed)
                ref.prepare_extend(0, b, committed, end - committed)
                live[i][3] = end
            elif committed >= len(toks) and left > 0 and rng.random() < 0.8:
                # decode steps: a token each (a page when it starts one)
                for _ in range(rng.randint(1, 2 * C)):
                    if left == 0:
                        break
                    n = page if committed % page == 0 else 0
                    if not both(lambda: lc.take_kv(n), lambda: model.kv(n)):
                        return steps
                    seq = committed + 1

                    def ref_prepare():
                        if ref.decode_prepare(b, seq)[3]:
                            try:
                                ref.decode_prepare(b, seq, model.slot())
                            except RuntimeError:
                                pass        # it goes on without the borrowed slot
                    if not both(lambda: lc.decode_prepare(a, seq), ref_prepare):
                        return steps
                    left -= 1
                    lc.decode_finish(a, seq, left == 0)
                    model.slots_free += len(ref.decode_finish(b, seq, left == 0)[2])
                    committed = seq
                    toks = np.concatenate([toks, np.array([rng.randint(1, 6)], np.int32)])
                live[i][2:] = [toks, committed, left]
            else:
                # finish (or abort a request still in its prompt); under the
                # overlap scheduler a finished request has KV for one more token
                ins = rng.random() < 0.85
                alloc = committed + (rng.random() < 0.5)
                n = model.ceil(alloc) - model.ceil(committed)
                if not both(lambda: lc.take_kv(n), lambda: model.kv(n)):
                    break
                held = (b.running, b.track0, b.track1) if ins else ()
                model.frees(ref.cache_finished(b, toks, committed, is_insert=ins,
                                               state_available=model.slots_free), True, held, True)
                lc.cache_finished(a, toks, committed, is_insert=ins)
                lc.free_row(committed, alloc)
                model.kv_free += n
                model.rows_free += 1
                live.pop(i)
        same()
    _drive.last = lc.counts()
    return steps


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", ["pp2", "pp1", "lazy", "no_buffer"])
@pytest.mark.parametrize("sem", ["v0.5.15", "v0.5.23"])
def test_counted_pools_match_a_python_model(seed: int, mode: str, sem: str) -> None:
    page = 1 if mode == "no_buffer" else (1, 2, 4)[seed % 3]
    assert _drive(seed, mode, page, sem, None) >= 100


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", ["pp2", "lazy"])
def test_a_victim_policy_picks_every_state_eviction(seed: int, mode: str) -> None:
    """set_victims: the counted Lifecycle evicts the states a policy names
    (here the most recently used) wherever it evicts states: the model
    evicts the same policy's picks through the tree."""
    assert _drive(seed, mode, 1, "v0.5.15", _mru) >= 100


def _cached(lc: _C.Lifecycle, keys: list) -> None:
    """Caches each key as a finished request (no_buffer: its running slot
    with it), through the counted pools."""
    for k in keys:
        rs = _C.ReqState()
        lc.take_admission(1, lc.admit(rs)[1], 1)
        lc.take_kv(len(k))
        lc.cache_finished(rs, np.array(k, np.int32), len(k))
        lc.free_row(len(k), len(k))


@pytest.mark.parametrize("sem,free_after", [("v0.5.15", 24), ("v0.5.23", 4)])
def test_kv_eviction_follows_the_release(sem: str, free_after: int) -> None:
    """Four cached leaves of 10 tokens, 24 tokens free, 30 wanted: v0.5.15
    evicts all 30 wanted (three leaves), v0.5.23 the 6 short (one leaf)."""
    lc = _lc("no_buffer", 1, sem, counts=(64, 10, 2))
    _cached(lc, [[i + 1] * 10 for i in range(4)])
    assert lc.kv_free == 24 and lc.slots_free == 6
    lc.take_kv(30)
    assert lc.kv_free == free_after
    c = lc.counts()
    assert c["kv_evicted"] == 30 + free_after - 24 and c["full_evictions"] == 1
    assert c["peak_kv"] == 64 - free_after
    # more than the free and evictable KV: refused before anything is evicted
    sizes = lc.sizes()
    with pytest.raises(RuntimeError, match="KV pool is exhausted"):
        lc.take_kv(free_after + 10 * (4 - (30 + free_after - 24) // 10) + 1)
    assert lc.sizes() == sizes and lc.kv_free == free_after and lc.counts()["full_evictions"] == 1


@pytest.mark.parametrize("sem,evicted", [("v0.5.15", 2), ("v0.5.23", 1)])
def test_admission_headroom_follows_the_release(sem: str, evicted: int) -> None:
    """Three cached states (keys A, B, C) and one free slot after a hit on A
    took its copy-on-write slot; the request wants its two track slots:
    v0.5.15 evicts to have three free per request (two states, B and C),
    v0.5.23 only what it takes past the free one (B, the least recent)."""
    lc = _lc("pp2", 1, sem, counts=(1000, 5, 4))
    keys = [np.array([k] * 8, np.int32) for k in (1, 2, 3)]
    for k in keys:
        rs = _C.ReqState()
        lc.take_admission(1, lc.admit(rs)[1], 1)
        lc.take_kv(8)
        lc.prepare_extend(0, rs, 0, 8)
        lc.cache_finished(rs, k, 8)
        lc.free_row(8, 8)
    assert (lc.slots_free, lc.counts()["states_evicted"]) == (2, 0)
    view = lc.tree_view()
    m = view.match_prefix(np.concatenate([keys[0], [9] * 4]).astype(np.int32), indices=False)
    node = m.node
    assert node.prefix_len == 8 and node.state is not None
    rs = _C.ReqState()
    rs.protected_len = 8
    lc.cow(rs, node.id, node.gen)
    assert lc.slots_free == 1 and rs.cow_src == node.state
    lc.lock(node.id, node.gen)
    rs.node_id, rs.node_gen, rs.locked = node.id, node.gen, 1
    assert lc.admit(rs)[1] == 2
    lc.take_admission(1, 2, 1)
    assert lc.counts()["states_evicted"] == evicted
    assert lc.slots_free == 1 + evicted - 2
    left = [view.match_prefix(k, indices=False).node.state is not None for k in keys]
    assert left == [True, False, evicted == 1]


def test_reset_gives_back_what_the_tree_held() -> None:
    """reset() (SGLang's flush) empties the tree; the counted pools get its
    KV and states back, and a request's own units stay in use."""
    lc = _lc("no_buffer", 1, "v0.5.15", counts=(100, 10, 3))
    _cached(lc, [[1] * 8, [2] * 6])
    rs = _C.ReqState()
    lc.take_admission(1, lc.admit(rs)[1], 1)
    lc.take_kv(5)
    assert (lc.kv_free, lc.slots_free, lc.rows_free) == (81, 7, 2)
    lc.reset()
    assert lc.sizes()[:4] == (0, 0, 0, 0)
    assert (lc.kv_free, lc.slots_free, lc.rows_free) == (95, 9, 2)
    lc.check()


def test_refusals_name_the_argument_and_change_nothing() -> None:
    with pytest.raises(ValueError, match="values=False"):
        _C.Lifecycle(values=True, counts=(10, 2, 2))
    with pytest.raises(TypeError, match="counts"):
        _C.Lifecycle(values=False, counts=[10, 2, 2])
    with pytest.raises(ValueError, match=r"counts\[1\]"):
        _C.Lifecycle(values=False, counts=(10, -1, 2))
    plain = _C.Lifecycle(values=False)
    for call in (lambda: plain.take_kv(1), lambda: plain.take_admission(1, 1, 1), lambda: plain.free_row(0, 0),
                 lambda: plain.counts(), lambda: plain.set_victims(None)):
        with pytest.raises(RuntimeError, match="not counted"):
            call()
    assert plain.kv_free is None
    lc = _lc("pp2", 4, "v0.5.15", counts=(30, 3, 1))
    assert lc.kv_free == 28          # whole pages
    with pytest.raises(ValueError, match="take_kv\\(\\): n"):
        lc.take_kv(-1)
    with pytest.raises(RuntimeError, match="KV pool is exhausted"):
        lc.take_kv(32)
    assert lc.kv_free == 28
    with pytest.raises(ValueError, match="rows"):
        lc.take_admission(1, 3, 2)
    with pytest.raises(RuntimeError, match="state pool is exhausted"):
        lc.take_admission(1, 4, 1)
    assert (lc.slots_free, lc.rows_free) == (3, 1)
    with pytest.raises(ValueError, match="no request row is in use"):
        lc.free_row(0, 0)
    # a finished request's row and the page past its committed length: 5
    # tokens committed (2 pages of 4), 9 allocated (3 pages): one page back
    lc.take_admission(1, 0, 1)
    lc.take_kv(12)
    assert lc.kv_free == 16
    with pytest.raises(ValueError, match="allocated_len"):
        lc.free_row(5, 4)
    with pytest.raises(ValueError, match="more KV would go back"):
        lc.free_row(0, 100)
    assert (lc.kv_free, lc.rows_free) == (16, 0)
    lc.free_row(5, 9)
    assert (lc.kv_free, lc.rows_free) == (20, 1)
    with pytest.raises(TypeError, match="callable"):
        lc.set_victims(3)


def test_a_failing_victim_policy_raises_its_error() -> None:
    """A policy that raises, or names a node it may not, stops the call
    that evicts with that error; nothing is taken."""
    lc = _lc("no_buffer", 1, "v0.5.23", counts=(100, 2, 3))
    _cached(lc, [[1] * 8, [2] * 8])
    assert lc.slots_free == 0 and lc.counts()["states_evicted"] == 0

    def boom(protect):
        raise KeyError("policy")
    lc.set_victims(boom)
    rs = _C.ReqState()
    with pytest.raises(KeyError, match="policy"):
        lc.take_admission(1, lc.admit(rs)[1], 1)
    assert lc.slots_free == 0 and lc.rows_free == 3
    root = lc.tree_view().root
    lc.set_victims(lambda protect: (root.id, root.gen))
    with pytest.raises(ValueError, match="cannot be evicted"):
        lc.take_admission(1, 1, 1)
    lc.set_victims(None)
    lc.take_admission(1, 1, 1)          # the tree's own eviction again
    assert lc.counts()["states_evicted"] == 1 and lc.slots_free == 0 and lc.rows_free == 2
