"""The simulator's command line, run as a user runs it: in a subprocess,
through the real replay engine and the C cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict:
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + path if path else ""), **extra)


def sim(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m mambaradix sim ARGS`."""
    return subprocess.run([sys.executable, "-m", "mambaradix", "sim", *args], capture_output=True,
                          text=True, timeout=timeout, env=env or _env(), cwd=ROOT)


SMALL = ["--num-clients", "8", "--num-rounds", "3", "--request-length", "128",
         "--output-length", "16"]


def test_default_run_prints_the_report():
    r = sim()
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "multi-turn chat: 512 requests" in out
    for section in ("hit rates", "token hit rate", "KV hit rate", "state hit rate",
                    "where the prompt tokens went", "reused (KV + state)",
                    "never cached before (cold)",
                    "lost: no state at the match end", "evictions and pools", "state bytes copied",
                    "prefill FLOPs saved for qwen3-next", "token hit rate per turn", "wall time"):
        assert section in out, section
    assert "Traceback" not in r.stderr


def test_json_output_parses_and_is_consistent():
    r = sim(*SMALL, "--json", "--state-slots", "40", "--chunk-size", "32")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    m = doc["metrics"]
    assert doc["workload"]["requests"] == 24 == m["requests"]
    assert doc["workload"]["prompt_tokens"] == m["prompt_tokens"]
    assert doc["config"]["state_slots"] == 40 and doc["config"]["chunk_size"] == 32
    assert doc["model"]["name"] == "qwen3-next"
    assert doc["model"]["state_bytes_per_slot"] == 77_266_944
    assert 0 < m["token_hit_rate"] <= m["kv_hit_rate"] <= 1
    assert m["token_hit_rate"] == pytest.approx(m["state_usable_tokens"] / m["prompt_tokens"])
    assert set(m["per_turn_hit_rate"]) == {"0", "1", "2"}
    assert m["per_turn_hit_rate"]["0"] == 0.0 and m["per_turn_hit_rate"]["2"] > 0.5
    assert m["prefill_flops_saved"] > 0


def test_state_mem_is_sized_by_the_preset():
    r = sim(*SMALL, "--json", "--state-mem", "8GiB", "--model", "qwen3-next",
            "--tp", "4", "--kv-mem", "1GiB")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["config"]["state_slots"] == (8 << 30) // 19_316_736
    assert doc["config"]["kv_tokens"] == (1 << 30) // (12 * 2 * 1 * 256 * 2)


def test_sweep_json_and_table():
    r = sim(*SMALL, "--json", "--sweep", "chunk_size=32,64",
            "--sweep", "lru_policy=sglang,consumed")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    params = [p["params"] for p in doc["sweep"]]
    assert params == [{"chunk_size": 32, "lru_policy": "sglang"},
                      {"chunk_size": 32, "lru_policy": "consumed"},
                      {"chunk_size": 64, "lru_policy": "sglang"},
                      {"chunk_size": 64, "lru_policy": "consumed"}]
    assert [p["config"]["chunk_size"] for p in doc["sweep"]] == [32, 32, 64, 64]
    r = sim(*SMALL, "--sweep", "state_mem=1GiB,2GiB")
    assert r.returncode == 0, r.stderr
    assert "token hit" in r.stdout and "1.0 GiB" in r.stdout and "2.0 GiB" in r.stdout


def test_sweep_with_the_bound_serial():
    """--bound at each point of a state-pool sweep, served one at a time:
    the bound rises with the pool and no replay passes it."""
    pytest.importorskip("scipy")
    r = sim(*SMALL, "--json", "--bound", "--max-running", "1", "--sweep", "state_slots=5,7,48",
            "--sweep", "policy=consumed,belady")
    assert r.returncode == 0, r.stderr
    pts = json.loads(r.stdout)["sweep"]
    bound = {p["params"]["state_slots"]: p["metrics"]["upper_bound_token_hit_rate"] for p in pts}
    assert bound[5] < bound[7] < bound[48]
    for p in pts:
        assert p["metrics"]["upper_bound_kind"] == "pool_aware"
        assert p["metrics"]["token_hit_rate"] <= p["metrics"]["upper_bound_token_hit_rate"] + 1e-12


def test_trace_file_replay(tmp_path):
    trace = tmp_path / "t.jsonl"
    lines = [{"input_ids": list(range(200)), "output_len": 4},
             {"input_ids": list(range(200)) + [7] * 50, "output_len": 4, "turn": 1,
              "arrival": 5.0}]
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = sim("--trace", str(trace), "--json", "--chunk-size", "64")
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)["metrics"]
    assert m["requests"] == 2 and m["prompt_tokens"] == 450
    # The first prompt's prefill snapshot sits at 192 (3 chunks of 64): the
    # second request reuses exactly that.
    assert m["state_usable_tokens"] == 192 and m["state_hits"] == 1
    assert m["per_turn_hit_rate"] == {"0": 0.0, "1": 192 / 250}


@pytest.mark.parametrize("args, message", [
    (["--model", "llama-70b"], "unknown model preset 'llama-70b'"),
    (["--policy", "fifo"], "invalid choice: 'fifo'"),
    (["--mode", "pp3"], "invalid choice: 'pp3'"),
    (["--tp", "3"], "tp=3 does not divide"),
    (["--kv-tokens", "100"], "smaller than one request's need"),
    (["--state-slots", "2"], "mode pp2 needs 3 per running request"),
    (["--state-mem", "10MiB"], "a state pool of 10.0 MiB holds no state slot: one slot of "
                               "qwen3-next at tp=1 is 73.7 MiB"),
    (["--state-mem", "100MiB"], "1 state slot(s) cannot run one request"),
    (["--sweep", "colour=1,2"], "unknown parameter 'colour'"),
    (["--sweep", "state_slots=8,lots"], "state_slots takes integers"),
    (["--sweep", "lru_policy=sglang,fifo"], "lru_policy=fifo: unknown eviction policy 'fifo'"),
    (["--sweep", "state_slots=1,64"], "state_slots=1:"),
    (["--sweep", "decode_boundary=batch,late"], "unknown decode_boundary 'late'"),
    (["--chunk-size", "48", "--page-size", "32"], "must be a multiple of page_size"),
    (["--kv-mem", "lots"], "cannot read a size from 'lots'"),
])
def test_bad_input_exits_2_with_a_message(args, message):
    r = sim(*SMALL, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_trace_exits_2_with_a_message():
    r = sim("--trace", "/nonexistent/trace.jsonl")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "cannot read trace /nonexistent/trace.jsonl" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_request_must_fit_the_kv_pool_with_its_outputs(tmp_path):
    """Outputs past admission's clip (4096) still take KV: the last decode
    step of 100 prompt + 5,000 output tokens holds 5,100 (the overlap
    scheduler's extra step included), so a pool one token smaller is refused
    up front rather than stopping mid-replay."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"input_ids": list(range(1, 101)), "output_len": 5000}) + "\n")
    r = sim("--trace", str(trace), "--kv-tokens", "5099")
    assert r.returncode == 2
    assert ("the KV pool (5,099 tokens) is smaller than one request's need: line-1 has 100 prompt "
            "+ 5,000 output tokens and needs 5,100") in r.stderr
    r = sim("--trace", str(trace), "--kv-tokens", "5100", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["metrics"]["requests"] == 1


def test_toy_states_run_or_say_what_is_missing():
    r = sim("--num-clients", "4", "--num-rounds", "2", "--request-length", "100",
            "--output-length", "8", "--states", "toy", "--json")
    if r.returncode == 0:
        m = json.loads(r.stdout)["metrics"]
        assert "toy" in m["wall_seconds"] and m["requests"] == 8
        # Every state a hit restored equalled the toy model's recomputation.
        assert m["state_mismatches"] == 0 and m["state_hits"] > 0
    else:
        assert r.returncode == 2, r.stderr
        assert "--states toy needs torch and the SGLang drop-in" in r.stderr
        assert "Traceback" not in r.stderr


def test_malformed_trace_line_names_its_line(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2,
                                 "hash_ids": [1]}) + "\n\n{oops\n")
    r = sim("--trace", str(trace))
    assert r.returncode == 2
    assert f"{trace}:3: not valid JSON" in r.stderr
    assert "Traceback" not in r.stderr


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "hit.png"
    r = sim(*SMALL, "--sweep", "state_slots=8,16,32", "--plot", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 5000
    assert f"plot written to {out}" in r.stdout


def test_plot_without_sweep_sweeps_the_state_pool(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "pool.png"
    r = sim(*SMALL, "--state-slots", "80", "--plot", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [p["params"]["state_slots"] for p in doc["sweep"]] == [10, 20, 40, 80, 160, 320]
    assert [p["config"]["max_running"] for p in doc["sweep"]] == [2, 4, 8, 16, 32, 64]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_so(tmp_path):
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "matplotlib.py").write_text("raise ImportError('blocked for the test')\n")
    env = _env()
    env["PYTHONPATH"] = str(blocker) + os.pathsep + env["PYTHONPATH"]
    r = sim(*SMALL, "--sweep", "state_slots=24,48", "--plot", str(tmp_path / "p.png"), env=env)
    assert r.returncode == 2
    assert "--plot needs matplotlib" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "p.png").exists()


def test_pool_running_dry_mid_replay_is_a_user_error():
    # 64 running requests x 3 slots fit in 200, but their locked states do not (v0.5.15's rules:
    # 0.5.23's cap SGLang's running requests at 200 // 5)
    r = sim("--workload", "gsp", "--gsp-num-groups", "8", "--gsp-prompts-per-group", "8",
            "--max-running", "64", "--state-slots", "200", "--semantics", "v0.5.15")
    assert r.returncode == 2
    assert "the replay stopped: state pool exhausted" in r.stderr
    assert "state slots 200, max running 64" in r.stderr and "Traceback" not in r.stderr


def test_running_requests_above_sglangs_cap_are_capped_and_said():
    """SGLang 0.5.23 runs at most state slots // 5 requests (pp2); the report and --json say what ran."""
    gsp = ["--workload", "gsp", "--gsp-num-groups", "4", "--gsp-prompts-per-group", "4", "--no-progress"]
    r = sim(*gsp, "--max-running", "8", "--state-slots", "32")
    assert r.returncode == 0, r.stderr
    assert "max running 6 (SGLang's cap for 32 state slots; 8 asked)" in r.stdout
    r = sim(*gsp, "--max-running", "8", "--state-slots", "32", "--json")
    cfg = json.loads(r.stdout)["config"]
    assert (cfg["max_running"], cfg["max_running_asked"]) == (6, 8)
    r = sim(*gsp, "--max-running", "6", "--state-slots", "32", "--json")
    cfg = json.loads(r.stdout)["config"]
    assert cfg["max_running"] == 6 and "max_running_asked" not in cfg


def test_top_level_usage():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "mambaradix"], capture_output=True, text=True,
                       env=env, cwd=ROOT)
    assert r.returncode == 2 and "sim" in r.stdout
    r = subprocess.run([sys.executable, "-m", "mambaradix", "simulate"], capture_output=True,
                       text=True, env=env, cwd=ROOT)
    assert r.returncode == 2 and "unknown command 'simulate'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "mambaradix", "sim", "--list-presets"],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0 and "qwen3-next" in r.stdout and "73.7 MiB" in r.stdout


def test_importing_the_package_and_simulator_never_imports_torch():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = ("import sys, mambaradix, mambaradix.sim, mambaradix.sim.cli, "
            "mambaradix.sim.report, mambaradix.sim.sweep\n"
            "from mambaradix.sim import workloads, SimConfig, presets\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------
# the same from Python
# --------------------------------------------------------------------------


def test_python_api_sweep_and_report():
    from mambaradix.sim import SimConfig, format_report, get_preset, metrics_to_dict, run, sweep
    from mambaradix.sim import workloads as wl
    from mambaradix.sim.sweep import points_to_rows

    reqs = wl.multi_turn(num_clients=6, num_rounds=3, request_length=128, output_length=16, seed=1)
    points = sweep(reqs, SimConfig(max_running=4), model="jamba-like", tp=2,
                   state_slots=[20, 48], lru_policy=["sglang", "consumed"])
    assert [p.params for p in points] == [
        {"state_slots": 20, "lru_policy": "sglang"}, {"state_slots": 20, "lru_policy": "consumed"},
        {"state_slots": 48, "lru_policy": "sglang"}, {"state_slots": 48, "lru_policy": "consumed"}]
    jamba = get_preset("jamba-like")
    for p in points:
        assert p.config.state_slots == p.params["state_slots"]
        assert p.config.state_bytes_per_slot == jamba.state_bytes_per_slot(2)
        assert p.metrics.state_bytes_donated % jamba.state_bytes_per_slot(2) == 0
        assert p.metrics.prefill_flops_saved == pytest.approx(
            p.metrics.state_usable_tokens * jamba.flops_per_token)
    # A bigger pool never serves less of this workload.
    assert points[2].metrics.token_hit_rate >= points[0].metrics.token_hit_rate
    rows = points_to_rows(points)
    assert rows[3]["lru_policy"] == "consumed" and rows[3]["state_slots"] == 48
    assert rows[3]["token_hit_rate"] == points[3].metrics.token_hit_rate

    m = run(reqs, SimConfig(state_slots=48, max_running=4))
    text = format_report(m, SimConfig(state_slots=48, max_running=4), preset=jamba,
                         workload={"name": "tiny chat", **wl.workload_stats(reqs)})
    assert text.startswith("tiny chat: 18 requests")
    assert f"{m.state_usable_tokens:,}" in text
    d = metrics_to_dict(m)
    assert json.loads(json.dumps(d))["requests"] == 18
    assert d["token_hit_rate"] == m.token_hit_rate

    with pytest.raises(ValueError, match="unknown SimConfig parameter 'slots'"):
        sweep(reqs, slots=[1, 2])


def test_config_checks():
    from mambaradix.sim import SimConfig
    from mambaradix.sim.checks import ConfigError, check_feasible, validate_config
    from mambaradix.sim import workloads as wl

    validate_config(SimConfig())
    for bad, msg in [(dict(mode="pp3"), "unknown mode"), (dict(lru_policy="lfu"), "unknown eviction"),
                     (dict(states="real"), "unknown states"), (dict(kv_tokens=0), "kv_tokens must be"),
                     (dict(chunked_prefill_size=0), "chunked_prefill_size must be"),
                     (dict(mode="no_buffer", page_size=16, chunk_size=64), "no_buffer needs page_size 1"),
                     (dict(page_size=64, track_interval=100), "track_interval 100 must be a multiple")]:
        with pytest.raises(ConfigError, match=msg):
            validate_config(SimConfig(**bad))
    reqs = wl.multi_turn(num_clients=2, num_rounds=2, request_length=100, output_length=10)
    check_feasible(reqs, SimConfig(kv_tokens=300, state_slots=3, max_running=1))
    with pytest.raises(ConfigError, match="smaller than one request's need: mt-0-1 has 210"):
        check_feasible(reqs, SimConfig(kv_tokens=219, state_slots=3, max_running=1))
    with pytest.raises(ConfigError, match="max_running 2 needs 6 state slots"):
        check_feasible(reqs, SimConfig(state_slots=5, max_running=2, semantics="v0.5.15"))
    # SGLang 0.5.23 runs fewer requests instead: state slots // 5 in pp2 (// 4 pp1, lazy; // 3 no_buffer)
    check_feasible(reqs, SimConfig(state_slots=5, max_running=2))
    assert SimConfig(state_slots=5, max_running=2).resolved().max_running == 1
    assert [SimConfig(state_slots=200, max_running=64, mode=m).resolved().max_running
            for m in ("pp2", "pp1", "lazy", "no_buffer")] == [40, 50, 50, 64]
