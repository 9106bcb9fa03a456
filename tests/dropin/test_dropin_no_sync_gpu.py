"""The drop-in batch of test_dropin_no_sync.py with mambaradix's pools on a
GPU, every drop-in call under torch.cuda.set_sync_debug_mode("error"): a
call that synchronises the host with the device raises.  Skipped without
a CUDA device; run by benchmarks/gpu_check.sh."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device visible to torch", allow_module_level=True)

from dropin_batch import MODES, run_batch  # noqa: E402


@contextlib.contextmanager
def no_sync() -> Iterator[None]:
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("mode", list(MODES))
def test_full_batch_never_syncs(mode: str) -> None:
    hits = run_batch(mode, "cuda", no_sync)
    torch.cuda.synchronize()
    assert hits[:2] == [0, 0] and min(hits[3:]) >= 16


def test_sync_debug_mode_raises() -> None:
    """The guard is live: a read back inside it raises."""
    t = torch.arange(3, device="cuda")
    with pytest.raises(RuntimeError):
        with no_sync():
            t.tolist()
