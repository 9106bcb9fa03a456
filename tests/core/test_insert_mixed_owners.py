"""An insert over the lifecycle's own pools whose KV indices have more than
one owner: some straight from kv.alloc (HELD), some a request row's (its
table past its prefix, REQ(row)).  The one-pass claim that takes a batch
row's own indices gives such a value back and the classifying pass takes
it; the owner counts it hands the allocator (HELD and REQ apart, for the
new tokens and for the duplicates it frees) must match the units' owners
read one by one before the insert (the reference) and kv.check(), in
seeded random mixes with and without duplicates and an open free group."""

import random

import numpy as np
import pytest

from seeds import seeds

from mambaradix import _C


def _owners(kv, units) -> dict:
    out = {}
    for u in units:
        o = kv.owner(int(u))
        o = "req" if isinstance(o, int) else o
        out[o] = out.get(o, 0) + 1
    return out


@pytest.mark.parametrize("seed", seeds(4))
@pytest.mark.parametrize("free_group", [False, True])
def test_mixed_owners_are_counted_as_they_are(seed: int, free_group: bool) -> None:
    rng = random.Random(seed)
    sa, kv, rp = _C.SlotAllocator(64), _C.SlotAllocator(4000), _C.ReqPool(8, 256, 2)
    lc = _C.Lifecycle(sa, kv, rp, chunk_size=4, extra_buffer=True, track_interval=4)
    key = [rng.randrange(1, 9) for _ in range(120)]
    rows = lc.prefill_batch([key + [99]])["rows"]          # the row's KV past its prefix is REQ(row)
    row_units = rp.table[int(rows[0]), :120].astype(np.int64).tolist()
    rng.shuffle(row_units)
    cached = []
    for _ in range(8):
        # a prefix of a key inserted before (duplicates), then new tokens
        dup = rng.choice(cached)[: rng.randrange(1, 24)] if cached and rng.random() < 0.7 else []
        k = dup + [rng.randrange(10, 60) for _ in range(rng.randrange(2, 24))]
        value = [row_units.pop() if row_units and rng.random() < 0.5 else int(kv.alloc(1)[0]) for _ in k]
        value[rng.randrange(len(value))] = int(kv.alloc(1)[0])   # at least one HELD
        if row_units:
            value[rng.randrange(len(value))] = row_units.pop()     # at least one REQ(row)
        before, owners = kv.counts(), _owners(kv, value)
        assert owners.get("held", 0) + owners.get("req", 0) == len(k)
        if free_group:
            kv.free_group_begin()
        pl = lc.insert(k, np.array(value, dtype=np.int64), int(sa.alloc(1)[0]))[0]
        if free_group:
            kv.free_group_end()
        kv.check()   # every class count equals the units its owners name
        after = kv.counts()
        assert after["held"] == before["held"] - owners.get("held", 0)
        assert after["req"] == before["req"] - owners.get("req", 0)
        assert after["tree"] == before["tree"] + len(k) - pl
        assert after["free"] == before["free"] + pl
        assert [kv.owner(v) for v in value[pl:]] == ["tree"] * (len(k) - pl)
        cached.append(k)
