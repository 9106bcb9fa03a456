"""The installed package as SGLang sees it: a general plugin that SGLang's own start-up code
(``sglang.srt.plugins.load_plugins``) runs, after which environment variables alone select the mambaradix
TreeCore through SGLang's own factory and set its options.  Each case is a fresh process whose only
mambaradix-specific input is its environment (the SGLang 0.5.23 CPU stand-ins are the tests' own)."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# What a scheduler process does: load the plugins, then build its cache from CacheInitParams that name no
# TreeCore backend (SGLang reads SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND).
SCRIPT = """
import logging, sys
sys.path.insert(0, {here!r})
import sgl_env
sgl_env.bootstrap()
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(name)s %(message)s")
import torch
from sglang.srt.plugins import load_plugins
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

load_plugins()
set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=1))
kv = MHATokenToKVPool(size=64, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=8, layer_num=1,
                      device="cpu", enable_memory_saver=False)
alloc = TokenToKVPoolAllocator(size=64, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False)
for n in range(2):
    cache = UnifiedRadixCache(params=CacheInitParams(
        req_to_token_pool=ReqToTokenPool(size=2, max_context_len=64, device="cpu", enable_memory_saver=False),
        token_to_kv_pool_allocator=alloc, page_size=1, disable=False, tree_components=(ComponentType.FULL,)))
print("CORE", type(cache.tree_core).__name__, cache.supports_fast_match_prefix())
"""


# A hybrid (FULL + MAMBA) cache, built the way SGLang's unit-test kit builds one, after the plugins loaded.
HYBRID_SCRIPT = """
import logging, sys
sys.path.insert(0, {here!r})
import sgl_env
sgl_env.bootstrap()
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(name)s %(message)s")
from sglang.srt.plugins import load_plugins
load_plugins()
import dual
from sglang.test.kits.unified_radix_cache.config import CacheConfig
cfg = CacheConfig(page_size=1, components=(dual.FULL, dual.MAMBA), enable_mamba_extra_buffer=True,
                  mamba_cache_size=40, kv_size=512, max_context_len=512, eviction_policy={policy!r})
import os
cache, alloc, pool = dual.build(cfg, os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"])
core = cache.tree_core
tree = getattr(core, "_tree", None)
print("CORE", type(core).__name__, type(cache.components[dual.MAMBA]).__name__,
      tree and tree.lru_policy, tree and int(tree.policy_stats()["mru"]))
"""


def _run(**env_extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MAMBARADIX_") or k in ("MAMBARADIX_SGLANG_0523",)}
    env.pop("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", None)
    env.pop("SGLANG_PLUGINS", None)
    env.update(env_extra)
    script = HYBRID_SCRIPT.format(here=HERE, policy=env.pop("POLICY", "lru")) if env.pop("HYBRID", "") else (
        SCRIPT.format(here=HERE))
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)


def test_the_package_declares_the_plugin():
    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("mambaradix") == "mambaradix.sglang.plugin:load", (
        f"sglang.srt.plugins entry points: {eps}; an install older than the entry point needs `pip install -e .`")


def test_environment_variables_alone_select_our_core():
    r = _run(SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="mambaradix")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "CORE MambaradixTreeCore False" in r.stdout, r.stdout[-3000:]
    logged = [ln for ln in r.stdout.splitlines() if "mambaradix TreeCore settings" in ln]
    assert logged == ["LOG mambaradix.sglang.unified mambaradix TreeCore settings: fast_match_prefix=False (default), "
                      "state_policy=None (default), utility_order='mru' (default), end_of_turn_states=False "
                      "(default), path_state_budget=0 (default)"]


def test_a_setting_from_the_environment_is_used_and_logged_with_its_source():
    r = _run(SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="mambaradix", MAMBARADIX_FAST_MATCH_PREFIX="on")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "CORE MambaradixTreeCore True" in r.stdout, r.stdout[-3000:]
    assert "fast_match_prefix=True (MAMBARADIX_FAST_MATCH_PREFIX)" in r.stdout


def test_without_the_switch_sglang_keeps_its_own_core():
    r = _run()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "CORE " in r.stdout and "CORE MambaradixTreeCore" not in r.stdout, r.stdout[-3000:]


def test_sglang_plugins_allow_list_without_us_leaves_the_backend_unregistered():
    r = _run(SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="mambaradix", SGLANG_PLUGINS="someone_else")
    assert r.returncode != 0 and "'mambaradix' is not registered" in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_an_unreadable_setting_is_refused_naming_the_variable(value):
    r = _run(SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="mambaradix", MAMBARADIX_FAST_MATCH_PREFIX=value)
    assert r.returncode != 0
    assert f"ValueError: MAMBARADIX_FAST_MATCH_PREFIX={value!r}: expected one of 1/0" in r.stderr, r.stderr[-3000:]


def test_state_policies_from_the_environment_reach_the_tree_and_sglangs_component_seam():
    """The state policy (a name of the C tree's policy table, passed through), its order, end-of-turn
    states and the budget: the tree runs the policy, and the cache's MAMBA component is mambaradix's,
    supplied through CacheInitParams.component_registry_override by the plugin's hook."""
    r = _run(HYBRID="1", SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="mambaradix", MAMBARADIX_STATE_POLICY="utility",
             MAMBARADIX_UTILITY_ORDER="lru", MAMBARADIX_END_OF_TURN_STATES="1", MAMBARADIX_PATH_STATE_BUDGET="2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "CORE MambaradixTreeCore EndOfTurnMambaComponent utility 0\n" in r.stdout, r.stdout[-3000:]
    logged = [ln for ln in r.stdout.splitlines() if "mambaradix TreeCore settings" in ln]
    assert len(logged) == 1 and logged[0].endswith(
        "state_policy='utility' (MAMBARADIX_STATE_POLICY), utility_order='lru' (MAMBARADIX_UTILITY_ORDER), "
        "end_of_turn_states=True (MAMBARADIX_END_OF_TURN_STATES), path_state_budget=2 "
        "(MAMBARADIX_PATH_STATE_BUDGET)"), logged


def test_without_state_settings_the_cache_keeps_sglangs_component_and_lru():
    r = _run(HYBRID="1", SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="mambaradix", MAMBARADIX_STATE_POLICY="consumed",
             MAMBARADIX_UTILITY_ORDER="mru")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "CORE MambaradixTreeCore MambaComponent consumed" in r.stdout, r.stdout[-3000:]
    # on SGLang's own cores the settings change nothing: no component of ours, no error
    r = _run(HYBRID="1", SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="python", MAMBARADIX_END_OF_TURN_STATES="1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "CORE UnifiedTreeCoreInspector MambaComponent None" in r.stdout, r.stdout[-3000:]


def test_a_state_policy_with_another_sglang_eviction_policy_is_refused_naming_the_variable():
    r = _run(HYBRID="1", POLICY="lfu", SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="mambaradix",
             MAMBARADIX_STATE_POLICY="utility")
    assert r.returncode != 0
    assert "ValueError: MAMBARADIX_STATE_POLICY='utility': the state policy replaces SGLang's lru; " \
           "--radix-eviction-policy is 'lfu'" in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("var, value, says", [
    ("MAMBARADIX_STATE_POLICY", "nonsense", "expected a policy of the tree's table"),
    ("MAMBARADIX_UTILITY_ORDER", "up", "expected mru or lru"),
    ("MAMBARADIX_END_OF_TURN_STATES", "maybe", "expected one of 1/0"),
    ("MAMBARADIX_PATH_STATE_BUDGET", "-1", "expected an integer >= 0"),
    ("MAMBARADIX_PATH_STATE_BUDGET", "two", "expected an integer >= 0"),
])
def test_an_unreadable_state_setting_is_refused_naming_the_variable(var, value, says):
    r = _run(SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="mambaradix", **{var: value})
    assert r.returncode != 0
    assert f"ValueError: {var}={value!r}: {says}" in r.stderr, r.stderr[-3000:]


# A cache our core cannot serve (a page size past 128 falls back to SGLang's Python TreeCore), with
# end-of-turn states and a budget set: the hook leaves SGLang's own MAMBA component there, and a request
# finishes as on SGLang's core (our component's cleanup asks the core for trim_path_states).
FALLBACK_SCRIPT = """
import logging, sys
sys.path.insert(0, {here!r})
import sgl_env
sgl_env.bootstrap()
from sglang.srt.plugins import load_plugins
load_plugins()
from array import array
import dual
from sglang.test.kits.unified_radix_cache.config import CacheConfig
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.mem_cache_utils import finish_req
PS = 256
cfg = CacheConfig(page_size=PS, components=(dual.FULL, dual.MAMBA), enable_mamba_extra_buffer=True,
                  mamba_cache_size=40, kv_size=8 * PS, max_context_len=8 * PS)
cache, alloc, pool = dual.build(cfg, "mambaradix")
print("CORE", type(cache.tree_core).__name__, type(cache.components[dual.MAMBA]).__name__)
toks = list(range(1, 2 * PS + 1))
req = Req(rid="r0", origin_input_text="", origin_input_ids=array("q", toks),
          sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
req.extra_key = None
req.cache_salt = None
pool.alloc([req])
req.output_ids = array("q")
req.full_untruncated_fill_ids = array("q", toks)
m = cache.match_prefix(MatchPrefixParams(key=dual._key(toks)))
req.last_node = m.last_device_node
req.lock = cache.lock(m.last_device_node)
n = len(toks)
pool.write((req.kv.req_pool_idx, slice(0, n)), alloc.alloc(n))
req.kv.cache_protected_len = 0
req.kv.kv_allocated_len = req.kv.kv_committed_len = req.kv.mamba_last_track_seqlen = n
req.kv.mamba_last_track_idx = 0
finish_req(cache, req, n)
print("FINISHED", cache.full_evictable_size() if hasattr(cache, "full_evictable_size") else "")
"""


def test_a_cache_on_sglangs_own_core_keeps_sglangs_component_with_our_state_settings():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAMBARADIX_")}
    env.update(SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="mambaradix", MAMBARADIX_END_OF_TURN_STATES="1",
               MAMBARADIX_PATH_STATE_BUDGET="2")
    r = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT.format(here=HERE)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "CORE UnifiedTreeCore MambaComponent\n" in r.stdout and "FINISHED" in r.stdout, r.stdout[-3000:]
