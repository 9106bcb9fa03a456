"""Loading SGLang 0.5.23 into this process on a machine without a GPU.

SGLang 0.5.23 is found in a directory made by ``pip install --no-deps --target DIR sglang==0.5.23 ...``
(``load(DIR)``, ``--sglang-path DIR`` or the ``MAMBARADIX_SGLANG_0523`` variable), or else wherever
``import sglang`` finds it.  Three packages that SGLang imports at module level but that a CPU process
never executes get stand-ins from ``stubs/`` when they are not installed:

- ``triton``: kernels are defined (decorated) at import time and launched only on a GPU;
- ``sgl_kernel``: SGLang's compiled ops, imported by attention, Mamba and KV-move modules;
- ``torchvision``: image-model configs import it; a text model never calls it.

torch and transformers probe for triton / torchvision once and cache the answer: they are probed before
the stand-ins go on ``sys.path`` so they keep seeing "not installed".  ``sglang.srt.configs`` (whose
``__init__`` imports every model config) becomes a lazy package, so only the configs used are loaded.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import types
from typing import Optional

WANT = "0.5.23"
#: The variable naming a ``pip install --target`` directory that holds SGLang 0.5.23.
ENV_VAR = "MAMBARADIX_SGLANG_0523"
STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stubs")


class SGLangUnavailable(ImportError):
    """SGLang 0.5.23 cannot be imported here; the message says why and how to point at it."""


def _where_help() -> str:
    return (f"install it (pip install sglang=={WANT}) or point --sglang-path (or the {ENV_VAR} variable) "
            f"at a directory made with pip install --no-deps --target DIR sglang=={WANT} and what it imports")


def has_sglang(target: str) -> bool:
    """Whether ``target`` holds an SGLang with the unified cache (0.5.23's layout)."""
    return os.path.isdir(os.path.join(target, "sglang", "srt", "mem_cache", "unified_cache"))


_loaded: Optional[str] = None


def load(target: Optional[str] = None) -> None:
    """Make ``import sglang`` give 0.5.23 (from ``target``, else ``$MAMBARADIX_SGLANG_0523``, else the
    environment) with SGLang's CPU engine.  Idempotent; raises :class:`SGLangUnavailable` naming what is
    missing."""
    global _loaded
    if target is None:
        target = os.environ.get(ENV_VAR) or None
    if _loaded is not None:
        if target is not None and os.path.abspath(target) != _loaded:
            raise SGLangUnavailable(f"SGLang {WANT} is already loaded from {_loaded}, not {target}")
        return
    if target is not None and not has_sglang(target):
        raise SGLangUnavailable(f"SGLang {WANT} is not importable: {target} holds no sglang/srt/mem_cache/"
                                f"unified_cache; {_where_help()}")
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("SGLANG_RUST_BUILD_MODE", "never")
    if "sglang" in sys.modules:
        import sglang

        version = getattr(sglang, "__version__", None)
        if version != WANT:
            raise SGLangUnavailable(f"SGLang {version} is already imported in this process; need {WANT}")
    if target is not None and os.path.abspath(target) not in sys.path:
        sys.path.insert(0, os.path.abspath(target))
    try:
        import torch
        import torch._functorch.aot_autograd  # noqa: F401
        import torch._inductor.runtime.triton_compat  # noqa: F401
        import torch.utils._triton as tt
    except ImportError as e:
        raise SGLangUnavailable(f"SGLang {WANT} needs torch, which is not importable: {e}") from None
    torch.set_num_threads(1)
    tt.has_triton_package()
    try:
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()
        if STUBS not in sys.path:
            sys.path.append(STUBS)
        import sglang
        import sglang.srt
    except ImportError as e:
        raise SGLangUnavailable(f"SGLang {WANT} is not importable: {e}; {_where_help()}") from None
    if getattr(sglang, "__version__", None) != WANT:
        raise SGLangUnavailable(f"SGLang {WANT} is not importable: found sglang {sglang.__version__} at "
                                f"{os.path.dirname(sglang.__file__)}; {_where_help()}")
    _lazy_configs(list(sglang.srt.__path__)[0])
    _loaded = os.path.abspath(target) if target is not None else os.path.dirname(os.path.dirname(sglang.__file__))


def _lazy_configs(srt_dir: str) -> None:
    """``sglang.srt.configs`` as a lazy package: a name is imported from its module on first use."""
    cfg_dir = os.path.join(srt_dir, "configs")
    with open(os.path.join(cfg_dir, "__init__.py")) as f:
        src = f.read()
    where = {}
    for mod, names in re.findall(r"from sglang\.srt\.configs\.(\w+) import \(?([^)]*?)\)?\n(?=\S|$)", src):
        for n in re.split(r"[\s,]+", names):
            if n:
                where[n] = mod
    pkg = types.ModuleType("sglang.srt.configs")
    pkg.__path__ = [cfg_dir]

    def _lazy(name, _w=where):
        if name in _w:
            return getattr(importlib.import_module("sglang.srt.configs." + _w[name]), name)
        raise AttributeError(name)

    pkg.__getattr__ = _lazy
    sys.modules[pkg.__name__] = pkg
    # Image-model configs read two constants from a module that imports torchvision's transforms.
    iv = types.ModuleType("sglang.srt.multimodal.internvl_utils")
    iv.IMAGENET_MEAN = (0.485, 0.456, 0.406)
    iv.IMAGENET_STD = (0.229, 0.224, 0.225)
    sys.modules[iv.__name__] = iv
