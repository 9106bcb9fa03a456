"""Helpers for the re-entrancy tests: arguments that run Python code (which
calls back into the object under test) while a binding reads them."""

from __future__ import annotations


class Calls:
    """An int whose __index__ first runs `fn` once."""

    def __init__(self, v: int, fn) -> None:
        self.v, self.fn = v, fn

    def __index__(self) -> int:
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()
        return self.v
