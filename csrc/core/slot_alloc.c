/* slot_alloc.c - FIFO slot allocator with per-unit ownership (slot_alloc.h). */
#include "slot_alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

/* ------------------------------------------------------------------------
 * Helpers */

/* Writes a zero byte into each page of p[0:bytes) (zeroed or unused memory),
 * so that the kernel maps the pages now: a large zeroed block (malloc +
 * memset becomes calloc, whose pages are mapped at first touch) would
 * otherwise fault inside the frees that first touch it, several times per
 * call. */
static void
touch_pages(void *p, size_t bytes)
{
    volatile uint8_t *b = p;
    for (size_t i = 0; i < bytes; i += 4096) {
        b[i] = 0;
    }
}

static int
accepts(mr_from from, int32_t owner)
{
    switch (from) {
    case MR_FROM_CALLER:
        return owner == MR_OWNER_HELD || owner >= 1;
    case MR_FROM_TREE:
        return owner == MR_OWNER_TREE;
    case MR_FROM_ANY:
        return owner == MR_OWNER_HELD || owner >= 1 || owner == MR_OWNER_TREE;
    }
    return 0;
}

static void
count_add(mr_slots *s, int32_t owner, int64_t d)
{
    if (owner == MR_OWNER_HELD) {
        s->n_held += d;
    }
    else if (owner == MR_OWNER_TREE) {
        s->n_tree += d;
    }
    else if (owner >= 1) {
        s->n_req += d;
    }
}

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* 1 if unit u is pre-allocated by the open alloc group and not handed out
 * yet: it is HELD, but no caller has it, so no free or transfer may take it. */
static int
in_group(const mr_slots *s, int64_t u)
{
    for (int64_t g = s->group_pos; g < s->group_len; g++) {
        if (s->group[g] == u) {
            return 1;
        }
    }
    return 0;
}

/* Validates idx[0:k) against `from`: range, current owner, duplicates
 * (one pass; each accepted unit gets its mark, which the caller clears).
 * skip_pending: a PENDING unit is accepted and left out (*skip counts
 * them; its mark stays 0).  Per-class counts of the accepted units go to
 * d[0..2] (held, req, tree).  Returns MR_OK, or the code of the first
 * problem with *bad set and no mark left. */
static int
validate(mr_slots *s, const int64_t *idx, int64_t k, mr_from from, int skip_pending, int64_t *bad, int64_t d[3])
{
    const int grp = s->group_active && s->group_pos < s->group_len;
    int32_t *owner = s->owner;
    uint8_t *mark = s->mark;
    const int64_t n = s->n;
    int64_t held = 0, req = 0, tree = 0;
    int rc = MR_OK;
    int64_t i;
    for (i = 0; i < k; i++) {
        int64_t u = idx[i];
        if (u < 1 || u > n) {
            rc = MR_EINVAL;
            break;
        }
        int32_t o = owner[u];
        if (mark[u]) {
            rc = MR_EINVAL;   /* listed twice */
            break;
        }
        if (o == MR_OWNER_PENDING && skip_pending) {
            continue;
        }
        if (o == MR_OWNER_FREE || o == MR_OWNER_PENDING) {
            rc = MR_ENOENT;
            break;
        }
        if (!accepts(from, o) || (grp && o == MR_OWNER_HELD && in_group(s, u))) {
            rc = MR_EBUSY;
            break;
        }
        held += o == MR_OWNER_HELD;
        tree += o == MR_OWNER_TREE;
        req += o >= 1;
        mark[u] = 1;
    }
    if (rc != MR_OK) {
        if (bad != NULL) {
            *bad = idx[i];
        }
        for (int64_t j = 0; j < i; j++) {
            mark[idx[j]] = 0;
        }
        return rc;
    }
    d[0] = held;
    d[1] = req;
    d[2] = tree;
    return MR_OK;
}

/* The ring holds units as int32 (n <= MR_SLOTS_MAX): half the bytes an
 * alloc reads and a free writes.  dst[0:k) = src[0:k), narrowed. */
static void
ring_copy_in(int32_t *dst, const int64_t *src, int64_t k)
{
    for (int64_t i = 0; i < k; i++) {
        dst[i] = (int32_t)src[i];
    }
}

/* Where the ring's next unit at its tail goes. */
static int64_t
ring_tail(const mr_slots *s)
{
    int64_t tail = s->head + s->count;
    return tail >= s->n ? tail - s->n : tail;
}

/* Puts FREE units u[0:k) (owner already FREE) into the ring: at the tail
 * in order, or at the head in reverse order (u[0] next out). */
static void
ring_put(mr_slots *s, const int64_t *u, int64_t k, int front)
{
    if (front) {
        for (int64_t i = k - 1; i >= 0; i--) {
            s->head = s->head == 0 ? s->n - 1 : s->head - 1;
            s->ring[s->head] = u[i];
        }
    }
    else {
        int64_t tail = ring_tail(s);
        int64_t first = s->n - tail < k ? s->n - tail : k;   /* up to the ring's end, then from 0 */
        ring_copy_in(s->ring + tail, u, first);
        ring_copy_in(s->ring, u + first, k - first);
    }
    s->count += k;
}

#ifndef MR_VERIFY_TRUSTED
/* ring_put(s, u, k, 0) of int32 units (mr_kv_free_tree's fast path). */
static void
ring_put32(mr_slots *s, const int32_t *u, int64_t k)
{
    int64_t tail = ring_tail(s);
    int64_t first = s->n - tail < k ? s->n - tail : k;
    memcpy(s->ring + tail, u, (size_t)first * sizeof(int32_t));
    memcpy(s->ring, u + first, (size_t)(k - first) * sizeof(int32_t));
    s->count += k;
}
#endif

/* ------------------------------------------------------------------------
 * Lifetime */

int
mr_slots_init(mr_slots *s, int64_t n)
{
    memset(s, 0, sizeof(*s));
    if (n < 0 || n > MR_SLOTS_MAX) {
        return MR_EINVAL;
    }
    size_t cap = (size_t)n > 0 ? (size_t)n : 1;
    s->ring = MR_MALLOC(cap * sizeof(int32_t));
    s->group = MR_MALLOC(cap * sizeof(int64_t));
    s->owner = MR_MALLOC(((size_t)n + 1) * sizeof(int32_t));
    s->mark = MR_MALLOC((size_t)n + 1);
    if (s->ring == NULL || s->group == NULL || s->owner == NULL || s->mark == NULL) {
        mr_slots_destroy(s);
        return MR_ENOMEM;
    }
    memset(s->mark, 0, (size_t)n + 1);
    touch_pages(s->mark, (size_t)n + 1);
    s->n = n;
    mr_slots_clear(s);
    return MR_OK;
}

void
mr_slots_destroy(mr_slots *s)
{
    MR_FREE(s->ring);
    MR_FREE(s->group);
    MR_FREE(s->owner);
    MR_FREE(s->mark);
    MR_FREE(s->pending);
    memset(s, 0, sizeof(*s));
}

void
mr_slots_clear(mr_slots *s)
{
    for (int64_t i = 0; i < s->n; i++) {
        s->ring[i] = (int32_t)(i + 1);
    }
    s->head = 0;
    s->count = s->n;
    if (s->owner != NULL) {
        s->owner[0] = MR_OWNER_RESERVED;
        for (int64_t i = 1; i <= s->n; i++) {
            s->owner[i] = MR_OWNER_FREE;
        }
    }
    s->n_held = s->n_req = s->n_tree = 0;
    s->group_len = s->group_pos = 0;
    s->group_active = 0;
    s->n_pending = 0;
    s->free_group = 0;
}

/* ------------------------------------------------------------------------
 * Alloc and free */

/* Pops k units from the ring's head (caller checked count >= k). */
static void
ring_pop(mr_slots *s, int64_t k, int32_t owner, int64_t *out)
{
    /* up to the ring's end, then from its start */
    int64_t first = s->n - s->head < k ? s->n - s->head : k;
    const int32_t *r = s->ring + s->head;
    for (int64_t i = 0; i < first; i++) {
        out[i] = r[i];
    }
    for (int64_t i = first; i < k; i++) {
        out[i] = s->ring[i - first];
    }
    s->head = k > first ? k - first : (s->head + k == s->n ? 0 : s->head + k);
    int32_t *own = s->owner;
    for (int64_t i = 0; i < k; i++) {
        own[out[i]] = owner;
    }
    s->count -= k;
    count_add(s, owner, k);
}

int
mr_slots_alloc(mr_slots *s, int64_t k, int32_t owner, int64_t *out)
{
    if (k < 0 || !(owner == MR_OWNER_HELD || owner >= 1)) {
        return MR_EINVAL;
    }
    if (k == 1 && s->group_active && s->group_pos < s->group_len) {
        int64_t u = s->group[s->group_pos++];
        if (owner != MR_OWNER_HELD) {
            count_add(s, MR_OWNER_HELD, -1);
            s->owner[u] = owner;
            count_add(s, owner, 1);
        }
        out[0] = u;
        return MR_OK;
    }
    if (k > s->count) {
        return MR_ENOSPC;
    }
    ring_pop(s, k, owner, out);
    return MR_OK;
}

int
mr_slots_alloc_i32(mr_slots *s, int64_t k, int32_t owner, int32_t *out)
{
    if (s->n > INT32_MAX) {
        return MR_EINVAL;
    }
    if (k == 1) {   /* an alloc group's unit, or the general path */
        int64_t u = 0;
        int rc = mr_slots_alloc(s, 1, owner, &u);
        out[0] = (int32_t)u;
        return rc;
    }
    if (k < 0 || !(owner == MR_OWNER_HELD || owner >= 1)) {
        return MR_EINVAL;
    }
    if (s->count < k) {
        return MR_ENOSPC;
    }
    /* ring_pop's order, each unit read once: written out and marked (up to
     * the ring's end, then from its start) */
    int32_t *own = s->owner;
    const int64_t first = s->n - s->head < k ? s->n - s->head : k;
    for (int part = 0; part < 2; part++) {
        const int32_t *ring = part == 0 ? s->ring + s->head : s->ring;
        int32_t *o = part == 0 ? out : out + first;
        const int64_t m = part == 0 ? first : k - first;
        for (int64_t i = 0; i < m; i++) {
            int32_t u = ring[i];
            o[i] = u;
            own[u] = owner;
        }
    }
    s->head = k > first ? k - first : (s->head + k == s->n ? 0 : s->head + k);
    s->count -= k;
    count_add(s, owner, k);
    return MR_OK;
}

/* mr_slots_free, with skip_pending as validate()'s. */
static int
slots_free(mr_slots *s, const int64_t *idx, int64_t k, mr_from from, int front, int skip_pending, int64_t *bad)
{
    if (k < 0) {
        return MR_EINVAL;
    }
    const int defer = s->free_group && from == MR_FROM_CALLER;
    if (!defer && k > 0 && from != MR_FROM_TREE && (uint64_t)idx[0] - 1 < (uint64_t)s->n) {
        /* every unit one caller's (a request's, or HELD outside an alloc
         * group): checked and freed in one pass over the owners, without
         * marks (a unit listed twice is FREE at its second listing).
         * Anything else is given back and takes validate(), which names
         * the problem */
        const int32_t o0 = s->owner[idx[0]];
        const int grp = s->group_active && s->group_pos < s->group_len;
        if (o0 >= 1 || (o0 == MR_OWNER_HELD && !grp)) {
            int64_t got = mr_slots_claim(s, idx, k, o0, MR_OWNER_FREE);
            if (got == k) {
                ring_put(s, idx, k, front);
                return MR_OK;
            }
            mr_slots_unclaim(s, idx, got, o0, MR_OWNER_FREE);
        }
    }
    int64_t d[3];
    int rc = validate(s, idx, k, from, defer && skip_pending, bad, d);
    if (rc != MR_OK) {
        return rc;
    }
    s->n_held -= d[0];
    s->n_req -= d[1];
    s->n_tree -= d[2];
    int32_t *owner = s->owner;
    uint8_t *mark = s->mark;
    if (defer) {
        /* the group's end puts them in the free list */
        int64_t *pend = s->pending + s->n_pending;
        int64_t m = 0;
        for (int64_t i = 0; i < k; i++) {
            int64_t u = idx[i];
            if (mark[u]) {   /* not a PENDING unit skipped */
                mark[u] = 0;
                owner[u] = MR_OWNER_PENDING;
                pend[m++] = u;
            }
        }
        s->n_pending += m;
        return MR_OK;
    }
    /* count + k <= n holds: every listed unit is distinct and not FREE */
    for (int64_t i = 0; i < k; i++) {
        int64_t u = idx[i];
        mark[u] = 0;
        owner[u] = MR_OWNER_FREE;
    }
    ring_put(s, idx, k, front);
    return MR_OK;
}

int
mr_slots_free(mr_slots *s, const int64_t *idx, int64_t k, mr_from from, int front, int64_t *bad)
{
    return slots_free(s, idx, k, from, front, 0, bad);
}

/* Sets the owner of units idx[0:k) (distinct) to `to`, taking each out of
 * its class count: one pass over the owners. */
static void
set_owners(mr_slots *s, const int64_t *idx, int64_t k, int32_t to)
{
    int32_t *owner = s->owner;
    for (int64_t i = 0; i < k; i++) {
        count_add(s, owner[idx[i]], -1);
        owner[idx[i]] = to;
    }
}

/* Units idx[0:k), just made FREE (PENDING inside a free group), join the
 * free list's tail (the group's pending list). */
static void
put_freed(mr_slots *s, const int64_t *idx, int64_t k)
{
    if (s->free_group) {   /* the group's end puts them in the free list */
        memcpy(s->pending + s->n_pending, idx, (size_t)k * sizeof(int64_t));
        s->n_pending += k;
        return;
    }
    ring_put(s, idx, k, 0);
}

void
mr_slots_free_checked(mr_slots *s, const int64_t *idx, int64_t k)
{
    set_owners(s, idx, k, s->free_group ? MR_OWNER_PENDING : MR_OWNER_FREE);
    put_freed(s, idx, k);
}

void
mr_slots_transfer_checked(mr_slots *s, const int64_t *idx, int64_t k, int32_t to)
{
    set_owners(s, idx, k, to);
    count_add(s, to, k);
}

/* Writes `to` as the owner of units idx[0:k), nheld of them HELD and the
 * rest REQ(r) (the caller's count), taking them out of those classes
 * without reading their owners (MR_VERIFY_TRUSTED builds read them and
 * abort on a mismatch). */
static void
set_owners_counted(mr_slots *s, const int64_t *idx, int64_t k, int32_t to, int64_t nheld, const char *who)
{
    int32_t *owner = s->owner;
#ifdef MR_VERIFY_TRUSTED
    int64_t held = 0, req = 0;
    for (int64_t i = 0; i < k; i++) {
        held += owner[idx[i]] == MR_OWNER_HELD;
        req += owner[idx[i]] >= 1;
    }
    if (held != nheld || held + req != k) {
        fprintf(stderr, "%s: %lld HELD and %lld REQ units of %lld, told %lld HELD\n", who, (long long)held,
                (long long)req, (long long)k, (long long)nheld);
        abort();
    }
#else
    (void)who;
#endif
    for (int64_t i = 0; i < k; i++) {
        owner[idx[i]] = to;
    }
    s->n_held -= nheld;
    s->n_req -= k - nheld;
}

void
mr_slots_transfer_counted(mr_slots *s, const int64_t *idx, int64_t k, int32_t to, int64_t nheld)
{
    set_owners_counted(s, idx, k, to, nheld, "mr_slots_transfer_counted");
    count_add(s, to, k);
}

void
mr_slots_free_counted(mr_slots *s, const int64_t *idx, int64_t k, int64_t nheld)
{
    set_owners_counted(s, idx, k, s->free_group ? MR_OWNER_PENDING : MR_OWNER_FREE, nheld,
                       "mr_slots_free_counted");
    put_freed(s, idx, k);
}

/* Unit i of a list of int32 (w 4) or int64 (w 8) units: w is a constant
 * where the callers below inline it, so each gets a loop of its width. */
MR_INLINE int64_t
unit_at(const void *idx, int w, int64_t i)
{
    return w == 4 ? ((const int32_t *)idx)[i] : ((const int64_t *)idx)[i];
}

MR_INLINE int64_t
claim_w(mr_slots *s, const void *idx, int w, int64_t k, int32_t expect, int32_t to)
{
    int32_t *owner = s->owner;
    const uint64_t n = (uint64_t)s->n;
    int64_t i = 0;
    for (; i < k; i++) {
        int64_t u = unit_at(idx, w, i);
        if ((uint64_t)u - 1 >= n || owner[u] != expect) {   /* u outside [1, n], or not expect's */
            break;
        }
        owner[u] = to;
    }
    count_add(s, expect, -i);
    count_add(s, to, i);
    return i;
}

MR_INLINE void
unclaim_w(mr_slots *s, const void *idx, int w, int64_t k, int32_t expect, int32_t to)
{
    int32_t *owner = s->owner;
    for (int64_t i = 0; i < k; i++) {
        owner[unit_at(idx, w, i)] = expect;
    }
    count_add(s, to, -k);
    count_add(s, expect, k);
}

int64_t
mr_slots_claim(mr_slots *s, const int64_t *idx, int64_t k, int32_t expect, int32_t to)
{
    return claim_w(s, idx, 8, k, expect, to);
}

int64_t
mr_slots_claim32(mr_slots *s, const int32_t *idx, int64_t k, int32_t expect, int32_t to)
{
    return claim_w(s, idx, 4, k, expect, to);
}

void
mr_slots_unclaim(mr_slots *s, const int64_t *idx, int64_t k, int32_t expect, int32_t to)
{
    unclaim_w(s, idx, 8, k, expect, to);
}

void
mr_slots_unclaim32(mr_slots *s, const int32_t *idx, int64_t k, int32_t expect, int32_t to)
{
    unclaim_w(s, idx, 4, k, expect, to);
}

int
mr_slots_transfer(mr_slots *s, const int64_t *idx, int64_t k, mr_from from, int32_t to, int64_t *bad)
{
    if (k < 0 || !(to == MR_OWNER_TREE || to == MR_OWNER_HELD || to >= 1)) {
        return MR_EINVAL;
    }
    /* units already owned by `to` are accepted whatever `from` says */
    for (int64_t i = 0; i < k; i++) {
        int64_t u = idx[i];
        if (u < 1 || u > s->n) {
            if (bad != NULL) {
                *bad = u;
            }
            return MR_EINVAL;
        }
        int32_t o = s->owner[u];
        if (o == to) {
            continue;
        }
        if (o == MR_OWNER_FREE || o == MR_OWNER_PENDING) {
            if (bad != NULL) {
                *bad = u;
            }
            return MR_ENOENT;
        }
        if (!accepts(from, o) || (o == MR_OWNER_HELD && in_group(s, u))) {
            if (bad != NULL) {
                *bad = u;
            }
            return MR_EBUSY;
        }
    }
    for (int64_t i = 0; i < k; i++) {
        int64_t u = idx[i];
        int32_t o = s->owner[u];
        if (o == to) {
            continue;
        }
        count_add(s, o, -1);
        s->owner[u] = to;
        count_add(s, to, 1);
    }
    return MR_OK;
}

int
mr_slots_owner(const mr_slots *s, int64_t i, int32_t *out)
{
    if (i < 0 || i > s->n) {
        return MR_EINVAL;
    }
    *out = s->owner[i];
    return MR_OK;
}

/* ------------------------------------------------------------------------
 * Alloc groups */

int
mr_slots_group_begin(mr_slots *s, int64_t k)
{
    if (k < 0) {
        return MR_EINVAL;
    }
    mr_slots_group_end(s);
    s->group_active = 1;
    s->group_len = s->group_pos = 0;
    if (k > 0 && k <= s->count) {
        ring_pop(s, k, MR_OWNER_HELD, s->group);
        s->group_len = k;
    }
    return MR_OK;
}

void
mr_slots_group_end(mr_slots *s)
{
    if (!s->group_active) {
        return;
    }
    int64_t left = s->group_len - s->group_pos, *unused = s->group + s->group_pos;
    s->group_active = 0;
    s->group_len = s->group_pos = 0;
    /* still HELD and distinct: straight back to the free list (never
     * deferred by a free group: no caller freed them) */
    for (int64_t i = 0; i < left; i++) {
        s->owner[unused[i]] = MR_OWNER_FREE;
    }
    s->n_held -= left;
    ring_put(s, unused, left, 0);
}

/* ------------------------------------------------------------------------
 * Free groups */

int
mr_slots_free_group_begin(mr_slots *s)
{
    if (s->pending == NULL) {
        /* room for every unit, so that a free inside the group cannot fail;
         * its pages are left to be mapped as the list grows into them (it
         * fills from the front, and a group rarely holds more than a batch's
         * frees: mapping all of it here cost milliseconds on a first group) */
        size_t bytes = (size_t)(s->n > 0 ? s->n : 1) * sizeof(int64_t);
        s->pending = MR_MALLOC(bytes);
        if (s->pending == NULL) {
            return MR_ENOMEM;
        }
    }
    /* A group already open stays open and keeps its pending units (they
     * rejoin the free list at the group's end).  SGLang's free_group_begin
     * resets its list there, so those frees never come back: a leak we do
     * not copy. */
    s->free_group = 1;
    return MR_OK;
}

int
mr_slots_free_group_end(mr_slots *s, int front)
{
    if (!s->free_group) {
        return MR_ESTATE;
    }
    int64_t k = s->n_pending;
    if (front && k > 1) {
        qsort(s->pending, (size_t)k, sizeof(int64_t), cmp_i64);
    }
    for (int64_t i = 0; i < k; i++) {
        s->owner[s->pending[i]] = MR_OWNER_FREE;
    }
    ring_put(s, s->pending, k, front);
    s->n_pending = 0;
    s->free_group = 0;
    return MR_OK;
}

/* ------------------------------------------------------------------------
 * Check */

int
mr_slots_check(const mr_slots *s, char *msg, size_t msglen)
{
    int64_t nfree = 0, nheld = 0, nreq = 0, ntree = 0, npend = 0;
    if (s->owner[0] != MR_OWNER_RESERVED) {
        snprintf(msg, msglen, "slot 0 is not reserved (owner %d)", (int)s->owner[0]);
        return MR_ECORRUPT;
    }
    for (int64_t u = 1; u <= s->n; u++) {
        int32_t o = s->owner[u];
        if (o == MR_OWNER_FREE) {
            nfree++;
        }
        else if (o == MR_OWNER_HELD) {
            nheld++;
        }
        else if (o == MR_OWNER_TREE) {
            ntree++;
        }
        else if (o >= 1) {
            nreq++;
        }
        else if (o == MR_OWNER_PENDING) {
            npend++;
        }
        else {
            snprintf(msg, msglen, "slot %lld has an unknown owner %d", (long long)u, (int)o);
            return MR_ECORRUPT;
        }
        if (s->mark[u]) {
            snprintf(msg, msglen, "slot %lld has a stale scratch mark", (long long)u);
            return MR_ECORRUPT;
        }
    }
    if (nfree != s->count || nheld != s->n_held || nreq != s->n_req || ntree != s->n_tree) {
        snprintf(msg, msglen,
                 "owner recount free/held/req/tree = %lld/%lld/%lld/%lld, counters say %lld/%lld/%lld/%lld",
                 (long long)nfree, (long long)nheld, (long long)nreq, (long long)ntree,
                 (long long)s->count, (long long)s->n_held, (long long)s->n_req, (long long)s->n_tree);
        return MR_ECORRUPT;
    }
    if (npend != s->n_pending || (npend > 0 && !s->free_group)) {
        snprintf(msg, msglen, "%lld PENDING slots, the pending list has %lld (free group %s)", (long long)npend,
                 (long long)s->n_pending, s->free_group ? "open" : "closed");
        return MR_ECORRUPT;
    }
    if (nfree + nheld + nreq + ntree + npend != s->n) {
        snprintf(msg, msglen, "free + held + req + tree + pending = %lld != total %lld",
                 (long long)(nfree + nheld + nreq + ntree + npend), (long long)s->n);
        return MR_ECORRUPT;
    }
    /* the pending list holds exactly the PENDING units, each once */
    int64_t ip;
    for (ip = 0; ip < s->n_pending; ip++) {
        int64_t u = s->pending[ip];
        if (u < 1 || u > s->n || s->owner[u] != MR_OWNER_PENDING || s->mark[u]) {
            snprintf(msg, msglen, "pending list entry %lld (slot %lld) is not a distinct PENDING slot",
                     (long long)ip, (long long)u);
            break;
        }
        s->mark[u] = 1;  /* scratch: cleared below */
    }
    for (int64_t j = 0; j < ip; j++) {
        s->mark[s->pending[j]] = 0;
    }
    if (ip < s->n_pending) {
        return MR_ECORRUPT;
    }
    /* the ring holds exactly the FREE units, each once */
    int rc = MR_OK;
    int64_t i;
    for (i = 0; i < s->count; i++) {
        int64_t p = s->head + i;
        if (p >= s->n) {
            p -= s->n;
        }
        int64_t u = s->ring[p];
        if (u < 1 || u > s->n || s->owner[u] != MR_OWNER_FREE || s->mark[u]) {
            snprintf(msg, msglen, "free list entry %lld (slot %lld) is not a distinct FREE slot",
                     (long long)i, (long long)u);
            rc = MR_ECORRUPT;
            break;
        }
        s->mark[u] = 1;  /* scratch: cleared below */
    }
    for (int64_t j = 0; j < i; j++) {
        int64_t p = s->head + j;
        if (p >= s->n) {
            p -= s->n;
        }
        s->mark[s->ring[p]] = 0;
    }
    if (rc == MR_OK && s->group_active) {
        for (int64_t g = s->group_pos; g < s->group_len; g++) {
            if (s->owner[s->group[g]] != MR_OWNER_HELD) {
                snprintf(msg, msglen, "group slot %lld is not HELD", (long long)s->group[g]);
                return MR_ECORRUPT;
            }
        }
    }
    return rc;
}

/* ------------------------------------------------------------------------
 * KV token view */

int
mr_kv_init(mr_kv *kv, int64_t size, int64_t page_size)
{
    memset(kv, 0, sizeof(*kv));
    if (page_size < 1 || size < 0) {
        return MR_EINVAL;
    }
    int rc = mr_slots_init(&kv->pages, size / page_size);
    if (rc != MR_OK) {
        return rc;
    }
    kv->page_size = page_size;
    return MR_OK;
}

void
mr_kv_destroy(mr_kv *kv)
{
    mr_slots_destroy(&kv->pages);
    MR_FREE(kv->scratch);
    MR_FREE(kv->stamp);
    MR_FREE(kv->wide);
    memset(kv, 0, sizeof(*kv));
}

int
mr_kv_alloc(mr_kv *kv, int64_t ntok, int32_t owner, int64_t *out)
{
    int64_t ps = kv->page_size;
    if (ntok < 0 || ntok % ps != 0) {
        return MR_EINVAL;
    }
    int64_t np = ntok / ps;
    if (ps == 1) {
        return mr_slots_alloc(&kv->pages, np, owner, out);
    }
    if (np > kv->pages.count) {
        return MR_ENOSPC;
    }
    /* pages land in out[0:np), then spread backwards into tokens */
    int rc = mr_slots_alloc(&kv->pages, np, owner, out);
    if (rc != MR_OK) {
        return rc;
    }
    for (int64_t p = np - 1; p >= 0; p--) {
        int64_t page = out[p];
        for (int64_t j = ps - 1; j >= 0; j--) {
            out[p * ps + j] = page * ps + j;
        }
    }
    return MR_OK;
}

int
mr_kv_alloc_check(const mr_kv *kv, int64_t ntok)
{
    const mr_slots *s = &kv->pages;
    if (ntok < 0 || ntok % kv->page_size != 0) {
        return MR_EINVAL;
    }
    if (ntok > mr_kv_available(kv) && !(ntok == 1 && s->group_active && s->group_pos < s->group_len)) {
        return MR_ENOSPC;
    }
    return MR_OK;
}

const char *
mr_owner_name(int32_t owner)
{
    switch (owner) {
    case MR_OWNER_FREE: return "free";
    case MR_OWNER_TREE: return "tree";
    case MR_OWNER_HELD: return "held";
    case MR_OWNER_RESERVED: return "reserved";
    case MR_OWNER_PENDING: return "pending";
    default: return NULL;
    }
}

int
mr_kv_reserve(mr_kv *kv, int64_t ntok)
{
    if (ntok < 0) {
        return MR_EINVAL;
    }
    if (kv->page_size == 1 || (size_t)ntok <= kv->scratch_cap) {
        return MR_OK;
    }
    int64_t *p = MR_REALLOC(kv->scratch, (size_t)ntok * sizeof(int64_t));
    if (p == NULL) {
        return MR_ENOMEM;
    }
    kv->scratch = p;
    kv->scratch_cap = (size_t)ntok;
    return MR_OK;
}

/* Fills kv->scratch with the distinct pages of tok[0:k), sorted; *np gets
 * their number.  MR_EINVAL (negative token, *bad set) or MR_ENOMEM. */
static int
pages_of(mr_kv *kv, const int64_t *tok, int64_t k, int64_t *np, int64_t *bad)
{
    int rc = mr_kv_reserve(kv, k);
    if (rc != MR_OK) {
        return rc;
    }
    for (int64_t i = 0; i < k; i++) {
        if (tok[i] < 0) {
            if (bad != NULL) {
                *bad = tok[i];
            }
            return MR_EINVAL;
        }
        kv->scratch[i] = tok[i] / kv->page_size;
    }
    if (k > 1) {  /* qsort's array may not be NULL, which an empty scratch is */
        qsort(kv->scratch, (size_t)k, sizeof(int64_t), cmp_i64);
    }
    int64_t m = 0;
    for (int64_t i = 0; i < k; i++) {
        if (m == 0 || kv->scratch[m - 1] != kv->scratch[i]) {
            kv->scratch[m++] = kv->scratch[i];
        }
    }
    *np = m;
    return MR_OK;
}

int
mr_kv_free(mr_kv *kv, const int64_t *tok, int64_t k, mr_from from, int64_t *bad)
{
    if (k < 0) {
        return MR_EINVAL;
    }
    if (kv->page_size == 1) {
        return mr_slots_free(&kv->pages, tok, k, from, 0, bad);
    }
    int64_t np = 0;
    int rc = pages_of(kv, tok, k, &np, bad);
    if (rc != MR_OK) {
        return rc;
    }
    int64_t badpage = -1;
    rc = slots_free(&kv->pages, kv->scratch, np, from, 1, 1, &badpage);
    if (rc != MR_OK && bad != NULL) {
        *bad = badpage * kv->page_size;
    }
    return rc;
}

int
mr_kv_free_tree(mr_kv *kv, const int32_t *tok, int64_t k)
{
    if (k < 0) {
        return MR_EINVAL;
    }
#ifndef MR_VERIFY_TRUSTED
    if (kv->page_size == 1) {
        mr_slots *s = &kv->pages;
        int32_t *owner = s->owner;
        for (int64_t i = 0; i < k; i++) {
            owner[tok[i]] = MR_OWNER_FREE;
        }
        s->n_tree -= k;
        ring_put32(s, tok, k);   /* the tree's frees never wait for a free group */
        return MR_OK;
    }
#endif
    if ((size_t)k > kv->wide_cap) {
        int64_t *w = MR_REALLOC(kv->wide, (size_t)k * sizeof(int64_t));
        if (w == NULL) {
            return MR_ENOMEM;
        }
        kv->wide = w;
        kv->wide_cap = (size_t)k;
    }
    for (int64_t i = 0; i < k; i++) {
        kv->wide[i] = tok[i];
    }
    return mr_kv_free(kv, kv->wide, k, MR_FROM_TREE, NULL);
}

int
mr_slots_in_alloc_group(const mr_slots *s, int64_t u)
{
    return s->group_active && s->group_pos < s->group_len && in_group(s, u);
}

int
mr_kv_stamp_begin(mr_kv *kv, uint16_t *gen)
{
    size_t bytes = ((size_t)kv->pages.n + 1) * sizeof(uint16_t);
    if (kv->stamp == NULL) {
        kv->stamp = MR_MALLOC(bytes);
        if (kv->stamp == NULL) {
            return MR_ENOMEM;
        }
        memset(kv->stamp, 0, bytes);
        touch_pages(kv->stamp, bytes);
        kv->stamp_gen = 0;
    }
    if (++kv->stamp_gen == 0) {   /* generations wrap: start over */
        memset(kv->stamp, 0, bytes);
        kv->stamp_gen = 1;
    }
    *gen = kv->stamp_gen;
    return MR_OK;
}

int
mr_kv_distinct(mr_kv *kv, const int64_t *tok, int64_t k, int64_t base, int64_t *bad)
{
    const int64_t ps = kv->page_size, n = kv->pages.n;
    if (k <= 0) {
        return k < 0 ? MR_EINVAL : MR_OK;
    }
    uint16_t gen = 0;
    int rc = mr_kv_stamp_begin(kv, &gen);
    if (rc != MR_OK) {
        return rc;
    }
    int64_t in_block = base % ps;
    for (int64_t i = 0; i < k; i++) {
        int64_t t = tok[i], p = t < 0 ? -1 : (ps == 1 ? t : t / ps);
        int64_t from = i - in_block < 0 ? 0 : i - in_block;
        if (p < 1 || p > n || mr_kv_stamp_page(kv, gen, tok, i, from, p)) {
            if (bad != NULL) {
                *bad = i;
            }
            return MR_EINVAL;
        }
        if (++in_block == ps) {
            in_block = 0;
        }
    }
    return MR_OK;
}

int
mr_kv_free_group_begin(mr_kv *kv)
{
    return mr_slots_free_group_begin(&kv->pages);
}

int
mr_kv_free_group_end(mr_kv *kv)
{
    return mr_slots_free_group_end(&kv->pages, kv->page_size > 1);
}

int
mr_kv_transfer(mr_kv *kv, const int64_t *tok, int64_t k, mr_from from, int32_t to, int64_t *bad)
{
    if (k < 0) {
        return MR_EINVAL;
    }
    if (kv->page_size == 1) {
        return mr_slots_transfer(&kv->pages, tok, k, from, to, bad);
    }
    int64_t np = 0;
    int rc = pages_of(kv, tok, k, &np, bad);
    if (rc != MR_OK) {
        return rc;
    }
    int64_t badpage = -1;
    rc = mr_slots_transfer(&kv->pages, kv->scratch, np, from, to, &badpage);
    if (rc != MR_OK && bad != NULL) {
        *bad = badpage * kv->page_size;
    }
    return rc;
}

/* The unit (a slot, or a token's page) index x falls in; a negative x
 * stays apart from every unit. */
static int64_t
unit_of(const mr_kv *kv, int64_t x)
{
    return x < 0 ? x : x / kv->page_size;
}

/* The core names the refused unit (by a token of its page); the first
 * entry naming it is the one (the checks run in order and stop at the
 * first problem), except a token listed twice: its second entry. */
static void
explain_entry(const mr_kv *kv, int rc, const int64_t *tok, int64_t k, int64_t bad, mr_kv_refusal *out)
{
    const int64_t ps = kv->page_size, u = unit_of(kv, bad);
    int64_t at = 0;
    *out = (mr_kv_refusal){MR_KV_WHY_STATUS, -1, -1, MR_OWNER_FREE, 0, -1, 0, 0};
    while (at < k && unit_of(kv, tok[at]) != u) {
        at++;
    }
    if (at == k || (rc != MR_EINVAL && rc != MR_ENOENT && rc != MR_EBUSY)) {
        return;   /* not an entry's unit, or not a refusal of one */
    }
    out->at = at;
    if (rc == MR_EINVAL && tok[at] >= ps && tok[at] / ps <= kv->pages.n) {
        int64_t first = at;
        while (++at < k && tok[at] != tok[first]) {
        }
        if (at < k) {
            *out = (mr_kv_refusal){MR_KV_WHY_TWICE, at, first, MR_OWNER_FREE, 0, -1, 0, 0};
        }
        else {
            out->at = -1;
        }
        return;
    }
    if (rc == MR_EINVAL) {
        out->why = MR_KV_WHY_RANGE;
        return;
    }
    int32_t o = MR_OWNER_FREE;
    (void)mr_slots_owner(&kv->pages, tok[at] / ps, &o);
    out->owner = o;
    if (rc == MR_ENOENT) {
        out->why = o == MR_OWNER_PENDING ? MR_KV_WHY_PENDING : MR_KV_WHY_FREE;
    }
    else if (o == MR_OWNER_TREE) {
        out->why = MR_KV_WHY_TREE;
    }
    else if (o == MR_OWNER_HELD && mr_slots_in_alloc_group(&kv->pages, tok[at] / ps)) {
        out->why = MR_KV_WHY_ALLOC_GROUP;
    }
    else {
        out->why = o >= 1 ? MR_KV_WHY_ROW : MR_KV_WHY_HELD;
    }
}

void
mr_kv_explain(const mr_kv *kv, int rc, const int64_t *tok, int64_t k, int64_t bad, mr_kv_refusal *out)
{
    explain_entry(kv, rc, tok, k, bad, out);
    const int64_t ps = kv->page_size;
    out->value = out->at >= 0 ? tok[out->at] : 0;
    out->page = ps > 1 && out->at >= 0 ? out->value / ps : -1;
    out->lo = ps;
    out->hi = (kv->pages.n + 1) * ps;
}
