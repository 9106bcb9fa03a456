"""setup.py rebuilds _C when a build knob changes (file times alone would
reinstall the old build from build/)."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _copy_tree(dst: Path) -> None:
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dst / name)
    shutil.copytree(ROOT / "csrc", dst / "csrc", ignore=shutil.ignore_patterns("*.o"))
    shutil.copytree(ROOT / "mambaradix", dst / "mambaradix",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))


def _build(tree: Path, **env: str) -> tuple[bool, str]:
    """Builds in place; (whether _C was compiled, digest of the built _C)."""
    full = dict(os.environ, MAMBARADIX_CUDA="0", MAMBARADIX_DEBUG="0", MAMBARADIX_SANITIZE="0")
    full.update(env)
    out = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tree,
                         env=full, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    so = next((tree / "mambaradix").glob("_C*.so"))
    return ("building 'mambaradix._C' extension" in out.stdout + out.stderr,
            hashlib.sha256(so.read_bytes()).hexdigest())


@pytest.mark.skipif(os.environ.get("MAMBARADIX_UNDER_ASAN") == "1",
                    reason="builds the extension twice; the plain run covers it")
def test_changed_knob_rebuilds_and_same_knobs_do_not(tmp_path):
    _copy_tree(tmp_path)
    built, plain = _build(tmp_path)
    assert built
    built, again = _build(tmp_path)
    assert not built and again == plain          # nothing changed: nothing rebuilt
    built, debug = _build(tmp_path, MAMBARADIX_DEBUG="1")
    assert built and debug != plain              # a changed knob rebuilds
    built, back = _build(tmp_path)
    assert built and back != debug


def _nvcc():
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.access(p, os.X_OK)), None)


@pytest.mark.skipif(os.environ.get("MAMBARADIX_UNDER_ASAN") == "1",
                    reason="builds the extension twice; the plain run covers it")
@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc to build the CUDA kernels")
def test_cuda_build_then_cpu_only_build_is_cpu_only(tmp_path):
    """The reported case: a tree built with CUDA, rebuilt with MAMBARADIX_CUDA=0."""
    _copy_tree(tmp_path)

    def compiled() -> str:
        out = subprocess.run([sys.executable, "-c", "import mambaradix; print(mambaradix.cuda_compiled)"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    _build(tmp_path, MAMBARADIX_CUDA="1", NVCC_THREADS="2")
    assert compiled() == "True"
    built, _ = _build(tmp_path, MAMBARADIX_CUDA="0")
    assert built and compiled() == "False"
