/* lc_check.c - the token a refused key view names, the request record by
 * field number, and the checks a front end of the lifecycle makes
 * (lc_check.h). */
#include "lc_check.h"

#include <stddef.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * Key views */

int64_t
mr_key_at(const mr_key *key, size_t i)
{
    return key->width == 8 ? ((const int64_t *)key->p)[i] : (int64_t)((const int32_t *)key->p)[i];
}

/* ------------------------------------------------------------------------
 * The request record by field number */

/* Field i's place in mr_req and its C type: 'q' int64, 't' an int32 index
 * into the two-entry track buffer or -1 (the core indexes the buffer with
 * it), 'I' uint32, 'b' a 0/1 flag, 'n' last_node's id (-1: no node). */
typedef struct {
    size_t off;
    char kind;
} req_field;

static const req_field req_fields[MR_REQ_NFIELDS] = {
    {offsetof(mr_req, running), 'q'},
    {offsetof(mr_req, track[0]), 'q'},
    {offsetof(mr_req, track[1]), 'q'},
    {offsetof(mr_req, next_track), 't'},
    {offsetof(mr_req, last_track_seqlen), 'q'},
    {offsetof(mr_req, branching_seqlen), 'q'},
    {offsetof(mr_req, cow_src), 'q'},
    {offsetof(mr_req, needs_clear), 'b'},
    {offsetof(mr_req, lazy_is_insert), 'b'},
    {offsetof(mr_req, protected_len), 'q'},
    {offsetof(mr_req, last_node.id), 'n'},
    {offsetof(mr_req, last_node.gen), 'I'},
    {offsetof(mr_req, locked), 'b'},
};

int64_t
mr_req_field(const mr_req *rec, int i)
{
    const char *p = (const char *)rec + req_fields[i].off;
    switch (req_fields[i].kind) {
    case 'q':
        return *(const int64_t *)p;
    case 't':
        return *(const int32_t *)p;
    case 'I':
        return *(const uint32_t *)p;
    case 'n':
        return rec->has_node ? (int64_t)rec->last_node.id : -1;
    default:
        return *(const uint8_t *)p;
    }
}

void
mr_req_field_range(int i, int64_t *lo, int64_t *hi)
{
    switch (req_fields[i].kind) {
    case 't':
        *lo = -1;
        *hi = 1;
        break;
    case 'I':
        *lo = 0;
        *hi = UINT32_MAX;
        break;
    case 'n':
        *lo = -1;
        *hi = UINT32_MAX;
        break;
    default:
        *lo = INT64_MIN;
        *hi = INT64_MAX;
        break;
    }
}

void
mr_req_set_field(mr_req *rec, int i, int64_t x)
{
    char *p = (char *)rec + req_fields[i].off;
    switch (req_fields[i].kind) {
    case 'q':
        *(int64_t *)p = x;
        break;
    case 't':
        *(int32_t *)p = (int32_t)x;
        break;
    case 'I':
        *(uint32_t *)p = (uint32_t)x;
        break;
    case 'n':
        rec->has_node = x >= 0;
        rec->last_node.id = (uint32_t)(x >= 0 ? x : 0);
        rec->locked = rec->locked && x >= 0;
        break;
    default:
        *(uint8_t *)p = x != 0;
        break;
    }
}

void
mr_req_from_fields(mr_req *rec, const int64_t *v)
{
    mr_req_reset(rec);
    for (int i = 0; i < MR_REQ_NFIELDS; i++) {
        mr_req_set_field(rec, i, v[i]);
    }
    rec->locked = rec->locked && rec->has_node;   /* locked only with a node */
}

/* ------------------------------------------------------------------------
 * Refusals */

static int
say(mr_lc_why *why, int reason, int64_t at, int64_t other, int64_t value)
{
    why->why = reason;
    why->in_outputs = 0;
    why->at = at;
    why->other = other;
    why->value = value;
    return reason;
}

int
mr_lc_config_check(const mr_lc_config *cfg, int pools, const mr_kv *state, const mr_kv *kv, const mr_reqpool *rp,
                   mr_lc_why *why)
{
    int64_t page = cfg->page_size, chunk = cfg->chunk_size;
    if (page % chunk != 0 && chunk % page != 0) {
        return say(why, MR_LC_WHY_CHUNK_PAGE, 0, page, chunk);
    }
    if (cfg->lazy && (!cfg->extra_buffer || cfg->track_buffer_size != 2)) {
        return say(why, MR_LC_WHY_LAZY, 0, 0, 0);
    }
    if (pools && cfg->no_values) {
        return say(why, MR_LC_WHY_NO_VALUES_POOLS, 0, 0, 0);
    }
    if (!pools) {
        return say(why, MR_LC_WHY_NONE, 0, 0, 0);
    }
    if (state == NULL || kv == NULL || rp == NULL) {
        return say(why, MR_LC_WHY_POOL_TYPE, 0, 0, 0);
    }
    if (state == kv) {
        return say(why, MR_LC_WHY_SAME_POOL, 0, 0, 0);
    }
    if (state->page_size != 1) {
        return say(why, MR_LC_WHY_STATE_PAGE, 0, 0, state->page_size);
    }
    if (kv->page_size != page) {
        return say(why, MR_LC_WHY_KV_PAGE, 0, page, kv->page_size);
    }
    if (rp->pp != cfg->track_buffer_size) {
        return say(why, MR_LC_WHY_TRACK_WIDTH, 0, cfg->track_buffer_size, rp->pp);
    }
    if (!mr_kv_fits_table(kv)) {
        return say(why, MR_LC_WHY_KV_TABLE, 0, 0, (int64_t)(kv->pages.n + 1) * kv->page_size);
    }
    return say(why, MR_LC_WHY_NONE, 0, 0, 0);
}

int
mr_lc_admit_rows_check(const mr_reqpool *rp, const int64_t *rows, size_t n, mr_lc_why *why)
{
    for (size_t i = 0; i < n; i++) {
        if (rows[i] >= 1 && !mr_reqpool_in_use(rp, rows[i])) {
            return say(why, MR_LC_WHY_ROW_FREE, (int64_t)i, 0, rows[i]);
        }
        for (size_t j = 0; rows[i] >= 1 && j < i; j++) {
            if (rows[j] == rows[i]) {
                return say(why, MR_LC_WHY_ROW_TWICE, (int64_t)i, (int64_t)j, rows[i]);
            }
        }
    }
    return say(why, MR_LC_WHY_NONE, 0, 0, 0);
}

int
mr_lc_batch_rows_check(mr_reqpool *rp, const int64_t *rows, size_t n, const mr_lc_batch_keys *keys, size_t nk,
                       size_t no, int step, mr_lc_why *why)
{
    if (keys != NULL && n != nk) {
        return say(why, MR_LC_WHY_KEY_COUNT, (int64_t)n, 0, (int64_t)nk);
    }
    if (keys != NULL && keys->olens != NULL && n != no) {
        say(why, MR_LC_WHY_KEY_COUNT, (int64_t)n, 0, (int64_t)no);
        why->in_outputs = 1;
        return why->why;
    }
    int64_t at = 0;
    if (mr_reqpool_rows_check(rp, rows, n, &at) != MR_OK) {
        if (!mr_reqpool_in_use(rp, rows[at])) {
            return say(why, MR_LC_WHY_ROW_FREE, at, 0, rows[at]);
        }
        int64_t j = 0;
        while (rows[j] != rows[at]) {
            j++;
        }
        return say(why, MR_LC_WHY_ROW_TWICE, at, j, rows[at]);
    }
    for (size_t i = 0; i < n; i++) {
        int64_t c = rp->req[rows[i]].committed;
        if (keys != NULL) {
            size_t len = keys->lens[i] + (keys->olens != NULL ? keys->olens[i] : 0);
            if ((int64_t)len < c) {
                say(why, MR_LC_WHY_ROW_SHORT, (int64_t)i, c, (int64_t)len);
                why->in_outputs = keys->olens != NULL;
                return why->why;
            }
        }
        if (step && c + 1 > rp->max_ctx) {
            return say(why, MR_LC_WHY_ROW_FULL, (int64_t)i, c, rows[i]);
        }
    }
    return say(why, MR_LC_WHY_NONE, 0, 0, 0);
}

int
mr_lc_row_len_check(const mr_reqpool *rp, int64_t row, int64_t len, mr_lc_why *why)
{
    if (!mr_reqpool_in_use(rp, row)) {
        return say(why, MR_LC_WHY_ROW_FREE, 0, rp->size, row);
    }
    if (len > rp->max_ctx) {
        return say(why, MR_LC_WHY_LEN_LONG, 0, rp->max_ctx, len);
    }
    return say(why, MR_LC_WHY_NONE, 0, 0, 0);
}

int
mr_lc_insert_check(const mr_lifecycle *lc, size_t len, size_t nval, int64_t prev_prefix_len, mr_lc_why *why)
{
    uint32_t page = mr_lc_config_of(lc)->page_size;
    if (nval != len) {
        return say(why, MR_LC_WHY_VALUE_COUNT, (int64_t)len, 0, (int64_t)nval);
    }
    if (len % page != 0) {
        return say(why, MR_LC_WHY_KEY_PAGES, (int64_t)len, page, 0);
    }
    if (prev_prefix_len < 0 || (uint64_t)prev_prefix_len > len) {
        return say(why, MR_LC_WHY_PREV_LONG, (int64_t)len, 0, prev_prefix_len);
    }
    return say(why, MR_LC_WHY_NONE, 0, 0, 0);
}

int
mr_lc_keys_fit(const size_t *lens, size_t n, int64_t max_ctx, mr_lc_why *why)
{
    for (size_t i = 0; i < n; i++) {
        if ((int64_t)lens[i] > max_ctx) {
            return say(why, MR_LC_WHY_KEY_LONG, (int64_t)i, max_ctx, (int64_t)lens[i]);
        }
    }
    return say(why, MR_LC_WHY_NONE, 0, 0, 0);
}

/* Token j of key i, when that key is int64 read in place (1), else 0. */
static int
token64(const int64_t *const *k64, size_t i, size_t j, int64_t *out)
{
    if (k64 == NULL || k64[i] == NULL) {
        return 0;
    }
    *out = k64[i][j];
    return 1;
}

int
mr_lc_batch_bad_token(const mr_lc_batch_keys *keys, size_t n, const int64_t *bad, mr_lc_why *why)
{
    int64_t v = 0;
    if (bad == NULL) {   /* the first misfit of any in-place key */
        for (size_t i = 0; keys->keys64 != NULL && i < n; i++) {
            for (size_t j = 0; keys->keys64[i] != NULL && j < keys->lens[i]; j++) {
                v = keys->keys64[i][j];
                if (v < INT32_MIN || v > INT32_MAX) {
                    return say(why, MR_LC_WHY_TOKEN, (int64_t)i, (int64_t)j, v);
                }
            }
        }
        return say(why, MR_LC_WHY_NONE, 0, 0, 0);
    }
    if (bad[0] < 0 || bad[1] < 0 || (size_t)bad[0] >= n) {
        return say(why, MR_LC_WHY_NONE, 0, 0, 0);
    }
    size_t i = (size_t)bad[0], j = (size_t)bad[1];
    if (keys->olens == NULL || j < keys->lens[i]) {
        return token64(keys->keys64, i, j, &v) ? say(why, MR_LC_WHY_TOKEN, bad[0], bad[1], v)
                                               : say(why, MR_LC_WHY_NONE, 0, 0, 0);
    }
    j -= keys->lens[i];
    if (!token64(keys->outs64, i, j, &v)) {
        return say(why, MR_LC_WHY_NONE, 0, 0, 0);
    }
    say(why, MR_LC_WHY_TOKEN, bad[0], (int64_t)j, v);
    why->in_outputs = 1;
    return why->why;
}

int
mr_lc_insert_why(const mr_kv *kv, int rc, const int64_t *val, int64_t bad, mr_lc_why *why)
{
    if (bad < 0 || rc != MR_EINVAL) {
        return say(why, MR_LC_WHY_NONE, 0, 0, 0);
    }
    int64_t x = val[bad];
    /* an index within the pool was refused for being listed twice */
    int within = x >= 0 && kv != NULL && x / kv->page_size <= kv->pages.n;
    return say(why, within ? MR_LC_WHY_KV_TWICE : MR_LC_WHY_KV_RANGE, bad, 0, x);
}
