"""`python -m mambaradix` run from a clone's root after `pip install .`: the
unbuilt source folder ./mambaradix comes first on sys.path and must hand over
to the installed copy, or say what to run when there is none."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not list((ROOT / "mambaradix").glob("_C*.so")),
                                reason="needs the extension built in place in this tree")


def _unbuilt_clone(dst: Path) -> Path:
    shutil.copytree(ROOT / "mambaradix", dst / "mambaradix",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    assert not list((dst / "mambaradix").glob("_C*.so"))
    return dst


def _installed(dst: Path) -> Path:
    """A site folder holding a built copy of the package."""
    shutil.copytree(ROOT / "mambaradix", dst / "mambaradix",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _run(cwd: Path, code_or_module: list[str], pythonpath: str | None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, *code_or_module], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_main_command_from_clone_root_uses_the_installed_copy(tmp_path):
    clone = _unbuilt_clone(tmp_path / "clone")
    site = _installed(tmp_path / "site")
    out = _run(clone, ["-m", "mambaradix", "sim", "--workload", "gsp", "--gsp-num-groups", "2",
                       "--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "64",
                       "--gsp-question-len", "8", "--gsp-output-len", "4", "--json"], str(site))
    assert out.returncode == 0, out.stderr
    assert '"token_hit_rate"' in out.stdout
    where = _run(clone, ["-c", "import mambaradix, mambaradix.sim.cli as c, mambaradix._C as m; "
                               "print(mambaradix.__file__); print(c.__file__); print(m.__file__); "
                               "print(mambaradix.RadixTree(page_size=1).page_size)"], str(site))
    assert where.returncode == 0, where.stderr
    lines = where.stdout.split()
    assert all(Path(p).is_relative_to(site) for p in lines[:3]), lines
    assert lines[3] == "1"


def test_unbuilt_source_tree_without_an_installed_copy_says_what_to_run(tmp_path):
    clone = _unbuilt_clone(tmp_path / "clone")
    out = _run(clone, ["-m", "mambaradix", "sim"], None)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert "ImportError: mambaradix is imported from its source tree" in last
    assert "not built" in last and "pip install -e ." in last and "build_ext --inplace" in last
    assert "circular import" not in out.stderr
