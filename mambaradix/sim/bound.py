"""An offline upper bound on the token hit rate of a replay.

``upper_bound(requests, config) -> BoundResult``: no state policy, online or
offline, reuses more prompt tokens than ``hit_tokens`` when the simulator
replays ``requests`` under ``config``.  docs/bound.md states the model and
proves it; in short:

- a hit of request j at prefix length p needs the state of ``prompt_j[:p]``
  in the tree at j's first admission, and that state was inserted by an
  earlier request whose tokens (prompt and outputs) start with that prefix;
  the latest such request before j, ``a(j, p)``, is the *last toucher*;
- served one request at a time (``max_running=1``), the state stands in the
  tree at every first admission from a(j, p) + 1 to j, distinct hits standing
  at one admission use distinct states, and after admitting request k the
  tree holds at most ``state_slots - held`` states (``held``: the slots k
  holds once admitted, the C lifecycle's admission rule);
- choosing at most one hit per request with at most that many intervals over
  any admission is a maximum-weight flow on a path of admissions; its exact
  optimum, certified by the dual of the flow's LP, is the bound.

With ``max_running > 1`` a state may be inserted after a later request's
admission, so the intervals above do not hold: the bound is then the
pool-free one (``unlimited_hit_tokens``, each request at the deepest prefix
an earlier request touched), which holds for every concurrency.

The flow's LP needs SciPy (HiGHS; ``pip install mambaradix[sim]``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from .. import _C
from ..scheduler import DriverConfig, match_key_limit
from .checks import validate_config
from .types import SimConfig, SimRequest

__all__ = ["BoundResult", "upper_bound", "held_slots", "BoundCache", "POOL_AWARE", "UNLIMITED_POOL"]

#: BoundResult.kind: the bound counts the state pool (served one at a time) ...
POOL_AWARE = "pool_aware"
#: ... or it is the unlimited-pool bound (several requests running at once).
UNLIMITED_POOL = "unlimited_pool"


@dataclass
class BoundResult:
    """An upper bound on a replay's reused prompt tokens, with diagnostics.

    hit_tokens: no replay of the workload under the configuration reuses
      more prompt tokens (``SimMetrics.state_usable_tokens``).
    prompt_tokens, requests: the workload's.
    unlimited_hit_tokens: the bound with an unlimited state pool (every
      request hits at the deepest page-aligned prefix within its match cap
      that an earlier request touched); valid for any configuration.
    pool_aware: whether hit_tokens accounts for the state pool (served one
      request at a time); False: hit_tokens is unlimited_hit_tokens.
    capacity: the states that may stand in the tree at a first admission
      (state slots minus those the admitted request holds); None when not
      pool_aware.
    candidates: hits the relaxation chose among (per request, the deepest
      prefix for each distinct last toucher).
    exact: hit_tokens is the relaxation's optimum, attained by an integral
      selection of hits (False only if the LP solver's answer could not be
      rounded to one; hit_tokens is then a valid, looser bound).
    wall_seconds: time taken.
    """

    hit_tokens: int
    prompt_tokens: int
    requests: int
    unlimited_hit_tokens: int
    pool_aware: bool
    capacity: Optional[int]
    candidates: int
    exact: bool
    wall_seconds: float

    @property
    def kind(self) -> str:
        """POOL_AWARE ("pool_aware") or UNLIMITED_POOL ("unlimited_pool")."""
        return POOL_AWARE if self.pool_aware else UNLIMITED_POOL

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def unlimited_token_hit_rate(self) -> float:
        return self.unlimited_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def held_slots(mode: str) -> int:
    """State slots a request holds once admitted in ``mode`` (a running slot
    and the track buffer: pp2 3, pp1 and lazy 2, no_buffer 1), asked of the C
    lifecycle's admission rule for a request that holds none."""
    d = DriverConfig(mode=mode)
    lc = _C.Lifecycle(page_size=1, chunk_size=64, extra_buffer=d.extra_buffer, lazy=d.lazy,
                      track_buffer_size=2 if d.overlap else 1, track_interval=256)
    return int(lc.admit(_C.ReqState())[1])


def _request_tokens(requests: Sequence[SimRequest]) -> list:
    """Every token each request may compute: its prompt, its outputs as the
    replay decodes them (``output_ids``, or the replay's pseudo tokens) and
    the two spare tokens an overlapped step decodes past its end (int32
    arrays, in the order given)."""
    from .engine import _pseudo_outputs, _pseudo_outputs_many

    gen = [i for i, r in enumerate(requests) if r.output_ids is None]
    flat, at = _pseudo_outputs_many([requests[i].rid for i in gen],
                                    [int(requests[i].output_len) + 2 for i in gen])
    outs = {i: flat[at[k]:at[k + 1]] for k, i in enumerate(gen)}
    tokens = []
    for i, r in enumerate(requests):
        ids = np.asarray(r.input_ids, dtype=np.int32)
        if r.output_ids is None:
            tokens.append(np.concatenate([ids, outs[i]]))
        else:
            given = np.asarray(r.output_ids[:r.output_len], dtype=np.int32)
            tokens.append(np.concatenate([ids, given, _pseudo_outputs(r.rid + "#spare", 2)]))
    return tokens


class _Node:
    """A node of the touch trie: an edge of tokens and the latest request
    whose tokens pass through all of it."""

    __slots__ = ("key", "children", "latest")

    def __init__(self, key: np.ndarray, latest: int) -> None:
        self.key = key
        self.children: dict = {}
        self.latest = latest


def _touch(root: _Node, toks: np.ndarray, limit: int, j: int) -> list:
    """Walks request j's tokens down the trie of the earlier requests' tokens
    and makes j the latest toucher of every prefix of them.  Returns, for the
    prefixes of length 1..limit that an earlier request touched, runs
    ``(lo, hi, a)``: a is the last toucher of every prefix of length in
    (lo, hi] (a never grows with the length)."""
    runs: list = []
    node, pos, n = root, 0, len(toks)
    while pos < n:
        t = int(toks[pos])
        child = node.children.get(t)
        if child is None:
            node.children[t] = _Node(toks[pos:], j)
            break
        key = child.key
        span = min(len(key), n - pos)
        diff = np.flatnonzero(key[1:span] != toks[pos + 1:pos + span])
        k = int(diff[0]) + 1 if len(diff) else span
        if k < len(key):
            upper = _Node(key[:k], child.latest)
            child.key = key[k:]
            upper.children[int(key[k])] = child
            node.children[t] = upper
            child = upper
        if pos < limit:
            if runs and runs[-1][2] == child.latest:
                runs[-1] = (runs[-1][0], min(pos + k, limit), child.latest)
            else:
                runs.append((pos, min(pos + k, limit), child.latest))
        child.latest = j
        pos += k
        node = child
    return runs


def _candidates(requests: Sequence[SimRequest], order: list, tokens: list, page: int,
                cap: bool) -> tuple:
    """Per request (by position in ``order``), its candidate hits: the
    deepest page-aligned prefix within the match cap for each distinct last
    toucher.  Returns arrays (j, a, p), positions in ``order``."""
    roots: dict = {}
    js, as_, ps = [], [], []
    for j, i in enumerate(order):
        r = requests[i]
        root = roots.get(r.extra_key)
        if root is None:
            root = roots[r.extra_key] = _Node(np.zeros(0, dtype=np.int32), -1)
        limit = match_key_limit(len(r.input_ids), cap)
        for lo, hi, a in _touch(root, tokens[i], limit, j):
            p = hi // page * page
            if p > lo:
                js.append(j)
                as_.append(a)
                ps.append(p)
    return (np.asarray(js, dtype=np.int64), np.asarray(as_, dtype=np.int64),
            np.asarray(ps, dtype=np.int64))


def _dual_value(pi: np.ndarray, tail: np.ndarray, head: np.ndarray, cap: np.ndarray,
                gain: np.ndarray, supply: np.ndarray) -> int:
    """Weak duality for max sum(gain * f), inflow - outflow = supply per node,
    0 <= f <= cap: for any node potentials pi, sum(pi * supply) + sum(cap *
    max(0, gain - pi[head] + pi[tail])) bounds every feasible flow's value.
    Exact integer arithmetic."""
    pi = [int(v) for v in pi]
    total = sum(p * int(s) for p, s in zip(pi, supply) if s)
    for t, h, c, g in zip(tail.tolist(), head.tolist(), cap.tolist(), gain.tolist()):
        red = g - pi[h] + pi[t]
        if red > 0:
            total += c * red
    return total


def _max_flow_value(n: int, C: int, js: np.ndarray, first: np.ndarray, ps: np.ndarray) -> tuple:
    """The most sum of p over hits, at most one per request, at most C of them
    standing at any admission (hit i stands at first[i]..js[i]): a
    maximum-gain flow of C units along the path of admissions 0..n (node b
    sits before admission b), each hit an edge first -> v_j of gain p into a
    node v_j with one unit out to j+1.  Returns (value, exact): value bounds
    the optimum from above (the dual of rounded LP potentials) and equals it
    when exact."""
    try:
        from scipy.optimize import linprog
        from scipy.sparse import csr_matrix
    except ImportError as e:
        raise ImportError("mambaradix.sim.upper_bound solves a linear program with SciPy; "
                          "install it with `pip install scipy` (or mambaradix[sim])") from e
    users, vidx = np.unique(js, return_inverse=True)
    nv = len(users)
    # edges: the path (n), the hits (K), one out-edge per request with hits (nv)
    K = len(js)
    tail = np.concatenate([np.arange(n), first, n + 1 + np.arange(nv)])
    head = np.concatenate([np.arange(1, n + 1), n + 1 + vidx, users + 1])
    cap = np.concatenate([np.full(n, C), np.ones(K + nv, dtype=np.int64)])
    gain = np.concatenate([np.zeros(n, dtype=np.int64), ps, np.zeros(nv, dtype=np.int64)])
    nodes = n + 1 + nv
    supply = np.zeros(nodes, dtype=np.int64)   # inflow - outflow
    supply[0], supply[n] = -C, C
    ne = len(tail)
    cols = np.arange(ne)
    A = csr_matrix((np.concatenate([np.ones(ne), -np.ones(ne)]),
                    (np.concatenate([head, tail]), np.concatenate([cols, cols]))), shape=(nodes, ne))
    res = linprog(-gain.astype(float), A_eq=A, b_eq=supply.astype(float),
                  bounds=np.column_stack([np.zeros(ne), cap.astype(float)]), method="highs")
    bound = int(ps.sum())      # pi = 0: every candidate taken
    primal = -1
    if res.status == 0:
        marg = np.rint(np.asarray(res.eqlin.marginals)).astype(np.int64)
        bound = min(bound, _dual_value(marg, tail, head, cap, gain, supply),
                    _dual_value(-marg, tail, head, cap, gain, supply))
        f = np.rint(res.x).astype(np.int64)
        bal = np.zeros(nodes, dtype=np.int64)
        np.add.at(bal, head, f)
        np.add.at(bal, tail, -f)
        if (f >= 0).all() and (f <= cap).all() and (bal == supply).all():
            primal = int((gain * f).sum())
    return bound, primal == bound


def _validate(requests: Any, config: Any) -> None:
    """What ``run`` refuses (the configuration, then the requests), and an
    empty workload."""
    from .engine import _validate as validate_replay

    if not isinstance(config, SimConfig):
        raise TypeError(f"config must be a SimConfig, got {type(config).__name__}")
    validate_config(config)
    validate_replay(requests, config.resolved())
    if not requests:
        raise ValueError("requests is empty")


def upper_bound(requests: Sequence[SimRequest], config: SimConfig) -> BoundResult:
    """The most prompt tokens any state policy can reuse when ``requests``
    are replayed under ``config`` (see the module docstring and
    docs/bound.md).  Raises TypeError / ValueError (ConfigError) for what
    ``run`` refuses, before any work."""
    _validate(requests, config)
    t0 = time.perf_counter()
    cfg = config.resolved()
    order = sorted(range(len(requests)), key=lambda i: (float(requests[i].arrival), i))
    tokens = _request_tokens(requests)
    js, as_, ps = _candidates(requests, order, tokens, int(cfg.page_size), bool(cfg.match_cap))
    n = len(order)
    prompt = sum(r.prompt_len for r in requests)
    # a hit stands at the admissions after its last toucher's, up to its own
    first = as_ + 1
    # the deepest candidate of each request (it has the earliest last toucher)
    best = np.zeros(n, dtype=np.int64)
    start = np.full(n, n, dtype=np.int64)
    np.maximum.at(best, js, ps)
    np.minimum.at(start, js, first)
    unlimited = int(best.sum())
    pool_aware = cfg.max_running == 1
    C: Optional[int] = None
    value, exact = unlimited, True
    if pool_aware:
        C = max(0, int(cfg.state_slots) - held_slots(cfg.mode))
        # every request at its deepest hit fits when no admission stands
        # under more than C of those intervals
        users = np.flatnonzero(best)
        cover = np.zeros(n + 1, dtype=np.int64)
        np.add.at(cover, start[users], 1)
        np.add.at(cover, users + 1, -1)
        if C == 0:
            value = 0
        elif len(users) and np.cumsum(cover).max() > C:
            value, exact = _max_flow_value(n, C, js, first, ps)
            value = min(value, unlimited)
    return BoundResult(hit_tokens=int(value), prompt_tokens=int(prompt), requests=n,
                       unlimited_hit_tokens=unlimited, pool_aware=pool_aware, capacity=C,
                       candidates=len(js), exact=exact, wall_seconds=time.perf_counter() - t0)


class BoundCache:
    """``upper_bound(requests, config)`` for several configurations of one
    workload (a sweep), each distinct bound computed once: the bound depends
    only on the page size and the match cap, and, served one at a time, on
    the states the tree may hold at an admission (state slots less the
    slots the mode holds)."""

    def __init__(self, requests: Sequence[SimRequest]) -> None:
        self.requests = requests
        self._done: dict = {}

    @staticmethod
    def key(config: SimConfig) -> tuple:
        cfg = config.resolved()
        room = (int(cfg.state_slots) - held_slots(cfg.mode)) if cfg.max_running == 1 else None
        return int(cfg.page_size), bool(cfg.match_cap), room

    def has(self, config: SimConfig) -> bool:
        """Whether config's bound is computed already."""
        return self.key(config) in self._done

    def __call__(self, config: SimConfig) -> BoundResult:
        if not isinstance(config, SimConfig):
            raise TypeError(f"config must be a SimConfig, got {type(config).__name__}")
        validate_config(config)
        k = self.key(config)
        if k not in self._done:
            self._done[k] = upper_bound(self.requests, config)
        return self._done[k]
