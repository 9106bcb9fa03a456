"""The entry a refused batch call names, against a brute-force reference.

Over seeded random batches: rows lists with a free row or a row listed
twice slipped in (decode_batch, finish_batch), and int64 keys (read in
place) with a token outside int32 at a random place, in a key or in its
outputs (prefill_batch, finish_batch).  The reference walks the arguments
in Python the way the documented rule reads: the first row not in use or
seen before, the first token outside int32 (a position past the key names
the output).  Each refusal must name exactly that entry, with the exception
type of its reason, and change nothing."""

import random
from array import array

import numpy as np
import pytest

from seeds import seeds

from mambaradix import _C
from mambaradix._C import OwnershipError

LO, HI = -2**31, 2**31 - 1


def _lifecycle():
    sa, ka, rp = _C.SlotAllocator(64), _C.SlotAllocator(4000), _C.ReqPool(8, 200, 2)
    lc = _C.Lifecycle(sa, ka, rp, extra_buffer=True, chunk_size=4, track_interval=4)
    return lc, sa, ka, rp


def _state(lc, sa, ka, rp) -> tuple:
    return (lc.sizes(), lc.dump(), lc.stats(), sa.counts(), ka.counts(), rp.available_size(), rp.table.tolist())


def _first_bad_row(rows, in_use):
    """(exception type, message tail) of the first bad entry, or None."""
    seen = {}
    for i, r in enumerate(rows):
        if r not in in_use:
            return OwnershipError, f"rows[{i}] = {r} is not a request row in use"
        if r in seen:
            return ValueError, f"rows[{i}] = {r} is listed twice (also at rows[{seen[r]}])"
        seen[r] = i
    return None


def _keys(rng, n):
    """n keys of distinct tokens (no shared prefix: every token is read)."""
    return [[1000 * (i + 1) + j for j in range(rng.randrange(3, 40))] for i in range(n)]


@pytest.mark.parametrize("seed", seeds(8))
def test_bad_rows_name_the_first_bad_entry(seed: int) -> None:
    rng = random.Random(seed)
    lc, sa, ka, rp = _lifecycle()
    keys = _keys(rng, rng.randrange(2, 6))
    rows = [int(r) for r in lc.prefill_batch([array("q", k) for k in keys])["rows"]]
    for _ in range(20):
        bad = list(rows)
        rng.shuffle(bad)
        for _ in range(rng.randrange(1, 3)):
            slip = rng.choice([rng.choice(rows), rng.choice([r for r in range(0, 10) if r not in rows])])
            bad.insert(rng.randrange(0, len(bad) + 1), slip)
        want = _first_bad_row(bad, set(rows))
        assert want is not None
        before = _state(lc, sa, ka, rp)
        by_row = dict(zip(rows, keys))
        with pytest.raises(want[0]) as e:
            lc.decode_batch(bad)
        tail = " (finished twice?)" if want[0] is OwnershipError else ""
        assert str(e.value) == f"decode_batch(): {want[1]}{tail}"
        with pytest.raises(want[0]) as e:
            lc.finish_batch(bad, [by_row.get(r, [1] * 50) for r in bad])
        assert str(e.value).startswith(f"finish_batch(): {want[1]}")
        assert _state(lc, sa, ka, rp) == before
    lc.check()


@pytest.mark.parametrize("seed", seeds(8))
def test_bad_tokens_name_the_key_or_output(seed: int) -> None:
    rng = random.Random(seed)
    lc, sa, ka, rp = _lifecycle()
    keys = _keys(rng, rng.randrange(1, 6))
    rows = lc.prefill_batch([array("q", k) for k in keys])["rows"]
    for _ in range(12):
        cut = [rng.randrange(0, len(k) + 1) for k in keys]
        head = [np.array(k[:c], dtype=np.int64) for k, c in zip(keys, cut)]
        tail = [np.array(k[c:], dtype=np.int64) for k, c in zip(keys, cut)]
        i = rng.randrange(len(keys))
        p = rng.randrange(len(keys[i]))
        v = rng.choice([HI + 1 + rng.randrange(2**40), LO - 1 - rng.randrange(2**40)])
        if p < cut[i]:
            head[i][p] = v
            name = f"keys[{i}][{p}]"
        else:
            tail[i][p - cut[i]] = v
            name = f"outputs[{i}][{p - cut[i]}]"
        before = _state(lc, sa, ka, rp)
        with pytest.raises(ValueError) as e:
            lc.finish_batch(rows, head, outputs=tail)
        assert str(e.value) == f"finish_batch(): {name} = {v} is out of range [{LO}, {HI}]"
        assert _state(lc, sa, ka, rp) == before
    lc.finish_batch(rows, keys)
    lc.check()


@pytest.mark.parametrize("seed", seeds(8))
def test_prefill_names_the_first_bad_token(seed: int) -> None:
    rng = random.Random(seed)
    lc, sa, ka, rp = _lifecycle()
    for _ in range(12):
        keys = [np.array(k, dtype=np.int64) for k in _keys(rng, rng.randrange(1, 6))]
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(keys))
            keys[i][rng.randrange(len(keys[i]))] = rng.choice([HI + 1, LO - 1, 2**50])
        want = next((i, j, int(t)) for i, k in enumerate(keys) for j, t in enumerate(k) if not LO <= t <= HI)
        before = _state(lc, sa, ka, rp)
        with pytest.raises(ValueError) as e:
            lc.prefill_batch(keys)
        assert str(e.value) == f"prefill_batch(): keys[{want[0]}][{want[1]}] = {want[2]} is out of range [{LO}, {HI}]"
        assert _state(lc, sa, ka, rp) == before
    lc.check()
