/* lifecycle.h - what a scheduler does with the cache for its requests:
 * match with copy-on-write bookkeeping, admission, the prefill and decode
 * tracking decisions, caching unfinished and finished requests, abort.
 * The rules are SGLang v0.5.15's (MambaRadixCache, HybridReqToTokenPool,
 * ScheduleBatch, the batch result processor), for both strategies:
 *
 *   no_buffer     the request's running slot is donated to the tree at
 *                 finish; an unfinished request forks it (one state copy).
 *   extra_buffer  the forward pass snapshots the state into the ping-pong
 *                 track buffer; the tree takes the slot holding the newest
 *                 snapshot (keep = other(next), lazy: next) and the request
 *                 gets a fresh slot in its place: no state copy.
 *
 * Slot ownership (slot_alloc.h) follows every step:
 *   alloc / COW      FREE -> HELD (matched before admission) or REQ(row)
 *   admission        HELD -> REQ(row)
 *   insert           REQ/HELD -> TREE (new KV tokens, the donated slot)
 *   eviction         TREE -> FREE (through the tree's mr_release callbacks)
 *   finish / abort   REQ -> FREE (tail KV, running and spare track slots)
 * so mr_lc_check() can prove free + request-owned + tree-owned == total,
 * and that the tree's own counts equal the TREE-owned units, at any time.
 *
 * Request records (mr_req, req_pool.h).  A request's record lives in its
 * ReqPool row (rp->req[r]) while it holds one.  The batched calls keep it
 * there from admission to finish.  The per-request calls (the drop-in's)
 * take a working copy of the record wherever it is and write it back: before
 * admission it is the caller's (a match with copy-on-write gives a request
 * a slot before it has a row); once mr_lc_admit has given it a row the
 * caller moves it in (mr_reqpool_bind, which marks the row bound) and gets
 * it back when the row is freed (mr_reqpool_free_record) or the request is
 * finished (mr_reqpool_unbind).  A bound row's track entries live in its
 * track map (the request's ping-pong buffer is that row of the map), so a
 * caller reads and writes its record with mr_reqpool_load / _store.  A bound row's
 * caller keeps the committed length (SGLang's Req.kv_committed_len), writes
 * the table's prefix itself after admission (SGLang's scheduler does) and
 * takes the lock on the matched node (inc_lock_ref); the cache calls refresh
 * the record's node from the request's.  Between calls every row's record
 * satisfies, checked by mr_lc_check():
 *   Q1  a free row's record is reset (mr_req_reset): no slot, no lock; a
 *       free row is not bound;
 *   Q2  running, track[0] and track[1] are -1 or distinct slots owned by
 *       REQ(r), except, in a bound row, one a caller handed to the tree
 *       with mr_lc_insert outside the request calls (SGLang's own tests
 *       insert a request's running slot): the row marks it
 *       (MR_ROW_GAVE_*, req_pool.h) and the record keeps naming it, as
 *       SGLang's Req does, until that field changes.  cow_src: in a batched row -1 (a copy-on-write pair lives
 *       within one call); in a bound row -1 or a pending copy-on-write
 *       source until the forward consumes it (SGLang clears
 *       mamba_cow_src_index there): a TREE-owned slot (the matched node's
 *       state, kept in the tree by the scheduler's lock on the node), with
 *       a running slot to copy into;
 *   Q3  next_track is -1 (no buffer: no_buffer mode, or not admitted) or 0 /
 *       1 with extra_buffer, and then track[next_track] != -1; only lazy
 *       mode leaves the other one empty; a record with a running slot has
 *       its slots in the row's maps (state_map[r], track_map[r]);
 *   Q4  locked implies has_node and last_node resolves to a node with a
 *       lock (at least one lock per locked record on that node);
 *   Q5  batched rows: 0 <= protected_len <= prefix_len <= committed <=
 *       max_ctx, last_track_seqlen <= committed; bound rows: committed == 0
 *       (the caller's), 0 <= protected_len, prefix_len, last_track_seqlen
 *       <= max_ctx; protected_len is whole pages in both;
 *   Q6  batched rows: table entries [0, protected_len) lie in TREE-owned KV
 *       pages (the tree's prefix), [protected_len, committed) in pages owned
 *       by REQ(r).  (A bound row's table is the caller's to fill.)
 * A 13-tuple caller (a request object that is not ours) keeps its record
 * itself; its row keeps a reset record, which satisfies Q1..Q6 trivially.
 *
 * A lifecycle owns its tree.  Without pools (state == kv == NULL) it is a
 * tree whose evictions are collected for the caller to free (used when the
 * pools are someone else's Python objects); the request-level functions
 * need pools and return MR_ESTATE without them.
 *
 * Errors: MR_OK or a negative MR_E* code.  Every function validates what it
 * can before changing anything; MR_ENOSPC (a pool is exhausted even after
 * eviction) and MR_ESTATE (e.g. the track buffer was already donated) leave
 * all accounting valid.
 */
#ifndef MR_LIFECYCLE_H
#define MR_LIFECYCLE_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "radix.h"
#include "req_pool.h"
#include "slot_alloc.h"

typedef struct {
    uint32_t page_size;       /* KV page size (tree pages) */
    uint32_t chunk_size;      /* mamba_cache_chunk_size C */
    mr_lru_policy policy;
    int extra_buffer;         /* 0: no_buffer, 1: extra_buffer */
    int lazy;                 /* extra_buffer_lazy (needs track_buffer_size 2) */
    int32_t track_buffer_size;/* 2 with the overlap scheduler, 1 without */
    int64_t track_interval;   /* mamba_track_interval (decode) */
    /* extra_buffer: a finished request whose committed length is whole
     * pages donates its running slot, which holds the state at exactly
     * that length, and the tree keeps it there instead of the last track
     * snapshot (no copy; the track slots are freed).  Only while the state
     * pool has one admission's headroom free (3 slots, lazy 2): the extra
     * state never forces an eviction.  no_buffer always does this. */
    int end_of_turn;
    /* The tree's utility policy and per-path budget settings.  The budget
     * is applied by mr_lc_insert with pools, and by cache_unfinished /
     * cache_finished once the request's lock has left the state the new one
     * supersedes (a tree-only lifecycle leaves it to its caller:
     * mr_radix_trim_path). */
    mr_radix_options tree;
    /* Which SGLang release's rules the tree and the cache calls follow
     * (mr_semantics; zero-initialized: v0.5.15). */
    mr_semantics semantics;
    /* Tree-only: the tree keeps keys only (mr_radix_config.no_values), for
     * a caller whose KV pool is a count (a simulator).  The _ext cache
     * calls then take kv NULL, and every KV index they hand out (collected
     * frees, prefix indices) is 0: only how many counts.  MR_EINVAL with
     * pools. */
    int no_values;
} mr_lc_config;

/* Counters of state traffic, for benchmarks and tests. */
typedef struct {
    uint64_t cow;             /* copy-on-write pairs emitted (state copies at hits) */
    uint64_t forks;           /* no_buffer unfinished-request forks (state copies) */
    uint64_t donated;         /* slots handed to the tree without a copy */
    uint64_t clears;          /* fresh running slots that need zeroing */
    uint64_t states_evicted;
    uint64_t tokens_evicted;
} mr_lc_stats;

typedef struct mr_lifecycle mr_lifecycle;

/* A key: len tokens at p, int32 (width 4) or int64 (width 8, read in place:
 * only what a call reads is narrowed, and a token outside int32 matches
 * nothing, since no cached key holds one). */
typedef struct {
    const void *p;
    size_t len;
    uint8_t width;
} mr_key;

/* Creates a lifecycle and its tree over the given pools (borrowed: they
 * must outlive it), or a tree-only lifecycle when state, kv and rp are all
 * NULL.  MR_EINVAL for a bad config (page/chunk as mr_radix_new; lazy
 * without track_buffer_size 2; track_interval < 1; kv page size differing
 * from cfg->page_size; with pools, no_buffer at a page size above 1, which
 * SGLang's MambaRadixCache refuses too), MR_ENOMEM. */
int mr_lc_new(const mr_lc_config *cfg, mr_slots *state, mr_kv *kv, mr_reqpool *rp,
              mr_lifecycle **out);
void mr_lc_free(mr_lifecycle *lc);
mr_radix *mr_lc_tree(mr_lifecycle *lc);
const mr_lc_config *mr_lc_config_of(const mr_lifecycle *lc);
const mr_lc_stats *mr_lc_stats_of(const mr_lifecycle *lc);
/* Empties the tree.  The caller clears the pools (SGLang's flush order);
 * counted pools get back what the tree held. */
void mr_lc_reset(mr_lifecycle *lc);

/* The release hooks of the tree.  With pools they return KV pages / state
 * slots to the allocators (TREE -> FREE); without, they append to the
 * collected arrays, which mr_lc_take_released() hands out and forgets. */
const mr_release *mr_lc_release_hooks(mr_lifecycle *lc);
void mr_lc_take_released(mr_lifecycle *lc, const int64_t **kv, size_t *nkv, const int64_t **states,
                         size_t *nstates);
/* Where each free call of the collected KV array ends (ends[0] < ends[1] <
 * ... = nkv): SGLang frees an evicted node's KV with a call of its own,
 * and cache_finished_req frees the tail before its insert frees the
 * duplicates.  A paged allocator puts each call's pages, sorted, at the
 * head of its free list, so the caller makes the same calls. */
void mr_lc_take_released_calls(mr_lifecycle *lc, const int64_t **ends, size_t *n);
/* Tree-only: the last mr_lc_insert's duplicates as SGLang frees them, one
 * call per node of the path they cross: where each call's run ends,
 * counted from the first duplicate (ascending, the last = ndup). */
void mr_lc_insert_runs(const mr_lifecycle *lc, const int64_t **ends, size_t *n);
void mr_lc_clear_released(mr_lifecycle *lc);

/* Inserts with ownership: new KV tokens and the state slot (unless it
 * existed) move to the tree, duplicate KV indices are freed.  Without
 * pools, duplicates are written to dup_out (capacity len) and nothing moves.
 * *out as mr_radix_insert.  With pools everything is checked before the
 * tree changes, and a refused insert changes nothing: MR_EINVAL (the state
 * out of range, a KV index out of range or listed twice past the tree's own
 * prefix), MR_ENOENT (a free one), MR_EBUSY (the tree's own past its
 * prefix, or a slot the tree holds); *bad (may be NULL) receives the
 * position in val of the offending KV index, -1 when it is the state.
 * Only val[min(prev_prefix_len, cached):] is checked (and read): what the
 * tree stores or frees, from the page boundary at or before it (a page's
 * indices are checked together).  SGLang reads nothing before it, so
 * neither does this (an index before that page may be anything). */
int mr_lc_insert(mr_lifecycle *lc, const int32_t *key, const int64_t *val, size_t len, int32_t ns,
                 int64_t state, size_t prev_prefix_len, int64_t *dup_out, mr_insert_result *out, int64_t *bad);
/* Evicts (mr_radix_evict_full / _state through the release hooks). */
int mr_lc_evict(mr_lifecycle *lc, size_t num_tokens, size_t num_states, size_t *tokens_out,
                size_t *states_out);
/* The same with `protect` (if not NULL) locked for the eviction's length
 * (mr_radix_lock, undone after): its state and the KV of its path stay.
 * The one home of "evict while the matched node is protected": the step
 * of mr_lc_alloc_state, and of a caller whose slot pool is its own
 * (SGLang's match_prefix with cow_mamba locks the matched node, evicts one
 * state, unlocks and allocates again).  Tree-only, what went is collected
 * for the caller to free (mr_lc_take_released), as mr_lc_evict. */
int mr_lc_evict_protected(mr_lifecycle *lc, size_t num_tokens, size_t num_states, mr_node *protect,
                          size_t *tokens_out, size_t *states_out);

/* Takes one state slot for `owner` (HELD or a row); when none is free,
 * evicts one state (mr_lc_evict_protected, with `protect` if not NULL) and
 * retries.  MR_ENOSPC when none can be had; MR_EINVAL for an owner that is
 * neither HELD nor a row of the pool (nothing changes). */
int mr_lc_alloc_state(mr_lifecycle *lc, int32_t owner, mr_node *protect, int64_t *out);

/* match_prefix: matches key in namespace ns; writes the usable prefix's KV
 * indices to indices (capacity key->len; may be NULL: then the caller reads
 * them with mr_radix_path_values(tree, m->node, ...)) and *m.  With cow and a
 * node that has a state: st->running gets a slot if it has none (owner
 * `owner`), st->cow_src = the node's state, st->needs_clear = 0.  With
 * owner a request row, st must be that row's request's record: the row's
 * maps are rewritten from st (Q3) when it gets the slot.
 * MR_ENOSPC if no slot could be had (the match itself stands). */
int mr_lc_match(mr_lifecycle *lc, const mr_key *key, int32_t ns, int cow, mr_req *st, int32_t owner, mr_match *m,
                int64_t *indices);

/* mr_lc_match's copy-on-write step on a lifecycle without pools (the
 * caller's allocators own the slots): with `node` (a match's result)
 * holding a state, st->cow_src = that state and st->needs_clear = 0, after
 * st->running gets `fresh` (>= 1) if it has no slot.  When it needs a slot
 * and fresh < 1, *need = 1 and nothing changes: the caller allocates one
 * (evicting with the node protected: mr_lc_evict_protected) and calls
 * again.  MR_EINVAL for a fresh slot the rule does not take (nothing
 * changes), MR_ESTATE with pools. */
int mr_lc_cow_ext(mr_lifecycle *lc, mr_req *st, const mr_node *node, int64_t fresh, int *need);

/* Admission of n requests (HybridReqToTokenPool.alloc, after the
 * scheduler's headroom eviction when headroom != 0: states short of
 * n * (lazy ? 2 : 3) are evicted first).  rows[i] < 1 gets a new row;
 * every request gets a running slot if it has none (needs_clear = 1) and,
 * with extra_buffer, its track buffer if it has none; COW slots move
 * HELD -> REQ(row); the maps are synced.  MR_ENOSPC when rows or slots are
 * short (nothing taken); MR_EINVAL for a row >= 1 listed twice. */
int mr_lc_admit(mr_lifecycle *lc, mr_req *sts, int64_t *rows, size_t n, int headroom);

/* mr_lc_admit's slots for one request on a lifecycle without pools (the
 * caller's allocators own the slots and the rows): *need = how many state
 * slots the request wants (a running slot if it has none, with
 * extra_buffer its track buffer if it has none).  With nfresh == 0 nothing
 * changes; the caller allocates *need slots and calls again with them
 * (fresh, distinct, >= 1): they become the running slot (needs_clear = 1)
 * and the track slots (next_track = 0), in that order, and *need = 0.
 * MR_EINVAL for a wrong count or a bad slot (nothing changes), MR_ESTATE
 * with pools. */
int mr_lc_admit_ext(mr_lifecycle *lc, mr_req *st, const int64_t *fresh, size_t nfresh, int64_t *need);
/* mr_lc_admit_ext in one call for a caller that numbers its slots with a
 * counter: the slots the request wants are first, first + 1, ... (in
 * mr_lc_admit_ext's order); *used = how many it took (0: it wanted none,
 * nothing changed).  MR_EINVAL (nothing changes) when it wants some and
 * first < 1, or one of those ids is a slot the request holds; MR_ESTATE
 * with pools. */
int mr_lc_admit_ids(mr_lifecycle *lc, mr_req *st, int64_t first, int64_t *used);

/* The prefill tracking decision for one request (extra_buffer): P prefix
 * tokens, E extend tokens.  Sets *mask = E >= C, *track_slot =
 * track[next], *track_seqlen (-1, P + E, or B + 1 at a branching point B)
 * and, when tracked, st->last_track_seqlen = P + (E / C) * C (or B) and
 * flips next (not lazy). */
void mr_lc_prepare_extend(mr_lifecycle *lc, int64_t row, mr_req *st, int64_t prefix_len,
                          int64_t extend_len, int64_t *track_slot, uint8_t *mask,
                          int64_t *track_seqlen);

/* Decode, before the forward (seq_len already includes the new token):
 * lazy mode borrows a second track slot at a boundary.  *track_slot =
 * track[next]; *mask = seq_len % interval == 0. */
int mr_lc_decode_prepare(mr_lifecycle *lc, int64_t row, mr_req *st, int64_t seq_len,
                         int64_t *track_slot, uint8_t *mask);
/* The same, tree-only: the lazy borrow uses `fresh` (a slot the caller
 * allocated, >= 1); when it needs one and fresh < 1, *need = 1 and nothing
 * changes (the caller allocates and calls again; without a slot it goes
 * on unborrowed, as SGLang does).  MR_ESTATE with pools. */
int mr_lc_decode_prepare_ext(mr_lifecycle *lc, mr_req *st, int64_t seq_len, int64_t fresh,
                             int64_t *track_slot, uint8_t *mask, int *need);
/* Decode, after the result: a boundary when committed % interval == 0 sets
 * last_track_seqlen and flips next (lazy: gives the borrowed slot back, or
 * marks a finished request not insertable).  Returns 1 at a boundary. */
int mr_lc_decode_finish(mr_lifecycle *lc, int64_t row, mr_req *st, int64_t committed_len,
                        int finished);

/* cache_unfinished_req for row (its table holds fill_len KV indices):
 * caches tokens[0:cache_len) (cache_len = last_track_seqlen with
 * extra_buffer, fill_len without; nothing when unset), moves the request's
 * lock to the new node, rewrites the table with the tree's indices and
 * writes the request's prefix indices (fill_len of them) to prefix_out.
 * *fork_src / *fork_dst get the no_buffer state copy to do now (-1 when
 * none).  MR_ESTATE when the slot to donate is already gone.  Only what
 * the insert reads of an int64 key is narrowed (from the locked prefix on,
 * see below); a token there outside int32 is MR_EINVAL with *bad its
 * position, nothing changed.
 *
 * This call, cache_finished and their _ext and batch forms trust a
 * request's tokens to begin with its locked prefix: when the locked node's
 * path is protected_len tokens long (it was matched from the request's
 * tokens), the insert starts there and reads no token before it (a key
 * that does not begin with it still leaves a valid tree, with the rest of
 * the key cached below the locked node).  Builds with MR_VERIFY_TRUSTED
 * compare them and abort. */
int mr_lc_cache_unfinished(mr_lifecycle *lc, int64_t row, mr_req *st, const mr_key *tokens, size_t fill_len,
                           int32_t ns, int64_t *prefix_out, int64_t *fork_src, int64_t *fork_dst, int64_t *bad);

/* The namespace of the node the request's record holds locked, or -1 (no
 * lock, or a stale one).  The cache calls refuse (MR_EINVAL, nothing
 * changed) an ns other than it: the request was matched there. */
int32_t mr_lc_locked_ns(const mr_lifecycle *lc, const mr_req *st);

/* What cache_unfinished caches of a request whose table holds fill_len
 * tokens: the tracked length with extra_buffer, all of them without; -1
 * when nothing was tracked (then the call caches nothing, takes no slot and
 * the request keeps all its KV: a front end whose slot pool is its own
 * allocates the fresh slot only when this is >= 0). */
int64_t mr_lc_unfinished_cache_len(const mr_lifecycle *lc, const mr_req *st, size_t fill_len);

/* cache_finished_req for row (committed_len KV indices in its table):
 * inserts the cacheable prefix (is_insert), frees the tail KV and every
 * state slot the tree does not keep, and drops the request's lock.  The row
 * itself stays allocated (the scheduler frees it).  MR_ESTATE when the
 * slot to keep was already donated (nothing changed). */
int mr_lc_cache_finished(mr_lifecycle *lc, int64_t row, mr_req *st, const int32_t *tokens,
                         size_t committed_len, int32_t ns, int is_insert);

/* The same two calls in tree-only mode, for pools that are someone else's
 * (SGLang's own): the request's KV indices are the caller's kv[0:n), and
 * cache_unfinished takes the fresh state slot the caller allocated (>= 1;
 * handed back when not needed).  Every KV index and state slot the
 * caller's allocators must free (duplicates, the tail, slots the tree does
 * not keep) is appended to the collected arrays, with what eviction
 * released: the caller takes them (mr_lc_take_released) and frees the
 * slots in one call, the KV in the calls mr_lc_take_released_calls
 * gives (the tail before the duplicates, those one call per node).  The table rewrite is the caller's: prefix_out holds
 * the request's indices, the tree's for [0, st->protected_len); tree-only,
 * prefix_out may be NULL (not wanted).  Of the range the caller's table
 * must now hold, [old protected_len, new protected_len), only
 * [old protected_len, *table_end) differs from kv (the duplicates the tree
 * replaced with its own indices; past them the tree took kv's): the caller
 * writes that part, none when *table_end is not past the old length.
 * MR_ESTATE with pools; MR_EBUSY (nothing changes) for a fresh slot the
 * request holds (its running slot or track buffer). */
int mr_lc_cache_unfinished_ext(mr_lifecycle *lc, mr_req *st, const int32_t *tokens, const int64_t *kv,
                               size_t fill_len, int32_t ns, int64_t fresh, int64_t *prefix_out,
                               int64_t *fork_src, int64_t *fork_dst, int64_t *table_end);
int mr_lc_cache_finished_ext(mr_lifecycle *lc, mr_req *st, const int32_t *tokens, const int64_t *kv,
                             size_t committed_len, int32_t ns, int is_insert);
/* Either call in tree-only mode, for a front end with one path for both:
 * finished picks mr_lc_cache_finished_ext (is_insert = flag, with the
 * caller's free state slots `available` for this call only: see
 * mr_lc_set_state_available), else mr_lc_cache_unfinished_ext (fresh =
 * flag; fork_*, table_end as there). */
int mr_lc_cache_ext(mr_lifecycle *lc, int finished, mr_req *st, const int32_t *tokens, const int64_t *kv, size_t len,
                    int32_t ns, int64_t flag, int64_t available, int64_t *prefix_out, int64_t *fork_src,
                    int64_t *fork_dst, int64_t *table_end);
/* The tokens the last cache call (cache_unfinished / cache_finished, any
 * form) inserted into the tree: its cache_len (the tracked length, the
 * fill length, or at finish mr_rule_finish_cache_len's), 0 when it
 * inserted nothing (nothing tracked, is_insert 0, or a refusal). */
int64_t mr_lc_cached_len(const mr_lifecycle *lc);
/* Tree-only: the caller's free state slots, which the end-of-turn rule
 * (mr_lc_config.end_of_turn) reads at cache_finished; -1 (the default):
 * unknown, and no end-of-turn state is kept. */
void mr_lc_set_state_available(mr_lifecycle *lc, int64_t n);

/* free_mamba_cache(req, keep): frees the running slot and, with
 * extra_buffer, every track slot but track[keep] (keep < 0: all); tree-only,
 * they go to the collected arrays.  MR_ESTATE when the request holds no
 * running slot (double free). */
int mr_lc_free_states(mr_lifecycle *lc, mr_req *st, int keep);

/* ------------------------------------------------------------------------
 * Batched calls: the request records live in the ReqPool (rp->req[row]);
 * one call does a whole batch.  Outputs are per request, -1 = none. */

typedef struct {
    int64_t *rows;          /* the request's row */
    int64_t *prefix_len;    /* cache hit */
    int64_t *cow_src;       /* copy-on-write pair to run before the forward */
    int64_t *cow_dst;
    int64_t *clear;         /* running slot to zero before the forward */
    int64_t *track_slot;    /* where the forward snapshots the state */
    uint8_t *track_mask;
    int64_t *track_seqlen;
} mr_lc_prefill_out;

/* A batch's token sequences: request i's is keys[i] (int32; or int64,
 * read in place, where keys64 and keys64[i] are not NULL) of lens[i]
 * tokens followed by outs[i] (likewise outs64[i]) of olens[i] tokens, its
 * output tokens, so that a caller needs not join them.  lens NULL: each
 * key holds at least its row's committed length (no outputs read); olens
 * NULL: no outputs. */
typedef struct {
    const int32_t *const *keys;
    const int64_t *const *keys64;
    const size_t *lens;
    const int32_t *const *outs;
    const int64_t *const *outs64;
    const size_t *olens;
} mr_lc_batch_keys;

/* Schedules n new requests: match (request i's key of keys->lens[i] tokens,
 * capped at lens[i] - 1, with copy-on-write; outputs are not read; an int64
 * key is read in place and never copied: a token outside int32 matches
 * nothing), admission with state headroom, the
 * request's lock, KV for its extend tokens (evicting when short) written to
 * its table row, and the tracking decision.  Whether the batch can be
 * admitted is decided first, from the matches as they stand (no split, no
 * LRU refresh) and what eviction could free around the batch's matched
 * prefixes: rows, a running slot and track buffer per request, KV pages for
 * the extends.  MR_ENOSPC when one is short: no request of the batch is
 * admitted, and nothing changed (nothing evicted); only an admitted batch
 * evicts (SGLang's PrefillAdder admits against available + evictable, and
 * only the admitted requests evict). */
int mr_lc_prefill_batch(mr_lifecycle *lc, size_t n, const mr_lc_batch_keys *keys, const int32_t *ns,
                        mr_lc_prefill_out *out);
/* End of prefill for requests that go on decoding: cache_unfinished_req on
 * each (its tokens: keys' sequence i, fill_len = its committed length).
 * A request's insert starts at its locked node when that node's path is its
 * first protected_len tokens (it was matched from them): the tokens before
 * it are neither read nor compared.  The tokens the call reads are checked
 * and narrowed once, before any row changed: one outside int32 is
 * MR_EINVAL, bad = {request, position in its sequence}; a sequence shorter
 * than what is read, MR_EINVAL, bad = {request, -1}; a row not in use or
 * listed twice (mr_reqpool_rows_check), MR_EINVAL, bad = {entry, -1}.
 * bad[2] is 1 when instead an insert refused the KV index at position
 * bad[1] of request bad[0]'s table (mr_lc_insert's codes; the requests
 * before it are cached).  MR_ENOSPC, before any row changed, when the rows
 * that cache (each takes a state slot) are more than the free slots and
 * the states eviction can free. */
int mr_lc_unfinished_batch(mr_lifecycle *lc, size_t n, const int64_t *rows, const mr_lc_batch_keys *keys,
                           const int32_t *ns, int64_t *fork_src, int64_t *fork_dst, int64_t bad[3]);
/* One decode step for n rows: one KV token each (written to the table),
 * the tracking decision before the forward and the boundary bookkeeping
 * after it.  MR_ENOSPC when the step's KV is more than the free KV and what
 * eviction can free: decided before anything is evicted, so a refused step
 * changes nothing (the caller retracts a request and steps again). */
int mr_lc_decode_batch(mr_lifecycle *lc, size_t n, const int64_t *rows, int64_t *track_slot,
                       uint8_t *track_mask);
/* Finishes n rows: cache_finished_req (its tokens: keys' sequence i,
 * origin + output tokens, at least the committed length) and frees the
 * row.  The tokens are read and refused as mr_lc_unfinished_batch reads
 * them (and a refused KV index reported so): every row is checked before
 * the first is finished. */
int mr_lc_finish_batch(mr_lifecycle *lc, size_t n, const int64_t *rows, const mr_lc_batch_keys *keys,
                       const int32_t *ns, int is_insert, int64_t bad[3]);

/* ------------------------------------------------------------------------
 * Counted pools: a tree-only lifecycle without values (a simulator) whose
 * KV, state and row pools are counts kept here.  Every free the lifecycle
 * would hand its caller (evictions, a tail, duplicates, slots the tree does
 * not keep) goes back to the counts instead (KV in whole pages), and the
 * calls that take a caller's fresh slot take one from the count when given
 * none (< 1): cache_unfinished (with the request's node protected), the
 * copy-on-write (the matched node protected), admission (mr_lc_admit_ids
 * with first < 1) and the lazy borrow at a decode boundary (which goes on
 * without one when none can be had, as SGLang does).  A slot taken from the
 * count is numbered (1, 2, ...) only to tell the request's slots apart.
 * The collected arrays stay empty. */
typedef struct {
    int64_t kv_total, kv_free;        /* KV tokens, whole pages */
    int64_t slots_total, slots_free;  /* state slots */
    int64_t rows_total, rows_free;    /* request rows */
    int64_t peak_kv, peak_slots;      /* the most ever in use */
    int64_t last_id;                  /* the last slot id handed out */
    uint64_t full_evictions;          /* KV evictions (mr_lc_count_evict) that freed something */
    uint64_t kv_evicted;              /* KV tokens the evictions freed */
    uint64_t states_evicted;          /* states the state evictions freed */
    uint64_t donated;                 /* slots a request held that the tree took (no copy) */
} mr_lc_counts;

/* Turns counting on with full pools of the given sizes.  MR_EINVAL unless
 * the lifecycle is tree-only without values, is not counting yet, and the
 * sizes are >= 0. */
int mr_lc_count_pools(mr_lifecycle *lc, int64_t kv_tokens, int64_t slots, int64_t rows);
/* The counts, or NULL when not counting. */
const mr_lc_counts *mr_lc_counts_of(const mr_lifecycle *lc);
/* An external policy's pick of the next state to evict (e.g. a
 * simulator's Belady oracle): *victim a node whose state the tree's rule
 * lets go (mr_radix_can_evict_state), never `protect`; NULL: none.  A
 * non-MR_OK return stops the eviction and is returned by the call that
 * evicted. */
typedef int (*mr_lc_victim_fn)(void *ctx, const mr_node *protect, mr_node **victim);
/* Counted pools: every state eviction (mr_lc_count_evict's states, and so
 * those of the slot takes and admission) evicts the victims fn picks,
 * one at a time, instead of the tree's own; NULL restores the tree's. */
void mr_lc_count_set_victims(mr_lifecycle *lc, mr_lc_victim_fn fn, void *ctx);
/* Evicts num_tokens of KV (whole leaves), then num_states states, with
 * `protect` (may be NULL) kept as mr_lc_evict_protected keeps it; what went
 * is counted free and in the eviction counters.  MR_ESTATE when not
 * counting. */
int mr_lc_count_evict(mr_lifecycle *lc, size_t num_tokens, size_t num_states, mr_node *protect,
                      size_t *tokens_out, size_t *states_out);
/* Takes n KV tokens, first evicting what the release's rule
 * (mr_rule_kv_evict_v) asks for when fewer than evict_below are free.
 * MR_ENOSPC when fewer than n are free after it (nothing taken), and
 * before evicting anything when the free and evictable KV fall short. */
int mr_lc_count_kv(mr_lifecycle *lc, int64_t n, int64_t evict_below);
/* Takes one state slot, evicting one state (keeping `protect`) when none
 * is free; *id its number.  MR_ENOSPC when none can be had. */
int mr_lc_count_slot(mr_lifecycle *lc, mr_node *protect, int64_t *id);
/* HybridReqToTokenPool.alloc's pools for a batch of n_reqs requests whose
 * records mr_lc_admit_ids numbered: `rows` new rows and the `slots` they
 * took, after the scheduler's state eviction for them (the release's rule,
 * mr_rule_state_shortfall).  MR_ENOSPC when the rows or the free and
 * evictable states are short (nothing changed), or the slots after the
 * eviction (nothing taken). */
int mr_lc_count_admit(mr_lifecycle *lc, int64_t n_reqs, int64_t slots, int64_t rows);
/* A finished request's row goes back, with the KV it allocated past its
 * committed length (whole pages: the overlap's step past the finish). */
int mr_lc_count_free_row(mr_lifecycle *lc, int64_t committed_len, int64_t allocated_len);

/* Verifies the tree (mr_radix_check), every pool, that the tree's KV
 * tokens and states equal the TREE-owned units of the pools, and every
 * row's request record Q1..Q6 (top of this file).  MR_ECORRUPT with the
 * invariant's number in msg. */
int mr_lc_check(mr_lifecycle *lc, char *msg, size_t msglen);

#endif /* MR_LIFECYCLE_H */
