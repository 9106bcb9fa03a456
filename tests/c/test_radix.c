/* test_radix.c - tests of the radix tree core (csrc/radix.c), without Python.
 *
 * Four groups, in the manner of rax's rax-test.c:
 *   --units       hand-written cases with exact expected values, among them
 *                 SGLang's test_mamba_radix_cache_1, test_insert_prev_prefix_len
 *                 and test_mamba_lru_match_refreshes_only_used_node;
 *   --regression  numbered cases, each guarding a bug seen upstream;
 *   --fuzz        random operations checked against the naive reference of
 *                 naive_model.c after every step;
 *   --oom         each allocation of each operation made to fail in turn
 *                 (a build with -DMR_FAULT_INJECT; skipped otherwise).
 * With no group flag every group runs.  --seed N sets the fuzz seed, --ops N
 * the number of fuzz operations.  The exit status is the number of failed
 * checks (at most 255).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "common.h"
#include "naive_model.h"
#include "idset.h"
#include "radix_ops.h"
#include "radix.h"

/* KV index k of node n in a tree that keeps int64 ones (not val32). */
static int64_t
node_val(const mr_node *n, size_t k)
{
    return ((const int64_t *)mr_node_values(n))[k];
}

/* ------------------------------------------------------------------------
 * Harness */

static int n_errors;
static int verbose;
static long n_checks;
static const char *cur_test = "";

static void
fail_at(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    n_errors++;
    if (n_errors > 60) {
        return;
    }
    fprintf(stderr, "FAIL %s:%d [%s] ", file, line, cur_test);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

#define CHECK(c)                                                        \
    do {                                                                \
        n_checks++;                                                     \
        if (!(c)) {                                                     \
            fail_at(__FILE__, __LINE__, "%s", #c);                      \
        }                                                               \
    } while (0)

#define CHECK_EQ(a, b)                                                  \
    do {                                                                \
        long long a_ = (long long)(a), b_ = (long long)(b);             \
        n_checks++;                                                     \
        if (a_ != b_) {                                                 \
            fail_at(__FILE__, __LINE__, "%s == %s: got %lld, expected %lld", \
                    #a, #b, a_, b_);                                    \
        }                                                               \
    } while (0)

#define CHECK_RC(call, want)                                            \
    do {                                                                \
        int rc_ = (call), w_ = (want);                                  \
        n_checks++;                                                     \
        if (rc_ != w_) {                                                \
            fail_at(__FILE__, __LINE__, "%s returned %s, expected %s",  \
                    #call, mr_strerror(rc_), mr_strerror(w_));          \
        }                                                               \
    } while (0)

#define CHECK_TREE(t) check_tree((t), __FILE__, __LINE__)

static void
print_dump(const mr_radix *t)
{
    char *buf = NULL;
    size_t len = 0;
    if (mr_radix_dump(t, &buf, &len) == MR_OK) {
        fprintf(stderr, "%s", buf);
        MR_FREE(buf);
    }
}

static int
check_tree(const mr_radix *t, const char *file, int line)
{
    char msg[256];
    int rc;
    n_checks++;
    msg[0] = '\0';
    rc = mr_radix_check(t, msg, sizeof msg);
    if (rc != MR_OK) {
        fail_at(file, line, "mr_radix_check: %s: %s", mr_strerror(rc), msg);
        print_dump(t);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------------
 * A pool of indices, as the scheduler's allocators: owned by the caller,
 * by the tree, or free. */

enum { OWN_FREE = 0, OWN_CALLER, OWN_TREE };

typedef struct {
    int64_t size, base;
    unsigned char *owner;
    int64_t *stack;
    int64_t nfree;
} pool;

static void
pool_init(pool *p, int64_t size, int64_t base)
{
    int64_t i;
    p->size = size;
    p->base = base;
    p->owner = calloc((size_t)size, 1);
    p->stack = malloc((size_t)size * sizeof(int64_t));
    if (!p->owner || !p->stack) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (i = 0; i < size; i++) {
        p->stack[i] = base + size - 1 - i;
    }
    p->nfree = size;
}

static void
pool_done(pool *p)
{
    free(p->owner);
    free(p->stack);
}

static int64_t
pool_alloc(pool *p)
{
    int64_t v;
    if (p->nfree == 0) {
        return -1;
    }
    v = p->stack[--p->nfree];
    p->owner[v - p->base] = OWN_CALLER;
    return v;
}

static int
pool_owner(const pool *p, int64_t v)
{
    if (v < p->base || v >= p->base + p->size) {
        return -1;
    }
    return p->owner[v - p->base];
}

/* Returns v to the pool; 0 if it was not owned by `by`. */
static int
pool_free(pool *p, int64_t v, int by)
{
    if (pool_owner(p, v) != by) {
        return 0;
    }
    p->owner[v - p->base] = OWN_FREE;
    p->stack[p->nfree++] = v;
    return 1;
}

/* ------------------------------------------------------------------------
 * Fixture: a tree, its two pools and recording release callbacks */

typedef struct {
    mr_radix *t;
    pool kv, st;
    mr_release rel;
    long kv_calls, st_calls;      /* callback calls */
    long kv_released, st_released;
    long fail_kv_call, fail_st_call;  /* this call number fails (0: never) */
    int fail_code;
    long bad;                     /* releases of things the tree did not hold */
    int64_t st_log[64];           /* released state slots, in order */
    int nst_log;
    int check_in_tree;            /* callbacks verify the node is still there */
    long not_in_tree;
    mr_insert_opts io;   /* fx_insert_pp's insert options (zero: none) */
} fixture;

static int
tree_holds(const mr_node *n, int64_t v, int state)
{
    size_t pos = 0, k;
    const mr_node *c;
    while ((c = mr_node_child_next(n, &pos)) != NULL) {
        if (state ? mr_node_state(c) == v : 0) {
            return 1;
        }
        for (k = 0; !state && k < mr_node_len(c); k++) {
            if (node_val(c, k) == v) {
                return 1;
            }
        }
        if (tree_holds(c, v, state)) {
            return 1;
        }
    }
    return 0;
}

static int
fx_free_kv(void *ctx, const int64_t *idx, size_t n)
{
    fixture *f = ctx;
    size_t i;
    f->kv_calls++;
    if (f->fail_kv_call && f->kv_calls == f->fail_kv_call) {
        return f->fail_code;
    }
    for (i = 0; f->check_in_tree && i < n; i++) {
        f->not_in_tree += !tree_holds(mr_radix_root(f->t), idx[i], 0);
    }
    for (i = 0; i < n; i++) {
        if (!pool_free(&f->kv, idx[i], OWN_TREE)) {
            f->bad++;
        }
    }
    f->kv_released += (long)n;
    return 0;
}

static int
fx_free_state(void *ctx, int64_t slot)
{
    fixture *f = ctx;
    f->st_calls++;
    if (f->fail_st_call && f->st_calls == f->fail_st_call) {
        return f->fail_code;
    }
    if (f->check_in_tree) {
        f->not_in_tree += !tree_holds(mr_radix_root(f->t), slot, 1);
    }
    if (!pool_free(&f->st, slot, OWN_TREE)) {
        f->bad++;
    }
    if (f->nst_log < 64) {
        f->st_log[f->nst_log++] = slot;
    }
    f->st_released++;
    return 0;
}

static void
fx_init(fixture *f, uint32_t page, uint32_t chunk, mr_lru_policy pol,
        int64_t kv_size, int64_t st_size)
{
    mr_radix_config cfg = {0};
    memset(f, 0, sizeof *f);
    cfg.page_size = page;
    cfg.chunk_size = chunk;
    cfg.policy = pol;
    if (mr_radix_new(&cfg, &f->t) != MR_OK) {
        fprintf(stderr, "mr_radix_new failed\n");
        exit(2);
    }
    pool_init(&f->kv, kv_size, 1);
    pool_init(&f->st, st_size, 1);
    f->rel.free_kv = fx_free_kv;
    f->rel.free_state = fx_free_state;
    f->rel.ctx = f;
    f->fail_code = -100;
}

static void
fx_done(fixture *f)
{
    mr_radix_free(f->t);
    pool_done(&f->kv);
    pool_done(&f->st);
}

static mr_radix_stats
fx_stats(const fixture *f)
{
    mr_radix_stats s;
    mr_radix_get_stats(f->t, &s);
    return s;
}

/* Inserts key as SGLang's cache_finished_req does: fresh KV indices for
 * every token (returned in val, which may be NULL) and a fresh state slot
 * (*slot_out, may be NULL).  The duplicates reported are checked to be
 * val[pp:prefix_len) and returned to the pool, and so is the slot if the
 * state existed.  The first pp indices stay with the caller (the test).
 * Returns the insert's code. */
static int
fx_insert_pp(fixture *f, const int32_t *key, size_t len, int32_t ns, size_t pp,
             mr_insert_result *res, int64_t *val, int64_t *slot_out)
{
    int64_t vbuf[256], dup[256], slot;
    size_t i;
    int rc;
    mr_insert_result r;
    if (!val) {
        val = vbuf;
    }
    for (i = 0; i < len; i++) {
        val[i] = pool_alloc(&f->kv);
    }
    slot = pool_alloc(&f->st);
    if (slot_out) {
        *slot_out = slot;
    }
    memset(&r, 0xa5, sizeof r);
    rc = mr_radix_insert_ex(f->t, key, val, len, ns, slot, pp, &f->io, dup, &r);
    if (rc == MR_OK) {
        size_t expect = r.prefix_len > pp ? r.prefix_len - pp : 0;
        CHECK_EQ(r.ndup, expect);
        for (i = 0; i < r.ndup && i < expect; i++) {
            CHECK_EQ(dup[i], val[pp + i]);
            CHECK(pool_free(&f->kv, dup[i], OWN_CALLER));
        }
        for (i = r.prefix_len; i < len; i++) {
            f->kv.owner[val[i] - f->kv.base] = OWN_TREE;
        }
        if (r.state_existed) {
            CHECK(pool_free(&f->st, slot, OWN_CALLER));
        } else {
            f->st.owner[slot - f->st.base] = OWN_TREE;
        }
    } else {
        for (i = pp; i < len; i++) {
            pool_free(&f->kv, val[i], OWN_CALLER);
        }
        pool_free(&f->st, slot, OWN_CALLER);
    }
    if (res) {
        *res = r;
    }
    return rc;
}

static int
fx_insert(fixture *f, const int32_t *key, size_t len, mr_insert_result *res,
          int64_t *val, int64_t *slot_out)
{
    return fx_insert_pp(f, key, len, 0, 0, res, val, slot_out);
}

/* Inserts and returns the node, failing the test on error. */
static mr_node *
fx_put(fixture *f, const int32_t *key, size_t len, int32_t ns, int64_t *val, int64_t *slot)
{
    mr_insert_result r;
    int rc = fx_insert_pp(f, key, len, ns, 0, &r, val, slot);
    CHECK_RC(rc, MR_OK);
    return rc == MR_OK ? r.node : NULL;
}

static void
walk_held(const mr_node *n, long *kv, long *st, const fixture *f, long *bad)
{
    size_t pos = 0;
    const mr_node *c;
    while ((c = mr_node_child_next(n, &pos)) != NULL) {
        size_t k;
        for (k = 0; k < mr_node_len(c); k++) {
            if (pool_owner(&f->kv, node_val(c, k)) != OWN_TREE) {
                (*bad)++;
            }
        }
        *kv += (long)mr_node_len(c);
        if (mr_node_state(c) >= 0) {
            if (pool_owner(&f->st, mr_node_state(c)) != OWN_TREE) {
                (*bad)++;
            }
            (*st)++;
        }
        walk_held(c, kv, st, f, bad);
    }
}

/* The tree and the pools agree: everything the tree holds is marked as
 * tree-owned in its pool and nothing else is, and no callback released
 * something the tree did not hold. */
#define CHECK_OWNERSHIP(f) check_ownership((f), __FILE__, __LINE__)

static void
check_ownership(fixture *f, const char *file, int line)
{
    long kv = 0, st = 0, bad = 0, kv_tree = 0, st_tree = 0;
    int64_t i;
    walk_held(mr_radix_root(f->t), &kv, &st, f, &bad);
    for (i = 0; i < f->kv.size; i++) {
        kv_tree += f->kv.owner[i] == OWN_TREE;
    }
    for (i = 0; i < f->st.size; i++) {
        st_tree += f->st.owner[i] == OWN_TREE;
    }
    n_checks++;
    if (bad || f->bad || kv != kv_tree || st != st_tree) {
        fail_at(file, line, "tree holds %ld KV / %ld states (%ld not tree-owned), "
                "pools mark %ld / %ld as tree-owned, %ld bad releases",
                kv, st, bad, kv_tree, st_tree, f->bad);
    }
}

static void
seq(int32_t *key, int32_t from, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        key[i] = from + (int32_t)i;
    }
}

/* Matches and checks the result against expectations (node NULL: the root). */
#define CHECK_MATCH(f, key, len, ns, e_prefix, e_kv, e_branch, e_state, out)      \
    do {                                                                         \
        CHECK_RC(mr_radix_match((f)->t, (key), (len), (ns), (out)), MR_OK);      \
        CHECK_EQ((out)->prefix_len, (e_prefix));                                 \
        CHECK_EQ((out)->kv_matched_len, (e_kv));                                 \
        CHECK_EQ((out)->branching_seqlen, (e_branch));                           \
        CHECK_EQ((out)->state, (e_state));                                       \
        if ((e_prefix) == 0) {                                                   \
            CHECK((out)->node == mr_radix_root((f)->t));                         \
        } else {                                                                 \
            CHECK_EQ(mr_radix_path_len((f)->t, (out)->node), (e_prefix));        \
            CHECK_EQ(mr_node_state((out)->node), (e_state));                     \
        }                                                                        \
    } while (0)

static int
lru_is(const mr_radix *t, int which, mr_node *const *expect, size_t n)
{
    mr_node *x = mr_radix_lru_first(t, which);
    size_t i;
    for (i = 0; i < n; i++, x = mr_radix_lru_next(t, which, x)) {
        if (x != expect[i]) {
            return 0;
        }
    }
    return x == NULL;
}

/* ------------------------------------------------------------------------
 * Units */

static void
unit_new_and_empty(void)
{
    mr_radix_config bad[] = {
        {0, 1, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0}, {1, 0, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0}, {3, 4, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0},
        {4, 6, MR_POLICY_CONSUMED, MR_SEMANTICS_V0515, 0, 0, 0}, {16, 24, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0},
    };
    mr_radix_config good[] = {
        {1, 64, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0}, {16, 64, MR_POLICY_CONSUMED, MR_SEMANTICS_V0515, 0, 0, 0}, {4, 2, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0},
        {64, 64, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0}, {1, 1, MR_POLICY_CONSUMED, MR_SEMANTICS_V0515, 0, 0, 0},
    };
    size_t i;
    mr_radix *t;
    cur_test = "new_and_empty";
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t = NULL;
        CHECK_RC(mr_radix_new(&bad[i], &t), MR_EINVAL);
    }
    for (i = 0; i < sizeof good / sizeof good[0]; i++) {
        mr_match m;
        mr_radix_stats s;
        fixture fx;
        int32_t key[4] = {1, 2, 3, 4};
        size_t tok = 99, sts = 99;
        CHECK_RC(mr_radix_new(&good[i], &t), MR_OK);
        CHECK_EQ(mr_radix_config_of(t)->page_size, good[i].page_size);
        CHECK_EQ(mr_radix_config_of(t)->chunk_size, good[i].chunk_size);
        CHECK_EQ(mr_radix_config_of(t)->policy, good[i].policy);
        CHECK_TREE(t);
        mr_radix_get_stats(t, &s);
        CHECK(s.full_evictable == 0 && s.full_protected == 0 && s.state_evictable == 0 &&
              s.state_protected == 0 && s.nodes == 0);
        CHECK(s.memory_bytes > 0);
        CHECK(mr_radix_lru_first(t, 0) == NULL && mr_radix_lru_first(t, 1) == NULL);
        CHECK(mr_node_parent(mr_radix_root(t)) == NULL);
        CHECK_EQ(mr_node_len(mr_radix_root(t)), 0);
        CHECK_EQ(mr_node_state(mr_radix_root(t)), -1);
        CHECK_EQ(mr_node_nchildren(mr_radix_root(t)), 0);
        CHECK_EQ(mr_radix_path_len(t, mr_radix_root(t)), 0);
        CHECK_RC(mr_radix_match(t, key, 4, 0, &m), MR_OK);
        CHECK(m.node == mr_radix_root(t) && m.prefix_len == 0 && m.kv_matched_len == 0 &&
              m.branching_seqlen == -1 && m.state == -1);
        memset(&fx, 0, sizeof fx);
        fx.rel.free_kv = fx_free_kv;
        fx.rel.free_state = fx_free_state;
        fx.rel.ctx = &fx;
        CHECK_RC(mr_radix_evict_full(t, 10, &fx.rel, &tok, &sts), MR_OK);
        CHECK(tok == 0 && sts == 0);
        CHECK_RC(mr_radix_evict_state(t, 10, &fx.rel, &tok, &sts), MR_OK);
        CHECK(tok == 0 && sts == 0);
        CHECK(fx.kv_calls == 0 && fx.st_calls == 0);
        CHECK_TREE(t);
        mr_radix_free(t);
    }
    mr_radix_free(NULL);
}

/* SGLang test_mamba_unittest.py::test_mamba_radix_cache_1, with its pool
 * sizes (128 KV tokens, 20 state slots, page 1, chunk 64): the same calls,
 * the same results, plus the victims the digest traces. */
static void
unit_sglang_cache_1(mr_lru_policy pol)
{
    fixture f;
    int32_t k1[3] = {1, 2, 3}, k2[7] = {1, 2, 3, 4, 5, 6, 7}, k3[3] = {10, 11, 12};
    int32_t k4[7] = {1, 2, 3, 4, 5, 60, 70};
    int64_t v1[3], v2[7], v3[3], v4[7], s1, s2, s3, s4, path[16];
    mr_insert_result r;
    mr_match m;
    mr_node *a, *c, *d, *bb, *root;
    mr_handle hc, ha;
    mr_radix_stats s;
    size_t tok, sts;
    cur_test = pol == MR_POLICY_SGLANG ? "sglang_cache_1/sglang" : "sglang_cache_1/consumed";
    fx_init(&f, 1, 64, pol, 128, 20);
    root = mr_radix_root(f.t);

#define POOLS_ADD_UP()                                                          \
    do {                                                                        \
        s = fx_stats(&f);                                                       \
        CHECK_EQ(f.kv.nfree + (int64_t)(s.full_evictable + s.full_protected), 128); \
        CHECK_EQ(f.st.nfree + (int64_t)(s.state_evictable + s.state_protected), 20); \
        CHECK_TREE(f.t);                                                        \
        CHECK_OWNERSHIP(&f);                                                    \
    } while (0)

    CHECK_RC(fx_insert(&f, k1, 3, &r, v1, &s1), MR_OK);
    a = r.node;
    CHECK(r.prefix_len == 0 && r.state_existed == 0 && r.ndup == 0);
    CHECK_EQ(f.kv.nfree, 125);
    CHECK_EQ(f.st.nfree, 19);
    POOLS_ADD_UP();

    CHECK_RC(fx_insert(&f, k2, 7, &r, v2, &s2), MR_OK);
    CHECK_EQ(r.prefix_len, 3);
    CHECK_EQ(r.ndup, 3);
    CHECK_EQ(r.state_existed, 0);
    CHECK(mr_node_parent(r.node) == a && mr_node_len(r.node) == 4);
    CHECK_EQ(f.kv.nfree, 121);
    POOLS_ADD_UP();

    CHECK_RC(fx_insert(&f, k3, 3, &r, v3, &s3), MR_OK);
    c = r.node;
    hc = mr_node_handle(c);
    CHECK(r.prefix_len == 0 && mr_node_parent(c) == root);
    CHECK_EQ(f.kv.nfree, 118);
    POOLS_ADD_UP();

    CHECK_RC(fx_insert(&f, k4, 7, &r, v4, &s4), MR_OK);
    d = r.node;
    CHECK_EQ(r.prefix_len, 5);
    CHECK_EQ(r.ndup, 5);
    CHECK_EQ(mr_node_len(d), 2);
    /* B split into B'[4,5] (tombstone) with children B''[6,7] and D[60,70]. */
    bb = mr_node_parent(d);
    CHECK(mr_node_len(bb) == 2 && mr_node_state(bb) == -1 && mr_node_parent(bb) == a);
    CHECK_EQ(mr_node_nchildren(bb), 2);
    CHECK_EQ(mr_node_key(mr_node_child(bb, 0))[0], 6);
    CHECK_EQ(mr_node_key(mr_node_child(bb, 1))[0], 60);
    CHECK_EQ(mr_node_state(mr_node_child(bb, 0)), s2);
    CHECK_EQ(f.kv.nfree, 116);
    CHECK_EQ(fx_stats(&f).nodes, 5);
    POOLS_ADD_UP();

    /* evict(num_tokens=1): the least recently used leaf is C. */
    CHECK_RC(mr_radix_evict_full(f.t, 1, &f.rel, &tok, &sts), MR_OK);
    CHECK_EQ(tok, 3);
    CHECK_EQ(sts, 1);
    CHECK_RC(mr_radix_resolve(f.t, hc, &c), MR_ESTALE);
    CHECK_EQ(f.kv.nfree, 119);
    CHECK_EQ(f.st.nfree, 17);
    POOLS_ADD_UP();

    /* evict(mamba_num=1): the least recently used state is A's; A is
     * internal, so it becomes a tombstone and keeps its KV. */
    ha = mr_node_handle(a);
    CHECK_RC(mr_radix_evict_state(f.t, 1, &f.rel, &tok, &sts), MR_OK);
    CHECK_EQ(tok, 0);
    CHECK_EQ(sts, 1);
    CHECK_RC(mr_radix_resolve(f.t, ha, &a), MR_OK);
    CHECK_EQ(mr_node_state(a), -1);
    CHECK(f.nst_log == 2 && f.st_log[1] == s1);
    POOLS_ADD_UP();

    /* match [1..5]: the path A, B' has no state. */
    CHECK_MATCH(&f, k2, 5, 0, 0, 5, -1, -1, &m);
    CHECK_EQ(fx_stats(&f).nodes, 4);
    /* match [1,2,3,4,5,60,70] -> D, 7 indices. */
    CHECK_MATCH(&f, k4, 7, 0, 7, 7, -1, s4, &m);
    CHECK(m.node == d && mr_node_len(m.node) == 2);
    CHECK_EQ(mr_radix_path_values(f.t, m.node, path), 7);
    CHECK(path[0] == v1[0] && path[1] == v1[1] && path[2] == v1[2] && path[3] == v2[3] &&
          path[4] == v2[4] && path[5] == v4[5] && path[6] == v4[6]);
    /* match [1..7] -> B'', 7 indices. */
    CHECK_MATCH(&f, k2, 7, 0, 7, 7, -1, s2, &m);
    CHECK_EQ(mr_node_len(m.node), 2);
    CHECK_EQ(mr_radix_path_values(f.t, m.node, path), 7);
    CHECK(path[0] == v1[0] && path[2] == v1[2] && path[3] == v2[3] && path[6] == v2[6]);
    POOLS_ADD_UP();

    /* evict(mamba_num=1): now D is the least recently used state; it is a
     * leaf, so its KV goes too. */
    CHECK_RC(mr_radix_evict_state(f.t, 1, &f.rel, &tok, &sts), MR_OK);
    CHECK_EQ(sts, 1);
    CHECK_EQ(tok, 2);
    CHECK(f.nst_log == 3 && f.st_log[2] == s4);
    POOLS_ADD_UP();

    CHECK_MATCH(&f, k4, 7, 0, 0, 5, -1, -1, &m);
    CHECK_MATCH(&f, k2, 7, 0, 7, 7, -1, s2, &m);
    CHECK_EQ(f.kv.nfree, 121);
    CHECK_EQ(f.st.nfree, 19);
    s = fx_stats(&f);
    CHECK(s.full_evictable == 7 && s.full_protected == 0 && s.state_evictable == 1 &&
          s.state_protected == 0 && s.nodes == 3);
    POOLS_ADD_UP();
#undef POOLS_ADD_UP
    (void)v3;
    (void)s3;
    fx_done(&f);
}

/* SGLang test_mamba_unittest.py::test_insert_prev_prefix_len. */
static void
unit_insert_prev_prefix_len(void)
{
    fixture f;
    int32_t key[9];
    int64_t val[9];
    mr_insert_result r;
    int64_t avail0;
    cur_test = "insert_prev_prefix_len";
    fx_init(&f, 1, 64, MR_POLICY_SGLANG, 128, 20);
    seq(key, 1, 9);
    avail0 = f.kv.nfree;

    CHECK_RC(fx_insert_pp(&f, key, 3, 0, 0, &r, val, NULL), MR_OK);
    CHECK_EQ(f.kv.nfree, avail0 - 3);

    CHECK_RC(fx_insert_pp(&f, key, 7, 0, 0, &r, val, NULL), MR_OK);
    CHECK_EQ(r.prefix_len, 3);
    CHECK_EQ(r.ndup, 3);
    CHECK_EQ(f.kv.nfree, avail0 - 7);

    /* Indices 0..1 are the caller's locked prefix: not reported. */
    CHECK_RC(fx_insert_pp(&f, key, 8, 0, 2, &r, val, NULL), MR_OK);
    CHECK_EQ(r.prefix_len, 7);
    CHECK_EQ(r.ndup, 5);
    CHECK_EQ(f.kv.nfree, avail0 - 7 - 3);

    CHECK_RC(fx_insert_pp(&f, key, 9, 0, 8, &r, val, NULL), MR_OK);
    CHECK_EQ(r.prefix_len, 8);
    CHECK_EQ(r.ndup, 0);
    CHECK_EQ(f.kv.nfree, avail0 - 7 - 3 - 9);
    /* prev_prefix_len beyond the shared prefix: nothing reported either. */
    CHECK_RC(fx_insert_pp(&f, key, 9, 0, 9, &r, val, NULL), MR_OK);
    CHECK_EQ(r.prefix_len, 9);
    CHECK_EQ(r.ndup, 0);
    CHECK_EQ(r.state_existed, 1);
    CHECK_TREE(f.t);
    fx_done(&f);
}

/* The shape of radix.h's picture, handles across splits, child order,
 * revival of tombstones. */
static void
unit_split_shapes(void)
{
    fixture f;
    int32_t k[4];
    int64_t v1[4], v2[4], v3[4], s1, s2, s3, s5;
    mr_insert_result r;
    mr_node *x, *u, *n, *one, *two;
    mr_handle hx;
    mr_match m;
    mr_radix_stats s;
    int64_t path[8];
    cur_test = "split_shapes";
    fx_init(&f, 1, 1, MR_POLICY_SGLANG, 64, 16);

    k[0] = 1, k[1] = 2, k[2] = 3, k[3] = 4;
    x = fx_put(&f, k, 4, 0, v1, &s1);
    hx = mr_node_handle(x);
    k[2] = 7, k[3] = 8;
    CHECK_RC(fx_insert(&f, k, 4, &r, v2, &s2), MR_OK);
    CHECK_EQ(r.prefix_len, 2);
    CHECK_TREE(f.t);
    CHECK_EQ(mr_node_nchildren(mr_radix_root(f.t)), 1);
    u = mr_node_child(mr_radix_root(f.t), 0);
    CHECK(mr_node_len(u) == 2 && mr_node_key(u)[0] == 1 && mr_node_key(u)[1] == 2);
    CHECK(node_val(u, 0) == v1[0] && node_val(u, 1) == v1[1]);
    CHECK_EQ(mr_node_state(u), -1);
    CHECK_EQ(mr_node_nchildren(u), 2);
    n = mr_node_child(u, 0);
    CHECK(n == x);      /* the split child keeps its identity: the lower half */
    CHECK(mr_node_len(n) == 2 && mr_node_key(n)[0] == 3 && mr_node_key(n)[1] == 4);
    CHECK(node_val(n, 0) == v1[2] && node_val(n, 1) == v1[3]);
    CHECK_EQ(mr_node_state(n), s1);
    CHECK(mr_node_parent(n) == u);
    n = mr_node_child(u, 1);
    CHECK(mr_node_key(n)[0] == 7 && node_val(n, 0) == v2[2] && mr_node_state(n) == s2);
    x = NULL;
    CHECK_RC(mr_radix_resolve(f.t, hx, &x), MR_OK);
    CHECK(x == mr_node_child(u, 0));
    CHECK_EQ(mr_radix_path_len(f.t, x), 4);
    CHECK_EQ(mr_radix_path_values(f.t, x, path), 4);
    CHECK(path[0] == v1[0] && path[3] == v1[3]);
    s = fx_stats(&f);
    CHECK(s.nodes == 3 && s.full_evictable == 6 && s.state_evictable == 2);

    /* Children stay sorted by first token. */
    k[2] = 0, k[3] = 9;
    fx_put(&f, k, 4, 0, v3, &s3);
    CHECK_EQ(mr_node_nchildren(u), 3);
    CHECK(mr_node_key(mr_node_child(u, 0))[0] == 0 && mr_node_key(mr_node_child(u, 1))[0] == 3 &&
          mr_node_key(mr_node_child(u, 2))[0] == 7);

    /* A state above a tombstone: [1] S4 -> [2] tombstone -> 3 children. */
    k[0] = 1;
    one = fx_put(&f, k, 1, 0, NULL, NULL);
    CHECK_TREE(f.t);
    CHECK(one && mr_node_len(one) == 1 && mr_node_state(one) >= 0);
    CHECK_EQ(mr_node_nchildren(one), 1);
    two = mr_node_child(one, 0);
    CHECK(two == u && mr_node_len(two) == 1 && mr_node_state(two) == -1);
    CHECK_EQ(mr_node_nchildren(two), 3);
    CHECK_EQ(fx_stats(&f).nodes, 5);

    /* A match inside [3,4] splits it: [3] tombstone -> [4] S1.  The usable
     * prefix is [1]; KV matched 3, so branching (chunk 1) is 3. */
    k[0] = 1, k[1] = 2, k[2] = 3;
    CHECK_MATCH(&f, k, 3, 0, 1, 3, 3, mr_node_state(one), &m);
    CHECK(m.node == one);
    CHECK_EQ(fx_stats(&f).nodes, 6);
    CHECK_RC(mr_radix_resolve(f.t, hx, &x), MR_OK);
    CHECK(mr_node_len(x) == 1 && mr_node_key(x)[0] == 4 && mr_node_state(x) == s1);
    CHECK_EQ(mr_radix_path_len(f.t, x), 4);
    CHECK(mr_node_state(mr_node_parent(x)) == -1 && mr_node_len(mr_node_parent(x)) == 1);
    CHECK_TREE(f.t);

    /* Insert ending at a tombstone revives it with the caller's state. */
    CHECK_RC(fx_insert(&f, k, 2, &r, NULL, &s5), MR_OK);
    CHECK(r.node == two && r.state_existed == 0 && r.prefix_len == 2 && r.ndup == 2);
    CHECK_EQ(mr_node_state(two), s5);
    /* Again: the state exists, the caller keeps its slot. */
    CHECK_RC(fx_insert(&f, k, 2, &r, NULL, NULL), MR_OK);
    CHECK(r.node == two && r.state_existed == 1 && r.prefix_len == 2 && r.ndup == 2);
    CHECK_EQ(mr_node_state(two), s5);
    CHECK_RC(fx_insert(&f, k, 3, &r, NULL, NULL), MR_OK);
    CHECK(r.state_existed == 0 && r.prefix_len == 3 && r.node == mr_node_parent(x));
    s = fx_stats(&f);
    CHECK(s.nodes == 6 && s.full_evictable == 8 && s.state_evictable == 6 && s.full_protected == 0);
    CHECK_TREE(f.t);
    CHECK_OWNERSHIP(&f);
    fx_done(&f);
}

/* Root children are ordered by (namespace, first token) over the whole
 * int32 range. */
static void
unit_child_order(void)
{
    fixture f;
    int32_t toks[] = {5, INT32_MAX, 0, -3, INT32_MIN, 2147483646, -2147483647};
    int32_t sorted[] = {INT32_MIN, -2147483647, -3, 0, 5, 2147483646, INT32_MAX};
    size_t i;
    mr_node *root;
    mr_match m;
    cur_test = "child_order";
    fx_init(&f, 1, 1, MR_POLICY_SGLANG, 64, 32);
    root = mr_radix_root(f.t);
    for (i = 0; i < 7; i++) {
        fx_put(&f, &toks[i], 1, 0, NULL, NULL);
    }
    fx_put(&f, &toks[0], 1, -9, NULL, NULL);
    fx_put(&f, &toks[2], 1, 4, NULL, NULL);
    CHECK_TREE(f.t);
    CHECK_EQ(mr_node_nchildren(root), 9);
    CHECK(mr_node_namespace(mr_node_child(root, 0)) == -9 && mr_node_key(mr_node_child(root, 0))[0] == 5);
    for (i = 0; i < 7; i++) {
        CHECK_EQ(mr_node_namespace(mr_node_child(root, i + 1)), 0);
        CHECK_EQ(mr_node_key(mr_node_child(root, i + 1))[0], sorted[i]);
    }
    CHECK(mr_node_namespace(mr_node_child(root, 8)) == 4 && mr_node_key(mr_node_child(root, 8))[0] == 0);
    for (i = 0; i < 7; i++) {
        CHECK_RC(mr_radix_match(f.t, &sorted[i], 1, 0, &m), MR_OK);
        CHECK(m.prefix_len == 1 && m.node == mr_node_child(root, i + 1));
    }
    fx_done(&f);
}

/* Branching lengths: kv_matched_len aligned down to chunk_size when the KV
 * match goes deeper than the usable state, else -1 (and -1 for 0). */
static void
unit_branching(void)
{
    fixture f;
    int32_t k[24];
    int64_t s1, s2;
    mr_match m;
    mr_node *n;
    cur_test = "branching";
    fx_init(&f, 1, 4, MR_POLICY_SGLANG, 64, 16);
    seq(k, 1, 12);
    fx_put(&f, k, 10, 0, NULL, &s1);
    CHECK_MATCH(&f, k, 10, 0, 10, 10, -1, s1, &m);
    CHECK_MATCH(&f, k, 12, 0, 10, 10, -1, s1, &m);     /* longer key */
    CHECK_MATCH(&f, k, 9, 0, 0, 9, 8, -1, &m);         /* split at 9 */
    CHECK_MATCH(&f, k, 3, 0, 0, 3, -1, -1, &m);        /* 3 // 4 * 4 == 0 */
    CHECK_EQ(fx_stats(&f).nodes, 3);
    n = fx_put(&f, k, 3, 0, NULL, &s2);                /* revive [1..3] */
    CHECK_EQ(fx_stats(&f).nodes, 3);
    CHECK_MATCH(&f, k, 9, 0, 3, 9, 8, s2, &m);
    CHECK(m.node == n);
    CHECK_MATCH(&f, k, 10, 0, 10, 10, -1, s1, &m);
    k[9] = 99;
    CHECK_MATCH(&f, k, 10, 0, 3, 9, 8, s2, &m);
    CHECK_MATCH(&f, k, 8, 0, 3, 8, 8, s2, &m);         /* splits [4..9] */
    CHECK_EQ(fx_stats(&f).nodes, 4);
    CHECK_TREE(f.t);
    fx_done(&f);

    /* page 4, chunk 8 */
    fx_init(&f, 4, 8, MR_POLICY_CONSUMED, 64, 16);
    seq(k, 100, 24);
    fx_put(&f, k, 24, 0, NULL, &s1);
    k[21] = -1;
    CHECK_MATCH(&f, k, 24, 0, 0, 20, 16, -1, &m);
    CHECK_MATCH(&f, k, 7, 0, 0, 4, -1, -1, &m);
    CHECK_EQ(fx_stats(&f).nodes, 3);
    CHECK_TREE(f.t);
    fx_done(&f);
}

static int
dump_equals(const mr_radix *t, const char *before)
{
    char *buf = NULL;
    size_t len;
    int eq;
    if (mr_radix_dump(t, &buf, &len) != MR_OK) {
        return 0;
    }
    eq = strcmp(buf, before) == 0;
    MR_FREE(buf);
    return eq;
}

/* page_size 16: matching truncates to whole pages, inserts must be whole
 * pages, children may share a first token (not a first page). */
static void
unit_page16(void)
{
    fixture f;
    int32_t a[48], b[48], c[16], odd[20];
    int64_t s1, s2, s3, val[48], dup[48];
    mr_match m;
    mr_insert_result r;
    mr_radix_stats before, after;
    char *dump = NULL;
    size_t dlen, i;
    mr_node *root, *up;
    cur_test = "page16";
    fx_init(&f, 16, 64, MR_POLICY_SGLANG, 256, 16);
    root = mr_radix_root(f.t);
    seq(a, 1000, 48);
    fx_put(&f, a, 48, 0, NULL, &s1);

    /* Lengths that are not whole pages are refused, the tree unchanged. */
    before = fx_stats(&f);
    CHECK_RC(mr_radix_dump(f.t, &dump, &dlen), MR_OK);
    memcpy(odd, a, sizeof odd);
    for (i = 0; i < 20; i++) {
        val[i] = 9000 + (int64_t)i;
    }
    memset(&r, 0, sizeof r);
    CHECK_RC(mr_radix_insert(f.t, odd, val, 20, 0, 7, 0, dup, &r), MR_EINVAL);
    CHECK_RC(mr_radix_insert(f.t, odd, val, 8, 0, 7, 0, dup, &r), MR_EINVAL);
    CHECK_RC(mr_radix_insert(f.t, a, val, 47, 0, 7, 0, dup, &r), MR_EINVAL);
    CHECK_RC(mr_radix_insert(f.t, a, val, 32, 0, -1, 0, dup, &r), MR_EINVAL);   /* no slot */
    after = fx_stats(&f);
    CHECK(memcmp(&before, &after, sizeof before) == 0);
    CHECK(dump && dump_equals(f.t, dump));
    MR_FREE(dump);
    CHECK_TREE(f.t);

    /* Matches truncate to whole pages. */
    CHECK_MATCH(&f, a, 15, 0, 0, 0, -1, -1, &m);
    CHECK_EQ(fx_stats(&f).nodes, 1);
    CHECK_MATCH(&f, a, 63, 0, 48, 48, -1, s1, &m);
    CHECK_MATCH(&f, a, 47, 0, 0, 32, -1, -1, &m);      /* split at 32 */
    CHECK_EQ(fx_stats(&f).nodes, 2);
    CHECK_MATCH(&f, a, 40, 0, 0, 32, -1, -1, &m);
    CHECK_EQ(fx_stats(&f).nodes, 2);

    /* b: first page equal, second page equal for 5 tokens only: the second
     * page does not match at all. */
    memcpy(b, a, sizeof b);
    for (i = 21; i < 48; i++) {
        b[i] = -(int32_t)i;
    }
    CHECK_RC(fx_insert(&f, b, 48, &r, NULL, &s2), MR_OK);
    CHECK_EQ(r.prefix_len, 16);
    CHECK_EQ(r.ndup, 16);
    CHECK_TREE(f.t);
    CHECK_EQ(mr_node_nchildren(root), 1);
    up = mr_node_child(root, 0);
    CHECK(mr_node_len(up) == 16 && mr_node_state(up) == -1);
    CHECK_EQ(mr_node_nchildren(up), 2);        /* both children start with token 1016 */
    CHECK(mr_node_key(mr_node_child(up, 0))[0] == 1016 && mr_node_key(mr_node_child(up, 1))[0] == 1016);
    CHECK_MATCH(&f, b, 48, 0, 48, 48, -1, s2, &m);
    CHECK_MATCH(&f, a, 48, 0, 48, 48, -1, s1, &m);
    CHECK_MATCH(&f, b, 40, 0, 0, 32, -1, -1, &m);      /* splits b's leaf at 32 */
    CHECK_EQ(fx_stats(&f).nodes, 5);

    /* c shares only its first 5 tokens with a: a second root child with
     * the same first token. */
    memcpy(c, a, 5 * sizeof(int32_t));
    for (i = 5; i < 16; i++) {
        c[i] = 77;
    }
    CHECK_RC(fx_insert(&f, c, 16, &r, NULL, &s3), MR_OK);
    CHECK(r.prefix_len == 0 && r.ndup == 0 && r.state_existed == 0);
    CHECK_EQ(mr_node_nchildren(root), 2);
    CHECK_MATCH(&f, c, 16, 0, 16, 16, -1, s3, &m);
    CHECK_MATCH(&f, a, 48, 0, 48, 48, -1, s1, &m);
    CHECK_TREE(f.t);
    CHECK_OWNERSHIP(&f);
    fx_done(&f);
}

/* Keys of different namespaces never match each other. */
static void
unit_namespaces(void)
{
    fixture f;
    int32_t k[4] = {1, 2, 3, 4};
    int64_t s0, s7, s8;
    mr_node *n0, *n7, *n8, *root;
    mr_insert_result r;
    mr_match m;
    size_t tok, sts;
    cur_test = "namespaces";
    fx_init(&f, 1, 1, MR_POLICY_SGLANG, 64, 16);
    root = mr_radix_root(f.t);
    n0 = fx_put(&f, k, 3, 0, NULL, &s0);
    CHECK_RC(fx_insert_pp(&f, k, 3, 7, 0, &r, NULL, &s7), MR_OK);
    n7 = r.node;
    CHECK(r.prefix_len == 0 && r.ndup == 0 && r.state_existed == 0);
    CHECK(n0 != n7);
    CHECK_EQ(mr_node_nchildren(root), 2);
    CHECK(mr_node_child(root, 0) == n0 && mr_node_child(root, 1) == n7);
    CHECK_EQ(mr_node_namespace(n0), 0);
    CHECK_EQ(mr_node_namespace(n7), 7);
    CHECK_MATCH(&f, k, 3, 0, 3, 3, -1, s0, &m);
    CHECK(m.node == n0);
    CHECK_MATCH(&f, k, 3, 7, 3, 3, -1, s7, &m);
    CHECK(m.node == n7);
    CHECK_MATCH(&f, k, 3, 5, 0, 0, -1, -1, &m);
    CHECK_RC(fx_insert_pp(&f, k, 4, 7, 0, &r, NULL, &s8), MR_OK);
    n8 = r.node;
    CHECK(r.prefix_len == 3 && r.ndup == 3 && mr_node_parent(n8) == n7);
    CHECK_EQ(mr_node_namespace(n8), 7);
    CHECK_MATCH(&f, k, 4, 0, 3, 3, -1, s0, &m);
    CHECK_MATCH(&f, k, 4, 7, 4, 4, -1, s8, &m);
    /* Namespace 0 and 7 hold separate KV for the same tokens. */
    CHECK(node_val(n0, 0) != node_val(n7, 0));
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_evict_full(f.t, 100, &f.rel, &tok, &sts), MR_OK);
    CHECK_EQ(tok, 7);
    CHECK_EQ(sts, 3);
    CHECK_EQ(fx_stats(&f).nodes, 0);
    CHECK_OWNERSHIP(&f);
    fx_done(&f);
}

/* The namespace table (nstable.h) against a list of the names in the order
 * they came (the ids a correct table hands out): random names over a small
 * alphabet with NUL bytes and the empty name, looked up with and without
 * create; ids survive a reset of the tree; the table refuses a name past
 * MR_NS_MAX and stays as it was. */
static void
unit_namespace_table(void)
{
    enum { NAMES = 300, LOOKUPS = 3000 };
    char model[NAMES][6];
    size_t mlen[NAMES], nmodel = 0;
    mr_radix *t;
    mr_radix_config cfg = {1, 1, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0};
    uint64_t rng = 12345;
    cur_test = "namespace_table";
    CHECK_RC(mr_radix_new(&cfg, &t), MR_OK);
    mr_nstable *ns = mr_radix_namespaces(t);
    for (int op = 0; op < LOOKUPS; op++) {
        char name[6];
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t len = (size_t)(rng >> 61) % 6;
        for (size_t i = 0; i < len; i++) {
            name[i] = "ab\0c"[(rng >> (8 + 2 * i)) & 3];
        }
        int create = (rng >> 40) % 3 != 0;
        size_t want = 0;
        while (want < nmodel && !(mlen[want] == len && memcmp(model[want], name, len) == 0)) {
            want++;
        }
        if (want == nmodel && create && nmodel < NAMES) {
            memcpy(model[nmodel], name, len);
            mlen[nmodel++] = len;
        }
        int32_t id = 0;
        CHECK_RC(mr_ns_lookup(ns, name, len, create && want < NAMES, &id), MR_OK);
        CHECK_EQ(id, want < nmodel ? (int32_t)want + 1 : -1);
        /* a refused insert drops the name it brought: only the newest goes */
        if ((rng >> 20) % 4 == 0 && nmodel > 0) {
            int32_t newest = (int32_t)nmodel, other = (int32_t)((rng >> 24) % nmodel);   /* other < newest */
            mr_ns_forget_newest(ns, other);
            mr_ns_forget_newest(ns, -1);
            if ((rng >> 28) % 2 == 0) {
                mr_ns_forget_newest(ns, newest);
                nmodel--;
            }
        }
        if (op == LOOKUPS / 2) {
            mr_radix_reset(t);
            ns = mr_radix_namespaces(t);
        }
    }
    CHECK(nmodel > 100);
    for (size_t i = 0; i < nmodel; i++) {
        const char *p;
        size_t len;
        CHECK_RC(mr_ns_name(ns, (int32_t)i + 1, &p, &len), MR_OK);
        CHECK(len == mlen[i] && memcmp(p, model[i], len) == 0 && p[len] == '\0');
    }
    const char *p;
    size_t len;
    CHECK_RC(mr_ns_name(ns, 0, &p, &len), MR_ENOENT);
    CHECK_RC(mr_ns_name(ns, -1, &p, &len), MR_ENOENT);
    CHECK_RC(mr_ns_name(ns, (int32_t)nmodel + 1, &p, &len), MR_ENOENT);
    mr_radix_free(t);

    /* a full table: every id still found, a new name refused */
    mr_nstable full;
    mr_ns_init(&full);
    int32_t id = 0;
    char name[16];
    for (int32_t i = 0; i < MR_NS_MAX && id == i; i++) {
        (void)mr_ns_lookup(&full, (const char *)&i, sizeof(i), 1, &id);
    }
    CHECK_EQ(id, MR_NS_MAX);
    memcpy(name, "one more", 8);
    CHECK_RC(mr_ns_lookup(&full, name, 8, 1, &id), MR_ENOSPC);
    CHECK_RC(mr_ns_lookup(&full, name, 8, 0, &id), MR_OK);
    CHECK_EQ(id, -1);
    int32_t k = 4242;
    CHECK_RC(mr_ns_lookup(&full, (const char *)&k, sizeof(k), 1, &id), MR_OK);
    CHECK_EQ(id, 4243);
    mr_ns_free(&full);
}

/* The ownership check (idset.h, mr_owned) with literal cases: what a tree
 * holds after inserts, each refusal with its offending position, and the
 * units handed back by an eviction accepted again. */
static void
unit_owned(void)
{
    mr_radix *t;
    mr_radix_config cfg = {1, 1, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0};
    mr_owned o;
    mr_owned_why why;
    mr_insert_result r;
    size_t bad = 99;
    int32_t k[] = {1, 2, 3, 4};
    cur_test = "owned";
    CHECK_RC(mr_radix_new(&cfg, &t), MR_OK);
    mr_owned_init(&o);
#define OWNED(val, len, ns, state, prev, want, at)                                                    \
    do {                                                                                               \
        bad = 99;                                                                                      \
        int orc_ = mr_owned_check_insert(&o, t, k, (val), (len), (ns), (state), (prev), &why, &bad); \
        CHECK_RC(orc_, (want) == MR_OWNED_OK ? MR_OK : MR_EINVAL);                                     \
        CHECK_EQ(why, (want));                                                                         \
        CHECK_EQ(bad, (size_t)(at));                                                                   \
    } while (0)
    int64_t v1[] = {10, 11, 12};
    OWNED(v1, 3, 0, 5, 0, MR_OWNED_OK, 99);
    CHECK_RC(mr_radix_insert(t, k, v1, 3, 0, 5, 0, NULL, &r), MR_OK);
    mr_owned_inserted(&o, v1, r.prefix_len, 3, 5, r.state_existed);
    /* the same state again; a longer key with the tree's own prefix undeclared */
    int64_t v2[] = {10, 11, 12, 13};
    OWNED(v2, 4, 0, 5, 3, MR_OWNED_STATE_HELD, 99);
    OWNED(v2, 4, 0, 6, 0, MR_OWNED_KV_HELD, 0);
    OWNED(v2, 4, 0, 6, 2, MR_OWNED_KV_HELD, 2);
    OWNED(v2, 4, 0, 6, 3, MR_OWNED_OK, 99);
    OWNED(v2, 4, 0, 6, 5, MR_OWNED_PREV_PAST_KEY, 99);
    /* another namespace caches nothing: every index is the caller's */
    OWNED(v2, 4, 7, 6, 3, MR_OWNED_KV_HELD, 0);
    int64_t v3[] = {20, 21, 22, 21};
    OWNED(v3, 4, 7, 6, 0, MR_OWNED_KV_TWICE, 3);
    int64_t v4[] = {20, 21, 22, 23};
    OWNED(v4, 4, 7, 6, 0, MR_OWNED_OK, 99);
    /* a check leaves no trace: the same call passes twice */
    OWNED(v4, 4, 7, 6, 0, MR_OWNED_OK, 99);
    /* what an eviction hands back may be inserted again */
    mr_owned_released(&o, v1, 3, (int64_t[]){5}, 1);
    OWNED(v2, 4, 0, 5, 0, MR_OWNED_OK, 99);
    mr_owned_clear(&o);
    OWNED(v1, 3, 0, 5, 0, MR_OWNED_OK, 99);
    mr_owned_free(&o);
    mr_radix_free(t);
#undef OWNED
}

static int
stats_are(const fixture *f, size_t fe, size_t fp, size_t se, size_t sp)
{
    mr_radix_stats s = fx_stats(f);
    if (s.full_evictable == fe && s.full_protected == fp && s.state_evictable == se &&
        s.state_protected == sp) {
        return 1;
    }
    fprintf(stderr, "  stats: full %zu/%zu state %zu/%zu, expected %zu/%zu %zu/%zu\n",
            s.full_evictable, s.full_protected, s.state_evictable, s.state_protected,
            fe, fp, se, sp);
    return 0;
}

/* Lock accounting: the four counters and the per-node counts. */
static void
unit_locks(void)
{
    fixture f;
    int32_t k[8] = {1, 2, 3, 4, 5, 0, 0, 0}, k9 = 9, k7[3] = {1, 2, 7};
    mr_node *a, *b, *c, *t2, *d, *root;
    size_t tok, sts;
    cur_test = "locks";
    fx_init(&f, 1, 1, MR_POLICY_SGLANG, 64, 16);
    root = mr_radix_root(f.t);
    a = fx_put(&f, k, 3, 0, NULL, NULL);
    b = fx_put(&f, k, 5, 0, NULL, NULL);
    c = fx_put(&f, &k9, 1, 0, NULL, NULL);
    CHECK(stats_are(&f, 6, 0, 3, 0));

    CHECK_RC(mr_radix_lock(f.t, b), MR_OK);
    CHECK(mr_node_full_lock(b) == 1 && mr_node_state_lock(b) == 1);
    CHECK(mr_node_full_lock(a) == 1 && mr_node_state_lock(a) == 0);
    CHECK(stats_are(&f, 1, 5, 2, 1));
    CHECK_RC(mr_radix_lock(f.t, a), MR_OK);
    CHECK(mr_node_full_lock(a) == 2 && mr_node_state_lock(a) == 1);
    CHECK(stats_are(&f, 1, 5, 1, 2));
    CHECK_RC(mr_radix_lock(f.t, b), MR_OK);
    CHECK(mr_node_full_lock(b) == 2 && mr_node_state_lock(b) == 2 && mr_node_full_lock(a) == 3);
    CHECK(stats_are(&f, 1, 5, 1, 2));
    CHECK_TREE(f.t);

    /* Only C can go. */
    CHECK_RC(mr_radix_evict_full(f.t, 100, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 1 && sts == 1);
    CHECK_RC(mr_radix_evict_state(f.t, 100, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 0 && sts == 0);
    CHECK(stats_are(&f, 0, 5, 0, 2));
    (void)c;

    CHECK_RC(mr_radix_unlock(f.t, b), MR_OK);
    CHECK(mr_node_full_lock(b) == 1 && mr_node_state_lock(b) == 1 && mr_node_full_lock(a) == 2);
    CHECK_RC(mr_radix_unlock(f.t, b), MR_OK);
    CHECK(mr_node_full_lock(b) == 0 && mr_node_state_lock(b) == 0 && mr_node_full_lock(a) == 1);
    CHECK(stats_are(&f, 2, 3, 1, 1));
    /* B holds no lock any more. */
    CHECK_RC(mr_radix_unlock(f.t, b), MR_EINVAL);
    CHECK(mr_node_full_lock(b) == 0 && mr_node_state_lock(b) == 0 && mr_node_full_lock(a) == 1);
    CHECK(stats_are(&f, 2, 3, 1, 1));
    CHECK_RC(mr_radix_unlock(f.t, a), MR_OK);
    CHECK(stats_are(&f, 5, 0, 2, 0));
    CHECK_RC(mr_radix_unlock(f.t, a), MR_EINVAL);
    CHECK(stats_are(&f, 5, 0, 2, 0));

    /* The root: locking and unlocking do nothing. */
    CHECK_RC(mr_radix_lock(f.t, root), MR_OK);
    CHECK(stats_are(&f, 5, 0, 2, 0));
    CHECK_RC(mr_radix_unlock(f.t, root), MR_OK);
    CHECK_RC(mr_radix_unlock(f.t, root), MR_OK);
    CHECK(stats_are(&f, 5, 0, 2, 0));
    CHECK_TREE(f.t);

    /* A lock on a tombstone protects its KV and takes no state. */
    d = fx_put(&f, k7, 3, 0, NULL, NULL);
    t2 = mr_node_parent(d);
    CHECK(mr_node_len(t2) == 2 && mr_node_state(t2) == -1);
    CHECK_RC(mr_radix_lock(f.t, t2), MR_OK);
    CHECK(mr_node_full_lock(t2) == 1 && mr_node_state_lock(t2) == 0);
    CHECK(stats_are(&f, 4, 2, 3, 0));
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_unlock(f.t, t2), MR_OK);
    CHECK_RC(mr_radix_unlock(f.t, t2), MR_EINVAL);
    CHECK(stats_are(&f, 6, 0, 3, 0));

    /* An internal state whose KV is locked by a descendant can still be
     * dropped by evict_state (tombstone, KV kept); the locked leaf not. */
    CHECK_RC(mr_radix_lock(f.t, b), MR_OK);
    CHECK_RC(mr_radix_evict_state(f.t, 100, &f.rel, &tok, &sts), MR_OK);
    CHECK_EQ(sts, 2);            /* A's [3] (internal) and D (a leaf) */
    CHECK_EQ(tok, 1);
    CHECK(mr_node_state(b) >= 0 && mr_node_state_lock(b) == 1);
    CHECK_EQ(mr_node_state(a), -1);
    CHECK(stats_are(&f, 0, 5, 0, 1));
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_unlock(f.t, b), MR_OK);
    CHECK(stats_are(&f, 5, 0, 1, 0));
    CHECK_OWNERSHIP(&f);
    fx_done(&f);
}

/* radix_ops.c, the calls as the front ends make them: names, the insert
 * behind the ownership check, lock kinds and what a refused unlock
 * reports, SGLang's lock components and their undo, NodeIds, and the
 * eviction collector (an eviction that keeps no indices still makes the
 * check forget them). */
static void
unit_radix_ops(void)
{
    mr_radix_config cfg = {0};
    mr_radix_options opt = {0};
    int64_t chunk = 0;
    cur_test = "radix_ops";
    CHECK_RC(mr_radix_page_chunk(16, &chunk), MR_OK);
    CHECK_EQ(chunk, 64);
    chunk = 0;
    CHECK_RC(mr_radix_page_chunk(128, &chunk), MR_OK);
    CHECK_EQ(chunk, 128);
    chunk = 24;
    CHECK_RC(mr_radix_page_chunk(16, &chunk), MR_EINVAL);
    CHECK_RC(mr_radix_policy_by_0523_name("lru", &cfg.policy), MR_OK);
    CHECK_EQ(cfg.policy, MR_POLICY_CONSUMED);
    CHECK_RC(mr_radix_policy_by_0523_name("sglang", &cfg.policy), MR_OK);
    CHECK_EQ(cfg.policy, MR_POLICY_SGLANG);
    CHECK_RC(mr_radix_policy_by_0523_name("lru2", &cfg.policy), MR_EINVAL);
    CHECK_RC(mr_radix_semantics_by_name("v0.5.23", &cfg.semantics), MR_OK);
    CHECK_EQ(cfg.semantics, MR_SEMANTICS_V0523);
    CHECK_RC(mr_radix_semantics_by_name("v0.5.2", &cfg.semantics), MR_EINVAL);
    CHECK_EQ(mr_skip_bit(0), MR_SKIP_FULL);
    CHECK_EQ(mr_skip_bit(2), MR_SKIP_MAMBA);
    CHECK_EQ(mr_skip_bit(1), 0);

    cfg.page_size = 1;
    cfg.chunk_size = 1;
    cfg.policy = MR_POLICY_CONSUMED;
    cfg.semantics = MR_SEMANTICS_V0515;
    mr_radix *t = NULL;
    CHECK_RC(mr_radix_create(&cfg, &opt, NULL, &t), MR_OK);
    if (t == NULL) {
        return;
    }
    mr_owned own;
    mr_owned_init(&own);
    int32_t key[4] = {1, 2, 3, 4};
    int64_t val[4] = {10, 11, 12, 13};
    mr_insert_result ra, rb;
    mr_owned_why why;
    size_t bad = 0;
    CHECK_RC(mr_owned_insert(&own, t, key, val, 2, 0, 1, 0, NULL, &why, &bad, &ra), MR_OK);
    CHECK_RC(mr_owned_insert(&own, t, key, val, 4, 0, 1, 2, NULL, &why, &bad, &rb), MR_EINVAL);
    CHECK_EQ(why, MR_OWNED_STATE_HELD);
    CHECK_RC(mr_owned_insert(&own, t, key, val, 4, 0, 2, 2, NULL, &why, &bad, &rb), MR_OK);
    CHECK(why == MR_OWNED_OK && rb.prefix_len == 2);
    mr_node *a = ra.node, *b = rb.node;
    CHECK(mr_node_parent(b) == a);

    /* Lock kinds; a refused unlock counts the locks of the other kind. */
    int32_t other = -1;
    CHECK_RC(mr_radix_lock_op(t, b, MR_LOCK, NULL), MR_OK);
    CHECK_RC(mr_radix_lock_op(t, a, MR_UNLOCK, &other), MR_EINVAL);
    CHECK_EQ(other, 0);
    CHECK_RC(mr_radix_lock_op(t, a, MR_UNLOCK_KV, &other), MR_EINVAL);
    CHECK_EQ(other, 1);
    CHECK_RC(mr_radix_lock_op(t, a, MR_LOCK_KV, NULL), MR_OK);
    CHECK_RC(mr_radix_lock_op(t, a, MR_UNLOCK, &other), MR_EINVAL);
    CHECK_EQ(other, 1);
    CHECK_RC(mr_radix_lock_op(t, a, MR_UNLOCK_KV, NULL), MR_OK);

    /* Components: FULL skipped releases the MAMBA part and leaves a KV
     * lock; its undo makes that a full lock again. */
    CHECK_RC(mr_radix_release_components(t, b, MR_SKIP_FULL), MR_OK);
    CHECK(mr_node_state_lock(b) == 0 && mr_node_kv_lock(b) == 1 && mr_node_full_lock(b) == 1);
    mr_radix_retake_components(t, b, MR_SKIP_FULL);
    CHECK(mr_node_state_lock(b) == 1 && mr_node_kv_lock(b) == 0 && mr_node_full_lock(b) == 1);
    CHECK_RC(mr_radix_release_components(t, b, MR_SKIP_FULL | MR_SKIP_MAMBA), MR_OK);
    CHECK_RC(mr_radix_release_components(t, b, MR_SKIP_MAMBA), MR_EINVAL);
    CHECK_EQ(mr_node_full_lock(b), 1);
    CHECK_RC(mr_radix_release_components(t, b, 0), MR_OK);
    CHECK(mr_node_full_lock(b) == 0 && mr_node_full_lock(a) == 0);
    CHECK_EQ(mr_radix_node_attr(t, b, MR_NODE_PREFIX_LEN), 4);
    CHECK_EQ(mr_radix_node_attr(t, b, MR_NODE_STATE), 2);
    CHECK_EQ(mr_radix_node_attr(t, mr_radix_root(t), MR_NODE_IS_ROOT), 1);
    CHECK_TREE(t);

    /* NodeIds; evictions into the collector. */
    int64_t bid = (int64_t)mr_node_nodeid(b);
    CHECK(mr_radix_node_by_nodeid(t, bid) == b);
    CHECK(mr_radix_node_by_nodeid(t, -1) == NULL);
    mr_evict_out out = {0};
    size_t tok = 0, sts = 0;
    CHECK_RC(mr_radix_evict_into(t, MR_EVICT_FULL, NULL, 100, 0, &own, &out, &tok, &sts), MR_OK);
    CHECK(tok == 4 && sts == 2 && out.nkv == 4 && out.nst == 2);
    mr_evict_out_free(&out);
    CHECK(mr_radix_node_by_nodeid(t, bid) == NULL);
    CHECK_RC(mr_owned_insert(&own, t, key, val, 4, 0, 2, 0, NULL, &why, &bad, &rb), MR_OK);
    CHECK(mr_radix_node_by_nodeid(t, bid) == NULL);
    CHECK_RC(mr_radix_evict_into(t, MR_EVICT_FULL, NULL, 100, 0, NULL, &out, &tok, &sts), MR_OK);
    CHECK(tok == 4 && sts == 1 && out.nkv == 0 && out.nst == 1 && out.st[0] == 2);
    mr_evict_out_free(&out);
    CHECK_TREE(t);
    mr_owned_free(&own);
    mr_radix_free(t);
}

/* Handles: stale after eviction and reset, never dereferenced. */
static void
unit_handles(void)
{
    fixture f;
    int32_t k[2] = {1, 2}, k5 = 5;
    mr_node *x, *y, *z, *n;
    mr_handle hx, hy, hz, hbad;
    size_t tok, sts;
    mr_radix_stats s;
    cur_test = "handles";
    fx_init(&f, 1, 1, MR_POLICY_SGLANG, 64, 16);
    x = fx_put(&f, k, 2, 0, NULL, NULL);
    y = fx_put(&f, &k5, 1, 0, NULL, NULL);
    hx = mr_node_handle(x);
    hy = mr_node_handle(y);
    CHECK(hx.id != hy.id || hx.gen != hy.gen);
    n = NULL;
    CHECK_RC(mr_radix_resolve(f.t, hx, &n), MR_OK);
    CHECK(n == x);
    CHECK_RC(mr_radix_evict_full(f.t, 100, &f.rel, &tok, &sts), MR_OK);
    CHECK_RC(mr_radix_resolve(f.t, hx, &n), MR_ESTALE);
    CHECK_RC(mr_radix_resolve(f.t, hy, &n), MR_ESTALE);
    /* New nodes may reuse the memory and the ids: old handles stay stale. */
    z = fx_put(&f, k, 2, 0, NULL, NULL);
    hz = mr_node_handle(z);
    CHECK_RC(mr_radix_resolve(f.t, hx, &n), MR_ESTALE);
    CHECK_RC(mr_radix_resolve(f.t, hz, &n), MR_OK);
    CHECK(n == z);
    hbad.id = 123456;
    hbad.gen = 0;
    CHECK(mr_radix_resolve(f.t, hbad, &n) != MR_OK);
    hbad.id = UINT32_MAX;
    hbad.gen = UINT32_MAX;
    CHECK(mr_radix_resolve(f.t, hbad, &n) != MR_OK);
    hbad = hz;
    hbad.gen++;
    CHECK(mr_radix_resolve(f.t, hbad, &n) != MR_OK);

    /* Reset: every node goes, nothing is released, handles go stale. */
    mr_radix_reset(f.t);
    CHECK_RC(mr_radix_resolve(f.t, hz, &n), MR_ESTALE);
    CHECK(f.kv_calls == 2 && f.st_calls == 2);
    s = fx_stats(&f);
    CHECK(s.nodes == 0 && s.full_evictable == 0 && s.state_evictable == 0);
    CHECK_EQ(mr_node_nchildren(mr_radix_root(f.t)), 0);
    CHECK(mr_radix_lru_first(f.t, 0) == NULL && mr_radix_lru_first(f.t, 1) == NULL);
    CHECK_TREE(f.t);
    /* The tree works after a reset (the test's pools are not cleared: it
     * just uses fresh indices). */
    z = fx_put(&f, k, 2, 0, NULL, NULL);
    CHECK_RC(mr_radix_resolve(f.t, mr_node_handle(z), &n), MR_OK);
    CHECK_RC(mr_radix_resolve(f.t, hz, &n), MR_ESTALE);
    CHECK_TREE(f.t);
    fx_done(&f);
}

/* SGLang test_mamba_lru_match_refreshes_only_used_node, under both
 * policies, with the full list order too. */
static void
unit_lru_policies(mr_lru_policy pol)
{
    fixture f;
    int32_t k1[6] = {1, 2, 3, 4, 5, 6}, k2[6] = {7, 8, 9, 10, 11, 12};
    mr_node *a1, *b1, *a2, *b2;
    mr_match m;
    size_t tok, sts;
    int sg = pol == MR_POLICY_SGLANG;
    cur_test = sg ? "lru_policies/sglang" : "lru_policies/consumed";
    fx_init(&f, 1, 1, pol, 64, 16);
    a1 = fx_put(&f, k1, 3, 0, NULL, NULL);
    b1 = fx_put(&f, k1, 6, 0, NULL, NULL);
    a2 = fx_put(&f, k2, 3, 0, NULL, NULL);
    b2 = fx_put(&f, k2, 6, 0, NULL, NULL);
    {
        mr_node *e[4] = {b2, a2, b1, a1};
        CHECK(lru_is(f.t, 0, e, 4));
        CHECK(lru_is(f.t, 1, e, 4));
    }
    CHECK_RC(mr_radix_match(f.t, k1, 6, 0, &m), MR_OK);
    CHECK(m.node == b1);
    {
        mr_node *full[4] = {b1, a1, b2, a2};
        mr_node *sgl[4] = {b1, a1, b2, a2}, *con[4] = {b1, b2, a2, a1};
        CHECK(lru_is(f.t, 0, full, 4));
        CHECK(lru_is(f.t, 1, sg ? sgl : con, 4));
    }
    CHECK_RC(mr_radix_match(f.t, k2, 6, 0, &m), MR_OK);
    CHECK(m.node == b2);
    {
        mr_node *full[4] = {b2, a2, b1, a1};
        mr_node *sgl[4] = {b2, a2, b1, a1}, *con[4] = {b2, b1, a2, a1};
        CHECK(lru_is(f.t, 0, full, 4));
        CHECK(lru_is(f.t, 1, sg ? sgl : con, 4));
    }
    CHECK_RC(mr_radix_match(f.t, k1, 6, 0, &m), MR_OK);
    {
        mr_node *full[4] = {b1, a1, b2, a2};
        mr_node *sgl[4] = {b1, a1, b2, a2}, *con[4] = {b1, b2, a2, a1};
        CHECK(lru_is(f.t, 0, full, 4));
        CHECK(lru_is(f.t, 1, sg ? sgl : con, 4));
        /* The upstream assertions: order[0] is b1, and a1 behind a2 only
         * under the consumed-state policy. */
        CHECK(mr_radix_lru_first(f.t, 1) == b1);
    }
    /* An insert walk over existing nodes refreshes their states only under
     * the SGLang policy. */
    fx_put(&f, k2, 6, 0, NULL, NULL);
    {
        mr_node *full[4] = {b2, a2, b1, a1};
        mr_node *sgl[4] = {b2, a2, b1, a1}, *con[4] = {b1, b2, a2, a1};
        CHECK(lru_is(f.t, 0, full, 4));
        CHECK(lru_is(f.t, 1, sg ? sgl : con, 4));
    }
    /* A match that uses a1's state (the key ends inside b1, which splits). */
    CHECK_RC(mr_radix_match(f.t, k1, 4, 0, &m), MR_OK);
    CHECK(m.node == a1 && m.prefix_len == 3 && m.kv_matched_len == 4);
    CHECK_EQ(mr_radix_lru_first(f.t, 1) == a1, 1);
    /* The least recently used state goes first: an internal one becomes a
     * tombstone.  sglang: b2, a2, b1, a1; the split refreshes b1, the match a1:
     * a1, b1, b2, a2.  consumed: b1, b2, a2, a1; the match refreshes a1:
     * a1, b1, b2, a2.  Either way a2 goes. */
    {
        mr_node *e[4] = {a1, b1, b2, a2};
        CHECK(lru_is(f.t, 1, e, 4));
    }
    CHECK_RC(mr_radix_evict_state(f.t, 1, &f.rel, &tok, &sts), MR_OK);
    CHECK(sts == 1 && tok == 0);
    CHECK_EQ(mr_node_state(a2), -1);
    CHECK(mr_node_state(a1) >= 0);
    CHECK_TREE(f.t);
    fx_done(&f);
}

/* mr_radix_dump prints every node. */
static void
unit_dump(void)
{
    fixture f;
    int32_t k1[3] = {424242, 17, 18}, k2[3] = {424242, 17, 31337}, k3[2] = {-55555, 8};
    char *buf = NULL, tokbuf[32];
    size_t len = 0, lines = 0, i;
    int64_t s[3];
    cur_test = "dump";
    fx_init(&f, 1, 1, MR_POLICY_SGLANG, 64, 1000);
    /* Slots far from the KV indices, so that the dump's numbers are distinct. */
    for (i = 0; i < 900; i++) {
        pool_alloc(&f.st);
    }
    fx_put(&f, k1, 3, 0, NULL, &s[0]);
    fx_put(&f, k2, 3, 0, NULL, &s[1]);
    fx_put(&f, k3, 2, 6, NULL, &s[2]);
    CHECK_RC(mr_radix_dump(f.t, &buf, &len), MR_OK);
    CHECK(buf != NULL);
    if (buf) {
        CHECK_EQ(strlen(buf), len);
        for (i = 0; i < len; i++) {
            lines += buf[i] == '\n';
        }
        CHECK(lines >= 4);   /* 4 nodes, one a line */
        CHECK(strstr(buf, "424242") != NULL);
        CHECK(strstr(buf, "18") != NULL);
        CHECK(strstr(buf, "31337") != NULL);
        CHECK(strstr(buf, "-55555") != NULL);
        for (i = 0; i < 3; i++) {
            snprintf(tokbuf, sizeof tokbuf, "%lld", (long long)s[i]);
            CHECK(strstr(buf, tokbuf) != NULL);
        }
        MR_FREE(buf);
    }
    fx_done(&f);
}

/* SGLang test_mamba_radix_cache_kv_events, without events: an internal
 * state goes without its KV; evicting the leaf then cascades through the
 * tombstone above it. */
static void
unit_evict_cascade(mr_lru_policy pol)
{
    fixture f;
    int32_t k[5] = {1, 2, 3, 4, 5};
    mr_node *a, *b;
    size_t tok, sts;
    cur_test = "evict_cascade";
    fx_init(&f, 1, 1, pol, 64, 16);
    f.check_in_tree = 1;     /* callbacks come before the node changes */
    a = fx_put(&f, k, 3, 0, NULL, NULL);
    b = fx_put(&f, k, 5, 0, NULL, NULL);
    CHECK_RC(mr_radix_evict_state(f.t, 1, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 0 && sts == 1);
    CHECK_EQ(mr_node_state(a), -1);
    CHECK(mr_node_state(b) >= 0);
    CHECK_RC(mr_radix_evict_full(f.t, 1, &f.rel, &tok, &sts), MR_OK);
    CHECK_EQ(tok, 5);     /* overshoot: the leaf and the tombstone above */
    CHECK_EQ(sts, 1);
    CHECK_EQ(f.kv_calls, 2);
    CHECK_EQ(f.not_in_tree, 0);
    CHECK_EQ(fx_stats(&f).nodes, 0);
    CHECK_TREE(f.t);
    CHECK_OWNERSHIP(&f);
    fx_done(&f);
}

/* The full list's least recently used leaf is evicted first; a match
 * makes a leaf recent again. */
static void
unit_evict_order(void)
{
    fixture f;
    int32_t k[3][2] = {{1, 1}, {2, 2}, {3, 3}};
    mr_node *n[3];
    mr_handle h[3];
    mr_match m;
    size_t tok, sts, i;
    mr_node *x;
    cur_test = "evict_order";
    fx_init(&f, 1, 1, MR_POLICY_SGLANG, 64, 16);
    for (i = 0; i < 3; i++) {
        n[i] = fx_put(&f, k[i], 2, 0, NULL, NULL);
        h[i] = mr_node_handle(n[i]);
    }
    CHECK_RC(mr_radix_match(f.t, k[0], 2, 0, &m), MR_OK);
    CHECK_RC(mr_radix_evict_full(f.t, 1, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 2 && sts == 1);
    CHECK_RC(mr_radix_resolve(f.t, h[1], &x), MR_ESTALE);
    CHECK_RC(mr_radix_resolve(f.t, h[0], &x), MR_OK);
    CHECK_RC(mr_radix_resolve(f.t, h[2], &x), MR_OK);
    CHECK_RC(mr_radix_evict_full(f.t, 3, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 4 && sts == 2);
    CHECK_TREE(f.t);
    fx_done(&f);
}


/* Evictions of nothing, NULL out-parameters, memory accounting. */
static void
unit_evict_edges_and_memory(void)
{
    fixture f;
    int32_t k[4];
    size_t tok = 99, sts = 99, i, base_mem, full_mem;
    mr_radix_stats s;
    cur_test = "evict_edges_and_memory";
    fx_init(&f, 2, 2, MR_POLICY_CONSUMED, 1024, 256);
    base_mem = fx_stats(&f).memory_bytes;
    for (i = 0; i < 200; i++) {
        k[0] = (int32_t)(i % 7);
        k[1] = (int32_t)i;
        k[2] = 3;
        k[3] = (int32_t)i;
        fx_put(&f, k, 4, 0, NULL, NULL);
    }
    s = fx_stats(&f);
    full_mem = s.memory_bytes;
    CHECK_EQ(s.full_evictable, 800);
    /* 200 nodes of 4 tokens (8-byte index + 4-byte token each). */
    CHECK(full_mem >= base_mem + 200 * 4 * 12);
    CHECK_RC(mr_radix_evict_full(f.t, 0, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 0 && sts == 0);
    CHECK_RC(mr_radix_evict_state(f.t, 0, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 0 && sts == 0);
    CHECK(f.kv_calls == 0 && f.st_calls == 0);
    CHECK_RC(mr_radix_evict_full(f.t, 5, &f.rel, NULL, NULL), MR_OK);
    CHECK_EQ(f.kv_released, 8);       /* two whole leaves of 4 */
    CHECK_RC(mr_radix_evict_state(f.t, 3, &f.rel, NULL, NULL), MR_OK);
    CHECK_EQ(f.st_released, 5);
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_evict_full(f.t, (size_t)-1, &f.rel, &tok, &sts), MR_OK);
    s = fx_stats(&f);
    CHECK(s.nodes == 0 && s.full_evictable == 0 && s.state_evictable == 0);
    CHECK(s.memory_bytes < full_mem);
    CHECK(s.memory_bytes >= base_mem);
    CHECK_TREE(f.t);
    CHECK_OWNERSHIP(&f);
    CHECK_EQ(f.kv.nfree, f.kv.size);
    CHECK_EQ(f.st.nfree, f.st.size);
    fx_done(&f);
}

/* prev_prefix_len with pages: the caller's locked prefix may end inside a
 * page; duplicates start exactly there. */
static void
unit_prev_prefix_pages(void)
{
    fixture f;
    int32_t k[12];
    int64_t val[12];
    mr_insert_result r;
    cur_test = "prev_prefix_pages";
    fx_init(&f, 4, 4, MR_POLICY_SGLANG, 128, 16);
    seq(k, 50, 12);
    CHECK_RC(fx_insert_pp(&f, k, 8, 0, 0, &r, val, NULL), MR_OK);
    CHECK_RC(fx_insert_pp(&f, k, 12, 0, 5, &r, val, NULL), MR_OK);
    CHECK(r.prefix_len == 8 && r.ndup == 3 && r.state_existed == 0);
    CHECK_RC(fx_insert_pp(&f, k, 12, 0, 0, &r, val, NULL), MR_OK);
    CHECK(r.prefix_len == 12 && r.ndup == 12 && r.state_existed == 1);
    CHECK_RC(fx_insert_pp(&f, k, 12, 0, 11, &r, val, NULL), MR_OK);
    CHECK(r.prefix_len == 12 && r.ndup == 1);
    CHECK_TREE(f.t);
    fx_done(&f);
}

/* SGLang 0.5.23 mode: stateless inserts, tombstones survive as leaves, the
 * [FULL]-only match, and the per-path state cap. */
static int64_t v0523_freed_st[16];
static int v0523_nfreed;

static int
v0523_free_kv(void *ctx, const int64_t *v, size_t n)
{
    (void)ctx;
    (void)v;
    (void)n;
    return 0;
}

static int
v0523_free_state(void *ctx, int64_t slot)
{
    (void)ctx;
    v0523_freed_st[v0523_nfreed++] = slot;
    return 0;
}

static mr_radix_stats
fx_stats_of(const mr_radix *t)
{
    mr_radix_stats st;
    mr_radix_get_stats(t, &st);
    return st;
}

static void
unit_v0523_mode(void)
{
    mr_radix_config cfg = {.page_size = 1, .chunk_size = 1, .policy = MR_POLICY_CONSUMED,
                           .semantics = MR_SEMANTICS_V0523};
    mr_radix *t;
    mr_insert_result r;
    mr_match m;
    size_t toks = 0, sts = 0;
    mr_release rel = {v0523_free_kv, v0523_free_state, NULL, NULL};
    int32_t a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 2, 3, 9, 9, 9};
    int64_t va[6] = {10, 11, 12, 13, 14, 15}, vb[6] = {20, 21, 22, 23, 24, 25};
    CHECK_RC(mr_radix_new(&cfg, &t), MR_OK);
    /* A stateless insert makes a tombstone leaf; a state insert over its prefix. */
    CHECK_RC(mr_radix_insert(t, a, va, 6, 0, MR_NO_STATE, 0, NULL, &r), MR_OK);
    CHECK(!r.state_existed && mr_node_state(r.node) == -1);
    CHECK_RC(mr_radix_insert(t, b, vb, 6, 0, 7, 0, NULL, &r), MR_OK);
    CHECK_EQ(r.prefix_len, 3);
    CHECK_TREE(t);
    CHECK_RC(mr_radix_match(t, a, 6, 0, &m), MR_OK);
    CHECK(m.node == mr_radix_root(t) && m.kv_matched_len == 6 && mr_node_len(m.kv_node) == 3);
    /* Removing b's leaf (its state) leaves the split's tombstone parent, which
     * still has a's leaf; removing that leaf then keeps the tombstone [1 2 3]
     * as a stateless leaf (v0.5.15 would cascade it away). */
    CHECK_RC(mr_radix_evict_state(t, 1, &rel, &toks, &sts), MR_OK);
    CHECK(toks == 3 && sts == 1 && v0523_freed_st[0] == 7);
    CHECK_RC(mr_radix_evict_full(t, 1, &rel, &toks, &sts), MR_OK);
    CHECK_EQ(toks, 3);
    CHECK_EQ(mr_node_nchildren(mr_radix_root(t)), 1);
    CHECK_TREE(t);
    /* Per-path cap: states at 1..2, 1..4, 1..6 on one chain; cap 1 drops the
     * shallowest ones that are single-child links, never the tail. */
    mr_radix_reset(t);
    v0523_nfreed = 0;
    CHECK_RC(mr_radix_insert(t, a, va, 2, 0, 1, 0, NULL, &r), MR_OK);
    CHECK_RC(mr_radix_insert(t, a, va, 4, 0, 2, 0, NULL, &r), MR_OK);
    CHECK_RC(mr_radix_insert(t, a, va, 6, 0, 3, 0, NULL, &r), MR_OK);
    CHECK_RC(mr_radix_evict_path_states(t, r.node, 1, &rel, &sts), MR_OK);
    CHECK(sts == 2 && v0523_nfreed == 2 && v0523_freed_st[0] == 1 && v0523_freed_st[1] == 2);
    CHECK_TREE(t);
    /* Locks count as SGLang 0.5.23 counts them: a lock taken on a tombstone
     * protects a state attached later; a KV-only lock never protects it. */
    mr_radix_reset(t);
    CHECK_RC(mr_radix_insert(t, a, va, 4, 0, MR_NO_STATE, 0, NULL, &r), MR_OK);
    mr_node *tomb = r.node;
    CHECK_RC(mr_radix_lock(t, tomb), MR_OK);
    CHECK_RC(mr_radix_lock_kv(t, tomb), MR_OK);
    CHECK_RC(mr_radix_insert(t, a, va, 4, 0, 9, 0, NULL, &r), MR_OK);
    CHECK(r.node == tomb && !r.state_existed);
    CHECK(fx_stats_of(t).state_protected == 1 && fx_stats_of(t).state_evictable == 0);
    CHECK_TREE(t);
    CHECK_RC(mr_radix_unlock(t, tomb), MR_OK);      /* the state lock, not the KV one */
    CHECK(fx_stats_of(t).state_evictable == 1 && fx_stats_of(t).full_protected == 4);
    CHECK_RC(mr_radix_unlock(t, tomb), MR_EINVAL);  /* no state lock left */
    /* A KV-locked leaf's state can still be evicted; its KV stays. */
    CHECK_RC(mr_radix_evict_state(t, 1, &rel, &toks, &sts), MR_OK);
    CHECK(sts == 1 && toks == 0 && mr_node_state(tomb) == -1);
    CHECK_RC(mr_radix_unlock_kv(t, tomb), MR_OK);
    CHECK_RC(mr_radix_unlock_kv(t, tomb), MR_EINVAL);
    CHECK_TREE(t);
    /* A lock's state part released alone (SGLang's MAMBA component first):
     * the state becomes evictable, the path's KV stays locked until
     * mr_radix_unlock_kv; a lock without its state part refuses it. */
    mr_radix_reset(t);
    CHECK_RC(mr_radix_insert(t, a, va, 4, 0, 5, 0, NULL, &r), MR_OK);
    CHECK_RC(mr_radix_lock(t, r.node), MR_OK);
    CHECK_RC(mr_radix_unlock_state(t, r.node), MR_OK);
    CHECK(fx_stats_of(t).state_evictable == 1 && fx_stats_of(t).state_protected == 0);
    CHECK(fx_stats_of(t).full_protected == 4 && mr_node_kv_lock(r.node) == 1);
    CHECK_TREE(t);
    CHECK_RC(mr_radix_unlock_state(t, r.node), MR_EINVAL);
    CHECK_RC(mr_radix_unlock(t, r.node), MR_EINVAL);
    CHECK_RC(mr_radix_unlock_kv(t, r.node), MR_OK);
    CHECK(fx_stats_of(t).full_evictable == 4 && fx_stats_of(t).full_protected == 0);
    CHECK_TREE(t);
    /* A v0.5.15 tree refuses a stateless insert. */
    mr_radix_free(t);
    cfg.semantics = MR_SEMANTICS_V0515;
    CHECK_RC(mr_radix_new(&cfg, &t), MR_OK);
    CHECK_RC(mr_radix_insert(t, a, va, 6, 0, MR_NO_STATE, 0, NULL, &r), MR_EINVAL);
    mr_radix_free(t);
    /* kv_only: the whole KV match is usable. */
    cfg.semantics = MR_SEMANTICS_V0523;
    cfg.kv_only = 1;
    CHECK_RC(mr_radix_new(&cfg, &t), MR_OK);
    CHECK_RC(mr_radix_insert(t, a, va, 6, 0, MR_NO_STATE, 0, NULL, &r), MR_OK);
    CHECK_RC(mr_radix_match(t, b, 6, 0, &m), MR_OK);
    CHECK(m.prefix_len == 3 && m.node == m.kv_node);
    CHECK_TREE(t);
    mr_radix_free(t);
}

/* The leaf heap outlives an eviction call; a lock or an unlock between two
 * calls must be seen by the next one (a leaf unlocked after the heap was
 * built is a victim; one locked after it is not). */
static void
unit_leaf_heap_sees_locks(void)
{
    fixture f;
    mr_insert_result ra, rb, rc;
    size_t tok, sts;
    const int32_t a[2] = {1, 2}, b[2] = {3, 4}, c[2] = {5, 6};
    cur_test = "leaf_heap_sees_locks";
    fx_init(&f, 1, 1, MR_POLICY_LFU, 64, 16);
    CHECK_RC(fx_insert_pp(&f, a, 2, 0, 0, &ra, NULL, NULL), MR_OK);
    CHECK_RC(fx_insert_pp(&f, b, 2, 0, 0, &rb, NULL, NULL), MR_OK);
    CHECK_RC(fx_insert_pp(&f, c, 2, 0, 0, &rc, NULL, NULL), MR_OK);
    CHECK_RC(mr_radix_lock_kv(f.t, ra.node), MR_OK);
    CHECK_RC(mr_radix_evict_full(f.t, 1, &f.rel, &tok, &sts), MR_OK);   /* b: the least recent unlocked */
    CHECK(tok == 2 && fx_stats(&f).nodes == 2);
    CHECK_TREE(f.t);
    mr_handle hc = mr_node_handle(rc.node);
    mr_node *live;
    CHECK_RC(mr_radix_lock_kv(f.t, rc.node), MR_OK);
    CHECK_RC(mr_radix_unlock_kv(f.t, ra.node), MR_OK);
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_evict_full(f.t, 1, &f.rel, &tok, &sts), MR_OK);   /* a, unlocked since; not c */
    CHECK(tok == 2 && fx_stats(&f).nodes == 1);
    CHECK_RC(mr_radix_resolve(f.t, hc, &live), MR_OK);
    if (live != rc.node) {
        fx_done(&f);
        return;
    }
    CHECK_RC(mr_radix_evict_full(f.t, 1, &f.rel, &tok, &sts), MR_OK);   /* c is locked */
    CHECK(tok == 0 && fx_stats(&f).nodes == 1);
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_unlock_kv(f.t, rc.node), MR_OK);
    CHECK_RC(mr_radix_evict_full(f.t, 1, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 2 && fx_stats(&f).nodes == 0);
    CHECK_TREE(f.t);
    fx_done(&f);
}

/* A leaf evicted under a locked parent: the parent, a leaf now, stays out
 * of the heap (its lock holds), for every keyed order and MRU. */
static void
unit_leaf_heap_locked_parent(mr_lru_policy pol)
{
    fixture f;
    mr_insert_result rp, rc, ro;
    size_t tok, sts;
    const int32_t p[2] = {1, 2}, c[4] = {1, 2, 3, 4}, o[2] = {7, 8};
    cur_test = "leaf_heap_locked_parent";
    fx_init(&f, 1, 1, pol, 64, 16);
    CHECK_RC(fx_insert_pp(&f, p, 2, 0, 0, &rp, NULL, NULL), MR_OK);
    CHECK_RC(fx_insert_pp(&f, c, 4, 0, 0, &rc, NULL, NULL), MR_OK);
    CHECK_RC(fx_insert_pp(&f, o, 2, 0, 0, &ro, NULL, NULL), MR_OK);
    CHECK_RC(mr_radix_lock_kv(f.t, rp.node), MR_OK);
    /* everything evictable goes: the child [3, 4] and the other key */
    CHECK_RC(mr_radix_evict_full(f.t, 64, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 4 && fx_stats(&f).nodes == 1);
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_unlock_kv(f.t, rp.node), MR_OK);
    CHECK_RC(mr_radix_evict_full(f.t, 64, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 2 && fx_stats(&f).nodes == 0);
    CHECK_TREE(f.t);
    fx_done(&f);
}

/* MRU with more than the probe's 64 locked leaves at the MRU end: the
 * victim comes from the heap, and is still the most recently used
 * evictable leaf (SGLang's MRU order), not the least. */
static void
unit_leaf_heap_mru_past_the_probe(void)
{
    fixture f;
    mr_insert_result r, ra, rb;
    size_t tok, sts;
    const int32_t a[1] = {1}, b[1] = {2};
    cur_test = "leaf_heap_mru_past_the_probe";
    fx_init(&f, 1, 1, MR_POLICY_MRU, 256, 128);
    CHECK_RC(fx_insert_pp(&f, a, 1, 0, 0, &ra, NULL, NULL), MR_OK);
    CHECK_RC(fx_insert_pp(&f, b, 1, 0, 0, &rb, NULL, NULL), MR_OK);
    for (int32_t k = 0; k < 80; k++) {
        const int32_t key[1] = {100 + k};
        CHECK_RC(fx_insert_pp(&f, key, 1, 0, 0, &r, NULL, NULL), MR_OK);
        CHECK_RC(mr_radix_lock_kv(f.t, r.node), MR_OK);
    }
    mr_handle ha = mr_node_handle(ra.node), hb = mr_node_handle(rb.node);
    mr_node *live;
    CHECK_RC(mr_radix_evict_full(f.t, 1, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 1 && fx_stats(&f).nodes == 81);
    CHECK(mr_radix_resolve(f.t, hb, &live) != MR_OK);    /* b, the more recent, went */
    CHECK_RC(mr_radix_resolve(f.t, ha, &live), MR_OK);
    CHECK_TREE(f.t);
    fx_done(&f);
}

static uint64_t rng_state;   /* the fuzzer's generator (below) */
static uint32_t rng_next(void *ctx);

/* Releases recorded in order, for comparing two trees' evictions. */
typedef struct {
    int64_t log[4096];
    size_t n;
} rel_log;

static int
log_kv(void *ctx, const int64_t *idx, size_t n)
{
    rel_log *l = ctx;
    for (size_t i = 0; i < n && l->n < 4096; i++) {
        l->log[l->n++] = idx[i];
    }
    return MR_OK;
}

static int
log_state(void *ctx, int64_t slot)
{
    rel_log *l = ctx;
    if (l->n < 4096) {
        l->log[l->n++] = -slot;
    }
    return MR_OK;
}

/* The ids of a tree's LRU list (which: 0 full, 1 state), most recent first,
 * into ids[0:cap); returns how many. */
static size_t
lru_ids(const mr_radix *t, int which, uint32_t *ids, size_t cap)
{
    size_t n = 0;
    for (mr_node *x = mr_radix_lru_first(t, which); x != NULL && n < cap; x = mr_radix_lru_next(t, which, x)) {
        ids[n++] = mr_node_handle(x).id;
    }
    return n;
}

/* An insert from a node on its key's path (mr_insert_opts.from: a request's
 * locked node, its path the first tokens of the key) does what the walk
 * from the root does.  The reference is that walk: a twin tree gets the
 * same operations, its inserts without `from`.  Results, duplicates, the
 * trees (dump), both LRU orders and what later evictions release must be
 * the same, under both policies at page sizes 1 and 4.  Where the build
 * does not verify (mr_verifies_trusted) the key's tokens before the node's
 * end are overwritten first: the insert must not read them. */
static void
unit_insert_from_node(void)
{
    cur_test = "insert_from_node";
    for (int c = 0; c < 4; c++) {
        int64_t from_used = 0;
        uint32_t page = (c & 1) ? 4 : 1;
        mr_radix_config cfg = {page, 4, (c & 2) ? MR_POLICY_CONSUMED : MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0};
        for (int run = 0; run < 30; run++) {
            mr_radix *tw[2] = {NULL, NULL};
            CHECK_RC(mr_radix_new(&cfg, &tw[0]), MR_OK);
            CHECK_RC(mr_radix_new(&cfg, &tw[1]), MR_OK);
            if (tw[0] == NULL || tw[1] == NULL) {
                return;
            }
            static rel_log logs[2];
            mr_release rel[2];
            for (int k = 0; k < 2; k++) {
                logs[k].n = 0;
                rel[k] = (mr_release){log_kv, log_state, &logs[k], NULL};
            }
            rng_state = 9001 + (uint64_t)run * 131 + (uint64_t)c;
            int64_t next_val = 1;
            for (int op = 0; op < 80; op++) {
                size_t len = page * (1 + rng_next(NULL) % 6);
                int32_t key[24], ka[24];
                int64_t val[24], dup[2][24];
                for (size_t i = 0; i < len; i++) {
                    key[i] = 1 + (int32_t)(rng_next(NULL) % 2);   /* two tokens: long shared prefixes */
                    val[i] = next_val++;
                }
                mr_match m[2];
                CHECK_RC(mr_radix_match(tw[0], key, len, 0, &m[0]), MR_OK);
                CHECK_RC(mr_radix_match(tw[1], key, len, 0, &m[1]), MR_OK);
                CHECK_EQ(m[0].prefix_len, m[1].prefix_len);
                memcpy(ka, key, len * sizeof(int32_t));
                for (size_t i = 0; !mr_verifies_trusted() && i < m[0].prefix_len; i++) {
                    ka[i] = -7;   /* not read */
                }
                size_t prev = rng_next(NULL) % 2 ? m[0].prefix_len : 0;
                mr_insert_opts o = {0, 0, m[0].node, NULL};
                mr_insert_result r[2];
                from_used += m[0].prefix_len > 0;
                CHECK_RC(mr_radix_insert_ex(tw[0], ka, val, len, 0, 1000 + op, prev, &o, dup[0], &r[0]), MR_OK);
                CHECK_RC(mr_radix_insert(tw[1], key, val, len, 0, 1000 + op, prev, dup[1], &r[1]), MR_OK);
                CHECK_EQ(r[0].prefix_len, r[1].prefix_len);
                CHECK_EQ(r[0].state_existed, r[1].state_existed);
                CHECK_EQ(r[0].ndup, r[1].ndup);
                CHECK(r[0].ndup > 24 || memcmp(dup[0], dup[1], r[0].ndup * sizeof(int64_t)) == 0);
                CHECK_EQ(mr_node_handle(r[0].node).id, mr_node_handle(r[1].node).id);
                if (op % 9 == 8) {   /* evictions read the LRU orders */
                    size_t tok[2], st[2];
                    for (int k = 0; k < 2; k++) {
                        CHECK_RC(mr_radix_evict_state(tw[k], 2, &rel[k], &tok[k], &st[k]), MR_OK);
                        CHECK_RC(mr_radix_evict_full(tw[k], 3 * page, &rel[k], &tok[k], &st[k]), MR_OK);
                    }
                    CHECK_EQ(logs[0].n, logs[1].n);
                    CHECK(memcmp(logs[0].log, logs[1].log, logs[0].n * sizeof(int64_t)) == 0);
                }
                for (int which = 0; which < 2; which++) {
                    uint32_t ida[512], idb[512];
                    size_t na = lru_ids(tw[0], which, ida, 512), nb = lru_ids(tw[1], which, idb, 512);
                    CHECK_EQ(na, nb);
                    CHECK(na == nb && memcmp(ida, idb, na * sizeof(uint32_t)) == 0);
                }
                char *da = NULL, *db = NULL;
                size_t la = 0, lb = 0;
                CHECK_RC(mr_radix_dump(tw[0], &da, &la), MR_OK);
                CHECK_RC(mr_radix_dump(tw[1], &db, &lb), MR_OK);
                CHECK(da != NULL && db != NULL && la == lb && strcmp(da, db) == 0);
                MR_FREE(da);
                MR_FREE(db);
                CHECK_TREE(tw[0]);
            }
            mr_radix_free(tw[0]);
            mr_radix_free(tw[1]);
        }
        CHECK(from_used > 100);   /* the walk did start at a node, often */
    }
}

static int
cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Removing one of n siblings leaves a hole in the parent's child array
 * (radix.c, "Children") instead of shifting the entries after it: evicting
 * n siblings moves O(n) entries in all, in any order.  Keys inserted in
 * token order are evicted (LRU) from the array's front, where each removal
 * used to shift every entry after it: n^2 / 2 moves.  Here half the
 * siblings go in LRU order, their keys come back in token order (filling
 * the holes left at their places, or appended), then every one goes: the
 * victims in LRU order (handles), the children in token order, and at most
 * 6 entry moves a removal or insert, for siblings inserted in token order,
 * in reverse order (evicted from the array's end) and shuffled.  (An insert
 * out of token order with no hole next to its place still shifts the
 * entries after it.) */
static void
unit_many_siblings(void)
{
    enum { N = 8000 };
    static int32_t tok[N], back[N / 2];
    static mr_handle h[N], h2[N / 2];
    cur_test = "many_siblings";
    for (int mode = 0; mode < 3; mode++) {
        fixture f;
        size_t tokens, states, i, pos;
        int32_t key[3] = {1, 2, 0};
        mr_node *n;
        fx_init(&f, 1, 4, MR_POLICY_CONSUMED, 3 * N + 16, 2 * N + 16);
        for (i = 0; i < N; i++) {
            tok[i] = 100 + (int32_t)(mode == 1 ? N - 1 - i : i);
        }
        rng_state = 77;
        for (i = N - 1; mode == 2 && i > 0; i--) {
            size_t j = rng_next(NULL) % (i + 1);
            int32_t x = tok[i];
            tok[i] = tok[j];
            tok[j] = x;
        }
        for (i = 0; i < N; i++) {
            key[2] = tok[i];
            h[i] = mr_node_handle(fx_put(&f, key, 3, 0, NULL, NULL));
        }
        mr_node *up = mr_node_child(mr_radix_root(f.t), 0);   /* [1 2] */
        CHECK_EQ(mr_node_nchildren(up), N);
        uint64_t moves = fx_stats(&f).child_moves;
        for (i = 0; i < N / 2; i++) {
            CHECK_RC(mr_radix_evict_full(f.t, 1, &f.rel, &tokens, &states), MR_OK);
            CHECK(tokens == 1 && states == 1);
            CHECK_RC(mr_radix_resolve(f.t, h[i], &n), MR_ESTALE);
            if (i + 1 < N) {
                CHECK_RC(mr_radix_resolve(f.t, h[i + 1], &n), MR_OK);
            }
        }
        CHECK_TREE(f.t);
        memcpy(back, tok, sizeof(back));
        qsort(back, N / 2, sizeof(int32_t), cmp_i32);
        for (i = 0; i < N / 2; i++) {
            key[2] = back[i];
            h2[i] = mr_node_handle(fx_put(&f, key, 3, 0, NULL, NULL));
        }
        CHECK_TREE(f.t);
        CHECK_EQ(mr_node_nchildren(up), N);
        pos = 0;
        int32_t last = INT32_MIN;
        while ((n = mr_node_child_next(up, &pos)) != NULL) {
            CHECK(mr_node_key(n)[0] > last);
            last = mr_node_key(n)[0];
        }
        for (i = 0; i < N; i++) {   /* the second half first, then the keys that came back */
            CHECK_RC(mr_radix_evict_full(f.t, 1, &f.rel, &tokens, &states), MR_OK);
            CHECK_RC(mr_radix_resolve(f.t, i < N / 2 ? h[N / 2 + i] : h2[i - N / 2], &n), MR_ESTALE);
            if (i % 1000 == 0) {
                CHECK_TREE(f.t);
            }
        }
        CHECK_EQ(fx_stats(&f).nodes, 0);
        moves = fx_stats(&f).child_moves - moves;
        n_checks++;
        if (moves > 6 * (uint64_t)(N + N / 2 + N)) {
            fail_at(__FILE__, __LINE__, "order %d: %llu child entries moved for %d removals and %d inserts", mode,
                    (unsigned long long)moves, N + N / 2, N / 2);
        }
        CHECK_OWNERSHIP(&f);
        fx_done(&f);
    }
}

static void
run_units(void)
{
    unit_new_and_empty();
    unit_insert_from_node();
    unit_leaf_heap_sees_locks();
    unit_leaf_heap_locked_parent(MR_POLICY_LFU);
    unit_leaf_heap_locked_parent(MR_POLICY_FIFO);
    unit_leaf_heap_locked_parent(MR_POLICY_PRIORITY);
    unit_leaf_heap_locked_parent(MR_POLICY_MRU);
    unit_leaf_heap_mru_past_the_probe();
    unit_v0523_mode();
    unit_sglang_cache_1(MR_POLICY_SGLANG);
    unit_sglang_cache_1(MR_POLICY_CONSUMED);
    unit_insert_prev_prefix_len();
    unit_split_shapes();
    unit_child_order();
    unit_many_siblings();
    unit_branching();
    unit_page16();
    unit_namespaces();
    unit_namespace_table();
    unit_owned();
    unit_locks();
    unit_handles();
    unit_radix_ops();
    unit_lru_policies(MR_POLICY_SGLANG);
    unit_lru_policies(MR_POLICY_CONSUMED);
    unit_dump();
    unit_evict_cascade(MR_POLICY_SGLANG);
    unit_evict_cascade(MR_POLICY_CONSUMED);
    unit_evict_order();
    unit_evict_edges_and_memory();
    unit_prev_prefix_pages();
}

/* ------------------------------------------------------------------------
 * Regression tests */

/* Regression test #1: a lock taken on a tombstone, the tombstone revived by
 * an insert, then the lock dropped.  SGLang's dec_lock_ref decides from the
 * node's *current* state whether to release a state reference, so this
 * asserts there (sglang-semantics.md 2.5b; the unified cache added
 * skip_lock_node_ids for it).  The counters must stay consistent (I5, I7). */
static void
regression_1(void)
{
    fixture f;
    int32_t k[4] = {1, 2, 3, 4}, k2[4] = {1, 2, 5, 6};
    mr_node *x, *t2;
    mr_insert_result r;
    cur_test = "regression_1";
    fx_init(&f, 1, 1, MR_POLICY_SGLANG, 64, 16);
    x = fx_put(&f, k, 4, 0, NULL, NULL);
    fx_put(&f, k2, 4, 0, NULL, NULL);
    t2 = mr_node_parent(x);
    CHECK_EQ(mr_node_state(t2), -1);
    CHECK_RC(mr_radix_lock(f.t, t2), MR_OK);
    CHECK(stats_are(&f, 4, 2, 2, 0));
    CHECK_RC(fx_insert(&f, k, 2, &r, NULL, NULL), MR_OK);
    CHECK(r.node == t2 && r.state_existed == 0);
    CHECK(mr_node_state(t2) >= 0 && mr_node_state_lock(t2) == 0);
    CHECK(stats_are(&f, 4, 2, 3, 0));
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_unlock(f.t, t2), MR_OK);
    CHECK(mr_node_full_lock(t2) == 0 && mr_node_state_lock(t2) == 0);
    CHECK(stats_are(&f, 6, 0, 3, 0));
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_unlock(f.t, t2), MR_EINVAL);
    CHECK(stats_are(&f, 6, 0, 3, 0));

    /* Mixed: one lock without state, one with; both unlock cleanly. */
    mr_radix_reset(f.t);
    x = fx_put(&f, k, 4, 0, NULL, NULL);
    fx_put(&f, k2, 4, 0, NULL, NULL);
    t2 = mr_node_parent(x);
    CHECK_RC(mr_radix_lock(f.t, t2), MR_OK);
    fx_put(&f, k, 2, 0, NULL, NULL);
    CHECK_RC(mr_radix_lock(f.t, t2), MR_OK);
    CHECK(mr_node_full_lock(t2) == 2 && mr_node_state_lock(t2) == 1);
    CHECK(stats_are(&f, 4, 2, 2, 1));
    CHECK_RC(mr_radix_unlock(f.t, t2), MR_OK);
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_unlock(f.t, t2), MR_OK);
    CHECK(mr_node_full_lock(t2) == 0 && mr_node_state_lock(t2) == 0);
    CHECK(stats_are(&f, 6, 0, 3, 0));
    CHECK_TREE(f.t);
    fx_done(&f);
}

/* Regression test #2: evict_state picked a leaf whose state was unlocked
 * but whose KV was locked, and _evict_leaf_node asserted (SGLang issue
 * #21379).  Such a leaf arises from a lock taken on a tombstone that is
 * later revived.  Two ways in: the leaf is the LRU candidate from the
 * start, or it becomes a leaf during the same eviction, when its last
 * child goes just before it is visited. */
static void
regression_2(void)
{
    fixture f;
    int32_t k[4] = {1, 2, 3, 4}, k2[4] = {1, 2, 5, 6}, k9[2] = {9, 9};
    mr_node *x, *t2, *y;
    mr_handle ht;
    size_t tok, sts;
    cur_test = "regression_2";

    /* (a) a locked tombstone leaf, revived, is the LRU state. */
    fx_init(&f, 1, 1, MR_POLICY_SGLANG, 64, 16);
    x = fx_put(&f, k, 4, 0, NULL, NULL);
    fx_put(&f, k2, 4, 0, NULL, NULL);
    t2 = mr_node_parent(x);
    ht = mr_node_handle(t2);
    CHECK_RC(mr_radix_lock(f.t, t2), MR_OK);
    CHECK_RC(mr_radix_evict_full(f.t, 100, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 4 && sts == 2);
    CHECK_RC(mr_radix_resolve(f.t, ht, &t2), MR_OK);
    CHECK(mr_node_nchildren(t2) == 0 && mr_node_state(t2) == -1);
    fx_put(&f, k, 2, 0, NULL, NULL);              /* revive: a leaf with a state */
    fx_put(&f, k9, 2, 0, NULL, NULL);
    CHECK(mr_node_state(t2) >= 0 && mr_node_state_lock(t2) == 0 && mr_node_full_lock(t2) == 1);
    CHECK_RC(mr_radix_evict_state(f.t, 1, &f.rel, &tok, &sts), MR_OK);
    CHECK(sts == 1 && tok == 2);                  /* [9,9], not t2 */
    CHECK_RC(mr_radix_resolve(f.t, ht, &t2), MR_OK);
    CHECK(mr_node_state(t2) >= 0);
    CHECK_RC(mr_radix_evict_state(f.t, 5, &f.rel, &tok, &sts), MR_OK);
    CHECK(sts == 0 && tok == 0);
    CHECK_RC(mr_radix_resolve(f.t, ht, &t2), MR_OK);
    CHECK_TREE(f.t);
    CHECK_OWNERSHIP(&f);
    CHECK_RC(mr_radix_unlock(f.t, t2), MR_OK);
    CHECK_TREE(f.t);
    fx_done(&f);

    /* (b) t2 (revived, locked without its state) has one child y; the
     * state list reads t2, y from the MRU side.  evict_state(2) takes y,
     * which leaves t2 a leaf with locked KV: t2 must not be taken next. */
    fx_init(&f, 1, 1, MR_POLICY_SGLANG, 64, 16);
    x = fx_put(&f, k, 4, 0, NULL, NULL);
    y = fx_put(&f, k2, 4, 0, NULL, NULL);
    t2 = mr_node_parent(x);
    ht = mr_node_handle(t2);
    CHECK_RC(mr_radix_lock(f.t, t2), MR_OK);
    CHECK_RC(mr_radix_evict_full(f.t, 1, &f.rel, &tok, &sts), MR_OK);   /* x goes */
    CHECK(tok == 2 && sts == 1);
    CHECK_EQ(mr_node_nchildren(t2), 1);
    fx_put(&f, k, 2, 0, NULL, NULL);              /* revive t2 */
    {
        mr_node *e[2] = {t2, y};
        CHECK(lru_is(f.t, 1, e, 2));
    }
    CHECK_RC(mr_radix_evict_state(f.t, 2, &f.rel, &tok, &sts), MR_OK);
    CHECK_EQ(sts, 1);
    CHECK_EQ(tok, 2);
    CHECK_RC(mr_radix_resolve(f.t, ht, &t2), MR_OK);
    CHECK_TREE(f.t);
    CHECK_OWNERSHIP(&f);
    if (mr_radix_resolve(f.t, ht, &t2) == MR_OK) {
        CHECK(mr_node_state(t2) >= 0 && mr_node_full_lock(t2) == 1);
        CHECK_RC(mr_radix_unlock(f.t, t2), MR_OK);
        CHECK_TREE(f.t);
    }
    fx_done(&f);
}

/* Regression test #3: an empty key must not create a node (SGLang returns
 * (0, True) early; PR #35821 fixed a stale COW source from an empty "ghost"
 * node). */
static void
regression_3(void)
{
    fixture f;
    mr_insert_result r;
    mr_match m;
    int32_t k[1] = {1};
    int64_t v[1] = {5}, dup[1];
    cur_test = "regression_3";
    fx_init(&f, 4, 4, MR_POLICY_SGLANG, 64, 16);
    memset(&r, 0xa5, sizeof r);
    CHECK_RC(mr_radix_insert(f.t, k, v, 0, 0, 3, 0, dup, &r), MR_OK);
    CHECK(r.prefix_len == 0 && r.state_existed == 1 && r.ndup == 0);
    CHECK(r.node == mr_radix_root(f.t));
    CHECK_EQ(fx_stats(&f).nodes, 0);
    CHECK(mr_radix_lru_first(f.t, 0) == NULL && mr_radix_lru_first(f.t, 1) == NULL);
    CHECK_RC(mr_radix_insert(f.t, k, v, 0, 9, 3, 0, dup, &r), MR_OK);
    CHECK_EQ(fx_stats(&f).nodes, 0);
    CHECK_MATCH(&f, k, 0, 0, 0, 0, -1, -1, &m);
    CHECK_MATCH(&f, k, 1, 0, 0, 0, -1, -1, &m);       /* less than a page */
    CHECK_TREE(f.t);
    fx_done(&f);
}

/* Regression test #4: a tombstone left a leaf by the eviction cascade
 * because it was locked (sglang-semantics.md 2.2, item 2) must be removed by
 * evict_full once unlocked, or its KV leaks for good. */
static void
regression_4(void)
{
    fixture f;
    int32_t k[4] = {1, 2, 3, 4}, k2[4] = {1, 2, 5, 6};
    mr_node *x, *t2;
    size_t tok, sts;
    cur_test = "regression_4";
    fx_init(&f, 1, 1, MR_POLICY_CONSUMED, 64, 16);
    x = fx_put(&f, k, 4, 0, NULL, NULL);
    fx_put(&f, k2, 4, 0, NULL, NULL);
    t2 = mr_node_parent(x);
    CHECK_RC(mr_radix_lock(f.t, t2), MR_OK);
    CHECK_RC(mr_radix_evict_state(f.t, 10, &f.rel, &tok, &sts), MR_OK);
    CHECK(sts == 2 && tok == 4);
    CHECK_EQ(fx_stats(&f).nodes, 1);
    CHECK(mr_node_nchildren(t2) == 0 && mr_node_state(t2) == -1);
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_evict_full(f.t, 10, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 0 && sts == 0);
    CHECK_RC(mr_radix_unlock(f.t, t2), MR_OK);
    CHECK(stats_are(&f, 2, 0, 0, 0));
    CHECK_RC(mr_radix_evict_full(f.t, 1, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 2 && sts == 0);
    CHECK_EQ(fx_stats(&f).nodes, 0);
    CHECK_TREE(f.t);
    CHECK_OWNERSHIP(&f);
    fx_done(&f);
}

/* Regression test #5: a reference to a removed node must be detected, not
 * followed (SGLang PR #36696: "parent does not have child key" from a node
 * registered under a stale key; here handles make staleness explicit).
 * Under ASan a dereference of the freed node would be reported. */
static void
regression_5(void)
{
    fixture f;
    int32_t k[6] = {1, 2, 3, 4, 5, 6}, k2[6] = {1, 2, 3, 4, 7, 8};
    mr_node *x, *n;
    mr_handle hs[64];
    size_t tok, sts, i, nh = 0;
    mr_match m;
    cur_test = "regression_5";
    fx_init(&f, 2, 2, MR_POLICY_SGLANG, 256, 64);
    x = fx_put(&f, k, 6, 0, NULL, NULL);
    hs[nh++] = mr_node_handle(x);
    CHECK_RC(mr_radix_match(f.t, k, 4, 0, &m), MR_OK);          /* split at 4 */
    hs[nh++] = mr_node_handle(mr_node_parent(x));
    x = fx_put(&f, k2, 6, 0, NULL, NULL);
    hs[nh++] = mr_node_handle(x);
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_evict_full(f.t, 1000, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 8 && sts == 2);
    for (i = 0; i < nh; i++) {
        CHECK_RC(mr_radix_resolve(f.t, hs[i], &n), MR_ESTALE);
    }
    /* Churn: many nodes reuse the freed ids and memory. */
    for (i = 0; i < 40; i++) {
        int32_t kk[2] = {(int32_t)i, 1};
        fx_put(&f, kk, 2, 0, NULL, NULL);
    }
    for (i = 0; i < nh; i++) {
        CHECK_RC(mr_radix_resolve(f.t, hs[i], &n), MR_ESTALE);
    }
    CHECK_TREE(f.t);
    fx_done(&f);
}

/* Regression test #6: a release callback that fails (a pool that refuses)
 * stops the eviction with the node left in place and the tree valid
 * (radix.h, mr_release).  Tried at every callback position of a full and a
 * state eviction, including a tombstone of the cascade. */
static void
regression_6_setup(fixture *f, mr_node **tomb, mr_node **internal)
{
    int32_t k[4] = {1, 2, 3, 4}, k2[4] = {1, 2, 5, 6}, k9[1] = {9}, k3[3] = {1, 2, 3};
    mr_node *x;
    fx_init(f, 1, 1, MR_POLICY_SGLANG, 64, 16);
    x = fx_put(f, k, 4, 0, NULL, NULL);
    fx_put(f, k2, 4, 0, NULL, NULL);
    fx_put(f, k9, 1, 0, NULL, NULL);
    *tomb = mr_node_parent(x);
    *internal = fx_put(f, k3, 3, 0, NULL, NULL);   /* [1,2] -> [3] S -> [4] */
}

static void
regression_6(void)
{
    fixture f;
    mr_node *tomb, *internal;
    size_t tok, sts;
    long k;
    int rc;
    cur_test = "regression_6";
    for (k = 1; k <= 6; k++) {
        mr_radix_stats s0;
        regression_6_setup(&f, &tomb, &internal);
        s0 = fx_stats(&f);
        f.fail_kv_call = k;
        rc = mr_radix_evict_full(f.t, 1000, &f.rel, &tok, &sts);
        if (f.kv_calls >= k) {
            CHECK_EQ(rc, -100);
            CHECK_EQ(tok, (size_t)f.kv_released);
            CHECK_EQ(sts, (size_t)f.st_released);
            CHECK(fx_stats(&f).nodes > 0);
        } else {
            CHECK_RC(rc, MR_OK);
            CHECK_EQ(tok, s0.full_evictable);
        }
        CHECK_TREE(f.t);
        CHECK_OWNERSHIP(&f);
        /* The eviction can be resumed once the pool accepts again. */
        f.fail_kv_call = 0;
        CHECK_RC(mr_radix_evict_full(f.t, 1000, &f.rel, &tok, &sts), MR_OK);
        CHECK_EQ(fx_stats(&f).nodes, 0);
        CHECK_TREE(f.t);
        CHECK_OWNERSHIP(&f);
        CHECK_EQ(f.kv.nfree, f.kv.size);
        CHECK_EQ(f.st.nfree, f.st.size);
        fx_done(&f);
    }
    /* evict_state: a refused KV release of a leaf, and a refused state
     * release of an internal node (free_state alone; radix.h allows a
     * failure there).  The LRU state is the internal [3]. */
    for (k = 1; k <= 4; k++) {
        regression_6_setup(&f, &tomb, &internal);
        f.fail_kv_call = k;
        rc = mr_radix_evict_state(f.t, 1000, &f.rel, &tok, &sts);
        CHECK_EQ(rc, f.kv_calls >= k ? -100 : MR_OK);
        CHECK_EQ(tok, (size_t)f.kv_released);
        CHECK_EQ(sts, (size_t)f.st_released);
        CHECK_TREE(f.t);
        CHECK_OWNERSHIP(&f);
        f.fail_kv_call = 0;
        CHECK_RC(mr_radix_evict_full(f.t, 1000, &f.rel, &tok, &sts), MR_OK);
        CHECK_EQ(fx_stats(&f).nodes, 0);
        CHECK_OWNERSHIP(&f);
        fx_done(&f);
    }
    regression_6_setup(&f, &tomb, &internal);
    f.fail_st_call = 1;
    {
        int32_t k9[1] = {9}, k2[4] = {1, 2, 5, 6}, k4[4] = {1, 2, 3, 4};
        mr_match m;
        /* Refresh every other state so [3] is the LRU one. */
        CHECK_RC(mr_radix_match(f.t, k9, 1, 0, &m), MR_OK);
        CHECK_RC(mr_radix_match(f.t, k2, 4, 0, &m), MR_OK);
        CHECK_RC(mr_radix_match(f.t, k4, 4, 0, &m), MR_OK);
        /* The SGLang policy refreshed [3] with [4]: refresh the others again. */
        CHECK_RC(mr_radix_match(f.t, k9, 1, 0, &m), MR_OK);
        CHECK_RC(mr_radix_match(f.t, k2, 4, 0, &m), MR_OK);
    }
    rc = mr_radix_evict_state(f.t, 1, &f.rel, &tok, &sts);
    CHECK_EQ(rc, -100);
    CHECK(tok == 0 && sts == 0);
    CHECK(mr_node_state(internal) >= 0);
    CHECK_TREE(f.t);
    CHECK_OWNERSHIP(&f);
    f.fail_st_call = 0;
    CHECK_RC(mr_radix_evict_state(f.t, 1, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 0 && sts == 1);
    CHECK_EQ(mr_node_state(internal), -1);
    CHECK_TREE(f.t);
    CHECK_OWNERSHIP(&f);
    fx_done(&f);
}

/* Regression test #7: unlock of a node whose full_lock comes only from a
 * locked descendant.  SGLang's dec_lock_ref asserts only full_lock_ref > 0
 * on the path; a C tree that checked only full_lock would drive the
 * node's own count negative (I5). */
static void
regression_7(void)
{
    fixture f;
    int32_t k[4] = {1, 2, 3, 4};
    mr_node *a, *b;
    cur_test = "regression_7";
    fx_init(&f, 1, 1, MR_POLICY_SGLANG, 64, 16);
    a = fx_put(&f, k, 2, 0, NULL, NULL);
    b = fx_put(&f, k, 4, 0, NULL, NULL);
    CHECK_RC(mr_radix_lock(f.t, b), MR_OK);
    CHECK_EQ(mr_node_full_lock(a), 1);
    CHECK_RC(mr_radix_unlock(f.t, a), MR_EINVAL);
    CHECK(mr_node_full_lock(a) == 1 && mr_node_full_lock(b) == 1 && mr_node_state_lock(b) == 1);
    CHECK(stats_are(&f, 0, 4, 1, 1));
    CHECK_TREE(f.t);
    CHECK_RC(mr_radix_unlock(f.t, b), MR_OK);
    CHECK(stats_are(&f, 4, 0, 2, 0));
    fx_done(&f);
}

/* Regression test #8: a split must register the new upper node under the
 * right child key and move the locks with it (SGLang PR #36696: "parent does
 * not have child key" in _delete_tombstone_leaf).  With pages of 2 the upper
 * node keeps the first page, the lower one is keyed by its new first page;
 * a later cascade must find both. */
static void
regression_8(void)
{
    fixture f;
    int32_t k[6] = {1, 2, 3, 4, 5, 6}, k2[6] = {1, 2, 3, 4, 7, 8}, k3[4] = {1, 2, 9, 9};
    mr_node *x, *up, *y;
    mr_match m;
    size_t tok, sts;
    cur_test = "regression_8";
    fx_init(&f, 2, 2, MR_POLICY_SGLANG, 64, 16);
    x = fx_put(&f, k, 6, 0, NULL, NULL);
    CHECK_RC(mr_radix_lock(f.t, x), MR_OK);
    CHECK_MATCH(&f, k, 5, 0, 0, 4, 4, -1, &m);        /* split at 4 (5 -> 4 tokens) */
    up = mr_node_parent(x);
    CHECK(mr_node_len(up) == 4 && mr_node_len(x) == 2 && mr_node_key(x)[0] == 5);
    CHECK(mr_node_full_lock(up) == 1 && mr_node_state_lock(up) == 0);
    CHECK(mr_node_full_lock(x) == 1 && mr_node_state_lock(x) == 1);
    CHECK(stats_are(&f, 0, 6, 0, 1));
    y = fx_put(&f, k2, 6, 0, NULL, NULL);
    CHECK(mr_node_parent(y) == up);
    fx_put(&f, k3, 4, 0, NULL, NULL);                 /* splits up at 2 */
    CHECK_TREE(f.t);
    CHECK_EQ(mr_node_full_lock(mr_node_parent(up)), 1);
    CHECK_RC(mr_radix_unlock(f.t, x), MR_OK);
    CHECK(stats_are(&f, 10, 0, 3, 0));
    CHECK_MATCH(&f, k2, 6, 0, 6, 6, -1, mr_node_state(y), &m);
    CHECK_RC(mr_radix_evict_full(f.t, 1000, &f.rel, &tok, &sts), MR_OK);
    CHECK(tok == 10 && sts == 3);
    CHECK_EQ(fx_stats(&f).nodes, 0);
    CHECK_TREE(f.t);
    CHECK_OWNERSHIP(&f);
    fx_done(&f);
}

static void
run_regression(void)
{
    regression_1();
    regression_2();
    regression_3();
    regression_4();
    regression_5();
    regression_6();
    regression_7();
    regression_8();
}

/* ------------------------------------------------------------------------
 * Model-based fuzzing */

static uint64_t rng_state;

static uint32_t
rng_next(void *ctx)
{
    /* splitmix64 */
    uint64_t z;
    (void)ctx;
    z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return (uint32_t)((z ^ (z >> 31)) >> 16);
}

static const mr_radix_config fuzz_configs[] = {
    {1, 1, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0},
    {1, 4, MR_POLICY_CONSUMED, MR_SEMANTICS_V0515, 0, 0, 0},
    {2, 4, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0},
    {4, 2, MR_POLICY_CONSUMED, MR_SEMANTICS_V0515, 0, 0, 0},
    {1, 3, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0},
    {2, 2, MR_POLICY_CONSUMED, MR_SEMANTICS_V0515, 0, 0, 0},
    /* int32 KV indices (val32): evictions widen them for free_kv */
    {1, 1, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 1},
    {2, 4, MR_POLICY_CONSUMED, MR_SEMANTICS_V0515, 0, 0, 1},
};

static void
run_fuzz(uint64_t seed, long ops, int inject)
{
    size_t nc = sizeof fuzz_configs / sizeof fuzz_configs[0], i;
    nm_source src = {rng_next, NULL, NULL};
    for (i = 0; i < nc; i++) {
        nm_options o;
        nm_counts c;
        memset(&o, 0, sizeof o);
        o.cfg = fuzz_configs[i];
        o.max_ops = ops / (long)nc;
        o.corpus_seed = (uint32_t)(seed + i);
        /* Small pools keep eviction busy; large ones grow trees past the
         * first resize of the node registry (64 ids). */
        o.kv_pool = i % 2 ? 640 : 64 + 48 * o.cfg.page_size;
        o.state_pool = i % 2 ? 120 : 16;
        o.few_evictions = i % 2;
        o.inject_oom = inject;
        rng_state = seed * 1000003ULL + i;
        cur_test = inject ? "oom_fuzz" : "fuzz";
        n_checks++;
        memset(&c, 0, sizeof c);
        if (nm_run(&o, &src, &c) != 0) {
            fail_at(__FILE__, __LINE__, "model mismatch: config %zu (page %u chunk %u policy %d), "
                    "--seed %llu, after %ld ops", i, o.cfg.page_size, o.cfg.chunk_size,
                    (int)o.cfg.policy, (unsigned long long)seed, c.ops);
        }
        if (verbose) {
            printf("  page %u chunk %u policy %d: %ld ops: %ld inserts (%ld revived, %ld refused), "
                   "%ld matches, %ld splits, %ld/%ld locks/unlocks, %ld/%ld evict full/state, "
                   "%ld resets, %ld failed allocations, up to %ld nodes\n",
                   o.cfg.page_size, o.cfg.chunk_size, (int)o.cfg.policy, c.ops, c.inserts,
                   c.revived, c.einval, c.matches, c.splits, c.locks, c.unlocks, c.evict_full,
                   c.evict_state, c.resets, c.enomem, c.max_nodes);
        }
        /* The run must reach the cases it exists for. */
        if (c.ops >= 10000) {
            CHECK(c.splits > 0 && c.revived > 0 && c.locks > 0 && c.evict_full > 0 &&
                  c.evict_state > 0);
            CHECK(!inject || c.enomem > 0);
        }
    }
}

/* ------------------------------------------------------------------------
 * Out of memory */

#ifdef MR_FAULT_INJECT

#define OOM_MAX 10000

/* Repeats `op` with the n-th allocation failing, n = 1, 2, ... until it
 * succeeds; after each failure checks rc == MR_ENOMEM, the tree and `after`.
 * Returns the number of failures seen. */
#define OOM_LOOP(name, t, rc, op, after)                                 \
    do {                                                                \
        long n_;                                                        \
        for (n_ = 1; n_ < OOM_MAX; n_++) {                              \
            mr_fault_fail_at(n_);                                       \
            rc = (op);                                                  \
            mr_fault_fail_at(0);                                        \
            if (rc == MR_OK) {                                          \
                break;                                                  \
            }                                                           \
            if (rc != MR_ENOMEM) {                                      \
                fail_at(__FILE__, __LINE__, "%s: failing allocation %ld: %s", \
                        name, n_, mr_strerror(rc));                     \
                break;                                                  \
            }                                                           \
            if ((t) != NULL && !CHECK_TREE(t)) {                        \
                break;                                                  \
            }                                                           \
            after;                                                      \
        }                                                               \
        CHECK(n_ < OOM_MAX);                                            \
    } while (0)

static void
oom_units(void)
{
    fixture f;
    mr_radix *t = NULL;
    mr_radix_config cfg = {1, 4, MR_POLICY_SGLANG, MR_SEMANTICS_V0515, 0, 0, 0};
    int rc;
    int32_t k[12];
    int64_t val[12], dup[12], slot;
    mr_insert_result r;
    mr_match m;
    mr_radix_stats s0, s1;
    size_t tok, sts, i;
    char *buf;
    size_t blen;

    cur_test = "oom_new";
    OOM_LOOP("mr_radix_new", (mr_radix *)NULL, rc, mr_radix_new(&cfg, &t), (void)0);
    CHECK(rc == MR_OK && t != NULL);
    mr_radix_free(t);

    /* Inserts: new leaves under one node (child arrays and the id table
     * grow), and a split with a new leaf. */
    cur_test = "oom_insert";
    fx_init(&f, 1, 4, MR_POLICY_SGLANG, 512, 128);
    for (i = 0; i < 80; i++) {
        k[0] = 1;
        k[1] = (int32_t)i;
        k[2] = 5;
        for (int j = 0; j < 3; j++) {
            val[j] = pool_alloc(&f.kv);
        }
        slot = pool_alloc(&f.st);
        s0 = fx_stats(&f);
        OOM_LOOP("insert", f.t, rc, mr_radix_insert(f.t, k, val, 3, 0, slot, 0, dup, &r), {
            s1 = fx_stats(&f);
            CHECK_EQ(r.ndup, 0);
            CHECK(s1.full_evictable + s1.full_protected == s0.full_evictable + s0.full_protected);
            CHECK(s1.state_evictable == s0.state_evictable);
        });
        if (rc == MR_OK) {
            CHECK_EQ(r.prefix_len, i ? 1 : 0);
            CHECK_EQ(r.ndup, i ? 1 : 0);
            CHECK_EQ(r.state_existed, 0);
            if (i) {
                pool_free(&f.kv, val[0], OWN_CALLER);
            } else {
                f.kv.owner[val[0] - 1] = OWN_TREE;
            }
            f.kv.owner[val[1] - 1] = OWN_TREE;
            f.kv.owner[val[2] - 1] = OWN_TREE;
            f.st.owner[slot - 1] = OWN_TREE;
        }
        CHECK_TREE(f.t);
        CHECK_OWNERSHIP(&f);
    }
    CHECK_EQ(fx_stats(&f).nodes, 81);

    /* A match that splits: on failure the result describes the match
     * without the split part. */
    cur_test = "oom_match";
    {
        int32_t kk[12];
        seq(kk, 300, 12);
        fx_put(&f, kk, 12, 0, NULL, NULL);
        s0 = fx_stats(&f);
        OOM_LOOP("match", f.t, rc, mr_radix_match(f.t, kk, 10, 0, &m), {
            CHECK(m.prefix_len == 0 && m.kv_matched_len == 0 && m.branching_seqlen == -1 &&
                  m.node == mr_radix_root(f.t) && m.state == -1);
            CHECK_EQ(fx_stats(&f).nodes, s0.nodes);
        });
        CHECK(rc == MR_OK && m.prefix_len == 0 && m.kv_matched_len == 10 && m.branching_seqlen == 8);
        CHECK_EQ(fx_stats(&f).nodes, s0.nodes + 1);
        /* Below a node with a state: the usable prefix survives the failure. */
        fx_put(&f, kk, 4, 0, NULL, NULL);
        s0 = fx_stats(&f);
        OOM_LOOP("match", f.t, rc, mr_radix_match(f.t, kk, 6, 0, &m), {
            CHECK(m.prefix_len == 4 && m.kv_matched_len == 4 && m.branching_seqlen == -1);
            CHECK_EQ(fx_stats(&f).nodes, s0.nodes);
        });
        CHECK(rc == MR_OK && m.prefix_len == 4 && m.kv_matched_len == 6 && m.branching_seqlen == 4);

        /* An insert whose walk splits and then adds a leaf. */
        cur_test = "oom_insert_split";
        kk[8] = -1;
        for (i = 0; i < 12; i++) {
            val[i] = pool_alloc(&f.kv);
        }
        slot = pool_alloc(&f.st);
        s0 = fx_stats(&f);
        OOM_LOOP("insert", f.t, rc, mr_radix_insert(f.t, kk, val, 12, 0, slot, 0, dup, &r), {
            s1 = fx_stats(&f);
            CHECK_EQ(r.ndup, 0);
            CHECK(s1.full_evictable == s0.full_evictable && s1.state_evictable == s0.state_evictable);
        });
        CHECK(rc == MR_OK && r.prefix_len == 8 && r.ndup == 8 && r.state_existed == 0);
        if (rc == MR_OK) {
            for (i = 0; i < 8; i++) {
                pool_free(&f.kv, val[i], OWN_CALLER);
            }
            for (i = 8; i < 12; i++) {
                f.kv.owner[val[i] - 1] = OWN_TREE;
            }
            f.st.owner[slot - 1] = OWN_TREE;
        }
        CHECK_TREE(f.t);
        CHECK_OWNERSHIP(&f);
    }

    /* Locks, dumps and evictions: a failure releases nothing. */
    cur_test = "oom_lock";
    {
        mr_node *n = mr_radix_lru_first(f.t, 1);
        OOM_LOOP("lock", f.t, rc, mr_radix_lock(f.t, n), (void)0);
        OOM_LOOP("unlock", f.t, rc, mr_radix_unlock(f.t, n), (void)0);
        CHECK(stats_are(&f, fx_stats(&f).full_evictable, 0, fx_stats(&f).state_evictable, 0));
    }
    cur_test = "oom_dump";
    buf = NULL;
    OOM_LOOP("dump", f.t, rc, mr_radix_dump(f.t, &buf, &blen), (void)0);
    CHECK(rc == MR_OK && buf && strlen(buf) == blen);
    MR_FREE(buf);
    cur_test = "oom_evict";
    {
        long kv0 = f.kv_calls, st0 = f.st_calls;
        OOM_LOOP("evict_state", f.t, rc, mr_radix_evict_state(f.t, 30, &f.rel, &tok, &sts), {
            CHECK(f.kv_calls == kv0 && f.st_calls == st0);
        });
        CHECK_EQ(sts, 30);
        kv0 = f.kv_calls;
        st0 = f.st_calls;
        OOM_LOOP("evict_full", f.t, rc, mr_radix_evict_full(f.t, 1000000, &f.rel, &tok, &sts), {
            CHECK(f.kv_calls == kv0 && f.st_calls == st0);
        });
        CHECK_EQ(fx_stats(&f).nodes, 0);
    }
    CHECK_TREE(f.t);
    CHECK_OWNERSHIP(&f);
    CHECK_EQ(f.kv.nfree, f.kv.size);
    CHECK_EQ(f.st.nfree, f.st.size);
    fx_done(&f);

    /* The namespace table: a failed create leaves it as it was. */
    cur_test = "oom_namespace";
    {
        mr_nstable ns;
        int32_t id = 0, id2 = 0;
        mr_ns_init(&ns);
        for (int32_t j = 0; j < 40; j++) {
            OOM_LOOP("namespace", (mr_radix *)NULL, rc, mr_ns_lookup(&ns, (const char *)&j, sizeof(j), 1, &id), {
                CHECK(ns.n == j && mr_ns_lookup(&ns, (const char *)&j, sizeof(j), 0, &id2) == MR_OK && id2 == -1);
            });
            CHECK_EQ(id, j + 1);
        }
        mr_ns_free(&ns);
    }

    /* The fault injector itself: a failing allocation is seen. */
    cur_test = "oom_injector";
    mr_fault_fail_at(1);
    CHECK_RC(mr_radix_new(&cfg, &t), MR_ENOMEM);
    mr_fault_fail_at(0);
}

/* A keyed leaf order whose victim heap cannot be allocated scans for each
 * victim instead; the heap (kept across the one-leaf calls of SGLang's walk)
 * and the scan must pick the same victims, under both semantics (v0.5.15's
 * cascade through tombstones included).  Tree a never gets its heap, tree b
 * does; their dumps must agree after every eviction. */
static void
oom_leaf_heap(void)
{
    static const mr_lru_policy pols[] = {MR_POLICY_LFU,      MR_POLICY_FIFO, MR_POLICY_MRU, MR_POLICY_FILO,
                                         MR_POLICY_PRIORITY, MR_POLICY_SLRU, MR_POLICY_TLRU};
    for (size_t pi = 0; pi < sizeof(pols) / sizeof(pols[0]); pi++) {
        for (int sem = 0; sem < 2; sem++) {
            fixture f[2];
            mr_radix_config cfg = {1, 1, pols[pi], (mr_semantics)sem, 0, 0, 0};
            cur_test = "oom_leaf_heap";
            for (int w = 0; w < 2; w++) {
                fx_init(&f[w], 1, 1, pols[pi], 4096, 512);
                mr_radix_free(f[w].t);
                CHECK_RC(mr_radix_new(&cfg, &f[w].t), MR_OK);
            }
            rng_state = 77 + pi;
            for (int i = 0; i < 150; i++) {
                int32_t k[8];
                size_t len = 1 + rng_next(NULL) % 8;
                for (size_t j = 0; j < len; j++) {
                    k[j] = (int32_t)(rng_next(NULL) % 3);
                }
                mr_insert_opts io = {rng_next(NULL) % 2 ? len / 2 : 0, (int64_t)(rng_next(NULL) % 3), NULL, NULL};
                for (int w = 0; w < 2; w++) {
                    f[w].io = io;
                    CHECK_RC(fx_insert_pp(&f[w], k, len, 0, 0, NULL, NULL, NULL), MR_OK);
                }
                if (i % 4 == 0) {
                    mr_match m;
                    CHECK_RC(mr_radix_match(f[0].t, k, len / 2, 0, &m), MR_OK);
                    CHECK_RC(mr_radix_match(f[1].t, k, len / 2, 0, &m), MR_OK);
                }
            }
            while (fx_stats(&f[1]).nodes > 0) {
                size_t tok[2], sts[2];
                mr_fault_fail_at(1);
                int rc = mr_radix_evict_full(f[0].t, 1, &f[0].rel, &tok[0], &sts[0]);
                mr_fault_fail_at(0);
                CHECK_RC(rc, MR_OK);
                CHECK_RC(mr_radix_evict_full(f[1].t, 1, &f[1].rel, &tok[1], &sts[1]), MR_OK);
                CHECK(tok[0] == tok[1] && tok[1] > 0 && sts[0] == sts[1]);
                char *d[2];
                size_t n[2];
                CHECK_RC(mr_radix_dump(f[0].t, &d[0], &n[0]), MR_OK);
                CHECK_RC(mr_radix_dump(f[1].t, &d[1], &n[1]), MR_OK);
                int same = n[0] == n[1] && memcmp(d[0], d[1], n[0]) == 0;
                MR_FREE(d[0]);
                MR_FREE(d[1]);
                CHECK(same);
                if (!same || !CHECK_TREE(f[0].t) || !CHECK_TREE(f[1].t)) {
                    break;
                }
            }
            fx_done(&f[0]);
            fx_done(&f[1]);
        }
    }
}

#endif /* MR_FAULT_INJECT */

/* ------------------------------------------------------------------------
 * Main */

int
main(int argc, char **argv)
{
    int units = 0, regression = 0, fuzz = 0, oom = 0, i;
    uint64_t seed = 1234;
    long ops = 200000;
    clock_t t0 = clock();

    setvbuf(stdout, NULL, _IONBF, 0);

    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--units")) {
            units = 1;
        } else if (!strcmp(argv[i], "--regression")) {
            regression = 1;
        } else if (!strcmp(argv[i], "--fuzz")) {
            fuzz = 1;
        } else if (!strcmp(argv[i], "--oom")) {
            oom = 1;
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v")) {
            verbose = 1;
        } else if (!strcmp(argv[i], "--ops") && i + 1 < argc) {
            ops = strtol(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: %s [--units] [--regression] [--fuzz] [--oom] "
                    "[--seed N] [--ops N] [--verbose]\n", argv[0]);
            return 255;
        }
    }
    if (!units && !regression && !fuzz && !oom) {
        units = regression = fuzz = oom = 1;
    }
    if (units) {
        printf("units...\n");
        run_units();
    }
    if (regression) {
        printf("regression...\n");
        run_regression();
    }
    if (fuzz) {
        printf("fuzz: %ld ops, seed %llu...\n", ops, (unsigned long long)seed);
        run_fuzz(seed, ops, 0);
    }
    if (oom) {
#ifdef MR_FAULT_INJECT
        printf("oom...\n");
        oom_units();
        oom_leaf_heap();
        printf("oom fuzz: %ld ops, seed %llu...\n", ops, (unsigned long long)seed);
        run_fuzz(seed, ops, 1);
#else
        printf("oom: skipped (build with -DMR_FAULT_INJECT)\n");
#endif
    }
    printf("%ld checks, %d failed (%.1f s)\n", n_checks, n_errors,
           (double)(clock() - t0) / CLOCKS_PER_SEC);
    return n_errors > 255 ? 255 : n_errors;
}
