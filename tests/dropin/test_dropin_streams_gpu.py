"""The drop-in's state and table kernels run on torch's current stream.

SGLang runs its forward (and, with the overlap scheduler, the next batch's
preparation) on streams of its own, which do not wait for the legacy
default stream.  A state copy, a clear or a req-to-token write launched on
the default stream would then race the forward that reads it.  Each test
makes the current stream busy (a long device sleep), queues a write on it,
then the drop-in's call, then a read: only a kernel queued on the same
stream, behind the write, gives the expected values.  Skipped without a
CUDA device; run by benchmarks/gpu_check.sh."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device visible to torch", allow_module_level=True)

import mambaradix  # noqa: E402

if not mambaradix.cuda_compiled:
    pytest.skip("the extension was built without CUDA", allow_module_level=True)

from dropin_batch import make  # noqa: E402

SLEEP_CYCLES = 200_000_000   # ~0.1 s on a ~2 GHz SM clock: far longer than a launch


def _behind_busy_stream(work):
    """Runs work() on a stream of torch's pool (as SGLang's forward stream
    is: it does not synchronise with the legacy default stream) that a long
    device sleep keeps busy; returns what work() returned, once done."""
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        got = work()
    s.synchronize()
    return got


def test_copy_from_runs_behind_the_current_streams_work() -> None:
    _, pool, _ = make("extra_buffer", "cuda")
    mp = pool.mamba_pool
    temporal = mp.mamba_cache.temporal
    temporal.zero_()

    def work():
        temporal[:, 3] = 7
        mp.copy_from(torch.tensor([3], device="cuda"), torch.tensor([5], device="cuda"))
        return temporal[:, 5].clone()

    got = _behind_busy_stream(work)
    assert bool((got == 7).all()), "the copy ran before the write queued ahead of it on the current stream"


def test_clear_slots_runs_behind_the_current_streams_work() -> None:
    _, pool, _ = make("extra_buffer", "cuda")
    mp = pool.mamba_pool
    temporal = mp.mamba_cache.temporal
    temporal.zero_()

    def work():
        temporal[:, 4] = 9
        mp.clear_slots(torch.tensor([4], device="cuda"))
        return temporal[:, 4].clone()

    got = _behind_busy_stream(work)
    assert bool((got == 0).all()), "the clear ran before the write queued ahead of it on the current stream"


def test_req_to_token_sync_runs_behind_the_current_streams_work() -> None:
    """sync_device() copies the rows the C side changed (here: written into
    the host table and marked, as the lifecycle marks them) to the device
    table with write_req_to_token."""
    _, pool, _ = make("extra_buffer", "cuda")
    row = 2
    pool._rp.table[row, :4] = np.array([11, 12, 13, 14], dtype=pool._rp.table.dtype)
    pool._rp.mark_dirty(row, 0, 4)

    def work():
        pool.req_to_token[row, :4] = -1          # a stale value, overwritten by the sync below
        pool.sync_device()
        return pool.req_to_token[row, :4].clone()

    got = _behind_busy_stream(work)
    assert got.tolist() == [11, 12, 13, 14], "the table write ran before the work queued ahead of it"
