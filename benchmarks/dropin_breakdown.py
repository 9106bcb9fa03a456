"""Where the drop-in's per-operation time goes (CPU), for both pool sets:
the parts each of bench_dropin.py's three operations is made of, each
timed on its own over the same data (64 groups x 16 prompts of 2048 + 128
tokens, keys built before the timer; medians over the 1024 operations).

  whole op        the drop-in's match_prefix / insert, as bench_dropin.py times it
  C call          the Lifecycle call alone, with the arguments the drop-in passes
  key read        match: its reading of the 2176-token array('q') key, the same
                  call on an empty tree, full key minus a 1-token key (read in
                  place, only as far as the walk goes, it is ~0 on a miss);
                  insert: the key narrowed to int32 (RadixTree.match_prefix on
                  an empty tree, full key minus a 1-token key)
  index tensor    torch.from_numpy of the matched KV indices
  result objects  MatchResult / InsertResult and the TreeNode handle
  value -> C      insert: reading the value tensor and the state slot
  dup frees       insert: the 2048 duplicate KV indices through the pool's
                  allocator inside a free group (over our pools the C call
                  does it; timed here with the allocator alone)
  minor faults    page faults per whole op (getrusage)

The parts overlap the whole op only roughly (caches are warmer when a part
runs alone); they say where the time goes, not a sum.

  python3 benchmarks/dropin_breakdown.py
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bench_dropin as B  # noqa: E402
import sglang_wheel  # noqa: E402
from mambaradix import _C  # noqa: E402
from mambaradix import sglang as mrs  # noqa: E402
from mambaradix.sglang.pools import _np_index  # noqa: E402

try:  # what the drop-in does with an insert's state slot
    from mambaradix.sglang.cache import _slot_of  # noqa: E402
except ImportError:  # an older drop-in (before-and-after runs)
    def _slot_of(v, ix=None):
        return int(_np_index(v)[0])

_tuple_new = tuple.__new__


def _med(fn, items):
    ts = []
    for it in items:
        t0 = time.perf_counter_ns()
        fn(it)
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1e3


def _faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _whole(fn, items):
    f0 = _faults()
    t = _med(fn, items)
    return t, (_faults() - f0) / len(items)


def breakdown(sg, impl, groups=64, per_group=16, shared=2048, own=128, seed=0):
    prompts, misses = B.op_prompts(groups, per_group, shared, own, seed)
    n = len(prompts)
    cache, pool, alloc, api = B.setup(sg, impl, 8, n + 8, n * (shared + own) + 64, shared + own + 8)
    keys = [api.RadixKey(p, None) for p in prompts]
    miss_keys = [api.RadixKey(m, None) for m in misses]
    values = [alloc.alloc(len(p)) for p in prompts]
    slots = [pool.mamba_allocator.alloc(1) for _ in prompts]
    lc = cache._lc
    empty = _C.Lifecycle()
    root = lc.root()
    node = cache._node(*root)
    out = {}

    # match miss
    ps = [api.MatchPrefixParams(key=k) for k in miss_keys]
    whole, flt = _whole(cache.match_prefix, ps)
    full = _med(lambda k: empty.match(k.token_ids), miss_keys)
    one = _med(lambda k: empty.match(k.token_ids[:1]), miss_keys)
    e = np.empty(0, dtype=np.int64)
    out["match miss"] = {
        "whole op": whole,
        "C call": _med(lambda k: lc.match(k.token_ids), miss_keys),
        "key read": full - one,
        "index tensor": _med(lambda k: torch.from_numpy(e), miss_keys),
        "result objects": _med(lambda k: (cache._node(*root), _tuple_new(mrs.MatchResult, (e, node, node, node, 0, 0, 0,
                                                                                           None, None))), miss_keys),
        "minor faults": flt,
    }

    # insert (one free group, as bench_dropin.py)
    ips = [api.InsertParams(key=k, value=v, mamba_value=s) for k, v, s in zip(keys, values, slots)]
    alloc.free_group_begin()
    whole, flt = _whole(cache.insert, ips)
    alloc.free_group_end()
    ks = [p.key.token_ids for p in ips]
    plain = _C.RadixTree()
    narrowed = (_med(lambda k: plain.match_prefix(k.token_ids), miss_keys)
                - _med(lambda k: plain.match_prefix(k.token_ids[:1]), miss_keys))
    out["insert"] = {
        "whole op": whole,
        "key read": narrowed,
        "value -> C": _med(lambda p: (_np_index(p.value), _slot_of(p.mamba_value, cache._ix)), ips),
        "result objects": _med(lambda p: mrs.InsertResult(prefix_len=2048, mamba_exist=False,
                                                          last_device_node=cache._node(*root)), ips),
        "minor faults": flt,
    }
    # the C call and the duplicate frees, on a second cache over fresh pools
    cache2, pool2, alloc2, _ = B.setup(sg, impl, 8, n + 8, n * (shared + own) + 64, shared + own + 8)
    values2 = [alloc2.alloc(len(p)) for p in prompts]
    slots2 = [int(pool2.mamba_allocator.alloc(1)[0]) for _ in prompts]
    vnp = [v.numpy() for v in values2]
    alloc2.free_group_begin()
    out["insert"]["C call"] = _med(lambda a: cache2._lc.insert(a[0], a[1], a[2]), list(zip(ks, vnp, slots2)))
    alloc2.free_group_end()
    cache3, pool3, alloc3, _ = B.setup(sg, impl, 8, n + 8, n * (shared + own) + 64, shared + own + 8)
    dups = [alloc3.alloc(shared) for _ in range(n // 2)]
    alloc3.free_group_begin()
    out["insert"]["dup frees"] = _med(alloc3.free, dups)
    alloc3.free_group_end()
    idx = [lc.match(k.token_ids)[0] for k in keys[:64]]
    out["insert"]["index tensor"] = _med(lambda a: torch.from_numpy(a[:shared]), idx)

    # match hit
    ps = [api.MatchPrefixParams(key=k) for k in keys]
    whole, flt = _whole(cache.match_prefix, ps)
    out["match hit"] = {
        "whole op": whole,
        "C call": _med(lambda k: lc.match(k.token_ids), keys),
        "key read": full - one,
        "index tensor": _med(torch.from_numpy, idx * (n // len(idx))),
        "result objects": _med(lambda k: (cache._node(*root), _tuple_new(mrs.MatchResult, (e, node, node, node, 0, 0, 0,
                                                                                           None, None))), keys),
        "minor faults": flt,
    }
    return out


def main() -> None:
    sg = sglang_wheel.load()
    parts = ("whole op", "C call", "key read", "value -> C", "dup frees", "index tensor", "result objects",
             "minor faults")
    res = {impl: breakdown(sg, impl) for impl in ("dropin/sg", "dropin/own")}
    print("Per-operation breakdown (us; minor faults per op), CPU")
    for op in ("match miss", "insert", "match hit"):
        print(f"\n{op:16}" + "".join(f"{i:>12}" for i in res))
        for part in parts:
            if part in res["dropin/sg"][op]:
                print(f"  {part:14}" + "".join(f"{res[i][op][part]:12.2f}" for i in res))


if __name__ == "__main__":
    main()
