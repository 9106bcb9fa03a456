/* test_lc_model.c - a model of the request lifecycle, and a fuzzer that runs
 * random batched calls (prefill, end of prefill, decode, finish) on the real
 * lifecycle (lifecycle.c) and on the model, comparing them after every call.
 * What naive_model.c is for the tree, this is for the lifecycle.
 *
 * The model knows nothing of nodes, splits, LRU order or the allocators'
 * free lists.  It keeps:
 *   - a trie of KV pages (a node is named by the KV page that holds its
 *     tokens; node 0, the reserved page, is the root), each with the state
 *     slot cached at its end, if any;
 *   - the owner of every state slot, KV page and request row (free, tree, or
 *     request r);
 *   - each live request's tokens.
 * After each call it derives, from its own rules (SGLang v0.5.15's), the
 * owner every unit must have now and the request records' fields, and
 * compares them with the pools and records of the real lifecycle.
 *
 * Eviction order is the tree's business; the model learns what a call
 * evicted by the units that left the tree, and checks that each was
 * evictable: no state that a request's lock protects, no KV page on a
 * locked path, only whole subtrees.  A match must then return the deepest
 * state on the key's path that was not evicted during the call.  A refused
 * batch or decode step must take nothing, evict nothing, and be short of
 * rows, state slots or KV pages even counting everything that could be
 * evicted; a refused end of prefill must leave every row as it was.
 *
 *   test_lc_model [--ops N] [--seed S]   (N in total over page sizes 1, 4
 *                                         and 16 and the four modes:
 *                                         no_buffer, pp2, pp1, lazy)
 * Exits with the number of failed runs.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lifecycle.h"
#include "lc_batch.h"

enum { MAXB = 3, MAXCTX = 512, MAXPS = 16 };

/* ------------------------------------------------------------------------
 * Random source */

static uint64_t rs = 1;
static uint32_t
rnd(uint32_t n)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return n ? (uint32_t)((rs >> 11) % n) : 0;
}

/* ------------------------------------------------------------------------
 * The model */

#define M_FREE 0
#define M_TREE (-1)

typedef struct {
    int32_t parent, child, sib;   /* links among live nodes */
    int32_t tok[MAXPS];
    int64_t state;                /* slot cached at the node's end, -1 none */
    uint8_t live;
    uint8_t evict;                /* scratch: evicted by the current call */
    int32_t locks, targets;       /* scratch: locked paths through / ending here */
} mnode;

typedef struct {
    int live;
    int32_t tok[MAXCTX + 8];
    int64_t ntok;                 /* tokens known (prompt + decoded) */
} mreq;

typedef struct {
    /* configuration */
    int64_t ps, npages, nslots, nrows, C, iv;
    int extra, pp, lazy;
    /* the model */
    mnode *nd;                    /* npages + 1; [0] is the root */
    int32_t *kv_owner;            /* per page */
    int32_t *st_owner;            /* per slot */
    int64_t *st_node;             /* slot -> node holding it as a state, -1 */
    mreq *rq;                     /* per row */
    /* the real thing */
    mr_slots state;
    mr_kv kv;
    mr_reqpool rp;
    mr_lifecycle *lc;
    /* bookkeeping */
    long op;
    const char *what;             /* the call being checked */
    int failed;
    long n_prefill, n_refused, n_unfinished, n_decode, n_decode_refused, n_finish, n_hits, n_evicted;
} model;

static void
fail(model *m, const char *fmt, ...)
{
    if (m->failed) {
        return;
    }
    m->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "lc_model: ps=%lld extra=%d pp=%d lazy=%d op %ld (%s): ", (long long)m->ps, m->extra, m->pp,
            m->lazy, m->op, m->what);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static int32_t
find_child(const model *m, int32_t parent, const int32_t *page)
{
    for (int32_t c = m->nd[parent].child; c != 0; c = m->nd[c].sib) {
        if (memcmp(m->nd[c].tok, page, (size_t)m->ps * sizeof(int32_t)) == 0) {
            return c;
        }
    }
    return -1;
}

/* Follows tokens[0 : npg pages) down the trie; path[d] = node at depth d+1.
 * Returns the pages found. */
static int64_t
walk(const model *m, const int32_t *tok, int64_t npg, int32_t *path)
{
    int32_t cur = 0;
    int64_t d = 0;
    for (; d < npg; d++) {
        int32_t c = find_child(m, cur, tok + d * m->ps);
        if (c < 0) {
            break;
        }
        path[d] = cur = c;
    }
    return d;
}

static int32_t
row_owner_of(int64_t r)
{
    return (int32_t)r;
}

static const mr_req *
rec(const model *m, int64_t r)
{
    return &m->rp.req[r];
}

static int32_t
table_at(const model *m, int64_t r, int64_t pos)
{
    return m->rp.table[r * m->rp.max_ctx + pos];
}

/* Locks: every live request's locked path (record.locked: the path of its
 * first protected_len tokens) but rows skip[0:nskip), plus extra paths (the
 * batch being checked). */
static void
mark_locks_but(model *m, const int32_t *const *xtok, const int64_t *xlen, int nx, const int64_t *skip,
               size_t nskip)
{
    for (int64_t i = 0; i <= m->npages; i++) {
        m->nd[i].locks = m->nd[i].targets = 0;
    }
    int32_t path[MAXCTX];
    for (int64_t r = 1; r <= m->nrows; r++) {
        const mr_req *st = rec(m, r);
        int skipped = 0;
        for (size_t k = 0; k < nskip; k++) {
            skipped |= skip[k] == r;
        }
        if (!m->rq[r].live || !st->locked || skipped) {
            continue;
        }
        int64_t npg = st->protected_len / m->ps;
        int64_t got = walk(m, m->rq[r].tok, npg, path);
        for (int64_t d = 0; d < got; d++) {
            m->nd[path[d]].locks++;
        }
        m->nd[got > 0 ? path[got - 1] : 0].targets++;
    }
    for (int i = 0; i < nx; i++) {
        if (xlen[i] < 0) {
            continue;
        }
        int64_t got = walk(m, xtok[i], xlen[i] / m->ps, path);
        for (int64_t d = 0; d < got; d++) {
            m->nd[path[d]].locks++;
        }
        m->nd[got > 0 ? path[got - 1] : 0].targets++;
    }
}

static void
mark_locks(model *m, const int32_t *const *xtok, const int64_t *xlen, int nx)
{
    mark_locks_but(m, xtok, xlen, nx, NULL, 0);
}

/* Units that left the tree during the call (real owner no longer TREE):
 * marks them, checks that each could be evicted; the model's owners move
 * to FREE and the trie loses them.  Locks must be marked.  Returns the
 * number of units evicted. */
static long
absorb_evictions(model *m)
{
    long n = 0;
    for (int64_t s = 1; s <= m->nslots; s++) {
        if (m->st_owner[s] != M_TREE || m->state.owner[s] == MR_OWNER_TREE) {
            continue;
        }
        int64_t id = m->st_node[s];
        if (id < 0 || m->nd[id].state != s) {
            fail(m, "state slot %lld left the tree but no node holds it", (long long)s);
            return n;
        }
        if (m->nd[id].targets > 0) {
            fail(m, "state slot %lld was evicted from a node a request has locked", (long long)s);
        }
        m->nd[id].state = -1;
        m->st_node[s] = -1;
        m->st_owner[s] = M_FREE;
        n++;
    }
    for (int64_t p = 1; p <= m->npages; p++) {
        m->nd[p].evict = 0;
        if (m->kv_owner[p] == M_TREE && m->kv.pages.owner[p] != MR_OWNER_TREE) {
            if (!m->nd[p].live) {
                fail(m, "KV page %lld left the tree but the model has no such node", (long long)p);
                return n;
            }
            if (m->nd[p].locks > 0) {
                fail(m, "KV page %lld on a locked path was evicted", (long long)p);
            }
            if (m->nd[p].state >= 0) {
                /* its state went with it, and came back to the tree elsewhere
                 * within the call (a slot is reused at once) */
                int64_t s = m->nd[p].state;
                m->st_node[s] = -1;
                m->st_owner[s] = M_FREE;
                m->nd[p].state = -1;
                n++;
            }
            m->nd[p].evict = 1;
        }
    }
    for (int64_t p = 1; p <= m->npages; p++) {
        if (!m->nd[p].evict) {
            continue;
        }
        for (int32_t c = m->nd[p].child; c != 0; c = m->nd[c].sib) {
            if (!m->nd[c].evict) {
                fail(m, "KV page %lld was evicted but its child %d stays", (long long)p, (int)c);
            }
        }
    }
    for (int64_t p = 1; p <= m->npages; p++) {
        if (m->nd[p].evict) {
            m->nd[p].evict = 0;
            m->nd[p].live = 0;   /* unlinked below, children first is not needed */
            m->kv_owner[p] = M_FREE;
            n++;
        }
    }
    for (int64_t p = 0; p <= m->npages; p++) {
        /* drop dead nodes from their parents' child lists (node 0: the root) */
        int32_t *pp = &m->nd[p].child;
        while (*pp != 0) {
            if (!m->nd[*pp].live) {
                int32_t dead = *pp;
                *pp = m->nd[dead].sib;
                m->nd[dead].sib = 0;
            }
            else {
                pp = &m->nd[*pp].sib;
            }
        }
    }
    for (int64_t p = 1; p <= m->npages; p++) {
        if (!m->nd[p].live) {
            m->nd[p].child = 0;
        }
    }
    m->n_evicted += n;
    return n;
}

/* Units that could still be evicted: KV pages off every locked path, and
 * states not at a lock target.  Locks must be marked. */
static void
evictable(const model *m, int64_t *pages, int64_t *states)
{
    *pages = *states = 0;
    for (int64_t p = 1; p <= m->npages; p++) {
        if (!m->nd[p].live) {
            continue;
        }
        if (m->nd[p].locks == 0) {
            (*pages)++;
        }
        if (m->nd[p].state >= 0 && m->nd[p].targets == 0) {
            (*states)++;
        }
    }
}

/* The model's owners against the pools'. */
static void
compare_owners(model *m)
{
    for (int64_t s = 1; s <= m->nslots && !m->failed; s++) {
        int32_t o = m->state.owner[s];
        if (o == MR_OWNER_HELD) {
            fail(m, "state slot %lld is left HELD", (long long)s);
        }
        else if (o != m->st_owner[s]) {
            fail(m, "state slot %lld: owner %d, the model says %d", (long long)s, (int)o, (int)m->st_owner[s]);
        }
    }
    for (int64_t p = 1; p <= m->npages && !m->failed; p++) {
        int32_t o = m->kv.pages.owner[p];
        if (o != m->kv_owner[p]) {
            fail(m, "KV page %lld: owner %d, the model says %d", (long long)p, (int)o, (int)m->kv_owner[p]);
        }
    }
    for (int64_t r = 1; r <= m->nrows && !m->failed; r++) {
        if (mr_reqpool_in_use(&m->rp, r) != m->rq[r].live) {
            fail(m, "row %lld: in use %d, the model says %d", (long long)r, mr_reqpool_in_use(&m->rp, r),
                 m->rq[r].live);
        }
    }
    char msg[512];
    if (!m->failed && mr_lc_check(m->lc, msg, sizeof(msg)) != MR_OK) {
        fail(m, "mr_lc_check: %s", msg);
    }
}

/* A slot the call gave to request r: FREE (or just evicted) in the model. */
static void
take_slot(model *m, int64_t s, int64_t r, const char *what)
{
    if (s < 1 || s > m->nslots) {
        fail(m, "row %lld's %s slot is %lld", (long long)r, what, (long long)s);
        return;
    }
    if (m->st_owner[s] == M_TREE && m->st_node[s] >= 0) {
        /* evicted by this call, then taken again (it may even be back in
         * the tree by the call's end): it must have been evictable */
        int64_t id = m->st_node[s];
        if (m->nd[id].targets > 0) {
            fail(m, "state slot %lld was evicted from a node a request has locked", (long long)s);
        }
        m->nd[id].state = -1;
        m->st_node[s] = -1;
        m->st_owner[s] = M_FREE;
        m->n_evicted++;
    }
    if (m->st_owner[s] != M_FREE) {
        fail(m, "row %lld's new %s slot %lld was not free (model owner %d)", (long long)r, what, (long long)s,
             (int)m->st_owner[s]);
    }
    m->st_owner[s] = row_owner_of(r);
}

/* KV pages of row r's table positions [from, to) that are new: FREE in the
 * model, and each token the next one of its page. */
static void
take_pages(model *m, int64_t r, int64_t from, int64_t to)
{
    for (int64_t pos = from; pos < to; pos++) {
        int32_t t = table_at(m, r, pos);
        int64_t pg = t / m->ps;
        if (t % m->ps != pos % m->ps) {
            fail(m, "row %lld position %lld: KV %d is not at its place in a page", (long long)r, (long long)pos,
                 (int)t);
            return;
        }
        if (pos % m->ps == 0 || pos == from) {
            if (pos % m->ps != 0 && table_at(m, r, pos - 1) / m->ps == pg) {
                continue;  /* the rest of a page the request already has */
            }
            if (pg < 1 || pg > m->npages || m->kv_owner[pg] != M_FREE) {
                fail(m, "row %lld position %lld: KV page %lld was not free", (long long)r, (long long)pos,
                     (long long)pg);
                return;
            }
            m->kv_owner[pg] = row_owner_of(r);
        }
        else if (table_at(m, r, pos - 1) + 1 != t) {
            fail(m, "row %lld position %lld: KV %d does not follow %d in its page", (long long)r, (long long)pos,
                 (int)t, (int)table_at(m, r, pos - 1));
        }
    }
}

/* The model's match: pages of the deepest state on tok's path within npg
 * pages, skipping states the call evicted is done by the caller. */
static void
check_match(model *m, int64_t r_or_i, const int32_t *tok, int64_t cap_tokens, int64_t P, int64_t cow_src)
{
    int32_t path[MAXCTX];
    int64_t got = walk(m, tok, cap_tokens / m->ps, path);
    int64_t deepest = 0;
    int64_t deepest_state = -1;
    for (int64_t d = 0; d < got; d++) {
        int32_t id = path[d];
        if (m->nd[id].state >= 0 && m->state.owner[m->nd[id].state] == MR_OWNER_TREE
            && m->st_owner[m->nd[id].state] == M_TREE) {
            deepest = (d + 1) * m->ps;  /* a state that stayed all along */
            deepest_state = m->nd[id].state;
        }
    }
    if (P < deepest || P % m->ps != 0 || P > got * m->ps) {
        fail(m, "request %lld matched %lld tokens; the deepest state that stayed is at %lld (path %lld)",
             (long long)r_or_i, (long long)P, (long long)deepest, (long long)(got * m->ps));
        return;
    }
    if (P > 0) {
        int32_t id = path[P / m->ps - 1];
        if (m->nd[id].state < 0) {
            fail(m, "request %lld matched %lld tokens where no state is cached", (long long)r_or_i, (long long)P);
            return;
        }
        if (P > deepest) {
            deepest_state = m->nd[id].state;
            if (m->state.owner[deepest_state] != MR_OWNER_TREE) {
                fail(m, "request %lld matched a state that was then evicted", (long long)r_or_i);
            }
        }
        if (cow_src != deepest_state) {
            fail(m, "request %lld: copy-on-write from %lld, the matched state is %lld", (long long)r_or_i,
                 (long long)cow_src, (long long)deepest_state);
        }
        for (int64_t d = P / m->ps; d < got; d++) {
            int64_t s = m->nd[path[d]].state;
            if (s >= 0 && m->state.owner[s] == MR_OWNER_TREE) {
                fail(m, "request %lld matched %lld tokens past a state at %lld that stayed", (long long)r_or_i,
                     (long long)P, (long long)((d + 1) * m->ps));
            }
        }
    }
}

/* ------------------------------------------------------------------------
 * Inserting a request's prefix into the model (cache_unfinished and
 * cache_finished): tokens [0, cache_len) with the row's table as it was
 * before the call, the donated slot at the end.  Returns 1 when the state
 * existed (the donated slot is then freed). */
static int
model_insert(model *m, int64_t r, const int32_t *tok, const int32_t *table_before, int64_t protected_len,
             int64_t cache_len, int64_t donated)
{
    int32_t cur = 0;
    for (int64_t d = 0; d < cache_len / m->ps; d++) {
        int32_t c = find_child(m, cur, tok + d * m->ps);
        int64_t mine = table_before[d * m->ps] / m->ps;
        if (c >= 0) {
            if (d < protected_len / m->ps) {
                if (mine != c) {
                    fail(m, "row %lld's protected page %lld is %lld, the tree's is %d", (long long)r, (long long)d,
                         (long long)mine, (int)c);
                }
            }
            else if (mine != c) {
                if (m->kv_owner[mine] != row_owner_of(r)) {
                    fail(m, "row %lld's duplicate page %lld is not its own", (long long)r, (long long)mine);
                }
                m->kv_owner[mine] = M_FREE;
            }
            cur = c;
            continue;
        }
        if (mine < 1 || mine > m->npages || m->kv_owner[mine] != row_owner_of(r) || m->nd[mine].live) {
            fail(m, "row %lld inserts page %lld that is not its own", (long long)r, (long long)mine);
            return 1;
        }
        mnode *n = &m->nd[mine];
        memcpy(n->tok, tok + d * m->ps, (size_t)m->ps * sizeof(int32_t));
        n->parent = cur;
        n->child = 0;
        n->sib = m->nd[cur].child;
        m->nd[cur].child = (int32_t)mine;
        n->state = -1;
        n->live = 1;
        m->kv_owner[mine] = M_TREE;
        cur = (int32_t)mine;
    }
    if (cur == 0) {
        return 1;
    }
    if (m->nd[cur].state >= 0) {
        if (donated >= 0) {
            m->st_owner[donated] = M_FREE;
        }
        return 1;
    }
    if (donated < 0) {
        fail(m, "row %lld caches a new state but gave no slot", (long long)r);
        return 1;
    }
    if (m->st_owner[donated] != row_owner_of(r)) {
        fail(m, "row %lld donates slot %lld that is not its own", (long long)r, (long long)donated);
    }
    m->nd[cur].state = donated;
    m->st_node[donated] = cur;
    m->st_owner[donated] = M_TREE;
    return 0;
}

static int
keep_of(const model *m, const mr_req *st)
{
    if (m->lazy) {
        return st->next_track;  /* the newest snapshot stays where it was taken */
    }
    return m->pp == 2 ? 1 - st->next_track : st->next_track;
}

/* ------------------------------------------------------------------------
 * The calls */

static int32_t corpus[4][MAXCTX];

static void
gen_key(model *m, int32_t *k, int64_t len)
{
    const int32_t *base = corpus[rnd(4)];
    int64_t keep = rnd(2) ? len : rnd((uint32_t)len + 1);
    for (int64_t i = 0; i < len; i++) {
        k[i] = i < keep ? base[i] : (int32_t)(1 + rnd(m->ps == 1 ? 3 : 2));
    }
}

static void
op_prefill(model *m)
{
    m->what = "prefill_batch";
    size_t n = 1 + rnd(MAXB);
    int32_t keys[MAXB][MAXCTX];
    const int32_t *kp[MAXB];
    size_t lens[MAXB];
    int64_t xlen[MAXB] = {-1, -1, -1};
    for (size_t i = 0; i < n; i++) {
        lens[i] = 1 + rnd(m->C * 3 + 20);
        gen_key(m, keys[i], (int64_t)lens[i]);
        kp[i] = keys[i];
    }
    int64_t rows[MAXB], pl[MAXB], cs[MAXB], cd[MAXB], cl[MAXB], ts[MAXB], tl[MAXB];
    uint8_t tm[MAXB];
    for (size_t i = 0; i < n; i++) {
        pl[i] = -1;
    }
    mr_lc_prefill_out out = {rows, pl, cs, cd, cl, ts, tm, tl};
    int free_rows = 0;
    for (int64_t r = 1; r <= m->nrows; r++) {
        free_rows += !m->rq[r].live;
    }
    /* half the batches give their keys as int64 tokens, read in place */
    int64_t keys64[MAXB][MAXCTX];
    const int64_t *kp64[MAXB];
    int wide = rnd(2) == 0;
    for (size_t i = 0; wide && i < n; i++) {
        for (size_t j = 0; j < lens[i]; j++) {
            keys64[i][j] = keys[i][j];
        }
        kp64[i] = keys64[i];
    }
    int rc = wide ? prefill_batch_key(m->lc, n, kp, kp64, lens, NULL, &out)
                  : prefill_batch32(m->lc, n, kp, lens, NULL, &out);
    m->n_prefill++;
    if (rc != MR_OK && rc != MR_ENOSPC) {
        fail(m, "prefill_batch: rc %d", rc);
        return;
    }
    /* locks during the call: the live requests' and the batch's matches */
    for (size_t i = 0; i < n; i++) {
        xlen[i] = pl[i];
    }
    mark_locks(m, kp, xlen, (int)n);
    /* matches, against the trie before the call's evictions are applied
     * (check_match skips states the call evicted) */
    for (size_t i = 0; i < n && rc == MR_OK; i++) {
        check_match(m, (int64_t)i, keys[i], (int64_t)lens[i] - 1, pl[i], pl[i] > 0 ? cs[i] : -1);
        m->n_hits += pl[i] > 0;
    }
    long evicted = absorb_evictions(m);
    if (rc == MR_ENOSPC) {
        m->n_refused++;
        /* decided before anything changed: nothing evicted, no request
         * matched; every request's prefix as the trie holds it */
        if (evicted != 0) {
            fail(m, "a refused batch evicted %ld units", evicted);
        }
        for (size_t i = 0; i < n; i++) {
            if (pl[i] >= 0) {
                fail(m, "a refused batch matched request %zu", i);
            }
            int32_t path[MAXCTX];
            int64_t got = walk(m, keys[i], ((int64_t)lens[i] - 1) / m->ps, path);
            xlen[i] = 0;
            for (int64_t d = 0; d < got; d++) {
                if (m->nd[path[d]].state >= 0) {
                    xlen[i] = (d + 1) * m->ps;
                }
            }
        }
        int64_t need_pages = 0;
        for (size_t i = 0; i < n; i++) {
            need_pages += ((int64_t)lens[i] - xlen[i] + m->ps - 1) / m->ps;
        }
        int64_t ev_pages, ev_states;
        mark_locks(m, kp, xlen, (int)n);
        evictable(m, &ev_pages, &ev_states);
        int64_t need_slots = (int64_t)n * (1 + (m->extra ? (m->lazy ? 1 : m->pp) : 0));
        int64_t free_pages = mr_slots_available(&m->kv.pages), free_slots = mr_slots_available(&m->state);
        if (!((int64_t)n > free_rows || free_pages + ev_pages < need_pages || free_slots + ev_states < need_slots)) {
            fail(m, "a batch of %zu was refused with %d free rows, %lld + %lld pages for %lld, %lld + %lld slots for "
                 "%lld", n, free_rows, (long long)free_pages, (long long)ev_pages, (long long)need_pages,
                 (long long)free_slots, (long long)ev_states, (long long)need_slots);
        }
        compare_owners(m);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t r = rows[i], P = pl[i], E = (int64_t)lens[i] - P;
        if (r < 1 || r > m->nrows || m->rq[r].live) {
            fail(m, "prefill gave row %lld", (long long)r);
            return;
        }
        mreq *q = &m->rq[r];
        q->live = 1;
        memcpy(q->tok, keys[i], lens[i] * sizeof(int32_t));
        q->ntok = (int64_t)lens[i];
        const mr_req *st = rec(m, r);
        if (st->prefix_len != P || st->protected_len != P || st->committed != (int64_t)lens[i] || !st->locked) {
            fail(m, "row %lld's record: prefix %lld protected %lld committed %lld locked %d", (long long)r,
                 (long long)st->prefix_len, (long long)st->protected_len, (long long)st->committed, st->locked);
        }
        take_slot(m, st->running, r, "running");
        if (m->extra) {
            for (int j = 0; j < (m->lazy ? 1 : m->pp); j++) {
                take_slot(m, st->track[j], r, "track");
            }
            int64_t want = -1;
            if (E >= m->C) {
                want = P + E / m->C * m->C;
                int64_t B = st->branching_seqlen;
                if (B > P && B < P + E && (B - P) % m->C == 0) {
                    want = B;
                }
            }
            if (st->last_track_seqlen != want || (want >= 0) != tm[i]) {
                fail(m, "row %lld: tracked at %lld (mask %d), the model says %lld", (long long)r,
                     (long long)st->last_track_seqlen, tm[i], (long long)want);
            }
        }
        if (P > 0 ? cd[i] != st->running : cl[i] != st->running) {
            fail(m, "row %lld: the running slot is neither copied into nor cleared", (long long)r);
        }
        int32_t path[MAXCTX];
        walk(m, keys[i], P / m->ps, path);
        for (int64_t pos = 0; pos < P; pos++) {
            if (table_at(m, r, pos) != path[pos / m->ps] * m->ps + pos % m->ps) {
                fail(m, "row %lld position %lld: KV %d is not the tree's", (long long)r, (long long)pos,
                     (int)table_at(m, r, pos));
                break;
            }
        }
        take_pages(m, r, P, (int64_t)lens[i]);
    }
    compare_owners(m);
}

/* Names the call and picks the rows of live requests it gets: a random
 * subset, at most 8. */
static size_t
begin_rows(model *m, const char *what, int64_t *rows)
{
    const size_t max = 8;
    size_t n = 0;
    m->what = what;
    for (int64_t r = 1; r <= m->nrows && n < max; r++) {
        if (m->rq[r].live && rnd(3) != 0) {
            rows[n++] = r;
        }
    }
    return n;
}

/* The rows' records and tables before a call, and their tokens. */
typedef struct {
    mr_req before[8];
    int32_t tab[8][MAXCTX];
    const int32_t *kp[8];
} snapshot;

static void
take_snapshot(const model *m, const int64_t *rows, size_t n, snapshot *sn)
{
    for (size_t i = 0; i < n; i++) {
        sn->before[i] = *rec(m, rows[i]);
        memcpy(sn->tab[i], m->rp.table + rows[i] * m->rp.max_ctx,
               (size_t)sn->before[i].committed * sizeof(int32_t));
        sn->kp[i] = m->rq[rows[i]].tok;
    }
}

static void
op_unfinished(model *m)
{
    int64_t rows[8];
    size_t n = begin_rows(m, "unfinished_batch", rows);
    if (n == 0) {
        return;
    }
    snapshot sn;
    take_snapshot(m, rows, n, &sn);
    const mr_req *before = sn.before;
    int32_t(*tab)[MAXCTX] = sn.tab;
    const int32_t *const *kp = sn.kp;
    int64_t fs[8], fd[8];
    for (size_t i = 0; i < n; i++) {
        fs[i] = fd[i] = -2;  /* the call sets -1 or a fork on each row it reaches */
    }
    int rc = unfinished_batch32(m->lc, n, rows, kp, NULL, fs, fd);
    m->n_unfinished++;
    if (rc != MR_OK && rc != MR_ENOSPC) {
        fail(m, "unfinished_batch: rc %d", rc);
        return;
    }
    /* rows it cached: all, or none (refused before any row changed: the
     * rows that cache need more state slots than are free or evictable) */
    size_t ndone = rc == MR_OK ? n : 0;
    for (size_t i = 0; rc != MR_OK && i < n; i++) {
        if (fs[i] != -2 || memcmp(rec(m, rows[i]), &before[i], sizeof(mr_req)) != 0) {
            fail(m, "a refused end of prefill changed row %lld", (long long)rows[i]);
        }
    }
    /* a cached row's lock moved during the call: its old and new nodes are
     * not protected all along (other locks are) */
    mark_locks_but(m, NULL, NULL, 0, rows, ndone);
    long evicted = absorb_evictions(m);
    if (rc != MR_OK && evicted != 0) {
        fail(m, "a refused end of prefill evicted %ld units", evicted);
    }
    for (size_t i = 0; i < ndone && !m->failed; i++) {
        int64_t r = rows[i];
        const mr_req *b = &before[i], *st = rec(m, r);
        int64_t fill = b->committed;
        int64_t cache_len = m->extra ? b->last_track_seqlen : fill;
        if (cache_len < 0) {
            if (st->prefix_len != fill || st->protected_len != b->protected_len) {
                fail(m, "row %lld, nothing tracked: prefix %lld", (long long)r, (long long)st->prefix_len);
            }
            continue;
        }
        int64_t donated, fresh;
        if (m->extra) {
            int k = keep_of(m, b);
            donated = b->track[k];
            fresh = st->track[k];
        }
        else {
            fresh = donated = -1;
        }
        if (m->extra) {
            take_slot(m, fresh, r, "fresh track");
        }
        else {
            /* no_buffer: the fork's destination is the tree's new state
             * (or was freed again when the state existed) */
            if (fd[i] >= 0) {
                take_slot(m, fd[i], r, "fork");
                donated = fd[i];
                if (fs[i] != b->running) {
                    fail(m, "row %lld forks from %lld, not its running slot", (long long)r, (long long)fs[i]);
                }
            }
        }
        int existed;
        if (donated >= 0) {
            existed = model_insert(m, r, kp[i], tab[i], b->protected_len, cache_len, donated);
        }
        else {
            /* no_buffer with the state already cached: insert with a
             * placeholder that must not be needed */
            int64_t tmp = 0;
            existed = 1;
            int32_t cur = 0;
            for (int64_t d = 0; d < cache_len / m->ps; d++) {
                int32_t c = find_child(m, cur, kp[i] + d * m->ps);
                if (c < 0) {
                    existed = 0;
                    break;
                }
                cur = c;
            }
            if (!existed || m->nd[cur].state < 0) {
                fail(m, "row %lld: no fork, but its state was not cached", (long long)r);
            }
            (void)tmp;
            existed = model_insert(m, r, kp[i], tab[i], b->protected_len, cache_len, -1);
        }
        if (!m->extra && existed && fd[i] >= 0) {
            fail(m, "row %lld: a fork was asked for a state that existed", (long long)r);
        }
        if (st->protected_len != cache_len || st->prefix_len != fill || st->last_track_seqlen != -1 || !st->locked) {
            fail(m, "row %lld after caching: protected %lld prefix %lld tracked %lld", (long long)r,
                 (long long)st->protected_len, (long long)st->prefix_len, (long long)st->last_track_seqlen);
        }
    }
    compare_owners(m);
}

static void
op_decode(model *m)
{
    int64_t rows[8];
    size_t n = begin_rows(m, "decode_batch", rows);
    int64_t need = 0;
    for (size_t i = 0; i < n; i++) {
        if (rec(m, rows[i])->committed + 1 > MAXCTX) {
            return;
        }
        need += rec(m, rows[i])->committed % m->ps == 0;
    }
    if (n == 0) {
        return;
    }
    mr_req before[8];
    for (size_t i = 0; i < n; i++) {
        before[i] = *rec(m, rows[i]);
    }
    int64_t ts[8];
    uint8_t tm[8];
    mark_locks(m, NULL, NULL, 0);
    int rc = mr_lc_decode_batch(m->lc, n, rows, ts, tm);
    m->n_decode++;
    if (rc != MR_OK && rc != MR_ENOSPC) {
        fail(m, "decode_batch: rc %d", rc);
        return;
    }
    long evicted = absorb_evictions(m);
    if (rc == MR_ENOSPC) {
        m->n_decode_refused++;
        int64_t ev_pages, ev_states;
        mark_locks(m, NULL, NULL, 0);
        evictable(m, &ev_pages, &ev_states);
        if (evicted != 0 || mr_slots_available(&m->kv.pages) + ev_pages >= need) {
            fail(m, "a decode step was refused with %lld free and %lld evictable pages for %lld (%ld units "
                 "evicted)", (long long)mr_slots_available(&m->kv.pages), (long long)ev_pages, (long long)need,
                 evicted);
        }
        for (size_t i = 0; i < n; i++) {
            if (memcmp(rec(m, rows[i]), &before[i], sizeof(mr_req)) != 0) {
                fail(m, "a refused decode step changed row %lld", (long long)rows[i]);
            }
        }
        compare_owners(m);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t r = rows[i];
        const mr_req *b = &before[i], *st = rec(m, r);
        int64_t pos = b->committed;
        mreq *q = &m->rq[r];
        q->tok[q->ntok++] = (int32_t)(1 + rnd(3));
        take_pages(m, r, pos, pos + 1);
        if (st->committed != pos + 1) {
            fail(m, "row %lld committed %lld after decoding at %lld", (long long)r, (long long)st->committed,
                 (long long)pos);
        }
        int boundary = (pos + 1) % m->iv == 0;
        if (m->lazy) {
            /* at a boundary the other track slot is borrowed before the
             * forward (when one can be had) and the old one given back
             * after it: the snapshot is taken in the borrowed slot */
            int borrowed = st->next_track != b->next_track;
            if (borrowed) {
                take_slot(m, st->track[st->next_track], r, "borrowed track");
                m->st_owner[b->track[b->next_track]] = M_FREE;
            }
            int64_t want_track = boundary ? pos + 1 : b->last_track_seqlen;
            if ((borrowed && (!boundary || st->track[b->next_track] != -1)) || st->last_track_seqlen != want_track
                || tm[i] != boundary || ts[i] != st->track[st->next_track]) {
                fail(m, "row %lld lazy decode at %lld: tracked %lld next %d (was %d)", (long long)r, (long long)pos,
                     (long long)st->last_track_seqlen, (int)st->next_track, (int)b->next_track);
            }
        }
        else if (m->extra) {
            int64_t want_track = boundary ? pos + 1 : b->last_track_seqlen;
            int32_t want_next = boundary && m->pp == 2 ? 1 - b->next_track : b->next_track;
            if (st->last_track_seqlen != want_track || st->next_track != want_next || tm[i] != boundary
                || ts[i] != b->track[b->next_track]) {
                fail(m, "row %lld decode at %lld: tracked %lld next %d, the model says %lld next %d", (long long)r,
                     (long long)pos, (long long)st->last_track_seqlen, (int)st->next_track, (long long)want_track,
                     (int)want_next);
            }
        }
    }
    compare_owners(m);
}

static void
op_finish(model *m)
{
    int64_t rows[8];
    size_t n = begin_rows(m, "finish_batch", rows);
    if (n == 0) {
        return;
    }
    int is_insert = rnd(5) != 0;
    snapshot sn;
    take_snapshot(m, rows, n, &sn);
    const mr_req *before = sn.before;
    int32_t(*tab)[MAXCTX] = sn.tab;
    const int32_t *const *kp = sn.kp;
    int rc = finish_batch32(m->lc, n, rows, kp, NULL, is_insert);
    m->n_finish++;
    if (rc != MR_OK) {
        fail(m, "finish_batch: rc %d", rc);
        return;
    }
    mark_locks(m, NULL, NULL, 0);
    if (absorb_evictions(m) != 0) {
        fail(m, "finishing evicted something");
    }
    for (size_t i = 0; i < n && !m->failed; i++) {
        int64_t r = rows[i];
        const mr_req *b = &before[i];
        int64_t committed = b->committed;
        int64_t cache_len = 0, donated = -1;
        if (is_insert) {
            cache_len = m->extra ? (b->last_track_seqlen < 0 ? 0 : b->last_track_seqlen) : committed;
            cache_len = (cache_len < committed ? cache_len : committed) / m->ps * m->ps;
            donated = m->extra ? b->track[keep_of(m, b)] : b->running;
        }
        int existed = 1;
        if (cache_len > 0) {
            existed = model_insert(m, r, kp[i], tab[i], b->protected_len, cache_len, donated);
        }
        int64_t end = cache_len > b->protected_len ? cache_len : b->protected_len;
        for (int64_t pos = end; pos < committed; pos++) {
            int64_t pg = tab[i][pos] / m->ps;
            if (m->kv_owner[pg] == row_owner_of(r)) {
                m->kv_owner[pg] = M_FREE;
            }
        }
        int64_t mine[3] = {b->running, b->track[0], b->track[1]};
        for (int j = 0; j < 3; j++) {
            if (mine[j] >= 0 && (existed || mine[j] != donated)) {
                if (m->st_owner[mine[j]] == row_owner_of(r)) {
                    m->st_owner[mine[j]] = M_FREE;
                }
            }
        }
        m->rq[r].live = 0;
    }
    compare_owners(m);
}

/* ------------------------------------------------------------------------
 * Runs */

static long totals[8];

static int
run(int64_t ps, int mode, long ops, uint64_t seed, long *done)
{
    model m;
    memset(&m, 0, sizeof(m));
    rs = seed * 2654435761u + 1;
    m.ps = ps;
    m.extra = mode != 0;
    m.pp = mode == 2 ? 1 : 2;
    m.lazy = mode == 3;
    m.C = ps == 16 ? 32 : 16;
    m.iv = ps == 16 ? 32 : 8;
    m.nslots = 6 + rnd(24);
    m.npages = (ps == 1 ? 60 : 8) + rnd(ps == 1 ? 600 : 60);
    m.nrows = 2 + rnd(5);
    mr_lc_config cfg = {.page_size = (uint32_t)ps, .chunk_size = (uint32_t)m.C, .policy = MR_POLICY_SGLANG,
                        .extra_buffer = m.extra, .lazy = m.lazy, .track_buffer_size = m.pp,
                        .track_interval = m.iv};
    if (mr_slots_init(&m.state, m.nslots) != MR_OK || mr_kv_init(&m.kv, m.npages * ps, ps) != MR_OK
        || mr_reqpool_init(&m.rp, m.nrows, MAXCTX, m.pp) != MR_OK || mr_lc_new(&cfg, &m.state, &m.kv, &m.rp, &m.lc) != MR_OK) {
        fprintf(stderr, "lc_model: init\n");
        return 1;
    }
    m.nd = calloc((size_t)m.npages + 1, sizeof(mnode));
    m.kv_owner = calloc((size_t)m.npages + 1, sizeof(int32_t));
    m.st_owner = calloc((size_t)m.nslots + 1, sizeof(int32_t));
    m.st_node = malloc(((size_t)m.nslots + 1) * sizeof(int64_t));
    m.rq = calloc((size_t)m.nrows + 1, sizeof(mreq));
    for (int64_t s = 0; s <= m.nslots; s++) {
        m.st_node[s] = -1;
    }
    m.nd[0].live = 1;
    m.nd[0].state = -1;
    for (int c = 0; c < 4; c++) {
        for (int i = 0; i < MAXCTX; i++) {
            corpus[c][i] = (int32_t)(1 + rnd(ps == 1 ? 3 : 2));
        }
    }
    for (m.op = 0; m.op < ops && !m.failed; m.op++) {
        uint32_t k = rnd(10);
        if (k < 3) {
            op_prefill(&m);
        }
        else if (k < 4) {
            op_unfinished(&m);
        }
        else if (k < 8) {
            op_decode(&m);
        }
        else {
            op_finish(&m);
        }
    }
    /* finish everything: every unit is free or the tree's */
    int64_t rows[16];
    size_t n = 0;
    for (int64_t r = 1; r <= m.nrows; r++) {
        if (m.rq[r].live) {
            rows[n++] = r;
        }
    }
    if (!m.failed && n > 0) {
        const int32_t *kp[16];
        for (size_t i = 0; i < n; i++) {
            kp[i] = m.rq[rows[i]].tok;
        }
        if (finish_batch32(m.lc, n, rows, kp, NULL, 1) != MR_OK || m.state.n_req != 0 || m.kv.pages.n_req != 0) {
            fail(&m, "the final finish left units with requests");
        }
    }
    *done += m.op;
    int bad = m.failed;
    totals[0] += m.n_prefill;
    totals[1] += m.n_refused;
    totals[2] += m.n_hits;
    totals[3] += m.n_evicted;
    totals[4] += m.n_decode;
    totals[5] += m.n_decode_refused;
    totals[6] += m.n_unfinished;
    totals[7] += m.n_finish;
    mr_lc_free(m.lc);
    mr_reqpool_destroy(&m.rp);
    mr_kv_destroy(&m.kv);
    mr_slots_destroy(&m.state);
    free(m.nd);
    free(m.kv_owner);
    free(m.st_owner);
    free(m.st_node);
    free(m.rq);
    return bad;
}

int
main(int argc, char **argv)
{
    long ops = 1000000;
    uint64_t seed = 1;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--ops") == 0) {
            ops = atol(argv[++i]);
        }
        else if (strcmp(argv[i], "--seed") == 0) {
            seed = (uint64_t)atoll(argv[++i]);
        }
    }
    /* modes: 0 no_buffer (page size 1 only), 1 extra_buffer pp2, 2 pp1,
     * 3 extra_buffer_lazy (pp2) */
    const int64_t pss[3] = {1, 4, 16};
    long done = 0, runs = 0, per_ps[3] = {0, 0, 0};
    int failed = 0;
    long per_run = 2000;
    for (uint64_t s = seed; done < ops; s++) {
        for (int p = 0; p < 3 && done < ops; p++) {
            for (int mode = 0; mode < 4 && done < ops; mode++) {
                if (mode == 0 && pss[p] != 1) {
                    continue;
                }
                long left = ops - done < per_run ? ops - done : per_run, before = done;
                failed += run(pss[p], mode, left, s * 13 + (uint64_t)(p * 4 + mode), &done);
                per_ps[p] += done - before;
                runs++;
                if (failed > 3) {
                    printf("lc_model: stopping after %d failed runs\n", failed);
                    return failed;
                }
            }
        }
    }
    printf("lc_model: %ld operations in %ld runs (page sizes 1, 4, 16), %d failed runs\n", done, runs, failed);
    printf("lc_model: by page size: 1: %ld, 4: %ld, 16: %ld operations\n", per_ps[0], per_ps[1], per_ps[2]);
    printf("lc_model: %ld prefill batches (%ld refused, %ld hits), %ld decode steps (%ld refused), %ld "
           "end-of-prefill and %ld finish batches, %ld units evicted\n", totals[0], totals[1], totals[2],
           totals[4], totals[5], totals[6], totals[7], totals[3]);
    return failed;
}
