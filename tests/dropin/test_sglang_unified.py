"""Runs tests/dropin/sglang_0523/ (mambaradix as a TreeCore for SGLang 0.5.23) in a
subprocess: the shared interpreter keeps SGLang 0.5.15 for the drop-in tests,
and 0.5.23 is installed in its own directory (MAMBARADIX_SGLANG_0523, default
.sgl0523; .ci/run fills it)."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TARGET = os.environ.get("MAMBARADIX_SGLANG_0523", os.path.join(REPO, ".sgl0523"))


def test_treecore_against_sglang_0523():
    if not os.path.isdir(os.path.join(TARGET, "sglang", "srt", "mem_cache", "unified_cache")):
        pytest.skip(f"sglang 0.5.23 is not installed in {TARGET} (see .ci/run)")
    env = dict(os.environ, MAMBARADIX_SGL0523_RUN="1", PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    if os.environ.get("MAMBARADIX_UNDER_ASAN"):
        env.setdefault("MAMBARADIX_DIFF_OPS", "150")  # the plain run does the 10^4 operations
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::UserWarning",
         os.path.join(HERE, "sglang_0523")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-4000:]
