"""DLPack import/export of mambaradix.Tensor: round trips with numpy and
torch (versioned and legacy capsules), ownership (each producer deleter runs
exactly once, on success and on every error path), and every refused input.

The test-only producer `_C._testing_make_capsule` fills its memory with the
byte pattern (i * 37 + 11) & 0xFF, so data read through the consumer can be
checked without numpy or torch doing the producing.
"""

import gc
import sys

import numpy as np
import pytest

import mambaradix
from mambaradix import _C

Tensor = mambaradix.Tensor


def pattern(nbytes):
    return ((np.arange(nbytes, dtype=np.int64) * 37 + 11) & 0xFF).astype(np.uint8)


def deleted():
    gc.collect()
    return _C._testing_deleter_calls()


NUMPY_DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64"]


def random_array(rng, shape, dtype):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 3).astype(dtype)


# ---------------------------------------------------------------------------
# The test producer: versioned / legacy capsules, deleter counts


@pytest.mark.parametrize("versioned", [True, False])
@pytest.mark.parametrize("dtype,itemsize", [("float32", 4), ("int8", 1), ("bfloat16", 2), ("int64", 8)])
def test_capsule_import_reads_producer_memory(versioned, dtype, itemsize):
    shape = (3, 5, 2)
    before = deleted()
    cap = _C._testing_make_capsule(shape, dtype, versioned=versioned)
    t = Tensor.from_dlpack(cap)
    assert t.shape == shape and t.dtype == dtype and t.device == "cpu"
    assert t.nbytes == 30 * itemsize and not t.owned
    assert deleted() == before  # we own it now; nobody deleted yet
    # View our tensor through numpy as raw bytes (bfloat16 is not a numpy dtype).
    raw = _bytes_of(t)
    np.testing.assert_array_equal(raw.reshape(-1), pattern(30 * itemsize))
    del raw
    del cap  # the consumed capsule must not run the deleter
    assert deleted() == before
    del t
    assert deleted() == before + 1


def _bytes_of(t):
    """The tensor's bytes as a uint8 numpy array (numpy has no bfloat16, so
    that one goes through torch)."""
    if t.dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        return torch.from_dlpack(t).view(torch.uint8).numpy()
    return np.from_dlpack(t).view(np.uint8)


@pytest.mark.parametrize("versioned", [True, False])
def test_byte_offset_is_applied(versioned):
    cap = _C._testing_make_capsule((4, 6), "int16", versioned=versioned, byte_offset=40)
    t = Tensor.from_dlpack(cap)
    a = np.from_dlpack(t)
    np.testing.assert_array_equal(a.view(np.uint8).reshape(-1), pattern(48))


def test_compact_strides_and_size_one_dims_are_accepted():
    before = deleted()
    # Explicit compact strides.
    t1 = Tensor.from_dlpack(_C._testing_make_capsule((2, 3, 4), "float32", strides=(12, 4, 1)))
    # Extent-1 dimension with a stride nothing could use.
    t2 = Tensor.from_dlpack(_C._testing_make_capsule((3, 1, 4), "float32", strides=(4, 99, 1)))
    # One element: any strides.
    t3 = Tensor.from_dlpack(_C._testing_make_capsule((1, 1), "float32", strides=(7, 5)))
    assert t1.shape == (2, 3, 4) and t2.shape == (3, 1, 4) and t3.shape == (1, 1)
    del t1, t2, t3
    assert deleted() == before + 3


@pytest.mark.parametrize("versioned", [True, False])
def test_non_compact_is_refused_and_deleted_once(versioned):
    before = deleted()
    cap = _C._testing_make_capsule((3, 4), "float32", versioned=versioned, strides=(1, 3))
    with pytest.raises(BufferError, match="compact"):
        Tensor.from_dlpack(cap)
    assert deleted() == before  # still the capsule's: not deleted by us
    del cap
    assert deleted() == before + 1


def test_read_only_refused_only_when_writing():
    before = deleted()
    cap = _C._testing_make_capsule((8,), "float32", readonly=True)
    with pytest.raises(BufferError, match="read-only"):
        Tensor.from_dlpack(cap, writable=True)
    t = Tensor.from_dlpack(cap)  # reading is fine
    assert t.shape == (8,)
    del t, cap
    assert deleted() == before + 1


def test_read_only_pool_tensor_names_the_argument():
    before = deleted()
    conv = _C._testing_make_capsule((2, 3, 4, 3), "bfloat16")
    temporal = _C._testing_make_capsule((2, 3, 2, 2), "float32", readonly=True)
    with pytest.raises(BufferError, match="temporal is read-only"):
        mambaradix.StatePool([conv], temporal)
    del conv, temporal
    assert deleted() == before + 2


def test_unsupported_major_version():
    before = deleted()
    cap = _C._testing_make_capsule((4,), "float32", version=(2, 0))
    with pytest.raises(BufferError, match="version 2.0"):
        Tensor.from_dlpack(cap)
    del cap
    assert deleted() == before + 1
    # A newer minor version of 1.x is fine.
    t = Tensor.from_dlpack(_C._testing_make_capsule((4,), "float32", version=(1, 7)))
    assert t.shape == (4,)


def test_capsule_already_consumed():
    cap = _C._testing_make_capsule((4,), "float32")
    t = Tensor.from_dlpack(cap)
    with pytest.raises(BufferError, match="already consumed"):
        Tensor.from_dlpack(cap)
    del t


def test_not_a_dlpack_capsule():
    import ctypes

    make = ctypes.pythonapi.PyCapsule_New
    make.restype = ctypes.py_object
    make.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    name = ctypes.create_string_buffer(b"something_else")
    cap = make(ctypes.addressof(name), name, None)
    with pytest.raises(TypeError, match="not a DLPack capsule"):
        Tensor.from_dlpack(cap)
    with pytest.raises(TypeError, match="must support DLPack"):
        Tensor.from_dlpack([1, 2, 3])


def test_unsupported_device_type():
    before = deleted()
    cap = _C._testing_make_capsule((4,), "float32", device=(14, 0))
    with pytest.raises(ValueError, match="device type 14"):
        Tensor.from_dlpack(cap)
    del cap
    assert deleted() == before + 1


def test_cuda_tensor_without_a_reachable_gpu():
    if mambaradix.cuda_device_count() > 0:
        pytest.skip("a CUDA device is visible")
    before = deleted()
    cap = _C._testing_make_capsule((4,), "float32", device=(2, 0))
    if mambaradix.cuda_compiled:
        match = "CUDA device"
    else:
        match = "built without CUDA"
    with pytest.raises(RuntimeError, match=match):
        Tensor.from_dlpack(cap)
    conv = _C._testing_make_capsule((1, 3, 4, 3), "bfloat16", device=(2, 0))
    temporal = _C._testing_make_capsule((1, 3, 4), "float32", device=(2, 0))
    with pytest.raises(RuntimeError, match=r"conv\[0\]"):
        mambaradix.StatePool([conv], temporal)
    with pytest.raises(RuntimeError):
        mambaradix.StatePool.allocate(1, 2, [(4, 3)], "bfloat16", (4,), "float32", device="cuda:0")
    del cap, conv, temporal
    assert deleted() == before + 3


def test_null_data_refused():
    before = deleted()
    cap = _C._testing_make_capsule((4,), "float32", null_data=True)
    with pytest.raises(BufferError, match="NULL"):
        Tensor.from_dlpack(cap)
    del cap
    assert deleted() == before + 1
    # An empty tensor may have a NULL pointer.
    t = Tensor.from_dlpack(_C._testing_make_capsule((0, 3), "float32", null_data=True))
    assert t.shape == (0, 3) and t.nbytes == 0


def test_errors_survive_temporary_capsules():
    """A failed call drops its (consumed) capsule arguments while the
    exception is pending: their destructors must leave it alone."""
    before = deleted()
    with pytest.raises(ValueError, match="layers"):
        mambaradix.StatePool([_C._testing_make_capsule((2, 4, 3), "bfloat16")],
                             _C._testing_make_capsule((3, 4, 3), "float32"))
    with pytest.raises(BufferError, match="read-only"):
        Tensor.from_dlpack(_C._testing_make_capsule((2,), "float32", readonly=True), writable=True)
    with pytest.raises(TypeError, match="table must be int32"):
        mambaradix.write_req_to_token(Tensor.zeros((2, 3), "float32").__dlpack__(max_version=(1, 1)), [0], [0], [1])
    assert deleted() == before + 3  # the pool's two tensors and the read-only capsule


def test_import_error_paths_delete_exactly_once_in_pools():
    before = deleted()
    good = [_C._testing_make_capsule((2, 4, 3), "bfloat16") for _ in range(2)]
    bad_layers = _C._testing_make_capsule((3, 4, 5), "float32")
    with pytest.raises(ValueError, match="layers"):
        mambaradix.StatePool(good, bad_layers)
    # Everything was consumed (renamed) before the shape check failed: the
    # failed pool released all three.
    assert deleted() == before + 3
    del good, bad_layers
    assert deleted() == before + 3


# ---------------------------------------------------------------------------
# numpy round trips


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_round_trip_shares_memory(dtype):
    rng = np.random.default_rng(1)
    a = random_array(rng, (5, 7), dtype)
    base = sys.getrefcount(a)
    t = Tensor.from_dlpack(a)
    assert sys.getrefcount(a) > base  # the producer keeps a alive for us
    assert t.shape == (5, 7) and t.dtype == dtype and t.data_ptr == a.ctypes.data
    b = np.from_dlpack(t)
    np.testing.assert_array_equal(a, b)
    assert b.ctypes.data == a.ctypes.data
    b[0, 0] = b[1, 1]
    assert a[0, 0] == a[1, 1]
    del b, t
    gc.collect()
    assert sys.getrefcount(a) == base


def test_numpy_legacy_producer_fallback():
    """A producer whose __dlpack__ knows no max_version gets the retry."""
    calls = []

    class Legacy:
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, stream=None):
            calls.append(stream)
            return self.arr.__dlpack__()

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    t = Tensor.from_dlpack(Legacy(a))
    assert calls == [None]
    np.testing.assert_array_equal(np.from_dlpack(t), a)


def test_numpy_read_only_array():
    a = np.arange(6, dtype=np.float32)
    a.flags.writeable = False
    t = Tensor.from_dlpack(a)
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    with pytest.raises(BufferError, match="read-only"):
        Tensor.from_dlpack(a, writable=True)


def test_numpy_non_contiguous_refused():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    with pytest.raises(BufferError, match="compact"):
        Tensor.from_dlpack(a)


# ---------------------------------------------------------------------------
# Export: tensors mambaradix allocates


@pytest.mark.parametrize("max_version,name", [(None, "dltensor"), ((1, 0), "dltensor_versioned"),
                                              ((1, 3), "dltensor_versioned"), ((0, 8), "dltensor")])
def test_export_capsule_kinds(max_version, name):
    t = Tensor.zeros((2, 3), "float32")
    cap = t.__dlpack__(max_version=max_version)
    assert repr(cap).startswith(f'<capsule object "{name}"')
    base = sys.getrefcount(t)
    t2 = Tensor.from_dlpack(cap)
    assert sys.getrefcount(t) == base  # the capsule's reference moved to t2
    assert t2.data_ptr == t.data_ptr
    del t2, cap
    gc.collect()
    assert sys.getrefcount(t) == base - 1


def test_unconsumed_export_releases_owner():
    t = Tensor.zeros((4,), "int32")
    base = sys.getrefcount(t)
    cap = t.__dlpack__()
    assert sys.getrefcount(t) == base + 1
    del cap
    assert sys.getrefcount(t) == base


def test_export_keeps_memory_alive_after_owner_is_dropped():
    t = Tensor.zeros((64,), "float64")
    a = np.from_dlpack(t)
    a[:] = np.arange(64)
    del t
    gc.collect()
    np.testing.assert_array_equal(a, np.arange(64))  # still valid memory


def test_zeros_is_zero_and_dlpack_device():
    for dtype in NUMPY_DTYPES:
        t = Tensor.zeros((3, 4, 5), dtype)
        assert t.owned and t.__dlpack_device__() == (1, 0)
        a = np.from_dlpack(t)
        assert a.dtype == np.dtype(dtype) and a.shape == (3, 4, 5)
        assert not a.any()


def test_export_argument_checks():
    t = Tensor.zeros((2,), "float32")
    with pytest.raises(BufferError, match="stream must be None"):
        t.__dlpack__(stream=5)
    with pytest.raises(BufferError, match="copy=True"):
        t.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="dl_device"):
        t.__dlpack__(dl_device=(2, 0))
    cap = t.__dlpack__(dl_device=(1, 0), copy=False)
    assert cap is not None
    with pytest.raises(TypeError):
        t.__dlpack__(1)
    with pytest.raises(TypeError, match="instances|cannot create"):
        Tensor()


def test_tensor_zeros_argument_checks():
    with pytest.raises(TypeError, match="unknown dtype"):
        Tensor.zeros((2,), "complex64")
    with pytest.raises(ValueError, match="device"):
        Tensor.zeros((2,), "float32", device="tpu")
    with pytest.raises(ValueError):
        Tensor.zeros((-1,), "float32")


# ---------------------------------------------------------------------------
# torch round trips


def test_torch_round_trip_all_dtypes():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    for dt in [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8,
               torch.int32, torch.int64, torch.bool]:
        if dt.is_floating_point:
            x = torch.randn(4, 6, generator=g).to(dt)
        elif dt == torch.bool:
            x = torch.rand(4, 6, generator=g) < 0.5
        else:
            x = torch.randint(-100 if dt != torch.uint8 else 0, 100, (4, 6), generator=g).to(dt)
        t = Tensor.from_dlpack(x)
        assert t.dtype == str(dt).replace("torch.", "")
        y = torch.from_dlpack(t)
        assert y.dtype == dt and torch.equal(x, y)
        assert y.data_ptr() == x.data_ptr()


def test_torch_legacy_capsule():
    torch = pytest.importorskip("torch")
    x = torch.arange(10, dtype=torch.int64)
    cap = x.__dlpack__()  # no max_version: a legacy capsule
    assert repr(cap).startswith('<capsule object "dltensor"')
    t = Tensor.from_dlpack(cap)
    assert torch.equal(torch.from_dlpack(t), x)


def test_torch_views_refused_or_accepted():
    torch = pytest.importorskip("torch")
    x = torch.randn(6, 8)
    with pytest.raises(BufferError, match="compact"):
        Tensor.from_dlpack(x.t())
    # A slice along dim 0 is compact, with a data offset.
    t = Tensor.from_dlpack(x[2:4])
    assert torch.equal(torch.from_dlpack(t), x[2:4])
    # Size-1 dims with normalized strides.
    t = Tensor.from_dlpack(x[:, :1].t()[:, 2:3])
    assert t.shape == (1, 1)


def test_torch_keeps_exported_pool_memory():
    torch = pytest.importorskip("torch")
    pool = mambaradix.StatePool.allocate(2, 3, [(4, 3)], "bfloat16", (2, 2), "float32")
    temporal = torch.from_dlpack(pool.temporal)
    conv = torch.from_dlpack(pool.conv[0])
    assert temporal.shape == (2, 4, 2, 2) and temporal.dtype == torch.float32
    assert conv.shape == (2, 4, 4, 3) and conv.dtype == torch.bfloat16
    temporal.copy_(torch.randn_like(temporal))
    want = temporal.clone()
    del pool
    gc.collect()
    assert torch.equal(temporal, want)
