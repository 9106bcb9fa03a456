"""The upper bound in the simulator's outputs: ``python -m mambaradix sim
--bound`` (report row, JSON ``metrics.upper_bound_*``, every sweep point, the
CSV, the plot), ``sweep(..., bound=True)``, and what --bound refuses.

The figures are checked against independent computations: the pool-free
bound against the brute-force deepest touched prefix (bound_reference.py),
the pool-aware one against ``upper_bound`` called on the point's own
configuration (the bound itself is checked in test_bound.py); and every
replay of every simulator policy against the bound it is reported with."""

from __future__ import annotations

import csv
import dataclasses
import json
import sys

import pytest

pytest.importorskip("scipy", reason="the hit-rate bound solves its LP with SciPy (tests/requirements.txt)")

from bound_reference import trace_of, unlimited_optimum
from mambaradix.sim import SimConfig, sweep, upper_bound, workloads
from mambaradix.sim import cli
from mambaradix.sim.checks import POLICIES, UTILITY_ORDERS

#: the CLI's multi-turn workload for these options (its default rate and seed)
SMALL = ["--num-clients", "6", "--num-rounds", "3", "--request-length", "96", "--output-length", "16"]


def _small():
    return workloads.multi_turn(6, 3, 96, 16, request_rate=16.0, seed=0)


def _sim(capsys, *args: str) -> tuple:
    code = cli.main([*SMALL, "--no-progress", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _unlimited_rate(reqs, page: int = 1, cap: bool = True) -> float:
    return unlimited_optimum(trace_of(reqs), page, cap) / sum(len(r.input_ids) for r in reqs)


# ---------------------------------------------------------------------------
# the flag and the JSON fields
# ---------------------------------------------------------------------------
def test_json_has_the_bound_only_with_the_flag(capsys):
    code, out, _ = _sim(capsys, "--json", "--state-slots", "30")
    assert code == 0
    m = json.loads(out)["metrics"]
    assert not [k for k in m if k.startswith("upper_bound")]
    code, out, _ = _sim(capsys, "--json", "--state-slots", "30", "--bound")
    assert code == 0
    doc = json.loads(out)
    m = doc["metrics"]
    reqs = _small()
    assert m["prompt_tokens"] == sum(len(r.input_ids) for r in reqs)   # the same workload
    # max running follows the pool (30 // 5 = 6): the unlimited-pool bound
    assert doc["config"]["max_running"] == 6
    assert m["upper_bound_kind"] == "unlimited_pool"
    assert m["upper_bound_token_hit_rate"] == pytest.approx(_unlimited_rate(reqs), abs=1e-15)
    assert m["upper_bound_hit_tokens"] == unlimited_optimum(trace_of(reqs), 1, True)
    assert m["upper_bound_exact"] is True and m["upper_bound_seconds"] >= 0
    assert m["token_hit_rate"] <= m["upper_bound_token_hit_rate"] + 1e-12


def test_json_pool_aware_bound_serial(capsys):
    code, out, _ = _sim(capsys, "--json", "--state-slots", "6", "--max-running", "1", "--bound",
                        "--policy", "belady", "--page-size", "16", "--no-match-cap")
    assert code == 0
    m = json.loads(out)["metrics"]
    reqs = _small()
    want = upper_bound(reqs, SimConfig(state_slots=6, max_running=1, page_size=16, match_cap=False))
    assert m["upper_bound_kind"] == "pool_aware"
    assert m["upper_bound_hit_tokens"] == want.hit_tokens
    # the pool binds here: the bound is below the unlimited one
    assert m["upper_bound_token_hit_rate"] < _unlimited_rate(reqs, 16, False)
    assert 0 < m["token_hit_rate"] <= m["upper_bound_token_hit_rate"]


def test_report_names_which_bound(capsys):
    code, out, _ = _sim(capsys, "--state-slots", "6", "--max-running", "1", "--bound")
    assert code == 0
    row = next(line for line in out.splitlines() if line.strip().startswith("upper bound"))
    b = upper_bound(_small(), SimConfig(state_slots=6, max_running=1))
    assert f"{100 * b.token_hit_rate:.1f}%" in row
    assert "pool-aware" in row and f"<= {b.capacity} states" in row and "computed in" in row
    code, out, _ = _sim(capsys, "--state-slots", "30", "--bound")
    row = next(line for line in out.splitlines() if line.strip().startswith("upper bound"))
    assert "unlimited pool" in row and "max running > 1" in row
    code, out, _ = _sim(capsys, "--state-slots", "30")
    assert "upper bound" not in out


def test_sweep_bound_at_every_point_json_table_csv(capsys, tmp_path):
    out_csv = tmp_path / "sweep.csv"
    args = ["--bound", "--max-running", "1", "--sweep", "state_slots=5,6,8,40",
            "--sweep", "policy=sglang,utility,belady", "--csv", str(out_csv)]
    code, out, _ = _sim(capsys, "--json", *args)
    assert code == 0
    points = json.loads(out)["sweep"]
    reqs = _small()
    assert len(points) == 12
    for p in points:
        m = p["metrics"]
        want = upper_bound(reqs, SimConfig(state_slots=p["params"]["state_slots"], max_running=1))
        assert m["upper_bound_hit_tokens"] == want.hit_tokens, p["params"]
        assert m["upper_bound_kind"] == "pool_aware"
        assert m["token_hit_rate"] <= m["upper_bound_token_hit_rate"] + 1e-12, p["params"]
    rates = {p["params"]["state_slots"]: p["metrics"]["upper_bound_token_hit_rate"] for p in points}
    assert rates[5] < rates[8] < rates[40]          # a bigger pool, a higher bound here
    with open(out_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["upper_bound_token_hit_rate"]) for r in rows] == [
        p["metrics"]["upper_bound_token_hit_rate"] for p in points]
    assert {r["upper_bound_kind"] for r in rows} == {"pool_aware"}
    # the table: a bound column beside the token hit rate, and which bound it is
    code, out, _ = _sim(capsys, *args)
    lines = out.splitlines()
    header = next(line for line in lines if "token hit" in line).split()
    assert header[header.index("hit") + 1] == "bound"
    row = next(line.split() for line in lines if line.split()[:2] == ["5", "belady"])
    assert row[3] == f"{100 * rates[5]:.1f}%"
    assert any(line.startswith("bound: no state policy passes it; pool-aware (one request at a time)")
               for line in lines)


def test_sweep_of_max_running_mixes_the_kinds(capsys):
    code, out, _ = _sim(capsys, "--json", "--bound", "--state-slots", "12", "--sweep", "max_running=1,2")
    assert code == 0
    kinds = {p["params"]["max_running"]: p["metrics"]["upper_bound_kind"] for p in json.loads(out)["sweep"]}
    assert kinds == {1: "pool_aware", 2: "unlimited_pool"}
    code, out, _ = _sim(capsys, "--bound", "--state-slots", "12", "--sweep", "max_running=1,2")
    assert "bound: no state policy passes it; pool-aware where max running is 1, else unlimited pool" in out


def test_plot_draws_the_bound(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    drawn = []
    plot = Axes.plot

    def recording(self, *args, **kw):
        drawn.append((kw.get("label"), list(args[1]) if len(args) > 1 else None))
        return plot(self, *args, **kw)

    monkeypatch.setattr(Axes, "plot", recording)
    png = tmp_path / "hit.png"
    code, _, _ = _sim(capsys, "--bound", "--max-running", "1", "--sweep", "state_slots=5,8,40",
                      "--sweep", "policy=sglang,belady", "--plot", str(png))
    assert code == 0 and png.stat().st_size > 0
    bounds = [ys for label, ys in drawn if label and "upper bound" in label]
    reqs = _small()
    want = [100 * upper_bound(reqs, SimConfig(state_slots=s, max_running=1)).token_hit_rate
            for s in (5, 8, 40)]
    assert bounds == [pytest.approx(want)]         # one line: both policies have the same bound


def test_progress_line_for_a_large_workload(capsys, monkeypatch):
    monkeypatch.setattr(cli, "BOUND_NOTE_REQUESTS", 10)
    code = cli.main([*SMALL, "--bound", "--json", "--state-slots", "30"])
    _, err = capsys.readouterr()
    assert code == 0
    assert "computing the upper bound over 18 requests" in err and "upper bound" in err.splitlines()[-1]
    code = cli.main([*SMALL, "--bound", "--json", "--state-slots", "30", "--no-progress"])
    assert code == 0 and "computing" not in capsys.readouterr().err


# ---------------------------------------------------------------------------
# what --bound refuses
# ---------------------------------------------------------------------------
def test_bound_max_requests_without_bound(capsys):
    code, _, err = _sim(capsys, "--bound-max-requests", "100")
    assert code == 2 and "--bound-max-requests applies to --bound" in err


def test_bound_refuses_a_workload_over_its_limit_before_any_replay(capsys, monkeypatch):
    from mambaradix.sim import engine

    def no_replay(*a, **k):
        raise AssertionError("replayed")

    monkeypatch.setattr(engine, "run", no_replay)
    code, _, err = _sim(capsys, "--bound", "--bound-max-requests", "17")
    assert code == 2
    assert "--bound: the workload has 18 requests, more than --bound-max-requests 17" in err
    assert "--limit" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_bound_max_requests_values(capsys, value):
    with pytest.raises(SystemExit) as e:
        cli.main([*SMALL, "--bound", f"--bound-max-requests={value}"])
    assert e.value.code == 2 and "--bound-max-requests" in capsys.readouterr().err


def test_bound_without_scipy_says_so_before_replaying(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)
    code, _, err = _sim(capsys, "--bound", "--max-running", "1", "--state-slots", "6")
    assert code == 2 and "--bound" in err and "SciPy" in err and "pip install scipy" in err
    # the unlimited-pool bound needs no LP
    code, out, _ = _sim(capsys, "--bound", "--state-slots", "30", "--json")
    assert code == 0 and json.loads(out)["metrics"]["upper_bound_kind"] == "unlimited_pool"


def test_bound_is_a_flag_in_the_subprocess():
    import subprocess

    from test_sim_cli import ROOT, _env

    r = subprocess.run([sys.executable, "-m", "mambaradix", "sim", *SMALL, "--bound", "--json",
                        "--state-slots", "6", "--max-running", "1"], capture_output=True, text=True,
                       timeout=300, env=_env(), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)["metrics"]
    assert m["upper_bound_kind"] == "pool_aware" and m["token_hit_rate"] <= m["upper_bound_token_hit_rate"]


# ---------------------------------------------------------------------------
# no policy exceeds the bound: every simulator policy, swept
# ---------------------------------------------------------------------------
def _sweep_workloads() -> dict:
    inf = float("inf")
    return {
        "multiturn": workloads.multi_turn(8, 4, 128, 16, request_rate=inf, seed=7),
        "gsp": workloads.generated_shared_prefix(6, 4, 192, 32, 16, request_rate=inf, seed=8),
        "agentic": workloads.agentic_branching(2, 3, 2, 192, 64, 32, 16, request_rate=inf, seed=9),
        "mooncake": workloads.mooncake_conversation(limit=40),
    }


@pytest.mark.parametrize("name", sorted(_sweep_workloads()))
def test_no_policy_exceeds_the_bound_in_a_sweep(name):
    """sweep(bound=True) over every policy (utility in both recency orders),
    with and without end-of-turn states and a per-path budget: served one at
    a time against the pool-aware bound (which binds at the small pools), and
    at the default concurrency against the unlimited-pool one."""
    reqs = _sweep_workloads()[name]
    kv = sum(len(r.input_ids) + r.output_len + 2 for r in reqs) + 4096
    common = dict(lru_policy=list(POLICIES), utility_order=list(UTILITY_ORDERS),
                  end_of_turn_states=[False, True], max_states_per_path=[0, 2])
    serial = sweep(reqs, SimConfig(max_running=1, kv_tokens=kv), bound=True, on_error="record",
                   state_slots=[5, 6, 8, 12, 64], **common)
    concurrent = sweep(reqs, SimConfig(kv_tokens=kv), bound=True, on_error="record",
                       state_slots=[10, 20, 64], **common)
    failed = [p for p in serial + concurrent if p.metrics is None]
    # a pool too small for a hit (every state locked) stops a replay
    assert all("state pool exhausted" in p.error for p in failed)
    assert len(failed) <= len(serial + concurrent) // 10, [(p.params, p.error) for p in failed]
    serial = [p for p in serial if p.metrics is not None]
    concurrent = [p for p in concurrent if p.metrics is not None]
    unlimited = unlimited_optimum(trace_of(reqs), 1, True)
    binding = 0
    for p in serial + concurrent:
        assert p.metrics.token_hit_rate <= p.bound.token_hit_rate + 1e-12, (name, p.params, p.bound)
        assert p.metrics.state_usable_tokens <= p.bound.hit_tokens
        serial_point = p.config.max_running == 1
        assert p.bound.pool_aware == serial_point
        if not serial_point:
            assert p.config.max_running > 1 and p.bound.hit_tokens == unlimited
        binding += p.bound.hit_tokens < unlimited
    # the pool-aware bound is upper_bound of the point's configuration, shared
    # by the points whose bound is the same
    for slots in (5, 12):
        pts = [p for p in serial if p.params["state_slots"] == slots]
        assert all(p.bound is pts[0].bound for p in pts)
        assert pts[0].bound.hit_tokens == upper_bound(reqs, pts[0].config).hit_tokens
    if name != "mooncake":
        assert binding > 0


def test_sweep_bound_follows_what_it_depends_on():
    reqs = _small()
    pts = sweep(reqs, SimConfig(max_running=1), bound=True, state_slots=[6], mode=["pp2", "no_buffer"],
                page_size=[1], match_cap=[True, False])
    for p in pts:
        assert p.bound.hit_tokens == upper_bound(reqs, p.config).hit_tokens, p.params
    assert len({id(p.bound) for p in pts}) == 4
    assert sweep(reqs, SimConfig(max_running=1), state_slots=[6])[0].bound is None
    with pytest.raises(TypeError, match="bound"):
        sweep(reqs, SimConfig(), bound="yes", state_slots=[6])


def test_points_to_rows_carry_the_bound():
    from mambaradix.sim.sweep import points_to_rows

    reqs = _small()
    pts = sweep(reqs, SimConfig(max_running=1), bound=True, state_slots=[6, 30])
    rows = points_to_rows(pts)
    assert [r["upper_bound_token_hit_rate"] for r in rows] == [p.bound.token_hit_rate for p in pts]
    assert {r["upper_bound_kind"] for r in rows} == {"pool_aware"}
    assert "upper_bound_token_hit_rate" not in points_to_rows(sweep(reqs, SimConfig(), state_slots=[6]))[0]


def test_deprecated_policy_name_in_a_sweep(capsys):
    with pytest.warns(DeprecationWarning):
        cfg = dataclasses.replace(SimConfig(), lru_policy="clairvoyant")
    assert cfg.lru_policy == "belady"
    code, out, err = _sim(capsys, "--json", "--state-slots", "30", "--sweep", "policy=clairvoyant,sglang")
    assert code == 0 and err.count("'clairvoyant' is deprecated") == 1
    assert [p["params"]["lru_policy"] for p in json.loads(out)["sweep"]] == ["belady", "sglang"]
