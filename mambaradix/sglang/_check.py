"""Argument checks of the SGLang front ends.

Each names the argument it refuses and runs before anything changes.  None
reads an element: a tensor's or an array's dtype, shape and device decide,
so a check costs the same for any length.  The C calls behind the front
ends check values (ranges, owners, lengths); these checks stop what would
otherwise be converted on the way there (a float truncated to an index, a
bool taken as 1, a 2-D tensor flattened).
"""

from __future__ import annotations

import operator
from typing import Any, Optional

import numpy as np
import torch

__all__ = ["INT_DTYPES", "count", "index_array", "index_tensor", "integer", "one_index", "positive", "str_or_none",
           "token_array"]

# tensor dtypes that hold indices (uint64 has no int64 view: its large values would wrap)
INT_DTYPES = frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32})


def integer(v: Any, name: str) -> int:
    """v as an int: an int, a numpy integer or a one-element integer
    tensor; TypeError for anything else (a bool, a float, None)."""
    if type(v) is int:
        return v
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, not bool")
    if isinstance(v, torch.Tensor):
        index_tensor(v, name, ndim=None)
        if v.numel() != 1:
            raise ValueError(f"{name} must be one int, not a tensor of {v.numel()} elements")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(v).__name__}") from None


def _at_least(v: Any, name: str, lo: int) -> int:
    """v as an int >= lo (see integer); ValueError when below."""
    n = integer(v, name)
    if n < lo:
        raise ValueError(f"{name} must be >= {lo}, not {n}")
    return n


def count(v: Any, name: str) -> int:
    """v as an int >= 0 (see integer); ValueError when negative."""
    if type(v) is int and v >= 0:
        return v
    return _at_least(v, name, 0)


def positive(v: Any, name: str) -> int:
    """v as an int >= 1 (see integer): a size, a count of layers or heads;
    ValueError when below 1."""
    if type(v) is int and v >= 1:
        return v
    return _at_least(v, name, 1)


def str_or_none(v: Any, name: str) -> None:
    """SGLang's extra_key: a str or None."""
    if v is not None and not isinstance(v, str):
        raise TypeError(f"{name} must be a str or None, not {type(v).__name__}")


def index_tensor(x: Any, name: str, ndim: Optional[int] = 1) -> None:
    """Refuses what is not a tensor that can hold indices: not a tensor, not
    an integer dtype, more than ndim dimensions (None: any), not dense, or
    without data (meta)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, not {type(x).__name__}")
    if x.dtype not in INT_DTYPES:
        raise TypeError(f"{name} must be an integer tensor, not {x.dtype}")
    if x.layout is not torch.strided:
        raise TypeError(f"{name} must be a dense tensor, not {x.layout}")
    if ndim is not None and x.dim() > ndim:
        raise ValueError(f"{name} must be 1-dimensional, not {x.dim()}-dimensional")
    if x.is_meta:
        raise ValueError(f"{name} is a meta tensor: it holds no indices")


def _array_kind(a: np.ndarray, name: str) -> np.ndarray:
    """a if it holds integers that fit int64, in at most one dimension."""
    if a.dtype.kind not in "iu" or (a.dtype.kind == "u" and a.dtype.itemsize == 8):
        if a.dtype.kind == "O":
            raise TypeError(f"{name} must hold only ints within int64")
        raise TypeError(f"{name} must hold integers, not {'bool' if a.dtype.kind == 'b' else a.dtype}")
    if a.ndim > 1:
        raise ValueError(f"{name} must be 1-dimensional, not {a.ndim}-dimensional")
    return a


def index_array(x: Any, name: str, scalar: bool = True) -> np.ndarray:
    """Integers (a tensor, a numpy array, a buffer or sequence of ints; with
    scalar, one int too) as a one-dimensional int64 numpy array: a view of
    a CPU tensor or array where its dtype allows, else a copy (a device
    tensor is read back)."""
    if isinstance(x, torch.Tensor):
        index_tensor(x, name)
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.reshape(-1).to(torch.int64).numpy()
    try:
        a = None if isinstance(x, (str, bytes, bool, np.bool_, float)) or x is None else np.asarray(x)
    except (TypeError, ValueError):
        a = None
    if a is None or (a.ndim == 0 and not scalar):
        raise TypeError(f"{name} must be {'a tensor or ' if scalar else ''}a sequence of ints, not {type(x).__name__}")
    if a.size == 0:
        return np.empty(0, dtype=np.int64)
    return _array_kind(a, name).astype(np.int64, copy=False).reshape(-1)


def one_index(v: Any, name: str) -> int:
    """One index (a state slot): an int, or an integer tensor (any shape)
    or a sequence holding one."""
    if type(v) is int:
        return v
    if type(v) is torch.Tensor:
        try:   # one read of the tensor (a device tensor: one sync); torch refuses a float
            i = operator.index(v)
        except (TypeError, ValueError, RuntimeError, NotImplementedError):
            i = None   # named below
        # a bool tensor reads as 0 or 1: its dtype is asked only then
        if i is not None and (not 0 <= i <= 1 or v.dtype is not torch.bool):
            return i
    if isinstance(v, torch.Tensor):
        index_tensor(v, name, ndim=None)
        raise ValueError(f"{name} must hold one index, not {v.numel()}")
    if isinstance(v, (bool, np.bool_, float, np.floating)) or v is None:
        raise TypeError(f"{name} must be an int or a one-element integer tensor, not {type(v).__name__}")
    try:
        return operator.index(v)
    except TypeError:
        pass
    a = index_array(v, name)
    if a.size != 1:
        raise ValueError(f"{name} must hold one index, not {a.size}")
    return int(a[0])


def token_array(tokens: Any, name: str) -> Any:
    """A key's token ids as the C calls read them: a tensor as an int64
    numpy array (a device tensor is read back), anything else as it is (the
    C call reads SGLang's array('q'), any integer buffer and any sequence
    of ints, and names a bad element or buffer format)."""
    if isinstance(tokens, torch.Tensor):
        return index_array(tokens, name)
    if tokens is None:
        raise TypeError(f"{name} must be a sequence of ints, not NoneType")
    return tokens
