"""Every code block of README.md and docs/*.md runs, small and on CPU, so the
documentation cannot rot:

- ``bash server``: an SGLang server launch, checked as shell (``bash -n``), not run;
- ``python``: executed as a script (in a scratch folder, this tree first on
  the path); ``python gpu``: the same on a GPU (marked cuda; run by
  benchmarks/gpu_check.sh); ``python sglang-0.5.23``: needs SGLang 0.5.23,
  which cannot share an interpreter with the 0.5.15 wheel the other tests
  load: tests/dropin/sglang_0523/test_unified_core.py runs it against that release
  (here it must at least compile);
- ``console``: a transcript; each ``$ `` line runs in bash (in the scratch
  folder, this tree on the path) and must exit as its output says (2 after a
  ``mambaradix sim: error:`` line, else 0) with the first line of output shown;
- ``bash``: commands CI runs: each one must appear in .ci/run;
- ``json``: a token-id trace line, which the trace reader must accept.

A block of any other kind fails, so every block is covered."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^( *)```([^\n`]*)\n(.*?)^\1```[ \t]*$", re.S | re.M)


def blocks():
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            info = m.group(2).split()
            body = textwrap.dedent("\n".join(ln[len(m.group(1)):] if ln.startswith(m.group(1)) else ln
                                             for ln in m.group(3).splitlines()))
            out.append(pytest.param(info, body, id=f"{path.name}:{line}",
                                    marks=_marks(info, body)))
    return out


def _marks(info, body):
    marks = []
    if info[1:] == ["gpu"]:
        marks.append(pytest.mark.cuda)
    if info[:1] == ["console"] and "benchmarks/" in body:
        marks.append(pytest.mark.slow)
        marks.append(pytest.mark.skipif(os.environ.get("MAMBARADIX_UNDER_ASAN") == "1",
                                        reason="a timing benchmark; the plain run covers it"))
    return marks


def _env() -> dict:
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + path if path else ""))


def _needs(body: str) -> None:
    if re.search(r"^\s*import torch|^\s*import torch,|mambaradix\.sglang|torch\.", body, re.M):
        pytest.importorskip("torch")
    if "--plot" in body:
        pytest.importorskip("matplotlib")
    if re.search(r"upper_bound|bench_bound|--bound|bound=True", body):
        pytest.importorskip("scipy", reason="the hit-rate bound solves its LP with SciPy")


def test_every_block_has_a_known_kind():
    kinds = {tuple(p.values[0]) for p in blocks()}
    assert kinds <= {("python",), ("python", "gpu"), ("python", "sglang-0.5.23"), ("console",), ("bash",),
                     ("bash", "server"), ("json",)}, kinds


@pytest.mark.parametrize("info, body", blocks())
def test_block_runs(info, body, tmp_path):
    kind = info[0] if info else ""
    if info[1:] == ["sglang-0.5.23"]:
        compile(body, "README.md", "exec")
        pytest.skip("needs sglang 0.5.23: run by tests/dropin/sglang_0523/test_unified_core.py")
    if info[1:] == ["server"]:
        # A server launch: checked as shell; the plugin it relies on is run in SGLang's own start-up code
        # by tests/dropin/sglang_0523/test_plugin.py.
        subprocess.run(["bash", "-n"], input=body, text=True, check=True)
        assert "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=mambaradix" in body
        pytest.skip("launches an SGLang server on a GPU with a full SGLang 0.5.23 install")
    if kind == "python":
        if info[1:] == ["gpu"]:
            torch = pytest.importorskip("torch")
            import mambaradix

            if not torch.cuda.is_available() or mambaradix.cuda_device_count() == 0:
                pytest.skip("needs a CUDA device and a CUDA build")
        _needs(body)
        script = tmp_path / "block.py"
        script.write_text(body)
        r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
    elif kind == "console":
        _needs(body)
        _run_transcript(body, tmp_path)
    elif kind == "bash":
        ci = " ".join((ROOT / ".ci" / "run").read_text().replace("\\\n", " ").split())
        for command in body.replace("\\\n", " ").splitlines():
            command = " ".join(command.split("#")[0].split())
            if command:
                assert command in ci, f"not run by .ci/run: {command}"
    elif kind == "json":
        from mambaradix.sim import workloads

        trace = tmp_path / "t.jsonl"
        trace.write_text(body)
        assert len(workloads.load_trace(str(trace))) == len(body.strip().splitlines())
    else:
        pytest.fail(f"code block of unknown kind {info!r}")


def python_bin(tmp: Path) -> Path:
    """A folder whose `python` is this interpreter, venv included: a wrapper, not a link (a link named
    bin/python outside a venv starts the venv's base interpreter, without the venv's packages)."""
    bindir = tmp / "bin"
    bindir.mkdir()
    wrapper = bindir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    return bindir


def _run_transcript(body: str, tmp: Path) -> None:
    (tmp / "benchmarks").symlink_to(ROOT / "benchmarks")
    steps: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    assert steps, "a console block shows at least one command"
    bindir = python_bin(tmp)
    env = _env()
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    for command, shown in steps:
        r = subprocess.run(["bash", "-c", command], cwd=tmp, env=env, capture_output=True,
                           text=True, timeout=900)
        shown = [ln for ln in shown if ln.strip()]
        error = any("mambaradix sim: error:" in ln for ln in shown)
        assert r.returncode == (2 if error else 0), f"{command}\n{r.stdout}{r.stderr}"
        if shown and shown[0] != "...":
            produced = (r.stderr if error else r.stdout).splitlines()
            assert produced and produced[0] == shown[0], f"{command}: {produced[:1]} != {shown[:1]}"


@pytest.mark.parametrize("name, max_lines, max_width", [
    ("ARCHITECTURE.md", 250, 110),
    ("benchmarks/RESULTS.md", 400, None),
])
def test_the_one_page_documents_stay_short(name, max_lines, max_width):
    """ARCHITECTURE.md is one page and RESULTS.md holds current tables only
    (history lives in git, deep dives in docs/)."""
    lines = (ROOT / name).read_text().splitlines()
    assert len(lines) <= max_lines, f"{name} has {len(lines)} lines (at most {max_lines})"
    if max_width:
        wide = [i + 1 for i, line in enumerate(lines) if len(line) > max_width]
        assert not wide, f"{name}: lines {wide} are wider than {max_width} characters"
