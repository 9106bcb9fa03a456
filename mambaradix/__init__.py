"""mambaradix: a native prefix cache for hybrid attention + recurrent-state models.

Importing mambaradix never imports torch.
"""

import importlib.machinery as _machinery
import os as _os
import sys as _sys


def _has_extension(folder):
    return any(_os.path.isfile(_os.path.join(folder, "_C" + suffix))
               for suffix in _machinery.EXTENSION_SUFFIXES)


def _installed_copy(here):
    """The folder of another mambaradix on sys.path with a built _C, or None."""
    here = _os.path.realpath(here)
    for entry in _sys.path:
        folder = _os.path.join(entry or _os.getcwd(), "mambaradix")
        if (_os.path.realpath(folder) != here and _has_extension(folder)
                and _os.path.isfile(_os.path.join(folder, "__init__.py"))):
            return folder
    return None


if not _has_extension(_os.path.dirname(_os.path.abspath(__file__))):
    # A source checkout whose extension was never built in place, imported
    # because it sits in the current directory: `python -m mambaradix` from
    # the clone's root after `pip install .`.  The installed copy takes over:
    # its folder becomes the package's path (so its _C, its subpackages and
    # its __main__ are the ones imported) and its __init__ runs here.
    _here = _os.path.dirname(_os.path.abspath(__file__))
    _other = _installed_copy(_here)
    if _other is None:
        raise ImportError(
            f"mambaradix is imported from its source tree ({_here}), where the C extension "
            "mambaradix._C is not built. Build it in place (pip install -e . , or "
            "python setup.py build_ext --inplace), or install it (pip install .).",
            name=__name__, path=__file__)
    __path__[:] = [_other]
    __file__ = _os.path.join(_other, "__init__.py")
    if __spec__ is not None:
        __spec__.submodule_search_locations = [_other]
        __spec__.origin = __file__
    with open(__file__, "rb") as _f:
        exec(compile(_f.read(), __file__, "exec"))
else:
    from . import _C
    from ._C import (
        Error,
        EvictResult,
        InsertResult,
        InvariantError,
        MatchResult,
        Node,
        RadixTree,
        StaleNodeError,
        cuda_compiled,
        cuda_device_count,
    )
    from ._C import StatePool, Tensor, write_req_to_token

    __version__ = "0.1.0"

    __all__ = [
        "Error",
        "EvictResult",
        "InsertResult",
        "MatchResult",
        "Node",
        "RadixTree",
        "InvariantError",
        "StaleNodeError",
        "StatePool",
        "Tensor",
        "cuda_compiled",
        "cuda_device_count",
        "write_req_to_token",
    ]
