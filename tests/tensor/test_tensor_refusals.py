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
