"""mambaradix: a native prefix cache for hybrid attention + recurrent-state models.

Importing mambaradix never imports torch.
"""

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
    "cuda_compiled",
    "cuda_device_count",
]
