"""The offline upper bound on the token hit rate (mambaradix.sim.bound)
against independent references (tests/sim/bound_reference.py): on tiny traces
over a two-token alphabet, an exhaustive search over every admission and
eviction choice of a cache of C states never beats the bound; the bound is
the relaxation's optimum found by enumeration, and with room for every state
it is the unlimited-pool optimum.  Replays of the simulator are checked in
test_bound_replays.py."""

from __future__ import annotations

import builtins
import dataclasses
import random
import sys

import numpy as np
import pytest

pytest.importorskip("scipy", reason="the hit-rate bound solves its LP with SciPy (tests/requirements.txt)")

from bound_reference import best_schedule, relaxation_optimum, unlimited_optimum
from mambaradix.sim import SimConfig, SimRequest
from mambaradix.sim.bound import BoundResult, held_slots, upper_bound
from mambaradix.sim.checks import ConfigError
from seeds import seeds


def _req(rid: str, prompt, outputs, arrival: float = 0.0, ns=None) -> SimRequest:
    return SimRequest(rid=rid, input_ids=np.asarray(prompt, dtype=np.int32), output_len=len(outputs),
                      output_ids=np.asarray(outputs, dtype=np.int32), arrival=arrival, extra_key=ns)


def _tiny_trace(rng: random.Random, n: int, namespaces: bool = False) -> list:
    """n requests over tokens {1, 2}: prompts of 1..4 tokens, 1..2 outputs;
    a prompt often extends an earlier request's tokens (a later turn)."""
    reqs: list = []
    for k in range(n):
        if reqs and rng.random() < 0.5:
            base = rng.choice(reqs)
            prefix = list(base.input_ids) + list(base.output_ids)
            prompt = prefix[:rng.randint(1, len(prefix))] + [rng.randint(1, 2)]
            prompt = prompt[:5]
        else:
            prompt = [rng.randint(1, 2) for _ in range(rng.randint(1, 4))]
        outputs = [rng.randint(1, 2) for _ in range(rng.randint(1, 2))]
        ns = rng.choice([None, "lora"]) if namespaces else None
        reqs.append(_req(f"r{k}", prompt, outputs, arrival=float(rng.randint(0, 3)), ns=ns))
    return reqs


def _trace(reqs: list) -> list:
    from bound_reference import trace_of
    return trace_of(reqs)


def _config(C: int, page: int = 1, cap: bool = True, mode: str = "pp2") -> SimConfig:
    """A serial configuration whose first admissions leave room for C states."""
    return SimConfig(state_slots=C + held_slots(mode), max_running=1, mode=mode, page_size=page,
                     chunk_size=64, match_cap=cap)


# ---------------------------------------------------------------------------
# every schedule against the bound
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed", seeds())
def test_no_schedule_beats_the_bound(seed):
    rng = random.Random(seed)
    for case in range(12):
        reqs = _tiny_trace(rng, rng.randint(3, 6), namespaces=case % 3 == 0)
        trace = _trace(reqs)
        page = 2 if case % 4 == 3 else 1
        cap = case % 5 != 4
        for C in (0, 1, 2, 3):
            b = upper_bound(reqs, _config(C, page, cap))
            assert b.pool_aware and b.capacity == C and b.exact
            best = best_schedule(trace, C, page, cap)
            assert best <= b.hit_tokens, (seed, case, C, best, b)
            assert b.hit_tokens == relaxation_optimum(trace, C, page, cap), (seed, case, C)
        # room for every state: the bound is the unlimited optimum, and a
        # schedule that keeps everything attains it
        roomy = upper_bound(reqs, _config(64, page, cap))
        unlimited = unlimited_optimum(trace, page, cap)
        assert roomy.hit_tokens == roomy.unlimited_hit_tokens == unlimited
        assert best_schedule(trace, 40, page, cap) == unlimited


def _conversations(rng: random.Random, clients: int, rounds: int) -> list:
    """Interleaved conversations over tokens {1, 2, 3}: each turn's prompt
    is the client's history (earlier prompts and outputs) and a new message;
    clients take turns in a shuffled order each round."""
    hist = {c: [rng.choice([1, 2, 3])] for c in range(clients)}
    reqs = []
    for r in range(rounds):
        for c in rng.sample(range(clients), clients):
            prompt = hist[c] + [rng.randint(1, 3) for _ in range(rng.randint(1, 2))]
            outputs = [rng.randint(1, 3) for _ in range(rng.randint(1, 2))]
            reqs.append(_req(f"c{c}-{r}", prompt, outputs))
            hist[c] = prompt + outputs
    return reqs


@pytest.mark.parametrize("seed", seeds())
def test_flow_is_the_relaxations_optimum(seed):
    """On conversations that contend for the pool, the bound equals the
    relaxation's optimum found by trying every selection of hits."""
    rng = random.Random(seed)
    binding = 0
    for case in range(6):
        reqs = _conversations(rng, rng.randint(2, 3), 3)
        trace = _trace(reqs)
        page = 2 if case % 3 == 2 else 1
        for C in (1, 2):
            b = upper_bound(reqs, _config(C, page))
            assert b.exact and b.hit_tokens == relaxation_optimum(trace, C, page, True), (seed, case, C)
            binding += b.hit_tokens < b.unlimited_hit_tokens
    assert binding >= 3


def test_two_conversations_sharing_one_state():
    """A, B, A', B': A' continues A, B' continues B.  With one state the two
    hits need their states across each other's admissions (A's until A',
    B's until B'): only one fits, the longer; with two both do."""
    reqs = [_req("A", [1, 1, 1, 1], [1]), _req("B", [2, 2], [2]),
            _req("A2", [1, 1, 1, 1, 1, 2], [1]), _req("B2", [2, 2, 2, 1], [1])]
    # A2 can hit at 5 (A's prompt and output), B2 at 3
    assert upper_bound(reqs, _config(1)).hit_tokens == 5
    assert upper_bound(reqs, _config(2)).hit_tokens == 5 + 3
    assert upper_bound(reqs, _config(0)).hit_tokens == 0
    # served A, A2, B, B2 the intervals no longer overlap
    for r, t in zip(reqs, (0, 2, 1, 3)):
        r.arrival = float(t)
    assert upper_bound(reqs, _config(1)).hit_tokens == 8
    # a page of 2: A2 at 4, B2 at 2
    for r, t in zip(reqs, (0, 1, 2, 3)):
        r.arrival = float(t)
    assert upper_bound(reqs, _config(2, page=2)).hit_tokens == 4 + 2
    # without the match cap a hit may cover the whole prompt, but A2 and B2
    # share only 5 and 3 tokens with A and B
    assert upper_bound(reqs, _config(2, cap=False)).hit_tokens == 5 + 3
    reqs[3].input_ids = np.asarray([2, 2, 2], dtype=np.int32)
    assert upper_bound(reqs, _config(2, cap=False)).hit_tokens == 5 + 3
    assert upper_bound(reqs, _config(2)).hit_tokens == 5 + 2


def test_a_hit_needs_an_earlier_toucher():
    """Identical prompts arriving together: the first of them has no one to
    reuse from; a namespace apart, neither does the other."""
    reqs = [_req("x", [1, 2, 1], [2]), _req("y", [1, 2, 1], [2])]
    assert upper_bound(reqs, _config(4)).hit_tokens == 2          # y at the cap, 3 - 1
    reqs[1].extra_key = "other"
    assert upper_bound(reqs, _config(4)).hit_tokens == 0


def test_held_slots_per_mode():
    """SGLang's HybridReqToTokenPool.alloc gives an admitted request a running
    slot and its track buffer: two with the overlap scheduler, one without or
    lazily, none in no_buffer mode."""
    assert {m: held_slots(m) for m in ("pp2", "pp1", "lazy", "no_buffer")} == \
        {"pp2": 3, "pp1": 2, "lazy": 2, "no_buffer": 1}
    reqs = [_req("A", [1, 1, 1], [1]), _req("B", [2, 2], [2]), _req("A2", [1, 1, 1, 1, 2], [1]),
            _req("B2", [2, 2, 2, 2], [1])]
    # 4 slots: no_buffer leaves 3 states, pp2 one
    assert upper_bound(reqs, SimConfig(state_slots=4, max_running=1, mode="no_buffer")).capacity == 3
    assert upper_bound(reqs, SimConfig(state_slots=4, max_running=1, mode="pp2")).hit_tokens == 4


def test_concurrency_gives_the_pool_free_bound():
    """With more than one request running, the pool-aware intervals do not
    hold (docs/bound.md, "Concurrency"): the bound is the unlimited one."""
    rng = random.Random(5)
    reqs = _tiny_trace(rng, 6)
    b = upper_bound(reqs, SimConfig(state_slots=10, max_running=2))
    assert not b.pool_aware and b.capacity is None
    assert b.hit_tokens == b.unlimited_hit_tokens == unlimited_optimum(_trace(reqs), 1, True)
    # max_running=None follows the pool: 6 // 5 = 1 request, so pool-aware
    assert upper_bound(reqs, SimConfig(state_slots=6)).pool_aware


def test_result_fields():
    reqs = [_req("A", [1, 1, 1, 1], [1]), _req("A2", [1, 1, 1, 1, 2], [1])]
    b = upper_bound(reqs, _config(1))
    assert isinstance(b, BoundResult)
    assert (b.hit_tokens, b.prompt_tokens, b.requests, b.candidates) == (4, 9, 2, 1)
    assert b.token_hit_rate == pytest.approx(4 / 9) and b.unlimited_token_hit_rate == pytest.approx(4 / 9)


# ---------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------
def test_bad_input_is_refused_naming_it():
    good = [_req("A", [1, 2], [1])]
    cfg = _config(2)
    with pytest.raises(TypeError, match="config must be a SimConfig"):
        upper_bound(good, {"state_slots": 4})
    with pytest.raises(TypeError, match="requests must be a list"):
        upper_bound(iter(good), cfg)
    with pytest.raises(ValueError, match="requests is empty"):
        upper_bound([], cfg)
    with pytest.raises(TypeError, match=r"requests\[1\] must be a SimRequest"):
        upper_bound(good + ["B"], cfg)
    with pytest.raises(ValueError, match=r"requests\[1\].*duplicate rid 'A'"):
        upper_bound(good + [_req("A", [1], [1])], cfg)
    with pytest.raises(ValueError, match=r"requests\[0\].*input_ids is empty"):
        upper_bound([_req("E", [], [1])], cfg)
    bad = _req("O", [1], [1])
    bad.output_len = 0
    with pytest.raises(ValueError, match=r"requests\[0\].*output_len must be >= 1"):
        upper_bound([bad], cfg)
    bad.output_len = 3
    with pytest.raises(ValueError, match=r"requests\[0\].*output_ids (is )?shorter than output_len"):
        upper_bound([bad], cfg)
    with pytest.raises(ConfigError, match="state_slots must be an integer"):
        upper_bound(good, dataclasses.replace(cfg, state_slots=0))
    with pytest.raises(ConfigError, match="unknown mode"):
        upper_bound(good, dataclasses.replace(cfg, mode="pp3"))
    with pytest.raises(ConfigError, match="page_size 1"):
        upper_bound(good, dataclasses.replace(cfg, mode="no_buffer", page_size=16))


def test_without_scipy_a_clear_import_error(monkeypatch):
    """The flow's LP needs SciPy, an optional dependency (the sim extra)."""
    reqs = [_req("A", [1, 1, 1, 1], [1]), _req("B", [2, 2], [2]),
            _req("A2", [1, 1, 1, 1, 1, 2], [1]), _req("B2", [2, 2, 2, 1], [1])]
    real_import = builtins.__import__

    def no_scipy(name, *args, **kwargs):
        if name == "scipy" or name.startswith("scipy."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    for mod in [m for m in sys.modules if m == "scipy" or m.startswith("scipy.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", no_scipy)
    with pytest.raises(ImportError, match=r"pip install scipy"):
        upper_bound(reqs, _config(1))
    # where no LP is needed (room for every hit, or concurrency) it still answers
    assert upper_bound(reqs, _config(2)).hit_tokens == 8
