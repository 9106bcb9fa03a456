"""Builds and runs tests/c/test_lifecycle.c in its four variants (plain,
ASan+UBSan, fault injection, valgrind when installed): the pools and the
request lifecycle in C, without Python.  Batches that run out of room at page
sizes 4 and 16 must take nothing; out-of-memory injection at every allocation
of a round of batched calls (page sizes 1, 4 and 16) must leave the tree, the
pools, the ownership accounting and the request records valid; eviction with
a node protected must keep it and hand back the least recently used others.
Then the lifecycle model (tests/c/test_lc_model.c) is run against the real
lifecycle for 10^6 batched calls at page sizes 1, 4 and 16 (10^5 more under
ASan)."""

from __future__ import annotations

import re
import shutil

from test_c_core import run_make


def test_c_lifecycle_variants() -> None:
    out = run_make("test-lifecycle")
    for line in ("lifecycle: plain", "lifecycle: asan+ubsan", "lifecycle: fault injection",
                 "room: page_size=16: ", "oom: extra_buffer=1 page_size=16",
                 "protect: evictions with a node protected checked", "counted: counted pools checked",
                 "lc_model: 1000000 operations", "lc_model: 100000 operations"):
        assert line in out
    if shutil.which("valgrind"):
        assert "lifecycle: valgrind\n" in out
    # the fuzz against the model: 10^6 batched calls in all, each page size its share
    by_ps = re.findall(r"^lc_model: by page size: 1: (\d+), 4: (\d+), 16: (\d+) operations$", out, re.M)
    assert len(by_ps) == 2
    full = [int(n) for n in by_ps[0]]
    assert sum(full) == 1000000 and min(full) >= 250000, full
    assert "tests/c lifecycle: all passed" in out
