"""Realism check with flash-linear-attention's chunked gated delta rule.

Run FLA's chunk_gated_delta_rule over a sequence, take the per-chunk states
h it computes on the way (state before chunk t = after t * 64 tokens), copy
chunk-aligned snapshots into a StatePool with snapshot_ssm_from_h, resume
the recurrence from a snapshot, and compare with the uninterrupted run.

h has the activation dtype (bfloat16 here), so a snapshot is the fp32 state
rounded to bfloat16: resuming from it differs from the uninterrupted run by
that rounding (SGLang's prefill snapshots behave the same way).  The test
bounds that difference and also resumes from the exact fp32 state of a
prefix-only run, to show the rest of the difference is the rounding.

Set MR_REALISM_OUT=path.json to record the numbers.  Skipped without a GPU
or without the `fla` package (fla-core).
"""

import json
import os

import pytest

import mambaradix

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available() or mambaradix.cuda_device_count() == 0:
    pytest.skip("needs a CUDA device", allow_module_level=True)

# Use FLA's own Triton path (the one that computes h), not a registered
# alternative backend.
os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
fla_chunk = pytest.importorskip("fla.ops.gated_delta_rule.chunk")

CHUNK = 64


def _capture_h(monkeypatch):
    """Records the h tensor FLA's forward computes (it is not returned)."""
    seen = []
    orig = fla_chunk.chunk_gated_delta_rule_fwd_h

    def wrapper(*args, **kwargs):
        out = orig(*args, **kwargs)
        seen.append(out[0])
        return out

    monkeypatch.setattr(fla_chunk, "chunk_gated_delta_rule_fwd_h", wrapper)
    return seen


def _run(q, k, v, g, beta, initial_state=None):
    return fla_chunk.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=initial_state, output_final_state=True,
        use_qk_l2norm_in_kernel=True, state_v_first=True)


def _rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@torch.inference_mode()
def test_resume_from_snapshot_matches_uninterrupted_run(monkeypatch):
    seen = _capture_h(monkeypatch)
    torch.manual_seed(0)
    dev = "cuda"
    B, T, H, K, V = 1, 512, 4, 128, 128
    q = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device=dev, dtype=torch.float32)) * 0.1
    beta = torch.sigmoid(torch.randn(B, T, H, device=dev, dtype=torch.float32)).to(torch.bfloat16)

    o_full, ht_full = _run(q, k, v, g, beta)
    assert seen, "FLA did not call chunk_gated_delta_rule_fwd_h"
    h = seen[-1]
    nt = T // CHUNK
    assert tuple(h.shape) == (B, nt, H, V, K), h.shape  # [B, NT, HV, V, K] with state_v_first
    assert tuple(ht_full.shape) == (B, H, V, K)

    slots = 6
    conv = torch.zeros(1, slots + 1, 32, 3, device=dev, dtype=torch.bfloat16)
    temporal = torch.randn(1, slots + 1, H, V, K, device=dev, dtype=torch.float32)  # poisoned
    pool = mambaradix.StatePool([conv], temporal)
    chunks = [2, 5, 7]
    dst = [1, 4, 2]
    stream = torch.cuda.current_stream().cuda_stream
    pool.snapshot_ssm_from_h(0, h, torch.tensor(chunks, device=dev), torch.tensor(dst, device=dev),
                             stream=stream)
    torch.cuda.synchronize()
    for c, s in zip(chunks, dst):
        # Bit-exact: the snapshot is h[c] widened to fp32.
        assert torch.equal(temporal[0, s], h[0, c].float())

    results = {"B": B, "T": T, "H": H, "K": K, "V": V, "h_dtype": str(h.dtype), "pool_dtype": "float32",
               "points": []}
    for c, s in zip(chunks, dst):
        p = c * CHUNK
        # Exact fp32 state at p from a prefix-only run.
        _, ht_prefix = _run(q[:, :p], k[:, :p], v[:, :p], g[:, :p], beta[:, :p])
        snap = temporal[0, s].unsqueeze(0).clone()
        o_res, ht_res = _run(q[:, p:], k[:, p:], v[:, p:], g[:, p:], beta[:, p:], initial_state=snap)
        o_ex, ht_ex = _run(q[:, p:], k[:, p:], v[:, p:], g[:, p:], beta[:, p:], initial_state=ht_prefix.clone())
        point = {
            "position": p,
            "snapshot_vs_exact_state_max_abs": (snap - ht_prefix).abs().max().item(),
            "snapshot_vs_exact_state_rel": _rel(snap, ht_prefix),
            "resume_o_max_abs": (o_res.float() - o_full[:, p:].float()).abs().max().item(),
            "resume_o_rel": _rel(o_res, o_full[:, p:]),
            "resume_final_state_max_abs": (ht_res - ht_full).abs().max().item(),
            "resume_final_state_rel": _rel(ht_res, ht_full),
            "exact_resume_o_rel": _rel(o_ex, o_full[:, p:]),
            "exact_resume_final_state_rel": _rel(ht_ex, ht_full),
        }
        results["points"].append(point)
        # The snapshot is the state rounded to bfloat16: within bf16's
        # relative precision (2^-8) of the exact state, plus the kernel's
        # own run-to-run differences.
        assert point["snapshot_vs_exact_state_rel"] < 1e-2, point
        assert point["resume_o_rel"] < 3e-2, point
        assert point["resume_final_state_rel"] < 3e-2, point
        assert all(torch.isfinite(x).all() for x in (o_res, ht_res))

    print("FLA realism:", json.dumps(results, indent=1))
    out = os.environ.get("MR_REALISM_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)


@torch.inference_mode()
def test_conv_window_matches_sglang_gather_on_gpu():
    """The conv snapshot on a realistic layer shape (Qwen3-Next conv dim
    8192 at TP=1, K = 4), against SGLang's own gather expression."""
    torch.manual_seed(1)
    dev = "cuda"
    dim, km1, tokens, slots = 8192, 3, 700, 8
    conv = torch.randn(2, slots + 1, dim, km1, device=dev).to(torch.bfloat16)
    temporal = torch.zeros(2, slots + 1, 4, device=dev)
    pool = mambaradix.StatePool([conv], temporal)
    ref = conv.clone()
    x = torch.randn(tokens, dim, device=dev).to(torch.bfloat16)  # mixed_qkv [T, dim]
    # Two requests, query_start_loc [0, 300, 700]; snapshot at 256 and 300 + 384.
    pos = torch.tensor([256, 300 + 384], device=dev)
    dst = torch.tensor([3, 5], device=dev)
    pool.snapshot_conv_window(1, x, pos, dst, stream=torch.cuda.current_stream().cuda_stream)
    idx = (pos[:, None] - km1 + torch.arange(km1, device=dev)[None, :]).clamp(0, tokens - 1)
    ref[1, dst] = x.transpose(0, 1)[:, idx].permute(1, 0, 2)  # SGLang: mixed_qkv[:, idx].transpose(0, 1)
    torch.cuda.synchronize()
    assert torch.equal(conv.view(torch.int16), ref.view(torch.int16))
