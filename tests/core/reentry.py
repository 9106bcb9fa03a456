"""Helpers for the re-entrancy tests: arguments that run Python code (which
calls back into the object under test) while a binding reads them."""

from __future__ import annotations


class Calls:
    """An int (or bool) whose __index__ (or __bool__) first runs `fn` once."""

    def __init__(self, v: int, fn) -> None:
        self.v, self.fn = v, fn

    def _run(self) -> None:
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()

    def __index__(self) -> int:
        self._run()
        return int(self.v)

    def __bool__(self) -> bool:
        self._run()
        return bool(self.v)
