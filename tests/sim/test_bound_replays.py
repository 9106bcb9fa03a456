"""The hit-rate bound against the simulator's own replays: no replay of a
built-in workload exceeds it, under every state policy (the belady one
included), page sizes 1 and 16, modes pp2 and no_buffer (and pp1, lazy),
end-of-turn states, a per-path budget, chunked prefill and a tight KV pool.

Beyond the totals, each replay's own hits (the usable prefix of every
request, from ``engine.replay``) are checked against the facts the proof
rests on (docs/bound.md), with the last toucher found by brute force: every
hit is page-aligned within the match cap and has an earlier request that
touched its prefix, and at no first admission do more hits stand between
their last toucher and their request than the state pool leaves the tree."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest

pytest.importorskip("scipy", reason="the hit-rate bound solves its LP with SciPy (tests/requirements.txt)")

from bound_reference import last_toucher, match_limit, trace_of, unlimited_optimum
from mambaradix.sim import SimConfig, run, workloads
from mambaradix.sim.bound import held_slots, upper_bound
from mambaradix.sim.engine import replay

POLICIES = ("sglang", "consumed", "utility", "belady")


def _workloads() -> dict:
    inf = float("inf")
    return {
        "gsp": workloads.generated_shared_prefix(8, 4, 256, 32, 16, request_rate=inf, seed=1),
        "multiturn": workloads.multi_turn(8, 4, 128, 16, request_rate=inf, seed=2),
        "multiturn-poisson": workloads.multi_turn(6, 4, 96, 16, request_rate=40.0, seed=4),
        "agentic": workloads.agentic_branching(2, 3, 2, 256, 64, 32, 16, request_rate=inf, seed=3),
        "mooncake": workloads.mooncake_conversation(limit=30),
        "retries": _retries(workloads.multi_turn(4, 3, 64, 16, request_rate=inf, seed=5)),
    }


def _retries(reqs: list) -> list:
    """Every request sent a second time after all of them (a client that
    retries): the copy's whole prompt is cached, up to SGLang's match cap."""
    again = [dataclasses.replace(r, rid=r.rid + "-again", arrival=r.arrival + 1.0) for r in reqs]
    return reqs + again


WORKLOADS = _workloads()


def _check_hits(reqs: list, cfg: SimConfig, prefixes: dict) -> int:
    """The replay's hits are a feasible point of the relaxation; returns the
    most hits standing at one admission."""
    trace = trace_of(reqs)
    order = sorted(range(len(reqs)), key=lambda i: (float(reqs[i].arrival), i))
    cover = np.zeros(len(reqs) + 1, dtype=np.int64)
    for j, i in enumerate(order):
        u = prefixes[reqs[i].rid]
        assert u % cfg.page_size == 0 and u <= match_limit(len(reqs[i].input_ids), cfg.match_cap)
        if u:
            a = last_toucher(trace, j, u)
            assert a is not None, f"{reqs[i].rid} hit {u} tokens no earlier request touched"
            cover[a + 1] += 1
            cover[j + 1] -= 1
    most = int(np.cumsum(cover).max())
    assert most <= cfg.state_slots - held_slots(cfg.mode), (most, cfg)
    return most


def _configs(seed: int, count: int, short_chunk: int) -> list:
    """A fixed sample of serial configurations: every policy in modes pp2 and
    no_buffer at page size 1, pp2 at 16, and pp1 / lazy; pools from 4 to 40
    slots; end-of-turn states, a per-path budget, short prefill chunks
    (short_chunk tokens) and a KV pool a quarter of the workload's."""
    grid = [(mode, page) for mode in ("pp2", "no_buffer", "pp1", "lazy") for page in (1, 16)
            if not (mode == "no_buffer" and page == 16)]
    rng = random.Random(seed)
    out = []
    for (mode, page), policy in itertools.product(grid, POLICIES):
        for _ in range(count):
            out.append(dict(mode=mode, page_size=page, lru_policy=policy,
                            state_slots=rng.choice([4, 6, 10, 40]), end_of_turn_states=rng.random() < 0.4,
                            max_states_per_path=rng.choice([0, 0, 2]),
                            chunked_prefill_size=rng.choice([None, short_chunk, 8192]),
                            kv_share=rng.choice([1.0, 0.25])))
    return out


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_replays_stay_within_the_bound(name):
    reqs = WORKLOADS[name]
    total = sum(len(r.input_ids) + r.output_len + 2 for r in reqs)
    longest = max(len(r.input_ids) + r.output_len for r in reqs)
    checked = 0
    most = 0
    for c in _configs(sum(map(ord, name)), 1, 2048 if name == "mooncake" else 96):
        kv = max(int(total * c.pop("kv_share")), longest + 64)
        cfg = SimConfig(max_running=1, kv_tokens=kv, **c)
        try:
            res = replay(reqs, cfg)
        except RuntimeError as e:   # a pool too small for a hit (every state locked)
            assert "state pool exhausted" in str(e)
            continue
        most = max(most, _check_hits(reqs, cfg, res.prefixes))
        b = upper_bound(reqs, cfg)
        assert sum(res.prefixes.values()) == res.metrics.state_usable_tokens <= b.hit_tokens, (cfg, b)
        checked += 1
    assert checked >= 20
    if name != "mooncake":      # 30 requests over few shared blocks rarely contend
        assert most >= 2        # replays that hold several states for later hits


@pytest.mark.parametrize("page, mode", [(1, "pp2"), (1, "no_buffer"), (16, "pp2")])
def test_bound_at_least_every_policy(page, mode):
    """run() itself, every policy, several pools, on every built-in workload;
    the bound binds (is below the unlimited one) at the small pools, and the
    unlimited one is the deepest touched prefix found by brute force."""
    binding = 0
    unlimited = {name: unlimited_optimum(trace_of(reqs), page, True) for name, reqs in WORKLOADS.items()}
    for name, reqs in WORKLOADS.items():
        kv = sum(len(r.input_ids) + r.output_len + 2 for r in reqs) + 4096
        for slots in (5, 8, 16, 64):
            cfg = SimConfig(state_slots=slots, max_running=1, page_size=page, mode=mode, kv_tokens=kv)
            b = upper_bound(reqs, cfg)
            assert b.pool_aware and b.hit_tokens <= b.unlimited_hit_tokens
            assert b.unlimited_hit_tokens == unlimited[name]
            binding += b.hit_tokens < b.unlimited_hit_tokens
            for policy in POLICIES:
                m = run(reqs, dataclasses.replace(cfg, lru_policy=policy))
                assert m.token_hit_rate <= b.token_hit_rate, (name, slots, policy, m.token_hit_rate, b)
    assert binding >= 3


def test_concurrent_replays_stay_within_the_pool_free_bound():
    """With several requests running, the bound is the unlimited-pool one,
    and concurrent replays stay within it."""
    for name, reqs in WORKLOADS.items():
        kv = sum(len(r.input_ids) + r.output_len + 2 for r in reqs) + 4096
        cfg = SimConfig(state_slots=24, max_running=4, kv_tokens=kv)
        b = upper_bound(reqs, cfg)
        assert not b.pool_aware
        for policy in POLICIES:
            res = replay(reqs, dataclasses.replace(cfg, lru_policy=policy))
            trace = trace_of(reqs)
            order = sorted(range(len(reqs)), key=lambda i: (float(reqs[i].arrival), i))
            for j, i in enumerate(order):
                u = res.prefixes[reqs[i].rid]
                assert u == 0 or last_toucher(trace, j, u) is not None
            assert res.metrics.state_usable_tokens <= b.hit_tokens


def test_mooncake_subset():
    """The bundled trace's first 300 requests (long prompts over 512-token
    blocks): the flow runs and no policy passes it."""
    reqs = workloads.mooncake_conversation(limit=300)
    kv = sum(len(r.input_ids) + r.output_len + 2 for r in reqs) + 4096
    cfg = SimConfig(state_slots=12, max_running=1, kv_tokens=kv)
    b = upper_bound(reqs, cfg)
    assert b.exact and 0 < b.hit_tokens < b.unlimited_hit_tokens
    for policy in ("consumed", "belady"):
        assert run(reqs, dataclasses.replace(cfg, lru_policy=policy)).state_usable_tokens <= b.hit_tokens
