"""The state kernels on host tensors (the C twins), against torch/numpy
references on fresh random data, bit for bit; and every refused input.

The helpers here take a `device` so tests/tensor/test_kernels_gpu.py runs the same
checks on CUDA tensors.
"""

import gc

import numpy as np
import pytest

import mambaradix
from mambaradix import _C

torch = pytest.importorskip("torch")

FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]

# (conv per-slot shapes and dtypes, temporal per-slot shape, temporal dtype):
# odd sizes so that rows are not multiples of 16 bytes, mixed dtypes.
POOL_SPECS = [
    ([((8, 3), torch.bfloat16)], (2, 4, 4), torch.float32),
    ([((7, 3), torch.bfloat16), ((5,), torch.int8)], (3, 5, 4), torch.float32),
    ([((3, 5, 7), torch.float16), ((9, 3), torch.bfloat16), ((2,), torch.int64)], (2, 3, 3), torch.bfloat16),
    ([((4, 3), torch.int32), ((6,), torch.bool), ((11,), torch.uint8)], (5,), torch.float64),
    ([((4, 1), torch.int16)], (1,), torch.float16),
]


def rand(shape, dtype, gen, device="cpu"):
    """Random values of any dtype: never zeros-only, every bit pattern class."""
    if dtype == torch.bool:
        t = torch.rand(shape, generator=gen) < 0.5
    elif dtype.is_floating_point:
        t = (torch.randn(shape, generator=gen, dtype=torch.float64) * 4).to(dtype)
    else:
        info = torch.iinfo(dtype)
        lo, hi = max(info.min, -(2**40)), min(info.max, 2**40)
        t = torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64).to(dtype)
    return t.to(device)


def bits(t):
    """Bitwise view (so -0.0 != 0.0 and every NaN payload counts)."""
    return t.contiguous().view(torch.uint8)


def assert_same_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(bits(a), bits(b))


def make_pool(spec, layers, slots, gen, device="cpu", stream=None):
    conv_spec, tshape, tdtype = spec
    conv = [rand((layers, slots + 1) + shape, dt, gen, device) for shape, dt in conv_spec]
    temporal = rand((layers, slots + 1) + tshape, tdtype, gen, device)
    pool = mambaradix.StatePool(conv, temporal, stream=stream)
    return pool, conv + [temporal]


def copy_plan(rng, slots, n, allow_zero=True):
    """n copies with distinct destinations that are never sources."""
    lo = 0 if allow_zero else 1
    perm = rng.permutation(np.arange(lo, slots + 1))
    dst = perm[:n]
    srcs = perm[n:]
    src = rng.choice(srcs, size=n, replace=True)
    return src.astype(np.int64), dst.astype(np.int64)


def index_as(kind, a, device="cpu"):
    a = np.asarray(a)
    if kind == "list":
        return [int(x) for x in a]
    if kind == "np64":
        return a.astype(np.int64)
    if kind == "np32":
        return a.astype(np.int32)
    if kind == "torch64":
        return torch.from_numpy(a.astype(np.int64)).to(device)
    if kind == "torch32":
        return torch.from_numpy(a.astype(np.int32)).to(device)
    raise AssertionError(kind)


def mask_as(kind, m, device="cpu"):
    m = np.asarray(m, dtype=bool)
    if kind == "list":
        return [bool(x) for x in m]
    if kind == "npbool":
        return m
    if kind == "torchbool":
        return torch.from_numpy(m).to(device)
    if kind == "torchu8":
        return torch.from_numpy(m.astype(np.uint8)).to(device)
    if kind == "torch64":
        return torch.from_numpy(m.astype(np.int64) * 7).to(device)
    raise AssertionError(kind)


# ---------------------------------------------------------------------------
# Checks shared with the GPU tests


def check_copy_slots(spec, device, seed, kind="np64", n=None, stream=None, sync=lambda: None):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    layers, slots = 3, 9
    pool, tensors = make_pool(spec, layers, slots, gen, device)
    ref = [t.clone() for t in tensors]
    n = n if n is not None else int(rng.integers(1, 5))
    src, dst = copy_plan(rng, slots, n)
    pool.copy_slots(index_as(kind, src, device), index_as(kind, dst, device), stream=stream)
    sync()
    s, d = torch.from_numpy(src).to(device), torch.from_numpy(dst).to(device)
    for r in ref:
        r[:, d] = r[:, s]
    for t, r in zip(tensors, ref):
        assert_same_bits(t, r)


def check_clear_slots(spec, device, seed, kind="np64", stream=None, sync=lambda: None):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    pool, tensors = make_pool(spec, 2, 7, gen, device)
    ref = [t.clone() for t in tensors]
    idx = rng.choice(np.arange(0, 8), size=int(rng.integers(1, 5)), replace=False)
    pool.clear_slots(index_as(kind, idx, device), stream=stream)
    sync()
    i = torch.from_numpy(idx).to(device)
    for r in ref:
        r[:, i] = torch.zeros((), dtype=r.dtype, device=device)
    for t, r in zip(tensors, ref):
        assert_same_bits(t, r)


def check_track_decode(spec, device, seed, kind="np64", mkind="npbool", stream=None, sync=lambda: None):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    pool, tensors = make_pool(spec, 3, 12, gen, device)
    ref = [t.clone() for t in tensors]
    bs = 5
    running, track = copy_plan(rng, 12, bs)
    mask = rng.random(bs) < 0.6
    mask[0] = True
    pool.track_decode(index_as(kind, running, device), index_as(kind, track, device),
                      mask_as(mkind, mask, device), stream=stream)
    sync()
    s = torch.from_numpy(running[mask]).to(device)
    d = torch.from_numpy(track[mask]).to(device)
    for r in ref:
        r[:, d] = r[:, s]
    for t, r in zip(tensors, ref):
        assert_same_bits(t, r)


def check_snapshot_ssm(h_dtype, t_dtype, device, seed, kind="np64", stream=None, sync=lambda: None):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    tshape = (3, 5, 6)
    layers, slots = 4, 6
    pool, tensors = make_pool(([((4, 3), torch.bfloat16)], tshape, t_dtype), layers, slots, gen, device)
    temporal = tensors[-1]
    ref = temporal.clone()
    h = rand((2, 7) + tshape, h_dtype, gen, device)  # FLA-like [B, NT, H, V, K]
    n = 3
    chunks = rng.choice(14, size=n, replace=False)
    dst = rng.choice(np.arange(slots + 1), size=n, replace=False)
    layer = int(rng.integers(0, layers))
    pool.snapshot_ssm_from_h(layer, h, index_as(kind, chunks, device), index_as(kind, dst, device),
                             stream=stream)
    sync()
    flat = h.reshape(-1, *tshape)
    ref[layer, torch.from_numpy(dst).to(device)] = flat[torch.from_numpy(chunks).to(device)].to(t_dtype)
    assert_same_bits(temporal, ref)
    return pool, tensors


def check_snapshot_conv(dtype, device, seed, kind="np64", stream=None, sync=lambda: None):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    dim, km1, layers, slots, tokens = 37, 3, 3, 6, 50
    pool, tensors = make_pool(([((5, 2), torch.float32), ((dim, km1), dtype)], (2, 2), torch.float32),
                              layers, slots, gen, device)
    conv = tensors[1]
    ref = [t.clone() for t in tensors]
    x = rand((tokens, dim), dtype, gen, device)
    n = 4
    # Include positions near both ends, where SGLang's indices get clamped.
    pos = np.array([1, 64 % tokens, tokens + 2, int(rng.integers(3, tokens))], dtype=np.int64)
    dst = rng.choice(np.arange(slots + 1), size=n, replace=False)
    layer = int(rng.integers(0, layers))
    pool.snapshot_conv_window(layer, x, index_as(kind, pos, device), index_as(kind, dst, device),
                              conv_index=1, stream=stream)
    sync()
    idx = torch.from_numpy(pos)[:, None] - km1 + torch.arange(km1)[None, :]
    idx = idx.clamp(0, tokens - 1).to(device)
    ref[1][layer, torch.from_numpy(dst).to(device)] = x[idx].permute(0, 2, 1)
    for t, r in zip(tensors, ref):
        assert_same_bits(t, r)
    assert conv is tensors[1]


def check_write_req_to_token(tdtype, vdtype, ragged, device, seed, on_device=False, stream=None,
                             sync=lambda: None):
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    nrows, ncols = 9, 33
    table = rand((nrows, ncols), tdtype, gen, device)  # poisoned with random values
    ref = table.cpu().numpy().copy()
    n = 4
    rows = rng.choice(nrows, size=n, replace=False).astype(np.int64)
    starts = rng.integers(0, ncols // 2, size=n)
    if ragged:
        ends = starts + rng.integers(0, ncols // 2, size=n)
        total = int((ends - starts).sum())
        vals = rng.integers(0, 2**31 - 1, size=total)
        off = 0
        for r, s, e in zip(rows, starts, ends):
            ref[r, s:e] = vals[off:off + e - s]
            off += e - s
    else:
        ends = None
        w = 3
        vals = rng.integers(0, 2**31 - 1, size=(n, w))
        for i, (r, s) in enumerate(zip(rows, starts)):
            ref[r, s:s + w] = vals[i]
    np_vdtype = {torch.int32: np.int32, torch.int64: np.int64}[vdtype]
    if on_device:
        conv = lambda a: torch.from_numpy(np.asarray(a)).to(device)  # noqa: E731
        vals_arg = torch.from_numpy(vals.astype(np_vdtype)).to(device)
    else:
        conv = lambda a: np.asarray(a)  # noqa: E731
        vals_arg = vals.astype(np_vdtype)
    mambaradix.write_req_to_token(table, conv(rows), conv(starts), vals_arg,
                                  ends=None if ends is None else conv(ends), stream=stream)
    sync()
    np.testing.assert_array_equal(table.cpu().numpy(), ref)


# ---------------------------------------------------------------------------
# CPU tests


@pytest.mark.parametrize("spec", POOL_SPECS)
@pytest.mark.parametrize("kind", ["list", "np64", "np32", "torch64", "torch32"])
def test_copy_slots(spec, kind):
    for seed in range(3):
        check_copy_slots(spec, "cpu", seed, kind)


def test_copy_slots_many_pairs_and_empty():
    spec = POOL_SPECS[1]
    check_copy_slots(spec, "cpu", 11, "np64", n=4)
    gen = torch.Generator().manual_seed(0)
    pool, tensors = make_pool(spec, 2, 4, gen)
    ref = [t.clone() for t in tensors]
    pool.copy_slots([], [])
    for t, r in zip(tensors, ref):
        assert_same_bits(t, r)


def test_copy_slots_scalar_indices():
    gen = torch.Generator().manual_seed(5)
    pool, tensors = make_pool(POOL_SPECS[0], 2, 4, gen)
    ref = [t.clone() for t in tensors]
    pool.copy_slots(torch.tensor(3), np.int64(1))  # 0-d, like SGLang's mamba_pool_idx
    for r in ref:
        r[:, 1] = r[:, 3]
    for t, r in zip(tensors, ref):
        assert_same_bits(t, r)


@pytest.mark.parametrize("spec", POOL_SPECS)
@pytest.mark.parametrize("kind", ["list", "np32", "torch64"])
def test_clear_slots(spec, kind):
    for seed in range(3):
        check_clear_slots(spec, "cpu", seed, kind)


@pytest.mark.parametrize("spec", POOL_SPECS)
@pytest.mark.parametrize("mkind", ["list", "npbool", "torchbool", "torchu8", "torch64"])
def test_track_decode(spec, mkind):
    for seed in range(3):
        check_track_decode(spec, "cpu", seed, "torch64", mkind)


@pytest.mark.parametrize("h_dtype,t_dtype", [
    (torch.bfloat16, torch.float32), (torch.float32, torch.float32), (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16)])
@pytest.mark.parametrize("kind", ["np64", "torch32"])
def test_snapshot_ssm_from_h(h_dtype, t_dtype, kind):
    for seed in range(3):
        check_snapshot_ssm(h_dtype, t_dtype, "cpu", seed, kind)


def test_snapshot_ssm_rounding_is_nearest_even():
    """float32 -> bfloat16 rounding on ties, against torch."""
    gen = torch.Generator().manual_seed(0)
    pool, tensors = make_pool(([((2, 3), torch.bfloat16)], (8,), torch.bfloat16), 1, 2, gen)
    # Values exactly halfway between two bfloat16 numbers, both parities,
    # plus the largest finite float32, infinities and a subnormal.
    h = torch.tensor([[1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 3.4028234663852886e38,
                       float("inf"), float("-inf"), 1e-40, -0.0]], dtype=torch.float32)
    pool.snapshot_ssm_from_h(0, h, [0], [1])
    assert_same_bits(tensors[-1][0, 1], h[0].to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8, torch.float64])
@pytest.mark.parametrize("kind", ["np64", "torch32"])
def test_snapshot_conv_window(dtype, kind):
    for seed in range(3):
        check_snapshot_conv(dtype, "cpu", seed, kind)


@pytest.mark.parametrize("tdtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("vdtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("ragged", [True, False])
def test_write_req_to_token(tdtype, vdtype, ragged):
    for seed in range(3):
        check_write_req_to_token(tdtype, vdtype, ragged, "cpu", seed)


def test_write_req_to_token_one_token_per_row():
    table = np.full((4, 8), -1, dtype=np.int32)
    mambaradix.write_req_to_token(table, [2, 0], [5, 7], np.array([11, 12]))
    want = np.full((4, 8), -1, dtype=np.int32)
    want[2, 5] = 11
    want[0, 7] = 12
    np.testing.assert_array_equal(table, want)


# ---------------------------------------------------------------------------
# Allocated pools


@pytest.mark.parametrize("tdtype", ["float32", "bfloat16"])
def test_allocate_layout_and_kernels(tdtype):
    conv_shapes = [(8192 // 64, 3), (5,)]
    pool = mambaradix.StatePool.allocate(3, 6, conv_shapes, ["bfloat16", "int8"], (2, 4, 4), tdtype)
    assert pool.num_slots == 6 and pool.num_layers == 3 and pool.device == "cpu"
    tsize = 4 if tdtype == "float32" else 2
    assert pool.bytes_per_slot == 3 * (128 * 3 * 2 + 5 + 32 * tsize)
    views = [torch.from_dlpack(t) for t in pool.conv] + [torch.from_dlpack(pool.temporal)]
    assert [tuple(v.shape) for v in views] == [(3, 7, 128, 3), (3, 7, 5), (3, 7, 2, 4, 4)]
    assert all(not bits(v).any() for v in views)  # zero-filled
    gen = torch.Generator().manual_seed(9)
    for v in views:
        v.copy_(rand(tuple(v.shape), v.dtype, gen))
    ref = [v.clone() for v in views]
    pool.copy_slots([1, 2], [5, 6])
    pool.clear_slots([3])
    for r in ref:
        r[:, [5, 6]] = r[:, [1, 2]]
        r[:, 3] = torch.zeros((), dtype=r.dtype)
    for v, r in zip(views, ref):
        assert_same_bits(v, r)


def test_qwen3_next_bytes_per_slot():
    """The brief's figure: 36 layers of conv [8192, 3] bf16 + SSM [32, 128, 128] fp32."""
    pool = mambaradix.StatePool.allocate(36, 1, [(8192, 3)], "bfloat16", (32, 128, 128), "float32")
    assert pool.bytes_per_slot == 77_266_944


def test_pool_keeps_adopted_tensors_alive():
    gen = torch.Generator().manual_seed(1)
    conv = rand((2, 5, 4, 3), torch.bfloat16, gen)
    temporal = rand((2, 5, 6), torch.float32, gen)
    ref = [conv.clone(), temporal.clone()]
    pool = mambaradix.StatePool([conv], temporal)
    assert pool.conv[0].data_ptr == conv.data_ptr()
    assert pool.temporal.data_ptr == temporal.data_ptr()
    del conv, temporal
    gc.collect()
    pool.copy_slots([4], [2])
    t = torch.from_dlpack(pool.temporal)
    for r in ref:
        r[:, 2] = r[:, 4]
    assert_same_bits(t, ref[1])
    assert_same_bits(torch.from_dlpack(pool.conv[0]), ref[0])


def test_pool_releases_capsules_exactly_once():
    gc.collect()
    before = _C._testing_deleter_calls()
    conv = [_C._testing_make_capsule((2, 4, 3), "bfloat16"), _C._testing_make_capsule((2, 4), "int8")]
    temporal = _C._testing_make_capsule((2, 4, 5), "float32", versioned=False)
    pool = mambaradix.StatePool(conv, temporal)
    pool.copy_slots([1], [2])
    del conv, temporal
    gc.collect()
    assert _C._testing_deleter_calls() == before
    del pool
    gc.collect()
    assert _C._testing_deleter_calls() == before + 3


# ---------------------------------------------------------------------------
# Refused inputs


@pytest.fixture
def pool():
    gen = torch.Generator().manual_seed(2)
    p, _ = make_pool(([((6, 3), torch.bfloat16)], (2, 3, 4), torch.float32), 2, 5, gen)
    return p  # the pool keeps its adopted tensors alive


def test_copy_slots_refused(pool):
    snapshot = [bits(torch.from_dlpack(t)).clone() for t in pool.conv + (pool.temporal,)]
    with pytest.raises(ValueError, match=r"src\[0\] == dst\[0\]"):
        pool.copy_slots([2], [2])
    with pytest.raises(IndexError, match=r"dst\[1\] = 6 is out of range \[0, 5\]"):
        pool.copy_slots([1, 2], [3, 6])
    with pytest.raises(IndexError, match=r"src\[0\] = -1"):
        pool.copy_slots([-1], [3])
    with pytest.raises(ValueError, match="appears twice"):
        pool.copy_slots([1, 2], [3, 3])
    with pytest.raises(ValueError, match="also a source"):
        pool.copy_slots([1, 3], [3, 4])
    with pytest.raises(ValueError, match="src has 2 entries, dst has 1"):
        pool.copy_slots([1, 2], [3])
    with pytest.raises(TypeError, match="src must hold int32 or int64"):
        pool.copy_slots(np.array([1.0]), [3])
    with pytest.raises(TypeError, match="src must be int32 or int64"):
        pool.copy_slots([1.5], [3])
    with pytest.raises(TypeError, match="dst must hold int32 or int64"):
        pool.copy_slots([1], torch.tensor([3], dtype=torch.int16))
    with pytest.raises(ValueError, match="1-D"):
        pool.copy_slots(np.array([[1]]), np.array([[3]]))
    with pytest.raises(TypeError, match="stream"):
        pool.copy_slots([1], [3], stream="s")
    with pytest.raises(TypeError):
        pool.copy_slots([1])
    with pytest.raises(TypeError, match="unexpected keyword"):
        pool.copy_slots([1], [3], streams=None)
    # Nothing was written by any refused call.
    after = [bits(torch.from_dlpack(t)) for t in pool.conv + (pool.temporal,)]
    assert all(torch.equal(a, b) for a, b in zip(snapshot, after))


def test_clear_and_track_refused(pool):
    with pytest.raises(IndexError, match=r"idx\[1\] = 9"):
        pool.clear_slots([1, 9])
    with pytest.raises(TypeError, match="mask must hold a bool or integer mask"):
        pool.track_decode([1], [2], np.array([0.5], dtype=np.float32))
    with pytest.raises(ValueError, match="running has 2 entries, mask has 1"):
        pool.track_decode([1, 2], [3, 4], [True])
    with pytest.raises(ValueError, match="equal"):
        pool.track_decode([1, 2], [1, 4], [True, False])
    # A masked-out pair is not checked (it is not copied).
    pool.track_decode([1, 2], [1, 4], [False, True])


def test_snapshot_refused(pool):
    h = torch.randn(5, 2, 3, 4)
    with pytest.raises(ValueError, match="layer must be in"):
        pool.snapshot_ssm_from_h(2, h, [0], [1])
    with pytest.raises(ValueError, match="temporal_shape"):
        pool.snapshot_ssm_from_h(0, torch.randn(5, 2, 4, 3), [0], [1])
    with pytest.raises(TypeError, match="h has dtype float16"):
        pool.snapshot_ssm_from_h(0, h.half(), [0], [1])
    with pytest.raises(IndexError, match=r"chunk_indices\[0\] = 5"):
        pool.snapshot_ssm_from_h(0, h, [5], [1])
    with pytest.raises(IndexError, match=r"dst_slots\[0\] = 6"):
        pool.snapshot_ssm_from_h(0, h, [0], [6])
    with pytest.raises(ValueError, match="appears twice"):
        pool.snapshot_ssm_from_h(0, h, [0, 1], [2, 2])
    with pytest.raises(BufferError, match="compact"):
        pool.snapshot_ssm_from_h(0, torch.randn(2, 3, 4, 5).permute(3, 0, 1, 2), [0], [1])
    x = torch.randn(10, 6).bfloat16()
    with pytest.raises(ValueError, match="dim = 6"):
        pool.snapshot_conv_window(0, torch.randn(10, 7).bfloat16(), [4], [1])
    with pytest.raises(TypeError, match="x has dtype float32"):
        pool.snapshot_conv_window(0, x.float(), [4], [1])
    with pytest.raises(ValueError, match="conv_index"):
        pool.snapshot_conv_window(0, x, [4], [1], conv_index=1)
    with pytest.raises(ValueError, match="no tokens"):
        pool.snapshot_conv_window(0, x[:0], [4], [1])


def test_write_req_to_token_refused():
    table = np.zeros((4, 8), dtype=np.int32)
    with pytest.raises(TypeError, match="table must be int32 or int64"):
        mambaradix.write_req_to_token(table.astype(np.float32), [0], [0], [1])
    with pytest.raises(ValueError, match="2-D"):
        mambaradix.write_req_to_token(table.reshape(-1), [0], [0], [1])
    ro = table.copy()
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="table is read-only"):
        mambaradix.write_req_to_token(ro, [0], [0], [1])
    with pytest.raises(IndexError, match=r"rows\[0\] = 4"):
        mambaradix.write_req_to_token(table, [4], [0], [1])
    with pytest.raises(IndexError, match="outside"):
        mambaradix.write_req_to_token(table, [0], [6], [1, 2, 3], ends=[9])
    with pytest.raises(ValueError, match="cover 2 tokens, values has 3"):
        mambaradix.write_req_to_token(table, [0], [0], [1, 2, 3], ends=[2])
    with pytest.raises(ValueError, match="values has 1 entries, rows 2"):
        mambaradix.write_req_to_token(table, [0, 1], [0, 0], [1])
    assert not table.any()


def test_pool_construction_refused():
    gen = torch.Generator().manual_seed(4)
    conv = rand((2, 5, 4, 3), torch.bfloat16, gen)
    with pytest.raises(ValueError, match="temporal has 3 layers"):
        mambaradix.StatePool([conv], rand((3, 5, 2), torch.float32, gen))
    with pytest.raises(ValueError, match="slot rows"):
        mambaradix.StatePool([conv], rand((2, 6, 2), torch.float32, gen))
    with pytest.raises(ValueError, match="slots"):
        mambaradix.StatePool([conv], rand((2,), torch.float32, gen))
    with pytest.raises(BufferError, match=r"conv\[0\]: the tensor is not compact"):
        mambaradix.StatePool([conv.transpose(2, 3)], rand((2, 5, 2), torch.float32, gen))
    with pytest.raises(ValueError, match="1 to 7"):
        mambaradix.StatePool([], rand((2, 5, 2), torch.float32, gen))
    with pytest.raises(TypeError, match="must support DLPack"):
        mambaradix.StatePool([conv], [1, 2])
    ro = np.zeros((2, 5, 3), dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="temporal is read-only"):
        mambaradix.StatePool([conv], ro)
    with pytest.raises(ValueError, match="conv_dtypes has 1 entries"):
        mambaradix.StatePool.allocate(2, 4, [(3,), (4,)], ["bfloat16"], (2,), "float32")
    with pytest.raises(TypeError, match="unknown dtype"):
        mambaradix.StatePool.allocate(2, 4, [(3,)], "complex", (2,), "float32")
    with pytest.raises(ValueError, match="layers must be in"):
        mambaradix.StatePool.allocate(0, 4, [(3,)], "bfloat16", (2,), "float32")
    with pytest.raises(ValueError, match="device"):
        mambaradix.StatePool.allocate(1, 4, [(3,)], "bfloat16", (2,), "float32", device="gpu")


def test_importing_mambaradix_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, mambaradix; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_copy_slots_hypothesis():
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")

    @hyp.settings(max_examples=60, deadline=None)
    @hyp.given(st.integers(1, 4), st.integers(2, 12), st.data())
    def run(layers, slots, data):
        seed = data.draw(st.integers(0, 2**31))
        gen = torch.Generator().manual_seed(seed)
        spec = data.draw(st.sampled_from(POOL_SPECS))
        pool, tensors = make_pool(spec, layers, slots, gen)
        ref = [t.clone() for t in tensors]
        perm = data.draw(st.permutations(list(range(slots + 1))))
        n = data.draw(st.integers(0, (slots + 1) // 2))
        dst, srcs = perm[:n], perm[n:]
        src = [data.draw(st.sampled_from(srcs)) for _ in range(n)]
        pool.copy_slots(src, dst)
        for r in ref:
            r[:, dst] = r[:, src]
        for t, r in zip(tensors, ref):
            assert_same_bits(t, r)

    run()
