"""Type stubs of mambaradix's tensor API (native, in mambaradix._C).

Conventions
-----------
* Tensors come in through DLPack (``__dlpack__``/``__dlpack_device__``):
  torch, CuPy, JAX, numpy, or a DLPack capsule.  They must be compact
  row-major (strides of extent-1 dimensions are ignored) on the CPU or a
  CUDA device; state tensors must also be writable.
* Index arguments (slots, chunk indices, positions, rows) are int32/int64:
  host arrays (numpy, CPU tensors, Python ints/sequences) are checked on the
  host before anything runs; device tensors stay on the device (no sync) and
  entries out of range are skipped by the kernel.
* ``stream`` is a ``cudaStream_t`` as an int (``torch.cuda.current_stream()
  .cuda_stream``, ``cupy.cuda.Stream().ptr``); None is the legacy default
  stream.  Kernels are launched on it and never synchronise.  It is ignored
  for host tensors.
* Errors: TypeError (dtype), ValueError (shape, device, plan), IndexError
  (index out of range), BufferError (layout, read-only, DLPack version,
  consumed capsule), RuntimeError (CUDA tensor in a build without CUDA, or
  a CUDA error with CUDA's message).
"""

from typing import Any, Optional, Sequence, Tuple, Union

_Tensorish = Any  # any object with __dlpack__, or a DLPack capsule
_Index = Union[int, Sequence[int], Any]  # host sequence/array, or a device tensor
_DType = Union[str, Any]  # "bfloat16", "bf16", "float32", numpy/torch dtypes, numpy scalar types (np.float16)
_Device = Union[str, Tuple[int, int], Any]  # "cpu", "cuda", "cuda:N", torch.device

class Tensor:
    """A compact tensor owned by mambaradix: memory it allocated, or a
    producer's DLPack tensor it keeps alive (the producer's deleter runs
    exactly once, when this object is freed)."""

    @classmethod
    def from_dlpack(cls, obj: _Tensorish, /, *, stream: Optional[int] = None, writable: bool = False) -> "Tensor":
        """Import without a copy.  writable=True refuses read-only tensors."""
    @classmethod
    def zeros(cls, shape: Sequence[int], dtype: _DType, device: _Device = "cpu") -> "Tensor":
        """Allocate a zero-filled tensor (host memory or cudaMalloc)."""
    def __dlpack__(self, *, stream: Optional[int] = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
        """Export without a copy (versioned capsule when max_version >= (1, 0))."""
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> str:
        """'cpu' or 'cuda:N'."""
    @property
    def data_ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def owned(self) -> bool:
        """True when mambaradix allocated the memory."""

class StatePool:
    """SGLang's MambaPool: conv tensors and one temporal (SSM) tensor, each
    shaped [layers, slots + 1, ...] (slot 0 is the padding slot), on one
    device.  All kernels touch every tensor and every layer in one launch."""

    def __init__(self, conv: Sequence[_Tensorish], temporal: _Tensorish, *, stream: Optional[int] = None) -> None:
        """Adopt caller-allocated tensors through DLPack (no copy); the pool
        keeps them alive."""
    @classmethod
    def allocate(cls, layers: int, slots: int, conv_shapes: Sequence[Sequence[int]],
                 conv_dtypes: Union[_DType, Sequence[_DType]], temporal_shape: Sequence[int],
                 temporal_dtype: _DType, device: _Device = "cpu") -> "StatePool":
        """Allocate zero-filled tensors: conv[i] is [layers, slots + 1,
        *conv_shapes[i]], temporal is [layers, slots + 1, *temporal_shape]."""
    @property
    def conv(self) -> Tuple[Tensor, ...]: ...
    @property
    def temporal(self) -> Tensor: ...
    @property
    def num_slots(self) -> int:
        """Usable slots, 1..num_slots (rows per layer = num_slots + 1)."""
    @property
    def num_layers(self) -> int: ...
    @property
    def bytes_per_slot(self) -> int:
        """Bytes of one slot over all tensors and layers."""
    @property
    def device(self) -> str: ...
    def copy_slots(self, src: _Index, dst: _Index, /, *, stream: Optional[int] = None) -> None:
        """Slot src[i] -> slot dst[i], one launch.  Host plans are checked:
        indices in [0, num_slots], src[i] != dst[i], dst distinct and never
        a source."""
    def clear_slots(self, idx: _Index, /, *, stream: Optional[int] = None) -> None:
        """Zero slot idx[i], one launch."""
    def track_decode(self, running: _Index, track: _Index, mask: _Index, /, *,
                     stream: Optional[int] = None) -> None:
        """Copy running[i] -> track[i] where mask[i] (bool or integer).  With
        device tensors: one launch, no host sync, no allocation (CUDA-graph
        capturable; replays read the tensors' current values)."""
    def snapshot_ssm_from_h(self, layer: int, h: _Tensorish, chunk_indices: _Index, dst_slots: _Index, /, *,
                            stream: Optional[int] = None) -> None:
        """temporal[layer, dst_slots[i]] = h[chunk_indices[i]] with
        h = [..., num_chunks, *temporal_shape] (FLA's [B, NT, H, V, K] with
        state_v_first); bfloat16 <-> float32 converted (round to nearest even)."""
    def snapshot_conv_window(self, layer: int, x: _Tensorish, positions: _Index, dst_slots: _Index, /, *,
                             conv_index: int = 0, stream: Optional[int] = None) -> None:
        """conv[conv_index][layer, dst_slots[i], :, j] = x[clamp(positions[i]
        - (K-1) + j, 0, T-1), :] for j < K - 1; x is the layer's pre-conv
        input [T, dim], conv per slot [dim, K - 1] (SGLang's layout)."""

def write_req_to_token(table: _Tensorish, rows: _Index, starts: _Index, values: _Index, /, *,
                       ends: Optional[_Index] = None, stream: Optional[int] = None) -> None:
    """table[rows[i], starts[i]:ends[i]] = next values (ragged, values 1-D in
    row order); without ends, values is [n] or [n, w] and row i gets w
    values at starts[i].  table: int32/int64 [num_rows, max_context_len].
    Host values an int32 table cannot hold raise OverflowError (nothing is
    written); device index tensors are not checked (no host sync)."""
