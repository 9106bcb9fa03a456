"""SGLang v0.5.15's pool classes over mambaradix's C pools.

Free lists, owners and the req-to-token table live in C (mambaradix._C
SlotAllocator / ReqPool); these classes keep SGLang's names, signatures and
return types (index results are int64 torch tensors on the pool's device).
Every slot is free, held by a caller, owned by one request row, or owned by
the prefix tree; a double free or freeing a tree-owned slot raises
mambaradix OwnershipError and changes nothing.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np
import torch

from .. import _C
from ._api import Mamba2CacheParams, Req, SlotIndex
from ._check import count, index_array, index_tensor, integer, positive

__all__ = [
    "MambaSlotAllocator",
    "TokenToKVPoolAllocator",
    "PagedTokenToKVPoolAllocator",
    "MambaPool",
    "ReqToTokenPool",
    "HybridReqToTokenPool",
]

OwnershipError = _C.OwnershipError


def _host_view(x: torch.Tensor, int32: bool = False) -> Optional[np.ndarray]:
    """The numpy view of a one-dimensional int64 tensor (int32: or int32)
    in host memory, sharing its memory; None for anything else (a device
    tensor is not read)."""
    if x.dtype is torch.int64 or (int32 and x.dtype is torch.int32):
        try:  # a CPU tensor: its numpy view (a device tensor raises)
            a = x.numpy()
        except (TypeError, RuntimeError):
            return None
        if a.ndim == 1:
            return a
    return None


def _np_index(x: Any, int32: bool = False, name: str = "indices") -> np.ndarray:
    """int64 numpy view/copy of an index tensor, array, sequence or int
    (int32: a CPU int32 tensor's int32 view too, which the C core reads as
    it is; SGLang's req_to_token rows are int32).  Anything but integers in
    at most one dimension raises TypeError / ValueError naming `name`."""
    if type(x) is torch.Tensor:
        a = _host_view(x, int32)
        if a is not None:
            return a
    return index_array(x, name)


def _to_device(a: np.ndarray, device: Any) -> torch.Tensor:
    """A host array's copy on `device`, queued on the current stream (the
    host does not wait for it)."""
    t = torch.from_numpy(a)
    if str(device) != "cpu":
        t = t.to(device, non_blocking=True)
    return t


_NP_INDEX_TYPES = (np.dtype(np.int32), np.dtype(np.int64))


def _stream_of(t: torch.Tensor) -> Optional[int]:
    """The stream a kernel on `t` must run on: torch's current stream on
    t's device (SGLang's forward and overlap streams are not the legacy
    default stream, which the kernels use without one); None on the host."""
    if t.device.type != "cuda":
        return None
    return torch.cuda.current_stream(t.device).cuda_stream


def _is_cpu(device: Any) -> bool:
    return torch.device(device).type == "cpu"


# ---------------------------------------------------------------------------
# Allocators


def _layer_ids(ids: Any, call: str) -> List[int]:
    """The recurrent layers' ids: a non-empty sequence of distinct ints >= 0
    (a state pool with no layer holds nothing; a layer listed twice would
    get two state tensors, one of them never read)."""
    if isinstance(ids, (str, bytes, torch.Tensor, np.ndarray)) or not isinstance(ids, Sequence):
        raise TypeError(f"{call}: mamba_layer_ids must be a list of ints, not {type(ids).__name__}")
    out = [count(v, f"{call}: mamba_layer_ids[{i}]") for i, v in enumerate(ids)]
    if not out:
        raise ValueError(f"{call}: mamba_layer_ids is empty (a state pool needs a layer)")
    if len(set(out)) != len(out):
        dup = next(v for i, v in enumerate(out) if v in out[:i])
        raise ValueError(f"{call}: mamba_layer_ids lists layer {dup} twice")
    return out


def _per_request(**tensors: Any) -> None:
    """Per-request integer tensors of one batch (one dimension each, all
    of one length); TypeError / ValueError naming the one that is not."""
    n = None
    for name, t in tensors.items():
        index_tensor(t, name)
        if n is None:
            n, first = t.numel(), name
        elif t.numel() != n:
            raise ValueError(f"{name} has {t.numel()} elements, {first} {n}")


class MambaSlotAllocator:
    """Free list of state slots 1..size (slot 0 is the dummy target)."""

    def __init__(self, size: int, device: Any) -> None:
        self.size = positive(size, "MambaSlotAllocator(): size")
        self.device = device
        self._on_host = _is_cpu(device)
        self._slots = _C.SlotAllocator(self.size)
        # the pool's index tensors (HybridReqToTokenPool sets them): one slot
        # comes back as a view of them, whose value the pool reads on the host
        self._ix: Optional[SlotIndex] = None

    def available_size(self) -> int:
        return self._slots.available_size()

    def schedulable_available_size(self) -> int:
        return self._slots.available_size()

    def alloc_group_begin(self, num_reqs: int) -> None:
        self._slots.alloc_group_begin(count(num_reqs, "num_reqs"))

    def alloc_group_end(self) -> None:
        self._slots.alloc_group_end()

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        got = self._slots.alloc(count(need_size, "need_size"))
        if got is None:
            return None
        if got.size == 1 and self._ix is not None:  # shape (1,), no copy to the device
            return self._ix.slot1(int(got[0]))
        return torch.from_numpy(got) if self._on_host else _to_device(got, self.device)

    def free(self, free_index: Any) -> None:
        idx = _np_index(free_index, name="free_index")
        if idx.size:
            self._slots.free(idx)

    def clear(self) -> None:
        self._slots.clear()

    def check(self) -> None:
        """free + held + request-owned + tree-owned == size; raises InvariantError."""
        self._slots.check()


class TokenToKVPoolAllocator:
    """KV token allocator, page_size 1 (token 0 is the padding target)."""

    page_size_default = 1

    def __init__(self, size: int, dtype: Any, device: Any, kvcache: Any, need_sort: bool, page_size: int = 1) -> None:
        call = f"{type(self).__name__}()"
        size, page_size = positive(size, f"{call}: size"), positive(page_size, f"{call}: page_size")
        if size < page_size:
            raise ValueError(f"{call}: size must be >= page_size ({page_size}): {size} tokens hold no page")
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self._on_host = _is_cpu(device)
        self._kvcache = kvcache
        self.need_sort = need_sort
        self._slots = _C.SlotAllocator(size, page_size)

    @property
    def size_full(self) -> int:
        return self.size

    def get_kvcache(self) -> Any:
        return self._kvcache

    def debug_print(self) -> str:
        return ""

    def available_size(self) -> int:
        return self._slots.available_size()

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        got = self._slots.alloc(count(need_size, "need_size"))
        if got is None:
            return None
        return torch.from_numpy(got) if self._on_host else _to_device(got, self.device)

    def free(self, free_index: Any) -> None:
        """Return a caller's KV indices.  Inside a free group they are
        checked now (a double free raises OwnershipError at once) and join
        the free list at free_group_end(), as SGLang's allocator defers."""
        self._slots.free(_np_index(free_index, name="free_index"))

    def free_group_begin(self) -> None:
        self._slots.free_group_begin()

    def free_group_end(self) -> None:
        """Ends the open free group; RuntimeError when none is open (an end
        without its begin: SGLang's callers pair them)."""
        self._slots.free_group_end()

    @property
    def is_not_in_free_group(self) -> bool:
        return not self._slots.in_free_group

    def merge_and_sort_free(self) -> None:
        """Free pages are kept in one FIFO list; nothing to merge."""

    def clear(self) -> None:
        self._slots.clear()

    def check(self) -> None:
        self._slots.check()

    def get_cpu_copy(self, indices: Any, mamba_indices: Any = None) -> Any:
        return self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)

    def load_cpu_copy(self, kv_cache_cpu: Any, indices: Any, mamba_indices: Any = None) -> Any:
        return self._kvcache.load_cpu_copy(kv_cache_cpu, indices, mamba_indices=mamba_indices)

    def alloc_extend(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("alloc_extend is only for the paged allocator")

    def alloc_decode(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("alloc_decode is only for the paged allocator")


class PagedTokenToKVPoolAllocator(TokenToKVPoolAllocator):
    """KV allocator handing out whole pages of page_size tokens."""

    def __init__(self, size: int, page_size: int, dtype: Any, device: Any, kvcache: Any, need_sort: bool) -> None:
        super().__init__(size, dtype, device, kvcache, need_sort, page_size=page_size)
        self.num_pages = size // page_size

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        need_size = count(need_size, "need_size")
        if need_size % self.page_size:
            raise ValueError(f"alloc(): need_size={need_size} is not a multiple of page_size={self.page_size}")
        return super().alloc(need_size)

    def _extend_one(self, prefix: int, seq: int, last: int, out: list) -> bool:
        ps = self.page_size
        fill = min(seq, -(-prefix // ps) * ps) - prefix   # rest of the last partial page
        out.extend(range(last + 1, last + 1 + fill))
        rest = seq - prefix - fill
        if rest <= 0:
            return True
        pages = -(-rest // ps)
        got = self._slots.alloc(pages * ps)
        if got is None:
            return False
        out.extend(got[:rest].tolist())
        # the unused tail of the last page stays with the request's last page
        return True

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        num_new_pages: Optional[int] = None,
    ) -> Optional[torch.Tensor]:
        """KV indices for each request's new tokens: first the free rest of
        its last page (after last_loc), then whole new pages."""
        _per_request(prefix_lens_cpu=prefix_lens_cpu, seq_lens_cpu=seq_lens_cpu, last_loc=last_loc)
        pl = prefix_lens_cpu.tolist()
        sl = seq_lens_cpu.tolist()
        ll = last_loc.cpu().tolist()
        ps = self.page_size
        need = sum(max(-(-s // ps) - -(-p // ps), 0) for p, s in zip(pl, sl))
        if need > self._slots.available_size() // ps:
            return None
        out: list = []
        for p, s, last in zip(pl, sl, ll):
            if not self._extend_one(int(p), int(s), int(last), out):
                return None
        return torch.tensor(out, dtype=torch.int64, device=self.device)

    def alloc_decode(self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor) -> Optional[torch.Tensor]:
        """One KV index per request for its next token (seq_lens include it)."""
        _per_request(seq_lens_cpu=seq_lens_cpu, last_loc=last_loc)
        sl = seq_lens_cpu.tolist()
        ll = last_loc.cpu().tolist()
        ps = self.page_size
        need = sum(1 for s in sl if (s - 1) % ps == 0)
        if need > self._slots.available_size() // ps:
            return None
        out = []
        for s, last in zip(sl, ll):
            if (s - 1) % ps == 0:
                out.append(int(self._slots.alloc(ps)[0]))
            else:
                out.append(int(last) + 1)
        return torch.tensor(out, dtype=torch.int64, device=self.device)


# ---------------------------------------------------------------------------
# State tensors


class _StateOps:
    """The one place that moves state bytes: mambaradix's StatePool kernels
    when that module part is built, torch indexing otherwise."""

    def __init__(self, conv: List[torch.Tensor], temporal: torch.Tensor) -> None:
        self.conv = conv
        self.temporal = temporal
        self.native = None
        sp = getattr(_C, "StatePool", None)
        if sp is not None:
            try:  # adopts the tensors through DLPack, no copy
                self.native = sp(list(conv), temporal)
            except Exception:
                self.native = None

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        if self.native is not None:
            self.native.copy_slots(src, dst, stream=_stream_of(self.temporal))
            return
        for t in self.conv:
            t[:, dst] = t[:, src]
        self.temporal[:, dst] = self.temporal[:, src]

    def clear(self, idx: torch.Tensor) -> None:
        if self.native is not None:
            self.native.clear_slots(idx, stream=_stream_of(self.temporal))
            return
        for t in self.conv:
            t[:, idx] = 0
        self.temporal[:, idx] = 0


class MambaPool:
    """Recurrent-state tensors: conv[i] [layers, size + 1, *conv_shape_i]
    and temporal [layers, size + 1, *temporal_shape]; slot 0 is the dummy."""

    class State:
        def __init__(self, conv: List[torch.Tensor], temporal: torch.Tensor) -> None:
            self.conv = conv
            self.temporal = temporal

        def at_layer_idx(self, layer: int) -> "MambaPool.State":
            return MambaPool.State([c[layer] for c in self.conv], self.temporal[layer])

        def mem_usage_bytes(self) -> int:
            return sum(c.numel() * c.element_size() for c in self.conv) + self.temporal.numel() * self.temporal.element_size()

    def __init__(
        self,
        *,
        size: int,
        spec_state_size: int = 0,
        cache_params: Mamba2CacheParams,
        mamba_layer_ids: Sequence[int],
        device: Any,
        enable_memory_saver: bool = False,
        speculative_num_draft_tokens: Optional[int] = None,
        speculative_eagle_topk: Optional[int] = None,
        **_ignored: Any,
    ) -> None:
        self.size = size = positive(size, "MambaPool(): size")
        self.device = device
        n = len(_layer_ids(mamba_layer_ids, "MambaPool()"))
        shape = cache_params.shape
        conv = [torch.zeros((n, size + 1) + tuple(c), dtype=cache_params.dtype.conv, device=device) for c in shape.conv]
        temporal = torch.zeros((n, size + 1) + tuple(shape.temporal), dtype=cache_params.dtype.temporal, device=device)
        self.mamba_cache = MambaPool.State(conv, temporal)
        self.replayssm_write_pos = None
        self._ops = _StateOps(conv, temporal)
        self.slot_bytes = sum(c[:, 0].numel() * c.element_size() for c in conv) + temporal[:, 0].numel() * temporal.element_size()
        self.bytes_copied = 0
        self.bytes_cleared = 0

    def mamba2_layer_cache(self, layer_id: int) -> "MambaPool.State":
        return self.mamba_cache.at_layer_idx(layer_id)

    def clear_slots(self, indices: torch.Tensor) -> None:
        """Zero the states at `indices` (run on the forward stream)."""
        index_tensor(indices, "indices")
        idx = indices.reshape(-1).to(torch.int64)
        self._ops.clear(idx)
        self.bytes_cleared += int(idx.numel()) * self.slot_bytes

    def copy_from(self, src_indices: torch.Tensor, dst_indices: torch.Tensor) -> None:
        """Copy whole states src -> dst (conv and temporal, every layer)."""
        index_tensor(src_indices, "src_indices")
        index_tensor(dst_indices, "dst_indices")
        src = src_indices.reshape(-1).to(torch.int64)
        dst = dst_indices.reshape(-1).to(torch.int64)
        if src.numel() != dst.numel():
            raise ValueError("copy_from(): src_indices and dst_indices differ in length")
        self._ops.copy(src, dst)
        self.bytes_copied += int(src.numel()) * self.slot_bytes

    def get_cpu_copy(self, indices: torch.Tensor) -> tuple:
        return [c[:, indices].cpu() for c in self.mamba_cache.conv], self.mamba_cache.temporal[:, indices].cpu()

    def load_cpu_copy(self, mamba_cache_cpu: tuple, indices: torch.Tensor) -> None:
        conv_cpu, temporal_cpu = mamba_cache_cpu
        for c, src in zip(self.mamba_cache.conv, conv_cpu):
            c[:, indices] = src.to(c.device)
        self.mamba_cache.temporal[:, indices] = temporal_cpu.to(self.mamba_cache.temporal.device)


# ---------------------------------------------------------------------------
# Request pools


def _table_write(indices: Any, values: Any) -> None:
    """ReqToTokenPool.write's arguments beyond its C fast path, before
    torch's assignment: what it stores must be KV indices, integers (a
    float would be truncated, a bool taken as 0 / 1), and a bool is no row
    (torch would read it as a mask over every row), nor is None (a new
    axis: the whole table); TypeError otherwise."""
    for i in indices if type(indices) is tuple else (indices,):
        if i is None or isinstance(i, (bool, np.bool_)):
            raise TypeError(f"write(): indices must not hold {i!r} (torch would write every row)")
    if isinstance(values, torch.Tensor):
        index_tensor(values, "write(): values", ndim=None)   # torch broadcasts any shape
    elif isinstance(values, np.ndarray):
        if values.dtype.kind not in "iu":
            raise TypeError(f"write(): values must hold integers, not {values.dtype}")
    elif isinstance(values, (bool, np.bool_, float, np.floating)):
        raise TypeError(f"write(): values must be integers, not {type(values).__name__}")


class ReqToTokenPool:
    """Request rows 1..size (row 0 is the padding row) and the table of
    their KV indices, int32 [size + 1, max_context_len].

    On CPU `req_to_token` is a zero-copy view of the C table.  On another
    device it is a device tensor (the mirror): `write()` updates both, and
    sync_device() copies the ranges the C side changed since the last call.
    """

    enable_mamba_extra_buffer_lazy = False

    def __init__(self, size: int, max_context_len: int, device: Any, enable_memory_saver: bool = False, *, _pp: int = 1) -> None:
        call = f"{type(self).__name__}()"
        self.size = positive(size, f"{call}: size")
        self.max_context_len = positive(max_context_len, f"{call}: max_context_len")
        self.device = device
        self._rp = _C.ReqPool(self.size, self.max_context_len, _pp)
        self._host = torch.from_numpy(self._rp.table)
        # on CPU req_to_token is the C table itself (decided once: the
        # per-request calls test this flag, not the device)
        self._on_host = _is_cpu(device)
        self.req_to_token = self._host if self._on_host else self._host.to(device)

    def sync_device(self) -> None:
        """Copy the host rows the C lifecycle changed to the device mirror."""
        if self._on_host:  # the table is the C one: nothing to copy
            return
        rows, starts, ends = self._rp.take_dirty()
        if rows.size == 0:
            return
        table = self._rp.table
        write = getattr(_C, "write_req_to_token", None)
        if write is not None:  # one ragged launch
            values = np.concatenate([table[r, a:b] for r, a, b in zip(rows, starts, ends)])
            write(self.req_to_token, rows, starts, values, ends=ends, stream=_stream_of(self.req_to_token))
            return
        for r, a, b in zip(rows.tolist(), starts.tolist(), ends.tolist()):
            self.req_to_token[r, a:b].copy_(self._host[r, a:b], non_blocking=True)

    def write(self, indices: Any, values: Any) -> None:
        """req_to_token[indices] = values (SGLang's write; int32/int64 numpy
        arrays are taken as the tensors over them).  On CPU a (row, slice)
        index with int32/int64 values (a CPU tensor, a numpy array of at
        most one dimension, an int) goes straight into the C table,
        checked there (IndexError for a row out of the table, RuntimeError
        for a length that is not the slice's, OverflowError for a value an
        int32 table cannot hold; nothing written then); any other case is
        torch's own assignment."""
        if self._on_host:
            v = values
            if type(v) is torch.Tensor:
                try:  # a CPU tensor's numpy view (a device tensor raises)
                    v = v.numpy()
                except (TypeError, RuntimeError):
                    v = None
            if not self._rp.write_index(indices, v):
                _table_write(indices, values)
                if type(values) is np.ndarray and values.dtype in _NP_INDEX_TYPES:  # read as the fast path reads it
                    values = torch.from_numpy(np.ascontiguousarray(values))
                self._host[indices] = values
            return
        _table_write(indices, values)
        self.req_to_token[indices] = values
        if isinstance(values, torch.Tensor):
            values = values.cpu()
        if isinstance(indices, tuple):
            indices = tuple(i.cpu() if isinstance(i, torch.Tensor) else i for i in indices)
        elif isinstance(indices, torch.Tensor):
            indices = indices.cpu()
        self._host[indices] = values

    def available_size(self) -> int:
        return self._rp.available_size()

    def alloc(self, reqs: List[Req]) -> Optional[List[int]]:
        try:
            need = sum(1 for r in reqs if r.req_pool_idx is None)
        except (AttributeError, TypeError):
            raise _reqs_error("alloc", reqs) from None
        _distinct(reqs, "alloc")
        if need > self._rp.available_size():
            return None
        rows = self._rp.alloc(need).tolist()
        it = iter(rows)
        for r in reqs:
            if r.req_pool_idx is None:
                r.req_pool_idx = next(it)
        return [r.req_pool_idx for r in reqs]

    def free(self, req: Req) -> None:
        _req_arg(req, "free")
        if req.req_pool_idx is None:
            raise ValueError(f"free(): request {getattr(req, 'rid', req)!r} holds no request row (double free?)")
        self._rp.free(int(req.req_pool_idx))
        req.req_pool_idx = None

    def clear(self) -> None:
        self._rp.clear()

    def check(self) -> None:
        self._rp.check()


def _req_arg(req: Any, call: str) -> None:
    """req must be a request: our Req, or an object with SGLang's Req fields."""
    if type(req) is not Req and not hasattr(req, "req_pool_idx"):
        raise TypeError(f"{call}(): req must be a Req, not {type(req).__name__}")


def _reqs_error(call: str, reqs: Any) -> TypeError:
    """The TypeError for a batch that is not a list of requests."""
    try:
        items = list(reqs)
    except TypeError:
        return TypeError(f"{call}(): reqs must be a list of Req, not {type(reqs).__name__}")
    for i, r in enumerate(items):
        if not hasattr(r, "req_pool_idx"):
            return TypeError(f"{call}(): reqs[{i}] must be a Req, not {type(r).__name__}")
    return TypeError(f"{call}(): reqs must be a list of Req")


def _distinct(reqs: List[Any], call: str) -> None:
    """ValueError naming a request listed twice in a batch (it would take
    two rows and keep one: the other held by nobody)."""
    first: dict = {}
    for i, r in enumerate(reqs):
        j = first.setdefault(id(r), i)
        if j != i:
            raise ValueError(f"{call}(): reqs[{i}] is reqs[{j}] (a request listed twice)")


def _fields_of(req: Any) -> tuple:
    """The 13-tuple of a request object that is not ours (SGLang's Req: its
    fields are tensors and ints); ours keep a ReqState."""
    buf = req.mamba_ping_pong_track_buffer
    if buf is not None:
        b = buf.tolist()
        t0 = int(b[0])
        t1 = int(b[1]) if len(b) > 1 else -1
    else:
        t0 = t1 = -1
    nxt = req.mamba_next_track_idx
    return (
        int(req.mamba_pool_idx) if req.mamba_pool_idx is not None else -1,
        t0,
        t1,
        -1 if nxt is None or buf is None else int(nxt),
        -1 if req.mamba_last_track_seqlen is None else int(req.mamba_last_track_seqlen),
        -1 if req.mamba_branching_seqlen is None else int(req.mamba_branching_seqlen),
        int(req.mamba_cow_src_index) if req.mamba_cow_src_index is not None else -1,
        1 if req.mamba_needs_clear else 0,
        1 if req.mamba_lazy_is_insert else 0,
        int(req.cache_protected_len or 0),
        -1,
        0,
        0,
    )


def _owns_record(req: Any) -> bool:
    return type(getattr(req, "_rs", None)) is _C.ReqState


def _rs_of(req: Any, *, with_node: bool = False, cache: Any = None) -> Any:
    """The request's record for a C lifecycle call.  Ours is the request's
    own ReqState (the call updates it in place; nothing is packed); another
    request type gets a temporary one built from its fields, which
    _apply_rs writes back.  with_node: last_node's handle and lock too."""
    if with_node and cache is not None:
        _check_last_node(req, cache)
    rs = req._rs if _owns_record(req) else _C.ReqState(_fields_of(req))
    if with_node:
        node = req.last_node if cache is not None else None
        if node is None:
            rs.node_id = -1
        else:
            rs.node_id, rs.node_gen, rs.locked = node._id, node._gen, 1
    return rs


def _check_last_node(req: Any, cache: Any) -> None:
    """req.last_node is None or a node of `cache` (SGLang's own node, or
    another cache's, names nothing there): else TypeError naming it."""
    node = req.last_node
    if node is not None and (getattr(node, "_cache", None) is not cache or not hasattr(node, "_gen")):
        where = "of another cache" if hasattr(node, "_cache") else f"not {type(node).__name__}"
        raise TypeError(f"req.last_node of request {getattr(req, 'rid', None)!r} must be a TreeNode of this "
                        f"cache, {where}")


def _apply_record(req: Any, rs: Any, ix: SlotIndex) -> None:
    """After a C call on the request's record: ours was updated in place
    (its fields read the record; bind them to the pool's index tensors);
    another request type gets its fields written back."""
    if rs is getattr(req, "_rs", None):
        req._ix = ix
    else:
        _apply_fields(req, rs, ix)


def _apply_fields(req: Any, rs: Any, ix: SlotIndex) -> None:
    """Writes a temporary record back into a request object that is not
    ours (only the fields that changed, so tensors the scheduler holds stay
    put)."""
    old = _fields_of(req)
    if rs.running != old[0]:
        req.mamba_pool_idx = None if rs.running < 0 else ix.slot(rs.running)
    if (rs.track0, rs.track1, rs.next_track) != old[1:4]:
        if rs.next_track < 0:
            req.mamba_ping_pong_track_buffer = None
            req.mamba_next_track_idx = None
        else:
            req.mamba_ping_pong_track_buffer = ix.buffer(rs, ix.pp)
            req.mamba_next_track_idx = rs.next_track
    if rs.last_track_seqlen != old[4]:
        req.mamba_last_track_seqlen = None if rs.last_track_seqlen < 0 else rs.last_track_seqlen
    if rs.cow_src != old[6]:
        req.mamba_cow_src_index = None if rs.cow_src < 0 else ix.slot1(rs.cow_src)
    req.mamba_needs_clear = bool(rs.needs_clear)
    req.mamba_lazy_is_insert = bool(rs.lazy_is_insert)


class HybridReqToTokenPool(ReqToTokenPool):
    """ReqToTokenPool plus the recurrent-state side: the state tensors
    (mamba_pool), the slot allocator (mamba_allocator), each request's
    running slot and ping-pong track buffer, and the row -> slot maps."""

    def __init__(
        self,
        *,
        size: int,
        mamba_size: int,
        mamba_spec_state_size: int = 0,
        max_context_len: int,
        device: Any,
        enable_memory_saver: bool = False,
        cache_params: Mamba2CacheParams,
        mamba_layer_ids: Sequence[int],
        enable_mamba_extra_buffer: bool,
        enable_mamba_extra_buffer_lazy: bool = False,
        speculative_num_draft_tokens: Optional[int] = None,
        speculative_eagle_topk: Optional[int] = None,
        enable_overlap_schedule: bool = True,
        start_layer: Optional[int] = None,
        mamba_cache_chunk_size: Optional[int] = None,
        mamba_track_interval: int = 256,
        **_ignored: Any,
    ) -> None:
        # every argument checked before anything is allocated (size and
        # max_context_len by ReqToTokenPool, before its table)
        mamba_size = positive(mamba_size, "HybridReqToTokenPool(): mamba_size")
        mamba_layer_ids = _layer_ids(mamba_layer_ids, "HybridReqToTokenPool()")
        pp = 2 if enable_overlap_schedule else 1
        super().__init__(size, max_context_len, device, enable_memory_saver, _pp=pp)
        if enable_mamba_extra_buffer_lazy and pp != 2:
            raise ValueError("enable_mamba_extra_buffer_lazy needs the overlap schedule (track buffer of 2)")
        self.mamba_ping_pong_track_buffer_size = pp
        self.enable_mamba_extra_buffer = bool(enable_mamba_extra_buffer)
        self.enable_mamba_extra_buffer_lazy = bool(enable_mamba_extra_buffer_lazy)
        self.enable_memory_saver = enable_memory_saver
        self.start_layer = start_layer or 0
        self.mamba_cache_chunk_size = mamba_cache_chunk_size
        self.mamba_track_interval = mamba_track_interval
        self.mamba_pool = MambaPool(
            size=mamba_size,
            spec_state_size=mamba_spec_state_size,
            cache_params=cache_params,
            mamba_layer_ids=mamba_layer_ids,
            device=device,
            speculative_num_draft_tokens=speculative_num_draft_tokens,
        )
        self.mamba_allocator = MambaSlotAllocator(size=mamba_size, device=device)
        self.mamba_map = {lid: i for i, lid in enumerate(mamba_layer_ids)}
        self.mamba_ckpt_pool = None
        self.req_index_to_mamba_index_mapping = torch.from_numpy(self._rp.state_map)
        self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.from_numpy(self._rp.track_map)
        if not self._on_host:
            self.req_index_to_mamba_index_mapping = self.req_index_to_mamba_index_mapping.to(device)
            self.req_index_to_mamba_ping_pong_track_buffer_mapping = (
                self.req_index_to_mamba_ping_pong_track_buffer_mapping.to(device)
            )
        # index tensors made once on the device; requests' fields are views
        # (a request's ping-pong buffer: its row of the track map)
        self._ix = SlotIndex(mamba_size, device, pp, self.req_index_to_mamba_ping_pong_track_buffer_mapping)
        self.mamba_allocator._ix = self._ix
        # Admission runs in C; until a MambaRadixCache binds its own
        # lifecycle, the pool uses one over a one-unit KV allocator (admission
        # takes no KV).
        self._lc = _C.Lifecycle(
            self.mamba_allocator._slots,
            _C.SlotAllocator(1),
            self._rp,
            extra_buffer=self.enable_mamba_extra_buffer,
            lazy=self.enable_mamba_extra_buffer_lazy,
            track_buffer_size=pp,
            track_interval=mamba_track_interval,
        )

    # -- request state <-> tensors -----------------------------------------

    def _slot(self, v: int) -> torch.Tensor:
        """The 0-d int64 tensor of slot v: a view of the index tensor."""
        return self._ix.slot(v)

    def _slot1(self, v: int) -> torch.Tensor:
        """The shape-(1,) int64 tensor of slot v: a view likewise."""
        return self._ix.slot1(v)

    def _apply_rs(self, req: Any, rs: Any, old: Any = None) -> None:
        _apply_record(req, rs, self._ix)

    def _sync_maps_to_device(self, rows: Sequence[int]) -> None:
        """Copies the maps' rows from the C pool to the device mirror, queued
        on the stream (host arrays in, no read back)."""
        if self._on_host or not rows:
            return
        idx = np.asarray(rows, dtype=np.int64)
        d = _to_device(idx, self.device)
        self.req_index_to_mamba_index_mapping[d] = _to_device(self._rp.state_map[idx], self.device)
        self.req_index_to_mamba_ping_pong_track_buffer_mapping[d] = _to_device(self._rp.track_map[idx], self.device)

    # -- SGLang API -----------------------------------------------------------

    def alloc(self, reqs: List[Req]) -> Optional[List[int]]:
        """Rows for the requests without one, a running slot for those
        without one (mamba_needs_clear) and, with extra_buffer, track
        buffers.  None when rows are short; RuntimeError when state slots
        are short (nothing is taken either way).

        The state headroom of SGLang's ``alloc_req_slots`` is taken here too
        (the C lifecycle evicts cached states when fewer than ``len(reqs) *
        3`` slots, lazy 2, are free): SGLang's scheduler skips it for a pool
        that is not its own class, and after it has run there is nothing
        left to evict, so the drop-in behaves as SGLang's pools do under
        either."""
        try:
            need = sum(1 for r in reqs if r.req_pool_idx is None)
        except (AttributeError, TypeError):
            raise _reqs_error("alloc", reqs) from None
        rows = [-1 if r.req_pool_idx is None else int(r.req_pool_idx) for r in reqs]
        olds = [_rs_of(r) for r in reqs]
        try:
            got = self._lc.admit(rows, olds, headroom=True)
        except ValueError:
            _distinct(reqs, "alloc")   # the C call's message names its own argument
            raise
        if got is None and need > self._rp.available_size():
            return None
        if got is None:
            raise RuntimeError(
                "Not enough space for mamba cache: "
                f"{self.mamba_allocator.available_size()} free state slots for {len(reqs)} requests; "
                "increase the number of state slots (--max-mamba-cache-size)"
            )
        new_rows, new_rs = got
        for r, row, rs in zip(reqs, new_rows, new_rs):
            r.req_pool_idx = row
            self._apply_rs(r, rs)
        self._sync_maps_to_device(new_rows)
        return list(new_rows)

    def free(self, req: Req) -> None:
        """Return the request's row (its state slots are not touched)."""
        super().free(req)

    def get_mamba_indices(self, req_indices: torch.Tensor) -> torch.Tensor:
        index_tensor(req_indices, "req_indices")
        return self.req_index_to_mamba_index_mapping[req_indices]

    def translate_mamba_indices(self, mamba_indices: torch.Tensor) -> torch.Tensor:
        return mamba_indices

    def mamba2_layer_cache(self, layer_id: int) -> MambaPool.State:
        if type(layer_id) is not int:
            layer_id = integer(layer_id, "layer_id")   # a bool or a float is no layer id
        if layer_id not in self.mamba_map:
            raise ValueError(f"layer_id={layer_id} is not a recurrent layer: {sorted(self.mamba_map)}")
        return self.mamba_pool.mamba2_layer_cache(self.mamba_map[layer_id])

    def get_mamba_ping_pong_other_idx(self, mamba_next_track_idx: int) -> int:
        if type(mamba_next_track_idx) is not int:
            mamba_next_track_idx = integer(mamba_next_track_idx, "mamba_next_track_idx")
        return _C.ping_pong_other(mamba_next_track_idx, self.mamba_ping_pong_track_buffer_size)

    def get_mamba_ping_pong_keep_idx(self, req: Req) -> int:
        """Index of the track slot holding the newest snapshot."""
        _req_arg(req, "get_mamba_ping_pong_keep_idx")
        return _C.keep_index(req.mamba_next_track_idx, self.mamba_ping_pong_track_buffer_size,
                             self.enable_mamba_extra_buffer_lazy)

    def set_mamba_ping_pong_slot(self, req: Req, idx: int, value: Any) -> None:
        """track[idx] = value (a slot, or -1), in the request's buffer and
        its row of the track map.  For our requests the value is read on the
        host (an int, or a slot this pool's allocator handed out: no device
        read) and written once, into the record: a record in its row is that
        row of the track map."""
        _req_arg(req, "set_mamba_ping_pong_slot")
        pp = self.mamba_ping_pong_track_buffer_size
        if type(idx) is not int or not 0 <= idx < pp:
            idx = integer(idx, "idx")
            if not 0 <= idx < pp:
                raise ValueError(f"idx must be in [0, {pp - 1}], not {idx}")
        if _owns_record(req):
            v = self._ix.host_value(value)
            if v < -1:
                raise ValueError(f"value must be a state slot or -1, not {v}")
            row = int(req.req_pool_idx)
            if v >= 1:  # a slot the caller took for the request is the request's now
                self.mamba_allocator._slots.transfer(np.array([v], dtype=np.int64), row)
            rs = req._rs
            if idx == 0:
                rs.track0 = v
            else:
                rs.track1 = v
            if rs.row != row:  # a record outside the row: the row's map as well
                self._rp.track_map[row, idx] = v
            self._sync_maps_to_device([row])
            return
        if type(value) is not int and not isinstance(value, np.integer):   # torch would truncate a float
            index_tensor(value, "value", ndim=None)
        req.mamba_ping_pong_track_buffer[idx] = value
        self.req_index_to_mamba_ping_pong_track_buffer_mapping[req.req_pool_idx] = req.mamba_ping_pong_track_buffer

    def donate_mamba_ping_pong_slot(self, req: Req, new_slot: torch.Tensor) -> torch.Tensor:
        """Hand the newest snapshot slot over (returned, shape [1]) and put
        new_slot in its place.  For our requests the slot comes from the
        record (no device read) and is returned as a view of the pool's
        index tensor."""
        _req_arg(req, "donate_mamba_ping_pong_slot")
        k = self.get_mamba_ping_pong_keep_idx(req)
        if _owns_record(req):
            v = req._rs.track1 if k else req._rs.track0
            donated = None if v == -1 else self._ix.slot1(v)
        else:
            donated = req.mamba_ping_pong_track_buffer[k].reshape(1).clone()
            if int(donated[0]) == -1:
                donated = None
        if donated is None:
            raise OwnershipError(f"request {req.rid!r}: the track slot to donate is empty (donated already?)")
        if type(new_slot) is not torch.Tensor or new_slot._base is not self._ix.ids:
            index_tensor(new_slot, "new_slot")
            if new_slot.numel() != 1:
                raise ValueError(f"new_slot must hold one state slot, not {new_slot.numel()}")
        self.set_mamba_ping_pong_slot(req, k, new_slot.reshape(-1)[0])
        return donated

    def free_mamba_cache(self, req: Req, mamba_ping_pong_track_buffer_to_keep: Optional[int] = None) -> None:
        """Free the running slot and the track slots except
        track[keep]; OwnershipError when the request holds no running slot
        (a double free) or a slot is not the request's."""
        _req_arg(req, "free_mamba_cache")
        keep = mamba_ping_pong_track_buffer_to_keep
        if keep is not None:
            if keep not in (0, 1) or type(keep) is not int:
                raise ValueError(f"mamba_ping_pong_track_buffer_to_keep must be 0 or 1, not {keep!r}")
            if self.mamba_ping_pong_track_buffer_size == 1 and keep != 0:
                raise ValueError("mamba_ping_pong_track_buffer_to_keep must be 0 with a track buffer of 1")
        if req.mamba_pool_idx is None:
            raise OwnershipError(f"free_mamba_cache(): request {req.rid!r} holds no state slot (double free?)")
        self._lc.free_states(_rs_of(req), keep=-1 if keep is None else keep)
        if req.req_pool_idx is not None and _owns_record(req):  # its track map row changed
            self._sync_maps_to_device([int(req.req_pool_idx)])
        req.mamba_pool_idx = None
        if self.enable_mamba_extra_buffer:
            req.mamba_ping_pong_track_buffer = None
            req.mamba_next_track_idx = None

    def clear(self) -> None:
        super().clear()
        self.mamba_allocator.clear()
        if not self._on_host:
            self.req_index_to_mamba_index_mapping.zero_()
            self.req_index_to_mamba_ping_pong_track_buffer_mapping.zero_()
