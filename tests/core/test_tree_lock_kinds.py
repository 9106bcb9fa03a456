"""inc_lock_ref and inc_kv_lock are two kinds of lock, each undone only by
its own call (dec_lock_ref / dec_kv_lock), under both semantics.

SGLang 0.5.23's Mamba component keeps them apart: a lock that skips the
Mamba component (our inc_kv_lock) is not released by the one that does not.
v0.5.15's MambaRadixCache has only inc_lock_ref; a KV-only lock there came
to count as a lock "taken on a tombstone", which dec_lock_ref released, so
`inc_kv_lock(n); dec_lock_ref(n)` went through and the matching
dec_kv_lock(n) then raised.  Expected values are written by hand: the wrong
unlock raises ValueError naming the other call and changes nothing; the
right one then releases the lock."""

import pytest

from tree_helpers import HAVE_C, sizes, tree_snapshot

pytestmark = pytest.mark.skipif(not HAVE_C, reason="mambaradix._C.RadixTree is not built")

from mambaradix import _C  # noqa: E402

SEMANTICS = ["v0.5.15", "v0.5.23"]


def _tree(semantics: str):
    t = _C.RadixTree(semantics=semantics)
    t.insert([1, 2, 3, 4], [11, 12, 13, 14], 5)
    leaf = t.insert([1, 2, 3, 4, 5, 6], [11, 12, 13, 14, 15, 16], 6).node
    t.insert([1, 2, 7], [11, 12, 17], 7)   # [1 2] becomes a tombstone above [3 4] and [7]
    return t, leaf


def _state(t):
    return sizes(t), tree_snapshot(t)


# (lock, its undo, the other undo, the locks it takes (full, state), the other undo's refusal)
ORDERS = [
    ("inc_kv_lock", "dec_kv_lock", "dec_lock_ref", (1, 0),
     r"^dec_lock_ref\(\): node holds no lock of inc_lock_ref, only 1 of inc_kv_lock \(undo those with "
     r"dec_kv_lock\)$"),
    ("inc_lock_ref", "dec_lock_ref", "dec_kv_lock", (1, 1),
     r"^dec_kv_lock\(\): node holds no lock of inc_kv_lock \(a lock of inc_lock_ref is undone by "
     r"dec_lock_ref\)$"),
]


@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize("lock,undo,wrong,refs,refused", ORDERS, ids=[o[0] for o in ORDERS])
def test_the_other_kinds_unlock_is_refused(semantics, lock, undo, wrong, refs, refused) -> None:
    t, n = _tree(semantics)
    unlocked = _state(t)
    getattr(t, lock)(n)
    locked = _state(t)
    assert (n.full_lock_ref, n.state_lock_ref) == refs
    assert t.full_protected_size() == 6 and t.mamba_protected_size() == refs[1]
    with pytest.raises(ValueError, match=refused):
        getattr(t, wrong)(n)
    assert _state(t) == locked
    t.sanity_check()
    getattr(t, undo)(n)
    assert _state(t) == unlocked
    with pytest.raises(ValueError, match=rf"^{undo}\(\): node is not locked$"):
        getattr(t, undo)(n)
    t.sanity_check()


@pytest.mark.parametrize("semantics", SEMANTICS)
def test_both_kinds_on_one_node_are_undone_one_each(semantics: str) -> None:
    """One lock of each kind: dec_lock_ref releases its own (and the state
    with it), a second dec_lock_ref is refused while the KV-only lock still
    protects the path, dec_kv_lock releases that one."""
    t, n = _tree(semantics)
    unlocked = _state(t)
    t.inc_lock_ref(n)
    t.inc_kv_lock(n)
    assert (n.full_lock_ref, n.state_lock_ref) == (2, 1)
    t.dec_lock_ref(n)
    assert (n.full_lock_ref, n.state_lock_ref) == (1, 0)
    after_one = _state(t)
    with pytest.raises(ValueError, match="only 1 of inc_kv_lock"):
        t.dec_lock_ref(n)
    assert _state(t) == after_one
    t.dec_kv_lock(n)
    assert _state(t) == unlocked
    t.sanity_check()


def test_v0515_tombstone_lock_and_kv_only_lock_stay_apart() -> None:
    """v0.5.15: inc_lock_ref on a tombstone takes no state reference; with a
    KV-only lock on it too, dec_lock_ref releases the tombstone's lock once
    and refuses the second call; dec_kv_lock releases the other."""
    t, _ = _tree("v0.5.15")
    up = t.match_prefix([1, 2, 9]).node   # no state on [1 2]: the match stops at the root
    assert up.is_root
    (mid,) = [c for c in t.root.children]
    assert mid.state is None and list(mid.key) == [1, 2]
    unlocked = _state(t)
    t.inc_lock_ref(mid)
    t.inc_kv_lock(mid)
    assert (mid.full_lock_ref, mid.state_lock_ref) == (2, 0)
    t.dec_lock_ref(mid)
    with pytest.raises(ValueError, match="only 1 of inc_kv_lock"):
        t.dec_lock_ref(mid)
    t.dec_kv_lock(mid)
    assert _state(t) == unlocked
    t.sanity_check()
