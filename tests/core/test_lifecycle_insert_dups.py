"""Lifecycle.insert's duplicates without pools: the caller's indices for
tokens the tree already had, past its protected length.  The reference is
SGLang's rule written out: value[min(prev_prefix_len, prefix_len):
prefix_len].  duplicates=False skips the array (None), for a caller that
frees that slice of its own value, and changes nothing else."""

from __future__ import annotations

import random

import numpy as np

from mambaradix import _C


def test_duplicates_are_the_value_slice_past_the_protected_length() -> None:
    rng = random.Random(11)
    for ps in (1, 4):
        a = _C.Lifecycle(page_size=ps, chunk_size=ps * 4)
        b = _C.Lifecycle(page_size=ps, chunk_size=ps * 4)
        keys: list = []
        for i in range(200):
            base = rng.choice(keys) if keys and rng.random() < 0.8 else []
            cut = rng.randrange(len(base) + 1) // ps * ps if base else 0
            key = base[:cut] + [rng.randrange(1, 4) for _ in range(ps * rng.randint(1, 5))]
            keys.append(key)
            value = np.arange(10_000 * i, 10_000 * i + len(key), dtype=np.int64)
            prev = rng.randrange(len(key) + 1)
            got = a.insert(key, value, i + 1, prev_prefix_len=prev)
            skip = b.insert(key, value, i + 1, prev_prefix_len=prev, duplicates=False)
            pl = got[0]
            assert got[4].tolist() == value[min(prev, pl):pl].tolist(), (ps, i)
            assert skip[4] is None and skip[:4] == got[:4]
        assert a.dump() == b.dump()
        a.check()
