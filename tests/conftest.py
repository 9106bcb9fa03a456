"""The tests live in folders by layer (see ARCHITECTURE.md, "Tests"):

    c/        the C core without Python (make-built binaries, run from pytest)
    core/     the tree, pools and lifecycle through their Python bindings
    tensor/   DLPack, the state pool and the kernels (CPU twins; GPU where present)
    dropin/   the SGLang front ends (v0.5.15 drop-in, 0.5.23 TreeCore in sglang_0523/)
    sim/      the reference driver, the simulator and the notebook
    package/  building, packaging, the README and the docs

Shared helpers (seeds.py here; reference models and SGLang loaders in their
layer's folder) are imported by module name, so every folder is on sys.path.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _d in ("", "c", "core", "tensor", "dropin", "sim", "package"):
    _p = os.path.join(_HERE, _d)
    if _p not in sys.path:
        sys.path.insert(0, _p)
