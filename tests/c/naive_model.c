/* naive_model.c - see naive_model.h.
 *
 * What each step checks:
 *   - mr_radix_check() passes;
 *   - the tree spells exactly the present pages of the reference: same
 *     namespaces, tokens, KV indices, state slots (a state only at the end
 *     of a node), full and state lock counts, and the four counters of
 *     mr_radix_get_stats() recomputed from the reference;
 *   - match: prefix_len, kv_matched_len, branching_seqlen, state, node and
 *     the path values, all computed from the reference;
 *   - insert: prefix_len, the duplicates written out (exactly the caller's
 *     indices of tokens already held, after prev_prefix_len), state_existed
 *     and the node; an odd-length key is refused with the tree unchanged;
 *   - eviction: each KV index or state released was held by the tree, is
 *     not under a lock, and is released once; the counts returned equal
 *     what the callbacks saw; a removed node takes its state with it;
 *     evict_full never merely tombstones; evict_state removes KV only of a
 *     leaf whose state it took (and the tombstones above it); stopping
 *     short of the request means nothing evictable is left; and the nodes
 *     removed or tombstoned, and the counts, are exactly those the LRU
 *     rule gives when replayed on a copy of the tree's own lists; no
 *     unlocked tombstone is left a leaf (I8);
 *   - LRU order: after a match or an insert the node used (and, by policy,
 *     its path) is at the front of each list; the consumed-state policy
 *     moves nothing else in the state list;
 *   - handles resolve to the node ending at their position while it lives
 *     and are stale once its pages were removed or the tree was reset;
 *   - with fault injection, a call that fails returns MR_ENOMEM, releases
 *     nothing, reports no duplicates, and leaves the reference unchanged.
 * At the end every lock is dropped and everything evicted: every KV index
 * and state slot is back in its pool, released exactly once.
 */
#include "naive_model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "common.h"

#define NM_MAXP 4
#define NM_NNS 3
#define NM_NBASE 12
#define NM_MAXTOK 16
#define NM_MAXLOCKS 6
#define NM_NHANDLES 32

/* Tokens and namespaces span the int32 range, negatives included. */
static const int32_t nm_alphabet[4] = {0, 5, -7, INT32_MAX};
static const int32_t nm_namespaces[NM_NNS] = {0, 3, 1 << 20};

typedef struct {
    int32_t page[NM_MAXP];
    int64_t kv[NM_MAXP];   /* -1: the page is not in the tree */
    int64_t state;         /* -1: no state ends at this page */
    int parent, first_child, next_sibling;
    int depth;             /* pages from the namespace root */
    int ns;                /* index into nm_namespaces */
    uint32_t epoch;        /* bumped each time the page leaves the tree */
    int cover;             /* live locks at this page or below */
    int slocks;            /* own locks holding the state */
    int nlocks;            /* own locks without the state */
    uint32_t end_stamp;    /* == walk stamp: a tree node ends here */
    mr_node *node;         /* that node */
    int removed;           /* scratch of the eviction checks */
} nm_pos;

enum { OWN_FREE = 0, OWN_CALLER, OWN_TREE };

typedef struct {
    int64_t size, base;
    unsigned char *owner;
    int *pos;              /* model page (KV) or position (state) */
    int *off;              /* offset in the page (KV) */
    int64_t *stack;
    int64_t nfree;
} nm_pool;

typedef struct {
    mr_handle h;
    int pos;
    uint32_t epoch, reset_gen;
} nm_hrec;

typedef struct {
    mr_node *node;
    int pos;
} nm_lock;

typedef struct {
    const nm_options *o;
    const nm_source *src;
    mr_radix *t;
    uint32_t P, chunk;
    mr_release rel;

    nm_pos *p;
    int np, cap;
    int roots[NM_NNS];
    long present;          /* pages the tree should hold */

    nm_pool kv, st;
    int32_t corpus[NM_NBASE][NM_MAXTOK];

    nm_lock locks[NM_MAXLOCKS];
    int nlocks;
    nm_hrec handles[NM_NHANDLES];
    int nhandles;
    uint32_t reset_gen;

    mr_node **wnode;       /* nodes of the last walk, in walk order */
    int *wpos;
    int nw, wcap;
    uint32_t stamp;

    int in_evict;
    size_t kv_rel, st_rel; /* released during the current call */
    int *rel_pages, nrel_pages;
    int *rel_states, nrel_states;
    int rel_cap;

    int failed;
    long step;
    const char *op;
    nm_counts c;
    long last_nodes;
} nm;

/* ------------------------------------------------------------------------
 * Failures and choices */

static void
nm_fail(nm *m, const char *fmt, ...)
{
    va_list ap;
    if (m->failed++)
        return;
    fprintf(stderr, "naive model: op %ld (%s), page %u chunk %u policy %d: ",
            m->step, m->op, m->P, m->chunk, (int)m->o->cfg.policy);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

#define NM_EXPECT(m, cond, ...) do { if (!(cond)) nm_fail((m), __VA_ARGS__); } while (0)

static uint32_t
draw(nm *m, uint32_t bound)
{
    return bound ? m->src->next(m->src->ctx) % bound : 0;
}

static void *
xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "naive model: out of memory\n");
        exit(2);
    }
    return p;
}

static void *
xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p) {
        fprintf(stderr, "naive model: out of memory\n");
        exit(2);
    }
    return p;
}

static int
arm(nm *m)
{
#ifdef MR_FAULT_INJECT
    if (m->o->inject_oom && draw(m, 4) == 0) {
        mr_fault_fail_at(1 + (long)draw(m, 8));
        return 1;
    }
#endif
    (void)m;
    return 0;
}

static void
disarm(void)
{
#ifdef MR_FAULT_INJECT
    mr_fault_fail_at(0);
#endif
}

/* ------------------------------------------------------------------------
 * Pools: KV indices and state slots, owned by the caller, the tree or free */

static void
pool_init(nm_pool *pl, int64_t size, int64_t base)
{
    int64_t i;
    pl->size = size;
    pl->base = base;
    pl->owner = xmalloc((size_t)size);
    pl->pos = xmalloc((size_t)size * sizeof(int));
    pl->off = xmalloc((size_t)size * sizeof(int));
    pl->stack = xmalloc((size_t)size * sizeof(int64_t));
    memset(pl->owner, OWN_FREE, (size_t)size);
    for (i = 0; i < size; i++)
        pl->stack[i] = base + size - 1 - i;
    pl->nfree = size;
}

static void
pool_done(nm_pool *pl)
{
    free(pl->owner);
    free(pl->pos);
    free(pl->off);
    free(pl->stack);
}

static int64_t
pool_alloc(nm_pool *pl)
{
    int64_t v;
    if (pl->nfree == 0)
        return -1;
    v = pl->stack[--pl->nfree];
    pl->owner[v - pl->base] = OWN_CALLER;
    return v;
}

/* 0 if v is not a valid index of the pool. */
static int
pool_has(const nm_pool *pl, int64_t v)
{
    return v >= pl->base && v < pl->base + pl->size;
}

static void
pool_free(nm_pool *pl, int64_t v)
{
    pl->owner[v - pl->base] = OWN_FREE;
    pl->stack[pl->nfree++] = v;
}

/* ------------------------------------------------------------------------
 * The page trie */

static int
pos_new(nm *m, int parent, const int32_t *page, int ns)
{
    nm_pos *q;
    int i;
    if (m->np == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 1024;
        m->p = xrealloc(m->p, (size_t)m->cap * sizeof(nm_pos));
    }
    q = &m->p[m->np];
    memset(q, 0, sizeof *q);
    for (i = 0; i < NM_MAXP; i++)
        q->kv[i] = -1;
    if (page)
        memcpy(q->page, page, m->P * sizeof(int32_t));
    q->state = -1;
    q->parent = parent;
    q->first_child = -1;
    q->next_sibling = -1;
    q->ns = ns;
    q->depth = parent >= 0 ? m->p[parent].depth + 1 : 0;
    if (parent >= 0) {
        q->next_sibling = m->p[parent].first_child;
        m->p[parent].first_child = m->np;
    }
    return m->np++;
}

static int
present(const nm *m, int i)
{
    return m->p[i].depth == 0 || m->p[i].kv[0] >= 0;
}

/* The child of pos spelling page; created if create, else -1 if none. */
static int
pos_child(nm *m, int pos, const int32_t *page, int create)
{
    int c;
    for (c = m->p[pos].first_child; c >= 0; c = m->p[c].next_sibling)
        if (memcmp(m->p[c].page, page, m->P * sizeof(int32_t)) == 0)
            return c;
    return create ? pos_new(m, pos, page, m->p[pos].ns) : -1;
}

/* Fills path[0..npages] with the positions of key's whole pages (created
 * as needed; path[0] is the namespace root).  Returns how many leading
 * pages the tree holds. */
static size_t
model_path(nm *m, int ns, const int32_t *key, size_t npages, int *path)
{
    size_t j, k = 0;
    int held = 1;
    path[0] = m->roots[ns];
    for (j = 0; j < npages; j++) {
        path[j + 1] = pos_child(m, path[j], key + j * m->P, 1);
        if (held && present(m, path[j + 1]))
            k = j + 1;
        else
            held = 0;
    }
    return k;
}

static void
cover_add(nm *m, int pos, int d)
{
    for (; m->p[pos].depth > 0; pos = m->p[pos].parent)
        m->p[pos].cover += d;
}

/* ------------------------------------------------------------------------
 * Release callbacks */

static void
rel_push(nm *m, int states, int v)
{
    int *n = states ? &m->nrel_states : &m->nrel_pages;
    if (*n == m->rel_cap) {
        int nc = m->rel_cap ? 2 * m->rel_cap : 64;
        m->rel_pages = xrealloc(m->rel_pages, (size_t)nc * sizeof(int));
        m->rel_states = xrealloc(m->rel_states, (size_t)nc * sizeof(int));
        m->rel_cap = nc;
    }
    (states ? m->rel_states : m->rel_pages)[(*n)++] = v;
}

static int
cb_free_kv(void *ctx, const int64_t *idx, size_t n)
{
    nm *m = ctx;
    size_t i;
    NM_EXPECT(m, m->in_evict, "free_kv called outside an eviction");
    NM_EXPECT(m, n > 0, "free_kv called with no index");
    for (i = 0; i < n; i++) {
        int64_t v = idx[i];
        nm_pos *q;
        int k, off, empty = 1;
        if (!pool_has(&m->kv, v) || m->kv.owner[v - m->kv.base] != OWN_TREE) {
            nm_fail(m, "free_kv released index %lld, which the tree did not hold",
                    (long long)v);
            continue;
        }
        q = &m->p[m->kv.pos[v - m->kv.base]];
        off = m->kv.off[v - m->kv.base];
        NM_EXPECT(m, q->kv[off] == v, "free_kv: index %lld is not where it was inserted",
                  (long long)v);
        NM_EXPECT(m, q->cover == 0, "free_kv released index %lld under %d lock(s)",
                  (long long)v, q->cover);
        q->kv[off] = -1;
        pool_free(&m->kv, v);
        for (k = 0; k < (int)m->P; k++)
            if (q->kv[k] >= 0)
                empty = 0;
        if (empty) {
            m->present--;
            q->epoch++;
            q->removed = 1;
            rel_push(m, 0, (int)(q - m->p));
        }
    }
    m->kv_rel += n;
    return 0;
}

static int
cb_free_state(void *ctx, int64_t slot)
{
    nm *m = ctx;
    nm_pos *q;
    NM_EXPECT(m, m->in_evict, "free_state called outside an eviction");
    if (!pool_has(&m->st, slot) || m->st.owner[slot - m->st.base] != OWN_TREE) {
        nm_fail(m, "free_state released slot %lld, which the tree did not hold",
                (long long)slot);
        return 0;
    }
    q = &m->p[m->st.pos[slot - m->st.base]];
    NM_EXPECT(m, q->state == slot, "free_state: slot %lld is not where it was inserted",
              (long long)slot);
    NM_EXPECT(m, q->slocks == 0, "free_state released slot %lld under %d state lock(s)",
              (long long)slot, q->slocks);
    q->state = -1;
    pool_free(&m->st, slot);
    rel_push(m, 1, (int)(q - m->p));
    m->st_rel++;
    return 0;
}

/* ------------------------------------------------------------------------
 * Comparing the tree with the reference */

typedef struct {
    size_t fe, fp, se, sp;
    long pages;
} nm_sum;

static void
walk_push(nm *m, mr_node *n, int pos)
{
    if (m->nw == m->wcap) {
        m->wcap = m->wcap ? 2 * m->wcap : 256;
        m->wnode = xrealloc(m->wnode, (size_t)m->wcap * sizeof(mr_node *));
        m->wpos = xrealloc(m->wpos, (size_t)m->wcap * sizeof(int));
    }
    m->wnode[m->nw] = n;
    m->wpos[m->nw++] = pos;
}

static int
ns_index(int32_t ns)
{
    int i;
    for (i = 0; i < NM_NNS; i++)
        if (nm_namespaces[i] == ns)
            return i;
    return -1;
}

static void
walk_node(nm *m, mr_node *node, int pos, nm_sum *s)
{
    size_t i, nc = mr_node_nchildren(node), cur = 0;
    for (i = 0; i < nc && !m->failed; i++) {
        mr_node *c = mr_node_child_next(node, &cur);
        const int32_t *key;
        size_t len, pg, k;
        int q;
        int64_t st;
        if (!c || mr_node_parent(c) != node) {
            nm_fail(m, "child %zu of a node does not point back at it", i);
            return;
        }
        key = mr_node_key(c);
        len = mr_node_len(c);
        st = mr_node_state(c);
        if (pos < 0) {
            int ns = ns_index(mr_node_namespace(c));
            if (ns < 0) {
                nm_fail(m, "root child in unknown namespace %d", (int)mr_node_namespace(c));
                return;
            }
            q = m->roots[ns];
        } else {
            q = pos;
            if (mr_node_namespace(c) != nm_namespaces[m->p[pos].ns]) {
                nm_fail(m, "node in namespace %d below a node of namespace %d",
                        (int)mr_node_namespace(c), (int)nm_namespaces[m->p[pos].ns]);
                return;
            }
        }
        if (len == 0 || len % m->P) {
            nm_fail(m, "node of %zu tokens (page %u)", len, m->P);
            return;
        }
        for (pg = 0; pg < len / m->P; pg++) {
            q = pos_child(m, q, key + pg * m->P, 0);
            if (q < 0 || !present(m, q)) {
                nm_fail(m, "the tree holds a page (depth %zu) the reference does not",
                        pg + 1 + (pos >= 0 ? (size_t)m->p[pos].depth : 0));
                return;
            }
            for (k = 0; k < m->P; k++) {
                int64_t v = 0;
                mr_node_values_i64(m->t, c, pg * m->P + k, 1, &v);   /* as int64 at either width */
                if (v != m->p[q].kv[k]) {
                    nm_fail(m, "KV index %lld where %lld was inserted", (long long)v, (long long)m->p[q].kv[k]);
                    return;
                }
            }
            if (pg + 1 < len / m->P && m->p[q].state >= 0) {
                nm_fail(m, "state %lld inserted at a page inside a node",
                        (long long)m->p[q].state);
                return;
            }
            s->pages++;
        }
        if (st != m->p[q].state) {
            nm_fail(m, "node (depth %d pages) has state %lld, expected %lld",
                    m->p[q].depth, (long long)st, (long long)m->p[q].state);
            return;
        }
        if (mr_node_full_lock(c) != m->p[q].cover) {
            nm_fail(m, "node (depth %d pages) full_lock %d, expected %d",
                    m->p[q].depth, (int)mr_node_full_lock(c), m->p[q].cover);
            return;
        }
        if (mr_node_state_lock(c) != m->p[q].slocks) {
            nm_fail(m, "node (depth %d pages) state_lock %d, expected %d",
                    m->p[q].depth, (int)mr_node_state_lock(c), m->p[q].slocks);
            return;
        }
        m->p[q].end_stamp = m->stamp;
        m->p[q].node = c;
        walk_push(m, c, q);
        if (m->p[q].cover > 0)
            s->fp += len;
        else
            s->fe += len;
        if (st >= 0) {
            if (m->p[q].slocks > 0)
                s->sp++;
            else
                s->se++;
        }
        walk_node(m, c, q, s);
    }
}

static void
compare(nm *m)
{
    char msg[256];
    nm_sum s;
    mr_radix_stats rs;
    int i;

    msg[0] = '\0';
    if (mr_radix_check(m->t, msg, sizeof msg) != MR_OK) {
        nm_fail(m, "mr_radix_check: %s", msg);
        return;
    }
    memset(&s, 0, sizeof s);
    m->nw = 0;
    m->stamp++;
    walk_node(m, mr_radix_root(m->t), -1, &s);
    if (m->failed)
        return;
    NM_EXPECT(m, s.pages == m->present, "the tree holds %ld pages, the reference %ld",
              s.pages, m->present);
    mr_radix_get_stats(m->t, &rs);
    m->last_nodes = (long)rs.nodes;
    if ((long)rs.nodes > m->c.max_nodes) {
        m->c.max_nodes = (long)rs.nodes;
    }
    NM_EXPECT(m, rs.full_evictable == s.fe && rs.full_protected == s.fp &&
              rs.state_evictable == s.se && rs.state_protected == s.sp &&
              rs.nodes == (size_t)m->nw,
              "stats full %zu/%zu state %zu/%zu nodes %zu, expected %zu/%zu %zu/%zu %d",
              rs.full_evictable, rs.full_protected, rs.state_evictable,
              rs.state_protected, rs.nodes, s.fe, s.fp, s.se, s.sp, m->nw);
    /* A locked node keeps its identity (a split leaves it the lower half). */
    for (i = 0; i < m->nlocks; i++) {
        nm_pos *q = &m->p[m->locks[i].pos];
        NM_EXPECT(m, q->end_stamp == m->stamp && q->node == m->locks[i].node,
                  "a locked node no longer ends at its position (depth %d)", q->depth);
    }
    /* Handles. */
    if (m->nhandles > 0) {
        nm_hrec *h = &m->handles[draw(m, (uint32_t)m->nhandles)];
        nm_pos *q = &m->p[h->pos];
        mr_node *n = NULL;
        int rc = mr_radix_resolve(m->t, h->h, &n);
        int alive = h->reset_gen == m->reset_gen && present(m, h->pos) &&
                    q->epoch == h->epoch;
        if (alive)
            NM_EXPECT(m, rc == MR_OK && n == q->node && q->end_stamp == m->stamp,
                      "handle of a live node (depth %d): %s", q->depth, mr_strerror(rc));
        else
            NM_EXPECT(m, rc == MR_ESTALE, "handle of a removed node: %s, expected MR_ESTALE",
                      mr_strerror(rc));
    }
}

static void
remember_handle(nm *m, mr_node *n, int pos)
{
    nm_hrec *h;
    if (n == mr_radix_root(m->t))
        return;
    if (m->nhandles < NM_NHANDLES)
        h = &m->handles[m->nhandles++];
    else
        h = &m->handles[draw(m, NM_NHANDLES)];
    h->h = mr_node_handle(n);
    h->pos = pos;
    h->epoch = m->p[pos].epoch;
    h->reset_gen = m->reset_gen;
}

/* ------------------------------------------------------------------------
 * Keys */

static size_t
max_pages(const nm *m)
{
    size_t mp = NM_MAXTOK / m->P;
    return mp > 12 ? 12 : mp;
}

static size_t
gen_key(nm *m, int32_t *key, int *ns, int for_match)
{
    uint32_t r = draw(m, 8);
    size_t npages, len;
    int b = (int)draw(m, NM_NBASE);
    *ns = r < 5 ? 0 : (r < 7 ? 1 : 2);
    npages = draw(m, 20) == 0 ? 0 : 1 + draw(m, (uint32_t)max_pages(m));
    len = npages * m->P;
    memcpy(key, m->corpus[b], len * sizeof(int32_t));
    if (len && draw(m, 4) == 0)
        key[draw(m, (uint32_t)len)] = nm_alphabet[draw(m, 4)];
    if (len && draw(m, 12) == 0)
        key[draw(m, (uint32_t)len)] = nm_alphabet[draw(m, 4)];
    if (for_match && m->P > 1 && len + m->P - 1 <= NM_MAXTOK && draw(m, 4) == 0) {
        size_t extra = 1 + draw(m, m->P - 1), i;
        for (i = 0; i < extra; i++)
            key[len + i] = m->corpus[b][len + i];
        len += extra;
    }
    return len;
}

/* ------------------------------------------------------------------------
 * Operations */

static void
evict_begin(nm *m)
{
    m->in_evict = 1;
    m->kv_rel = m->st_rel = 0;
    m->nrel_pages = m->nrel_states = 0;
}

static int
has_present_child(const nm *m, int pos)
{
    int c;
    for (c = m->p[pos].first_child; c >= 0; c = m->p[c].next_sibling)
        if (present(m, c))
            return 1;
    return 0;
}

static void
evict_end(nm *m)
{
    int i;
    m->in_evict = 0;
    for (i = 0; i < m->nrel_pages; i++) {
        nm_pos *q = &m->p[m->rel_pages[i]];
        int up = q->parent;
        NM_EXPECT(m, q->state < 0, "a node was removed without releasing its state %lld",
                  (long long)q->state);
        /* I8: the cascade removes every tombstone it leaves a leaf, unless
         * that tombstone is locked. */
        if (m->p[up].depth > 0 && present(m, up) && m->p[up].state < 0 &&
            !has_present_child(m, up))
            NM_EXPECT(m, m->p[up].cover > 0,
                      "eviction left an unlocked tombstone leaf (depth %d pages)", m->p[up].depth);
    }
    for (i = 0; i < m->nrel_pages; i++)
        m->p[m->rel_pages[i]].removed = 0;
}

/* ------------------------------------------------------------------------
 * Eviction prediction.  Before each eviction the model copies both LRU lists
 * and replays the documented rule on the copy: repeatedly take the least
 * recently used candidate that qualifies *now* (evict_full: an unlocked
 * leaf; evict_state: a state without state lock, on an internal node or on
 * a leaf whose KV is not locked), remove a leaf with its state and every
 * tombstone left an unlocked leaf above it, or tombstone an internal node,
 * until enough was released.  The tree must remove and tombstone exactly
 * the predicted nodes and report the predicted counts. */

typedef struct {
    mr_node *n;
    int parent;            /* index in the copy, -1: the root */
    mr_handle h;
    size_t len, nchildren;
    int full_lock, state_lock;
    int64_t state;         /* current in the replay */
    int64_t state0;        /* before the eviction */
    int dead, tomb;
} sim_node;

typedef struct {
    sim_node *v;
    int n;
    int *state_order;      /* indices, MRU first */
    int nstate;
} sim;

static int
sim_index(const sim *s, const mr_node *n)
{
    int i;
    for (i = 0; i < s->n; i++)
        if (s->v[i].n == n)
            return i;
    return -1;
}

static void
sim_take(nm *m, sim *s)
{
    mr_node *n;
    int i;
    s->n = s->nstate = 0;
    for (n = mr_radix_lru_first(m->t, 0); n; n = mr_radix_lru_next(m->t, 0, n))
        s->n++;
    s->v = xmalloc((size_t)s->n * sizeof(sim_node));
    s->state_order = xmalloc((size_t)s->n * sizeof(int));
    i = 0;
    for (n = mr_radix_lru_first(m->t, 0); n && i < s->n; n = mr_radix_lru_next(m->t, 0, n), i++) {
        sim_node *x = &s->v[i];
        x->n = n;
        x->h = mr_node_handle(n);
        x->len = mr_node_len(n);
        x->nchildren = mr_node_nchildren(n);
        x->full_lock = mr_node_full_lock(n);
        x->state_lock = mr_node_state_lock(n);
        x->state = x->state0 = mr_node_state(n);
        x->dead = x->tomb = 0;
    }
    for (i = 0; i < s->n; i++)
        s->v[i].parent = sim_index(s, mr_node_parent(s->v[i].n));
    for (n = mr_radix_lru_first(m->t, 1); n && s->nstate < s->n; n = mr_radix_lru_next(m->t, 1, n))
        s->state_order[s->nstate++] = sim_index(s, n);
}

static void
sim_free(sim *s)
{
    free(s->v);
    free(s->state_order);
}

/* Removes leaf i and the tombstones it leaves unlocked leaves. */
static void
sim_remove_leaf(sim *s, int i, size_t *tok, size_t *sts)
{
    int p;
    s->v[i].dead = 1;
    *tok += s->v[i].len;
    if (s->v[i].state >= 0)
        (*sts)++;
    for (p = s->v[i].parent; p >= 0; p = s->v[p].parent) {
        sim_node *x = &s->v[p];
        x->nchildren--;
        if (x->nchildren > 0 || x->state >= 0 || x->full_lock > 0)
            break;
        x->dead = 1;
        *tok += x->len;
    }
}

static void
sim_run(sim *s, int states, size_t want, size_t *tok, size_t *sts)
{
    *tok = *sts = 0;
    while ((states ? *sts : *tok) < want) {
        int i, k, v = -1;
        if (!states) {
            for (i = s->n - 1; i >= 0 && v < 0; i--)
                if (!s->v[i].dead && s->v[i].nchildren == 0 && s->v[i].full_lock == 0)
                    v = i;
        } else {
            for (k = s->nstate - 1; k >= 0 && v < 0; k--) {
                sim_node *x = &s->v[s->state_order[k]];
                if (!x->dead && !x->tomb && x->state_lock == 0 &&
                    (x->nchildren > 0 || x->full_lock == 0))
                    v = s->state_order[k];
            }
        }
        if (v < 0)
            break;
        if (states && s->v[v].nchildren > 0) {
            s->v[v].tomb = 1;
            s->v[v].state = -1;
            (*sts)++;
        } else {
            sim_remove_leaf(s, v, tok, sts);
        }
    }
}

/* Compares the tree after the eviction with the prediction. */
static void
sim_compare(nm *m, const sim *s, size_t tok, size_t sts, size_t ptok, size_t psts)
{
    int i;
    NM_EXPECT(m, tok == ptok && sts == psts,
              "%s released %zu tokens and %zu states, the LRU rule gives %zu and %zu",
              m->op, tok, sts, ptok, psts);
    for (i = 0; i < s->n && !m->failed; i++) {
        const sim_node *x = &s->v[i];
        mr_node *n = NULL;
        int rc = mr_radix_resolve(m->t, x->h, &n);
        if (x->dead)
            NM_EXPECT(m, rc == MR_ESTALE, "%s kept a node the LRU rule removes "
                      "(LRU position %d of %d, %zu tokens)", m->op, i, s->n, x->len);
        else if (rc != MR_OK)
            nm_fail(m, "%s removed a node the LRU rule keeps (LRU position %d of %d, "
                    "%zu tokens, full_lock %d)", m->op, i, s->n, x->len, x->full_lock);
        else
            NM_EXPECT(m, mr_node_state(n) == x->state,
                      "%s: state %lld where the LRU rule gives %lld (was %lld)", m->op,
                      (long long)mr_node_state(n), (long long)x->state, (long long)x->state0);
    }
}

static void
op_evict(nm *m, int states, size_t want)
{
    size_t tok = 12345, sts = 12345, ptok, psts;
    sim s;
    int rc, armed, i;

    m->op = states ? "evict_state" : "evict_full";
    sim_take(m, &s);
    sim_run(&s, states, want, &ptok, &psts);
    evict_begin(m);
    armed = arm(m);
    rc = states ? mr_radix_evict_state(m->t, want, &m->rel, &tok, &sts)
                : mr_radix_evict_full(m->t, want, &m->rel, &tok, &sts);
    disarm();
    if (states)
        m->c.evict_state++;
    else
        m->c.evict_full++;
    if (rc == MR_ENOMEM && armed) {
        m->c.enomem++;
        NM_EXPECT(m, m->kv_rel == 0 && m->st_rel == 0,
                  "failed eviction released %zu KV and %zu states", m->kv_rel, m->st_rel);
        evict_end(m);
        sim_free(&s);
        return;
    }
    if (rc != MR_OK) {
        nm_fail(m, "returned %s", mr_strerror(rc));
        evict_end(m);
        sim_free(&s);
        return;
    }
    NM_EXPECT(m, tok == m->kv_rel && sts == m->st_rel,
              "reported %zu tokens %zu states, released %zu and %zu",
              tok, sts, m->kv_rel, m->st_rel);
    if (!states) {
        for (i = 0; i < m->nrel_states; i++)
            NM_EXPECT(m, m->p[m->rel_states[i]].removed,
                      "evict_full released the state of a node it kept");
    } else {
        /* Each removed page lies on the path of a removed leaf whose state
         * this call released. */
        for (i = 0; i < m->nrel_states; i++) {
            int q = m->rel_states[i];
            while (m->p[q].depth > 0 && m->p[q].removed) {
                m->p[q].removed = 2;
                q = m->p[q].parent;
            }
        }
        for (i = 0; i < m->nrel_pages; i++)
            NM_EXPECT(m, m->p[m->rel_pages[i]].removed == 2,
                      "evict_state removed KV that is not on the path of an evicted leaf");
    }
    evict_end(m);
    if (!m->failed)
        sim_compare(m, &s, tok, sts, ptok, psts);
    sim_free(&s);
    compare(m);
    if (m->failed)
        return;
    /* Stopping short means nothing qualifies any more. */
    if (!states && tok < want) {
        for (i = 0; i < m->nw; i++)
            NM_EXPECT(m, mr_node_nchildren(m->wnode[i]) > 0 || mr_node_full_lock(m->wnode[i]) > 0,
                      "evict_full stopped at %zu of %zu tokens with an unlocked leaf left",
                      tok, want);
    }
    if (states && sts < want) {
        for (i = 0; i < m->nw; i++) {
            mr_node *n = m->wnode[i];
            NM_EXPECT(m, mr_node_state(n) < 0 || mr_node_state_lock(n) > 0 ||
                      (mr_node_nchildren(n) == 0 && mr_node_full_lock(n) > 0),
                      "evict_state stopped at %zu of %zu states with an evictable state left",
                      sts, want);
        }
    }
}

/* ------------------------------------------------------------------------
 * LRU order after a match or an insert (radix.h, mr_lru_policy):
 *   - the full list starts with the node used (match: the node whose state
 *     is used; insert: the node at the key's end), then its ancestors;
 *   - SGLang policy: the state list starts with the state-bearing nodes of
 *     that path, deepest first;
 *   - consumed policy: the state list only moves the node used (match) or
 *     adds the node given a state (insert) to the front. */

static int
lru_copy(nm *m, int which, mr_node ***out)
{
    mr_node *n;
    int k = 0, cap = 64;
    mr_node **v = xmalloc((size_t)cap * sizeof(mr_node *));
    for (n = mr_radix_lru_first(m->t, which); n; n = mr_radix_lru_next(m->t, which, n)) {
        if (k == cap) {
            cap *= 2;
            v = xrealloc(v, (size_t)cap * sizeof(mr_node *));
        }
        v[k++] = n;
    }
    *out = v;
    return k;
}

/* `front` was moved to (or added at) the front of the list `before`. */
static void
expect_moved_front(nm *m, int which, mr_node **before, int nb, mr_node *front)
{
    mr_node *x = mr_radix_lru_first(m->t, which);
    int i;
    if (front) {
        NM_EXPECT(m, x == front, "%s: the node used is not first in the %s list", m->op,
                  which ? "state" : "full");
        x = x ? mr_radix_lru_next(m->t, which, x) : NULL;
    }
    for (i = 0; i < nb && !m->failed; i++) {
        if (before[i] == front)
            continue;
        NM_EXPECT(m, x == before[i], "%s (consumed policy) reordered the %s list", m->op,
                  which ? "state" : "full");
        x = x ? mr_radix_lru_next(m->t, which, x) : NULL;
    }
    NM_EXPECT(m, x == NULL || m->failed, "%s: the %s list grew", m->op, which ? "state" : "full");
}

static void
expect_path_front(nm *m, int which, mr_node *n)
{
    mr_node *root = mr_radix_root(m->t), *x = mr_radix_lru_first(m->t, which);
    for (; n != root && !m->failed; n = mr_node_parent(n)) {
        if (which == 1 && mr_node_state(n) < 0)
            continue;
        NM_EXPECT(m, x == n, "%s: the %s list does not start with the path used "
                  "(depth %zu tokens)", m->op, which ? "state" : "full", mr_radix_path_len(m->t, n));
        x = x ? mr_radix_lru_next(m->t, which, x) : NULL;
    }
}

static void
op_insert(nm *m)
{
    int32_t key[NM_MAXTOK + NM_MAXP];
    int64_t val[NM_MAXTOK + NM_MAXP], dup[NM_MAXTOK + NM_MAXP];
    int path[NM_MAXTOK + 1];
    mr_insert_result res;
    size_t len, npages, k, pp, i, expect_dup;
    int ns, rc, armed, existed;
    int64_t slot, old_state;
    long nodes0;
    mr_node **before;
    int nbefore;

    m->op = "insert";
    len = gen_key(m, key, &ns, 0);
    if (m->P > 1 && len + m->P - 1 <= NM_MAXTOK && draw(m, 30) == 0) {
        /* A key that is not a whole number of pages: refused, nothing kept. */
        size_t odd = len + 1 + draw(m, m->P - 1);
        for (i = len; i < odd; i++)
            key[i] = nm_alphabet[draw(m, 4)];
        for (i = 0; i < odd; i++)
            val[i] = -1000 - (int64_t)i;
        res.ndup = 777;
        rc = mr_radix_insert(m->t, key, val, odd, nm_namespaces[ns], 0, 0, dup, &res);
        NM_EXPECT(m, rc == MR_EINVAL, "insert of %zu tokens (page %u) returned %s",
                  odd, m->P, mr_strerror(rc));
        m->c.einval++;
        compare(m);
        return;
    }
    /* Make room as the scheduler does, then build the request. */
    if ((size_t)m->kv.nfree < len) {
        op_evict(m, 0, len - (size_t)m->kv.nfree);
        m->op = "insert";
        if (m->failed || (size_t)m->kv.nfree < len)
            return;
    }
    if (m->st.nfree == 0) {
        op_evict(m, 1, 1);
        m->op = "insert";
        if (m->failed || m->st.nfree == 0)
            return;
    }
    npages = len / m->P;
    k = model_path(m, ns, key, npages, path);
    pp = draw(m, 3) == 0 ? draw(m, (uint32_t)(k * m->P + 1)) : 0;
    for (i = 0; i < len; i++)
        val[i] = i < pp ? m->p[path[i / m->P + 1]].kv[i % m->P] : pool_alloc(&m->kv);
    slot = pool_alloc(&m->st);
    old_state = npages ? m->p[path[npages]].state : -1;
    existed = len == 0 || old_state >= 0;
    expect_dup = k * m->P > pp ? k * m->P - pp : 0;

    nodes0 = m->last_nodes;
    nbefore = lru_copy(m, 1, &before);
    memset(&res, 0xa5, sizeof res);
    armed = arm(m);
    rc = mr_radix_insert(m->t, key, val, len, nm_namespaces[ns], slot, pp, dup, &res);
    disarm();
    m->c.inserts++;
    if (rc == MR_OK && len > 0) {
        NM_EXPECT(m, mr_radix_lru_first(m->t, 0) == res.node,
                  "insert: the node at the key's end is not first in the full list");
        if (m->o->cfg.policy == MR_POLICY_CONSUMED)
            expect_moved_front(m, 1, before, nbefore, existed ? NULL : res.node);
        else
            NM_EXPECT(m, mr_radix_lru_first(m->t, 1) == res.node,
                      "insert: the node at the key's end is not first in the state list");
    }
    free(before);
    if (rc == MR_ENOMEM && armed) {
        m->c.enomem++;
        NM_EXPECT(m, res.ndup == 0, "failed insert reported %zu duplicates", res.ndup);
        for (i = pp; i < len; i++)
            pool_free(&m->kv, val[i]);
        pool_free(&m->st, slot);
        compare(m);
        return;
    }
    if (rc != MR_OK) {
        nm_fail(m, "insert of %zu tokens returned %s", len, mr_strerror(rc));
        return;
    }
    NM_EXPECT(m, res.prefix_len == k * m->P, "prefix_len %zu, expected %zu",
              res.prefix_len, k * m->P);
    NM_EXPECT(m, res.ndup == expect_dup, "ndup %zu, expected %zu (prefix %zu, prev %zu)",
              res.ndup, expect_dup, k * m->P, pp);
    for (i = 0; i < expect_dup && i < res.ndup; i++)
        NM_EXPECT(m, dup[i] == val[pp + i], "dup_out[%zu] = %lld, expected %lld",
                  i, (long long)dup[i], (long long)val[pp + i]);
    NM_EXPECT(m, res.state_existed == existed, "state_existed %d, expected %d",
              res.state_existed, existed);
    if (len == 0) {
        NM_EXPECT(m, res.node == mr_radix_root(m->t), "empty insert did not return the root");
    } else {
        NM_EXPECT(m, res.node && mr_radix_path_len(m->t, res.node) == len,
                  "insert node does not end at the key's end");
        NM_EXPECT(m, res.node && mr_node_state(res.node) == (existed ? old_state : slot),
                  "insert node has state %lld", res.node ? (long long)mr_node_state(res.node) : -2LL);
    }
    if (m->failed)
        return;
    /* The reference takes the new pages and the state. */
    for (i = k * m->P; i < len; i++) {
        int q = path[i / m->P + 1];
        int64_t v = val[i];
        m->p[q].kv[i % m->P] = v;
        m->kv.owner[v - m->kv.base] = OWN_TREE;
        m->kv.pos[v - m->kv.base] = q;
        m->kv.off[v - m->kv.base] = (int)(i % m->P);
        if (i % m->P == m->P - 1)
            m->present++;
    }
    for (i = 0; i < res.ndup; i++)
        pool_free(&m->kv, dup[i]);
    if (existed) {
        pool_free(&m->st, slot);
    } else {
        m->p[path[npages]].state = slot;
        m->st.owner[slot - m->st.base] = OWN_TREE;
        m->st.pos[slot - m->st.base] = path[npages];
    }
    compare(m);
    if (m->last_nodes > nodes0 + (len > k * m->P ? 1 : 0))
        m->c.splits++;
    if (!existed && k == npages && len)
        m->c.revived++;
    if (len && !m->failed)
        remember_handle(m, res.node, path[npages]);
}

static void
op_match(nm *m)
{
    int32_t key[NM_MAXTOK + NM_MAXP];
    int64_t vals[NM_MAXTOK + NM_MAXP];
    int path[NM_MAXTOK + 1];
    mr_match out;
    size_t len, npages, k, l, j, kk, i;
    int ns, rc, armed;
    int64_t state, br;
    long nodes0;
    mr_node **before;
    int nbefore;

    m->op = "match";
    len = gen_key(m, key, &ns, 1);
    npages = len / m->P;
    k = model_path(m, ns, key, npages, path);
    /* kk: the deepest node end within the match (no split needed there). */
    kk = 0;
    for (j = 1; j <= k; j++)
        if (m->p[path[j]].end_stamp == m->stamp)
            kk = j;
    l = 0;
    for (j = 1; j <= k; j++)
        if (m->p[path[j]].state >= 0)
            l = j;
    state = l ? m->p[path[l]].state : -1;

    nodes0 = m->last_nodes;
    nbefore = lru_copy(m, 1, &before);
    memset(&out, 0xa5, sizeof out);
    armed = arm(m);
    rc = mr_radix_match(m->t, key, len, nm_namespaces[ns], &out);
    disarm();
    m->c.matches++;
    if (rc == MR_OK || rc == MR_ENOMEM) {
        expect_path_front(m, 0, out.node);
        if (m->o->cfg.policy == MR_POLICY_CONSUMED)
            expect_moved_front(m, 1, before, nbefore,
                               out.node == mr_radix_root(m->t) ? NULL : out.node);
        else
            expect_path_front(m, 1, out.node);
    }
    free(before);
    if (rc == MR_ENOMEM && armed) {
        m->c.enomem++;
        NM_EXPECT(m, kk < k, "match that needs no split failed with MR_ENOMEM");
        k = kk;     /* the result describes the match without the split part */
    } else if (rc != MR_OK) {
        nm_fail(m, "match returned %s", mr_strerror(rc));
        return;
    }
    br = -1;
    if (k > l) {
        br = (int64_t)(k * m->P / m->chunk * m->chunk);
        if (br == 0)
            br = -1;
    }
    NM_EXPECT(m, out.prefix_len == l * m->P && out.kv_matched_len == k * m->P &&
              out.state == state && out.branching_seqlen == br,
              "match of %zu tokens: prefix %zu kv %zu state %lld branching %lld, "
              "expected %zu %zu %lld %lld", len, out.prefix_len, out.kv_matched_len,
              (long long)out.state, (long long)out.branching_seqlen,
              l * m->P, k * m->P, (long long)state, (long long)br);
    if (m->failed)
        return;
    if (l == 0) {
        NM_EXPECT(m, out.node == mr_radix_root(m->t), "match without a state did not return the root");
    } else {
        NM_EXPECT(m, mr_radix_path_len(m->t, out.node) == l * m->P && mr_node_state(out.node) == state,
                  "match node does not end at the usable prefix");
        if (m->failed)
            return;
        NM_EXPECT(m, mr_radix_path_values(m->t, out.node, vals) == l * m->P,
                  "mr_radix_path_values wrote a wrong count");
        for (i = 0; i < l * m->P && !m->failed; i++)
            NM_EXPECT(m, vals[i] == m->p[path[i / m->P + 1]].kv[i % m->P],
                      "path value %zu is %lld, expected %lld", i, (long long)vals[i],
                      (long long)m->p[path[i / m->P + 1]].kv[i % m->P]);
    }
    compare(m);
    if (m->last_nodes > nodes0)
        m->c.splits++;
    if (l && !m->failed)
        remember_handle(m, out.node, path[l]);
}

static void
op_lock(nm *m)
{
    int w, pos, rc, armed;
    mr_node *n;
    m->op = "lock";
    if (m->nlocks == NM_MAXLOCKS || m->nw == 0)
        return;
    w = (int)draw(m, (uint32_t)m->nw);
    n = m->wnode[w];
    pos = m->wpos[w];
    armed = arm(m);
    rc = mr_radix_lock(m->t, n);
    disarm();
    m->c.locks++;
    if (rc == MR_ENOMEM && armed) {
        m->c.enomem++;
        compare(m);
        return;
    }
    if (rc != MR_OK) {
        nm_fail(m, "lock returned %s", mr_strerror(rc));
        return;
    }
    if (m->p[pos].state >= 0)
        m->p[pos].slocks++;
    else
        m->p[pos].nlocks++;
    cover_add(m, pos, 1);
    m->locks[m->nlocks].node = n;
    m->locks[m->nlocks++].pos = pos;
    compare(m);
}

static void
op_unlock(nm *m)
{
    int rc, armed, i, pos, s;
    m->op = "unlock";
    if (m->nlocks > 0 && draw(m, 5) != 0) {
        i = (int)draw(m, (uint32_t)m->nlocks);
        pos = m->locks[i].pos;
        s = m->p[pos].slocks;
        armed = arm(m);
        rc = mr_radix_unlock(m->t, m->locks[i].node);
        disarm();
        m->c.unlocks++;
        if (rc == MR_ENOMEM && armed) {
            m->c.enomem++;
            compare(m);
            return;
        }
        if (rc != MR_OK) {
            nm_fail(m, "unlock of a locked node returned %s", mr_strerror(rc));
            return;
        }
        /* Which kind of own lock an unlock drops is the tree's choice. */
        if (s > 0 && mr_node_state_lock(m->locks[i].node) == s - 1)
            m->p[pos].slocks--;
        else if (m->p[pos].nlocks > 0 && mr_node_state_lock(m->locks[i].node) == s)
            m->p[pos].nlocks--;
        else {
            nm_fail(m, "unlock left state_lock %d (was %d, %d lock(s) without state)",
                    (int)mr_node_state_lock(m->locks[i].node), s, m->p[pos].nlocks);
            return;
        }
        cover_add(m, pos, -1);
        m->locks[i] = m->locks[--m->nlocks];
        compare(m);
        return;
    }
    /* A node without locks of its own (it may be covered by a child's). */
    for (i = 0; i < 4 && m->nw > 0; i++) {
        int w = (int)draw(m, (uint32_t)m->nw);
        pos = m->wpos[w];
        if (m->p[pos].slocks + m->p[pos].nlocks == 0) {
            rc = mr_radix_unlock(m->t, m->wnode[w]);
            NM_EXPECT(m, rc == MR_EINVAL, "unlock of a node not locked returned %s",
                      mr_strerror(rc));
            compare(m);
            return;
        }
    }
}

static void
op_dump(nm *m)
{
    char *buf = NULL;
    size_t len = 0, lines = 0, i;
    int rc, armed;
    m->op = "dump";
    armed = arm(m);
    rc = mr_radix_dump(m->t, &buf, &len);
    disarm();
    if (rc == MR_ENOMEM && armed) {
        m->c.enomem++;
        free(buf);
        return;
    }
    if (rc != MR_OK || !buf) {
        nm_fail(m, "dump returned %s", mr_strerror(rc));
        free(buf);
        return;
    }
    NM_EXPECT(m, strlen(buf) == len, "dump length %zu, strlen %zu", len, strlen(buf));
    for (i = 0; i < len; i++)
        lines += buf[i] == '\n';
    NM_EXPECT(m, lines >= (size_t)m->nw, "dump of %d nodes has %zu lines", m->nw, lines);
    MR_FREE(buf);
}

static void
op_reset(nm *m)
{
    int i, k;
    m->op = "reset";
    mr_radix_reset(m->t);
    m->c.resets++;
    /* The caller clears its pools. */
    for (i = 0; i < m->np; i++) {
        nm_pos *q = &m->p[i];
        if (q->depth > 0 && q->kv[0] >= 0) {
            for (k = 0; k < (int)m->P; k++)
                pool_free(&m->kv, q->kv[k]);
            q->kv[0] = -1;
            for (k = 1; k < (int)m->P; k++)
                q->kv[k] = -1;
            q->epoch++;
        }
        if (q->state >= 0)
            pool_free(&m->st, q->state);
        q->state = -1;
        q->cover = q->slocks = q->nlocks = 0;
    }
    m->present = 0;
    m->nlocks = 0;
    m->reset_gen++;
    compare(m);
}

/* ------------------------------------------------------------------------
 * The run */

int
nm_run(const nm_options *o, const nm_source *src, nm_counts *counts)
{
    nm m;
    uint32_t rs = o->corpus_seed * 2654435761u + 12345u;
    int i, j, rc;
    size_t tok = 0, sts = 0;

    memset(&m, 0, sizeof m);
    m.o = o;
    m.src = src;
    m.P = o->cfg.page_size;
    m.chunk = o->cfg.chunk_size;
    m.op = "new";
    if (m.P < 1 || m.P > NM_MAXP) {
        fprintf(stderr, "naive model: page size %u not supported\n", m.P);
        return 1;
    }
    rc = mr_radix_new(&o->cfg, &m.t);
    if (rc != MR_OK) {
        nm_fail(&m, "mr_radix_new returned %s", mr_strerror(rc));
        return 1;
    }
    m.rel.free_kv = cb_free_kv;
    m.rel.free_state = cb_free_state;
    m.rel.ctx = &m;
    pool_init(&m.kv, (int64_t)o->kv_pool, 1);
    pool_init(&m.st, (int64_t)o->state_pool, 1);
    for (i = 0; i < NM_NNS; i++) {
        m.roots[i] = pos_new(&m, -1, NULL, i);
        m.p[m.roots[i]].ns = i;
    }
    /* Base sequences share prefixes with earlier ones, so keys cut from them
     * meet inside nodes and split them. */
    for (i = 0; i < NM_NBASE; i++) {
        int cut = 0;
        if (i > 0) {
            rs = rs * 1103515245u + 12345u;
            cut = (int)((rs >> 8) % NM_MAXTOK);
            memcpy(m.corpus[i], m.corpus[(rs >> 20) % (uint32_t)i], (size_t)cut * sizeof(int32_t));
        }
        for (j = cut; j < NM_MAXTOK; j++) {
            rs = rs * 1103515245u + 12345u;
            m.corpus[i][j] = nm_alphabet[(rs >> 16) % 4];
        }
    }
    compare(&m);

    for (m.step = 0; m.step < o->max_ops && !m.failed; m.step++) {
        uint32_t r;
        if (src->exhausted && src->exhausted(src->ctx))
            break;
        r = draw(&m, 1000);
        if (o->few_evictions && r >= 810 && r < 950 && draw(&m, 8) != 0)
            r = draw(&m, 650);      /* an insert or a match instead */
        if (r < 350)
            op_insert(&m);
        else if (r < 650)
            op_match(&m);
        else if (r < 730)
            op_lock(&m);
        else if (r < 810)
            op_unlock(&m);
        else if (r < 880)
            op_evict(&m, 0, draw(&m, 2) ? 1 : 1 + draw(&m, 48));
        else if (r < 950)
            op_evict(&m, 1, draw(&m, 2) ? 1 : 1 + draw(&m, 4));
        else if (r < 960)
            op_dump(&m);
        else if (r < 961 && draw(&m, 3) == 0)
            op_reset(&m);
        else {
            m.op = "check";
            compare(&m);
        }
    }
    m.c.ops = m.step;
    if (counts)
        *counts = m.c;

    /* Drop every lock and evict everything: all returns to the pools. */
    if (!m.failed) {
        m.op = "final unlock";
        for (i = 0; i < m.nlocks && !m.failed; i++) {
            rc = mr_radix_unlock(m.t, m.locks[i].node);
            NM_EXPECT(&m, rc == MR_OK, "final unlock returned %s", mr_strerror(rc));
            cover_add(&m, m.locks[i].pos, -1);
            if (m.p[m.locks[i].pos].slocks > 0)
                m.p[m.locks[i].pos].slocks--;
            else
                m.p[m.locks[i].pos].nlocks--;
        }
        m.nlocks = 0;
    }
    if (!m.failed) {
        mr_radix_stats rs2;
        m.op = "final evict";
        evict_begin(&m);
        rc = mr_radix_evict_full(m.t, (size_t)-1, &m.rel, &tok, &sts);
        evict_end(&m);
        NM_EXPECT(&m, rc == MR_OK, "final evict_full returned %s", mr_strerror(rc));
        mr_radix_get_stats(m.t, &rs2);
        NM_EXPECT(&m, rs2.nodes == 0 && m.present == 0,
                  "%zu nodes (%ld pages) left after evicting everything", rs2.nodes, m.present);
        NM_EXPECT(&m, m.kv.nfree == m.kv.size && m.st.nfree == m.st.size,
                  "%lld KV indices and %lld slots not back in their pools",
                  (long long)(m.kv.size - m.kv.nfree), (long long)(m.st.size - m.st.nfree));
        compare(&m);
    }
    mr_radix_free(m.t);
    pool_done(&m.kv);
    pool_done(&m.st);
    free(m.p);
    free(m.wnode);
    free(m.wpos);
    free(m.rel_pages);
    free(m.rel_states);
    return m.failed ? 1 : 0;
}
