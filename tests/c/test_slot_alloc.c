/* test_slot_alloc.c - csrc/core/slot_alloc.c against a small independent
 * model, without Python.
 *
 *   --units   hand-written cases with literal expected values: FIFO order,
 *             frees to the head, transfers, alloc groups, clear, the KV page
 *             view, and every error code of every function;
 *   --check   mr_slots_check() must report each of a list of deliberate
 *             corruptions, and pass again once each is undone;
 *   --fuzz    random calls on mr_slots (1 to 40 units, alloc groups and
 *             free groups included) and on mr_kv (page sizes 1, 4 and 16,
 *             free groups included), each made on the model too (the owner
 *             of every unit, the free list as a plain array, the alloc
 *             group's units, the free group's pending units in order).  After every call: the same
 *             return code and offending unit, the same units handed out, the
 *             same owners, free-list order and counters, and
 *             mr_slots_check() passes;
 *   --oom     (a build with -DMR_FAULT_INJECT) each allocation of
 *             mr_slots_init() and mr_kv_init() made to fail in turn:
 *             MR_ENOMEM, the struct zeroed, nothing leaked; a page-mode free,
 *             transfer or reserve whose scratch cannot grow: MR_ENOMEM and
 *             nothing changed; the fuzz again with allocations failing at
 *             random.
 * Default: every group.  --seed N, --ops N (fuzz calls in all).  Exits 1 when
 * a check failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "slot_alloc.h"
#include "unit.h"

enum { MAXN = 48, MAXTOK = 16 * 8 };

/* ------------------------------------------------------------------------
 * The model: who owns each unit, and the free units oldest first. */

typedef struct {
    int64_t n;
    int32_t owner[MAXN + 1];
    int64_t fifo[MAXN];
    int64_t nfree;
    int64_t group[MAXN];  /* the open group's pre-allocated units */
    int64_t glen, gpos;
    int gactive;
    int64_t pend[MAXN];   /* the open free group's freed units, in order */
    int64_t npend;
    int factive;
} model;

static void
m_clear(model *m)
{
    m->owner[0] = MR_OWNER_RESERVED;
    for (int64_t u = 1; u <= m->n; u++) {
        m->owner[u] = MR_OWNER_FREE;
        m->fifo[u - 1] = u;
    }
    m->nfree = m->n;
    m->glen = m->gpos = 0;
    m->gactive = 0;
    m->npend = 0;
    m->factive = 0;
}

static void
m_init(model *m, int64_t n)
{
    memset(m, 0, sizeof(*m));
    m->n = n;
    m_clear(m);
}

/* May a free / transfer `from` take a unit owned by o? */
static int
m_takes(mr_from from, int32_t o)
{
    if (o == MR_OWNER_FREE || o == MR_OWNER_RESERVED) {
        return 0;
    }
    if (from == MR_FROM_ANY) {
        return 1;
    }
    return from == MR_FROM_TREE ? o == MR_OWNER_TREE : o != MR_OWNER_TREE;
}

static void
m_take(model *m, int64_t k, int32_t owner, int64_t *out)
{
    for (int64_t i = 0; i < k; i++) {
        out[i] = m->fifo[i];
        m->owner[out[i]] = owner;
    }
    memmove(m->fifo, m->fifo + k, (size_t)(m->nfree - k) * sizeof(int64_t));
    m->nfree -= k;
}

static int
m_alloc(model *m, int64_t k, int32_t owner, int64_t *out)
{
    if (k < 0 || !(owner == MR_OWNER_HELD || owner > 0)) {
        return MR_EINVAL;
    }
    if (k == 1 && m->gactive && m->gpos < m->glen) {
        out[0] = m->group[m->gpos++];
        m->owner[out[0]] = owner;
        return MR_OK;
    }
    if (k > m->nfree) {
        return MR_ENOSPC;
    }
    m_take(m, k, owner, out);
    return MR_OK;
}

/* Is u pre-allocated by the open group and not handed out yet? */
static int
m_pending(const model *m, int64_t u)
{
    int found = 0;
    for (int64_t g = m->gpos; m->gactive && g < m->glen; g++) {
        found |= m->group[g] == u;
    }
    return found;
}

/* The first problem of idx[0:k): for a free (is_free, duplicates refused)
 * or for a transfer to `to` (units already owned by `to` pass).  A unit the
 * open group holds for its next alloc(1) belongs to no caller yet.  A unit
 * the open free group freed is free already, except for a paged free
 * (skip), which passes it. */
static int
m_validate(const model *m, const int64_t *idx, int64_t k, mr_from from, int is_free, int32_t to, int skip,
           int64_t *bad)
{
    for (int64_t i = 0; i < k; i++) {
        int64_t u = idx[i];
        int rc = MR_OK;
        if (u < 1 || u > m->n) {
            rc = MR_EINVAL;
        }
        else if (!is_free && m->owner[u] == to) {
            continue;
        }
        else if (skip && m->owner[u] == MR_OWNER_PENDING) {
            continue;
        }
        else if (m->owner[u] == MR_OWNER_FREE || m->owner[u] == MR_OWNER_PENDING) {
            rc = MR_ENOENT;
        }
        else if (!m_takes(from, m->owner[u]) || m_pending(m, u)) {
            rc = MR_EBUSY;
        }
        else if (is_free) {
            for (int64_t j = 0; j < i; j++) {
                if (idx[j] == u) {
                    rc = MR_EINVAL;
                }
            }
        }
        if (rc != MR_OK) {
            *bad = u;
            return rc;
        }
    }
    return MR_OK;
}

static int
m_free(model *m, const int64_t *idx, int64_t k, mr_from from, int front, int skip, int64_t *bad)
{
    if (k < 0) {
        return MR_EINVAL;
    }
    int defer = m->factive && from == MR_FROM_CALLER;
    int rc = m_validate(m, idx, k, from, 1, 0, defer && skip, bad);
    if (rc != MR_OK) {
        return rc;
    }
    if (defer) {
        for (int64_t i = 0; i < k; i++) {
            if (m->owner[idx[i]] != MR_OWNER_PENDING) {
                m->owner[idx[i]] = MR_OWNER_PENDING;
                m->pend[m->npend++] = idx[i];
            }
        }
        return MR_OK;
    }
    for (int64_t i = 0; i < k; i++) {
        m->owner[idx[i]] = MR_OWNER_FREE;
    }
    if (front) {
        memmove(m->fifo + k, m->fifo, (size_t)m->nfree * sizeof(int64_t));
        memcpy(m->fifo, idx, (size_t)k * sizeof(int64_t));
    }
    else {
        memcpy(m->fifo + m->nfree, idx, (size_t)k * sizeof(int64_t));
    }
    m->nfree += k;
    return MR_OK;
}

static int
m_transfer(model *m, const int64_t *idx, int64_t k, mr_from from, int32_t to, int64_t *bad)
{
    if (k < 0 || !(to == MR_OWNER_TREE || to == MR_OWNER_HELD || to > 0)) {
        return MR_EINVAL;
    }
    int rc = m_validate(m, idx, k, from, 0, to, 0, bad);
    if (rc != MR_OK) {
        return rc;
    }
    for (int64_t i = 0; i < k; i++) {
        m->owner[idx[i]] = to;
    }
    return MR_OK;
}

/* The free group's end: its units to the free list in the order freed,
 * or ascending at the front. */
static void
m_free_group_end(model *m, int front)
{
    if (!m->factive) {
        return;
    }
    int64_t k = m->npend;
    for (int64_t i = 0; i < k; i++) {
        m->owner[m->pend[i]] = MR_OWNER_FREE;
    }
    if (front) {
        for (int64_t i = 1; i < k; i++) {   /* insertion sort */
            int64_t u = m->pend[i], j = i;
            while (j > 0 && m->pend[j - 1] > u) {
                m->pend[j] = m->pend[j - 1];
                j--;
            }
            m->pend[j] = u;
        }
        memmove(m->fifo + k, m->fifo, (size_t)m->nfree * sizeof(int64_t));
        memcpy(m->fifo, m->pend, (size_t)k * sizeof(int64_t));
    }
    else {
        memcpy(m->fifo + m->nfree, m->pend, (size_t)k * sizeof(int64_t));
    }
    m->nfree += k;
    m->npend = 0;
    m->factive = 0;
}

/* A free group opens; an open one stays open with its pending units (they
 * rejoin at the end; SGLang's free_group_begin would lose them). */
static void
m_free_group_begin(model *m)
{
    m->factive = 1;
}

static void
m_group_end(model *m)
{
    if (!m->gactive) {
        return;
    }
    for (int64_t g = m->gpos; g < m->glen; g++) {
        m->owner[m->group[g]] = MR_OWNER_FREE;
        m->fifo[m->nfree++] = m->group[g];
    }
    m->gactive = 0;
    m->glen = m->gpos = 0;
}

static int
m_group_begin(model *m, int64_t k)
{
    if (k < 0) {
        return MR_EINVAL;
    }
    m_group_end(m);
    m->gactive = 1;
    if (k > 0 && k <= m->nfree) {
        m_take(m, k, MR_OWNER_HELD, m->group);
        m->glen = k;
    }
    return MR_OK;
}

/* The page view: tokens of page p are p * ps .. p * ps + ps - 1. */
static int
mk_alloc(model *m, int64_t ps, int64_t ntok, int32_t owner, int64_t *out)
{
    int64_t pages[MAXN];
    if (ntok < 0 || ntok % ps != 0) {
        return MR_EINVAL;
    }
    int rc = m_alloc(m, ntok / ps, owner, pages);
    for (int64_t i = 0; rc == MR_OK && i < ntok; i++) {
        out[i] = pages[i / ps] * ps + i % ps;
    }
    return rc;
}

/* The distinct pages of tok[0:k), ascending (page size > 1), or -1 with
 * *bad set for a negative token. */
static int64_t
mk_pages(int64_t ps, const int64_t *tok, int64_t k, int64_t *pages, int64_t *bad)
{
    int64_t np = 0;
    for (int64_t i = 0; i < k; i++) {
        if (tok[i] < 0) {
            *bad = tok[i];
            return -1;
        }
        int64_t p = tok[i] / ps, j = np;
        int dup = 0;
        for (int64_t q = 0; q < np; q++) {
            dup |= pages[q] == p;
        }
        if (dup) {
            continue;
        }
        while (j > 0 && pages[j - 1] > p) {
            pages[j] = pages[j - 1];
            j--;
        }
        pages[j] = p;
        np++;
    }
    return np;
}

/* A free (is_free) or a transfer to `to` of the pages of tok[0:k). */
static int
mk_move(model *m, int64_t ps, const int64_t *tok, int64_t k, mr_from from, int is_free, int32_t to,
        int64_t *bad)
{
    if (k < 0) {
        return MR_EINVAL;
    }
    if (ps == 1) {
        return is_free ? m_free(m, tok, k, from, 0, 0, bad) : m_transfer(m, tok, k, from, to, bad);
    }
    int64_t pages[MAXTOK + 8], badpage = 0;
    int64_t np = mk_pages(ps, tok, k, pages, bad);
    if (np < 0) {
        return MR_EINVAL;
    }
    int rc = is_free ? m_free(m, pages, np, from, 1, 1, &badpage) : m_transfer(m, pages, np, from, to, &badpage);
    if (rc != MR_OK) {
        *bad = badpage * ps;
    }
    return rc;
}

/* ------------------------------------------------------------------------
 * Comparison */

/* s and the model agree on everything observable; 0 when not. */
static int
same(const mr_slots *s, const model *m, const char *where)
{
    char msg[256];
    int before = unit_errors;
    int rc = mr_slots_check(s, msg, sizeof(msg));
    CHECK(rc == MR_OK, "%s: mr_slots_check: %s", where, msg);
    CHECK(s->n == m->n, "%s: n %lld, model %lld", where, (long long)s->n, (long long)m->n);
    CHECK(mr_slots_available(s) == m->nfree, "%s: available %lld, model %lld", where,
          (long long)mr_slots_available(s), (long long)m->nfree);
    if (unit_errors != before) {
        return 0;
    }
    int64_t held = 0, req = 0, tree = 0;
    for (int64_t u = 0; u <= m->n; u++) {
        int32_t o = 99;
        CHECK(mr_slots_owner(s, u, &o) == MR_OK && o == m->owner[u], "%s: unit %lld owner %d, model %d",
              where, (long long)u, (int)o, (int)m->owner[u]);
        held += m->owner[u] == MR_OWNER_HELD;
        req += m->owner[u] > 0;
        tree += m->owner[u] == MR_OWNER_TREE;
    }
    CHECK(s->n_held == held && s->n_req == req && s->n_tree == tree,
          "%s: held/req/tree %lld/%lld/%lld, model %lld/%lld/%lld", where, (long long)s->n_held,
          (long long)s->n_req, (long long)s->n_tree, (long long)held, (long long)req, (long long)tree);
    for (int64_t i = 0; i < m->nfree && unit_errors == before; i++) {
        int64_t u = s->ring[(s->head + i) % s->n];
        CHECK(u == m->fifo[i], "%s: free list position %lld holds %lld, model %lld", where, (long long)i,
              (long long)u, (long long)m->fifo[i]);
    }
    CHECK(s->group_active == m->gactive && s->group_len - s->group_pos == m->glen - m->gpos,
          "%s: group active %d with %lld left, model %d with %lld", where, s->group_active,
          (long long)(s->group_len - s->group_pos), m->gactive, (long long)(m->glen - m->gpos));
    for (int64_t g = 0; unit_errors == before && g < m->glen - m->gpos; g++) {
        CHECK(s->group[s->group_pos + g] == m->group[m->gpos + g], "%s: group unit %lld", where, (long long)g);
    }
    CHECK(s->free_group == m->factive && s->n_pending == m->npend, "%s: free group %d with %lld pending, model %d with %lld",
          where, s->free_group, (long long)s->n_pending, m->factive, (long long)m->npend);
    for (int64_t g = 0; unit_errors == before && g < m->npend; g++) {
        CHECK(s->pending[g] == m->pend[g], "%s: pending unit %lld is %lld, model %lld", where, (long long)g,
              (long long)s->pending[g], (long long)m->pend[g]);
    }
    return unit_errors == before;
}

static void
same_out(const int64_t *a, const int64_t *b, int64_t k, const char *where)
{
    for (int64_t i = 0; i < k; i++) {
        if (a[i] != b[i]) {
            CHECK(0, "%s: out[%lld] = %lld, model %lld", where, (long long)i, (long long)a[i], (long long)b[i]);
            return;
        }
    }
}

/* ------------------------------------------------------------------------
 * --units */

static void
expect_units(const int64_t *got, const int64_t *want, int64_t k, const char *what)
{
    for (int64_t i = 0; i < k; i++) {
        CHECK(got[i] == want[i], "%s: [%lld] = %lld, expected %lld", what, (long long)i, (long long)got[i],
              (long long)want[i]);
    }
}

static void
expect_valid(const mr_slots *s, const char *what)
{
    char msg[256];
    CHECK(mr_slots_check(s, msg, sizeof(msg)) == MR_OK, "%s: %s", what, msg);
}

static void
test_fifo(void)
{
    mr_slots s;
    int64_t a[8], bad = 0;
    int32_t o = 0;
    CHECK_RC(mr_slots_init(&s, 5), MR_OK, "init 5");
    CHECK_RC(mr_slots_owner(&s, 0, &o), MR_OK, "owner 0");
    CHECK(o == MR_OWNER_RESERVED, "unit 0 is reserved");
    CHECK_RC(mr_slots_alloc(&s, 2, MR_OWNER_HELD, a), MR_OK, "alloc 2");
    expect_units(a, (int64_t[]){1, 2}, 2, "first units");
    CHECK_RC(mr_slots_alloc(&s, 1, 3, a + 2), MR_OK, "alloc for row 3");
    CHECK(a[2] == 3 && mr_slots_owner(&s, 3, &o) == MR_OK && o == 3, "unit 3 is row 3's");
    CHECK(s.n_held == 2 && s.n_req == 1 && mr_slots_available(&s) == 2, "counters after alloc");
    /* to the tail, in the order given */
    CHECK_RC(mr_slots_free(&s, (int64_t[]){2, 1}, 2, MR_FROM_CALLER, 0, &bad), MR_OK, "free 2, 1");
    CHECK_RC(mr_slots_alloc(&s, 4, MR_OWNER_HELD, a), MR_OK, "alloc 4");
    expect_units(a, (int64_t[]){4, 5, 2, 1}, 4, "FIFO order");
    /* to the head: idx[0] is next out */
    CHECK_RC(mr_slots_free(&s, (int64_t[]){5, 2}, 2, MR_FROM_CALLER, 1, NULL), MR_OK, "free 5, 2 to the head");
    CHECK_RC(mr_slots_free(&s, (int64_t[]){4}, 1, MR_FROM_CALLER, 0, NULL), MR_OK, "free 4 to the tail");
    CHECK_RC(mr_slots_alloc(&s, 3, 7, a), MR_OK, "alloc 3");
    expect_units(a, (int64_t[]){5, 2, 4}, 3, "head then tail");
    CHECK_RC(mr_slots_alloc(&s, 1, MR_OWNER_HELD, a), MR_ENOSPC, "alloc with none free");
    CHECK_RC(mr_slots_alloc(&s, 0, MR_OWNER_HELD, a), MR_OK, "alloc 0");
    expect_valid(&s, "fifo");
    /* clear: every unit free, order 1..n */
    mr_slots_clear(&s);
    CHECK(mr_slots_available(&s) == 5 && s.n_held == 0 && s.n_req == 0, "clear");
    CHECK_RC(mr_slots_alloc(&s, 5, MR_OWNER_HELD, a), MR_OK, "alloc 5 after clear");
    expect_units(a, (int64_t[]){1, 2, 3, 4, 5}, 5, "order after clear");
    expect_valid(&s, "clear");
    mr_slots_destroy(&s);
    mr_slots_destroy(&s);  /* safe twice */
}

static void
test_transfer(void)
{
    mr_slots s;
    int64_t a[4], bad = 0;
    int32_t o = 0;
    CHECK_RC(mr_slots_init(&s, 4), MR_OK, "init 4");
    CHECK_RC(mr_slots_alloc(&s, 3, 2, a), MR_OK, "alloc 3 for row 2");
    CHECK_RC(mr_slots_transfer(&s, a, 2, MR_FROM_CALLER, MR_OWNER_TREE, &bad), MR_OK, "to the tree");
    CHECK(s.n_tree == 2 && s.n_req == 1, "counters after transfer");
    /* units already the target's pass whatever `from` says */
    CHECK_RC(mr_slots_transfer(&s, a, 2, MR_FROM_CALLER, MR_OWNER_TREE, NULL), MR_OK, "tree to tree");
    CHECK_RC(mr_slots_free(&s, a, 2, MR_FROM_CALLER, 0, &bad), MR_EBUSY, "caller frees tree units");
    CHECK(bad == 1, "bad unit %lld", (long long)bad);
    CHECK_RC(mr_slots_free(&s, a + 2, 1, MR_FROM_TREE, 0, &bad), MR_EBUSY, "tree frees a row's unit");
    CHECK(bad == 3, "bad unit %lld", (long long)bad);
    CHECK_RC(mr_slots_transfer(&s, a + 1, 2, MR_FROM_TREE, 5, &bad), MR_EBUSY, "tree takes a row's unit");
    CHECK(bad == 3 && mr_slots_owner(&s, 2, &o) == MR_OK && o == MR_OWNER_TREE, "a refused transfer moves nothing");
    CHECK_RC(mr_slots_transfer(&s, a + 1, 2, MR_FROM_ANY, MR_OWNER_HELD, NULL), MR_OK, "any to held");
    CHECK(s.n_tree == 1 && s.n_held == 2 && s.n_req == 0, "counters after any");
    CHECK_RC(mr_slots_transfer(&s, (int64_t[]){4}, 1, MR_FROM_ANY, 1, &bad), MR_ENOENT, "transfer a free unit");
    CHECK(bad == 4, "bad unit %lld", (long long)bad);
    CHECK_RC(mr_slots_transfer(&s, a, 1, MR_FROM_ANY, MR_OWNER_FREE, NULL), MR_EINVAL, "transfer to FREE");
    CHECK_RC(mr_slots_transfer(&s, a, 1, MR_FROM_ANY, MR_OWNER_RESERVED, NULL), MR_EINVAL, "transfer to RESERVED");
    CHECK_RC(mr_slots_transfer(&s, a, -1, MR_FROM_ANY, 1, NULL), MR_EINVAL, "transfer k < 0");
    CHECK_RC(mr_slots_transfer(&s, (int64_t[]){0}, 1, MR_FROM_ANY, 1, &bad), MR_EINVAL, "transfer unit 0");
    CHECK_RC(mr_slots_transfer(&s, (int64_t[]){5}, 1, MR_FROM_ANY, 1, &bad), MR_EINVAL, "transfer unit n + 1");
    CHECK(bad == 5, "bad unit %lld", (long long)bad);
    /* a transfer may list a unit twice; a free may not */
    CHECK_RC(mr_slots_transfer(&s, (int64_t[]){2, 2}, 2, MR_FROM_ANY, 1, NULL), MR_OK, "transfer listed twice");
    CHECK_RC(mr_slots_free(&s, (int64_t[]){2, 2}, 2, MR_FROM_ANY, 0, &bad), MR_EINVAL, "free listed twice");
    CHECK(bad == 2 && mr_slots_available(&s) == 1, "a refused free frees nothing");
    CHECK_RC(mr_slots_free(&s, (int64_t[]){1, 2, 3}, 3, MR_FROM_ANY, 0, NULL), MR_OK, "free from any");
    CHECK_RC(mr_slots_free(&s, (int64_t[]){3}, 1, MR_FROM_ANY, 0, &bad), MR_ENOENT, "double free");
    CHECK_RC(mr_slots_free(&s, a, -1, MR_FROM_ANY, 0, NULL), MR_EINVAL, "free k < 0");
    CHECK_RC(mr_slots_free(&s, (int64_t[]){-3}, 1, MR_FROM_ANY, 0, &bad), MR_EINVAL, "free unit -3");
    CHECK(bad == -3 && mr_slots_available(&s) == 4, "bad unit %lld", (long long)bad);
    CHECK_RC(mr_slots_alloc(&s, -1, MR_OWNER_HELD, a), MR_EINVAL, "alloc k < 0");
    CHECK_RC(mr_slots_alloc(&s, 1, MR_OWNER_TREE, a), MR_EINVAL, "alloc for the tree");
    CHECK_RC(mr_slots_alloc(&s, 1, MR_OWNER_FREE, a), MR_EINVAL, "alloc for FREE");
    CHECK_RC(mr_slots_alloc(&s, 1, -9, a), MR_EINVAL, "alloc for owner -9");
    CHECK_RC(mr_slots_owner(&s, -1, &o), MR_EINVAL, "owner -1");
    CHECK_RC(mr_slots_owner(&s, 5, &o), MR_EINVAL, "owner n + 1");
    expect_valid(&s, "transfer");
    mr_slots_destroy(&s);
}

static void
test_groups(void)
{
    mr_slots s;
    int64_t a[5];
    CHECK_RC(mr_slots_init(&s, 6), MR_OK, "init 6");
    CHECK_RC(mr_slots_group_begin(&s, -1), MR_EINVAL, "group of -1");
    CHECK_RC(mr_slots_group_begin(&s, 3), MR_OK, "group of 3");
    CHECK(mr_slots_available(&s) == 3 && s.n_held == 3, "a group pre-allocates");
    CHECK_RC(mr_slots_alloc(&s, 1, 2, a), MR_OK, "alloc 1 in a group");
    CHECK(a[0] == 1 && s.n_held == 2 && s.n_req == 1, "the group's first unit, now row 2's");
    CHECK_RC(mr_slots_alloc(&s, 2, MR_OWNER_HELD, a), MR_OK, "alloc 2 in a group");
    expect_units(a, (int64_t[]){4, 5}, 2, "alloc(k > 1) takes from the free list");
    CHECK_RC(mr_slots_alloc(&s, 1, MR_OWNER_HELD, a), MR_OK, "alloc 1 in a group");
    CHECK(a[0] == 2, "the group's second unit: %lld", (long long)a[0]);
    expect_valid(&s, "group open");
    /* the group's unit 3 is HELD but no caller has it yet */
    int64_t bad = 0;
    CHECK_RC(mr_slots_free(&s, (int64_t[]){2, 3}, 2, MR_FROM_CALLER, 0, &bad), MR_EBUSY, "free a pending unit");
    CHECK(bad == 3, "bad unit %lld", (long long)bad);
    CHECK_RC(mr_slots_transfer(&s, (int64_t[]){3}, 1, MR_FROM_ANY, MR_OWNER_TREE, &bad), MR_EBUSY,
             "transfer a pending unit");
    CHECK_RC(mr_slots_transfer(&s, (int64_t[]){3}, 1, MR_FROM_ANY, MR_OWNER_HELD, &bad), MR_OK,
             "a pending unit is HELD already");
    expect_valid(&s, "group open");
    mr_slots_group_end(&s);
    CHECK(mr_slots_available(&s) == 2 && s.n_held == 3, "group end returns the unused unit");
    CHECK_RC(mr_slots_alloc(&s, 2, MR_OWNER_HELD, a), MR_OK, "alloc 2");
    expect_units(a, (int64_t[]){6, 3}, 2, "the unused unit goes to the tail");
    mr_slots_group_end(&s);  /* no group: nothing happens */
    /* too few free: the group is open but empty */
    CHECK_RC(mr_slots_group_begin(&s, 1), MR_OK, "group of 1 with none free");
    CHECK_RC(mr_slots_alloc(&s, 1, MR_OWNER_HELD, a), MR_ENOSPC, "alloc in an empty group");
    CHECK_RC(mr_slots_free(&s, (int64_t[]){6, 3}, 2, MR_FROM_CALLER, 0, NULL), MR_OK, "free 2");
    /* a new group ends the open one first */
    CHECK_RC(mr_slots_group_begin(&s, 1), MR_OK, "group of 1");
    CHECK_RC(mr_slots_group_begin(&s, 1), MR_OK, "group of 1 again");
    CHECK_RC(mr_slots_alloc(&s, 1, MR_OWNER_HELD, a), MR_OK, "alloc 1");
    CHECK(a[0] == 3 && mr_slots_available(&s) == 1, "second group's unit %lld", (long long)a[0]);
    expect_valid(&s, "groups");
    mr_slots_clear(&s);
    CHECK(!s.group_active && mr_slots_available(&s) == 6, "clear ends the group");
    /* a free group opened while one is open keeps it open with its pending
     * units (SGLang's free_group_begin would lose them: a leak) */
    CHECK_RC(mr_slots_alloc(&s, 4, MR_OWNER_HELD, a), MR_OK, "alloc 4");     /* 1 2 3 4 */
    CHECK_RC(mr_slots_free_group_begin(&s), MR_OK, "free group");
    CHECK_RC(mr_slots_free(&s, (int64_t[]){2, 1}, 2, MR_FROM_CALLER, 0, NULL), MR_OK, "free 2 1 in the group");
    CHECK_RC(mr_slots_free_group_begin(&s), MR_OK, "free group again");
    CHECK(s.free_group && s.n_pending == 2 && s.n_held == 2 && s.owner[1] == MR_OWNER_PENDING
          && s.owner[2] == MR_OWNER_PENDING && mr_slots_available(&s) == 2, "the open group's frees stay pending");
    CHECK_RC(mr_slots_free(&s, (int64_t[]){1}, 1, MR_FROM_CALLER, 0, NULL), MR_ENOENT, "a pending unit freed twice");
    CHECK_RC(mr_slots_free(&s, (int64_t[]){3}, 1, MR_FROM_CALLER, 0, NULL), MR_OK, "free 3 in the same group");
    mr_slots_free_group_end(&s, 0);
    CHECK(mr_slots_available(&s) == 5 && s.n_held == 1, "all three frees come back");
    CHECK_RC(mr_slots_alloc(&s, 5, MR_OWNER_HELD, a), MR_OK, "alloc 5");
    CHECK(a[0] == 5 && a[1] == 6 && a[2] == 2 && a[3] == 1 && a[4] == 3, "free list 5 6 2 1 3, in the order freed");
    CHECK_RC(mr_slots_free(&s, (int64_t[]){1, 2}, 2, MR_FROM_CALLER, 0, NULL), MR_OK, "free 1 2");
    expect_valid(&s, "nested free group");
    /* moves of units the caller checked: as mr_slots_transfer / mr_slots_free */
    CHECK_RC(mr_slots_alloc(&s, 2, 2, a), MR_OK, "alloc 2 for row 2");          /* 1 2 */
    mr_slots_transfer_checked(&s, a, 1, MR_OWNER_TREE);
    CHECK(s.owner[a[0]] == MR_OWNER_TREE && s.n_tree == 1 && s.n_req == 1, "a checked transfer");
    mr_slots_free_checked(&s, a + 1, 1);
    CHECK(s.n_req == 0 && mr_slots_available(&s) == 1, "a checked free");
    CHECK_RC(mr_slots_free_group_begin(&s), MR_OK, "free group");
    CHECK_RC(mr_slots_alloc(&s, 1, MR_OWNER_HELD, a), MR_OK, "alloc 1");
    mr_slots_free_checked(&s, a, 1);
    CHECK(s.owner[a[0]] == MR_OWNER_PENDING && s.n_pending == 1, "a checked free in a group waits");
    mr_slots_free_group_end(&s, 0);
    expect_valid(&s, "checked moves");
    mr_slots_destroy(&s);
}

static void
test_empty_and_bad_init(void)
{
    mr_slots s, zero;
    int64_t a[1];
    memset(&zero, 0, sizeof(zero));
    memset(&s, 0x5a, sizeof(s));
    CHECK_RC(mr_slots_init(&s, -1), MR_EINVAL, "init -1");
    CHECK(memcmp(&s, &zero, sizeof(s)) == 0, "a refused init leaves s zeroed");
    mr_slots_destroy(&s);
    CHECK_RC(mr_slots_init(&s, 0), MR_OK, "init 0");
    CHECK_RC(mr_slots_alloc(&s, 1, MR_OWNER_HELD, a), MR_ENOSPC, "alloc from nothing");
    CHECK_RC(mr_slots_free(&s, a, 0, MR_FROM_CALLER, 1, NULL), MR_OK, "free nothing");
    CHECK_RC(mr_slots_group_begin(&s, 1), MR_OK, "group with nothing");
    mr_slots_group_end(&s);
    expect_valid(&s, "empty");
    mr_slots_destroy(&s);
}

static void
test_kv_pages(void)
{
    mr_kv kv, zero;
    int64_t t[16], bad = 0;
    int32_t o = 0;
    memset(&zero, 0, sizeof(zero));
    memset(&kv, 0x5a, sizeof(kv));
    CHECK_RC(mr_kv_init(&kv, 8, 0), MR_EINVAL, "page size 0");
    CHECK(memcmp(&kv, &zero, sizeof(kv)) == 0, "a refused init leaves kv zeroed");
    CHECK_RC(mr_kv_init(&kv, -4, 4), MR_EINVAL, "size -4");
    mr_kv_destroy(&kv);
    /* 14 tokens of pages of 4: pages 1..3 (tokens 4..15), a partial page dropped */
    CHECK_RC(mr_kv_init(&kv, 14, 4), MR_OK, "init 14, 4");
    CHECK(kv.pages.n == 3 && mr_kv_available(&kv) == 12, "3 pages, 12 tokens: %lld", (long long)kv.pages.n);
    CHECK_RC(mr_kv_alloc(&kv, 6, MR_OWNER_HELD, t), MR_EINVAL, "alloc 6 tokens");
    CHECK_RC(mr_kv_alloc(&kv, -4, MR_OWNER_HELD, t), MR_EINVAL, "alloc -4 tokens");
    CHECK_RC(mr_kv_alloc(&kv, 16, MR_OWNER_HELD, t), MR_ENOSPC, "alloc 16 tokens");
    CHECK_RC(mr_kv_alloc(&kv, 8, 1, t), MR_OK, "alloc 8 tokens");
    expect_units(t, (int64_t[]){4, 5, 6, 7, 8, 9, 10, 11}, 8, "tokens of pages 1, 2");
    CHECK(mr_slots_owner(&kv.pages, 2, &o) == MR_OK && o == 1, "page 2 is row 1's");
    CHECK_RC(mr_kv_alloc(&kv, 4, 2, t + 8), MR_OK, "alloc 4 tokens");
    expect_units(t + 8, (int64_t[]){12, 13, 14, 15}, 4, "tokens of page 3");
    /* any token of a page frees the page; pages go to the head, ascending */
    CHECK_RC(mr_kv_free(&kv, (int64_t[]){14, 9, 10, 13}, 4, MR_FROM_CALLER, &bad), MR_OK, "free pages 3, 2");
    CHECK(mr_kv_available(&kv) == 8, "8 tokens free");
    CHECK_RC(mr_kv_alloc(&kv, 4, MR_OWNER_HELD, t), MR_OK, "alloc 4 tokens");
    CHECK(t[0] == 8, "the lowest freed page comes first: token %lld", (long long)t[0]);
    CHECK_RC(mr_kv_transfer(&kv, (int64_t[]){5, 8}, 2, MR_FROM_CALLER, MR_OWNER_TREE, &bad), MR_OK, "to the tree");
    CHECK(kv.pages.n_tree == 2, "2 pages in the tree");
    CHECK_RC(mr_kv_free(&kv, (int64_t[]){5}, 1, MR_FROM_CALLER, &bad), MR_EBUSY, "caller frees a tree page");
    CHECK(bad == 4, "bad is the page's first token: %lld", (long long)bad);
    CHECK_RC(mr_kv_free(&kv, (int64_t[]){7, 2}, 2, MR_FROM_TREE, &bad), MR_EINVAL, "free a token of page 0");
    CHECK(bad == 0, "bad %lld", (long long)bad);
    CHECK_RC(mr_kv_free(&kv, (int64_t[]){7, 16}, 2, MR_FROM_TREE, &bad), MR_EINVAL, "free a token past the end");
    CHECK(bad == 16, "bad %lld", (long long)bad);
    CHECK_RC(mr_kv_free(&kv, (int64_t[]){7, -1}, 2, MR_FROM_TREE, &bad), MR_EINVAL, "free token -1");
    CHECK(bad == -1, "bad %lld", (long long)bad);
    CHECK_RC(mr_kv_transfer(&kv, (int64_t[]){12}, 1, MR_FROM_ANY, 1, &bad), MR_ENOENT, "transfer a free page");
    CHECK(bad == 12, "bad %lld", (long long)bad);
    CHECK_RC(mr_kv_transfer(&kv, (int64_t[]){-2}, 1, MR_FROM_ANY, 1, &bad), MR_EINVAL, "transfer token -2");
    CHECK_RC(mr_kv_transfer(&kv, t, -1, MR_FROM_ANY, 1, &bad), MR_EINVAL, "transfer k < 0");
    CHECK_RC(mr_kv_free(&kv, t, -1, MR_FROM_ANY, &bad), MR_EINVAL, "free k < 0");
    CHECK_RC(mr_kv_free(&kv, t, 0, MR_FROM_ANY, &bad), MR_OK, "free no token");
    CHECK_RC(mr_kv_free(&kv, (int64_t[]){7, 4, 8}, 3, MR_FROM_TREE, &bad), MR_OK, "the tree frees its pages");
    CHECK(kv.pages.n_tree == 0 && mr_kv_available(&kv) == 12, "tree pages freed");
    CHECK_RC(mr_kv_reserve(&kv, -1), MR_EINVAL, "reserve -1");
    CHECK_RC(mr_kv_reserve(&kv, 40), MR_OK, "reserve 40");
    CHECK(kv.scratch_cap >= 40, "reserve grows the scratch");
    /* distinct pages per block of 4 positions (an insert's value) */
    CHECK_RC(mr_kv_distinct(&kv, (int64_t[]){4, 5, 6, 7, 8, 9, 10, 11}, 8, 0, &bad), MR_OK, "two pages");
    CHECK_RC(mr_kv_distinct(&kv, (int64_t[]){4, 4, 9, 6, 12, 13}, 6, 0, &bad), MR_OK,
             "a block may list its pages again, two pages included");
    CHECK_RC(mr_kv_distinct(&kv, (int64_t[]){4, 5, 6, 7, 8, 9, 5, 11}, 8, 0, &bad), MR_EINVAL,
             "page 1 in a second block");
    CHECK(bad == 6, "bad offset %lld", (long long)bad);
    CHECK_RC(mr_kv_distinct(&kv, (int64_t[]){6, 7, 4, 5}, 4, 2, &bad), MR_EINVAL,
             "positions 2..5: page 1 ends block 0 and starts block 1");
    CHECK(bad == 2, "bad offset %lld", (long long)bad);
    CHECK_RC(mr_kv_distinct(&kv, (int64_t[]){4, 16}, 2, 0, &bad), MR_EINVAL, "a page out of range");
    CHECK(bad == 1, "bad offset %lld", (long long)bad);
    expect_valid(&kv.pages, "kv pages");
    mr_kv_destroy(&kv);
    /* page size 1: a page is a token, frees go to the tail in the order given */
    CHECK_RC(mr_kv_init(&kv, 4, 1), MR_OK, "init 4, 1");
    CHECK_RC(mr_kv_alloc(&kv, 3, MR_OWNER_HELD, t), MR_OK, "alloc 3");
    expect_units(t, (int64_t[]){1, 2, 3}, 3, "tokens");
    CHECK_RC(mr_kv_free(&kv, (int64_t[]){3, 1}, 2, MR_FROM_CALLER, &bad), MR_OK, "free 3, 1");
    CHECK_RC(mr_kv_free(&kv, (int64_t[]){2, 2}, 2, MR_FROM_CALLER, &bad), MR_EINVAL, "free 2 twice");
    CHECK_RC(mr_kv_alloc(&kv, 3, MR_OWNER_HELD, t), MR_OK, "alloc 3");
    expect_units(t, (int64_t[]){4, 3, 1}, 3, "tail order");
    CHECK_RC(mr_kv_distinct(&kv, (int64_t[]){1, 3, 2}, 3, 0, &bad), MR_OK, "three tokens");
    CHECK_RC(mr_kv_distinct(&kv, (int64_t[]){1, 3, 1}, 3, 0, &bad), MR_EINVAL, "token 1 twice");
    CHECK(bad == 2, "bad offset %lld", (long long)bad);
    expect_valid(&kv.pages, "no mark left");
    CHECK_RC(mr_kv_reserve(&kv, 100), MR_OK, "reserve at page size 1");
    CHECK(kv.scratch == NULL, "page size 1 needs no scratch");
    mr_kv_destroy(&kv);
    mr_kv_destroy(&kv);
}

/* mr_kv_explain: each refusal of a free / transfer, explained in terms of
 * the caller's list (literal expected entries and reasons). */
static void
expect_why(mr_kv *kv, int rc, const int64_t *tok, int64_t k, int64_t bad, mr_kv_why why, int64_t at, int64_t first,
           int32_t owner, const char *what)
{
    mr_kv_refusal r;
    mr_kv_explain(kv, rc, tok, k, bad, &r);
    CHECK(r.why == why && r.at == at && (why != MR_KV_WHY_TWICE || r.first == first)
              && (why < MR_KV_WHY_FREE || r.owner == owner),
          "%s: why %d at %lld first %lld owner %d, expected %d at %lld first %lld owner %d", what, (int)r.why,
          (long long)r.at, (long long)r.first, (int)r.owner, (int)why, (long long)at, (long long)first, (int)owner);
}

#define EXPLAIN(call, tok, k, why, at, first, owner, what)                                 \
    do {                                                                                   \
        int64_t bad_ = -7;                                                                 \
        int rc_ = (call);                                                                  \
        CHECK(rc_ != MR_OK, "%s: refused", (what));                                        \
        expect_why(&kv, rc_, (tok), (k), bad_, (why), (at), (first), (owner), (what));     \
    } while (0)

static void
test_kv_explain(void)
{
    mr_kv kv;
    int64_t t[16];
    /* pages of 4: 1..3 (tokens 4..15) */
    CHECK_RC(mr_kv_init(&kv, 16, 4), MR_OK, "init 16, 4");
    CHECK_RC(mr_kv_alloc(&kv, 4, 2, t), MR_OK, "page 1 to row 2");
    CHECK_RC(mr_kv_alloc(&kv, 4, MR_OWNER_HELD, t + 4), MR_OK, "page 2 held");
    CHECK_RC(mr_kv_transfer(&kv, (int64_t[]){4}, 1, MR_FROM_ANY, MR_OWNER_TREE, NULL), MR_OK, "page 1 to the tree");
    int64_t a[] = {9, 13};   /* page 3 is free */
    EXPLAIN(mr_kv_free(&kv, a, 2, MR_FROM_CALLER, &bad_), a, 2, MR_KV_WHY_FREE, 1, -1, MR_OWNER_FREE, "free page");
    int64_t b[] = {8, 20};
    EXPLAIN(mr_kv_free(&kv, b, 2, MR_FROM_CALLER, &bad_), b, 2, MR_KV_WHY_RANGE, 1, -1, 0, "past the end");
    int64_t c[] = {9, 2};
    EXPLAIN(mr_kv_free(&kv, c, 2, MR_FROM_CALLER, &bad_), c, 2, MR_KV_WHY_RANGE, 1, -1, 0, "page 0");
    int64_t d[] = {10, 6};
    EXPLAIN(mr_kv_free(&kv, d, 2, MR_FROM_CALLER, &bad_), d, 2, MR_KV_WHY_TREE, 1, -1, MR_OWNER_TREE,
            "a tree page from the caller");
    int64_t e[] = {9};
    EXPLAIN(mr_kv_transfer(&kv, e, 1, MR_FROM_TREE, 1, &bad_), e, 1, MR_KV_WHY_HELD, 0, -1, MR_OWNER_HELD,
            "a held page from the tree");
    CHECK_RC(mr_kv_transfer(&kv, (int64_t[]){4}, 1, MR_FROM_ANY, 3, NULL), MR_OK, "page 1 to row 3");
    EXPLAIN(mr_kv_transfer(&kv, (int64_t[]){5}, 1, MR_FROM_TREE, MR_OWNER_HELD, &bad_), ((int64_t[]){5}), 1,
            MR_KV_WHY_ROW, 0, -1, 3, "a row's page from the tree");
    CHECK_RC(mr_kv_free_group_begin(&kv), MR_OK, "free group");
    CHECK_RC(mr_kv_free(&kv, (int64_t[]){8}, 1, MR_FROM_CALLER, NULL), MR_OK, "page 2 pending");
    CHECK_RC(mr_kv_alloc(&kv, 4, MR_OWNER_HELD, t), MR_OK, "page 3 held");
    CHECK_RC(mr_kv_free_group_end(&kv), MR_OK, "end the free group");
    mr_kv_destroy(&kv);
    /* page size 1: a token listed twice (its second entry), a pending one */
    CHECK_RC(mr_kv_init(&kv, 6, 1), MR_OK, "init 6, 1");
    CHECK_RC(mr_kv_alloc(&kv, 5, MR_OWNER_HELD, t), MR_OK, "alloc 5");
    int64_t f[] = {1, 3, 2, 3, 4};
    EXPLAIN(mr_kv_free(&kv, f, 5, MR_FROM_CALLER, &bad_), f, 5, MR_KV_WHY_TWICE, 3, 1, 0, "3 twice");
    CHECK_RC(mr_kv_free_group_begin(&kv), MR_OK, "free group");
    CHECK_RC(mr_kv_free(&kv, (int64_t[]){2}, 1, MR_FROM_CALLER, NULL), MR_OK, "2 pending");
    int64_t g[] = {1, 2};
    EXPLAIN(mr_kv_free(&kv, g, 2, MR_FROM_CALLER, &bad_), g, 2, MR_KV_WHY_PENDING, 1, -1, MR_OWNER_PENDING,
            "2 freed in the open group");
    CHECK_RC(mr_kv_free_group_end(&kv), MR_OK, "end the free group");
    int64_t h[] = {-3};
    EXPLAIN(mr_kv_free(&kv, h, 1, MR_FROM_CALLER, &bad_), h, 1, MR_KV_WHY_RANGE, 0, -1, 0, "token -3");
    /* the open alloc group's units: held, but not handed out */
    CHECK_RC(mr_kv_free(&kv, (int64_t[]){1, 3, 4, 5}, 4, MR_FROM_CALLER, NULL), MR_OK, "free 1, 3, 4, 5");
    CHECK_RC(mr_slots_group_begin(&kv.pages, 2), MR_OK, "an alloc group of 2");
    int64_t i[] = {kv.pages.group[1]};
    EXPLAIN(mr_kv_free(&kv, i, 1, MR_FROM_CALLER, &bad_), i, 1, MR_KV_WHY_ALLOC_GROUP, 0, -1, MR_OWNER_HELD,
            "a unit of the open alloc group");
    mr_slots_group_end(&kv.pages);
    /* a status with no entry to blame */
    expect_why(&kv, MR_ENOMEM, g, 2, -1, MR_KV_WHY_STATUS, -1, -1, 0, "out of memory");
    expect_why(&kv, MR_EINVAL, (int64_t[]){1, 3}, 2, 3, MR_KV_WHY_STATUS, -1, -1, 0, "in range, listed once");
    mr_kv_destroy(&kv);
}

/* ------------------------------------------------------------------------
 * --check: deliberate corruptions */

static void
expect_corrupt(mr_slots *s, const char *what, const char *needle)
{
    char msg[256] = "";
    int rc = mr_slots_check(s, msg, sizeof(msg));
    CHECK(rc == MR_ECORRUPT && strstr(msg, needle) != NULL, "%s: check returned %s (%s), expected \"%s\"", what,
          mr_strerror(rc), msg, needle);
}

static void
test_check_detects(void)
{
    mr_slots s;
    int64_t a[8];
    CHECK_RC(mr_slots_init(&s, 8), MR_OK, "init 8");
    CHECK_RC(mr_slots_alloc(&s, 3, MR_OWNER_HELD, a), MR_OK, "alloc 3");   /* 1 2 3 */
    CHECK_RC(mr_slots_transfer(&s, a, 1, MR_FROM_CALLER, MR_OWNER_TREE, NULL), MR_OK, "1 to the tree");
    CHECK_RC(mr_slots_alloc(&s, 1, 2, a), MR_OK, "alloc for row 2");     /* 4 */
    CHECK_RC(mr_slots_group_begin(&s, 2), MR_OK, "group of 2");          /* 5 6 */
    expect_valid(&s, "before corruption");
    int64_t ring0 = s.ring[s.head], ring1 = s.ring[(s.head + 1) % s.n];  /* 7 8 */

    s.owner[0] = MR_OWNER_FREE;
    expect_corrupt(&s, "unit 0 free", "not reserved");
    s.owner[0] = MR_OWNER_RESERVED;

    s.owner[3] = -9;
    expect_corrupt(&s, "unknown owner", "unknown owner");
    s.owner[3] = MR_OWNER_HELD;

    s.mark[2] = 1;
    expect_corrupt(&s, "stale mark", "stale scratch mark");
    s.mark[2] = 0;

    s.n_req++;
    expect_corrupt(&s, "counter", "recount");
    s.n_req--;

    s.owner[2] = MR_OWNER_FREE;  /* free, but not in the free list */
    expect_corrupt(&s, "free unit not listed", "recount");
    s.owner[2] = MR_OWNER_HELD;

    /* a listed unit that is held, and a held unit that is free: counts agree */
    s.owner[ring0] = MR_OWNER_HELD;
    s.owner[2] = MR_OWNER_FREE;
    expect_corrupt(&s, "listed unit held", "not a distinct FREE slot");
    s.owner[ring0] = MR_OWNER_FREE;
    s.owner[2] = MR_OWNER_HELD;

    s.ring[(s.head + 1) % s.n] = ring0;  /* listed twice */
    expect_corrupt(&s, "listed twice", "not a distinct FREE slot");
    s.ring[(s.head + 1) % s.n] = ring1;
    expect_valid(&s, "marks cleared after a failed check");

    s.ring[s.head] = 0;
    expect_corrupt(&s, "unit 0 listed", "not a distinct FREE slot");
    s.ring[s.head] = ring0;

    s.owner[s.group[s.group_pos]] = 3;  /* a group unit given away behind its back */
    s.n_held--;
    s.n_req++;
    expect_corrupt(&s, "group unit not held", "group slot");
    s.owner[s.group[s.group_pos]] = MR_OWNER_HELD;
    s.n_held++;
    s.n_req--;

    expect_valid(&s, "after every corruption was undone");
    mr_slots_destroy(&s);
}

/* ------------------------------------------------------------------------
 * --fuzz */

static int fuzz_inject = 0;      /* make allocations fail at random (fault-injection build) */
static long hits[16];            /* return codes seen, by -code */
static long injected = 0;

/* Up to 4 distinct units `from` accepts, and sometimes one bad entry. */
static int64_t
rand_units(const model *m, mr_from from, int64_t *idx)
{
    int64_t cand[MAXN], nc = 0;
    for (int64_t u = 1; u <= m->n; u++) {
        if (m_takes(from, m->owner[u])) {
            cand[nc++] = u;
        }
    }
    int64_t k = (int64_t)unit_rnd(5);
    if (k > nc) {
        k = nc;
    }
    for (int64_t i = 0; i < k; i++) {
        int64_t j = i + (int64_t)unit_rnd((uint32_t)(nc - i));
        int64_t x = cand[i];
        cand[i] = cand[j];
        cand[j] = x;
        idx[i] = cand[i];
    }
    if (unit_rnd(4) == 0) {
        int64_t v = 0;
        switch (unit_rnd(6)) {
        case 0: v = 0; break;
        case 1: v = m->n + 1; break;
        case 2: v = -1 - (int64_t)unit_rnd(3); break;
        case 3: v = m->nfree > 0 ? m->fifo[unit_rnd((uint32_t)m->nfree)] : m->n + 7; break;
        case 4: v = 1 + (int64_t)unit_rnd((uint32_t)(m->n > 0 ? m->n : 1)); break;  /* any owner */
        default: v = k > 0 ? idx[unit_rnd((uint32_t)k)] : 0; break;                  /* twice */
        }
        int64_t pos = (int64_t)unit_rnd((uint32_t)k + 1);
        memmove(idx + pos + 1, idx + pos, (size_t)(k - pos) * sizeof(int64_t));
        idx[pos] = v;
        k++;
    }
    return k;
}

static mr_from
rand_from(void)
{
    static const mr_from f[3] = {MR_FROM_CALLER, MR_FROM_TREE, MR_FROM_ANY};
    return f[unit_rnd(3)];
}

static int32_t
rand_owner(int tree_ok)
{
    uint32_t r = unit_rnd(12);
    if (r < 4) {
        return MR_OWNER_HELD;
    }
    if (r < 9) {
        return (int32_t)(1 + unit_rnd(5));
    }
    if (r < 11 && tree_ok) {
        return MR_OWNER_TREE;
    }
    static const int32_t badowner[4] = {MR_OWNER_FREE, MR_OWNER_RESERVED, -9, MR_OWNER_TREE};
    return badowner[unit_rnd(4)];
}

static void
seen(int rc)
{
    hits[-rc < 16 ? -rc : 15]++;
}

/* One run on mr_slots: n units, ops calls. */
static void
fuzz_slots(int64_t n, long ops)
{
    mr_slots s;
    model m;
    char where[96];
    int64_t a[MAXN + 8], b[MAXN + 8], idx[MAXN + 8];
    CHECK_RC(mr_slots_init(&s, n), MR_OK, "fuzz init");
    m_init(&m, n);
    for (long op = 0; op < ops; op++) {
        int64_t bad_s = -77, bad_m = -77, k;
        int rs = MR_OK, rm = MR_OK, cmp_bad = 0;
        uint32_t kind = unit_rnd(22);
        snprintf(where, sizeof(where), "slots n=%lld op %ld kind %u", (long long)n, op, kind);
        if (kind < 6) {
            k = unit_rnd(10) == 0 ? -1 : (int64_t)unit_rnd(5);
            int32_t owner = rand_owner(0);
            rs = mr_slots_alloc(&s, k, owner, a);
            rm = m_alloc(&m, k, owner, b);
            if (rs == MR_OK && rm == MR_OK) {
                same_out(a, b, k, where);
            }
        }
        else if (kind < 10) {
            mr_from from = rand_from();
            int front = (int)unit_rnd(2);
            k = rand_units(&m, from, idx);
            rs = mr_slots_free(&s, idx, k, from, front, unit_rnd(8) == 0 ? NULL : &bad_s);
            rm = m_free(&m, idx, k, from, front, 0, &bad_m);
            cmp_bad = bad_s != -77;
        }
        else if (kind < 15) {
            mr_from from = rand_from();
            int32_t to = rand_owner(1);
            k = rand_units(&m, from, idx);
            rs = mr_slots_transfer(&s, idx, k, from, to, &bad_s);
            rm = m_transfer(&m, idx, k, from, to, &bad_m);
            cmp_bad = to == MR_OWNER_TREE || to == MR_OWNER_HELD || to > 0;
        }
        else if (kind < 17) {
            k = (int64_t)unit_rnd(6) - (unit_rnd(8) == 0 ? 7 : 0);
            rs = mr_slots_group_begin(&s, k);
            rm = m_group_begin(&m, k);
        }
        else if (kind < 19) {
            mr_slots_group_end(&s);
            m_group_end(&m);
        }
        else if (kind == 20) {
            rs = mr_slots_free_group_begin(&s);
            if (rs == MR_OK) {
                m_free_group_begin(&m);
            }
            rm = rs;
        }
        else if (kind == 21) {
            int front = (int)unit_rnd(2);
            mr_slots_free_group_end(&s, front);
            m_free_group_end(&m, front);
        }
        else if (unit_rnd(4) == 0) {
            mr_slots_clear(&s);
            m_clear(&m);
        }
        else {
            int64_t i = (int64_t)unit_rnd((uint32_t)n + 5) - 2;
            int32_t o = 0;
            rs = mr_slots_owner(&s, i, &o);
            rm = i >= 0 && i <= n ? MR_OK : MR_EINVAL;
            CHECK(rs != MR_OK || (rm == MR_OK && o == m.owner[i]), "%s: owner(%lld)", where, (long long)i);
        }
        seen(rs);
        CHECK(rs == rm, "%s: %s, model %s", where, mr_strerror(rs), mr_strerror(rm));
        if (rs != MR_OK && cmp_bad) {
            CHECK(bad_s == bad_m, "%s: bad unit %lld, model %lld", where, (long long)bad_s, (long long)bad_m);
        }
        if (!same(&s, &m, where)) {
            break;
        }
    }
    mr_slots_destroy(&s);
}

/* Tokens of up to 4 pages `from` accepts (several tokens of a page, any
 * order) and sometimes one bad token. */
static int64_t
rand_tokens(const model *m, int64_t ps, mr_from from, int64_t *tok)
{
    int64_t pages[MAXN + 8], k = 0;
    int64_t np = rand_units(m, from, pages);
    for (int64_t i = 0; i < np; i++) {
        int64_t c = ps == 1 ? 1 : 1 + (int64_t)unit_rnd(3);
        for (int64_t j = 0; j < c && k < MAXTOK; j++) {
            tok[k++] = pages[i] * ps + (int64_t)unit_rnd((uint32_t)ps);
        }
    }
    for (int64_t i = k - 1; i > 0; i--) {
        int64_t j = (int64_t)unit_rnd((uint32_t)i + 1), x = tok[i];
        tok[i] = tok[j];
        tok[j] = x;
    }
    if (unit_rnd(10) == 0) {
        int64_t pos = (int64_t)unit_rnd((uint32_t)k + 1);
        tok[pos] = -1 - (int64_t)unit_rnd(20);
        k += pos == k;
    }
    return k;
}

/* One run on mr_kv: npages pages of ps tokens, ops calls. */
static void
fuzz_kv(int64_t ps, int64_t npages, long ops)
{
    mr_kv kv;
    model m;
    char where[96];
    int64_t a[MAXN * 16], b[MAXN * 16], tok[MAXTOK + 8];
    CHECK_RC(mr_kv_init(&kv, npages * ps + (int64_t)unit_rnd((uint32_t)ps), ps), MR_OK, "fuzz kv init");
    m_init(&m, npages);
    for (long op = 0; op < ops; op++) {
        int64_t bad_s = -77, bad_m = -77, k;
        int rs = MR_OK, rm = MR_OK, cmp_bad = 0;
        uint32_t kind = unit_rnd(11);
        snprintf(where, sizeof(where), "kv ps=%lld pages=%lld op %ld kind %u", (long long)ps, (long long)npages,
                 op, kind);
        if (kind < 4) {
            k = (int64_t)unit_rnd(4) * ps + (unit_rnd(8) == 0 ? 1 : 0);
            int32_t owner = rand_owner(0);
            if (!(owner == MR_OWNER_HELD || owner > 0)) {
                owner = MR_OWNER_HELD;  /* bad owners: --units (their precedence over ENOSPC is unspecified) */
            }
            rs = mr_kv_alloc(&kv, k, owner, a);
            rm = mk_alloc(&m, ps, k, owner, b);
            if (rs == MR_OK && rm == MR_OK) {
                same_out(a, b, k, where);
            }
        }
        else if (kind == 10) {   /* a free group opens or closes */
            if (m.factive && unit_rnd(4) != 0) {
                mr_kv_free_group_end(&kv);
                m_free_group_end(&m, ps > 1);
            }
            else {   /* sometimes while one is open: its pending pages are dropped */
                rs = mr_kv_free_group_begin(&kv);
                if (rs == MR_OK) {
                    m_free_group_begin(&m);
                }
                rm = rs;
            }
        }
        else {
            int is_free = kind < 7;
            mr_from from = rand_from();
            int32_t to = rand_owner(1);
            k = rand_tokens(&m, ps, from, tok);
            long used = 0;
#ifdef MR_FAULT_INJECT
            int inject = fuzz_inject && unit_rnd(3) == 0;
            if (inject) {
                mr_fault_fail_at(1);
            }
#endif
            rs = is_free ? mr_kv_free(&kv, tok, k, from, &bad_s) : mr_kv_transfer(&kv, tok, k, from, to, &bad_s);
#ifdef MR_FAULT_INJECT
            used = mr_fault_count();
            mr_fault_fail_at(0);
            if (inject && rs == MR_ENOMEM) {
                CHECK(used >= 1, "%s: MR_ENOMEM without an allocation", where);
                injected++;
                seen(rs);
                if (!same(&kv.pages, &m, where)) {
                    break;
                }
                continue;  /* nothing changed: the model stays as it is */
            }
#endif
            (void)used;
            rm = mk_move(&m, ps, tok, k, from, is_free, to, &bad_m);
            cmp_bad = is_free || to == MR_OWNER_TREE || to == MR_OWNER_HELD || to > 0;  /* else no unit is at fault */
        }
        seen(rs);
        CHECK(rs == rm, "%s: %s, model %s", where, mr_strerror(rs), mr_strerror(rm));
        if (rs != MR_OK && cmp_bad) {
            CHECK(bad_s == bad_m, "%s: bad token %lld, model %lld", where, (long long)bad_s, (long long)bad_m);
        }
        CHECK(mr_kv_available(&kv) == m.nfree * ps, "%s: available tokens", where);
        if (!same(&kv.pages, &m, where)) {
            break;
        }
    }
    mr_kv_destroy(&kv);
}

static void
test_fuzz(long ops)
{
    static const int64_t pss[3] = {1, 4, 16};
    long done = 0, runs = 0;
    memset(hits, 0, sizeof(hits));
    while (done < ops && unit_errors == 0) {
        long per = 400;
        if (runs % 2 == 0) {
            int64_t n = unit_rnd(8) == 0 ? (int64_t)unit_rnd(3) : 1 + (int64_t)unit_rnd(40);
            fuzz_slots(n, per);
        }
        else {
            int64_t ps = pss[unit_rnd(3)];
            fuzz_kv(ps, 1 + (int64_t)unit_rnd(ps == 16 ? 10 : 30), per);
        }
        done += per;
        runs++;
    }
    printf("fuzz: %ld calls in %ld runs%s; codes seen: OK %ld, EINVAL %ld, ENOENT %ld, EBUSY %ld, ENOSPC %ld, "
           "ENOMEM %ld (injected %ld)\n", done, runs, fuzz_inject ? " with failing allocations" : "", hits[0],
           hits[-MR_EINVAL], hits[-MR_ENOENT], hits[-MR_EBUSY], hits[-MR_ENOSPC], hits[-MR_ENOMEM], injected);
    if (ops >= 10000) {
        static const int codes[5] = {MR_OK, MR_EINVAL, MR_ENOENT, MR_EBUSY, MR_ENOSPC};
        for (int c = 0; c < 5; c++) {
            CHECK(hits[-codes[c]] > 0, "fuzz never returned %s", mr_strerror(codes[c]));
        }
        CHECK(!fuzz_inject || injected > 0, "fuzz: no allocation failure injected");
    }
}

/* ------------------------------------------------------------------------
 * --oom */

#ifdef MR_FAULT_INJECT
static void
oom_init(void)
{
    static const int64_t sizes[3] = {0, 1, 7};
    long points = 0;
    for (int z = 0; z < 3; z++) {
        for (int kind = 0; kind < 2; kind++) {
            for (long f = 1; f < 100; f++) {
                mr_slots s;
                mr_kv kv;
                char zero[sizeof(mr_kv)];
                memset(zero, 0, sizeof(zero));
                mr_fault_fail_at(f);
                int rc = kind == 0 ? mr_slots_init(&s, sizes[z]) : mr_kv_init(&kv, sizes[z] * 4, 4);
                long used = mr_fault_count();
                mr_fault_fail_at(0);
                if (used < f) {
                    CHECK_RC(rc, MR_OK, "init with no failure");
                    expect_valid(kind == 0 ? &s : &kv.pages, "init");
                    kind == 0 ? mr_slots_destroy(&s) : mr_kv_destroy(&kv);
                    CHECK(f > 4, "init made %ld allocations", f - 1);
                    break;
                }
                points++;
                CHECK_RC(rc, MR_ENOMEM, "init with a failing allocation");
                CHECK(memcmp(kind == 0 ? (void *)&s : (void *)&kv, zero, kind == 0 ? sizeof(s) : sizeof(kv)) == 0,
                      "a failed init leaves the struct zeroed (allocation %ld)", f);
                kind == 0 ? mr_slots_destroy(&s) : mr_kv_destroy(&kv);
            }
        }
    }
    printf("oom: init: %ld allocation failure points checked\n", points);
}

/* The scratch of a page-mode free / transfer / reserve cannot grow. */
static void
oom_scratch(void)
{
    mr_kv kv;
    model m;
    int64_t t[24], bad = 0;
    CHECK_RC(mr_kv_init(&kv, 6 * 4, 4), MR_OK, "init");
    m_init(&m, 6);
    CHECK_RC(mr_kv_alloc(&kv, 12, 1, t), MR_OK, "alloc");
    CHECK_RC(mk_alloc(&m, 4, 12, 1, t + 12), MR_OK, "model alloc");
    for (int what = 0; what < 3; what++) {
        mr_fault_fail_at(1);
        int rc = what == 0   ? mr_kv_free(&kv, t, 12, MR_FROM_CALLER, &bad)
                 : what == 1 ? mr_kv_transfer(&kv, t, 12, MR_FROM_CALLER, MR_OWNER_TREE, &bad)
                             : mr_kv_reserve(&kv, 12);
        mr_fault_fail_at(0);
        CHECK_RC(rc, MR_ENOMEM, what == 0 ? "free" : what == 1 ? "transfer" : "reserve");
        CHECK(kv.scratch == NULL && kv.scratch_cap == 0, "a failed growth keeps the scratch");
        same(&kv.pages, &m, "after a failed scratch growth");
    }
    /* once reserved, the free needs no allocation */
    CHECK_RC(mr_kv_reserve(&kv, 12), MR_OK, "reserve");
    mr_fault_fail_at(1);
    int rc = mr_kv_transfer(&kv, t, 12, MR_FROM_CALLER, MR_OWNER_TREE, &bad);
    CHECK(mr_fault_count() == 0, "a transfer within the reserve allocates");
    rc = rc == MR_OK ? mr_kv_free(&kv, t, 12, MR_FROM_TREE, &bad) : rc;
    CHECK(mr_fault_count() == 0, "a free within the reserve allocates");
    mr_fault_fail_at(0);
    CHECK_RC(rc, MR_OK, "transfer and free within the reserve");
    CHECK_RC(mk_move(&m, 4, t, 12, MR_FROM_CALLER, 1, 0, &bad), MR_OK, "model free");
    same(&kv.pages, &m, "after the reserved free");
    /* a larger list grows the scratch again, and can fail again */
    int64_t more[30];
    for (int i = 0; i < 30; i++) {
        more[i] = 4 + i % 8;
    }
    mr_fault_fail_at(1);
    CHECK_RC(mr_kv_free(&kv, more, 30, MR_FROM_ANY, &bad), MR_ENOMEM, "free of 30 tokens");
    mr_fault_fail_at(0);
    CHECK(kv.scratch != NULL && kv.scratch_cap == 12, "the old scratch stays");
    CHECK_RC(mr_kv_free(&kv, more, 30, MR_FROM_ANY, &bad), MR_ENOENT, "the same free, pages already free");
    same(&kv.pages, &m, "end");
    mr_kv_destroy(&kv);
}
#endif

int
main(int argc, char **argv)
{
    static const char *const groups[4] = {"units", "check", "fuzz", "oom"};
    int on[4];
    long ops = 200000;
    unit_start(argc, argv, groups, on, 4, &ops);
    if (on[0]) {
        test_fifo();
        test_transfer();
        test_groups();
        test_empty_and_bad_init();
        test_kv_pages();
        test_kv_explain();
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
        oom_scratch();
        fuzz_inject = 1;
        test_fuzz(ops / 2);
#else
        unit_skip_oom();
#endif
    }
    return unit_exit("test_slot_alloc");
}
