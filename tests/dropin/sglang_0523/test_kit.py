"""SGLang's own unit-test kit (sglang.test.kits.unified_radix_cache) on the
mambaradix TreeCore: build_fixture with our inspection core, the kit's
fixture-driven steps, and every node inspected through
UnifiedTreeCoreInspectionInterface against the same steps on SGLang's
Python inspector."""

from __future__ import annotations

import unittest
from unittest import mock

import pytest
from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.unified_cache import tree_core_registry as reg
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.test.kits.unified_radix_cache import fixtures
from sglang.test.kits.unified_radix_cache.config import CONFIGS
from sglang.test.kits.unified_radix_cache.mixins import UnifiedRadixCacheFixtures
from sglang.test.mem_cache_utils import finish_req

import mambaradix.sglang.unified as mr_unified

FULL, MAMBA = ComponentType.FULL, ComponentType.MAMBA
KIT_CONFIGS = [c for c in CONFIGS if set(c.components) <= {FULL, MAMBA}]


def build(cfg, backend):
    mr_unified.register()
    inspector = mr_unified.inspection_core_class()
    with mock.patch.dict(reg._TREE_CORE_REGISTRY, {"mambaradix": lambda p, c: inspector(p, c)}):
        return fixtures.build_fixture(cfg, tree_core_backend=backend, enable_kv_cache_events=True)


def describe(cache):
    """The whole tree through the kit's inspection interface, node ids replaced by token paths."""
    core = cache.tree_core
    root = cache.root_node_handle()
    paths = {root: ()}
    out = []
    stack = [root]
    while stack:
        nid = stack.pop()
        kids = sorted(core.get_child_node_ids(nid), key=lambda k: fixtures.node_token_ids(cache, k))
        for k in kids:
            assert fixtures.node_parent(cache, k) == nid
            paths[k] = paths[nid] + tuple(fixtures.node_token_ids(cache, k))
            stack.append(k)
        if nid == root:
            continue
        mv = fixtures.node_device_value(cache, nid, MAMBA) if MAMBA in cache.tree_components else None
        out.append(
            (
                paths[nid],
                fixtures.node_key_length(cache, nid),
                fixtures.node_device_value(cache, nid, FULL).tolist(),
                None if mv is None else mv.tolist(),
                tuple(fixtures.node_device_lock_ref(cache, nid, ct) for ct in cache.tree_components),
                core.is_device_leaf(nid),
                core.is_device_evictable_leaf(nid),
                tuple(core.is_node_in_device_lru(nid, ct) for ct in cache.tree_components),
                core.contains_node(nid),
            )
        )
    lru = []
    if MAMBA in cache.tree_components:
        lru = [paths[n] for n in core.get_component_device_lru_node_ids(MAMBA)]
    assert sorted(core.get_all_node_ids()) == sorted(paths)
    return sorted(out), lru, [repr(e) for e in core.take_events()]


class KitSteps(UnifiedRadixCacheFixtures, unittest.TestCase):
    """The kit's fixture helpers, run identically on both cores."""

    def steps(self, cache, allocator, pool):
        snaps = []
        chain = self._build_chain_pages(cache, allocator, pool, 5)
        snaps.append((len(chain), describe(cache)))
        self._insert(cache, allocator, pool, self._make_seq(1000, 3), extra_key="lora-a")
        self._insert(cache, allocator, pool, self._make_seq(1000, 2) + self._make_seq(7000, 1), cache_salt="s")
        snaps.append(describe(cache))
        m = fixtures.match_prefix(cache, self._match_tokens_for_chain(cache, chain[:3]))
        receipt = cache.inc_lock_ref(m.last_device_node)
        snaps.append((m.device_prefix_len, m.full_kv_hit_length, describe(cache)))
        req, _ = self._make_inflight_req(cache, allocator, pool, self._make_seq(3000, 3), allocated=True)
        if self.cfg.has_mamba:
            req.kv.mamba_last_track_seqlen = req.extend_end
        finish_req(cache, req, req.extend_end)
        pool.free(req)
        snaps.append(describe(cache))
        r = cache.evict(EvictParams(num_tokens=2 * self.cfg.page_size, mamba_num=1 if self.cfg.has_mamba else 0))
        snaps.append((r.num_tokens_evicted, r.mamba_num_evicted, describe(cache)))
        cache.dec_lock_ref(m.last_device_node, receipt.to_dec_params())
        r = cache.evict(EvictParams(num_tokens=10**6, mamba_num=10**6 if self.cfg.has_mamba else 0))
        snaps.append((r.num_tokens_evicted, r.mamba_num_evicted, describe(cache), allocator.available_size()))
        cache.sanity_check()
        return snaps


@pytest.mark.parametrize("cfg", KIT_CONFIGS, ids=[c.label for c in KIT_CONFIGS])
def test_kit_steps_match_python_core(cfg):
    runs = []
    for backend in ("python", "mambaradix"):
        kit = KitSteps()
        kit.cfg = cfg
        cache, allocator, pool = build(cfg, backend)
        expected = "MambaradixTreeCoreInspector" if backend == "mambaradix" else "UnifiedTreeCoreInspector"
        assert type(cache.tree_core).__name__ == expected
        runs.append(kit.steps(cache, allocator, pool))
    for i, (a, b) in enumerate(zip(*runs)):
        assert a == b, f"kit step {i}: python={a!r}\nmambaradix={b!r}"


def test_raw_mutators_refuse_cleanly():
    cfg = KIT_CONFIGS[-1]
    cache, allocator, pool = build(cfg, "mambaradix")
    with pytest.raises(NotImplementedError, match="set_component_device_lock_ref"):
        cache.tree_core.set_component_device_lock_ref(cache.root_node_handle(), FULL, 3)
    cache.sanity_check()
