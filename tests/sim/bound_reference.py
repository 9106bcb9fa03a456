"""Pure-Python references for the hit-rate bound (mambaradix.sim.bound),
written from docs/bound.md without its code: the last toucher by brute force
over every earlier request, the relaxation's optimum by enumeration, and an
exhaustive search over every admission and eviction choice of a cache of C
states serving requests one at a time.

A trace here is a list of (namespace, prompt, tokens): ``tokens`` is what the
request may compute (prompt, then outputs), in first-admission order."""

from __future__ import annotations

from functools import lru_cache
from typing import Optional, Sequence

import numpy as np


def trace_of(requests: Sequence) -> list:
    """(namespace, prompt, prompt + given outputs) of SimRequests in
    first-admission order ((arrival, position)), as int64 arrays; pseudo
    outputs (no output_ids) are left out: no later prompt contains them."""
    order = sorted(range(len(requests)), key=lambda i: (float(requests[i].arrival), i))
    out = []
    for i in order:
        r = requests[i]
        prompt = np.asarray(r.input_ids, dtype=np.int64)
        outs = np.zeros(0, dtype=np.int64) if r.output_ids is None else \
            np.asarray(r.output_ids[:r.output_len], dtype=np.int64)
        out.append((r.extra_key, prompt, np.concatenate([prompt, outs])))
    return out


def match_limit(prompt_len: int, cap: bool) -> int:
    return prompt_len - 1 if cap else prompt_len


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    a, b = np.asarray(a), np.asarray(b)
    n = min(len(a), len(b))
    d = np.flatnonzero(a[:n] != b[:n])
    return int(d[0]) if len(d) else n


def last_toucher(trace: list, j: int, p: int) -> Optional[int]:
    """The latest request before j whose tokens start with j's prompt[:p]
    (same namespace), or None."""
    ns, prompt, _ = trace[j]
    for i in range(j - 1, -1, -1):
        if trace[i][0] == ns and lcp(trace[i][2], prompt[:p]) >= p:
            return i
    return None


def unlimited_optimum(trace: list, page: int, cap: bool) -> int:
    """Each request at the deepest page-aligned prefix within its match cap
    that an earlier request touched."""
    total = 0
    for j, (ns, prompt, _) in enumerate(trace):
        best = 0
        for i in range(j):
            if trace[i][0] == ns:
                best = max(best, min(lcp(trace[i][2], prompt), match_limit(len(prompt), cap)))
        total += best // page * page
    return total


def relaxation_optimum(trace: list, C: int, page: int, cap: bool) -> int:
    """The relaxation of docs/bound.md by enumeration: at most one hit
    (j, p) per request, p page-aligned within the match cap with a last
    toucher a, at most C of the intervals (a, j] over any admission."""
    n = len(trace)
    options = []
    for j, (_, prompt, _) in enumerate(trace):
        opts = []
        for p in range(page, match_limit(len(prompt), cap) + 1, page):
            a = last_toucher(trace, j, p)
            if a is not None:
                opts.append((p, a))
        options.append(opts)
    cover = [0] * n
    best = 0

    def go(j: int, value: int) -> None:
        nonlocal best
        if j == n:
            best = max(best, value)
            return
        go(j + 1, value)
        for p, a in options[j]:
            ks = range(a + 1, j + 1)
            if all(cover[k] < C for k in ks):
                for k in ks:
                    cover[k] += 1
                go(j + 1, value + p)
                for k in ks:
                    cover[k] -= 1

    go(0, 0)
    return best


def best_schedule(trace: list, C: int, page: int, cap: bool) -> int:
    """The most prompt tokens any schedule reuses in a cache of at most C
    states at each admission: at request j, a hit at any cached prefix of
    its prompt within the cap (or none); then the cache becomes any set of at
    most C states out of those it held and the page-aligned prefixes of j's
    tokens that j computed (past its hit).  Every choice is tried, except
    that when all of them fit only keeping all is (a cache that holds more
    never serves less: any later choice open to the smaller set is open to
    the larger)."""
    n = len(trace)
    trace = [(ns, tuple(p.tolist()), tuple(t.tolist())) for ns, p, t in trace]

    @lru_cache(maxsize=None)
    def go(j: int, cache: frozenset) -> int:
        if j == n:
            return 0
        ns, prompt, toks = trace[j]
        limit = match_limit(len(prompt), cap)
        hits = [0] + [len(s) for (sns, s) in cache
                      if sns == ns and len(s) <= limit and prompt[:len(s)] == s]
        best = 0
        for u in set(hits):
            new = {(ns, toks[:q]) for q in range(u + 1, len(toks) + 1) if q % page == 0}
            pool = sorted(cache | new, key=repr)
            for keep in ([pool] if len(pool) <= C else _subsets(pool, C)):
                best = max(best, u + go(j + 1, frozenset(keep)))
        return best

    return go(0, frozenset())


def _subsets(items: list, most: int):
    """Every subset of items with at most ``most`` elements."""
    from itertools import combinations

    for k in range(min(most, len(items)) + 1):
        yield from combinations(items, k)
