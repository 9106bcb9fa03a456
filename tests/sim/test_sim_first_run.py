"""What a new user of the simulator ran into: the Python API and the command
line must agree on defaults and refuse impossible inputs up front, no input
may hang a replay, errors are one line with exit code 2, and the output
carries what a researcher needs to reproduce and reuse a run."""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mambaradix
from mambaradix.sim import SimConfig, SimRequest, cli, engine, run, sweep, workloads
from mambaradix.sim.checks import ConfigError
from mambaradix.sim.report import config_to_dict

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--num-clients", "6", "--num-rounds", "3", "--request-length", "96",
         "--output-length", "8", "--no-progress"]


def main(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_replay(monkeypatch):
    """Makes any replay fail the test: errors must come before the first one."""
    def replay(*a, **k):
        raise AssertionError("a replay ran before the error was reported")
    monkeypatch.setattr(engine, "run", replay)


# --- item 2: no input hangs a replay -------------------------------------------------------

def test_kv_pool_smaller_than_one_request_raises_up_front():
    code = ("from mambaradix.sim import run, SimConfig, workloads\n"
            "reqs = workloads.multi_turn(4, 2, 64, 8)\n"
            "try:\n    run(reqs, SimConfig(kv_tokens=10))\n"
            "except ValueError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "refused: the KV pool (10 tokens) is smaller than one request's need" in out.stdout


def _random_case(rng: random.Random):
    n = rng.randrange(1, 9)
    shared = [rng.randrange(1, 50) for _ in range(rng.randrange(0, 40))]
    reqs = []
    for i in range(n):
        tail = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 40))]
        ids = np.array(shared[:rng.randrange(len(shared) + 1)] + tail, dtype=np.int32)
        reqs.append(SimRequest(rid=f"r{i}", input_ids=ids, output_len=rng.randrange(1, 30),
                               arrival=rng.choice([0.0, rng.random()])))
    page = rng.choice([1, 1, 2, 4])
    cfg = SimConfig(kv_tokens=rng.randrange(8, 200), state_slots=rng.randrange(3, 16),
                    page_size=page, chunk_size=page * rng.choice([1, 2, 4]),
                    track_interval=page * rng.choice([1, 3, 8]),
                    chunked_prefill_size=rng.choice([None, 8, 16]),
                    mode=rng.choice(["pp2", "pp1", "lazy"] + (["no_buffer"] if page == 1 else [])),
                    lru_policy=rng.choice(["sglang", "consumed"]),
                    max_running=rng.choice([None, 1, 2, 4]), max_prefill_tokens=rng.choice([16, 64]))
    return reqs, cfg


def test_replays_of_random_inputs_end_within_a_bounded_number_of_steps():
    """Tiny, tight pools and odd shapes: each replay is refused up front,
    stops with a pool message, or finishes within a step count bounded by the
    work (one step per token of every request, 16 times over)."""
    rng = random.Random(0)
    outcomes = {"finished": 0, "refused": 0, "pool": 0}
    for _ in range(150):
        reqs, cfg = _random_case(rng)
        try:
            res = engine.replay(reqs, cfg)
        except ConfigError:
            outcomes["refused"] += 1
            continue
        except RuntimeError as e:
            assert "made no progress" not in str(e)
            assert "exhausted" in str(e) or "too small" in str(e), e
            outcomes["pool"] += 1
            continue
        bound = 16 * sum(len(r.input_ids) + r.output_len + 3 for r in reqs) + 1000
        assert res.steps <= bound
        assert res.metrics.requests == len(reqs)
        outcomes["finished"] += 1
    assert outcomes["finished"] > 30 and outcomes["refused"] > 10, outcomes


def test_a_replay_that_stops_progressing_is_stopped(monkeypatch):
    monkeypatch.setattr(engine, "step_limit", lambda reqs, cfg: 3)
    reqs = workloads.multi_turn(4, 2, 64, 8)
    with pytest.raises(RuntimeError, match="made no progress: .* after 3 scheduler steps"):
        run(reqs, SimConfig())


# --- item 3: the API derives the command line's defaults -----------------------------------

def test_default_config_and_workload_give_the_cli_result(capsys):
    code, out, _ = main(capsys, "--json", "--no-progress")
    assert code == 0
    doc = json.loads(out)
    reqs = workloads.multi_turn(64, 8, 512, 64)
    m = run(reqs, SimConfig())
    assert doc["config"] == config_to_dict(SimConfig().resolved())
    assert doc["config"]["max_running"] == 51                  # 256 slots // 5
    for k in ("requests", "prompt_tokens", "state_usable_tokens", "kv_matched_tokens",
              "state_hits", "lost_eviction", "peak_state_slots", "prefill_flops_saved"):
        assert doc["metrics"][k] == getattr(m, k), k
    assert m.prefill_flops_saved == m.state_usable_tokens * 6e9 > 0


def test_max_running_follows_the_state_pool_unless_given():
    assert SimConfig().resolved().max_running == 51
    assert dataclasses.replace(SimConfig(), state_slots=40).resolved().max_running == 8
    assert SimConfig(state_slots=4).resolved().max_running == 1
    assert SimConfig(state_slots=10_000).resolved().max_running == 64
    assert SimConfig(state_slots=40, max_running=3).resolved().max_running == 3
    reqs = workloads.multi_turn(4, 2, 64, 8)
    points = sweep(reqs, SimConfig(), state_slots=[10, 100])
    assert [p.config.max_running for p in points] == [2, 20]


def test_empty_workload_is_refused_like_the_cli(tmp_path, capsys):
    with pytest.raises(ConfigError, match="the workload has no requests"):
        run([], SimConfig())
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, _, err = main(capsys, "--trace", str(empty))
    assert code == 2 and "no requests" in err


# --- item 4: --states toy with paged KV ---------------------------------------------------

@pytest.mark.parametrize("page", [4, 16])
def test_toy_states_run_with_pages_from_the_api(page):
    pytest.importorskip("torch")
    pytest.importorskip("mambaradix.sglang")
    reqs = workloads.multi_turn(6, 3, 100, 24, seed=3)
    m = run(reqs, SimConfig(states="toy", page_size=page))
    # run() raises unless every request's usable prefix through the drop-in
    # (paged allocator) equals the state-free replay's
    assert m.requests == 18 and m.state_hits > 0 and m.state_mismatches == 0
    assert "toy" in m.wall_seconds
    # SGLang runs no_buffer with page size 1 only
    with pytest.raises(ValueError, match="page_size must be 1 in no_buffer mode"):
        run(reqs, SimConfig(states="toy", mode="no_buffer", page_size=page))


def test_paged_kv_pool_counts_whole_pages_up_front():
    # 64 prompt + 8 output tokens + a page of headroom = 88 tokens, but a pool of
    # 95 tokens holds five pages of 16 (80 tokens): refused before any replay
    reqs = [SimRequest("a", np.arange(1, 65, dtype=np.int32), 8)]
    with pytest.raises(ConfigError, match="smaller than one request's need"):
        run(reqs, SimConfig(kv_tokens=95, page_size=16, chunk_size=64, track_interval=64,
                            state_slots=8, max_running=1))
    m = run(reqs, SimConfig(kv_tokens=95, page_size=1, chunk_size=64, track_interval=64,
                            state_slots=8, max_running=1))
    assert m.requests == 1


@pytest.mark.parametrize("page", ["4", "16", "64"])
def test_toy_states_run_with_pages_from_the_command_line(capsys, page):
    pytest.importorskip("torch")
    pytest.importorskip("mambaradix.sglang")
    code, out, err = main(capsys, *SMALL, "--states", "toy", "--page-size", page, "--json")
    assert code == 0, err
    doc = json.loads(out)
    m = doc["metrics"]
    assert doc["config"]["page_size"] == int(page)
    assert m["requests"] == 18 and m["state_hits"] > 0 and m["state_mismatches"] == 0
    code, out, err = main(capsys, *SMALL, "--states", "toy", "--sweep", f"page_size=1,{page}",
                          "--json")
    assert code == 0, err
    assert "Lifecycle" not in err


def test_toy_replays_of_random_tiny_pools_agree_at_every_page_size():
    """The random tight cases above (page 1, 2 and 4), replayed state-free
    (pool accounting checked after every step) and with toy states through
    the drop-in: both stop on a pool error, or both finish with the same
    usable prefix for every request and no restored state differs (lazy
    aside: its SGLang window)."""
    pytest.importorskip("torch")
    pytest.importorskip("mambaradix.sglang")
    rng = random.Random(1)
    finished, stopped = [], 0
    for _ in range(150):
        reqs, cfg = _random_case(rng)
        cfg = dataclasses.replace(cfg, states="toy", decode_boundary=(
            "committed" if cfg.mode == "lazy" else "batch")).resolved()
        try:
            res = engine.replay(reqs, cfg, check_every_step=True)
        except ConfigError:
            continue
        except RuntimeError:
            with pytest.raises(RuntimeError):
                engine._toy_replay(reqs, cfg)
            stopped += 1
            continue
        got, _, bad = engine._toy_replay(reqs, cfg)
        assert {rid: got[rid] for rid in res.prefixes} == res.prefixes, cfg
        assert bad == 0 or cfg.mode == "lazy"
        finished.append(cfg.page_size)
    assert finished.count(2) > 5 and finished.count(4) > 5 and stopped > 5, (finished, stopped)


# --- item 7: one-line errors, exit code 2 -------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--seed", "-1"], "argument --seed: expected an integer >= 0, got '-1'"),
    (["--state-mem", "-8GiB"], "argument --state-mem: a size must be a finite number >= 0, got '-8GiB'"),
    (["--kv-mem", "-1e9"], "argument --kv-mem: a size must be a finite number >= 0"),
    (["--plot", "out.txt"], "--plot out.txt: unsupported format 'txt'"),
    (["--plot", "out"], "--plot out: unsupported format (no extension)"),
    (["--plot", "/nonexistent-dir/out.png"], "the folder /nonexistent-dir does not exist"),
    (["--csv", "/nonexistent-dir/t.csv"], "--csv /nonexistent-dir/t.csv: the folder"),
])
def test_bad_arguments_exit_2_with_one_line_before_any_replay(argv, message, no_replay, capsys):
    if argv[0] == "--plot":
        pytest.importorskip("matplotlib")
    try:
        code, _, err = main(capsys, *argv)
    except SystemExit as e:               # argparse's own errors
        code, err = e.code, capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err


def test_binary_trace_names_the_line(tmp_path, capsys):
    bad = tmp_path / "trace.jsonl"
    bad.write_bytes(b'{"input_ids": [1, 2], "output_len": 1}\n\xff\xfe\x00\x01binary\n')
    code, _, err = main(capsys, "--trace", str(bad))
    assert code == 2
    assert f"{bad}:2: not UTF-8 text" in err


# --- item 9: --help shows every default; a plain progress line without tqdm ---------------

def test_help_shows_every_default():
    parser = cli.build_parser()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert "default" in (action.help or ""), action.option_strings
    text = parser.format_help()
    assert "(default: 1048576)" in text and "(default: 256)" in text and "(default: pp2)" in text


def test_without_tqdm_long_runs_print_a_plain_progress_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)          # import tqdm fails
    monkeypatch.setattr(cli._Progress, "PLAIN_AFTER", 0.0)
    monkeypatch.setattr(cli._Progress, "PLAIN_EVERY", 0.0)
    code, out, err = main(capsys, *[a for a in SMALL if a != "--no-progress"])
    assert code == 0 and "hit rates" in out
    lines = [ln for ln in err.splitlines() if "requests done" in ln]
    assert lines and lines[-1].startswith("replay: 18 of 18 requests done (100%)")
    code, out, err = main(capsys, *SMALL)                    # --no-progress: silent
    assert code == 0 and "requests done" not in err


# --- item 11: output for researchers ------------------------------------------------------

def test_json_carries_version_command_config_and_timestamp(capsys):
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    code, out, _ = main(capsys, *SMALL, "--json", "--state-slots", "30")
    doc = json.loads(out)
    assert code == 0
    assert doc["mambaradix_version"] == mambaradix.__version__
    assert doc["command"] == "python -m mambaradix sim " + " ".join(SMALL + ["--json", "--state-slots", "30"])
    stamp = datetime.datetime.fromisoformat(doc["timestamp"])
    assert before <= stamp <= datetime.datetime.now(datetime.timezone.utc)
    assert doc["config"]["state_slots"] == 30 and doc["config"]["max_running"] == 6


def test_sweep_json_is_an_object_and_csv_has_one_row_per_point(tmp_path, capsys):
    table = tmp_path / "t.csv"
    code, out, _ = main(capsys, *SMALL, "--json", "--sweep", "state_slots=10,40",
                        "--sweep", "policy=sglang,consumed", "--csv", str(table))
    assert code == 0
    doc = json.loads(out)
    assert isinstance(doc, dict) and isinstance(doc["sweep"], list) and len(doc["sweep"]) == 4
    rows = list(csv.DictReader(table.open()))
    assert [(int(r["state_slots"]), r["lru_policy"]) for r in rows] == \
        [(p["params"]["state_slots"], p["params"]["lru_policy"]) for p in doc["sweep"]]
    for r, p in zip(rows, doc["sweep"]):
        assert float(r["token_hit_rate"]) == pytest.approx(p["metrics"]["token_hit_rate"])
        assert int(r["state_usable_tokens"]) == p["metrics"]["state_usable_tokens"]


def test_saved_trace_replays_to_the_same_result(tmp_path, capsys):
    trace = tmp_path / "w.jsonl.gz"
    code, out, err = main(capsys, "--workload", "agentic", "--agent-trees", "2",
                          "--agent-depth", "3", "--json", "--no-progress", "--save-trace", str(trace))
    assert code == 0 and f"workload written to {trace}" in err
    generated = json.loads(out)["metrics"]
    code, out, _ = main(capsys, "--trace", str(trace), "--json", "--no-progress")
    assert code == 0
    replayed = json.loads(out)["metrics"]
    for k in ("requests", "prompt_tokens", "state_usable_tokens", "kv_matched_tokens", "lost_eviction"):
        assert replayed[k] == generated[k], k


def test_prefill_estimates_state_their_assumption(capsys):
    code, out, _ = main(capsys, *SMALL, "--json", "--device-tflops", "100", "--tp", "2")
    doc = json.loads(out)
    m, est = doc["metrics"], doc["estimates"]
    rate = 100e12 * 2
    assert est["prefill_seconds_saved"] == pytest.approx(m["state_usable_tokens"] * 6e9 / rate)
    assert est["prefill_seconds_without_cache"] == pytest.approx(m["prompt_tokens"] * 6e9 / rate)
    assert est["mean_ttft_seconds_with_cache"] == pytest.approx(
        (m["prompt_tokens"] - m["state_usable_tokens"]) * 6e9 / rate / m["requests"])
    assert "100 TFLOP/s per GPU on 2 GPU(s)" in est["assumption"]
    code, out, _ = main(capsys, *SMALL)
    assert "estimated prefill time (assumed: prefill runs at 400 TFLOP/s per GPU" in out
    assert "mean time to first token" in out


@pytest.mark.parametrize("field, value", [("flops_per_token", float("inf")),
                                          ("utility_alpha", float("inf")),
                                          ("prefill_token_seconds", float("inf")),
                                          ("new_token_ratio", float("nan"))])
def test_the_api_refuses_numbers_that_are_not_finite(field, value):
    """What the command line refuses at parsing, run() refuses before it
    replays: one rule per field (checks.check_field)."""
    reqs = workloads.multi_turn(2, 2, 32, 4)
    with pytest.raises(ConfigError, match=f"{field} must be a finite number"):
        run(reqs, dataclasses.replace(SimConfig(lru_policy="utility"), **{field: value}))


def test_simconfig_model_costs_are_the_default_presets():
    """SimConfig()'s model costs are the command line's default model
    (qwen3-next at TP 1), each one as the preset computes it."""
    from mambaradix.sim.presets import get_preset
    p = get_preset("qwen3-next")
    c = SimConfig()
    assert c.state_bytes_per_slot == p.state_bytes_per_slot(1)
    assert c.flops_per_token == p.flops_per_token
    assert c.kv_bytes_per_token == p.kv_bytes_per_token(1)
    assert c.attn_flops_per_pos == p.attn_flops_per_token_position
