"""Every boolean argument of the binding takes a bool (or a numpy.bool_)
and refuses anything else with TypeError naming the call and the argument,
before any work: flags were truth-tested, so RadixTree(check_ownership=
"false") turned the checks on while page_size=True was refused.  One
reader, py_args.c's mr_arg_bool, serves every class and function."""

from array import array

import numpy as np
import pytest

from mambaradix import _C

GOOD = [True, False, np.True_, np.False_]


class Truthy:
    """An object whose truth runs code: never asked."""

    def __bool__(self) -> bool:
        raise AssertionError("a flag's __bool__ was called")


BAD = ["false", "", 1, 0, None, 1.0, np.int64(1), [True], Truthy()]


def _pools():
    sa, ka, rp = _C.SlotAllocator(16), _C.SlotAllocator(256), _C.ReqPool(4, 64)
    return sa, ka, rp, _C.Lifecycle(sa, ka, rp, page_size=1, chunk_size=4)


def _admitted():
    sa, ka, rp, lc = _pools()
    rec = _C.ReqState()
    (row,), _ = lc.admit([-1], [rec])
    rp.write(row, 0, ka.alloc(4))
    return sa, ka, rp, lc, row, rec


def _foreign(call):
    """call(lifecycle, record, flag) on a tree-only Lifecycle and a request
    admitted over the caller's slot 1."""
    def run(v):
        lc = _C.Lifecycle(None, None, None, page_size=1, chunk_size=4)
        rec = _C.ReqState()
        lc.admit(rec, [1])
        call(lc, rec, v)
    return run


def _tree_with_leaf():
    t = _C.RadixTree()
    t.insert([1, 2], [5, 6], 1)
    return t


def _lc_case(call):
    """call(lifecycle, row, record, flag) on an admitted request; a refused
    flag leaves the pools, the tree and the record as they were."""
    def run(v):
        sa, ka, rp, lc, row, rec = _admitted()
        before = (lc.sizes(), sa.counts(), ka.counts(), rp.available_size(), rec.astuple())
        try:
            call(lc, row, rec, v)
        finally:
            if not isinstance(v, (bool, np.bool_)):
                assert (lc.sizes(), sa.counts(), ka.counts(), rp.available_size(), rec.astuple()) == before
    return run


# (the call as errors name it, the flag, a function of the flag's value
# that makes the call on fresh objects)
CASES = [
    ("RadixTree", "check_ownership", lambda v: _C.RadixTree(check_ownership=v)),
    ("RadixTree", "kv_only", lambda v: _C.RadixTree(semantics="v0.5.23", kv_only=v)),
    ("RadixTree", "values", lambda v: _C.RadixTree(values=v)),
    ("match_prefix", "indices", lambda v: _tree_with_leaf().match_prefix([1, 2], indices=v)),
    ("evict_full", "indices", lambda v: _tree_with_leaf().evict_full(1, indices=v)),
    ("evict_mamba", "indices", lambda v: _tree_with_leaf().evict_mamba(1, indices=v)),
    ("Lifecycle", "extra_buffer", lambda v: _C.Lifecycle(None, None, None, extra_buffer=v)),
    ("Lifecycle", "lazy", lambda v: _C.Lifecycle(None, None, None, extra_buffer=True, lazy=v)),
    ("Lifecycle", "end_of_turn_states", lambda v: _C.Lifecycle(None, None, None, end_of_turn_states=v)),
    ("match", "cow", _lc_case(lambda lc, row, rec, v: lc.match([1, 2], cow=v))),
    ("insert", "duplicates", lambda v: _insert(v)),
    ("admit", "headroom", _lc_case(lambda lc, row, rec, v: lc.admit([-1], [_C.ReqState()], headroom=v))),
    ("decode_finish", "finished", _lc_case(lambda lc, row, rec, v: lc.decode_finish(row, rec, 4, v))),
    ("cache_finished", "is_insert",
     _lc_case(lambda lc, row, rec, v: lc.cache_finished(row, rec, [1, 2, 3, 4], 4, is_insert=v))),
    ("finish_batch", "is_insert", lambda v: _finish_batch(v)),
    ("cache_unfinished", "prefix",
     _foreign(lambda lc, rec, v: lc.cache_unfinished(rec, [1, 2], [7, 8], 2, prefix=v))),
    ("cache_finished", "is_insert",
     _foreign(lambda lc, rec, v: lc.cache_finished(rec, [1, 2], [7, 8], is_insert=v))),
    ("decode_finish", "finished", _foreign(lambda lc, rec, v: lc.decode_finish(rec, 2, v))),
    ("match_key_limit", "match_cap", lambda v: _C.match_key_limit(5, v)),
    ("state_headroom", "lazy", lambda v: _C.state_headroom(1, 2, v)),
    ("slots_per_req", "lazy", lambda v: _C.slots_per_req(v)),
    ("keep_index", "lazy", lambda v: _C.keep_index(0, 2, v)),
    ("end_of_turn", "enabled", lambda v: _C.end_of_turn(v, True, 4, 1, 10, False)),
    ("end_of_turn", "extra_buffer", lambda v: _C.end_of_turn(True, v, 4, 1, 10, False)),
    ("end_of_turn", "lazy", lambda v: _C.end_of_turn(True, True, 4, 1, 10, v)),
    ("finish_cache_len", "extra_buffer", lambda v: _C.finish_cache_len(v, 0, 4, False, 1)),
    ("finish_cache_len", "end_of_turn", lambda v: _C.finish_cache_len(True, 0, 4, v, 1)),
    ("from_dlpack", "writable", lambda v: _C.Tensor.from_dlpack(np.zeros(3, np.float32), writable=v)),
    ("_testing_make_capsule", "versioned", lambda v: _C._testing_make_capsule((2,), versioned=v)),
    ("_testing_make_capsule", "readonly", lambda v: _C._testing_make_capsule((2,), readonly=v)),
    ("_testing_make_capsule", "null_data", lambda v: _C._testing_make_capsule((0,), null_data=v)),
]


def _insert(v):
    sa, ka, rp, lc = _pools()
    kv, slot = ka.alloc(2), lc.alloc_state()
    before = (lc.sizes(), sa.counts(), ka.counts())
    try:
        lc.insert([1, 2], kv, slot, duplicates=v)
    finally:
        if not isinstance(v, (bool, np.bool_)):
            assert (lc.sizes(), sa.counts(), ka.counts()) == before


def _finish_batch(v):
    sa, ka, rp, lc = _pools()
    out = lc.prefill_batch([[1, 2, 3]])
    before = (lc.sizes(), sa.counts(), ka.counts(), rp.available_size())
    try:
        lc.finish_batch(out["rows"], [[1, 2, 3]], is_insert=v)
    finally:
        if not isinstance(v, (bool, np.bool_)):
            assert (lc.sizes(), sa.counts(), ka.counts(), rp.available_size()) == before


def _type_name(v) -> str:
    """The type's name as CPython's tp_name gives it (numpy's scalars:
    "numpy.int64")."""
    return f"numpy.{type(v).__name__}" if isinstance(v, np.generic) else type(v).__name__


@pytest.mark.parametrize("fname,arg,call", CASES, ids=[f"{f}-{a}" for f, a, _ in CASES])
def test_flags_take_bools_and_refuse_the_rest(fname, arg, call) -> None:
    for v in GOOD:
        call(v)
    for v in BAD:
        with pytest.raises(TypeError) as e:
            call(v)
        assert str(e.value) == f"{fname}() argument '{arg}' must be bool, not {_type_name(v)}"


def test_dlpack_copy_takes_none_or_a_bool() -> None:
    """The DLPack protocol's copy is None or a bool: False and None export
    the view, True is refused as unsupported (BufferError), anything else is
    TypeError."""
    t = _C.Tensor.zeros((2,), "float32")
    for v in (None, False, np.False_):
        t.__dlpack__(copy=v)
    for v in (True, np.True_):
        with pytest.raises(BufferError, match="copy=True is not supported"):
            t.__dlpack__(copy=v)
    for v in ("no", 0, 1.0):
        with pytest.raises(TypeError, match=rf"^__dlpack__\(\) argument 'copy' must be bool, not {type(v).__name__}$"):
            t.__dlpack__(copy=v)


def test_unified_core_flags() -> None:
    """UnifiedCore(has_mamba=, events=) are read after the classes and
    templates and before the tree: a bad flag is named there."""
    for arg in ("has_mamba", "events"):
        for v in BAD:
            kw = {"has_mamba": True, "events": False, arg: v}
            with pytest.raises(TypeError, match=rf"^UnifiedCore\(\) argument '{arg}' must be bool, not "):
                _C.UnifiedCore(None, None, (), ({}, {}, {}), None, None, kw["has_mamba"], kw["events"], 1, 1, 0)


def test_check_ownership_follows_the_flag() -> None:
    """The flag's value, not its truth, decides: numpy's False leaves the
    checks off (an index the tree holds may be inserted again, SGLang's
    behaviour); True turns them on; the string "false" is refused."""
    for flag, checks in ((np.False_, False), (False, False), (True, True), (np.True_, True)):
        t = _C.RadixTree(check_ownership=flag)
        t.insert([1, 2], [5, 6], 1)
        if checks:
            with pytest.raises(ValueError):
                t.insert([3, 4], [5, 7], 2)
        else:
            t.insert([3, 4], [5, 7], 2)
    with pytest.raises(TypeError, match=r"^RadixTree\(\) argument 'check_ownership' must be bool, not str$"):
        _C.RadixTree(check_ownership="false")


def test_a_refused_flag_takes_no_slot() -> None:
    """match(cow=...) with a bad flag: refused before the copy-on-write slot
    is taken; with True it is."""
    sa, ka, rp, lc = _pools()
    lc.insert([1, 2, 3], ka.alloc(3), lc.alloc_state())
    free = sa.available_size()
    with pytest.raises(TypeError):
        lc.match(array("q", [1, 2, 3, 4]), cow="yes")
    assert sa.available_size() == free
    *_, running = lc.match(array("q", [1, 2, 3, 4]), cow=np.True_)
    assert running >= 1 and sa.available_size() == free - 1
