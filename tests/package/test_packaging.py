"""Declared dependencies: a torch extra pinned as the tests pin torch, and skipped
tests that say why."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_torch_extra_is_pinned_as_the_tests_pin_it():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    test_reqs = (ROOT / "tests" / "requirements.txt").read_text().splitlines()
    pins = {p for f in (".ci/run", "tests/run.sh", "tests/requirements.txt")
            for p in re.findall(r"torch==[0-9][0-9.+a-z]*", (ROOT / f).read_text())}
    assert extras["torch"] == ["torch==2.13.0"] and "torch==2.13.0" in test_reqs and pins == {"torch==2.13.0"}
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash tests/run.sh" in ci          # CI installs through the README's test command
    assert {"matplotlib", "tqdm"} <= set(extras["sim"]) and "pytest" in extras["test"]


def test_skipped_tests_say_why(tmp_path):
    (tmp_path / "test_skip.py").write_text(
        "import pytest\n\ndef test_needs_it():\n    pytest.skip('needs the moon')\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
                        "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"SKIPPED \[1\] .*test_skip\.py:\d+: needs the moon", r.stdout), r.stdout
