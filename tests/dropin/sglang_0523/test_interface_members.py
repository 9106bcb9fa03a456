"""TreeCore interface members the differential run does not reach, each
driven on both SGLang's Python TreeCore and ours (same fixture, same
operations) and compared: reset of a filled tree, node_by_id,
collect_path_info, inc_full_pin / dec_full_pin, component_protected_size,
get_component_device_value, empty_match_result, is_full_device_evicted,
evict_excess_path_states, the AllBlocksCleared event, extra_key together with
cache_salt, pretty_print, touch_prefix / supports_fast_match_prefix,
get_node_hit_count, the eviction walk's and match_prefix's error paths, and
the configurations that fall back to the Python core."""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import re
from array import array
from unittest import mock

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.cache_action import MambaEvictExcessPathStates
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore
from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import UnifiedTreeCoreInterface
from sglang.test.kits.unified_radix_cache import fixtures
from sglang.test.kits.unified_radix_cache.config import CacheConfig

import dual
import mambaradix.sglang.unified as mr_unified

FULL, MAMBA = ComponentType.FULL, ComponentType.MAMBA
MAMBA_PS1 = CacheConfig(page_size=1, components=(FULL, MAMBA))
MAMBA_PS4 = CacheConfig(page_size=4, components=(FULL, MAMBA), enable_mamba_extra_buffer=True)


def _key(tokens, extra=None, salt=None):
    return RadixKey(array("q", tokens), extra_key=extra, cache_salt=salt)


def _filled(cfg=MAMBA_PS1, strategy="no_buffer", seed=21, ops=150, **kw):
    d = dual.Differ(cfg, strategy, seed=seed, **kw)
    d.run(ops)
    return d


def _matched(d, side, picks):
    """The deepest node each pick reaches (its KV path; a state need not end there)."""
    return [side.core.match_full_device_prefix(_key(p))[1] for p in picks]


PICKS = [[1, 1, 1, 1], [1, 2, 3], [3, 3, 3, 3, 3, 3], [2, 2, 2, 2, 4], [4, 4], [1] * 12,
         [5, 5, 6, 6, 7, 7], [5, 5, 6, 6, 8, 8], [5, 5, 9]]


# ---- reset, AllBlocksCleared, empty_match_result ---------------------------


@pytest.mark.parametrize("cfg,strategy", [(MAMBA_PS1, "no_buffer"), (MAMBA_PS4, "extra_buffer")])
def test_reset_of_a_filled_tree(cfg, strategy):
    d = _filled(cfg, strategy)
    out = []
    for side in (d.a, d.b):
        for node, receipt in side.locks:
            side.cache.dec_lock_ref(node, receipt.to_dec_params())
        side.locks.clear()
        side.core.take_events()
        assert side.cache.full_evictable_size() > 0  # really filled
        side.cache.reset()
        side.alloc.clear()
        side.pool.clear()
        events = [type(e).__name__ for e in side.cache.take_events()]
        empty = side.core.empty_match_result
        root = side.core.root_node_handle()
        m = side.cache.match_prefix(MatchPrefixParams(key=_key([1, 1, 1, 1])))
        out.append(
            (
                events,
                side.core.total_size(),
                side.core.all_values_flatten().tolist(),
                side.core.all_mamba_values_flatten().tolist(),
                (empty.device_prefix_len, empty.last_device_node == root, empty.best_match_node == root,
                 empty.last_host_node == root, list(empty.cache_actions), empty.full_kv_hit_length),
                (m.device_prefix_len, m.best_match_node == root),
            )
        )
    assert out[0] == out[1]
    assert out[0][0] == ["AllBlocksCleared"]
    d.check("after reset")
    d.run(150)  # both cores keep working in lockstep after the reset


def test_extra_key_and_cache_salt_together():
    """Both namespaces on one key: matches, inserts and the namespaced block
    hashes of BlockStored / BlockRemoved events."""
    d = dual.Differ(MAMBA_PS4, "extra_buffer", seed=33)
    d._ns = lambda: d.rng.choice([(None, None), ("lora-a", "salt-1"), ("lora-a", None), (None, "salt-1"),
                                  ("lora-b", "salt-1")])
    d.run(300)
    keys = [(e, s) for e, s in [("lora-a", "salt-1"), ("lora-a", None), (None, "salt-1"), (None, None)]]
    for extra, salt in keys:
        out = []
        for side in (d.a, d.b):
            v = side.alloc.alloc(8)
            side.cache.insert(InsertParams(key=_key([7] * 8, extra, salt), value=v,
                                           mamba_value=side.pool.mamba_allocator.alloc(1)))
            m = side.cache.match_prefix(MatchPrefixParams(key=_key([7] * 8, extra, salt)))
            out.append((m.device_prefix_len, d._path(side, m.best_match_node), v.tolist()))
        d.check(f"insert ns={extra, salt}", out[0], out[1])


# ---- node_by_id, collect_path_info, component values ------------------------


def test_node_by_id_collect_path_info_and_values():
    d = _filled()
    out = []
    for side in (d.a, d.b):
        core = side.core
        for p in PICKS[-3:]:  # a branching path of its own, three nodes deep
            side.cache.insert(InsertParams(key=_key(p), value=side.alloc.alloc(len(p)),
                                           mamba_value=side.pool.mamba_allocator.alloc(1)))
        ids = _matched(d, side, PICKS)
        root = core.root_node_handle()
        obs = []
        for nid in ids:
            node = core.node_by_id(nid)
            fv = core.get_component_device_value(nid, FULL)
            mv = core.get_component_device_value(nid, MAMBA)
            obs.append(
                (
                    d._path(side, nid),
                    len(node.key) if nid != root else 0,
                    None if nid == root else fv.tolist(),
                    None if mv is None else torch.as_tensor(mv).flatten().tolist(),
                    core.is_full_device_evicted(nid),
                    core.component_has_host_value_only(nid, FULL),
                )
            )
        infos = core.collect_path_info(ids)
        shapes = []
        for nid, path in zip(ids, infos):
            prev = root
            for info in path:
                assert info.parent_id == prev
                prev = info.node_id
            assert prev == nid or (not path and nid == root)
            shapes.append([(i.path_start, i.path_end, i.full_value_len, i.num_children) for i in path])
        with pytest.raises(KeyError):
            core.node_by_id(10**15)
        out.append((obs, shapes))
    assert out[0] == out[1]
    assert any(o[3] is not None for o in out[0][0])  # some node carries a state
    assert max(len(p) for p in out[0][1]) >= 3  # and some path is three nodes deep


# ---- pins and protected sizes ----------------------------------------------


def test_full_pin_protects_the_path_kv_only():
    d = _filled(seed=22)
    out = []
    for side in (d.a, d.b):
        core, cache = side.core, side.cache
        cache.insert(InsertParams(key=_key([6] * 6), value=side.alloc.alloc(6),
                                  mamba_value=side.pool.mamba_allocator.alloc(1)))
        nid = _matched(d, side, [[6] * 6])[0]
        path = d._path(side, nid)
        core.inc_full_pin(nid)
        pinned = [core.component_protected_size(ct) for ct in (FULL, MAMBA)] + [core.full_evictable_size()]
        cache.evict(EvictParams(num_tokens=10**6, mamba_num=10**6))
        after_evict = (core.full_evictable_size(), core.component_protected_size(FULL),
                       core.component_protected_size(MAMBA), d._path(side, nid))
        core.dec_full_pin(nid)
        released = [core.component_protected_size(ct) for ct in (FULL, MAMBA)] + [core.full_evictable_size()]
        out.append((path, pinned, after_evict, released))
        cache.sanity_check()
    assert out[0] == out[1]
    assert out[0][1][0] > 0 and out[0][3][0] == 0  # the pin really protected something
    d.check("after pins")


# ---- evict_excess_path_states ----------------------------------------------


def test_evict_excess_path_states_called_directly():
    """The path cap's action held back from the controller, then the core's
    evict_excess_path_states called on the tail: the same slots come back."""
    d = dual.Differ(MAMBA_PS1, "no_buffer", seed=2, path_cap=1)
    out = []
    for side in (d.a, d.b):
        real = side.cache._apply_cache_actions

        def hold_back(actions, _real=real):
            return _real([a for a in actions if not isinstance(a, MambaEvictExcessPathStates)])

        with mock.patch.object(side.cache, "_apply_cache_actions", hold_back):
            for n in (3, 6, 9, 12):
                side.cache.insert(InsertParams(key=_key(list(range(1, n + 1))), value=side.alloc.alloc(n),
                                               mamba_value=side.pool.mamba_allocator.alloc(1)))
        tail = side.cache.match_prefix(MatchPrefixParams(key=_key(list(range(1, 13))))).best_match_node
        before = side.core.mamba_evictable_size()
        frees = {FULL: [], MAMBA: []}
        side.core.evict_excess_path_states(tail, frees, {FULL: [], MAMBA: []}, [])
        slots = sorted(torch.cat(frees[MAMBA]).tolist()) if frees[MAMBA] else []
        side.pool.mamba_allocator.free(torch.tensor(slots, dtype=torch.int64))
        out.append((before, slots, side.core.mamba_evictable_size()))
    assert out[0] == out[1]
    assert len(out[0][1]) == 3  # four states on the path, cap 1
    d.check("after evict_excess_path_states")


@pytest.mark.parametrize("path_cap", [-1, 1])
def test_evict_excess_path_states_without_mamba(path_cap):
    """A [FULL] tree has no Mamba component to trim: both cores raise the
    same KeyError, whatever the tail (a live node or no node) and the cap,
    and change nothing."""
    d = dual.Differ(CacheConfig(page_size=1, components=(FULL,)), "none", seed=5, path_cap=path_cap)
    d.run(40)
    out = []
    for side in (d.a, d.b):
        live = side.core.match_full_device_prefix(_key([1, 1, 1, 1]))[1]
        raised = []
        for tail in (live, side.core.root_node_handle(), 10**9):
            frees = {FULL: []}
            with pytest.raises(KeyError) as ei:
                side.core.evict_excess_path_states(tail, frees, {FULL: []}, [])
            raised.append((ei.value.args, frees))
        out.append(raised)
    assert out[0] == out[1]
    assert out[0][0] == ((MAMBA,), {FULL: []})
    d.check("after evict_excess_path_states without Mamba")


# ---- pretty_print ------------------------------------------------------------


def _printed_shape(text, depth_of, len_of, state_of):
    shape = []
    for line in text.splitlines():
        if not line.strip():
            continue
        shape.append((depth_of(line), len_of(line), state_of(line)))
    return sorted(shape[1:]), shape[0][0]  # the root line first, then one line a node


def test_pretty_print_prints_the_tree():
    d = _filled(MAMBA_PS4, "extra_buffer", seed=3, ops=60)
    printed = []
    for side in (d.a, d.b):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert side.cache.pretty_print() is None
        printed.append(buf.getvalue())
    # SGLang's line: " " * indent, "[id]", key length, full_lock=..., "<ct>=yes|no" per component.
    py = _printed_shape(
        printed[0],
        lambda l: (len(l) - len(l.lstrip(" ")) - 1) // 2,
        lambda l: int(l.split()[1]),
        lambda l: re.search(r"mamba=(yes|no)", l, re.I).group(1) == "yes",
    )
    ours = _printed_shape(
        printed[1],
        lambda l: (len(l) - len(l.lstrip(" "))) // 2,
        lambda l: int(re.search(r"len=(\d+)", l).group(1)) if "len=" in l else 0,
        lambda l: "state=" in l,
    )
    assert len(py[0]) >= 5
    assert ours == py


# ---- touch_prefix / supports_fast_match_prefix --------------------------------


def test_scheduler_sees_no_fast_match_prefix_by_default():
    d = dual.Differ(MAMBA_PS1, "no_buffer", seed=1)
    assert d.a.cache.supports_fast_match_prefix() is False
    assert d.b.cache.supports_fast_match_prefix() is False
    try:
        mr_unified.register(fast_match_prefix=True)
        opted = dual.Side(MAMBA_PS1, "mambaradix", "no_buffer")
        assert opted.cache.supports_fast_match_prefix() is True
    finally:
        mr_unified.register(fast_match_prefix=False)
    assert dual.Side(MAMBA_PS1, "mambaradix", "no_buffer").cache.supports_fast_match_prefix() is False


@pytest.mark.parametrize("cfg,strategy", [(CacheConfig(page_size=1, components=(FULL,)), "none"),
                                          (MAMBA_PS1, "no_buffer")])
def test_touch_prefix_refreshes_lru_like_sglang(cfg, strategy):
    """The scheduler's waiting-prefix refresh (UnifiedRadixCache.touch_prefix)
    on both cores: the eviction order afterwards is the same."""
    prompts = [[k] * 4 + [k + 10] * 4 for k in range(1, 7)]
    order = []
    for backend in ("python", "mambaradix"):
        side = dual.Side(cfg, backend, strategy)
        cache = side.cache
        values = []
        for p in prompts:
            ms = side.pool.mamba_allocator.alloc(1) if cfg.has_mamba else None
            values.append(side.alloc.alloc(len(p)))
            cache.insert(InsertParams(key=_key(p), value=values[-1], mamba_value=ms))
        for i in (4, 0, 2, 0):  # touch some, oldest first afterwards: 1, 3, 5, then 4, 2, 0
            cache.touch_prefix(_key(prompts[i]))
        seq = []
        while cache.full_evictable_size():
            before = cache.full_evictable_size()
            cache.evict(EvictParams(num_tokens=1))
            # Read the cached KV without a match (a match would refresh the LRU itself).
            cached = set(side.core.all_values_flatten().tolist())
            gone = [j for j, v in enumerate(values) if j not in seq and int(v[-1]) not in cached]
            seq.extend(gone)
            assert cache.full_evictable_size() < before
        order.append(seq)
    assert order[0] == order[1]
    assert order[0] == [1, 3, 5, 4, 2, 0]


# ---- get_node_hit_count --------------------------------------------------------


def test_node_hit_count_matches_sglang_inspector():
    import test_kit

    cfg = [c for c in test_kit.KIT_CONFIGS if c.label == "FULL_MAMBA_ps1"][0]
    seqs = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 5, 6], [1, 2, 3, 4, 7], [1, 2], [9, 9], [1, 2, 5, 6, 8]]
    out = []
    for backend in ("python", "mambaradix"):
        cache, alloc, pool = test_kit.build(cfg, backend)
        core = cache.tree_core
        for s in seqs:
            cache.insert(InsertParams(key=_key(s), value=alloc.alloc(len(s)), mamba_value=pool.mamba_allocator.alloc(1)))
        cache.insert(InsertParams(key=_key([1, 2, 3, 4, 7, 7]), value=alloc.alloc(6),
                                  mamba_value=pool.mamba_allocator.alloc(1), inserted_len=4))
        for s in seqs:
            cache.match_prefix(MatchPrefixParams(key=_key(s)))  # matches do not count
        counts = {}
        stack = [(cache.root_node_handle(), ())]
        while stack:
            nid, path = stack.pop()
            counts[path] = core.get_node_hit_count(nid)
            for c in core.get_child_node_ids(nid):
                stack.append((c, path + tuple(core.get_node_token_ids(c))))
        out.append(counts)
    assert out[0] == out[1]
    assert max(out[0].values()) >= 3


# ---- error paths ------------------------------------------------------------


def test_error_paths_match_sglang_and_never_poison():
    d = _filled(seed=5, ops=80)
    for side in (d.a, d.b):
        core = side.core
        # An eviction step outside a walk fails as SGLang's components assert.
        with pytest.raises(AssertionError, match="not started"):
            core.evict_device_next_node(FULL, {FULL: 0})
        with pytest.raises(AssertionError, match="not started"):
            core.evict_device_end(MAMBA)
        core.evict_device_start(FULL, 1)
        with pytest.raises(AssertionError, match="already in progress"):
            core.evict_device_start(FULL, 1)
        core.evict_device_end(FULL)
        side.cache.sanity_check()
    core = d.b.core
    before = d.snapshot(d.b)["sizes"]
    for call in (lambda: core.match_prefix(None), lambda: core._match_prefix_py(None),
                 lambda: core.begin_insert(None)):
        with pytest.raises(TypeError, match="params"):
            call()
        core.sanity_check([], [])
        assert d.snapshot(d.b)["sizes"] == before
    d.run(100)


# ---- fallbacks ------------------------------------------------------------------


def _build_logged(caplog, cfg, server_args=None, **kw):
    mr_unified.register()
    args = functools.partial(fixtures.ServerArgs, **(server_args or {}))
    with caplog.at_level(logging.INFO, logger="mambaradix.sglang.unified"), mock.patch.object(
        fixtures, "UnifiedTreeCoreInspectionInterface", UnifiedTreeCoreInterface
    ), mock.patch.object(fixtures, "ServerArgs", args):
        cache, _, _ = fixtures.build_fixture(cfg, tree_core_backend="mambaradix", **kw)
    return cache


def _full_component():
    from sglang.srt.mem_cache.unified_cache.components.full import FullComponent

    return {FULL: FullComponent}


@pytest.mark.parametrize(
    "case,cfg,server_args,kw,reason",
    [
        ("custom components", CacheConfig(page_size=1, components=(FULL,)), None,
         {"component_registry_override": "full"}, "custom components"),
        ("eagle", CacheConfig(page_size=1, components=(FULL,), is_eagle=True), None, {}, "EAGLE"),
        ("storage backend", CacheConfig(page_size=1, components=(FULL,)), {"hicache_storage_backend": "file"}, {},
         "storage backends"),
        ("external linker", CacheConfig(page_size=1, components=(FULL,)),
         {"enable_unified_cache_external_linker": True}, {}, "external cache linkers"),
        ("page size 256", CacheConfig(page_size=256, components=(FULL,), kv_size=4096, max_context_len=4096), None, {},
         "page_size 256"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_more_unserved_configs_fall_back_with_reason(case, cfg, server_args, kw, reason, caplog):
    if kw.get("component_registry_override") == "full":
        kw = dict(kw, component_registry_override=_full_component())
    cache = _build_logged(caplog, cfg, server_args, **kw)
    assert isinstance(cache.tree_core, UnifiedTreeCore)
    assert any(reason in r.getMessage() and "Python TreeCore" in r.getMessage() for r in caplog.records)


def test_kv_sharding_falls_back_with_reason(caplog):
    """A shard-widened allocator (logical-page KV sharding): SGLang's controller
    refuses a core without rotation bases, so the factory must hand it to the
    Python core (which has them)."""
    import sglang.srt.mem_cache.allocator.page_interleave as pi
    import sglang.srt.mem_cache.unified_radix_cache as urc

    def shard_size(allocator):
        return 2

    with mock.patch.object(pi, "page_interleave_shard_size", shard_size), mock.patch.object(
        urc, "page_interleave_shard_size", shard_size
    ):
        cache = _build_logged(caplog, CacheConfig(page_size=4, components=(FULL,)))
    assert isinstance(cache.tree_core, UnifiedTreeCore)
    assert any("KV sharding" in r.getMessage() for r in caplog.records)


# ---- the event-hash store ----------------------------------------------------


def test_page_hashes_behave_as_a_dict():
    """PageHashes (numpy rows, dict overflow) against a plain dict of
    (chain, block) per KV index, over random puts / chain reads / pops,
    including indices past the rows, negative ones and non-hex chains."""
    import hashlib
    import random

    rng = random.Random(7)
    store, model = mr_unified.PageHashes(16), {}
    for step in range(3000):
        idx = rng.choice([rng.randint(0, 40), rng.randint(-3, -1), mr_unified.PageHashes.DENSE_MAX + rng.randint(0, 3)])
        r = rng.random()
        if r < 0.5:
            chain = hashlib.sha256(str(step).encode()).hexdigest() if rng.random() < 0.9 else f"x{step}"
            block = rng.randint(-2**63, 2**63 - 1)
            store.put(idx, chain, block)
            model[idx] = (chain, block)
        elif r < 0.75 and idx in model:
            assert store.chain(idx) == model[idx][0]
        else:
            want = model.pop(idx, (None, None))[1]
            assert store.pop_block(idx) == want
    assert len(store.block) > 16  # the rows grew
