"""SGLang v0.5.15's own decision code, read from the installed wheel's files.

The scheduler modules that hold SGLang's lifecycle decisions
(``schedule_batch.py``, ``batch_result_processor.py``, ``memory_pool.py``,
``mem_cache/common.py``) import SGLang's whole serving stack at module level,
which a ``--no-deps`` install cannot satisfy.  The decisions themselves are
small functions and methods that touch only their arguments and a handful of
module globals.  :func:`load_functions` takes each one's source text from the
wheel's file (by AST, unchanged), and compiles it in a namespace that holds
exactly the globals the caller passes: the code under comparison is SGLang's,
only its surroundings are stand-ins.

``SKIP_REASON`` is None when the wheel is there, else why not (a test module
skips with it).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import textwrap
import types
from typing import Any, Dict, Iterable, Optional

SGLANG_VERSION = "0.5.15"


def sglang_dir() -> Optional[str]:
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def sglang_version() -> Optional[str]:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001  (PackageNotFoundError, broken metadata)
        return None


def _skip_reason() -> Optional[str]:
    v = sglang_version()
    if v is None or sglang_dir() is None:
        return "the sglang package is not installed (pip install --no-deps sglang==%s)" % SGLANG_VERSION
    if v != SGLANG_VERSION:
        return "sglang %s is installed; these tests read v%s's files" % (v, SGLANG_VERSION)
    return None


SKIP_REASON = _skip_reason()


def source_of(relpath: str, qualname: str, with_line: bool = False):
    """The source text of ``qualname`` ("func", "Class" or "Class.method")
    in the wheel's ``relpath`` (e.g. "srt/mem_cache/common.py"), dedented
    (and its first line number in the file, with_line=True)."""
    path = os.path.join(sglang_dir() or "", relpath)
    with open(path) as f:
        src = f.read()
    body: Iterable[ast.stmt] = ast.parse(src).body
    node: Any = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part),
                    None)
        if node is None:
            raise LookupError("%s not found in %s" % (qualname, path))
        body = node.body
    # with decorators such as @staticmethod: they are part of the code
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    seg = textwrap.dedent("\n".join(src.splitlines()[first - 1: node.end_lineno]))
    return (seg, first) if with_line else seg


def module_constant(relpath: str, name: str) -> Any:
    """A module-level constant of the wheel's file (a literal or an
    arithmetic expression of literals)."""
    path = os.path.join(sglang_dir() or "", relpath)
    with open(path) as f:
        tree = ast.parse(f.read())
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            return eval(compile(ast.Expression(n.value), path, "eval"), {"__builtins__": {}})
    raise LookupError("%s not found in %s" % (name, path))


def load_functions(relpath: str, qualnames: Iterable[str], env: Dict[str, Any]) -> types.SimpleNamespace:
    """Compiles each of ``qualnames`` from the wheel's ``relpath`` in one
    namespace whose globals are ``env`` (plus ``from __future__ import
    annotations``, so annotations naming SGLang's types are never evaluated).
    Returns them by their last name."""
    g: Dict[str, Any] = {"__name__": "sglang_source:" + relpath}
    g.update(env)
    out = types.SimpleNamespace()
    path = os.path.join(sglang_dir() or "", relpath)
    for q in qualnames:
        seg, first = source_of(relpath, q, with_line=True)
        # padded so that tracebacks show the wheel's line numbers
        text = "from __future__ import annotations\n" + "\n" * max(first - 2, 0) + seg
        code = compile(text, path, "exec")
        exec(code, g)
        name = q.split(".")[-1]
        setattr(out, name, g[name])
    return out
