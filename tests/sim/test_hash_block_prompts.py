"""The simulator's synthetic tokens.  Mooncake prompts kept as hash blocks:
what a read of ``input_ids`` makes (against expand_hash_blocks), and
``prefix_bounds`` (against brute-force longest common prefixes over every
pair of requests).  Pseudo output tokens (against the rule in Python
integers)."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest

from mambaradix.sim import SimConfig, workloads as wl
from mambaradix.sim.checks import check_requests
from mambaradix.sim.engine import replay


@pytest.mark.parametrize("vocab", [2, 1000, 131072, 151936, 2**31 - 1, 2**31])
@pytest.mark.parametrize("block", [1, 5, 16])
def test_block_tokens_are_the_multiply_high(vocab, block):
    # the rule in Python integers: token j of block b is the top bits of the
    # 32-bit product key(b) * mult(j), scaled into [0, vocab)
    rng = np.random.default_rng(vocab + block)
    blocks = wl.HashBlocks(rng.integers(0, 2**63, 12), block, vocab, 3)
    keys, mults = [int(k) for k in blocks.keys], [int(m) for m in blocks.mults]
    for first, n in ((0, 12 * block), (3, 4 * block + 1), (11, block), (5, 0), (2, 2 * block - 1)):
        want = [(keys[first + i // block] * mults[i % block] % 2**32 * vocab) >> 32 for i in range(n)]
        out = np.full(n, -7, dtype=np.int32)
        blocks.write(first, out)
        assert out.view(np.uint32).tolist() == want
        strided = np.full(2 * n, -7, dtype=np.int32)
        blocks.write(first, strided[::2])       # (not contiguous: written through a copy)
        assert strided[::2].view(np.uint32).tolist() == want and (strided[1::2] == -7).all()


def test_block_tokens_refuse_bad_arguments():
    from mambaradix import _C
    keys = np.arange(4, dtype=np.uint32)
    mults = np.ones(2, dtype=np.uint32)
    out = np.zeros(3, dtype=np.int32)
    with pytest.raises(ValueError, match="keys has 4"):
        _C.hash_blocks_write(keys, mults, 3, 10, out)     # blocks 3 and 4: one past the end
    with pytest.raises(TypeError, match="keys"):
        _C.hash_blocks_write(keys.astype(np.int64), mults, 0, 10, out)
    with pytest.raises(TypeError, match="out"):
        _C.hash_blocks_write(keys, mults, 0, 10, out.astype(np.int64))
    with pytest.raises(TypeError, match="out"):
        _C.hash_blocks_write(keys, mults, 0, 10, np.zeros(6, dtype=np.int32)[::2])
    with pytest.raises(ValueError, match="vocab_size"):
        _C.hash_blocks_write(keys, mults, 0, 0, out)
    with pytest.raises(ValueError, match="mults is empty"):
        _C.hash_blocks_write(keys, mults[:0], 0, 10, out)
    assert (out == 0).all()


@pytest.mark.parametrize("victim", ["keys", "mults"])
def test_block_tokens_read_the_arrays_after_the_ints(victim):
    """An int argument's __index__ that reinterprets an array (uint32 as
    uint8: the same bytes, 4x the length) runs before the arrays are checked,
    so the call refuses the array instead of reading past its end."""
    from mambaradix import _C
    arrays = {"keys": np.arange(1, 5, dtype=np.uint32), "mults": np.ones(2, dtype=np.uint32)}

    class First:
        def __index__(self):
            arrays[victim].dtype = np.uint8
            return 0

    out = np.zeros(8, dtype=np.int32)
    with pytest.raises(TypeError, match=f"{victim} must be a 1-D C-contiguous uint32"):
        _C.hash_blocks_write(arrays["keys"], arrays["mults"], First(), 1 << 32, out)
    assert (out == 0).all()


M64 = 2**64 - 1


def _pseudo_reference(rid: str, n: int, vocab: int) -> list:
    """The documented rule in Python integers: FNV-1a 64 of the rid's UTF-8
    bytes, then splitmix64's mix of h + j * golden, mod vocab, plus 1."""
    h = 1469598103934665603
    for byte in rid.encode():
        h = ((h ^ byte) * 1099511628211) & M64
    out = []
    for j in range(n):
        z = (h + j * 0x9E3779B97F4A7C15) & M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        z ^= z >> 31
        out.append(z % vocab + 1)
    return out


@pytest.mark.parametrize("vocab", [1, 7, 150000, 2**31 - 1])
def test_pseudo_outputs_follow_the_rule(vocab):
    from mambaradix import _C
    rids = ["a", "", "req-17#spare", "é✓", "r" * 300, "a"]
    counts = [5, 3, 2, 4, 0, 9]
    tokens, starts = _C.pseudo_tokens(rids, counts, vocab)
    assert tokens.dtype == np.int32 and starts.dtype == np.int64
    assert starts.tolist() == [0, 5, 8, 10, 14, 14, 23]
    for i, (rid, n) in enumerate(zip(rids, counts)):
        assert tokens[starts[i]:starts[i + 1]].tolist() == _pseudo_reference(rid, n, vocab), rid
    # the engine's rule: vocabulary 150000, one request's alone or with others alike
    from mambaradix.sim.engine import _pseudo_outputs
    assert _pseudo_outputs("req-3", 40).tolist() == _pseudo_reference("req-3", 40, 150000)


def test_pseudo_outputs_refuse_bad_arguments():
    from mambaradix import _C
    with pytest.raises(ValueError, match="rids has 2 items but counts has 1"):
        _C.pseudo_tokens(["a", "b"], [1], 10)
    with pytest.raises(TypeError, match=r"rids\[1\] must be a str, not int"):
        _C.pseudo_tokens(["a", 3], [1, 1], 10)
    with pytest.raises(TypeError, match="rids must be a sequence"):
        _C.pseudo_tokens(5, [1], 10)
    with pytest.raises(ValueError, match=r"counts\[0\] = -1 is out of range"):
        _C.pseudo_tokens(["a"], [-1], 10)
    with pytest.raises(ValueError, match="vocab_size"):
        _C.pseudo_tokens(["a"], [1], 0)
    with pytest.raises(ValueError, match="vocab_size"):
        _C.pseudo_tokens(["a"], [1], 2**31)
    with pytest.raises(UnicodeEncodeError):
        _C.pseudo_tokens(["\ud800"], [1], 10)
    # reading counts runs Python code that empties the rids list: the call
    # works on the rids it was given
    rids = ["a", "b"]

    class Count:
        def __index__(self):
            rids.clear()
            return 3

    tokens, starts = _C.pseudo_tokens(rids, [Count(), 2], 7)
    assert rids == [] and starts.tolist() == [0, 3, 5]
    assert tokens.tolist() == _pseudo_reference("a", 3, 7) + _pseudo_reference("b", 2, 7)


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _trace(tmp_path, seed: int, n: int, block: int) -> str:
    """Conversations that extend each other, share first blocks, or not."""
    rng = random.Random(seed)
    chains: list = []
    lines = []
    next_id = 0
    for i in range(n):
        pick = rng.random()
        if chains and pick < 0.5:
            base = list(rng.choice(chains))[:rng.randint(0, 6)]
        else:
            base = []
        ids = base + list(range(next_id, next_id + rng.randint(1, 4)))
        next_id += len(ids)
        chains.append(ids)
        length = (len(ids) - 1) * block + rng.randint(1, block)
        lines.append(json.dumps({"timestamp": i, "input_length": length,
                                 "output_length": rng.randint(1, 9), "hash_ids": ids}))
    path = tmp_path / f"t{seed}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_input_ids_are_the_expanded_blocks_on_every_read(tmp_path):
    path = _trace(tmp_path, 1, 30, 16)
    reqs = wl.load_mooncake(path, block_size=16, vocab_size=1000, seed=3)
    recs = [json.loads(x) for x in open(path)]
    for r, rec in zip(reqs, recs):
        want = wl.expand_hash_blocks(np.array(rec["hash_ids"]), 16, 1000, 3).reshape(-1)
        want = want[:rec["input_length"]]
        got = r.input_ids
        assert got.dtype == np.int32 and np.array_equal(got, want)
        assert r.prompt_len == len(want) and r.generated_prompt
        out = np.full(len(want), -1, dtype=np.int32)
        r.write_prompt(out)
        assert np.array_equal(out, want)
        got[:] = -1                         # a read is a new array each time
        assert np.array_equal(r.input_ids, want)
    # an assigned array makes an ordinary prompt, which validation scans
    r = reqs[0]
    r.input_ids = np.array([5, -1], dtype=np.int32)
    assert not r.generated_prompt and r.prompt_len == 2
    with pytest.raises(ValueError, match=r"input_ids\[1\] is -1"):
        check_requests([r])
    again = dataclasses.replace(reqs[1], output_len=4)
    assert np.array_equal(again.input_ids, reqs[1].input_ids) and again.output_len == 4


def _rows(blocks: "wl.HashBlocks", keys: np.ndarray) -> np.ndarray:
    blocks.keys = keys.astype(np.uint32)
    out = np.empty(len(keys) * blocks.block_size, dtype=np.int32)
    blocks.write(0, out)
    return out.reshape(len(keys), blocks.block_size)


def test_rows_distinct():
    # one token a block: distinct ids share tokens
    assert not wl.HashBlocks(np.arange(3), 1, 1 << 17, 0).rows_distinct()
    assert wl.HashBlocks(np.arange(3), 512, 1 << 17, 0).rows_distinct()
    assert not wl.HashBlocks(np.arange(3), 512, 2, 0).rows_distinct()   # too few tokens to tell
    # two tokens of 1024 values: some pair of keys has the same row, found
    # by brute force over every key a + d near a (d * m(0) within 2**22)
    blocks = wl.HashBlocks(np.arange(3), 2, 1024, 0)
    assert not blocks.rows_distinct()
    inv = pow(int(blocks.mults[0]), -1, 1 << 32)
    e = np.arange(-(1 << 22), 1 << 22, dtype=np.int64)
    d = ((e % (1 << 32)).astype(np.uint64) * np.uint64(inv)) & np.uint64(0xFFFFFFFF)
    d = d[d != 0]
    a = np.uint64(123456789)
    rows = _rows(wl.HashBlocks(np.arange(1), 2, 1024, 0), np.concatenate(([a], (a + d) & np.uint64(0xFFFFFFFF))))
    assert (rows[1:] == rows[0]).all(axis=1).any()


@pytest.mark.parametrize("seed", range(6))
def test_prefix_bounds_hold_for_every_pair(tmp_path, seed):
    # a small vocabulary: blocks of different ids often start alike
    block, vocab = 8, 1 << 12
    reqs = wl.load_mooncake(_trace(tmp_path, seed, 60, block), block_size=block,
                            vocab_size=vocab, seed=seed)
    assert wl.HashBlocks(np.arange(2), block, vocab, seed).rows_distinct()
    bounds = wl.prefix_bounds(reqs)
    assert bounds is not None and any(b is not None for b in bounds)
    prompts = [r.input_ids for r in reqs]
    rng = np.random.default_rng(seed)
    tight = 0
    for i, (p, b) in enumerate(zip(prompts, bounds)):
        # whatever follows the prompt (outputs) does not matter
        tokens = np.concatenate([p, rng.integers(0, vocab, 40, dtype=np.int32)])
        longest = max(_lcp(tokens, q) for j, q in enumerate(prompts) if j != i)
        if b is None:
            continue
        assert longest < b, (i, longest, b)
        tight += longest >= b - block
    assert tight            # the bound is not loose by a whole block everywhere


def test_no_bounds_for_other_requests(tmp_path):
    reqs = wl.load_mooncake(_trace(tmp_path, 0, 10, 8), block_size=8)
    mixed = reqs + wl.generated_shared_prefix(num_groups=1, prompts_per_group=2, seed=1)
    assert wl.prefix_bounds(mixed) is None
    reqs[0].input_ids = reqs[0].input_ids     # now an ordinary prompt
    assert wl.prefix_bounds(reqs) is None
    other = wl.load_mooncake(_trace(tmp_path, 1, 10, 8), block_size=8)
    assert wl.prefix_bounds(reqs[1:] + other) is None   # two block tables


def test_replay_is_the_same_with_prompts_as_arrays(tmp_path):
    # the bounded record of keys seen and the prompts made on demand change
    # nothing: the same trace with its prompts as plain arrays replays alike
    reqs = wl.load_mooncake(_trace(tmp_path, 2, 80, 16), block_size=16, vocab_size=1 << 12)
    plain = [wl.SimRequest(rid=r.rid, input_ids=r.input_ids, output_len=r.output_len,
                           arrival=r.arrival) for r in reqs]
    assert wl.prefix_bounds(reqs) is not None and wl.prefix_bounds(plain) is None
    for cfg in (SimConfig(kv_tokens=600, state_slots=60, max_running=4, chunk_size=16,
                          track_interval=16, chunked_prefill_size=64),
                SimConfig(kv_tokens=3000, state_slots=30, max_running=8, chunk_size=16,
                          track_interval=32, mode="pp1", semantics="v0.5.15")):
        a, b = replay(reqs, cfg, check_every_step=True), replay(plain, cfg, check_every_step=True)
        ma, mb = dataclasses.asdict(a.metrics), dataclasses.asdict(b.metrics)
        ma.pop("wall_seconds"), mb.pop("wall_seconds")
        assert ma == mb and a.prefixes == b.prefixes
        assert a.metrics.lost_eviction > 0 and a.metrics.state_usable_tokens > 0


def test_key_of_a_running_request_counts_as_seen():
    # B repeats A's prompt while A decodes: A's prompt went into the tree
    # when its prefill ended (no_buffer caches every prefilled token), so all
    # of B's prompt was seen before, and its last token only lies past the
    # match cap (L - 1): 1 token lost to the cap, none never seen
    prompt = np.arange(1, 101, dtype=np.int32)
    reqs = [wl.SimRequest(rid="a", input_ids=prompt, output_len=50, arrival=0.0),
            wl.SimRequest(rid="b", input_ids=prompt.copy(), output_len=5, arrival=0.2)]
    cfg = SimConfig(kv_tokens=4096, state_slots=20, max_running=4, mode="no_buffer")
    m = replay(reqs, cfg, check_every_step=True).metrics
    assert (m.never_seen_tokens, m.lost_match_cap, m.kv_matched_tokens) == (100, 1, 99)


@pytest.mark.parametrize("collecting", [True, False])
def test_loading_leaves_the_collector_as_it_was(tmp_path, collecting):
    # the loader pauses the cyclic collector while it reads, then restores
    # whatever state it found, also when the trace is refused
    import gc

    was = gc.isenabled()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_length": 3}\n')
    try:
        (gc.enable if collecting else gc.disable)()
        assert len(wl.load_mooncake(_trace(tmp_path, 4, 5, 16), block_size=16)) == 5
        assert gc.isenabled() is collecting
        with pytest.raises(wl.TraceFormatError, match="missing field"):
            wl.load_mooncake(str(bad), block_size=16)
        assert gc.isenabled() is collecting
    finally:
        (gc.enable if was else gc.disable)()
