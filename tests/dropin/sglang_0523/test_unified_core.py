"""mambaradix's TreeCore against SGLang 0.5.23's own Python TreeCore.

Run by tests/dropin/test_sglang_unified.py in a subprocess that loads SGLang 0.5.23
(see sgl_env.py).  MAMBARADIX_DIFF_OPS scales the differential run (the
nightly script sets it high)."""

from __future__ import annotations

import logging
import os
import re
from array import array

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    DecLockRefParams,
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore
from sglang.test.kits.unified_radix_cache.config import CacheConfig

import dual
import mambaradix.sglang.unified as mr_unified

OPS = int(os.environ.get("MAMBARADIX_DIFF_OPS", "700"))
SEED = int(os.environ.get("MAMBARADIX_DIFF_SEED", "0"))
CONFIGS = dual.configs()


@pytest.mark.parametrize("cfg,strategy", CONFIGS, ids=[f"{c.label}-{s}" for c, s in CONFIGS])
def test_differential(cfg, strategy):
    d = dual.Differ(cfg, strategy, seed=SEED + 1000 + cfg.page_size, partial_unlocks=True)
    steps = d.run(OPS)
    assert steps >= OPS
    assert d.requests_done >= min(5, 1 + OPS // 200)  # the request paths really ran
    assert d.resets >= min(1, OPS // 700)  # and so did a real reset (AllBlocksCleared)


PY_PATH_CONFIGS = [c for c in CONFIGS if (c[0].page_size, c[1]) in ((1, "none"), (4, "extra_buffer"), (16, "extra_buffer_lazy"))]


@pytest.mark.parametrize("cfg,strategy", PY_PATH_CONFIGS, ids=[f"{c.label}-{s}" for c, s in PY_PATH_CONFIGS])
def test_differential_python_path(cfg, strategy):
    """The adapter's Python path (what the C calls hand over for token lists,
    tensors off the CPU, empty keys) against SGLang's core too."""
    d = dual.Differ(cfg, strategy, seed=SEED + 4000 + cfg.page_size, python_path=True, partial_unlocks=True)
    assert d.run(OPS // 2) >= OPS // 2


MAMBA_CONFIGS = [(c, s) for c, s in CONFIGS if c.has_mamba]


@pytest.mark.parametrize("cfg,strategy", MAMBA_CONFIGS, ids=[f"{c.label}-{s}" for c, s in MAMBA_CONFIGS])
def test_differential_mamba_max_states_per_path(cfg, strategy):
    d = dual.Differ(cfg, strategy, seed=SEED + 2000 + cfg.page_size, path_cap=1 + cfg.page_size % 2)
    assert d.b.core._path_cap >= 1
    assert d.run(OPS // 2) >= OPS // 2


# Every eviction policy SGLang 0.5.23 offers (sglang/srt/mem_cache/utils.py), with a
# configuration for the two that take one; lru is the differential above.
POLICIES = [
    ("lfu", None), ("fifo", None), ("mru", None), ("filo", None), ("priority", None),
    ("slru", {"protected_threshold": 2}), ("tlru", {"threshold": 12, "next_prompt_estimate": 4}),
]
POLICY_CONFIGS = [c for c in CONFIGS if (c[0].page_size, c[1]) in ((1, "none"), (1, "no_buffer"), (4, "extra_buffer"))]


@pytest.mark.parametrize("policy,config", POLICIES, ids=[p for p, _ in POLICIES])
@pytest.mark.parametrize("cfg,strategy", POLICY_CONFIGS, ids=[f"{c.label}-{s}" for c, s in POLICY_CONFIGS])
def test_differential_eviction_policies(cfg, strategy, policy, config):
    from dataclasses import replace

    cfg = replace(cfg, eviction_policy=policy)
    d = dual.Differ(cfg, strategy, seed=SEED + 3000 + cfg.page_size, policy_config=config)
    assert d.b.core.eviction_policy == policy and type(d.a.core.eviction_strategy).__name__.lower().startswith(policy)
    evicted = []
    real_evict = d.op_evict

    def op_evict():
        before = d.b.core.full_evictable_size()
        real_evict()
        evicted.append(before - d.b.core.full_evictable_size())

    d.op_evict = op_evict
    assert d.run(OPS // 2) >= OPS // 2
    assert sum(1 for e in evicted if e > 0) >= min(10, OPS // 50)  # leaves really were chosen by the policy


def test_differential_covers_ten_thousand_ops():
    if os.environ.get("MAMBARADIX_UNDER_ASAN"):
        pytest.skip("the sanitizer pass runs fewer operations; the plain run does 10^4")
    assert OPS * len(CONFIGS) >= 10_000


def test_registered_name_selects_native_core(monkeypatch):
    mr_unified.register()
    mr_unified.register()  # idempotent
    from sglang.srt.environ import envs

    cfg = CacheConfig(page_size=4, components=(ComponentType.FULL, ComponentType.MAMBA), enable_mamba_extra_buffer=True)
    from unittest import mock

    from sglang.test.kits.unified_radix_cache import fixtures

    # build_fixture pins "python" unless its module-level default is cleared.
    with envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND.override("mambaradix"), mock.patch.object(
        fixtures, "TREE_CORE_TEST_BACKEND", None
    ):
        cache, _, _ = dual.build(cfg, None)
    assert type(cache.tree_core).__name__ == "MambaradixTreeCore"


@pytest.mark.parametrize(
    "cfg,kwargs,reason",
    [
        (CacheConfig(page_size=1, components=(ComponentType.FULL, ComponentType.SWA), sliding_window_size=4), {}, "components"),
        (CacheConfig(page_size=1, components=(ComponentType.FULL,)), {"enable_session_radix_cache": True}, "session"),
    ],
)
def test_unserved_configs_fall_back_with_reason(cfg, kwargs, reason, caplog):
    from unittest import mock

    from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import UnifiedTreeCoreInterface
    from sglang.test.kits.unified_radix_cache import fixtures

    mr_unified.register()
    with caplog.at_level(logging.INFO, logger="mambaradix.sglang.unified"):
        with mock.patch.object(fixtures, "UnifiedTreeCoreInspectionInterface", UnifiedTreeCoreInterface):
            cache, _, _ = fixtures.build_fixture(cfg, tree_core_backend="mambaradix", **kwargs)
    assert isinstance(cache.tree_core, UnifiedTreeCore)
    assert any(reason in r.getMessage() and "Python TreeCore" in r.getMessage() for r in caplog.records)


def test_unserved_policy_config_falls_back(caplog):
    """A policy configuration the C tree does not take (a fractional SLRU
    threshold) is built on the Python core, which takes it."""
    import functools
    from unittest import mock

    from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import UnifiedTreeCoreInterface
    from sglang.test.kits.unified_radix_cache import fixtures

    mr_unified.register()
    cfg = CacheConfig(page_size=1, components=(ComponentType.FULL,), eviction_policy="slru")
    init = functools.partial(fixtures.CacheInitParams, eviction_policy_config={"protected_threshold": 2.5})
    with caplog.at_level(logging.INFO, logger="mambaradix.sglang.unified"), mock.patch.object(
        fixtures, "CacheInitParams", init
    ), mock.patch.object(fixtures, "UnifiedTreeCoreInspectionInterface", UnifiedTreeCoreInterface):
        cache, _, _ = fixtures.build_fixture(cfg, tree_core_backend="mambaradix")
    assert isinstance(cache.tree_core, UnifiedTreeCore)
    assert any("eviction_policy_config" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("setting, says", [("enable_hierarchical_cache", "HiCache"), ("enable_lmcache", "LMCache")])
def test_hicache_server_setting_falls_back(setting, says, caplog):
    """HiCache is switched on by server arguments after the cache is built; the
    factory reads them and hands the whole cache to the Python core.  So is
    --enable-lmcache: SGLang's LMCacheUnifiedRadixCache asks its TreeCore for
    prefetch_anchor_info (a node's namespace) on every external load."""
    import functools
    from unittest import mock

    from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import UnifiedTreeCoreInterface
    from sglang.test.kits.unified_radix_cache import fixtures

    mr_unified.register()
    cfg = CacheConfig(page_size=1, components=(ComponentType.FULL, ComponentType.MAMBA))
    args = functools.partial(fixtures.ServerArgs, **{setting: True})
    with caplog.at_level(logging.INFO, logger="mambaradix.sglang.unified"), mock.patch.object(
        fixtures, "ServerArgs", args
    ), mock.patch.object(fixtures, "UnifiedTreeCoreInspectionInterface", UnifiedTreeCoreInterface):
        cache, _, _ = fixtures.build_fixture(cfg, tree_core_backend="mambaradix")
    assert isinstance(cache.tree_core, UnifiedTreeCore)
    assert cache.tree_core.prefetch_anchor_info(cache.tree_core.root_node_handle()) == (None, None)
    assert any(says in r.getMessage() for r in caplog.records)


def _key(tokens):
    return RadixKey(array("q", tokens))


def test_errors_name_the_argument_and_never_poison_the_core():
    cfg = CacheConfig(page_size=1, components=(ComponentType.FULL, ComponentType.MAMBA))
    d = dual.Differ(cfg, "no_buffer", seed=5)
    d.run(60)
    side = d.b
    core, cache = side.core, side.cache
    bad_calls = [
        (lambda: core.inc_lock_ref("x"), TypeError, "node_id"),
        (lambda: core.inc_lock_ref(10**9), KeyError, "node_id"),
        (lambda: core.dec_lock_ref(core.root_node_handle(), DecLockRefParams(node_id=12345)), ValueError, "params"),
        (lambda: core.match_prefix(MatchPrefixParams(key=[1, 2, 3])), TypeError, "key"),
        (lambda: core.match_prefix(None), TypeError, "params"),
        # SGLang's core keys namespaces by (extra_key, cache_salt) as objects: 1 and "1" are two; ours by
        # name, so a salt that is not a str is refused (an API request's salt is a str)
        (lambda: core.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2]), cache_salt=1))), TypeError,
         "key.cache_salt"),
        (
            lambda: core.begin_insert(InsertParams(key=RadixKey(array("q", [9, 9, 9]), cache_salt=7),
                                                   value=torch.tensor([1, 2, 3]), mamba_value=torch.tensor([0]))),
            TypeError,
            "key.cache_salt",
        ),
        (
            lambda: core.begin_insert(InsertParams(key=_key([9, 9, 9]), value=[1, 2, 3], mamba_value=torch.tensor([0]))),
            TypeError,
            "params.value",
        ),
        (
            lambda: core.begin_insert(
                InsertParams(key=_key([9, 9, 9]), value=torch.tensor([1]), mamba_value=torch.tensor([0]))
            ),
            ValueError,
            "params.value",
        ),
        (lambda: core.begin_insert(InsertParams(key=_key([9, 9, 9]), value=torch.tensor([1, 2, 3]))), ValueError, "mamba_value"),
        (lambda: core.collect_full_device_indices(core.root_node_handle(), 10**9), KeyError, "until_node_id"),
        (
            lambda: core.begin_insert(
                InsertParams(key=_key([9, 9, 9]), value=torch.tensor([1, -2, 3]), mamba_value=torch.tensor([0]))
            ),
            ValueError,
            "params.value",
        ),
        (
            lambda: core.begin_insert(
                InsertParams(key=_key([9, 9, 9]), value=torch.tensor([1, 2, 3]), mamba_value=torch.tensor([0, 1]))
            ),
            ValueError,
            "mamba_value",
        ),
        (
            lambda: core.begin_insert(
                InsertParams(key=_key([9, 9, 9]), value=torch.tensor([1, 2, 3]), mamba_value=torch.tensor([0]),
                             priority="high")
            ),
            TypeError,
            "params.priority",
        ),
        (lambda: core.inc_lock_ref(core.root_node_handle(), skip_lock_components=(ComponentType.FULL,)), ValueError,
         "skip_lock_components"),
    ]
    for call, exc, name in bad_calls:
        before = d.snapshot(side)
        with pytest.raises(exc, match=name):
            call()
        core.sanity_check([], [])
        assert d.snapshot(side)["sizes"] == before["sizes"]
    # An unlock of an unlocked node is refused and changes nothing.
    m = cache.match_prefix(MatchPrefixParams(key=_key([1, 2, 3, 4])))
    if not core.is_root(m.best_match_node):
        with pytest.raises(ValueError):
            core.dec_lock_ref(m.best_match_node, DecLockRefParams(node_id=m.best_match_node))
        core.sanity_check([], [])
    # Still in lockstep with SGLang's core afterwards.
    d.a.cache.match_prefix(MatchPrefixParams(key=_key([1, 2, 3, 4])))
    d.run(200)



def test_what_the_python_path_would_convert_is_refused():
    """Values, keys and counts the C calls hand to the Python path (a value
    that is not an int64 CPU tensor, a key that is not an int64 buffer, a
    limit that is not an int >= 0) raise naming the argument, where the
    Python path converted them: a float value or token truncated, a bool
    value taken as 1, a negative limit cutting the key's last token."""
    cfg = CacheConfig(page_size=1, components=(ComponentType.FULL, ComponentType.MAMBA))
    d = dual.Differ(cfg, "no_buffer", seed=6)
    d.run(60)
    side = d.b
    core = side.core
    v = torch.tensor([1, 2, 3])
    slot = torch.tensor([0])

    def insert(key=None, value=v, mamba_value=slot):
        return lambda: core.begin_insert(InsertParams(key=key or _key([9, 9, 9]), value=value, mamba_value=mamba_value))

    def match(key):
        return lambda: core.match_prefix(MatchPrefixParams(key=key))

    bad_calls = [
        (insert(value=v.float() + 0.7), TypeError, r"params\.value must be an integer tensor, not torch\.float32"),
        (insert(value=v > 1), TypeError, r"params\.value must be an integer tensor, not torch\.bool"),
        (insert(value=v.to("meta")), ValueError, r"params\.value is a meta tensor"),
        (insert(value=v.reshape(3, 1).int()), ValueError, r"params\.value must be 1-dimensional"),
        (insert(key=RadixKey([9.5, 9.0, 9.0])), TypeError, r"key\.token_ids must hold integers, not float64"),
        (insert(key=RadixKey(torch.tensor([9.0, 9.0, 9.0]))), TypeError, r"key\.token_ids must be an integer tensor"),
        (insert(key=RadixKey(array("d", [9, 9, 9]))), TypeError, r"key\.token_ids must hold integers, not float64"),
        (match(RadixKey(array("q", [1, 2, 3]), limit=-1)), ValueError, r"key\.limit must be >= 0, not -1"),
        (match(RadixKey(array("q", [1, 2, 3]), limit=2.0)), TypeError, r"key\.limit must be an int, not float"),
        (match(RadixKey([1.0, 2.0])), TypeError, r"key\.token_ids must hold integers"),
        (match(RadixKey("abc")), TypeError, r"key\.token_ids must be a sequence of ints, not str"),
        (lambda: core.evict_device_start(ComponentType.FULL, 2.5), TypeError, r"request_cnt must be an int, not float"),
        # a slot tensor the C path read with item(): a bool as slot 0 or 1, a float as "not one element"
        (insert(mamba_value=torch.tensor([True])), TypeError,
         r"params\.mamba_value must be an integer tensor, not torch\.bool"),
        (insert(mamba_value=torch.tensor([0.0])), TypeError,
         r"params\.mamba_value must be an integer tensor, not torch\.float32"),
        (insert(mamba_value=torch.tensor([0.0, 1.0])), TypeError, r"params\.mamba_value .*torch\.float32"),
        (lambda: core.evict_device_start("FULL", 1), TypeError,
         r"evict_device_start\(\): component_type must be a ComponentType, not 'FULL'"),
        (lambda: core.evict_device_start(ComponentType.SWA, 1), ValueError,
         r"evict_device_start\(\): component_type SWA is not a component of this tree \(FULL, MAMBA\)"),
        (lambda: core.get_component_device_value(core.root_node_handle(), "x"), TypeError,
         r"get_component_device_value\(\): component_type must be a ComponentType, not 'x'"),
    ]
    for call, exc, message in bad_calls:
        before = d.snapshot(side)
        with pytest.raises(exc, match=message):
            call()
        core.sanity_check([], [])
        assert d.snapshot(side) == before
    # an int32 value, a tensor key and a list key are read as their ints
    d.a.cache.match_prefix(MatchPrefixParams(key=_key([1, 2, 3, 4])))
    side.cache.match_prefix(MatchPrefixParams(key=RadixKey(torch.tensor([1, 2, 3, 4]))))
    d.run(200)   # still in lockstep with SGLang's core


def test_a_component_type_is_read_as_sglangs_core_reads_it():
    """SGLang's core indexes a node's components with the ComponentType (an
    int enum): a member or its int value reads the component (None for
    SWA, which this tree has not), anything else raises there; eviction
    starts only for the tree's components (a KeyError there).  Ours gives
    the same values and refuses the same arguments, naming component_type,
    and a refused start leaves no walk open."""
    cfg = CacheConfig(page_size=1, components=(ComponentType.FULL, ComponentType.MAMBA))
    d = dual.Differ(cfg, "no_buffer", seed=7)
    d.run(40)
    nodes = []
    for side in (d.a, d.b):   # a key of its own on both (the walk's tokens are 1..4)
        side.cache.insert(InsertParams(key=_key([7, 7, 7]), value=side.alloc.alloc(3),
                                       mamba_value=side.pool.mamba_allocator.alloc(1)))
        nodes.append(side.cache.match_prefix(MatchPrefixParams(key=_key([7, 7, 7]))).last_device_node)

    def value(side, node, ct):
        v = side.core.get_component_device_value(node, ct)
        return None if v is None else v.tolist()

    for ct in (ComponentType.FULL, ComponentType.MAMBA, ComponentType.SWA, 0, 2):
        assert value(d.b, nodes[1], ct) == value(d.a, nodes[0], ct), ct
    for bad in ("x", "FULL", None, 2.0):
        for side, node in zip((d.a, d.b), nodes):
            with pytest.raises(TypeError):
                side.core.get_component_device_value(node, bad)
    for bad, ours in (("FULL", TypeError), (ComponentType.SWA, ValueError), (None, TypeError)):
        with pytest.raises(KeyError):
            d.a.core.evict_device_start(bad, 1)
        with pytest.raises(ours, match="component_type"):
            d.b.core.evict_device_start(bad, 1)
    for side in (d.a, d.b):   # no walk was left open; the int value starts one
        side.core.evict_device_start(0, 1)
        side.core.evict_device_end(ComponentType.FULL)
    d.run(100)   # still in lockstep with SGLang's core


def test_a_missing_sglang_module_is_named(monkeypatch):
    """With 0.5.23 installed but a module of it missing, register() and the
    class say 0.5.23 is needed and name the module (not a version)."""
    import sys

    # register() imports the registry's package; the class, among others, the events module
    for name, call in (("sglang.srt.mem_cache.unified_cache", mr_unified.register),
                       ("sglang.srt.mem_cache.events", lambda: mr_unified.MambaradixTreeCore)):
        with monkeypatch.context() as m:
            m.setitem(sys.modules, name, None)      # an import of it fails
            m.setattr(mr_unified, "_CORE", None, raising=False)   # the class is built again
            with pytest.raises(ImportError) as e:
                call()
        assert str(e.value).startswith(
            "mambaradix.sglang.unified needs SGLang 0.5.23 (sglang.srt.mem_cache.unified_cache): ")
        assert name in str(e.value) and "is installed" not in str(e.value)
    assert mr_unified.MambaradixTreeCore.__name__ == "MambaradixTreeCore"

def test_memory_per_cached_token_is_reported():
    cfg = CacheConfig(page_size=1, components=(ComponentType.FULL, ComponentType.MAMBA))
    d = dual.Differ(cfg, "no_buffer", seed=3)
    d.run(100)
    tree = d.b.core._tree
    tokens = sum(d.b.core.total_size()[:1])
    assert tree.memory_bytes() > 0 and (tokens == 0 or tree.memory_bytes() / tokens < 200)


def test_readme_snippet_runs_as_written():
    import re

    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "README.md")).read()
    block = re.search(r"## SGLang 0\.5\.23 TreeCore.*?```python sglang-0\.5\.23\n(.*?)```", readme, re.S).group(1)
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})
    assert out.getvalue().split() == ["MambaradixTreeCore", "3"]


def test_dfs_weight_order_matches_sglang_up_to_equal_weight_ties():
    """The same order shape as SGLang's core (per position, the weight of the
    request's branch); only equal-weight siblings may swap."""
    import random

    cfg = CacheConfig(page_size=1, components=(ComponentType.FULL,))
    d = dual.Differ(cfg, "none", seed=9)
    d.run(150)
    rng = random.Random(4)
    for _ in range(30):
        picks = [[rng.randint(1, 4) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(1, 12))]
        seqs = []
        for side in (d.a, d.b):
            ids = [side.cache.match_prefix(MatchPrefixParams(key=_key(p))).last_device_node for p in picks]
            order = side.cache.dfs_weight_order(ids)
            assert sorted(order) == list(range(len(picks)))
            # Each request's matched path, in the order given; and the weight of its root branch.
            paths = [tuple(side.core.collect_full_device_indices(i, side.core.root_node_handle()).tolist()) for i in ids]
            branch = [p[:1] for p in paths]
            weights = [branch.count(branch[i]) for i in order]
            seqs.append((weights, sorted(paths)))
        assert seqs[0] == seqs[1]
    d.run(50)


@pytest.mark.parametrize("backend", ["python", "mambaradix"])
def test_stale_node_id_after_eviction_names_no_node(backend):
    """A NodeId of an evicted node must not resolve, even after the tree reuses
    the node's slot for a new node (SGLang's Python core never reuses ids;
    ours puts the id's generation in the NodeId's high bits)."""
    cfg = CacheConfig(page_size=1, components=(ComponentType.FULL, ComponentType.MAMBA))
    cache, alloc, pool = dual.build(cfg, backend)
    core = cache.tree_core

    def insert(tokens):
        key = _key(tokens)
        cache.insert(InsertParams(key=key, value=alloc.alloc(len(tokens)), mamba_value=pool.mamba_allocator.alloc(1)))
        return cache.match_prefix(MatchPrefixParams(key=key)).best_match_node

    old = insert([5, 6, 7, 8])
    assert not core.is_root(old)
    cache.evict(EvictParams(num_tokens=cache.full_evictable_size()))
    assert cache.full_evictable_size() == 0
    new = insert([9, 10, 11, 12])
    assert new != old
    if backend == "mambaradix":
        assert new & 0xFFFFFFFF == old & 0xFFFFFFFF, "the test needs the C node id to be reused"
    with pytest.raises(KeyError):
        core.is_root(old)
    with pytest.raises(KeyError):
        core.inc_lock_ref(old)
    assert not core.is_root(new)
    receipt = core.inc_lock_ref(new)
    if backend == "mambaradix":
        # a reused id's receipt still takes the one-call C path (not the Python fallback)
        calls = []
        fallback = core._dec_lock_ref_py
        core._dec_lock_ref_py = lambda *a, **k: calls.append(a) or fallback(*a, **k)
        core.dec_lock_ref(new, receipt)
        assert calls == []
    else:
        core.dec_lock_ref(new, receipt)
    core.sanity_check([], [])


def test_adaptive_policy_is_served_natively():
    """eviction_policy "adaptive" (a mambaradix policy SGLang does not have)
    selects our core, whose tree runs the C policy table's adaptive row."""
    from dataclasses import replace

    cfg, _ = next(c for c in CONFIGS if c[0].has_mamba and c[0].page_size == 4)
    cache, _, _ = dual.build(replace(cfg, eviction_policy="adaptive"), "mambaradix")
    assert type(cache.tree_core).__name__ == "MambaradixTreeCore"
    assert cache.tree_core.eviction_policy == "adaptive"
    assert cache.tree_core._tree.lru_policy == "adaptive"   # no fallback: our core, the adaptive row


def test_state_settings_reach_the_tree_and_are_restored():
    """register()'s keywords (here through settings(), which restores them): the state policy is passed to
    the C tree as a name of its policy table; cores built afterwards use the previous settings again."""
    cfg = CacheConfig(page_size=1, components=(ComponentType.FULL, ComponentType.MAMBA), enable_mamba_extra_buffer=True)
    before = mr_unified.resolved_settings()
    with mr_unified.settings(state_policy="utility", utility_order="lru", path_state_budget=3):
        cache, _, _ = dual.build(cfg, "mambaradix")
        assert mr_unified.resolved_settings()["path_state_budget"] == (3, "register()")
    tree = cache.tree_core._tree
    assert tree.lru_policy == "utility" and not tree.policy_stats()["mru"]
    assert type(cache.components[ComponentType.MAMBA]).__name__ == "EndOfTurnMambaComponent"
    assert mr_unified.resolved_settings() == before
    plain, _, _ = dual.build(cfg, "mambaradix")
    assert plain.tree_core._tree.lru_policy == "consumed"
    assert type(plain.components[ComponentType.MAMBA]).__name__ == "MambaComponent"


def test_register_inside_a_settings_block_keeps_its_changes(monkeypatch):
    """settings() scopes its own keywords to the block; a register() call inside it is not undone at its
    end, and the block's keywords win over it while the block lasts."""
    monkeypatch.setattr(mr_unified, "_OVERRIDES", {})
    before = mr_unified.resolved_settings()
    with mr_unified.settings(state_policy="utility", path_state_budget=3):
        mr_unified.register(path_state_budget=5, end_of_turn_states=True)
        inside = mr_unified.resolved_settings()
        assert inside["path_state_budget"] == (3, "register()")
        assert inside["end_of_turn_states"] == (True, "register()")
        assert inside["state_policy"] == ("utility", "register()")
    after = mr_unified.resolved_settings()
    assert after["path_state_budget"] == (5, "register()")
    assert after["end_of_turn_states"] == (True, "register()")
    assert after["state_policy"] == before["state_policy"]


@pytest.mark.parametrize("kwargs, exc, says", [
    ({"state_policy": 3}, TypeError, "state_policy must be a str, not int"),
    ({"state_policy": "nonsense"}, ValueError, "state_policy='nonsense': expected a policy of the tree's table"),
    ({"utility_order": "up"}, ValueError, "utility_order='up': expected mru or lru"),
    ({"end_of_turn_states": 1}, TypeError, "end_of_turn_states must be a bool, not int"),
    ({"path_state_budget": -1}, ValueError, "path_state_budget=-1: expected an integer >= 0"),
    ({"path_state_budget": True}, TypeError, "path_state_budget must be an int, not bool"),
    ({"fast_match_prefix": True, "path_state_budget": -1}, ValueError, "path_state_budget"),
])
def test_register_checks_its_keywords_before_anything_changes(kwargs, exc, says):
    before = mr_unified.resolved_settings()
    with pytest.raises(exc, match=re.escape(says)):
        mr_unified.register(**kwargs)
    assert mr_unified.resolved_settings() == before


def test_only_our_own_mamba_component_is_served_natively():
    from types import SimpleNamespace

    from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent

    class Other(MambaComponent):
        pass

    def params(override):
        return SimpleNamespace(tree_components=(ComponentType.FULL, ComponentType.MAMBA), page_size=1,
                               component_registry_override=override, enable_session_radix_cache=False,
                               eviction_policy="lru", eviction_policy_config=None, is_eagle=False,
                               token_to_kv_pool_allocator=None)

    assert mr_unified.fallback_reason(params({ComponentType.MAMBA: mr_unified.end_of_turn_component_class()})) is None
    assert "custom components" in mr_unified.fallback_reason(params({ComponentType.MAMBA: Other}))



@pytest.mark.parametrize("page_size, skip", [(1, (ComponentType.MAMBA,)), (16, (ComponentType.MAMBA,)),
                                             (1, (ComponentType.SWA, ComponentType.MAMBA))])
def test_a_lock_that_skips_mamba_on_a_tree_without_it_locks_the_kv(page_size, skip):
    """SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK makes the controller lock every
    unfinished request's node with skip_lock_components=(MAMBA,), whatever the
    tree's components; SGLang's core skips only components it has, so on a
    [FULL] tree the lock (and its receipt's release) holds the path's KV."""
    cfg = dual.configs((page_size,))[0][0]
    assert not cfg.has_mamba
    d = dual.Differ(cfg, "none", seed=11)
    toks = [1] * page_size + [2] * page_size
    for side in (d.a, d.b):
        v = side.alloc.alloc(len(toks))
        side.cache.insert(dual.InsertParams(key=dual._key(toks), value=v))
    d.check("insert")
    for side in (d.a, d.b):
        node = side.cache.match_prefix(MatchPrefixParams(key=dual._key(toks))).last_device_node
        side.locks.append((node, side.cache.inc_lock_ref(node, skip_lock_components=skip)))
    d.check(f"lock skipping {skip}")
    assert d.b.core.full_protected_size() == len(toks)
    d.op_evict()
    for side in (d.a, d.b):
        node, receipt = side.locks.pop()
        side.cache.dec_lock_ref(node, receipt.to_dec_params())
    d.check("unlock")
    d.run(100)
