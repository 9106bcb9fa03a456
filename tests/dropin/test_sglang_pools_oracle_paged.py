"""test_sglang_pools_oracle's three-way comparison (SGLang v0.5.15's
MambaRadixCache over its pools, the drop-in over SGLang's pools, the drop-in
over its own) with paged KV: SGLang's PagedTokenToKVPoolAllocator (the
wheel's allocator/paged.py; alloc_extend through the file's own
alloc_extend_naive, alloc_decode through a stand-in written from the Triton
kernel, see sglang_wheel.paged_allocator_class) against the drop-in's, page
sizes 4 and 16, extra_buffer modes pp2, pp1 and lazy (SGLang's validation:
the track interval a multiple of the page, chunk size max(64, page)).

Prompts of random lengths over a few shared stems (partial pages, prefixes
shared at and off page boundaries), a state pool small enough that
admission evicts states, a KV pool small enough that the tree's KV is
evicted too, chunked prefill in some runs.  After every step: the sizes
match, every KV page and state slot is exactly one of free, the tree's or a
live request's, and every live request's KV table row holds the same indices
in all three.  Needs torch and the sglang 0.5.15 wheel.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("torch")

from seeds import seeds  # noqa: E402
from test_sglang_oracle import SG, SKIP_REASON  # noqa: E402
from test_sglang_pools_oracle import CHUNK, _run_three  # noqa: E402

pytestmark = pytest.mark.skipif(SG is None, reason="SGLang oracle unavailable: %s" % SKIP_REASON)

from mambaradix.driver import DriverConfig, DriverRequest  # noqa: E402
from sglang_wheel import wheel  # noqa: E402,F401  (a fixture)


def _workload(seed, n, page):
    """n requests, two arriving every three steps: prompts cut from three
    stems (mostly past their first chunk, so that they share cached
    states; at a page multiple or not, about half each) plus a random
    tail, outputs long enough to cross pages in decode."""
    rng = random.Random(seed)
    stems = [[rng.randrange(1, 5000) for _ in range(rng.randrange(96, 320))] for _ in range(3)]
    out = []
    for i in range(n):
        s = rng.choice(stems)
        cut = rng.randrange(64, len(s)) if rng.random() < 0.75 else rng.randrange(1, 64)
        if rng.random() < 0.5:
            cut = max(page, cut // page * page)
        prompt = s[:cut] + [rng.randrange(1, 5000) for _ in range(rng.randrange(1, 120))]
        out.append((i * 2 // 3, DriverRequest(f"r{i}", prompt, rng.randrange(1, 3 * page + 8))))
    return out


SEEDS = seeds()
N = 24
# (page, mode, state slots, max running, chunked prefill size, KV tokens):
# KV pools small enough that every run evicts the tree's KV
CONFIGS = [(4, "pp2", 9, 2, None, 640), (4, "pp1", 12, 2, 128, 640), (4, "lazy", 12, 3, 100, 560),
           (16, "pp2", 12, 2, 128, 640), (16, "pp1", 9, 2, None, 640), (16, "lazy", 12, 2, None, 896),
           (16, "lazy", 9, 2, 128, 640)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("page,mode,slots,max_running,chunked,kv", CONFIGS)
def test_paged_state_pool_pressure_matches_sglang(wheel, page, mode, slots, max_running, chunked, kv, seed):
    w, sg = wheel
    cfg = DriverConfig(mode=mode, chunk_size=CHUNK, track_interval=32, max_running=max_running,
                       chunked_prefill_size=chunked, new_token_ratio=1.0, page_size=page)
    arrivals = _workload(seed, N, page)
    drivers, evicted = _run_three(w, sg, cfg, 6, slots, kv, arrivals, compare_rows=True)
    assert any(evicted.headroom), "the state pool was never short at admission"
    assert sum(evicted.kv) > 0, "the tree's KV was never evicted"
    prefixes = [drivers["sglang"].records[r.rid].prefix_len for _, r in arrivals]
    assert any(prefixes), "no prefix hit"
    assert all(p % page == 0 for p in prefixes)
    assert sum(len(r.input_ids) % page != 0 for _, r in arrivals) >= 3, "too few partial pages"
