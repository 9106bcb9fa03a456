"""Slot allocators, the request pool and their ownership accounting.

Every randomized test drives the C objects and a small Python model of the
same rules side by side and compares them after every operation; the C
accounting check runs after every operation too.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Optional

import numpy as np
import pytest

from mambaradix import _C


# ---------------------------------------------------------------------------
# Reference model of one allocator (pages of page_size tokens)


class ModelAllocator:
    """FIFO free list of pages 1..n; owner per page (None = free)."""

    def __init__(self, size: int, page_size: int = 1) -> None:
        self.ps = page_size
        self.n = size // page_size
        self.free = deque(range(1, self.n + 1))
        self.owner: dict[int, object] = {}
        self.group: Optional[list[int]] = None   # pages freed in the open free group

    def group_begin(self) -> None:
        if self.group is None:
            self.group = []

    def group_end(self) -> None:
        """As one free of every page the group freed, at its end."""
        pages, self.group = self.group or [], None
        for p in pages:
            del self.owner[p]
        if self.ps == 1:
            self.free.extend(pages)
        else:
            self.free.extendleft(reversed(sorted(pages)))

    def alloc(self, ntok: int, owner: object = "held") -> Optional[list[int]]:
        np_ = ntok // self.ps
        if np_ > len(self.free):
            return None
        pages = [self.free.popleft() for _ in range(np_)]
        for p in pages:
            self.owner[p] = owner
        return [p * self.ps + j for p in pages for j in range(self.ps)]

    def free_tokens(self, toks: list[int], tree: bool = False) -> str:
        """Returns "" on success or the failure kind; changes nothing on failure."""
        if self.ps == 1:
            pages = list(toks)
            if len(set(pages)) != len(pages):
                return "dup"
        else:
            pages = sorted(set(t // self.ps for t in toks))
        defer = self.group is not None and not tree
        if defer and self.ps > 1:   # a page the group freed already may be listed again
            pages = [p for p in pages if self.owner.get(p) != "pending"]
        for p in pages:
            if p < 1 or p > self.n:
                return "range"
            if p not in self.owner or self.owner[p] == "pending":
                return "double"
            if (self.owner[p] == "tree") != tree:
                return "owner"
        if defer:
            for p in pages:
                self.owner[p] = "pending"
            self.group.extend(pages)
            return ""
        for p in pages:
            del self.owner[p]
        if self.ps == 1:
            self.free.extend(pages)
        else:
            self.free.extendleft(reversed(pages))
        return ""

    def counts(self) -> dict[str, int]:
        held = sum(1 for o in self.owner.values() if o == "held")
        tree = sum(1 for o in self.owner.values() if o == "tree")
        pending = sum(1 for o in self.owner.values() if o == "pending")
        req = len(self.owner) - held - tree - pending
        return {"free": len(self.free), "held": held, "req": req, "tree": tree, "pending": pending,
                "total": self.n}


def _same(a: "_C.SlotAllocator", m: ModelAllocator) -> None:
    a.check()
    assert a.counts() == m.counts()
    assert a.available_size() == len(m.free) * m.ps


@pytest.mark.parametrize("page_size", [1, 4])
def test_allocator_matches_model(page_size: int) -> None:
    rng = random.Random(1000 + page_size)
    size = 64 * page_size
    a = _C.SlotAllocator(size, page_size)
    m = ModelAllocator(size, page_size)
    held: list[int] = []   # tokens currently held by the caller
    tree: list[int] = []   # tokens handed to the tree
    for step in range(3000):
        op = rng.random()
        if op < 0.35:
            k = rng.randint(0, 10) * page_size
            got = a.alloc(k)
            want = m.alloc(k)
            if want is None:
                assert got is None
            else:
                assert got is not None and got.dtype == np.int64
                assert got.tolist() == want
                held.extend(want)
        elif op < 0.6 and held:
            # free a random page-aligned run of held tokens
            rng.shuffle(held)
            k = rng.randint(1, min(8, len(held)))
            toks = held[:k]
            if page_size > 1:
                pages = set(t // page_size for t in toks)
                toks = [t for t in held if t // page_size in pages]
            assert m.free_tokens(toks) == ""
            a.free(np.array(toks, dtype=np.int64))
            held = [t for t in held if t not in set(toks)]
        elif op < 0.75 and held:
            k = rng.randint(1, len(held))
            pages = set(t // page_size for t in held[:k])
            toks = [t for t in held if t // page_size in pages]
            a.transfer(toks, "tree")
            for t in toks:
                m.owner[t // page_size] = "tree"
            held = [t for t in held if t // page_size not in pages]
            tree.extend(toks)
        elif op < 0.85 and tree:
            rng.shuffle(tree)
            pages = set(t // page_size for t in tree[: rng.randint(1, len(tree))])
            toks = [t for t in tree if t // page_size in pages]
            assert m.free_tokens(toks, tree=True) == ""
            a.release_tree(toks)
            tree = [t for t in tree if t // page_size not in pages]
        elif op < 0.93:
            # a bad free: double free (of a free unit, or of one the open
            # free group freed), tree-owned, or out of range
            choice = rng.random()
            if choice < 0.2 and m.group and page_size == 1:
                bad = [rng.choice(m.group)]
                kind = "double"
            elif choice < 0.4 and len(m.free) > 0:
                bad = [m.free[rng.randrange(len(m.free))] * page_size]
                kind = "double"
            elif choice < 0.7 and tree:
                bad = [rng.choice(tree)]
                kind = "owner"
            else:
                bad = [rng.choice([-1, 0, size + page_size, 10**9])]
                kind = "range"
            if held and rng.random() < 0.5:
                bad = [held[0]] + bad   # a good index before the bad one
            before = a.counts()
            exc = _C.OwnershipError if kind in ("double", "owner") else ValueError
            with pytest.raises(exc):
                a.free(bad)
            assert a.counts() == before   # nothing moved
        elif op < 0.97:
            # open or close a free group (SGLang's scheduler wraps a batch's frees in one)
            if m.group is None:
                a.free_group_begin()
                m.group_begin()
            else:
                a.free_group_end()
                m.group_end()
            assert a.in_free_group == (m.group is not None)
        else:
            # the tree cannot release a caller's unit
            if held:
                with pytest.raises(_C.OwnershipError):
                    a.release_tree([held[0]])
        _same(a, m)


def test_state_slots_fifo_and_slot_zero_reserved() -> None:
    a = _C.SlotAllocator(5)
    assert a.alloc(5).tolist() == [1, 2, 3, 4, 5]
    assert a.alloc(1) is None
    assert a.owner(0) == "reserved"
    a.free([3, 1])
    assert a.alloc(2).tolist() == [3, 1]   # tail append, FIFO
    with pytest.raises(ValueError, match="out of range"):
        a.free([0])
    with pytest.raises(ValueError, match="listed twice"):
        a.free([2, 2])
    a.check()


def test_paged_alloc_returns_whole_pages_and_frees_pages() -> None:
    a = _C.SlotAllocator(16, 4)   # pages 1..4: tokens 4..19 (page 0 reserved)
    assert a.size == 16 and a.page_size == 4
    got = a.alloc(8)
    assert got.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    with pytest.raises(ValueError, match="multiple of page_size"):
        a.alloc(3)
    # freeing one token of a page frees the page (SGLang frees unique pages)
    a.free([9])
    assert a.available_size() == 12
    assert a.owner(10) == "free" and a.owner(5) == "held"
    # freed pages go to the front of the free list
    assert a.alloc(4).tolist() == [8, 9, 10, 11]
    a.check()


def test_alloc_group() -> None:
    a = _C.SlotAllocator(10)
    a.alloc_group_begin(3)
    assert a.available_size() == 7
    got = [int(a.alloc(1)[0]) for _ in range(4)]
    assert got == [1, 2, 3, 4]   # the group's three, then the free list
    a.alloc_group_begin(2)       # ends the previous group (nothing left)
    a.alloc_group_end()          # returns both unused
    assert a.available_size() == 6
    a.alloc_group_begin(100)     # more than free: nothing pre-allocated
    assert a.available_size() == 6
    a.alloc_group_end()
    a.check()
    c = a.counts()
    assert c["held"] == 4 and c["free"] == 6


def test_alloc_group_units_not_handed_out_belong_to_no_caller() -> None:
    # A unit the open group holds for its next alloc(1) is HELD but nobody has
    # it: freeing or transferring it would put it on the free list while the
    # group still hands it out, so it would be handed out twice.
    a = _C.SlotAllocator(6)
    a.alloc_group_begin(2)
    with pytest.raises(_C.OwnershipError):
        a.free([1])
    with pytest.raises(_C.OwnershipError):
        a.free([2])
    got = [int(a.alloc(1)[0]) for _ in range(2)] + [int(x) for x in a.alloc(4)]
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    a.check()
    a.free([1])                    # handed out now: the caller's to free
    a.alloc_group_end()
    a.check()


def test_owner_rows_and_transfer() -> None:
    a = _C.SlotAllocator(6)
    s = a.alloc(2, owner=3)
    assert a.owner(int(s[0])) == 3
    assert a.counts()["req"] == 2
    a.transfer(s[:1], "tree")
    assert a.owner(int(s[0])) == "tree"
    with pytest.raises(_C.OwnershipError, match="not owned by the caller"):
        a.free(s)       # s[0] belongs to the tree: nothing is freed
    assert a.counts() == {"free": 4, "held": 0, "req": 1, "tree": 1, "pending": 0, "total": 6}
    a.free(s[1:])
    a.release_tree(s[:1])
    assert a.counts()["free"] == 6
    with pytest.raises(TypeError, match="indices"):
        a.free("abc")
    with pytest.raises(ValueError, match="owner"):
        a.alloc(1, owner=0)
    a.check()


def test_allocator_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError, match="size"):
        _C.SlotAllocator(-1)
    with pytest.raises(ValueError, match="page_size"):
        _C.SlotAllocator(8, 0)


# ---------------------------------------------------------------------------
# Request pool


def test_req_pool_rows_table_and_dirty_ranges() -> None:
    rng = random.Random(7)
    p = _C.ReqPool(6, 32, 2)
    model_free = deque(range(1, 7))
    model_table = np.zeros((7, 32), dtype=np.int32)
    used: set[int] = set()
    touched: dict[int, tuple[int, int]] = {}
    for _ in range(500):
        op = rng.random()
        if op < 0.3:
            k = rng.randint(0, 3)
            got = p.alloc(k)
            if k > len(model_free):
                assert got is None
            else:
                want = [model_free.popleft() for _ in range(k)]
                assert got.tolist() == want
                used.update(want)
        elif op < 0.5 and used:
            r = rng.choice(sorted(used))
            p.free(r)
            used.discard(r)
            model_free.append(r)
            with pytest.raises(_C.OwnershipError, match="double free"):
                p.free(r)
        elif op < 0.9:
            r = rng.randint(0, 6)
            start = rng.randint(0, 31)
            n = rng.randint(0, 32 - start)
            vals = [rng.randint(0, 10**6) for _ in range(n)]
            p.write(r, start, vals)
            model_table[r, start : start + n] = vals
            if n:
                lo, hi = touched.get(r, (start, start + n))
                touched[r] = (min(lo, start), max(hi, start + n))
        else:
            rows, starts, ends = p.take_dirty()
            got = {int(r): (int(a), int(b)) for r, a, b in zip(rows, starts, ends)}
            assert got == touched
            touched = {}
        assert p.available_size() == len(model_free)
        p.check()
    np.testing.assert_array_equal(p.table, model_table)
    # the table is a zero-copy view
    t = p.table
    t[1, 0] = 12345
    assert int(p.table[1, 0]) == 12345


def test_req_pool_bad_input() -> None:
    p = _C.ReqPool(2, 4, 1)
    with pytest.raises(ValueError, match="row"):
        p.free(0)
    with pytest.raises(ValueError, match="row"):
        p.free(3)
    with pytest.raises(_C.OwnershipError):
        p.free(1)   # never allocated
    with pytest.raises(ValueError, match="do not fit"):
        p.write(1, 2, [1, 2, 3])
    with pytest.raises(ValueError, match="do not fit"):
        p.write(1, 0, [2**40])
    with pytest.raises(ValueError, match="track_buffer_size"):
        _C.ReqPool(2, 4, 3)
    assert p.track_map.shape == (3, 1)
    p.check()


def test_free_group_defers_and_catches_a_double_free_at_once() -> None:
    a = _C.SlotAllocator(8)
    got = a.alloc(6).tolist()            # [1..6]
    a.free_group_begin()
    assert a.in_free_group
    a.free([3, 1])
    assert a.owner(3) == "pending" and a.available_size() == 2   # not back yet
    assert a.counts()["pending"] == 2
    with pytest.raises(_C.OwnershipError, match=r"^free\(\): indices\[1\] = 1 is not allocated \(freed in the open "
                                                r"free group: a double free\)$"):
        a.free([2, 1])                   # 2 is fine, 1 was freed in the group: nothing moves
    assert a.owner(2) == "held" and a.counts()["pending"] == 2
    a.check()
    with pytest.raises(_C.OwnershipError):
        a.transfer([3], "tree")          # a pending unit is nobody's
    with pytest.raises(ValueError, match="listed twice"):
        a.free([4, 4])
    a.free([5])
    a.free_group_end()
    assert not a.in_free_group and a.counts()["pending"] == 0
    # the units join the free list in the order freed, behind the free ones
    assert a.alloc(5).tolist() == [7, 8, 3, 1, 5]
    a.check()
    # page_size > 1: a page the group freed may be listed again; the end
    # pushes the pages, sorted, at the front (one free of all of them)
    p = _C.SlotAllocator(16, 4)
    toks = p.alloc(12).tolist()          # pages 1, 2, 3
    p.free_group_begin()
    p.free([toks[9]])                    # page 3
    p.free([toks[10], toks[0]])          # page 3 again, page 1
    with pytest.raises(_C.OwnershipError):
        p.free([4 * 4])                  # page 4 is free: a double free all the same
    p.free_group_end()
    assert p.alloc(8).tolist() == [4, 5, 6, 7, 12, 13, 14, 15]
    p.check()
    # clear() ends the group; nothing stays pending
    a.free_group_begin()
    a.free([2])
    a.clear()
    assert not a.in_free_group and a.counts()["pending"] == 0
    a.check()



@pytest.mark.parametrize("dtype", ["i4", "i8", "u2"])
def test_free_takes_strided_index_arrays(dtype):
    """free() and transfer() read index arrays of any integer type and
    stride (SGLang slices its index tensors): exactly the listed units
    change owner, and page_size 1 frees to the tail in the order listed."""
    a = _C.SlotAllocator(12)
    got = a.alloc(12).astype(dtype)
    a.free(got[::-3])                   # units 12, 9, 6, 3
    owners = ["held"] * 12
    for u in (12, 9, 6, 3):
        owners[u - 1] = "free"
    assert [a.owner(u) for u in range(1, 13)] == owners
    with pytest.raises(_C.OwnershipError) as e:
        a.transfer(got[1::4], "tree")   # units 2, 6, 10: 6 is free
    assert str(e.value) == "transfer(): indices[1] = 6 is not allocated (already free)"
    a.transfer(got[1:9:3][::-1], "tree")   # units 8, 5, 2
    for u in (8, 5, 2):
        owners[u - 1] = "tree"
    assert [a.owner(u) for u in range(1, 13)] == owners
    assert a.alloc(4).tolist() == [12, 9, 6, 3]
    a.check()
