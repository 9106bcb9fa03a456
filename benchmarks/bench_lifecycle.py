"""Scheduler-side cache work per request: match + admission + tracking
decisions + caching (end of prefill and finish), in one run, three ways:

  python    a pure-Python implementation of the same logic in SGLang's style
            (benchmarks/_py_lifecycle_baseline.py; torch index tensors)
  dropin    mambaradix.sglang (MambaRadixCache + HybridReqToTokenPool + the
            allocators + Req), called per request as SGLang's scheduler does
  batch     mambaradix._C.Lifecycle's one-call-per-batch API

Each request: match (capped at input_len - 1, copy-on-write), admission,
lock, KV for the extend written to the req-to-token table, the prefill
tracking decision, cache_unfinished_req at the end of prefill, one decode
step (KV + tracking decision), cache_finished_req and the row's release.
No model runs: the numbers are the cache's own work.

Workloads: a generated shared-prefix one and the Mooncake conversation
trace (512-token blocks from hash_ids expanded to deterministic pseudo
tokens).  State traffic is counted per workload: copies (copy-on-write at
hits; no_buffer forks) vs slots donated to the tree without a copy.

  python3 benchmarks/bench_lifecycle.py [--requests N] [--batch B] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from array import array
from typing import Callable, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import torch  # noqa: E402

from _py_lifecycle_baseline import PyHybridCache, PyReq  # noqa: E402
from mambaradix import _C  # noqa: E402
from mambaradix.sglang import (  # noqa: E402
    CacheInitParams,
    HybridReqToTokenPool,
    Mamba2CacheParams,
    Mamba2StateDType,
    Mamba2StateShape,
    MambaRadixCache,
    Req,
    TokenToKVPoolAllocator,
    alloc_req_slots,
    release_kv_cache,
)
from mambaradix.sglang.pools import _rs_of  # noqa: E402

CHUNK = 64
_OUT = array("q", [1, 2])
INTERVAL = 256
# Qwen3-Next-80B-A3B, TP=1: 36 GDN layers x (conv 8192x3 bf16 + SSM 32x128x128 fp32)
QWEN3_NEXT_STATE_BYTES = 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4)


# ---------------------------------------------------------------------------
# Workloads


def shared_prefix_workload(n: int, seed: int = 0) -> List[List[int]]:
    """n requests over 32 system prompts (1-3k tokens) with 16-600 token
    user suffixes; a third are follow-ups of an earlier request."""
    rng = random.Random(seed)
    systems = [[rng.randint(1, 50000) for _ in range(rng.randint(1000, 3000))] for _ in range(32)]
    out: List[List[int]] = []
    for _ in range(n):
        if out and rng.random() < 0.33:
            prev = rng.choice(out)
            out.append(prev + [rng.randint(1, 50000) for _ in range(rng.randint(16, 300))])
        else:
            out.append(rng.choice(systems) + [rng.randint(1, 50000) for _ in range(rng.randint(16, 600))])
    return out


def mooncake_workload(path: str, n: int) -> List[List[int]]:
    """The first n requests of the Mooncake trace; each hash id becomes 512
    deterministic pseudo tokens, the last block cut to input_length."""
    out = []
    base = np.arange(512, dtype=np.int64)
    with open(path) as f:
        for line in f:
            if len(out) >= n:
                break
            r = json.loads(line)
            blocks = [((h * 1000003 + base * 7919) % 49999) + 1 for h in r["hash_ids"]]
            toks = np.concatenate(blocks)[: r["input_length"]] if blocks else np.zeros(0, dtype=np.int64)
            out.append(toks.tolist())
    return out


# ---------------------------------------------------------------------------
# The three implementations


def op_prompts(groups: int, per_group: int, shared: int, own: int, seed: int = 0):
    """The per-operation keys (bench_dropin.py, bench_batch_ab.py --ops):
    `groups` x `per_group` prompts of `shared` common + `own` tokens, and
    as many prompts that share nothing, each an array('q')."""
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(groups):
        head = rng.integers(1, 50000, size=shared).tolist()
        for _ in range(per_group):
            prompts.append(array("q", head + rng.integers(1, 50000, size=own).tolist()))
    misses = [array("q", rng.integers(50001, 99999, size=shared + own).tolist()) for _ in range(len(prompts))]
    return prompts, misses


def run_python(reqs: List[array], cfg: dict) -> dict:
    cache = PyHybridCache(cfg["kv"], cfg["states"], cfg["rows"], cfg["ctx"], CHUNK, INTERVAL)
    hits = 0
    t0 = time.perf_counter()
    for toks in reqs:
        r = PyReq(array("q", toks))
        cache.schedule(r)
        hits += len(r.prefix)
        cache.cache_unfinished(r)
        cache.decode(r, 1)
        cache.finish(r)
    dt = time.perf_counter() - t0
    return {"seconds": dt, "hits": hits, "copies": cache.cow, "donated": cache.donated}


def _dropin_setup(cfg: dict):
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=8, n_groups=1, num_heads=1, head_dim=2,
                                    state_size=2, conv_kernel=2)
    params = Mamba2CacheParams(shape=shape, layers=[0], dtype=Mamba2StateDType(conv=torch.float32,
                                                                               temporal=torch.float32))
    pool = HybridReqToTokenPool(size=cfg["rows"], mamba_size=cfg["states"], max_context_len=cfg["ctx"], device="cpu",
                                cache_params=params, mamba_layer_ids=[0], enable_mamba_extra_buffer=True,
                                mamba_track_interval=INTERVAL)
    alloc = TokenToKVPoolAllocator(size=cfg["kv"], dtype=torch.float32, device="cpu", kvcache=None, need_sort=False)
    tree = MambaRadixCache(CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc,
                                           page_size=1, enable_mamba_extra_buffer=True), chunk_size=CHUNK,
                           track_interval=INTERVAL)
    return tree, pool, alloc


def run_dropin(reqs: List[List[int]], cfg: dict) -> dict:
    tree, pool, alloc = _dropin_setup(cfg)
    lc = tree._lc
    hits = 0
    t0 = time.perf_counter()
    for i, toks in enumerate(reqs):
        req = Req(rid=i, origin_input_ids=array("q", toks))
        req.init_next_round_input(tree)                       # match + copy-on-write
        alloc_req_slots(pool, [req], tree)                    # admission with headroom
        tree.inc_lock_ref(req.last_node)
        P = len(req.prefix_indices)
        E = len(toks) - P
        if alloc.available_size() < E:
            tree.evict_full(E - alloc.available_size())
        kv = alloc.alloc(E)
        row = req.req_pool_idx
        pool.write((row, slice(0, P)), req.prefix_indices)
        pool.write((row, slice(P, P + E)), kv)
        req.set_extend_range(P, P + E)
        req.kv_committed_len = req.kv_allocated_len = P + E
        tree.prepare_extend_track(req, P, E)                 # prefill tracking decision
        hits += P
        req.output_ids.append(1)
        req._refresh_fill_ids()
        tree.cache_unfinished_req(req)                        # end of prefill
        if alloc.available_size() < 1:
            tree.evict_full(1)
        loc = alloc.alloc(1)
        pool.write((row, slice(P + E, P + E + 1)), loc)
        req.kv_committed_len = req.kv_allocated_len = P + E + 1
        old = _rs_of(req)                                     # decode tracking decision
        rs, _, _ = lc.decode_prepare(row, old, P + E + 1)
        rs, _ = lc.decode_finish(row, rs, P + E + 1, True)
        pool._apply_rs(req, rs, old)
        req.output_ids.append(2)
        release_kv_cache(req, tree)                           # cache_finished_req + row
    dt = time.perf_counter() - t0
    st = lc.stats()
    tree.sanity_check()
    return {"seconds": dt, "hits": hits, "copies": st["cow"] + st["forks"], "donated": st["donated"]}


def run_batch(reqs: List[List[int]], cfg: dict, batch: int, C=None, warm: int = 0) -> dict:
    """The batch API over fresh pools (built before the timer); C: the
    module (default mambaradix._C; bench_batch_ab.py passes another
    build's).  warm: the first `warm` requests (a multiple of `batch`) are
    served before the timer, so the timed ones meet a lifecycle in steady
    state (its tree full, its memory mapped and recycled) instead of pools
    that take a page fault the first time each page is written; seconds,
    hits and prefix_lens then cover the timed requests only."""
    C = C or _C
    state = C.SlotAllocator(cfg["states"])
    kv = C.SlotAllocator(cfg["kv"])
    rp = C.ReqPool(cfg["rows"], cfg["ctx"], 2)
    lc = C.Lifecycle(state, kv, rp, chunk_size=CHUNK, extra_buffer=True, track_interval=INTERVAL)
    # a module whose calls take the output tokens apart from the origin
    # tokens (outputs=) is given them so; an older one the two joined
    joined = "outputs=" not in (C.Lifecycle.finish_batch.__doc__ or "")
    outs = [_OUT] * batch
    if warm % batch != 0:
        raise ValueError("warm must be a multiple of batch")
    hits = 0
    plens = []   # the prefix_len arrays, joined after the timer
    t0 = time.perf_counter()
    for s in range(0, len(reqs), batch):
        if s == warm and warm > 0:
            hits, plens, t0 = 0, [], time.perf_counter()
        keys = reqs[s : s + batch]
        out = lc.prefill_batch(keys)
        if out is None:
            raise RuntimeError("pools too small for the batch")
        hits += int(out["prefix_len"].sum())
        plens.append(out["prefix_len"])
        rows = out["rows"]
        # the requests' tokens with their two output tokens (only the
        # committed length of each is read)
        if joined:
            full = [k + _OUT for k in keys]
            lc.unfinished_batch(rows, full)
            lc.decode_batch(rows)
            lc.finish_batch(rows, full)
        else:
            o = outs[: len(keys)]
            lc.unfinished_batch(rows, keys, outputs=o)
            lc.decode_batch(rows)
            lc.finish_batch(rows, keys, outputs=o)
    dt = time.perf_counter() - t0
    lc.check()
    st = lc.stats()
    return {"seconds": dt, "hits": hits, "copies": st["cow"] + st["forks"], "donated": st["donated"],
            "requests": len(reqs) - warm, "prefix_lens": np.concatenate(plens).tolist() if plens else []}


# ---------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--trace", default=os.path.join(ROOT, "..", "shared", "data", "mooncake_conversation_trace.jsonl"))
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()

    workloads = [("shared-prefix", shared_prefix_workload(args.requests))]
    if os.path.exists(args.trace):
        workloads.append(("mooncake", mooncake_workload(args.trace, args.requests)))
    else:
        print(f"(no Mooncake trace at {args.trace}; skipped)")
    # token arrays, as a scheduler holds them (SGLang: array('q'))
    workloads = [(name, [array("q", r) for r in reqs]) for name, reqs in workloads]

    lines = []
    head = (f"{'workload':14} {'impl':8} {'us/req':>9} {'speedup':>8} {'hit tokens':>12} "
            f"{'state copies':>13} {'donated':>8} {'copied GiB*':>11} {'donated GiB*':>12}")
    lines.append(head)
    lines.append("-" * len(head))
    for name, reqs in workloads:
        ctx = max(len(r) for r in reqs) + 8
        total = sum(len(r) for r in reqs)
        cfg = {"kv": max(400_000, min(total // 4, 4_000_000)), "states": 192, "rows": 64, "ctx": ctx}
        res = {
            "python": run_python(reqs, cfg),
            "dropin": run_dropin(reqs, cfg),
            "batch": run_batch(reqs, cfg, args.batch),
        }
        base = res["python"]["seconds"]
        for impl, r in res.items():
            us = r["seconds"] / len(reqs) * 1e6
            lines.append(
                f"{name:14} {impl:8} {us:9.1f} {base / r['seconds']:7.1f}x {r['hits']:12d} {r['copies']:13d} "
                f"{r['donated']:8d} {r['copies'] * QWEN3_NEXT_STATE_BYTES / 2**30:11.1f} "
                f"{r['donated'] * QWEN3_NEXT_STATE_BYTES / 2**30:12.1f}"
            )
        if res["python"]["hits"] != res["dropin"]["hits"]:
            lines.append(f"  note: hit totals differ ({res['python']['hits']} vs {res['dropin']['hits']}): the "
                         "baseline's LRU bookkeeping is simplified, so under eviction pressure it evicts "
                         "slightly different states")
        lines.append(f"  ({len(reqs)} requests, {total / len(reqs):.0f} tokens/request on average, "
                     f"KV pool {cfg['kv']} tokens, {cfg['states']} state slots; batch: {args.batch} requests "
                     "a call, which cannot hit each other's prefixes within a batch)")
    lines.append("* at Qwen3-Next-80B-A3B's state size (TP=1): "
                 f"{QWEN3_NEXT_STATE_BYTES / 2**20:.1f} MiB per slot")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
