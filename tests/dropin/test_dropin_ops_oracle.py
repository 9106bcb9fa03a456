"""The drop-in's match_prefix and insert over SGLang v0.5.15's own pools,
call for call against SGLang's own MambaRadixCache (both from the wheel's
files, as test_sglang_pools_oracle.py loads them).

A seeded run of direct inserts and plain matches (no copy-on-write), with
evictions between them (so node ids are reused), over keys that share
prefixes, with namespaces (one never inserted), key limits on matches and
inserts, empty keys (no tokens; one token as bigrams), protected lengths,
and every kind of value tensor an insert may get: a view into the
allocator's free list, a view into a larger row, a strided view, int32,
and none (the tokens).  Keys are SGLang's RadixKey or ours.  After every
call: the same result (indices, their device and shape, the branching
length, the node's own key, the root itself on a miss), the same KV
indices handed to the allocator's free (in order, with the value's dtype;
an eviction's state slots too), the same evictable sizes.  Each match
result is then overwritten, so one that shared memory with another result
or with the tree would show in a later comparison.
"""

from __future__ import annotations

import random
import types
from array import array

import pytest

torch = pytest.importorskip("torch")

from test_sglang_oracle import SG, SKIP_REASON  # noqa: E402

pytestmark = pytest.mark.skipif(SG is None, reason="SGLang oracle unavailable: %s" % SKIP_REASON)

from mambaradix import sglang as mrs  # noqa: E402
from seeds import seeds  # noqa: E402
from sglang_wheel import recording_frees, wheel  # noqa: E402,F401  (wheel: a fixture)
from test_sglang_pools_oracle import CTX, _dropin_cache, _sglang_cache  # noqa: E402

VALUE_KINDS = ("alloc", "row", "strided", "int32", "none")


def _value(kind, indices, tokens):
    """The value tensor of an insert: `indices` as the given kind of tensor."""
    if kind == "none":
        return None
    if kind == "int32":
        return torch.tensor(indices, dtype=torch.int32)
    if kind == "row":       # a view into a longer row, as req_to_token's
        row = torch.tensor([0] + indices + [0, 0], dtype=torch.int64)
        return row[1 : 1 + len(indices)]
    if kind == "strided":
        buf = torch.zeros(2 * len(indices), dtype=torch.int64)
        buf[::2] = torch.tensor(indices, dtype=torch.int64)
        return buf[::2]
    return torch.tensor([-1] + indices, dtype=torch.int64)[1:]   # "alloc": a view at an offset


class _Side:
    def __init__(self, name, cache, pool, alloc, api):
        self.name, self.cache, self.api = name, cache, api
        self.frees = recording_frees(alloc)
        self.state_frees = recording_frees(pool.mamba_allocator)

    def key(self, tokens, extra, limit, bigram=False):
        if not isinstance(tokens, torch.Tensor):
            tokens = array("q", tokens)
        return self.api.RadixKey(tokens, extra, is_bigram=bigram, limit=limit)

    def insert(self, tokens, extra, limit, kind, indices, slot, prev):
        value = _value(kind, indices, tokens)
        del self.frees[:]
        r = self.cache.insert(self.api.InsertParams(key=self.key(tokens, extra, limit), value=value,
                                                    mamba_value=torch.tensor([slot]), prev_prefix_len=prev))
        freed = [i for _, idx in self.frees for i in idx]
        dtypes = sorted({str(d) for d, _ in self.frees})
        return (r.prefix_len, r.mamba_exist, freed, dtypes, self.sizes())

    def match(self, tokens, extra, limit, bigram=False):
        m = self.cache.match_prefix(self.api.MatchPrefixParams(key=self.key(tokens, extra, limit, bigram)))
        node = m.last_device_node
        t = m.device_indices
        out = (t.tolist(), t.device.type, tuple(t.shape), m.mamba_branching_seqlen,
               node is self.cache.root_node, None if node is self.cache.root_node else list(node.key),
               m.last_host_node is node, m.best_match_node is node, self.sizes())
        t.fill_(-7)   # the caller's to overwrite
        return out, t.dtype

    def evict(self, num_tokens, num_states):
        del self.frees[:], self.state_frees[:]
        r = self.cache.evict(self.api.EvictParams(num_tokens=num_tokens, mamba_num=num_states))
        return (r.num_tokens_evicted, r.mamba_num_evicted, [i for _, idx in self.frees for i in idx],
                [i for _, idx in self.state_frees for i in idx], self.sizes())

    def sizes(self):
        c = self.cache
        return (c.full_evictable_size(), c.full_protected_size(), c.mamba_evictable_size())


def _sides(w, sg, our_keys):
    cfg = types.SimpleNamespace(extra_buffer=True, lazy=False, track_interval=64)
    sides = []
    for name in ("sglang", "dropin"):
        pool, alloc = w.make_pools(sg, size=4, mamba_size=16, max_context_len=CTX, kv_size=1024, extra_buffer=True)
        if name == "sglang":
            sides.append(_Side(name, _sglang_cache(sg, pool, alloc, cfg), pool, alloc, sg))
        else:
            api = types.SimpleNamespace(RadixKey=mrs.RadixKey if our_keys else sg.RadixKey, EvictParams=mrs.EvictParams,
                                        InsertParams=mrs.InsertParams, MatchPrefixParams=mrs.MatchPrefixParams)
            sides.append(_Side(name, _dropin_cache(pool, alloc, cfg), pool, alloc, api))
    return sides


@pytest.mark.parametrize("our_keys", [False, True], ids=["sglang-keys", "our-keys"])
@pytest.mark.parametrize("seed", seeds(2))
def test_match_and_insert_follow_sglang(wheel, seed, our_keys):
    w, sg = wheel
    theirs, ours = _sides(w, sg, our_keys)
    rng = random.Random(seed)
    stems = [[rng.randrange(1, 3000) for _ in range(rng.randrange(100, 260))] for _ in range(3)]
    # each stem's first token alone, with a state: a one-token bigram key (no
    # bigram at all) must not match it
    for i, s in enumerate(stems):
        assert theirs.insert([s[0]], None, None, "alloc", [4000 + i], 200 + i, 0) == \
            ours.insert([s[0]], None, None, "alloc", [4000 + i], 200 + i, 0)
    cached = []
    int32_inserted = False
    next_kv, next_slot = 5000, 1
    seen = dict(evicted=0, hits=0, misses=0, branching=0, frees=0, kinds=set(), limits=0, ns_hits=0)

    def reached():
        """The run reached what it is meant to compare (it goes on until it has)."""
        counts = [v for k, v in seen.items() if k != "kinds"]
        return min(counts) > 3 and seen["kinds"] == set(VALUE_KINDS)

    step = 0
    while step < 400 or not reached():
        assert step < 5000, seen
        step += 1
        extra = rng.choice([None, None, "a", "b"])
        if cached and rng.random() < 0.7:
            base = rng.choice(cached)
            tokens = base[: rng.randrange(1, len(base) + 1)]
        else:
            s = rng.choice(stems)
            tokens = s[: rng.randrange(1, len(s) + 1)]
        tokens = tokens + [rng.randrange(1, 3000) for _ in range(rng.choice([0, 0, 1, 5, 70]))]
        limit = rng.randrange(0, len(tokens) + 3) if rng.random() < 0.25 else None
        n = len(tokens) if limit is None else min(limit, len(tokens))
        if rng.random() < 0.08:
            args = rng.choice([(rng.randrange(1, 300), 0), (0, rng.randrange(1, 4)), (rng.randrange(1, 50), 1)])
            want, got = theirs.evict(*args), ours.evict(*args)
            assert got == want, (step, "evict", args)
            seen["evicted"] += want[0] + want[1]
        elif rng.random() < 0.45:
            kind = rng.choice(VALUE_KINDS)
            indices = list(tokens[:n]) if kind == "none" else list(range(next_kv, next_kv + n))
            next_kv += n
            prev = rng.choice([0, 0, rng.randrange(0, n + 1)])
            args = (tokens, extra, limit, kind, indices, next_slot, prev)
            next_slot += 1
            want, got = theirs.insert(*args), ours.insert(*args)
            assert got == want, (step, "insert", kind, limit, prev)
            if n:
                cached.append(tokens[:n])
            seen["frees"] += bool(want[2])
            seen["kinds"].add(kind)
            int32_inserted = int32_inserted or kind == "int32"
        else:
            extra = rng.choice([None, None, "a", "b", "never"])
            bigram = False
            r = rng.random()
            if r < 0.05:        # an empty key (every other one an empty tensor)
                tokens, limit = ([] if step % 2 else torch.tensor([], dtype=torch.int64)), None
            elif r < 0.1:       # one token as bigrams: an empty key too
                tokens, limit, bigram = [rng.choice(stems)[0]], None, True
            args = (tokens, extra, limit, bigram)
            (want, want_dtype), (got, dtype) = theirs.match(*args), ours.match(*args)
            assert got == want, (step, "match", args)
            # SGLang's indices have the dtype of the values inserted (torch.cat
            # of node clones); the drop-in's are int64, as int64 values give
            assert dtype == torch.int64 and (int32_inserted or want_dtype == torch.int64), step
            seen["hits" if want[0] else "misses"] += 1
            seen["branching"] += want[3] is not None
            seen["ns_hits"] += bool(want[0]) and extra is not None
            seen["limits"] += bool(want[0]) and limit is not None
    ours.cache.sanity_check()


def test_match_results_are_fresh_tensors(wheel):
    """Two matches of one cached key, a miss after a miss: each result is its
    own tensor (a caller may overwrite one; SGLang's results are fresh)."""
    w, sg = wheel
    _, ours = _sides(w, sg, True)
    tokens = list(range(1, 40))
    ours.insert(tokens, None, None, "alloc", list(range(100, 139)), 1, 0)
    mp = mrs.MatchPrefixParams(key=mrs.RadixKey(array("q", tokens)))
    a, b = ours.cache.match_prefix(mp).device_indices, ours.cache.match_prefix(mp).device_indices
    assert a.tolist() == b.tolist() == list(range(100, 139)) and a.data_ptr() != b.data_ptr()
    miss = mrs.MatchPrefixParams(key=mrs.RadixKey(array("q", [999, 998])))
    e1, e2 = ours.cache.match_prefix(miss).device_indices, ours.cache.match_prefix(miss).device_indices
    assert e1 is not e2 and e1.untyped_storage()._cdata != e2.untyped_storage()._cdata
    assert e1.dtype == e2.dtype == torch.int64 and e1.shape == e2.shape == (0,)


@pytest.mark.parametrize("our_keys", [False, True], ids=["sglang-keys", "our-keys"])
def test_a_negative_key_limit_is_refused_as_sglang_refuses_it(wheel, our_keys):
    """A key whose limit is negative: SGLang's class raises on insert and
    on match (the key's length is negative) and changes nothing; so must the
    drop-in (its insert used to store the tokens up to the limit from the
    end)."""
    w, sg = wheel
    theirs, ours = _sides(w, sg, our_keys)
    tokens = list(range(1, 20))
    for op in ("insert", "match"):
        outcomes = []
        for side in (theirs, ours):
            try:
                if op == "insert":
                    side.insert(tokens, None, -3, "alloc", list(range(100, 119)), 1, 0)
                else:
                    side.match(tokens, None, -3)
                outcomes.append(None)
            except (ValueError, TypeError) as e:
                outcomes.append(type(e))
            outcomes.append(side.sizes())
        assert outcomes[0] is not None and outcomes == [outcomes[0], theirs.sizes(), outcomes[0], ours.sizes()]
    assert theirs.sizes() == ours.sizes() == (0, 0, 0)
