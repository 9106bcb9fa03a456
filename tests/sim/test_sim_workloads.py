"""Workload generators, trace parsing and Mooncake expansion of the simulator."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from mambaradix.sim import workloads as wl
from mambaradix.sim.presets import PRESETS, get_preset, parse_size
from mambaradix.sim.types import SimRequest


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if len(diff) else n


def _same(a: list[SimRequest], b: list[SimRequest]) -> bool:
    return len(a) == len(b) and all(
        x.rid == y.rid and np.array_equal(x.input_ids, y.input_ids) and x.output_len == y.output_len
        and x.arrival == y.arrival and x.session == y.session and x.turn == y.turn
        for x, y in zip(a, b))


# --------------------------------------------------------------------------
# generated shared prefix
# --------------------------------------------------------------------------


def test_gsp_shapes_and_lengths():
    reqs = wl.generated_shared_prefix(num_groups=5, prompts_per_group=7, system_prompt_len=300,
                                      question_len=40, output_len=9, seed=1)
    assert len(reqs) == 35
    for r in reqs:
        assert r.input_ids.dtype == np.int32
        assert len(r.input_ids) == 340
        assert r.output_len == 9
        assert 0 <= r.input_ids.min() and r.input_ids.max() < wl.DEFAULT_VOCAB_SIZE
    assert sorted(r.session for r in reqs) == sorted(f"g{g}" for g in range(5) for _ in range(7))
    assert len({r.rid for r in reqs}) == 35


def test_gsp_groups_share_exactly_their_system_prompt():
    reqs = wl.generated_shared_prefix(num_groups=4, prompts_per_group=6, system_prompt_len=256,
                                      question_len=64, output_len=4, seed=3)
    by_group: dict[str, list[SimRequest]] = {}
    for r in reqs:
        by_group.setdefault(r.session, []).append(r)
    prompts = {g: rs[0].input_ids[:256] for g, rs in by_group.items()}
    for g, rs in by_group.items():
        for r in rs:
            assert np.array_equal(r.input_ids[:256], prompts[g])
        # Questions differ: two requests of a group share (almost) only the system prompt.
        assert _common_prefix(rs[0].input_ids, rs[1].input_ids) < 256 + 3
    groups = list(prompts)
    # Different groups share (almost) nothing.
    assert _common_prefix(prompts[groups[0]], prompts[groups[1]]) < 3


def test_gsp_is_deterministic_and_seed_dependent():
    kw = dict(num_groups=3, prompts_per_group=4, system_prompt_len=50, question_len=10,
              output_len=5, range_ratio=0.5, request_rate=10.0)
    a = wl.generated_shared_prefix(seed=7, **kw)
    b = wl.generated_shared_prefix(seed=7, **kw)
    c = wl.generated_shared_prefix(seed=8, **kw)
    assert _same(a, b)
    assert not _same(a, c)


def test_gsp_range_ratio_and_arrivals():
    reqs = wl.generated_shared_prefix(num_groups=8, prompts_per_group=8, system_prompt_len=100,
                                      question_len=20, output_len=10, range_ratio=0.5,
                                      request_rate=5.0, ordered=True, seed=0)
    lens = {len(r.input_ids) for r in reqs}
    assert len(lens) > 1 and min(lens) >= 50 + 10 and max(lens) <= 120
    outs = [r.output_len for r in reqs]
    assert min(outs) >= 5 and max(outs) <= 10
    arrivals = [r.arrival for r in reqs]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    # 64 requests at 5 req/s take about 13 s.
    assert 5 < arrivals[-1] < 30


def test_gsp_ordered_keeps_groups_together():
    reqs = wl.generated_shared_prefix(num_groups=3, prompts_per_group=4, system_prompt_len=20,
                                      question_len=5, output_len=2, ordered=True)
    assert [r.session for r in reqs] == ["g0"] * 4 + ["g1"] * 4 + ["g2"] * 4
    shuffled = wl.generated_shared_prefix(num_groups=3, prompts_per_group=4,
                                          system_prompt_len=20, question_len=5, output_len=2)
    assert [r.session for r in shuffled] != [r.session for r in reqs]


def test_gsp_zipf_skews_group_popularity():
    reqs = wl.generated_shared_prefix(num_groups=20, prompts_per_group=50, system_prompt_len=10,
                                      question_len=5, output_len=2, group_distribution="zipf",
                                      zipf_alpha=1.2, seed=0)
    assert len(reqs) == 1000
    counts = {}
    for r in reqs:
        counts[r.session] = counts.get(r.session, 0) + 1
    assert counts["g0"] > 3 * 50  # uniform would give 50 each
    assert counts["g0"] > counts.get("g19", 0) * 5


@pytest.mark.parametrize("kw", [
    dict(num_groups=0), dict(question_len=0), dict(range_ratio=1.5),
    dict(group_distribution="pareto"), dict(group_distribution="zipf", zipf_alpha=-1.0),
    dict(request_rate=0.0),
])
def test_gsp_rejects_bad_parameters(kw):
    with pytest.raises(wl.WorkloadError):
        wl.generated_shared_prefix(**kw)


# --------------------------------------------------------------------------
# multi-turn
# --------------------------------------------------------------------------


def test_multi_turn_history_composition():
    reqs = wl.multi_turn(num_clients=3, num_rounds=4, request_length=20, output_length=6, seed=2)
    assert len(reqs) == 12
    by_client: dict[str, list[SimRequest]] = {}
    for r in reqs:
        by_client.setdefault(r.session, []).append(r)
    assert set(by_client) == {"c0", "c1", "c2"}
    for turns in by_client.values():
        assert [t.turn for t in turns] == [0, 1, 2, 3]
        assert len(turns[0].input_ids) == 20
        for prev, cur in zip(turns, turns[1:]):
            # turn r = turn r-1's prompt + its output + a new 20-token message
            assert prev.output_ids is not None and len(prev.output_ids) == prev.output_len == 6
            history = np.concatenate((prev.input_ids, prev.output_ids))
            assert len(cur.input_ids) == len(history) + 20
            assert np.array_equal(cur.input_ids[:len(history)], history)
    # Different clients' conversations are unrelated.
    assert _common_prefix(by_client["c0"][3].input_ids, by_client["c1"][3].input_ids) < 3


def test_multi_turn_order_and_shared_system_prompt():
    reqs = wl.multi_turn(num_clients=4, num_rounds=3, request_length=10, output_length=2,
                         system_prompt_len=32, request_rate=100.0, seed=0)
    assert [(r.turn, r.session) for r in reqs] == [(t, f"c{c}") for t in range(3) for c in range(4)]
    first = reqs[0].input_ids[:32]
    assert all(np.array_equal(r.input_ids[:32], first) for r in reqs)
    arrivals = [r.arrival for r in reqs]
    assert arrivals == sorted(arrivals)
    assert all(r.rid == f"mt-{r.session[1:]}-{r.turn}" for r in reqs)


def test_multi_turn_deterministic():
    a = wl.multi_turn(num_clients=2, num_rounds=3, request_length=8, output_length=3,
                      range_ratio=0.25, seed=5)
    b = wl.multi_turn(num_clients=2, num_rounds=3, request_length=8, output_length=3,
                      range_ratio=0.25, seed=5)
    assert _same(a, b)
    assert all(np.array_equal(x.output_ids, y.output_ids) for x, y in zip(a, b))


# --------------------------------------------------------------------------
# agentic branching
# --------------------------------------------------------------------------


def test_agentic_tree_shape_and_sharing():
    reqs = wl.agentic_branching(num_trees=2, depth=3, branching=2, system_prompt_len=64,
                                task_len=16, step_len=8, output_len=4, seed=0)
    assert len(reqs) == 2 * (1 + 2 + 4)
    by_rid = {r.rid: r for r in reqs}
    # Parents precede children.
    pos = {r.rid: i for i, r in enumerate(reqs)}
    for r in reqs:
        tree, path = r.rid.split("-")[1], r.rid.split("-")[2]
        assert r.turn == path.count(".")
        if "." in path:
            parent = by_rid[f"ag-{tree}-{path.rsplit('.', 1)[0]}"]
            assert pos[parent.rid] < pos[r.rid]
            history = np.concatenate((parent.input_ids, parent.output_ids))
            assert np.array_equal(r.input_ids[:len(history)], history)
            assert len(r.input_ids) == len(history) + 8
    # Siblings share exactly their parent's trajectory, then diverge.
    a, b = by_rid["ag-0-0.0"], by_rid["ag-0-0.1"]
    parent = by_rid["ag-0-0"]
    shared = len(parent.input_ids) + len(parent.output_ids)
    assert shared <= _common_prefix(a.input_ids, b.input_ids) < shared + 3
    # Trees share the system prompt only.
    assert 64 <= _common_prefix(by_rid["ag-0-0"].input_ids, by_rid["ag-1-0"].input_ids) < 67


# --------------------------------------------------------------------------
# Mooncake traces
# --------------------------------------------------------------------------


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _mc(ts: int, n_in: int, n_out: int, ids: list[int]) -> str:
    return json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out,
                       "hash_ids": ids})


def test_mooncake_block_sharing_means_token_sharing(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", [
        _mc(0, 1000, 10, [0, 1]),
        _mc(1500, 1200, 20, [0, 1, 2]),
        _mc(3000, 700, 3, [0, 3]),
        _mc(3000, 512, 5, [4]),
    ])
    reqs = wl.load_mooncake(path)
    a, b, c, d = (r.input_ids for r in reqs)
    assert [len(x) for x in (a, b, c, d)] == [1000, 1200, 700, 512]
    assert np.array_equal(a, b[:1000])             # blocks 0, 1 shared; block 1 cut at 1000
    assert _common_prefix(b, c) in range(512, 515)  # only block 0 shared
    assert np.array_equal(a[:512], c[:512])
    assert _common_prefix(a, d) < 3                # no block shared
    assert [r.arrival for r in reqs] == [0.0, 1.5, 3.0, 3.0]
    assert [r.output_len for r in reqs] == [10, 20, 3, 5]
    assert all(r.input_ids.dtype == np.int32 for r in reqs)


def test_mooncake_last_block_is_cut_and_tokens_depend_only_on_ids(tmp_path):
    p1 = _write_lines(tmp_path / "a.jsonl", [_mc(0, 513, 1, [7, 8])])
    p2 = _write_lines(tmp_path / "b.jsonl", [_mc(0, 1024, 1, [7, 8])])
    short, = wl.load_mooncake(p1)
    full, = wl.load_mooncake(p2)
    assert len(short.input_ids) == 513
    assert np.array_equal(short.input_ids, full.input_ids[:513])
    blocks = wl.expand_hash_blocks(np.array([7, 8]))
    assert np.array_equal(full.input_ids, blocks.reshape(-1))
    # A different seed gives different tokens, the same seed the same ones.
    assert np.array_equal(wl.expand_hash_blocks(np.array([7]), seed=1),
                          wl.expand_hash_blocks(np.array([7]), seed=1))
    assert not np.array_equal(wl.expand_hash_blocks(np.array([7]), seed=1), blocks[:1])


def test_expand_hash_blocks_distinct_ids_look_independent():
    blocks = wl.expand_hash_blocks(np.arange(2000), block_size=64)
    assert blocks.shape == (2000, 64) and blocks.dtype == np.int32
    assert blocks.min() >= 0 and blocks.max() < wl.DEFAULT_VOCAB_SIZE
    # Different ids agree at a position about 1/vocab of the time.
    same = (blocks[:-1] == blocks[1:]).mean()
    assert same < 1e-3
    # First tokens of different blocks collide only as random draws would
    # (2000 draws from 2**17 values: about 15 birthday collisions).
    assert len(np.unique(blocks[:, 0])) > 1950
    # Different ids never give the same block.
    many = wl.expand_hash_blocks(np.arange(200_000), block_size=4)
    assert len(np.unique(many, axis=0)) == 200_000
    # Any vocabulary size is honoured.
    small = wl.expand_hash_blocks(np.arange(100), block_size=32, vocab_size=1000)
    assert small.min() >= 0 and small.max() < 1000 and len(np.unique(small)) > 900


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1}), "missing field 'hash_ids'"),
    (_mc(0, 0, 1, [1]), "input_length must be an int >= 1"),
    (_mc(0, 10, -1, [1]), "output_length must be an int >= 1"),
    (_mc(0, 10, 0, [1]), "output_length 0 (a prefill-only request) cannot be replayed"),
    (_mc(0, 10, 1, []), "hash_ids must be a non-empty list"),
    (_mc(0, 10, 1, [1, "x"]), "hash_ids must be a non-empty list"),
    (_mc(0, 10, 1, [1.5]), "hash_ids must be a non-empty list"),
    (_mc(0, 10, 1, [-3]), "hash_ids must be a non-empty list of ints >= 0"),
    (_mc(0, 600, 1, [1]), "input_length 600 does not fit 1 blocks of 512 tokens"),
    (_mc(0, 100, 1, [1, 2]), "input_length 100 does not fit 2 blocks"),
    (_mc(-5, 100, 1, [1]), "timestamp must be a number >= 0"),
])
def test_mooncake_bad_lines_name_their_line(tmp_path, line, message):
    path = _write_lines(tmp_path / "bad.jsonl", [_mc(0, 10, 1, [1]), "", _mc(0, 10, 1, [1]), line])
    with pytest.raises(wl.TraceFormatError) as exc:
        wl.load_mooncake(path)
    assert exc.value.lineno == 4
    assert str(exc.value).startswith(f"{path}:4: ")
    assert message in str(exc.value)


def test_mooncake_gzip_limit_and_empty(tmp_path):
    lines = [_mc(i * 10, 100 + i, 1, [i]) for i in range(5)]
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    reqs = wl.load_mooncake(path, limit=3)
    assert [len(r.input_ids) for r in reqs] == [100, 101, 102]
    empty = _write_lines(tmp_path / "e.jsonl", ["", "  "])
    with pytest.raises(wl.WorkloadError, match="no requests"):
        wl.load_mooncake(empty)
    with pytest.raises(wl.WorkloadError, match="cannot read trace"):
        wl.load_mooncake(tmp_path / "missing.jsonl")


def test_bundled_mooncake_trace_matches_the_docs():
    # (its expansion time is measured by benchmarks/bench_sim.py, not asserted here)
    reqs = wl.mooncake_conversation()
    assert len(reqs) == 12031
    stats = wl.workload_stats(reqs)
    assert stats["prompt_tokens"] == 144_793_823
    assert 12_000 < stats["mean_prompt"] < 12_100  # "average input 12,035 tokens"
    # Records 0 and 1 share hash id 0 only: 512 shared tokens.
    assert _common_prefix(reqs[0].input_ids, reqs[1].input_ids) in range(512, 515)
    assert reqs[-1].arrival > 3000  # one hour of timestamps, in seconds


def test_bundled_trace_limit():
    reqs = wl.mooncake_conversation(limit=10)
    assert len(reqs) == 10 and reqs[0].rid == "mc-0"
    assert len(reqs[0].input_ids) == 6758


# --------------------------------------------------------------------------
# explicit token traces
# --------------------------------------------------------------------------


def test_token_trace_round_trip(tmp_path):
    reqs = wl.multi_turn(num_clients=2, num_rounds=2, request_length=5, output_length=3,
                         request_rate=4.0, seed=0)
    reqs[0].extra_key = "lora-a"
    for name in ("t.jsonl", "t.jsonl.gz"):
        path = tmp_path / name
        wl.save_token_trace(reqs, path)
        back = wl.load_trace(path)
        assert _same(reqs, back)
        assert back[0].extra_key == "lora-a" and back[1].extra_key is None
        assert all(np.array_equal(x.output_ids, y.output_ids) for x, y in zip(reqs, back))
        assert all(x.input_ids.dtype == np.int32 for x in back)


def test_token_trace_defaults(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", [
        json.dumps({"input_ids": [1, 2, 3], "output_len": 4}),
        json.dumps({"input_ids": [1, 2], "output_ids": [5, 6], "session": 3, "turn": 1}),
    ])
    a, b = wl.load_token_trace(path)
    assert a.rid == "line-1" and a.arrival == 0.0 and a.session is None and a.turn == 0
    assert a.output_ids is None and a.output_len == 4
    assert b.output_len == 2 and b.session == "3" and b.turn == 1


@pytest.mark.parametrize("rec, message", [
    ({"output_len": 3}, "missing field 'input_ids'"),
    ({"input_ids": [], "output_len": 3}, "input_ids must be a non-empty list"),
    ({"input_ids": [1, "a"], "output_len": 3}, "input_ids must be a list of ints"),
    ({"input_ids": [1, 2.5], "output_len": 3}, "input_ids must be a list of ints"),
    ({"input_ids": [1, -2], "output_len": 3}, "input_ids values must lie in [0, 2**31)"),
    ({"input_ids": [1]}, "missing field 'output_len'"),
    ({"input_ids": [1], "output_len": 0}, "output_len must be an int >= 1"),
    ({"input_ids": [1], "output_len": 2, "output_ids": [1]}, "output_ids has 1 tokens"),
    ({"input_ids": [1], "output_len": 2, "arrival": -1}, "arrival must be a number >= 0"),
    ({"input_ids": [1], "output_len": 2, "turn": "x"}, "turn must be an int >= 0"),
    ({"input_ids": [1], "output_len": 2, "extra_key": 5}, "extra_key must be a string"),
    ({"input_ids": [1], "output_len": 2, "colour": 5}, "unknown field(s) colour"),
])
def test_token_trace_bad_lines(tmp_path, rec, message):
    good = json.dumps({"input_ids": [1, 2], "output_len": 1})
    path = _write_lines(tmp_path / "t.jsonl", [good, good, json.dumps(rec)])
    with pytest.raises(wl.TraceFormatError) as exc:
        wl.load_token_trace(path)
    assert exc.value.lineno == 3
    assert "t.jsonl:3: " in str(exc.value)
    assert message in str(exc.value)


def test_trace_format_detection(tmp_path):
    mc = _write_lines(tmp_path / "m.jsonl", [_mc(0, 10, 1, [1])])
    tok = _write_lines(tmp_path / "k.jsonl", [json.dumps({"input_ids": [1], "output_len": 1})])
    other = _write_lines(tmp_path / "o.jsonl", ["", json.dumps({"prompt": "hi"})])
    assert wl.detect_trace_format(mc) == "mooncake"
    assert wl.detect_trace_format(tok) == "tokens"
    with pytest.raises(wl.TraceFormatError, match=r"o.jsonl:2: unknown record format"):
        wl.load_trace(other)
    with pytest.raises(wl.WorkloadError, match="unknown trace format"):
        wl.load_trace(mc, fmt="csv")


# --------------------------------------------------------------------------
# presets
# --------------------------------------------------------------------------


def test_presets_state_sizes():
    q = get_preset("Qwen3-Next")
    assert q.state_bytes_per_slot(1) == 77_266_944
    assert q.state_bytes_per_slot(4) == 19_316_736
    assert q.kv_bytes_per_token(1) == 12 * 2 * 2 * 256 * 2
    assert get_preset("nemotron-h-8b").state_bytes_per_slot(1) == 24 * (10240 * 3 * 2 + 128 * 64 * 128 * 4)
    assert get_preset("jamba-like").state_bytes_per_slot(2) == 28 * (4096 * 3 * 2 + 4096 * 16 * 4)
    for p in PRESETS.values():
        assert p.state_bytes_per_slot(2) * 2 == p.state_bytes_per_slot(1)
        # Prefill cost grows with position (attention) on top of the per-token cost.
        assert p.prefill_flops(0, 1000) > 1000 * p.flops_per_token
        assert p.prefill_flops(0, 2000) == pytest.approx(p.prefill_flops(0, 1000) + p.prefill_flops(1000, 2000))
    with pytest.raises(ValueError, match="unknown model preset"):
        get_preset("llama")
    with pytest.raises(ValueError, match="does not divide"):
        q.state_bytes_per_slot(3)


def test_parse_size():
    assert parse_size("8GiB") == 8 * 1024**3
    assert parse_size("1.5 GB".replace(" ", "")) == 1_500_000_000
    assert parse_size("4096") == 4096
    for bad in ("lots", "GiB", "5 parsecs", "-1"):
        with pytest.raises(ValueError):
            parse_size(bad)
