"""Runs the C tests of the core (tests/c: plain, ASan+UBSan and fault-injection
builds, plus valgrind when installed) so that pytest is the single entry point.

Skipped only when no C compiler (or no make) is installed.
"""

import os
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
