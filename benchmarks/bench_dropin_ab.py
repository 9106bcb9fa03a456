"""The drop-in's Python layer, before and after, in one process (CPU): this
tree's ``mambaradix/sglang/cache.py`` against another checkout's, both over
this tree's C module, on bench_dropin.py's per-operation workload (match
miss, insert inside a free group, match hit; keys, values and slots built
before the timer).

The other checkout's ``cache.py`` is loaded as a module of this package,
with the helpers it takes from ``pools.py`` (functions only: the pool
classes are this tree's) taken from the other checkout's ``pools.py``.
Each round runs both versions on fresh caches, in alternating order, and
takes the median of each operation; SGLang's own class (over its own pools,
as in bench_dropin.py) runs in the same rounds as the reference.  The table
gives the median over the rounds and the median of the per-round ratios.  On a shared machine this
reads a change of a few percent that separate runs of bench_dropin.py
(minutes apart, each column at another moment) cannot.

  python3 benchmarks/bench_dropin_ab.py OTHER_CHECKOUT [--rounds 9] [--groups 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_dropin as B  # noqa: E402
from dropin_breakdown import _med  # noqa: E402  (median us of fn over items, one call each)
from mambaradix import sglang as mrs  # noqa: E402

POOL_HELPERS = ("_apply_record", "_host_view", "_np_index", "_owns_record", "_rs_of", "_to_device")


def load_other(checkout: str):
    """The other checkout's MambaRadixCache class."""
    mods = {}
    for name in ("pools", "cache"):
        spec = importlib.util.spec_from_file_location(f"mambaradix.sglang._ab_{name}",
                                                      os.path.join(checkout, "mambaradix", "sglang", f"{name}.py"))
        mods[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mods[name])
    for helper in POOL_HELPERS:
        if hasattr(mods["cache"], helper):
            setattr(mods["cache"], helper, getattr(mods["pools"], helper))
    return mods["cache"].MambaRadixCache


def one_round(sg, impl, cls, prompts, misses):
    """(miss, insert, hit) medians in us for one cache class, on fresh pools."""
    n = len(prompts)
    saved = B.mrs.MambaRadixCache
    B.mrs.MambaRadixCache = cls   # None with impl "sglang": SGLang's own class
    try:
        cache, pool, alloc, api = B.setup(sg, impl, 8, n + 8, n * len(prompts[0]) + 64, len(prompts[0]) + 8)
    finally:
        B.mrs.MambaRadixCache = saved
    keys = [api.RadixKey(p, None) for p in prompts]
    miss = [api.MatchPrefixParams(key=api.RadixKey(m, None)) for m in misses]
    ins = [api.InsertParams(key=k, value=alloc.alloc(len(k.token_ids)), mamba_value=pool.mamba_allocator.alloc(1))
           for k in keys]
    hit = [api.MatchPrefixParams(key=k) for k in keys]
    alloc.free_group_begin()
    t_miss = _med(cache.match_prefix, miss)
    t_ins = _med(cache.insert, ins)
    alloc.free_group_end()
    t_hit = _med(cache.match_prefix, hit)
    return {"match miss": t_miss, "insert": t_ins, "match hit": t_hit}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("other", help="the checkout to compare with (its mambaradix/sglang/cache.py)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--per-group", type=int, default=16)
    args = ap.parse_args()
    sg = B.sglang_wheel.load()
    versions = (("other", load_other(args.other)), ("this", mrs.MambaRadixCache))
    prompts, misses = B.op_prompts(args.groups, args.per_group, 2048, 128)
    print(f"us per operation, median over {args.rounds} interleaved rounds ({len(prompts)} prompts of 2048 + 128 "
          f"tokens); other = {args.other}, this = {os.path.dirname(HERE)}")
    print("sglang: SGLang's own class over its pools, run in the same rounds; ratios are medians of per-round ratios")
    print(f"{'':12}{'operation':12}{'sglang':>10}{'other':>10}{'this':>10}{'other/this':>12}{'sglang/other':>14}"
          f"{'sglang/this':>13}")
    for impl in ("dropin/sg", "dropin/own"):
        res = {name: [] for name in ("sglang", "other", "this")}
        for r in range(args.rounds):
            runs = versions if r % 2 == 0 else versions[::-1]
            for name, cls in ((("sglang", None),) + runs if r % 4 < 2 else runs + (("sglang", None),)):
                res[name].append(one_round(sg, "sglang" if cls is None else impl, cls, prompts, misses))
        for op in ("match miss", "insert", "match hit"):
            t = {name: [x[op] for x in v] for name, v in res.items()}

            def ratio(a, b):
                return statistics.median(x / y for x, y in zip(t[a], t[b]))

            print(f"{impl:12}{op:12}" + "".join(f"{statistics.median(t[n]):10.2f}" for n in ("sglang", "other", "this"))
                  + f"{ratio('other', 'this'):11.2f}x{ratio('sglang', 'other'):13.1f}x{ratio('sglang', 'this'):12.1f}x")


if __name__ == "__main__":
    main()
