"""The state kernels on CUDA tensors (torch and CuPy), against torch/CuPy
references, bit for bit: host and device index vectors, a non-default
stream, CUDA-graph capture and replay of track_decode, and device-side
indices out of range.  Skipped without a GPU (or without torch.cuda).
"""

import os
import sys

import numpy as np
import pytest

import mambaradix

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available() or mambaradix.cuda_device_count() == 0:
    pytest.skip("needs a CUDA device visible to torch and mambaradix", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_kernels_cpu import (  # noqa: E402  (after the skip)
    POOL_SPECS,
    assert_same_bits,
    check_clear_slots,
    check_copy_slots,
    check_snapshot_conv,
    check_snapshot_ssm,
    check_track_decode,
    check_write_req_to_token,
    make_pool,
    rand,
)

DEV = "cuda"
sync = torch.cuda.synchronize


@pytest.mark.parametrize("spec", POOL_SPECS)
@pytest.mark.parametrize("kind", ["np64", "list", "torch64", "torch32"])
def test_copy_slots_cuda(spec, kind):
    for seed in range(2):
        check_copy_slots(spec, DEV, seed, kind, sync=sync)


@pytest.mark.parametrize("spec", POOL_SPECS)
@pytest.mark.parametrize("kind", ["np32", "torch64"])
def test_clear_slots_cuda(spec, kind):
    for seed in range(2):
        check_clear_slots(spec, DEV, seed, kind, sync=sync)


@pytest.mark.parametrize("spec", POOL_SPECS)
@pytest.mark.parametrize("kind,mkind", [("np64", "npbool"), ("torch64", "torchbool"), ("torch32", "torchu8"),
                                        ("torch64", "torch64")])
def test_track_decode_cuda(spec, kind, mkind):
    for seed in range(2):
        check_track_decode(spec, DEV, seed, kind, mkind, sync=sync)


@pytest.mark.parametrize("h_dtype,t_dtype", [
    (torch.bfloat16, torch.float32), (torch.float32, torch.float32), (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16)])
@pytest.mark.parametrize("kind", ["np64", "torch64", "torch32"])
def test_snapshot_ssm_cuda(h_dtype, t_dtype, kind):
    for seed in range(2):
        check_snapshot_ssm(h_dtype, t_dtype, DEV, seed, kind, sync=sync)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8, torch.float64])
@pytest.mark.parametrize("kind", ["np64", "torch64"])
def test_snapshot_conv_cuda(dtype, kind):
    for seed in range(2):
        check_snapshot_conv(dtype, DEV, seed, kind, sync=sync)


@pytest.mark.parametrize("tdtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("vdtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("ragged", [True, False])
@pytest.mark.parametrize("on_device", [True, False])
def test_write_req_to_token_cuda(tdtype, vdtype, ragged, on_device):
    for seed in range(2):
        check_write_req_to_token(tdtype, vdtype, ragged, DEV, seed, on_device=on_device, sync=sync)


def test_large_rows_many_pairs_and_misaligned():
    """Rows of several chunks, more host pairs than one launch carries, and
    rows that only allow 1-byte accesses."""
    gen = torch.Generator().manual_seed(7)
    spec = ([((1001,), torch.int8), ((96, 3), torch.bfloat16)], (3, 128, 129), torch.float32)
    layers, slots = 2, 640
    pool, tensors = make_pool(spec, layers, slots, gen, DEV)
    ref = [t.clone() for t in tensors]
    rng = np.random.default_rng(7)
    perm = rng.permutation(np.arange(1, slots + 1))
    dst, src = perm[:300], perm[300:600]
    pool.copy_slots(src, dst)
    sync()
    for r in ref:
        r[:, torch.from_numpy(dst).to(DEV)] = r[:, torch.from_numpy(src).to(DEV)]
    for t, r in zip(tensors, ref):
        assert_same_bits(t, r)


def test_allocated_cuda_pool():
    pool = mambaradix.StatePool.allocate(3, 8, [(64, 3), (7,)], ["bfloat16", "int8"], (4, 16, 16), "float32",
                                         device="cuda:0")
    assert pool.device == "cuda:0"
    views = [torch.from_dlpack(t) for t in pool.conv] + [torch.from_dlpack(pool.temporal)]
    assert all(v.is_cuda and not v.view(torch.uint8).any() for v in views)
    gen = torch.Generator().manual_seed(3)
    for v in views:
        v.copy_(rand(tuple(v.shape), v.dtype, gen, DEV))
    ref = [v.clone() for v in views]
    dst = torch.tensor([7, 2], device=DEV)
    src = torch.tensor([1, 5], device=DEV)
    pool.copy_slots(src, dst)
    pool.clear_slots(torch.tensor([4], dtype=torch.int32, device=DEV))
    sync()
    for r in ref:
        r[:, dst] = r[:, src]
        r[:, 4] = torch.zeros((), dtype=r.dtype, device=DEV)
    for v, r in zip(views, ref):
        assert_same_bits(v, r)


def test_non_default_stream_ordering():
    """The kernel runs on the stream passed: it must see a write queued on
    that stream behind a long sleep (on the default stream it would not)."""
    gen = torch.Generator().manual_seed(1)
    pool, tensors = make_pool(POOL_SPECS[1], 2, 6, gen, DEV)
    temporal = tensors[-1]
    new = rand(tuple(temporal[:, 2].shape), temporal.dtype, gen, DEV)
    sync()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)
        temporal[:, 2] = new
        pool.copy_slots([2], [5], stream=s.cuda_stream)
        pool.clear_slots(torch.tensor([3], device=DEV), stream=s.cuda_stream)
    s.synchronize()
    assert_same_bits(temporal[:, 5], new)
    assert not temporal[:, 3].view(torch.uint8).any()


def test_track_decode_cuda_graph_capture_and_replay():
    gen = torch.Generator().manual_seed(5)
    rng = np.random.default_rng(5)
    spec = POOL_SPECS[2]
    slots, bs = 20, 6
    pool, tensors = make_pool(spec, 3, slots, gen, DEV)
    running = torch.zeros(bs, dtype=torch.int64, device=DEV)
    track = torch.zeros(bs, dtype=torch.int64, device=DEV)
    mask = torch.zeros(bs, dtype=torch.bool, device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture
        pool.track_decode(running, track, mask, stream=side.cuda_stream)
    torch.cuda.current_stream().wait_stream(side)
    sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pool.track_decode(running, track, mask, stream=torch.cuda.current_stream().cuda_stream)
    for round_ in range(3):
        for t in tensors:
            t.copy_(rand(tuple(t.shape), t.dtype, gen, DEV))
        perm = rng.permutation(np.arange(0, slots + 1))
        r_np, t_np = perm[:bs], perm[bs:2 * bs]
        m_np = rng.random(bs) < 0.5
        m_np[round_] = True
        running.copy_(torch.from_numpy(r_np))
        track.copy_(torch.from_numpy(t_np))
        mask.copy_(torch.from_numpy(m_np))
        ref = [t.clone() for t in tensors]
        g.replay()
        sync()
        s = torch.from_numpy(r_np[m_np]).to(DEV)
        d = torch.from_numpy(t_np[m_np]).to(DEV)
        for r in ref:
            r[:, d] = r[:, s]
        for t, r in zip(tensors, ref):
            assert_same_bits(t, r)


def test_device_indices_out_of_range_are_skipped():
    gen = torch.Generator().manual_seed(2)
    pool, tensors = make_pool(POOL_SPECS[0], 2, 5, gen, DEV)
    ref = [t.clone() for t in tensors]
    pool.copy_slots(torch.tensor([1, 2, -1], device=DEV), torch.tensor([-1, 99, 3], device=DEV))
    pool.clear_slots(torch.tensor([-5, 6, 1000], device=DEV))
    pool.track_decode(torch.tensor([1], device=DEV), torch.tensor([77], device=DEV),
                      torch.tensor([True], device=DEV))
    sync()
    for t, r in zip(tensors, ref):
        assert_same_bits(t, r)


def test_cuda_placement_refused():
    gen = torch.Generator().manual_seed(2)
    cpu_pool, _ = make_pool(POOL_SPECS[0], 2, 5, gen, "cpu")
    with pytest.raises(ValueError, match="src is on cuda:0, but the state tensors are on cpu"):
        cpu_pool.copy_slots(torch.tensor([1], device=DEV), torch.tensor([2], device=DEV))
    pool, _ = make_pool(POOL_SPECS[0], 2, 5, gen, DEV)
    with pytest.raises(ValueError, match="both host arrays or both device tensors"):
        pool.copy_slots([1], torch.tensor([2], device=DEV))
    with pytest.raises(ValueError, match="another device"):
        pool.snapshot_ssm_from_h(0, torch.randn(3, 2, 4, 4), [0], [1])
    with pytest.raises(ValueError, match="another device"):
        mambaradix.StatePool([torch.zeros(2, 3, 4, device=DEV)], torch.zeros(2, 3, 4))


def test_export_to_torch_shares_device_memory():
    t = mambaradix.Tensor.zeros((5, 7), "bfloat16", device="cuda:0")
    assert t.__dlpack_device__() == (2, 0)
    v = torch.from_dlpack(t)
    assert v.is_cuda and v.dtype == torch.bfloat16 and v.data_ptr() == t.data_ptr
    assert torch.from_dlpack(t.__dlpack__(stream=torch.cuda.current_stream().cuda_stream or 1)) is not None
    with pytest.raises(TypeError, match="stream must be an int"):
        t.__dlpack__(stream="default")
    x = torch.randn(4, 4, device=DEV)
    tx = mambaradix.Tensor.from_dlpack(x, stream=torch.cuda.current_stream().cuda_stream)
    assert tx.device == "cuda:0" and torch.equal(torch.from_dlpack(tx), x)


def test_cupy_pool_and_indices():
    cp = pytest.importorskip("cupy")
    rs = cp.random.RandomState(4)
    layers, slots = 3, 9
    conv = (rs.standard_normal((layers, slots + 1, 6, 3)) * 3).astype(cp.float16)
    conv2 = rs.randint(-2**31, 2**31 - 1, size=(layers, slots + 1, 5), dtype=cp.int64).astype(cp.int32)
    temporal = rs.standard_normal((layers, slots + 1, 2, 8, 8)).astype(cp.float32)
    ref = [a.copy() for a in (conv, conv2, temporal)]
    # the arrays were made on CuPy's null stream, which a non-blocking
    # stream does not wait for
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        pool = mambaradix.StatePool([conv, conv2], temporal, stream=stream.ptr)
        src = cp.asarray([1, 4], dtype=cp.int64)
        dst = cp.asarray([6, 2], dtype=cp.int64)
        pool.copy_slots(src, dst, stream=stream.ptr)
        pool.clear_slots(cp.asarray([9], dtype=cp.int32), stream=stream.ptr)
    stream.synchronize()
    for r in ref:
        r[:, dst] = r[:, src]
        r[:, 9] = 0
    for a, r in zip((conv, conv2, temporal), ref):
        assert bool((a.view(cp.uint8) == r.view(cp.uint8)).all())
    # Export back to CuPy: same memory.
    t = cp.from_dlpack(pool.temporal)
    assert t.data.ptr == temporal.data.ptr


@pytest.mark.parametrize("tdtype", [torch.int32, torch.int64])
def test_write_req_to_token_pinned_host_values_are_read_before_return(tdtype):
    """Host values in page-locked memory: CUDA copies those only when the
    stream reaches the copy, but the call's contract is that the caller may
    change its values once it returns.  A long device sleep keeps the stream
    busy, the values are overwritten right after the call: the table must
    hold what they were at the call."""
    table = torch.zeros(4, 64, dtype=tdtype, device=DEV)
    values = torch.arange(100, 148, dtype=torch.int64).pin_memory()
    expect = values.clone()
    rows, starts, ends = np.array([1, 3]), np.array([0, 8]), np.array([16, 40])
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)
        mambaradix.write_req_to_token(table, rows, starts, values, ends=ends, stream=s.cuda_stream)
        values.fill_(-1)
    s.synchronize()
    got = table.cpu()
    assert torch.equal(got[1, :16], expect[:16].to(tdtype))
    assert torch.equal(got[3, 8:40], expect[16:].to(tdtype))
    assert int(got[0].abs().sum()) == 0 and int(got[2].abs().sum()) == 0
