"""mambaradix as a TreeCore for SGLang 0.5.23's ``UnifiedRadixCache``.

SGLang 0.5.23 runs hybrid models on ``UnifiedRadixCache``, a controller over a
pluggable *TreeCore* ("tree decides, cache executes").  This module plugs the
C tree (``mambaradix.RadixTree``, in its 0.5.23 mode: stateless inserts,
consumed-state LRU refresh) in as that TreeCore::

    import mambaradix.sglang.unified as mr_unified
    mr_unified.register()     # registers the backend name "mambaradix"
    # then SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=mambaradix, or
    # CacheInitParams(tree_core_backend="mambaradix", ...)

Served natively: components ``[FULL]`` and ``[FULL, MAMBA]``, page sizes 1 to
128, the Mamba strategies no_buffer / extra_buffer / extra_buffer_lazy (they
differ only in the controller), ``extra_key`` / ``cache_salt`` namespaces, the
eviction policies 0.5.23 offers (lru, lfu, fifo, mru, filo, priority, slru,
tlru), KV events, and mambaradix's state policies, chosen in the plugin's
settings (``mambaradix.sglang.plugin.SETTINGS``): any state policy of the C
tree's policy table (``utility``...), end-of-turn states and a per-path state
budget (the last two through ``end_of_turn_component_class()``, a MAMBA
component the plugin supplies through SGLang's
``CacheInitParams.component_registry_override``).  Everything else (HiCache
host tier, storage backends, SWA, session cache, other custom components,
other policy configurations, EAGLE bigram keys, KV sharding, LMCache) is built on
SGLang's Python TreeCore instead, with the reason logged; see
``fallback_reason``.

``supports_fast_match_prefix()`` is False, as on SGLang's own cores, so SGLang's
scheduler runs unchanged (waiting-prefix refresh through ``touch_prefix``);
``register(fast_match_prefix=True)`` makes cores built afterwards answer True
(the scheduler then matches every waiting request and skips that refresh).

The hot calls (match_prefix, begin_insert, end_insert, has_ongoing_insert,
collect_full_device_indices) are one C call each (``_C.UnifiedCore``, bound
per instance); the ``_*_py`` methods are their Python path for what the C path
hands back (token lists, tensors off the CPU, empty keys).

Importing this module imports nothing from SGLang; ``register()`` does, and
without SGLang 0.5.23 it (like ``MambaradixTreeCore``) raises an ImportError
that says so and why: sglang not installed, another release, or a module of
it missing.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import sys
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from .. import _C
from . import _check
from . import plugin as _plugin

logger = logging.getLogger(__name__)

BACKEND_NAME = "mambaradix"
SGLANG_VERSION = "0.5.23"   # the release whose TreeCore interface this module implements


def _sglang_version() -> Optional[str]:
    """The version of the sglang that is imported, else of the one installed
    (its metadata; importing it may be what failed); None when unknown."""
    v = getattr(sys.modules.get("sglang"), "__version__", None)
    if v is None:
        try:
            v = importlib.metadata.version("sglang")
        except Exception:   # no metadata (not installed, a source tree)
            v = None
    return v


@contextlib.contextmanager
def _needs_sglang(what: str = "sglang.srt.mem_cache.unified_cache") -> Iterator[None]:
    """Turns an ImportError of SGLang's modules into one that says this module
    needs SGLang 0.5.23 (what: the part of SGLang it imports) and why the
    import failed: sglang is not installed, another release is, or a module
    (of SGLang, or one it imports) is missing."""
    if "sglang" not in sys.modules:
        # A failed `import sglang` (mambaradix.sglang tries one for SGLang's base
        # class) keeps the subpackages it had imported, without their parent:
        # an import through them raises KeyError('sglang') instead of the error.
        for name in [m for m in sys.modules if m.startswith("sglang.")]:
            del sys.modules[name]
    try:
        yield
    except ImportError as e:
        why = str(e)
        if e.name != "sglang":
            v = _sglang_version()
            if v is not None and v != SGLANG_VERSION:
                why = f"sglang {v} is installed ({e})"
        raise ImportError(f"mambaradix.sglang.unified needs SGLang {SGLANG_VERSION} ({what}): {why}",
                          name=e.name) from e

# What the native core serves; everything else falls back to SGLang's Python core.
# SGLang 0.5.23's --radix-eviction-policy names (sglang/srt/mem_cache/utils.py), each a row
# of the C tree's policy table; the keyword arguments each accepts in eviction_policy_config.
_SERVED_POLICIES = {
    "lru": (), "lfu": (), "fifo": (), "mru": (), "filo": (), "priority": (),
    "slru": ("protected_threshold",), "tlru": ("threshold", "next_prompt_estimate"),
    "adaptive": (),
}
_ORDER_DEFAULTS = {"protected_threshold": 2, "threshold": 0, "next_prompt_estimate": 0}


def _leaf_order(policy, config):
    """The C tree's (slru_protected_threshold, tlru_threshold, tlru_next_prompt_estimate)."""
    c = dict(_ORDER_DEFAULTS, **(config or {}))
    return (int(c["protected_threshold"]), int(c["threshold"]), int(c["next_prompt_estimate"]))


def fallback_reason(params) -> Optional[str]:
    """Why ``params`` needs SGLang's Python TreeCore, or None when ours serves it."""
    with _needs_sglang():
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    comps = tuple(params.tree_components or (ComponentType.FULL,))
    if comps not in ((ComponentType.FULL,), (ComponentType.FULL, ComponentType.MAMBA)):
        names = ", ".join(c.name for c in comps)
        return f"components [{names}] are not served natively (only [FULL] and [FULL, MAMBA])"
    override = dict(params.component_registry_override or {})
    if override and override != {ComponentType.MAMBA: end_of_turn_component_class()}:
        return "custom components are not served natively"
    if getattr(params, "enable_session_radix_cache", False):
        return "session-aware caching is not served natively"
    policy = (params.eviction_policy or "lru").lower()
    if policy not in _SERVED_POLICIES:
        return f"eviction policy {policy!r} is not served natively (only {', '.join(_SERVED_POLICIES)})"
    config = getattr(params, "eviction_policy_config", None) or {}
    if not isinstance(config, dict) or any(k not in _SERVED_POLICIES[policy] for k in config):
        return f"eviction_policy_config {config!r} is not served natively for {policy!r}"
    if any(isinstance(v, bool) or not isinstance(v, int) for v in config.values()):
        return f"eviction_policy_config {config!r}: only int values are served natively"
    if getattr(params, "is_eagle", False) and ComponentType.MAMBA not in comps:
        return "EAGLE bigram keys are not served natively"
    # The host tier, storage and external linkers are switched on by server
    # arguments after the cache is built (registry.py -> init_hicache), so
    # read the settings in effect.
    try:
        from sglang.srt.runtime_context import get_disagg, get_memory

        mem, disagg = get_memory(), get_disagg()
    except Exception:  # no server arguments installed (unit use): nothing enabled
        mem = disagg = None
    if mem is not None:
        if getattr(mem, "enable_hierarchical_cache", False):
            return "the HiCache host tier is not served natively"
        if getattr(mem, "hicache_storage_backend", None):
            return "storage backends are not served natively"
        if getattr(mem, "enable_unified_cache_external_linker", False):
            return "external cache linkers are not served natively"
        if getattr(mem, "enable_lmcache", False):
            return "LMCache (--enable-lmcache) is not served natively"
    if disagg is not None and getattr(disagg, "disaggregation_decode_retraction_backup", None) == "host_pool":
        return "the decode retraction host pool is not served natively"
    ps = int(params.page_size)
    if ps < 1 or ps > 128:
        return f"page_size {ps} is outside 1..128"
    shard_size = _page_interleave_shard_size()
    if shard_size is not None and shard_size(params.token_to_kv_pool_allocator) > 1:
        return "logical-page KV sharding is not served natively"
    return None


def _page_interleave_shard_size():
    """SGLang's page_interleave_shard_size (0.5.23 keeps it in
    mem_cache.allocator.page_interleave), or None in a release without KV sharding."""
    try:
        from sglang.srt.mem_cache.allocator.page_interleave import page_interleave_shard_size
    except ImportError:
        try:
            from sglang.srt.mem_cache.page_interleave import page_interleave_shard_size
        except ImportError:
            return None
    return page_interleave_shard_size


def _policy_options(params, utility_order: str) -> dict:
    """The utility policy's options (mambaradix.RadixTree's policy_options): the simulator's defaults for
    the initial weight, the tuning window and the FLOPs (a Qwen3-Next-like model; only their ratio
    matters), the bytes of a state slot and of a token's KV from SGLang's pools where they say."""
    from ..sim.types import SimConfig

    d = SimConfig()
    state_bytes, kv_bytes = float(d.state_bytes_per_slot), float(d.kv_bytes_per_token)
    try:
        mp = params.req_to_token_pool.mamba_pool
        state_bytes = float(mp.get_kv_size_bytes()) / max(1, int(mp.size) + 1)
    except Exception:   # another pool: keep the default
        pass
    try:
        alloc = params.token_to_kv_pool_allocator
        kv = alloc.get_kvcache().get_kv_size_bytes()
        kv_bytes = float(sum(kv) if isinstance(kv, (tuple, list)) else kv) / max(1, int(alloc.size) + 1)
    except Exception:
        pass
    chunked = getattr(params, "chunked_prefill_size", None)    # None or <= 0: SGLang's chunking is off
    chunked = int(chunked) if isinstance(chunked, int) and 0 < chunked < 1 << 31 else 0
    return {"alpha": float(d.utility_alpha), "tune_window": int(d.tune_window),
            "flops_per_token": float(d.flops_per_token), "attn_flops_per_pos": float(d.attn_flops_per_pos),
            "state_bytes": state_bytes, "kv_bytes_per_token": kv_bytes, "mru": int(utility_order == "mru"),
            "chunked_prefill_size": chunked}


def _factory(params, components):
    global _SETTINGS_LOGGED
    settings = resolved_settings()
    if not _SETTINGS_LOGGED:
        _SETTINGS_LOGGED = True
        logger.info("mambaradix TreeCore settings: %s", _plugin.describe(settings))
    reason = fallback_reason(params)
    if reason is not None:
        logger.info("mambaradix TreeCore: using SGLang's Python TreeCore: %s", reason)
        from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

        return UnifiedTreeCore(params, components)
    return _core_class()(params, components)


# register()'s keywords: they take precedence over the environment (mambaradix.sglang.plugin.SETTINGS).
_OVERRIDES: dict = {}
# settings() blocks' keywords, innermost last: over register()'s while the block lasts.
_SCOPED: list = []
_SETTINGS_LOGGED = False


def resolved_settings() -> dict:
    """Each setting's value and where it came from (register() or a settings() block, its environment
    variable, or the default), as the next core built will use them."""
    merged = dict(_OVERRIDES)
    for scoped in _SCOPED:
        merged.update(scoped)
    return _plugin.resolve(merged)


def register(fast_match_prefix: Optional[bool] = None, *, state_policy: Optional[str] = None,
             utility_order: Optional[str] = None, end_of_turn_states: Optional[bool] = None,
             path_state_budget: Optional[int] = None) -> None:
    """Register the TreeCore under ``"mambaradix"`` (idempotent).  The installed
    package's SGLang plugin (``mambaradix.sglang.plugin``) calls it in every SGLang
    process; call it yourself only where plugins are not loaded.

    ``fast_match_prefix=True`` makes cores built afterwards answer True to
    ``supports_fast_match_prefix()``: SGLang's scheduler then matches every
    waiting request each round (cheap on this core) and skips its waiting-prefix
    refresh (``touch_prefix``).  The default (False, or
    ``MAMBARADIX_FAST_MATCH_PREFIX``, while the argument is None) is what SGLang's
    Python and Rust cores answer, so the scheduler behaves exactly as with them.

    The state policies (``mambaradix.sglang.plugin.SETTINGS``; None: the environment's):
    ``state_policy`` (a name of the tree's policy table, e.g. "utility"), ``utility_order``
    ("mru" or "lru"), ``end_of_turn_states`` (bool) and ``path_state_budget`` (int >= 0).
    Each is checked before anything changes (TypeError / ValueError naming it)."""
    given = {k: v for k, v in dict(fast_match_prefix=fast_match_prefix, state_policy=state_policy,
                                   utility_order=utility_order, end_of_turn_states=end_of_turn_states,
                                   path_state_budget=path_state_budget).items() if v is not None}
    checked = {k: _plugin.check(k, v) for k, v in given.items()}
    with _needs_sglang():
        from sglang.srt.mem_cache.unified_cache import tree_core_registry as reg

    _OVERRIDES.update(checked)
    if reg.get_tree_core_factory(BACKEND_NAME) is None:
        reg.register_tree_core_backend(BACKEND_NAME, _factory)
    _install_component_hook()


@contextlib.contextmanager
def settings(**overrides: Any) -> Iterator[None]:
    """register()'s keywords for the cores built inside the block (checked first).  They take precedence
    over register()'s while the block lasts and are gone after it; a register() call inside the block
    keeps its own changes."""
    checked = {k: _plugin.check(k, v) for k, v in overrides.items() if v is not None}
    _SCOPED.append(checked)
    try:
        yield
    finally:
        _SCOPED.remove(checked)


_HOOK_TARGET = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.__init__"


def _supply_components(cache, params, *args, **kwargs):
    """SGLang plugin hook (before UnifiedRadixCache.__init__): a cache built on this TreeCore with
    end-of-turn states or a per-path state budget takes mambaradix's MAMBA component through SGLang's own
    seam for custom components, CacheInitParams.component_registry_override."""
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    if (params is None or ComponentType.MAMBA not in tuple(params.tree_components or ())
            or params.component_registry_override or params.disable):
        return None
    # SGLang's choice of backend (select_tree_core_backend), which resolves only "rust" further
    name = params.tree_core_backend if params.tree_core_backend is not None else (
        envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND.get())
    if name != BACKEND_NAME:
        return None
    chosen = resolved_settings()
    if not (chosen["end_of_turn_states"][0] or chosen["path_state_budget"][0]):
        return None
    if fallback_reason(params) is not None:
        return None     # SGLang's own TreeCore serves this cache: it keeps SGLang's own component
    params.component_registry_override = {ComponentType.MAMBA: end_of_turn_component_class()}
    return None


def _install_component_hook() -> None:
    """Registers _supply_components with SGLang's plugin hooks; SGLang applies them when it loads its
    plugins (sglang.srt.plugins.load_plugins), and this applies them itself when called outside that."""
    global _HOOKED
    if _HOOKED:
        return
    from sglang.srt.plugins import hook_registry as hr

    hr.HookRegistry.register(_HOOK_TARGET, _supply_components, hr.HookType.BEFORE)
    _HOOKED = True
    loading = getattr(hr, "_current_plugin_source", None)
    if loading is None or loading.get() is None:
        hr.HookRegistry.apply_hooks()


_HOOKED = False


_EOT_COMPONENT: Any = None


def end_of_turn_component_class():
    """mambaradix's MAMBA component (built on first use; it subclasses SGLang's MambaComponent): SGLang's,
    plus end-of-turn states and the per-path state budget.  End of turn (on when the cache was built with
    it): in an extra_buffer mode, a finished request whose running slot holds the state at exactly the
    tokens it caches leaves that slot in the tree (no copy) instead of its last track snapshot, when the C
    core's end-of-turn rule (mambaradix._C.end_of_turn: a non-empty, page-aligned length, one admission's
    slots still free) allows it; its track slots are freed.  Budget: after an insert with a state, once
    the request's lock has moved onto the inserted node, the TreeCore's trim_path_states.  Otherwise
    SGLang's own behaviour."""
    global _EOT_COMPONENT
    if _EOT_COMPONENT is not None:
        return _EOT_COMPONENT
    with _needs_sglang():
        from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent
        from sglang.srt.runtime_context import get_exec

    class EndOfTurnMambaComponent(MambaComponent):
        def __init__(self, cache, params):
            super().__init__(cache, params)
            self._eot_params = None   # the InsertParams of the finished request whose running slot goes in
            self._eot = bool(resolved_settings()["end_of_turn_states"][0])

        def prepare_for_caching_req(self, req, insert_params, token_ids_len, is_finished):
            self._eot_params = None
            kv = req.kv
            if (self._eot and is_finished and self.cache.enable_mamba_extra_buffer and self.int8_ckpt_pool is None
                    and kv.mamba_pool_idx is not None and kv.mamba_pool_idx.numel() == 1
                    # the running slot holds the state after exactly the committed tokens: no step ran past
                    # them (the overlap scheduler's next step may already have fed one more)
                    and kv.kv_allocated_len == token_ids_len == kv.kv_committed_len
                    and _C.end_of_turn(True, True, int(token_ids_len), int(self.cache.page_size),
                                       int(self.cache.req_to_token_pool.mamba_allocator.available_size()),
                                       bool(get_exec().mamba.enable_mamba_extra_buffer_lazy))):
                insert_params.mamba_value = kv.mamba_pool_idx.reshape(1).clone()
                insert_params.mamba_keep_idx = None
                self._eot_params = insert_params
                return token_ids_len
            return super().prepare_for_caching_req(req, insert_params, token_ids_len, is_finished)

        def cleanup_after_caching_req(self, req, is_finished, insert_result=None, insert_params=None):
            eot = insert_params is not None and insert_params is self._eot_params
            self._eot_params = None
            if eot and insert_result is not None and not insert_result.mamba_exist:
                # The tree owns the running slot now: free the request's track slots and clear its
                # records through SGLang's own free, handing it an empty running index (freeing none).
                req.kv.mamba_pool_idx = req.kv.mamba_pool_idx.reshape(1)[:0]
                self.cache.req_to_token_pool.free_mamba_cache(req)
            else:
                super().cleanup_after_caching_req(req, is_finished, insert_result, insert_params)
            trim = getattr(self.tree_core, "trim_path_states", None)    # ours only
            if (trim is not None and insert_result is not None and insert_params is not None
                    and insert_params.mamba_value is not None):
                # the per-path budget, now that the request's lock has moved onto the inserted node
                slots = trim(insert_result.last_device_node)
                if slots.numel():
                    self._free_mamba_value(slots)

    EndOfTurnMambaComponent.__module__ = __name__
    _EOT_COMPONENT = EndOfTurnMambaComponent
    return _EOT_COMPONENT


class PageHashes:
    """The KV-event hashes of each cached page, keyed by the KV index of the
    page's first token: its chain digest (SGLang's 64-hex SHA-256 hash_value,
    kept as 32 bytes; a child's BlockStored chains from its parent's last page)
    and its namespaced int64 block hash (what BlockRemoved names).  Dense numpy
    rows indexed by KV index (41 bytes each, sized to the KV pool when it is
    known, else grown by doubling), so the cost is bounded by the pool, not a
    Python object per page; an index past
    DENSE_MAX, or a hash that is not 64 hex digits, goes to a small dict."""

    DENSE_MAX = 1 << 26

    def __init__(self, capacity: int = 0):
        capacity = min(max(int(capacity), 0), self.DENSE_MAX)
        self.digest = np.zeros((capacity, 32), dtype=np.uint8)
        self.block = np.zeros(capacity, dtype=np.int64)
        self.present = np.zeros(capacity, dtype=bool)
        self.other: dict = {}

    def _grow(self, idx):
        n = max(1024, len(self.block))
        while n <= idx:
            n *= 2
        for name in ("digest", "block", "present"):
            old = getattr(self, name)
            new = np.zeros((n,) + old.shape[1:], dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def put(self, idx: int, chain: str, block: int) -> None:
        raw = None
        if 0 <= idx < self.DENSE_MAX and isinstance(chain, str) and len(chain) == 64:
            try:
                raw = bytes.fromhex(chain)
            except ValueError:
                raw = None
            if raw is not None and raw.hex() != chain:  # keep only what round-trips exactly
                raw = None
        if raw is None:
            if 0 <= idx < len(self.present):
                self.present[idx] = False
            self.other[idx] = (chain, block)
            return
        if idx >= len(self.block):
            self._grow(idx)
        self.digest[idx] = np.frombuffer(raw, dtype=np.uint8)
        self.block[idx] = block
        self.present[idx] = True
        self.other.pop(idx, None)

    def chain(self, idx: int) -> str:
        if 0 <= idx < len(self.present) and self.present[idx]:
            return self.digest[idx].tobytes().hex()
        return self.other[idx][0]

    def pop_block(self, idx: int) -> Optional[int]:
        if 0 <= idx < len(self.present) and self.present[idx]:
            self.present[idx] = False
            return int(self.block[idx])
        h = self.other.pop(idx, None)
        return None if h is None else h[1]

    def nbytes(self) -> int:
        return self.digest.nbytes + self.block.nbytes + self.present.nbytes


def _core_class():
    """Builds the TreeCore class on first use (it subclasses SGLang's
    interface); the module's ``MambaradixTreeCore``."""
    global _CORE
    if _CORE is None:
        with _needs_sglang():
            _CORE = _build_class()
    return _CORE


_CORE: Any = None

_INT32_MAX = 2**31 - 1
_WIDE_MISS = -(2**31)   # a match's stand-in for a token outside int32 that no insert gave one
_WIDE_COLLECT_MIN = 4096   # stand-ins in the table before the first collection of unused ones

# The TreeCore methods each instance binds to its _C.UnifiedCore (the class keeps
# their Python path under the same names).
C_BOUND = ("match_prefix", "begin_insert", "end_insert", "has_ongoing_insert", "collect_full_device_indices",
           "inc_lock_ref", "dec_lock_ref")


def _build_class():  # noqa: C901 - one class, built lazily
    import torch
    from sglang.srt.disaggregation.kv_events import BlockRemoved, StorageMedium
    from sglang.srt.mem_cache.base_prefix_cache import (
        DecLockRefResult,
        IncLockRefResult,
        InsertResult,
        MatchResult,
    )
    from sglang.srt.mem_cache.events import KVCacheEventRecorder
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.cache_action import FreeDeviceKV, MambaEvictExcessPathStates
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import (
        DecSwaLockOnlyResult,
        EvictDeviceNextNodeResult,
        InsertStepResult,
        RadixCacheWalkResult,
        UnifiedTreeCoreInterface,
    )
    from sglang.srt.disaggregation.kv_events import namespaced_block_hash
    from sglang.srt.mem_cache.utils import compute_node_event_hash_values, hash_str_to_int64

    FULL = ComponentType.FULL
    MAMBA = ComponentType.MAMBA
    _COMPONENT_VALUES = frozenset(c.value for c in ComponentType)
    assert MatchResult._fields[:14] == (
        "device_prefix_len", "last_device_node", "last_host_node", "best_match_node", "host_hit_length",
        "swa_host_hit_length", "swa_branching_seqlen", "mamba_host_hit_length", "mamba_branching_seqlen",
        "cache_protected_len", "full_kv_hit_length", "cache_actions", "last_visited_node_id",
        "full_device_match_len",
    ), MatchResult._fields

    def _new_match(values):
        return tuple.__new__(MatchResult, values)

    def _unserved(name):
        def method(self, *a, **k):
            raise NotImplementedError(
                f"MambaradixTreeCore.{name}: HiCache, storage, SWA and external linkers are "
                "served by SGLang's Python TreeCore (select it, or let the mambaradix factory fall back)"
            )

        method.__name__ = name
        return method

    class _EvNode:
        """The attributes SGLang's KVCacheEventRecorder reads from a node."""

        __slots__ = ("key", "parent", "hash_value", "event_hash_value")

        def __init__(self, key, parent, hash_value=None, event_hash_value=None):
            self.key = key
            self.parent = parent
            self.hash_value = hash_value
            self.event_hash_value = event_hash_value

    class Core(UnifiedTreeCoreInterface):
        """SGLang 0.5.23 TreeCore over the C tree (see the module docstring)."""

        supports_rotation_base = False

        def __init__(self, params, components):
            self.page_size = int(params.page_size)
            self.component_types = tuple(components.keys()) if components else (FULL,)
            self.has_mamba = MAMBA in self.component_types
            self.is_eagle = False
            self.enable_hicache = False
            self.enable_storage = False
            self.enable_external_cache_linker = False
            self.write_through_threshold = 256
            self.is_write_back = False
            self.has_swa_host_pool = False
            self.is_host_memory_buffer_only = False
            alloc = params.token_to_kv_pool_allocator
            self.device = alloc.device if alloc is not None else torch.device("cpu")
            self._kv_rows = int(getattr(alloc, "size", 0) or 0) + self.page_size + 1
            self._on_cpu = torch.device(self.device).type == "cpu"
            chunk = self.page_size
            if self.has_mamba:
                comp = components[MAMBA]
                chunk = int(getattr(comp, "mamba_checkpoint_grid", None) or self.page_size)
            self._chunk = chunk
            cap = -1
            if self.has_mamba:
                from sglang.srt.runtime_context import get_exec

                cap = get_exec().mamba.mamba_max_states_per_path
            self._path_cap = int(cap) if cap is not None else -1
            self.kv_events = KVCacheEventRecorder(
                enabled=params.enable_kv_cache_events,
                page_size=self.page_size,
                dynamo_format=params.dynamo_kv_event_format,
                lora_names=params.kv_event_lora_names,
            )
            settings = resolved_settings()
            policy = (params.eviction_policy or "lru").lower()
            state_policy, source = settings["state_policy"]
            tree_policy, options = "consumed", None
            if state_policy is not None:
                if policy != "lru":
                    raise ValueError(f"{_plugin.SETTINGS['state_policy'].env if source == 'default' else source}"
                                     f"={state_policy!r}: the state policy replaces SGLang's lru; "
                                     f"--radix-eviction-policy is {policy!r}")
                tree_policy = policy = state_policy
                options = _policy_options(params, settings["utility_order"][0])
            self._state_budget = settings["path_state_budget"][0]
            self._tree = _C.RadixTree(
                page_size=self.page_size,
                chunk_size=max(chunk, self.page_size) if chunk % self.page_size == 0 or self.page_size % chunk == 0 else self.page_size,
                lru_policy=tree_policy,
                policy_options=options,
                max_states_per_path=self._state_budget or None,
                semantics="v0.5.23",
                kv_only=not self.has_mamba,
            )
            self._empty = torch.empty((0,), dtype=torch.int64, device=self.device)
            templates = (dict(InsertResult(prefix_len=0).__dict__), dict(IncLockRefResult().__dict__),
                         dict(DecLockRefResult().__dict__))
            self.eviction_policy = policy
            self._fast_match_prefix = settings["fast_match_prefix"][0]
            self._fast = _C.UnifiedCore(
                self._tree, self,
                (RadixKey, torch.Tensor, MatchResult, InsertStepResult, InsertResult, FreeDeviceKV,
                 MambaEvictExcessPathStates, torch.int64, IncLockRefResult, DecLockRefResult),
                templates, torch.from_numpy if self._on_cpu else self._tensor, self._empty,
                self.has_mamba, bool(self.kv_events.enabled), self.page_size, self._chunk, self._path_cap,
                policy, _leaf_order(policy, params.eviction_policy_config),
            )
            # One C call per hot TreeCore method (instance attributes shadow the class's).
            for name in C_BOUND:
                setattr(self, name, getattr(self._fast, name))
            self.reset()

        # ---- ids and namespaces -------------------------------------------------

        @staticmethod
        def _nid(node) -> int:
            """A node's NodeId: its generation above its C id, so that an id the
            tree reuses after an eviction never names the new node."""
            return node.gen << 32 | node.id

        def _node(self, node_id, arg="node_id"):
            """The Node handle of a NodeId (generation << 32 | C node id); KeyError / TypeError name arg."""
            try:
                return self._fast.node(node_id)
            except KeyError:
                raise KeyError(f"{arg}={node_id!r} names no live node") from None
            except TypeError:
                raise TypeError(f"{arg} must be an int NodeId, not {type(node_id).__name__}") from None

        def _tensor(self, arr):
            """A device tensor over a numpy int64 array the tree handed out (owned, no copy on CPU)."""
            t = torch.from_numpy(arr)
            return t if self._on_cpu else t.to(self.device)

        def _namespace(self, key):
            """The tree's namespace name of (key.extra_key, key.cache_salt): None when both are None, else a
            str that tells every pair apart (each part length-prefixed; None written '-'); the tree's table
            gives the name its id."""
            extra, salt = key.extra_key, key.cache_salt
            if extra is None and salt is None:
                return None
            if extra is not None and not isinstance(extra, str):
                raise TypeError(f"key.extra_key must be a str or None, not {type(extra).__name__}")
            if salt is not None and not isinstance(salt, str):
                # (str() would give 1 and "1" one namespace, where SGLang's core keys them apart)
                raise TypeError(f"key.cache_salt must be a str or None, not {type(salt).__name__}")
            return "".join("-" if v is None else f"{len(v)}:{v}" for v in (extra, salt))

        def _tokens(self, key, arg="key", grow=False):
            """The key's tokens (limit honoured) as int64: a view of SGLang's
            array('q'); an array of any integer type, a tensor or a list of
            ints converted; anything else (floats, a negative limit) refused.
            A token outside [0, INT32_MAX] (SGLang's 62-bit multimodal pad
            ids, a negative id) is replaced by its stand-in in the int32 tree
            (_wide_ids; grow: an insert gives a new token one, a match reads
            an unknown one as _WIDE_MISS, which no inserted key holds)."""
            if not isinstance(key, RadixKey):
                raise TypeError(f"{arg} must be a RadixKey, not {type(key).__name__}")
            if key.is_bigram:
                raise ValueError(f"{arg}: bigram (EAGLE) keys are served by the Python TreeCore")
            if key.limit is not None:   # a negative one: SGLang's RadixKey has a negative length
                _check.count(key.limit, f"{arg}.limit")
            toks = _check.index_array(key.raw_token_ids(), f"{arg}.token_ids", scalar=False)
            wide = (toks < 0) | (toks > _INT32_MAX)
            if wide.any():
                if grow and len(self._wide_ids) >= self._wide_collect_at:
                    self._wide_collect()   # before this key's own stand-ins exist outside the tree
                toks = toks.copy()
                toks[wide] = [self._wide_id(int(t), grow) for t in toks[wide]]
            return toks

        def _wide_id(self, token: int, grow: bool) -> int:
            """token's stand-in: -1 - its index in _wide_tokens."""
            sid = self._wide_ids.get(token)
            if sid is None:
                if not grow:
                    return _WIDE_MISS
                if self._wide_free:
                    i = self._wide_free.pop()
                    self._wide_tokens[i] = token
                elif len(self._wide_tokens) >= _INT32_MAX:
                    raise ValueError(f"key.token_ids: more than {_INT32_MAX} distinct ids outside int32 are cached")
                else:
                    i = len(self._wide_tokens)
                    self._wide_tokens.append(token)
                sid = self._wide_ids[token] = -1 - i
            return sid

        def _wide_collect(self) -> None:
            """Frees the stand-ins no key in the tree holds any more (their nodes were evicted), for reuse;
            the next collection comes when the table has doubled, so the work is amortized over the new
            ids.  Stand-ins exist outside the tree only within one call (a match or an insert)."""
            live = set(self._tree.negative_tokens().tolist())
            for token, sid in list(self._wide_ids.items()):
                if sid not in live:
                    del self._wide_ids[token]
                    self._wide_tokens[-1 - sid] = None
                    self._wide_free.append(-1 - sid)
            self._wide_collect_at = max(_WIDE_COLLECT_MIN, 2 * len(self._wide_ids))

        def _real_tokens(self, toks):
            """The tokens a node's key stands for (stand-ins back to SGLang's ids), as int64."""
            toks = np.asarray(toks, dtype=np.int64)
            wide = toks < 0
            if wide.any():
                toks = toks.copy()
                toks[wide] = [self._wide_tokens[-1 - int(t)] for t in toks[wide]]
            return toks

        # ---- tree API -----------------------------------------------------------

        def reset(self) -> None:
            if getattr(self, "_insert_state", None) is not None:
                self._insert_state = None
            self._tree.reset()
            root = self._tree.root
            self._root = root
            self._pin: dict[int, int] = {}
            # Stand-ins of the tokens outside [0, INT32_MAX] the tree holds (see _tokens).
            self._wide_ids: dict[int, int] = {}
            self._wide_tokens: list = []          # by stand-in: -1 - sid; None: free
            self._wide_free: list[int] = []        # free indices of _wide_tokens
            self._wide_collect_at = _WIDE_COLLECT_MIN
            # Rows for the KV pool's indices (allocators hand out 1..size, paged ones a page more).
            self._page_hash = PageHashes(self._kv_rows if self.kv_events.enabled else 0)
            self._insert_state = None
            self._insert_pending: list = []
            self._evict_quota: dict = {}  # component -> request_cnt of its ongoing walk
            self._empty_match = MatchResult(
                device_prefix_len=0,
                last_device_node=self._nid(root),
                last_host_node=self._nid(root),
                best_match_node=self._nid(root),
                cache_actions=[],
            )

        def node_by_id(self, node_id):
            return self._node(node_id)

        def is_write_through_compatible(self) -> bool:
            return True

        def is_backuped(self, node_id) -> bool:
            self._node(node_id)
            return False

        def is_root(self, node_id) -> bool:
            return self._node(node_id).is_root

        def root_node_handle(self, extra_key=None):
            return self._nid(self._root)

        @property
        def root_node(self):
            return self._root

        def get_last_hash_value(self, node_id):
            self._node(node_id)
            return None

        def get_prefix_hash_values(self, node_id):
            self._node(node_id)
            return []

        def get_hash_values(self, node_id):
            self._node(node_id)
            return []

        def backfill_missing_hash_values(self) -> int:
            return 0

        def dfs_weight_order(self, node_ids):
            """Request indices in depth-first order, heavier subtrees (more
            requests ending in them) first, as SGLang's scheduler orders them.
            Equal-weight siblings follow the tree's child order (namespace,
            first token), where SGLang's follow child creation order."""
            at: dict = {}
            for i, nid in enumerate(node_ids):
                at.setdefault(self._node(nid), []).append(i)
            weight = {n: len(ix) for n, ix in at.items()}
            # Only the paths to the given nodes carry weight: sum it upward.
            for n, w in list(weight.items()):
                p = n.parent
                while p is not None:
                    weight[p] = weight.get(p, 0) + w
                    p = p.parent
            order: list[int] = []
            stack = [(self._root, False)]
            while stack:
                node, visited = stack.pop()
                if visited:
                    order.extend(at.get(node, ()))
                    continue
                stack.append((node, True))
                kids = [c for c in node.children if c in weight]
                kids.sort(key=lambda c: -weight[c])
                stack.extend((c, False) for c in reversed(kids))
            return order

        def collect_path_info(self, end_node_ids):
            from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import TreePathNodeInfo

            out = []
            for nid in end_node_ids:
                node = self._node(nid)
                path = []
                while not node.is_root:
                    end = node.prefix_len
                    parent = node.parent
                    path.append(
                        TreePathNodeInfo(
                            node_id=self._nid(node),
                            parent_id=self._nid(parent),
                            path_start=end - len(node.key),
                            path_end=end,
                            full_value_len=len(node.key),
                            num_children=len(node.children),
                        )
                    )
                    node = parent
                out.append(tuple(reversed(path)))
            return tuple(out)

        # ---- locks -------------------------------------------------------------

        def _inc_lock_ref_py(self, node_id, skip_lock_components: Sequence = ()):
            node = self._node(node_id)
            skipped = tuple(skip_lock_components)
            if FULL in skipped:
                raise ValueError(
                    f"skip_lock_components={skipped!r}: only MAMBA can be skipped (FULL is always locked)"
                )
            # SGLang's core skips only the components it has (the controller's decode lock names MAMBA
            # whatever the tree's components); the receipt keeps the tuple as given.
            if MAMBA in skipped and self.has_mamba:
                self._tree.inc_kv_lock(node)  # the path's KV, not the node's state
            else:
                self._tree.inc_lock_ref(node)
            return IncLockRefResult(node_id=self._nid(node), skipped_lock_components=skipped)

        def _dec_lock_ref_py(self, node_id, params, skip_swa: bool = False):
            node = self._node(node_id)
            if params is None or params.node_id != self._nid(node):
                raise ValueError(
                    f"params: lock receipt anchored on node {getattr(params, 'node_id', None)} "
                    f"released on node {self._nid(node)}"
                )
            # Release each component the receipt does not skip, as SGLang's cores do: SGLang's lazy
            # slot allocation releases a request's MAMBA component first and the rest later.
            skipped = tuple(params.skipped_lock_components)
            if any(isinstance(ct, bool) or ct not in _COMPONENT_VALUES for ct in skipped):
                raise ValueError(f"params.skipped_lock_components={skipped!r}: not ComponentTypes")
            full, mamba = FULL not in skipped, self.has_mamba and MAMBA not in skipped
            if full and (mamba or not self.has_mamba):
                self._tree.dec_lock_ref(node)
            elif full:
                self._tree.dec_kv_lock(node)
            elif mamba:
                self._tree.dec_state_lock(node)
            return DecLockRefResult()

        def dec_swa_lock_only(self, node_id, params):
            self._node(node_id)
            return DecSwaLockOnlyResult()

        def inc_full_pin(self, node_id) -> None:
            # A pin protects the path's KV only, never the node's state.
            self._tree.inc_kv_lock(self._node(node_id))

        def dec_full_pin(self, node_id) -> None:
            self._tree.dec_kv_lock(self._node(node_id))

        # ---- match -------------------------------------------------------------

        def _aligned(self, key, grow=False):
            toks = self._tokens(key, grow=grow)
            n = len(toks) // self.page_size * self.page_size
            return toks[:n] if n != len(toks) else toks

        def _match_prefix_py(self, params):
            """match_prefix for what the C path hands back (keys over token lists)."""
            if not hasattr(params, "key"):
                raise TypeError(f"params must be a MatchPrefixParams (with a key), not {type(params).__name__}")
            key = params.key
            toks = self._aligned(key)
            if len(toks) == 0:
                return self._empty_match
            m = self._tree.match_prefix(toks, extra_key=self._namespace(key))
            kv_node = m.kv_node
            best = m.node
            if self.has_mamba:
                dev_len = len(m.indices)
                kv_len = m.kv_matched_len
                grid = self._chunk
                aligned = kv_len // grid * grid
                branching = aligned if aligned > dev_len else None
            else:
                dev_len = m.kv_matched_len
                kv_len = dev_len
                branching = None
            bid = self._nid(best)
            # Positional (MatchResult's field order): a keyword NamedTuple build costs microseconds.
            return _new_match(
                (dev_len, bid, bid, bid, 0, 0, None, 0, branching, None, kv_len, [],
                 None if kv_node.is_root else self._nid(kv_node), None)
            )

        def match_full_device_prefix(self, key):
            toks = self._aligned(key)
            node = self._root
            matched = 0
            ns = self._namespace(key)
            # Read-only: walk children without splitting.
            while matched < len(toks):
                nxt = None
                for c in node.children:
                    if c.extra_key == ns and int(c.key[0]) == int(toks[matched]):
                        ck = c.key
                        if len(ck) >= self.page_size and np.array_equal(
                            ck[: self.page_size], toks[matched : matched + self.page_size]
                        ):
                            nxt = c
                            break
                if nxt is None:
                    break
                ck = nxt.key
                n = min(len(ck), len(toks) - matched)
                eq = ck[:n] == toks[matched : matched + n]
                common = n if eq.all() else int(np.argmin(eq))
                common = common // self.page_size * self.page_size
                node = nxt
                if common < len(ck):
                    matched += common
                    return matched, self._nid(node), nxt.prefix_len
                matched += common
            return matched, self._nid(node), node.prefix_len

        @property
        def empty_match_result(self):
            return self._empty_match

        def supports_fast_match_prefix(self) -> bool:
            # False (as SGLang's own cores) unless register(fast_match_prefix=True).
            return self._fast_match_prefix

        def is_full_device_evicted(self, node_id) -> bool:
            self._node(node_id)
            return False

        def _collect_full_device_indices_py(self, from_node_id, until_node_id):
            """collect_full_device_indices below a node other than the root."""
            node = self._node(from_node_id, "from_node_id")
            until = self._node(until_node_id, "until_node_id")
            if until.is_root:
                if node.is_root:
                    return self._empty
                return self._tensor(self._tree.path_indices(node))
            chunks = []
            while node != until:
                if node.is_root:
                    raise ValueError("until_node_id is not an ancestor of from_node_id")
                chunks.append(node.value)
                node = node.parent
            if not chunks:
                return self._empty
            chunks.reverse()
            return self._tensor(np.concatenate(chunks))

        # ---- insert ------------------------------------------------------------

        def _begin_insert_py(self, params):
            """begin_insert for what the C path hands back (token lists, tensors
            off the CPU, values None, empty keys)."""
            key = params.key
            toks = self._aligned(key, grow=True)
            n = len(toks)
            value = params.value
            if value is None:
                value_np = toks.copy()
            else:
                _check.index_tensor(value, "params.value")
                if value.numel() < n:
                    raise ValueError(f"params.value has {value.numel()} indices for a key of {n} tokens")
                value_np = _check.index_array(value[:n], "params.value")
            state = None
            if self.has_mamba and n > 0:
                mv = params.mamba_value
                if mv is None:
                    raise ValueError("params.mamba_value is required with a MAMBA component")
                if isinstance(mv, torch.Tensor):
                    _check.index_tensor(mv, "params.mamba_value", ndim=None)   # its dtype before its size
                if not isinstance(mv, torch.Tensor) or mv.numel() != 1:
                    raise ValueError("params.mamba_value must be a one-element tensor (the state slot)")
                state = _check.one_index(mv, "params.mamba_value")
            if n == 0:
                return InsertStepResult(
                    actions=[], result=InsertResult(prefix_len=0, mamba_exist=True, last_device_node=self._nid(self._root))
                )
            prev = int(params.prev_prefix_len or 0)
            ns = self._namespace(key)
            prefix_len, existed, node, nd = self._fast.tree_insert(
                np.ascontiguousarray(toks, dtype=np.int64), np.ascontiguousarray(value_np, dtype=np.int64),
                state, ns, prev, int(params.inserted_len or 0), int(params.priority or 0),
            )
            actions = []
            if nd:
                # The tree's duplicates are always the caller's value[prefix_len - nd : prefix_len]:
                # hand back that slice of the caller's tensor, as SGLang's core does.
                src = value if value is not None else torch.from_numpy(value_np)
                actions.append(FreeDeviceKV([src[prefix_len - nd : prefix_len]]))
            if state is not None and not existed and self._path_cap >= 0:
                actions.append(MambaEvictExcessPathStates(self._nid(node)))
            if self.kv_events.enabled and prefix_len < n:
                self._record_store(node, key, params.session_id)
            res = InsertResult(
                prefix_len=prefix_len,
                last_device_node=self._nid(node),
                mamba_exist=bool(existed) if self.has_mamba else False,
            )
            return InsertStepResult(actions=actions, result=res)

        def resume_insert(self):
            raise RuntimeError("no insert walk is suspended")

        # The hot calls are _C.UnifiedCore's (bound per instance in __init__);
        # these class-level names are the same calls through the Python path.
        match_prefix = _match_prefix_py
        inc_lock_ref = _inc_lock_ref_py
        dec_lock_ref = _dec_lock_ref_py
        begin_insert = _begin_insert_py
        collect_full_device_indices = _collect_full_device_indices_py

        def has_ongoing_insert(self) -> bool:
            return False

        def end_insert(self):
            return []

        def evict_excess_path_states(self, tail_node_id, device_frees, host_frees, cache_actions) -> None:
            # SGLang's core looks up its Mamba component first: a tree without
            # one raises KeyError(MAMBA) whatever the tail or the cap.
            if not self.has_mamba:
                raise KeyError(MAMBA)
            node = self._node(tail_node_id, "tail_node_id")
            if self._path_cap < 0:
                return
            slots = self._tree.evict_path_states(node, self._path_cap)
            if len(slots):
                device_frees[MAMBA].append(self._tensor(slots))

        def trim_path_states(self, node_id):
            """The per-path state budget (MAMBARADIX_PATH_STATE_BUDGET; the C core's trim_path) for the
            path to node_id: the state slots it dropped (a tensor; empty without a budget).  mambaradix's
            MAMBA component calls it once a request's lock has moved to the node its insert ended at, so
            the states the new one supersedes are no longer held by that request."""
            node = self._node(node_id)
            if not self._state_budget or not self.has_mamba:
                return self._empty
            return self._tensor(self._tree.trim_path(node).state_slots)

        # ---- KV events ---------------------------------------------------------

        def _record_store(self, leaf, key, session_id):
            extra, salt = key.extra_key, key.cache_salt
            namespaced = extra is not None or salt is not None
            ps = self.page_size
            root = _EvNode(RadixKey(array_q([]), None), None, [], [])
            parent_node = leaf.parent
            if parent_node.is_root:
                parent = root
            else:
                pv = parent_node.value
                chain = self._page_hash.chain(int(pv[len(pv) - ps]))
                parent = _EvNode(
                    RadixKey(array_q(self._real_tokens(parent_node.key[-ps:])), extra, cache_salt=salt),
                    root,
                    [chain],
                    [chain] if namespaced else None,
                )
            ev = _EvNode(RadixKey(array_q(self._real_tokens(leaf.key)), extra, cache_salt=salt), parent)
            start = len(self.kv_events._queue)
            self.kv_events.record_store(ev, session_id=session_id)
            hv = ev.hash_value if not namespaced else compute_node_event_hash_values(ev, ps)
            seed = self.kv_events._namespace_seed(ev)
            vals = leaf.value
            for i, h in enumerate(hv):
                self._page_hash.put(int(vals[i * ps]), h, namespaced_block_hash(hash_str_to_int64(h), namespace_seed=seed))
            del start

        def _record_removed(self, kv: np.ndarray):
            if not self.kv_events.enabled or len(kv) == 0:
                return
            ps = self.page_size
            hashes = []
            for i in range(0, len(kv), ps):
                h = self._page_hash.pop_block(int(kv[i]))
                if h is not None:
                    hashes.append(h)
            if hashes:
                self.kv_events.enqueue(BlockRemoved(block_hashes=hashes, medium=StorageMedium.GPU))

        # ---- eviction ----------------------------------------------------------

        def _component(self, component_type, call: str, in_tree: bool = False):
            """component_type as a ComponentType (a member, or its int value,
            which SGLang's core indexes with too); TypeError for anything
            else (SGLang's core: a KeyError or a TypeError from its lookup).
            in_tree: ValueError unless the tree has the component."""
            if not isinstance(component_type, ComponentType):
                if type(component_type) is not int or component_type not in _COMPONENT_VALUES:
                    raise TypeError(f"{call}(): component_type must be a ComponentType, not {component_type!r}")
                component_type = ComponentType(component_type)
            if in_tree and component_type not in self.component_types:
                raise ValueError(f"{call}(): component_type {component_type.name} is not a component of this tree "
                                 f"({', '.join(c.name for c in self.component_types)})")
            return component_type

        # A walk's steps outside evict_device_start / _end fail as SGLang's
        # components assert they do (AssertionError naming the component).
        def evict_device_start(self, component_type, request_cnt) -> None:
            component_type = self._component(component_type, "evict_device_start", in_tree=True)
            if component_type in self._evict_quota:
                raise AssertionError(f"{component_type} device eviction already in progress")
            self._evict_quota[component_type] = _check.count(request_cnt, "request_cnt")

        def evict_device_next_node(self, component_type, tracker):
            quota = self._evict_quota.get(component_type)
            if quota is None:
                raise AssertionError(f"{component_type} device eviction not started")
            res = EvictDeviceNextNodeResult()
            if tracker.get(component_type, 0) >= quota:
                return res
            if component_type == MAMBA:
                if not self.has_mamba:
                    return res
                r = self._tree.evict_mamba(1)
            else:
                r = self._tree.evict_full(1)
            if r.tokens_evicted == 0 and r.states_evicted == 0:
                return res
            res.made_progress = True
            if len(r.kv_indices):
                self._record_removed(r.kv_indices)
                res.device_frees[FULL].append(self._tensor(r.kv_indices))
                res.tracker[FULL] += int(r.tokens_evicted)
            if len(r.state_slots):
                res.device_frees[MAMBA].append(self._tensor(r.state_slots))
                res.tracker[MAMBA] += int(r.states_evicted)
            return res

        def evict_device_end(self, component_type) -> None:
            if self._evict_quota.pop(component_type, None) is None:
                raise AssertionError(f"{component_type} device eviction not started")

        def evict_device_leaf(self, node_id, is_write_back):
            raise RuntimeError("evict_device_next_node never hands out a leaf in this TreeCore")

        def finish_mamba_state_eviction(self, node_id):
            raise RuntimeError("no Mamba backup is pending (no host tier)")

        def finish_swa_state_eviction(self, node_id):
            raise RuntimeError("no SWA component")

        # ---- sizes -------------------------------------------------------------

        def full_evictable_size(self) -> int:
            return self._tree.full_evictable_size()

        def full_protected_size(self) -> int:
            return self._tree.full_protected_size()

        def mamba_evictable_size(self) -> int:
            return self._tree.mamba_evictable_size() if self.has_mamba else 0

        def mamba_protected_size(self) -> int:
            return self._tree.mamba_protected_size() if self.has_mamba else 0

        def swa_evictable_size(self) -> int:
            return 0

        def swa_protected_size(self) -> int:
            return 0

        def evictable_size(self) -> int:
            return self.full_evictable_size()

        def protected_size(self) -> int:
            return self.full_protected_size()

        def component_evictable_size(self, component_type) -> int:
            if component_type == FULL:
                return self.full_evictable_size()
            if component_type == MAMBA:
                return self.mamba_evictable_size()
            return 0

        def component_protected_size(self, component_type) -> int:
            if component_type == FULL:
                return self.full_protected_size()
            if component_type == MAMBA:
                return self.mamba_protected_size()
            return 0

        def adjust_component_size(self, node_id, component_type, delta) -> None:
            raise NotImplementedError("adjust_component_size: no component changes its backing here")

        def total_size(self):
            full = self.full_evictable_size() + self.full_protected_size()
            aux = self.mamba_evictable_size() + self.mamba_protected_size()
            return full, aux

        def all_values_flatten(self):
            vals = [n.value for n in self._tree.lru_order("full")]
            if not vals:
                return self._empty
            return self._tensor(np.concatenate(vals))

        def all_mamba_values_flatten(self):
            if not self.has_mamba:
                return self._empty
            s = [n.state for n in self._tree.lru_order("mamba")]
            return torch.tensor(s, dtype=torch.int64, device=self.device)

        def walk_for_kv_canary(self, unlocked_only, swa_resident_only):
            slots, pos, prev = [], [], []
            stack = [(self._root, -1)]
            while stack:
                node, last = stack.pop()
                if not node.is_root:
                    v = node.value
                    start = node.prefix_len - len(v)
                    lock_ok = not unlocked_only or node.full_lock_ref == 0
                    for i, s in enumerate(v):
                        if lock_ok:
                            slots.append(int(s))
                            pos.append(start + i)
                            prev.append(last)
                        last = int(s)
                for c in node.children:
                    stack.append((c, last))
            t = lambda x: torch.tensor(x, dtype=torch.int64, device=self.device)  # noqa: E731
            return RadixCacheWalkResult(slot_indices=t(slots), positions=t(pos), prev_slot_indices=t(prev))

        # ---- component values --------------------------------------------------

        def get_component_device_value(self, node_id, component_type):
            component_type = self._component(component_type, "get_component_device_value")
            node = self._node(node_id)
            if component_type == FULL:
                return None if node.is_root else self._tensor(node.value)
            if component_type == MAMBA and self.has_mamba:
                s = node.state
                return None if s is None else torch.tensor([s], dtype=torch.int64, device=self.device)
            return None

        def set_component_device_value(self, node_id, component_type, value) -> None:
            raise NotImplementedError(
                "set_component_device_value: values reach this TreeCore through insert only"
            )

        def component_has_host_value_only(self, node_id, component_type) -> bool:
            self._component(component_type, "component_has_host_value_only")
            self._node(node_id)
            return False

        # ---- checks and printing -----------------------------------------------

        def sanity_check(self, ongoing_write_through=(), ongoing_load_back=()) -> None:
            try:
                self._tree.sanity_check()
            except _C.InvariantError as e:
                raise AssertionError(str(e)) from e

        def pretty_print(self) -> None:
            print(self._tree.pretty_print(), end="")

        # ---- host tier and friends: served by the Python TreeCore -------------

        def set_hicache_enabled(self) -> None:
            raise NotImplementedError(
                "set_hicache_enabled: the HiCache host tier is served by SGLang's Python TreeCore"
            )

        def set_host_memory_buffer_only(self) -> None:
            raise NotImplementedError(
                "set_host_memory_buffer_only: the HiCache host tier is served by SGLang's Python TreeCore"
            )

        def inc_host_lock_ref(self, node_id):
            self._node(node_id)
            return IncLockRefResult(node_id=int(node_id))

        def dec_host_lock_ref(self, node_id, params):
            self._node(node_id)
            return DecLockRefResult()

        def drive_host_eviction(self, component_type, num_tokens):
            from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import DriveHostEvictionResult

            return DriveHostEvictionResult()

    for _name in (
        "snapshot_buffer_backup",
        "validate_buffer_backup",
        "dec_window_lock_only",
        "drop_subtree_no_host",
        "demote",
        "insert_host",
        "build_backup_spec",
        "build_backup_kv_action",
        "build_storage_backup_spec",
        "build_hicache_transfers",
        "build_load_back_spec",
        "prefetch_anchor_info",
        "commit_hicache_transfers",
        "commit_backup",
        "commit_load_back",
        "finish_load_back",
        "build_external_linker_offload_transfers",
        "mark_external_cache_stored_path",
        "mark_external_linker_offload_pending",
        "finish_external_linker_offload",
        "mark_write_through_pending",
        "finish_write_through",
        "swa_tombstone_ranges",
        "attach_swa_window",
    ):
        setattr(Core, _name, _unserved(_name))
    Core.__abstractmethods__ = frozenset()
    Core.__name__ = Core.__qualname__ = "MambaradixTreeCore"
    return Core


_INSPECTOR = None


def inspection_core_class():
    """The TreeCore with SGLang's test-kit inspection interface
    (``sglang.test.kits.unified_radix_cache``'s ``UnifiedTreeCoreInspectionInterface``),
    for SGLang-style unit suites.  Read-side inspection is served; the kit's
    white-box mutators (raw value / lock / size writes) raise NotImplementedError:
    the C tree's internals are only changed through its operations."""
    global _INSPECTOR
    if _INSPECTOR is not None:
        return _INSPECTOR
    with _needs_sglang("sglang.test.kits.unified_radix_cache"):
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.test.kits.unified_radix_cache.unified_tree_core_inspection_interface import (
            UnifiedTreeCoreInspectionInterface,
        )

    FULL, MAMBA = ComponentType.FULL, ComponentType.MAMBA
    Core = _core_class()

    class Inspector(Core, UnifiedTreeCoreInspectionInterface):
        def contains_node(self, node_id):
            try:
                self._fast.node(node_id)
                return True
            except (KeyError, TypeError):
                return False

        def get_parent_node_id(self, node_id):
            parent = self._node(node_id).parent
            return None if parent is None else self._nid(parent)

        def get_child_node_ids(self, node_id):
            return [self._nid(c) for c in self._node(node_id).children]

        def get_node_key_length(self, node_id):
            return len(self._node(node_id).key)

        def get_node_token_ids(self, node_id):
            return [int(t) for t in self._real_tokens(self._node(node_id).key)]

        def is_node_key_bigram(self, node_id):
            self._node(node_id)
            return False

        def get_component_host_value(self, node_id, component_type):
            self._node(node_id)
            return None

        def get_component_device_lock_ref(self, node_id, component_type):
            node = self._node(node_id)
            if node.is_root:
                return 1  # SGLang's root holds one reference of each component
            if component_type == FULL:
                return node.full_lock_ref
            if component_type == MAMBA and self.has_mamba:
                return node.state_lock_ref
            return 0

        def get_component_host_lock_ref(self, node_id, component_type):
            self._node(node_id)
            return 0

        def get_node_hit_count(self, node_id):
            # The C tree counts as SGLang's insert walk does: +1 for each node an
            # insert walks past its inserted_len or creates; a split keeps the count.
            return self._node(node_id).hits

        def get_write_through_pending_id(self, node_id):
            self._node(node_id)
            return None

        def is_external_cache_stored(self, node_id):
            self._node(node_id)
            return False

        def is_node_in_device_lru(self, node_id, component_type):
            node = self._node(node_id)
            if node.is_root:
                return False
            # SGLang's FULL eviction orders by access time, not through a device LRU list.
            return component_type == MAMBA and self.has_mamba and node.state is not None

        def is_node_in_host_lru(self, node_id, component_type):
            self._node(node_id)
            return False

        def get_component_device_lru_node_ids(self, component_type):
            if component_type == MAMBA and self.has_mamba:
                return [self._nid(n) for n in self._tree.lru_order("mamba")]
            return []

        def is_device_leaf(self, node_id):
            node = self._node(node_id)
            return (not node.is_root and not node.children and node.full_lock_ref == 0
                    and (node.state_lock_ref == 0))

        def is_device_evictable_leaf(self, node_id):
            return self.contains_node(node_id) and self.is_device_leaf(node_id)

        def is_host_evictable_leaf(self, node_id):
            return False

        def get_all_node_ids(self):
            out, stack = [], [self._root]
            while stack:
                n = stack.pop()
                out.append(self._nid(n))
                stack.extend(n.children)
            return out

    def _no_raw_writes(name):
        def method(self, *a, **k):
            raise NotImplementedError(f"{name}: the C tree is changed only through its operations")

        method.__name__ = name
        return method

    for name in (
        "set_node_hash_values", "set_component_device_value_raw", "set_component_host_value_raw",
        "set_component_device_lock_ref", "remove_node_from_device_lru", "insert_node_into_host_lru",
        "set_component_evictable_size", "set_component_protected_size", "update_duplicate_tracking",
        "advance_insert_walk_once", "evict_component", "validate_cascade_evict",
        "cleanup_tombstone_ancestors", "finalize_component_match_result", "build_backup_node_ids",
    ):
        setattr(Inspector, name, _no_raw_writes(name))
    Inspector.__abstractmethods__ = frozenset()
    Inspector.__name__ = Inspector.__qualname__ = "MambaradixTreeCoreInspector"
    _INSPECTOR = Inspector
    return Inspector


def array_q(tokens):
    from array import array

    return array("q", [int(t) for t in tokens])


def __getattr__(name):
    # the class is built on first use, from SGLang's interface (ImportError without it)
    if name in ("MambaradixTreeCore", "MambaradixTreeCoreClass"):
        return _core_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
