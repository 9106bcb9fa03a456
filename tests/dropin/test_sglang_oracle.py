"""Optional oracle: SGLang v0.5.15's own MambaRadixCache, driven through the
same random operations as the C tree and the reference model (LRU policy
"sglang"; page_size 1 with chunk 64, and page_size 4 / 8 with extra_key
namespaces, which SGLang's tree supports in its extra_buffer mode), comparing
every result, the freed KV indices and state slots, the size counters and
both LRU orders.  Locks are taken only on nodes that have a state, as
SGLang's scheduler does (a lock on a tombstone is one of the hazards
mambaradix fixes, which SGLang would assert on).

Needs torch and the `sglang==0.5.15` package.  SGLang's package imports a
large stack (transformers, triton, ...); when the cache module cannot be
imported normally, its file is loaded on its own, with small stand-ins for
the modules it imports that play no part in the tree (allocators, events,
metrics, server arguments).  RadixKey and the prefix-cache dataclasses are
SGLang's own classes, read from its files.  Without torch or the package
the tests are skipped.
"""

from __future__ import annotations

import ast
import os
import random
import sys
import types
from array import array

import pytest

from sglang_source import sglang_dir, sglang_version
from tree_helpers import HAVE_C, RadixTree, ints, node_path
from reference_tree import ReferenceTree

try:
    import torch
except Exception as e:  # noqa: BLE001  (ImportError, or a broken installation)
    pytest.skip("torch is not importable: %r" % (e,), allow_module_level=True)

SGLANG_VERSION = "0.5.15"


# --------------------------------------------------------------------------
# Loading SGLang's MambaRadixCache


class _Allocator:
    """Stands in for the token allocator / state-slot allocator: records
    every free, in order."""

    def __init__(self):
        self.device = torch.device("cpu")
        self.freed = []

    def free(self, indices):
        self.freed.extend(int(x) for x in torch.as_tensor(indices).reshape(-1).tolist())

    def available_size(self):
        return 0

    def take(self):
        out, self.freed = self.freed, []
        return out


def _stub(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__path__ = []  # a package, so that submodules can be stand-ins too
    return m


def _sglang_dir():
    d = sglang_dir()
    if d is None:
        return None
    path = os.path.join(d, "srt", "mem_cache", "mamba_radix_cache.py")
    return d if os.path.exists(path) else None


_sglang_version = sglang_version


def _exec_module(name, path, source=None):
    mod = types.ModuleType(name)
    mod.__file__ = path
    sys.modules[name] = mod
    code = compile(source if source is not None else open(path).read(), path, "exec")
    exec(code, mod.__dict__)
    return mod


def _radix_key_source(path):
    """The source of SGLang's RadixKey class alone (radix_cache.py's other
    classes need the whole package)."""
    src = open(path).read()
    tree = ast.parse(src)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "RadixKey":
            seg = ast.get_source_segment(src, node)
            head = "from __future__ import annotations\nfrom array import array\nfrom typing import *\nimport torch\n"
            return head + seg
    raise ImportError("RadixKey not found in %s" % path)


# What the stand-in get_global_server_args() returns (read by the cache's
# constructor): the chunk size of branching points.
_SERVER_ARGS = types.SimpleNamespace(mamba_cache_chunk_size=64)


def load_sglang(more=None):
    """Returns a namespace with MambaRadixCache, RadixKey, InsertParams,
    MatchPrefixParams, EvictParams and a cache factory; raises ImportError
    (with the reason) when it cannot.  With `more`, the cache module is
    always loaded on its own, and more(sglang_dir) is called once the
    stand-ins are in place, before it loads: it may load more of SGLang's
    files over them, and the dict it returns is added to the namespace."""
    try:  # a complete installation
        if more is not None:
            raise ImportError("loading SGLang's files on their own")
        from sglang.srt.mem_cache import base_prefix_cache as bpc
        from sglang.srt.mem_cache import mamba_radix_cache as mrc
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return _namespace(mrc, bpc, RadixKey, mrc.TokenToKVPoolAllocator, isolated=False)
    except Exception as e:  # noqa: BLE001
        first_error = e
    d = _sglang_dir()
    if d is None:
        raise ImportError("the sglang package is not installed (%r)" % (first_error,))
    mc = os.path.join(d, "srt", "mem_cache")
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    try:

        class TokenToKVPoolAllocator(_Allocator):
            pass

        class PagedTokenToKVPoolAllocator(_Allocator):
            pass

        class UnifiedMambaTokenToKVPoolAllocator(_Allocator):
            pass

        class KVCacheEventMixin:
            def _record_store_event(self, *a, **k):
                pass

            def _record_remove_event(self, *a, **k):
                pass

            def _record_all_cleared_event(self, *a, **k):
                pass

        stubs = {
            "sglang": _stub("sglang"),
            "sglang.srt": _stub("sglang.srt"),
            "sglang.srt.distributed": _stub("sglang.srt.distributed", get_tensor_model_parallel_rank=lambda: 0),
            "sglang.srt.mem_cache": _stub("sglang.srt.mem_cache"),
            "sglang.srt.mem_cache.allocator": _stub(
                "sglang.srt.mem_cache.allocator",
                BaseTokenToKVPoolAllocator=_Allocator,
                TokenToKVPoolAllocator=TokenToKVPoolAllocator,
                PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator,
            ),
            "sglang.srt.mem_cache.memory_pool": _stub(
                "sglang.srt.mem_cache.memory_pool", ReqToTokenPool=object, HybridReqToTokenPool=object
            ),
            "sglang.srt.observability": _stub("sglang.srt.observability"),
            "sglang.srt.observability.metrics_collector": _stub(
                "sglang.srt.observability.metrics_collector",
                STAT_LOGGER_ROLE_RADIX_CACHE="radix_cache",
                RadixCacheMetricsCollector=object,
                resolve_collector_class=lambda *a, **k: object,
            ),
            "sglang.srt.mem_cache.events": _stub("sglang.srt.mem_cache.events", KVCacheEventMixin=KVCacheEventMixin),
            "sglang.srt.mem_cache.multi_ended_allocator": _stub(
                "sglang.srt.mem_cache.multi_ended_allocator",
                UnifiedMambaTokenToKVPoolAllocator=UnifiedMambaTokenToKVPoolAllocator,
            ),
            "sglang.srt.mem_cache.utils": _stub(
                "sglang.srt.mem_cache.utils", split_node_hash_value=lambda *a, **k: (None, None)
            ),
            "sglang.srt.server_args": _stub(
                "sglang.srt.server_args",
                get_global_server_args=lambda: _SERVER_ARGS,
            ),
        }
        sys.modules.update(stubs)
        extra = more(d) if more is not None else {}
        rk = _exec_module("sglang.srt.mem_cache.radix_cache", os.path.join(mc, "radix_cache.py"),
                          _radix_key_source(os.path.join(mc, "radix_cache.py")))
        bpc = _exec_module("sglang.srt.mem_cache.base_prefix_cache", os.path.join(mc, "base_prefix_cache.py"))
        mrc = _exec_module("sglang.srt.mem_cache.mamba_radix_cache", os.path.join(mc, "mamba_radix_cache.py"))
        ns = _namespace(mrc, bpc, rk.RadixKey, TokenToKVPoolAllocator, isolated=True)
        ns.__dict__.update(extra)
        return ns
    except Exception as e:  # noqa: BLE001
        raise ImportError("cannot load SGLang's mamba_radix_cache.py: %r (normal import: %r)" % (e, first_error))
    finally:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def _namespace(mrc, bpc, RadixKey, alloc_cls, isolated):
    ns = types.SimpleNamespace()
    ns.MambaRadixCache = mrc.MambaRadixCache
    ns.RadixKey = RadixKey
    ns.InsertParams = bpc.InsertParams
    ns.MatchPrefixParams = bpc.MatchPrefixParams
    ns.EvictParams = bpc.EvictParams
    ns.isolated = isolated

    def make(page_size=1, chunk_size=64):
        if not isolated and (page_size, chunk_size) != (1, 64):
            pytest.skip("page_size / chunk_size are set through the stand-in server arguments only")
        _SERVER_ARGS.mamba_cache_chunk_size = chunk_size
        kv = alloc_cls()
        slots = _Allocator()
        pool = types.SimpleNamespace(mamba_allocator=slots)
        params = types.SimpleNamespace(
            req_to_token_pool=pool,
            token_to_kv_pool_allocator=kv,
            page_size=page_size,
            disable=False,
            enable_kv_cache_events=False,
            # page_size > 1 needs extra_buffer mode (it changes nothing in the tree)
            enable_mamba_extra_buffer=page_size > 1,
            enable_mamba_extra_buffer_lazy=False,
            enable_metrics=False,
        )
        return ns.MambaRadixCache(params), kv, slots

    ns.make = make
    return ns


try:
    if _sglang_version() != SGLANG_VERSION:
        raise ImportError("sglang %s is not installed (found %r)" % (SGLANG_VERSION, _sglang_version()))
    SG = load_sglang()
    SKIP_REASON = None
except ImportError as e:
    SG = None
    SKIP_REASON = str(e)

pytestmark = pytest.mark.skipif(SG is None, reason="SGLang oracle unavailable: %s" % SKIP_REASON)


# --------------------------------------------------------------------------
# The driver


def _sg_path(node):
    parts = []
    extra = node.key.extra_key if node.parent is not None else None
    while node.parent is not None:
        parts.append(list(node.key.token_ids))
        node = node.parent
    out = []
    for p in reversed(parts):
        out.extend(p)
    return (extra, tuple(out))


def _sg_lru(cache, mamba):
    lst = cache.mamba_lru_list if mamba else cache.full_lru_list
    out = []
    node = lst.head.mamba_next if mamba else lst.head.next
    while node is not lst.tail:
        out.append(_sg_path(node))
        node = node.mamba_next if mamba else node.next
    return out


class OracleRun:
    """SGLang's cache, the reference model and (when built) the C tree."""

    def __init__(self, seed, alphabet=3, max_len=10, page_size=1, chunk_size=64, extra_keys=(None,)):
        self.rng = random.Random(seed)
        self.sg, self.kv, self.slots = SG.make(page_size, chunk_size)
        kw = dict(page_size=page_size, chunk_size=chunk_size, lru_policy="sglang")
        self.m = ReferenceTree(**kw)
        self.c = RadixTree(**kw) if HAVE_C else None
        self.page = page_size
        self.extra_keys = list(extra_keys)
        self.extra = None
        if page_size > 1:  # whole pages from a few patterns that differ at one token
            base = [self.rng.randrange(alphabet) for _ in range(page_size)]
            self.atoms = [base]
            for _ in range(2):
                a = list(base)
                j = self.rng.randrange(page_size)
                a[j] = (a[j] + 1) % max(2, alphabet)
                self.atoms.append(a)
        self.alphabet = alphabet
        self.max_len = max_len
        self.keys = []
        self.next_kv = 1
        self.next_slot = 1
        self.locks = []  # (sglang node, model node, C node)
        self.ops = 0
        self.log = []

    def key(self, for_match=False):
        rng = self.rng
        self.extra = rng.choice(self.extra_keys)
        if self.page > 1:
            if self.keys and rng.random() < 0.6:
                base = rng.choice(self.keys)
                k = base[: rng.randrange(len(base) // self.page + 1) * self.page]
            else:
                k = []
            for _ in range(rng.randrange(0 if k else 1, 4)):
                k += rng.choice(self.atoms)
            k = k[: self.max_len * self.page]
            if for_match and rng.random() < 0.3:
                k += [rng.randrange(self.alphabet) for _ in range(rng.randrange(1, self.page))]
            return k
        if self.keys and rng.random() < 0.6:
            base = rng.choice(self.keys)
            k = base[: rng.randrange(len(base) + 1)] + [rng.randrange(self.alphabet) for _ in range(rng.randrange(0, 4))]
        else:
            k = [rng.randrange(self.alphabet) for _ in range(rng.randrange(1, self.max_len + 1))]
        k = k[: self.max_len]
        return k

    def same(self, what, sg_val, m_val, c_val=None):
        if sg_val != m_val or (self.c is not None and c_val != sg_val):
            raise AssertionError(
                "oracle divergence after %d ops at %s:\n  sglang: %r\n  model:  %r\n  C:      %r\nlast ops:\n%s"
                % (self.ops, what, sg_val, m_val, c_val, "\n".join(self.log[-20:]))
            )

    def rk(self, key):
        return SG.RadixKey(array("q", key), self.extra)

    def op_insert(self):
        key = self.key()
        if not key:
            return
        self.keys.append(key)
        self.keys = self.keys[-40:]
        value = list(range(self.next_kv, self.next_kv + len(key)))
        self.next_kv += len(key)
        slot = self.next_slot
        self.next_slot += 1
        prev = 0 if self.rng.random() < 0.7 else self.rng.randrange(len(key) + 2)
        self.log.append("insert %r prev=%d extra=%r" % (key, prev, self.extra))
        r = self.sg.insert(
            SG.InsertParams(
                key=self.rk(key),
                value=torch.tensor(value, dtype=torch.int64),
                mamba_value=torch.tensor([slot], dtype=torch.int64),
                prev_prefix_len=prev,
            )
        )
        dups = self.kv.take()
        rm = self.m.insert(key, value, slot, prev_prefix_len=prev, extra_key=self.extra)
        rc = self.c.insert(key, value, slot, prev_prefix_len=prev, extra_key=self.extra) if self.c else None
        self.same("insert prefix_len", r.prefix_len, rm.prefix_len, rc and rc.prefix_len)
        self.same("insert state_existed", bool(r.mamba_exist), rm.state_existed, rc and bool(rc.state_existed))
        self.same("insert duplicates", dups, rm.duplicates, rc is not None and ints(rc.duplicates))

    def op_match(self):
        key = self.key(for_match=True)
        self.log.append("match %r extra=%r" % (key, self.extra))
        r = self.sg.match_prefix(SG.MatchPrefixParams(key=self.rk(key)))
        rm = self.m.match_prefix(key, self.extra)
        rc = self.c.match_prefix(key, self.extra) if self.c else None
        self.same("match indices", r.device_indices.tolist(), rm.indices, rc is not None and ints(rc.indices))
        self.same("match node", _sg_path(r.last_device_node), rm.node.path, rc is not None and node_path(rc.node))
        self.same("match branching", r.mamba_branching_seqlen, rm.branching_seqlen, rc and rc.branching_seqlen)
        if rm.node.parent is not None and self.rng.random() < 0.3 and len(self.locks) < 6:
            self.log.append("lock %r" % (rm.node.path,))
            self.sg.inc_lock_ref(r.last_device_node)
            self.m.inc_lock_ref(rm.node)
            if self.c:
                self.c.inc_lock_ref(rc.node)
            self.locks.append((r.last_device_node, rm.node, rc and rc.node))

    def op_unlock(self):
        if not self.locks:
            return
        s, m, c = self.locks.pop(self.rng.randrange(len(self.locks)))
        self.log.append("unlock %r" % (m.path,))
        self.sg.dec_lock_ref(s)
        self.m.dec_lock_ref(m)
        if self.c:
            self.c.dec_lock_ref(c)

    def _evict(self, kind, n):
        self.log.append("%s %d" % (kind, n))
        got = getattr(self.sg, kind)(n)
        kv, slots = self.kv.take(), self.slots.take()
        rm = getattr(self.m, kind)(n)
        rc = getattr(self.c, kind)(n) if self.c else None
        count = rm.tokens_evicted if kind == "evict_full" else rm.states_evicted
        c_count = rc and (rc.tokens_evicted if kind == "evict_full" else rc.states_evicted)
        self.same(kind + " count", got, count, c_count)
        self.same(kind + " kv indices", kv, rm.kv_indices, rc is not None and ints(rc.kv_indices))
        self.same(kind + " state slots", slots, rm.state_slots, rc is not None and ints(rc.state_slots))

    def compare(self):
        sg = self.sg
        s = (sg.full_evictable_size(), sg.full_protected_size(), sg.mamba_evictable_size(), sg.mamba_protected_size())
        m = self.m
        self.same(
            "sizes",
            s,
            (m.full_evictable_size(), m.full_protected_size(), m.mamba_evictable_size(), m.mamba_protected_size()),
            self.c
            and (
                self.c.full_evictable_size(),
                self.c.full_protected_size(),
                self.c.mamba_evictable_size(),
                self.c.mamba_protected_size(),
            ),
        )
        self.same("full LRU", _sg_lru(sg, False), [n.path for n in m.lru_order("full")],
                  self.c and [node_path(n) for n in self.c.lru_order("full")])
        self.same("mamba LRU", _sg_lru(sg, True), [n.path for n in m.lru_order("mamba")],
                  self.c and [node_path(n) for n in self.c.lru_order("mamba")])
        if not self.locks:
            sg.sanity_check()
        m.sanity_check()
        if self.c:
            self.c.sanity_check()

    def run(self, n):
        ops = [("insert", 40), ("match", 35), ("unlock", 8), ("evict_full", 8), ("evict_mamba", 9)]
        for _ in range(n):
            op = self.rng.choices([o for o, _ in ops], [w for _, w in ops])[0]
            if op == "insert":
                self.op_insert()
            elif op == "match":
                self.op_match()
            elif op == "unlock":
                self.op_unlock()
            elif op == "evict_full":
                self._evict("evict_full", self.rng.choice([1, 2, 4, 8, 20]))
            else:
                self._evict("evict_mamba", self.rng.choice([1, 1, 2, 3]))
            self.ops += 1
            if self.m.total_size()[0] > 80 * self.page:
                self._evict("evict_full", self.m.total_size()[0] - 40 * self.page)
            self.compare()


def test_sglang_unit_flow_on_the_oracle():
    """The stand-ins work: SGLang's own test_mamba_radix_cache_1 numbers."""
    sg, kv, slots = SG.make()

    def ins(key, first_kv, slot):
        return sg.insert(
            SG.InsertParams(
                key=SG.RadixKey(array("q", key), None),
                value=torch.arange(first_kv, first_kv + len(key), dtype=torch.int64),
                mamba_value=torch.tensor([slot], dtype=torch.int64),
            )
        )

    assert ins([1, 2, 3], 1, 1).prefix_len == 0
    assert ins([1, 2, 3, 4, 5, 6, 7], 4, 2).prefix_len == 3
    assert kv.take() == [4, 5, 6]
    ins([10, 11, 12], 11, 3)
    assert ins([1, 2, 3, 4, 5, 60, 70], 14, 4).prefix_len == 5
    assert kv.take() == [14, 15, 16, 17, 18]
    assert sg.evict_full(1) == 3 and kv.take() == [11, 12, 13] and slots.take() == [3]
    assert sg.evict_mamba(1) == 1 and slots.take() == [1]
    r = sg.match_prefix(SG.MatchPrefixParams(key=SG.RadixKey(array("q", [1, 2, 3, 4, 5, 60, 70]), None)))
    assert r.device_indices.tolist() == [1, 2, 3, 7, 8, 19, 20]
    sg.sanity_check()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_ops_match_sglang(seed):
    OracleRun(seed).run(1500)


def test_random_ops_match_sglang_small_alphabet():
    OracleRun(99, alphabet=2, max_len=14).run(2000)


def test_random_ops_match_sglang_pages_and_extra_keys():
    """page_size 4 (SGLang's extra_buffer mode allows it), chunk 8, two
    extra_key namespaces besides None."""
    OracleRun(7, alphabet=2, max_len=4, page_size=4, chunk_size=8, extra_keys=(None, None, "a", "b")).run(1500)


def test_random_ops_match_sglang_chunk_smaller_than_page():
    OracleRun(8, alphabet=3, max_len=3, page_size=8, chunk_size=2).run(1000)
