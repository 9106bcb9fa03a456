/* lc_check.h - what a front end of the lifecycle (lifecycle.h) decides
 * before and after a call, so that each front end only converts its
 * arguments and words the answer:
 *
 *   - the token a refusal of a key view (mr_key, lifecycle.h) names;
 *   - the request record's fields in the order of the 13-tuple a front end
 *     exchanges (mr_req, req_pool.h), read and set by number;
 *   - the checks of a Lifecycle's configuration and pools, of admit's rows,
 *     of a batch call's rows and keys, and what a refused insert or a
 *     refused in-place key means: each returns a reason (MR_LC_WHY_*) with
 *     the entries it names, never a message.
 *
 * Nothing here changes a lifecycle or a pool. */
#ifndef MR_LC_CHECK_H
#define MR_LC_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle.h"

/* The token at position i of an int64 key (the one a refusal names). */
int64_t mr_key_at(const mr_key *key, size_t i);

/* ------------------------------------------------------------------------
 * The request record by field number: 0 running, 1 track0, 2 track1,
 * 3 next_track, 4 last_track_seqlen, 5 branching_seqlen, 6 cow_src,
 * 7 needs_clear, 8 lazy_is_insert, 9 protected_len, 10 node_id (-1: no
 * node), 11 node_gen, 12 locked. */
enum { MR_REQ_NFIELDS = 13 };

/* Field i's value. */
int64_t mr_req_field(const mr_req *rec, int i);
/* The values field i takes: [*lo, *hi] (a flag takes any int64, nonzero
 * meaning 1; next_track only -1, 0 and 1: the core indexes the record's
 * two-entry track buffer with it). */
void mr_req_field_range(int i, int64_t *lo, int64_t *hi);
/* Sets field i to x (narrowed to its C type; a flag to x != 0; node_id -1
 * drops the node and its lock). */
void mr_req_set_field(mr_req *rec, int i, int64_t x);
/* A record from the 13 values v (locked only with a node). */
void mr_req_from_fields(mr_req *rec, const int64_t *v);

/* ------------------------------------------------------------------------
 * Refusals: a reason and the entries it names. */

enum {
    MR_LC_WHY_NONE = 0,
    /* the configuration and pools of a new lifecycle (mr_lc_config_check) */
    MR_LC_WHY_CHUNK_PAGE,       /* neither of chunk_size and page_size divides the other */
    MR_LC_WHY_LAZY,             /* lazy without extra_buffer and track_buffer_size 2 */
    MR_LC_WHY_NO_VALUES_POOLS,  /* no_values with pools */
    MR_LC_WHY_POOL_TYPE,        /* some of the pools given, not all three */
    MR_LC_WHY_SAME_POOL,        /* one allocator for the states and the KV */
    MR_LC_WHY_STATE_PAGE,       /* a state allocator whose page size is not 1 */
    MR_LC_WHY_KV_PAGE,          /* a KV allocator of another page size */
    MR_LC_WHY_TRACK_WIDTH,      /* a ReqPool of another track_buffer_size */
    MR_LC_WHY_KV_TABLE,         /* more KV tokens than the table's int32 indices */
    /* rows (admit, the batch calls) */
    MR_LC_WHY_ROW_FREE,         /* rows[at] is not a row in use */
    MR_LC_WHY_ROW_TWICE,        /* rows[at] is rows[other] too */
    MR_LC_WHY_ROW_SHORT,        /* keys[at] (with its outputs) has value tokens, fewer than other committed */
    MR_LC_WHY_ROW_FULL,         /* rows[at] has other tokens, max_context_len */
    MR_LC_WHY_KEY_COUNT,        /* keys (or outputs, in_outputs) have value entries, rows at */
    MR_LC_WHY_KEY_LONG,         /* keys[at] has value tokens, more than max_context_len */
    MR_LC_WHY_LEN_LONG,         /* a request's length value is more than max_context_len other */
    /* an insert's arguments (mr_lc_insert_check), for a key of at tokens */
    MR_LC_WHY_VALUE_COUNT,      /* value KV indices */
    MR_LC_WHY_KEY_PAGES,        /* not whole pages of other tokens */
    MR_LC_WHY_PREV_LONG,        /* prev_prefix_len value is longer than the key */
    /* a token of an int64 key outside int32: keys[at][other] (or
     * outputs[at][other], in_outputs) = value */
    MR_LC_WHY_TOKEN,
    /* a refused insert's KV index val[at] = value */
    MR_LC_WHY_KV_RANGE,         /* out of range */
    MR_LC_WHY_KV_TWICE,         /* listed twice past the tree's own prefix */
};

typedef struct {
    int why;
    int in_outputs;
    int64_t at;
    int64_t other;
    int64_t value;
} mr_lc_why;

/* A new lifecycle's configuration, and with pools (pools != 0: state, kv
 * and rp, NULL for an argument that is not one) the pools against it: the
 * first problem, or MR_LC_WHY_NONE. */
int mr_lc_config_check(const mr_lc_config *cfg, int pools, const mr_kv *state, const mr_kv *kv,
                       const mr_reqpool *rp, mr_lc_why *why);

/* admit's rows: every row >= 1 in use and listed once (a row < 1 gets a
 * new row): MR_LC_WHY_ROW_FREE or MR_LC_WHY_ROW_TWICE, or MR_LC_WHY_NONE. */
int mr_lc_admit_rows_check(const mr_reqpool *rp, const int64_t *rows, size_t n, mr_lc_why *why);

/* A batch call's n rows (mr_reqpool_rows_check: each in use, listed once)
 * and, where keys is not NULL, its keys: as many as rows (and outputs, when
 * keys->olens is not NULL), each key with its outputs at least its row's
 * committed length (keys->lens and olens give the lengths of nk keys);
 * step: each row with room for one more token.  The first problem, or
 * MR_LC_WHY_NONE. */
int mr_lc_batch_rows_check(mr_reqpool *rp, const int64_t *rows, size_t n, const mr_lc_batch_keys *keys,
                           size_t nk, size_t no, int step, mr_lc_why *why);

/* A per-request call's row and length: the row in use (MR_LC_WHY_ROW_FREE,
 * value the row, other the pool's size), the length within the table's
 * max_context_len (MR_LC_WHY_LEN_LONG). */
int mr_lc_row_len_check(const mr_reqpool *rp, int64_t row, int64_t len, mr_lc_why *why);

/* mr_lc_insert's shape: nval KV indices for len tokens, whole pages,
 * prev_prefix_len at most len. */
int mr_lc_insert_check(const mr_lifecycle *lc, size_t len, size_t nval, int64_t prev_prefix_len, mr_lc_why *why);

/* prefill_batch's keys: each at most max_ctx tokens (MR_LC_WHY_KEY_LONG). */
int mr_lc_keys_fit(const size_t *lens, size_t n, int64_t max_ctx, mr_lc_why *why);

/* After a batch call refused its in-place keys (MR_EINVAL): the token
 * bad = {request, position in its sequence} names (MR_LC_WHY_TOKEN), or
 * with bad NULL the first token of any in-place key outside int32;
 * MR_LC_WHY_NONE when there is none (the refusal was another). */
int mr_lc_batch_bad_token(const mr_lc_batch_keys *keys, size_t n, const int64_t *bad, mr_lc_why *why);

/* What a refused mr_lc_insert's rc and *bad mean for the KV index val[bad]
 * (bad >= 0) of a lifecycle with pools (kv: its KV allocator): with
 * MR_EINVAL, out of range or listed twice; MR_LC_WHY_NONE otherwise. */
int mr_lc_insert_why(const mr_kv *kv, int rc, const int64_t *val, int64_t bad, mr_lc_why *why);

#endif /* MR_LC_CHECK_H */
