/* rules.h - SGLang v0.5.15's scheduling and caching decisions for one
 * request, as pure functions: the one home of each rule.  The C lifecycle
 * (lifecycle.c) applies them; the Python scheduler loop (mambaradix/
 * scheduler.py), under the reference driver and the simulator, calls the
 * same functions through the module's bindings (csrc/py/py_rules.c).
 *
 * Lengths are token counts; -1 stands for None. */
#ifndef MR_RULES_H
#define MR_RULES_H

#include <stdint.h>

/* State slots one admitted request may hold (running slot + ping-pong pair;
 * lazy mode: running + one), the eviction headroom factor of SGLang's
 * alloc_req_slots. */
static inline int64_t
mr_rule_slots_per_req(int lazy)
{
    return lazy ? 2 : 3;
}

/* States to evict before allocating request slots for num_reqs requests
 * when `available` slots are free: max(0, num_reqs * factor - available). */
static inline int64_t
mr_rule_state_headroom(int64_t available, int64_t num_reqs, int lazy)
{
    int64_t need = num_reqs * mr_rule_slots_per_req(lazy);
    return available < need ? need - available : 0;
}

/* 1 when mr_rule_state_headroom's num_reqs * slots_per_req does not fit
 * int64 (the caller refuses such a count). */
static inline int
mr_rule_state_headroom_overflows(int64_t num_reqs, int lazy)
{
    return num_reqs > INT64_MAX / mr_rule_slots_per_req(lazy);
}

/* SGLang 0.5.23's rule (ensure_mamba_capacity): states to evict before
 * allocating request slots are exactly the slots the allocation takes
 * (`wants`: a running slot for each request without one, the initial track
 * slots for each without its ping-pong buffer) beyond the `available` free
 * ones.  v0515 non-zero: mr_rule_state_headroom's fixed factor per request. */
static inline int64_t
mr_rule_state_shortfall(int v0515, int64_t available, int64_t num_reqs, int lazy, int64_t wants)
{
    if (v0515) {
        return mr_rule_state_headroom(available, num_reqs, lazy);
    }
    return available < wants ? wants - available : 0;
}

/* Tokens of a request's fill ids a prefix match may cover: SGLang caps it
 * at fill_len - 1 (one token is computed to produce logits). */
static inline int64_t
mr_rule_match_limit(int64_t fill_len, int cap)
{
    return cap ? (fill_len > 0 ? fill_len - 1 : 0) : fill_len;
}

/* The prefill track decision in extra_buffer mode: an extend of extend_len
 * tokens after prefix_len cached ones snapshots when extend_len >= chunk.
 * Returns 1 then, with *point the sequence length the snapshot stands for
 * (prefix_len + (extend_len / chunk) * chunk, or the match's branching point
 * B when prefix_len < B < prefix_len + extend_len and (B - prefix_len) is a
 * multiple of chunk) and *kernel_seqlen the length the snapshot kernel is
 * given (the extend's end; B + 1 at a branching point: the state comes from
 * the per-chunk h, not the last one).  Returns 0 when nothing is tracked. */
static inline int
mr_rule_prefill_track(int64_t prefix_len, int64_t extend_len, int64_t chunk, int64_t branching,
                      int64_t *point, int64_t *kernel_seqlen)
{
    if (extend_len < chunk) {
        return 0;
    }
    int64_t end = prefix_len + extend_len;
    *point = prefix_len + (extend_len / chunk) * chunk;
    *kernel_seqlen = end;
    if (branching >= 0 && branching > prefix_len && branching < end && (branching - prefix_len) % chunk == 0) {
        *point = branching;
        *kernel_seqlen = branching + 1;
    }
    return 1;
}

/* 1 when mr_rule_prefill_track's prefix_len + extend_len does not fit int64. */
static inline int
mr_rule_prefill_track_overflows(int64_t prefix_len, int64_t extend_len)
{
    return extend_len > 0 && prefix_len > INT64_MAX - extend_len;
}

/* A decode step that brings a request to seq_len tokens snapshots its state
 * when seq_len is a multiple of the track interval. */
static inline int
mr_rule_decode_due(int64_t seq_len, int64_t interval)
{
    return seq_len % interval == 0;
}

/* The other index of a ping-pong buffer of pp slots: flips with 2, stays
 * with 1 (get_mamba_ping_pong_other_idx). */
static inline int
mr_rule_ping_pong_other(int idx, int pp)
{
    return pp == 2 ? 1 - idx : idx;
}

/* The track slot holding the newest snapshot, which the tree takes: the
 * other of next_track (lazy mode: next_track itself). */
static inline int
mr_rule_keep_index(int next_track, int pp, int lazy)
{
    return lazy ? next_track : mr_rule_ping_pong_other(next_track, pp);
}

/* How much of its remaining cand tokens the chunked request prefills next
 * with budget tokens: the count, and *truncated when it stops short.  A cut
 * ends on a page boundary (rounded down, or up to the next page when that
 * would leave nothing); SGLang v0.5.15 cuts anywhere, later versions round
 * down. */
static inline int64_t
mr_rule_chunk_continuation(int64_t prefix_len, int64_t cand, int64_t budget, int64_t page, int *truncated)
{
    int64_t n = cand < budget ? cand : budget;
    if (page > 1 && n < cand) {
        int64_t end = (prefix_len + n) / page * page;
        if (end <= prefix_len) {
            end = (prefix_len / page + 1) * page;
        }
        n = end - prefix_len < cand ? end - prefix_len : cand;
    }
    *truncated = n < cand;
    return n;
}

/* 1 when mr_rule_chunk_continuation's cut (at most prefix_len + cand, or
 * the page after prefix_len) does not fit int64 (cand, page >= 0). */
static inline int
mr_rule_chunk_continuation_overflows(int64_t prefix_len, int64_t cand, int64_t page)
{
    int64_t most = cand > page ? cand : page;
    return prefix_len > INT64_MAX - most;
}

/* End-of-turn states: a finished request's running slot (the state at
 * exactly committed tokens) is donated to the tree when the option is on,
 * in extra_buffer mode, for a non-empty, page-aligned length, and while the
 * pool keeps one admission's headroom free. */
static inline int
mr_rule_end_of_turn(int enabled, int extra_buffer, int64_t committed, int64_t page, int64_t available, int lazy)
{
    return enabled && extra_buffer && committed > 0 && committed % page == 0
           && available >= mr_rule_slots_per_req(lazy);
}

/* The length a finished request caches: its newest snapshot's
 * (last_track, -1 = none) in extra_buffer mode, all of committed otherwise
 * or at an end of turn; never past committed, in whole pages. */
static inline int64_t
mr_rule_finish_cache_len(int extra_buffer, int64_t last_track, int64_t committed, int eot, int64_t page)
{
    int64_t n = extra_buffer && !eot ? (last_track < 0 ? 0 : last_track) : committed;
    if (n > committed) {
        n = committed;
    }
    return n / page * page;
}

/* KV tokens an extend of extend_total tokens over num_reqs requests makes
 * room for (SGLang's alloc_for_extend): the tokens, or with pages an
 * over-estimate of one fresh page per request on top
 * (alloc_paged_token_slots_extend). */
static inline int64_t
mr_rule_extend_kv_need(int64_t extend_total, int64_t num_reqs, int64_t page)
{
    return page == 1 ? extend_total : extend_total + num_reqs * page;
}

/* 1 when mr_rule_extend_kv_need's extend_total + num_reqs * page does not
 * fit int64 (for any page size: the caller refuses such a count). */
static inline int
mr_rule_extend_kv_overflows(int64_t extend_total, int64_t num_reqs, int64_t page)
{
    return num_reqs > 0 && num_reqs > (INT64_MAX - extend_total) / page;
}

/* KV tokens a decode step of num_reqs requests makes room for (SGLang's
 * alloc_for_decode): one token each, or with pages a page each. */
static inline int64_t
mr_rule_decode_kv_need(int64_t num_reqs, int64_t page)
{
    return num_reqs * page;
}

/* 1 when mr_rule_decode_kv_need's num_reqs * page does not fit int64. */
static inline int
mr_rule_decode_kv_overflows(int64_t num_reqs, int64_t page)
{
    return num_reqs > INT64_MAX / page;
}

/* KV tokens to evict from the tree when `need` are wanted and `available`
 * are free (SGLang's evict_from_tree_cache): all of need when short, not
 * the shortfall; 0 otherwise. */
static inline int64_t
mr_rule_kv_evict(int64_t available, int64_t need)
{
    return available < need ? need : 0;
}

/* KV tokens one request of prompt + output tokens needs to run at all, alone
 * in the pool: the most of what admission asks for (SGLang's PrefillAdder
 * takes it only while prompt + min(output, clip) + a page stays below the
 * available KV, so one more) and what its decode steps hold (every position
 * it writes, in whole pages: the prompt and each output but the last, and the
 * last too under the overlap scheduler, which prepares a step past the
 * finish).  Saturates at INT64_MAX instead of overflowing. */
static inline int64_t
mr_rule_request_kv_need(int64_t prompt, int64_t output, int64_t page, int64_t clip, int overlap)
{
    int64_t clipped = output < clip ? output : clip, admit, positions, pages;
    if (__builtin_add_overflow(prompt, clipped, &admit) || __builtin_add_overflow(admit, page + 1, &admit)
        || __builtin_add_overflow(prompt, output, &positions)) {
        return INT64_MAX;
    }
    positions -= overlap ? 0 : 1;
    pages = positions / page + (positions % page != 0);
    if (pages > INT64_MAX / page) {
        return INT64_MAX;
    }
    return admit > pages * page ? admit : pages * page;
}

/* SGLang 0.5.23's rule (evict_to_free_tokens): only the shortfall,
 * need - available; v0515 non-zero: mr_rule_kv_evict. */
static inline int64_t
mr_rule_kv_evict_v(int v0515, int64_t available, int64_t need)
{
    if (v0515) {
        return mr_rule_kv_evict(available, need);
    }
    return available < need ? need - available : 0;
}

#endif /* MR_RULES_H */
