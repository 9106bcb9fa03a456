"""Token ids outside int32 against SGLang 0.5.23's own Python TreeCore.

SGLang 0.5.23 pads a multimodal item's positions with 62-bit sentinels
(schedule_batch._compute_pad_values: MM_PAD_SHIFT_VALUE plus 62 bits of a
SHA-256), and those ids go into the radix key as any token does; its cores
store int64 tokens.  The C tree keeps int32 tokens, so the adapter must give
such ids stable stand-ins instead of refusing the key."""

from __future__ import annotations

import pytest
from sglang.srt.managers.schedule_batch import _compute_pad_values
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

import dual

PADS = [list(_compute_pad_values(bytes([i]) * 8)) for i in range(3)]
assert all(p > 2**31 - 1 for pads in PADS for p in pads)


class WideDiffer(dual.Differ):
    """The differential's operations over keys that hold image pad runs."""

    def _tokens(self):
        toks = super()._tokens()
        rng = self.rng
        if rng.random() < 0.6:
            pads = rng.choice(PADS)
            at = rng.randint(0, len(toks))
            run = [pads[i % len(pads)] for i in range(rng.randint(1, 3 * self.ps))]
            toks = toks[:at] + run + toks[at:]
        return toks


WIDE_CONFIGS = [c for c in dual.configs((1, 16))]


@pytest.mark.parametrize("cfg,strategy", WIDE_CONFIGS, ids=[f"{c.label}-{s}" for c, s in WIDE_CONFIGS])
@pytest.mark.parametrize("python_path", [False, True], ids=["c", "py"])
def test_multimodal_pad_tokens_match_sglangs_core(cfg, strategy, python_path):
    d = WideDiffer(cfg, strategy, seed=77 + cfg.page_size, python_path=python_path, partial_unlocks=True)
    assert d.run(300) >= 300
    assert d.requests_done >= 3


def test_an_image_prompt_is_cached_and_hit_as_on_sglangs_core():
    cfg = dual.configs((1,))[1][0]          # [FULL, MAMBA], page 1
    d = WideDiffer(cfg, "no_buffer", seed=3)
    prompt = [5, 6] + PADS[0] * 4 + [7, 8]
    for side in (d.a, d.b):
        d._run_request(side, prompt, None, None, [len(prompt)])
    out = []
    for side in (d.a, d.b):
        m = side.cache.match_prefix(MatchPrefixParams(key=dual._key(prompt + [9])))
        out.append((m.device_prefix_len, m.full_kv_hit_length))
    d.check("match the image prompt again", out[0], out[1])
    assert out[1][1] == len(prompt)
    # Another image's pads miss after the shared text.
    out = []
    for side in (d.a, d.b):
        m = side.cache.match_prefix(MatchPrefixParams(key=dual._key([5, 6] + PADS[1] * 4)))
        out.append((m.device_prefix_len, m.full_kv_hit_length))
    d.check("another image", out[0], out[1])
    assert out[1][1] == 2



@pytest.mark.parametrize("page_size", [1, 16])
def test_stand_ins_of_evicted_images_are_reused_and_hits_stay_exact(page_size, monkeypatch):
    """A server sees new images for as long as it runs: 150 requests, each with its own image, the
    cache emptied after every tenth.  The stand-ins of evicted images are collected and reused, so the
    table holds about what the tree holds, while every match and eviction equals SGLang's core."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    from mambaradix.sglang import unified

    monkeypatch.setattr(unified, "_WIDE_COLLECT_MIN", 8)
    cfg = next(c for c, s in WIDE_CONFIGS if c.page_size == page_size and s == "extra_buffer")
    d = WideDiffer(cfg, "extra_buffer", seed=1)
    ps = page_size
    prompts = []
    for i in range(150):
        pads = list(_compute_pad_values(b"image" + i.to_bytes(4, "little")))
        prompts.append([5] * ps + [pads[j % len(pads)] for j in range(2 * ps)] + [7 + i % 3] * ps)
        for side in (d.a, d.b):
            d._run_request(side, prompts[-1], None, None, [len(prompts[-1])])
        if i % 10 == 9 and i < 149:
            out = [side.cache.evict(EvictParams(num_tokens=1 << 20, mamba_num=1 << 20)) for side in (d.a, d.b)]
            d.check(f"evict after request {i}", (out[0].num_tokens_evicted, out[0].mamba_num_evicted),
                    (out[1].num_tokens_evicted, out[1].mamba_num_evicted))
    for prompt in (prompts[-1], prompts[-5], prompts[0], prompts[70]):
        out = []
        for side in (d.a, d.b):
            m = side.cache.match_prefix(MatchPrefixParams(key=dual._key(prompt + [9])))
            out.append((m.device_prefix_len, m.full_kv_hit_length))
        d.check("match an image prompt", out[0], out[1])
    core = d.b.core
    live = set(core._tree.negative_tokens().tolist())
    per_image = len({t for t in prompts[0] if t > 2**31 - 1})
    assert live <= set(core._wide_ids.values())                 # every stand-in in the tree is mapped
    assert len(core._wide_ids) <= 2 * 20 * per_image              # about the last 10-20 images', not 150
    assert len(core._wide_tokens) <= 2 * 20 * per_image           # and the freed stand-ins were reused
