/* radix_ops.c - the tree's operations in the form its front ends call them
 * (radix_ops.h). */
#include "radix_ops.h"

#include <string.h>

#include "alloc.h"

/* ------------------------------------------------------------------------
 * Locks */

int
mr_radix_lock_op(mr_radix *t, mr_node *node, mr_lock_op op, int32_t *other)
{
    int rc;
    switch (op) {
    case MR_LOCK:
        return mr_radix_lock(t, node);
    case MR_LOCK_KV:
        return mr_radix_lock_kv(t, node);
    case MR_UNLOCK:
        rc = mr_radix_unlock(t, node);
        break;
    case MR_UNLOCK_KV:
        rc = mr_radix_unlock_kv(t, node);
        break;
    case MR_UNLOCK_STATE:
        rc = mr_radix_unlock_state(t, node);
        break;
    default:
        return MR_EINVAL;
    }
    if (rc != MR_OK && other != NULL) {
        /* what the caller may have meant: the other kind of lock */
        *other = op == MR_UNLOCK ? mr_node_kv_lock(node) : op == MR_UNLOCK_KV ? mr_node_full_lock(node) : 0;
    }
    return rc;
}

int
mr_skip_bit(long component)
{
    return component == 0 ? MR_SKIP_FULL : component == 2 ? MR_SKIP_MAMBA : 0;
}

int
mr_radix_release_components(mr_radix *t, mr_node *node, int skipped)
{
    switch (skipped & (MR_SKIP_FULL | MR_SKIP_MAMBA)) {
    case 0:
        return mr_radix_unlock(t, node);
    case MR_SKIP_FULL:
        return mr_radix_unlock_state(t, node);
    case MR_SKIP_MAMBA:
        return mr_radix_unlock_kv(t, node);
    default:
        return MR_OK;   /* both skipped: the lock holds nothing to release */
    }
}

void
mr_radix_retake_components(mr_radix *t, mr_node *node, int skipped)
{
    switch (skipped & (MR_SKIP_FULL | MR_SKIP_MAMBA)) {
    case 0:
        mr_radix_lock(t, node);
        break;
    case MR_SKIP_FULL:
        /* the state part again: the KV lock it became goes back into a
         * full lock */
        mr_radix_unlock_kv(t, node);
        mr_radix_lock(t, node);
        break;
    case MR_SKIP_MAMBA:
        mr_radix_lock_kv(t, node);
        break;
    default:
        break;
    }
}

/* ------------------------------------------------------------------------
 * Evictions into a collector */

/* Room for `more` further entries of *buf (grown by doubling). */
static int
out_reserve(int64_t **buf, size_t len, size_t *cap, size_t more)
{
    if (len + more <= *cap) {
        return MR_OK;
    }
    size_t c = *cap ? *cap : 256;
    while (c < len + more) {
        if (c > SIZE_MAX / 2 / sizeof(int64_t)) {
            return MR_ENOMEM;
        }
        c *= 2;
    }
    int64_t *p = MR_REALLOC(*buf, c * sizeof(int64_t));
    if (p == NULL) {
        return MR_ENOMEM;
    }
    *buf = p;
    *cap = c;
    return MR_OK;
}

static int
out_free_kv(void *ctx, const int64_t *idx, size_t n)
{
    mr_evict_out *o = ctx;
    /* idx NULL: a tree without values (the core counts its tokens).
     * Reserve one state slot too: free_state must not fail after this. */
    if (o->count_only) {
        idx = NULL;
    }
    if ((idx != NULL && out_reserve(&o->kv, o->nkv, &o->kvcap, n) != MR_OK)
        || out_reserve(&o->st, o->nst, &o->stcap, 1) != MR_OK) {
        return MR_ENOMEM;
    }
    if (idx != NULL && n > 0) {
        memcpy(o->kv + o->nkv, idx, n * sizeof(int64_t));
        o->nkv += n;
    }
    return MR_OK;
}

static int
out_free_state(void *ctx, int64_t slot)
{
    mr_evict_out *o = ctx;
    if (out_reserve(&o->st, o->nst, &o->stcap, 1) != MR_OK) {
        return MR_ENOMEM;
    }
    o->st[o->nst++] = slot;
    return MR_OK;
}

int
mr_radix_evict_into(mr_radix *t, mr_evict_kind kind, mr_node *node, size_t n, int want_kv, mr_owned *owned,
                    mr_evict_out *out, size_t *tokens, size_t *states)
{
    mr_release rel = {out_free_kv, out_free_state, out, NULL};   /* val32: widened */
    int rc;
    /* the ownership check needs the indices to forget them */
    out->count_only = !want_kv && owned == NULL;
    *tokens = 0;
    *states = 0;
    switch (kind) {
    case MR_EVICT_FULL:
        rc = mr_radix_evict_full(t, n, &rel, tokens, states);
        break;
    case MR_EVICT_STATE:
        rc = mr_radix_evict_state(t, n, &rel, tokens, states);
        break;
    case MR_EVICT_TRIM:
        rc = mr_radix_trim_path(t, node, &rel, states);
        break;
    case MR_EVICT_NODE_STATE:
        rc = mr_radix_evict_node_state(t, node, &rel, tokens, states);
        break;
    case MR_EVICT_PATH_STATES:
        rc = mr_radix_evict_path_states(t, node, n, &rel, states);
        break;
    default:
        return MR_EINVAL;
    }
    if (owned != NULL) {
        mr_owned_released(owned, out->kv, out->nkv, out->st, out->nst);
    }
    /* Only an out-of-memory failure can stop an eviction early; what it
     * released before is still the caller's to free. */
    if (rc != MR_OK && (out->nkv > 0 || out->nst > 0 || *tokens > 0)) {
        return MR_OK;
    }
    return rc;
}

void
mr_evict_out_free(mr_evict_out *out)
{
    MR_FREE(out->kv);
    MR_FREE(out->st);
    memset(out, 0, sizeof(*out));
}

/* ------------------------------------------------------------------------
 * Names and ids */

int
mr_radix_page_chunk(int64_t page, int64_t *chunk)
{
    if (*chunk == 0) {
        *chunk = page > 64 ? page : 64;
    }
    return page % *chunk != 0 && *chunk % page != 0 ? MR_EINVAL : MR_OK;
}

int64_t
mr_radix_node_attr(const mr_radix *t, const mr_node *n, mr_node_attr attr)
{
    switch (attr) {
    case MR_NODE_IS_ROOT:
        return n == mr_radix_root(t);
    case MR_NODE_STATE:
        return mr_node_state(n);
    case MR_NODE_FULL_LOCK:
        return mr_node_full_lock(n);
    case MR_NODE_STATE_LOCK:
        return mr_node_state_lock(n);
    case MR_NODE_CAN_EVICT_STATE:
        return mr_radix_can_evict_state(t, n);
    case MR_NODE_HITS:
        return mr_node_hits(n);
    case MR_NODE_PREFIX_LEN:
        return (int64_t)mr_radix_path_len(t, n);
    }
    return 0;
}

uint64_t
mr_node_nodeid(const mr_node *node)
{
    mr_handle h = mr_node_handle(node);
    return ((uint64_t)h.gen << 32) | h.id;
}

mr_node *
mr_radix_node_by_nodeid(const mr_radix *t, int64_t nodeid)
{
    if (nodeid < 0) {
        return NULL;
    }
    mr_node *n = mr_radix_node_by_id(t, (uint32_t)(nodeid & 0xffffffff));
    if (n != NULL && (uint64_t)mr_node_handle(n).gen != ((uint64_t)nodeid >> 32)) {
        return NULL;
    }
    return n;
}

int
mr_radix_policy_by_0523_name(const char *name, mr_lru_policy *out)
{
    static const struct {
        const char *name;
        mr_lru_policy policy;
    } names[] = {{"lru", MR_POLICY_CONSUMED}, {"lfu", MR_POLICY_LFU},           {"fifo", MR_POLICY_FIFO},
                 {"mru", MR_POLICY_MRU},      {"filo", MR_POLICY_FILO},         {"priority", MR_POLICY_PRIORITY},
                 {"slru", MR_POLICY_SLRU},    {"tlru", MR_POLICY_TLRU},         {"adaptive", MR_POLICY_ADAPTIVE}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].policy;
            return MR_OK;
        }
    }
    /* any other name of the tree's policy table passes through (the state
     * policies) */
    return mr_radix_policy_by_name(name, out);
}

int
mr_radix_semantics_by_name(const char *name, mr_semantics *out)
{
    if (strcmp(name, "v0.5.23") == 0) {
        *out = MR_SEMANTICS_V0523;
    }
    else if (strcmp(name, "v0.5.15") == 0) {
        *out = MR_SEMANTICS_V0515;
    }
    else {
        return MR_EINVAL;
    }
    return MR_OK;
}

int
mr_radix_create(const mr_radix_config *cfg, const mr_radix_options *opt, const mr_leaf_order *order,
                mr_radix **out)
{
    mr_radix *t = NULL;
    int rc = mr_radix_new(cfg, &t);
    if (rc == MR_OK) {
        rc = mr_radix_set_options(t, opt);
    }
    if (rc == MR_OK) {
        rc = mr_radix_set_policy(t, cfg->policy, order);
    }
    if (rc != MR_OK) {
        mr_radix_free(t);
        t = NULL;
    }
    *out = t;
    return rc;
}

/* ------------------------------------------------------------------------
 * Matches as SGLang 0.5.23's TreeCore reports them */

void
mr_match_device(const mr_match *m, int has_mamba, size_t chunk, size_t *device_len, int64_t *branching)
{
    *branching = -1;
    if (!has_mamba) {
        *device_len = m->kv_matched_len;
        return;
    }
    *device_len = m->prefix_len;
    if (m->placed) {
        *branching = m->branching_seqlen;   /* the adaptive policy's predicted junction */
        return;
    }
    size_t aligned = m->kv_matched_len / chunk * chunk;
    if (aligned > m->prefix_len) {
        *branching = (int64_t)aligned;
    }
}
