"""Bad input to the reference driver (``mambaradix.driver``): each refused
with a TypeError or ValueError naming the argument (and the limit) before
any work, nothing queued or changed; valid numpy integers accepted where
Python ints are.

The pool limits are hand-derived from SGLang v0.5.15's scheduler: its
PrefillAdder admits a request only while ``new tokens + min(output,
clip_max_new_tokens) + page < available + evictable KV``; a request's row
holds the prompt and every output but the last (also the last under the
overlap scheduler, whose next batch still decodes a finished request); the
KV pool counts whole pages."""

from __future__ import annotations

from array import array

import numpy as np
import pytest

from mambaradix.driver import DriverConfig, DriverRequest, SchedulerDriver, pseudo_token

torch = pytest.importorskip("torch")
pytest.importorskip("mambaradix.sglang")

from mambaradix.driver import build_dropin  # noqa: E402


def _driver(mode: str = "pp2", kv: int = 512, ctx: int = 256, page: int = 1,
            **kw) -> SchedulerDriver:
    cfg = DriverConfig(mode=mode, page_size=page, chunk_size=8, track_interval=8, max_running=4,
                       **kw)
    di = build_dropin(cfg, kv_tokens=kv, state_slots=16, max_context_len=ctx)
    return SchedulerDriver(cfg, di.tree_cache, di.req_to_token_pool, di.allocator, api=di.api)


def _untouched(d: SchedulerDriver) -> None:
    assert d.idle and not d.infos and not d.records and d.step_count == 0
    d.tree_cache.sanity_check()


# ---------------------------------------------------------------- DriverRequest
@pytest.mark.parametrize("kw, exc, words", [
    (dict(output_len=True), TypeError, ["output_len", "bool"]),
    (dict(output_len=2.0), TypeError, ["output_len", "float"]),
    (dict(output_len=0), ValueError, ["output_len", ">= 1"]),
    (dict(input_ids=None), TypeError, ["input_ids", "NoneType"]),
    (dict(input_ids="abc"), TypeError, ["input_ids", "str"]),
    (dict(input_ids=b"ab"), TypeError, ["input_ids", "bytes"]),
    (dict(input_ids=5), TypeError, ["input_ids", "int"]),
    (dict(input_ids=[1.5, 2.5]), TypeError, ["input_ids[0]", "float"]),
    (dict(input_ids=[1, 2, True]), TypeError, ["input_ids[2]", "bool"]),
    (dict(input_ids=[1, "2"]), TypeError, ["input_ids[1]", "str"]),
    (dict(input_ids=np.array([1.0, 2.0])), TypeError, ["input_ids", "float64"]),
    (dict(input_ids=np.array([True, False])), TypeError, ["input_ids", "bool"]),
    (dict(input_ids=np.ones((2, 2), np.int64)), ValueError, ["input_ids", "2-dimensional"]),
    (dict(input_ids=[]), ValueError, ["input_ids", "empty"]),
    (dict(input_ids=[1, -1]), ValueError, ["input_ids[1] = -1", "2147483647"]),
    (dict(input_ids=[1, 2, 1 << 31]), ValueError, ["input_ids[2] = 2147483648", "2147483647"]),
    (dict(input_ids=np.array([5, 1 << 40])), ValueError, ["input_ids[1]", "2147483647"]),
    (dict(output_ids=[1, 2.5]), TypeError, ["output_ids[1]", "float"]),
    (dict(output_ids="ab"), TypeError, ["output_ids", "str"]),
    (dict(output_ids=[1]), ValueError, ["output_ids", "shorter than output_len"]),
    (dict(output_ids=[1, -3]), ValueError, ["output_ids[1] = -3"]),
    (dict(extra_key=5), TypeError, ["extra_key", "int"]),
    (dict(rid=5), TypeError, ["rid", "str"]),
])
def test_request_refuses_bad_fields(kw, exc, words):
    args = dict(rid="a", input_ids=[1, 2, 3], output_len=2)
    args.update(kw)
    with pytest.raises(exc) as e:
        DriverRequest(**args)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("ids", [
    (5, 6, 7, 8), np.array([5, 6, 7, 8], np.int32), np.array([5, 6, 7, 8], np.uint16),
    [np.int64(5), np.int32(6), 7, np.uint8(8)], array("q", [5, 6, 7, 8]), range(5, 9),
    torch.tensor([5, 6, 7, 8]),
])
def test_request_accepts_integer_sequences(ids):
    d = _driver()
    d.submit(DriverRequest("a", ids, np.int64(3), output_ids=np.array([9, 10, 11, 12])))
    d.run(max_steps=np.int64(100))
    rec = d.records["a"]
    assert rec.prompt_len == 4 and rec.output == [9, 10, 11]
    assert d.infos["a"].req.origin_input_ids.tolist() == [5, 6, 7, 8]


def test_submit_refuses_what_is_not_a_request():
    d = _driver()
    with pytest.raises(TypeError, match=r"submit\(\): request must be a DriverRequest, not int"):
        d.submit(5)
    with pytest.raises(TypeError, match="request must be a DriverRequest, not dict"):
        d.submit({"rid": "a", "input_ids": [1, 2]})
    _untouched(d)


def test_submit_checks_a_request_changed_after_it_was_made():
    d = _driver()
    r = DriverRequest("a", [1, 2, 3], 2)
    r.input_ids = "abc"
    with pytest.raises(TypeError, match="input_ids of request 'a'"):
        d.submit(r)
    r.input_ids, r.output_len = [1, 2, 3], True
    with pytest.raises(TypeError, match="output_len of request 'a' must be an int, not bool"):
        d.submit(r)
    _untouched(d)
    r.output_len = 2
    d.submit(r)
    d.run()
    assert d.records["a"].output == [pseudo_token("a", 0), pseudo_token("a", 1)]


# ---------------------------------------------------------------- requests that can never run
# (mode, page, kv_tokens, max_context_len, clip_max_new_tokens, output_len, the longest prompt)
LIMITS = [
    ("pp2", 1, 40, 1000, 4096, 2, 36),      # KV: P + 2 + 1 + 1 <= 40
    ("pp1", 1, 40, 1000, 4096, 5, 33),      # KV: P + 5 + 1 + 1 <= 40
    ("lazy", 4, 42, 1000, 4096, 9, 26),     # 42 tokens are 10 pages: P + 9 + 4 + 1 <= 40
    ("no_buffer", 1, 40, 1000, 4096, 1, 37),  # KV: P + 1 + 1 + 1 <= 40
    ("pp2", 4, 40, 1000, 2, 9, 31),         # admission P + 2 + 4 + 1 <= 40; decode P + 9 <= 40
    ("pp1", 1, 40, 1000, 2, 9, 32),         # decode: P + 9 - 1 <= 40
    ("pp2", 1, 1000, 40, 4096, 5, 35),      # row: P + 5 <= 40 (overlap)
    ("lazy", 4, 1000, 40, 4096, 5, 35),
    ("pp1", 4, 1000, 40, 4096, 5, 36),      # row: P + 5 - 1 <= 40
    ("no_buffer", 1, 1000, 40, 4096, 1, 40),
]


@pytest.mark.parametrize("mode, page, kv, ctx, clip, out, longest", LIMITS)
def test_a_request_that_can_never_run_is_refused_at_submit(mode, page, kv, ctx, clip, out, longest):
    d = _driver(mode, kv=kv, ctx=ctx, page=page, clip_max_new_tokens=clip)
    limit = "KV" if kv < ctx else "max_context_len"
    with pytest.raises(ValueError) as e:
        d.submit(DriverRequest("big", list(range(1, longest + 2)), out))
    msg = str(e.value)
    assert "request 'big' can never run" in msg and limit in msg
    assert f"prompt {longest + 1} + output {out}" in msg
    _untouched(d)
    # the longest prompt that fits runs to the end, also after the refusal
    d.submit(DriverRequest("big", list(range(1, longest + 1)), out))
    d.run(max_steps=500)
    assert len(d.records["big"].output) == out and not d.records["big"].aborted
    d.tree_cache.sanity_check()


def test_refusals_name_the_request_and_the_limit():
    d = _driver(kv=32)
    with pytest.raises(ValueError, match=r"request 'a' can never run: prompt 99 \+ output 2 "
                                         r"tokens need 103 KV tokens .* the KV pool has 32"):
        d.submit(DriverRequest("a", list(range(1, 100)), 2))
    d = _driver(ctx=32)
    with pytest.raises(ValueError, match=r"request 'a' can never run: prompt 19 \+ output 50 "
                                         r"tokens take 69 positions .* max_context_len 32"):
        d.submit(DriverRequest("a", list(range(1, 20)), 50))
    # an output far past any pool is refused before its tokens are made
    with pytest.raises(ValueError, match="max_context_len 32"):
        d.submit(DriverRequest("b", [1, 2], 10 ** 15))
    _untouched(d)


def test_run_says_which_request_can_not_be_admitted():
    """KV held outside the driver: the request fits the pool but not what is
    left of it, and nothing running will give any back."""
    d = _driver(kv=40)
    held = d.allocator.alloc(30)
    d.submit(DriverRequest("a", list(range(1, 21)), 2))
    with pytest.raises(RuntimeError, match=r"request 'a' \(prompt 20, output 2\) can not be "
                                           r"admitted with nothing else running: KV available 10"):
        d.run(max_steps=1000)
    assert d.step_count <= 2
    d.allocator.free(held)
    d.run()
    assert len(d.records["a"].output) == 2
    d.tree_cache.sanity_check()


# ---------------------------------------------------------------- run()
@pytest.mark.parametrize("steps, exc, words", [
    (0, ValueError, ">= 1, got 0"), (-1, ValueError, ">= 1, got -1"),
    (True, TypeError, "not bool"), (2.5, TypeError, "not float"), (None, TypeError, "not NoneType"),
])
def test_run_refuses_bad_max_steps(steps, exc, words):
    d = _driver()
    d.submit(DriverRequest("a", [1, 2], 2))
    with pytest.raises(exc, match=r"run\(\): max_steps must be .*" + words):
        d.run(max_steps=steps)
    assert d.step_count == 0
    d.run()
    assert len(d.records["a"].output) == 2


def test_run_counts_max_steps_per_call():
    d = _driver()
    d.submit(DriverRequest("long", list(range(1, 30)), 40))
    d.run()
    assert d.step_count > 40
    d.submit(DriverRequest("short", [7, 8, 9], 1))
    d.run(max_steps=5)            # prefill, then the overlap scheduler's result step
    assert d.records["short"].output == [pseudo_token("short", 0)]
    d.submit(DriverRequest("more", [7, 8, 10], 20))
    with pytest.raises(RuntimeError, match=r"run\(\): not idle after max_steps=5 steps"):
        d.run(max_steps=5)


# ---------------------------------------------------------------- build_dropin, SchedulerDriver
@pytest.mark.parametrize("kw, exc, words", [
    (dict(kv_tokens=True), TypeError, "kv_tokens must be an int, not bool"),
    (dict(kv_tokens=0), ValueError, "kv_tokens must be >= 1"),
    (dict(state_slots=8.0), TypeError, "state_slots must be an int, not float"),
    (dict(state_slots=False), TypeError, "state_slots must be an int, not bool"),
    (dict(max_context_len="64"), TypeError, "max_context_len must be an int, not str"),
    (dict(max_context_len=-4), ValueError, "max_context_len must be >= 1"),
    (dict(req_rows=0), ValueError, "req_rows must be >= 1, got 0"),
    (dict(req_rows=True), TypeError, "req_rows must be an int, not bool"),
    (dict(req_rows=2.0), TypeError, "req_rows must be an int, not float"),
])
def test_build_dropin_refuses_bad_sizes(kw, exc, words):
    args = dict(kv_tokens=64, state_slots=8, max_context_len=64)
    args.update(kw)
    with pytest.raises(exc, match=r"build_dropin\(\): " + words):
        build_dropin(DriverConfig(), **args)


def test_build_dropin_accepts_numpy_sizes():
    cfg = DriverConfig(max_running=2)
    di = build_dropin(cfg, kv_tokens=np.int64(64), state_slots=np.int32(12),
                      max_context_len=np.uint16(48), req_rows=np.int64(3))
    assert di.allocator.available_size() == 64
    assert di.req_to_token_pool.mamba_allocator.available_size() == 12
    assert di.req_to_token_pool.available_size() == 3
    d = SchedulerDriver(cfg, di.tree_cache, di.req_to_token_pool, di.allocator, api=di.api)
    assert (d.kv_tokens, d.max_context_len) == (64, 48)
    d.submit(DriverRequest("a", list(range(1, 30)), 3))
    d.run()
    assert len(d.records["a"].output) == 3


def test_config_must_be_a_driver_config():
    di = build_dropin(DriverConfig(), kv_tokens=64, state_slots=8, max_context_len=64)
    with pytest.raises(TypeError, match="config must be a DriverConfig, not dict"):
        SchedulerDriver({"mode": "pp2"}, di.tree_cache, di.req_to_token_pool, di.allocator,
                        api=di.api)
    with pytest.raises(TypeError, match=r"build_dropin\(\): config must be a DriverConfig, not str"):
        build_dropin("pp2", kv_tokens=64, state_slots=8, max_context_len=64)


# ---------------------------------------------------------------- DriverConfig
@pytest.mark.parametrize("kw, exc, words", [
    (dict(chunk_size=True), TypeError, "chunk_size must be an int, not bool"),
    (dict(max_running=2.0), TypeError, "max_running must be an int, not float"),
    (dict(track_interval=0), ValueError, "track_interval must be a positive int, got 0"),
    (dict(chunked_prefill_size=False), TypeError, r"chunked_prefill_size \(or None\) must be an int"),
    (dict(clip_max_new_tokens=0), ValueError, "clip_max_new_tokens must be a positive int, got 0"),
    (dict(clip_max_new_tokens=-5), ValueError, "clip_max_new_tokens must be a positive int, got -5"),
    (dict(new_token_ratio=float("nan")), ValueError, r"new_token_ratio must lie in \[0, 1\], got nan"),
    (dict(new_token_ratio=-1.0), ValueError, r"new_token_ratio must lie in \[0, 1\], got -1.0"),
    (dict(new_token_ratio=1.5), ValueError, r"new_token_ratio must lie in \[0, 1\]"),
    (dict(new_token_ratio="0.7"), TypeError, "new_token_ratio must be a number, not str"),
    (dict(match_cap="no"), TypeError, "match_cap must be a bool, not str"),
    (dict(page_size=4, chunk_size=6), ValueError, "chunk_size 6 must be a multiple of page_size 4"),
    (dict(page_size=4, track_interval=6), ValueError,
     "track_interval 6 must be a multiple of page_size 4"),
])
def test_config_refuses_bad_values(kw, exc, words):
    with pytest.raises(exc, match=words):
        DriverConfig(**kw)


def test_config_accepts_numpy_values():
    cfg = DriverConfig(chunk_size=np.int64(64), track_interval=np.int32(128), page_size=np.int64(4),
                       max_running=np.uint8(3), chunked_prefill_size=np.int64(96),
                       new_token_ratio=np.float64(0.5), clip_max_new_tokens=np.int16(100))
    assert (cfg.chunk_size, cfg.track_interval, cfg.page_size, cfg.max_running) == (64, 128, 4, 3)
    assert (cfg.chunked_prefill_size, cfg.new_token_ratio, cfg.clip_max_new_tokens) == (96, 0.5, 100)
    di = build_dropin(cfg, kv_tokens=400, state_slots=16, max_context_len=256)
    d = SchedulerDriver(cfg, di.tree_cache, di.req_to_token_pool, di.allocator, api=di.api)
    d.submit(DriverRequest("a", list(range(1, 200)), 3))
    d.run()
    assert len(d.records["a"].output) == 3
