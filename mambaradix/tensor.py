"""Tensors and the state pool: DLPack in and out, and the state kernels.

Everything here is native (``mambaradix._C``); this module only gives the
names a home with type stubs (``tensor.pyi``).  Importing it never imports
torch: tensors from any DLPack producer (torch, CuPy, JAX, numpy) are
accepted, and mambaradix's own tensors can be viewed by any consumer.
"""

from ._C import StatePool, Tensor, write_req_to_token

__all__ = ["StatePool", "Tensor", "write_req_to_token"]
