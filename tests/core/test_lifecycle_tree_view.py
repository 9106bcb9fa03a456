"""A tree-only Lifecycle's tree as a RadixTree (``tree_view``), the
end-of-turn rule in tree-only mode (``state_available``), and
``cache_unfinished(prefix=False)``: what the simulator's replay
uses to run its cache steps through the C lifecycle over counted pools."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from mambaradix import _C


def _rs(running: int, track=(-1, -1), nxt: int = -1, last_track: int = -1, protected: int = 0,
        node=(-1, 0), locked: int = 0) -> tuple:
    return (running, track[0], track[1], nxt, last_track, -1, -1, 0, 1, protected, node[0], node[1], locked)


def test_the_view_is_the_lifecycles_tree() -> None:
    lc = _C.Lifecycle(chunk_size=4, lru_policy="consumed")
    view = lc.tree_view()
    ns = view.namespace("lora-a")
    assert ns >= 1 and view.namespace("lora-a") == ns and view.namespace(None) == 0
    # a request cached through the lifecycle in namespace "lora-a" ...
    lc.cache_finished(_rs(5), [1, 2, 3, 4, 9], np.arange(10, 15), ns=ns)
    # ... is what the view matches there, and nowhere else
    m = view.match_prefix(np.array([1, 2, 3, 4, 9, 7], np.int32), extra_key="lora-a")
    assert m.node.prefix_len == 5 and m.state == 5 and m.indices.tolist() == [10, 11, 12, 13, 14]
    assert view.match_prefix(np.array([1, 2, 3, 4, 9], np.int32)).node.is_root
    assert view.total_size() == (5, 1) and lc.sizes()[0] + lc.sizes()[1] == 5
    # a lock taken through the view is the one the lifecycle's record names
    node = m.node
    view.inc_lock_ref(node)
    assert lc.node_info(node.id, node.gen)[5] == 1
    rs, kv_free, st_free = lc.cache_finished(
        _rs(6, protected=5, node=(node.id, node.gen), locked=1), [1, 2, 3, 4, 9], np.arange(10, 15),
        ns=ns, is_insert=False)
    assert node.full_lock_ref == 0 and st_free.tolist() == [6] and kv_free.size == 0
    # evictions through the view take the lifecycle's nodes
    assert view.evict_full(5).tokens_evicted == 5 and lc.sizes()[4] == 0
    lc.check()
    view.sanity_check()


def test_one_namespace_table_for_the_lifecycle_and_its_views() -> None:
    """The tree's table against a dict of first appearances: ids 1, 2, ...
    in the order names came, through the Lifecycle or any of its views;
    create=False gives -1 for a new name and adds nothing; reset keeps the
    ids; namespace_name maps back (None for 0 and unknown ids)."""
    lc = _C.Lifecycle(chunk_size=4)
    views = [lc.tree_view(), lc.tree_view()]
    model: dict = {}
    names = ["a", "", "lora-b", "a\x00b", "\udc80x", "a", "é", "", "z" * 300]
    for i, name in enumerate(names):
        api = (lc, views[0], views[1])[i % 3]
        assert api.namespace(name, create=False) == model.get(name, -1)
        assert api.namespace(name) == model.setdefault(name, len(model) + 1)
        if i == 4:
            lc.reset()
    assert lc.namespace(None) == 0 and views[1].namespace(None, False) == 0
    for name, ns in model.items():
        assert lc.namespace_name(ns) == name and views[0].namespace_name(ns) == name
    assert lc.namespace_name(0) is None and lc.namespace_name(len(model) + 1) is None
    assert lc.namespace_name(-3) is None
    # a node of a namespace names its extra_key
    lc.cache_finished(_rs(5), [1, 2, 3, 4], np.arange(10, 14), ns=model["lora-b"])
    assert [c.extra_key for c in views[0].root.children] == ["lora-b"]
    for bad in (3, b"a", ["a"]):
        with pytest.raises(TypeError, match="extra_key must be a str or None, not"):
            lc.namespace(bad)
    with pytest.raises(TypeError, match="create"):
        lc.namespace("a", create=1)


def test_the_view_keeps_its_lifecycle_alive() -> None:
    lc = _C.Lifecycle(chunk_size=4)
    lc.cache_finished(_rs(3), [4, 5, 6], np.array([7, 8, 9]))
    view = lc.tree_view()
    del lc
    gc.collect()
    assert view.total_size() == (3, 1)
    assert [n.state for n in view.lru_order("mamba")] == [3]


def test_no_view_of_a_lifecycle_with_pools() -> None:
    own = _C.Lifecycle(_C.SlotAllocator(4), _C.SlotAllocator(16), _C.ReqPool(2, 8, 2))
    with pytest.raises(RuntimeError, match="own pools"):
        own.tree_view()


@pytest.mark.parametrize("lazy", [False, True])
def test_end_of_turn_in_tree_only_mode_follows_the_free_slots(lazy: bool) -> None:
    """end_of_turn_states: a finished request whose committed length is whole
    pages leaves its running slot (the state at exactly that length) to the
    tree, when the caller has one admission's headroom free (3 slots, lazy 2);
    else, and when the caller does not say (-1), the newest snapshot at the
    tracked length, as without the option."""
    need = 2 if lazy else 3
    tokens, kv = list(range(1, 9)), np.arange(20, 28)
    track = (2, -1) if lazy else (2, 3)
    for avail, eot in ((need, True), (need - 1, False), (-1, False)):
        lc = _C.Lifecycle(page_size=4, chunk_size=4, extra_buffer=True, lazy=lazy, end_of_turn_states=True)
        view = lc.tree_view()
        rs, kv_free, st_free = lc.cache_finished(
            _rs(1, track=track, nxt=0, last_track=4), tokens, kv, state_available=avail)
        keep = 0 if lazy else 1          # lazy keeps next, two buffers other(next)
        if eot:
            # the whole turn, with the running slot; every track slot goes back
            assert view.match_prefix(np.array(tokens + [0], np.int32)).state == 1
            assert sorted(st_free.tolist()) == sorted(s for s in track if s > 0)
            assert kv_free.size == 0
        else:
            # the last snapshot (4 tokens) in track[keep]; the rest is freed
            m = view.match_prefix(np.array(tokens + [0], np.int32))
            assert m.node.prefix_len == 4 and m.state == track[keep]
            assert sorted(st_free.tolist()) == sorted([1] + [s for s in track if s > 0 and s != track[keep]])
            assert sorted(kv_free.tolist()) == [24, 25, 26, 27]
        assert rs[0] == -1 and rs[3] == -1
        lc.check()
    # without the option, the free slots change nothing
    lc = _C.Lifecycle(page_size=4, chunk_size=4, extra_buffer=True, lazy=lazy)
    lc.cache_finished(_rs(1, track=track, nxt=0, last_track=4), tokens, kv, state_available=99)
    assert lc.tree_view().total_size() == (4, 1)
    with pytest.raises(ValueError, match="state_available"):
        lc.cache_finished(_rs(1, track=track, nxt=0, last_track=4), tokens, kv, state_available=-2)


def test_unfinished_without_the_prefix_array() -> None:
    """prefix=False: the same call, the same record and frees, no index array."""
    got = []
    for want in (True, False):
        lc = _C.Lifecycle(chunk_size=4, extra_buffer=True)
        lc.cache_finished(_rs(7, track=(5, 6), nxt=0, last_track=4), [1, 2, 3, 4], np.arange(30, 34))
        rs, prefix, fs, fd, kv_free, st_free, end = lc.cache_unfinished(
            _rs(1, track=(2, 3), nxt=0, last_track=8), list(range(1, 11)), np.arange(40, 50), 9,
            prefix=want)
        assert (prefix is None) == (not want)
        if want:
            assert prefix.tolist() == [30, 31, 32, 33] + list(range(44, 50))
        got.append((rs, fs, fd, kv_free.tolist(), st_free.tolist(), lc.sizes(), end))
        lc.check()
    assert got[0] == got[1]
    assert got[0][3] == [40, 41, 42, 43]             # the tree's own prefix: duplicates
    assert got[0][6] == 4                            # only they differ from the caller's table
    assert got[0][0][9] == 8 and got[0][0][1:3] == (2, 9)


# SGLang v0.5.15's copy-on-write at a hit (MambaRadixCache.match_prefix with
# cow_mamba), written out here as the reference: a matched node holding a
# state gives the request a running slot if it has none (allocated by the
# caller's pool) and names the node's state as the source to copy into it;
# the slot then needs no clear.  A node without a state changes nothing.
def _sglang_cow(running: int, node_state: int, fresh: int) -> tuple:
    if node_state < 0:
        return running, -1, None
    if running < 0:
        running = fresh
    return running, node_state, False


@pytest.mark.parametrize("running", [-1, 3])
def test_cow_is_sglangs_copy_on_write(running: int) -> None:
    lc = _C.Lifecycle(chunk_size=4)
    lc.cache_finished(_rs(5), [1, 2, 3, 4], np.arange(10, 14))
    m = lc.tree_view().match_prefix(np.array([1, 2, 3, 4, 8], np.int32))
    node = m.node
    rs = _C.ReqState(_rs(running))
    rs.needs_clear = 1   # as admission leaves a fresh slot: the copy makes the clear moot
    rs, need = lc.cow(rs, node.id, node.gen)
    if running < 0:
        # the rule wants a slot the caller must allocate: nothing changed yet
        assert need and (rs.running, rs.cow_src) == (-1, -1)
        with pytest.raises(ValueError, match="fresh"):   # not a slot id
            lc.cow(rs, node.id, node.gen, -2)
        rs, need = lc.cow(rs, node.id, node.gen, 7)
    else:
        with pytest.raises(ValueError, match="does not take"):
            lc.cow(rs, node.id, node.gen, 7)
    want_run, want_src, want_clear = _sglang_cow(running, m.state, 7)
    assert not need and (rs.running, rs.cow_src, bool(rs.needs_clear)) == (want_run, want_src, want_clear)
    assert lc.stats()["cow"] == 1
    # the root (no state) changes nothing, and refuses a slot
    root = lc.tree_view().match_prefix(np.array([9], np.int32)).node
    blank = _C.ReqState(_rs(-1))
    blank.needs_clear = 1
    out, need = lc.cow(blank, root.id, root.gen)
    assert not need and (out.running, out.cow_src, bool(out.needs_clear)) == (-1, -1, True)
    with pytest.raises(ValueError, match="does not take"):
        lc.cow(blank, root.id, root.gen, 7)
    lc.check()


def test_cow_refuses_pools_and_stale_nodes() -> None:
    own = _C.Lifecycle(_C.SlotAllocator(4), _C.SlotAllocator(16), _C.ReqPool(2, 8, 2))
    with pytest.raises(RuntimeError, match="own pools"):
        own.cow(_rs(-1), 0, 0)
    lc = _C.Lifecycle(chunk_size=4)
    lc.cache_finished(_rs(5), [1, 2, 3, 4], np.arange(10, 14))
    node = lc.tree_view().match_prefix(np.array([1, 2, 3, 4], np.int32)).node
    nid, ngen = node.id, node.gen
    assert lc.tree_view().evict_full(4).tokens_evicted == 4
    with pytest.raises(Exception, match="node"):
        lc.cow(_rs(-1), nid, ngen)


# SGLang v0.5.15's HybridReqToTokenPool.alloc, written out as the reference:
# a request without a running slot gets one (marked for a clear); with the
# extra buffer, a request without a ping-pong track buffer gets one (one
# slot in lazy mode, else mamba_ping_pong_track_buffer_size), next index 0.
def _sglang_alloc(running: int, track, extra: bool, lazy: bool, pp: int, fresh: list) -> tuple:
    fresh = list(fresh)
    clear = False
    if running < 0:
        running, clear = fresh.pop(0), True
    nxt = -1
    if extra:
        if track is None:
            n = 1 if lazy else pp
            track = (fresh[:n] + [-1, -1])[:2]
            del fresh[:n]
            nxt = 0
        else:
            nxt = 1
    assert not fresh
    return running, tuple(track) if track is not None else (-1, -1), nxt, clear


@pytest.mark.parametrize("mode,has_track", [("no_buffer", False)] + [(m, t) for m in ("pp1", "pp2", "lazy")
                                                                      for t in (False, True)])
@pytest.mark.parametrize("running", [-1, 4])
def test_admit_is_sglangs_alloc(mode: str, running: int, has_track: bool) -> None:
    extra, lazy, pp = mode != "no_buffer", mode == "lazy", 1 if mode == "pp1" else 2
    lc = _C.Lifecycle(chunk_size=4, extra_buffer=extra, lazy=lazy, track_buffer_size=pp)
    track = (5, 6 if pp == 2 and not lazy else -1) if has_track else None
    rs = _C.ReqState(_rs(running, track=track or (-1, -1), nxt=1 if has_track else -1))
    rs, need = lc.admit(rs)
    want = (running < 0) + (0 if (not extra or has_track) else (1 if lazy else pp))
    assert need == want and rs.running == running     # nothing taken yet
    fresh = [11, 12, 13][:want]
    if want:
        with pytest.raises(ValueError, match="fresh"):
            lc.admit(rs, fresh + [14])         # one too many
        if want > 1:
            with pytest.raises(ValueError, match="distinct"):
                lc.admit(rs, fresh[:-1])       # one too few
        with pytest.raises(ValueError, match="distinct"):
            lc.admit(rs, [0] + fresh[1:])      # not a slot id
        if want > 1:
            with pytest.raises(ValueError, match="distinct"):
                lc.admit(rs, [fresh[0]] * want)
        assert rs.running == running
    rs, need = lc.admit(rs, fresh)
    got = (rs.running, (rs.track0, rs.track1), rs.next_track, bool(rs.needs_clear))
    assert need == 0 and got == _sglang_alloc(running, track, extra, lazy, pp, fresh)
    assert lc.admit(rs)[1] == 0   # nothing more wanted


def test_admit_with_pools_takes_rows_and_records() -> None:
    own = _C.Lifecycle(_C.SlotAllocator(4), _C.SlotAllocator(16), _C.ReqPool(2, 8, 2))
    with pytest.raises(TypeError, match="rs_list"):
        own.admit(_rs(-1))


# --------------------------------------------------------------------------
# Eviction with the matched node protected: Lifecycle.evict(protect=), the
# step the drop-in over SGLang's pools and the simulator take when a
# copy-on-write at a hit finds no free state slot.  The reference is
# SGLang v0.5.15's own MambaRadixCache from the wheel (tests/dropin's
# oracle), doing what its match_prefix does there: inc_lock_ref(node),
# evict(EvictParams(num_tokens=0, mamba_num=k)), dec_lock_ref(node).

def _oracle():
    try:
        import test_sglang_oracle
    except ImportError as e:  # pragma: no cover - the wheel is part of the test setup
        pytest.skip("SGLang oracle unavailable: %s" % e)
    if test_sglang_oracle.SG is None:
        pytest.skip("SGLang oracle unavailable: %s" % test_sglang_oracle.SKIP_REASON)
    return test_sglang_oracle.SG


def _sg_sizes(sg) -> tuple:
    return (sg.full_evictable_size(), sg.full_protected_size(), sg.mamba_evictable_size(),
            sg.mamba_protected_size())


@pytest.mark.parametrize("seed", range(6))
def test_protected_eviction_is_sglangs(seed: int) -> None:
    import random
    from array import array

    torch = pytest.importorskip("torch")
    SG = _oracle()
    rng = random.Random(seed)
    sg, kv_alloc, slot_alloc = SG.make(1, 64)
    lc = _C.Lifecycle(chunk_size=64, lru_policy="sglang")
    keys: list = []
    next_kv, next_slot = 1, 1
    locks: list = []   # (SGLang's node, our handle): callers' own locks
    protected_evictions = 0

    def rk(key):
        return SG.RadixKey(array("q", key), None)

    def match(key):
        r = sg.match_prefix(SG.MatchPrefixParams(key=rk(key)))
        idx, nid, ngen, state, _, _ = lc.match(key)
        assert idx.tolist() == r.device_indices.tolist()
        node = r.last_device_node
        want = -1 if node.mamba_value is None else int(node.mamba_value[0])
        assert state == want
        return node, (nid, ngen)

    for _ in range(260):
        op = rng.random()
        if op < 0.45 or not keys:
            if keys and rng.random() < 0.6:
                base = rng.choice(keys)
                key = base[:rng.randrange(len(base) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(1, 4))]
            else:
                key = [rng.randrange(3) for _ in range(rng.randrange(1, 9))]
            key = key[:12]
            keys.append(key)
            value = list(range(next_kv, next_kv + len(key)))
            next_kv += len(key)
            r = sg.insert(SG.InsertParams(key=rk(key), value=torch.tensor(value, dtype=torch.int64),
                                          mamba_value=torch.tensor([next_slot], dtype=torch.int64)))
            sg_dups = kv_alloc.take()
            prefix_len, existed, _, _, dups = lc.insert(key, value, next_slot)
            next_slot += 1
            assert (prefix_len, existed, dups.tolist()) == (r.prefix_len, bool(r.mamba_exist), sg_dups)
        elif op < 0.55:
            node, h = match(rng.choice(keys))
            if node is not sg.root_node and len(locks) < 4:
                sg.inc_lock_ref(node)
                lc.lock(*h)
                locks.append((node, h))
        elif op < 0.62 and locks:
            node, h = locks.pop(rng.randrange(len(locks)))
            sg.dec_lock_ref(node)
            lc.unlock(*h)
        else:
            # a copy-on-write at a hit, no slot free: the matched node is kept
            node, h = match(rng.choice(keys))
            k = rng.choice([1, 1, 1, 2, 3])
            before = None if node.mamba_value is None else int(node.mamba_value[0])
            sg.inc_lock_ref(node)
            got = sg.evict(SG.EvictParams(num_tokens=0, mamba_num=k))
            sg.dec_lock_ref(node)
            sg_kv, sg_slots = kv_alloc.take(), slot_alloc.take()
            tokens, states, kv, slots = lc.evict(0, k, protect=h)
            assert states == got.mamba_num_evicted == len(sg_slots)
            assert (kv.tolist(), slots.tolist()) == (sg_kv, sg_slots)
            assert tokens == len(sg_kv)
            # the protected node is still there, with its state
            assert lc.node_info(*h) is not None
            assert (None if node.mamba_value is None else int(node.mamba_value[0])) == before
            protected_evictions += before is not None and states > 0
        assert lc.sizes()[:4] == _sg_sizes(sg)
        assert lc.tree_view().total_size() == sg.total_size()
        lc.check()
    assert protected_evictions >= 5


def test_protect_keeps_what_the_lru_would_take() -> None:
    """The least recently used state, protected, stays; the next one goes;
    the protection ends with the call (a later eviction takes it)."""
    lc = _C.Lifecycle(chunk_size=4)
    for k in range(3):
        lc.insert([10 * k + j for j in range(4)], np.arange(4 * k + 1, 4 * k + 5), 100 + k)
    oldest = lc.match([0, 1, 2, 3, 9])[1:3]
    assert lc.match([0, 1, 2, 3])[3] == 100
    lc.match([10, 11, 12, 13]), lc.match([20, 21, 22, 23])   # key 0 is the least recently used again
    t, s, kv, st = lc.evict(0, 1, protect=oldest)
    assert (t, s, kv.tolist(), st.tolist()) == (4, 1, [5, 6, 7, 8], [101])
    assert lc.sizes()[1] == lc.sizes()[3] == 0        # no lock left behind
    t, s, kv, st = lc.evict(0, 1)
    assert (t, s, kv.tolist(), st.tolist()) == (4, 1, [1, 2, 3, 4], [100])
    lc.check()


def test_protect_argument_is_checked() -> None:
    lc = _C.Lifecycle(chunk_size=4)
    lc.insert([1, 2, 3, 4], np.arange(10, 14), 5)
    node = lc.match([1, 2, 3, 4])[1:3]
    before = lc.sizes()
    for bad, exc, what in ((node[0], TypeError, "protect must be None or a \\(node_id, node_gen\\) tuple"),
                           ([node[0], node[1]], TypeError, "protect must be"),
                           ((node[0],), TypeError, "protect must be"),
                           (("a", 0), TypeError, "protect's node id must be an int"),
                           ((node[0], -1), ValueError, "protect's node generation must be in"),
                           ((1 << 40, 0), ValueError, "protect's node id must be in")):
        with pytest.raises(exc, match=what):
            lc.evict(0, 1, protect=bad)
        assert lc.sizes() == before                   # nothing evicted
    with pytest.raises(TypeError, match="positional"):
        lc.evict(0, 1, node)                          # keyword only
    with pytest.raises(TypeError, match="num_states"):
        lc.evict(0, "1", protect=node)
    # a stale handle: the error every node call gives
    assert lc.evict(4, 0)[0] == 4
    with pytest.raises(_C.StaleNodeError, match="stale handle") as got:
        lc.evict(0, 1, protect=node)
    with pytest.raises(type(got.value)):
        lc.lock(*node)
    assert lc.evict(0, 1, protect=None)[:2] == (0, 0)
    # with pools too: what goes is freed there, nothing is handed back
    state, kv = _C.SlotAllocator(4), _C.SlotAllocator(16)
    own = _C.Lifecycle(state, kv, _C.ReqPool(2, 8, 2), chunk_size=4)
    slot, idx = state.alloc(1), kv.alloc(4)
    own.insert([1, 2, 3, 4], idx, int(slot[0]))
    h = own.match([1, 2, 3, 4])[1:3]
    assert own.evict(0, 1, protect=h)[:2] == (0, 0)
    t, s, a, b = own.evict(0, 1)
    assert (t, s, a.size, b.size) == (4, 1, 0, 0)
    own.check()
