"""Whole request lifecycles through mambaradix.sglang, driven the way
SGLang v0.5.15's scheduler drives its cache: match (input_len - 1 cap,
copy-on-write), admission, prefill tracking, cache_unfinished_req,
decode boundaries, cache_finished_req.

A stand-in "forward" writes into the state pool a fingerprint of exactly
the tokens a state has consumed (running slot after every step, track slot
at every snapshot), so every hit can be checked: the state a request copies
from the tree must be the fingerprint of the prefix it was given.  The
prefill snapshot is taken where the kernel's inputs (``track_seqlen``, the
mask) put it (tests/tensor/kernel_inputs.py), never at the length the decision
code meant, so a wrong ``track_seqlen`` shows as a wrong state at a hit.
"""

from __future__ import annotations

import random
import zlib
from array import array
from typing import Optional

import numpy as np
import pytest
from kernel_inputs import tracked_length

torch = pytest.importorskip("torch")

from mambaradix import _C  # noqa: E402
from mambaradix.sglang import (  # noqa: E402
    CacheInitParams,
    HybridReqToTokenPool,
    Mamba2CacheParams,
    Mamba2StateDType,
    Mamba2StateShape,
    MambaRadixCache,
    MatchPrefixParams,
    RadixKey,
    Req,
    SamplingParams,
    TokenToKVPoolAllocator,
    alloc_req_slots,
    release_kv_cache,
)

C = 64


def fingerprint(tokens) -> float:
    return float(zlib.crc32(np.asarray(tokens, dtype=np.int64).tobytes()) % (1 << 22) + 1)


class Loop:
    """A minimal SGLang-style scheduler loop (one request at a time unless
    told otherwise), with a fingerprinting forward."""

    def __init__(self, *, extra_buffer: bool, overlap: bool = True, lazy: bool = False, interval: int = 256,
                 mamba_size: int = 64, kv_size: int = 8192, rows: int = 16, chunk: Optional[int] = None,
                 foreign: bool = False) -> None:
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=8, n_groups=1, num_heads=1,
                                        head_dim=2, state_size=2, conv_kernel=2)
        params = Mamba2CacheParams(shape=shape, layers=[0],
                                   dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32))
        self.pool = HybridReqToTokenPool(
            size=rows, mamba_size=mamba_size, max_context_len=4096, device="cpu", cache_params=params,
            mamba_layer_ids=[0], enable_mamba_extra_buffer=extra_buffer, enable_mamba_extra_buffer_lazy=lazy,
            enable_overlap_schedule=overlap, mamba_track_interval=interval,
        )
        self.alloc = TokenToKVPoolAllocator(size=kv_size, dtype=torch.float32, device="cpu", kvcache=None,
                                            need_sort=False)
        from test_sglang_dropin import Foreign

        p, a = (Foreign(self.pool), Foreign(self.alloc)) if foreign else (self.pool, self.alloc)
        self.tree = MambaRadixCache(
            CacheInitParams(disable=False, req_to_token_pool=p, token_to_kv_pool_allocator=a,
                            page_size=1, enable_mamba_extra_buffer=extra_buffer,
                            enable_mamba_extra_buffer_lazy=lazy),
            chunk_size=C, track_interval=interval)
        self.extra = extra_buffer
        self.interval = interval
        self.chunk = chunk
        self.temporal = self.pool.mamba_pool.mamba_cache.temporal
        self.rid = 0

    # -- state fingerprints ------------------------------------------------

    def state(self, slot: int) -> float:
        return float(self.temporal[0, slot, 0, 0, 0])

    def set_state(self, slot: int, v: float) -> None:
        assert slot >= 1, "no slot (-1) or the padding slot: a negative index would write another slot"
        self.temporal[0, slot, 0, 0, 0] = v

    def check(self) -> None:
        self.tree.sanity_check()
        self.pool.mamba_allocator.check()
        self.alloc.check()
        self.pool.check()

    # -- one request ---------------------------------------------------------

    def admit(self, tokens) -> Req:
        self.rid += 1
        req = Req(rid=self.rid, origin_input_text="", origin_input_ids=array("q", tokens),
                  sampling_params=SamplingParams(max_new_tokens=1))
        req.init_next_round_input(self.tree)
        alloc_req_slots(self.pool, [req], self.tree)
        self.tree.inc_lock_ref(req.last_node)
        self.check()
        return req

    def prefill(self, req: Req, end: Optional[int] = None) -> None:
        """Extend from the request's prefix to `end` (default: all input)."""
        P = len(req.prefix_indices)
        tokens = list(req.origin_input_ids) + list(req.output_ids)
        end = len(tokens) if end is None else end
        E = end - P
        row = req.req_pool_idx
        kv = self.alloc.alloc(E)
        self.pool.write((row, slice(0, P)), req.prefix_indices.to(torch.int32))
        self.pool.write((row, slice(P, end)), kv.to(torch.int32))
        req.set_extend_range(P, end)
        req.kv_committed_len = req.kv_allocated_len = end
        # deferred copy-on-write / clear, then the state must be the prefix's
        run = int(req.mamba_pool_idx)
        if req.mamba_cow_src_index is not None:
            self.pool.mamba_pool.copy_from(req.mamba_cow_src_index, req.mamba_pool_idx.reshape(1))
            req.mamba_cow_src_index = None
        elif req.mamba_needs_clear:
            self.pool.mamba_pool.clear_slots(req.mamba_pool_idx.reshape(1))
        req.mamba_needs_clear = False
        if P > 0:
            assert self.state(run) == fingerprint(tokens[:P]), "a hit handed out the wrong state"
        if self.extra:
            slot, mask, seqlen = self.tree.prepare_extend_track(req, P, E)
            if mask:
                self.set_state(slot, fingerprint(tokens[: tracked_length(P, E, seqlen, C)]))
        self.set_state(run, fingerprint(tokens[:end]))

    def decode(self, req: Req, token: int, finished: bool = False) -> None:
        """One decode step that appends `token` (its KV is computed)."""
        req.output_ids.append(token)
        seq = len(req.origin_input_ids) + len(req.output_ids) - 1   # tokens whose KV exists after this step
        kv = self.alloc.alloc(1)
        self.pool.write((req.req_pool_idx, slice(seq - 1, seq)), kv.to(torch.int32))
        req.kv_committed_len = req.kv_allocated_len = seq
        slot, mask = self.tree.decode_track(req, seq)
        tokens = list(req.origin_input_ids) + list(req.output_ids)
        if mask and self.extra:  # no_buffer tracks nothing
            self.set_state(slot, fingerprint(tokens[:seq]))
        self.set_state(int(req.mamba_pool_idx), fingerprint(tokens[:seq]))
        if finished:
            req.finished_reason = "length"
        self.tree.decode_track_done(req, finished)

    def finish(self, req: Req, is_insert: bool = True) -> None:
        release_kv_cache(req, self.tree, is_insert=is_insert)
        self.check()

    def run(self, tokens, out_len: int = 1) -> int:
        """One whole request; returns its cache hit (prefix length)."""
        req = self.admit(tokens)
        hit = len(req.prefix_indices)
        n = len(tokens)
        if self.chunk:
            start = hit
            while n - start > self.chunk:
                self.prefill(req, start + self.chunk)
                self.tree.cache_unfinished_req(req, chunked=True)
                self.check()
                start = start + self.chunk
                assert len(req.prefix_indices) == start
        self.prefill(req)
        req.output_ids.append(7)   # the prefill's output token
        if out_len > 1:
            self.tree.cache_unfinished_req(req)
            self.check()
            for i in range(out_len - 1):
                self.decode(req, 1000 + i, finished=(i == out_len - 2))
        self.finish(req)
        return hit


def doc_workload():
    a = lambda v: [v] * 256  # noqa: E731
    return [a(1) + a(2), a(1) + a(3), a(1) + a(4), a(1) + a(2) + a(5), a(1) + a(4) + a(5),
            a(1) + a(3) + a(5), a(1) + a(3), a(1) + a(3)]


@pytest.mark.parametrize("overlap", [True, False])
def test_design_example_extra_buffer(overlap: bool) -> None:
    """The design document's 8-request example, with SGLang's input_len - 1
    cap: 0 0 256 512 512 256 256 448 (NOTES.md)."""
    loop = Loop(extra_buffer=True, overlap=overlap)
    hits = [loop.run(t) for t in doc_workload()]
    assert hits == [0, 0, 256, 512, 512, 256, 256, 448]
    # no state was copied except at hits (copy-on-write)
    traffic = loop.tree.state_traffic()
    assert traffic["forks"] == 0
    assert loop.pool.mamba_pool.bytes_copied == sum(1 for h in hits if h) * loop.pool.mamba_pool.slot_bytes


def test_design_example_no_buffer() -> None:
    """no_buffer: identical prompts never hit: 0 0 0 512 512 512 0 0."""
    loop = Loop(extra_buffer=False, overlap=False)
    assert [loop.run(t) for t in doc_workload()] == [0, 0, 0, 512, 512, 512, 0, 0]


def test_lazy_buffer_same_hits_as_extra_buffer() -> None:
    loop = Loop(extra_buffer=True, lazy=True)
    assert [loop.run(t) for t in doc_workload()] == [0, 0, 256, 512, 512, 256, 256, 448]


def test_lazy_buffer_borrows_a_slot_only_at_boundaries() -> None:
    loop = Loop(extra_buffer=True, lazy=True, interval=16)
    prompt = list(range(1, 129))
    req = loop.admit(prompt)
    assert req.mamba_ping_pong_track_buffer.tolist()[1] == -1      # one slot held
    loop.prefill(req)
    req.output_ids.append(7)
    loop.tree.cache_unfinished_req(req)
    held = []
    for i in range(20):
        loop.decode(req, 1000 + i)
        held.append(sum(1 for x in req.mamba_ping_pong_track_buffer.tolist() if x != -1))
    assert held == [1] * 20          # the borrowed slot goes back after each boundary
    assert req.mamba_last_track_seqlen == 144
    loop.finish(req)
    follow = prompt + [7] + [1000 + i for i in range(19)] + [5]
    assert loop.run(follow) == 144


def test_chunked_prefill_snapshots_relative_to_chunk_start() -> None:
    """Chunk 100: snapshots at 64 (chunk 1), 164 (chunk 2), 264 ... (SGLang's
    quirk); a follow-up request hits the last one."""
    loop = Loop(extra_buffer=True, chunk=100)
    toks = list(range(1, 301))
    assert loop.run(toks) == 0
    # the cached path: 64, then 164, then 264 (each a multiple of 64 from its chunk's start)
    assert loop.run(toks + [999]) == 264


@pytest.mark.parametrize("extend", [C - 1, C, C + 1])
def test_an_extend_of_exactly_one_chunk_is_tracked(extend: int) -> None:
    """A prompt of C - 1, C, C + 1 tokens: the snapshot is taken when the
    extend has at least C tokens (at C), and the next request hits it."""
    for loop in (Loop(extra_buffer=True, overlap=False), Loop(extra_buffer=True)):
        toks = list(range(1, extend + 1))
        assert loop.run(toks) == 0
        assert loop.run(toks + [999, 998]) == (C if extend >= C else 0)


def test_branching_point_at_a_chunk_end() -> None:
    """Chunked prefill (256) of a(1) + a(3) after a(1) + a(2) was cached: the
    match reports the branching point 256, which is the first piece's end.
    That piece tracks its own end (its final state, not an h past its
    chunks); a(1) + a(4) then hits 256 with the state at 256."""
    a = lambda v: [v] * 256  # noqa: E731
    loop = Loop(extra_buffer=True)
    assert loop.run(a(1) + a(2)) == 0
    loop.chunk = 256
    assert loop.run(a(1) + a(3)) == 0
    assert loop.run(a(1) + a(4)) == 256


def test_branching_point_equal_to_the_prefix_is_no_branch() -> None:
    """Cached: a(1) + a(2) (state at 512) and, from a(1) + a(3), the state at
    the branching point 256.  a(1) + a(2)[:40] + 100 new tokens matches 296
    KV tokens with the state at 256: the aligned branching point is the
    prefix itself, so the usual point is tracked, 256 + (140 // 64) * 64 =
    384, and a follow-up hits it."""
    a = lambda v: [v] * 256  # noqa: E731
    loop = Loop(extra_buffer=True)
    assert loop.run(a(1) + a(2)) == 0
    assert loop.run(a(1) + a(3)) == 0
    third = a(1) + a(2)[:40] + list(range(1000, 1100))
    assert loop.run(third) == 256
    assert loop.run(third + [5, 6]) == 384


def test_decode_boundaries_cache_interval_multiples() -> None:
    """Output >= 2: end-of-prefill caching clears the tracked length; a
    decode step that reaches a multiple of the interval snapshots again."""
    loop = Loop(extra_buffer=True, interval=16)
    prompt = list(range(1, 129))             # 128 tokens: snapshot at 128
    assert loop.run(prompt, out_len=20) == 0
    # seq reached 128 + 19 = 147 KV tokens: boundary at 144
    follow = prompt + [7] + [1000 + i for i in range(19)] + [5]
    assert loop.run(follow) == 144


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_finish_keeps_tree_slot(overlap: bool) -> None:
    """Semantics 3.3: under overlap, batch N+1 is launched (track slot
    fixed) before batch N's result shows the request finished.  The slot
    the tree keeps must not be the one N+1 writes; with a single track slot
    (no overlap) it is, which is why the overlap scheduler needs two."""
    loop = Loop(extra_buffer=True, overlap=overlap, interval=8)
    prompt = list(range(1, 65))  # 64 tokens: prefill snapshot at 64
    req = loop.admit(prompt)
    loop.prefill(req)
    req.output_ids.append(7)
    loop.tree.cache_unfinished_req(req)
    # decode up to a boundary: seq 72 is a multiple of 8
    for i in range(8):
        loop.decode(req, 1000 + i)
    assert req.mamba_last_track_seqlen == 72
    # batch N+1 is prepared before batch N's result: it fixes its track slot
    next_slot = int(req.mamba_ping_pong_track_buffer[req.mamba_next_track_idx])
    # batch N's result: the request finished -> the tree takes track[keep]
    req.finished_reason = "length"
    release_kv_cache(req, loop.tree)
    cached = prompt + [7] + [1000 + i for i in range(7)]
    assert len(cached) == 72
    node = loop.tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", cached + [0])))).last_device_node
    tree_slot = int(node.mamba_value[0])
    want = fingerprint(cached)
    assert loop.state(tree_slot) == want
    # ... and then the in-flight forward N+1 writes its track slot
    loop.set_state(next_slot, -12345.0)
    if overlap:
        assert next_slot != tree_slot
        assert loop.state(tree_slot) == want
    else:
        assert next_slot == tree_slot   # the hazard the second slot removes
    loop.check()


@pytest.mark.parametrize("extra_buffer", [True, False])
def test_random_workload_states_match_from_scratch_fingerprints(extra_buffer: bool) -> None:
    """Random shared-prefix requests (mixed output lengths, chunking, small
    pools so eviction happens).  The reference is the from-scratch
    fingerprint of each hit's prefix (checked in Loop.prefill); all
    accounting holds after every step; a hit is a prefix some earlier request
    had, at a length the tracking rules can produce: with extra_buffer a
    multiple of gcd(C, interval, chunked-prefill size) = 32."""
    rng = random.Random(11 + extra_buffer)
    loop = Loop(extra_buffer=extra_buffer, overlap=extra_buffer, mamba_size=12, kv_size=3000,
                chunk=rng.choice([None, 128]) if extra_buffer else None, interval=32)
    bases = [[rng.randint(1, 50) for _ in range(rng.randint(64, 300))] for _ in range(4)]
    seen: list[list[int]] = []
    hits = 0
    for i in range(60):
        # a new prompt on a shared stem, or the next turn of an earlier one
        base = rng.choice(seen) if seen and rng.random() < 0.4 else rng.choice(bases)
        toks = base[: rng.randint(1, len(base))] + [rng.randint(1, 50) for _ in range(rng.randint(1, 120))]
        if base in seen and rng.random() < 0.7:
            toks = base + toks[len(base) // 2:][:60]
        hit = loop.run(toks, out_len=rng.choice([1, 1, 3, 40]))
        assert hit < len(toks)
        if hit:
            hits += 1
            # a hit is a prefix some earlier request really had
            assert any(s[:hit] == toks[:hit] for s in seen)
            if extra_buffer:
                assert hit % 32 == 0
        seen.append(toks + [7])
    assert hits >= 10  # the workload shares prefixes: the fingerprint checks above ran
    traffic = loop.tree.state_traffic()
    assert traffic["cow"] == hits
    if extra_buffer:
        assert traffic["forks"] == 0


def test_finish_twice_and_abort_paths() -> None:
    loop = Loop(extra_buffer=True)
    req = loop.admit(list(range(1, 200)))
    loop.prefill(req)
    loop.finish(req)
    with pytest.raises(RuntimeError, match="finished twice"):
        loop.tree.cache_finished_req(req)
    # abort before admission: the copy-on-write slot comes back
    loop.run(list(range(1, 200)))
    r2 = Req(rid="x", origin_input_ids=array("q", range(1, 200)))
    r2.init_next_round_input(loop.tree)
    assert r2.mamba_pool_idx is not None and r2.req_pool_idx is None
    free_before = loop.pool.mamba_allocator.available_size()
    release_kv_cache(r2, loop.tree)
    assert loop.pool.mamba_allocator.available_size() == free_before + 1
    # retract (is_insert=False): everything the request had is freed
    r3 = loop.admit(list(range(1, 150)))
    loop.prefill(r3)
    kv_free = loop.alloc.available_size()
    loop.finish(r3, is_insert=False)
    assert loop.alloc.available_size() > kv_free
    c = loop.pool.mamba_allocator._slots.counts()
    assert c["req"] == 0 and c["held"] == 0
    assert c["tree"] == loop.tree.total_size()[1]


# ---------------------------------------------------------------------------
# The one-call-per-batch C API


class BatchLoop:
    """The same scheduler loop on Lifecycle's batched calls; the state pool
    is a numpy array of fingerprints, one per slot."""

    def __init__(self, *, extra_buffer: bool = True, lazy: bool = False, interval: int = 256,
                 mamba_size: int = 64, kv_size: int = 20000, rows: int = 16, page_size: int = 1) -> None:
        pp = 2
        self.state_alloc = _C.SlotAllocator(mamba_size)
        self.kv_alloc = _C.SlotAllocator(kv_size, page_size)
        self.rp = _C.ReqPool(rows, 4096, pp)
        self.lc = _C.Lifecycle(self.state_alloc, self.kv_alloc, self.rp, page_size=page_size,
                               chunk_size=max(C, page_size), extra_buffer=extra_buffer, lazy=lazy,
                               track_buffer_size=pp, track_interval=interval)
        self.states = np.zeros(mamba_size + 1)
        self.extra = extra_buffer
        self.chunk = max(C, page_size)

    def prefill(self, keys, may_fail: bool = False):
        """One prefill batch; runs the forward's deferred copy-on-write or
        clear, checks the request's running slot holds its prefix's state,
        then writes the running state and the track snapshot."""
        out = self.lc.prefill_batch(keys)
        if out is None and may_fail:
            return None
        assert out is not None
        for i, toks in enumerate(keys):
            P = int(out["prefix_len"][i])
            run = int(self.rp.state_map[int(out["rows"][i])])
            if out["cow_src"][i] >= 0:
                assert out["cow_dst"][i] == run and out["clear"][i] == -1
                self.states[out["cow_dst"][i]] = self.states[out["cow_src"][i]]
            else:
                assert P == 0 and out["clear"][i] == run
                self.states[out["clear"][i]] = 0.0
            assert self.states[run] == (fingerprint(toks[:P]) if P else 0.0), "a hit handed out the wrong state"
            self.states[run] = fingerprint(toks)
            if out["track_mask"][i]:
                # where the kernel snapshots, given its inputs
                ln = tracked_length(P, len(toks) - P, int(out["track_seqlen"][i]), self.chunk)
                self.states[out["track_slot"][i]] = fingerprint(toks[:ln])
        self.lc.check()
        return out

    def decode(self, rows, seqs):
        """One decode step: seqs[i] is row i's tokens, the new one last."""
        got = self.lc.decode_batch(rows)
        assert got is not None
        slots, mask = got
        for i, r in enumerate(rows):
            fp = fingerprint(seqs[i])
            self.states[int(self.rp.state_map[r])] = fp
            if mask[i]:
                self.states[slots[i]] = fp
        self.lc.check()
        return got

    def finish(self, rows, keys):
        self.lc.finish_batch(rows, keys)
        self.lc.check()


def test_batch_api_design_example() -> None:
    loop = BatchLoop()
    hits = []
    for toks in doc_workload():
        out = loop.prefill([toks])
        hits.append(int(out["prefix_len"][0]))
        loop.finish(out["rows"], [toks + [7]])
    assert hits == [0, 0, 256, 512, 512, 256, 256, 448]
    assert loop.lc.stats()["forks"] == 0
    assert loop.lc.stats()["cow"] == sum(1 for h in hits if h)
    c = loop.state_alloc.counts()
    assert c["req"] == 0 and c["held"] == 0 and c["tree"] == loop.lc.sizes()[2] + loop.lc.sizes()[3]


@pytest.mark.parametrize("page_size", [1, 16])
def test_one_batch_of_one_prompt_caches_it_once(page_size: int) -> None:
    """Two requests of one prompt in one batch: neither hits (a batch does
    not hit itself) and each gets its own KV.  At the end of prefill the
    first caches its tracked prefix with its own indices; the second's for
    the same tokens are duplicates (SGLang's insert frees
    value[prev_prefix_len:prefix_len]): they go back to the pool and its
    row points at the tree's from then on, its tail its own."""
    rng = random.Random(5)
    toks = [rng.randrange(1, 1000) for _ in range(700)]
    loop = BatchLoop(page_size=page_size)
    out = loop.prefill([toks, toks])
    assert out["prefix_len"].tolist() == [0, 0]
    r1, r2 = (int(r) for r in out["rows"])
    first, second = (loop.rp.table[r][: len(toks)].copy() for r in (r1, r2))
    assert not set(first.tolist()) & set(second.tolist())
    free_before = loop.kv_alloc.available_size()
    loop.lc.unfinished_batch(out["rows"], [toks, toks])
    loop.lc.check()
    cached = sum(loop.lc.sizes()[:2])
    assert 0 < cached < len(toks) and cached % page_size == 0
    assert loop.rp.table[r1][: len(toks)].tolist() == first.tolist()
    assert loop.rp.table[r2][:cached].tolist() == first[:cached].tolist()
    assert loop.rp.table[r2][cached : len(toks)].tolist() == second[cached:].tolist()
    assert loop.kv_alloc.available_size() - free_before == cached
    loop.finish(out["rows"], [toks + [7], toks + [7]])
    c = loop.kv_alloc.counts()
    assert c["req"] == 0 and c["tree"] * page_size == sum(loop.lc.sizes()[:2])


@pytest.mark.parametrize("page_size", [1, 16])
def test_eviction_counts_the_kv_it_frees(page_size: int) -> None:
    """With pools the tree hands an evicted node's KV straight to the KV
    pool: the tokens evict() reports, stats()["tokens_evicted"], the
    tree's tokens lost and the pool's tokens gained all agree, and every
    freed index is free again."""
    loop = BatchLoop(page_size=page_size)
    for toks in doc_workload():
        out = loop.prefill([toks])
        loop.finish(out["rows"], [toks + [7]])
    held = sum(loop.lc.sizes()[:2])
    assert held > 0
    before = (loop.lc.stats()["tokens_evicted"], loop.kv_alloc.available_size())
    tokens, _, kv, _ = loop.lc.evict(held // 2)
    assert len(kv) == 0   # with pools, already freed
    assert tokens >= held // 2
    assert loop.lc.stats()["tokens_evicted"] - before[0] == tokens
    assert held - sum(loop.lc.sizes()[:2]) == tokens
    assert loop.kv_alloc.available_size() - before[1] == tokens
    c = loop.kv_alloc.counts()
    assert c["tree"] * page_size == sum(loop.lc.sizes()[:2]) and c["req"] == 0
    loop.lc.check()


@pytest.mark.parametrize("page_size", [1, 16])
def test_batch_api_random_batches(page_size: int) -> None:
    """Batches of requests with decode steps; accounting after every call;
    a batch of requests is admitted together or not at all."""
    rng = random.Random(5 + page_size)
    loop = BatchLoop(interval=32, mamba_size=40, kv_size=6000, rows=8, page_size=page_size)
    bases = [[rng.randint(1, 30) for _ in range(rng.randint(100, 400))] for _ in range(3)]
    running: dict[int, list[int]] = {}
    for step in range(80):
        if running and rng.random() < 0.4:
            rows = list(running)
            for r in rows:
                running[r].append(rng.randint(1, 30))
            loop.decode(rows, [running[r] for r in rows])
        if running and rng.random() < 0.4:
            done = rng.sample(list(running), rng.randint(1, len(running)))
            loop.finish(done, [running[r] + [0] for r in done])
            for r in done:
                del running[r]
        k = rng.randint(1, 3)
        if len(running) + k <= 8:
            keys = []
            for _ in range(k):
                b = rng.choice(bases)
                keys.append(b[: rng.randint(1, len(b))] + [rng.randint(1, 30) for _ in range(rng.randint(1, 80))])
            before = (loop.state_alloc.counts(), loop.kv_alloc.counts(), loop.rp.available_size())
            out = loop.prefill(keys, may_fail=True)
            if out is None:
                assert (loop.state_alloc.counts()["held"], loop.rp.available_size()) == (before[0]["held"], before[2])
            else:
                for r, toks in zip(out["rows"].tolist(), keys):
                    running[r] = list(toks)
                    assert loop.rp.table[r, : len(toks)].min() > 0
            loop.lc.check()
    loop.finish(list(running), [running[r] + [0] for r in running])
    c = loop.state_alloc.counts()
    assert c["req"] == 0 and c["held"] == 0
    kc = loop.kv_alloc.counts()
    assert kc["req"] == 0 and kc["held"] == 0   # every KV page is free or the tree's


def test_batch_admission_counts_kv_in_pages() -> None:
    """Three 2-token requests need three KV pages of 4 tokens; with two free
    the batch is refused and nothing is taken (it once took 3 rows, 9 state
    slots and every KV token while reporting a refusal); with three it is
    admitted."""
    for pages, admitted in ((2, False), (3, True)):
        st, kv, rp = _C.SlotAllocator(32), _C.SlotAllocator(4 * pages, 4), _C.ReqPool(6, 64, 2)
        lc = _C.Lifecycle(st, kv, rp, page_size=4, chunk_size=4, extra_buffer=True)
        out = lc.prefill_batch([[1, 2], [3, 4], [5, 6]])
        assert (out is not None) == admitted
        if admitted:
            assert (st.available_size(), kv.available_size(), rp.available_size()) == (32 - 9, 0, 3)
        else:
            assert (st.available_size(), kv.available_size(), rp.available_size()) == (32, 4 * pages, 6)
        assert st.counts()["held"] == 0 and kv.counts()["held"] == 0
        lc.check()


def test_batch_admission_evicts_for_partial_pages() -> None:
    """Page size 4, four KV pages, two of them a cached 8-token key: three
    2-token requests need a page each (a partial page is a whole one), so
    the batch evicts the cached key and is admitted; the pages it takes are
    the three it needs."""
    st, kv, rp = _C.SlotAllocator(32), _C.SlotAllocator(16, 4), _C.ReqPool(6, 64, 2)
    lc = _C.Lifecycle(st, kv, rp, page_size=4, chunk_size=4, extra_buffer=True)
    lc.insert(list(range(100, 108)), kv.alloc(8), int(st.alloc(1)[0]))
    assert kv.available_size() == 8
    out = lc.prefill_batch([[1, 2], [3, 4], [5, 6]])
    assert out is not None
    assert lc.sizes()[0] == 0 and kv.available_size() == 4     # the cached key went
    assert kv.counts()["req"] == 3 and kv.counts()["tree"] == 0
    lc.check()


def test_no_buffer_needs_page_size_one() -> None:
    """SGLang's MambaRadixCache asserts page_size == 1 without the extra buffer."""
    with pytest.raises(ValueError):
        _C.Lifecycle(_C.SlotAllocator(8), _C.SlotAllocator(64, 4), _C.ReqPool(2, 16, 2), page_size=4,
                     extra_buffer=False)


def test_batch_api_bad_input() -> None:
    loop = BatchLoop()
    out = loop.prefill([list(range(1, 100))])
    row = int(out["rows"][0])
    loop.finish([row], [list(range(1, 101))])
    with pytest.raises(_C.OwnershipError, match="finished twice"):
        loop.lc.finish_batch([row], [list(range(1, 101))])
    with pytest.raises(ValueError):
        loop.lc.decode_batch([row])
    with pytest.raises(ValueError, match="max_context_len"):
        loop.lc.prefill_batch([list(range(1, 5000))])
    with pytest.raises(TypeError):
        loop.lc.prefill_batch([["a"]])
    loop.lc.check()


@pytest.mark.parametrize("lazy", [False, True])
def test_batch_headroom_evicts_the_shortfall(lazy: bool) -> None:
    """prefill_batch's admission first evicts cached states until n * factor
    slots are free (factor 3: running + two ping-pong; lazy 2), as SGLang's
    alloc_req_slots does.  30 slots, 8 cached states (22 free); a batch of 6
    needs 18 (lazy 12): nothing evicted, 4 (lazy 10) left free; then a batch
    of 2 (lazy 6) needs 6 (lazy 12): exactly 2 states are evicted."""
    loop = BatchLoop(lazy=lazy, mamba_size=30)
    for i in range(8):
        toks = [1000 * (i + 1) + k for k in range(70)]   # one chunk tracked: one state each
        out = loop.prefill([toks])
        loop.finish(out["rows"], [toks + [7]])
    assert loop.lc.sizes()[2] == 8 and loop.state_alloc.available_size() == 22

    def batch(n, base):
        before = loop.lc.stats()["states_evicted"]
        loop.prefill([[base * (j + 1) + k for k in range(10)] for j in range(n)])
        return loop.lc.stats()["states_evicted"] - before

    assert batch(6, 50000) == 0
    assert loop.state_alloc.available_size() == (10 if lazy else 4)
    assert batch(6 if lazy else 2, 90000) == 2
    assert loop.lc.sizes()[2] == 6


def test_state_pool_exhaustion_is_a_clear_error() -> None:
    """Admission beyond the state pool: SGLang's headroom eviction first,
    then a clear RuntimeError (not an assert), with nothing leaked."""
    loop = Loop(extra_buffer=True, mamba_size=5)
    a = loop.admit(list(range(1, 100)))          # running + 2 track = 3 slots
    loop.prefill(a)
    with pytest.raises(RuntimeError, match="state slots"):
        loop.admit(list(range(200, 300)))        # needs 3, 2 free, nothing cached to evict
    loop.check()
    c = loop.pool.mamba_allocator._slots.counts()
    assert c["req"] == 3 and c["free"] == 2 and c["held"] == 0
    loop.finish(a)
    # now the cached state can be evicted to make room
    b = loop.admit(list(range(200, 300)))
    loop.prefill(b)
    loop.finish(b)
    assert loop.pool.mamba_allocator._slots.counts()["req"] == 0


def test_donated_track_slot_cannot_be_cached_again() -> None:
    loop = Loop(extra_buffer=True)
    req = loop.admit(list(range(1, 200)))
    loop.prefill(req)
    keep = loop.pool.get_mamba_ping_pong_keep_idx(req)
    slot = int(req.mamba_ping_pong_track_buffer[keep])
    req.mamba_ping_pong_track_buffer[keep] = -1     # as if donated already
    before = loop.pool.mamba_allocator._slots.counts()
    with pytest.raises(_C.OwnershipError, match="already freed or donated"):
        loop.tree.cache_finished_req(req, kv_len_to_handle=req.kv_committed_len)
    assert loop.pool.mamba_allocator._slots.counts() == before
    req.mamba_ping_pong_track_buffer[keep] = slot   # put it back: finishing works
    loop.check()
    loop.finish(req)
    assert loop.pool.mamba_allocator._slots.counts()["req"] == 0


@pytest.mark.parametrize("mode", ["no_buffer", "extra_buffer", "lazy"])
def test_own_and_foreign_pools_give_the_same_hits(mode: str) -> None:
    """The same random workload through the C lifecycle over its own pools
    and in its tree-only mode, which the cache takes over someone else's
    pools (what those must free handed back per call): the same hits for
    every request and the same tree sizes after each.  Both use the C
    decisions (checked against SGLang's own code in
    test_sglang_decisions.py); what this compares is the two ownership
    paths, and each hit's state is checked against the from-scratch
    fingerprint in Loop.prefill."""
    extra_buffer = mode != "no_buffer"
    rng = random.Random(77 + len(mode))
    bases = [[rng.randint(1, 40) for _ in range(rng.randint(64, 260))] for _ in range(3)]
    work = []
    for _ in range(40):
        b = rng.choice(bases)
        work.append((b[: rng.randint(1, len(b))] + [rng.randint(1, 40) for _ in range(rng.randint(1, 90))],
                     rng.choice([1, 2, 20])))
    kw = dict(extra_buffer=extra_buffer, overlap=extra_buffer, lazy=mode == "lazy", mamba_size=10, kv_size=2500,
              interval=16, chunk=96 if extra_buffer else None)
    own, other = Loop(**kw), Loop(foreign=True, **kw)
    assert own.tree._native and not other.tree._native
    for toks, out_len in work:
        assert own.run(toks, out_len) == other.run(toks, out_len)
        assert own.tree.total_size() == other.tree.total_size()
        assert own.tree._lc.sizes() == other.tree._lc.sizes()


def _rs(running: int, track=(-1, -1), nxt: int = -1, last_track: int = -1, protected: int = 0,
        node=(-1, 0), locked: int = 0) -> tuple:
    return (running, track[0], track[1], nxt, last_track, -1, -1, 0, 1, protected, node[0], node[1], locked)


def test_tree_only_calls_hand_back_what_to_free() -> None:
    """Tree-only mode (the cache over SGLang's own pools): what the caller's
    allocators must free comes back from each call, per kind."""
    lc = _C.Lifecycle(chunk_size=4)                      # no_buffer, page size 1
    rs, kv_free, st_free = lc.cache_finished(_rs(5), [1, 2, 3], np.array([10, 11, 12]))
    assert rs[0] == -1 and kv_free.size == 0 and st_free.size == 0   # the tree took slot 5 and the KV
    # a longer request over the same prefix: its first three KV indices are
    # duplicates; its slot ends the new node
    rs, kv_free, st_free = lc.cache_finished(_rs(6), [1, 2, 3, 4], np.array([20, 21, 22, 23]))
    assert sorted(kv_free.tolist()) == [20, 21, 22] and st_free.size == 0
    # the same prefix again: all duplicates, and the state exists: its slot comes back
    rs, kv_free, st_free = lc.cache_finished(_rs(8), [1, 2, 3], np.array([30, 31, 32]))
    assert sorted(kv_free.tolist()) == [30, 31, 32] and st_free.tolist() == [8]
    # not inserted: everything past the protected prefix goes back
    rs, kv_free, st_free = lc.cache_finished(_rs(7), [9, 9], np.array([40, 41]), is_insert=False)
    assert sorted(kv_free.tolist()) == [40, 41] and st_free.tolist() == [7]
    assert lc.sizes()[2] + lc.sizes()[3] == 2                        # states 5 and 6 cached
    # extra_buffer: the newest snapshot (track[keep]) is donated; the fresh slot replaces it
    lc = _C.Lifecycle(chunk_size=4, extra_buffer=True)
    rs, prefix, fs, fd, kv_free, st_free, end = lc.cache_unfinished(
        _rs(1, track=(2, 3), nxt=0, last_track=4), [1, 2, 3, 4, 5], np.array([11, 12, 13, 14, 15]), 9)
    assert rs[1:3] == (2, 9)        # keep = other(next) = 1: slot 3 went to the tree, 9 took its place
    assert prefix.tolist() == [11, 12, 13, 14, 15] and rs[9] == 4 and (fs, fd) == (-1, -1)
    assert kv_free.size == 0 and st_free.size == 0
    assert end == 0                 # the tree took the caller's indices: its table needs no write
    # nothing tracked: the fresh slot comes back unused
    rs, prefix, fs, fd, kv_free, st_free, end = lc.cache_unfinished(
        _rs(4, track=(5, 6), nxt=0), [7, 7], np.array([50, 51]), 8)
    assert st_free.tolist() == [8] and prefix.tolist() == [50, 51] and end == 0
    lc.check()


def test_tree_only_lazy_decode_borrows_a_caller_slot() -> None:
    """Lazy mode over someone else's pools: at a boundary the lifecycle asks
    for a slot to borrow (nothing changes until it gets one), snapshots into
    it, and after the step hands the old one back to be freed."""
    lc = _C.Lifecycle(extra_buffer=True, lazy=True, track_interval=4)
    rs = _rs(1, track=(2, -1), nxt=0)
    assert lc.decode_prepare(rs, 7) == (rs, 2, False, False)       # no boundary
    assert lc.decode_prepare(rs, 8) == (rs, 2, True, True)         # wants a slot
    rs2, slot, mask, need = lc.decode_prepare(rs, 8, 9)
    assert rs2[1:4] == (2, 9, 1) and (slot, mask, need) == (9, True, False)
    rs3, at, st_free = lc.decode_finish(rs2, 8, False)
    assert at and rs3[1:5] == (-1, 9, 1, 8) and st_free.tolist() == [2]
    # no slot to be had: the step goes on in the slot it has
    rs4, at, st_free = lc.decode_finish(rs, 8, True)
    assert at and rs4[1:5] == (2, -1, 0, 8) and rs4[8] == 0 and st_free.size == 0   # not insertable


def test_tree_only_calls_bad_input() -> None:
    own = _C.Lifecycle(_C.SlotAllocator(4), _C.SlotAllocator(16), _C.ReqPool(2, 8, 2))
    # with pools the call takes the request's row first: the record-first form is not it
    with pytest.raises(TypeError, match="committed_len"):
        own.cache_finished(_rs(1), [1], np.array([1]))
    lc = _C.Lifecycle(extra_buffer=True)
    with pytest.raises(ValueError, match="fresh"):
        lc.cache_unfinished(_rs(1, track=(2, 3), nxt=0, last_track=1), [1], np.array([1]), 0)
    with pytest.raises(ValueError, match="tokens"):
        lc.cache_finished(_rs(1, track=(2, 3), nxt=0), [1], np.array([1, 2]))
    with pytest.raises(ValueError):
        lc.cache_finished(_rs(1), [1, 2], np.array([-1, 2]))
    with pytest.raises(_C.OwnershipError):
        lc.cache_finished(_rs(-1), [1], np.array([1]))   # no running slot: finished twice
    lc.check()


def test_disabled_cache_frees_everything() -> None:
    """disable=True: nothing is cached, finishing frees the request's KV and
    every state slot it holds."""
    loop = Loop(extra_buffer=True)
    tree = MambaRadixCache(CacheInitParams(disable=True, req_to_token_pool=loop.pool,
                                           token_to_kv_pool_allocator=loop.alloc, page_size=1,
                                           enable_mamba_extra_buffer=True), chunk_size=C)
    loop.tree = tree
    kv_free, st_free = loop.alloc.available_size(), loop.pool.mamba_allocator.available_size()
    for _ in range(2):
        req = loop.admit(list(range(1, 150)))
        assert len(req.prefix_indices) == 0 and req.last_node is tree.root_node
        loop.prefill(req)
        loop.finish(req)
        assert loop.alloc.available_size() == kv_free
        assert loop.pool.mamba_allocator.available_size() == st_free
    assert tree.total_size() == (0, 0)


def test_check_catches_a_row_that_breaks_its_record_rules() -> None:
    """A request's row maps (state_map, track_map: what the kernels read)
    must name the slots its record holds, and between calls its record
    keeps no copy-on-write source; check() catches an entry that differs
    (the track entries swapped, or another slot the request owns) and a
    source left behind, and passes again once each is put back."""
    st, kv, rp = _C.SlotAllocator(32), _C.SlotAllocator(64, 4), _C.ReqPool(4, 64, 2)
    lc = _C.Lifecycle(st, kv, rp, page_size=4, chunk_size=4, extra_buffer=True)
    out = lc.prefill_batch([[1, 2, 3, 4, 5], [6, 7]])
    lc.check()
    row = int(out["rows"][0])
    tm, sm = rp.track_map, rp.state_map
    good = tm[row].copy()
    assert good[0] != good[1] and min(good) >= 1 and st.owner(int(good[0])) == row
    tm[row] = good[::-1]
    with pytest.raises(_C.InvariantError, match="track map entry 0 differs"):
        lc.check()
    tm[row] = good
    lc.check()
    running = int(sm[row])
    sm[row] = int(good[0])                 # a slot the request owns, not its running one
    with pytest.raises(_C.InvariantError, match="state map says"):
        lc.check()
    sm[row] = running
    lc.check()
    # between calls a row keeps no copy-on-write source, even a tree state
    tree_slot = int(st.alloc(1)[0])
    lc.insert([9, 9, 9, 9], kv.alloc(4), tree_slot)
    assert st.owner(tree_slot) == "tree"
    rp.record(row).cow_src = tree_slot
    with pytest.raises(_C.InvariantError, match="keeps a copy-on-write source between calls"):
        lc.check()
    rp.record(row).cow_src = -1
    lc.check()


def _batch_lifecycle():
    st, kv, rp = _C.SlotAllocator(64), _C.SlotAllocator(4096), _C.ReqPool(16, 64, 2)
    return _C.Lifecycle(st, kv, rp, chunk_size=4, extra_buffer=True), st, kv, rp


def test_batch_keys_in_every_form_are_the_same_tokens() -> None:
    """The batch calls read each key as int32 tokens: prefill_batch reads
    array('q') and int64 numpy keys where they are (it only matches them),
    the other calls narrow them into the batch's buffer, any other form is
    converted; every form gives the same tree and the same matches as plain
    lists (the reference), on an empty tree and once every key is cached,
    and a token past int32 is named by key and position, before or past
    what matched."""
    rng = np.random.default_rng(5)
    lists = [rng.integers(1, 2**31 - 1, size=int(m)).tolist() for m in rng.integers(1, 40, size=12)]
    forms = [lambda k: k, lambda k: array("q", k), lambda k: np.array(k, np.int64),
             lambda k: np.array(k, np.int32), lambda k: np.array(k, np.int64)[::1], lambda k: tuple(k)]
    def keys(f):   # f: one form for every key, or None: the forms in turn
        return [(forms[i % len(forms)] if f is None else f)(k) for i, k in enumerate(lists)]

    want = None
    for form in forms + [None]:
        lc, st, kv, rp = _batch_lifecycle()
        out = lc.prefill_batch(keys(form))
        got = (out["prefix_len"].tolist(), [lc.match(array("q", k))[0].tolist() for k in lists])
        lc.unfinished_batch(out["rows"], keys(form))
        got += ([lc.match(array("q", k))[0].tolist() for k in lists],)
        lc.finish_batch(out["rows"], keys(form))
        again = lc.prefill_batch(keys(form))   # every key hits the tree now
        got += (again["prefix_len"].tolist(),)
        lc.check()
        want = got if want is None else want
        assert got == want
    assert [len(m) for m in want[2]] == [len(k) - len(k) % 4 for k in lists]   # cached up to the tracked chunk
    assert sum(want[3]) > 0 and all(0 <= p < len(k) for p, k in zip(want[3], lists))
    lc, st, kv, rp = _batch_lifecycle()
    out = lc.prefill_batch([lists[0]])
    lc.finish_batch(out["rows"], [lists[0]])
    assert lc.match(array("q", lists[0]))[0].size >= 8
    with pytest.raises(ValueError, match=r"^prefill_batch\(\): keys\[1\]\[8\] = -4294967296 is out of range"):
        lc.prefill_batch([lists[1], np.array(lists[0][:8] + [-(2**32)], np.int64)])   # past the match
    assert (st.available_size(), kv.available_size(), rp.available_size()) == (64 - lc.sizes()[2], 4096 - lc.sizes()[0], 16)
    lc.check()
    lc, st, kv, rp = _batch_lifecycle()
    keys = [array("q", k) for k in lists]
    keys[11] = array("q", [1, 2, 2**32, 4])
    with pytest.raises(ValueError, match=r"^prefill_batch\(\): keys\[11\]\[2\] = 4294967296 is out of range"):
        lc.prefill_batch(keys)
    assert (st.available_size(), kv.available_size(), rp.available_size()) == (64, 4096, 16)
    lc.check()



def _snapshot(lc, st, kv, rp, rows, keys):
    """Everything a refused call must leave as it was: pool sizes, the
    tree's sizes and matches, the rows' records and tables."""
    recs = [rp.record(int(r)).astuple() for r in rows]
    tables = [rp.table[int(r), :40].tolist() for r in rows]
    return (st.available_size(), kv.available_size(), rp.available_size(), lc.sizes(),
            [lc.match(array("q", k))[0].tolist() for k in keys], recs, tables)


@pytest.mark.parametrize("call", ["unfinished_batch", "finish_batch"])
def test_batch_end_calls_name_a_table_entry_they_refuse(call: str) -> None:
    """A row's table past its locked prefix holds the KV indices the insert
    stores: one that is free, the tree's, listed twice or out of range is
    refused with the row and position named, and the call changes nothing
    (the request keeps its snapshot); put right, the call goes through."""
    rng = np.random.default_rng(11)
    base = [rng.integers(1, 50000, size=16).tolist() for _ in range(2)]
    ext = [b + rng.integers(1, 50000, size=10).tolist() for b in base]
    lc, st, kv, rp = _batch_lifecycle()
    out = lc.prefill_batch(base)
    lc.finish_batch(out["rows"], base)
    out = lc.prefill_batch(ext)
    assert out["prefix_len"].tolist() == [16, 16]
    rows = out["rows"]
    r = int(rows[0])
    own = int(rp.table[r, 20])
    assert kv.owner(4095) == "free" and kv.owner(int(rp.table[r, 0])) == "tree"
    # a tree's index right below one of the request's own (read one off, it would pass)
    beside = max(x for x in range(1, 4095) if kv.owner(x) == "tree" and kv.owner(x + 1) == r)
    cases = [(4095, _C.OwnershipError, "is free"), (int(rp.table[r, 0]), _C.OwnershipError, "is owned by the prefix tree"),
             (beside, _C.OwnershipError, "is owned by the prefix tree"),
             (int(rp.table[r, 17]), ValueError, "is listed twice"), (10**6, ValueError, "is out of range")]
    for x, exc, why in cases:
        rp.write(r, 20, [x])
        before = _snapshot(lc, st, kv, rp, rows, ext)
        with pytest.raises(exc, match=rf"^{call}\(\): rows\[0\] \(row {r}\): its table\[20\] = {x} {why}"):
            getattr(lc, call)(rows, ext)
        assert _snapshot(lc, st, kv, rp, rows, ext) == before
        rp.write(r, 20, [own])
        lc.check()
    getattr(lc, call)(rows, ext)
    lc.check()


def test_batch_end_calls_check_the_tokens_they_read_before_any_row() -> None:
    """unfinished_batch and finish_batch read array('q') / int64 numpy keys
    in place, from each row's locked prefix on (the insert starts at the
    locked node).  A token outside int32 in what a call reads is named by
    key and position, and refused before any row of the batch changed: a
    bad second key leaves the first row as it was.  The same keys as lists
    give the same tree."""
    rng = np.random.default_rng(11)
    base = [rng.integers(1, 50000, size=16).tolist() for _ in range(2)]
    ext = [b + rng.integers(1, 50000, size=10).tolist() for b in base]   # each hits its base, 16 tokens

    def run(form, bad=None):
        lc, st, kv, rp = _batch_lifecycle()
        out = lc.prefill_batch([form(b) for b in base])
        lc.finish_batch(out["rows"], [form(b) for b in base])
        out = lc.prefill_batch([form(k) for k in ext])
        assert out["prefix_len"].tolist() == [16, 16]   # locked prefixes: the insert starts there
        rows = out["rows"]
        if bad is not None:
            for call in ("unfinished_batch", "finish_batch"):
                for i in (0, 1):
                    keys = [array("q", k) for k in ext]
                    keys[i] = np.array(ext[i], np.int64)
                    keys[i][bad] = -(2**40)
                    before = _snapshot(lc, st, kv, rp, rows, ext)
                    with pytest.raises(ValueError, match=rf"^{call}\(\): keys\[{i}\]\[{bad}\] = -1099511627776 "
                                                          r"is out of range"):
                        getattr(lc, call)(rows, keys)
                    assert _snapshot(lc, st, kv, rp, rows, ext) == before
                    lc.check()
        lc.unfinished_batch(rows, [form(k) for k in ext])
        lc.decode_batch(rows)
        lc.finish_batch(rows, [form(k + [7]) for k in ext])
        lc.check()
        return [lc.match(array("q", k + [7]))[0].tolist() for k in ext + base], lc.sizes()

    want = run(list)
    assert [len(m) for m in want[0][:2]] == [24, 24]
    for form in (lambda k: array("q", k), lambda k: np.array(k, np.int64)):
        assert run(form) == want
    assert run(lambda k: array("q", k), bad=20) == want   # past the locked prefix, in what every call reads


def test_an_insert_from_the_locked_node_refreshes_its_path_as_sglang() -> None:
    """A finishing request's insert starts at its locked node but refreshes
    the nodes of its path as a walk from the root does: SGLang v0.5.15's
    _insert_helper moves each node it passes to the MRU end of the full list
    and, when it has a state, of the state list.  Derived by hand from that
    rule: X and Y are cached, X first; request A hits X (a match refreshes
    X), a plain match refreshes Y, A finishes (its insert passes X: X is
    newer than Y again), so the one state evicted is Y's, a leaf with its 8
    tokens; X's state stays and A's extension still hits through it."""
    lc, st, kv, rp = _batch_lifecycle()
    kx, ky = list(range(100, 108)), list(range(200, 208))
    for k in (kx, ky):
        out = lc.prefill_batch([k])
        lc.finish_batch(out["rows"], [k])
    a = kx + list(range(300, 308))
    out = lc.prefill_batch([a])
    assert out["prefix_len"].tolist() == [8]
    lc.match(array("q", ky))
    lc.finish_batch(out["rows"], [array("q", a + [9])])
    assert lc.evict(0, 1)[:2] == (8, 1)
    assert [lc.match(array("q", k))[0].size for k in (kx, ky, a)] == [8, 0, 16]
    lc.check()


def _cached_leaves(lc, st, kv, keys) -> None:
    """Cache each key as its own leaf, oldest first (the LRU order)."""
    for key in keys:
        lc.insert(list(key), kv.alloc(len(key)), int(st.alloc(1)[0]))


def test_batch_extend_evicts_what_sglang_evicts() -> None:
    """SGLang's alloc_for_extend (evict_from_tree_cache) asks the tree for
    every token it is about to take, not for the shortfall, once fewer are
    free; with pages it asks for the batch's tokens plus a page a request.
    Page size 1: 32 tokens free and four cached 8-token leaves; a 40-token
    request evicts 40, that is every leaf (the shortfall, 8, would leave
    three).  Page size 4: 16 tokens free and two cached 8-token leaves; a
    14-token request needs 4 pages (16 tokens, all free) but SGLang evicts
    for 14 + 4 = 18, both leaves (the exact need would evict nothing)."""
    st, kv, rp = _C.SlotAllocator(32), _C.SlotAllocator(64), _C.ReqPool(4, 128, 2)
    lc = _C.Lifecycle(st, kv, rp, chunk_size=4, extra_buffer=True)
    _cached_leaves(lc, st, kv, [[100 + i] * 8 for i in range(4)])
    assert kv.available_size() == 32
    assert lc.prefill_batch([list(range(1, 41))]) is not None
    assert (lc.sizes()[0], kv.available_size()) == (0, 64 - 40)
    lc.check()

    st, kv, rp = _C.SlotAllocator(32), _C.SlotAllocator(32, 4), _C.ReqPool(4, 128, 2)
    lc = _C.Lifecycle(st, kv, rp, page_size=4, chunk_size=4, extra_buffer=True)
    _cached_leaves(lc, st, kv, [[100 + i] * 8 for i in range(2)])
    assert kv.available_size() == 16
    assert lc.prefill_batch([list(range(1, 15))]) is not None
    assert (lc.sizes()[0], kv.available_size()) == (0, 32 - 16)
    lc.check()


def test_batch_decode_evicts_what_sglang_evicts() -> None:
    """A decode step evicts twice in SGLang: check_decode_mem for the tokens
    the step takes, then alloc_for_decode for its estimate (a token, or with
    pages a page, per request), each time for all of it when short.  Page
    size 1: two running requests, one token free and three cached one-token
    leaves: the step evicts 2 (two leaves; the shortfall would take one).
    Page size 4: two 5-token requests take no new page, yet with one page
    free SGLang evicts for 2 * 4 = 8 tokens: two of three cached one-page
    leaves (the exact need, 0, evicts nothing)."""
    st, kv, rp = _C.SlotAllocator(32), _C.SlotAllocator(12), _C.ReqPool(4, 128, 2)
    lc = _C.Lifecycle(st, kv, rp, chunk_size=4, extra_buffer=True)
    rows = lc.prefill_batch([[1, 2, 3, 4], [5, 6, 7, 8]])["rows"]
    _cached_leaves(lc, st, kv, [[200 + i] for i in range(3)])
    assert kv.available_size() == 1
    lc.decode_batch(rows)
    assert (lc.sizes()[0], kv.available_size()) == (1, 1)
    lc.check()

    st, kv, rp = _C.SlotAllocator(32), _C.SlotAllocator(32, 4), _C.ReqPool(4, 128, 2)
    lc = _C.Lifecycle(st, kv, rp, page_size=4, chunk_size=4, extra_buffer=True)
    rows = lc.prefill_batch([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])["rows"]
    _cached_leaves(lc, st, kv, [[200 + i] * 4 for i in range(3)])
    assert kv.available_size() == 4
    lc.decode_batch(rows)
    assert (lc.sizes()[0], kv.available_size()) == (4, 12)
    lc.check()
