"""A toy recurrent model whose states can be recomputed exactly.

The reference driver and the simulator use it to check, bit for bit, that a
state restored from the prefix cache is the state of the matched prefix.

Per layer ``l`` and state element ``d`` the model keeps

- a convolution window: the mapped values of the last ``K-1`` tokens
  (``K = conv_width``), zero before the sequence starts;
- a scalar recurrence over the prime field ``P = 2**31 - 1``::

      x_i = sum_k W[l, d, k] * v(token_{i-k})          (mod P), k = 0..K-1
      s_i = A[l, d] * s_{i-1} + x_i                     (mod P), s_0 = 0

  where ``v(t) = (t * 2654435761 + 12345) mod P`` maps token ids into the field.

All arithmetic is exact int64 (every product of two field elements is below
2**62), so the state after any prefix is a pure function of that prefix.

Two implementations live here on purpose:

- :meth:`ToyRecurrentModel.advance` (and :meth:`states_along`) evaluate a whole
  segment at once with numpy, using ``s_j = A^j (s_0 + sum_i x_i A^-i)``;
- :meth:`ToyRecurrentModel.reference_state` is a plain token-by-token loop over
  Python integers, independent of the vectorised formula, used by tests as the
  from-scratch oracle.

States live in the two tensors of a state pool, indexed ``[layer, slot, ...]``
like SGLang's ``MambaPool``: ``conv`` holds the window (``[L, S+1, K-1]``) and
``temporal`` holds ``s`` (``[L, S+1, D]``).  Both must be int64 or float64 (all
stored values are below 2**31, so float64 is exact).  torch is imported only
when tensors are torch tensors; numpy arrays work as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

import numpy as np

P: int = (1 << 31) - 1
"""The prime modulus of the recurrence."""

_MUL: int = 2654435761
_ADD: int = 12345


def token_values(tokens: Any) -> np.ndarray:
    """Map token ids into the field: ``v(t) = (t * 2654435761 + 12345) mod P``."""
    t = np.asarray(tokens, dtype=np.int64) % P
    return (t * (_MUL % P) + _ADD) % P


def _pow_table(base: np.ndarray, n: int) -> np.ndarray:
    """``base ** i mod P`` for ``i = 0..n-1``; base has shape ``[L, D]``;
    result ``[L, D, n]``.  Built by doubling, O(n) vectorised work."""
    L, D = base.shape
    out = np.empty((L, D, max(n, 1)), dtype=np.int64)
    out[:, :, 0] = 1
    m = 1
    step = base.astype(np.int64) % P  # base ** m for the current m
    while m < n:
        k = min(m, n - m)
        out[:, :, m:m + k] = (out[:, :, :k] * step[:, :, None]) % P
        step = (step * step) % P
        m *= 2
    return out[:, :, :n]


@dataclass(frozen=True)
class ToyState:
    """One state: ``conv`` window ``[K-1]`` (int64) and ``temporal`` ``[L, D]``."""

    conv: np.ndarray
    temporal: np.ndarray

    def equals(self, other: "ToyState") -> bool:
        return bool(np.array_equal(self.conv, other.conv)
                    and np.array_equal(self.temporal, other.temporal))


class ToyRecurrentModel:
    """The toy model's parameters and its forward pass on pool slots.

    num_layers: layers L (each with its own coefficients).
    state_dim: state elements D per layer.
    conv_width: K, the convolution width (window of K-1 past tokens, K >= 1).
    seed: picks the coefficients.
    """

    def __init__(self, num_layers: int = 2, state_dim: int = 4, conv_width: int = 4,
                 seed: int = 0) -> None:
        for name, val, lo in (("num_layers", num_layers, 1), ("state_dim", state_dim, 1),
                              ("conv_width", conv_width, 1)):
            if not isinstance(val, (int, np.integer)) or val < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {val!r}")
        self.num_layers = int(num_layers)
        self.state_dim = int(state_dim)
        self.conv_width = int(conv_width)
        rng = np.random.default_rng(seed)
        L, D, K = self.num_layers, self.state_dim, self.conv_width
        self.A = rng.integers(2, P - 1, size=(L, D), dtype=np.int64)
        self.W = rng.integers(1, P - 1, size=(L, D, K), dtype=np.int64)
        # A^-1 by Fermat's little theorem.
        self.A_inv = np.array([[pow(int(a), P - 2, P) for a in row] for row in self.A],
                              dtype=np.int64)
        self._pow: np.ndarray = _pow_table(self.A, 1)
        self._pow_inv: np.ndarray = _pow_table(self.A_inv, 1)
        self._conv: Any = None
        self._temporal: Any = None
        self._conv_np: Optional[np.ndarray] = None
        self._temporal_np: Optional[np.ndarray] = None

    # ------------------------------------------------------------------ shapes
    @property
    def conv_shape(self) -> tuple[int, ...]:
        """Per-layer, per-slot shape of the conv tensor: ``(K-1,)``."""
        return (self.conv_width - 1,)

    @property
    def temporal_shape(self) -> tuple[int, ...]:
        """Per-layer, per-slot shape of the temporal tensor: ``(D,)``."""
        return (self.state_dim,)

    def bytes_per_slot(self) -> int:
        """Bytes of one slot in int64 storage (all layers)."""
        return 8 * self.num_layers * (self.conv_width - 1 + self.state_dim)

    # ------------------------------------------------------------- storage
    def bind(self, conv: Any, temporal: Any) -> None:
        """Use ``conv`` ``[L, S+1, K-1]`` and ``temporal`` ``[L, S+1, D]`` (numpy
        arrays or CPU torch tensors, int64 or float64) as the state storage."""
        L = self.num_layers
        for name, t, tail in (("conv", conv, self.conv_shape),
                              ("temporal", temporal, self.temporal_shape)):
            shape = tuple(t.shape)
            if len(shape) != 2 + len(tail) or shape[0] != L or shape[2:] != tail:
                raise ValueError(f"{name} must have shape [{L}, slots+1, "
                                 f"{', '.join(map(str, tail))}], got {list(shape)}")
            dt = str(t.dtype)
            if "int64" not in dt and "float64" not in dt:
                raise ValueError(f"{name} must be int64 or float64 to hold exact "
                                 f"states, got {dt}")
        self._conv, self._temporal = conv, temporal
        self._conv_np = self._as_numpy(conv)
        self._temporal_np = self._as_numpy(temporal)

    def bind_pool(self, pool: Any) -> None:
        """Bind to a state pool object: SGLang's ``MambaPool`` layout
        (``pool.mamba_cache.conv[0]`` / ``.temporal``) or any object with
        ``conv`` (tensor or list of tensors) and ``temporal`` attributes."""
        cache = getattr(pool, "mamba_cache", pool)
        conv = getattr(cache, "conv", None)
        temporal = getattr(cache, "temporal", None)
        if conv is None or temporal is None:
            raise ValueError("pool has no conv/temporal state tensors")
        if isinstance(conv, (list, tuple)):
            conv = conv[0]
        self.bind(conv, temporal)

    @staticmethod
    def _as_numpy(t: Any) -> Optional[np.ndarray]:
        if isinstance(t, np.ndarray):
            return t
        try:
            if t.device.type == "cpu":
                return t.numpy()  # shares memory with the tensor
        except (AttributeError, RuntimeError, TypeError):
            pass
        return None

    def _require_bound(self) -> None:
        if self._conv is None:
            raise RuntimeError("ToyRecurrentModel: call bind()/bind_pool() first")

    def read_state(self, slot: int) -> ToyState:
        """The state stored in pool slot ``slot``."""
        self._require_bound()
        slot = int(slot)
        if self._conv_np is not None and self._temporal_np is not None:
            conv = self._conv_np[0, slot].astype(np.int64)
            temporal = self._temporal_np[:, slot].astype(np.int64)
        else:
            conv = self._conv[0, slot].cpu().numpy().astype(np.int64)
            temporal = self._temporal[:, slot].cpu().numpy().astype(np.int64)
        return ToyState(conv.copy(), temporal.copy())

    def write_state(self, slot: int, state: ToyState) -> None:
        """Store ``state`` into pool slot ``slot`` (every layer's conv window)."""
        self._require_bound()
        slot = int(slot)
        if self._conv_np is not None and self._temporal_np is not None:
            self._conv_np[:, slot] = state.conv[None, :]
            self._temporal_np[:, slot] = state.temporal
        else:
            import torch

            self._conv[:, slot] = torch.as_tensor(
                np.broadcast_to(state.conv, (self.num_layers, len(state.conv))).copy(),
                dtype=self._conv.dtype, device=self._conv.device)
            self._temporal[:, slot] = torch.as_tensor(
                state.temporal, dtype=self._temporal.dtype, device=self._temporal.device)

    # ------------------------------------------------------------- math
    def _ensure_pow(self, n: int) -> None:
        if self._pow.shape[2] < n:
            size = max(n, 2 * self._pow.shape[2], 256)
            self._pow = _pow_table(self.A, size)
            self._pow_inv = _pow_table(self.A_inv, size)

    def zero_state(self) -> ToyState:
        return ToyState(np.zeros(self.conv_width - 1, dtype=np.int64),
                        np.zeros((self.num_layers, self.state_dim), dtype=np.int64))

    def states_along(self, state: ToyState, tokens: Any,
                     positions: Iterable[int]) -> list[ToyState]:
        """States after ``positions[i]`` tokens of ``tokens``, starting from
        ``state`` (vectorised).  Each position must be in ``[0, len(tokens)]``."""
        vals = token_values(tokens)
        n = int(vals.shape[0])
        pos = [int(p) for p in positions]
        for p in pos:
            if p < 0 or p > n:
                raise ValueError(f"position {p} outside [0, {n}]")
        K = self.conv_width
        ext = np.concatenate([state.conv.astype(np.int64), vals])
        out: list[ToyState] = []
        if n == 0 or not pos:
            return [ToyState(ext[len(ext) - (K - 1):].copy() if K > 1 else ext[:0].copy(),
                             state.temporal.copy()) for _ in pos]
        self._ensure_pow(n + 1)
        # x_i for i = 1..n (segment-relative), shape [L, D, n]
        x = np.zeros((self.num_layers, self.state_dim, n), dtype=np.int64)
        for k in range(K):
            seg = ext[K - 1 - k:K - 1 - k + n]
            x = (x + (self.W[:, :, k, None] * seg[None, None, :]) % P) % P
        y = (x * self._pow_inv[:, :, 1:n + 1]) % P
        cum = np.cumsum(y, axis=2) % P
        s0 = state.temporal.astype(np.int64) % P
        for p in pos:
            if p == 0:
                s = s0.copy()
            else:
                s = (((s0 + cum[:, :, p - 1]) % P) * self._pow[:, :, p]) % P
            conv = ext[p:p + K - 1].copy()
            out.append(ToyState(conv, s))
        return out

    def advance(self, slot: int, tokens: Any,
                snapshots: Sequence[tuple[int, int]] = ()) -> None:
        """Run the forward pass of one request over ``tokens`` on pool slot
        ``slot`` (its running state), and write the state after ``rel`` tokens of
        the segment into slot ``dst`` for each ``(rel, dst)`` in ``snapshots``
        (a track point of the prefill kernel: the state *at that position*)."""
        n = len(tokens)
        start = self.read_state(slot)
        positions = [n] + [int(r) for r, _ in snapshots]
        states = self.states_along(start, tokens, positions)
        for (_, dst), st in zip(snapshots, states[1:]):
            self.write_state(dst, st)
        self.write_state(slot, states[0])

    def decode(self, slots: Sequence[int], tokens: Sequence[int],
               track: Sequence[int] = ()) -> None:
        """One decode step for a batch: advance each running slot ``slots[b]``
        by one token ``tokens[b]``; where ``track[b] >= 0`` also copy the new
        state into slot ``track[b]`` (vectorised over the batch)."""
        self._require_bound()
        n = len(slots)
        if n == 0:
            return
        if len(tokens) != n or (len(track) and len(track) != n):
            raise ValueError("slots, tokens and track must have the same length")
        idx = np.asarray(slots, dtype=np.int64)
        if self._conv_np is None or self._temporal_np is None:
            for b in range(n):
                snaps = [(1, int(track[b]))] if len(track) and track[b] >= 0 else []
                self.advance(int(idx[b]), [tokens[b]], snaps)
            return
        K = self.conv_width
        window = self._conv_np[0][idx].astype(np.int64)          # [B, K-1]
        s = self._temporal_np[:, idx].astype(np.int64)            # [L, B, D]
        v = token_values(tokens)                                  # [B]
        hist = np.concatenate([v[:, None], window[:, ::-1]], axis=1)  # [B, K]
        x = np.zeros((self.num_layers, n, self.state_dim), dtype=np.int64)
        for k in range(K):
            x = (x + (self.W[:, None, :, k] * hist[None, :, k, None]) % P) % P
        s = (self.A[:, None, :] * s % P + x) % P
        new_window = np.concatenate([window[:, 1:], v[:, None]], axis=1) if K > 1 else window
        self._temporal_np[:, idx] = s
        self._conv_np[:, idx] = new_window[None, :, :]
        if len(track):
            t = np.asarray(track, dtype=np.int64)
            sel = t >= 0
            if sel.any():
                self._temporal_np[:, t[sel]] = s[:, sel]
                self._conv_np[:, t[sel]] = new_window[None, sel, :]

    def state_of(self, tokens: Any) -> ToyState:
        """State after ``tokens`` from the zero state (vectorised)."""
        return self.states_along(self.zero_state(), tokens, [len(tokens)])[0]

    def reference_state(self, tokens: Any) -> ToyState:
        """State after ``tokens`` from scratch, one token at a time over Python
        ints: the independent oracle for tests."""
        L, D, K = self.num_layers, self.state_dim, self.conv_width
        A = self.A.tolist()
        W = self.W.tolist()
        s = [[0] * D for _ in range(L)]
        window = [0] * (K - 1)  # oldest first
        for t in np.asarray(tokens, dtype=np.int64).tolist():
            v = ((t % P) * (_MUL % P) + _ADD) % P
            hist = [v] + window[::-1]  # hist[k] = v(token_{i-k})
            for l in range(L):
                for d in range(D):
                    x = 0
                    wl = W[l][d]
                    for k in range(K):
                        x += wl[k] * hist[k]
                    s[l][d] = (A[l][d] * s[l][d] + x) % P
            if K > 1:
                window = window[1:] + [v]
        return ToyState(np.array(window, dtype=np.int64),
                        np.array(s, dtype=np.int64))
