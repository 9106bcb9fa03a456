"""Index and mask arguments of the state kernels in every host form (lists,
tuples, numpy arrays of each accepted dtype, strided views, torch CPU
tensors) select the same slots as numpy fancy indexing does; a snapshot
source of a dtype the pool cannot take is refused with nothing written."""

from __future__ import annotations

import numpy as np
import pytest

import mambaradix

torch = pytest.importorskip("torch")

LAYERS, SLOTS = 2, 9


def make_pool(seed: int):
    rng = np.random.default_rng(seed)
    conv = rng.standard_normal((LAYERS, SLOTS + 1, 4, 3)).astype(np.float32)
    temporal = rng.standard_normal((LAYERS, SLOTS + 1, 2, 3, 4)).astype(np.float32)
    return mambaradix.StatePool([conv], temporal), conv, temporal


def copied(states, src, dst):
    """numpy's reference: every state tensor's slots dst take slots src."""
    out = [s.copy() for s in states]
    for s in out:
        s[:, np.asarray(dst, dtype=np.int64)] = s[:, np.asarray(src, dtype=np.int64)]
    return out


MASKS = {
    "bool list": [True, False, True, False],
    "int list": [2, 0, 1, 0],
    "numpy bool": np.array([True, False, True, False]),
    "numpy int8": np.array([1, 0, -1, 0], dtype=np.int8),
    "numpy uint8": np.array([7, 0, 1, 0], dtype=np.uint8),
    "numpy int32": np.array([1, 0, 5, 0], dtype=np.int32),
    "numpy strided": np.array([1, 1, 0, 0, 1, 1, 0, 0], dtype=np.int64)[::2],
    "torch bool": torch.tensor([True, False, True, False]),
}


@pytest.mark.parametrize("form", sorted(MASKS))
def test_every_mask_form_selects_the_same_pairs(form):
    pool, conv, temporal = make_pool(1)
    running, track = [1, 2, 3, 4], [5, 6, 7, 8]
    want = copied([conv, temporal], [1, 3], [5, 7])      # entries 0 and 2 are selected
    pool.track_decode(running, track, MASKS[form])
    assert np.array_equal(conv, want[0]) and np.array_equal(temporal, want[1])


def test_a_lone_true_mask_and_lone_indices_copy_one_pair():
    pool, conv, temporal = make_pool(2)
    want = copied([conv, temporal], [3], [9])
    pool.track_decode(3, 9, True)
    assert np.array_equal(conv, want[0]) and np.array_equal(temporal, want[1])
    pool.track_decode(4, 8, False)                        # masked out: nothing copied
    assert np.array_equal(conv, want[0]) and np.array_equal(temporal, want[1])


INDICES = {
    "list": ([1, 2, 3], [7, 8, 9]),
    "tuple": ((1, 2, 3), (7, 8, 9)),
    "numpy int32": (np.array([1, 2, 3], np.int32), np.array([7, 8, 9], np.int32)),
    "numpy strided int64": (np.arange(1, 7)[::2], np.arange(7, 10)),
    "0-d and numpy scalars": (np.int64(2), np.array(9)),
    "torch int32": (torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([7, 8, 9], dtype=torch.int32)),
}


@pytest.mark.parametrize("form", sorted(INDICES))
def test_every_index_form_copies_like_numpy(form):
    pool, conv, temporal = make_pool(3)
    src, dst = INDICES[form]
    src_ref = np.asarray(src, dtype=np.int64).reshape(-1)
    dst_ref = np.asarray(dst, dtype=np.int64).reshape(-1)
    want = copied([conv, temporal], src_ref, dst_ref)
    pool.copy_slots(src, dst)
    assert np.array_equal(conv, want[0]) and np.array_equal(temporal, want[1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.int32])
def test_snapshot_of_an_h_the_pool_cannot_take_writes_nothing(dtype):
    pool, conv, temporal = make_pool(4)
    before = temporal.copy()
    h = torch.ones(3, 2, 3, 4).to(dtype)
    with pytest.raises(TypeError, match=rf"snapshot_ssm_from_h\(\): h has dtype {str(dtype)[6:]}, the pool's "
                                        r"temporal float32"):
        pool.snapshot_ssm_from_h(0, h, [0], [1])
    assert np.array_equal(temporal, before)
    pool.snapshot_ssm_from_h(0, torch.ones(3, 2, 3, 4).to(torch.bfloat16), [2], [1])   # converted
    assert np.array_equal(temporal[0, 1], np.ones((2, 3, 4), np.float32))


def test_indices_that_alias_the_pool_are_read_once_before_the_copy():
    """A host index array that is a view of the memory the copy writes: the
    kernel takes the indices as they were checked (a copy), not as the copy
    rewrites them, so every pair lands where the check allowed."""
    pool = mambaradix.StatePool.allocate(1, 3, [[2]], "int64", [1], "float32")   # conv: [1, 4, 2] int64
    conv = np.from_dlpack(pool.conv[0])
    conv[0, 1] = [0, 10**6]            # slot 1's state: what the first copy writes into dst's memory
    conv[0, 2] = [5, 6]
    dst = conv.reshape(-1)[6:8]        # slot 3's memory, as the dst indices [3, 0]
    dst[:] = [3, 0]
    src = np.array([1, 2], dtype=np.int64)
    want = conv.copy()
    want[0, 3] = want[0, 1]
    want[0, 0] = want[0, 2]
    pool.copy_slots(src, dst)
    assert np.array_equal(conv, want)


def test_an_index_array_cannot_be_resized_away_during_the_call():
    """copy_slots holds the index arrays it reads: a later argument's
    __index__ that resizes src is refused by numpy, so the call fails
    cleanly with nothing copied."""
    pool, conv, temporal = make_pool(3)
    before = conv.copy()
    held = [np.arange(1, 9, dtype=np.int64)]

    class Dst:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            if held:
                np.ndarray.resize(held.pop(), (1,))
            return self.v

    with pytest.raises((TypeError, ValueError)):
        pool.copy_slots(held[0], [Dst(0)] + [0] * 7)
    assert np.array_equal(conv, before)
