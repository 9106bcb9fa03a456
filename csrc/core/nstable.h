/* nstable.h - the namespace table of a tree: SGLang's extra_key names (any
 * bytes) -> int32 ids, and back.  Ids are 1, 2, ... in the order names
 * first came and stay fixed for the table's life; 0 is "no namespace"
 * (extra_key None) and never names an entry.  Open addressing over the
 * names' hashes (linear probing; entries are never removed). */
#ifndef MR_NSTABLE_H
#define MR_NSTABLE_H

#include <stddef.h>
#include <stdint.h>

/* Distinct names a table holds at most: a name past it is refused
 * (MR_ENOSPC).  Millions of extra_key values mean a caller put per-request
 * data into it, which no prefix could ever share. */
#define MR_NS_MAX (1 << 20)

typedef struct {
    char *name;      /* MR_MALLOC'd copy, NUL-terminated (len excludes it) */
    size_t len;
    uint64_t hash;
} mr_ns_entry;

typedef struct {
    mr_ns_entry *ent;   /* id - 1 -> entry; cap entries */
    int32_t n, cap;
    int32_t *slot;      /* nslot hash slots: an id, or 0 when free */
    size_t nslot;       /* 0 or a power of two, > 2 * n */
} mr_nstable;

void mr_ns_init(mr_nstable *t);
void mr_ns_free(mr_nstable *t);

/* The id of name[0:len) in *id.  An unknown name gets the next id when
 * `create`, else *id = -1 (a name that matches nothing).  MR_OK, MR_ENOSPC
 * (create past MR_NS_MAX names), MR_ENOMEM; the table is unchanged on a
 * failure. */
int mr_ns_lookup(mr_nstable *t, const char *name, size_t len, int create, int32_t *id);

/* Drops id again when it is the newest name (the table then is as before
 * the lookup that created it): a caller whose operation was refused after
 * it named a new namespace leaves no trace of it.  Any other id: nothing. */
void mr_ns_forget_newest(mr_nstable *t, int32_t id);

/* The name of id (*name stays valid for the table's life).  MR_OK, or
 * MR_ENOENT for 0, a negative id or one never handed out. */
int mr_ns_name(const mr_nstable *t, int32_t id, const char **name, size_t *len);

#endif /* MR_NSTABLE_H */
