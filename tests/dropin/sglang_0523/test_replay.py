"""``sglang-replay``: traces through SGLang 0.5.23's own Scheduler on CPU (mambaradix.sglang_replay).

References: hand-computed cached_tokens from SGLang's documented Mamba tracking rules, the three TreeCores
against each other (SGLang's Python and Rust cores are SGLang's own), and toy states recomputed from the
tokens (a pure-Python hash here).  The scheduler is built in this process, a second or so a run."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
import sgl_env

from mambaradix.sglang_replay import ReplayConfig, ReplayError, replay, toy_hash
from mambaradix.sglang_replay import cli
from mambaradix.sim import workloads as wl
from mambaradix.sim.types import SimRequest

CORES = ("python", "rust", "mambaradix")


def _conversation(out1: int) -> list:
    """Two turns of one conversation: a 200-token prompt decoding ``out1`` tokens, then the whole turn
    (prompt + outputs) plus 100 new tokens.  Turn 2 arrives long after turn 1 has finished."""
    rng = np.random.default_rng(26)
    p1, o1 = rng.integers(2, 5000, 200), rng.integers(2, 5000, out1)
    p2, o2 = np.concatenate([p1, o1, rng.integers(2, 5000, 100)]), rng.integers(2, 5000, 8)
    return [SimRequest("t1", p1, out1, output_ids=o1, arrival=0.0),
            SimRequest("t2", p2, 8, output_ids=o2, arrival=100.0)]


# Expected cached_tokens of turn 2, by hand from SGLang's Mamba tracking rules (docs/sglang-replay.md):
# extra_buffer keeps states only at snapshots: the prefill snapshot at P + (E // C) * C (C = max(64,
# page size) = 64 here: 200 // 64 * 64 = 192) and decode snapshots where the committed length is a multiple
# of --mamba-track-interval (64).  Turn 1 commits 200 + out1 - 1 tokens (its last output is never fed):
# with 40 outputs, lengths 201..239 hold no multiple of 64, so it leaves 192; with 60, 201..259 hold 256.
# no_buffer donates the finished request's running state: its whole committed length, 239 or 259.
# 192 and 256 are multiples of the page size 16 too, and turn 2's prompts (340, 360) are longer.
HAND = [
    # (strategy, page size, turn-1 outputs, turn 2's cached_tokens)
    ("extra_buffer", 1, 40, 192), ("extra_buffer", 1, 60, 256),
    ("extra_buffer", 16, 40, 192), ("extra_buffer", 16, 60, 256),
    ("extra_buffer_lazy", 1, 60, 256), ("extra_buffer_lazy", 16, 40, 192),
    ("no_buffer", 1, 40, 239), ("no_buffer", 1, 60, 259),
]


@pytest.mark.parametrize("strategy, page, out1, expected", HAND)
def test_turn_two_reuses_turn_one_as_the_tracking_rules_say(strategy, page, out1, expected):
    r = replay(_conversation(out1), ReplayConfig(
        tree_core="mambaradix", state_slots=16, kv_tokens=4096, page_size=page, max_running=1,
        mamba_strategy=strategy, track_interval=64))
    assert [(q["rid"], q["prompt_tokens"], q["cached_tokens"]) for q in r.requests] == [
        ("t1", 200, 0), ("t2", 200 + out1 + 100, expected)]
    assert r.toy_state_mismatches == 0
    assert r.cached_tokens_total == expected and r.token_hit_rate == expected / (500 + out1)


def _workloads() -> dict:
    return {
        # five conversations of three turns (recorded outputs)
        "multiturn": wl.multi_turn(5, 3, 200, 40, request_rate=8.0, seed=3),
        # two groups sharing a system prompt; outputs only as lengths: generated from the request ids
        "gsp": wl.generated_shared_prefix(2, 4, 256, 32, 24, seed=3),
    }


# (workload, strategy, page size, state slots): the small pools make SGLang evict states.
MATRIX = [
    ("multiturn", "extra_buffer", 1, 12), ("multiturn", "extra_buffer", 16, 14),
    ("gsp", "extra_buffer", 1, 8), ("multiturn", "no_buffer", 1, 8),
    ("multiturn", "extra_buffer_lazy", 1, 64), ("multiturn", "extra_buffer_lazy", 16, 64),
]


@pytest.fixture(scope="module")
def matrix():
    work = _workloads()
    out = {}
    for name, strategy, page, slots in MATRIX:
        for core in CORES:
            out[name, strategy, page, slots, core] = replay(work[name], ReplayConfig(
                tree_core=core, state_slots=slots, kv_tokens=16384, page_size=page, max_running=2,
                mamba_strategy=strategy, track_interval=64))
    return out


@pytest.mark.parametrize("case", MATRIX, ids=lambda c: "-".join(map(str, c)))
def test_every_tree_core_gives_sglang_the_same_cached_tokens(matrix, case):
    rows = {core: [(q["rid"], q["prompt_tokens"], q["cached_tokens"]) for q in matrix[(*case, core)].requests]
            for core in CORES}
    assert rows["mambaradix"] == rows["python"] == rows["rust"]
    cached = [c for _, _, c in rows["python"]]
    assert any(cached) and not all(cached)     # hits and misses both
    for core in CORES:
        r = matrix[(*case, core)]
        assert r.toy_state_mismatches == 0, (core, r.mismatch_examples)
        assert r.config["tree_core_class"] == {"python": "UnifiedTreeCore", "rust": "RustUnifiedTreeCore",
                                               "mambaradix": "MambaradixTreeCore"}[core]


def test_a_small_state_pool_costs_hits(matrix):
    """The pressured pools above evict states: a big pool finds more (so the matrix tests eviction)."""
    work = _workloads()["multiturn"]
    big = replay(work, ReplayConfig(tree_core="python", state_slots=64, kv_tokens=16384, max_running=2,
                                    track_interval=64))
    small = matrix["multiturn", "extra_buffer", 1, 12, "python"]
    assert big.toy_state_mismatches == 0
    assert small.cached_tokens_total < big.cached_tokens_total


def _documented_commands() -> list:
    """The sglang-replay command lines of README.md and docs/sglang-replay.md (indented blocks), as argv."""
    out = []
    for name in ("README.md", os.path.join("docs", "sglang-replay.md")):
        with open(os.path.join(sgl_env.REPO, name)) as f:
            text = f.read().replace("\\\n", " ")
        out += [shlex.split(m) for m in re.findall(r"^ {4}python -m mambaradix sglang-replay(.*)$", text, re.M)]
    return out


def test_documented_commands_parse():
    commands = _documented_commands()
    assert len(commands) >= 6
    for argv in commands:
        cli._config(cli.build_parser().parse_args(argv))


def test_lazy_under_state_pressure_on_the_mambaradix_core():
    """extra_buffer_lazy with its state pool run empty: SGLang releases the MAMBA part of a request's lock
    on its own and the rest later (MambaComponent._alloc_mamba_slot); docs/sglang-replay.md's command, as
    written, gives SGLang the same cached_tokens as on its Python core."""
    argv = next(a for a in _documented_commands() if "extra_buffer_lazy" in a and "--state-slots" in a
                and "mambaradix" in a)
    args = cli.build_parser().parse_args(argv)
    work, _ = cli.build_workload(args)
    config = cli._config(args)
    ref = replay(work, dataclasses.replace(config, tree_core="python"))
    ours = replay(work, config)
    assert ref.toy_state_mismatches == 0 and ours.toy_state_mismatches == 0
    assert ours.requests == ref.requests
    assert any(q["cached_tokens"] for q in ours.requests)


def test_a_corrupted_state_is_reported():
    """The check can fail: the first state written into a track slot (turn 1's prefill snapshot at 192,
    which turn 2 restores) is made wrong once, through the test hook."""
    work = _conversation(40)
    cfg = ReplayConfig(tree_core="python", state_slots=16, kv_tokens=4096, max_running=1, track_interval=64)
    assert replay(work, cfg).toy_state_mismatches == 0
    bad = replay(work, cfg, corrupt_track_write=0)
    assert bad.toy_state_mismatches == 1 and bad.mismatch_examples == [("t2", 192)]
    assert bad.requests == replay(work, cfg).requests   # what SGLang reports does not depend on the states


def test_a_replay_leaves_no_scheduler_alive():
    """Replays in one process (bench_sglang_replay.py runs about a hundred) free each scheduler and its
    pools: SGLang's watchdog thread, which never ends, must not keep the last one."""
    import gc

    from sglang.srt.managers.scheduler import Scheduler

    def alive() -> int:
        return sum(1 for o in gc.get_objects() if isinstance(o, Scheduler))

    work = _conversation(8)
    for core in ("rust", "mambaradix"):
        gc.collect()
        before = alive()
        replay(work, ReplayConfig(tree_core=core, state_slots=16, kv_tokens=4096, max_running=1))
        gc.collect()
        assert alive() == before, core


def test_toy_hash_is_the_documented_polynomial():
    def slow(tokens):
        h = 0
        for t in tokens:
            h = (h * 0x100000001B3 + t + 1) % (1 << 64)
        return h

    rng = np.random.default_rng(5)
    for n in (0, 1, 2, 63, 1000, 5000):
        toks = rng.integers(0, 1 << 31, n).tolist()
        assert toy_hash(toks) == slow(toks)
    assert toy_hash([1, 2]) != toy_hash([2, 1]) and toy_hash([0]) != toy_hash([])


def test_bad_settings_are_refused_before_sglang_runs():
    work = _conversation(40)
    for kwargs, option in [({"state_slots": 0}, "state_slots"), ({"tree_core": "cpp"}, "tree_core"),
                           ({"mamba_strategy": "lazy"}, "mamba_strategy"),
                           ({"page_size": 16, "track_interval": 40}, "track_interval"),
                           ({"mamba_strategy": "no_buffer", "page_size": 16}, "page_size"),
                           ({"mamba_strategy": "extra_buffer_lazy", "overlap": False}, "overlap"),
                           ({"chunked_prefill_size": -1}, "chunked_prefill_size"),
                           ({"kv_tokens": True}, "kv_tokens")]:
        with pytest.raises(ReplayError) as e:
            replay(work, ReplayConfig(**kwargs))
        assert e.value.option == option, (kwargs, str(e.value))
    with pytest.raises(ReplayError, match="appears twice"):
        replay([work[0], work[0]], ReplayConfig())
    with pytest.raises(ReplayError, match="no requests"):
        replay([], ReplayConfig())


# ---------------------------------------------------------------- the mambaradix TreeCore's state policies

@pytest.mark.parametrize("strategy, page, out1, expected", [
    # turn 1 commits 200 + out1 - 1 tokens; the end-of-turn state is there when that is whole pages
    ("extra_buffer", 1, 40, 239), ("extra_buffer", 16, 25, 224), ("extra_buffer_lazy", 1, 40, 239),
    ("extra_buffer_lazy", 16, 25, 224),
    # 239 is not whole pages of 16: the rule refuses, the prefill snapshot at 192 stays (as without it)
    ("extra_buffer", 16, 40, 192),
])
def test_end_of_turn_states_leave_the_exact_end_of_a_turn(strategy, page, out1, expected):
    """With end-of-turn states turn 2 reuses all of turn 1 (its committed tokens, when they are whole pages),
    not only turn 1's last track snapshot (HAND above); turn 1 ran alone, so the running slot is exact."""
    work = _conversation(out1)
    cfg = ReplayConfig(tree_core="mambaradix", state_slots=16, kv_tokens=4096, page_size=page, max_running=1,
                       mamba_strategy=strategy, track_interval=64, overlap=True)
    plain = replay(work, cfg)
    eot = replay(work, dataclasses.replace(cfg, end_of_turn_states=True))
    assert eot.toy_state_mismatches == 0 and plain.toy_state_mismatches == 0
    assert eot.config["tree_settings"]["end_of_turn_states"] is True
    assert [q["cached_tokens"] for q in eot.requests] == [0, expected]
    snapshot = 256 if (200 + out1 - 1) >= 256 else 192
    assert [q["cached_tokens"] for q in plain.requests] == [0, snapshot]


def _fork_after_two_turns(budget):
    """Turn 1 (p1, 200 tokens), turn 2 (all of turn 1 + 100 tokens), then a request sharing only p1."""
    work = _conversation(40)
    rng = np.random.default_rng(7)
    fork = SimRequest("fork", np.concatenate([work[0].input_ids, rng.integers(2, 5000, 50)]), 4,
                      output_ids=rng.integers(2, 5000, 4), arrival=200.0)
    return replay(work + [fork], ReplayConfig(tree_core="mambaradix", state_slots=16, kv_tokens=4096,
                                              max_running=1, track_interval=64, path_state_budget=budget))


def test_a_path_state_budget_drops_the_states_a_deeper_one_makes_redundant():
    """Without a budget the fork finds turn 1's state at 192 (its prefill snapshot); with a budget of one
    state per path, turn 2's deeper states on the same path dropped it, so the fork finds nothing."""
    free, tight = _fork_after_two_turns(0), _fork_after_two_turns(1)
    assert [q["cached_tokens"] for q in free.requests] == [0, 192, 192]
    assert [q["cached_tokens"] for q in tight.requests][2] == 0
    assert tight.requests[1]["cached_tokens"] == 192      # the budget never drops a state a match needs next
    assert free.toy_state_mismatches == 0 and tight.toy_state_mismatches == 0


# (state policy settings, label): every configuration of the TreeCore the plugin offers, and the one the
# README recommends; the toy-state check must hold for each, in both extra_buffer modes and page sizes.
POLICY_CONFIGS = [
    ({"state_policy": "utility"}, "utility"),
    ({"state_policy": "utility", "utility_order": "lru"}, "utility-lru"),
    ({"end_of_turn_states": True}, "eot"),
    ({"path_state_budget": 2}, "budget2"),
    ({"state_policy": "utility", "end_of_turn_states": True, "path_state_budget": 2}, "utility-eot-budget"),
]


@pytest.mark.parametrize("strategy", ["extra_buffer", "extra_buffer_lazy"])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("settings, label", POLICY_CONFIGS, ids=[c[1] for c in POLICY_CONFIGS])
def test_every_state_policy_restores_exact_states(settings, label, page, strategy):
    """Small pools (states are evicted) and a multi-turn workload with shared prefixes: SGLang's own
    scheduler restores only exact states (0 toy-state mismatches) and still finds hits."""
    work = _workloads()["multiturn"]
    r = replay(work, ReplayConfig(tree_core="mambaradix", state_slots=12 if page == 1 else 14, kv_tokens=16384,
                                  page_size=page, max_running=2, mamba_strategy=strategy, track_interval=64,
                                  **settings))
    assert r.toy_state_mismatches == 0, r.mismatch_examples
    assert r.cached_tokens_total > 0
    assert {k: r.config["tree_settings"][k] for k in settings} == settings


def test_state_policy_options_are_refused_for_sglangs_cores_and_bad_values_named():
    work = _conversation(40)
    for core in ("python", "rust"):
        with pytest.raises(ReplayError) as e:
            replay(work, ReplayConfig(tree_core=core, state_policy="utility"))
        assert e.value.option == "state_policy" and "mambaradix TreeCore" in str(e.value)
    for kwargs, option in [({"state_policy": "belady-ish"}, "state_policy"),
                           ({"utility_order": "up"}, "utility_order"),
                           ({"path_state_budget": -1}, "path_state_budget"),
                           ({"end_of_turn_states": "yes"}, "end_of_turn_states")]:
        with pytest.raises(ReplayError) as e:
            replay(work, ReplayConfig(tree_core="mambaradix", **kwargs))
        assert e.value.option == option, (kwargs, str(e.value))


# ---------------------------------------------------------------- the command line

def test_cli_json_is_the_documented_structure(tmp_path, capfd):
    trace = tmp_path / "conv.jsonl"
    wl.save_token_trace(_conversation(60), str(trace))
    rc = cli.main(["--trace", str(trace), "--tree-core", "mambaradix", "--state-slots", "16",
                   "--kv-tokens", "4096", "--max-running", "1", "--track-interval", "64", "--json"])
    out, err = capfd.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert set(doc) == {"config", "metrics", "requests"}
    assert set(doc["metrics"]) == {"token_hit_rate", "requests", "cached_tokens_total",
                                   "scheduler_us_per_request", "tree_cache_us_per_request",
                                   "toy_state_mismatches"}
    assert doc["requests"] == [{"rid": "t1", "prompt_tokens": 200, "cached_tokens": 0},
                               {"rid": "t2", "prompt_tokens": 360, "cached_tokens": 256}]
    m = doc["metrics"]
    assert (m["requests"], m["cached_tokens_total"], m["toy_state_mismatches"]) == (2, 256, 0)
    assert m["token_hit_rate"] == 256 / 560 and m["scheduler_us_per_request"] > 0
    # the tree cache's share is part of the scheduler's time, and the cache was called (matches, inserts)
    assert 0 < m["tree_cache_us_per_request"] < m["scheduler_us_per_request"]
    assert doc["config"]["tree_core"] == "mambaradix" and doc["config"]["state_slots"] == 16


def test_cli_table(capfd):
    rc = cli.main(["--workload", "multiturn", "--num-clients", "2", "--num-rounds", "2", "--request-length",
                   "100", "--output-length", "8", "--state-slots", "16", "--kv-tokens", "4096"])
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert "multi-turn chat: 4 requests" in out and "token hit rate" in out and "mt-1-1" in out


@pytest.mark.parametrize("argv, says", [
    (["--state-slots", "0"], "--state-slots"),
    (["--tree-core", "cpp"], "--tree-core"),
    (["--page-size", "16", "--track-interval", "40"], "--track-interval"),
    (["--mamba-strategy", "extra_buffer_lazy", "--disable-overlap-schedule"], "--disable-overlap-schedule"),
    (["--trace", "/nonexistent/trace.jsonl"], "--trace"),
    (["--workload", "gsp", "--trace", "t.jsonl"], "--workload or --trace"),
    (["--kv-tokens", "300", "--workload", "multiturn", "--num-clients", "1", "--num-rounds", "1"], "--kv-tokens"),
    # SGLang keeps 5 slots per running request with extra_buffer and the overlap scheduler: it refuses 4
    (["--state-slots", "4", "--kv-tokens", "4096", "--workload", "multiturn", "--num-clients", "1",
      "--num-rounds", "1"], "--state-slots"),
    (["--frobnicate"], "--frobnicate"),
    (["--state-policy", "utility"], "--state-policy"),                      # the default core is rust
    (["--tree-core", "python", "--end-of-turn-states"], "--end-of-turn-states"),
    (["--tree-core", "mambaradix", "--state-policy", "nonsense", "--workload", "multiturn", "--num-clients", "1",
      "--num-rounds", "1"], "--state-policy"),
    (["--path-state-budget", "-1"], "--path-state-budget"),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv, says, capfd):
    assert cli.main(argv) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err, err
    assert err.startswith("mambaradix sglang-replay: error: ") and "Traceback" not in err


def test_cli_without_sglang_says_so_and_how_to_point_at_it(tmp_path):
    trace = tmp_path / "conv.jsonl"
    wl.save_token_trace(_conversation(40), str(trace))
    env = dict(os.environ, PYTHONPATH=sgl_env.REPO)
    env.pop("MAMBARADIX_SGLANG_0523", None)
    r = subprocess.run([sys.executable, "-m", "mambaradix", "sglang-replay", "--trace", str(trace),
                        "--sglang-path", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("mambaradix sglang-replay: error: SGLang 0.5.23 is not importable")
    assert "--sglang-path" in r.stderr and "MAMBARADIX_SGLANG_0523" in r.stderr and r.stderr.count("\n") == 1


def test_cli_as_a_user_runs_it(tmp_path):
    """A fresh process, the 0.5.23 install named by the variable: stdout is the JSON alone."""
    trace = tmp_path / "conv.jsonl"
    wl.save_token_trace(_conversation(40), str(trace))
    env = dict(os.environ, PYTHONPATH=sgl_env.REPO, MAMBARADIX_SGLANG_0523=sgl_env.TARGET, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "mambaradix", "sglang-replay", "--trace", str(trace),
                        "--state-slots", "16", "--kv-tokens", "4096", "--max-running", "1", "--track-interval",
                        "64", "--json"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [q["cached_tokens"] for q in json.loads(r.stdout)["requests"]] == [0, 192]
