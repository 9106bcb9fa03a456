"""The session workloads (agent, rag, tenants, longdoc): their shape checked
from the token ids alone (shared prefixes found by comparing prompts, not by
reading the generator's plan), determinism, and the refusal of bad
parameters in Python and on the command line."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

from mambaradix.sim import SimConfig, cli
from mambaradix.sim import workloads as wl
from mambaradix.sim.checks import check_requests, request_checker
from mambaradix.sim.types import SimRequest

from test_sim_first_run import no_replay  # noqa: F401  (the fixture: no replay may run)
from test_sim_inputs import main

GENERATORS = {
    "agent": (wl.agent_sessions, dict(num_tasks=10, active=4, steps=(4, 10), system_prompt_len=300,
                                      task_len=(40, 80), tool_len=(10, 60),
                                      output_len=(5, 30))),
    "rag": (wl.rag_queries, dict(num_docs=30, doc_len=(20, 60), docs_per_query=4, num_queries=60,
                                 instruction_len=50, question_len=(5, 15), output_len=(5, 20))),
    "tenants": (wl.multi_tenant, dict(num_tenants=5, num_sessions=60, system_prompt_len=(50, 200),
                                      message_len=(5, 40), output_len=(5, 30))),
    "longdoc": (wl.long_document_qa, dict(num_docs=3, doc_len=(500, 2000), questions_per_doc=6,
                                          system_prompt_len=40, question_len=(5, 20),
                                          output_len=(5, 30))),
}


def _prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(diff[0]) if len(diff) else n


def _starts_with(a: np.ndarray, b: np.ndarray) -> bool:
    return len(a) >= len(b) and np.array_equal(a[:len(b)], b)


def _history(r: SimRequest) -> np.ndarray:
    """The prompt and output of a request: what the next turn builds on."""
    return np.concatenate((r.input_ids, r.output_ids))


def _by_session(reqs: list[SimRequest]) -> dict[str, list[SimRequest]]:
    """Each session's requests in turn order."""
    out: dict[str, list[SimRequest]] = collections.defaultdict(list)
    for r in reqs:
        out[r.session].append(r)
    for rs in out.values():
        rs.sort(key=lambda r: r.turn)
    return out


def _same(a: list[SimRequest], b: list[SimRequest]) -> bool:
    return len(a) == len(b) and all(
        x.rid == y.rid and np.array_equal(x.input_ids, y.input_ids)
        and np.array_equal(x.output_ids, y.output_ids) and x.output_len == y.output_len
        and x.arrival == y.arrival and x.session == y.session and x.turn == y.turn
        for x, y in zip(a, b))


# --------------------------------------------------------------------------
# all four
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", GENERATORS)
def test_same_seed_same_requests_other_seed_others(name):
    gen, kw = GENERATORS[name]
    a, b, c = gen(**kw, seed=5), gen(**kw, seed=5), gen(**kw, seed=6)
    assert _same(a, b)
    assert not _same(a, c)
    assert sum(len(r.input_ids) for r in a) != sum(len(r.input_ids) for r in c)


@pytest.mark.parametrize("name", GENERATORS)
def test_requests_pass_the_simulators_checks_in_arrival_order(name):
    gen, kw = GENERATORS[name]
    reqs = gen(**kw, seed=1)
    check_requests(reqs)
    arrivals = [r.arrival for r in reqs]
    assert arrivals == sorted(arrivals)
    for r in reqs:
        assert r.output_ids is not None and len(r.output_ids) == r.output_len
        assert r.input_ids.dtype == np.int32


@pytest.mark.parametrize("name", GENERATORS)
def test_defaults_are_fixed_by_the_seed(name):
    gen, _ = GENERATORS[name]
    a = gen()
    assert _same(a, gen())
    stats = wl.workload_stats(a)
    # every default request fits the default KV pool on its own
    check = request_checker([SimConfig()])
    for r in a:
        check(r.rid, len(r.input_ids), r.output_len)
    if name == "agent":       # the default size: 48 tasks, about 700 requests
        assert stats["sessions"] == 48 and 550 <= stats["requests"] <= 850


@pytest.mark.parametrize("name", GENERATORS)
def test_a_request_beyond_the_kv_pool_is_refused_by_rid_before_tokens(name, monkeypatch):
    gen, kw = GENERATORS[name]
    made = []
    monkeypatch.setattr(wl, "_random_tokens", lambda *a: made.append(a))
    with pytest.raises(ValueError, match=r"smaller than one request's need: (agent|rag|tn|ld)-"):
        gen(**kw, check_request=request_checker([SimConfig(kv_tokens=64)]))
    assert not made


@pytest.mark.parametrize("name", GENERATORS)
def test_a_workload_over_max_bytes_is_refused(name):
    gen, kw = GENERATORS[name]
    with pytest.raises(wl.WorkloadError, match=f"the {name} workload would take about"):
        gen(**kw, max_bytes=10_000)


@pytest.mark.parametrize("name", GENERATORS)
def test_replays_with_toy_states_restore_exact_states(name):
    """Every hit of a replay with toy states is checked against a state
    recomputed from scratch (the engine counts the mismatches)."""
    pytest.importorskip("torch")
    pytest.importorskip("mambaradix.sglang")
    from mambaradix.sim import run

    gen, kw = GENERATORS[name]
    reqs = gen(**kw, seed=7)
    m = run(reqs, SimConfig(states="toy", state_slots=20, kv_tokens=200_000, chunk_size=16,
                            track_interval=64))
    assert m.requests == len(reqs) and m.state_mismatches == 0
    assert m.state_hits > len({r.session for r in reqs}) // 2 and m.state_usable_tokens > 0


def test_a_huge_count_is_refused_before_planning():
    with pytest.raises(wl.WorkloadError, match="the agent workload would take"):
        wl.agent_sessions(num_tasks=10**12)
    with pytest.raises(wl.WorkloadError, match="the rag workload would take"):
        wl.rag_queries(num_docs=10**12, docs_per_query=1)
    with pytest.raises(wl.WorkloadError, match="the tenants workload would take"):
        wl.multi_tenant(num_sessions=10**12)
    with pytest.raises(wl.WorkloadError, match="the longdoc workload would take"):
        wl.long_document_qa(questions_per_doc=10**12)


@pytest.mark.parametrize("call, error, message", [
    (lambda: wl.agent_sessions(steps=(24, 6)), wl.WorkloadError, "steps must be a pair"),
    (lambda: wl.agent_sessions(steps=(0, 6)), wl.WorkloadError, r"steps\[0\] must be an integer >= 1"),
    (lambda: wl.agent_sessions(tool_len=(1, 2, 3)), wl.WorkloadError, "tool_len must be an integer or a pair"),
    (lambda: wl.agent_sessions(output_len=2.5), TypeError, "output_len must be an integer"),
    (lambda: wl.agent_sessions(backtrack_prob=1.5), wl.WorkloadError, "backtrack_prob"),
    (lambda: wl.agent_sessions(active=0), wl.WorkloadError, "active must be an integer >= 1"),
    (lambda: wl.agent_sessions(step_gap=float("nan")), wl.WorkloadError, "step_gap"),
    (lambda: wl.rag_queries(num_docs=3, docs_per_query=4), wl.WorkloadError,
     r"docs_per_query \(4\) must be at most num_docs \(3\)"),
    (lambda: wl.rag_queries(zipf_alpha=-1), wl.WorkloadError, "zipf_alpha"),
    (lambda: wl.rag_queries(query_rate=0), wl.WorkloadError, "query_rate"),
    (lambda: wl.multi_tenant(turns=(0, 3)), wl.WorkloadError, r"turns\[0\]"),
    (lambda: wl.multi_tenant(think_time=-1), wl.WorkloadError, "think_time"),
    (lambda: wl.multi_tenant(think_time=1e300), wl.WorkloadError, "think_time"),
    (lambda: wl.long_document_qa(max_turns=0), wl.WorkloadError, "max_turns"),
    (lambda: wl.long_document_qa(followup_prob=True), TypeError, "followup_prob"),
    (lambda: wl.long_document_qa(seed=-1), wl.WorkloadError, "seed"),
])
def test_bad_parameters_are_refused_by_name(call, error, message):
    with pytest.raises(error, match=message):
        call()


# --------------------------------------------------------------------------
# agent sessions
# --------------------------------------------------------------------------


def _agent_walk(reqs: list[SimRequest], system_len: int) -> dict:
    """Reconstruct every task's kept steps from the tokens alone: a request
    whose prompt extends the previous step's prompt and output is a plain
    step; otherwise it must extend a kept step further back (or the task's
    root: system prompt and description, found as the common prefix with the
    task's first prompt), and it backs up to there."""
    system = reqs[0].input_ids[:system_len]
    found = {"steps": 0, "eligible": 0, "backtracks": [], "early_backtracks": 0}
    for rs in _by_session(reqs).values():
        assert [r.turn for r in rs] == list(range(len(rs)))
        assert all(np.array_equal(r.input_ids[:system_len], system) for r in rs)
        kept = [rs[0]]
        for r in rs[1:]:
            found["steps"] += 1
            found["eligible"] += r.turn >= 3
            depth = next((i for i in range(len(kept) - 1, -1, -1)
                          if _starts_with(r.input_ids, _history(kept[i]))), None)
            if depth == len(kept) - 1:
                kept.append(r)
                continue
            # a backtrack: it must not share the latest step's history
            latest = _history(kept[-1])
            branch = _prefix(r.input_ids, latest)
            assert branch < len(latest)
            if depth is None:            # back to the root
                root = _prefix(r.input_ids, kept[0].input_ids)
                assert system_len < root < len(kept[0].input_ids)
                back = len(kept)
            else:
                assert branch == len(_history(kept[depth]))
                back = len(kept) - 1 - depth
            found["backtracks"].append(back)
            found["early_backtracks"] += r.turn < 3
            kept = kept[:len(kept) - back] + [r]
    return found


def test_agent_steps_extend_the_history_and_backtracks_reuse_an_earlier_step():
    reqs = wl.agent_sessions(seed=3)
    found = _agent_walk(reqs, 3000)
    backs = found["backtracks"]
    assert found["early_backtracks"] == 0           # only after the third step
    assert 1 <= min(backs) and max(backs) == 3      # 1 to 3 steps back, 3 reached
    assert collections.Counter(backs)[1] < len(backs)   # not always just the latest step
    assert 0.10 < len(backs) / found["eligible"] < 0.20   # about 15%


def test_agent_without_backtracking_only_extends():
    reqs = wl.agent_sessions(**GENERATORS["agent"][1], backtrack_prob=0.0, seed=2)
    found = _agent_walk(reqs, 300)
    assert found["backtracks"] == [] and found["steps"] > 0
    reqs = wl.agent_sessions(**GENERATORS["agent"][1], backtrack_prob=1.0, backtrack_after=2,
                             max_backtrack=1, seed=2)
    found = _agent_walk(reqs, 300)
    assert set(found["backtracks"]) == {1}
    assert len(found["backtracks"]) == sum(r.turn >= 2 for r in reqs)


def test_agent_tasks_share_the_system_prompt_only_and_lengths_keep_their_ranges():
    kw = GENERATORS["agent"][1]
    reqs = wl.agent_sessions(**kw, seed=4)
    firsts = {rs[0].session: rs[0] for rs in _by_session(reqs).values()}
    assert len(firsts) == 10
    roots = list(firsts.values())
    for a, b in zip(roots, roots[1:]):
        assert 300 <= _prefix(a.input_ids, b.input_ids) <= 302   # then the descriptions differ
    for r in roots:   # system + description (40-80) + tool result (10-60)
        assert 300 + 40 + 10 <= len(r.input_ids) <= 300 + 80 + 60
    assert {r.output_len for r in reqs} <= set(range(5, 31))
    steps = collections.Counter(r.session for r in reqs)
    assert set(steps.values()) <= set(range(4, 11))


def test_agent_tasks_run_about_active_at_once_and_interleave():
    reqs = wl.agent_sessions(seed=0)
    spans = {}
    for r in reqs:
        lo, hi = spans.get(r.session, (r.arrival, r.arrival))
        spans[r.session] = (min(lo, r.arrival), max(hi, r.arrival))
    events = sorted([(lo, 1) for lo, _ in spans.values()] + [(hi, -1) for _, hi in spans.values()],
                    key=lambda e: (e[0], e[1]))
    running, peak = 0, 0
    for _, d in events:
        running += d
        peak = max(peak, running)
    assert peak == 12
    # the arrival order interleaves tasks: consecutive requests mostly differ
    switches = sum(a.session != b.session for a, b in zip(reqs, reqs[1:]))
    assert switches > 0.8 * (len(reqs) - 1)
    # a task's steps come 10 s apart on average (Gamma, shape 4: sd 5 s)
    gaps = [b.arrival - a.arrival for rs in _by_session(reqs).values() for a, b in zip(rs, rs[1:])]
    assert 9.0 < np.mean(gaps) < 11.0 and 4.0 < np.std(gaps) < 6.0
    # the tasks start in order, each when a running one is done
    starts = sorted(spans, key=lambda s: spans[s][0])
    assert starts == [f"task{t}" for t in range(48)]


# --------------------------------------------------------------------------
# RAG
# --------------------------------------------------------------------------


def _rag_docs(reqs: list[SimRequest], prefix: int, doc_len: int, k: int) -> list[list[bytes]]:
    """The documents of every first turn (fixed-length documents cut by position)."""
    out = []
    for r in reqs:
        if r.turn == 0:
            body = r.input_ids[prefix:prefix + k * doc_len]
            out.append([body[i * doc_len:(i + 1) * doc_len].tobytes() for i in range(k)])
    return out


def test_rag_queries_hold_distinct_zipf_documents_in_shuffled_order():
    kw = dict(num_docs=40, doc_len=30, docs_per_query=4, num_queries=600, instruction_len=25,
              question_len=(5, 10), output_len=5)
    reqs = wl.rag_queries(**kw, seed=1)
    instruction = reqs[0].input_ids[:25]
    assert all(np.array_equal(r.input_ids[:25], instruction) for r in reqs)
    docs = _rag_docs(reqs, 25, 30, 4)
    assert len(docs) == 600
    assert all(len(set(d)) == 4 for d in docs)                 # distinct documents
    counts = collections.Counter(d for q in docs for d in q)
    assert len(counts) <= 40
    ranked = [n for _, n in counts.most_common()]
    # Zipf(1) over 40 documents, 4 drawn without replacement: the hottest is in
    # nearly every query, the median one in about a tenth of them
    assert ranked[0] > 0.6 * 600 and ranked[0] > 4 * ranked[len(ranked) // 2]
    # shuffled: the hottest document stands at every position, none most of the
    # time, and the documents at each position are equally popular on average
    # (drawn by popularity without a shuffle, the first would be the hottest)
    hot = counts.most_common(1)[0][0]
    where = collections.Counter(q.index(hot) for q in docs if hot in q)
    assert set(where) == {0, 1, 2, 3} and max(where.values()) < 0.4 * sum(where.values())
    popularity = [np.mean([counts[q[i]] for q in docs]) for i in range(4)]
    assert max(popularity) < 1.1 * min(popularity)
    # alpha 0: uniform popularity
    flat = collections.Counter(d for q in _rag_docs(wl.rag_queries(**kw, zipf_alpha=0.0, seed=1),
                                                     25, 30, 4) for d in q)
    assert len(flat) == 40 and max(flat.values()) < 2 * min(flat.values())


def test_rag_follow_ups_extend_their_query_after_a_think_time():
    reqs = wl.rag_queries(**GENERATORS["rag"][1], followup_prob=0.5, max_turns=3,
                          think_time=7.0, seed=2)
    sessions = _by_session(reqs)
    turns = collections.Counter(len(rs) for rs in sessions.values())
    # a follow-up with probability 1/2 after each turn, at most 3 turns: 1/2, 1/4, 1/4
    assert set(turns) == {1, 2, 3} and 20 <= turns[1] <= 40 and 6 <= turns[3] <= 24
    gaps = []
    for rs in sessions.values():
        for a, b in zip(rs, rs[1:]):
            assert _starts_with(b.input_ids, _history(a))
            assert 5 <= len(b.input_ids) - len(_history(a)) <= 15
            gaps.append(b.arrival - a.arrival)
    assert 5.0 < np.mean(gaps) < 9.0


# --------------------------------------------------------------------------
# tenants
# --------------------------------------------------------------------------


def _tenant_of(reqs: list[SimRequest]) -> dict[str, int]:
    """Each session's tenant, numbered by the tenants' system prompts as
    first seen (found as prefixes shared across sessions)."""
    prompts: list[np.ndarray] = []
    out = {}
    for rs in _by_session(reqs).values():
        first = rs[0].input_ids
        match = [i for i, p in enumerate(prompts) if _starts_with(first, p)]
        if not match:
            # the system prompt is the longest prefix shared with another session
            best = max(_prefix(first, o[0].input_ids) for o in _by_session(reqs).values()
                       if o[0] is not rs[0])
            prompts.append(first[:best])
            match = [len(prompts) - 1]
        out[rs[0].session] = match[0]
    return out


def test_tenants_share_their_system_prompt_with_zipf_traffic():
    kw = dict(num_tenants=6, num_sessions=900, system_prompt_len=100, turns=1,
              message_len=(5, 10), output_len=5)
    reqs = wl.multi_tenant(**kw, seed=3)
    # rid names the tenant: check it against the prompts themselves
    tenant = _tenant_of(reqs)
    rid_tenant = {r.session: int(r.rid.split("-")[1]) for r in reqs}
    pairs = {(tenant[s], rid_tenant[s]) for s in tenant}
    assert len(pairs) == 6 and len({a for a, _ in pairs}) == 6   # a bijection
    counts = collections.Counter(rid_tenant.values())
    expected = 900 / np.arange(1, 7) / sum(1 / np.arange(1, 7))
    for t in range(6):
        assert abs(counts[t] - expected[t]) < 4 * np.sqrt(expected[t]) + 5
    assert counts[0] > 4 * counts[5]
    flat = collections.Counter(int(r.rid.split("-")[1]) for r in
                               wl.multi_tenant(**kw, zipf_alpha=0.0, seed=3))
    assert max(flat.values()) < 1.5 * min(flat.values())


def test_tenant_turns_interleave_with_think_times():
    reqs = wl.multi_tenant(num_sessions=200, turns=(2, 6), think_time=20.0, session_rate=2.0,
                           seed=4)
    position = {r.rid: i for i, r in enumerate(reqs)}
    between, gaps = [], []
    for rs in _by_session(reqs).values():
        assert 2 <= len(rs) <= 6
        for a, b in zip(rs, rs[1:]):
            assert _starts_with(b.input_ids, _history(a))
            between.append(position[b.rid] - position[a.rid] - 1)
            gaps.append(b.arrival - a.arrival)
    # other sessions' turns come between a session's turns
    assert np.mean(np.array(between) > 0) > 0.95 and np.median(between) > 10
    # the gaps are think times of mean 20 s (Gamma, shape 2: sd 14 s)
    assert 18.0 < np.mean(gaps) < 22.0 and 11.0 < np.std(gaps) < 17.0


# --------------------------------------------------------------------------
# long documents
# --------------------------------------------------------------------------


def test_longdoc_each_document_gets_its_questions_spread_over_time():
    reqs = wl.long_document_qa(num_docs=4, doc_len=(3000, 6000), questions_per_doc=5,
                               system_prompt_len=64, question_len=(10, 30), output_len=(5, 10),
                               followup_prob=0.5, seed=5)
    firsts = [r for r in reqs if r.turn == 0]
    assert len(firsts) == 20
    system = firsts[0].input_ids[:64]
    # documents: the longest prefix a first question shares with another, past the system prompt
    docs: list[np.ndarray] = []
    asked = []
    for r in firsts:
        assert np.array_equal(r.input_ids[:64], system)
        idx = next((i for i, d in enumerate(docs) if _starts_with(r.input_ids, d)), None)
        if idx is None:
            shared = max(_prefix(r.input_ids, o.input_ids) for o in firsts if o is not r)
            assert 64 + 3000 <= shared <= 64 + 6000 + 2
            docs.append(r.input_ids[:shared])
            idx = len(docs) - 1
        assert 10 <= len(r.input_ids) - len(docs[idx]) <= 30
        asked.append(idx)
    assert sorted(collections.Counter(asked).values()) == [5, 5, 5, 5]
    # spread: the questions about one document are not asked back to back
    assert sum(a == b for a, b in zip(asked, asked[1:])) < 10
    for rs in _by_session(reqs).values():
        for a, b in zip(rs, rs[1:]):
            assert _starts_with(b.input_ids, _history(a)) and b.arrival > a.arrival


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--workload", "agent", "--agent-steps", "24-6"], "argument --agent-steps: expected LO <= HI"),
    (["--workload", "agent", "--agent-tool-len", "0-5"],
     "argument --agent-tool-len: expected N or LO-HI (integers >= 1)"),
    (["--workload", "agent", "--agent-tool-len", "5-6-7"], "argument --agent-tool-len"),
    (["--workload", "agent", "--agent-backtrack", "1.5"], "argument --agent-backtrack"),
    (["--workload", "agent", "--agent-step-gap", "-1"], "argument --agent-step-gap"),
    (["--workload", "agent", "--agent-step-gap", "1e10"], "argument --agent-step-gap: expected a "
                                                         "finite number >= 0 and <= 1e+09"),
    (["--workload", "rag", "--rag-k", "7", "--rag-docs", "5"],
     "--rag-k 7 is more than --rag-docs 5"),
    (["--workload", "rag", "--rag-rate", "0"], "argument --rag-rate"),
    (["--workload", "rag", "--rag-zipf-alpha", "nan"], "argument --rag-zipf-alpha"),
    (["--workload", "tenants", "--tenant-turns", "0-3"], "argument --tenant-turns"),
    (["--workload", "tenants", "--tenant-think", "inf"], "argument --tenant-think"),
    (["--workload", "longdoc", "--longdoc-max-turns", "0"], "argument --longdoc-max-turns"),
    (["--workload", "tenants", "--rag-docs", "5"], "--rag-docs applies to --workload rag, not tenants"),
    (["--workload", "agentic", "--agent-tasks", "5"],
     "--agent-tasks applies to --workload agent, not agentic"),
    (["--workload", "agent", "--agent-trees", "5"],
     "--agent-trees applies to --workload agentic, not agent"),
    (["--agent-tasks", "5"], "--agent-tasks applies to --workload agent, not multiturn"),
    (["--workload", "rag", "--request-rate", "4"],
     "--request-rate applies to multiturn, gsp and agentic: --workload rag times its own arrivals "
     "(--rag-rate and --rag-think)"),
    (["--workload", "longdoc", "--range-ratio", "0.5"],
     "--range-ratio applies to multiturn, gsp and agentic: --workload longdoc takes its lengths"),
    (["--workload", "longdoc", "--longdoc-len", "2000000", "--kv-tokens", "1000000"],
     "smaller than one request's need: ld-"),
])
def test_bad_flags_are_refused_naming_the_flag(capsys, no_replay, argv, message):
    code, out, err = main(capsys, *argv, "--no-progress")
    assert code == 2, (out, err)
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["--workload", "agent", "--agent-tasks", "6", "--agent-active", "3", "--agent-steps", "5-8",
     "--agent-prefix-len", "200", "--agent-desc-len", "50", "--agent-tool-len", "20-80",
     "--agent-reply-len", "10-20", "--agent-backtrack", "0.3", "--agent-backtrack-after", "2",
     "--agent-backtrack-max", "2", "--agent-step-gap", "3"],
    ["--workload", "rag", "--rag-docs", "20", "--rag-doc-len", "50-100", "--rag-k", "3",
     "--rag-queries", "30", "--rag-prefix-len", "40", "--rag-question-len", "10",
     "--rag-output-len", "5-10", "--rag-zipf-alpha", "1.2", "--rag-followup", "0.5",
     "--rag-max-turns", "2", "--rag-rate", "4", "--rag-think", "5"],
    ["--workload", "tenants", "--tenants", "4", "--tenant-sessions", "30", "--tenant-prompt-len",
     "100-300", "--tenant-turns", "1-4", "--tenant-msg-len", "10-40", "--tenant-output-len", "8",
     "--tenant-zipf-alpha", "0.8", "--tenant-rate", "3", "--tenant-think", "4"],
    ["--workload", "longdoc", "--longdoc-docs", "2", "--longdoc-len", "1000-3000",
     "--longdoc-questions", "4", "--longdoc-prefix-len", "30", "--longdoc-question-len", "10-20",
     "--longdoc-output-len", "5-15", "--longdoc-followup", "0.5", "--longdoc-max-turns", "2",
     "--longdoc-rate", "1", "--longdoc-think", "5"],
])
def test_each_workload_runs_from_its_flags_as_the_api_builds_it(capsys, argv):
    code, out, err = main(capsys, *argv, "--json", "--seed", "3", "--state-slots", "40")
    assert code == 0, err
    doc = json.loads(out)
    args = cli.build_parser().parse_args(argv + ["--seed", "3"])
    reqs, _ = cli._build_workload(args, None)
    stats = wl.workload_stats(reqs)
    assert doc["workload"]["requests"] == stats["requests"] == doc["metrics"]["requests"]
    assert doc["workload"]["prompt_tokens"] == stats["prompt_tokens"]
    assert 0.0 < doc["metrics"]["token_hit_rate"] < 1.0


@pytest.mark.parametrize("name", GENERATORS)
def test_sglang_replay_takes_the_same_workload_options(name):
    """python -m mambaradix sglang-replay builds the simulator's workloads from
    the same options (its parser copies the simulator's workload groups)."""
    from mambaradix.sglang_replay import cli as replay_cli

    argv = ["--workload", name, "--seed", "2"]
    reqs, desc = replay_cli.build_workload(replay_cli.build_parser().parse_args(argv))
    ours, ours_desc = cli._build_workload(cli.build_parser().parse_args(argv), None)
    assert desc == ours_desc and len(reqs) == len(ours)
    assert all(a.rid == b.rid and np.array_equal(a.input_ids, b.input_ids) for a, b in zip(reqs, ours))
