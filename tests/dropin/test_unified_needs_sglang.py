"""mambaradix.sglang.unified without SGLang 0.5.23: register(), the
MambaradixTreeCore class and inspection_core_class() raise an ImportError
that says SGLang 0.5.23 is needed and why this interpreter has none: sglang
not installed (a child process in which no import of sglang succeeds), or
another release (the SGLang 0.5.15 wheel the drop-in's oracle tests use,
when it is installed).  Importing the module itself still needs no SGLang.
A module of 0.5.23 that is missing is named by the tests run against it
(sglang_0523/test_unified_core.py)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Each way in: what the child reports, as (exception type, message), per call.
_CHILD = r"""
import json, sys
if sys.argv[1] == "blocked":   # sglang unimportable, whatever is installed
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name == "sglang" or name.startswith("sglang."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Blocker())
import mambaradix.sglang.unified as unified

def outcome(call):
    try:
        call()
    except BaseException as e:
        return [type(e).__name__, str(e)]
    return ["ok", ""]

print(json.dumps({
    "register": outcome(unified.register),
    "MambaradixTreeCore()": outcome(lambda: unified.MambaradixTreeCore()),
    "from-import": outcome(lambda: exec("from mambaradix.sglang.unified import MambaradixTreeCore")),
    "inspection_core_class": outcome(unified.inspection_core_class),
    "register again": outcome(unified.register),
}))
"""


def _child(mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", _CHILD, mode], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


NEEDS = "mambaradix.sglang.unified needs SGLang 0.5.23 ({}): "


def test_without_sglang_each_entry_says_sglang_0523_is_needed():
    got = _child("blocked")
    for call, (kind, message) in got.items():
        what = "sglang.test.kits.unified_radix_cache" if call == "inspection_core_class" else \
            "sglang.srt.mem_cache.unified_cache"
        assert kind == "ImportError", (call, kind, message)
        assert message == NEEDS.format(what) + "No module named 'sglang'", (call, message)


def _installed_sglang():
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.skipif(_installed_sglang() in (None, "0.5.23"),
                    reason="needs another SGLang release installed (CI installs the 0.5.15 wheel)")
def test_with_another_sglang_release_the_error_names_its_version():
    version = _installed_sglang()
    got = _child("installed")
    for call, (kind, message) in got.items():
        assert kind == "ImportError", (call, kind, message)
        assert message.startswith("mambaradix.sglang.unified needs SGLang 0.5.23 ("), (call, message)
        # the reason: this release, then what its import raised
        assert f"): sglang {version} is installed (" in message, (call, message)
