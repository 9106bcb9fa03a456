"""The bindings' argument parser (csrc/py/py_args.c) against CPython's own
argument binding: for the same signature, a call binds the same values or
raises the same exception with the same message as a Python function would.

The reference is CPython itself: each signature is compiled into a `def f`
that returns its parameters, and both sides get the same calls."""

import random

import numpy as np
import pytest

from mambaradix import _C

ABSENT = Ellipsis
SEED = 20251201


def reference(posonly, maxpos, required, names):
    """A Python function with the signature the descriptor describes."""
    params = []
    for i, name in enumerate(names):
        if i == posonly and posonly > 0:
            params.append("/")
        if i == maxpos:
            params.append("*")
        params.append(name if i < required else f"{name}=ABSENT")
    if posonly == len(names) and posonly > 0:
        params.append("/")
    src = "def f(%s):\n    return (%s)\n" % (", ".join(params), "".join(n + ", " for n in names))
    env = {"ABSENT": ABSENT}
    exec(src, env)
    return env["f"]


def outcome(fn, *args, **kwargs):
    try:
        return ("ok", fn(*args, **kwargs))
    except TypeError as e:
        return ("TypeError", str(e))


def parser(sig):
    return lambda *a, **k: _C._testing_parse(sig, *a, **k)


def random_signature(rng):
    n = rng.randint(0, 5)
    names = tuple("p%d" % i for i in range(n))
    maxpos = rng.randint(0, n)
    posonly = rng.randint(0, maxpos)
    # required positionals come first (Python's rule); keyword-only ones may
    # be required whatever precedes them
    nreq_pos = rng.randint(0, maxpos)
    required = nreq_pos if nreq_pos < maxpos else rng.randint(maxpos, n)
    return posonly, maxpos, required, names


def random_call(rng, names):
    nargs = rng.randint(0, len(names) + 2)
    args = tuple(100 + i for i in range(nargs))
    pool = list(names) + ["zz", "p9"]
    kwargs = {k: 200 + i for i, k in enumerate(rng.sample(pool, rng.randint(0, len(pool))))}
    return args, kwargs


def test_random_signatures_bind_and_fail_as_cpython():
    rng = random.Random(SEED)
    seen = set()
    for _ in range(3000):
        sig = random_signature(rng)
        ref = reference(*sig)
        ours = parser(sig)
        args, kwargs = random_call(rng, sig[3])
        want = outcome(ref, *args, **kwargs)
        got = outcome(ours, *args, **kwargs)
        assert got == want, (sig, args, kwargs)
        seen.add(want[1].split(":")[0] if want[0] != "ok" else "ok")
    # every kind of error came up
    text = " | ".join(seen)
    for kind in ("ok", "missing", "unexpected keyword", "multiple values", "positional argument",
                 "positional-only arguments passed as keyword", "keyword-only argument"):
        assert kind in text, (kind, text)


@pytest.mark.parametrize("sig, args, kwargs", [
    ((0, 2, 2, ("a", "b")), (), {}),                       # 2 missing: 'a' and 'b'
    ((0, 3, 3, ("a", "b", "c")), (), {}),                  # 'a', 'b', and 'c'
    ((0, 1, 3, ("a", "b", "c")), (1,), {}),                # keyword-only missing
    ((0, 1, 1, ("a",)), (1, 2), {}),                       # 1 positional but 2 were given
    ((0, 0, 0, ()), (1,), {}),                             # 0 positional but 1 was given
    ((0, 2, 1, ("a", "b", "c")), (1, 2, 3), {"c": 4}),     # ... (and 1 keyword-only argument)
    ((0, 2, 1, ("a", "b")), (1, 2, 3), {}),                # from 1 to 2
    ((2, 2, 2, ("a", "b")), (), {"a": 1, "b": 2}),         # positional-only as keywords: 'a, b'
    ((1, 2, 2, ("a", "b")), (1,), {"a": 1}),               # 'a' positional-only, b missing
    ((0, 2, 2, ("a", "b")), (1, 2), {"a": 3}),             # multiple values (before too-many)
    ((0, 1, 1, ("a",)), (1, 2), {"a": 3}),
    ((0, 2, 0, ("a", "b")), (), {"b": 1, "q": 2}),         # unexpected keyword
])
def test_messages_match_cpython(sig, args, kwargs):
    assert outcome(parser(sig), *args, **kwargs) == outcome(reference(*sig), *args, **kwargs)


def test_keyword_names_match_by_value_when_not_interned():
    # Keyword names built at run time are not interned: the pointer check
    # misses and the string compare must find them.
    sig = (0, 1, 1, ("alpha", "beta"))
    name = "".join(["be", "ta"])
    assert _C._testing_parse(sig, 1, **{name: 2}) == (1, 2)

    class Key(str):
        pass

    assert _C._testing_parse(sig, **{Key("alpha"): 3}) == (3, ABSENT)
    # and the same spec keeps working once interned
    assert _C._testing_parse(sig, 5, beta=6) == (5, 6)


# The bound methods: each declares a signature; CPython's binding of the
# same signature is the reference for the calls' errors.
def _ref(src):
    env = {}
    exec(src, env)
    return env["f"]


METHODS = [
    # (callable factory, Python signature as declared, bad calls)
    (lambda: _C.RadixTree().insert, "def f(key, value, state, /, *, extra_key=None, prev_prefix_len=None): pass",
     [((1, 2), {}), ((1, 2, 3, 4), {}), (([1], [1], 1), {"extra": 1}), ((), {"key": [1]}),
      (([1], [1], 1), {"extra_key": None, "prev": 0})]),
    (lambda: _C.RadixTree().match_prefix, "def f(key, /, extra_key=None): pass",
     [((), {}), (([1], None, 3), {}), (([1], None), {"extra_key": None}), (([1],), {"x": 1})]),
    (lambda: _C.SlotAllocator(8).alloc, "def f(n, /, owner=None): pass",
     [((), {}), ((1, 2, 3), {}), ((1,), {"who": 1}), ((1, 2), {"owner": 3})]),
    (lambda: _C.RadixTree, "def f(page_size=None, chunk_size=None, lru_policy=None, *, check_ownership=None, "
     "policy_options=None, max_states_per_path=None, semantics=None, kv_only=None): pass",
     [((1, 2, "sglang", 4), {}), ((1,), {"page_size": 1}), ((), {"pagesize": 1})]),
    (lambda: _C.SlotAllocator, "def f(size, page_size=None): pass",
     [((), {}), ((1, 2, 3), {}), ((1,), {"size": 2}), ((), {"page_size": 2})]),
    (lambda: _C.Tensor.zeros, "def f(shape, dtype, device=None): pass",
     [((), {}), (((1,),), {}), (((1,), "int64", "cpu", 1), {}), (((1,),), {"dtype": "int64", "dev": 1})]),
    (lambda: _C.write_req_to_token,
     "def f(table, rows, starts, values, *, ends=None, stream=None): pass",
     [((), {}), ((1, 2, 3), {}), ((1, 2, 3, 4, 5), {}), ((1, 2, 3, 4), {"end": 1})]),
]


@pytest.mark.parametrize("make, src, calls", METHODS)
def test_methods_raise_as_their_python_signature(make, src, calls):
    ref = _ref(src)
    for args, kwargs in calls:
        fn = make()
        name = getattr(fn, "__name__", None) or fn.__name__
        got = outcome(fn, *args, **kwargs)
        want = outcome(ref, *args, **kwargs)
        assert want[0] == "TypeError", (args, kwargs)
        assert got == (want[0], want[1].replace("f()", name + "()", 1)), (src, args, kwargs)


def test_positional_only_methods_refuse_extra_positionals_as_cpython():
    lc = _C.Lifecycle()
    ref = _ref("def f(node_id, node_gen, /): pass")
    for args in [(), (1,), (1, 2, 3)]:
        got = outcome(lc.lock, *args)
        want = outcome(ref, *args)
        assert got == (want[0], want[1].replace("f()", "lock()", 1))


def test_converted_arguments_still_name_the_argument():
    # values reach the converters after parsing: their errors name the argument
    with pytest.raises(TypeError, match="RadixTree\\(\\) argument 'lru_policy' must be str"):
        _C.RadixTree(lru_policy=3)
    with pytest.raises(TypeError, match="alloc\\(\\): n must be an int"):
        _C.SlotAllocator(8).alloc("3")
    # one int-array reader: its errors name the argument and the element
    # (an int64 array key is read in place by match, where such a token
    # matches nothing: test_match_int64_keys.py; an int32 key is converted)
    with pytest.raises(ValueError, match=r"insert\(\): key\[1\] = 1099511627776 is out of range"):
        _C.Lifecycle().insert(np.array([1, 2**40], dtype=np.int64), [1, 2], 1)
    with pytest.raises(ValueError, match=r"match\(\): key\[1\] = 1099511627776 is out of range"):
        _C.Lifecycle().match([1, 2**40])
    with pytest.raises(TypeError, match=r"free\(\): indices\[1\] must be an int, not float"):
        _C.SlotAllocator(8).free([1, 1.5])
    with pytest.raises(ValueError, match=r"key must be 1-dimensional"):
        _C.RadixTree().match_prefix(np.zeros((2, 2), dtype=np.int32))
    # flags are bools (one reader, mr_arg_bool; every flag: test_bool_flags.py)
    with pytest.raises(TypeError, match=r"^RadixTree\(\) argument 'check_ownership' must be bool, not str$"):
        _C.RadixTree(check_ownership="false")
    with pytest.raises(TypeError, match=r"^Lifecycle\(\) argument 'extra_buffer' must be bool, not int$"):
        _C.Lifecycle(extra_buffer=1)


def test_index_arguments_accept_a_lone_int_of_any_width():
    # the pools' index arguments take a lone int (Python or numpy scalar,
    # any integer width) as one index, as they did through numpy before
    alloc = _C.SlotAllocator(8)
    got = alloc.alloc(3)
    alloc.free(np.int32(got[0]))
    alloc.free(int(got[1]))
    alloc.free(np.array(got[2], dtype=np.int16))
    assert [alloc.owner(int(i)) for i in got] == ["free"] * 3
    assert alloc.available_size() == 8


def test_status_overrides_name_the_call_and_leave_the_pools_alone():
    # each call maps the core's "bad argument" status to its own message
    # (py_status.h override tables); a refused call changes nothing
    sa, kv, rp = _C.SlotAllocator(16), _C.SlotAllocator(64), _C.ReqPool(4, 32, 2)
    lc = _C.Lifecycle(sa, kv, rp)
    rs = _C.ReqState()
    before = (sa.available_size(), kv.available_size(), rp.available_size())
    cases = [
        (lambda: lc.cache_finished(3, rs, [1, 2, 3], 3),
         r"^cache_finished\(\): row 3 is not a request row in use \(the ReqPool has rows 1\.\.4\)$"),
        (lambda: lc.cache_unfinished(2, rs, [1, 2, 3], 3), r"^cache_unfinished\(\): row 2 is not a request row in use"),
        (lambda: lc.admit([3], [rs]), r"^admit\(\): rows\[0\] = 3 is not a request row in use \(-1 takes a new row\)$"),
        (lambda: lc.prefill_batch([[1], list(range(40))]),
         r"^prefill_batch\(\): keys\[1\] has 40 tokens, more than max_context_len = 32$"),
        (lambda: lc.decode_batch([3]), r"^decode_batch\(\): rows\[0\] = 3 is not a request row in use"),
    ]
    for call, msg in cases:
        with pytest.raises(ValueError, match=msg):
            call()
        assert (sa.available_size(), kv.available_size(), rp.available_size()) == before
        lc.check()
    # a code without an override of its own falls through to the file's and
    # then to the default table: an exhausted state pool
    small = _C.Lifecycle(_C.SlotAllocator(1), _C.SlotAllocator(64), _C.ReqPool(4, 32, 2))
    with pytest.raises(RuntimeError, match="state pool is exhausted"):
        for _ in range(4):
            small.alloc_state()


def test_a_lifecycle_refuses_a_kv_pool_whose_indices_outgrow_the_table() -> None:
    """The req-to-token table holds int32 KV indices, and the lifecycle
    writes the indices it holds into rows without checking each: a KV pool
    whose largest token index, (pages + 1) * page_size - 1, passes int32 is
    refused when the Lifecycle is made, naming the count; one whose largest
    index is exactly int32's largest is accepted (pages of 2**22 tokens keep
    the pools small)."""
    page = 2**22
    st, rp = _C.SlotAllocator(8), _C.ReqPool(2, 8, 2)
    big = _C.SlotAllocator(2**31, page)   # 512 pages, 513 * 2**22 tokens with the reserved page 0
    with pytest.raises(ValueError, match=r"^Lifecycle\(\): kv_allocator's 2151677952 tokens exceed the "
                                         r"req-to-token table's int32 indices$"):
        _C.Lifecycle(st, big, rp, page_size=page, chunk_size=page, extra_buffer=True)
    fits = _C.SlotAllocator(2**31 - page, page)   # largest index 2**31 - 1
    lc = _C.Lifecycle(st, fits, rp, page_size=page, chunk_size=page, extra_buffer=True)
    lc.check()


def test_a_slot_allocator_larger_than_int32_indices_is_refused_up_front() -> None:
    """Unit ids, state slots and KV indices are int32 where SGLang's tables
    keep them, so an allocator of more than 2**31 - 2 units is refused with
    a ValueError before anything is allocated (it used to ask for tens of
    GB, which the OS answered by killing the process); the limit counts
    pages, not tokens."""
    for size, page in ((2**31 + 5, 1), (2**40, 2**8)):
        with pytest.raises(ValueError, match=r"^SlotAllocator\(\): \d+ units \(size / page_size\) exceed "
                                             r"2147483646: slot and KV indices are int32$"):
            _C.SlotAllocator(size, page)
    assert _C.SlotAllocator(2**40, 2**20).available_size() == 2**40   # 2**20 pages of 2**20 tokens
