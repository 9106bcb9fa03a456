"""write_req_to_token refuses values its table cannot hold (int32 tables used
to wrap them silently), reads torch CPU tensors without numpy warnings, and a
huge allocation says what it could not allocate."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import mambaradix


@pytest.mark.parametrize("bad", [2**31 + 5, 2**40, -(2**31) - 1])
def test_int32_table_refuses_values_it_cannot_hold(bad):
    table = np.zeros((2, 8), dtype=np.int32)
    with pytest.raises(OverflowError, match=rf"values\[1\] = {bad} does not fit the int32 table"):
        mambaradix.write_req_to_token(table, np.array([0]), np.array([0]), np.array([1, bad]),
                                      ends=np.array([2]))
    assert not table.any()                     # nothing written


def test_int32_table_keeps_its_range_and_int64_table_takes_large_values():
    t32 = np.zeros((1, 4), dtype=np.int32)
    lim = [2**31 - 1, -(2**31), 0, 5]
    mambaradix.write_req_to_token(t32, np.array([0]), np.array([0]), np.array(lim), ends=np.array([4]))
    assert t32[0].tolist() == lim
    t64 = np.zeros((1, 2), dtype=np.int64)
    mambaradix.write_req_to_token(t64, np.array([0]), np.array([0]), np.array([2**40, 2**31 + 5]),
                                  ends=np.array([2]))
    assert t64[0].tolist() == [2**40, 2**31 + 5]


def test_torch_cpu_tensors_raise_no_numpy_warning():
    torch = pytest.importorskip("torch")
    table = torch.zeros(2, 8, dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mambaradix.write_req_to_token(table, torch.tensor([0, 1]), torch.tensor([0, 2]),
                                      torch.tensor([[1, 2], [3, 4]]))
        mambaradix.write_req_to_token(table, torch.tensor([1]), torch.tensor([5]),
                                      torch.tensor([7, 8], dtype=torch.int64), ends=torch.tensor([7]))
        with pytest.raises(OverflowError, match="values"):
            mambaradix.write_req_to_token(table, torch.tensor([0]), torch.tensor([0]),
                                          torch.tensor([[2**40]]))
    assert table[0].tolist() == [1, 2, 0, 0, 0, 0, 0, 0]
    assert table[1].tolist() == [0, 0, 3, 4, 0, 7, 8, 0]


@pytest.mark.skipif(os.environ.get("MAMBARADIX_UNDER_ASAN") == "1",
                    reason="ASan aborts on a multi-TiB malloc instead of returning NULL")
def test_huge_allocation_says_what_it_could_not_allocate():
    with pytest.raises(MemoryError, match=r"allocate\(\): conv tensor \[4, 1000001, 1048576\] "
                                          r"needs 1\.56\de\+04 GiB: out of memory"):
        mambaradix.StatePool.allocate(4, 1_000_000, [(1 << 20,)], ["float32"], (4,), "float32")
    with pytest.raises(ValueError, match=r"allocate\(\): conv tensor .* is too large"):
        mambaradix.StatePool.allocate(4, 1000, [(1 << 30, 1 << 30)], ["float32"], (4,), "float32")


@pytest.mark.parametrize("far", [-2**63, -2**62, 2**63 - 1])
def test_conv_window_positions_far_outside_clamp_as_documented(far):
    """positions take any int64: a window far before the first token (or
    past the last) is clamped row by row, as a position just outside is,
    never wrapped by the subtraction."""
    import mambaradix as mr
    pool = mr.StatePool.allocate(1, 3, [[2, 3]], "float32", [1], "float32")   # conv per slot [2, 3]
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    near = -1 if far < 0 else 10
    pool.snapshot_conv_window(0, x, [far, near], [1, 2])
    conv = np.from_dlpack(pool.conv[0])
    t = 0 if far < 0 else 3
    assert conv[0, 1].tolist() == conv[0, 2].tolist() == [[x[t, 0]] * 3, [x[t, 1]] * 3]
