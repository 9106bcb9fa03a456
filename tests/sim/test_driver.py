"""The reference driver and the toy recurrent model.

Expected numbers come from the design document's worked example (see
shared/seed/NOTES.md) and from hand-derived track points; states are checked
against the toy model's token-by-token recomputation from scratch."""

from __future__ import annotations

import numpy as np
import pytest

from mambaradix.driver import (DriverConfig, DriverRequest, SchedulerDriver, chunk_continuation,
                               decode_track_due, match_key_limit, prefill_track_point,
                               state_headroom)
from mambaradix.toy_model import P, ToyRecurrentModel
from seeds import seeds

SEED = seeds(1)[0]

torch = pytest.importorskip("torch")
sg = pytest.importorskip("mambaradix.sglang")

from mambaradix.driver import build_dropin  # noqa: E402


# ---------------------------------------------------------------- toy model
def test_toy_vectorised_matches_token_by_token_reference():
    rng = np.random.default_rng(SEED)
    model = ToyRecurrentModel(num_layers=3, state_dim=5, conv_width=4,
                              seed=int(rng.integers(1 << 30)))
    toks = rng.integers(0, 1 << 31, size=int(rng.integers(200, 600)))
    conv = np.zeros((3, 6, 3), np.int64)
    temporal = np.zeros((3, 6, 5), np.int64)
    model.bind(conv, temporal)
    # random segmentation with random snapshot points inside each segment
    cuts = sorted(set(rng.integers(1, len(toks), size=4).tolist())) + [len(toks)]
    start, snaps = 0, []
    for k, end in enumerate(cuts):
        rel = int(rng.integers(0, end - start + 1))
        model.advance(1, toks[start:end], [(rel, 2 + (k % 4))])
        snaps.append((2 + (k % 4), start + rel))
        start = end
    assert model.read_state(1).equals(model.reference_state(toks))
    last = {}
    for slot, pos in snaps:
        last[slot] = pos
    for slot, pos in last.items():
        assert model.read_state(slot).equals(model.reference_state(toks[:pos]))


def test_toy_state_depends_on_every_token_and_stays_in_field():
    rng = np.random.default_rng(SEED)
    model = ToyRecurrentModel(seed=int(rng.integers(1 << 30)))
    toks = rng.integers(0, 1000, size=100)
    a = model.reference_state(toks)
    changed = toks.copy()
    changed[int(rng.integers(0, 100))] += 1
    b = model.reference_state(changed)
    assert not a.equals(b)
    assert (a.temporal >= 0).all() and (a.temporal < P).all()


def test_toy_bind_rejects_bad_tensors():
    model = ToyRecurrentModel(num_layers=2, state_dim=4, conv_width=4)
    with pytest.raises(ValueError, match="conv"):
        model.bind(np.zeros((2, 5, 2), np.int64), np.zeros((2, 5, 4), np.int64))
    with pytest.raises(ValueError, match="int64 or float64"):
        model.bind(np.zeros((2, 5, 3), np.float32), np.zeros((2, 5, 4), np.int64))
    with pytest.raises(ValueError, match="state_dim"):
        ToyRecurrentModel(state_dim=0)


# ---------------------------------------------------------------- decisions
def test_decision_functions_hand_values():
    assert match_key_limit(512, True) == 511
    assert match_key_limit(512, False) == 512
    assert match_key_limit(0, True) == 0
    # prefill track points (C = 64)
    assert prefill_track_point(0, 512, 64, None) == 512
    assert prefill_track_point(0, 63, 64, None) is None
    assert prefill_track_point(0, 300, 64, None) == 256
    assert prefill_track_point(0, 512, 64, 256) == 256      # branching point inside
    assert prefill_track_point(0, 511, 64, 448) == 448
    assert prefill_track_point(100, 100, 64, None) == 164  # chunk-relative grid
    assert prefill_track_point(100, 200, 64, 228) == 228   # (228 - 100) % 64 == 0
    assert prefill_track_point(100, 200, 64, 256) == 292   # B not on the chunk's grid
    assert prefill_track_point(0, 512, 64, 512) == 512     # B == end: not "inside"
    assert decode_track_due(512, 256) and not decode_track_due(513, 256)
    assert state_headroom(10, 3, lazy=False) == 0
    assert state_headroom(5, 3, lazy=False) == 4
    assert state_headroom(5, 3, lazy=True) == 1
    with pytest.raises(ValueError, match="mode"):
        DriverConfig(mode="pp3")
    with pytest.raises(ValueError, match="page_size"):
        DriverConfig(mode="no_buffer", page_size=2)
    with pytest.raises(ValueError, match="output_len"):
        DriverRequest("x", [1, 2], 0)


# ---------------------------------------------------------------- helpers
def _setup(mode, cap=True, slots=64, kv=20000, ctx=4096, **kw):
    cfg = DriverConfig(mode=mode, match_cap=cap, **kw)
    model = ToyRecurrentModel(seed=int(np.random.default_rng(SEED).integers(1 << 30)))
    di = build_dropin(cfg, kv_tokens=kv, state_slots=slots, max_context_len=ctx, model=model)
    checked = []

    def on_extend(rid, slot, prefix, kind):
        assert model.read_state(slot).equals(model.reference_state(prefix)), (rid, kind)
        checked.append((rid, len(prefix), kind))

    d = SchedulerDriver(cfg, di.tree_cache, di.req_to_token_pool, di.allocator, api=di.api,
                        model=model, on_extend=on_extend)
    return d, checked


def _worked_example():
    def run(x):
        return [x] * 256
    return [run(1) + run(2), run(1) + run(3), run(1) + run(4), run(1) + run(2) + run(5),
            run(1) + run(4) + run(5), run(1) + run(3) + run(5), run(1) + run(3),
            run(1) + run(3)]


def _run_one_at_a_time(d, prompts, output_len=1):
    for i, p in enumerate(prompts):
        d.submit(DriverRequest(f"r{i}", p, output_len))
        d.run()
    return [d.records[f"r{i}"].prefix_len for i in range(len(prompts))]


# ---------------------------------------------------------------- worked example
@pytest.mark.parametrize("mode", ["pp2", "pp1", "lazy"])
def test_worked_example_extra_buffer(mode):
    """The document's 8 requests, one after the other, output 1 token, C = 64.

    With SGLang's ``input_len - 1`` match cap: ``0 0 256 512 512 256 256 448``.
    The document's table says 512 for R8; that needs the match to cover the
    whole prompt.  With the cap, R7's key is 511 tokens: it splits R6's node at
    511, the branching point is 511 // 64 * 64 = 448, R7 stores the state at
    448, and R8 (identical to R7) matches at most 511 tokens, so the deepest
    state on its path is R7's at 448.  Without the cap (second run) R7 stores
    512 and R8 hits 512: the document's table.
    """
    d, checked = _setup(mode, cap=True)
    assert _run_one_at_a_time(d, _worked_example()) == [0, 0, 256, 512, 512, 256, 256, 448]
    hits = [c for c in checked if c[2] == "hit"]
    assert [n for _, n, _ in hits] == [256, 512, 512, 256, 256, 448]
    d, checked = _setup(mode, cap=False)
    assert _run_one_at_a_time(d, _worked_example()) == [0, 0, 256, 512, 512, 256, 256, 512]
    assert sum(1 for c in checked if c[2] == "hit") == 6


def test_worked_example_no_buffer():
    """no_buffer caches the running state at the end of every request only:
    R2's match splits R1's edge at 256 and the split node has no state, and
    identical prompts (R7, R8) end mid-node because of the cap, so they never
    hit: ``0 0 0 512 512 512 0 0``."""
    d, checked = _setup("no_buffer", cap=True)
    assert _run_one_at_a_time(d, _worked_example()) == [0, 0, 0, 512, 512, 512, 0, 0]
    assert [n for _, n, k in checked if k == "hit"] == [512, 512, 512]


# ---------------------------------------------------------------- chunked prefill
@pytest.mark.parametrize("mode", ["pp2", "pp1", "lazy"])
def test_chunked_prefill_tracks_per_chunk_grid(mode):
    """Chunks of 100 tokens snapshot at 64, 164 and 264 (the grid restarts at
    each chunk's start).  Later requests sharing 300, 200 and 120 tokens of that
    prompt then hit 264, 164 and 64."""
    rng = np.random.default_rng(SEED)
    base = rng.integers(1, 50000, size=300).tolist()
    d, checked = _setup(mode, chunked_prefill_size=100)
    d.submit(DriverRequest("a", base, 1))
    d.run()
    assert d.records["a"].chunks == 3
    tails = [rng.integers(50001, 60000, size=40).tolist() for _ in range(3)]
    prompts = [base + tails[0], base[:200] + tails[1], base[:120] + tails[2]]
    got = []
    for i, p in enumerate(prompts):
        d.submit(DriverRequest(f"b{i}", p, 1))
        d.run()
        got.append(d.records[f"b{i}"].prefix_len)
    assert got == [264, 164, 64]


# ---------------------------------------------------------------- paged KV
def test_chunk_continuation_cuts_on_pages():
    assert chunk_continuation(0, 300, 100, 1) == (100, True)
    assert chunk_continuation(96, 300, 100, 16) == (96, True)     # 196 -> 192
    assert chunk_continuation(96, 50, 100, 16) == (50, False)     # the last chunk
    assert chunk_continuation(96, 300, 10, 16) == (16, True)      # up to the next page
    assert chunk_continuation(96, 8, 10, 16) == (8, False)


@pytest.mark.parametrize("mode", ["pp2", "pp1", "lazy"])
def test_paged_kv_layout_and_accounting(mode):
    """Page size 4: every request's KV sits page by page as SGLang's paged
    allocator lays it out (position p at offset p % 4 of the page of its
    page-start position), the pool moves in whole pages, and a request holds
    the pages of its tokens past the tree's prefix: free == size - tree tokens
    - (ceil(committed / 4) * 4 - protected) per request.  A follow-up turn
    then hits the prefill snapshot at 64."""
    page, size = 4, 400
    d, checked = _setup(mode, chunk_size=16, track_interval=16, page_size=page, kv=size)
    seen = []

    def on_step(drv):
        held = 0
        for req in drv.live_requests():
            if req.req_pool_idx is None or not req.kv_committed_len:
                continue
            n = req.kv_committed_len
            row = drv.req_to_token_pool.req_to_token[req.req_pool_idx, :n].tolist()
            for p in range(n):
                start = row[p - p % page]
                assert start % page == 0 and row[p] == start + p % page, (req.rid, p, row)
            held += -(-n // page) * page - req.cache_protected_len
            seen.append(-(-n // page) * page)
        tree = drv.tree_cache.total_size()[0]
        free = drv.allocator.available_size()
        assert free % page == 0 and free == size - tree - held, (free, tree, held)

    d.on_step = on_step
    rng = np.random.default_rng()
    prompt = rng.integers(1, 50000, size=70).tolist()
    d.submit(DriverRequest("a", prompt, 9))
    d.run()
    assert max(seen) == 80    # 79 tokens (80 with an overlap step) in 20 pages
    assert d.tree_cache.total_size()[0] == 64
    assert d.allocator.available_size() == size - 64
    d.submit(DriverRequest("b", prompt[:66] + [7, 8, 9], 5))
    d.run()
    assert d.records["b"].prefix_len == 64
    assert [k for r, _, k in checked if r == "b"] == ["hit"]


@pytest.mark.parametrize("mode", ["pp2", "pp1", "lazy"])
def test_paged_chunked_prefill_snapshots_stay_on_the_page_grid(mode):
    """Page 16, C = 64, chunks of 100 tokens: the first cut is 96 (a page
    multiple), later cuts end on pages too (96 + 100 -> 192), so the chunk
    snapshots sit at 64, 160, 256 and 352, and follow-ups sharing 380, 300 and
    200 tokens hit those."""
    rng = np.random.default_rng()
    base = rng.integers(1, 50000, size=400).tolist()
    d, checked = _setup(mode, chunk_size=64, track_interval=64, page_size=16,
                        chunked_prefill_size=100)
    d.submit(DriverRequest("a", base, 1))
    d.run()
    assert d.records["a"].chunks == 5
    got = []
    for i, n in enumerate([380, 300, 200]):
        d.submit(DriverRequest(f"b{i}", base[:n] + rng.integers(50001, 60000, size=30).tolist(),
                               1))
        d.run()
        got.append(d.records[f"b{i}"].prefix_len)
    assert got == [352, 256, 160]


def test_driver_refuses_an_allocator_of_another_page_size():
    cfg = DriverConfig(mode="pp2", page_size=16)
    di = build_dropin(DriverConfig(mode="pp2"), kv_tokens=1000, state_slots=16,
                      max_context_len=256)
    with pytest.raises(ValueError, match="page_size 1 but config.page_size is 16"):
        SchedulerDriver(cfg, di.tree_cache, di.req_to_token_pool, di.allocator, api=di.api)


@pytest.mark.parametrize("mode, page", [("pp2", 1), ("pp1", 4), ("lazy", 4), ("no_buffer", 1)])
@pytest.mark.parametrize("tight", ["kv", "row"])
def test_a_request_filling_a_pool_runs_and_one_token_more_is_refused(mode, page, tight):
    """Prompt 29 + output 6 with exactly the KV that admission needs (29 + 6 +
    a page + 1: SGLang's PrefillAdder wants the tokens, the reserved outputs
    and a page below the free KV), or exactly the row positions it writes (35
    under the overlap scheduler, which decodes one step past the last output;
    34 without): it runs with the right states and a follow-up resumes from
    its prefill snapshot (3 * 8; no_buffer keeps none there).  One prompt
    token more is refused at submit."""
    P, O = 29, 6
    overlap = mode in ("pp2", "lazy")
    kv = P + O + page + 1 if tight == "kv" else 1000
    ctx = P + O - (0 if overlap else 1) if tight == "row" else 1000
    d, checked = _setup(mode, kv=kv, ctx=ctx, page_size=page, chunk_size=8, track_interval=8)
    prompt = np.random.default_rng(SEED).integers(1, 50000, size=P + 1).tolist()
    with pytest.raises(ValueError, match="request 'over' can never run"):
        d.submit(DriverRequest("over", prompt, O))
    d.submit(DriverRequest("a", prompt[:P], O))
    d.run()
    d.submit(DriverRequest("b", prompt[:26] + [7, 8, 9], O))
    d.run()
    assert [len(d.records[r].output) for r in "ab"] == [O, O]
    assert d.records["b"].prefix_len == (0 if mode == "no_buffer" else 24)
    assert {r for r, _, _ in checked} == {"a", "b"}
    d.tree_cache.sanity_check()


# ---------------------------------------------------------------- multi-turn
@pytest.mark.parametrize("mode", ["pp2", "pp1", "lazy"])
def test_follow_up_turn_hits_last_snapshot(mode):
    """Turn 1: 300-token prompt, 10 output tokens.  The prefill snapshots 256;
    the end-of-prefill caching stores it and clears the tracked length; the
    decode (301..310) crosses no multiple of 256, so finishing caches nothing
    new.  Turn 2 (turn 1 + its output + 50 tokens) hits 256 only.
    Turn 1 of a second conversation: 250-token prompt, 20 outputs: the decode
    reaches 256 (a track boundary), so its follow-up hits 256 as well, the
    decode snapshot."""
    rng = np.random.default_rng(SEED)
    d, checked = _setup(mode, track_interval=256)
    p1 = rng.integers(1, 50000, size=300).tolist()
    d.submit(DriverRequest("t1", p1, 10))
    d.run()
    out1 = d.records["t1"].output
    assert len(out1) == 10
    d.submit(DriverRequest("t2", p1 + out1 + rng.integers(1, 50000, size=50).tolist(), 1))
    d.run()
    assert d.records["t2"].prefix_len == 256
    q1 = rng.integers(60000, 90000, size=250).tolist()
    d.submit(DriverRequest("u1", q1, 20))
    d.run()
    out = d.records["u1"].output
    d.submit(DriverRequest("u2", q1 + out + [7, 8, 9], 1))
    d.run()
    assert d.records["u2"].prefix_len == 256
    assert ("u2", 256, "hit") in checked


def test_no_buffer_follow_up_hits_whole_committed_turn():
    """no_buffer caches the running state at finish: turn 1 (prompt 300, 10
    outputs) commits 300 + 9 KV tokens (the last output was never fed back), so
    the follow-up hits 309."""
    rng = np.random.default_rng(SEED)
    d, checked = _setup("no_buffer")
    p1 = rng.integers(1, 50000, size=300).tolist()
    d.submit(DriverRequest("t1", p1, 10))
    d.run()
    out1 = d.records["t1"].output
    d.submit(DriverRequest("t2", p1 + out1 + [5, 6, 7], 1))
    d.run()
    assert d.records["t2"].prefix_len == 309


# ---------------------------------------------------------------- oracle: SGLang's classes
def _sglang():
    """SGLang's own classes from the wheel (tests/dropin/sglang_isolated.py), or skip
    naming the cause."""
    import sglang_isolated

    try:
        return sglang_isolated.load()
    except ImportError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("mode", ["pp2", "pp1", "no_buffer"])
def test_oracle_sglang_classes_give_same_prefixes(mode):
    """The same driver over SGLang's own MambaRadixCache, HybridReqToTokenPool,
    TokenToKVPoolAllocator and Req gives the same prefixes as over
    mambaradix.sglang on the worked example and a random shared-prefix
    workload."""
    import types
    from array import array

    import sglang_isolated

    sgc = _sglang()
    cfg = DriverConfig(mode=mode)
    sglang_isolated.configure(sgc, chunk_size=64, track_interval=256,
                              strategy="extra_buffer" if cfg.extra_buffer else "no_buffer",
                              overlap=cfg.overlap)
    with sgc.active():
        shape = sgc.Mamba2StateShape.create(tp_world_size=1, intermediate_size=64, n_groups=1,
                                            num_heads=1, head_dim=4, state_size=4, conv_kernel=4)
        params = sgc.Mamba2CacheParams(shape=shape, layers=[0])
        pool = sgc.HybridReqToTokenPool(size=70, mamba_size=64, mamba_spec_state_size=0,
                                        max_context_len=2048, device="cpu",
                                        enable_memory_saver=False, cache_params=params,
                                        mamba_layer_ids=[0],
                                        enable_mamba_extra_buffer=cfg.extra_buffer,
                                        enable_overlap_schedule=cfg.overlap)
        alloc = sgc.TokenToKVPoolAllocator(size=20000, dtype=torch.bfloat16, device="cpu",
                                           kvcache=None, need_sort=False)
        cache = sgc.MambaRadixCache(sgc.CacheInitParams(
            disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=1,
            enable_mamba_extra_buffer=cfg.extra_buffer))
        assert type(cache).__module__ == "sglang.srt.mem_cache.mamba_radix_cache"

        def make_req(rid, ids, max_new, extra_key):
            return sgc.Req(rid=rid, origin_input_text="", origin_input_ids=array("q", ids),
                           sampling_params=sgc.SamplingParams(max_new_tokens=max_new, temperature=0))

        api = types.SimpleNamespace(RadixKey=sgc.RadixKey, MatchPrefixParams=sgc.MatchPrefixParams,
                                    EvictParams=sgc.EvictParams, Req=sgc.Req,
                                    SamplingParams=sgc.SamplingParams, make_req=make_req)
        theirs = SchedulerDriver(cfg, cache, pool, alloc, api=api)
        ours, _ = _setup(mode)
        rng = np.random.default_rng(SEED)
        prompts = _worked_example()
        stems = [rng.integers(1, 9999, size=int(rng.integers(60, 400))).tolist() for _ in range(4)]
        for _ in range(12):
            s = stems[int(rng.integers(4))]
            prompts.append(s[:int(rng.integers(1, len(s)))]
                           + rng.integers(1, 9999, size=int(rng.integers(1, 200))).tolist())
        got = _run_one_at_a_time(theirs, prompts, 3)
        assert got == _run_one_at_a_time(ours, prompts, 3)
        assert any(p > 0 for p in got)


# ---------------------------------------------------------------- the lazy-mode race
def test_lazy_overlap_caches_the_next_decode_snapshot_as_prefill_state():
    """SGLang v0.5.15's ``extra_buffer_lazy`` with the overlap scheduler has a
    window where the tree receives a state from the wrong position, and the
    driver reproduces it (pp2 does not have it).

    C = 16, interval 32, prompt of 31 tokens: the prefill snapshots the state
    at 16 into ``track[next]`` (lazy never flips at prefill).  Under overlap
    the first decode batch (seq_len 32, a track boundary) is prepared before
    the prefill's result is processed: the lazy pre-allocation puts a second
    slot in ``track[1]`` and flips ``next`` to it, and the decode writes the
    state at 32 there.  Then the prefill's ``cache_unfinished_req`` donates
    ``track[keep]`` with ``keep = next`` (lazy), i.e. the slot with the state
    at 32, for the 16-token key.  A later request sharing those 16 tokens
    restores the 32-token state."""
    rng = np.random.default_rng(SEED)
    prompt = rng.integers(1, 5000, size=31).tolist()
    other = prompt[:16] + rng.integers(5001, 9000, size=20).tolist()
    restored = {}
    for mode in ("lazy", "pp2"):
        cfg = DriverConfig(mode=mode, chunk_size=16, track_interval=32)
        model = ToyRecurrentModel(seed=int(rng.integers(1 << 30)))
        di = build_dropin(cfg, kv_tokens=4000, state_slots=32, max_context_len=256, model=model)
        got = {}

        def on_extend(rid, slot, prefix, kind, model=model, got=got):
            got[rid] = (len(prefix), model.read_state(slot))

        d = SchedulerDriver(cfg, di.tree_cache, di.req_to_token_pool, di.allocator,
                            api=di.api, model=model, on_extend=on_extend)
        d.submit(DriverRequest("a", prompt, 4))
        d.run()
        d.submit(DriverRequest("b", other, 1))
        d.run()
        assert d.records["b"].prefix_len == 16
        n, state = got["b"]
        assert n == 16
        out_a = d.records["a"].output
        restored[mode] = (state, model.reference_state(prompt[:16]),
                          model.reference_state(prompt + out_a[:1]))
    st, at16, at32 = restored["lazy"]
    assert st.equals(at32) and not st.equals(at16)
    st, at16, _ = restored["pp2"]
    assert st.equals(at16)


# ---------------------------------------------------------------- the double boundary
def test_overlap_decode_boundary_fires_twice_around_a_prefill_batch():
    """SGLang v0.5.15 decides a decode track boundary from ``kv_committed_len``
    when a decode result is processed.  Under the overlap scheduler the result
    of the batch *before* the boundary batch already sees the boundary length
    (the boundary batch was prepared first) and flips the ping-pong index; if
    the next scheduled batch is a prefill batch, the boundary batch's own result
    sees the same length again and flips it back, so ``keep`` names the stale
    slot.  C = 16, interval 32: A (20-token prompt, 40 outputs) reaches 32 in
    decode; B arrives just then and its prefill runs next.  A's finish caches
    its 32-token key with the stale slot; C, sharing A's first 32 tokens,
    restores a state that is not the state at 32.  With the "batch" check the
    same run restores the right state."""
    rng = np.random.default_rng(SEED)
    a = rng.integers(1, 5000, size=20).tolist()
    restored = {}
    for boundary in ("committed", "batch"):
        cfg = DriverConfig(mode="pp2", chunk_size=16, track_interval=32,
                           decode_boundary=boundary)
        model = ToyRecurrentModel(seed=int(rng.integers(1 << 30)))
        di = build_dropin(cfg, kv_tokens=4000, state_slots=32, max_context_len=256, model=model)
        got = {}

        def on_extend(rid, slot, prefix, kind, model=model, got=got):
            got[rid] = (len(prefix), model.read_state(slot))

        d = SchedulerDriver(cfg, di.tree_cache, di.req_to_token_pool, di.allocator,
                            api=di.api, model=model, on_extend=on_extend)
        d.submit(DriverRequest("a", a, 40))
        while d.infos["a"].req.kv_committed_len != 32:
            d.step()
        d.submit(DriverRequest("b", rng.integers(6000, 9000, size=20).tolist(), 1))
        d.run()
        full_a = a + d.records["a"].output
        d.submit(DriverRequest("c", full_a[:32] + [9999, 9998, 9997], 1))
        d.run()
        assert d.records["c"].prefix_len == 32
        restored[boundary] = (got["c"][1], model.reference_state(full_a[:32]))
    st, want = restored["committed"]
    assert not st.equals(want)
    st, want = restored["batch"]
    assert st.equals(want)
