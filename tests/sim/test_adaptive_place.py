"""Adaptive snapshot placement in the simulator: a predicted junction is
where SGLang's branching rule snapshots, so every state restored there is
exact (toy states, page sizes 1 and 16), and on shared-prefix traffic the
second request of a group hits the shared prompt that it misses under
SGLang's own placement.  The rule itself is checked against a model in
tests/core/test_tree_adaptive_place.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mambaradix.sim import SimConfig, apply_preset
from mambaradix.sim import engine


def _groups(n: int, shared: int, tail: int, per_group: int = 3):
    """n groups in turn, each a shared prompt of `shared` tokens and
    per_group requests under it with their own `tail` tokens, one at a
    time (each arrives after the one before has finished)."""
    from mambaradix.sim.types import SimRequest
    rng = np.random.default_rng(11)
    reqs, t = [], 0.0
    for g in range(n):
        head = rng.integers(1, 40000, size=shared)
        for i in range(per_group):
            p = np.concatenate([head, rng.integers(1, 40000, size=tail)]).astype(np.int32)
            reqs.append(SimRequest(f"g{g}r{i}", p, 8, arrival=t,
                                   output_ids=rng.integers(1, 40000, size=8).astype(np.int32)))
            t += 10.0
    return reqs


@pytest.mark.parametrize("page_size", [1, 16])
def test_sim_placement_gains_exact_hits_at_page_sizes(page_size: int) -> None:
    pytest.importorskip("torch")   # the toy replay runs through mambaradix.sglang
    reqs = _groups(20, 128, 40)
    cfg = apply_preset(SimConfig(page_size=page_size, chunk_size=32, track_interval=256, state_slots=256,
                                 max_running=2, lru_policy="adaptive", states="toy", kv_tokens=65536,
                                 decode_boundary="batch"), "qwen3-next")
    m = engine.run(reqs, cfg)
    base = engine.run(reqs, dataclasses.replace(cfg, lru_policy="consumed"))
    assert m.state_mismatches == 0 and base.state_mismatches == 0
    # SGLang's placement: a group's second request makes the junction, the third hits it
    assert base.state_hits == 20 and base.state_usable_tokens == 20 * 128
    # predicted junctions: once the evidence is in, the second request hits too
    assert m.adaptive_placements > 0
    assert m.state_hits >= base.state_hits + 10 and m.state_usable_tokens >= base.state_usable_tokens + 10 * 128
    assert (m.state_usable_tokens - base.state_usable_tokens) % 128 == 0


def test_sim_placement_leaves_a_chat_alone() -> None:
    """Multi-turn chat: every next turn continues its own path, so the end
    snapshot stays (no prediction) and the hits are SGLang's."""
    from mambaradix.sim import workloads
    reqs = workloads.multi_turn(num_clients=24, num_rounds=4, system_prompt_len=256, seed=3)
    cfg = apply_preset(SimConfig(state_slots=512, lru_policy="adaptive"), "qwen3-next")
    m = engine.run(reqs, cfg)
    base = engine.run(reqs, dataclasses.replace(cfg, lru_policy="consumed"))
    assert m.adaptive_placements == 0 and m.token_hit_rate == base.token_hit_rate


def test_sim_placement_leaves_a_chunked_prefill_alone() -> None:
    """A prompt prefilled in several extends keeps its chunk ends' snapshots:
    no junction is predicted for an extend longer than the chunked prefill
    budget (each group's first request extends 168 tokens here)."""
    reqs = _groups(20, 128, 40)
    cfg = apply_preset(SimConfig(chunk_size=32, track_interval=256, state_slots=256, max_running=2,
                                 lru_policy="adaptive", kv_tokens=65536, chunked_prefill_size=4096), "qwen3-next")
    assert engine.run(reqs, cfg).adaptive_placements > 0
    chunked = engine.run(reqs, dataclasses.replace(cfg, chunked_prefill_size=160))
    assert chunked.adaptive_placements == 0
    base = engine.run(reqs, dataclasses.replace(cfg, chunked_prefill_size=160, lru_policy="consumed"))
    assert chunked.state_usable_tokens == base.state_usable_tokens
