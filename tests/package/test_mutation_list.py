"""tests/mutation/run.py's mutants still apply: each names a file that
exists and a piece of text found exactly once in it (a mutant whose text
moved would be reported NOT APPLICABLE instead of testing anything)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_mutant_applies_exactly_once():
    spec = importlib.util.spec_from_file_location("mutation_run", ROOT / "tests" / "mutation" / "run.py")
    run = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = run   # its dataclasses look their module up
    try:
        spec.loader.exec_module(run)
    finally:
        del sys.modules[spec.name]
    assert run.MUTANTS
    bad = []
    for m in run.MUTANTS:
        path = ROOT / m.path
        n = path.read_text().count(m.find) if path.exists() else -1
        if n != 1:
            bad.append(f"{m.id}: {m.path} has its text {n} times")
    assert bad == []
