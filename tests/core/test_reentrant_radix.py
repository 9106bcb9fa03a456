"""RadixTree calls whose arguments run Python code (an item's or an int's
__index__) that calls the same tree while the arguments are read.  The
outer call must not use what the re-entrant call changed under it: a node
it removed, a namespace id read before it created one.  Reference: the same
two calls made one after the other (the re-entrant one first, as it
finishes first), on a second tree."""

from __future__ import annotations

import pytest

import mambaradix
from reentry import Calls


def _contents(t, keys, extra_key=None):
    """What the tree answers for each key: (indices, state)."""
    out = []
    for k in keys:
        m = t.match_prefix(list(k), extra_key=extra_key)
        out.append((m.indices.tolist(), m.state))
    return out


def test_evict_path_states_reads_cap_before_the_node() -> None:
    # cap's __index__ resets the tree (freeing the node) and inserts anew; the
    # outer call used to go on with the freed node
    key, other = list(range(1, 13)), list(range(60, 72))

    def run(reenter: bool):
        t = mambaradix.RadixTree(page_size=1, chunk_size=4)
        t.insert(key[:8], list(range(100, 108)), 3)
        t.insert(key, list(range(100, 112)), 4)
        node = t.match_prefix(key).node

        def inner():
            t.reset()
            t.insert(other, list(range(400, 412)), 9)

        if not reenter:
            inner()
        with pytest.raises(mambaradix.StaleNodeError, match="node was removed"):
            t.evict_path_states(node, Calls(0, inner) if reenter else 0)
        t.sanity_check()
        return _contents(t, [key, other]), t.node_count()

    got, want = run(True), run(False)
    assert got == want
    assert got[0] == [([], None), (list(range(400, 412)), 9)]


def test_match_prefix_reads_the_namespace_after_its_key() -> None:
    # an item of the key inserts under the same extra_key, creating its
    # namespace: the outer match used the id it looked up before (none) and
    # missed
    key, vals = list(range(1, 9)), list(range(100, 108))

    def run(reenter: bool):
        t = mambaradix.RadixTree(page_size=1, chunk_size=4)
        inner = lambda: t.insert(list(key), list(vals), 3, extra_key="x")
        if not reenter:
            inner()
        k = [Calls(key[0], inner)] + key[1:] if reenter else list(key)
        m = t.match_prefix(k, extra_key="x")
        t.sanity_check()
        return m.indices.tolist(), m.state, m.kv_matched_len

    got, want = run(True), run(False)
    assert got == want
    assert got == (vals, 3, 8)
