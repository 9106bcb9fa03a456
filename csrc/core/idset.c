/* idset.c - see idset.h. */
#include "idset.h"

#include "alloc.h"
#include "common.h"

static size_t
slot_of(int64_t id, size_t cap)
{
    uint64_t x = (uint64_t)id * 0x9E3779B97F4A7C15ull;   /* Fibonacci hashing */
    return (size_t)(x ^ (x >> 29)) & (cap - 1);
}

void
mr_idset_init(mr_idset *s)
{
    s->keys = NULL;
    s->cap = 0;
    s->n = 0;
}

void
mr_idset_free(mr_idset *s)
{
    MR_FREE(s->keys);
    mr_idset_init(s);
}

void
mr_idset_clear(mr_idset *s)
{
    for (size_t i = 0; i < s->cap; i++) {
        s->keys[i] = MR_IDSET_EMPTY;
    }
    s->n = 0;
}

int
mr_idset_has(const mr_idset *s, int64_t id)
{
    if (s->cap == 0) {
        return 0;
    }
    for (size_t i = slot_of(id, s->cap);; i = (i + 1) & (s->cap - 1)) {
        if (s->keys[i] == id) {
            return 1;
        }
        if (s->keys[i] == MR_IDSET_EMPTY) {
            return 0;
        }
    }
}

static void
put(int64_t *keys, size_t cap, int64_t id)
{
    size_t i = slot_of(id, cap);
    while (keys[i] != MR_IDSET_EMPTY && keys[i] != id) {
        i = (i + 1) & (cap - 1);
    }
    keys[i] = id;
}

int
mr_idset_reserve(mr_idset *s, size_t more)
{
    size_t need = s->n + more;
    if (need > SIZE_MAX / 4) {
        return MR_ENOMEM;
    }
    if (need * 2 <= s->cap) {   /* load factor <= 1/2 */
        return MR_OK;
    }
    size_t cap = s->cap ? s->cap : 64;
    while (cap < need * 2) {
        cap *= 2;
    }
    int64_t *keys = MR_MALLOC(cap * sizeof(int64_t));
    if (keys == NULL) {
        return MR_ENOMEM;
    }
    for (size_t i = 0; i < cap; i++) {
        keys[i] = MR_IDSET_EMPTY;
    }
    for (size_t i = 0; i < s->cap; i++) {
        if (s->keys[i] != MR_IDSET_EMPTY) {
            put(keys, cap, s->keys[i]);
        }
    }
    MR_FREE(s->keys);
    s->keys = keys;
    s->cap = cap;
    return MR_OK;
}

int
mr_idset_add(mr_idset *s, int64_t id)
{
    if (mr_idset_has(s, id)) {
        return MR_OK;
    }
    int rc = mr_idset_reserve(s, 1);
    if (rc != MR_OK) {
        return rc;
    }
    put(s->keys, s->cap, id);
    s->n++;
    return MR_OK;
}

int
mr_idset_remove(mr_idset *s, int64_t id)
{
    if (s->cap == 0) {
        return 0;
    }
    size_t mask = s->cap - 1, i = slot_of(id, s->cap);
    while (s->keys[i] != id) {
        if (s->keys[i] == MR_IDSET_EMPTY) {
            return 0;
        }
        i = (i + 1) & mask;
    }
    /* backward-shift deletion: pull later members of the run into the gap */
    size_t gap = i;
    for (size_t j = (gap + 1) & mask; s->keys[j] != MR_IDSET_EMPTY; j = (j + 1) & mask) {
        size_t home = slot_of(s->keys[j], s->cap);
        /* j's entry may move to gap unless its home lies cyclically in (gap, j] */
        int stays = gap <= j ? (gap < home && home <= j) : (gap < home || home <= j);
        if (!stays) {
            s->keys[gap] = s->keys[j];
            gap = j;
        }
    }
    s->keys[gap] = MR_IDSET_EMPTY;
    s->n--;
    return 1;
}

/* ------------------------------------------------------------------------
 * mr_owned */

void
mr_owned_init(mr_owned *o)
{
    mr_idset_init(&o->kv);
    mr_idset_init(&o->st);
    mr_idset_init(&o->seen);
}

void
mr_owned_free(mr_owned *o)
{
    mr_idset_free(&o->kv);
    mr_idset_free(&o->st);
    mr_idset_free(&o->seen);
}

void
mr_owned_clear(mr_owned *o)
{
    mr_idset_clear(&o->kv);
    mr_idset_clear(&o->st);
}

int
mr_owned_check_insert(mr_owned *o, const mr_radix *t, const int32_t *key, const int64_t *val, size_t len,
                      int32_t ns, int64_t state, size_t prev, mr_owned_why *why, size_t *bad)
{
    *why = MR_OWNED_OK;
    if (prev > len) {
        *why = MR_OWNED_PREV_PAST_KEY;
        return MR_EINVAL;
    }
    if (state >= 0 && mr_idset_has(&o->st, state)) {
        *why = MR_OWNED_STATE_HELD;
        return MR_EINVAL;
    }
    /* the tree's own prefix: what is cached and declared locked; every
     * index past it is the caller's (stored, or handed back as duplicates) */
    size_t cached = mr_radix_cached_len(t, key, len, ns);
    size_t from = cached < prev ? cached : prev;
    if (mr_idset_reserve(&o->seen, len - from) != MR_OK || mr_idset_reserve(&o->kv, len - from) != MR_OK
        || mr_idset_reserve(&o->st, 1) != MR_OK) {
        return MR_ENOMEM;
    }
    size_t i;
    for (i = from; i < len && *why == MR_OWNED_OK; i++) {
        if (mr_idset_has(&o->kv, val[i])) {
            *why = MR_OWNED_KV_HELD;
            *bad = i;
        }
        else if (mr_idset_has(&o->seen, val[i])) {
            *why = MR_OWNED_KV_TWICE;
            *bad = i;
        }
        else {
            (void)mr_idset_add(&o->seen, val[i]);
        }
    }
    for (size_t j = from; j < i; j++) {
        (void)mr_idset_remove(&o->seen, val[j]);
    }
    return *why == MR_OWNED_OK ? MR_OK : MR_EINVAL;
}

void
mr_owned_inserted(mr_owned *o, const int64_t *val, size_t prefix_len, size_t len, int64_t state, int state_existed)
{
    for (size_t i = prefix_len; i < len; i++) {
        (void)mr_idset_add(&o->kv, val[i]);
    }
    if (!state_existed && state >= 0) {
        (void)mr_idset_add(&o->st, state);
    }
}

int
mr_owned_insert(mr_owned *o, mr_radix *t, const int32_t *key, const int64_t *val, size_t len, int32_t ns,
                int64_t state, size_t prev, const mr_insert_opts *opts, mr_owned_why *why, size_t *bad,
                mr_insert_result *out)
{
    *why = MR_OWNED_OK;
    int rc = o != NULL ? mr_owned_check_insert(o, t, key, val, len, ns, state, prev, why, bad) : MR_OK;
    if (rc == MR_OK) {
        rc = mr_radix_insert_ex(t, key, val, len, ns, state, prev, opts, NULL, out);
    }
    if (rc == MR_OK && o != NULL) {
        mr_owned_inserted(o, val, out->prefix_len, len, state, out->state_existed);
    }
    return rc;
}

void
mr_owned_released(mr_owned *o, const int64_t *kv, size_t nkv, const int64_t *st, size_t nst)
{
    for (size_t i = 0; i < nkv; i++) {
        (void)mr_idset_remove(&o->kv, kv[i]);
    }
    for (size_t i = 0; i < nst; i++) {
        (void)mr_idset_remove(&o->st, st[i]);
    }
}
