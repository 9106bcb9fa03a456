"""Shared helpers of the radix tree tests: implementations, an allocator,
and a comparison of the C tree with the reference model."""

from __future__ import annotations

import os
import sys
from collections import deque

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from reference_tree import ReferenceTree  # noqa: E402

try:
    from mambaradix import _C

    RadixTree = getattr(_C, "RadixTree", None)
    StaleNodeError = getattr(_C, "StaleNodeError", None)
    InvariantError = getattr(_C, "InvariantError", None)
except ImportError:  # the extension is not built
    _C = None
    RadixTree = StaleNodeError = InvariantError = None

HAVE_C = RadixTree is not None
needs_c = pytest.mark.skipif(not HAVE_C, reason="mambaradix._C.RadixTree is not built")

# Implementations a flow test runs against: the C tree and the model.
IMPLS = [
    pytest.param("c", marks=needs_c),
    "ref",
]


def make_tree(impl: str, **kw):
    if impl == "c":
        return RadixTree(**kw)
    if impl == "ref":
        return ReferenceTree(**kw)
    raise ValueError(impl)


def ints(xs) -> list:
    """A result array or list as a list of Python ints (None stays None: a
    tree made with values=False has no values)."""
    if xs is None:
        return None
    if hasattr(xs, "tolist"):
        return xs.tolist()
    return [int(x) for x in xs]


def node_path(node) -> tuple:
    """(extra_key, every token from the root to the end of node)."""
    parts = []
    extra = node.extra_key
    while not node.is_root:
        parts.append(ints(node.key))
        node = node.parent
    tokens = []
    for part in reversed(parts):
        tokens.extend(part)
    return (extra, tuple(tokens))


class Allocator:
    """A FIFO free list of indices 1..size, like SGLang's token allocator
    and state slot allocator (index 0 is the reserved dummy)."""

    def __init__(self, size: int):
        self.size = size
        self.free_list = deque(range(1, size + 1))
        self.used = set()

    def available_size(self) -> int:
        return len(self.free_list)

    def alloc(self, n: int) -> list:
        assert n <= len(self.free_list), "allocator exhausted"
        out = [self.free_list.popleft() for _ in range(n)]
        self.used.update(out)
        return out

    def free(self, indices) -> None:
        for i in ints(indices):
            assert i in self.used, "double free of %d" % i
            self.used.remove(i)
            self.free_list.append(i)


def tree_snapshot(tree, paths=None) -> list:
    """Every node of a tree (C or model) as a comparable tuple, sorted by
    path: (extra_key, path, value, state, full_lock_ref, state_lock_ref).
    paths: a dict that receives node -> (extra_key, path)."""
    out = []
    stack = [(tree.root, ())]
    while stack:
        node, prefix = stack.pop()
        key = ints(node.key)
        path = prefix + tuple(key)
        if paths is not None:
            paths[node] = (node.extra_key, path)
        out.append(
            (
                node.extra_key,
                path,
                ints(node.value),
                node.state,
                node.full_lock_ref if not node.is_root else None,
                node.state_lock_ref if not node.is_root else None,
            )
        )
        for child in reversed(list(node.children)):
            stack.append((child, path))
    out.sort(key=lambda r: (r[0] is not None, r[0] or "", r[1]))
    return out


def lru_paths(tree, which: str, paths=None) -> list:
    """The paths of an LRU list, most recent first (paths: a node -> path
    dict from tree_snapshot, to save the walks to the root)."""
    if paths is not None:
        return [paths[n] for n in tree.lru_order(which)]
    return [node_path(n) for n in tree.lru_order(which)]


def sizes(tree) -> tuple:
    return (
        tree.full_evictable_size(),
        tree.full_protected_size(),
        tree.mamba_evictable_size(),
        tree.mamba_protected_size(),
        tuple(tree.total_size()),
        tree.node_count(),
    )
