"""Simulator inputs a new user tries (issue 29, items 2 to 8): bounds checked
before anything is built, every sweep parameter plotted and applied, a failed
sweep point reported with the others kept, bad numbers refused at parsing,
report fields that say what they mean, and the cost of one long request."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mambaradix
from mambaradix.sim import SimConfig, SimRequest, checks, cli, engine, presets, report, run, sweep, workloads
from mambaradix.sim.checks import ConfigError, check_feasible

from test_sim_first_run import no_replay  # noqa: F401  (the fixture: no replay may run)

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--num-clients", "4", "--num-rounds", "3", "--request-length", "64",
         "--output-length", "8", "--no-progress"]
GSP = ["--workload", "gsp", "--gsp-num-groups", "8", "--gsp-prompts-per-group", "8",
       "--no-progress"]
#: the rules under which too many running requests run the state pool dry (SGLang 0.5.23 caps them)
V0515 = ["--semantics", "v0.5.15"]


def main(capsys, *argv: str) -> tuple[int, str, str]:
    """cli.main in this process; argparse's own errors give their exit code too."""
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def limited(code: str, *args: str, gib: float = 1.5) -> subprocess.CompletedProcess:
    """Python code (or `-m mambaradix sim ARGS`) with its address space capped,
    so that building anything big fails instead of eating the machine.  ASan
    reserves terabytes of shadow memory at start, which no cap admits: the plain
    run covers these."""
    if os.environ.get("MAMBARADIX_UNDER_ASAN") == "1":
        pytest.skip("ASan's shadow memory does not fit under an address-space cap")
    pre = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({int(gib * 2**30)}, "
           f"{int(gib * 2**30)}))\n")
    if code == "sim":
        code = "import sys; from mambaradix.__main__ import main; sys.exit(main(sys.argv[1:]))"
        args = ("sim", *args)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", pre + code, *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)


# --- item 2: bounds before anything is built ------------------------------------------------

def test_a_45_byte_trace_asking_for_a_billion_outputs_is_refused_by_name(tmp_path):
    trace = tmp_path / "big.jsonl"
    trace.write_text('{"input_ids":[1,2],"output_len":1000000000}\n')
    r = limited("sim", "--trace", str(trace))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1
    assert (f"{trace}:1: the KV pool (1,048,576 tokens) is smaller than one request's need: "
            f"line-1 has 2 prompt + 1,000,000,000 output tokens") in r.stderr


def test_a_generated_request_beyond_the_kv_pool_is_refused_before_its_tokens():
    r = limited("sim", "--num-clients", "1", "--num-rounds", "1", "--request-length", "1000000000")
    assert r.returncode == 2, r.stderr
    assert ("the KV pool (1,048,576 tokens) is smaller than one request's need: mt-0-0 has "
            "1,000,000,000 prompt + 64 output tokens") in r.stderr
    assert "Traceback" not in r.stderr


def test_the_api_refuses_a_request_beyond_the_pool_before_making_its_outputs():
    code = ("import numpy as np\n"
            "from mambaradix.sim import run, SimConfig, SimRequest\n"
            "try:\n    run([SimRequest('a', np.array([1, 2], dtype=np.int32), 10**9)], SimConfig())\n"
            "except ValueError as e:\n    print('refused:', e)\n")
    r = limited(code)
    assert r.returncode == 0, r.stderr
    assert "refused: the KV pool (1,048,576 tokens) is smaller than one request's need: a has" in r.stdout


def test_an_output_len_beyond_int64_is_refused_by_name():
    with pytest.raises(ConfigError, match="a has 2 prompt \\+ 1,000,000,000,000,000,000,000,000,000,000"):
        run([SimRequest("a", np.array([1, 2], dtype=np.int32), 10**30)], SimConfig())


@pytest.mark.parametrize("make, message", [
    (lambda: workloads.multi_turn(num_clients=10**9), "the multi-turn workload would take about"),
    (lambda: workloads.multi_turn(4, 2, 64, 8, system_prompt_len=10**12), "the multi-turn workload"),
    (lambda: workloads.generated_shared_prefix(num_groups=10**9), "the generated-shared-prefix"),
    (lambda: workloads.generated_shared_prefix(system_prompt_len=10**12), "the generated-shared-prefix"),
    (lambda: workloads.agentic_branching(depth=40), "its first 10 of 40 levels alone"),
    (lambda: workloads.agentic_branching(depth=10**12, branching=1), "of 1,000,000,000,000 levels"),
])
def test_generators_refuse_a_workload_over_the_memory_limit_before_building_it(make, message):
    with pytest.raises(workloads.WorkloadError, match=message) as e:
        make()
    assert "more than the limit of 4.0 GiB" in str(e.value)


def test_generators_check_every_request_against_the_pools_before_its_tokens():
    seen = []

    def check(rid: str, prompt: int, output: int) -> None:
        seen.append((rid, prompt, output))

    reqs = workloads.multi_turn(2, 2, 10, 3, system_prompt_len=5, check_request=check)
    # turn r's prompt: system + (r + 1) messages + r answers, each request checked once
    assert seen == [("mt-0-0", 15, 3), ("mt-1-0", 15, 3), ("mt-0-1", 28, 3), ("mt-1-1", 28, 3)]
    assert [(r.rid, len(r.input_ids), r.output_len) for r in reqs] == seen
    seen.clear()
    reqs = workloads.generated_shared_prefix(2, 2, 7, 3, 5, check_request=check)
    assert sorted(seen) == sorted((r.rid, len(r.input_ids), r.output_len) for r in reqs)
    seen.clear()
    reqs = workloads.agentic_branching(1, 2, 2, 4, 3, 2, 1, check_request=check)
    assert seen == [(r.rid, len(r.input_ids), r.output_len) for r in reqs]
    # a refusal stops the generator at that request
    # mt-0-1 needs 28 + 3 + a page + 1 = 33 (admission), mt-0-0 20
    cfg = SimConfig(kv_tokens=30)
    with pytest.raises(ConfigError, match="mt-0-1 has 28 prompt"):
        workloads.multi_turn(2, 2, 10, 3, system_prompt_len=5,
                             check_request=checks.request_checker([cfg]))


def test_traces_refuse_by_line_a_request_beyond_the_pools_and_a_total_beyond_the_limit(tmp_path):
    lines = [{"input_ids": list(range(1, 101)), "output_len": 4, "rid": f"r{i}"} for i in range(5)]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    check = checks.request_checker([SimConfig(kv_tokens=90), SimConfig(kv_tokens=110)])
    assert len(workloads.load_trace(trace, check_request=check)) == 5   # fits the larger pool
    with pytest.raises(workloads.WorkloadError, match=f"{trace}:1: the KV pool \\(100 tokens\\)"):
        workloads.load_trace(trace, check_request=checks.request_checker([SimConfig(kv_tokens=100)]))
    # each line: 100 token ids (400 bytes) and a request (1 KiB): the third crosses 4000 bytes
    with pytest.raises(workloads.WorkloadError, match=f"{trace}:3: the trace up to this line"):
        workloads.load_trace(trace, max_bytes=4000)
    mc = tmp_path / "mc.jsonl"
    mc.write_text("".join(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 2,
                                      "hash_ids": [i, i + 1]}) + "\n" for i in range(3)))
    # two 512-token blocks a line (4 KiB expanded) and a request: the second crosses 8000 bytes
    with pytest.raises(workloads.WorkloadError, match=f"{mc}:2: the trace up to this line"):
        workloads.load_mooncake(mc, max_bytes=8000)
    with pytest.raises(workloads.WorkloadError, match=f"{mc}:1: .* mc-0 has 600 prompt"):
        workloads.load_mooncake(mc, check_request=checks.request_checker([SimConfig(kv_tokens=500)]))


def test_a_trace_line_too_long_to_parse_safely_is_refused(tmp_path):
    trace = tmp_path / "long.jsonl"
    ids = ",".join(["123456"] * 200_000)              # 1.4 MB of text
    trace.write_text('{"input_ids": [1], "output_len": 1}\n{"input_ids": [' + ids + '], "output_len": 1}\n')
    with pytest.raises(workloads.TraceFormatError, match=f"{trace}:2: the line is longer than 1,048,576"):
        workloads.load_token_trace(trace, max_bytes=8 << 20)
    assert len(workloads.load_token_trace(trace)) == 2


def test_duplicate_rids_are_refused_at_their_line(tmp_path, capsys):
    trace = tmp_path / "dup.jsonl"
    trace.write_text('{"input_ids": [1], "output_len": 1, "rid": "a"}\n'
                     '{"input_ids": [2], "output_len": 1, "rid": "a"}\n')
    code, _, err = main(capsys, "--trace", str(trace))
    assert code == 2 and f"{trace}:2: rid 'a' is also line 1's" in err


def test_the_kv_need_is_exactly_what_one_request_needs_to_finish_alone():
    """check_feasible accepts a lone request exactly when its replay finishes:
    below the need the replay cannot finish (before, outputs past the
    admission clip passed the check and stopped mid-replay)."""
    rng = random.Random(5)
    for _ in range(60):
        page = rng.choice([1, 1, 4, 16])
        mode = rng.choice(["pp2", "pp1", "lazy"] + (["no_buffer"] if page == 1 else []))
        P = rng.randrange(1, 300)
        O = rng.choice([rng.randrange(1, 50), rng.randrange(4000, 4300)])
        reqs = [SimRequest("a", np.arange(1, P + 1, dtype=np.int32), O)]
        outcomes = []
        for kv in range(max(page, P - 2 * page), P + O + 4 * page + 8, page):
            cfg = SimConfig(kv_tokens=kv, state_slots=8, max_running=1, mode=mode, page_size=page,
                            chunk_size=16 if page <= 16 else page, track_interval=16,
                            chunked_prefill_size=rng.choice([None, 64]))
            try:
                check_feasible(reqs, cfg)
            except ConfigError:
                outcomes.append("refused")
                continue
            engine.replay(reqs, cfg)              # raises if it cannot finish
            outcomes.append("ran")
        # refused up to a pool size, then every pool runs
        assert outcomes == sorted(outcomes, key=lambda o: o == "ran"), (mode, page, P, O)
        assert "ran" in outcomes and "refused" in outcomes


def test_pools_beyond_the_c_allocators_are_refused(capsys, no_replay):
    for argv, message in [
        (["--kv-tokens", "3e9"], "argument --kv-tokens: kv_tokens must be an integer in [1, 2,147,483,646]"),
        (["--state-mem", "1e30"], "more than a pool may have (2,147,483,646)"),
        (["--states", "toy", "--state-slots", "1e9"], "--states toy would allocate about"),
    ]:
        code, _, err = main(capsys, *SMALL, *argv)
        assert code == 2 and message in err, (argv, err)


def test_replay_outputs_are_made_in_blocks(monkeypatch):
    calls = []
    made = engine._pseudo_outputs_many

    def record(rids, ns):
        calls.append(sum(ns))
        return made(rids, ns)

    monkeypatch.setattr(engine._Replay, "OUTPUT_BLOCK", 1000)
    monkeypatch.setattr(engine, "_pseudo_outputs_many", record)
    reqs = [SimRequest(f"r{i}", np.arange(1, 50, dtype=np.int32) + i, 300) for i in range(10)]
    m = run(reqs, SimConfig(kv_tokens=8192, state_slots=16))
    assert m.requests == 10 and sum(calls) == 10 * 302
    assert max(calls) <= 1000 + 302 and len(calls) == 3


def test_a_next_turn_that_quotes_pseudo_outputs_hits_them():
    # a trace that gives only output lengths: the engine decodes the pseudo
    # tokens the documented rule makes (here in Python integers), so a next
    # turn whose prompt quotes them hits the finished turn's whole KV (its
    # exact final state kept: end-of-turn states), all but its last token
    from test_hash_block_prompts import _pseudo_reference
    prompt = np.arange(1, 65, dtype=np.int32)
    quoted = np.asarray(_pseudo_reference("turn-1", 40, 150000), dtype=np.int32)
    follow = np.concatenate([prompt, quoted, np.arange(500, 510, dtype=np.int32)])
    reqs = [SimRequest("turn-1", prompt, 40, arrival=0.0), SimRequest("turn-2", follow, 5, arrival=1000.0)]
    m = run(reqs, SimConfig(kv_tokens=8192, state_slots=16, end_of_turn_states=True))
    assert (m.kv_matched_tokens, m.state_usable_tokens) == (64 + 39, 64 + 39)


# --- item 3: --plot for every sweep parameter -----------------------------------------------

SWEEPS = [
    ("state_slots", "10,20"), ("kv_tokens", "4096,8192"), ("page_size", "1,2"),
    ("chunk_size", "32,64"), ("track_interval", "64,256"), ("mode", "pp2,lazy"),
    ("lru_policy", "sglang,consumed"), ("match_cap", "true,false"), ("max_running", "1,2"),
    ("chunked_prefill_size", "0,64"), ("max_prefill_tokens", "256,16384"),
    ("decode_step_seconds", "0.01,0.02"), ("prefill_token_seconds", "0,2e-5"),
    ("new_token_ratio", "0.5,1"), ("decode_boundary", "committed,batch"), ("semantics", "v0.5.15,v0.5.23"),
    ("end_of_turn_states", "false,true"), ("max_states_per_path", "0,1"),
    ("state_mem", "1GiB,4GiB"), ("kv_mem", "1GiB,4GiB"), ("flops_per_token", "1e9,6e10"),
    ("state_bytes_per_slot", "1000,2000"), ("kv_bytes_per_token", "1000,2000"),
    ("attn_flops_per_pos", "0,1e5"),
]


@pytest.mark.parametrize("name, values", SWEEPS + [
    ("utility_alpha", "0,16"), ("tune_window", "0,64"), ("utility_order", "mru,lru")])
def test_every_sweep_parameter_plots(tmp_path, capsys, name, values):
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    extra = ["--policy", "utility"] if name in ("utility_alpha", "tune_window", "utility_order") else []
    code, out, err = main(capsys, *SMALL, *extra, "--sweep", f"{name}={values}", "--plot", str(png))
    assert code == 0, err
    assert f"plot written to {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_sweepable_field_is_covered_above():
    from mambaradix.sim.sweep import UNSWEEPABLE, config_fields
    covered = {n for n, _ in SWEEPS} | {"utility_alpha", "tune_window", "utility_order"}
    # states=toy needs torch (tests/sim/test_sim_first_run.py sweeps it)
    assert set(config_fields()) - covered == {"states"} | set(UNSWEEPABLE)


# --- item 4: model costs swept --------------------------------------------------------------

def test_swept_model_costs_take_effect_on_the_command_line(capsys):
    code, out, err = main(capsys, *SMALL, "--json", "--sweep", "flops_per_token=1e9,6e10",
                          "--sweep", "state_bytes_per_slot=1000,2000",
                          "--sweep", "kv_bytes_per_token=100,300")
    assert code == 0, err
    points = json.loads(out)["sweep"]
    assert len(points) == 8
    for p in points:
        cfg, m, params = p["config"], p["metrics"], p["params"]
        for k in ("flops_per_token", "state_bytes_per_slot", "kv_bytes_per_token"):
            assert cfg[k] == params[k]
        assert m["prefill_flops_saved"] == m["state_usable_tokens"] * params["flops_per_token"] > 0
        assert p["estimates"]["flops_per_token"] == params["flops_per_token"]
        assert m["state_bytes_donated"] % params["state_bytes_per_slot"] == 0
        sb = m["peak_state_slots"] * params["state_bytes_per_slot"]
        kb = m["peak_kv_tokens"] * params["kv_bytes_per_token"]
        assert m["state_memory_share"] == pytest.approx(sb / (sb + kb))
    donated = {p["params"]["state_bytes_per_slot"]: p["metrics"]["state_bytes_donated"]
               for p in points}
    assert donated[2000] == 2 * donated[1000] > 0


def test_a_swept_slot_size_resizes_a_pool_given_in_bytes(capsys):
    code, out, err = main(capsys, *SMALL, "--json", "--state-mem", "1MiB",
                          "--sweep", "state_bytes_per_slot=100000,200000")
    assert code == 0, err
    points = json.loads(out)["sweep"]
    assert [p["config"]["state_slots"] for p in points] == [(1 << 20) // 100000, (1 << 20) // 200000]
    assert [p["config"]["max_running"] for p in points] == [2, 1]        # slots // 5


def test_swept_model_costs_override_the_preset_in_python():
    reqs = workloads.multi_turn(3, 2, 64, 8, seed=2)
    points = sweep(reqs, SimConfig(max_running=2, state_slots=16), model="nemotron-h-8b",
                   flops_per_token=[1e9, 6e10])
    assert [p.config.flops_per_token for p in points] == [1e9, 6e10]
    for p in points:
        assert p.metrics.prefill_flops_saved == p.metrics.state_usable_tokens * p.config.flops_per_token
        assert p.config.state_bytes_per_slot == 102_137_856        # the preset's, not swept
    with pytest.raises(ValueError, match="seed cannot be swept"):
        sweep(reqs, seed=[1, 2])


def test_seed_cannot_be_swept_from_the_command_line(capsys, no_replay):
    code, _, err = main(capsys, *SMALL, "--sweep", "seed=1,2")
    assert code == 2 and "--sweep: seed cannot be swept" in err


# --- item 5: a failed point does not lose the others ----------------------------------------

def test_a_failed_sweep_point_is_reported_and_the_rest_kept(tmp_path, capsys):
    table = tmp_path / "t.csv"
    # 64 running requests x 3 slots fit in 200, but their locked states do not
    code, out, err = main(capsys, *GSP, *V0515, "--state-slots", "200", "--sweep", "max_running=4,64,8",
                          "--json", "--csv", str(table))
    assert code == 0, err
    assert "1 of 3 replays of the sweep failed" in err
    points = json.loads(out)["sweep"]
    assert [p["params"]["max_running"] for p in points] == [4, 64, 8]
    assert "metrics" in points[0] and "metrics" in points[2]
    assert "metrics" not in points[1] and "state pool exhausted" in points[1]["error"]
    rows = list(csv.DictReader(table.open()))
    assert [r["max_running"] for r in rows] == ["4", "64", "8"]
    assert rows[1]["error"] == points[1]["error"] and rows[1]["token_hit_rate"] == ""
    assert float(rows[2]["token_hit_rate"]) == pytest.approx(points[2]["metrics"]["token_hit_rate"])
    code, out, err = main(capsys, *GSP, *V0515, "--state-slots", "200", "--sweep", "max_running=4,64")
    assert code == 0 and "failed" in out and "^ failed: the replay stopped (max_running=64)" in out


def test_a_sweep_in_which_every_point_fails_exits_2_with_the_errors(capsys):
    code, out, err = main(capsys, *GSP, *V0515, "--state-slots", "200", "--sweep", "max_running=63,64",
                          "--json")
    assert code == 2 and "every replay of the sweep failed" in err
    assert all("state pool exhausted" in p["error"] for p in json.loads(out)["sweep"])


def test_python_sweep_records_a_failed_point_when_asked():
    reqs = workloads.generated_shared_prefix(8, 8, seed=0)
    points = sweep(reqs, SimConfig(state_slots=200, semantics="v0.5.15"), max_running=[4, 64], on_error="record")
    assert points[0].metrics is not None and points[0].error is None
    assert points[1].metrics is None and "state pool exhausted" in points[1].error
    with pytest.raises(RuntimeError, match="state pool exhausted"):
        sweep(reqs, SimConfig(state_slots=200, semantics="v0.5.15"), max_running=[4, 64])


# --- item 6: bad numbers refused at parsing -------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--policy", "utility", "--utility-alpha", "nan"], "argument --utility-alpha: utility_alpha must be a finite number >= 0, got nan"),
    (["--policy", "utility", "--utility-alpha", "inf"], "argument --utility-alpha: utility_alpha must be a finite number >= 0, got inf"),
    (["--policy", "utility", "--utility-alpha", "-1"], "argument --utility-alpha: utility_alpha must be a finite number >= 0"),
    (["--device-tflops", "inf"], "argument --device-tflops: expected a finite number > 0, got 'inf'"),
    (["--device-tflops", "nan"], "argument --device-tflops: expected a finite number > 0"),
    (["--sweep", "utility_alpha=1,nan", "--policy", "utility"], "--sweep utility_alpha=nan: utility_alpha must be a finite number"),
    (["--sweep", "decode_step_seconds=0"], "--sweep decode_step_seconds=0: decode_step_seconds must be a finite number > 0"),
    (["--sweep", "flops_per_token=inf"], "--sweep flops_per_token=inf: flops_per_token must be a finite number >= 0"),
    (["--sweep", "new_token_ratio=-1"], "--sweep new_token_ratio=-1: new_token_ratio must be a finite number >= 0 and <= 1"),
    (["--kv-tokens", "1e400"], "argument --kv-tokens: kv_tokens takes integers, got '1e400'"),
    (["--end-of-turn-states", "--mode", "no_buffer"], "--end-of-turn-states applies to the extra_buffer modes"),
    (["--sweep", "max_running=0"], "--sweep max_running=0: max_running must be an integer in [1, 2,147,483,646], got 0"),
    (["--kv-mem", "1e30"], "more than a pool may have (2,147,483,646); lower --kv-mem"),
    (["--state-mem", "1e30"], "more than a pool may have (2,147,483,646); lower --state-mem"),
])
def test_bad_numbers_are_refused_at_parsing_naming_the_option(capsys, no_replay, argv, message):
    code, _, err = main(capsys, *SMALL, *argv)
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-2"])
def test_bad_zipf_alpha_is_refused_at_parsing(capsys, no_replay, value):
    code, _, err = main(capsys, *GSP, "--gsp-group-distribution", "zipf", "--gsp-zipf-alpha", value)
    assert code == 2 and "argument --gsp-zipf-alpha: expected a finite number > 0" in err


# --- item 7: report details -----------------------------------------------------------------

def test_json_names_the_configured_and_the_final_utility_settings_apart(capsys):
    code, out, _ = main(capsys, *SMALL, "--json", "--policy", "utility", "--utility-alpha", "4",
                        "--utility-order", "lru")
    assert code == 0
    doc = json.loads(out)
    assert doc["config"]["utility_alpha"] == 4.0 and doc["config"]["utility_order"] == "lru"
    m = doc["metrics"]
    assert "utility_alpha" not in m and "utility_order" not in m
    assert m["utility_tunes"] == 0          # nothing evicted: the tuner never started
    assert m["final_utility_alpha"] == 4.0 and m["final_utility_order"] == "lru"
    code, out, _ = main(capsys, *SMALL, "--json")
    m = json.loads(out)["metrics"]
    assert m["final_utility_alpha"] is None and m["final_utility_order"] is None
    code, out, _ = main(capsys, *SMALL, "--policy", "utility", "--utility-alpha", "4")
    assert "utility alpha               4 -> 4  configured -> after 0 re-tunings; recency order mru -> mru" \
        in out


def test_mooncake_output_length_0_is_refused_not_replayed_as_1(tmp_path, capsys):
    trace = tmp_path / "mc.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2,
                                 "hash_ids": [1]}) + "\n" +
                     json.dumps({"timestamp": 0, "input_length": 10, "output_length": 0,
                                 "hash_ids": [2]}) + "\n")
    code, _, err = main(capsys, "--trace", str(trace))
    assert code == 2
    assert f"{trace}:2: output_length 0 (a prefill-only request) cannot be replayed" in err


def test_per_turn_hit_rates_come_with_what_they_are(capsys):
    code, out, _ = main(capsys, *SMALL)
    assert code == 0
    lines = out.splitlines()
    at = lines.index("token hit rate per turn")
    assert lines[at + 3].startswith("  (the share of each turn's prompt tokens its requests reused")
    assert "follow the evictions" in out


# --- item 8: one long request costs about its length ----------------------------------------

def test_a_chunked_prefill_records_its_keys_once_not_per_chunk(monkeypatch):
    """The replay's record of every key seen (a keys-only RadixTree) gets
    one insert per request at the next match, not the growing prefix after
    every chunk (64 chunks: 64 * 65 / 2 * 64 = 133,120 tokens read before)."""
    real = mambaradix.RadixTree
    inserted: list[int] = []

    class Counting:
        def __init__(self, *a, **k):
            self.tree = real(*a, **k)

        def insert(self, key, *a, **k):
            inserted.append(len(key))
            return self.tree.insert(key, *a, **k)

        def __getattr__(self, name):
            return getattr(self.tree, name)

    monkeypatch.setattr(mambaradix, "RadixTree", Counting)
    long = np.arange(1, 4097, dtype=np.int32)
    reqs = [SimRequest("long", long, 2),
            SimRequest("filler", np.arange(20000, 24000, dtype=np.int32), 2, arrival=50.0),
            SimRequest("next", np.concatenate([long[:1000], np.arange(9000, 9050, dtype=np.int32)]),
                       2, arrival=100.0)]
    # the filler evicts most of the long request's KV before the last one comes
    m = run(reqs, SimConfig(kv_tokens=4200, chunked_prefill_size=64, chunk_size=64))
    assert sum(inserted) <= 2 * (4096 + 4000 + 1050 + 6)
    # what the record serves is unchanged: the last request's first 1000 tokens
    # were cached before, whatever of them was evicted since
    assert m.never_seen_tokens == 4096 + 4000 + 50
    assert m.lost_eviction + m.kv_matched_tokens == 1000 and m.lost_eviction > 0


def test_a_request_longer_than_the_pool_is_refused_not_replayed(capsys, no_replay):
    code, _, err = main(capsys, "--num-clients", "1", "--num-rounds", "1",
                        "--request-length", "2000000", "--kv-tokens", "1000000")
    assert code == 2 and "mt-0-0 has 2,000,000 prompt" in err


# --- odd inputs: one line, exit code 2, the option named ------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--limit", "0"], "argument --limit: expected an integer >= 1, got '0'"),
    (["--limit", "1e30"], "argument --limit: expected an integer <= 9,223,372,036,854,775,807"),
    (["--seed", "1.5"], "argument --seed: expected an integer, got '1.5'"),
    (["--max-running", "0"], "argument --max-running: max_running must be an integer in [1,"),
    (["--chunk-size", "1e9"], "argument --chunk-size: chunk_size must be an integer in [1, 16,777,216]"),
    (["--tune-window", "1e30", "--policy", "utility"], "argument --tune-window: tune_window must be"),
    (["--max-prefill-tokens", "1e30"], "argument --max-prefill-tokens: max_prefill_tokens must be"),
    (["--sweep", "max_running=x"], "--sweep max_running=x: max_running takes integers"),
    (["--sweep", "state_slots=1e400"], "--sweep state_slots=1e400: state_slots takes integers"),
    (["--sweep", "decode_boundary=batch", "--mode", "lazy"], "decode_boundary batch does not fit mode lazy"),
    (["--sweep", "state_slots=16", "--state-slots", "32"], "--sweep state_slots and --state-slots both set"),
    (["--sweep", "state_mem=1GiB", "--state-slots", "32"], "--sweep state_mem and --state-slots both set"),
    (["--sweep", "policy=sglang", "--policy", "consumed"], "--sweep lru_policy and --policy both set"),
    (["--gsp-num-groups", "4"], "--gsp-num-groups applies to --workload gsp, not multiturn"),
    (["--agent-depth", "2"], "--agent-depth applies to --workload agentic, not multiturn"),
    (["--utility-alpha", "2"], "--utility-alpha applies to --policy utility"),
    (["--trace-format", "tokens"], "--trace-format applies to --trace"),
    (["--num-clients", "1e9"], "the multi-turn workload would take about"),
    (["--max-workload-mem", "1KiB"], "more than the limit of 1.0 KiB"),
])
def test_odd_inputs_get_one_line_naming_the_option(capsys, no_replay, argv, message):
    code, _, err = main(capsys, *SMALL, *argv)
    assert code == 2 and message in err and "Traceback" not in err
    assert len([ln for ln in err.splitlines() if "error:" in ln]) == 1


@pytest.mark.parametrize("argv, message", [
    (["--workload", "gsp", "--num-clients", "4"], "--num-clients applies to --workload multiturn, not gsp"),
    (["--workload", "gsp", "--gsp-num-groups", "1e9"], "the generated-shared-prefix workload would take"),
    (["--workload", "agentic", "--agent-depth", "40"], "its first 10 of 40 levels alone"),
    (["--workload", "mooncake", "--range-ratio", "0.5"], "--range-ratio applies to generated workloads"),
    (["--workload", "gsp", "--gsp-zipf-alpha", "2"], "--gsp-zipf-alpha applies to --gsp-group-distribution zipf"),
])
def test_odd_workload_inputs_get_one_line(capsys, no_replay, argv, message):
    code, _, err = main(capsys, *argv, "--no-progress")
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("text, message", [
    pytest.param("[" * 100_000 + "]" * 100_000, "not valid JSON", id="deep-nesting"),
    pytest.param('{"input_ids": [1' + "0" * 5000 + '], "output_len": 1}', "not valid JSON",
                 id="5001-digit-number"),
])
def test_pathological_json_lines_name_their_line(tmp_path, capsys, text, message):
    trace = tmp_path / "odd.jsonl"
    trace.write_text(text + "\n")
    code, _, err = main(capsys, "--trace", str(trace))
    assert code == 2 and f"{trace}:1: {message}" in err and "Traceback" not in err


def test_an_arrival_far_in_the_future_is_waited_for(tmp_path, capsys):
    trace = tmp_path / "far.jsonl"
    trace.write_text('{"input_ids": [1, 2, 3], "output_len": 3}\n'
                     '{"input_ids": [1, 2, 3, 4], "output_len": 3, "arrival": 1e308}\n')
    code, out, err = main(capsys, "--trace", str(trace), "--json", "--no-progress")
    assert code == 0, err
    assert json.loads(out)["metrics"]["requests"] == 2


# --- every request field checked by run() before the replay ---------------------------------

@pytest.fixture
def no_replay_loop(monkeypatch):
    """Makes the replay loop fail the test: a bad request must be refused before it."""
    def loop(self):
        raise AssertionError("the replay started before the bad request was refused")
    monkeypatch.setattr(engine._Replay, "run", loop)


def _req(**kw) -> SimRequest:
    kw.setdefault("rid", "a")
    kw.setdefault("input_ids", np.arange(1, 41, dtype=np.int32))
    kw.setdefault("output_len", 4)
    return SimRequest(**kw)


@pytest.mark.parametrize("kw, error, message", [
    (dict(arrival=float("nan")), ValueError, "requests[0] ('a').arrival must be a finite number >= 0 (seconds), got nan"),
    (dict(arrival=float("inf")), ValueError, "requests[0] ('a').arrival must be a finite number >= 0"),
    (dict(arrival=-5.0), ValueError, "requests[0] ('a').arrival must be a finite number >= 0"),
    (dict(arrival="1"), TypeError, "requests[0] ('a').arrival must be a finite number"),
    (dict(arrival=None), TypeError, "requests[0] ('a').arrival must be a finite number"),
    (dict(input_ids=np.arange(2**31, 2**31 + 40, dtype=np.int64)), ValueError,
     "requests[0] ('a').input_ids[0] is 2147483648: token ids must lie in [0, 2147483647]"),
    (dict(input_ids=np.arange(-40, 0, dtype=np.int32)), ValueError, "requests[0] ('a').input_ids[0] is -40: token ids must lie in"),
    (dict(input_ids=np.arange(1, 41) + 0.5), TypeError, "requests[0] ('a').input_ids must be a 1-D array or list of integer token ids"),
    (dict(input_ids=np.ones((4, 10), np.int32)), TypeError, "requests[0] ('a').input_ids must be a 1-D array"),
    (dict(input_ids="hello world"), TypeError, "requests[0] ('a').input_ids must be a 1-D array"),
    (dict(input_ids=None), TypeError, "requests[0] ('a').input_ids must be a 1-D array"),
    (dict(output_len=2.5), TypeError, "requests[0] ('a').output_len must be an integer >= 1, got 2.5"),
    (dict(output_len=True), TypeError, "requests[0] ('a').output_len must be an integer >= 1, got True"),
    (dict(output_len="4"), TypeError, "requests[0] ('a').output_len must be an integer"),
    (dict(output_len=float("nan")), TypeError, "requests[0] ('a').output_len must be an integer"),
    (dict(output_len=None), TypeError, "requests[0] ('a').output_len must be an integer"),
    (dict(output_ids=np.array([1.5, 2, 3, 4])), TypeError, "requests[0] ('a').output_ids must be a 1-D array"),
    (dict(output_ids=np.array([-1, -2, -3, -4])), ValueError, "requests[0] ('a').output_ids[0] is -1: token ids must lie in"),
    (dict(turn=-1), ValueError, "requests[0] ('a').turn must be an integer >= 0, got -1"),
    (dict(turn=1.5), TypeError, "requests[0] ('a').turn must be an integer >= 0, got 1.5"),
    (dict(turn="x"), TypeError, "requests[0] ('a').turn must be an integer >= 0"),
    (dict(rid=None), TypeError, "requests[0].rid must be a str, got None"),
    (dict(rid=["x"]), TypeError, "requests[0].rid must be a str, got ['x']"),
])
def test_run_refuses_each_bad_request_field_by_name_before_replaying(no_replay_loop, kw, error, message):
    with pytest.raises(error) as e:
        run([_req(**kw)], SimConfig(state_slots=16, kv_tokens=4096))
    assert message in str(e.value)


def test_run_accepts_numpy_integers_lists_and_unsigned_ids_as_plain_ints():
    ids = np.arange(1, 201, dtype=np.int32)
    want = run([_req(input_ids=ids), _req(rid="b", input_ids=ids, arrival=1.0)],
               SimConfig(state_slots=16, kv_tokens=4096))
    got = run([_req(input_ids=ids.tolist(), output_len=np.int64(4), turn=np.int32(0)),
               _req(rid="b", input_ids=ids.astype(np.uint64), arrival=np.float32(1.0))],
              SimConfig(state_slots=np.int32(16), kv_tokens=np.int64(4096)))
    # the second prompt resumes from the first one's state at 192 (chunks of 64)
    assert got.requests == 2 and got.state_usable_tokens == want.state_usable_tokens == 192
    # numpy ints give the same default max_running as Python ints (16 // 5 = 3)
    assert SimConfig(state_slots=np.int32(16)).resolved().max_running == 3


@pytest.mark.parametrize("kw, message", [
    (dict(utility_alpha="x", lru_policy="utility"), "utility_alpha must be a finite number >= 0, got 'x'"),
    (dict(utility_alpha=float("inf"), lru_policy="utility"), "utility_alpha must be a finite number >= 0, got inf"),
    (dict(chunk_size=2**63), "chunk_size must be an integer in [1, 16,777,216]"),
    (dict(track_interval=2**63), "track_interval must be an integer >= 1"),
    (dict(max_prefill_tokens=None), "max_prefill_tokens must be an integer >= 1, got None"),
    (dict(new_token_ratio="x"), "new_token_ratio must be a finite number"),
    (dict(lru_policy="belady", states="toy"), "config.lru_policy belady reads the future from the trace: "
     "it runs with config.states 'none' only"),
])
def test_run_names_the_bad_config_field(no_replay_loop, kw, message):
    with pytest.raises(ConfigError) as e:
        run([_req()], SimConfig(state_slots=16, kv_tokens=4096, **kw))
    assert message in str(e.value)


# --- generator and loader arguments: types and ranges, by name ------------------------------

_MC_LINE = '{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}\n'


@pytest.mark.parametrize("make, error, message", [
    (lambda: workloads.multi_turn(2.5, 2, 8, 2), TypeError, "num_clients must be an integer, got 2.5"),
    (lambda: workloads.multi_turn("2", 2, 8, 2), TypeError, "num_clients must be an integer, got '2'"),
    (lambda: workloads.multi_turn(True, 2, 8, 2), TypeError, "num_clients must be an integer, got True"),
    (lambda: workloads.multi_turn(2, 1.5, 8, 2), TypeError, "num_rounds must be an integer, got 1.5"),
    (lambda: workloads.multi_turn(2, 2, 8.5, 2), TypeError, "request_length must be an integer, got 8.5"),
    (lambda: workloads.multi_turn(2, 2, 8, 2.5), TypeError, "output_length must be an integer, got 2.5"),
    (lambda: workloads.multi_turn(2, 2, 8, 2, system_prompt_len=2.5), TypeError, "system_prompt_len must be an integer"),
    (lambda: workloads.multi_turn(2, 2, 8, 2, system_prompt_len=None), TypeError, "system_prompt_len must be an integer"),
    (lambda: workloads.multi_turn(2, 2, 8, 2, vocab_size=100.5), TypeError, "vocab_size must be an integer, got 100.5"),
    (lambda: workloads.multi_turn(2, 2, 8, 2, range_ratio="0.5"), TypeError, "range_ratio must be a number, got '0.5'"),
    (lambda: workloads.multi_turn(2, 2, 8, 2, request_rate="5"), TypeError, "request_rate must be a number, got '5'"),
    (lambda: workloads.multi_turn(2, 2, 8, 2, request_rate=-float("inf")), workloads.WorkloadError,
     "request_rate must be a number > 0 (or inf), got -inf"),
    (lambda: workloads.multi_turn(2, 2, 8, 2, request_rate=float("nan")), workloads.WorkloadError, "request_rate must be a number > 0"),
    (lambda: workloads.multi_turn(2, 2, 8, 2, seed=-1), workloads.WorkloadError, "seed must be an integer >= 0, got -1"),
    (lambda: workloads.generated_shared_prefix(2.5, 2, 8, 4, 2), TypeError, "num_groups must be an integer, got 2.5"),
    (lambda: workloads.generated_shared_prefix(2, 2, 8, 4, 2, group_distribution="zipf", zipf_alpha="1"), TypeError,
     "zipf_alpha must be a number, got '1'"),
    (lambda: workloads.generated_shared_prefix(2, 2, 8, 4, 2, zipf_alpha=-3.0), workloads.WorkloadError,
     "zipf_alpha applies with group_distribution='zipf' only"),
    (lambda: workloads.agentic_branching(1, 2, 1.5, 8, 8, 8, 2), TypeError, "branching must be an integer, got 1.5"),
    (lambda: workloads.agentic_branching(1, 2.5, 2, 8, 8, 8, 2), TypeError, "depth must be an integer, got 2.5"),
    (lambda: workloads.expand_hash_blocks(np.array([1]), block_size=2.5), TypeError, "block_size must be an integer"),
    (lambda: workloads.expand_hash_blocks(np.array([1]), block_size=2**40), workloads.WorkloadError,
     "block_size must be an integer in [1, 1048576], got 1099511627776"),
    (lambda: workloads.expand_hash_blocks(np.array([1]), vocab_size=1000.5), TypeError, "vocab_size must be an integer"),
    (lambda: workloads.expand_hash_blocks(np.array([1]), seed=0.5), TypeError, "seed must be an integer, got 0.5"),
    (lambda: workloads.expand_hash_blocks(np.array([[1, 2]])), TypeError, "hash_ids must be a 1-D array of integers"),
    (lambda: workloads.expand_hash_blocks(np.array([1.7])), TypeError, "hash_ids must be a 1-D array of integers"),
    (lambda: workloads.expand_hash_blocks(np.array([3, -1])), workloads.WorkloadError, "hash_ids[1] is -1: hash ids must lie in [0, 2**63)"),
    (lambda: workloads.multi_turn(2, 2, 8, 2, request_rate=5e-324), workloads.WorkloadError,
     "request_rate 5e-324 is too small: the arrivals overflow to inf seconds"),
    (lambda: workloads.generated_shared_prefix(2, 2, 8, 4, 2, ordered="no"), TypeError, "ordered must be True or False, got 'no'"),
    (lambda: workloads.save_token_trace([1, 2], "never-written.jsonl"), TypeError, "requests[0] must be a SimRequest, got int"),
    (lambda: workloads.workload_stats([1]), TypeError, "requests[0] must be a SimRequest, got int"),
])
def test_generators_name_a_bad_argument(tmp_path, monkeypatch, make, error, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error) as e:
        make()
    assert message in str(e.value)
    assert not Path("never-written.jsonl").exists()


@pytest.mark.parametrize("kw, error, message", [
    (dict(limit=1.5), TypeError, "limit must be an integer, got 1.5"),
    (dict(limit="1"), TypeError, "limit must be an integer, got '1'"),
    (dict(time_scale=float("nan")), workloads.WorkloadError, "time_scale must be a finite number > 0, got nan"),
    (dict(time_scale=-1.0), workloads.WorkloadError, "time_scale must be a finite number > 0, got -1.0"),
    (dict(time_scale="x"), TypeError, "time_scale must be a number, got 'x'"),
    (dict(block_size=0), workloads.WorkloadError, "block_size must be an integer in [1, 1048576], got 0"),
    (dict(block_size=-512), workloads.WorkloadError, "block_size must be an integer in [1, 1048576], got -512"),
])
def test_load_mooncake_names_a_bad_argument_before_reading(tmp_path, kw, error, message):
    path = tmp_path / "mc.jsonl"
    path.write_text(_MC_LINE)
    with pytest.raises(error) as e:
        workloads.load_mooncake(path, **kw)
    assert message in str(e.value) and "mc.jsonl" not in str(e.value)


def test_a_corrupted_gzip_trace_is_a_workload_error(tmp_path, capsys):
    import gzip
    data = bytearray(gzip.compress(b"".join(
        b'{"input_ids": [%d, 2, 3], "output_len": 2}\n' % i for i in range(5000))))
    data[40:60] = bytes(20)        # a damaged deflate stream, the header and trailer intact
    path = tmp_path / "corrupt.jsonl.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(workloads.WorkloadError, match="cannot read trace"):
        workloads.load_trace(path)
    code, _, err = main(capsys, "--trace", str(path), "--no-progress")
    assert code == 2 and "cannot read trace" in err and "Traceback" not in err


# --- the command line: options that cannot apply, standard JSON, `version` ------------------

def test_end_of_turn_states_stay_allowed_when_a_swept_mode_uses_them(capsys):
    code, out, _ = main(capsys, *SMALL, "--end-of-turn-states", "--sweep", "mode=pp2,no_buffer", "--json")
    doc = json.loads(out)
    assert code == 0 and [p["config"]["mode"] for p in doc["sweep"]] == ["pp2", "no_buffer"]
    assert all(p["config"]["end_of_turn_states"] for p in doc["sweep"])


def test_json_is_standard_even_when_an_estimate_is_infinite(capsys):
    # 1e-320 TFLOP/s makes the estimated prefill times overflow to inf
    code, out, _ = main(capsys, *SMALL, "--device-tflops", "1e-320", "--json")
    assert code == 0
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert doc["metrics"]["requests"] == 12 and doc["estimates"]["prefill_seconds_without_cache"] is None


def test_version_takes_no_arguments():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    bad = subprocess.run([sys.executable, "-m", "mambaradix", "version", "--bogus"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert bad.returncode == 2 and "takes no arguments" in bad.stderr and not bad.stdout
    good = subprocess.run([sys.executable, "-m", "mambaradix", "version"],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert good.returncode == 0 and good.stdout.strip() == mambaradix.__version__


# --- sweep, presets and the report: arguments by name ---------------------------------------

@pytest.mark.parametrize("call, error, message", [
    (lambda r: sweep(r, {"kv_tokens": 4096}, state_slots=[16]), TypeError, "base must be a SimConfig, got dict"),
    (lambda r: sweep(r, SimConfig(), state_slots=[]), ValueError, "sweep values of 'state_slots' are empty"),
    (lambda r: sweep(r, SimConfig(), tp=3, state_slots=[16]), ValueError, "tp applies with model= only"),
    (lambda r: presets.get_preset(None), TypeError, "a model preset name must be a str"),
    (lambda r: presets.get_preset(5), TypeError, "a model preset name must be a str"),
    (lambda r: presets.apply_preset({}, "qwen3-next"), TypeError, "config must be a SimConfig, got dict"),
    (lambda r: presets.apply_preset(SimConfig(), "qwen3-next", tp="2"), TypeError, "tp must be an integer >= 1, got '2'"),
    (lambda r: presets.apply_preset(SimConfig(), "qwen3-next", tp=2.0), TypeError, "tp must be an integer >= 1, got 2.0"),
    (lambda r: presets.get_preset("qwen3-next").check_tp(2.0), TypeError, "tp must be an integer >= 1, got 2.0"),
    (lambda r: presets.get_preset("qwen3-next").state_bytes_per_slot(True), TypeError, "tp must be an integer >= 1, got True"),
    (lambda r: presets.get_preset("qwen3-next").prefill_flops(-10, 5), ValueError, "start must be >= 0, got -10"),
    (lambda r: presets.get_preset("qwen3-next").prefill_flops(0, 2.5), TypeError, "end must be an integer >= 0, got 2.5"),
    (lambda r: presets.get_preset("qwen3-next").policy_options(alpha=float("nan")), ValueError,
     "utility_alpha must be a finite number >= 0, got nan"),
    (lambda r: presets.get_preset("qwen3-next").policy_options(tune_window=1.5), ValueError,
     "tune_window must be an integer in [0, 1,048,576], got 1.5"),
    (lambda r: presets.parse_size(8), TypeError, "a size must be a str such as '8GiB'"),
    (lambda r: presets.parse_size(b"8GiB"), TypeError, "a size must be a str such as '8GiB'"),
    (lambda r: report.format_report(None, SimConfig()), TypeError, "metrics must be a SimMetrics"),
])
def test_sweep_presets_and_report_name_a_bad_argument(no_replay_loop, call, error, message):
    reqs = workloads.multi_turn(2, 2, 16, 4, request_rate=float("inf"))
    with pytest.raises(error) as e:
        call(reqs)
    assert message in str(e.value)


def test_presets_accept_numpy_integers_as_tp():
    p = presets.get_preset("qwen3-next")
    assert p.state_bytes_per_slot(np.int64(2)) == p.state_bytes_per_slot(2) == 77_266_944 // 2
