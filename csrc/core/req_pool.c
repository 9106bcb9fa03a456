/* req_pool.c - request rows, the req-to-token table and request records
 * (req_pool.h). */
#include "req_pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

void
mr_req_reset(mr_req *st)
{
    memset(st, 0, sizeof(*st));
    st->running = -1;
    st->track[0] = st->track[1] = -1;
    st->next_track = -1;
    st->lazy_is_insert = 1;
    st->last_track_seqlen = -1;
    st->branching_seqlen = -1;
    st->cow_src = -1;
}

/* ------------------------------------------------------------------------
 * Lifetime */

int
mr_reqpool_init(mr_reqpool *p, int64_t size, int64_t max_ctx, int32_t pp)
{
    memset(p, 0, sizeof(*p));
    if (size < 0 || max_ctx < 1 || (pp != 1 && pp != 2)) {
        return MR_EINVAL;
    }
    size_t rows = (size_t)size + 1;
    if ((size_t)max_ctx > SIZE_MAX / sizeof(int32_t) / rows) {
        return MR_EINVAL;
    }
    int rc = mr_slots_init(&p->rows, size);
    if (rc != MR_OK) {
        return rc;
    }
    p->table = MR_CALLOC(rows * (size_t)max_ctx, sizeof(int32_t));
    p->state_map = MR_CALLOC(rows, sizeof(int32_t));
    p->track_map = MR_CALLOC(rows * (size_t)pp, sizeof(int64_t));
    p->req = MR_MALLOC(rows * sizeof(mr_req));
    p->gen = MR_CALLOC(rows, sizeof(uint32_t));
    p->bound = MR_CALLOC(rows, sizeof(uint8_t));
    p->dirty_lo = MR_MALLOC(rows * sizeof(int64_t));
    p->dirty_hi = MR_MALLOC(rows * sizeof(int64_t));
    p->dirty_rows = MR_MALLOC(rows * sizeof(int64_t));
    if (p->table == NULL || p->state_map == NULL || p->track_map == NULL || p->req == NULL
        || p->gen == NULL || p->bound == NULL
        || p->dirty_lo == NULL || p->dirty_hi == NULL || p->dirty_rows == NULL) {
        mr_reqpool_destroy(p);
        return MR_ENOMEM;
    }
    p->size = size;
    p->max_ctx = max_ctx;
    p->pp = pp;
    for (size_t r = 0; r < rows; r++) {
        mr_req_reset(&p->req[r]);
        p->dirty_lo[r] = p->dirty_hi[r] = 0;
    }
    p->ndirty = 0;
    return MR_OK;
}

void
mr_reqpool_destroy(mr_reqpool *p)
{
    mr_slots_destroy(&p->rows);
    MR_FREE(p->table);
    MR_FREE(p->state_map);
    MR_FREE(p->track_map);
    MR_FREE(p->req);
    MR_FREE(p->gen);
    MR_FREE(p->bound);
    MR_FREE(p->dirty_lo);
    MR_FREE(p->dirty_hi);
    MR_FREE(p->dirty_rows);
    memset(p, 0, sizeof(*p));
}

void
mr_reqpool_clear(mr_reqpool *p)
{
    mr_slots_clear(&p->rows);
    memset(p->state_map, 0, ((size_t)p->size + 1) * sizeof(int32_t));
    memset(p->track_map, 0, ((size_t)p->size + 1) * (size_t)p->pp * sizeof(int64_t));
    for (int64_t r = 0; r <= p->size; r++) {
        mr_req_reset(&p->req[r]);
        p->bound[r] = 0;
        p->gen[r]++;
    }
}

/* ------------------------------------------------------------------------
 * Rows */

int
mr_reqpool_alloc(mr_reqpool *p, int64_t k, int64_t *out)
{
    int rc = mr_slots_alloc(&p->rows, k, MR_OWNER_HELD, out);
    if (rc == MR_OK) {
        for (int64_t i = 0; i < k; i++) {
            mr_req_reset(&p->req[out[i]]);
            p->bound[out[i]] = 0;
            p->gen[out[i]]++;
        }
    }
    return rc;
}

int
mr_reqpool_free(mr_reqpool *p, int64_t r)
{
    return mr_reqpool_free_record(p, r, NULL);
}

int
mr_reqpool_free_record(mr_reqpool *p, int64_t r, mr_req *out)
{
    if (r < 0 || r > p->size) {
        return MR_EINVAL;
    }
    mr_req rec;
    mr_reqpool_load(p, r, &rec);
    int rc = mr_slots_free(&p->rows, &r, 1, MR_FROM_CALLER, 0, NULL);
    if (rc == MR_OK) {
        if (out != NULL) {
            *out = rec;
        }
        mr_req_reset(&p->req[r]);
        p->bound[r] = 0;
        p->gen[r]++;
    }
    return rc;
}

int
mr_reqpool_unbind(mr_reqpool *p, int64_t r, mr_req *out)
{
    if (!mr_reqpool_in_use(p, r)) {
        return MR_EINVAL;
    }
    if (out != NULL) {
        mr_reqpool_load(p, r, out);
    }
    mr_req_reset(&p->req[r]);
    p->bound[r] = 0;
    return MR_OK;
}

void
mr_reqpool_load(const mr_reqpool *p, int64_t r, mr_req *out)
{
    *out = p->req[r];
    if (p->bound[r] & MR_ROW_BOUND) {
        for (int32_t j = 0; j < p->pp; j++) {
            out->track[j] = p->track_map[(size_t)r * (size_t)p->pp + (size_t)j];
        }
    }
}

void
mr_reqpool_store(mr_reqpool *p, int64_t r, const mr_req *st)
{
    if (p->bound[r] & (MR_ROW_GAVE_RUNNING | MR_ROW_GAVE_TRACK0 | MR_ROW_GAVE_TRACK1)) {
        mr_req old;
        mr_reqpool_load(p, r, &old);
        p->bound[r] &= (uint8_t)~((old.running != st->running ? MR_ROW_GAVE_RUNNING : 0)
                                  | (old.track[0] != st->track[0] ? MR_ROW_GAVE_TRACK0 : 0)
                                  | (old.track[1] != st->track[1] ? MR_ROW_GAVE_TRACK1 : 0));
    }
    p->req[r] = *st;
    if (p->bound[r] & MR_ROW_BOUND) {
        for (int32_t j = 0; j < p->pp; j++) {
            p->track_map[(size_t)r * (size_t)p->pp + (size_t)j] = st->track[j];
        }
    }
}

int
mr_reqpool_bind(mr_reqpool *p, int64_t r, const mr_req *st)
{
    if (!mr_reqpool_in_use(p, r)) {
        return MR_EINVAL;
    }
    p->req[r] = *st;
    p->bound[r] = MR_ROW_BOUND;
    mr_reqpool_sync_maps(p, r, st);
    return MR_OK;
}

uint32_t
mr_reqpool_gen(const mr_reqpool *p, int64_t r)
{
    return r >= 0 && r <= p->size ? p->gen[r] : 0;
}

int
mr_reqpool_in_use(const mr_reqpool *p, int64_t r)
{
    return r >= 1 && r <= p->size && p->rows.owner[r] != MR_OWNER_FREE;
}

int
mr_reqpool_rows_check(mr_reqpool *p, const int64_t *rows, size_t n, int64_t *bad)
{
    uint8_t *mark = p->rows.mark;
    size_t i = 0;
    for (; i < n; i++) {
        if (!mr_reqpool_in_use(p, rows[i]) || mark[rows[i]]) {
            break;
        }
        mark[rows[i]] = 1;
    }
    for (size_t j = 0; j < i; j++) {
        mark[rows[j]] = 0;
    }
    if (i < n) {
        *bad = (int64_t)i;
        return MR_EINVAL;
    }
    return MR_OK;
}

/* ------------------------------------------------------------------------
 * Table */

void
mr_reqpool_mark_dirty(mr_reqpool *p, int64_t r, int64_t start, int64_t end)
{
    if (r < 0 || r > p->size || end <= start) {
        return;
    }
    if (p->dirty_hi[r] <= p->dirty_lo[r]) {
        p->dirty_rows[p->ndirty++] = r;
        p->dirty_lo[r] = start;
        p->dirty_hi[r] = end;
        return;
    }
    if (start < p->dirty_lo[r]) {
        p->dirty_lo[r] = start;
    }
    if (end > p->dirty_hi[r]) {
        p->dirty_hi[r] = end;
    }
}

int
mr_reqpool_write(mr_reqpool *p, int64_t r, int64_t start, const int64_t *vals, int64_t n)
{
    if (start < 0 || start > p->max_ctx) {   /* refused for n == 0 too */
        return MR_EINVAL;
    }
    int64_t bad;
    return mr_reqpool_write_cols(p, r, start, 1, n, vals, (int)sizeof(int64_t), (int64_t)sizeof(int64_t), &bad);
}

int
mr_reqpool_write_trusted(mr_reqpool *p, int64_t r, int64_t start, const int64_t *vals, int64_t n)
{
    if (r < 0 || r > p->size || n < 0 || start < 0 || start > p->max_ctx || n > p->max_ctx - start) {
        return MR_EINVAL;
    }
#ifdef MR_VERIFY_TRUSTED
    if (!mr_fits_i32(vals, (size_t)n)) {
        abort();   /* a caller's "validated" value does not fit the table */
    }
#endif
    int32_t *dst = p->table + (size_t)r * (size_t)p->max_ctx + start;
    for (int64_t i = 0; i < n; i++) {
        dst[i] = (int32_t)vals[i];
    }
    if (n > 0) {
        mr_reqpool_mark_dirty(p, r, start, start + n);
    }
    return MR_OK;
}

int32_t *
mr_reqpool_span(mr_reqpool *p, int64_t r, int64_t start, int64_t n)
{
    if (r < 0 || r > p->size || n < 0 || start < 0 || start > p->max_ctx || n > p->max_ctx - start) {
        return NULL;
    }
    return p->table + (size_t)r * (size_t)p->max_ctx + start;
}

int
mr_reqpool_write_cols(mr_reqpool *p, int64_t r, int64_t start, int64_t step, int64_t n, const void *vals,
                      int width, int64_t vstride, int64_t *bad)
{
    *bad = -1;
    int64_t last = n > 0 ? start + (n - 1) * step : start;
    if (r < 0 || r > p->size || n < 0 || (width != 4 && width != 8)
        || (n > 0 && (start < 0 || start >= p->max_ctx || last < 0 || last >= p->max_ctx))) {
        return MR_EINVAL;
    }
    const char *v = vals;
    const int contiguous = step == 1 && vstride == width;
    if (width == 8) {   /* int64 values: each must fit the int32 table */
        /* contiguous: one branch-free pass (mr_fits_i32); the first misfit
         * is then looked for */
        const int fits = contiguous && mr_fits_i32(vals, (size_t)n);
        for (int64_t i = 0; !fits && i < n; i++) {
            int64_t x = *(const int64_t *)(v + i * vstride);
            if (x < INT32_MIN || x > INT32_MAX) {
                *bad = i;
                return MR_EINVAL;
            }
        }
    }
    int32_t *row = p->table + (size_t)r * (size_t)p->max_ctx;
    if (contiguous && width == 4) {
        memcpy(row + start, vals, (size_t)n * sizeof(int32_t));
    }
    else if (contiguous) {
        const int64_t *x = vals;
        int32_t *dst = row + start;
        for (int64_t i = 0; i < n; i++) {
            dst[i] = (int32_t)x[i];
        }
    }
    else if (width == 4) {
        for (int64_t i = 0; i < n; i++) {
            row[start + i * step] = *(const int32_t *)(v + i * vstride);
        }
    }
    else {
        for (int64_t i = 0; i < n; i++) {
            row[start + i * step] = (int32_t)*(const int64_t *)(v + i * vstride);
        }
    }
    if (n > 0) {
        mr_reqpool_mark_dirty(p, r, step > 0 ? start : last, (step > 0 ? last : start) + 1);
    }
    return MR_OK;
}

int
mr_reqpool_assign(mr_reqpool *p, int64_t r, int64_t start, int64_t step, int64_t n, const void *vals, int width,
                  int64_t nv, int64_t vstride, int *why, int64_t *bad, int64_t *val)
{
    *why = 0;
    *bad = -1;
    *val = 0;
    if (nv != n && nv != 1) {
        *why = MR_RP_ASSIGN_COUNT;
        return MR_EINVAL;
    }
    int64_t i = -1;
    if (mr_reqpool_write_cols(p, r, start, step, n, vals, width, nv == 1 ? 0 : vstride, &i) == MR_OK) {
        return MR_OK;
    }
    if (i < 0) {
        *why = MR_RP_ASSIGN_COLS;
        return MR_EINVAL;
    }
    /* only int64 values can fail to fit; a broadcast one is values[0] */
    *why = MR_RP_ASSIGN_VALUE;
    *bad = nv == 1 ? 0 : i;
    *val = *(const int64_t *)((const char *)vals + *bad * vstride);
    return MR_EINVAL;
}

int
mr_reqpool_overlaps(const mr_reqpool *p, const void *vals, int width, int64_t nv, int64_t vstride)
{
    if (nv <= 0) {
        return 0;
    }
    const char *lo = vals, *hi = vals;
    if (vstride >= 0) {
        hi += (nv - 1) * vstride + width;
    }
    else {
        lo += (nv - 1) * vstride;
        hi += width;
    }
    const char *t = (const char *)p->table;
    size_t tb = (size_t)(p->size + 1) * (size_t)p->max_ctx * sizeof(int32_t);
    return lo < t + tb && t < hi;
}

int
mr_reqpool_row_index(const mr_reqpool *p, int64_t r, int64_t *out)
{
    const int64_t rows = p->size + 1;
    if (r < -rows || r >= rows) {
        return MR_EINVAL;
    }
    *out = r < 0 ? r + rows : r;
    return MR_OK;
}

int
mr_reqpool_read(const mr_reqpool *p, int64_t r, int64_t start, int64_t n, int64_t *out)
{
    if (r < 0 || r > p->size || start < 0 || n < 0 || start > p->max_ctx || n > p->max_ctx - start) {
        return MR_EINVAL;
    }
    const int32_t *row = p->table + (size_t)r * (size_t)p->max_ctx + start;
    for (int64_t i = 0; i < n; i++) {
        out[i] = row[i];
    }
    return MR_OK;
}

int64_t
mr_reqpool_take_dirty(mr_reqpool *p, int64_t *rows, int64_t *starts, int64_t *ends, int64_t cap)
{
    int64_t m = p->ndirty < cap ? p->ndirty : (cap > 0 ? cap : 0);
    for (int64_t i = 0; i < m; i++) {
        int64_t r = p->dirty_rows[i];
        rows[i] = r;
        starts[i] = p->dirty_lo[r];
        ends[i] = p->dirty_hi[r];
        p->dirty_lo[r] = p->dirty_hi[r] = 0;
    }
    /* keep the ones not taken, in order */
    memmove(p->dirty_rows, p->dirty_rows + m, (size_t)(p->ndirty - m) * sizeof(int64_t));
    p->ndirty -= m;
    return m;
}

void
mr_reqpool_sync_maps(mr_reqpool *p, int64_t r, const mr_req *st)
{
    if (r < 1 || r > p->size) {
        return;
    }
    p->state_map[r] = st->running >= 0 ? (int32_t)st->running : 0;
    for (int32_t j = 0; j < p->pp; j++) {
        p->track_map[(size_t)r * (size_t)p->pp + (size_t)j] = st->track[j];
    }
}

int
mr_reqpool_check(const mr_reqpool *p, char *msg, size_t msglen)
{
    int rc = mr_slots_check(&p->rows, msg, msglen);
    if (rc != MR_OK) {
        return rc;
    }
    if (p->rows.n_req != 0 || p->rows.n_tree != 0) {
        snprintf(msg, msglen, "request rows owned by a request or the tree");
        return MR_ECORRUPT;
    }
    for (int64_t r = 0; r <= p->size; r++) {
        if (p->bound[r] && !mr_reqpool_in_use(p, r)) {
            snprintf(msg, msglen, "free request row %lld is bound to a request's record", (long long)r);
            return MR_ECORRUPT;
        }
    }
    return MR_OK;
}
