"""Lifecycle.match reads an int64 key (SGLang's array('q') tokens) in place,
only as far as the walk goes.  The reference: the same tree built twice,
one matched with the key narrowed to int32 first (the path every other key
type takes).  A token outside int32 matches nothing: in the int32 copy it
becomes a token no inserted key holds."""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest

from mambaradix import _C

NEVER = 2**31 - 1   # no key below holds it


def _tree(seed: int, ps: int):
    rng = random.Random(seed)
    lc = _C.Lifecycle(page_size=ps, chunk_size=max(4, ps))
    keys: list = []
    for i in range(40):
        base = rng.choice(keys) if keys and rng.random() < 0.7 else []
        cut = rng.randrange(len(base) + 1) // ps * ps if base else 0
        k = list(base[:cut]) + [rng.randrange(1, 6) for _ in range(ps * rng.randint(1, 6))]
        keys.append(k)
        lc.insert(np.asarray(k, dtype=np.int64), np.arange(1000 * i, 1000 * i + len(k), dtype=np.int64), i + 1)
    return lc, keys, rng


@pytest.mark.parametrize("ps", [1, 4])
def test_int64_keys_match_as_their_int32_copies(ps: int) -> None:
    for seed in range(12):
        a, keys, rng = _tree(seed, ps)
        b, _, _ = _tree(seed, ps)
        for j in range(60):
            k = list(rng.choice(keys))[: rng.randrange(1, 40)] + [rng.randrange(1, 6) for _ in range(rng.randrange(8))]
            if rng.random() < 0.3:   # a token past int32, some equal to an inserted token mod 2**32
                k[rng.randrange(len(k))] = rng.choice([2**31, -(2**31) - 1, 2**32 + 1, 2**32 + 3, 2**40 + 2])
            limit = rng.choice([-1, -1, rng.randrange(len(k) + 2)])
            key64 = array("q", k) if j % 2 else np.asarray(k, dtype=np.int64)
            got = a.match(key64, limit=limit)
            want = b.match(np.asarray([t if -(2**31) <= t < 2**31 else NEVER for t in k], dtype=np.int32),
                           limit=limit)
            assert got[0].tolist() == want[0].tolist() and got[1:] == want[1:], (seed, j)
            assert a.dump() == b.dump()   # the same splits and LRU order
        a.check()


def test_other_keys_still_read_and_checked() -> None:
    lc = _C.Lifecycle()
    lc.insert([1, 2, 3], [10, 11, 12], 1)
    assert lc.match(array("i", [1, 2, 3]))[0].tolist() == [10, 11, 12]   # int32 buffer
    assert lc.match([1, 2, 9])[0].tolist() == []                         # list: no state at [1, 2]
    assert lc.match(np.array([1, 2, 3], dtype=np.int64)[::-1][::-1])[0].tolist() == [10, 11, 12]
    with pytest.raises(ValueError, match="key"):
        lc.match([1, 2**40])          # a list is converted, and checked
    with pytest.raises(TypeError, match="key"):
        lc.match(array("d", [1.0]))


@pytest.mark.parametrize("ps", [1, 16])
def test_long_int64_keys_compare_block_by_block(ps: int) -> None:
    """One edge of hundreds of tokens (the walk compares it in blocks):
    negative tokens, and tokens past int32 equal to an inserted token mod
    2**32, put anywhere, including in the middle of a block.  The reference
    is a pure-Python longest common prefix: the KV walk ends (and reports
    its branching point, chunk = page) at the last whole page the keys
    agree on."""
    rng = random.Random(7)
    for trial in range(24):
        n = rng.randrange(64, 300) // ps * ps
        lo, hi = [(0, 50000), (-(2**31), 2**31), (-3, 3)][trial % 3]   # vocabulary ids, any int32, few
        base = [rng.randrange(lo, hi) for _ in range(n)]
        for _ in range(8):
            lc = _C.Lifecycle(page_size=ps, chunk_size=ps)
            lc.insert(np.asarray(base, dtype=np.int64), np.arange(n, dtype=np.int64), 1)
            k = list(base)
            at = rng.randrange(n)
            k[at] = rng.choice([base[at] + 2**32, base[at] - 2**32, base[at] + 1, base[at] ^ (1 << 31), 2**63 - 1,
                                -(2**63)])
            aligned = next(i for i, (x, y) in enumerate(zip(k, base)) if x != y) // ps * ps
            got = lc.match(array("q", k))
            assert got[0].tolist() == [] and got[4] == (aligned or -1), (trial, at)
            lc.check()
        lc = _C.Lifecycle(page_size=ps, chunk_size=ps)
        lc.insert(np.asarray(base, dtype=np.int64), np.arange(n, dtype=np.int64), 1)
        assert lc.match(array("q", base))[0].tolist() == list(range(n))


def test_prefill_batch_keeps_in_place_keys_alive() -> None:
    # prefill_batch reads int64 keys where they are and its namespaces after
    # them: a namespace's __index__ drops the caller's only reference to a
    # key and fills a new array of its size (where the freed memory may go):
    # the batch matches the key it was given.  Reference: the same batch
    # with nothing dropped.
    n = 1 << 16

    class Drops:
        def __init__(self, keys, junk):
            self.keys, self.junk = keys, junk

        def __index__(self):
            self.keys.clear()
            self.junk.append(np.full(n, 3, dtype=np.int64))
            return 0

    def run(drop: bool):
        sa, ka, rp = _C.SlotAllocator(16), _C.SlotAllocator(2 * n + 64), _C.ReqPool(4, n + 16, 2)
        lc = _C.Lifecycle(sa, ka, rp, extra_buffer=True, chunk_size=4, track_interval=4)
        first = lc.prefill_batch([np.arange(1, n + 1, dtype=np.int64)])["rows"].tolist()
        lc.finish_batch(first, [np.arange(1, n + 3, dtype=np.int64)])
        keys, junk = [np.arange(1, n + 9, dtype=np.int64)], []
        out = lc.prefill_batch(keys, ns=[Drops(keys, junk) if drop else 0])
        lc.check()
        return out["prefix_len"].tolist(), lc.sizes()

    got = run(True)
    assert got == run(False) and got[0][0] > n // 2
