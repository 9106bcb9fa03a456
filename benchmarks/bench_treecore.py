#!/usr/bin/env python3
"""SGLang 0.5.23 TreeCores through UnifiedRadixCache: mambaradix vs Rust vs Python.

Needs sglang 0.5.23 in .sgl0523 (see .ci/run); loads it the way the tests do
(tests/dropin/sglang_0523/sgl_env.py).  One torch thread, keys and KV indices built
before the timer, median microseconds per call, CPU figures.

Workload: G groups x P prompts; a group shares an S-token prefix, each prompt
adds Q tokens of its own.  Per prompt, in order:
  match miss  - match_prefix before the prompt is cached (hits the group prefix
                after the first prompt of a group), with path_device_indices
  insert      - insert its KV and Mamba state
  match hit   - match_prefix again (whole prompt cached), with path_device_indices
Then `evict` frees one prompt's worth of tokens at a time until the tree is empty.
KV frees are deferred in allocator free groups, as the scheduler defers them.
`cache hit (warm)` repeats a hit through the cache, `core only` the same hit
against tree_core.match_prefix alone, and `insert (core only)` replays the inserts
through tree_core.begin_insert/end_insert on a fresh cache: the difference is what
the controller's own Python costs on top of each core.  `per prompt` is the three
timed calls of one prompt together: the heap grows through the run (the tree,
the deferred frees), and which call meets fresh pages and pays their faults
depends on each core's allocation order, so the sum compares cores best.

`null` is a TreeCore whose hot calls (match_prefix, begin_insert, end_insert,
has_ongoing_insert, collect_full_device_indices) return, through C-level
callables, the results our core gave for the same calls (recorded beforehand,
untimed) and do nothing else.  Through the same UnifiedRadixCache its time is
the controller's own floor: rust/null is the largest ratio to the Rust core
that any core can reach there.  `null+copy` is the same but hands the path's
KV indices back as a fresh tensor (a clone), the least any core must do for
`path_device_indices`: rust/(null+copy) is the cap for a core that does.
`null+numpy` builds that fresh tensor the way our core does (a new numpy array
filled with the path's indices, then torch.from_numpy), with no tree walk.

    python3 benchmarks/bench_treecore.py [--groups 64 --prompts 16 --shared 2048 --unique 128] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
import tracemalloc
from array import array

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "dropin", "sglang_0523"))

import sgl_env  # noqa: E402

sgl_env.bootstrap()

import warnings  # noqa: E402

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.test.kits.unified_radix_cache import fixtures  # noqa: E402
from sglang.test.kits.unified_radix_cache.config import CacheConfig  # noqa: E402
from unittest import mock  # noqa: E402

import mambaradix.sglang.unified as mr_unified  # noqa: E402


def mooncake_prompts(path, n):
    """The first n prompts of a Mooncake trace, each hash id expanded to 512
    deterministic pseudo-tokens (benchmarks/bench_tree.py's expansion)."""
    import gzip
    import json

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from bench_tree import block_tokens

    out, blocks = [], {}
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            if len(out) >= n:
                break
            rec = json.loads(line)
            parts = [blocks.setdefault(h, block_tokens(h)) for h in rec["hash_ids"]]
            if parts:
                import numpy as np

                out.append(np.concatenate(parts)[: rec["input_length"]])
    return out

torch.set_num_threads(1)
now = time.perf_counter_ns
BACKENDS = ("mambaradix", "rust", "python", "null", "null+copy", "null+numpy")
NULL_ID = 1 << 62  # the null core's NodeIds: unique per result, never a real node's


class NullScript:
    """What the null TreeCore hands out, call by call: the results our core
    returned for the same calls, recorded beforehand (untimed)."""

    def __init__(self):
        self.matches = []  # MatchResult per match_prefix call, in call order
        self.inserts = []  # InsertStepResult per begin_insert call
        self.paths = {}  # NodeId -> KV index tensor (collect_full_device_indices(node, root))


def record_null_script(cfg, prompts, warm):
    """Runs run_backend's timed sequence on our core (untimed) and records
    every result the controller gets from the core, with fresh unique NodeIds."""
    from dataclasses import replace

    from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import InsertStepResult

    cache, alloc, pool = build(cfg, "mambaradix")
    core = cache.tree_core
    root = core.root_node_handle()
    script = NullScript()
    real_match, real_insert, real_collect = core.match_prefix, core.begin_insert, core.collect_full_device_indices

    def match(params):
        m = real_match(params)
        fid = NULL_ID + len(script.matches)
        script.paths[fid] = real_collect(m.last_device_node, root)
        script.matches.append(m._replace(last_device_node=fid, last_host_node=fid, best_match_node=fid, cache_actions=[]))
        return m

    def begin_insert(params):
        step = real_insert(params)
        r = step.result
        fid = NULL_ID + (1 << 30) + len(script.inserts)
        script.paths[fid] = real_collect(r.last_device_node, root)
        script.inserts.append(InsertStepResult(actions=list(step.actions), result=replace(r, last_device_node=fid)))
        return step

    core.match_prefix, core.begin_insert = match, begin_insert
    keys = [RadixKey(array("q", p)) for p in prompts]
    kvs = [alloc.alloc(len(p)) for p in prompts]
    states = [pool.mamba_allocator.alloc(1) for _ in prompts]
    alloc.free_group_begin()
    for key, kv, st in zip(keys, kvs, states):
        p = MatchPrefixParams(key=key)
        cache.match_prefix(p)
        r = cache.insert(InsertParams(key=key, value=kv, mamba_value=st))
        cache.match_prefix(p)
        if r.mamba_exist:
            pool.mamba_allocator.free(st)
    alloc.free_group_end()
    p = MatchPrefixParams(key=keys[0])
    for _ in range(warm):
        cache.match_prefix(p)
        core.match_prefix(p)
    return script


_NULL = {"script": None}


def null_core_factory(params, components, copy=None):
    """The null TreeCore: every hot call returns the next prebuilt result and
    does nothing else (C-level callables, no Python frame).  Through the same
    UnifiedRadixCache, its time is the controller's own floor.  copy: the
    path's KV indices come back as a fresh tensor (a clone of the prebuilt
    one), the least a real core does for path_device_indices; copy="numpy":
    the fresh tensor is built the way ours builds it (a new numpy array filled
    with the path's indices, then torch.from_numpy), with no tree walk."""
    import functools

    core = mr_unified._core_class()(params, components)
    script = _NULL["script"]
    core.match_prefix = functools.partial(next, iter(script.matches))
    core.begin_insert = functools.partial(next, iter(script.inserts))
    core.end_insert = list
    core.has_ongoing_insert = bool
    if copy == "numpy":
        paths = {k: v.numpy() for k, v in script.paths.items()}
        from_numpy = torch.from_numpy
        core.collect_full_device_indices = lambda node_id, until: from_numpy(paths[node_id].copy())
    elif copy:
        paths = script.paths
        core.collect_full_device_indices = lambda node_id, until: paths[node_id].clone()
    else:
        core.collect_full_device_indices = script.paths.get  # get(node_id, root) -> the tensor
    return core


def build(cfg, backend):
    """build_fixture's pools, with the production cores (not the kit's inspectors)."""
    mr_unified.register()
    from sglang.srt.mem_cache.unified_cache import tree_core_registry as reg
    from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import UnifiedTreeCoreInterface

    if reg.get_tree_core_factory("null") is None:
        reg.register_tree_core_backend("null", null_core_factory)
        reg.register_tree_core_backend("null+copy", lambda p, c: null_core_factory(p, c, copy="clone"))
        reg.register_tree_core_backend("null+numpy", lambda p, c: null_core_factory(p, c, copy="numpy"))

    with mock.patch.object(fixtures, "_TREE_CORE_REGISTRY", {}), mock.patch.object(
        fixtures, "UnifiedTreeCoreInspectionInterface", UnifiedTreeCoreInterface
    ):
        cache, alloc, pool = fixtures.build_fixture(cfg, tree_core_backend=backend)
    return cache, alloc, pool


def med_us(xs):
    return statistics.median(xs) / 1000.0 if xs else float("nan")


def python_heap_growth(cfg, backend, keys):
    """Python-heap bytes a fresh cache grows by while caching `keys` (untimed;
    torch tensor storage is not traced)."""
    cache, alloc, pool = build(cfg, backend)
    kvs = [alloc.alloc(len(k)) for k in keys]
    states = [pool.mamba_allocator.alloc(1) for _ in keys]
    gc.collect()
    tracemalloc.start()
    m0 = tracemalloc.get_traced_memory()[0]
    for key, kv, st in zip(keys, kvs, states):
        cache.insert(InsertParams(key=key, value=kv, mamba_value=st))
    gc.collect()
    m1 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return m1 - m0


def core_insert_times(cfg, backend, keys):
    """Insert through tree_core.begin_insert/end_insert alone (a fresh cache),
    frees applied untimed: the core's share of an insert."""
    cache, alloc, pool = build(cfg, backend)
    core = cache.tree_core
    kvs = [alloc.alloc(len(k)) for k in keys]
    states = [pool.mamba_allocator.alloc(1) for _ in keys]
    times = []
    alloc.free_group_begin()
    for key, kv, st in zip(keys, kvs, states):
        params = InsertParams(key=key, value=kv, mamba_value=st)
        t0 = now()
        step = core.begin_insert(params)
        actions = list(step.actions)
        while step.result is None:
            step = core.resume_insert()
            actions += step.actions
        actions += core.end_insert()
        times.append(now() - t0)
        cache._apply_cache_actions(actions)
    alloc.free_group_end()
    return times


WARM = 50


def run_backend(backend, cfg, prompts, evict_step):
    if backend.startswith("null"):
        _NULL["script"] = record_null_script(cfg, prompts, WARM)
    gc.collect()
    cache, alloc, pool = build(cfg, backend)
    core_name = type(cache.tree_core).__name__
    root = cache.root_node_handle()
    keys = [RadixKey(array("q", p)) for p in prompts]
    kvs = [alloc.alloc(len(p)) for p in prompts]
    states = [pool.mamba_allocator.alloc(1) for _ in prompts]
    assert all(v is not None for v in kvs) and all(s is not None for s in states), "pools too small"
    t = {"match miss": [], "insert": [], "match hit": [], "per prompt": [], "evict": [], "core only": [],
         "cache hit (warm)": []}
    results = []
    # Frees are deferred as the scheduler defers them (a free group per batch),
    # so the allocator's torch.cat is not billed to each call.
    alloc.free_group_begin()
    for key, kv, st in zip(keys, kvs, states):
        p = MatchPrefixParams(key=key)
        t0 = now()
        m = cache.match_prefix(p)
        idx = cache.path_device_indices(m.last_device_node)
        t1 = now()
        r = cache.insert(InsertParams(key=key, value=kv, mamba_value=st))
        t2 = now()
        m2 = cache.match_prefix(p)
        idx2 = cache.path_device_indices(m2.last_device_node)
        t3 = now()
        t["match miss"].append(t1 - t0)
        t["insert"].append(t2 - t1)
        t["match hit"].append(t3 - t2)
        t["per prompt"].append(t3 - t0)
        results.append((m.device_prefix_len, len(idx), r.prefix_len, m2.device_prefix_len, len(idx2)))
        if r.mamba_exist:
            pool.mamba_allocator.free(st)
    alloc.free_group_end()
    p = MatchPrefixParams(key=keys[0])
    for _ in range(WARM):
        t0 = now()
        cache.match_prefix(p)
        t1 = now()
        cache.tree_core.match_prefix(p)
        t2 = now()
        t["cache hit (warm)"].append(t1 - t0)
        t["core only"].append(t2 - t1)
    if backend.startswith("null"):
        core_name = backend
        return core_name, t, results, None, float("nan")
    tokens = cache.tree_core.total_size()[0]
    if core_name == "MambaradixTreeCore":
        tree_bytes = cache.tree_core._tree.memory_bytes()
    elif core_name.startswith("Rust"):
        tree_bytes = float("nan")  # its native heap is invisible to tracemalloc
    else:
        tree_bytes = python_heap_growth(cfg, backend, keys)
    sizes = (cache.full_evictable_size(), cache.mamba_evictable_size())
    alloc.free_group_begin()
    while cache.full_evictable_size() > 0:
        t0 = now()
        cache.evict(EvictParams(num_tokens=evict_step))
        t["evict"].append(now() - t0)
    alloc.free_group_end()
    assert root == cache.root_node_handle()
    t["insert (core only)"] = core_insert_times(cfg, backend, keys)
    return core_name, t, results, sizes, tree_bytes / max(tokens, 1)


def small_hybrid_config(kv_size, max_context_len, mamba_cache_size):
    """A [FULL, MAMBA] cache with tiny tensors: the benchmark times the tree,
    not the pools."""
    return CacheConfig(
        page_size=1,
        components=(ComponentType.FULL, ComponentType.MAMBA),
        num_layers=2,
        full_attention_layer_ids=(1,),
        head_num=1,
        head_dim=16,
        kv_size=kv_size,
        max_context_len=max_context_len,
        mamba_cache_size=mamba_cache_size,
        mamba_intermediate_size=32,
        mamba_num_heads=1,
        mamba_head_dim=16,
        mamba_state_size=8,
        max_num_reqs=4,
    )


def run_mooncake(backend, prompts, kv_cap, state_cap):
    """Replay Mooncake prompts as a scheduler would: match (prefix locked),
    evict to capacity, insert with the matched prefix's own indices."""
    cfg = small_hybrid_config(kv_cap, max(len(p) for p in prompts) + 16, state_cap)
    gc.collect()
    cache, alloc, pool = build(cfg, backend)
    keys = [RadixKey(array("q", p.tolist())) for p in prompts]
    t = {"match": [], "evict": [], "insert": []}
    results = []
    alloc.free_group_begin()
    for key in keys:
        p = MatchPrefixParams(key=key)
        t0 = now()
        m = cache.match_prefix(p)
        prefix = cache.path_device_indices(m.last_device_node)
        t1 = now()
        t["match"].append(t1 - t0)
        receipt = cache.inc_lock_ref(m.last_device_node)
        need = len(key) - m.device_prefix_len
        short_kv = need - alloc.available_size()
        short_st = 1 - pool.mamba_allocator.available_size()
        if short_kv > 0 or short_st > 0:
            alloc.free_group_end()
            t0 = now()
            r = cache.evict(EvictParams(num_tokens=max(short_kv, 0), mamba_num=max(short_st, 0)))
            t["evict"].append(now() - t0)
            alloc.free_group_begin()
            results.append(("evict", r.num_tokens_evicted, r.mamba_num_evicted))
        alloc.free_group_end()
        fresh = alloc.alloc(need)
        alloc.free_group_begin()
        st = pool.mamba_allocator.alloc(1)
        value = torch.cat([prefix, fresh])
        params = InsertParams(key=key, value=value, mamba_value=st, prev_prefix_len=m.device_prefix_len)
        t0 = now()
        r = cache.insert(params)
        t["insert"].append(now() - t0)
        cache.dec_lock_ref(m.last_device_node, receipt.to_dec_params())
        if r.mamba_exist:
            pool.mamba_allocator.free(st)
        results.append((m.device_prefix_len, m.full_kv_hit_length, r.prefix_len))
    alloc.free_group_end()
    return type(cache.tree_core).__name__, t, results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--shared", type=int, default=2048)
    ap.add_argument("--unique", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="8 x 4 prompts of 512 + 64")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--mooncake", type=int, default=300, help="Mooncake requests to replay (0: skip)")
    ap.add_argument("--trace", default=os.path.join(ROOT, "mambaradix", "sim", "data", "mooncake_conversation_trace.jsonl.gz"))
    a = ap.parse_args()
    if a.quick:
        a.groups, a.prompts, a.shared, a.unique = 8, 4, 512, 64
    prompts = []
    tok = 1000
    for g in range(a.groups):
        shared = list(range(tok, tok + a.shared))
        tok += a.shared
        for _ in range(a.prompts):
            prompts.append(shared + list(range(tok, tok + a.unique)))
            tok += a.unique
    total = a.groups * (a.shared + a.prompts * a.unique)
    n = len(prompts)
    cfg = small_hybrid_config(sum(len(p) for p in prompts) + 16, a.shared + a.unique + 16, n + 16)
    print(f"{a.groups} groups x {a.prompts} prompts of {a.shared} + {a.unique} tokens "
          f"({n} prompts, {total} cached tokens), page 1, [FULL, MAMBA]; "
          f"{platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}")
    # The allocator's free list grows by torch.cat; glibc serves the first
    # buffers of that size by fresh mmap (page faults) until its dynamic mmap
    # threshold adapts, which would bill whichever core runs first.  Warm it.
    for _ in range(3):
        torch.cat((torch.zeros(cfg.kv_size, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)))
    out = {}
    for b in a.backends.split(","):
        try:
            out[b] = run_backend(b, cfg, prompts, a.unique)
        except Exception as e:  # a core that cannot run here is reported, not fatal
            print(f"  {b}: not run ({type(e).__name__}: {e})")
    names = list(out)
    ref = out[names[0]][2]
    same = all(out[b][2] == ref for b in names)
    print(f"cores: {', '.join(f'{b}={out[b][0]}' for b in names)}; identical results: {same}")
    ops = ["match miss", "insert", "match hit", "per prompt", "evict", "cache hit (warm)", "core only", "insert (core only)"]
    ratio_cols = [(x, names[0]) for x in names[1:] if not x.startswith("null")]
    for floor in ("null", "null+copy", "null+numpy"):
        if floor in names and "rust" in names:
            ratio_cols.append(("rust", floor))  # the cap: the most any core can gain on Rust here
        if floor in names:
            ratio_cols.append((names[0], floor))  # how far ours is from the floor
    head = "| op (median us) | " + " | ".join(names) + " | " + " | ".join(f"{x}/{y}" for x, y in ratio_cols) + " |"
    print(head)
    print("|" + "---|" * (1 + len(names) + len(ratio_cols)))
    for op in ops:
        meds = {b: med_us(out[b][1].get(op, [])) for b in names}
        label = {"core only": "match hit (core only, warm)",
                 "per prompt": "per prompt (miss + insert + hit)"}.get(op, op)
        ratios = [f"{meds[x] / meds[y]:.1f}x" if meds[x] == meds[x] and meds[y] == meds[y] else "-" for x, y in ratio_cols]
        print(f"| {label} | " + " | ".join("-" if meds[b] != meds[b] else f"{meds[b]:.1f}" for b in names) + " | "
              + " | ".join(ratios) + " |")
    if "null" in names:
        print("(null: a TreeCore whose hot calls return prebuilt results of the same calls and do nothing else, "
              "through the same UnifiedRadixCache: its time is the controller's floor, and rust/null the largest "
              "ratio to the Rust core that any core can reach through the controller; null+copy: the same, "
              "but path_device_indices gets a fresh copy of the path's KV indices, as any real core must (clone); "
              "null+numpy: that copy made as our core makes it, numpy array + torch.from_numpy)")
    print("| tree bytes / cached token | " + " | ".join(f"{out[b][4]:.1f}" for b in names) + " |" + " |" * len(ratio_cols))
    print("(tree bytes: mambaradix = the C tree's own count; others = Python-heap growth while caching, "
          "tensor storage excluded; the Rust core's native heap is not visible to tracemalloc)")
    if a.mooncake and os.path.exists(a.trace):
        n = a.mooncake if not a.quick else min(a.mooncake, 60)
        prompts = mooncake_prompts(a.trace, n)
        kv_cap, state_cap = 1 << 20, 48
        print(f"\nMooncake replay: first {len(prompts)} requests ({sum(len(p) for p in prompts)} prompt tokens), "
              f"room for {kv_cap} KV tokens and {state_cap} states")
        mc = {}
        names = [b for b in names if not b.startswith("null")]
        for b in names:
            mc[b] = run_mooncake(b, prompts, kv_cap, state_cap)
        same = all(mc[b][2] == mc[names[0]][2] for b in names)
        print(f"identical results: {same}")
        print("| op (median us) | " + " | ".join(names) + " | " + " | ".join(f"{x}/mambaradix" for x in names[1:]) + " |")
        print("|" + "---|" * (2 * len(names)))
        for op in ("match", "insert", "evict"):
            meds = [med_us(mc[b][1][op]) for b in names]
            print(f"| {op} ({len(mc[names[0]][1][op])} calls) | " + " | ".join(f"{m:.1f}" for m in meds) + " | "
                  + " | ".join(f"{m / meds[0]:.1f}x" for m in meds[1:]) + " |")


if __name__ == "__main__":
    main()
