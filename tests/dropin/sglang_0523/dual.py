"""Two UnifiedRadixCaches, one over SGLang's Python TreeCore and one over
mambaradix, driven through the same seeded operations; every observable is
compared after every step, the KV indices and state slots each step frees
among them (in the order they reach the allocators)."""

from __future__ import annotations

import functools
import random
from array import array
from dataclasses import replace
from unittest import mock

import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import UnifiedTreeCoreInterface
from sglang.test.kits.unified_radix_cache import fixtures
from sglang.test.kits.unified_radix_cache.config import CacheConfig
from sglang.test.mem_cache_utils import finish_req

import mambaradix.sglang.unified as mr_unified

FULL, MAMBA = ComponentType.FULL, ComponentType.MAMBA


def build(cfg: CacheConfig, backend: str, events: bool = True, path_cap: int = -1, policy_config=None):
    """build_fixture's pools and cache; the kit's inspector check is bypassed
    for the mambaradix core (it is a production core, not an inspector).
    path_cap >= 0 sets --mamba-max-states-per-path; policy_config is
    --radix-eviction-policy-config (cfg.eviction_policy's keyword arguments)."""
    mr_unified.register()
    args = functools.partial(fixtures.ServerArgs, mamba_max_states_per_path=path_cap)
    init = functools.partial(fixtures.CacheInitParams, eviction_policy_config=policy_config)
    with mock.patch.object(fixtures, "UnifiedTreeCoreInspectionInterface", UnifiedTreeCoreInterface), mock.patch.object(
        fixtures, "ServerArgs", args
    ), mock.patch.object(fixtures, "CacheInitParams", init):
        return fixtures.build_fixture(cfg, tree_core_backend=backend, enable_kv_cache_events=events)


def configs(page_sizes=(1, 4, 16, 64, 128)):
    """[FULL] and [FULL, MAMBA] across page sizes and Mamba strategies."""
    out = []
    for ps in page_sizes:
        kv = max(512, 16 * ps)
        out.append(CacheConfig(page_size=ps, components=(FULL,), kv_size=kv, max_context_len=kv))
        strategies = ["extra_buffer", "extra_buffer_lazy"] if ps > 1 else ["no_buffer", "extra_buffer"]
        for st in strategies:
            out.append(
                (
                    CacheConfig(
                        page_size=ps,
                        components=(FULL, MAMBA),
                        enable_mamba_extra_buffer=st != "no_buffer",
                        mamba_cache_size=40,
                        kv_size=kv,
                        max_context_len=kv,
                    ),
                    st,
                )
            )
    return [c if isinstance(c, tuple) else (c, "none") for c in out]


class Side:
    def __init__(self, cfg, backend, strategy, path_cap=-1, policy_config=None):
        if strategy == "extra_buffer_lazy":
            # The lazy ping-pong buffer is a pool option build_fixture does not expose.
            pool_cls = functools.partial(fixtures.HybridReqToTokenPool, enable_mamba_extra_buffer_lazy=True)
            with mock.patch.object(fixtures, "HybridReqToTokenPool", pool_cls):
                self.cache, self.alloc, self.pool = build(cfg, backend, path_cap=path_cap, policy_config=policy_config)
            assert self.pool.enable_mamba_extra_buffer_lazy
        else:
            self.cache, self.alloc, self.pool = build(cfg, backend, path_cap=path_cap, policy_config=policy_config)
        self.core = self.cache.tree_core
        self.locks = []  # (node_id, receipt)
        self.freed = {"kv": [], "mamba": []}  # what each allocator got back since the last check, in order
        _record_frees(self.alloc, self.freed["kv"])
        if cfg.has_mamba:
            _record_frees(self.pool.mamba_allocator, self.freed["mamba"])

    def take_freed(self):
        out = {k: list(v) for k, v in self.freed.items()}
        for v in self.freed.values():
            v.clear()
        return out


def _record_frees(alloc, log):
    """Wraps alloc.free (every free path of the fixture's allocators ends
    there) to log the indices it returns to the pool, in order; a free inside
    a free group is logged when the group's end returns it.  The allocators
    are FIFO (need_sort=False): the order of the frees decides which indices
    later allocations get, so it is compared with the indices; how they are
    split into calls is not (SGLang's insert frees its duplicates one call a
    node it walks, ours one slice)."""
    real = alloc.free

    def free(index):
        if getattr(alloc, "free_group", None) is None and index.numel():
            log.extend(index.reshape(-1).tolist())
        return real(index)

    alloc.free = free


def _key(tokens, extra=None, salt=None, limit=None):
    return RadixKey(array("q", tokens), extra_key=extra, cache_salt=salt, limit=limit)


class Differ:
    def __init__(self, cfg: CacheConfig, strategy: str, seed: int, path_cap: int = -1, policy_config=None,
                 python_path: bool = False, partial_unlocks: bool = False):
        self.cfg = cfg
        self.partial_unlocks = partial_unlocks   # some unlocks release the MAMBA component first
        self.rng = random.Random(seed)
        self.a = Side(cfg, "python", strategy, path_cap, policy_config)
        self.b = Side(cfg, "mambaradix", strategy, path_cap, policy_config)
        if python_path:
            # Unbind the C calls (_C.UnifiedCore): the adapter's Python path serves them.
            for name in mr_unified.C_BOUND:
                delattr(self.b.core, name)
            assert type(self.b.core).match_prefix is type(self.b.core)._match_prefix_py
        assert type(self.b.core).__name__ == "MambaradixTreeCore", type(self.b.core)
        self.has_mamba = cfg.has_mamba
        self.ps = cfg.page_size
        self.log = []
        self.requests = True
        self.requests_done = 0
        self.resets = 0
        self.check("init")

    # -- observables ----------------------------------------------------------

    def _path(self, side, node_id):
        core = side.core
        if core.is_root(node_id):
            return []
        root = core.root_node_handle()
        return core.collect_full_device_indices(node_id, root).tolist()

    def snapshot(self, side):
        c = side.core
        return {
            "sizes": (
                c.full_evictable_size(),
                c.full_protected_size(),
                c.mamba_evictable_size(),
                c.mamba_protected_size(),
                c.evictable_size(),
                c.protected_size(),
                c.total_size(),
                c.component_evictable_size(FULL),
                c.component_evictable_size(MAMBA),
            ),
            "kv_free": side.alloc.available_size(),
            "freed": side.take_freed(),
            "mamba_free": side.pool.mamba_allocator.available_size() if self.has_mamba else 0,
            "events": [repr(e) for e in c.take_events()],
            "values": (sorted(c.all_values_flatten().tolist()), sorted(c.all_mamba_values_flatten().tolist())),
            "canary": [
                sorted(zip(*(t.tolist() for t in (w.slot_indices, w.positions, w.prev_slot_indices))))
                for w in (c.walk_for_kv_canary(uo, False) for uo in (False, True))
            ],
        }

    def check(self, what, ra=None, rb=None):
        self.log.append(what)
        if ra != rb:
            raise AssertionError(f"step {len(self.log)} {what}: python={ra!r} mambaradix={rb!r}")
        sa, sb = self.snapshot(self.a), self.snapshot(self.b)
        for k in sa:
            if sa[k] != sb[k]:
                note = ""
                if k == "freed" and all(sorted(sa[k][p]) == sorted(sb[k][p]) for p in sa[k]):
                    note = " (the same indices, in another order)"
                raise AssertionError(f"step {len(self.log)} {what}: {k}{note}: python={sa[k]!r} mambaradix={sb[k]!r}")
        self.a.cache.sanity_check()
        self.b.cache.sanity_check()

    # -- operations -----------------------------------------------------------

    def _tokens(self):
        rng = self.rng
        pages = rng.randint(1, 6)
        base = rng.choice([[], [1] * self.ps, [1] * self.ps + [2] * self.ps, [3] * (2 * self.ps)])
        toks = list(base)
        for _ in range(pages):
            toks += [rng.randint(1, 4)] * rng.choice([1, self.ps])
        if rng.random() < 0.3:
            toks += [rng.randint(1, 4)] * rng.randint(1, max(1, self.ps))  # ragged tail
        return toks

    def _ns(self):
        r = self.rng.random()
        if r < 0.8:
            return None, None
        if r < 0.9:
            return "lora-a", None
        return None, "salt-1"

    def op_insert(self):
        toks = self._tokens()
        extra, salt = self._ns()
        # The insert's priority (the priority policy's key; every core keeps it).
        priority = self.rng.choice([0, 0, 1, 2, 5])
        out = []
        for side in (self.a, self.b):
            n = len(toks)
            v = side.alloc.alloc(n) if n else torch.empty(0, dtype=torch.int64)
            if v is None:
                out.append(None)
                continue
            params = InsertParams(key=_key(toks, extra, salt), value=v, priority=priority)
            ms = None
            if self.has_mamba:
                ms = side.pool.mamba_allocator.alloc(1)
                if ms is None:
                    side.alloc.free(v)
                    out.append(None)
                    continue
                params.mamba_value = ms
            r = side.cache.insert(params)
            aligned = n // self.ps * self.ps
            # The caller frees what the tree did not take: the ragged tail, and
            # its state slot when the node already had one.
            if aligned < n:
                side.alloc.free(v[aligned:])
            if ms is not None and (r.mamba_exist or aligned == 0):
                side.pool.mamba_allocator.free(ms)
            out.append((r.prefix_len, r.mamba_exist if self.has_mamba else None, self._path(side, r.last_device_node), v.tolist()))
        self.check(f"insert {toks} ns={extra, salt} priority={priority}", out[0], out[1])

    def op_match(self):
        toks = self._tokens()
        extra, salt = self._ns()
        limit = self.rng.randint(0, len(toks)) if self.rng.random() < 0.3 else None
        out = []
        for side in (self.a, self.b):
            m = side.cache.match_prefix(MatchPrefixParams(key=_key(toks, extra, salt, limit)))
            out.append(
                (
                    m.device_prefix_len,
                    m.full_kv_hit_length,
                    m.mamba_branching_seqlen,
                    self._path(side, m.best_match_node),
                    self._path(side, m.last_device_node),
                    None if m.last_visited_node_id is None else len(self._path(side, m.last_visited_node_id)),
                )
            )
            fm = side.core.match_full_device_prefix(_key(toks, extra, salt, limit))
            out[-1] += (fm[0], fm[2], self._path(side, fm[1]))
            if self.rng.random() < 0.0:
                pass
            side._last_match = m
        self.check(f"match {toks} limit={limit} ns={extra, salt}", out[0], out[1])
        if self.rng.random() < 0.4:
            # Some locks skip the Mamba component, as SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK's decode lock does.
            skip = (MAMBA,) if self.has_mamba and self.rng.random() < 0.3 else ()
            for side in (self.a, self.b):
                node = side._last_match.last_device_node
                side.locks.append((node, side.cache.inc_lock_ref(node, skip_lock_components=skip)))
            self.check(f"lock skip={skip}")

    def op_unlock(self):
        if not self.a.locks:
            self.check("unlock (none held)")
            return
        i = self.rng.randrange(len(self.a.locks))
        if (self.partial_unlocks and self.has_mamba and not self.a.locks[i][1].skipped_lock_components
                and self.rng.random() < 0.3):
            # The MAMBA part alone, the rest later: what extra_buffer_lazy's slot allocation does when
            # the state pool is empty (MambaComponent._alloc_mamba_slot).
            for side in (self.a, self.b):
                node, receipt = side.locks[i]
                side.cache.dec_lock_ref(node, replace(receipt.to_dec_params(), skipped_lock_components=(FULL,)))
                receipt.skipped_lock_components += (MAMBA,)
            self.check("unlock MAMBA only")
            return
        for side in (self.a, self.b):
            node, receipt = side.locks.pop(i)
            side.cache.dec_lock_ref(node, receipt.to_dec_params())
        self.check("unlock")

    def op_evict(self):
        n = self.rng.choice([0, 1, self.ps, 3 * self.ps, 100])
        m = self.rng.choice([0, 0, 1, 2]) if self.has_mamba else 0
        out = []
        for side in (self.a, self.b):
            r = side.cache.evict(EvictParams(num_tokens=n, mamba_num=m))
            out.append((r.num_tokens_evicted, r.mamba_num_evicted))
        self.check(f"evict {n} {m}", out[0], out[1])

    def op_request(self):
        """A request through the controller's own paths: match its prompt,
        lock the prefix, compute the rest (fresh KV), cache it unfinished once
        or more (chunked prefill), then finished; the request row is freed."""
        toks = self._tokens() + self._tokens()
        extra, salt = self._ns()
        chunks = sorted({self.rng.randint(1, len(toks)) for _ in range(self.rng.randint(0, 2))} | {len(toks)})
        out = []
        for side in (self.a, self.b):
            out.append(self._run_request(side, toks, extra, salt, chunks))
        self.check(f"request {toks} chunks={chunks} ns={extra, salt}", out[0], out[1])
        if isinstance(out[0], list):
            self.requests_done += 1

    def _run_request(self, side, toks, extra, salt, chunks):
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        cache, pool, alloc = side.cache, side.pool, side.alloc
        req = Req(
            rid=f"r{len(self.log)}",
            origin_input_text="",
            origin_input_ids=array("q", toks),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=1),
        )
        req.extra_key = extra
        req.cache_salt = salt
        if not pool.free_slots:
            return "no row"
        # A scheduler admits a request only with state slots for it (running
        # slot, ping-pong pair, a fork on checkpoint): evict first, as it does.
        if self.has_mamba and pool.mamba_allocator.available_size() < 8:
            cache.evict(EvictParams(mamba_num=8))
            if pool.mamba_allocator.available_size() < 8:
                return "no state slots"
        pool.alloc([req])
        req.output_ids = array("q")
        req.full_untruncated_fill_ids = array("q", toks)
        m = cache.match_prefix(MatchPrefixParams(key=_key(toks, extra, salt)))
        pre = m.device_prefix_len
        req.last_node = m.last_device_node
        req.lock = cache.lock(m.last_device_node)
        prefix = cache.tree_core.collect_full_device_indices(m.last_device_node, cache.tree_core.root_node_handle())
        n = len(toks)
        short = (n - pre) - alloc.available_size()
        if short > 0:  # the scheduler evicts before it allocates (the prefix is locked)
            cache.evict(EvictParams(num_tokens=short))
        fresh = alloc.alloc(n - pre) if n > pre else torch.empty(0, dtype=torch.int64)
        if fresh is None:
            cache.unlock(req.lock)
            pool.free(req)
            return "no kv"
        pool.write((req.kv.req_pool_idx, slice(0, n)), torch.cat([prefix, fresh]))
        req.kv.cache_protected_len = pre
        req.kv.kv_allocated_len = n
        trace = [pre]
        chunks = [c for c in chunks if c > pre] or [n]
        for i, upto in enumerate(chunks):
            last = i == len(chunks) - 1
            req.kv.kv_committed_len = upto
            if self.has_mamba:
                req.kv.mamba_last_track_seqlen = upto
                if pool.enable_mamba_extra_buffer:
                    req.kv.mamba_last_track_idx = 0
            if last:
                req.finished_reason = FINISH_LENGTH(length=0)
                finish_req(cache, req, upto)
            else:
                cache.checkpoint(req, up_to=upto)
            trace.append((req.kv.cache_protected_len, None if req.lock is None else 1))
        if req.kv.holds_kv:
            pool.free(req)
        return trace

    def op_reset(self):
        """Release every lock, then (usually) flush the cache as the scheduler's
        flush_cache does: the tree (AllBlocksCleared when events are on), then
        the KV allocator and the request / state pools (no request is running
        between operations)."""
        for side in (self.a, self.b):
            for node, receipt in side.locks:
                side.cache.dec_lock_ref(node, receipt.to_dec_params())
            side.locks.clear()
        self.check("unlock all")
        if self.rng.random() < 0.25:
            return
        for side in (self.a, self.b):
            side.cache.reset()
            side.alloc.clear()
            side.pool.clear()
        self.check("reset")
        self.resets += 1

    def step(self):
        r = self.rng.random()
        if r < 0.3:
            self.op_insert()
        elif r < 0.4 and self.requests:
            self.op_request()
        elif r < 0.65:
            self.op_match()
        elif r < 0.8:
            self.op_unlock()
        elif r < 0.98:
            self.op_evict()
        else:
            self.op_reset()

    def run(self, n):
        for _ in range(n):
            self.step()
        return len(self.log)
