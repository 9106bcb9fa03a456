"""The source layout's layering rules (ARCHITECTURE.md):

- ``csrc/core`` includes only its own headers; ``csrc/tensor`` only its own and
  the core's; ``csrc/cuda`` only the core's and the tensor layer's; only
  ``csrc/py`` may include ``Python.h`` or NumPy's headers;
- compiled on their own, the objects of ``csrc/core`` and ``csrc/tensor``
  define and use no CPython symbol (checked with ``nm``).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc"
ALLOWED = {"core": {"core"}, "tensor": {"core", "tensor"}, "cuda": {"core", "tensor"},
           "py": {"core", "tensor", "py"}}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def _headers() -> dict:
    return {h.name: h.parent.name for d in ALLOWED for h in (CSRC / d).glob("*.h")}


def _sources(layer: str) -> list:
    return sorted(p for p in (CSRC / layer).iterdir() if p.suffix in (".c", ".h", ".cu", ".cuh"))


def test_every_source_is_in_a_layer():
    loose = sorted(p.name for p in CSRC.iterdir() if p.is_file())
    assert loose == [], f"files outside csrc/{{{','.join(ALLOWED)}}}: {loose}"
    assert {p.name for p in CSRC.iterdir() if p.is_dir()} == set(ALLOWED)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_includes_follow_the_layers(layer):
    where = _headers()
    bad = []
    for src in _sources(layer):
        for kind, name in INCLUDE.findall(src.read_text()):
            if kind == '"':
                home = where.get(name)
                if home is None and layer != "py":   # py may include CPython's own "structmember.h"
                    bad.append(f"{src.name}: unknown header {name}")
                elif home is not None and home not in ALLOWED[layer]:
                    bad.append(f"{src.name}: includes {home}/{name}")
            elif layer != "py" and (name == "Python.h" or name.startswith("numpy/")):
                bad.append(f"{src.name}: includes <{name}>")
    assert bad == []


@pytest.mark.parametrize("layer", ["core", "tensor"])
def test_objects_use_no_python_symbol(layer, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    nm = shutil.which("nm")
    if cc is None or nm is None:
        pytest.skip("needs a C compiler and nm")
    incs = [f"-I{CSRC / d}" for d in ALLOWED[layer]]
    found = []
    srcs = [p for p in _sources(layer) if p.suffix == ".c"]
    assert srcs
    for src in srcs:
        obj = tmp_path / (src.stem + ".o")
        subprocess.run([cc, "-std=c11", "-O1", "-c", str(src), "-o", str(obj), *incs], check=True)
        out = subprocess.run([nm, str(obj)], check=True, capture_output=True, text=True).stdout
        syms = [line.split()[-1] for line in out.splitlines() if line.strip()]
        assert syms, f"nm listed no symbol in {obj.name}"
        found += [f"{src.name}: {s}" for s in syms if re.match(r"_*Py|_*PyArray|_*NPY", s)]
    assert found == []
