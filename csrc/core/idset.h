/* idset.h - a set of int64 ids (open addressing, linear probing, backward-
 * shift deletion), for RadixTree's optional ownership check: which KV
 * indices and state slots the tree holds. */
#ifndef MR_IDSET_H
#define MR_IDSET_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t *keys;   /* cap entries; MR_IDSET_EMPTY marks a free one */
    size_t cap;      /* 0 or a power of two */
    size_t n;
} mr_idset;

#define MR_IDSET_EMPTY INT64_MIN

/* An empty set (no allocation until the first add). */
void mr_idset_init(mr_idset *s);
void mr_idset_free(mr_idset *s);
void mr_idset_clear(mr_idset *s);
/* 1 if id is in s, else 0.  id must not be MR_IDSET_EMPTY. */
int mr_idset_has(const mr_idset *s, int64_t id);
/* Makes room for `more` further adds: MR_OK or MR_ENOMEM (s unchanged). */
int mr_idset_reserve(mr_idset *s, size_t more);
/* Adds id (no-op if present).  Never allocates after mr_idset_reserve
 * covered it; otherwise MR_ENOMEM is possible (s unchanged). */
int mr_idset_add(mr_idset *s, int64_t id);
/* Removes id; 1 if it was there, else 0. */
int mr_idset_remove(mr_idset *s, int64_t id);

#endif /* MR_IDSET_H */
