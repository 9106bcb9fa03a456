"""benchmarks/bench_robustness.py: its goal arithmetic on a hand-made table
(expected numbers worked out by hand), its candidate syntax, its held-out
traces, and a --quick run on one small workload."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_robustness as br  # noqa: E402

# (name, SGLang's two at the point, the same at W, candidate, bound) and by hand:
# (better SGLang policy, pressure, ratio, gap closed, goal met)
TABLE = [
    # consumed 0.40 < 0.8 * 0.70: pressure; 0.46 / 0.40 = 1.15x but (0.46-0.40)/(0.50-0.40) = 60% closed
    ("A", (0.30, 0.40), (0.60, 0.70), 0.46, 0.50, "consumed", True, 1.15, 0.6, True),
    # pressure; 1.10x and 40% closed: neither goal
    ("B", (0.30, 0.40), (0.60, 0.70), 0.44, 0.50, "consumed", True, 1.10, 0.4, False),
    # pressure; 1.25x with only 10/50 = 20% of the gap closed: the ratio goal is met
    ("C", (0.30, 0.40), (0.60, 0.70), 0.50, 0.90, "consumed", True, 1.25, 0.2, True),
    # sglang 0.65 >= 0.8 * 0.70 = 0.56: no pressure; 0.64 / 0.65 = 0.9846x < 0.99x
    ("D", (0.65, 0.60), (0.70, 0.70), 0.64, 0.80, "sglang", False, 0.64 / 0.65, -1 / 15, False),
    # no pressure; 0.645 / 0.65 = 0.9923x >= 0.99x
    ("E", (0.65, 0.60), (0.70, 0.70), 0.645, 0.80, "sglang", False, 0.645 / 0.65, -1 / 30, True),
    # SGLang hits nothing (pressure); any hit is an infinite ratio; half of 0.2 closed
    ("F", (0.0, 0.0), (0.50, 0.40), 0.10, 0.20, "sglang", True, math.inf, 0.5, True),
    # the bound is SGLang's rate: no gap to close; a tie goes to sglang
    ("G", (0.70, 0.70), (0.70, 0.70), 0.70, 0.70, "sglang", False, 1.0, 1.0, True),
    # pressure is judged against the better policy's own rate at W: consumed 0.30 >= 0.8 * 0.35,
    # no pressure (against sglang's 0.90 it would be), so 1.1x meets >= 0.99x
    ("H", (0.10, 0.30), (0.90, 0.35), 0.33, 0.40, "consumed", False, 1.1, 0.3, True),
]


def _verdict(row):
    _, (s, c), (ws, wc), cand, bound = row[:5]
    return br.judge_point({"sglang": s, "consumed": c}, {"sglang": ws, "consumed": wc}, cand, bound)


@pytest.mark.parametrize("row", TABLE, ids=[r[0] for r in TABLE])
def test_judge_point_hand_table(row):
    best, pressure, ratio, gap, ok = row[5:]
    v = _verdict(row)
    assert v["sglang_best"] == best
    assert v["pressure"] is pressure
    assert v["ratio"] == pytest.approx(ratio)
    assert v["gap_closed"] == pytest.approx(gap)
    assert v["ok"] is ok


def test_summarize_hand_table():
    s = br.summarize([(row[0], _verdict(row)) for row in TABLE])
    assert s["points"] == 8
    assert s["worst_at"] == "D" and s["worst_ratio"] == pytest.approx(0.64 / 0.65)
    assert s["pressure"] == dict(total=4, met=3, missed=["B"], passed=False)
    assert s["elsewhere"] == dict(total=4, met=3, missed=["D"], passed=False)
    good = br.summarize([(row[0], _verdict(row)) for row in TABLE if row[-1]])
    assert good["pressure"]["passed"] and good["elsewhere"]["passed"]
    assert good["worst_at"] == "E"


def test_goal_edges():
    # exactly 1.2x, exactly half the gap, exactly 0.99x: met
    at_w = {"sglang": 1.0, "consumed": 1.0}
    assert br.judge_point({"sglang": 0.5, "consumed": 0.4}, at_w, 0.6, 0.9)["ok"]
    assert br.judge_point({"sglang": 0.5, "consumed": 0.4}, at_w, 0.55, 0.6)["ok"]
    assert br.judge_point({"sglang": 0.5, "consumed": 0.4}, at_w, 0.549, 0.6)["ok"] is False
    assert br.judge_point({"sglang": 0.9, "consumed": 0.4}, at_w, 0.891, 0.95)["ok"]
    assert br.judge_point({"sglang": 0.9, "consumed": 0.4}, at_w, 0.890, 0.95)["ok"] is False
    # exactly 80% of the rate at W is not under pressure
    assert br.judge_point({"sglang": 0.8, "consumed": 0.4}, at_w, 0.8, 0.9)["pressure"] is False
    assert br.ratio_of(0.0, 0.0) == 1.0


def test_candidate_syntax():
    c = br.Candidate.parse("utility --end-of-turn-states --max-states-per-path 2 --utility-order lru")
    assert (c.policy, c.eot, c.budget, c.order) == ("utility", True, 2, "lru")
    assert c.label == "utility+eot+budget2+lru"
    assert c.overrides() == {"lru_policy": "utility", "end_of_turn_states": True, "max_states_per_path": 2,
                             "utility_order": "lru"}
    assert br.Candidate.parse("consumed").overrides() == {
        "lru_policy": "consumed", "end_of_turn_states": False, "max_states_per_path": 0}
    for bad in ("", "--end-of-turn-states", "utility --eot", "utility --max-states-per-path -1",
                "utility --utility-order fifo"):
        with pytest.raises(ValueError, match="--candidate"):
            br.Candidate.parse(bad)


def test_unaccepted_policy_falls_back(capsys):
    from mambaradix.sim.checks import POLICIES

    name = "no-such-policy"
    assert name not in POLICIES
    c = br.accepted(br.Candidate.parse(f"{name} --end-of-turn-states"))
    assert (c.policy, c.eot, c.fallback_from) == (br.FALLBACK, True, name)
    assert name in capsys.readouterr().err
    same = br.Candidate("consumed", eot=True)
    assert br.accepted(same) is same


def test_held_out_traces_differ():
    for name in br.WORKLOADS:
        if name == "mooncake":
            continue
        gen, kw = br.generator_args(name, False, False)
        hgen, hkw = br.generator_args(name, False, True)
        assert gen == hgen
        changed = {k for k in set(kw) | set(hkw) if kw.get(k) != hkw.get(k)}
        assert len(changed) >= 3, (name, changed)
    (_, t0, b0), = br.traces(["longdoc"], [0], True, False)
    (_, t1, b1), = br.traces(["longdoc"], [0], True, True)
    assert (t0, t1) == ("seed 0", f"seed {br.HELD_OUT_SEED}")
    a, b = b0(), b1()
    assert len(a) != len(b) or any(len(x.input_ids) != len(y.input_ids) for x, y in zip(a, b))
    moon = br.traces(["mooncake"], [0, 1], True, True)
    assert [t for _, t, _ in moon] == ["requests 1000-1999", "requests 2000-2999"]


def test_quick_run_one_workload(tmp_path):
    out = tmp_path / "r.json"
    assert br.main(["--quick", "--only", "longdoc", "--candidate", "utility", "--candidate",
                    "utility --end-of-turn-states", "--no-timing", "--held-out", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["tables"]) == {"defaults", "held_out"}
    for where, rows in res["tables"].items():
        assert rows and {r["workload"] for r in rows} == {"longdoc"}
        for r in rows:
            h = r["hits"]
            sg = max(h["sglang"], h["consumed"])
            for label in ("utility", "utility+eot"):
                v = r["verdicts"][label]
                assert v["ratio"] == pytest.approx(h[label] / sg)
                assert max(h.values()) <= r["bound"] + 1e-12
        biggest = max(rows, key=lambda r: r["slots"])
        assert biggest["fraction"] >= 1.0 - 1e-9          # the pool at W is always a point
    for label in ("utility", "utility+eot"):
        for where in ("defaults", "held_out"):
            s = res["summaries"][label][where]
            rows = res["tables"][where]
            assert s["worst_ratio"] == pytest.approx(min(r["verdicts"][label]["ratio"] for r in rows))
    assert res["bound_kinds"] == ["unlimited_pool"]
    for label in ("utility", "utility+eot"):
        per = res["summaries"][label]["per_workload"]
        for where in ("defaults", "held_out"):
            assert per[where]["longdoc"]["points"] == len(res["tables"][where])
            assert per[where]["longdoc"]["worst_ratio"] == res["summaries"][label][where]["worst_ratio"]


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "a"], "--seeds"), (["--seeds", "0,-1"], "--seeds"), (["--only", "gsp,nope"], "--only"),
    (["--max-running", "0"], "--max-running"), (["--candidate", "utility --bogus"], "--candidate"),
    (["--candidate", "utility", "--candidate", "utility"], "--candidate"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        br.main(argv + ["--no-timing"])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
