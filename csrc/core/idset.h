/* idset.h - a set of int64 ids (open addressing, linear probing, backward-
 * shift deletion), and over it RadixTree's optional ownership check
 * (mr_owned): which KV indices and state slots the tree holds, and whether
 * an insert would hand it one of them again. */
#ifndef MR_IDSET_H
#define MR_IDSET_H

#include <stddef.h>
#include <stdint.h>

#include "radix.h"

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

/* ------------------------------------------------------------------------
 * The ownership check of a tree without pools (RadixTree(check_ownership=
 * True)): the KV indices and state slots the tree holds, kept beside it.
 * An insert must not hand the tree one it holds already (a later eviction
 * would return it twice: a double free). */

typedef struct {
    mr_idset kv;     /* KV indices the tree holds */
    mr_idset st;     /* state slots the tree holds */
    mr_idset seen;   /* scratch: one insert's new indices */
} mr_owned;

/* Why mr_owned_check_insert refuses an insert. */
typedef enum {
    MR_OWNED_OK = 0,
    MR_OWNED_PREV_PAST_KEY,   /* prev_prefix_len exceeds the key */
    MR_OWNED_STATE_HELD,      /* the state slot is the tree's already */
    MR_OWNED_KV_HELD,         /* val[*bad] is the tree's already */
    MR_OWNED_KV_TWICE,        /* val[*bad] is listed twice past the tree's own prefix */
} mr_owned_why;

void mr_owned_init(mr_owned *o);
void mr_owned_free(mr_owned *o);
void mr_owned_clear(mr_owned *o);

/* Before inserting key/val[0:len) in namespace ns with state slot `state`
 * (negative: none) and prev_prefix_len prev into t: every index past the
 * tree's own prefix (the cached tokens, at most prev) and the state must
 * not be held by the tree, nor an index listed twice there.  MR_OK (*why =
 * MR_OWNED_OK, room reserved so that mr_owned_inserted cannot fail),
 * MR_EINVAL with *why and *bad (the offending position of val; the first
 * of them in key order), or MR_ENOMEM.  o is unchanged but for room. */
int mr_owned_check_insert(mr_owned *o, const mr_radix *t, const int32_t *key, const int64_t *val, size_t len,
                          int32_t ns, int64_t state, size_t prev, mr_owned_why *why, size_t *bad);
/* After the insert: the tree holds val[prefix_len:len), and `state` unless
 * the end node had one (state_existed) or there is none (negative). */
void mr_owned_inserted(mr_owned *o, const int64_t *val, size_t prefix_len, size_t len, int64_t state,
                       int state_existed);
/* mr_radix_insert_ex behind the check: with o (NULL: no check), first
 * mr_owned_check_insert (its refusal returned as is, nothing changed), then
 * the insert (dup_out NULL), then mr_owned_inserted.  *why is MR_OWNED_OK
 * unless the check refused. */
int mr_owned_insert(mr_owned *o, mr_radix *t, const int32_t *key, const int64_t *val, size_t len, int32_t ns,
                    int64_t state, size_t prev, const mr_insert_opts *opts, mr_owned_why *why, size_t *bad,
                    mr_insert_result *out);
/* After an eviction: the tree no longer holds kv[0:nkv) and st[0:nst). */
void mr_owned_released(mr_owned *o, const int64_t *kv, size_t nkv, const int64_t *st, size_t nst);

#endif /* MR_IDSET_H */
