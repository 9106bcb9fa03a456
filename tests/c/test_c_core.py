"""Runs the C tests of the core (tests/c: plain, ASan+UBSan and fault-injection
builds, plus valgrind when installed) so that pytest is the single entry point:
the radix tree (make test), and the unit tests of slot_alloc.c, req_pool.c and
kernels_cpu.c (make test-units).  tests/c/test_c_lifecycle.py runs the lifecycle's.

Skipped only when no C compiler (or no make) is installed.
"""

import os
import re
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
C_DIR = HERE

# Variables of a sanitized Python run that must not reach the C binaries:
# LD_PRELOAD would load libasan into valgrind and into the plain build,
# ASAN_OPTIONS=detect_leaks=0 would hide the leaks these tests look for.
_SCRUB = ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "PYTHONMALLOC",
          "CFLAGS", "MAKEFLAGS", "MFLAGS")


def _compiler():
    cc = os.environ.get("CC")
    if cc and shutil.which(cc.split()[0]):
        return cc
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    return None


def run_make(target: str) -> str:
    """Runs `make -C tests/c target` with a clean environment; skips without a
    compiler or make, fails with the output when it fails, returns the output."""
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler installed")
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["CC"] = cc
    proc = subprocess.run(
        [make, "-C", C_DIR, target],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        pytest.fail(f"make -C tests/c {target} exited with {proc.returncode}:\n{proc.stdout}", pytrace=False)
    return proc.stdout


def test_c_core():
    run_make("test")


def test_c_units():
    """Each unit test (tests/c/test_{slot_alloc,req_pool,kernels_cpu}.c) ran and
    passed in every variant: plain, ASan+UBSan, fault injection, valgrind."""
    out = run_make("test-units")
    variants = ["plain", "asan+ubsan", "fault injection"]
    if shutil.which("valgrind"):
        variants.append("valgrind")
    for unit in ("slot_alloc", "req_pool", "kernels_cpu"):
        for variant in variants:
            assert f"== {unit}: {variant}\n" in out, (unit, variant)
        passed = re.findall(rf"^test_{unit}: \d+ checks, 0 failed: passed$", out, re.M)
        assert len(passed) == len(variants), unit
    # the fault-injection builds made allocations fail (slot_alloc, req_pool) and
    # checked that the kernels allocate nothing
    points = [int(n) for n in re.findall(r"^oom: init: (\d+) allocation failure points checked$", out, re.M)]
    assert len(points) == 2 and min(points) > 0
    assert re.search(r"with failing allocations; .* \(injected [1-9]", out)
    assert "fuzz (no allocation allowed): " in out
