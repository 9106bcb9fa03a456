"""``python -m mambaradix sglang-replay``: a trace through SGLang 0.5.23's own scheduler, on CPU.

:func:`replay` runs simulator requests (``mambaradix.sim.workloads``) through SGLang's ``Scheduler`` with
a teacher-forced stand-in forward and toy recurrent states, and reports SGLang's own per-request
``cached_tokens``, the token hit rate, the scheduler's CPU time and toy-state mismatches
(docs/sglang-replay.md).  Importing this package imports neither SGLang nor torch; ``env.load`` finds
SGLang 0.5.23 and ``replay`` calls it.
"""

from __future__ import annotations

from .env import SGLangUnavailable, load
from .replay import STAND_INS, ReplayConfig, ReplayError, ReplayResult, replay, toy_hash

__all__ = ["ReplayConfig", "ReplayError", "ReplayResult", "SGLangUnavailable", "STAND_INS", "load", "replay",
           "toy_hash"]
