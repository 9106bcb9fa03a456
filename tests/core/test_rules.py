"""The scheduling and caching decisions of csrc/core/rules.h, as the module
exposes them (and mambaradix.scheduler re-exports them), against a
transcription of SGLang v0.5.15's rules written here from its source's
behaviour, over random inputs with a fixed seed; and their argument errors."""
from __future__ import annotations

import random

import pytest

from mambaradix import _C, scheduler


def ref_prefill_track_point(P, E, C, B):
    if E < C:
        return None
    if B is not None and P < B < P + E and (B - P) % C == 0:
        return B
    return P + (E // C) * C


def ref_chunk_continuation(P, cand, budget, page):
    n = min(cand, budget)
    if page > 1 and n < cand:
        end = (P + n) // page * page
        if end <= P:
            end = (P // page + 1) * page
        n = min(end - P, cand)
    return n, n < cand


def ref_end_of_turn(on, eb, committed, page, available, lazy):
    return bool(on and eb and committed > 0 and committed % page == 0 and available >= (2 if lazy else 3))


def ref_extend_kv_need(ext_total, n, page):
    # alloc_for_extend: alloc_token_slots(extend_num_tokens) at page size 1,
    # alloc_paged_token_slots_extend's extend_num_tokens + len(seq_lens) * page_size
    return ext_total if page == 1 else ext_total + n * page


def ref_kv_evict(available, need):
    # evict_from_tree_cache: tree_cache.evict(num_tokens) when available < num_tokens
    return need if available < need else 0


def ref_finish_cache_len(eb, last, committed, eot, page):
    n = committed if (not eb or eot) else (last or 0)
    return min(n, committed) // page * page


@pytest.mark.parametrize("seed", [0, 1])
def test_rules_against_reference(seed):
    rng = random.Random(seed)
    for _ in range(3000):
        P, E = rng.randrange(0, 600), rng.randrange(0, 600)
        C = rng.choice([1, 16, 64, 100])
        B = rng.choice([None, rng.randrange(0, 1200), P + C * rng.randrange(0, 8)])
        assert _C.prefill_track_point(P, E, C, B) == ref_prefill_track_point(P, E, C, B), (P, E, C, B)
        cand, budget, page = rng.randrange(0, 400), rng.randrange(0, 400), rng.choice([1, 4, 16, 64])
        assert _C.chunk_continuation(P, cand, budget, page) == ref_chunk_continuation(P, cand, budget, page)
        seq, iv = rng.randrange(0, 2000), rng.choice([1, 7, 256])
        assert _C.decode_track_due(seq, iv) is (seq % iv == 0)
        avail, n, lazy = rng.randrange(0, 40), rng.randrange(0, 10), rng.random() < 0.5
        assert _C.state_headroom(avail, n, lazy) == max(0, n * (2 if lazy else 3) - avail)
        fill, cap = rng.randrange(0, 50), rng.random() < 0.5
        assert _C.match_key_limit(fill, cap) == (max(fill - 1, 0) if cap else fill)
        idx, pp = rng.randrange(0, 2), rng.choice([1, 2])
        other = 1 - idx if pp == 2 else idx
        assert _C.ping_pong_other(idx, pp) == other
        assert _C.keep_index(idx, pp, lazy) == (idx if lazy else other)
        on, eb = rng.random() < 0.7, rng.random() < 0.7
        committed, last = rng.randrange(0, 300), rng.choice([None, 0, rng.randrange(0, 320)])
        eot = _C.end_of_turn(on, eb, committed, page, avail, lazy)
        assert eot is ref_end_of_turn(on, eb, committed, page, avail, lazy)
        assert _C.finish_cache_len(eb, last, committed, eot, page) == ref_finish_cache_len(eb, last, committed,
                                                                                            eot, page)
        ext_total = rng.randrange(0, 5000)
        assert _C.extend_kv_need(ext_total, n, page) == ref_extend_kv_need(ext_total, n, page)
        assert _C.decode_kv_need(n, page) == n * page   # alloc_for_decode: bs tokens, or bs * page_size
        kv_avail = rng.randrange(0, 6000)
        assert _C.kv_evict(kv_avail, ext_total) == ref_kv_evict(kv_avail, ext_total)
    assert _C.slots_per_req(False) == scheduler.STATE_FACTOR == 3
    assert _C.slots_per_req(True) == scheduler.STATE_FACTOR_LAZY == 2


def test_scheduler_uses_the_core_rules():
    for name in ("match_key_limit", "prefill_track_point", "decode_track_due", "chunk_continuation",
                 "state_headroom", "ping_pong_other", "keep_index", "end_of_turn", "finish_cache_len",
                 "extend_kv_need", "decode_kv_need", "kv_evict"):
        assert getattr(scheduler, name) is getattr(_C, name), name


@pytest.mark.parametrize("call, exc, words", [
    (lambda: _C.prefill_track_point(0, 10, 0, None), ValueError, "chunk_size"),
    (lambda: _C.prefill_track_point(-1, 10, 4, None), ValueError, "prefix_len"),
    (lambda: _C.prefill_track_point(0, 10, 4, -3), ValueError, "branching_seqlen"),
    (lambda: _C.decode_track_due(5, 0), ValueError, "interval"),
    (lambda: _C.match_key_limit(-1, True), ValueError, "fill_len"),
    (lambda: _C.ping_pong_other(0, 3), ValueError, "pp_size"),
    (lambda: _C.keep_index(2, 2, False), ValueError, "next_idx"),
    (lambda: _C.chunk_continuation(0, 5, 5, 0), ValueError, "page_size"),
    (lambda: _C.finish_cache_len(True, "x", 5, False, 1), TypeError, "last_track"),
    (lambda: _C.state_headroom(1, 2), TypeError, "lazy"),
    (lambda: _C.extend_kv_need(10, 2, 0), ValueError, "page_size"),
    (lambda: _C.extend_kv_need(-1, 2, 4), ValueError, "extend_total"),
    (lambda: _C.decode_kv_need(-1, 4), ValueError, "num_reqs"),
    (lambda: _C.kv_evict(-1, 4), ValueError, "available"),
    (lambda: _C.decode_kv_need(2**62, 2**20), OverflowError, "overflows"),
    (lambda: _C.state_headroom(0, 2**62, False), OverflowError, "state_headroom.*overflows"),
    (lambda: _C.prefill_track_point(2**63 - 1, 2**63 - 1, 1, None), OverflowError, "prefill_track_point.*overflows"),
    (lambda: _C.chunk_continuation(2**63 - 1, 10, 5, 4), OverflowError, "chunk_continuation.*overflows"),
])
def test_rule_arguments_are_named(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


I64 = 2**63 - 1


def test_rules_at_the_edge_of_int64_answer_as_python_integers_do() -> None:
    """The largest arguments that fit get the answer of the rule written in
    Python integers; one more is refused (OverflowError) instead of wrapping."""
    n = I64 // 3
    assert _C.state_headroom(5, n, False) == n * 3 - 5
    with pytest.raises(OverflowError):
        _C.state_headroom(5, n + 1, False)
    assert _C.state_headroom(0, I64 // 2, True) == I64 // 2 * 2
    p = I64 - 10
    assert _C.prefill_track_point(p, 10, 4, None) == p + 8
    with pytest.raises(OverflowError):
        _C.prefill_track_point(p + 1, 10, 4, None)
    # a cut rounds down to a page, or up to the next one when that leaves nothing
    q = I64 - 10
    want = min((q // 4 + 1) * 4, q + 10) - q if (q + 5) // 4 * 4 <= q else (q + 5) // 4 * 4 - q
    assert _C.chunk_continuation(q, 10, 5, 4) == (want, True)
    with pytest.raises(OverflowError):
        _C.chunk_continuation(q + 1, 10, 5, 4)
