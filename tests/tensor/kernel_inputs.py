"""What the forward pass does with the tracking inputs the scheduler hands it.

SGLang v0.5.15's hybrid linear-attention backend (``_init_track_ssm_indices``
and ``_init_track_conv_indices`` in ``hybrid_linear_attn_backend.py``) never
sees ``mamba_last_track_seqlen``: from ``track_seqlen`` and the extend's
prefix length it computes ``L = track_seqlen - prefix_len`` and copies

- when ``L`` is a multiple of the chunk size: the final state of the extend
  (``last_recurrent_state``, the state after ``prefix_len + extend_len``);
- otherwise the chunked kernel's intermediate ``h[L // C]``, the state after
  ``prefix_len + (L // C) * C`` tokens.

A stand-in forward that snapshots there (and not at the length the decision
code says it meant) lets a test see a wrong ``track_seqlen``.
"""

from __future__ import annotations


def tracked_length(prefix_len: int, extend_len: int, track_seqlen: int, chunk: int) -> int:
    """The sequence length whose state the forward writes to the track slot.
    AssertionError when the inputs point outside this request's ``h`` (the
    chunked kernel keeps ``(extend_len - 1) // chunk + 1`` of them): the
    backend would read another request's state."""
    L = track_seqlen - prefix_len
    if L % chunk == 0:
        return prefix_len + extend_len
    k = L // chunk
    assert 0 <= k < (extend_len - 1) // chunk + 1, (
        "track_seqlen %d after prefix %d points at h[%d]; the extend of %d tokens has %d"
        % (track_seqlen, prefix_len, k, extend_len, (extend_len - 1) // chunk + 1))
    return prefix_len + k * chunk
