"""Builds and runs tests/c/test_lifecycle.c: the pools and the request
lifecycle in C, without Python, with out-of-memory injection at every
allocation of a batch round (accounting must stay valid)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["slot_alloc.c", "req_pool.c", "lifecycle.c", "radix.c", "common.c"]


def test_c_lifecycle_oom_injection(tmp_path) -> None:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONMALLOC")}
    exe = str(tmp_path / "test_lifecycle")
    cmd = [cc, "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter",
           "-Wno-missing-field-initializers", "-DMR_FAULT_INJECT", "-I", os.path.join(ROOT, "csrc"),
           os.path.join(ROOT, "tests", "c", "test_lifecycle.c")]
    cmd += [os.path.join(ROOT, "csrc", s) for s in SOURCES]
    cmd += ["-o", exe]
    build = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([exe], capture_output=True, text=True, env=env, timeout=600)
    sys.stdout.write(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failed" in run.stdout
