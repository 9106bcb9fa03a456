"""_C.UnifiedCore calls (the C half of mambaradix.sglang.unified's TreeCore)
whose arguments run Python code (a RadixKey property, an int's __index__, a
result class) that calls the same core while the call is under way.  The
outer call must not use what the re-entrant call changed under it: the
tokens it read, a node the tree freed.  Reference: the same two calls made
one after the other (the re-entrant one first, as it finishes first) on a
second core.  SGLang's parameter and result classes are stand-ins with the
attributes the C calls read (the adapter hands over the real ones)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pytest

import mambaradix
from mambaradix import _C
from reentry import Calls

torch = pytest.importorskip("torch")


class RadixKey:
    def __init__(self, toks, extra_key=None) -> None:
        self.token_ids = np.asarray(toks, dtype=np.int64)
        self.extra_key, self.cache_salt, self.is_bigram, self.limit = extra_key, None, False, None


class HookKey(RadixKey):
    """A RadixKey whose cache_salt (read after the tokens) runs `hook` once."""

    def __init__(self, toks, hook) -> None:
        super().__init__(toks)
        self.hook = hook

    @property
    def cache_salt(self):
        h, self.hook = self.hook, None
        if h is not None:
            h()
        return None

    @cache_salt.setter
    def cache_salt(self, v) -> None:
        pass


MatchResult = NamedTuple("MatchResult", [(f"f{i}", Any) for i in range(14)])


class Plain:
    def __init__(self, *a) -> None:
        self.a = a


class InsertStepResult:
    def __init__(self, actions, result) -> None:
        self.actions, self.result = actions, result


class Params:
    def __init__(self, **k) -> None:
        self.value, self.mamba_value, self.prev_prefix_len, self.inserted_len = None, None, 0, 0
        self.priority, self.session_id = 0, None
        self.__dict__.update(k)


class Core:
    """The adapter's side: namespaces, KV events (recorded), no Python path."""

    def __init__(self) -> None:
        self.stores = []

    def _namespace(self, key):
        return key.extra_key

    def _record_store(self, leaf, key, session_id) -> None:
        self.stores.append((leaf.id, leaf.gen, key.token_ids.tolist()))

    def _match_prefix_py(self, p):
        raise AssertionError("the Python path was taken")

    _begin_insert_py = _match_prefix_py


def _build(free_kv=Plain, has_mamba=False, events=False, path_cap=-1):
    tree = mambaradix.RadixTree(page_size=1, chunk_size=1, lru_policy="consumed", semantics="v0.5.23",
                                kv_only=not has_mamba)
    core = Core()
    classes = (RadixKey, torch.Tensor, MatchResult, InsertStepResult, Plain, free_kv, Plain, torch.int64, Plain,
               Plain)
    uc = _C.UnifiedCore(tree, core, classes, ({}, {}, {}), torch.from_numpy, torch.empty((0,), dtype=torch.int64),
                        has_mamba, events, 1, 1, path_cap, "lru")
    return tree, uc, core


def _tree_insert(uc, toks, first, state=None):
    uc.tree_insert(np.array(toks, dtype=np.int64), np.arange(first, first + len(toks), dtype=np.int64), state, None,
                   0, 0, 0)


def _contents(tree, keys):
    """What the tree answers for each key: (KV indices, state)."""
    out = []
    for k in keys:
        m = tree.match_prefix(list(k))
        out.append((m.indices.tolist(), m.state))
    return out


OUTER = list(range(1, 9))


@pytest.mark.parametrize("inner_len", [8, 4096], ids=["same-length", "longer"])
def test_begin_insert_keeps_its_key_while_an_int_runs_tree_insert(inner_len) -> None:
    # prev_prefix_len is read after the key; its __index__ inserts another key
    # (the Python path's tree_insert) into the buffer that held the outer
    # tokens: the outer values went in under the inner tokens, or (a longer
    # key) the buffer moved and the outer insert read freed memory
    inner_key = list(range(1000, 1000 + inner_len))

    def run(reenter: bool):
        tree, uc, _ = _build()
        inner = lambda: _tree_insert(uc, inner_key, 300)
        if not reenter:
            inner()
        p = Params(key=RadixKey(OUTER), value=torch.arange(100, 108, dtype=torch.int64),
                   prev_prefix_len=Calls(0, inner) if reenter else 0)
        r = uc.begin_insert(p)
        tree.sanity_check()
        return r.result.prefix_len, r.actions, _contents(tree, [OUTER, inner_key])

    got, want = run(True), run(False)
    assert got == want
    assert got[2][0] == (list(range(100, 108)), None)


def test_begin_insert_keeps_its_key_while_a_key_property_runs_begin_insert() -> None:
    # key.cache_salt is read after the tokens: a begin_insert there took the
    # buffer holding them (the outer call had not yet marked it lent out)
    other = list(range(50, 58))

    def run(reenter: bool):
        tree, uc, _ = _build()
        inner = lambda: uc.begin_insert(Params(key=RadixKey(other), value=torch.arange(300, 308)))
        if not reenter:
            inner()
        key = HookKey(OUTER, inner if reenter else None)
        r = uc.begin_insert(Params(key=key, value=torch.arange(100, 108)))
        tree.sanity_check()
        return r.result.prefix_len, _contents(tree, [OUTER, other])

    got, want = run(True), run(False)
    assert got == want
    assert got[1] == [(list(range(100, 108)), None), (list(range(300, 308)), None)]


def test_match_prefix_keeps_its_key_while_a_key_property_runs_match_prefix() -> None:
    # key.cache_salt is read after the tokens: a match there overwrote them,
    # and the outer call matched the other key
    other = list(range(50, 58))

    def run(reenter: bool):
        tree, uc, _ = _build()
        _tree_insert(uc, OUTER, 100)
        _tree_insert(uc, other, 300)
        inner = lambda: uc.match_prefix(Params(key=RadixKey(other)))
        if not reenter:
            inner()
        m = uc.match_prefix(Params(key=HookKey(OUTER, inner if reenter else None)))
        return m[0], m[10], uc.path_device_indices(m[1]).tolist()

    got, want = run(True), run(False)
    assert got == want
    assert got == (8, 8, list(range(100, 108)))


def test_begin_insert_names_its_node_before_building_the_result() -> None:
    # the duplicates' FreeDeviceKV is built (Python code) before the
    # MambaEvictExcessPathStates action, the KV event and the result, which
    # all name the node the insert ended at: a FreeDeviceKV that resets the
    # tree left them reading the freed node
    def run(reenter: bool):
        box = {}

        class FreeKV(Plain):
            def __init__(self, *a) -> None:
                super().__init__(*a)
                h, box["hook"] = box.get("hook"), None
                if h is not None:
                    h()

        tree, uc, core = _build(FreeKV, has_mamba=True, events=True, path_cap=1)
        _tree_insert(uc, OUTER, 100, state=1)

        def inner():
            tree.reset()
            for i in range(4):   # new nodes, likely where the freed ones were
                _tree_insert(uc, list(range(60 + 20 * i, 72 + 20 * i)), 400 + 20 * i, state=2 + i)

        box["hook"] = inner if reenter else None
        key = OUTER + [9, 10, 11, 12]
        r = uc.begin_insert(Params(key=RadixKey(key), value=torch.arange(200, 212), mamba_value=torch.tensor([5])))
        if not reenter:
            inner()
        tree.sanity_check()
        dups = r.actions[0].a[0][0].tolist()
        return (r.result.prefix_len, r.result.last_device_node, r.actions[1].a, dups, core.stores,
                _contents(tree, [key] + [range(60 + 20 * i, 72 + 20 * i) for i in range(4)]))

    got, want = run(True), run(False)
    assert got == want
    nid = got[1]
    assert got[2] == (nid,) and got[3] == list(range(200, 208))
    assert got[4] == [(nid & 0xFFFFFFFF, nid >> 32, OUTER + [9, 10, 11, 12])]


@pytest.mark.parametrize("swap", ["int32", "strided", "subclass"])
def test_begin_insert_reads_the_value_as_it_is_after_the_ints(swap) -> None:
    # an int's __index__ replaces the value tensor's storage (int32, a
    # strided view) after its kind was looked at: the insert used to read
    # the new storage as contiguous int64 (a heap over-read, garbage KV
    # indices in the tree); it must take the Python path, as it does for
    # such a value from the start.  A Tensor subclass always takes it.
    def run(reenter: bool):
        tree, uc, core = _build()
        taken = []
        core._begin_insert_py = lambda p: taken.append((p.value.dtype, p.value.is_contiguous())) or "python path"
        value = torch.arange(100, 108, dtype=torch.int64)

        def hook():
            if swap == "int32":
                value.data = torch.arange(1, 9, dtype=torch.int32)
            elif swap == "strided":
                value.data = torch.arange(300, 316, dtype=torch.int64)[::2]

        v = value
        if swap == "subclass":
            v = value.as_subclass(type("Sub", (torch.Tensor,), {}))
        if not reenter:
            hook()
        r = uc.begin_insert(Params(key=RadixKey(OUTER), value=v, prev_prefix_len=Calls(0, hook) if reenter else 0))
        tree.sanity_check()
        return r, taken, _contents(tree, [OUTER])

    got = run(True)
    assert got == run(False)
    assert got[0] == "python path" and got[2] == [([], None)]


def test_dec_lock_ref_reads_the_receipt_before_the_node() -> None:
    # the receipt's node_id (a property) resets the tree: the node the call
    # had resolved was freed before it was unlocked
    class Receipt:
        def __init__(self, nid, hook) -> None:
            self.nid, self.hook, self.skipped_lock_components = nid, hook, ()

        @property
        def node_id(self):
            h, self.hook = self.hook, None
            if h is not None:
                h()
            return self.nid

    def run(reenter: bool):
        tree, uc, _ = _build()
        _tree_insert(uc, OUTER, 100)
        nid = uc.inc_lock_ref(uc.match_prefix(Params(key=RadixKey(OUTER)))[1]).node_id

        def inner():
            tree.reset()
            _tree_insert(uc, list(range(60, 72)), 400)

        if not reenter:
            inner()
        with pytest.raises(KeyError, match="names no live node"):
            uc.dec_lock_ref(nid, Receipt(nid, inner if reenter else None))
        tree.sanity_check()
        return _contents(tree, [OUTER, range(60, 72)]), tree.full_protected_size()

    got, want = run(True), run(False)
    assert got == want
    assert got == ([([], None), (list(range(400, 412)), None)], 0)


@pytest.mark.parametrize("refusal", ["prev_prefix_len", "negative index", "no state", "negative state"])
def test_refused_begin_insert_names_no_namespace(refusal) -> None:
    # a new extra_key gets its id at the insert, not when the key is read:
    # a begin_insert refused for a later argument leaves the table as it
    # was, and the next accepted insert under that name gets the next id
    has_mamba = refusal in ("no state", "negative state")
    tree, uc, _ = _build(has_mamba=has_mamba)
    good = dict(value=torch.arange(100, 108, dtype=torch.int64),
                mamba_value=torch.tensor([3], dtype=torch.int64) if has_mamba else None)
    bad = dict(good)
    if refusal == "prev_prefix_len":
        bad["prev_prefix_len"] = -1
    elif refusal == "negative index":
        bad["value"] = torch.full((8,), -5, dtype=torch.int64)
    elif refusal == "no state":
        bad["mamba_value"] = None
    else:
        bad["mamba_value"] = torch.tensor([-2], dtype=torch.int64)
    with pytest.raises(ValueError):
        uc.begin_insert(Params(key=RadixKey(OUTER, "tenant-a"), **bad))
    assert tree.namespace("tenant-a", create=False) == -1 and tree.total_size() == (0, 0)
    r = uc.begin_insert(Params(key=RadixKey(OUTER, "tenant-b"), **good))
    assert r.result.prefix_len == 0
    assert (tree.namespace("tenant-b", create=False), tree.namespace("tenant-a", create=False)) == (1, -1)
    assert tree.match_prefix(OUTER, extra_key="tenant-b").kv_matched_len == 8
    assert tree.match_prefix(OUTER).kv_matched_len == 0


@pytest.mark.parametrize("order", [(2, 2**63 - 1, -2**63), (2, -2**63, 2**63 - 1)])
def test_tlru_takes_any_int64_threshold_without_wrapping(order) -> None:
    # TLRU's budget, history + next_prompt_estimate - threshold, is computed
    # as SGLang's Python ints compute it: here it is below 0 (every leaf past
    # it) or far above any depth (none), so the leaves go in plain LRU order,
    # as with thresholds that fit (a wrapped sum put some leaves first)
    def evicted(order):
        tree = mambaradix.RadixTree(page_size=1, chunk_size=1, lru_policy="consumed", semantics="v0.5.23",
                                    kv_only=True)
        classes = (RadixKey, torch.Tensor, MatchResult, InsertStepResult, Plain, Plain, Plain, torch.int64, Plain,
                   Plain)
        uc = _C.UnifiedCore(tree, Core(), classes, ({}, {}, {}), torch.from_numpy,
                            torch.empty((0,), dtype=torch.int64), False, False, 1, 1, -1, "tlru", order)
        keys = [[1, 2, 3, 4], [1, 2, 9], [5, 6, 7, 8, 9, 10], [5, 11]]
        for i, k in enumerate(keys):
            _tree_insert(uc, k, 100 * (i + 1))
        for k in keys[::-1]:
            tree.match_prefix(k)          # history and recency
        got = []
        while tree.total_size()[0]:
            got.append(tree.evict_full(1).kv_indices.tolist())
        return got

    want_all_past = evicted((2, 2**60, 0))        # budget < 0: every leaf is past it
    want_none_past = evicted((2, 0, 2**60))       # budget far above every depth
    assert evicted(order) == (want_all_past if order[1] > 0 else want_none_past)
