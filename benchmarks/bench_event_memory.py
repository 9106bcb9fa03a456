"""Memory per cached token of the SGLang 0.5.23 TreeCores, KV events off and on.

CPU figures (2-core VM).  Page size 1, [FULL], 60 random prompts of 1024 tokens
inserted through UnifiedRadixCache (fixed seed).  For each core: the Python heap
growth over the inserts (tracemalloc; numpy buffers included; one warm-up insert
with events on first, so one-time imports are not counted), and for ours the C
tree's own memory_bytes() and the event-hash rows (allocated with the core) on top.  With events on, the cores keep every
cached page's event hashes (ours in PageHashes' numpy rows, SGLang's on its
nodes).

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 benchmarks/bench_event_memory.py
"""

from __future__ import annotations

import gc
import os
import random
import sys
import tracemalloc
from array import array

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "dropin", "sglang_0523"))

import sgl_env  # noqa: E402

sgl_env.bootstrap()

import warnings  # noqa: E402

warnings.filterwarnings("ignore")

import dual  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.test.kits.unified_radix_cache.config import CacheConfig  # noqa: E402

PROMPTS, LEN, SEED = 60, 1024, 1


CFG = CacheConfig(page_size=1, components=(ComponentType.FULL,), kv_size=70000, max_context_len=70000)


def warm_up():
    """One insert with events on through each core: the one-time imports (the
    native hasher) are then outside the measured window."""
    for backend in ("mambaradix", "python"):
        cache, alloc, _ = dual.build(CFG, backend, events=True)
        cache.insert(InsertParams(key=RadixKey(array("q", [1, 2, 3, 4])), value=alloc.alloc(4)))
        cache.tree_core.take_events()


def measure(backend: str, events: bool):
    cfg = CFG
    rng = random.Random(SEED)
    keys = [RadixKey(array("q", [rng.randint(1, 30000) for _ in range(LEN)])) for _ in range(PROMPTS)]
    cache, alloc, _ = dual.build(cfg, backend, events=events)
    vals = [alloc.alloc(len(k)) for k in keys]
    gc.collect()
    tracemalloc.start()
    m0 = tracemalloc.get_traced_memory()[0]
    for k, v in zip(keys, vals):
        cache.insert(InsertParams(key=k, value=v))
    cache.tree_core.take_events()
    gc.collect()
    m1 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    tokens = cache.tree_core.total_size()[0]
    core = cache.tree_core
    tree = core._tree.memory_bytes() / tokens if backend == "mambaradix" else 0.0
    # Our event-hash rows are allocated with the core (sized to the KV pool), before the window.
    rows = core._page_hash.nbytes() / tokens if backend == "mambaradix" else 0.0
    return tokens, (m1 - m0) / tokens, tree, rows


def main():
    warm_up()
    print(f"{'events':>6} {'core':>10} {'tokens':>7} {'py heap B/tok':>14} {'C tree B/tok':>13} "
          f"{'hash rows B/tok':>16} {'total B/tok':>12}")
    for events in (False, True):
        for backend in ("mambaradix", "python"):
            tokens, heap, tree, rows = measure(backend, events)
            print(f"{str(events):>6} {backend:>10} {tokens:>7} {heap:>14.1f} {tree:>13.1f} {rows:>16.1f} "
                  f"{heap + tree + rows:>12.1f}")


if __name__ == "__main__":
    main()
