"""Lifecycle.kv_free_ends: a tree-only Lifecycle hands back the KV indices
to free in the free calls SGLang v0.5.15's MambaRadixCache makes (its
mamba_radix_cache.py): an evicted node's KV with a call of its own
(_evict_leaf_node, _iteratively_delete_tombstone_leaf), a finished
request's tail before its insert's duplicates (cache_finished_req), and
those duplicates one call per node of the path they cross (_insert_helper,
``free(value[start:prefix_len])`` at each node it walks).  A paged
allocator puts each call's pages, sorted, at the head of its free list, so
the calls decide which indices come next (the three-way comparison over
SGLang's paged allocator is tests/dropin/test_sglang_pools_oracle_paged.py)."""

from __future__ import annotations

import numpy as np

from mambaradix import _C

KEY = list(range(1, 25))


def _rs(running: int, track=(-1, -1), nxt: int = -1, last_track: int = -1) -> tuple:
    return (running, track[0], track[1], nxt, last_track, -1, -1, 0, 1, 0, -1, 0, 0)


def _calls(kv: np.ndarray, ends: np.ndarray) -> list:
    return [kv[a:b].tolist() for a, b in zip([0] + ends.tolist()[:-1], ends.tolist())]


def _tree() -> _C.Lifecycle:
    """Nodes [0, 8) (KV 100..107), [8, 12) and [12, 16) (208..215, split
    by the last insert) and [16, 24) (316..323), each with a state."""
    lc = _C.Lifecycle(page_size=4, chunk_size=4, extra_buffer=True)
    lc.insert(KEY[:8], np.arange(100, 108), 1)
    # the cached 8 come back as duplicates: one call, the node [0, 8)
    _, _, _, _, dups = lc.insert(KEY[:16], np.arange(200, 216), 2)
    assert _calls(dups, lc.kv_free_ends) == [list(range(200, 208))]
    # past a protected prefix of 4, across two nodes: a call for each
    pl, _, _, _, dups = lc.insert(KEY, np.arange(300, 324), 3, prev_prefix_len=4)
    assert pl == 16 and _calls(dups, lc.kv_free_ends) == [list(range(304, 308)), list(range(308, 316))]
    # a key ending inside the node [8, 16) splits it there: its part is a call of its own
    pl, _, _, _, dups = lc.insert(KEY[:12], np.arange(400, 412), 4)
    assert pl == 12 and _calls(dups, lc.kv_free_ends) == [list(range(400, 408)), list(range(408, 412))]
    lc.check()
    return lc


def test_insert_duplicates_one_call_per_node() -> None:
    _tree()


def test_eviction_one_call_per_node() -> None:
    lc = _tree()
    tokens, states, kv, _ = lc.evict(10 ** 6, 0)
    assert tokens == 24 and states == 4
    nodes = [list(range(100, 108)), list(range(208, 212)), list(range(212, 216)), list(range(316, 324))]
    assert sorted(_calls(kv, lc.kv_free_ends)) == nodes
    # a state's eviction that deletes a leaf frees its KV (one call too)
    lc = _tree()
    _, states, kv, _ = lc.evict(0, 4)
    assert states == 4 and sorted(_calls(kv, lc.kv_free_ends)) == nodes


def test_finished_request_tail_before_its_duplicates() -> None:
    lc = _C.Lifecycle(page_size=4, chunk_size=4, extra_buffer=True)
    lc.insert(KEY[:4], np.arange(100, 104), 1)
    lc.insert(KEY[:8], np.arange(200, 208), 2)      # nodes [0, 4) and [4, 8)
    # 14 committed tokens, the last snapshot at 12: the tail 12..13 goes
    # first (SGLang frees it before the insert), then the duplicates of
    # the cached 8 tokens, one call per node
    _, kv_free, _ = lc.cache_finished(_rs(9, track=(5, 6), nxt=0, last_track=12), KEY[:14],
                                              np.arange(500, 514))
    assert _calls(kv_free, lc.kv_free_ends) == [[512, 513], [500, 501, 502, 503], [504, 505, 506, 507]]
    # nothing cached (is_insert=False): one call, from the protected length
    _, kv_free, _ = lc.cache_finished(_rs(7, track=(3, 4), nxt=0, last_track=12), KEY[:6],
                                              np.arange(600, 606), is_insert=False)
    assert _calls(kv_free, lc.kv_free_ends) == [list(range(600, 606))]
    lc.check()
