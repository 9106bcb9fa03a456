"""Loads SGLang 0.5.23 on a CPU-only machine for the TreeCore tests and benchmark.

SGLang 0.5.23 lives in its own directory (``MAMBARADIX_SGLANG_0523``, default
``<repo>/.sgl0523``, filled by ``pip install --no-deps --target``) because the
shared interpreter keeps SGLang 0.5.15 for the v0.5.15 drop-in tests.  Three
imports that the cache never executes are cut here, test-only:

- ``triton``, ``sgl_kernel``: stand-ins from ``stubs/`` (kernels are defined at
  import time, never launched by tree operations).  torch and transformers probe
  for triton/torchvision once and cache the answer; they are probed *before* the
  stand-ins go on ``sys.path`` so they keep seeing "not installed".
- ``torchvision``: only image-model configs import it; ``sglang.srt.configs`` is
  made a lazy package (its ``__init__`` imports every model config) so the cache
  loads only the config modules it uses.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
TARGET = os.environ.get("MAMBARADIX_SGLANG_0523", os.path.join(REPO, ".sgl0523"))
WANT = "0.5.23"


def target_has_sglang() -> bool:
    return os.path.isdir(os.path.join(TARGET, "sglang", "srt", "mem_cache", "unified_cache"))


_done = False


def bootstrap() -> None:
    """Make ``import sglang`` give 0.5.23 from TARGET.  Idempotent."""
    global _done
    if _done:
        return
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("SGLANG_RUST_BUILD_MODE", "never")
    if "sglang" in sys.modules:
        import sglang

        if getattr(sglang, "__version__", None) != WANT:
            raise RuntimeError(f"sglang {sglang.__version__} is already imported; need {WANT}")
    if TARGET not in sys.path:
        sys.path.insert(0, TARGET)
    import torch  # noqa: F401
    import torch._functorch.aot_autograd  # noqa: F401
    import torch._inductor.runtime.triton_compat  # noqa: F401
    import torch.utils._triton as tt

    torch.set_num_threads(1)
    tt.has_triton_package()
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()
    sys.path.insert(0, os.path.join(HERE, "stubs"))

    import sglang.srt

    cfg_dir = os.path.join(list(sglang.srt.__path__)[0], "configs")
    src = open(os.path.join(cfg_dir, "__init__.py")).read()
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
    # Image-model configs read two constants from a module that imports torchvision.
    iv = types.ModuleType("sglang.srt.multimodal.internvl_utils")
    iv.IMAGENET_MEAN = (0.485, 0.456, 0.406)
    iv.IMAGENET_STD = (0.229, 0.224, 0.225)
    sys.modules[iv.__name__] = iv
    import sglang

    if sglang.__version__ != WANT:
        raise RuntimeError(f"{TARGET} holds sglang {sglang.__version__}, need {WANT}")
    _done = True
