"""The per-path state budget on whole replays: it drops only the states the
newest one on a path makes redundant, never a fork's state that other
branches resume from.  The reference is the same replay without a budget."""

from __future__ import annotations

import dataclasses

from mambaradix.sim import SimConfig, apply_preset, workloads
from mambaradix.sim.engine import replay


def _prefixes(reqs, budget: int) -> tuple:
    cfg = apply_preset(SimConfig(kv_tokens=1 << 17, state_slots=1 << 12, max_running=4, lru_policy="utility"),
                       "qwen3-next")
    res = replay(reqs, dataclasses.replace(cfg, max_states_per_path=budget).resolved(), None)
    return res.prefixes, res.metrics.states_trimmed


def test_budget_keeps_the_shared_system_prompt_state() -> None:
    # 4 groups x 4 prompts: each path holds the group's system-prompt state
    # (a fork once the group's second prompt arrives), a state inside the
    # question and one at the end of the answer; a budget of 2 drops only the
    # middle one, which no later request needs
    reqs = workloads.generated_shared_prefix(num_groups=4, prompts_per_group=4, system_prompt_len=2048,
                                             question_len=128, output_len=256, request_rate=float("inf"),
                                             seed=0)
    want, _ = _prefixes(reqs, 0)
    got, trimmed = _prefixes(reqs, 2)
    assert trimmed > 0
    assert got == want
