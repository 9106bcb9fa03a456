/* nstable.c - see nstable.h. */
#include "nstable.h"

#include <string.h>

#include "alloc.h"
#include "common.h"

static uint64_t
hash_of(const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    }
    return h ^ (h >> 31);
}

void
mr_ns_init(mr_nstable *t)
{
    memset(t, 0, sizeof(*t));
}

void
mr_ns_free(mr_nstable *t)
{
    for (int32_t i = 0; i < t->n; i++) {
        MR_FREE(t->ent[i].name);
    }
    MR_FREE(t->ent);
    MR_FREE(t->slot);
    mr_ns_init(t);
}

/* The slot holding name, or the free slot where it would go. */
static size_t
find(const mr_nstable *t, const char *name, size_t len, uint64_t h)
{
    size_t i = (size_t)h & (t->nslot - 1);
    for (;; i = (i + 1) & (t->nslot - 1)) {
        int32_t id = t->slot[i];
        if (id == 0) {
            return i;
        }
        const mr_ns_entry *e = &t->ent[id - 1];
        if (e->hash == h && e->len == len && memcmp(e->name, name, len) == 0) {
            return i;
        }
    }
}

/* Room for one more name: entries and a slot array kept under half full. */
static int
grow(mr_nstable *t)
{
    if (t->n == t->cap) {
        int32_t cap = t->cap ? 2 * t->cap : 8;
        mr_ns_entry *ent = MR_REALLOC(t->ent, (size_t)cap * sizeof(*ent));
        if (ent == NULL) {
            return MR_ENOMEM;
        }
        t->ent = ent;
        t->cap = cap;
    }
    if (2 * ((size_t)t->n + 1) < t->nslot) {
        return MR_OK;
    }
    size_t nslot = t->nslot ? 2 * t->nslot : 16;
    int32_t *slot = MR_CALLOC(nslot, sizeof(*slot));
    if (slot == NULL) {
        return MR_ENOMEM;
    }
    for (int32_t id = 1; id <= t->n; id++) {
        size_t i = (size_t)t->ent[id - 1].hash & (nslot - 1);
        while (slot[i] != 0) {
            i = (i + 1) & (nslot - 1);
        }
        slot[i] = id;
    }
    MR_FREE(t->slot);
    t->slot = slot;
    t->nslot = nslot;
    return MR_OK;
}

int
mr_ns_lookup(mr_nstable *t, const char *name, size_t len, int create, int32_t *id)
{
    uint64_t h = hash_of(name, len);
    size_t i = t->nslot ? find(t, name, len, h) : 0;
    if (t->nslot && t->slot[i] != 0) {
        *id = t->slot[i];
        return MR_OK;
    }
    if (!create) {
        *id = -1;
        return MR_OK;
    }
    if (t->n >= MR_NS_MAX) {
        return MR_ENOSPC;
    }
    char *copy = MR_MALLOC(len + 1);
    if (copy == NULL) {
        return MR_ENOMEM;
    }
    if (grow(t) != MR_OK) {
        MR_FREE(copy);
        return MR_ENOMEM;
    }
    memcpy(copy, name, len);
    copy[len] = '\0';
    t->ent[t->n] = (mr_ns_entry){copy, len, h};
    *id = ++t->n;
    t->slot[find(t, name, len, h)] = *id;
    return MR_OK;
}

void
mr_ns_forget_newest(mr_nstable *t, int32_t id)
{
    if (id < 1 || id != t->n) {
        return;
    }
    /* the newest entry took the first free slot of its probe run, after
     * every other entry was placed: clearing it breaks no other run */
    mr_ns_entry *e = &t->ent[id - 1];
    t->slot[find(t, e->name, e->len, e->hash)] = 0;
    MR_FREE(e->name);
    t->n--;
}

int
mr_ns_name(const mr_nstable *t, int32_t id, const char **name, size_t *len)
{
    if (id <= 0 || id > t->n) {
        return MR_ENOENT;
    }
    *name = t->ent[id - 1].name;
    *len = t->ent[id - 1].len;
    return MR_OK;
}
