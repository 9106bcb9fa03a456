/* test_req_pool.c - csrc/core/req_pool.c against a small independent model,
 * without Python.
 *
 *   --units   hand-written cases with literal expected values: rows handed
 *             out FIFO (row 0 never), the int32 req-to-token table, the
 *             row -> state slot and row -> ping-pong buffer maps, request
 *             records reset on alloc, free and clear, dirty ranges (union per
 *             row, first-touch order, partial takes), and every error code;
 *             A request's record moved into its row (mr_reqpool_bind) and
 *             out again (mr_reqpool_free_record, mr_reqpool_unbind), a
 *             bound row's track entries read from and written to its track
 *             map (mr_reqpool_load / _store), the given-away marks cleared
 *             by a changed field, the row generation on every take and free;
 *   --check   mr_reqpool_check() must report a row owned by a request or the
 *             tree, a free row still bound, and a broken row allocator;
 *   --fuzz    random calls (alloc, free, write, read, mark_dirty,
 *             take_dirty, sync_maps, clear, in_use), each made on the model
 *             too (free rows oldest first, the table as int64, both maps,
 *             per-row dirty ranges); after every call the return codes, the
 *             rows handed out, the table, the maps, the dirty ranges and the
 *             records of the rows handed out agree, and mr_reqpool_check()
 *             passes;
 *   --oom     (a build with -DMR_FAULT_INJECT) each allocation of
 *             mr_reqpool_init() made to fail in turn: MR_ENOMEM, the pool
 *             zeroed, nothing leaked.
 * Default: every group.  --seed N, --ops N (fuzz calls in all).  Exits 1 when
 * a check failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "req_pool.h"
#include "unit.h"

enum { MAXR = 12, MAXC = 24 };

/* A fresh record, written out field by field. */
static int
is_fresh(const mr_req *q)
{
    return q->running == -1 && q->track[0] == -1 && q->track[1] == -1 && q->next_track == -1
           && q->needs_clear == 0 && q->lazy_is_insert == 1 && q->has_node == 0 && q->locked == 0
           && q->last_track_seqlen == -1 && q->branching_seqlen == -1 && q->cow_src == -1
           && q->protected_len == 0 && q->prefix_len == 0 && q->committed == 0 && q->last_node.id == 0 && q->last_node.gen == 0;
}

/* What a lifecycle leaves in a record it used. */
static void
scribble(mr_req *q)
{
    memset(q, 0x5a, sizeof(*q));
}

/* ------------------------------------------------------------------------
 * The model */

typedef struct {
    int64_t size, max_ctx;
    int32_t pp;
    int64_t fifo[MAXR];            /* free rows, oldest first */
    int64_t nfree;
    uint8_t used[MAXR + 1];
    int64_t table[MAXR + 1][MAXC];
    int64_t state_map[MAXR + 1];
    int64_t track_map[MAXR + 1][2];
    int64_t lo[MAXR + 1], hi[MAXR + 1];
    int64_t order[MAXR + 1];       /* rows with a dirty range, first touch first */
    int64_t norder;
} rmodel;

static void
rm_clear_rows(rmodel *m)
{
    m->nfree = m->size;
    for (int64_t r = 1; r <= m->size; r++) {
        m->fifo[r - 1] = r;
        m->used[r] = 0;
    }
    memset(m->state_map, 0, sizeof(m->state_map));
    memset(m->track_map, 0, sizeof(m->track_map));
}

static void
rm_init(rmodel *m, int64_t size, int64_t max_ctx, int32_t pp)
{
    memset(m, 0, sizeof(*m));
    m->size = size;
    m->max_ctx = max_ctx;
    m->pp = pp;
    rm_clear_rows(m);
}

static int
rm_alloc(rmodel *m, int64_t k, int64_t *out)
{
    if (k < 0) {
        return MR_EINVAL;
    }
    if (k > m->nfree) {
        return MR_ENOSPC;
    }
    for (int64_t i = 0; i < k; i++) {
        out[i] = m->fifo[i];
        m->used[out[i]] = 1;
    }
    memmove(m->fifo, m->fifo + k, (size_t)(m->nfree - k) * sizeof(int64_t));
    m->nfree -= k;
    return MR_OK;
}

static int
rm_free(rmodel *m, int64_t r)
{
    if (r < 1 || r > m->size) {
        return MR_EINVAL;
    }
    if (!m->used[r]) {
        return MR_ENOENT;
    }
    m->used[r] = 0;
    m->fifo[m->nfree++] = r;
    return MR_OK;
}

static void
rm_mark(rmodel *m, int64_t r, int64_t a, int64_t b)
{
    if (r < 0 || r > m->size || b <= a) {
        return;
    }
    int64_t i = 0;
    while (i < m->norder && m->order[i] != r) {
        i++;
    }
    if (i == m->norder) {
        m->order[m->norder++] = r;
        m->lo[r] = a;
        m->hi[r] = b;
        return;
    }
    m->lo[r] = a < m->lo[r] ? a : m->lo[r];
    m->hi[r] = b > m->hi[r] ? b : m->hi[r];
}

static int
rm_span_ok(const rmodel *m, int64_t r, int64_t a, int64_t n)
{
    return r >= 0 && r <= m->size && a >= 0 && n >= 0 && a + n <= m->max_ctx;
}

static int
rm_write(rmodel *m, int64_t r, int64_t a, const int64_t *v, int64_t n)
{
    if (!rm_span_ok(m, r, a, n)) {
        return MR_EINVAL;
    }
    for (int64_t i = 0; i < n; i++) {
        if (v[i] != (int64_t)(int32_t)v[i]) {
            return MR_EINVAL;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        m->table[r][a + i] = v[i];
    }
    rm_mark(m, r, a, a + n);
    return MR_OK;
}

static int64_t
rm_take(rmodel *m, int64_t *rows, int64_t *lo, int64_t *hi, int64_t cap)
{
    int64_t k = cap < 0 ? 0 : (cap < m->norder ? cap : m->norder);
    for (int64_t i = 0; i < k; i++) {
        rows[i] = m->order[i];
        lo[i] = m->lo[rows[i]];
        hi[i] = m->hi[rows[i]];
    }
    memmove(m->order, m->order + k, (size_t)(m->norder - k) * sizeof(int64_t));
    m->norder -= k;
    return k;
}

static void
rm_sync(rmodel *m, int64_t r, const mr_req *q)
{
    if (r < 1 || r > m->size) {
        return;
    }
    m->state_map[r] = q->running < 0 ? 0 : q->running;
    for (int j = 0; j < m->pp; j++) {
        m->track_map[r][j] = q->track[j];
    }
}

/* ------------------------------------------------------------------------
 * Comparison */

static int
same(const mr_reqpool *p, const rmodel *m, const char *where)
{
    char msg[256];
    int before = unit_errors;
    CHECK(mr_reqpool_check(p, msg, sizeof(msg)) == MR_OK, "%s: mr_reqpool_check: %s", where, msg);
    CHECK(mr_slots_available(&p->rows) == m->nfree, "%s: %lld rows free, model %lld", where,
          (long long)mr_slots_available(&p->rows), (long long)m->nfree);
    if (unit_errors != before) {
        return 0;
    }
    for (int64_t i = 0; i < m->nfree; i++) {
        CHECK(p->rows.ring[(p->rows.head + i) % p->rows.n] == m->fifo[i], "%s: free row %lld", where, (long long)i);
    }
    for (int64_t r = -2; r <= m->size + 2; r++) {
        int want = r >= 1 && r <= m->size && m->used[r];
        CHECK(mr_reqpool_in_use(p, r) == want, "%s: in_use(%lld) = %d", where, (long long)r,
              mr_reqpool_in_use(p, r));
    }
    for (int64_t r = 0; r <= m->size && unit_errors == before; r++) {
        for (int64_t c = 0; c < m->max_ctx; c++) {
            CHECK(p->table[r * m->max_ctx + c] == m->table[r][c], "%s: table[%lld, %lld] = %d, model %lld", where,
                  (long long)r, (long long)c, p->table[r * m->max_ctx + c], (long long)m->table[r][c]);
        }
        CHECK(p->state_map[r] == m->state_map[r], "%s: state_map[%lld]", where, (long long)r);
        for (int j = 0; j < m->pp; j++) {
            CHECK(p->track_map[r * m->pp + j] == m->track_map[r][j], "%s: track_map[%lld, %d]", where, (long long)r, j);
        }
    }
    CHECK(p->ndirty == m->norder, "%s: %lld dirty rows, model %lld", where, (long long)p->ndirty,
          (long long)m->norder);
    for (int64_t i = 0; unit_errors == before && i < m->norder; i++) {
        int64_t r = m->order[i];
        CHECK(p->dirty_rows[i] == r && p->dirty_lo[r] == m->lo[r] && p->dirty_hi[r] == m->hi[r],
              "%s: dirty range %lld: row %lld [%lld, %lld), model row %lld [%lld, %lld)", where, (long long)i,
              (long long)p->dirty_rows[i], (long long)p->dirty_lo[p->dirty_rows[i]],
              (long long)p->dirty_hi[p->dirty_rows[i]], (long long)r, (long long)m->lo[r], (long long)m->hi[r]);
    }
    return unit_errors == before;
}

/* ------------------------------------------------------------------------
 * --units */

static void
expect_row(const mr_reqpool *p, int64_t r, const int64_t *want, const char *what)
{
    int64_t got[MAXC];
    CHECK_RC(mr_reqpool_read(p, r, 0, p->max_ctx, got), MR_OK, what);
    for (int64_t c = 0; c < p->max_ctx; c++) {
        CHECK(got[c] == want[c], "%s: column %lld = %lld, expected %lld", what, (long long)c, (long long)got[c],
              (long long)want[c]);
    }
}

static void
expect_dirty(mr_reqpool *p, int64_t cap, int64_t n, const int64_t *want, const char *what)
{
    int64_t rows[MAXR + 1], lo[MAXR + 1], hi[MAXR + 1];
    int64_t got = mr_reqpool_take_dirty(p, rows, lo, hi, cap);
    CHECK(got == n, "%s: %lld ranges, expected %lld", what, (long long)got, (long long)n);
    for (int64_t i = 0; i < n && i < got; i++) {
        CHECK(rows[i] == want[3 * i] && lo[i] == want[3 * i + 1] && hi[i] == want[3 * i + 2],
              "%s: range %lld is row %lld [%lld, %lld), expected row %lld [%lld, %lld)", what, (long long)i,
              (long long)rows[i], (long long)lo[i], (long long)hi[i], (long long)want[3 * i],
              (long long)want[3 * i + 1], (long long)want[3 * i + 2]);
    }
}

static void
test_rows_and_records(void)
{
    mr_reqpool p;
    int64_t r[4];
    mr_req q;
    mr_req_reset(&q);
    CHECK(is_fresh(&q), "mr_req_reset");
    CHECK_RC(mr_reqpool_init(&p, 3, 8, 2), MR_OK, "init 3 x 8");
    for (int64_t i = 0; i <= 3; i++) {
        CHECK(is_fresh(&p.req[i]), "record %lld fresh after init", (long long)i);
    }
    CHECK(mr_slots_available(&p.rows) == 3 && !mr_reqpool_in_use(&p, 0), "3 rows free, row 0 never");
    CHECK_RC(mr_reqpool_alloc(&p, 2, r), MR_OK, "alloc 2");
    CHECK(r[0] == 1 && r[1] == 2 && mr_reqpool_in_use(&p, 1) && mr_reqpool_in_use(&p, 2), "rows 1, 2");
    CHECK_RC(mr_reqpool_alloc(&p, 2, r), MR_ENOSPC, "alloc 2 of 1");
    CHECK_RC(mr_reqpool_alloc(&p, -1, r), MR_EINVAL, "alloc -1");
    CHECK(mr_slots_available(&p.rows) == 1, "a refused alloc takes nothing");
    scribble(&p.req[2]);
    CHECK_RC(mr_reqpool_free(&p, 2), MR_OK, "free 2");
    CHECK(is_fresh(&p.req[2]) && !mr_reqpool_in_use(&p, 2), "free resets the record");
    CHECK_RC(mr_reqpool_free(&p, 2), MR_ENOENT, "free 2 again");
    CHECK_RC(mr_reqpool_free(&p, 0), MR_EINVAL, "free row 0");
    CHECK_RC(mr_reqpool_free(&p, 4), MR_EINVAL, "free row 4");
    CHECK_RC(mr_reqpool_free(&p, -1), MR_EINVAL, "free row -1");
    scribble(&p.req[3]);
    scribble(&p.req[2]);
    CHECK_RC(mr_reqpool_alloc(&p, 2, r), MR_OK, "alloc 2");
    CHECK(r[0] == 3 && r[1] == 2, "FIFO: rows %lld, %lld", (long long)r[0], (long long)r[1]);
    CHECK(is_fresh(&p.req[3]) && is_fresh(&p.req[2]), "alloc resets the records");
    /* maps */
    q.running = 12;
    q.track[0] = 13;
    q.track[1] = 14;
    mr_reqpool_sync_maps(&p, 3, &q);
    CHECK(p.state_map[3] == 12 && p.track_map[6] == 13 && p.track_map[7] == 14, "sync_maps row 3");
    q.running = -1;
    q.track[1] = -1;
    mr_reqpool_sync_maps(&p, 2, &q);
    CHECK(p.state_map[2] == 0 && p.track_map[4] == 13 && p.track_map[5] == -1, "no running slot maps to 0");
    mr_reqpool_sync_maps(&p, 0, &q);
    mr_reqpool_sync_maps(&p, 4, &q);
    CHECK(p.state_map[0] == 0 && p.track_map[0] == 0 && p.track_map[1] == 0, "row 0 and row 4 are not synced");
    /* clear: rows, maps, records; the table stays */
    int64_t v[2] = {70, 71};
    CHECK_RC(mr_reqpool_write(&p, 3, 0, v, 2), MR_OK, "write");
    scribble(&p.req[1]);
    mr_reqpool_clear(&p);
    CHECK(mr_slots_available(&p.rows) == 3 && p.state_map[3] == 0 && p.track_map[6] == 0 && is_fresh(&p.req[1]),
          "clear");
    expect_row(&p, 3, (int64_t[]){70, 71, 0, 0, 0, 0, 0, 0}, "the table survives clear");
    CHECK_RC(mr_reqpool_alloc(&p, 3, r), MR_OK, "alloc 3 after clear");
    CHECK(r[0] == 1 && r[1] == 2 && r[2] == 3, "order 1..n after clear");
    mr_reqpool_destroy(&p);
    mr_reqpool_destroy(&p);
    /* pp = 1: one track column */
    CHECK_RC(mr_reqpool_init(&p, 2, 4, 1), MR_OK, "init pp 1");
    q.track[0] = 5;
    q.track[1] = 6;
    mr_reqpool_sync_maps(&p, 2, &q);
    CHECK(p.track_map[2] == 5 && p.track_map[1] == 0, "pp 1: track_map[2] = %lld", (long long)p.track_map[2]);
    mr_reqpool_destroy(&p);
}

static void
test_table_and_dirty(void)
{
    mr_reqpool p;
    int64_t out[8];
    CHECK_RC(mr_reqpool_init(&p, 3, 8, 2), MR_OK, "init");
    CHECK_RC(mr_reqpool_write(&p, 1, 2, (int64_t[]){7, 8, 9}, 3), MR_OK, "write row 1 [2, 5)");
    expect_row(&p, 1, (int64_t[]){0, 0, 7, 8, 9, 0, 0, 0}, "row 1");
    CHECK(p.table[8 + 2] == 7 && p.table[8 + 4] == 9, "the int32 table holds the values");
    CHECK_RC(mr_reqpool_read(&p, 1, 3, 2, out), MR_OK, "read [3, 5)");
    CHECK(out[0] == 8 && out[1] == 9, "read");
    expect_dirty(&p, 8, 1, (int64_t[]){1, 2, 5}, "one range");
    expect_dirty(&p, 8, 0, NULL, "taken");
    /* union per row, rows in first-touch order */
    CHECK_RC(mr_reqpool_write(&p, 2, 4, (int64_t[]){1}, 1), MR_OK, "write row 2");
    CHECK_RC(mr_reqpool_write(&p, 1, 6, (int64_t[]){INT32_MAX, INT32_MIN}, 2), MR_OK, "write int32 limits");
    CHECK_RC(mr_reqpool_write(&p, 2, 1, (int64_t[]){2}, 1), MR_OK, "write row 2 again");
    CHECK_RC(mr_reqpool_write(&p, 0, 0, (int64_t[]){3}, 1), MR_OK, "write row 0");
    CHECK_RC(mr_reqpool_write(&p, 3, 5, NULL, 0), MR_OK, "write nothing");
    mr_reqpool_mark_dirty(&p, 3, 0, 8);
    mr_reqpool_mark_dirty(&p, 2, 7, 8);
    mr_reqpool_mark_dirty(&p, 1, 5, 5);   /* empty: ignored */
    mr_reqpool_mark_dirty(&p, 4, 0, 1);   /* no such row: ignored */
    mr_reqpool_mark_dirty(&p, -1, 0, 1);
    CHECK_RC(mr_reqpool_read(&p, 1, 6, 2, out), MR_OK, "read the limits");
    CHECK(out[0] == INT32_MAX && out[1] == INT32_MIN, "int32 limits kept");
    expect_dirty(&p, 2, 2, (int64_t[]){2, 1, 8, 1, 6, 8}, "the first two");
    expect_dirty(&p, -1, 0, NULL, "a negative cap takes nothing");
    expect_dirty(&p, 0, 0, NULL, "cap 0");
    expect_dirty(&p, 5, 2, (int64_t[]){0, 0, 1, 3, 0, 8}, "the rest, in order");
    /* errors change nothing */
    static const struct { int64_t r, a, n, v; } bad[] = {
        {-1, 0, 1, 1}, {4, 0, 1, 1}, {1, -1, 1, 1}, {1, 9, 0, 1}, {1, 0, 9, 1}, {1, 7, 2, 1}, {1, 0, -1, 1},
        {1, 0, 1, (int64_t)INT32_MAX + 1}, {1, 0, 1, (int64_t)INT32_MIN - 1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int64_t v[9];
        for (int j = 0; j < 9; j++) {
            v[j] = j == 0 ? bad[i].v : 5;
        }
        CHECK_RC(mr_reqpool_write(&p, bad[i].r, bad[i].a, v, bad[i].n), MR_EINVAL, "a bad write");
        CHECK_RC(mr_reqpool_read(&p, bad[i].r, bad[i].a, bad[i].n, out), bad[i].v == 1 ? MR_EINVAL : MR_OK,
                 "the same read");
    }
    expect_row(&p, 1, (int64_t[]){0, 0, 7, 8, 9, 0, INT32_MAX, INT32_MIN}, "nothing written");
    expect_dirty(&p, 8, 0, NULL, "nothing recorded");
    CHECK_RC(mr_reqpool_write(&p, 1, 8, NULL, 0), MR_OK, "write nothing at the end");
    mr_reqpool_destroy(&p);
}

static void
test_bad_init(void)
{
    static const struct { int64_t size, ctx; int32_t pp; } bad[] = {
        {-1, 8, 2}, {3, 0, 2}, {3, -4, 1}, {3, 8, 0}, {3, 8, 3}, {3, INT64_MAX / 4, 2}, {INT64_MAX, 1, 1},
    };
    mr_reqpool p, zero;
    memset(&zero, 0, sizeof(zero));
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&p, 0x5a, sizeof(p));
        CHECK_RC(mr_reqpool_init(&p, bad[i].size, bad[i].ctx, bad[i].pp), MR_EINVAL, "a bad init");
        CHECK(memcmp(&p, &zero, sizeof(p)) == 0, "a refused init leaves the pool zeroed (case %zu)", i);
        mr_reqpool_destroy(&p);
    }
    CHECK_RC(mr_reqpool_init(&p, 0, 1, 1), MR_OK, "init with no row");
    int64_t r;
    CHECK_RC(mr_reqpool_alloc(&p, 1, &r), MR_ENOSPC, "alloc with no row");
    mr_reqpool_destroy(&p);
}

/* ------------------------------------------------------------------------
 * --check */

/* A request's record moves into its row at admission and back out when
 * the row is freed or unbound; a bound row's track entries live in its
 * track map; the row's generation changes on every take and free. */
static void
test_bind_and_move(void)
{
    mr_reqpool p;
    CHECK_RC(mr_reqpool_init(&p, 3, 8, 2), MR_OK, "init");
    int64_t r = 0, r2 = 0;
    uint32_t g0 = mr_reqpool_gen(&p, 1);
    CHECK_RC(mr_reqpool_alloc(&p, 1, &r), MR_OK, "alloc");
    CHECK(r == 1 && mr_reqpool_gen(&p, 1) != g0, "row 1 taken, its generation changed");
    uint32_t g1 = mr_reqpool_gen(&p, 1);
    mr_req st;
    mr_req_reset(&st);
    st.running = 5;
    st.track[0] = 6;
    st.track[1] = 7;
    st.next_track = 1;
    st.cow_src = 3;
    st.protected_len = 4;
    CHECK_RC(mr_reqpool_bind(&p, 2, &st), MR_EINVAL, "bind to a free row");
    CHECK_RC(mr_reqpool_bind(&p, 1, &st), MR_OK, "bind");
    CHECK(p.bound[1] == MR_ROW_BOUND && memcmp(&p.req[1], &st, sizeof(st)) == 0, "the record moved in");
    CHECK(p.state_map[1] == 5 && p.track_map[2] == 6 && p.track_map[3] == 7, "the maps follow the record");
    /* the track map is a bound row's track storage */
    p.track_map[3] = 9;
    mr_req got;
    mr_reqpool_load(&p, 1, &got);
    CHECK(got.track[0] == 6 && got.track[1] == 9 && got.running == 5 && got.cow_src == 3, "load reads the map");
    got.track[0] = 11;
    mr_reqpool_store(&p, 1, &got);
    CHECK(p.track_map[2] == 11 && p.req[1].track[0] == 11 && p.req[1].track[1] == 9, "store writes the map");
    /* a batched row's record does not read the map */
    CHECK_RC(mr_reqpool_alloc(&p, 1, &r2), MR_OK, "alloc");
    p.track_map[r2 * 2] = 13;
    mr_reqpool_load(&p, r2, &got);
    CHECK(got.track[0] == -1 && p.bound[r2] == 0, "a batched row's record is its own");
    /* a changed field is no longer a given-away slot */
    p.bound[1] |= MR_ROW_GAVE_RUNNING | MR_ROW_GAVE_TRACK1;
    mr_reqpool_load(&p, 1, &got);
    got.track[1] = 12;
    mr_reqpool_store(&p, 1, &got);
    CHECK(p.bound[1] == (MR_ROW_BOUND | MR_ROW_GAVE_RUNNING), "track1 changed: %d", (int)p.bound[1]);
    got.cow_src = -1;
    mr_reqpool_store(&p, 1, &got);
    CHECK(p.bound[1] == (MR_ROW_BOUND | MR_ROW_GAVE_RUNNING), "another field changed: %d", (int)p.bound[1]);
    got.running = 4;
    mr_reqpool_store(&p, 1, &got);
    CHECK(p.bound[1] == MR_ROW_BOUND, "running changed: %d", (int)p.bound[1]);
    /* free moves it out (track entries from the map), resets the row */
    mr_req out;
    memset(&out, 0, sizeof(out));
    CHECK_RC(mr_reqpool_free_record(&p, 1, &out), MR_OK, "free");
    CHECK(out.running == 4 && out.track[0] == 11 && out.track[1] == 12 && out.next_track == 1
          && out.protected_len == 4 && out.cow_src == -1,
          "the record came out");
    CHECK(is_fresh(&p.req[1]) && p.bound[1] == 0 && mr_reqpool_gen(&p, 1) != g1, "row 1 reset, new generation");
    out.running = 77;
    CHECK_RC(mr_reqpool_free_record(&p, 1, &out), MR_ENOENT, "double free");
    CHECK_RC(mr_reqpool_free_record(&p, 0, &out), MR_EINVAL, "row 0");
    CHECK_RC(mr_reqpool_free_record(&p, 4, &out), MR_EINVAL, "row 4");
    CHECK(out.running == 77, "a failed free wrote the record out");
    /* unbind: the record comes out, the row stays taken */
    uint32_t g2 = mr_reqpool_gen(&p, r2);
    CHECK_RC(mr_reqpool_bind(&p, r2, &st), MR_OK, "bind");
    CHECK_RC(mr_reqpool_unbind(&p, r2, &out), MR_OK, "unbind");
    CHECK(out.running == 5 && out.track[1] == 7 && is_fresh(&p.req[r2]) && p.bound[r2] == 0
          && mr_reqpool_in_use(&p, r2) && mr_reqpool_gen(&p, r2) == g2,
          "unbound, still taken, same generation");
    CHECK_RC(mr_reqpool_unbind(&p, 1, &out), MR_EINVAL, "unbind a free row");
    /* clear: every generation changes, no row bound */
    CHECK_RC(mr_reqpool_bind(&p, r2, &st), MR_OK, "bind");
    mr_reqpool_clear(&p);
    CHECK(p.bound[r2] == 0 && mr_reqpool_gen(&p, r2) != g2 && is_fresh(&p.req[r2]), "clear");
    mr_reqpool_destroy(&p);
}

static void
test_check_detects(void)
{
    mr_reqpool p;
    int64_t r[2];
    char msg[256];
    CHECK_RC(mr_reqpool_init(&p, 4, 4, 2), MR_OK, "init");
    CHECK_RC(mr_reqpool_alloc(&p, 2, r), MR_OK, "alloc");
    CHECK_RC(mr_slots_transfer(&p.rows, r, 1, MR_FROM_ANY, MR_OWNER_TREE, NULL), MR_OK, "row to the tree");
    CHECK(mr_reqpool_check(&p, msg, sizeof(msg)) == MR_ECORRUPT && strstr(msg, "owned by a request or the tree"),
          "a row owned by the tree: %s", msg);
    CHECK_RC(mr_slots_transfer(&p.rows, r, 1, MR_FROM_ANY, 3, NULL), MR_OK, "row to a request");
    CHECK(mr_reqpool_check(&p, msg, sizeof(msg)) == MR_ECORRUPT, "a row owned by a request");
    CHECK_RC(mr_slots_transfer(&p.rows, r, 1, MR_FROM_ANY, MR_OWNER_HELD, NULL), MR_OK, "row back");
    CHECK(mr_reqpool_check(&p, msg, sizeof(msg)) == MR_OK, "valid again: %s", msg);
    p.rows.n_held++;
    CHECK(mr_reqpool_check(&p, msg, sizeof(msg)) == MR_ECORRUPT && strstr(msg, "recount"),
          "a broken row allocator: %s", msg);
    p.rows.n_held--;
    CHECK(mr_reqpool_check(&p, msg, sizeof(msg)) == MR_OK, "valid again: %s", msg);
    p.bound[4] = MR_ROW_BOUND;  /* row 4 is free */
    CHECK(mr_reqpool_check(&p, msg, sizeof(msg)) == MR_ECORRUPT && strstr(msg, "free request row 4 is bound"),
          "a free row still bound: %s", msg);
    p.bound[4] = 0;
    mr_reqpool_destroy(&p);
}

/* ------------------------------------------------------------------------
 * --fuzz */

static long hits[16];

static void
fuzz_run(int64_t size, int64_t ctx, int32_t pp, long ops)
{
    mr_reqpool p;
    rmodel m;
    char where[96];
    CHECK_RC(mr_reqpool_init(&p, size, ctx, pp), MR_OK, "fuzz init");
    rm_init(&m, size, ctx, pp);
    for (long op = 0; op < ops; op++) {
        uint32_t kind = unit_rnd(24);
        int rs = MR_OK, rmc = MR_OK;
        snprintf(where, sizeof(where), "size=%lld ctx=%lld pp=%d op %ld kind %u", (long long)size, (long long)ctx,
                 pp, op, kind);
        if (kind < 4) {
            int64_t k = unit_rnd(10) == 0 ? -1 : (int64_t)unit_rnd(4), a[MAXR], b[MAXR];
            for (int64_t r = 1; r <= size; r++) {
                if (!m.used[r]) {
                    scribble(&p.req[r]);
                }
            }
            rs = mr_reqpool_alloc(&p, k, a);
            rmc = rm_alloc(&m, k, b);
            for (int64_t i = 0; rs == MR_OK && rmc == MR_OK && i < k; i++) {
                CHECK(a[i] == b[i], "%s: row %lld, model %lld", where, (long long)a[i], (long long)b[i]);
                CHECK(is_fresh(&p.req[a[i]]), "%s: row %lld's record is not fresh", where, (long long)a[i]);
            }
        }
        else if (kind < 7) {
            int64_t r = (int64_t)unit_rnd((uint32_t)size + 4) - 1;
            if (r >= 1 && r <= size) {
                scribble(&p.req[r]);
            }
            rs = mr_reqpool_free(&p, r);
            rmc = rm_free(&m, r);
            if (rs == MR_OK) {
                CHECK(is_fresh(&p.req[r]), "%s: free left row %lld's record", where, (long long)r);
            }
        }
        else if (kind < 13) {
            int64_t r = (int64_t)unit_rnd((uint32_t)size + 3) - (unit_rnd(10) == 0);
            int64_t a = (int64_t)unit_rnd((uint32_t)ctx + 1) - (unit_rnd(12) == 0);
            int64_t n = (int64_t)unit_rnd((uint32_t)(ctx - (a > 0 ? a : 0)) + 2) - (unit_rnd(12) == 0);
            int64_t v[MAXC + 2];
            for (int64_t i = 0; i < n; i++) {
                v[i] = (int64_t)unit_rnd(1u << 31) * (unit_rnd(2) ? 1 : -1) - (unit_rnd(4) == 0);
                if (unit_rnd(40) == 0) {
                    v[i] = unit_rnd(2) ? (int64_t)INT32_MAX + 1 : (int64_t)INT32_MIN - 1;
                }
            }
            rs = mr_reqpool_write(&p, r, a, v, n);
            rmc = rm_write(&m, r, a, v, n);
        }
        else if (kind < 15) {
            int64_t r = (int64_t)unit_rnd((uint32_t)size + 3) - 1, a = (int64_t)unit_rnd((uint32_t)ctx + 1);
            int64_t n = (int64_t)unit_rnd((uint32_t)(ctx - a) + 2), got[MAXC + 2];
            rs = mr_reqpool_read(&p, r, a, n, got);
            rmc = rm_span_ok(&m, r, a, n) ? MR_OK : MR_EINVAL;
            for (int64_t i = 0; rs == MR_OK && rmc == MR_OK && i < n; i++) {
                CHECK(got[i] == m.table[r][a + i], "%s: read column %lld", where, (long long)(a + i));
            }
        }
        else if (kind < 17) {
            int64_t r = (int64_t)unit_rnd((uint32_t)size + 3) - 1;
            int64_t a = (int64_t)unit_rnd((uint32_t)ctx + 1), b = (int64_t)unit_rnd((uint32_t)ctx + 1);
            mr_reqpool_mark_dirty(&p, r, a, b);
            rm_mark(&m, r, a, b);
        }
        else if (kind < 20) {
            int64_t cap = (int64_t)unit_rnd((uint32_t)size + 4) - 1;
            int64_t r1[MAXR + 1], a1[MAXR + 1], b1[MAXR + 1], r2[MAXR + 1], a2[MAXR + 1], b2[MAXR + 1];
            int64_t n1 = mr_reqpool_take_dirty(&p, r1, a1, b1, cap);
            int64_t n2 = rm_take(&m, r2, a2, b2, cap);
            CHECK(n1 == n2, "%s: took %lld ranges, model %lld", where, (long long)n1, (long long)n2);
            for (int64_t i = 0; n1 == n2 && i < n1; i++) {
                CHECK(r1[i] == r2[i] && a1[i] == a2[i] && b1[i] == b2[i], "%s: range %lld", where, (long long)i);
            }
        }
        else if (kind < 23) {
            int64_t r = (int64_t)unit_rnd((uint32_t)size + 3) - 1;
            mr_req q;
            mr_req_reset(&q);
            q.running = (int64_t)unit_rnd(20) - 1;
            q.track[0] = (int64_t)unit_rnd(20) - 1;
            q.track[1] = (int64_t)unit_rnd(20) - 1;
            mr_reqpool_sync_maps(&p, r, &q);
            rm_sync(&m, r, &q);
        }
        else if (unit_rnd(3) == 0) {
            for (int64_t r = 0; r <= size; r++) {
                scribble(&p.req[r]);
            }
            mr_reqpool_clear(&p);
            rm_clear_rows(&m);
            for (int64_t r = 0; r <= size; r++) {
                CHECK(is_fresh(&p.req[r]), "%s: clear left row %lld's record", where, (long long)r);
            }
        }
        hits[-rs < 16 ? -rs : 15]++;
        CHECK(rs == rmc, "%s: %s, model %s", where, mr_strerror(rs), mr_strerror(rmc));
        if (!same(&p, &m, where)) {
            break;
        }
    }
    mr_reqpool_destroy(&p);
}

static void
test_fuzz(long ops)
{
    long done = 0, runs = 0;
    while (done < ops && unit_errors == 0) {
        long per = 300;
        int64_t size = (int64_t)unit_rnd(MAXR + 1), ctx = 1 + (int64_t)unit_rnd(MAXC);
        fuzz_run(size, ctx, (int32_t)(1 + unit_rnd(2)), per);
        done += per;
        runs++;
    }
    printf("fuzz: %ld calls in %ld runs; codes seen: OK %ld, EINVAL %ld, ENOENT %ld, ENOSPC %ld\n", done, runs,
           hits[0], hits[-MR_EINVAL], hits[-MR_ENOENT], hits[-MR_ENOSPC]);
    if (ops >= 10000) {
        static const int codes[4] = {MR_OK, MR_EINVAL, MR_ENOENT, MR_ENOSPC};
        for (int c = 0; c < 4; c++) {
            CHECK(hits[-codes[c]] > 0, "fuzz never returned %s", mr_strerror(codes[c]));
        }
    }
}

/* ------------------------------------------------------------------------
 * --oom */

#ifdef MR_FAULT_INJECT
static void
oom_init(void)
{
    mr_reqpool zero;
    memset(&zero, 0, sizeof(zero));
    long f;
    for (f = 1; f < 100; f++) {
        mr_reqpool p;
        mr_fault_fail_at(f);
        int rc = mr_reqpool_init(&p, 5, 16, 2);
        long used = mr_fault_count();
        mr_fault_fail_at(0);
        if (used < f) {
            CHECK_RC(rc, MR_OK, "init with no failure");
            mr_reqpool_destroy(&p);
            break;
        }
        CHECK_RC(rc, MR_ENOMEM, "init with a failing allocation");
        CHECK(memcmp(&p, &zero, sizeof(p)) == 0, "a failed init leaves the pool zeroed (allocation %ld)", f);
        mr_reqpool_destroy(&p);
    }
    CHECK(f > 11, "init made %ld allocations", f - 1);
    printf("oom: init: %ld allocation failure points checked\n", f - 1);
    /* nothing else allocates */
    mr_reqpool p;
    int64_t r[2], v[3] = {1, 2, 3}, rows[6], lo[6], hi[6];
    CHECK_RC(mr_reqpool_init(&p, 5, 16, 2), MR_OK, "init");
    mr_fault_fail_at(1);
    int rc = mr_reqpool_alloc(&p, 2, r);
    rc = rc == MR_OK ? mr_reqpool_write(&p, r[0], 3, v, 3) : rc;
    mr_reqpool_mark_dirty(&p, r[1], 0, 4);
    (void)mr_reqpool_take_dirty(&p, rows, lo, hi, 6);
    rc = rc == MR_OK ? mr_reqpool_free(&p, r[0]) : rc;
    mr_reqpool_clear(&p);
    CHECK(mr_fault_count() == 0 && rc == MR_OK, "the calls after init allocate (%ld)", mr_fault_count());
    mr_fault_fail_at(0);
    mr_reqpool_destroy(&p);
}
#endif

int
main(int argc, char **argv)
{
    static const char *const groups[4] = {"units", "check", "fuzz", "oom"};
    int on[4];
    long ops = 100000;
    unit_start(argc, argv, groups, on, 4, &ops);
    if (on[0]) {
        test_rows_and_records();
        test_table_and_dirty();
        test_bad_init();
        test_bind_and_move();
    }
    if (on[1]) {
        test_check_detects();
    }
    if (on[2]) {
        test_fuzz(ops);
    }
    if (on[3]) {
#ifdef MR_FAULT_INJECT
        oom_init();
#else
        unit_skip_oom();
#endif
    }
    return unit_exit("test_req_pool");
}
