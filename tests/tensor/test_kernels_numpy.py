"""The state kernels' C twins on numpy arrays, against element-by-element
Python loops (no torch): a second, independent check of what
tests/tensor/test_kernels_cpu.py compares with torch indexing.  Values are small
integers in float64, so every comparison is exact."""

from __future__ import annotations

import numpy as np

import mambaradix

LAYERS, SLOTS, DIM, KM1 = 2, 6, 3, 2
TSHAPE = (2, 3)


def _pool(seed: int):
    rng = np.random.default_rng(seed)
    conv = rng.integers(1, 1000, size=(LAYERS, SLOTS + 1, DIM, KM1)).astype(np.float64)
    temporal = rng.integers(1, 1000, size=(LAYERS, SLOTS + 1) + TSHAPE).astype(np.float64)
    return mambaradix.StatePool([conv], temporal), conv, temporal


def test_copy_clear_and_track_decode_elementwise() -> None:
    pool, conv, temporal = _pool(1)
    c0, t0 = conv.copy(), temporal.copy()
    pool.copy_slots([2, 5], [4, 1])          # 2 -> 4, 5 -> 1
    for layer in range(LAYERS):
        for s in range(SLOTS + 1):
            src = {4: 2, 1: 5}.get(s, s)
            assert (conv[layer, s] == c0[layer, src]).all()
            assert (temporal[layer, s] == t0[layer, src]).all()
    c1, t1 = conv.copy(), temporal.copy()
    pool.clear_slots([3])
    for layer in range(LAYERS):
        for s in range(SLOTS + 1):
            want_c = 0.0 if s == 3 else None
            if want_c is None:
                assert (conv[layer, s] == c1[layer, s]).all() and (temporal[layer, s] == t1[layer, s]).all()
            else:
                assert (conv[layer, s] == 0).all() and (temporal[layer, s] == 0).all()
    c2, t2 = conv.copy(), temporal.copy()
    # running 1 -> track 6 (masked in), running 2 -> track 5 (masked out)
    pool.track_decode([1, 2], [6, 5], np.array([True, False]))
    for layer in range(LAYERS):
        assert (conv[layer, 6] == c2[layer, 1]).all() and (temporal[layer, 6] == t2[layer, 1]).all()
        assert (conv[layer, 5] == c2[layer, 5]).all() and (temporal[layer, 5] == t2[layer, 5]).all()
        for s in range(5):
            assert (conv[layer, s] == c2[layer, s]).all()


def test_snapshot_ssm_takes_the_named_chunk() -> None:
    pool, _, temporal = _pool(2)
    nt = 5
    h = np.zeros((1, nt) + TSHAPE)
    for k in range(nt):
        h[0, k] = 100 * (k + 1) + np.arange(np.prod(TSHAPE)).reshape(TSHAPE)  # chunk k is recognisable
    before = temporal.copy()
    pool.snapshot_ssm_from_h(1, h, [3, 0], [2, 4])
    assert (temporal[1, 2] == h[0, 3]).all()
    assert (temporal[1, 4] == h[0, 0]).all()
    changed = {(1, 2), (1, 4)}
    for layer in range(LAYERS):
        for s in range(SLOTS + 1):
            if (layer, s) not in changed:
                assert (temporal[layer, s] == before[layer, s]).all()


def test_snapshot_conv_window_ends_at_the_position() -> None:
    pool, conv, _ = _pool(3)
    T = 10
    x = np.array([[10.0 * t + d for d in range(DIM)] for t in range(T)])  # x[t, d] names t
    pool.snapshot_conv_window(0, x, [4, 1], [3, 5])
    for j in range(KM1):
        for d in range(DIM):
            # the window of the last KM1 inputs before position p: tokens p-KM1 .. p-1
            assert conv[0, 3, d, j] == x[4 - KM1 + j, d]
            assert conv[0, 5, d, j] == x[max(1 - KM1 + j, 0), d]   # clamped at the start
