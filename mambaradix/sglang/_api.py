"""The value types SGLang v0.5.15's scheduler passes to and reads from its
prefix cache, with the same names, fields and defaults: RadixKey, the
parameter / result dataclasses, CacheInitParams, the state-shape classes
and a Req carrying the fields the cache reads and writes.

These are written for mambaradix; they follow SGLang's documented
behaviour (see the project's reference notes), not its code.
"""

from __future__ import annotations

import dataclasses
from array import array
from typing import Any, Iterator, NamedTuple, Optional, Sequence, Union

import torch

from .. import _C
from ._check import count, index_array, integer, one_index, positive

__all__ = [
    "RadixKey",
    "MatchPrefixParams",
    "InsertParams",
    "InsertResult",
    "EvictParams",
    "EvictResult",
    "IncLockRefResult",
    "DecLockRefParams",
    "DecLockRefResult",
    "MatchResult",
    "CacheInitParams",
    "Mamba2StateDType",
    "Mamba2StateShape",
    "Mamba2CacheParams",
    "Range",
    "SamplingParams",
    "Req",
    "SlotIndex",
]


# ---------------------------------------------------------------------------
# RadixKey


class RadixKey:
    """Token ids of a prefix-cache key plus an optional namespace.

    `extra_key` (a LoRA id, a cache salt) separates namespaces: keys with
    different extra keys never share a prefix.  `limit` caps the number of
    tokens the key stands for without copying `token_ids`.
    """

    __slots__ = ("token_ids", "extra_key", "is_bigram", "limit")

    def __init__(
        self,
        token_ids: Union[array, Sequence[int]],
        extra_key: Optional[str] = None,
        is_bigram: bool = False,
        limit: Optional[int] = None,
    ) -> None:
        self.token_ids = token_ids
        self.extra_key = extra_key
        self.is_bigram = is_bigram
        self.limit = limit

    def _n(self) -> int:
        n = len(self.token_ids)
        return n if self.limit is None or self.limit >= n else max(self.limit, 0)

    def __len__(self) -> int:
        n = self._n()
        return max(n - 1, 0) if self.is_bigram else n

    def raw_token_ids(self) -> Union[array, Sequence[int]]:
        """The tokens the key stands for (a copy only when `limit` cuts)."""
        n = self._n()
        return self.token_ids if n == len(self.token_ids) else self.token_ids[:n]

    def __iter__(self) -> Iterator[int]:
        return iter(self.raw_token_ids())

    def __getitem__(self, idx: Union[int, slice]) -> "RadixKey":
        if isinstance(idx, int):
            n = len(self)
            if idx < 0:
                idx += n
            if not 0 <= idx < n:
                raise IndexError(f"RadixKey index out of range: {idx}")
            idx = slice(idx, idx + 1)
        start, stop, step = idx.indices(len(self))
        if step != 1:
            raise ValueError("RadixKey slices must have step 1")
        return RadixKey(self.token_ids[start:stop], self.extra_key)

    def match(self, other: "RadixKey", page_size: int = 1) -> int:
        """Length of the common prefix, rounded down to whole pages."""
        if self.extra_key != other.extra_key:
            raise ValueError(
                f"RadixKey.match: extra_key differs ({self.extra_key!r} != {other.extra_key!r})"
            )
        a, b = self.raw_token_ids(), other.raw_token_ids()
        n = min(len(a), len(b))
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i // page_size * page_size

    def child_key(self, page_size: int = 1) -> Any:
        """The first page as a dict key ((extra_key, page) in a namespace)."""
        t = self.raw_token_ids()
        plain = t[0] if page_size == 1 else tuple(t[:page_size])
        return plain if self.extra_key is None else (self.extra_key, plain)

    def page_aligned(self, page_size: int) -> "RadixKey":
        if page_size == 1:
            return self
        return self[: len(self) // page_size * page_size]

    def __repr__(self) -> str:
        head = list(self.raw_token_ids()[:10])
        more = "..." if len(self) > 10 else ""
        return f"RadixKey(extra_key={self.extra_key!r}, token_ids={head}{more})"


# ---------------------------------------------------------------------------
# Parameters and results


@dataclasses.dataclass
class MatchPrefixParams:
    key: RadixKey
    cow_mamba: bool = False
    req: Optional["Req"] = None


@dataclasses.dataclass
class InsertParams:
    key: Optional[RadixKey] = None
    value: Optional[torch.Tensor] = None
    mamba_value: Optional[torch.Tensor] = None
    prev_prefix_len: int = 0
    swa_evicted_seqlen: int = 0
    chunked: bool = False
    priority: int = 0


@dataclasses.dataclass
class InsertResult:
    prefix_len: int
    total_len: int = 0
    last_device_node: Any = None
    mamba_exist: bool = False
    inserted_host_node: Any = None


@dataclasses.dataclass
class EvictParams:
    num_tokens: int = 0
    swa_num_tokens: int = 0
    mamba_num: int = 0


@dataclasses.dataclass
class EvictResult:
    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0


@dataclasses.dataclass
class DecLockRefParams:
    swa_uuid_for_lock: Optional[int] = None
    swa_uuid_for_host_lock: Optional[int] = None
    skip_lock_node_ids: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class IncLockRefResult:
    delta: Optional[int] = None
    swa_uuid_for_lock: Optional[int] = None
    swa_uuid_for_host_lock: Optional[int] = None
    skip_lock_node_ids: dict = dataclasses.field(default_factory=dict)

    def to_dec_params(self) -> DecLockRefParams:
        return DecLockRefParams(
            swa_uuid_for_lock=self.swa_uuid_for_lock,
            swa_uuid_for_host_lock=self.swa_uuid_for_host_lock,
            skip_lock_node_ids={k: set(v) for k, v in self.skip_lock_node_ids.items()},
        )


@dataclasses.dataclass
class DecLockRefResult:
    delta: Optional[int] = None


class MatchResult(NamedTuple):
    """What match_prefix returns.  Without a host tier the three node fields
    are the same node: the deepest matched node that has a state."""

    device_indices: torch.Tensor
    last_device_node: Any
    last_host_node: Any
    best_match_node: Any
    host_hit_length: int = 0
    swa_host_hit_length: int = 0
    mamba_host_hit_length: int = 0
    mamba_branching_seqlen: Optional[int] = None
    cache_protected_len: Optional[int] = None


@dataclasses.dataclass
class CacheInitParams:
    disable: bool
    req_to_token_pool: Any
    token_to_kv_pool_allocator: Any
    page_size: int
    is_eagle: bool = False
    tp_cache_group: Any = None
    attn_cp_cache_group: Any = None
    attn_tp_cache_group: Any = None
    pp_cache_group: Any = None
    eviction_policy: str = "lru"
    disable_finished_insert: bool = False
    enable_metrics: bool = False
    enable_kv_cache_events: bool = False
    enable_session_radix_cache: bool = False
    enable_mamba_extra_buffer: bool = False
    enable_mamba_extra_buffer_lazy: bool = False
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    chunked_prefill_size: Optional[int] = None
    sliding_window_size: Optional[int] = None
    cache_ttl_seconds: Optional[float] = None
    tree_components: Optional[tuple] = None
    component_registry_override: Optional[dict] = None


# ---------------------------------------------------------------------------
# State shapes (what MambaPool's constructor takes)


@dataclasses.dataclass(kw_only=True, frozen=True)
class Mamba2StateDType:
    conv: torch.dtype = torch.bfloat16
    temporal: torch.dtype = torch.float32


@dataclasses.dataclass(kw_only=True, frozen=True)
class Mamba2StateShape:
    """Per-layer, per-slot state shapes: conv windows and the SSM state."""

    conv: list
    temporal: tuple
    intermediate_size: int
    conv_dim: int
    ssm_state_size: int
    num_heads: int
    head_dim: int
    state_size: int
    conv_kernel: int
    num_k_heads_per_tp: int = 1

    @staticmethod
    def create(
        *,
        tp_world_size: int,
        intermediate_size: int,
        n_groups: int,
        num_heads: int,
        head_dim: int,
        state_size: int,
        conv_kernel: int,
    ) -> "Mamba2StateShape":
        """Shapes for one tensor-parallel rank (heads and groups split over
        tp_world_size; groups padded up so every head keeps its group)."""
        call = "Mamba2StateShape.create()"
        tp_world_size = positive(tp_world_size, f"{call}: tp_world_size")
        intermediate_size = positive(intermediate_size, f"{call}: intermediate_size")
        n_groups = positive(n_groups, f"{call}: n_groups")
        num_heads = positive(num_heads, f"{call}: num_heads")
        head_dim = positive(head_dim, f"{call}: head_dim")
        state_size = positive(state_size, f"{call}: state_size")
        conv_kernel = positive(conv_kernel, f"{call}: conv_kernel")
        if conv_kernel < 2:   # the conv state keeps conv_kernel - 1 columns
            raise ValueError(f"{call}: conv_kernel must be >= 2, not {conv_kernel}")
        k_heads = -(-n_groups // tp_world_size)
        groups = n_groups
        if n_groups % tp_world_size != 0:
            groups = k_heads * tp_world_size
        conv_dim = intermediate_size + 2 * groups * state_size
        if conv_dim % tp_world_size or num_heads % tp_world_size:
            raise ValueError("conv_dim and num_heads must divide by tp_world_size")
        return Mamba2StateShape(
            conv=[(conv_dim // tp_world_size, conv_kernel - 1)],
            temporal=(num_heads // tp_world_size, head_dim, state_size),
            intermediate_size=intermediate_size,
            conv_dim=conv_dim,
            ssm_state_size=state_size,
            num_heads=num_heads,
            head_dim=head_dim,
            state_size=state_size,
            conv_kernel=conv_kernel,
            num_k_heads_per_tp=k_heads,
        )


@dataclasses.dataclass(kw_only=True, frozen=True)
class Mamba2CacheParams:
    shape: Mamba2StateShape
    layers: list
    dtype: Mamba2StateDType = dataclasses.field(default_factory=Mamba2StateDType)

    @property
    def mamba_cache_per_req(self) -> int:
        """Bytes of one state slot over all layers."""
        conv = sum(int(torch.Size(c).numel()) for c in self.shape.conv)
        ssm = int(torch.Size(self.shape.temporal).numel())
        conv_b = torch.empty((), dtype=self.dtype.conv).element_size()
        ssm_b = torch.empty((), dtype=self.dtype.temporal).element_size()
        return (conv * conv_b + ssm * ssm_b) * len(self.layers)

    @property
    def is_kda(self) -> bool:
        return False


# ---------------------------------------------------------------------------
# Req


class Range(NamedTuple):
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclasses.dataclass
class SamplingParams:
    """The two sampling fields the cache path looks at."""

    temperature: float = 1.0
    max_new_tokens: int = 128


def _slot_value(value: Any, name: str) -> int:
    """A slot given as None, an int or a one-element integer tensor, as an
    int (-1 = None).  A device tensor is read back here: the drop-in never
    assigns one, it writes the record."""
    if value is None:
        return -1
    v = one_index(value, name)
    if v < 0:
        raise ValueError(f"{name} must be a state slot (>= 0) or None, not {v}")
    return v


def _record_int(field: str, name: str, doc: str) -> property:
    """A Req field over an int of its record, -1 read as None (and taken
    as None: the record's own value, which the cache's calls write back)."""

    def get(self: "Req") -> Optional[int]:
        v = getattr(self._rs, field)
        return None if v < 0 else v

    def set_(self: "Req", value: Optional[int]) -> None:
        v = -1 if value is None else integer(value, name)
        if v < -1:
            raise ValueError(f"{name} must be >= 0 or None, not {v}")
        setattr(self._rs, field, v)

    return property(get, set_, doc=doc)


def _record_flag(field: str, doc: str) -> property:
    """A Req field over a 0/1 byte of its record, read as a bool."""

    def get(self: "Req") -> bool:
        return bool(getattr(self._rs, field))

    def set_(self: "Req", value: bool) -> None:
        setattr(self._rs, field, 1 if value else 0)

    return property(get, set_, doc=doc)


class SlotIndex:
    """The index tensors of a state pool, made once on its device:
    `ids[v + 1] == v` for every slot v >= -1, so a request's slot (0-d) or
    copy-on-write source (shape (1,)) is a view of `ids`, and a ping-pong
    buffer of a request without a row is gathered from it on the device: no
    host-device transfer per request.  pp: the track buffer's width.
    track_map: the pool's row -> track slots tensor (mambaradix's own
    pools), whose row is the ping-pong buffer of a request in that row."""

    __slots__ = ("ids", "pp", "device", "on_cpu", "track_map", "_s0", "_s1")

    def __init__(self, size: int, device: Any, pp: int = 2, track_map: Optional[torch.Tensor] = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.on_cpu = self.device.type == "cpu"
        self.ids = torch.arange(-1, int(size) + 1, dtype=torch.int64, device=self.device)
        self.pp = int(pp)
        self.track_map = track_map
        # the views handed out, made once per slot (a view costs more than
        # the lookup; they are views of ids either way)
        self._s0: dict = {}
        self._s1: dict = {}

    def _grow(self, v: int) -> None:
        n = max(v + 2, 2 * self.ids.numel())
        self.ids = torch.arange(-1, n - 1, dtype=torch.int64, device=self.device)
        self._s0 = {}
        self._s1 = {}

    def slot(self, v: int) -> torch.Tensor:
        t = self._s0.get(v)
        if t is None:
            if v + 1 >= self.ids.numel():
                self._grow(v)
            t = self._s0[v] = self.ids[v + 1]
        return t

    def slot1(self, v: int) -> torch.Tensor:
        t = self._s1.get(v)
        if t is None:
            if v + 1 >= self.ids.numel():
                self._grow(v)
            t = self._s1[v] = self.ids[v + 1 : v + 2]
        return t

    def host_value(self, value: Any, name: str = "value") -> int:
        """The slot `value` names, without reading a device: an int as it
        is, a one-element view of `ids` (a slot this index handed out) from
        its offset; any other tensor is read back (on a device, a sync)."""
        if type(value) is int:
            return value
        if isinstance(value, torch.Tensor) and value._base is self.ids and value.numel() == 1 and value.dim() <= 1:
            return value.storage_offset() - 1
        return one_index(value, name)

    def buffer(self, rs: Any, pp: int) -> torch.Tensor:
        """A new tensor of the record's pp track entries (the caller may
        write to it; `ids` stays untouched)."""
        a, b = rs.track0, rs.track1
        if max(a, b) + 1 >= self.ids.numel():
            self._grow(max(a, b))
        if pp == 1:
            return self.ids[a + 1 : a + 2].clone()
        return torch.stack((self.ids[a + 1], self.ids[b + 1]))


class Req:
    """A request as the cache sees it: SGLang's constructor keywords and the
    fields MambaRadixCache and HybridReqToTokenPool read and write."""

    def __init__(
        self,
        rid: Any,
        origin_input_text: str = "",
        origin_input_ids: Union[array, Sequence[int], None] = None,
        sampling_params: Any = None,
        return_logprob: bool = False,
        *,
        extra_key: Optional[str] = None,
        lora_id: Optional[str] = None,
        priority: Optional[int] = None,
        **_ignored: Any,
    ) -> None:
        # recurrent state bookkeeping: a C record the cache's calls update in
        # place (the mamba_* properties below read and write it)
        self._rs = _C.ReqState()
        self._ix: Optional[SlotIndex] = None
        self._track_t: Optional[torch.Tensor] = None  # the ping-pong view of _track_row
        self._track_row = -1                          # of _track_of (a track map), -1: of the record
        self._track_of: Optional[torch.Tensor] = None
        self._pp = 2
        self.rid = rid
        self.origin_input_text = origin_input_text
        ids = origin_input_ids if origin_input_ids is not None else array("q")
        if type(ids) is not array or ids.typecode != "q":   # SGLang's array('q'), or the ints of anything else
            ids = array("q", index_array(ids, "origin_input_ids", scalar=False).tobytes())
        self.origin_input_ids = ids
        self.sampling_params = sampling_params if sampling_params is not None else SamplingParams()
        self.return_logprob = return_logprob
        self.logprob_start_len = -1
        self.extra_key = extra_key
        self.lora_id = lora_id
        self.priority = priority
        self.output_ids = array("q")
        self.full_untruncated_fill_ids = array("q")
        self.extend_range: Optional[Range] = None
        self.finished_reason: Any = None
        self.session = None
        self.is_retracted = False
        self.retraction_count = 0
        self.inflight_middle_chunks = 0
        # KV bookkeeping
        self.req_pool_idx: Optional[int] = None
        self.prefix_indices = torch.empty((0,), dtype=torch.int64)
        self.last_node: Any = None
        self.last_host_node: Any = None
        self.best_match_node: Any = None
        self.host_hit_length = 0
        self.swa_host_hit_length = 0
        self.mamba_host_hit_length = 0
        self.cache_protected_len = 0
        self.kv_committed_len = 0
        self.kv_allocated_len = 0
        self.kv_committed_freed = False
        self.kv_overallocated_freed = False

    # -- the recurrent-state fields, over the C record -------------------------
    # The record lives in the request's ReqPool row from admission on (in
    # the ReqState before and after).  Index tensors are views of one device
    # tensor made once (SlotIndex); the ping-pong buffer of a request in a
    # row is that row of the pool's track map (SGLang's
    # req_index_to_mamba_ping_pong_track_buffer_mapping), which the C calls
    # keep equal to the record.  Assigning a tensor reads it back to the host
    # (the cache and pools never do: they write the record).

    @property
    def mamba_pool_idx(self) -> Optional[torch.Tensor]:
        v = self._rs.running
        if v < 0:
            return None
        ix = self._ix
        return torch.tensor(v, dtype=torch.int64) if ix is None else ix.slot(v)

    @mamba_pool_idx.setter
    def mamba_pool_idx(self, value: Any) -> None:
        self._rs.running = _slot_value(value, "mamba_pool_idx")

    @property
    def mamba_cow_src_index(self) -> Optional[torch.Tensor]:
        v = self._rs.cow_src
        if v < 0:
            return None
        ix = self._ix
        return torch.tensor([v], dtype=torch.int64) if ix is None else ix.slot1(v)

    @mamba_cow_src_index.setter
    def mamba_cow_src_index(self, value: Any) -> None:
        self._rs.cow_src = _slot_value(value, "mamba_cow_src_index")

    @property
    def mamba_ping_pong_track_buffer(self) -> Optional[torch.Tensor]:
        rs = self._rs
        if rs.next_track < 0 and rs.track0 < 0 and rs.track1 < 0:
            return None
        ix = self._ix
        row = rs.row
        pp = self._pp if ix is None else ix.pp
        if row > 0:
            if ix is None or ix.track_map is None:  # bound to a pool this cache does not index
                return torch.tensor([rs.track0, rs.track1][:pp], dtype=torch.int64)
            t = self._track_t
            if t is None or self._track_row != row or self._track_of is not ix.track_map:
                t = self._track_t = ix.track_map[row]
                self._track_row, self._track_of = row, ix.track_map
            return t
        if ix is not None and not ix.on_cpu:  # not in a row, on a device: a gather
            return ix.buffer(rs, pp)
        # not in a row, on CPU: a zero-copy tensor over the record in the
        # ReqState (SGLang's own pools write into it in place)
        t = self._track_t
        if t is None or self._track_row != -1:
            t = self._track_t = torch.frombuffer(rs, dtype=torch.int64)
            self._track_row = -1
        return t if pp == 2 else t[:pp]

    @mamba_ping_pong_track_buffer.setter
    def mamba_ping_pong_track_buffer(self, value: Any) -> None:
        rs = self._rs
        if value is None:
            rs.track0 = rs.track1 = -1
            rs.next_track = -1
            return
        vals = index_array(value, "mamba_ping_pong_track_buffer").tolist()
        if not 1 <= len(vals) <= 2:
            raise ValueError(f"mamba_ping_pong_track_buffer must hold 1 or 2 slots, not {len(vals)}")
        if min(vals) < -1:
            raise ValueError(f"mamba_ping_pong_track_buffer holds {min(vals)}: a slot is >= 0 (-1: none)")
        self._pp = len(vals)
        rs.track0 = vals[0]   # in a row: its track map (on the host)
        rs.track1 = vals[1] if len(vals) > 1 else -1

    mamba_next_track_idx = _record_int("next_track", "mamba_next_track_idx", "mamba_next_track_idx (None = no buffer).")
    mamba_last_track_seqlen = _record_int("last_track_seqlen", "mamba_last_track_seqlen",
                                          "The length the newest snapshot stands for.")
    mamba_branching_seqlen = _record_int("branching_seqlen", "mamba_branching_seqlen",
                                         "The match's branching point, if any.")
    mamba_needs_clear = _record_flag("needs_clear", "The running slot must be zeroed before the forward.")
    mamba_lazy_is_insert = _record_flag("lazy_is_insert", "Lazy mode: the finished request may be cached.")

    @property
    def cache_protected_len(self) -> int:
        return self._rs.protected_len

    @cache_protected_len.setter
    def cache_protected_len(self, value: Optional[int]) -> None:
        self._rs.protected_len = 0 if value is None else count(value, "cache_protected_len")

    # -- lengths and ids ---------------------------------------------------

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def finished(self) -> bool:
        return self.finished_reason is not None

    def set_extend_range(self, start: int, end: int) -> None:
        self.extend_range = Range(start, end)

    def _refresh_fill_ids(self) -> None:
        have = len(self.full_untruncated_fill_ids) - len(self.origin_input_ids)
        if self.full_untruncated_fill_ids is not self.origin_input_ids and 0 <= have <= len(self.output_ids):
            self.full_untruncated_fill_ids.extend(self.output_ids[have:])
        else:
            self.full_untruncated_fill_ids = self.origin_input_ids + self.output_ids

    def get_fill_ids(self) -> array:
        if self.extend_range is None:
            raise ValueError(f"request {self.rid!r}: get_fill_ids() before set_extend_range()")
        return self.full_untruncated_fill_ids[: self.extend_range.end]

    def _compute_max_prefix_len(self, input_len: int) -> int:
        """At most input_len - 1 tokens can hit: one must be computed."""
        m = input_len - 1
        if self.return_logprob and self.logprob_start_len >= 0:
            m = min(m, self.logprob_start_len)
        return max(m, 0)

    def init_next_round_input(self, tree_cache: Any = None, cow_mamba: Optional[bool] = None) -> None:
        """Match the request's tokens (capped at input_len - 1) and record
        the prefix, the node and the copy-on-write bookkeeping."""
        self._refresh_fill_ids()
        input_len = len(self.full_untruncated_fill_ids)
        if tree_cache is None:
            return
        if cow_mamba is None:
            cow_mamba = tree_cache.supports_mamba()
        r = tree_cache.match_prefix(
            MatchPrefixParams(
                key=RadixKey(
                    self.full_untruncated_fill_ids,
                    extra_key=self.extra_key,
                    limit=self._compute_max_prefix_len(input_len),
                ),
                req=self,
                cow_mamba=cow_mamba,
            )
        )
        self.prefix_indices = r.device_indices
        self.last_node = r.last_device_node
        self.last_host_node = r.last_host_node
        self.best_match_node = r.best_match_node
        self.host_hit_length = r.host_hit_length
        self.swa_host_hit_length = r.swa_host_hit_length
        self.mamba_host_hit_length = r.mamba_host_hit_length
        self.mamba_branching_seqlen = r.mamba_branching_seqlen
        self.cache_protected_len = (
            r.cache_protected_len if r.cache_protected_len is not None else len(self.prefix_indices)
        )

    # -- KV lengths -----------------------------------------------------------

    def pop_committed_kv_cache(self) -> int:
        """The committed KV length, once: a second call is a double finish."""
        if self.kv_committed_freed:
            raise RuntimeError(
                f"request {self.rid!r}: committed KV cache already freed (finished twice?)"
            )
        self.kv_committed_freed = True
        return self.kv_committed_len

    def pop_overallocated_kv_cache(self) -> tuple[int, int]:
        if self.kv_overallocated_freed:
            raise RuntimeError(f"request {self.rid!r}: over-allocated KV cache already freed")
        self.kv_overallocated_freed = True
        return self.kv_committed_len, self.kv_allocated_len

    def reset_for_retract(self) -> None:
        self.retraction_count += 1
        self.prefix_indices = torch.empty((0,), dtype=torch.int64)
        self.last_node = None
        self.cache_protected_len = 0
        self.extend_range = None
        self.is_retracted = True
        self.inflight_middle_chunks = 0
        lazy_is_insert = self._rs.lazy_is_insert
        self._rs.reset()
        self._rs.lazy_is_insert = lazy_is_insert
        self.kv_allocated_len = 0
        self.kv_committed_len = 0
        self.kv_committed_freed = False
        self.kv_overallocated_freed = False

    def __repr__(self) -> str:
        return f"Req(rid={self.rid!r}, input_len={len(self.origin_input_ids)}, output_len={len(self.output_ids)})"
