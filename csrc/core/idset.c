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
