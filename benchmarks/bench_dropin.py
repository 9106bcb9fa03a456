"""The drop-in against SGLang v0.5.15's own classes, side by side in one run
(CPU tensors).

  sglang        SGLang's own MambaRadixCache (mamba_radix_cache.py), its
                HybridReqToTokenPool (memory_pool.py), MambaSlotAllocator and
                TokenToKVPoolAllocator, loaded from the installed 0.5.15
                wheel's files as tests/dropin/test_sglang_oracle.py loads them
                (tests/dropin/sglang_wheel.py)
  dropin/sg     mambaradix.sglang.MambaRadixCache over those same SGLang pools
  dropin/own    mambaradix.sglang.MambaRadixCache over its own pools
  batch         mambaradix._C.Lifecycle's one-call-per-batch API (per request
                only)

Per operation: match miss, insert, match hit, on 64 groups x 16 prompts of
2048 shared + 128 own tokens (keys, KV indices and state slots built before
the timer); the median over the operations of one timed pass after a
warm-up pass on a fresh cache.  The inserts run inside one free group of the
KV allocator (the duplicate indices they free are gathered, as SGLang's
scheduler gathers a batch's frees; the group's end is not timed).

Per request, scheduler-side, in batches of --batch requests (the batch API's
call size; a batch's requests cannot hit each other's prefixes): each request
is matched (capped at len - 1, copy-on-write) and locked, the batch is
admitted by SGLang's own alloc_req_slots (read from the wheel's common.py),
each request gets its extend KV written to the req-to-token table and the
prefill tracking decision, then cache_unfinished_req, one decode token,
cache_finished_req and the row's release, the KV frees of each step inside
one free group as SGLang's scheduler does; no model runs.  Workloads: the
shared-prefix generator and the Mooncake conversation trace of
bench_lifecycle.py.  The median of --repeat runs, each on fresh caches,
with nothing wrapped around any method.  Then, per workload:
  memory floor    memory_floor(): the least data any implementation must
                  move per request, as bulk copies; sglang / floor is the
                  most any implementation can reach
  clocked run     one more run of each implementation with a clock around
                  every cache, pool and allocator method; what is left is
                  the scheduler's own code (Req objects, its tensors, the
                  loop), and sglang / that is the most a cache and pools
                  behind SGLang's per-request API can reach

  python3 benchmarks/bench_dropin.py [--requests N] [--groups G] [--repeat R]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import types
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path[:0] = [os.path.join(ROOT, "tests", d) for d in ("", "core", "dropin")]

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sglang_wheel  # noqa: E402
from bench_lifecycle import mooncake_workload, op_prompts, run_batch, shared_prefix_workload  # noqa: E402
from mambaradix import _C  # noqa: E402
from mambaradix import sglang as mrs  # noqa: E402
from mambaradix.driver import prefill_track_point  # noqa: E402
from test_sglang_oracle import _SERVER_ARGS  # noqa: E402

CHUNK = 64
INTERVAL = 256


# ---------------------------------------------------------------------------
# The three set-ups


def _own_pools(rows, slots, kv, ctx):
    shape = mrs.Mamba2StateShape(conv=[(1,)], temporal=(1,), intermediate_size=1, conv_dim=1, ssm_state_size=1,
                                 num_heads=1, head_dim=1, state_size=1, conv_kernel=2)
    params = mrs.Mamba2CacheParams(shape=shape, layers=[0],
                                   dtype=mrs.Mamba2StateDType(conv=torch.int64, temporal=torch.int64))
    pool = mrs.HybridReqToTokenPool(size=rows, mamba_size=slots, mamba_spec_state_size=0, max_context_len=ctx,
                                    device="cpu", enable_memory_saver=False, cache_params=params,
                                    mamba_layer_ids=[0], enable_mamba_extra_buffer=True,
                                    mamba_cache_chunk_size=CHUNK, mamba_track_interval=INTERVAL)
    alloc = mrs.TokenToKVPoolAllocator(kv, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
    return pool, alloc


class _FloorCache:
    """The per-operation floor: what any cache behind SGLang's v0.5.15 API must
    do per call over SGLang's own pools, with no tree work at all (the
    answers are looked up by key, computed before the timer).  A match
    returns a fresh ``MatchResult`` (built as the tuple it is, the cheapest
    way) whose ``device_indices`` is a fresh tensor over KV indices already
    in host memory, and the node.  An insert hands the caller's duplicate KV
    indices (those of the tokens the tree already had) to the allocator's
    ``free`` as a tensor -- inside SGLang's free group a list append -- and
    returns a fresh ``InsertResult``.  The ratio SGLang / floor is the most
    any implementation of the API can reach over SGLang's own class."""

    def __init__(self, alloc):
        self._alloc = alloc
        self._answers = {}   # id(token array) -> int64 numpy array of the matched KV indices
        self._dups = {}      # id(token array) -> int64 numpy array of an insert's duplicates
        self.root_node = object()

    def match_prefix(self, params):
        a = self._answers.get(id(params.key.token_ids))
        r = self.root_node
        return _tuple_new(mrs.MatchResult, (torch.from_numpy(_EMPTY if a is None else a), r, r, r, 0, 0, 0,
                                            None, None))

    def insert(self, params):
        d = self._dups.get(id(params.key.token_ids))
        if d is not None:
            self._alloc.free(torch.from_numpy(d))
        return mrs.InsertResult(prefix_len=len(params.key), mamba_exist=False, last_device_node=self.root_node)


_tuple_new = tuple.__new__


_EMPTY = np.empty(0, dtype=np.int64)


def setup(sg, impl, rows, slots, kv, ctx):
    """(cache, pool, allocator, api) for one implementation."""
    if impl == "floor":
        pool, alloc = sglang_wheel.make_pools(sg, size=rows, mamba_size=slots, max_context_len=ctx, kv_size=kv,
                                              extra_buffer=True)
        api = types.SimpleNamespace(RadixKey=sg.RadixKey, MatchPrefixParams=sg.MatchPrefixParams,
                                    InsertParams=sg.InsertParams, EvictParams=sg.EvictParams)
        return _FloorCache(alloc), pool, alloc, api
    if impl == "dropin/own":
        pool, alloc = _own_pools(rows, slots, kv, ctx)
    else:
        pool, alloc = sglang_wheel.make_pools(sg, size=rows, mamba_size=slots, max_context_len=ctx, kv_size=kv,
                                              extra_buffer=True)
    if impl == "sglang":
        _SERVER_ARGS.mamba_cache_chunk_size = CHUNK
        params = types.SimpleNamespace(req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=1,
                                       disable=False, enable_kv_cache_events=False, enable_mamba_extra_buffer=True,
                                       enable_mamba_extra_buffer_lazy=False, enable_metrics=False)
        cache = sg.MambaRadixCache(params)
        api = types.SimpleNamespace(RadixKey=sg.RadixKey, MatchPrefixParams=sg.MatchPrefixParams,
                                    InsertParams=sg.InsertParams, EvictParams=sg.EvictParams)
    else:
        init = mrs.CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc,
                                   page_size=1, enable_mamba_extra_buffer=True)
        cache = mrs.MambaRadixCache(init, chunk_size=CHUNK, track_interval=INTERVAL)
        api = types.SimpleNamespace(RadixKey=mrs.RadixKey, MatchPrefixParams=mrs.MatchPrefixParams,
                                    InsertParams=mrs.InsertParams, EvictParams=mrs.EvictParams)
    api.alloc_req_slots = sglang_wheel.alloc_req_slots_for(sg, api.EvictParams)
    return cache, pool, alloc, api


# ---------------------------------------------------------------------------
# Per operation


def per_op(sg, impl, groups, per_group, shared, own, seed=0):
    prompts, misses = op_prompts(groups, per_group, shared, own, seed)
    n = len(prompts)
    out = {}
    for timed in (False, True):   # a warm-up pass on its own cache, then the timed one
        # the garbage of earlier passes (SGLang's tree is a web of cycles) is
        # collected before the pass, not by a collection the pass triggers
        gc.collect()
        cache, pool, alloc, api = setup(sg, impl, 8, n + 8, n * (shared + own) + 64, shared + own + 8)
        keys = [api.RadixKey(p, None) for p in prompts]
        miss_keys = [api.RadixKey(m, None) for m in misses]
        values = [alloc.alloc(len(p)) for p in prompts]
        slots = [pool.mamba_allocator.alloc(1) for _ in prompts]
        if impl == "floor":   # the answers a hit returns and an insert's duplicates, known before the timer
            cache._answers.update((id(p), v.numpy()) for p, v in zip(prompts, values))
            cache._dups.update((id(p), v.numpy()[:shared]) for i, (p, v) in enumerate(zip(prompts, values))
                               if i % per_group)
        t_miss, t_ins, t_hit = [], [], []
        # an insert frees the caller's duplicate KV indices; SGLang's
        # allocator appends them to a torch free list (a torch.cat over the
        # whole pool), so, as SGLang's scheduler does around a batch, the
        # frees are grouped and the group's end is not timed
        alloc.free_group_begin()
        for k in miss_keys:
            p = api.MatchPrefixParams(key=k)
            t0 = time.perf_counter_ns()
            cache.match_prefix(p)
            t_miss.append(time.perf_counter_ns() - t0)
        for k, v, s in zip(keys, values, slots):
            p = api.InsertParams(key=k, value=v, mamba_value=s)
            t0 = time.perf_counter_ns()
            cache.insert(p)
            t_ins.append(time.perf_counter_ns() - t0)
        alloc.free_group_end()
        for k in keys:
            p = api.MatchPrefixParams(key=k)
            t0 = time.perf_counter_ns()
            r = cache.match_prefix(p)
            t_hit.append(time.perf_counter_ns() - t0)
            assert len(r.device_indices) == len(k), (impl, len(r.device_indices))
        if timed:
            out = {"match miss": statistics.median(t_miss) / 1e3, "insert": statistics.median(t_ins) / 1e3,
                   "match hit": statistics.median(t_hit) / 1e3}
            if impl == "floor":
                out["key read"] = key_read(prompts)
    return out


def key_read(prompts) -> float:
    """The least time a hit or an insert spends on its key beyond the API's
    floor: one pass over all its tokens (each must be compared with the
    tree), timed as one C pass, the int64 -> int32 narrowing a tree-only
    RadixTree's match runs (read ahead, vectorised), on an empty tree, less
    the same call on a one-token key.  The keys are read in the order, and
    so at the temperature, the timed operations read them (each read once
    in a pass over 1024 keys of 17 KiB, so a key is cold again by its turn).
    Median us."""
    tree = _C.RadixTree()
    one = array("q", [1])
    t_key, t_one = [], []
    clock = time.perf_counter_ns
    for p in prompts:
        t0 = clock()
        tree.match_prefix(p)
        t1 = clock()
        tree.match_prefix(one)
        t_one.append(clock() - t1)
        t_key.append(t1 - t0)
    return max(0.0, statistics.median(t_key) - statistics.median(t_one)) / 1e3


# ---------------------------------------------------------------------------
# Per request


class _Clock:
    """Per-call clocks for the breakdown run (they add their own cost, so
    the headline run has none): the seconds spent in the cache's methods
    and in the pools' and allocators' methods, each call counted once (a
    pool method the cache calls is the cache's time; one pool method
    calling another is one call)."""

    def __init__(self):
        self.seconds = {"cache": 0.0, "pools": 0.0}
        self.active = None

    def wrap(self, part, fn):
        def call(*args, **kwargs):
            if self.active is not None:
                return fn(*args, **kwargs)
            self.active = part
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - t0
                self.active = None

        return call

    def patch(self, part, obj, names):
        """Shadows obj's methods `names` with clocked ones (instance
        attributes: the object's own calls through self go through them too)."""
        for name in names:
            setattr(obj, name, self.wrap(part, getattr(obj, name)))


_CACHE_METHODS = ("match_prefix", "inc_lock_ref", "dec_lock_ref", "evict", "cache_unfinished_req",
                  "cache_finished_req")
_POOL_METHODS = ("alloc", "free", "write", "available_size", "get_mamba_ping_pong_other_idx",
                 "free_mamba_cache")
_ALLOC_METHODS = ("alloc", "free", "available_size", "free_group_begin", "free_group_end")
_STATE_ALLOC_METHODS = ("alloc", "free", "available_size", "schedulable_available_size")


def per_request(sg, impl, reqs, cfg, batch, clocked=False):
    """Batches of `batch` requests, as a scheduler runs them: KV frees of a
    batch's results inside one free group (SGLang's scheduler does this).
    With `clocked`, also the seconds spent inside the cache's own methods
    ("cache") and inside the pools' and allocators' ("pools"): the rest is
    the scheduler's own code, which no cache or pool can make faster."""
    cache, pool, alloc, api = setup(sg, impl, cfg["rows"], cfg["states"], cfg["kv"], cfg["ctx"])
    clock = _Clock()
    if clocked:
        clock.patch("cache", cache, _CACHE_METHODS)
        clock.patch("pools", pool, _POOL_METHODS)
        clock.patch("pools", alloc, _ALLOC_METHODS)
        clock.patch("pools", pool.mamba_allocator, _STATE_ALLOC_METHODS)
    hits = 0
    prefix_lens = []
    t0 = time.perf_counter()
    for s in range(0, len(reqs), batch):
        group = [mrs.Req(rid=s + i, origin_input_ids=toks) for i, toks in enumerate(reqs[s : s + batch])]
        for req in group:                                     # match (copy-on-write)
            toks = req.origin_input_ids
            res = cache.match_prefix(api.MatchPrefixParams(key=api.RadixKey(toks[: len(toks) - 1], None),
                                                           cow_mamba=True, req=req))
            req.prefix_indices = res.device_indices
            req.last_node = res.last_device_node
            req.mamba_branching_seqlen = res.mamba_branching_seqlen
            req.cache_protected_len = len(req.prefix_indices)
            req.set_extend_range(len(req.prefix_indices), len(toks))
            cache.inc_lock_ref(req.last_node)
        api.alloc_req_slots(pool, group, cache)               # SGLang's own admission
        for req in group:                                     # KV, table, tracking decision
            n, P = len(req.origin_input_ids), len(req.prefix_indices)
            E = n - P
            if alloc.available_size() < E:
                cache.evict(api.EvictParams(num_tokens=E))
            kv = alloc.alloc(E)
            row = req.req_pool_idx
            if P:
                pool.write((row, slice(0, P)), req.prefix_indices.to(torch.int32))
            pool.write((row, slice(P, n)), kv.to(torch.int32))
            req.kv_committed_len = req.kv_allocated_len = n
            req.mamba_cow_src_index = None
            req.mamba_needs_clear = False
            point = prefill_track_point(P, E, CHUNK, req.mamba_branching_seqlen)
            if point is not None:
                req.mamba_next_track_idx = pool.get_mamba_ping_pong_other_idx(req.mamba_next_track_idx)
                req.mamba_last_track_seqlen = point
            hits += P
            prefix_lens.append(P)
        alloc.free_group_begin()
        for req in group:                                     # end of prefill
            req.output_ids.append(1)
            req._refresh_fill_ids()
            cache.cache_unfinished_req(req)
        alloc.free_group_end()
        for req in group:                                     # one decode token
            n = len(req.origin_input_ids)
            if alloc.available_size() < 1:
                cache.evict(api.EvictParams(num_tokens=1))
            loc = alloc.alloc(1)
            pool.write((req.req_pool_idx, slice(n, n + 1)), loc.to(torch.int32))
            req.kv_committed_len = req.kv_allocated_len = n + 1
            req.output_ids.append(2)
            req._refresh_fill_ids()
        alloc.free_group_begin()
        for req in group:                                     # finish
            cache.cache_finished_req(req)
            pool.free(req)
        alloc.free_group_end()
    dt = time.perf_counter() - t0
    cache.sanity_check()
    return {"seconds": dt, "hits": hits, "prefix_lens": prefix_lens, **clock.seconds}


def memory_floor(reqs, prefix_lens, cfg, batch, repeat):
    """A lower bound, per request, for any implementation of the per-request
    work: the least data it must move, as bulk numpy copies per batch of
    `batch` requests, with no tree walk, no call per request and no result
    object.  For a request of n tokens of which P hit (as SGLang's class
    hits them) and E = n - P are new:
      - read its n tokens once (narrowed to int32, as the tree keeps them);
      - write its n KV indices into its req-to-token row (the P cached ones
        read from the tree);
      - take E fresh KV indices from a free list;
      - store the E new tokens and their E indices in the tree.
    Frees, evictions, locks, state slots and the decode token are left out,
    so the true floor is higher.  Returns (us per request median of `repeat`
    passes)."""
    kv = cfg["kv"]
    batches = []
    for s in range(0, len(reqs), batch):
        group = reqs[s : s + batch]
        keys = np.concatenate([np.frombuffer(r, dtype=np.int64) for r in group])
        new = sum(len(r) - p for r, p in zip(group, prefix_lens[s : s + batch]))
        batches.append((keys, new))
    width = max(len(k) for k, _ in batches)
    key32 = np.empty(width, dtype=np.int32)
    rows = np.empty(width, dtype=np.int64)
    fresh = np.empty(width, dtype=np.int64)
    free_list = np.arange(1, kv + 1, dtype=np.int64)
    tree_keys = np.empty(kv, dtype=np.int32)
    tree_values = np.empty(kv, dtype=np.int64)
    runs = []
    for _ in range(repeat + 1):   # the first pass warms up
        at = 0
        t0 = time.perf_counter()
        for keys, new in batches:
            n = len(keys)
            np.copyto(key32[:n], keys, casting="unsafe")   # read the tokens
            if at + new > kv:
                at = 0
            fresh[:new] = free_list[at : at + new]         # E fresh indices
            rows[: n - new] = tree_values[: n - new]         # the rows get the P cached indices
            rows[n - new : n] = fresh[:new]                  # and the E fresh ones
            tree_keys[at : at + new] = key32[n - new : n]    # the tree keeps E tokens
            tree_values[at : at + new] = fresh[:new]         # and their E indices
            at += new
        runs.append((time.perf_counter() - t0) / len(reqs) * 1e6)
    return statistics.median(runs[1:])


# ---------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--per-group", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ops-only", action="store_true", help="only the per-operation table")
    ap.add_argument("--trace", default=os.path.join(ROOT, "..", "shared", "data", "mooncake_conversation_trace.jsonl"))
    args = ap.parse_args()
    sg = sglang_wheel.load()
    impls = ("sglang", "dropin/sg", "dropin/own")

    print(f"Per operation (us, median; {args.groups} groups x {args.per_group} prompts of 2048 + 128 tokens;")
    print(" floor: the API's own cost with no tree work, see _FloorCache; 'cap' = sglang / floor;")
    print(" 'cap+read' = sglang / (floor + one pass over the key, key_read()): a hit or an insert compares")
    print(" every token of its key with the tree, a miss only its first)")
    op_impls = impls + ("floor",)
    ops = {impl: per_op(sg, impl, args.groups, args.per_group, 2048, 128) for impl in op_impls}
    head = (f"{'operation':12}" + "".join(f"{i:>12}" for i in op_impls)
            + "".join(f"{'x ' + i:>14}" for i in impls[1:]) + f"{'cap':>8}{'cap+read':>10}")
    print(head)
    print("-" * len(head))
    read = ops["floor"]["key read"]
    for op in ("match miss", "insert", "match hit"):
        base, floor = ops["sglang"][op], ops["floor"][op]
        print(f"{op:12}" + "".join(f"{ops[i][op]:12.2f}" for i in op_impls)
              + "".join(f"{base / ops[i][op]:13.1f}x" for i in impls[1:]) + f"{base / floor:7.1f}x"
              + f"{base / (floor + (0.0 if op == 'match miss' else read)):9.1f}x")
    print(f"(one C pass over a 2176-token key, as the operations read it: {read:.2f} us)")

    if args.ops_only:
        return
    workloads = [("shared-prefix", shared_prefix_workload(args.requests))]
    if os.path.exists(args.trace):
        workloads.append(("mooncake", mooncake_workload(args.trace, args.requests)))
    else:
        print(f"(no Mooncake trace at {args.trace}; skipped)")
    print()
    print(f"Per request (us, median of {args.repeat} runs; batch API: {args.batch} requests a call)")
    head = f"{'workload':14}" + "".join(f"{i:>12}" for i in impls + ("batch",)) \
        + "".join(f"{'x ' + i:>14}" for i in impls[1:] + ("batch",))
    print(head)
    print("-" * len(head))
    for name, reqs in workloads:
        reqs = [array("q", r) for r in reqs]
        ctx = max(len(r) for r in reqs) + 8
        total = sum(len(r) for r in reqs)
        cfg = {"kv": max(400_000, min(total // 4, 4_000_000)), "states": 192, "rows": 64, "ctx": ctx}
        us, hits, prefix_lens = {}, {}, None
        for impl in impls + ("batch",):
            runs = []
            for _ in range(args.repeat):
                r = (run_batch(reqs, cfg, args.batch) if impl == "batch"
                     else per_request(sg, impl, reqs, cfg, args.batch))
                runs.append(r["seconds"])
                hits[impl] = r["hits"]
                if impl == "sglang":
                    prefix_lens = r["prefix_lens"]
            us[impl] = statistics.median(runs) / len(reqs) * 1e6
        base = us["sglang"]
        floor = memory_floor(reqs, prefix_lens, cfg, args.batch, args.repeat)
        print(f"{name:14}" + "".join(f"{us[i]:12.1f}" for i in impls + ("batch",))
              + "".join(f"{base / us[i]:13.1f}x" for i in impls[1:] + ("batch",)))
        print(f"  ({len(reqs)} requests, {total / len(reqs):.0f} tokens/request; hit tokens: "
              + ", ".join(f"{i} {hits[i]}" for i in impls + ("batch",)) + ")")
        print(f"  memory floor (memory_floor: the least data any implementation moves) {floor:.1f} us/request: "
              f"no implementation can pass sglang/floor = {base / floor:.1f}x")
        print("  one more run of each with per-call clocks (us/request: the clocks add their own cost):")
        for i in impls:
            r = per_request(sg, i, reqs, cfg, args.batch, clocked=True)
            whole, in_cache, in_pools = (r[k] / len(reqs) * 1e6 for k in ("seconds", "cache", "pools"))
            rest = whole - in_cache - in_pools
            print(f"    {i:11} whole {whole:7.1f}  cache {in_cache:7.1f}  pools {in_pools:7.1f}  scheduler's own code "
                  f"{rest:6.1f}: a zero-cost cache over these pools would reach {base / (whole - in_cache):.1f}x, "
                  f"over zero-cost pools too {base / rest:.1f}x")


if __name__ == "__main__":
    main()
