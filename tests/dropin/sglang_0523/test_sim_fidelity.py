"""The simulator's SGLang baseline (``--semantics v0.5.23``) against SGLang 0.5.23's own scheduler.

Reference: ``mambaradix.sglang_replay`` runs the same requests through SGLang 0.5.23's Scheduler and its
UnifiedRadixCache over SGLang's own TreeCores (python, rust) and reports SGLang's ``cached_tokens``; the
simulator (``mambaradix.sim.engine.replay``) must give every request the same usable prefix.  Small state
(and KV) pools make both evict, so the eviction orders, the admission's state headroom, the overlap loop's
skipped finishing decode and the waiting-prefix refresh all show in the hits.  A small version of
``benchmarks/bench_fidelity_0523.py``."""

from __future__ import annotations

import pytest
import sgl_env  # noqa: F401  (SGLang 0.5.23 on the path; see conftest.py)

from mambaradix.sglang_replay import ReplayConfig, replay
from mambaradix.sim import engine
from mambaradix.sim import workloads as wl
from mambaradix.sim.types import SimConfig


def _workloads() -> dict:
    return {
        "multiturn": wl.multi_turn(6, 3, 300, 40, request_rate=4.0, seed=1),
        "multiturn16": wl.multi_turn(16, 4, 256, 32, seed=0),
        "agentic": wl.agentic_branching(2, 3, 2, 600, 100, 90, 30, seed=0),
        "gsp": wl.generated_shared_prefix(4, 4, 700, 64, 32, seed=0),
        "mooncake": wl.mooncake_conversation(limit=20),
    }


# (workload, state slots, KV tokens, track interval, max running)
CASES = [
    ("multiturn", 10, 1 << 20, 256, 1), ("multiturn", 16, 1 << 20, 256, 3),
    ("multiturn16", 40, 6000, 256, 1), ("multiturn16", 40, 1 << 20, 256, 8),
    ("agentic", 6, 1 << 20, 256, 1), ("gsp", 16, 1 << 20, 256, 3),
    ("mooncake", 6, 1 << 20, 256, 1), ("mooncake", 32, 1 << 20, 256, 6),
    # more running requests asked for than SGLang's state pool allows: it runs fewer
    ("gsp", 16, 1 << 20, 256, 8), ("mooncake", 32, 1 << 20, 256, 9),
]


def _sim(reqs: list, case: tuple, semantics: str) -> list:
    _, slots, kv, interval, running = case
    cfg = SimConfig(state_slots=slots, kv_tokens=kv, track_interval=interval, max_running=running,
                    semantics=semantics)
    got = engine.replay(reqs, cfg).prefixes
    return [(r.rid, int(got[r.rid])) for r in reqs]


@pytest.fixture(scope="module")
def runs():
    work = _workloads()
    out = {}
    for case in CASES:
        reqs = work[case[0]]
        _, slots, kv, interval, running = case
        for core in ("python", "rust"):
            r = replay(reqs, ReplayConfig(tree_core=core, state_slots=slots, kv_tokens=kv,
                                          track_interval=interval, max_running=running))
            out[case, core] = [(q["rid"], q["cached_tokens"]) for q in r.requests]
            out[case, core, "running"] = r.config["sglang_max_running_requests"]
        out[case, "v0.5.23"] = _sim(reqs, case, "v0.5.23")
        if running * 5 <= slots:     # within SGLang's cap (v0.5.15's rules have none: above it they run dry)
            out[case, "v0.5.15"] = _sim(reqs, case, "v0.5.15")
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-slots{c[1]}-running{c[4]}")
def test_simulator_hits_equal_sglang_cached_tokens_per_request(runs, case):
    assert runs[case, "python"] == runs[case, "rust"]
    assert runs[case, "v0.5.23"] == runs[case, "python"]
    _, slots, _, _, running = case
    sim_running = SimConfig(state_slots=slots, max_running=running).resolved().max_running
    assert sim_running == runs[case, "python", "running"] == runs[case, "rust", "running"]


@pytest.mark.parametrize("strategy, overlap, mode", [
    ("extra_buffer", True, "pp2"), ("extra_buffer", False, "pp1"),
    ("extra_buffer_lazy", True, "lazy"), ("no_buffer", False, "no_buffer")])
def test_the_running_requests_a_state_pool_allows_are_sglangs(strategy, overlap, mode):
    """SGLang 0.5.23 caps max_running_requests by the state pool, by mode; the simulator's v0.5.23
    rules cap it the same way (a value within the cap is kept, one above it lowered)."""
    reqs = wl.multi_turn(2, 1, 64, 4, seed=0)
    for slots, running in ((23, 30), (23, 3), (12, 12)):
        r = replay(reqs, ReplayConfig(tree_core="python", state_slots=slots, kv_tokens=8192,
                                      max_running=running, mamba_strategy=strategy, overlap=overlap))
        got = SimConfig(state_slots=slots, max_running=running, mode=mode).resolved().max_running
        assert got == r.config["sglang_max_running_requests"], (slots, running)
    assert SimConfig(state_slots=23, max_running=30, mode=mode,
                     semantics="v0.5.15").resolved().max_running == 30


def test_the_cases_hit_miss_and_tell_the_releases_apart(runs):
    """The cases are not trivial: every one has hits and misses, and v0.5.15's rules (the MambaRadixCache
    baseline) give other hits than SGLang 0.5.23 in several of them."""
    for case in CASES:
        cached = [c for _, c in runs[case, "python"]]
        assert any(cached) and not all(cached), case
    differ = [case for case in CASES if runs.get((case, "v0.5.15")) not in (None, runs[case, "python"])]
    assert len(differ) >= 3, differ
