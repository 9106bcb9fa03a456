"""Requests with an extra_key (SGLang's namespace: LoRA, cache salt) through
the simulator: each namespace's cache serves only its own requests, and a
request whose match finds nothing in its namespace (the root, locked) caches
under it, chunked or not."""

from __future__ import annotations

import numpy as np
import pytest

from mambaradix.sim import SimConfig, SimRequest
from mambaradix.sim.engine import replay


def _req(rid, ns, n, at):
    return SimRequest(rid, np.arange(1, n + 1, dtype=np.int32), 4, float(at), extra_key=ns)


@pytest.mark.parametrize("chunked", [None, 16])
@pytest.mark.parametrize("states", ["none", "toy"])
def test_each_namespace_serves_only_its_own_requests(chunked, states):
    # the same tokens in tenant a (twice) and in tenant b, one after another
    reqs = [_req("a1", "a", 40, 0), _req("a2", "a", 48, 100), _req("b1", "b", 48, 200), _req("n1", None, 48, 300)]
    cfg = SimConfig(kv_tokens=2000, state_slots=20, chunk_size=8, chunked_prefill_size=chunked, max_running=2,
                    states=states)
    res = replay(reqs, cfg, check_every_step=True) if states == "none" else None
    if res is None:
        from mambaradix.sim import run
        m = run(reqs, cfg)
        assert m.state_mismatches == 0 and m.requests == 4
        return
    got = res.prefixes
    assert got["a1"] == 0 and got["b1"] == 0 and got["n1"] == 0   # nothing of theirs was cached before
    assert got["a2"] >= 40 - 8                                   # a1's prompt, to a state on the chunk grid
