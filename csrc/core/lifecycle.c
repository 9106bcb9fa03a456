/* lifecycle.c - the request lifecycle over the tree and the pools
 * (lifecycle.h). */
#include "lifecycle.h"
#include "rules.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"

struct mr_lifecycle {
    mr_radix *tree;
    mr_slots *state;       /* borrowed; NULL: tree only */
    mr_kv *kv;             /* borrowed */
    mr_reqpool *rp;        /* borrowed */
    mr_lc_config cfg;
    mr_release rel;
    mr_lc_stats stats;
    /* scratch */
    int64_t *a;            /* KV indices of a row */
    int64_t *b;            /* duplicates / matched indices */
    size_t cap;
    /* collected releases (tree-only mode) */
    int64_t *rkv;
    size_t nrkv, caprkv;
    int64_t *rcut;         /* where each free call of rkv ends (SGLang's per node, tail, duplicates) */
    size_t nrcut, caprcut;
    int64_t *ends;         /* the last insert's duplicate runs (dup_runs) */
    size_t nends, capends;
    int64_t *rst;
    size_t nrst, caprst;
    int32_t *kb;           /* a request's int64 tokens narrowed (key_tail) */
    size_t capkb;
    int32_t *bk;           /* a batch call's tokens as int32 (batch_tokens) */
    size_t capbk;
    int rel_error;         /* first error a release hook hit */
    int64_t ext_available; /* tree-only: the caller's free state slots, -1 unknown */
    int64_t cached_len;    /* tokens the last cache call inserted (mr_lc_cached_len) */
    int counted;           /* tree-only: the pools are the counts below (mr_lc_count_pools) */
    mr_lc_counts cnt;
    mr_lc_victim_fn victim;   /* counted: an external policy's state victims (NULL: the tree's) */
    void *victim_ctx;
};

/* ------------------------------------------------------------------------
 * Helpers */

/* Makes *p (elements of `size` bytes, *cap of them) hold at least need,
 * doubling from 64. */
static int
grow_n(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap) {
        return MR_OK;
    }
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        c *= 2;
    }
    void *q = MR_REALLOC(*p, c * size);
    if (q == NULL) {
        return MR_ENOMEM;
    }
    *p = q;
    *cap = c;
    return MR_OK;
}

static int
grow(int64_t **p, size_t *cap, size_t need)
{
    return grow_n((void **)p, cap, need, sizeof(int64_t));
}

/* Makes both scratch buffers hold at least n entries. */
static int
scratch(mr_lifecycle *lc, size_t n)
{
    if (n <= lc->cap) {
        return MR_OK;
    }
    size_t c = lc->cap ? lc->cap : 256;
    while (c < n) {
        c *= 2;
    }
    int64_t *a = MR_REALLOC(lc->a, c * sizeof(int64_t));
    if (a == NULL) {
        return MR_ENOMEM;
    }
    lc->a = a;
    int64_t *b = MR_REALLOC(lc->b, c * sizeof(int64_t));
    if (b == NULL) {
        return MR_ENOMEM;
    }
    lc->b = b;
    lc->cap = c;
    return MR_OK;
}

/* Appends n KV indices to the collected array (room reserved): a tree
 * without values has none (idx is not read), so zeros stand for them. */
static void
copy_kv(mr_lifecycle *lc, const int64_t *idx, size_t n)
{
    if (lc->cfg.no_values || idx == NULL) {
        memset(lc->rkv + lc->nrkv, 0, n * sizeof(int64_t));
    }
    else {
        memcpy(lc->rkv + lc->nrkv, idx, n * sizeof(int64_t));
    }
    lc->nrkv += n;
}

/* Counted pools: KV goes back in whole pages (a request's tail ends
 * within its last page; a node's KV is whole pages). */
static void
count_kv_back(mr_lifecycle *lc, size_t n)
{
    int64_t page = (int64_t)lc->cfg.page_size;
    lc->cnt.kv_free += ((int64_t)n + page - 1) / page * page;
}

/* A node's KV back to the pools, as the tree keeps it (int32: with pools
 * the tree is val32). */
static int
free_kv32_hook(void *ctx, const int32_t *idx, size_t n)
{
    mr_lifecycle *lc = ctx;
    int rc = mr_kv_free_tree(lc->kv, idx, (int64_t)n);
    if (rc == MR_OK) {
        lc->stats.tokens_evicted += n;
    }
    return rc;
}

/* A node's KV without pools: counted, or collected for the caller (the
 * pools' is free_kv32_hook's). */
static int
free_kv_hook(void *ctx, const int64_t *idx, size_t n)
{
    mr_lifecycle *lc = ctx;
    if (lc->counted) {
        count_kv_back(lc, n);
        return MR_OK;
    }
    if (lc->kv == NULL) {
        /* room for the node's state too: free_state must not fail once
         * this node's KV is handed over (radix.h, mr_release) */
        if (grow(&lc->rkv, &lc->caprkv, lc->nrkv + n) != MR_OK
            || grow(&lc->rcut, &lc->caprcut, lc->nrcut + 1) != MR_OK
            || grow(&lc->rst, &lc->caprst, lc->nrst + 1) != MR_OK) {
            return MR_ENOMEM;
        }
        copy_kv(lc, idx, n);
        lc->rcut[lc->nrcut++] = (int64_t)lc->nrkv;   /* one free call per node, as SGLang's */
        return MR_OK;
    }
    return MR_ESTATE;   /* with pools the tree hands int32 KV to free_kv32_hook */
}

static int
free_state_hook(void *ctx, int64_t slot)
{
    mr_lifecycle *lc = ctx;
    if (lc->counted) {
        lc->cnt.slots_free++;
        return MR_OK;
    }
    if (lc->state == NULL) {
        if (grow(&lc->rst, &lc->caprst, lc->nrst + 1) != MR_OK) {
            return MR_ENOMEM;
        }
        lc->rst[lc->nrst++] = slot;
        return MR_OK;
    }
    int rc = mr_slots_free(lc->state, &slot, 1, MR_FROM_TREE, 0, NULL);
    if (rc == MR_OK) {
        lc->stats.states_evicted++;
    }
    return rc;
}

static int
has_pools(const mr_lifecycle *lc)
{
    return lc->state != NULL && lc->kv != NULL && lc->rp != NULL;
}

static int32_t
row_owner(int64_t row)
{
    return row >= 1 ? (int32_t)row : MR_OWNER_HELD;
}

/* keep index: the track slot holding the newest snapshot */
static int
keep_idx(const mr_lifecycle *lc, const mr_req *st)
{
    return mr_rule_keep_index(st->next_track, (int)lc->cfg.track_buffer_size, lc->cfg.lazy);
}

/* dst[0:n) = src[0:n), or zeros when src is NULL (a tree without values). */
static void
copy_or_zero(int64_t *dst, const int64_t *src, size_t n)
{
    if (src != NULL) {
        memcpy(dst, src, n * sizeof(int64_t));
    }
    else {
        memset(dst, 0, n * sizeof(int64_t));
    }
}

/* Frees a caller's KV indices: to the pool, or (tree-only) to the collected
 * arrays, for the caller's allocator.  Room is reserved first (reserve_out). */
static int
out_kv(mr_lifecycle *lc, const int64_t *idx, size_t n)
{
    if (n == 0) {
        return MR_OK;
    }
    if (lc->kv != NULL) {
        return mr_kv_free(lc->kv, idx, (int64_t)n, MR_FROM_CALLER, NULL);
    }
    if (lc->counted) {
        count_kv_back(lc, n);
        return MR_OK;
    }
    if (grow(&lc->rkv, &lc->caprkv, lc->nrkv + n) != MR_OK
        || grow(&lc->rcut, &lc->caprcut, lc->nrcut + 1) != MR_OK) {
        return MR_ENOMEM;
    }
    copy_kv(lc, idx, n);
    lc->rcut[lc->nrcut++] = (int64_t)lc->nrkv;   /* a free call of its own */
    return MR_OK;
}

/* Frees a caller's state slots (as out_kv). */
static int
out_slots(mr_lifecycle *lc, const int64_t *slots, size_t k)
{
    if (k == 0) {
        return MR_OK;
    }
    if (lc->state != NULL) {
        return mr_slots_free(lc->state, slots, (int64_t)k, MR_FROM_CALLER, 0, NULL);
    }
    if (lc->counted) {
        lc->cnt.slots_free += (int64_t)k;
        return MR_OK;
    }
    if (grow(&lc->rst, &lc->caprst, lc->nrst + k) != MR_OK) {
        return MR_ENOMEM;
    }
    memcpy(lc->rst + lc->nrst, slots, k * sizeof(int64_t));
    lc->nrst += k;
    return MR_OK;
}

/* Tree-only: room in the collected arrays for nkv more KV indices (in up
 * to two free calls) and nst more slots, so that a call can hand them out
 * after a change it cannot undo.  With pools: the KV allocator's scratch
 * for nkv. */
static int
reserve_out(mr_lifecycle *lc, size_t nkv, size_t nst)
{
    if (lc->kv != NULL) {
        return mr_kv_reserve(lc->kv, (int64_t)nkv);
    }
    if (grow(&lc->rkv, &lc->caprkv, lc->nrkv + nkv) != MR_OK
        || grow(&lc->rcut, &lc->caprcut, lc->nrcut + 2) != MR_OK
        || grow(&lc->rst, &lc->caprst, lc->nrst + nst) != MR_OK) {
        return MR_ENOMEM;
    }
    return MR_OK;
}

/* Room for the duplicate runs of an insert of len tokens (one per node
 * of its path at most), before the tree changes. */
static int
reserve_runs(mr_lifecycle *lc, size_t len)
{
    lc->nends = 0;
    return grow(&lc->ends, &lc->capends, len / lc->cfg.page_size + 2);
}

/* SGLang's _insert_helper frees an insert's duplicates with a call for
 * each node of the path they cross (the part of that node's tokens past
 * prev_prefix_len).  After the insert (res, len tokens), the nodes of the
 * path to prefix_len have the same boundaries (the partly matched one was
 * split there): the end of each run, counted from the first duplicate, is
 * written to lc->ends (ascending; room reserved by reserve_runs). */
static void
dup_runs(mr_lifecycle *lc, const mr_insert_result *res, size_t len)
{
    lc->nends = 0;
    if (res->ndup == 0) {
        return;
    }
    size_t pl = res->prefix_len, d0 = pl - res->ndup, k = 0, depth = pl;
    mr_node *top = pl < len ? mr_node_parent(res->node) : res->node;  /* the node ending at pl */
    for (mr_node *n = top; depth > d0; n = mr_node_parent(n)) {
        k++;
        depth -= mr_node_len(n);
    }
    depth = pl;
    mr_node *n = top;
    for (size_t i = k; i-- > 0; n = mr_node_parent(n)) {
        lc->ends[i] = (int64_t)(depth - d0);
        depth -= mr_node_len(n);
    }
    lc->nends = k;
}

/* frees a caller's state slot, ignoring -1 */
static int
free_slot(mr_lifecycle *lc, int64_t slot)
{
    if (slot < 0) {
        return MR_OK;
    }
    return out_slots(lc, &slot, 1);
}

/* syncs a row's maps when there are pools and a row */
static void
sync_row(mr_lifecycle *lc, int64_t row, const mr_req *st)
{
    if (lc->rp != NULL && row >= 1) {
        mr_reqpool_sync_maps(lc->rp, row, st);
    }
}

/* ------------------------------------------------------------------------
 * Lifetime */

/* The request's locked node when an insert of cache_len of its tokens may
 * start there (mr_insert_opts.from) without reading the tokens before it:
 * the node's path is the request's first protected_len tokens, matched
 * from them (a lock keeps the path in the tree), and the insert covers
 * it.  NULL otherwise: the insert walks from the root. */
static mr_node *
locked_path(mr_lifecycle *lc, const mr_req *st, size_t cache_len)
{
    mr_node *n = NULL;
    if (!st->locked || st->protected_len <= 0 || (size_t)st->protected_len > cache_len
        || mr_radix_resolve(lc->tree, st->last_node, &n) != MR_OK || n == mr_radix_root(lc->tree)) {
        return NULL;
    }
    return mr_radix_path_len(lc->tree, n) == (size_t)st->protected_len ? n : NULL;
}

int32_t
mr_lc_locked_ns(const mr_lifecycle *lc, const mr_req *st)
{
    mr_node *n = NULL;
    /* a lock on the root (a match that found nothing) is in no namespace */
    return st->locked && mr_radix_resolve(lc->tree, st->last_node, &n) == MR_OK && n != mr_radix_root(lc->tree)
               ? mr_node_namespace(n)
               : -1;
}

/* The request's lock, checked before a cache call changes anything: a
 * stale handle (MR_ESTALE: the call could not drop it after its insert), or
 * a node of another namespace than ns (MR_EINVAL: its cached prefix is that
 * namespace's, so caching it under ns would give the tree's own KV to a
 * second path).  MR_OK when it holds none. */
static int
lock_check(const mr_lifecycle *lc, const mr_req *st, int32_t ns)
{
    mr_node *n = NULL;
    if (!st->locked) {
        return MR_OK;
    }
    int rc = mr_radix_resolve(lc->tree, st->last_node, &n);
    if (rc != MR_OK) {
        return rc;
    }
    /* (the root, a miss's lock, is in no namespace: mr_lc_locked_ns) */
    return n == mr_radix_root(lc->tree) || mr_node_namespace(n) == ns ? MR_OK : MR_EINVAL;
}

/* lock_check for each row's request with its entry's namespace (ns NULL:
 * 0), or its refusal with bad[0] = the entry. */
static int
batch_lock_check(const mr_lifecycle *lc, size_t n, const int64_t *rows, const int32_t *ns, int64_t *bad)
{
    for (size_t i = 0; i < n; i++) {
        int rc = lock_check(lc, &lc->rp->req[rows[i]], ns ? ns[i] : 0);
        if (rc != MR_OK) {
            bad[0] = (int64_t)i;
            return rc;
        }
    }
    return MR_OK;
}

/* The first position in [from, len) of k64 outside int32, or -1 (one
 * branch-free pass when all fit). */
static int64_t
misfit_at(const int64_t *k64, size_t from, size_t len)
{
    if (mr_fits_i32(k64 + from, len - from)) {
        return -1;
    }
    for (size_t i = from; i < len; i++) {
        if (k64[i] < INT32_MIN || k64[i] > INT32_MAX) {
            return (int64_t)i;
        }
    }
    return -1;
}

/* A request's tokens [from, len) as int32: tokens itself, or tokens64's
 * narrowed into lc->kb at the same positions (kb[0:from) is not written:
 * an insert from a locked node does not read it).  MR_EINVAL, *bad the
 * position, for a token outside int32 (nothing changed). */
static int
key_tail(mr_lifecycle *lc, const int32_t *tokens, const int64_t *tokens64, size_t from, size_t len,
         const int32_t **out, int64_t *bad)
{
    if (tokens64 == NULL) {
        *out = tokens;
        return MR_OK;
    }
#ifdef MR_VERIFY_TRUSTED
    from = 0;   /* the whole key, for the insert's check of the caller's path */
#endif
    if (grow_n((void **)&lc->kb, &lc->capkb, len, sizeof(int32_t)) != MR_OK) {
        return MR_ENOMEM;
    }
    /* checked as it is narrowed: one pass over the (usually cold) key */
    if (from < len && mr_narrow_i32(tokens64 + from, len - from, lc->kb + from)) {
        *bad = misfit_at(tokens64, from, len);
        return MR_EINVAL;
    }
    *bad = -1;
    *out = lc->kb;
    return MR_OK;
}

int
mr_lc_new(const mr_lc_config *cfg, mr_slots *state, mr_kv *kv, mr_reqpool *rp, mr_lifecycle **out)
{
    int with = state != NULL || kv != NULL || rp != NULL;
    if (with && (state == NULL || kv == NULL || rp == NULL)) {
        return MR_EINVAL;
    }
    if ((cfg->track_buffer_size != 1 && cfg->track_buffer_size != 2) || cfg->track_interval < 1
        || (cfg->lazy && (!cfg->extra_buffer || cfg->track_buffer_size != 2))) {
        return MR_EINVAL;
    }
    if (with && cfg->no_values) {
        return MR_EINVAL;   /* pools own KV indices: the tree must keep them */
    }
    if (with && ((uint32_t)kv->page_size != cfg->page_size || rp->pp != cfg->track_buffer_size
                 || (!cfg->extra_buffer && cfg->page_size != 1) || !mr_kv_fits_table(kv))) {
        return MR_EINVAL;   /* mr_kv_fits_table: the rows hold KV indices unchecked (mr_reqpool_write_trusted) */
    }
    mr_lifecycle *lc = MR_CALLOC(1, sizeof(*lc));
    if (lc == NULL) {
        return MR_ENOMEM;
    }
    mr_radix_config rc = {.page_size = cfg->page_size, .chunk_size = cfg->chunk_size, .policy = cfg->policy,
                          .semantics = cfg->semantics, .no_values = cfg->no_values != 0,
                          .val32 = with};   /* KV indices that fit the int32 rows */
    int err = mr_radix_new(&rc, &lc->tree);
    if (err == MR_OK && (err = mr_radix_set_options(lc->tree, &cfg->tree)) != MR_OK) {
        mr_radix_free(lc->tree);
    }
    if (err != MR_OK) {
        MR_FREE(lc);
        return err;
    }
    lc->state = state;
    lc->kv = kv;
    lc->rp = rp;
    lc->cfg = *cfg;
    lc->rel.free_kv = free_kv_hook;
    lc->rel.free_kv32 = with ? free_kv32_hook : NULL;
    lc->rel.free_state = free_state_hook;
    lc->rel.ctx = lc;
    lc->ext_available = -1;
    *out = lc;
    return MR_OK;
}

void
mr_lc_free(mr_lifecycle *lc)
{
    if (lc == NULL) {
        return;
    }
    mr_radix_free(lc->tree);
    MR_FREE(lc->a);
    MR_FREE(lc->b);
    MR_FREE(lc->rkv);
    MR_FREE(lc->rcut);
    MR_FREE(lc->ends);
    MR_FREE(lc->rst);
    MR_FREE(lc->kb);
    MR_FREE(lc->bk);
    MR_FREE(lc);
}

mr_radix *mr_lc_tree(mr_lifecycle *lc) { return lc->tree; }
const mr_lc_config *mr_lc_config_of(const mr_lifecycle *lc) { return &lc->cfg; }
const mr_lc_stats *mr_lc_stats_of(const mr_lifecycle *lc) { return &lc->stats; }

void
mr_lc_reset(mr_lifecycle *lc)
{
    if (lc->counted) {
        /* what the tree held goes back to the counts */
        mr_radix_stats s;
        mr_radix_get_stats(lc->tree, &s);
        lc->cnt.kv_free += (int64_t)(s.full_evictable + s.full_protected);
        lc->cnt.slots_free += (int64_t)(s.state_evictable + s.state_protected);
    }
    mr_radix_reset(lc->tree);
    lc->nrkv = lc->nrst = lc->nrcut = 0;
}

const mr_release *
mr_lc_release_hooks(mr_lifecycle *lc)
{
    return &lc->rel;
}

void
mr_lc_take_released(mr_lifecycle *lc, const int64_t **kv, size_t *nkv, const int64_t **states,
                    size_t *nstates)
{
    *kv = lc->rkv;
    *nkv = lc->nrkv;
    *states = lc->rst;
    *nstates = lc->nrst;
}

void
mr_lc_insert_runs(const mr_lifecycle *lc, const int64_t **ends, size_t *n)
{
    *ends = lc->ends;
    *n = lc->nends;
}

void
mr_lc_take_released_calls(mr_lifecycle *lc, const int64_t **ends, size_t *n)
{
    *ends = lc->rcut;
    *n = lc->nrcut;
}

void
mr_lc_clear_released(mr_lifecycle *lc)
{
    lc->nrkv = lc->nrst = lc->nrcut = 0;
}

int64_t
mr_lc_cached_len(const mr_lifecycle *lc)
{
    return lc->cached_len;
}

void
mr_lc_set_state_available(mr_lifecycle *lc, int64_t n)
{
    lc->ext_available = n < 0 ? -1 : n;
}

/* ------------------------------------------------------------------------
 * Tree operations with ownership */

static int lc_insert(mr_lifecycle *lc, const int32_t *key, const int64_t *val, size_t len, int32_t ns,
                     int64_t state, size_t prev_prefix_len, int64_t *dup_out, mr_insert_result *out,
                     int trim, int64_t *bad, size_t mine, const int64_t *tail, size_t ntail, const mr_node *from,
                     const int32_t *row);

int
mr_lc_insert(mr_lifecycle *lc, const int32_t *key, const int64_t *val, size_t len, int32_t ns,
             int64_t state, size_t prev_prefix_len, int64_t *dup_out, mr_insert_result *out, int64_t *bad)
{
    int32_t o = 0;
    if (!has_pools(lc) || mr_slots_owner(lc->state, state, &o) != MR_OK) {
        o = 0;
    }
    int rc = lc_insert(lc, key, val, len, ns, state, prev_prefix_len, dup_out, out, 1, bad, SIZE_MAX, NULL, 0, NULL,
                       NULL);
    /* a slot a bound row's record names, given to the tree by a caller (not
     * by the request calls, whose records let go of it): the record keeps
     * naming it, as SGLang's Req does (Q2) */
    if (rc == MR_OK && !out->state_existed && o >= 1 && o <= lc->rp->size && (lc->rp->bound[o] & MR_ROW_BOUND)) {
        mr_req rec;
        mr_reqpool_load(lc->rp, o, &rec);
        lc->rp->bound[o] |= (uint8_t)((rec.running == state ? MR_ROW_GAVE_RUNNING : 0)
                                      | (rec.track[0] == state ? MR_ROW_GAVE_TRACK0 : 0)
                                      | (rec.track[1] == state ? MR_ROW_GAVE_TRACK1 : 0));
    }
    return rc;
}

/* The per-path budget for the node a request's insertion ended at, once the
 * request's own lock no longer holds the state the new one supersedes. */
static int
trim_inserted(mr_lifecycle *lc, mr_handle h)
{
    mr_node *n = NULL;
    if (mr_radix_resolve(lc->tree, h, &n) != MR_OK) {
        return MR_OK;   /* evicted meanwhile: nothing to trim */
    }
    return mr_radix_trim_path(lc->tree, n, &lc->rel, NULL);
}

/* The tree's own prefix of an insert: cached, and within the caller's
 * locked prefix (prev_prefix_len).  SGLang reads nothing of the value
 * before it: an insert stores value[prefix_len:] and frees
 * value[min(prev_prefix_len, prefix_len):prefix_len], so only that part is
 * checked (and, in the request calls, read from the table).  No walk when
 * prev_prefix_len is 0. */
static size_t
own_prefix(mr_lifecycle *lc, const int32_t *key, size_t len, int32_t ns, size_t prev_prefix_len)
{
    if (prev_prefix_len == 0) {
        return 0;
    }
    size_t n = mr_radix_cached_len(lc->tree, key, len, ns);
    return n < prev_prefix_len ? n : prev_prefix_len;
}

/* Where an insert's check starts: own_prefix rounded down to a page (a
 * page's indices are checked together: its block starts on a page
 * boundary of the key). */
static size_t
check_from(const mr_lifecycle *lc, size_t mine)
{
    return mine / lc->cfg.page_size * lc->cfg.page_size;
}

/* Why an insert refuses KV index val[i] (page pg, owner o, which is not a
 * request row): MR_OK when it is the caller's. */
static int
kv_refusal(const mr_kv *kv, int32_t o, int64_t pg, int grp, size_t i, size_t mine)
{
    if (o == MR_OWNER_FREE || o == MR_OWNER_RESERVED || o == MR_OWNER_PENDING) {
        return MR_ENOENT;  /* a KV index nobody holds */
    }
    if (o == MR_OWNER_TREE) {
        return i >= mine ? MR_EBUSY : MR_OK;  /* the tree's own past its prefix */
    }
    if (grp && o == MR_OWNER_HELD && mr_slots_in_alloc_group(&kv->pages, pg)) {
        return MR_EBUSY;   /* an alloc group's, not handed out */
    }
    return MR_OK;
}

/* Gives k units from position `from` back to `expect` after a claim:
 * val's, or row's when the insert reads the row in place (lc_insert). */
static void
unclaim_units(mr_lifecycle *lc, const int64_t *val, const int32_t *row, size_t from, int64_t k, int32_t expect)
{
    if (row != NULL) {
        mr_slots_unclaim32(&lc->kv->pages, row + from, k, expect, MR_OWNER_TREE);
    }
    else {
        mr_slots_unclaim(&lc->kv->pages, val + from, k, expect, MR_OWNER_TREE);
    }
}

/* tail[0:ntail) (with pools): the caller's KV past what it caches, freed
 * once the tree has changed, in a call of its own before the duplicates
 * (cache_finished_req frees its tail before it inserts).  from: NULL or
 * the request's locked_path (the walk starts there).  row: NULL, or (with
 * pools and page size 1) the values as the request's row holds them,
 * int32, read in place: val is then room for len values, written (widened
 * from the row) only when the insert takes the checking pass below. */
static int
lc_insert(mr_lifecycle *lc, const int32_t *key, const int64_t *val, size_t len, int32_t ns,
          int64_t state, size_t prev_prefix_len, int64_t *dup_out, mr_insert_result *out, int trim,
          int64_t *bad, size_t mine, const int64_t *tail, size_t ntail, const mr_node *from, const int32_t *row)
{
    mr_insert_opts opts = {0, 0, from, NULL};
    int rc;
    int64_t bad_local;
    if (bad == NULL) {
        bad = &bad_local;
    }
    *bad = -1;
    if (!has_pools(lc)) {
        if ((rc = reserve_runs(lc, len)) != MR_OK) {
            return rc;
        }
        rc = mr_radix_insert_ex(lc->tree, key, val, len, ns, state, prev_prefix_len, &opts, dup_out, out);
        if (rc == MR_OK) {
            dup_runs(lc, out, len);
        }
        return rc;
    }
    /* 1. validate before the tree changes (a refused insert changes
     *    nothing): the state must be a caller's slot, each KV index the
     *    insert stores or frees (value[mine:], own_prefix) a caller's,
     *    listed once */
    int32_t o = 0;
    if (mr_slots_owner(lc->state, state, &o) != MR_OK || state < 1) {
        return MR_EINVAL;
    }
    if (!(o == MR_OWNER_HELD || o >= 1)) {
        return o == MR_OWNER_FREE || o == MR_OWNER_PENDING ? MR_ENOENT : MR_EBUSY;
    }
    if (mine == SIZE_MAX) {
        mine = own_prefix(lc, key, len, ns, prev_prefix_len);
    }
    const int64_t ps = lc->kv->page_size, np = lc->kv->pages.n;
    const int32_t *owner = lc->kv->pages.owner;
    const mr_slots *pages = &lc->kv->pages;
    const int grp = pages->group_active && pages->group_pos < pages->group_len;
    /* ps == 1 and every index the insert takes owned by one caller (a
     * request row, whose table past the tree's prefix is its own, Q6; or
     * HELD outside an alloc group): checked and claimed for the tree in one
     * pass over the owners, without stamps (an index listed twice is the
     * tree's at its second listing).  Anything else is given back and takes
     * the pass below, which classifies the refusal and names the index. */
    int64_t claimed = -1;
    int32_t expect = 0;
    if (ps == 1 && mine < len) {
        const int64_t u0 = row != NULL ? row[mine] : val[mine];
        const int32_t o0 = (uint64_t)u0 - 1 < (uint64_t)np ? owner[u0] : MR_OWNER_FREE;
        if (o0 >= 1 || (o0 == MR_OWNER_HELD && !grp)) {
            expect = o0;
            const int64_t k = (int64_t)(len - mine);
            claimed = row != NULL ? mr_slots_claim32(&lc->kv->pages, row + mine, k, expect, MR_OWNER_TREE)
                                  : mr_slots_claim(&lc->kv->pages, val + mine, k, expect, MR_OWNER_TREE);
            if (claimed < k) {
                unclaim_units(lc, val, row, mine, claimed, expect);
                claimed = -1;
            }
        }
    }
    if (row != NULL && claimed < 0) {
        /* the checking pass reads int64 values: the row's, widened */
        int64_t *wide = (int64_t *)val;
        for (size_t i = check_from(lc, mine); i < len; i++) {
            wide[i] = row[i];
        }
        row = NULL;
    }
    opts.val32 = row;   /* claimed in place: the insert stores the row's values as they are */
    /* each index (page) listed once, checked in the same pass: each page is
     * stamped with this call's generation (mr_kv_stamp_begin) */
    uint16_t gen = 0;
    if (claimed < 0 && (rc = mr_kv_stamp_begin(lc->kv, &gen)) != MR_OK) {
        return rc;   /* a claimed insert needs no stamps (nor their table) */
    }
    int64_t again = -1, held = 0;   /* held: HELD units in val[mine:len), ps == 1 */
    uint16_t *const stamp = lc->kv->stamp;
    const uint16_t g = gen;   /* not reloaded after each stamp store */
    if (claimed >= 0) {
        /* checked and claimed above */
    }
    else if (ps == 1) {
        /* each token its own page: one test per index for the common case
         * (a request's, or a caller's HELD one outside an alloc group), the
         * rest classified by kv_refusal.  The counts stay in registers: the
         * pass waits on the cold key, owners and stamps, not on arithmetic */
        const int32_t pass_held = grp ? 1 : MR_OWNER_HELD;   /* 1: no owner below 1 passes */
        int64_t nheld = 0;
        for (size_t i = mine; i < len; i++) {
            int64_t u = val[i];
            if (MR_UNLIKELY((uint64_t)u > (uint64_t)np)) {
                *bad = (int64_t)i;
                return MR_EINVAL;
            }
            int32_t ou = owner[u];
            if (MR_UNLIKELY(ou < 1 && ou != pass_held)) {
                rc = kv_refusal(lc->kv, ou, u, grp, i, mine);
                if (rc != MR_OK) {
                    *bad = (int64_t)i;
                    return rc;
                }
            }
            nheld += ou == MR_OWNER_HELD;   /* past mine, kv_refusal accepts HELD only */
            if (MR_UNLIKELY(stamp[u] == g) && again < 0) {
                again = (int64_t)i;   /* a page seen is listed again */
            }
            stamp[u] = g;
        }
        held = nheld;
    }
    else {
        /* pages of a power-of-two size by a shift (a division costs more
         * than the rest of this pass) */
        const int shift = (ps & (ps - 1)) == 0 ? __builtin_ctzll((unsigned long long)ps) : -1;
        int64_t in_block = 0;
        for (size_t i = check_from(lc, mine); i < len; i++) {
            int64_t pg = shift >= 0 ? val[i] >> shift : val[i] / ps;
            if (val[i] < 0 || pg > np) {
                *bad = (int64_t)i;
                return MR_EINVAL;
            }
            rc = owner[pg] >= 1 ? MR_OK : kv_refusal(lc->kv, owner[pg], pg, grp, i, mine);
            if (rc != MR_OK) {
                *bad = (int64_t)i;
                return rc;
            }
            if (mr_kv_stamp_page(lc->kv, gen, val, (int64_t)i, (int64_t)i - in_block, pg) && again < 0) {
                again = (int64_t)i;
            }
            if (++in_block == ps) {
                in_block = 0;
            }
        }
    }
    /* an index listed twice past the tree's prefix would be freed twice (a
     * duplicate) or stored twice.  A page boundary before `mine` may have
     * started the pass above early: a repeat found there is looked for
     * again past the tree's own prefix only (SGLang ignores what comes
     * before it). */
    if (again >= 0) {
        int64_t at = -1;
        rc = mine < len ? mr_kv_distinct(lc->kv, val + mine, (int64_t)(len - mine), (int64_t)mine, &at) : MR_OK;
        if (rc == MR_EINVAL) {
            *bad = (int64_t)mine + at;
        }
        if (rc != MR_OK) {
            return rc;
        }
    }
    rc = scratch(lc, len);
    if (rc == MR_OK) {
        rc = mr_kv_reserve(lc->kv, (int64_t)len);  /* steps 2 and 3 cannot fail then */
    }
    if (rc == MR_OK && ps > 1) {
        rc = reserve_runs(lc, len);
    }
    int64_t *dup = dup_out != NULL ? dup_out : lc->b;
    if (rc == MR_OK) {
        rc = mr_radix_insert_ex(lc->tree, key, val, len, ns, state, prev_prefix_len, &opts, dup, out);
    }
    if (rc != MR_OK) {
        if (claimed >= 0) {
            unclaim_units(lc, val, row, mine, claimed, expect);
        }
        return rc;
    }
    /* 2. the tree owns the new tokens and the state now.  The new tokens
     * and the duplicates are val[min(prev_prefix_len, prefix_len):], which
     * step 1 checked (the caller's, each once): with page size 1 they move
     * without a second check */
    size_t pl = out->prefix_len;
    /* ps == 1: the HELD units among the new tokens val[pl:len) and among
     * the duplicates val[mine:pl) (SGLang's value[prev_prefix_len:
     * prefix_len], mine being its min with the tree's prefix), from the
     * check's count over val[mine:len) and one pass over the shorter part */
    int64_t held_new = 0;
    const int counted = ps == 1 && pl >= mine && out->ndup == pl - mine;
    if (claimed >= 0) {
        /* the tree keeps val[pl:len) as claimed; val[mine:pl) (the
         * duplicates, freed below) goes back to the caller first */
        size_t from_new = pl > mine ? pl : mine;
        if (pl > mine) {
            unclaim_units(lc, val, row, mine, (int64_t)(pl - mine), expect);
        }
        else if (pl < mine) {
            int64_t *wide = (int64_t *)val;   /* room for len values (see row above) */
            for (size_t i = pl; i < mine && row != NULL; i++) {
                wide[i] = row[i];
            }
            mr_slots_transfer_checked(&lc->kv->pages, val + pl, (int64_t)(mine - pl), MR_OWNER_TREE);
        }
        held = expect == MR_OWNER_HELD ? (int64_t)(len - mine) : 0;
        held_new = expect == MR_OWNER_HELD ? (int64_t)(len - from_new) : 0;
    }
    else if (ps == 1) {
        if (!counted || len - pl <= pl - mine) {
            for (size_t i = pl; i < len; i++) {
                held_new += owner[val[i]] == MR_OWNER_HELD;
            }
        }
        else {
            held_new = held;
            for (size_t i = mine; i < pl; i++) {
                held_new -= owner[val[i]] == MR_OWNER_HELD;
            }
        }
    }
    if (claimed >= 0) {
        /* moved when claimed */
    }
    else if (len > pl && ps == 1) {
        mr_slots_transfer_counted(&lc->kv->pages, val + pl, (int64_t)(len - pl), MR_OWNER_TREE, held_new);
    }
    else if (len > pl) {
        rc = mr_kv_transfer(lc->kv, val + pl, (int64_t)(len - pl), MR_FROM_CALLER, MR_OWNER_TREE, NULL);
        if (rc != MR_OK) {
            return rc;
        }
    }
    if (!out->state_existed) {
        rc = mr_slots_transfer(lc->state, &state, 1, MR_FROM_CALLER, MR_OWNER_TREE, NULL);
        if (rc != MR_OK) {
            return rc;
        }
        lc->stats.donated++;
    }
    /* 3. the caller's tail, then its duplicates, go back to the pool */
    if (ntail > 0 && (rc = mr_kv_free(lc->kv, tail, (int64_t)ntail, MR_FROM_CALLER, NULL)) != MR_OK) {
        return rc;
    }
    if (out->ndup > 0 && ps == 1) {
        /* tokens are appended to the free list: one call frees as SGLang's calls do */
        if (counted) {
            mr_slots_free_counted(&lc->kv->pages, dup, (int64_t)out->ndup, held - held_new);
        }
        else {
            mr_slots_free_checked(&lc->kv->pages, dup, (int64_t)out->ndup);
        }
    }
    else if (out->ndup > 0) {
        /* pages go, sorted, to the head of the free list: SGLang's calls, one per node */
        dup_runs(lc, out, len);
        for (size_t i = 0, from = 0; i < lc->nends && rc == MR_OK; from = (size_t)lc->ends[i++]) {
            rc = mr_kv_free(lc->kv, dup + from, lc->ends[i] - (int64_t)from, MR_FROM_CALLER, NULL);
        }
    }
    /* 4. the per-path state budget */
    if (rc == MR_OK && trim && !out->state_existed) {
        rc = mr_radix_trim_path(lc->tree, out->node, &lc->rel, NULL);
    }
    return rc;
}

int
mr_lc_evict(mr_lifecycle *lc, size_t num_tokens, size_t num_states, size_t *tokens_out,
            size_t *states_out)
{
    return mr_lc_evict_protected(lc, num_tokens, num_states, NULL, tokens_out, states_out);
}

int
mr_lc_evict_protected(mr_lifecycle *lc, size_t num_tokens, size_t num_states, mr_node *protect,
                      size_t *tokens_out, size_t *states_out)
{
    size_t t1 = 0, s1 = 0, t2 = 0, s2 = 0;
    int rc = MR_OK;
    /* inc_lock_ref(protect) for the eviction's length: its state and the
     * KV of its path are not evictable meanwhile */
    if (protect != NULL && (rc = mr_radix_lock(lc->tree, protect)) != MR_OK) {
        return rc;
    }
    if (num_tokens > 0) {
        rc = mr_radix_evict_full(lc->tree, num_tokens, &lc->rel, &t1, &s1);
    }
    if (rc == MR_OK && num_states > 0) {
        rc = mr_radix_evict_state(lc->tree, num_states, &lc->rel, &t2, &s2);
    }
    if (protect != NULL) {
        (void)mr_radix_unlock(lc->tree, protect);
    }
    if (tokens_out != NULL) {
        *tokens_out = t1 + t2;
    }
    if (states_out != NULL) {
        *states_out = s1 + s2;
    }
    return rc;
}

int
mr_lc_alloc_state(mr_lifecycle *lc, int32_t owner, mr_node *protect, int64_t *out)
{
    if (lc->state == NULL) {
        return MR_ESTATE;
    }
    /* a request row of the pool, or HELD */
    if (owner != MR_OWNER_HELD && (owner < 1 || lc->rp == NULL || owner > lc->rp->size)) {
        return MR_EINVAL;
    }
    int rc = mr_slots_alloc(lc->state, 1, owner, out);
    if (rc != MR_ENOSPC) {
        return rc;
    }
    rc = mr_lc_evict_protected(lc, 0, 1, protect, NULL, NULL);
    if (rc != MR_OK) {
        return rc;
    }
    return mr_slots_alloc(lc->state, 1, owner, out);
}

/* ------------------------------------------------------------------------
 * Match */

/* SGLang's copy-on-write at a hit (match_prefix with cow_mamba), once the
 * request has its running slot: the slot gets a copy of the node's state
 * before the forward, so it needs no clear. */
static void
record_cow(mr_lifecycle *lc, mr_req *st, int64_t state)
{
    st->cow_src = state;
    st->needs_clear = 0;
    lc->stats.cow++;
}

/* mr_lc_match, its walk started at `from` (NULL: the root; else a node
 * with a state whose path the caller vouches is the key's start:
 * mr_radix_match_key_from). */
static int
lc_match_from(mr_lifecycle *lc, mr_node *from, const mr_key *key, int32_t ns, int cow, mr_req *st, int32_t owner,
              mr_match *m, int64_t *indices)
{
    const int32_t *k32 = key->width == 4 ? key->p : NULL;
    const int64_t *k64 = key->width == 8 ? key->p : NULL;
    int rc = mr_radix_match_key_from(lc->tree, from, k32, k64, key->len, ns, m);
    if (rc != MR_OK && rc != MR_ENOMEM) {
        return rc;
    }
    if (indices != NULL) {
        (void)mr_radix_path_values(lc->tree, m->node, indices);
    }
    if (rc != MR_OK) {
        return rc;
    }
    if (cow && m->state >= 0 && st != NULL) {
        if (st->running < 0) {
            int64_t slot = -1;
            rc = mr_lc_alloc_state(lc, owner, m->node, &slot);
            if (rc != MR_OK) {
                return rc;
            }
            st->running = slot;
            sync_row(lc, owner, st);  /* a request with a row: its map follows */
        }
        record_cow(lc, st, m->state);
    }
    return MR_OK;
}

int
mr_lc_match(mr_lifecycle *lc, const mr_key *key, int32_t ns, int cow, mr_req *st, int32_t owner, mr_match *m,
            int64_t *indices)
{
    return lc_match_from(lc, NULL, key, ns, cow, st, owner, m, indices);
}

int
mr_lc_cow_ext(mr_lifecycle *lc, mr_req *st, const mr_node *node, int64_t fresh, int *need)
{
    *need = 0;
    if (has_pools(lc)) {
        return MR_ESTATE;
    }
    int64_t state = mr_node_state(node);
    int wants_slot = state >= 0 && st->running < 0;
    if (fresh >= 1 && !wants_slot) {
        return MR_EINVAL;   /* a slot the rule does not take: the caller keeps it */
    }
    if (state < 0) {
        return MR_OK;
    }
    if (wants_slot) {
        if (fresh < 1 && lc->counted) {
            /* the node is kept while a state is evicted for the slot */
            int rc = mr_lc_count_slot(lc, (mr_node *)node, &fresh);
            if (rc != MR_OK) {
                return rc;
            }
        }
        if (fresh < 1) {
            *need = 1;
            return MR_OK;
        }
        st->running = fresh;
    }
    record_cow(lc, st, state);
    return MR_OK;
}

/* ------------------------------------------------------------------------
 * Admission */

/* HybridReqToTokenPool.alloc's slots for one request: a running slot if it
 * has none (a fresh one needs a clear unless a copy-on-write fills it) and,
 * with extra_buffer, its ping-pong track buffer if it has none (one slot in
 * lazy mode, track_buffer_size otherwise).  admit_wants counts them;
 * admit_give hands them out from fresh[], in that order. */
static int64_t
admit_wants(const mr_lifecycle *lc, const mr_req *st)
{
    const mr_lc_config *c = &lc->cfg;
    int64_t n = st->running < 0;
    if (c->extra_buffer && st->next_track < 0) {
        n += c->lazy ? 1 : c->track_buffer_size;
    }
    return n;
}

static void
admit_give(mr_lifecycle *lc, mr_req *st, const int64_t *fresh)
{
    const mr_lc_config *c = &lc->cfg;
    size_t k = 0;
    if (st->running < 0) {
        st->running = fresh[k++];
        st->needs_clear = 1;
        lc->stats.clears++;
    }
    if (c->extra_buffer && st->next_track < 0) {
        int64_t nbuf = c->lazy ? 1 : c->track_buffer_size;
        st->track[0] = fresh[k++];
        st->track[1] = nbuf > 1 ? fresh[k++] : -1;
        st->next_track = 0;
    }
}

int
mr_lc_admit_ext(mr_lifecycle *lc, mr_req *st, const int64_t *fresh, size_t nfresh, int64_t *need)
{
    if (has_pools(lc)) {
        return MR_ESTATE;
    }
    int64_t want = admit_wants(lc, st);
    *need = want;
    if (nfresh == 0) {
        return MR_OK;
    }
    if ((int64_t)nfresh != want) {
        return MR_EINVAL;
    }
    for (size_t i = 0; i < nfresh; i++) {
        int bad = fresh[i] < 1 || fresh[i] == st->running || fresh[i] == st->track[0] || fresh[i] == st->track[1];
        for (size_t j = 0; j < i; j++) {
            bad |= fresh[j] == fresh[i];
        }
        if (bad) {
            return MR_EINVAL;
        }
    }
    admit_give(lc, st, fresh);
    *need = 0;
    return MR_OK;
}

int
mr_lc_admit_ids(mr_lifecycle *lc, mr_req *st, int64_t first, int64_t *used)
{
    *used = 0;
    if (has_pools(lc)) {
        return MR_ESTATE;
    }
    int64_t want = admit_wants(lc, st);
    if (want == 0) {
        return MR_OK;
    }
    if (first < 1 && lc->counted) {
        first = lc->cnt.last_id + 1;    /* ids past every one handed out */
        if (first <= INT64_MAX - want) {
            lc->cnt.last_id += want;
        }
    }
    if (first < 1 || first > INT64_MAX - want) {
        return MR_EINVAL;
    }
    int64_t fresh[3];
    for (int64_t j = 0; j < want; j++) {
        fresh[j] = first + j;
        if (fresh[j] == st->running || fresh[j] == st->track[0] || fresh[j] == st->track[1]) {
            return MR_EINVAL;   /* an id the request holds: the counter is not the caller's allocator */
        }
    }
    admit_give(lc, st, fresh);
    *used = want;
    return MR_OK;
}

/* State slots an admission can take now: the free ones and what is left
 * of an open alloc group (mr_slots_alloc of one slot takes those first). */
static int64_t
slots_to_hand(const mr_lifecycle *lc)
{
    const mr_slots *s = lc->state;
    return mr_slots_available(s) + (s->group_active ? s->group_len - s->group_pos : 0);
}

int
mr_lc_admit(mr_lifecycle *lc, mr_req *sts, int64_t *rows, size_t n, int headroom)
{
    if (!has_pools(lc)) {
        return MR_ESTATE;
    }
    const mr_lc_config *c = &lc->cfg;
    /* one row per request: two records in one row would share its slots */
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; rows[i] >= 1 && j < i; j++) {
            if (rows[j] == rows[i]) {
                return MR_EINVAL;
            }
        }
    }
    if (headroom) {
        int64_t wants = 0;
        for (size_t i = 0; c->semantics == MR_SEMANTICS_V0523 && i < n; i++) {
            wants += admit_wants(lc, &sts[i]);
        }
        int64_t short_by = mr_rule_state_shortfall(c->semantics == MR_SEMANTICS_V0515, mr_slots_available(lc->state),
                                                   (int64_t)n, c->lazy, wants);
        if (short_by > 0) {
            int rc = mr_radix_evict_state(lc->tree, (size_t)short_by, &lc->rel, NULL, NULL);
            if (rc != MR_OK) {
                return rc;
            }
        }
    }
    /* 1. count what is needed, and check it is there */
    int64_t new_rows = 0, new_slots = 0;
    for (size_t i = 0; i < n; i++) {
        if (rows[i] < 1) {
            new_rows++;
        }
        else if (!mr_reqpool_in_use(lc->rp, rows[i])) {
            return MR_EINVAL;
        }
        new_slots += admit_wants(lc, &sts[i]);
        /* slots a request brings must be its own (or held for it) */
        int64_t mine[3] = {sts[i].running, -1, -1};
        if (c->extra_buffer && sts[i].next_track >= 0) {
            mine[1] = sts[i].track[0];
            mine[2] = sts[i].track[1];
        }
        for (int j = 0; j < 3; j++) {
            int32_t o = 0;
            if (mine[j] < 0) {
                continue;
            }
            if (mr_slots_owner(lc->state, mine[j], &o) != MR_OK || mine[j] == 0) {
                return MR_EINVAL;
            }
            if (o == MR_OWNER_FREE) {
                return MR_ENOENT;
            }
            if (!(o == MR_OWNER_HELD || (o >= 1 && (rows[i] < 1 || o == (int32_t)rows[i])))) {
                return MR_EBUSY;
            }
        }
    }
    if (new_rows > mr_slots_available(&lc->rp->rows) || new_slots > slots_to_hand(lc)) {
        return MR_ENOSPC;
    }
    /* 2. rows (FIFO), then slots; nothing below can fail */
    for (size_t i = 0; i < n; i++) {
        if (rows[i] < 1) {
            int64_t r = 0;
            (void)mr_slots_alloc(&lc->rp->rows, 1, MR_OWNER_HELD, &r);
            rows[i] = r;
        }
    }
    for (size_t i = 0; i < n; i++) {
        mr_req *st = &sts[i];
        int32_t owner = (int32_t)rows[i];
        if (st->running >= 0) {
            (void)mr_slots_transfer(lc->state, &st->running, 1, MR_FROM_CALLER, owner, NULL);
        }
        int64_t fresh[3] = {-1, -1, -1};
        int64_t want = admit_wants(lc, st);
        for (int64_t j = 0; j < want; j++) {
            if (mr_slots_alloc(lc->state, 1, owner, &fresh[j]) != MR_OK) {
                (void)mr_slots_alloc(lc->state, 1, MR_OWNER_HELD, &fresh[j]);
                (void)mr_slots_transfer(lc->state, &fresh[j], 1, MR_FROM_CALLER, owner, NULL);
            }
        }
        admit_give(lc, st, fresh);
        mr_reqpool_sync_maps(lc->rp, rows[i], st);
    }
    return MR_OK;
}

/* ------------------------------------------------------------------------
 * Tracking decisions */

void
mr_lc_prepare_extend(mr_lifecycle *lc, int64_t row, mr_req *st, int64_t prefix_len, int64_t extend_len,
                     int64_t *track_slot, uint8_t *mask, int64_t *track_seqlen)
{
    int64_t aligned = -1, seqlen = -1;
    *mask = (uint8_t)mr_rule_prefill_track(prefix_len, extend_len, lc->cfg.chunk_size, st->branching_seqlen,
                                           &aligned, &seqlen);
    *track_slot = st->next_track >= 0 ? st->track[st->next_track] : -1;
    *track_seqlen = -1;
    if (!*mask) {
        return;
    }
    if (!lc->cfg.lazy && st->next_track >= 0) {
        st->next_track = mr_rule_ping_pong_other(st->next_track, (int)lc->cfg.track_buffer_size);
    }
    st->last_track_seqlen = aligned;
    *track_seqlen = seqlen;
    (void)row;
}

/* The decode tracking decision; the lazy borrow takes a slot from the pool
 * or, tree-only, the caller's `given` (*need set when one is wanted and
 * none was given). */
static void
decode_prepare(mr_lifecycle *lc, int64_t row, mr_req *st, int64_t seq_len, int64_t given, int64_t *track_slot,
               uint8_t *mask, int *need)
{
    const int64_t iv = lc->cfg.track_interval;
    int at = mr_rule_decode_due(seq_len, iv);
    *need = 0;
    if (lc->cfg.lazy && at && st->next_track >= 0) {
        int other = 1 - st->next_track;
        if (st->track[other] == -1) {
            int64_t s = -1;
            if (lc->state != NULL) {
                if (mr_lc_alloc_state(lc, row_owner(row), NULL, &s) != MR_OK) {
                    s = -1;
                }
            }
            else if (given >= 1) {
                s = given;
            }
            else if (lc->counted) {
                if (mr_lc_count_slot(lc, NULL, &s) != MR_OK) {
                    s = -1;         /* none to be had: it goes on unborrowed */
                }
            }
            else {
                *need = 1;
            }
            if (s >= 0) {
                st->track[other] = s;
                st->next_track = other;
                sync_row(lc, row, st);
            }
        }
    }
    *track_slot = st->next_track >= 0 ? st->track[st->next_track] : -1;
    *mask = (uint8_t)at;
}

int
mr_lc_decode_prepare(mr_lifecycle *lc, int64_t row, mr_req *st, int64_t seq_len, int64_t *track_slot,
                     uint8_t *mask)
{
    int need = 0;
    decode_prepare(lc, row, st, seq_len, -1, track_slot, mask, &need);
    return MR_OK;
}

int
mr_lc_decode_prepare_ext(mr_lifecycle *lc, mr_req *st, int64_t seq_len, int64_t fresh, int64_t *track_slot,
                         uint8_t *mask, int *need)
{
    if (has_pools(lc)) {
        return MR_ESTATE;
    }
    decode_prepare(lc, -1, st, seq_len, fresh, track_slot, mask, need);
    return MR_OK;
}

int
mr_lc_decode_finish(mr_lifecycle *lc, int64_t row, mr_req *st, int64_t committed_len, int finished)
{
    if (st->next_track < 0 || !mr_rule_decode_due((int64_t)committed_len, lc->cfg.track_interval)) {
        return 0;
    }
    st->last_track_seqlen = committed_len;
    if (lc->cfg.lazy) {
        int other = 1 - st->next_track;
        if (st->track[other] != -1) {
            (void)free_slot(lc, st->track[other]);
            st->track[other] = -1;
            sync_row(lc, row, st);
        }
        else if (finished) {
            st->lazy_is_insert = 0;
        }
    }
    else {
        st->next_track = mr_rule_ping_pong_other(st->next_track, (int)lc->cfg.track_buffer_size);
    }
    return 1;
}

/* ------------------------------------------------------------------------
 * Caching */

int
mr_lc_free_states(mr_lifecycle *lc, mr_req *st, int keep)
{
    if (st->running < 0) {
        return MR_ESTATE;
    }
    int64_t slots[3];
    int k = 0;
    slots[k++] = st->running;
    if (lc->cfg.extra_buffer && st->next_track >= 0) {
        for (int j = 0; j < lc->cfg.track_buffer_size; j++) {
            if (j == keep || st->track[j] < 0) {
                continue;
            }
            slots[k++] = st->track[j];
        }
    }
    int rc = out_slots(lc, slots, (size_t)k);
    if (rc != MR_OK) {
        return rc;
    }
    st->running = -1;
    if (lc->cfg.extra_buffer) {
        st->track[0] = st->track[1] = -1;
        st->next_track = -1;
    }
    return MR_OK;
}

/* Unlocks the request's node, if it holds a lock. */
static int
drop_lock(mr_lifecycle *lc, mr_req *st)
{
    if (!st->locked) {
        return MR_OK;
    }
    mr_node *node = NULL;
    int rc = mr_radix_resolve(lc->tree, st->last_node, &node);
    if (rc != MR_OK) {
        return rc;
    }
    rc = mr_radix_unlock(lc->tree, node);
    if (rc == MR_OK) {
        st->locked = 0;
    }
    return rc;
}

/* Inserts a request's prefix with ownership: with pools through
 * mr_lc_insert (mine: own_prefix of the insert; its KV indices before the
 * page boundary at or before mine are neither checked nor read); tree-only,
 * the caller's duplicates are handed out with the collected frees (room
 * reserved by the caller).  tail[0:ntail): KV the request frees past what
 * it caches, once the insert succeeded, in a free call before the
 * duplicates' (SGLang's order). */
static int
insert_req(mr_lifecycle *lc, const int32_t *tokens, const int64_t *kv, size_t len, int32_t ns, int64_t slot,
           size_t prev, size_t mine, mr_insert_result *res, const int64_t *tail, size_t ntail, const mr_node *from,
           const int32_t *row, int64_t *bad)
{
    /* the per-path budget is applied by the caller, once the request's lock
     * has moved (trim_inserted) */
    if (has_pools(lc)) {
        return lc_insert(lc, tokens, kv, len, ns, slot, prev, NULL, res, 0, bad, mine, tail, ntail, from, row);
    }
    /* room for a free call per run (the caller reserved the indices) */
    int rc = grow(&lc->rcut, &lc->caprcut, lc->nrcut + len / lc->cfg.page_size + 3);
    if (rc == MR_OK) {
        rc = lc_insert(lc, tokens, kv, len, ns, slot, prev, lc->b, res, 0, bad, mine, NULL, 0, from, NULL);
    }
    if (rc == MR_OK) {
        rc = out_kv(lc, tail, ntail);
    }
    for (size_t i = 0, from = 0; i < lc->nends && rc == MR_OK; from = (size_t)lc->ends[i++]) {
        rc = out_kv(lc, lc->b + from, (size_t)lc->ends[i] - from);
    }
    return rc;
}

/* cache_finished_req over the row's table (kv_in NULL) or, tree-only, over
 * the caller's KV indices kv_in[0:committed_len).  The tokens are tokens
 * or, when tokens64 is not NULL, tokens64 (int64, read in place: only what
 * the insert reads is narrowed; *bad names a token outside int32).
 * kv_bad: NULL, or where the insert names a KV index it refused (its
 * position in the table). */
static int
cache_finished(mr_lifecycle *lc, int64_t row, mr_req *st, const int32_t *tokens, const int64_t *tokens64,
               const int64_t *kv_in, size_t committed_len, int32_t ns, int is_insert, int64_t *bad,
               int64_t *kv_bad)
{
    const mr_lc_config *c = &lc->cfg;
    lc->cached_len = 0;
    if (st->running < 0) {
        return MR_ESTATE;  /* finished twice, or its states were freed */
    }
    int rc0 = lock_check(lc, st, ns);
    if (rc0 != MR_OK) {
        return rc0;        /* a stale lock, or matched under another namespace */
    }
    int rc = scratch(lc, committed_len + 1);
    if (rc == MR_OK) {
        rc = reserve_out(lc, 2 * committed_len, 3);
    }
    if (rc != MR_OK) {
        return rc;
    }
    /* a negative protected_len (a record's field takes any int64) protects
     * nothing: kv is never read before its first entry */
    int64_t protected_len = st->protected_len > 0 ? st->protected_len : 0;
    int keep = -1;
    int existed = 1;
    mr_handle inserted = {0, 0};
    /* end of turn: the running slot holds the state at committed_len */
    int64_t avail = has_pools(lc) ? mr_slots_available(lc->state) : lc->counted ? lc->cnt.slots_free
                                                                                : lc->ext_available;
    int eot = is_insert && avail >= 0
              && mr_rule_end_of_turn(c->end_of_turn, c->extra_buffer, (int64_t)committed_len, c->page_size,
                                     avail, c->lazy);
    int64_t cache_len = is_insert ? mr_rule_finish_cache_len(c->extra_buffer, st->last_track_seqlen,
                                                             (int64_t)committed_len, eot, c->page_size)
                                  : 0;
    size_t prev = protected_len > 0 ? (size_t)protected_len : 0;
    /* the insert starts at the request's locked node when it can; the
     * tokens it reads are narrowed (int64 ones) before anything changes */
    const mr_node *from = cache_len > 0 ? locked_path(lc, st, (size_t)cache_len) : NULL;
    if (cache_len > 0) {
        rc = key_tail(lc, tokens, tokens64, from != NULL ? prev : 0, (size_t)cache_len, &tokens, bad);
        if (rc != MR_OK) {
            return rc;
        }
    }
    /* the KV the call uses: the insert's from its own prefix on (mine: the
     * locked prefix itself from a locked node), the tail past the protected
     * prefix; the table is read from there only */
    size_t mine = from != NULL ? prev
                  : cache_len > 0 && has_pools(lc) ? own_prefix(lc, tokens, (size_t)cache_len, ns, prev) : prev;
    const int64_t *kv = kv_in;
    if (has_pools(lc)) {
        size_t first = check_from(lc, mine < prev ? mine : prev);
        first = first < committed_len ? first : committed_len;
        (void)mr_reqpool_read(lc->rp, row, (int64_t)first, (int64_t)(committed_len - first), lc->a + first);
        kv = lc->a;
    }
    if (is_insert) {
        int64_t slot = st->running;
        if (c->extra_buffer) {
            if (st->next_track < 0) {
                return MR_ESTATE;
            }
            keep = keep_idx(lc, st);
            slot = st->track[keep];
            if (slot < 0) {
                return MR_ESTATE;  /* the slot was donated already */
            }
            if (eot) {
                slot = st->running;
                keep = -1;
            }
        }
        /* the tail beyond what is cached (and beyond the tree's own
         * prefix): SGLang frees it before the insert frees the duplicates,
         * each a free call of its own */
        int64_t end = cache_len > protected_len ? cache_len : protected_len;
        size_t ntail = end < (int64_t)committed_len ? committed_len - (size_t)end : 0;
        const int64_t *tail = kv != NULL ? kv + end : NULL;   /* NULL: a tree without values */
        /* insert first: it is the step that can fail, and then nothing
         * has changed; the tail goes once it succeeded */
        if (cache_len > 0) {
            mr_insert_result res;
            rc = insert_req(lc, tokens, kv, (size_t)cache_len, ns, slot, prev, mine, &res, tail, ntail, from, NULL,
                            kv_bad);
            if (rc != MR_OK) {
                return rc;
            }
            existed = res.state_existed;
            lc->cnt.donated += !existed;     /* a slot of the request's */
            inserted = mr_node_handle(res.node);
            lc->cached_len = cache_len;
        }
        else if (ntail > 0 && (rc = out_kv(lc, tail, ntail)) != MR_OK) {
            return rc;
        }
    }
    else if (protected_len < (int64_t)committed_len) {
        rc = out_kv(lc, kv != NULL ? kv + protected_len : NULL, committed_len - (size_t)protected_len);
        if (rc != MR_OK) {
            return rc;
        }
    }
    if (existed) {
        keep = -1;
    }
    if (eot && !existed) {
        /* the running slot is the tree's now; the track slots go back */
        int64_t spare[2];
        int k = 0;
        for (int j = 0; j < c->track_buffer_size && st->next_track >= 0; j++) {
            if (st->track[j] >= 0) {
                spare[k++] = st->track[j];
            }
        }
        rc = k > 0 ? out_slots(lc, spare, (size_t)k) : MR_OK;
        if (rc == MR_OK) {
            st->running = -1;
            st->track[0] = st->track[1] = -1;
            st->next_track = -1;
        }
    }
    else if (c->extra_buffer) {
        if (keep >= 0) {
            st->track[keep] = -1;  /* the tree's now: not freed below */
        }
        rc = mr_lc_free_states(lc, st, -1);
    }
    else if (existed) {
        rc = mr_lc_free_states(lc, st, -1);
    }
    else {
        st->running = -1;  /* donated to the tree */
    }
    if (rc != MR_OK) {
        return rc;
    }
    rc = drop_lock(lc, st);
    if (rc == MR_OK && !existed) {
        rc = trim_inserted(lc, inserted);
    }
    return rc;
}

int
mr_lc_cache_finished(mr_lifecycle *lc, int64_t row, mr_req *st, const int32_t *tokens, size_t committed_len,
                     int32_t ns, int is_insert)
{
    if (!has_pools(lc)) {
        return MR_ESTATE;
    }
    if (!mr_reqpool_in_use(lc->rp, row) || (int64_t)committed_len > lc->rp->max_ctx) {
        return MR_EINVAL;
    }
    int64_t bad;
    return cache_finished(lc, row, st, tokens, NULL, NULL, committed_len, ns, is_insert, &bad, NULL);
}

int
mr_lc_cache_finished_ext(mr_lifecycle *lc, mr_req *st, const int32_t *tokens, const int64_t *kv,
                         size_t committed_len, int32_t ns, int is_insert)
{
    if (has_pools(lc)) {
        return MR_ESTATE;
    }
    if (kv == NULL && !lc->cfg.no_values) {
        return MR_EINVAL;
    }
    int64_t bad;
    return cache_finished(lc, -1, st, tokens, NULL, kv, committed_len, ns, is_insert, &bad, NULL);
}

int64_t
mr_lc_unfinished_cache_len(const mr_lifecycle *lc, const mr_req *st, size_t fill_len)
{
    return lc->cfg.extra_buffer ? st->last_track_seqlen : (int64_t)fill_len;
}

/* Row `row` gets the tree's indices at positions [lo, hi) of the path that
 * ends at node (hi past its length: to its end), node by node: the nodes
 * before lo are not read. */
static void
row_from_path(mr_lifecycle *lc, int64_t row, const mr_node *node, int64_t lo, int64_t hi)
{
    int64_t end = (int64_t)mr_radix_path_len(lc->tree, node);
    for (const mr_node *n = node; mr_node_parent(n) != NULL && end > lo; n = mr_node_parent(n)) {
        int64_t start = end - (int64_t)mr_node_len(n);
        int64_t a = start > lo ? start : lo, b = end < hi ? end : hi;
        int32_t *dst = b > a ? mr_reqpool_span(lc->rp, row, a, b - a) : NULL;
        if (dst != NULL) {
            /* the tree keeps them as int32, as the row does */
            memcpy(dst, (const int32_t *)mr_node_values(n) + (a - start), (size_t)(b - a) * sizeof(int32_t));
            mr_reqpool_mark_dirty(lc->rp, row, a, b);
        }
        end = start;
    }
}

/* cache_unfinished_req over the row's table (kv_in NULL; the fresh slot is
 * allocated here) or, tree-only, over the caller's KV indices
 * kv_in[0:fill_len) with the caller's fresh slot (handed back with the
 * collected frees when not needed).  bad, kv_bad: as cache_finished's. */
static int
cache_unfinished(mr_lifecycle *lc, int64_t row, mr_req *st, const int32_t *tokens, const int64_t *tokens64,
                 const int64_t *kv_in, size_t fill_len, int32_t ns, int64_t given, int64_t *prefix_out,
                 int64_t *fork_src, int64_t *fork_dst, int64_t *table_end, int64_t *bad, int64_t *kv_bad)
{
    const mr_lc_config *c = &lc->cfg;
    *fork_src = *fork_dst = -1;
    *table_end = st->protected_len > 0 ? st->protected_len : 0;   /* nothing to rewrite yet */
    lc->cached_len = 0;
    int rc0 = lock_check(lc, st, ns);
    if (rc0 != MR_OK) {
        return rc0;        /* a stale lock, or matched under another namespace */
    }
    int64_t cache_len = mr_lc_unfinished_cache_len(lc, st, fill_len);
    if (cache_len < 0) {
        /* nothing tracked: the request keeps all its KV */
        if (prefix_out == NULL) {
            /* the caller does not want them */
        }
        else if (!has_pools(lc)) {
            copy_or_zero(prefix_out, kv_in, fill_len);
        }
        else {
            (void)mr_reqpool_read(lc->rp, row, 0, (int64_t)fill_len, prefix_out);
        }
        st->prefix_len = (int64_t)fill_len;
        return given >= 1 ? free_slot(lc, given) : MR_OK;
    }
    if (cache_len > (int64_t)fill_len || cache_len % c->page_size != 0) {
        return MR_EINVAL;
    }
    if (st->running < 0) {
        return MR_ESTATE;
    }
    int keep = -1;
    if (c->extra_buffer) {
        if (st->next_track < 0) {
            return MR_ESTATE;
        }
        keep = keep_idx(lc, st);
        if (st->track[keep] < 0) {
            return MR_ESTATE;
        }
    }
    int rc = scratch(lc, fill_len + 1);
    if (rc == MR_OK) {
        rc = reserve_out(lc, fill_len, 2);
    }
    if (rc != MR_OK) {
        return rc;
    }
    mr_node *old = NULL;
    if (st->locked && mr_radix_resolve(lc->tree, st->last_node, &old) != MR_OK) {
        return MR_ESTATE;
    }
    /* the insert starts at the locked node when it can (no eviction below
     * takes it); the tokens it reads are narrowed (int64 ones) before
     * anything changes */
    const mr_node *from = locked_path(lc, st, (size_t)cache_len);
    size_t prev = st->protected_len > 0 ? (size_t)st->protected_len : 0;
    rc = key_tail(lc, tokens, tokens64, from != NULL ? prev : 0, (size_t)cache_len, &tokens, bad);
    if (rc != MR_OK) {
        return rc;
    }
    /* 1. the slot the tree gets: the newest snapshot (extra_buffer, replaced
     *    by a fresh slot) or a fork of the running slot (no_buffer) */
    int64_t fresh = given, donated = -1;
    if (has_pools(lc)) {
        rc = mr_lc_alloc_state(lc, row_owner(row), old, &fresh);
    }
    else if (lc->counted && given < 1) {
        rc = mr_lc_count_slot(lc, old, &fresh);
    }
    if (rc != MR_OK) {
        return rc;
    }
    if (c->extra_buffer) {
        donated = st->track[keep];
        st->track[keep] = fresh;
        sync_row(lc, row, st);
    }
    else {
        donated = fresh;
        *fork_src = st->running;
        *fork_dst = donated;
        lc->stats.forks++;
    }
    /* 2. insert.  The KV it uses, value[mine:], and the tail past the
     *    inserted prefix: the table is read from there only (after the
     *    allocation above, whose eviction may shorten the tree's prefix) */
    mr_insert_result res;
    size_t mine = from != NULL ? prev : has_pools(lc) ? own_prefix(lc, tokens, (size_t)cache_len, ns, prev) : SIZE_MAX;
    const int64_t *kv = kv_in;
    /* with page size 1, read in place (lc_insert widens them into lc->a only
     * if it checks them one by one) */
    const int32_t *in_row = has_pools(lc) && c->page_size == 1 && prefix_out == NULL
                                ? mr_reqpool_span(lc->rp, row, 0, (int64_t)fill_len) : NULL;
    if (in_row != NULL) {
        kv = lc->a;
    }
    else if (has_pools(lc)) {
        size_t first = check_from(lc, mine);
        (void)mr_reqpool_read(lc->rp, row, (int64_t)first, (int64_t)(fill_len - first), lc->a + first);
        kv = lc->a;
    }
    rc = insert_req(lc, tokens, kv, (size_t)cache_len, ns, donated, prev, mine, &res, NULL, 0, from, in_row,
                    kv_bad);
    if (rc != MR_OK) {
        /* refused: the request keeps its snapshot (its record and row as
         * they were) and the slot taken for it goes back */
        if (c->extra_buffer) {
            st->track[keep] = donated;
            sync_row(lc, row, st);
        }
        else {
            *fork_src = *fork_dst = -1;
            lc->stats.forks--;
        }
        (void)free_slot(lc, fresh);
        return rc;
    }
    if (res.state_existed) {
        (void)free_slot(lc, donated);
        if (!c->extra_buffer) {
            *fork_src = *fork_dst = -1;  /* the copy is not needed */
            lc->stats.forks--;
        }
    }
    else if (c->extra_buffer) {
        lc->cnt.donated++;               /* the request's snapshot */
    }
    /* 3. re-match (the match of tokens[0:cache_len) ends at the inserted
     *    node, which has a state: its effects without reading the key); the
     *    request now points at the tree's indices */
    mr_node *mnode = res.node;
    size_t nnew = 0;
    rc = mr_radix_match_node(lc->tree, mnode, &nnew);
    if (rc != MR_OK) {
        return rc;
    }
    /* the row gets the tree's indices where they are not its own: past the
     * insert's matched prefix the tree stored the row's values */
    int64_t pl = st->protected_len;
    int64_t differ = res.prefix_len < nnew ? (int64_t)res.prefix_len : (int64_t)nnew;
    /* the tree's indices go straight into the caller's prefix (no copy
     * through scratch), and from there into the row; without a prefix to
     * hand back, the row gets [pl, differ) from the path's nodes, the rest
     * of the path unread */
    if (prefix_out != NULL) {
        (void)mr_radix_path_values(lc->tree, mnode, prefix_out);
    }
    if (differ > pl && has_pools(lc)) {
        if (prefix_out != NULL) {
            (void)mr_reqpool_write_trusted(lc->rp, row, pl, prefix_out + pl, differ - pl);
        }
        else {
            row_from_path(lc, row, mnode, pl, differ);
        }
    }
    if (differ > *table_end) {
        *table_end = differ;
    }
    /* 4. move the lock */
    rc = mr_radix_lock(lc->tree, mnode);
    if (rc != MR_OK) {
        return rc;
    }
    if (old != NULL) {
        (void)mr_radix_unlock(lc->tree, old);
    }
    st->locked = 1;
    st->has_node = 1;
    st->last_node = mr_node_handle(mnode);
    if (prefix_out != NULL && fill_len > nnew) {
        copy_or_zero(prefix_out + nnew, kv != NULL ? kv + nnew : NULL, fill_len - nnew);
    }
    st->prefix_len = (int64_t)fill_len;
    st->protected_len = (int64_t)nnew;
    st->last_track_seqlen = -1;
    lc->cached_len = cache_len;
    return res.state_existed ? MR_OK : trim_inserted(lc, mr_node_handle(res.node));
}

int
mr_lc_cache_unfinished(mr_lifecycle *lc, int64_t row, mr_req *st, const mr_key *tokens, size_t fill_len, int32_t ns,
                       int64_t *prefix_out, int64_t *fork_src, int64_t *fork_dst, int64_t *bad)
{
    *fork_src = *fork_dst = -1;
    *bad = -1;
    if (!has_pools(lc)) {
        return MR_ESTATE;
    }
    if (!mr_reqpool_in_use(lc->rp, row) || (int64_t)fill_len > lc->rp->max_ctx) {
        return MR_EINVAL;
    }
    int64_t table_end;
    return cache_unfinished(lc, row, st, tokens->width == 4 ? tokens->p : NULL, tokens->width == 8 ? tokens->p : NULL,
                            NULL, fill_len, ns, -1, prefix_out, fork_src, fork_dst, &table_end, bad, NULL);
}

int
mr_lc_cache_unfinished_ext(mr_lifecycle *lc, mr_req *st, const int32_t *tokens, const int64_t *kv, size_t fill_len,
                           int32_t ns, int64_t fresh, int64_t *prefix_out, int64_t *fork_src, int64_t *fork_dst,
                           int64_t *table_end)
{
    *fork_src = *fork_dst = -1;
    *table_end = st->protected_len > 0 ? st->protected_len : 0;
    if (has_pools(lc)) {
        return MR_ESTATE;
    }
    if ((fresh < 1 && !lc->counted) || (kv == NULL && !lc->cfg.no_values)) {
        return MR_EINVAL;   /* (counting: fresh < 1 takes one from the count) */
    }
    /* a slot the request holds would get a second owner, the tree's node */
    if (fresh < 1) {
        fresh = 0;
    }
    else if (fresh == st->running
        || (lc->cfg.extra_buffer && st->next_track >= 0 && (fresh == st->track[0] || fresh == st->track[1]))) {
        return MR_EBUSY;
    }
    int64_t bad;
    return cache_unfinished(lc, -1, st, tokens, NULL, kv, fill_len, ns, fresh, prefix_out, fork_src, fork_dst,
                            table_end, &bad, NULL);
}

int
mr_lc_cache_ext(mr_lifecycle *lc, int finished, mr_req *st, const int32_t *tokens, const int64_t *kv, size_t len,
                int32_t ns, int64_t flag, int64_t available, int64_t *prefix_out, int64_t *fork_src, int64_t *fork_dst,
                int64_t *table_end)
{
    if (!finished) {
        return mr_lc_cache_unfinished_ext(lc, st, tokens, kv, len, ns, flag, prefix_out, fork_src, fork_dst,
                                          table_end);
    }
    *fork_src = *fork_dst = -1;
    *table_end = 0;
    mr_lc_set_state_available(lc, available);
    int rc = mr_lc_cache_finished_ext(lc, st, tokens, kv, len, ns, flag != 0);
    mr_lc_set_state_available(lc, -1);
    return rc;
}

/* ------------------------------------------------------------------------
 * Counted pools */

int
mr_lc_count_pools(mr_lifecycle *lc, int64_t kv_tokens, int64_t slots, int64_t rows)
{
    if (has_pools(lc) || lc->state != NULL || !lc->cfg.no_values || lc->counted || kv_tokens < 0 || slots < 0
        || rows < 0) {
        return MR_EINVAL;
    }
    int64_t page = (int64_t)lc->cfg.page_size;
    memset(&lc->cnt, 0, sizeof(lc->cnt));
    lc->cnt.kv_total = lc->cnt.kv_free = kv_tokens / page * page;   /* whole pages */
    lc->cnt.slots_total = lc->cnt.slots_free = slots;
    lc->cnt.rows_total = lc->cnt.rows_free = rows;
    lc->counted = 1;
    return MR_OK;
}

const mr_lc_counts *
mr_lc_counts_of(const mr_lifecycle *lc)
{
    return lc->counted ? &lc->cnt : NULL;
}

/* notes the peaks after a count fell */
static void
count_peaks(mr_lifecycle *lc)
{
    mr_lc_counts *c = &lc->cnt;
    if (c->kv_total - c->kv_free > c->peak_kv) {
        c->peak_kv = c->kv_total - c->kv_free;
    }
    if (c->slots_total - c->slots_free > c->peak_slots) {
        c->peak_slots = c->slots_total - c->slots_free;
    }
}

int
mr_lc_count_evict(mr_lifecycle *lc, size_t num_tokens, size_t num_states, mr_node *protect, size_t *tokens_out,
                  size_t *states_out)
{
    size_t t = 0, s = 0, t2 = 0, s2 = 0;
    int rc = MR_OK;
    if (!lc->counted) {
        return MR_ESTATE;
    }
    if (num_tokens > 0) {
        rc = mr_lc_evict_protected(lc, num_tokens, 0, NULL, &t, &s);
        lc->cnt.full_evictions += t > 0 || s > 0;
        lc->cnt.kv_evicted += t;
    }
    if (rc == MR_OK && num_states > 0 && lc->victim == NULL) {
        rc = mr_lc_evict_protected(lc, 0, num_states, protect, &t2, &s2);
    }
    /* an external policy's victims, one at a time, until enough went or it
     * names none */
    while (rc == MR_OK && lc->victim != NULL && s2 < num_states) {
        mr_node *v = NULL;
        size_t t1 = 0, s1 = 0;
        rc = lc->victim(lc->victim_ctx, protect, &v);
        if (rc != MR_OK || v == NULL) {
            break;
        }
        if (v == protect || !mr_radix_can_evict_state(lc->tree, v)) {
            rc = MR_EINVAL;
            break;
        }
        rc = mr_radix_evict_node_state(lc->tree, v, &lc->rel, &t1, &s1);
        t2 += t1;
        s2 += s1;
    }
    lc->cnt.kv_evicted += t2;
    lc->cnt.states_evicted += s2;
    if (tokens_out != NULL) {
        *tokens_out = t + t2;
    }
    if (states_out != NULL) {
        *states_out = s + s2;
    }
    return rc;
}

void
mr_lc_count_set_victims(mr_lifecycle *lc, mr_lc_victim_fn fn, void *ctx)
{
    lc->victim = fn;
    lc->victim_ctx = ctx;
}

int
mr_lc_count_kv(mr_lifecycle *lc, int64_t n, int64_t evict_below)
{
    if (!lc->counted) {
        return MR_ESTATE;
    }
    if (n < 0) {
        return MR_EINVAL;
    }
    mr_radix_stats s;
    mr_radix_get_stats(lc->tree, &s);
    if (n > lc->cnt.kv_free && n - lc->cnt.kv_free > (int64_t)s.full_evictable) {
        return MR_ENOSPC;   /* not even evicting all it can: refused before evicting */
    }
    int64_t evict = mr_rule_kv_evict_v(lc->cfg.semantics == MR_SEMANTICS_V0515, lc->cnt.kv_free, evict_below);
    if (evict > 0) {
        int rc = mr_lc_count_evict(lc, (size_t)evict, 0, NULL, NULL, NULL);
        if (rc != MR_OK) {
            return rc;
        }
    }
    if (lc->cnt.kv_free < n) {
        return MR_ENOSPC;
    }
    lc->cnt.kv_free -= n;
    count_peaks(lc);
    return MR_OK;
}

int
mr_lc_count_slot(mr_lifecycle *lc, mr_node *protect, int64_t *id)
{
    if (!lc->counted) {
        return MR_ESTATE;
    }
    if (lc->cnt.slots_free <= 0) {
        int rc = mr_lc_count_evict(lc, 0, 1, protect, NULL, NULL);
        if (rc != MR_OK) {
            return rc;
        }
    }
    if (lc->cnt.slots_free <= 0 || lc->cnt.last_id == INT64_MAX) {
        return MR_ENOSPC;
    }
    lc->cnt.slots_free--;
    *id = ++lc->cnt.last_id;
    count_peaks(lc);
    return MR_OK;
}

int
mr_lc_count_admit(mr_lifecycle *lc, int64_t n_reqs, int64_t slots, int64_t rows)
{
    if (!lc->counted) {
        return MR_ESTATE;
    }
    if (n_reqs < 0 || slots < 0 || rows < 0 || rows > n_reqs
        || mr_rule_state_headroom_overflows(n_reqs, lc->cfg.lazy)) {
        return MR_EINVAL;
    }
    mr_radix_stats s;
    mr_radix_get_stats(lc->tree, &s);
    if (rows > lc->cnt.rows_free
        || (slots > lc->cnt.slots_free && slots - lc->cnt.slots_free > (int64_t)s.state_evictable)) {
        return MR_ENOSPC;   /* refused before evicting */
    }
    int64_t evict = mr_rule_state_shortfall(lc->cfg.semantics == MR_SEMANTICS_V0515, lc->cnt.slots_free, n_reqs,
                                            lc->cfg.lazy, slots);
    if (evict > 0) {
        int rc = mr_lc_count_evict(lc, 0, (size_t)evict, NULL, NULL, NULL);
        if (rc != MR_OK) {
            return rc;
        }
    }
    if (slots > lc->cnt.slots_free) {
        return MR_ENOSPC;
    }
    lc->cnt.slots_free -= slots;
    lc->cnt.rows_free -= rows;
    count_peaks(lc);
    return MR_OK;
}

int
mr_lc_count_free_row(mr_lifecycle *lc, int64_t committed_len, int64_t allocated_len)
{
    if (!lc->counted) {
        return MR_ESTATE;
    }
    if (committed_len < 0 || allocated_len < committed_len || lc->cnt.rows_free >= lc->cnt.rows_total) {
        return MR_EINVAL;
    }
    int64_t page = (int64_t)lc->cfg.page_size;
    int64_t more = (allocated_len + page - 1) / page - (committed_len + page - 1) / page;
    if (more > (lc->cnt.kv_total - lc->cnt.kv_free) / page) {
        return MR_EINVAL;   /* more than is in use */
    }
    lc->cnt.kv_free += more * page;
    lc->cnt.rows_free++;
    return MR_OK;
}

/* ------------------------------------------------------------------------
 * Check */

#define Q_FAIL(...)                              \
    do {                                         \
        snprintf(msg, msglen, __VA_ARGS__);      \
        return MR_ECORRUPT;                      \
    } while (0)

/* Q1..Q6 of lifecycle.h for the record of row r. */
static int
check_record(mr_lifecycle *lc, int64_t r, char *msg, size_t msglen)
{
    const mr_reqpool *rp = lc->rp;
    const mr_lc_config *c = &lc->cfg;
    mr_req rec;
    mr_reqpool_load(rp, r, &rec);
    const mr_req *st = &rec;
    const int bound = rp->bound[r] & MR_ROW_BOUND;
    const int gave[3] = {rp->bound[r] & MR_ROW_GAVE_RUNNING, rp->bound[r] & MR_ROW_GAVE_TRACK0,
                         rp->bound[r] & MR_ROW_GAVE_TRACK1};
    long long R = (long long)r;
    if (!mr_reqpool_in_use(rp, r)) {
        mr_req z;
        mr_req_reset(&z);
        if (memcmp(&z, st, sizeof(z)) != 0) {
            Q_FAIL("Q1: free row %lld has a record that is not reset", R);
        }
        if (bound) {
            Q_FAIL("Q1: free row %lld is bound to a request's record", R);
        }
        return MR_OK;
    }
    const int64_t slots[3] = {st->running, st->track[0], st->track[1]};
    for (int j = 0; j < 3; j++) {
        int32_t o = 0;
        if (slots[j] < 0 || gave[j]) {
            continue;  /* a slot given to the tree is only a name now */
        }
        if (mr_slots_owner(lc->state, slots[j], &o) != MR_OK || o != (int32_t)r) {
            Q_FAIL("Q2: row %lld's slot %lld is not owned by it (owner %d)", R, (long long)slots[j], (int)o);
        }
        for (int k = 0; k < j; k++) {
            if (!gave[k] && slots[k] == slots[j]) {
                Q_FAIL("Q2: row %lld holds slot %lld twice", R, (long long)slots[j]);
            }
        }
    }
    if (st->cow_src != -1 && !bound) {
        Q_FAIL("Q2: row %lld keeps a copy-on-write source between calls", R);
    }
    if (st->cow_src != -1) {
        int32_t o = 0;
        if (mr_slots_owner(lc->state, st->cow_src, &o) != MR_OK || o != MR_OWNER_TREE || st->running < 0) {
            Q_FAIL("Q2: row %lld's pending copy-on-write source %lld is not a tree state (owner %d) or has no "
                   "running slot to copy into",
                   R, (long long)st->cow_src, (int)o);
        }
    }
    if (st->next_track >= 0) {
        if (!c->extra_buffer || st->next_track >= c->track_buffer_size || st->track[st->next_track] < 0) {
            Q_FAIL("Q3: row %lld's next track slot is %d", R, (int)st->next_track);
        }
        for (int j = 0; j < 2; j++) {
            int want = j < c->track_buffer_size && !c->lazy;
            if ((want && st->track[j] < 0) || (j >= c->track_buffer_size && st->track[j] >= 0)) {
                Q_FAIL("Q3: row %lld's track buffer entry %d is %lld", R, j, (long long)st->track[j]);
            }
        }
    }
    else if (st->track[0] >= 0 || st->track[1] >= 0) {
        Q_FAIL("Q3: row %lld has track slots but no next track index", R);
    }
    if (st->running >= 0) {
        if (rp->state_map[r] != st->running) {
            Q_FAIL("Q3: row %lld's state map says %d, its record %lld", R, (int)rp->state_map[r],
                   (long long)st->running);
        }
        for (int32_t j = 0; j < rp->pp; j++) {
            if (rp->track_map[(size_t)r * (size_t)rp->pp + (size_t)j] != st->track[j]) {
                Q_FAIL("Q3: row %lld's track map entry %d differs from its record", R, (int)j);
            }
        }
    }
    if (st->locked) {
        mr_node *node = NULL;
        if (!st->has_node || mr_radix_resolve(lc->tree, st->last_node, &node) != MR_OK) {
            Q_FAIL("Q4: row %lld holds a lock on a node that is gone", R);
        }
        if (node != mr_radix_root(lc->tree) && mr_node_full_lock(node) < 1) {
            Q_FAIL("Q4: row %lld's locked node has no lock", R);
        }
    }
    if (bound) {
        if (!(st->committed == 0 && 0 <= st->protected_len && st->protected_len <= rp->max_ctx
              && 0 <= st->prefix_len && st->prefix_len <= rp->max_ctx && st->last_track_seqlen <= rp->max_ctx
              && st->protected_len % (int64_t)c->page_size == 0)) {
            Q_FAIL("Q5: bound row %lld's lengths are out of range (protected %lld, prefix %lld, committed %lld, "
                   "tracked %lld)",
                   R, (long long)st->protected_len, (long long)st->prefix_len, (long long)st->committed,
                   (long long)st->last_track_seqlen);
        }
        return MR_OK;  /* Q6: the table is the caller's to fill */
    }
    if (!(0 <= st->protected_len && st->protected_len <= st->prefix_len && st->prefix_len <= st->committed
          && st->committed <= rp->max_ctx && st->protected_len % (int64_t)c->page_size == 0
          && st->last_track_seqlen <= st->committed)) {
        Q_FAIL("Q5: row %lld's lengths are out of order (protected %lld, prefix %lld, committed %lld, "
               "tracked %lld)",
               R, (long long)st->protected_len, (long long)st->prefix_len, (long long)st->committed,
               (long long)st->last_track_seqlen);
    }
    const int32_t *tab = rp->table + (size_t)r * (size_t)rp->max_ctx;
    const int64_t ps = lc->kv->page_size;
    for (int64_t j = 0; j < st->committed; j++) {
        int64_t pg = tab[j] / ps;
        int32_t want = j < st->protected_len ? MR_OWNER_TREE : (int32_t)r;
        if (tab[j] < 1 || pg > lc->kv->pages.n || lc->kv->pages.owner[pg] != want) {
            Q_FAIL("Q6: row %lld's token %lld (KV %d) is not in a page owned by %s", R, (long long)j,
                   (int)tab[j], want == MR_OWNER_TREE ? "the tree" : "the request");
        }
    }
    return MR_OK;
}

int
mr_lc_check(mr_lifecycle *lc, char *msg, size_t msglen)
{
    int rc = mr_radix_check(lc->tree, msg, msglen);
    if (rc != MR_OK) {
        return rc;
    }
    if (lc->counted) {
        /* the counts hold at least what the tree holds in use */
        const mr_lc_counts *c = &lc->cnt;
        mr_radix_stats s;
        mr_radix_get_stats(lc->tree, &s);
        if (c->kv_free < 0 || c->kv_free > c->kv_total || c->slots_free < 0 || c->slots_free > c->slots_total
            || c->rows_free < 0 || c->rows_free > c->rows_total) {
            snprintf(msg, msglen, "a counted pool's free count is out of range (KV %lld of %lld, slots %lld of %lld, "
                     "rows %lld of %lld)", (long long)c->kv_free, (long long)c->kv_total, (long long)c->slots_free,
                     (long long)c->slots_total, (long long)c->rows_free, (long long)c->rows_total);
            return MR_ECORRUPT;
        }
        if ((int64_t)(s.full_evictable + s.full_protected) > c->kv_total - c->kv_free
            || (int64_t)(s.state_evictable + s.state_protected) > c->slots_total - c->slots_free) {
            snprintf(msg, msglen, "the tree holds more than the counted pools have in use");
            return MR_ECORRUPT;
        }
    }
    if (!has_pools(lc)) {
        return MR_OK;
    }
    if ((rc = mr_slots_check(lc->state, msg, msglen)) != MR_OK
        || (rc = mr_slots_check(&lc->kv->pages, msg, msglen)) != MR_OK
        || (rc = mr_reqpool_check(lc->rp, msg, msglen)) != MR_OK) {
        return rc;
    }
    mr_radix_stats s;
    mr_radix_get_stats(lc->tree, &s);
    size_t tokens = s.full_evictable + s.full_protected;
    size_t states = s.state_evictable + s.state_protected;
    if ((int64_t)tokens != lc->kv->pages.n_tree * lc->kv->page_size) {
        snprintf(msg, msglen, "the tree holds %zu KV tokens but %lld are tree-owned in the pool", tokens,
                 (long long)(lc->kv->pages.n_tree * lc->kv->page_size));
        return MR_ECORRUPT;
    }
    if ((int64_t)states != lc->state->n_tree) {
        snprintf(msg, msglen, "the tree holds %zu states but %lld slots are tree-owned", states,
                 (long long)lc->state->n_tree);
        return MR_ECORRUPT;
    }
    for (int64_t r = 1; r <= lc->rp->size; r++) {
        if ((rc = check_record(lc, r, msg, msglen)) != MR_OK) {
            return rc;
        }
    }
    return MR_OK;
}

/* ------------------------------------------------------------------------
 * Batched calls */

/* Gives back the copy-on-write slots taken for a batch that is not admitted. */
static void
undo_cow(mr_lifecycle *lc, mr_req *sts, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (sts[i].running >= 0) {
            (void)free_slot(lc, sts[i].running);
            sts[i].running = -1;
        }
    }
}

/* Undoes a batch that is not admitted: every lock taken, every copy-on-write
 * slot held, every row and slot admission took (the requests' records are
 * reset), every KV page taken.  Eviction done on the way stays done. */
static void
undo_prefill(mr_lifecycle *lc, mr_req *sts, size_t n, const int64_t *rows, int admitted)
{
    for (size_t i = 0; i < n; i++) {
        (void)drop_lock(lc, &sts[i]);
        if (admitted) {
            (void)mr_lc_free_states(lc, &sts[i], -1);
            (void)mr_reqpool_free(lc->rp, rows[i]);
        }
    }
    if (!admitted) {
        undo_cow(lc, sts, n);
    }
}

int
mr_lc_prefill_batch(mr_lifecycle *lc, size_t n, const mr_lc_batch_keys *keys, const int32_t *ns,
                    mr_lc_prefill_out *out)
{
    if (!has_pools(lc)) {
        return MR_ESTATE;
    }
    if (keys->lens == NULL) {
        return MR_EINVAL;
    }
    const size_t *lens = keys->lens;
    const int64_t ps = lc->kv->page_size;
    size_t maxlen = 1;
    for (size_t i = 0; i < n; i++) {
        maxlen = lens[i] > maxlen ? lens[i] : maxlen;
        if ((int64_t)lens[i] > lc->rp->max_ctx) {
            return MR_EINVAL;
        }
    }
    /* every buffer the batch needs is taken first: nothing below fails for
     * memory once a unit has moved, except the tree's own operations */
    int rc = scratch(lc, maxlen + (size_t)ps + 1);
    if (rc != MR_OK) {
        return rc;
    }
    mr_req *sts = MR_CALLOC(n + 1, sizeof(mr_req));
    if (sts == NULL) {
        return MR_ENOMEM;
    }
    /* 1. the plan, changing nothing the batch could not undo: each key's
     *    match as it stands (mr_radix_peek_key: no split, no LRU refresh),
     *    its node locked at once (a lock is undone exactly), so the
     *    evictable counts below leave the batch's prefixes out */
    int64_t need_pages = 0;
    for (size_t i = 0; i < n; i++) {
        mr_req_reset(&sts[i]);
        out->rows[i] = -1;
    }
    for (size_t i = 0; i < n && rc == MR_OK; i++) {
        mr_req *st = &sts[i];
        size_t cap = (size_t)mr_rule_match_limit((int64_t)lens[i], 1);
        mr_match m;
        const int64_t *k64 = keys->keys64 != NULL ? keys->keys64[i] : NULL;
        rc = mr_radix_peek_key(lc->tree, k64 != NULL ? NULL : keys->keys[i], k64, cap, ns ? ns[i] : 0, &m);
        if (rc != MR_OK) {
            break;
        }
        if (k64 != NULL && !mr_fits_i32(k64 + m.kv_matched_len, lens[i] - m.kv_matched_len)) {
            rc = MR_EINVAL;   /* a token past what matched is outside int32 (what matched is the tree's) */
            break;
        }
        rc = mr_radix_lock(lc->tree, m.node);
        if (rc != MR_OK) {
            break;
        }
        st->locked = 1;
        st->last_node = mr_node_handle(m.node);
        st->has_node = 1;
        /* the prefix is whole pages; the extend starts a fresh page */
        need_pages += ((int64_t)lens[i] - (int64_t)m.prefix_len + ps - 1) / ps;
    }
    /* 2. can the batch be admitted?  Decided before anything is evicted,
     *    counting what eviction can free (SGLang's PrefillAdder admits
     *    against available + evictable, and only the admitted requests
     *    evict): rows; a running slot and the track buffer per request
     *    (the copy-on-write slot is the running slot); KV pages for the
     *    extends.  A refused batch takes nothing and loses nothing. */
    if (rc == MR_OK) {
        mr_req fresh;
        mr_req_reset(&fresh);
        mr_radix_stats ts;
        mr_radix_get_stats(lc->tree, &ts);
        int64_t want = (int64_t)n * admit_wants(lc, &fresh), have = slots_to_hand(lc);
        size_t short_slots = want > have ? (size_t)(want - have) : 0;
        if ((int64_t)n > mr_slots_available(&lc->rp->rows)
            || (short_slots > 0 && mr_radix_states_evictable_min(lc->tree, short_slots) < short_slots)
            || need_pages * ps > mr_kv_available(lc->kv) + (int64_t)ts.full_evictable) {
            rc = MR_ENOSPC;
        }
    }
    /* 3. match with copy-on-write (slots HELD until admission; a slot may
     *    cost a state the plan's locks do not protect): the node is the
     *    one the plan locked, split where the match ends */
    need_pages = 0;
    for (size_t i = 0; i < n && rc == MR_OK; i++) {
        mr_req *st = &sts[i];
        size_t cap = (size_t)mr_rule_match_limit((int64_t)lens[i], 1);
        mr_match m;
        const int64_t *k64 = keys->keys64 != NULL ? keys->keys64[i] : NULL;
        const mr_key key = {k64 != NULL ? (const void *)k64 : (const void *)keys->keys[i], cap, k64 != NULL ? 8 : 4};
        /* the walk starts at the planned node, locked since the plan matched
         * this key to it (its path unread again), while it keeps its state */
        mr_node *from = NULL;
        if (mr_radix_resolve(lc->tree, st->last_node, &from) != MR_OK || mr_node_state(from) < 0) {
            from = NULL;
        }
        rc = lc_match_from(lc, from, &key, ns ? ns[i] : 0, 1, st, MR_OWNER_HELD, &m, NULL);
        if (rc != MR_OK) {
            break;
        }
        mr_handle h = mr_node_handle(m.node);
        if (h.id != st->last_node.id || h.gen != st->last_node.gen) {
            /* not the planned node (cannot happen: the plan's locks keep
             * its path): the lock follows the match */
            if ((rc = drop_lock(lc, st)) != MR_OK || (rc = mr_radix_lock(lc->tree, m.node)) != MR_OK) {
                break;
            }
            st->locked = 1;
            st->last_node = h;
        }
        st->prefix_len = st->protected_len = (int64_t)m.prefix_len;
        st->branching_seqlen = m.branching_seqlen;
        need_pages += ((int64_t)lens[i] - st->prefix_len + ps - 1) / ps;
        out->prefix_len[i] = st->prefix_len;
    }
    /* 4. admission (rows and state slots, all or none; states evicted for
     *    the headroom first), then 5. KV: SGLang's alloc_for_extend in its
     *    order, evicting for its estimate of the batch's tokens when short */
    if (rc == MR_OK) {
        rc = mr_lc_admit(lc, sts, out->rows, n, 1);
    }
    if (rc != MR_OK) {
        undo_prefill(lc, sts, n, out->rows, 0);
        MR_FREE(sts);
        return rc;
    }
    int64_t need_kv = need_pages * ps, ext_total = 0;
    for (size_t i = 0; i < n; i++) {
        ext_total += (int64_t)lens[i] - sts[i].prefix_len;
    }
    int64_t evict = mr_rule_kv_evict_v(lc->cfg.semantics == MR_SEMANTICS_V0515, mr_kv_available(lc->kv),
                                       mr_rule_extend_kv_need(ext_total, (int64_t)n, ps));
    if (evict > 0) {
        rc = mr_radix_evict_full(lc->tree, (size_t)evict, &lc->rel, NULL, NULL);
    }
    if (rc == MR_OK && mr_kv_available(lc->kv) < need_kv) {
        rc = MR_ENOSPC;
    }
    /* 6. KV pages, all or none (whole pages: the count above is exact) */
    int64_t done = 0;
    for (size_t i = 0; i < n && rc == MR_OK; i++) {
        int64_t ealloc = ((int64_t)lens[i] - sts[i].prefix_len + ps - 1) / ps * ps;
        int64_t P = sts[i].prefix_len;
        if (ps == 1) {
            /* token pages: the indices go straight into the row */
            int32_t *dst = mr_reqpool_span(lc->rp, out->rows[i], P, ealloc);
            rc = dst == NULL ? MR_EINVAL : mr_slots_alloc_i32(&lc->kv->pages, ealloc, (int32_t)out->rows[i], dst);
            if (rc == MR_OK) {
                mr_reqpool_mark_dirty(lc->rp, out->rows[i], P, P + ealloc);
                done++;
            }
            continue;
        }
        rc = mr_kv_alloc(lc->kv, ealloc, (int32_t)out->rows[i], lc->a);
        if (rc == MR_OK) {
            /* the unused rest of a last partial page stays the request's:
             * the next decode tokens go there */
            (void)mr_reqpool_write_trusted(lc->rp, out->rows[i], P, lc->a, (int64_t)lens[i] - P);
            done++;
        }
    }
    if (rc != MR_OK) {
        for (int64_t i = 0; i < done; i++) {
            int64_t P = sts[i].prefix_len, E = (int64_t)lens[i] - P;
            if (E > 0) {
                (void)mr_reqpool_read(lc->rp, out->rows[i], P, E, lc->a);
                (void)mr_kv_free(lc->kv, lc->a, E, MR_FROM_CALLER, NULL);
            }
        }
        undo_prefill(lc, sts, n, out->rows, 1);
        for (size_t i = 0; i < n; i++) {
            out->rows[i] = -1;
        }
        MR_FREE(sts);
        return rc;
    }
    /* 7. per request: the prefix in the table, tracking, forward lists;
     *    nothing here can fail */
    for (size_t i = 0; i < n; i++) {
        mr_req *st = &sts[i];
        int64_t row = out->rows[i];
        int64_t P = st->prefix_len, E = (int64_t)lens[i] - P;
        mr_node *node = NULL;
        (void)mr_radix_resolve(lc->tree, st->last_node, &node);
        /* the prefix's indices, node by node from the tree into the row */
        row_from_path(lc, row, node, 0, INT64_MAX);
        st->committed = (int64_t)lens[i];
        if (lc->cfg.extra_buffer) {
            mr_lc_prepare_extend(lc, row, st, P, E, &out->track_slot[i], &out->track_mask[i],
                                 &out->track_seqlen[i]);
        }
        else {
            out->track_slot[i] = -1;
            out->track_mask[i] = 0;
            out->track_seqlen[i] = -1;
        }
        out->cow_src[i] = out->cow_dst[i] = out->clear[i] = -1;
        if (st->cow_src >= 0) {
            out->cow_src[i] = st->cow_src;
            out->cow_dst[i] = st->running;
        }
        else if (st->needs_clear) {
            out->clear[i] = st->running;
        }
        st->cow_src = -1;
        st->needs_clear = 0;
        lc->rp->req[row] = *st;
        lc->rp->bound[row] |= MR_ROW_BATCH;   /* its record is the row's own (no outside record is it) */
    }
    MR_FREE(sts);
    return MR_OK;
}

/* Where a batch call reads a request's tokens, when its insert covers
 * cache_len of them: from its locked prefix when the insert can start at
 * its locked node (locked_path), else from 0. */
static size_t
read_from(mr_lifecycle *lc, const mr_req *st, int64_t cache_len)
{
#ifdef MR_VERIFY_TRUSTED
    (void)lc, (void)st, (void)cache_len;
    return 0;   /* the insert checks the caller's path: the whole key */
#else
    return cache_len > 0 && locked_path(lc, st, (size_t)cache_len) != NULL ? (size_t)st->protected_len : 0;
#endif
}

/* The tokens [*lo, *hi) of row st that a batch call checks and reads:
 * up to its committed length, from its locked prefix when the insert can
 * start there, whatever length the insert covers: the end of prefill's
 * (finish 0) its tracked length; a finish's (is_insert: the request's
 * is_insert too) what mr_rule_finish_cache_len gives with or without the
 * end-of-turn state, which the rows finished before it decide. */
static void
read_range(mr_lifecycle *lc, const mr_req *st, int finish, int is_insert, size_t *lo, size_t *hi)
{
    const mr_lc_config *c = &lc->cfg;
    int64_t len[2] = {mr_lc_unfinished_cache_len(lc, st, (size_t)st->committed), -1};
    if (finish) {
        len[0] = len[1] = -1;
        for (int eot = 0; eot < 2 && is_insert && st->lazy_is_insert; eot++) {
            len[eot] = mr_rule_finish_cache_len(c->extra_buffer, st->last_track_seqlen, st->committed, eot,
                                                c->page_size);
        }
    }
    *hi = (size_t)st->committed;
    *lo = read_from(lc, st, st->committed);
    for (int j = 0; j < 2; j++) {
        size_t f = len[j] > 0 ? read_from(lc, st, len[j]) : *lo;
        *lo = f < *lo ? f : *lo;
    }
    *lo = *lo < *hi ? *lo : *hi;
}

/* Copies tokens [lo, hi) of the request's sequence (keys[i], then outs[i])
 * to dst at the same positions, narrowing int64 ones.  The position of
 * the first token outside int32, or -1. */
static int64_t
join_tokens(const mr_lc_batch_keys *k, size_t i, size_t lo, size_t hi, int32_t *dst)
{
    size_t klen = k->lens != NULL ? k->lens[i] : SIZE_MAX;
    for (int part = 0; part < 2; part++) {
        size_t a = part == 0 ? lo : (lo > klen ? lo : klen);
        size_t b = part == 0 ? (hi < klen ? hi : klen) : hi;
        if (a >= b) {
            continue;
        }
        size_t base = part == 0 ? 0 : klen;   /* the part's first position */
        const int64_t *s64 = part == 0 ? (k->keys64 != NULL ? k->keys64[i] : NULL)
                                       : (k->outs64 != NULL ? k->outs64[i] : NULL);
        if (s64 == NULL) {
            const int32_t *s32 = part == 0 ? k->keys[i] : k->outs[i];
            memcpy(dst + a, s32 + (a - base), (b - a) * sizeof(int32_t));
        }
        else if (mr_narrow_i32(s64 + (a - base), b - a, dst + a)) {
            return (int64_t)base + misfit_at(s64, a - base, b - base);
        }
    }
    return -1;
}

/* Before a batch call changes anything: each request's tokens that the
 * call reads (read_range), as int32 in tok[i]: its int32 key itself when
 * that holds them, else copied (int64 ones narrowed, checked) into lc->bk
 * at their positions.  MR_EINVAL with bad = {key, position} for a token
 * outside int32, bad = {key, -1} when the key and its outputs are shorter
 * than what the call reads. */
static int
batch_tokens(mr_lifecycle *lc, size_t n, const int64_t *rows, const mr_lc_batch_keys *k, int finish, int is_insert,
             const int32_t **tok, int64_t *bad)
{
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && grow_n((void **)&lc->bk, &lc->capbk, total, sizeof(int32_t)) != MR_OK) {
            return MR_ENOMEM;
        }
        size_t off = 0;
        for (size_t i = 0; i < n; i++) {
            size_t lo, hi;
            read_range(lc, &lc->rp->req[rows[i]], finish, is_insert, &lo, &hi);
            size_t klen = k->lens != NULL ? k->lens[i] : SIZE_MAX;
            size_t have = k->lens == NULL ? SIZE_MAX : klen + (k->olens != NULL ? k->olens[i] : 0);
            const int in_place = (k->keys64 == NULL || k->keys64[i] == NULL) && hi <= klen;
            if (pass == 0) {
                if (hi > have) {
                    bad[0] = (int64_t)i;
                    bad[1] = -1;
                    return MR_EINVAL;
                }
                total += in_place ? 0 : hi;
                continue;
            }
            tok[i] = in_place ? k->keys[i] : lc->bk + off;
            if (!in_place) {
                int64_t at = join_tokens(k, i, lo, hi, lc->bk + off);
                if (at >= 0) {
                    bad[0] = (int64_t)i;
                    bad[1] = at;
                    return MR_EINVAL;
                }
                off += hi;
            }
        }
    }
    return MR_OK;
}

int
mr_lc_unfinished_batch(mr_lifecycle *lc, size_t n, const int64_t *rows, const mr_lc_batch_keys *keys,
                       const int32_t *ns, int64_t *fork_src, int64_t *fork_dst, int64_t bad[3])
{
    bad[0] = bad[1] = -1;
    bad[2] = 0;
    if (!has_pools(lc)) {
        return MR_ESTATE;
    }
    if (mr_reqpool_rows_check(lc->rp, rows, n, &bad[0]) != MR_OK) {
        return MR_EINVAL;   /* bad = {entry, -1} */
    }
    for (size_t i = 0; i < n; i++) {
        if (lc->rp->req[rows[i]].committed > lc->rp->max_ctx) {
            bad[0] = (int64_t)i;
            return MR_EINVAL;
        }
    }
    int lrc = batch_lock_check(lc, n, rows, ns, bad);
    if (lrc != MR_OK) {
        return lrc;   /* bad = {entry, -1}: a stale lock, or matched under another namespace */
    }
    const int32_t **tok = MR_MALLOC((n + 1) * sizeof(*tok));
    if (tok == NULL) {
        return MR_ENOMEM;
    }
    int rc = batch_tokens(lc, n, rows, keys, 0, 0, tok, bad);   /* before any row changes */
    /* every row that caches takes a state slot (the fresh one for its
     * buffer, or the fork's copy): a batch short of them even counting
     * what eviction can free is refused before any row changes */
    int64_t want = 0, have = slots_to_hand(lc);
    for (size_t i = 0; i < n; i++) {
        const mr_req *st = &lc->rp->req[rows[i]];
        want += mr_lc_unfinished_cache_len(lc, st, (size_t)st->committed) >= 0;
    }
    size_t short_slots = want > have ? (size_t)(want - have) : 0;
    if (rc == MR_OK && short_slots > 0 && mr_radix_states_evictable_min(lc->tree, short_slots) < short_slots) {
        rc = MR_ENOSPC;
    }
    for (size_t i = 0; i < n && rc == MR_OK; i++) {
        mr_req *st = &lc->rp->req[rows[i]];
        size_t fill = (size_t)st->committed;
        int64_t table_end;
        /* the batch hands back no prefix: the row is the request's table */
        int64_t tok_bad = -1;   /* none: the tokens are narrowed already */
        rc = cache_unfinished(lc, rows[i], st, tok[i], NULL, NULL, fill, ns ? ns[i] : 0, -1, NULL, &fork_src[i],
                              &fork_dst[i], &table_end, &tok_bad, &bad[1]);
        if (rc != MR_OK && bad[1] >= 0) {
            bad[0] = (int64_t)i;   /* its insert refused the KV index at table position bad[1] */
            bad[2] = 1;
        }
    }
    MR_FREE(tok);
    return rc;
}

int
mr_lc_decode_batch(mr_lifecycle *lc, size_t n, const int64_t *rows, int64_t *track_slot, uint8_t *track_mask)
{
    if (!has_pools(lc)) {
        return MR_ESTATE;
    }
    int64_t ps = lc->kv->page_size;
    int64_t need = 0, at;
    if (mr_reqpool_rows_check(lc->rp, rows, n, &at) != MR_OK) {
        return MR_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (lc->rp->req[rows[i]].committed + 1 > lc->rp->max_ctx) {
            return MR_EINVAL;
        }
        if (lc->rp->req[rows[i]].committed % ps == 0) {
            need += ps;
        }
    }
    /* a step that cannot have its KV even from everything evictable is
     * refused before anything is evicted (the caller retracts a request and
     * calls again): a refused step changes nothing */
    mr_radix_stats ts;
    mr_radix_get_stats(lc->tree, &ts);
    if (need > mr_kv_available(lc->kv) + (int64_t)ts.full_evictable) {
        return MR_ENOSPC;
    }
    /* SGLang's two evictions of a decode step: check_decode_mem's for the
     * tokens the step takes, then alloc_for_decode's for its estimate */
    int64_t est = mr_rule_decode_kv_need((int64_t)n, ps);
    for (int k = 0; k < 2; k++) {
        int64_t evict = mr_rule_kv_evict_v(lc->cfg.semantics == MR_SEMANTICS_V0515, mr_kv_available(lc->kv),
                                           k == 0 ? need : est);
        int rc = evict > 0 ? mr_radix_evict_full(lc->tree, (size_t)evict, &lc->rel, NULL, NULL) : MR_OK;
        if (rc != MR_OK) {
            return rc;
        }
    }
    if (mr_kv_available(lc->kv) < need) {
        return MR_ENOSPC;
    }
    int rc = scratch(lc, (size_t)ps + 1);
    if (rc != MR_OK) {
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        mr_req *st = &lc->rp->req[rows[i]];
        int64_t pos = st->committed;
        int64_t idx;
        if (pos % ps == 0) {
            (void)mr_kv_alloc(lc->kv, ps, (int32_t)rows[i], lc->a);
            idx = lc->a[0];
        }
        else {
            int64_t last = 0;
            (void)mr_reqpool_read(lc->rp, rows[i], pos - 1, 1, &last);
            idx = last + 1;
        }
        (void)mr_reqpool_write(lc->rp, rows[i], pos, &idx, 1);
        st->committed = pos + 1;
        (void)mr_lc_decode_prepare(lc, rows[i], st, st->committed, &track_slot[i], &track_mask[i]);
        (void)mr_lc_decode_finish(lc, rows[i], st, st->committed, 0);
    }
    return MR_OK;
}

int
mr_lc_finish_batch(mr_lifecycle *lc, size_t n, const int64_t *rows, const mr_lc_batch_keys *keys, const int32_t *ns,
                   int is_insert, int64_t bad[3])
{
    bad[0] = bad[1] = -1;
    bad[2] = 0;
    if (!has_pools(lc)) {
        return MR_ESTATE;
    }
    if (mr_reqpool_rows_check(lc->rp, rows, n, &bad[0]) != MR_OK) {
        return MR_EINVAL;   /* bad = {entry, -1} */
    }
    for (size_t i = 0; i < n; i++) {
        if (lc->rp->req[rows[i]].committed > lc->rp->max_ctx) {
            bad[0] = (int64_t)i;
            return MR_EINVAL;
        }
    }
    int lrc = batch_lock_check(lc, n, rows, ns, bad);
    if (lrc != MR_OK) {
        return lrc;   /* bad = {entry, -1}: a stale lock, or matched under another namespace */
    }
    const int32_t **tok = MR_MALLOC((n + 1) * sizeof(*tok));
    if (tok == NULL) {
        return MR_ENOMEM;
    }
    int rc = batch_tokens(lc, n, rows, keys, 1, is_insert, tok, bad);   /* before any row changes */
    for (size_t i = 0; i < n && rc == MR_OK; i++) {
        mr_req *st = &lc->rp->req[rows[i]];
        int64_t tok_bad = -1;   /* as unfinished_batch's */
        rc = cache_finished(lc, rows[i], st, tok[i], NULL, NULL, (size_t)st->committed, ns ? ns[i] : 0,
                            is_insert && st->lazy_is_insert, &tok_bad, &bad[1]);
        if (rc != MR_OK && bad[1] >= 0) {
            bad[0] = (int64_t)i;   /* as unfinished_batch's */
            bad[2] = 1;
        }
        if (rc == MR_OK) {
            rc = mr_reqpool_free(lc->rp, rows[i]);
        }
    }
    MR_FREE(tok);
    return rc;
}
