"""Loads SGLang 0.5.23 on a CPU-only machine for the TreeCore tests and benchmarks.

SGLang 0.5.23 lives in its own directory (``MAMBARADIX_SGLANG_0523``, default
``<repo>/.sgl0523``, filled by ``pip install --no-deps --target``) because the
shared interpreter keeps SGLang 0.5.15 for the v0.5.15 drop-in tests.  The
loading itself (stand-ins for triton, sgl_kernel and torchvision, which SGLang
imports but a CPU process never executes; lazy model configs) is the package's
``mambaradix.sglang_replay.env.load``, which ``sglang-replay`` uses too.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
TARGET = os.environ.get("MAMBARADIX_SGLANG_0523", os.path.join(REPO, ".sgl0523"))
WANT = "0.5.23"


def target_has_sglang() -> bool:
    return os.path.isdir(os.path.join(TARGET, "sglang", "srt", "mem_cache", "unified_cache"))


def bootstrap() -> None:
    """Make ``import sglang`` give 0.5.23 from TARGET.  Idempotent."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from mambaradix.sglang_replay import env

    env.load(TARGET)
