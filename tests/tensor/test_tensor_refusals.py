"""The tensor API's bad and odd inputs: numpy scalar types as dtypes, state
pools that could hold no state or alias one, strided numpy index arrays."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mambaradix import StatePool, Tensor, write_req_to_token  # noqa: E402


@pytest.mark.parametrize("np_type, name", [(np.float16, "float16"), (np.float32, "float32"),
                                           (np.int32, "int32"), (np.int64, "int64"), (np.uint8, "uint8")])
def test_numpy_scalar_types_are_dtypes(np_type, name: str) -> None:
    assert Tensor.zeros((2,), np_type).dtype == name == str(np.dtype(np_type))


@pytest.mark.parametrize("make, msg", [
    (lambda: StatePool.allocate(2, 0, [(3, 2)], "float32", (2, 2), "float32"),
     r"allocate\(\): slots must be in \[1, "),
    (lambda: StatePool([torch.zeros(2, 1, 2)], torch.zeros(2, 1, 2)),
     r"StatePool\(\): conv\[0\] has 1 slot rows \(dim 1\).*rows >= 2"),
    (lambda: StatePool([torch.zeros(0, 5, 2)], torch.zeros(0, 5, 2)),
     r"StatePool\(\): conv\[0\] has 0 layers \(dim 0\).*layers >= 1"),
])
def test_pool_without_a_usable_slot_is_refused(make, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        make()


def test_one_tensor_twice_is_refused() -> None:
    t, u = torch.zeros(2, 5, 2), torch.zeros(2, 5, 2)
    with pytest.raises(ValueError, match=r"StatePool\(\): conv\[0\] and temporal share memory"):
        StatePool([t], t)
    with pytest.raises(ValueError, match=r"StatePool\(\): conv\[0\] and conv\[1\] share memory"):
        StatePool([t, t], u)
    whole = torch.zeros(2 * 5 * 4)   # two tensors over halves of one buffer are separate memory
    p = StatePool([whole[:20].view(2, 5, 2)], whole[20:].view(2, 5, 2))
    assert p.num_slots == 4


def test_strided_numpy_indices_are_read() -> None:
    conv = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)
    temporal = torch.zeros(2, 5, 2)
    p = StatePool([conv], temporal)
    src, dst = np.array([1, 0, 2, 0])[::2], np.array([3, 0, 4, 0])[::2]
    p.copy_slots(src, dst)
    expected = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)
    expected[:, 3], expected[:, 4] = expected[:, 1].clone(), expected[:, 2].clone()
    assert torch.equal(conv, expected)


def test_write_req_to_token_names_the_shape_of_values() -> None:
    table = np.zeros((4, 8), dtype=np.int32)
    with pytest.raises(ValueError, match=r"write_req_to_token\(\): values must be \[n\] or \[n, w\]"):
        write_req_to_token(table, [1], [0], np.ones((1, 1, 2), np.int32))
    assert not table.any()


@pytest.mark.parametrize("dtype", [np.uint64, np.int8, np.uint8, np.float64])
def test_numpy_indices_of_other_dtypes_are_refused(dtype) -> None:
    p = StatePool([torch.zeros(2, 5, 3)], torch.zeros(2, 5, 2))
    with pytest.raises(TypeError, match=rf"copy_slots\(\): src must hold int32 or int64 indices, not "
                                        rf"{np.dtype(dtype)}"):
        p.copy_slots(np.array([1], dtype=dtype), [3])
    with pytest.raises(TypeError, match=rf"src must hold int32 or int64 indices, not {np.dtype(dtype)}"):
        p.copy_slots(np.array([], dtype=dtype), np.array([], dtype=np.int64))


I64 = 2**63 - 1


@pytest.mark.parametrize("case", ["start at int64's end", "end before start, far", "lengths that wrap"])
def test_write_req_to_token_refuses_ranges_past_int64_without_writing(case) -> None:
    """Starts and ends take any int64: a range whose end or length does not
    fit (starts[i] + width, ends[i] - starts[i], their sum) is refused by
    comparison, never by a sum that wraps into the table's range."""
    table = np.zeros((2, 8), dtype=np.int32)
    guard = np.full(32, 5, dtype=np.int32)
    if case == "start at int64's end":
        with pytest.raises(IndexError, match=r"starts\[0\] = 9223372036854775807"):
            write_req_to_token(table, [0], [I64], [5])
    elif case == "end before start, far":
        with pytest.raises(IndexError, match=r"ends\[0\] = -9223372036854775808 is before starts\[0\] = 1"):
            write_req_to_token(table, [0, 0, 1], [1, 1, 0], [7], ends=[-2**63, -2**63, 3])
    else:
        with pytest.raises(IndexError, match=r"outside the table"):
            write_req_to_token(table, [0, 1], [0, 0], np.arange(9, dtype=np.int32), ends=[I64, 2])
    assert not table.any() and (guard == 5).all()


def test_a_snapshot_source_inside_the_pool_is_refused() -> None:
    """h (or x) sharing memory with the pool's state tensors would be read
    while the snapshot writes it: refused, nothing written."""
    pool = StatePool.allocate(1, 3, [[1]], "float32", [2], "float32")     # temporal [1, 4, 2]
    temporal = np.from_dlpack(pool.temporal)
    temporal[...] = np.arange(8, dtype=np.float32).reshape(1, 4, 2)
    before = temporal.copy()
    h = temporal.reshape(-1)[1:7].reshape(3, 2)
    with pytest.raises(ValueError, match="h shares memory with the pool's state tensors"):
        pool.snapshot_ssm_from_h(0, h, [0], [1])
    assert np.array_equal(temporal, before)
    pool.snapshot_ssm_from_h(0, h.copy(), [0], [1])       # the same values from outside the pool
    assert temporal[0, 1].tolist() == before.reshape(-1)[1:3].tolist()


@pytest.mark.parametrize("device", [(7, 0), (3, 0), (1, 5), (0, 0)])
def test_memory_is_made_only_on_the_cpu_or_a_cuda_device(device) -> None:
    with pytest.raises(ValueError, match=r"zeros\(\): device must be the CPU"):
        Tensor.zeros((4,), "float32", device=device)
    with pytest.raises(ValueError, match=r"allocate\(\): device must be the CPU"):
        StatePool.allocate(1, 3, [[1]], "float32", [2], "float32", device=device)
