"""Adaptive snapshot placement in the simulator: a predicted junction is
where SGLang's branching rule snapshots, so every state restored there is
exact (toy states, page sizes 1 and 16), and on shared-prefix traffic the
second request of a group hits the shared prompt that it misses under
SGLang's own placement; an end snapshot moved up (end-relative placement)
serves prompts that part a little above the last one's end.  The rule
itself is checked against a model in tests/core/test_tree_adaptive_place.py."""

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


def _toy_runs(reqs, page_size: int, chunk: int, slots: int):
    """`adaptive` and SGLang's `consumed` over the requests with toy states:
    their metrics, every restored state checked exact."""
    pytest.importorskip("torch")   # the toy replay runs through mambaradix.sglang
    cfg = apply_preset(SimConfig(page_size=page_size, chunk_size=chunk, track_interval=256, state_slots=slots,
                                 max_running=2, lru_policy="adaptive", states="toy", kv_tokens=65536,
                                 decode_boundary="batch"), "qwen3-next")
    m = engine.run(reqs, cfg)
    base = engine.run(reqs, dataclasses.replace(cfg, lru_policy="consumed"))
    assert m.state_mismatches == 0 and base.state_mismatches == 0
    return m, base


@pytest.mark.parametrize("page_size", [1, 16])
def test_sim_placement_gains_exact_hits_at_page_sizes(page_size: int) -> None:
    m, base = _toy_runs(_groups(20, 128, 40), page_size, 32, 256)
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


def _conversations(n: int, turns: int, block: int = 48, seed: int = 5):
    """n conversations taking turns, Mooncake-like: a prompt is whole blocks
    of `block` tokens and a last, partial block; a conversation's next prompt
    keeps the whole blocks of its last one, then two new blocks and a new
    partial one, so it parts from the last prompt a little above its end
    (past its chunk ends, before its end snapshot).  Each turn arrives once
    the turn before it has finished."""
    from mambaradix.sim.types import SimRequest
    rng = np.random.default_rng(seed)
    blocks = [[rng.integers(1, 40000, size=block) for _ in range(int(rng.integers(3, 7)))] for _ in range(n)]
    reqs, t = [], 0.0
    for turn in range(turns):
        for c in range(n):
            tail = rng.integers(1, 40000, size=int(rng.integers(5, block - 5)))
            p = np.concatenate(blocks[c] + [tail]).astype(np.int32)
            reqs.append(SimRequest(f"c{c}t{turn}", p, 8, arrival=t,
                                   output_ids=rng.integers(1, 40000, size=8).astype(np.int32)))
            blocks[c] = blocks[c] + [rng.integers(1, 40000, size=block) for _ in range(2)]
            t += 10.0
    return reqs


@pytest.mark.parametrize("page_size", [1, 16])
def test_sim_end_placement_serves_prompts_that_part_above_the_end(page_size: int) -> None:
    """Conversations whose next prompt parts a little above the last prompt's
    end snapshot: once such partings are seen, the end snapshot moves up by
    about what they part above it, the next prompts hit it, and every state
    restored there is exact (toy states)."""
    m, base = _toy_runs(_conversations(12, 5), page_size, 16, 512)
    assert m.adaptive_end_placements > 0 and m.adaptive_end_placements <= m.adaptive_placements
    # a prompt 300-600 tokens long reuses its last one's whole blocks instead of those of the one before (1.13x)
    assert m.state_usable_tokens >= 1.1 * base.state_usable_tokens, (m.state_usable_tokens, base.state_usable_tokens)


def test_sim_placement_leaves_a_chunked_prefill_alone() -> None:
    """A prompt prefilled in several extends keeps its chunk ends' snapshots:
    no junction is predicted below a branch's top for an extend longer than
    the chunked prefill budget (each group's first request extends 168
    tokens here); what remains is the end snapshot moved up (the shared
    prompt's end, 40 tokens above it, where the group's next request parts),
    no fewer hits than SGLang's own placement."""
    reqs = _groups(20, 128, 40)
    cfg = apply_preset(SimConfig(chunk_size=32, track_interval=256, state_slots=256, max_running=2,
                                 lru_policy="adaptive", kv_tokens=65536, chunked_prefill_size=4096), "qwen3-next")
    whole = engine.run(reqs, cfg)
    assert whole.adaptive_placements > whole.adaptive_end_placements
    chunked = engine.run(reqs, dataclasses.replace(cfg, chunked_prefill_size=160))
    assert chunked.adaptive_placements == chunked.adaptive_end_placements > 0
    base = engine.run(reqs, dataclasses.replace(cfg, chunked_prefill_size=160, lru_policy="consumed"))
    assert chunked.state_usable_tokens >= base.state_usable_tokens
