/* slot_alloc.h - a FIFO slot allocator that knows who owns every slot.
 *
 * One allocator hands out the units of one pool: recurrent-state slots, KV
 * tokens (page_size 1), KV pages, or request rows.  Unit 0 is reserved (the
 * padding / dummy target) and never handed out; units 1..n are.
 *
 *   free list (a ring, FIFO):   head -> [5][6][1][9] <- tail
 *   owner[]:   0:RESERVED 1:FREE 2:REQ(3) 3:TREE 4:HELD 5:FREE ...
 *
 * Every unit is at all times exactly one of
 *   FREE       in the free list,
 *   HELD       allocated to a caller that did not name an owner (an SGLang
 *              style alloc(n)), or pre-allocated for an alloc group,
 *   REQ(r)     owned by request row r (r >= 1),
 *   TREE       owned by a node of the prefix tree,
 *   PENDING    freed by a caller inside an open free group: checked, out of
 *              the caller's hands, back in the free list at the group's end.
 * mr_slots_check() verifies it: the free list holds exactly the FREE units,
 * each once, the pending list exactly the PENDING ones, and the per-class
 * counters equal a recount of owner[].
 *
 * Free groups (SGLang's free_group_begin / free_group_end): while one is
 * open, a caller's free (MR_FROM_CALLER) is validated as usual and its units
 * become PENDING (one pass, no free-list work); a second free of a PENDING
 * unit is a double free (MR_ENOENT) at once.  The group's end appends the
 * pending units to the free list in the order they were freed (the KV view
 * with page_size > 1: sorted, at the head, as one free of them all would).
 * Opening a group while one is open keeps it open with its pending units
 * (SGLang's free_group_begin loses them there; see mr_slots_free_group_begin).
 * Frees by the tree (evictions) are never deferred.
 *
 * Errors: every function returns MR_OK or a negative MR_E* code.  A failed
 * call changes nothing (inputs are validated before any unit moves).
 */
#ifndef MR_SLOT_ALLOC_H
#define MR_SLOT_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* Owner codes stored in owner[]; a value >= 1 is REQ(value). */
#define MR_OWNER_FREE      0
#define MR_OWNER_TREE      (-1)
#define MR_OWNER_HELD      (-2)
#define MR_OWNER_RESERVED  (-3)
#define MR_OWNER_PENDING   (-4)   /* freed inside the open free group */

/* Which owners a free / transfer accepts. */
typedef enum {
    MR_FROM_CALLER = 0,  /* HELD or any REQ(r): a caller's unit */
    MR_FROM_TREE = 1,    /* TREE only */
    MR_FROM_ANY = 2,     /* HELD, REQ(r) or TREE (never FREE / RESERVED) */
} mr_from;

typedef struct {
    int64_t n;          /* units 1..n */
    int32_t *ring;      /* free list, capacity n (units fit int32: n <= MR_SLOTS_MAX) */
    int64_t head;       /* index of the oldest free unit in ring */
    int64_t count;      /* free units */
    int32_t *owner;     /* n + 1 entries */
    uint8_t *mark;      /* n + 1 scratch flags (duplicate detection) */
    int64_t n_held;     /* units HELD */
    int64_t n_req;      /* units REQ(r) */
    int64_t n_tree;     /* units TREE */
    /* alloc group (SGLang's alloc_group_begin / alloc_group_end) */
    int64_t *group;     /* capacity n */
    int64_t group_len;
    int64_t group_pos;
    int group_active;
    /* free group: units freed while it is open, in order (capacity n,
     * allocated by the first mr_slots_free_group_begin) */
    int64_t *pending;
    int64_t n_pending;
    int free_group;
} mr_slots;

/* The most units an allocator holds: unit ids, state slots and KV indices
 * are int32 where SGLang's tables keep them. */
#define MR_SLOTS_MAX ((int64_t)INT32_MAX - 1)

/* Initialises s with units 1..n all FREE, in order 1, 2, ..., n.
 * MR_EINVAL if n < 0 or n > MR_SLOTS_MAX; MR_ENOMEM (s left zeroed,
 * nothing to free). */
int mr_slots_init(mr_slots *s, int64_t n);
/* Frees s's arrays.  Safe on a zeroed or already destroyed s. */
void mr_slots_destroy(mr_slots *s);
/* Makes every unit FREE again (order 1..n) and ends any alloc group:
 * SGLang's clear().  Owners are forgotten, so the caller must forget them. */
void mr_slots_clear(mr_slots *s);

/* Free units, not counting an open group's pre-allocated ones. */
static inline int64_t mr_slots_available(const mr_slots *s) { return s->count; }

/* Takes k units from the front of the free list (k == 1 inside an alloc
 * group takes the group's next unit first), writes them to out and marks
 * them owned by `owner` (MR_OWNER_HELD or a request row >= 1).
 * MR_ENOSPC if fewer than k are free (nothing taken); MR_EINVAL for k < 0
 * or a bad owner. */
int mr_slots_alloc(mr_slots *s, int64_t k, int32_t owner, int64_t *out);
/* mr_slots_alloc writing the units as int32 (a req-to-token row): the
 * lifecycle's KV straight into a request's table.  MR_EINVAL too when a
 * unit could be outside int32 (n > INT32_MAX). */
int mr_slots_alloc_i32(mr_slots *s, int64_t k, int32_t owner, int32_t *out);

/* Returns units idx[0:k) to the free list (appended at the tail, or pushed
 * at the head in reverse order when front != 0, so idx[0] is next out).
 * Each unit must be in [1, n] and held by an owner `from` accepts, and may
 * appear only once.  MR_EINVAL (out of range / listed twice), MR_ENOENT
 * (already FREE or PENDING: a double free), MR_EBUSY (owned by the tree when
 * from is MR_FROM_CALLER, or by a caller when from is MR_FROM_TREE, or
 * pre-allocated by the open alloc group and not handed out yet); *bad (may
 * be NULL) receives the offending unit.  Nothing is freed on error.  Inside
 * a free group a caller's units become PENDING instead (`front` then plays
 * no part: the group's end orders them). */
int mr_slots_free(mr_slots *s, const int64_t *idx, int64_t k, mr_from from, int front,
                  int64_t *bad);

/* Moves units idx[0:k) from an owner `from` accepts to `to` (MR_OWNER_TREE,
 * MR_OWNER_HELD or a request row).  Units already owned by `to` are left as
 * they are.  Errors as mr_slots_free; nothing moves on error. */
int mr_slots_transfer(mr_slots *s, const int64_t *idx, int64_t k, mr_from from, int32_t to,
                      int64_t *bad);

/* mr_slots_free (from a caller, to the tail) and mr_slots_transfer of
 * units the caller has checked already: each in [1, n], listed once, HELD
 * or REQ(r) and not an open alloc group's (mr_lc_insert's own pass checks
 * exactly that).  Nothing is validated; they cannot fail. */
void mr_slots_free_checked(mr_slots *s, const int64_t *idx, int64_t k);
void mr_slots_transfer_checked(mr_slots *s, const int64_t *idx, int64_t k, int32_t to);
/* mr_slots_transfer_checked when the caller's check also counted the HELD
 * units among idx[0:k) (nheld; the rest are REQ): the owners are written
 * without being read again (MR_VERIFY_TRUSTED builds verify the count and
 * abort on a mismatch). */
void mr_slots_transfer_counted(mr_slots *s, const int64_t *idx, int64_t k, int32_t to, int64_t nheld);
/* mr_slots_free_checked with the caller's count of HELD units, likewise. */
void mr_slots_free_counted(mr_slots *s, const int64_t *idx, int64_t k, int64_t nheld);
/* Moves units idx[0:k), all owned by `expect`, to `to` (expect != to) in
 * one pass that checks as it moves: it stops at the first unit out of [1, n]
 * or not owned by `expect` (a unit listed twice is `to`'s at its second
 * listing) and returns how many it moved, k when all; the class counts move
 * with them.  The caller gives a partial claim back with mr_slots_unclaim. */
int64_t mr_slots_claim(mr_slots *s, const int64_t *idx, int64_t k, int32_t expect, int32_t to);
/* Gives units idx[0:k) that mr_slots_claim moved to `to` back to `expect`. */
void mr_slots_unclaim(mr_slots *s, const int64_t *idx, int64_t k, int32_t expect, int32_t to);
/* mr_slots_claim and mr_slots_unclaim of int32 units (a req-to-token row's). */
int64_t mr_slots_claim32(mr_slots *s, const int32_t *idx, int64_t k, int32_t expect, int32_t to);
void mr_slots_unclaim32(mr_slots *s, const int32_t *idx, int64_t k, int32_t expect, int32_t to);

/* Owner code of unit i; MR_EINVAL if i is out of [0, n]. */
int mr_slots_owner(const mr_slots *s, int64_t i, int32_t *out);

/* Starts an alloc group: pre-allocates k units, marked HELD, if k are
 * free (else none, as SGLang does); alloc(1) calls consume them in order.
 * An open group is ended first.  MR_EINVAL for k < 0. */
int mr_slots_group_begin(mr_slots *s, int64_t k);
/* Ends the group: unused pre-allocated units go back to the free list. */
void mr_slots_group_end(mr_slots *s);

/* Opens a free group (one already open stays open: nothing pending is
 * lost, where SGLang's free_group_begin would drop those frees for good).
 * MR_ENOMEM (nothing changed) if the pending list cannot be allocated. */
int mr_slots_free_group_begin(mr_slots *s);
/* Closes the free group: the pending units go to the free list, in the
 * order they were freed (front == 0: at the tail), or sorted and pushed at
 * the head (front != 0, the smallest next out).  MR_ESTATE, nothing
 * changed, when no group is open (SGLang's allocator raises there too). */
int mr_slots_free_group_end(mr_slots *s, int front);

/* 1 if unit u is pre-allocated by the open alloc group and not handed out
 * yet (HELD, but no caller's: a free or transfer of it is MR_EBUSY). */
int mr_slots_in_alloc_group(const mr_slots *s, int64_t u);

/* Verifies the ownership invariant (see the top of this file).  MR_OK, or
 * MR_ECORRUPT with a message in msg (capacity msglen). */
int mr_slots_check(const mr_slots *s, char *msg, size_t msglen);

/* ------------------------------------------------------------------------
 * The KV token view: an allocator of pages of page_size tokens over
 * mr_slots.  Token t lives in page t / page_size; page 0 (tokens
 * 0..page_size-1) is reserved.  With page_size 1 a page is a token.
 * Ownership is per page.  Order as SGLang's allocators: page_size 1 frees
 * to the tail in the order given; page_size > 1 frees the distinct pages,
 * sorted, to the head. */

typedef struct {
    mr_slots pages;
    int64_t page_size;
    int64_t *scratch;     /* page list of the current free / transfer */
    size_t scratch_cap;
    uint16_t *stamp;      /* n + 1 generations of mr_kv_distinct (allocated by its first call) */
    uint16_t stamp_gen;   /* the latest one */
    int64_t *wide;        /* mr_kv_free_tree's tokens widened, for mr_kv_free's path */
    size_t wide_cap;
} mr_kv;

/* size tokens (size / page_size pages).  MR_EINVAL for page_size < 1 or
 * size < 0; MR_ENOMEM. */
int mr_kv_init(mr_kv *kv, int64_t size, int64_t page_size);
void mr_kv_destroy(mr_kv *kv);

static inline int64_t mr_kv_available(const mr_kv *kv) { return kv->pages.count * kv->page_size; }
/* 1 when every token index of kv fits int32 (the req-to-token table's
 * type): pages 1..n, so the largest is (n + 1) * page_size - 1. */
static inline int mr_kv_fits_table(const mr_kv *kv)
{
    return kv->page_size >= 1 && kv->pages.n + 1 <= ((int64_t)INT32_MAX + 1) / kv->page_size;
}

/* Allocates ntok tokens (whole pages: MR_EINVAL unless ntok % page_size
 * == 0) owned by `owner`; out receives ntok token indices, page by page.
 * MR_ENOSPC when too few pages are free (nothing taken). */
int mr_kv_alloc(mr_kv *kv, int64_t ntok, int32_t owner, int64_t *out);
/* Whether mr_kv_alloc(kv, ntok, ...) can succeed, before the caller makes
 * room for its output: MR_EINVAL when ntok is not whole pages, MR_ENOSPC
 * when too few are free (a lone token the open alloc group still holds
 * counts as free), MR_OK otherwise. */
int mr_kv_alloc_check(const mr_kv *kv, int64_t ntok);
/* The name of an owner class ("free", "tree", "held", "reserved",
 * "pending"), or NULL for a request row. */
const char *mr_owner_name(int32_t owner);
/* Frees the pages of tokens tok[0:k) (every page listed once or more in
 * paged mode; each token once with page_size 1).  Errors as mr_slots_free
 * (*bad is a token index); MR_ENOMEM when the scratch cannot grow.  Inside
 * a free group a caller's pages become PENDING; with page_size > 1 a page
 * already PENDING may be listed again (one free of the group's pages all
 * together lists each page once), with page_size 1 that is a double free. */
int mr_kv_free(mr_kv *kv, const int64_t *tok, int64_t k, mr_from from, int64_t *bad);
/* mr_kv_free(kv, tok, k, MR_FROM_TREE, NULL) for KV the tree evicts, which
 * the tree owns by the lifecycle's invariant (mr_lc_check counts it), as
 * the tree keeps them: int32 (a val32 tree).  With page_size 1 the units
 * are not validated: one pass sets their owners, where mr_kv_free reads
 * and marks each first, and they join the free list as they are.  Paged
 * pools, and builds with MR_VERIFY_TRUSTED (common.h), take mr_kv_free's
 * path. */
int mr_kv_free_tree(mr_kv *kv, const int32_t *tok, int64_t k);
/* Free groups over the pages (mr_slots_free_group_begin / _end with the
 * page order of mr_kv_free). */
int mr_kv_free_group_begin(mr_kv *kv);
int mr_kv_free_group_end(mr_kv *kv);
/* Makes the next free / transfer of up to ntok tokens need no memory (so a
 * caller can take it after a change it cannot undo).  MR_ENOMEM. */
int mr_kv_reserve(mr_kv *kv, int64_t ntok);
/* Starts a check like mr_kv_distinct's (which a caller may fuse into its
 * own pass over the tokens): *gen is a generation no page's stamp has
 * (kv->stamp is allocated by the first call: MR_ENOMEM).  Then, for each
 * token tok[i] in order, of page p, with tok[from:i) the earlier tokens of
 * its block (page-sized run of positions), mr_kv_stamp_page() stamps p and
 * returns 1 when p was listed in an earlier block. */
int mr_kv_stamp_begin(mr_kv *kv, uint16_t *gen);
static inline int
mr_kv_stamp_page(mr_kv *kv, uint16_t gen, const int64_t *tok, int64_t i, int64_t from, int64_t p)
{
    if (kv->stamp[p] != gen) {
        kv->stamp[p] = gen;
        return 0;
    }
    for (int64_t j = i - 1; j >= from; j--) {   /* seen already: in this block? */
        if (tok[j] / kv->page_size == p) {
            return 0;
        }
    }
    return 1;
}
/* Checks that tok[0:k), the KV indices of key positions base .. base + k
 * - 1, name each page from one page-sized block of positions only (page
 * size 1: each token once): a value an insert could store or free twice.
 * Changes no unit (one pass, stamping each page with the call's
 * generation).  MR_EINVAL
 * with *bad (may be NULL) = the offending offset in tok, for a page listed
 * again or out of range; MR_ENOMEM when the first call cannot allocate
 * its stamps. */
int mr_kv_distinct(mr_kv *kv, const int64_t *tok, int64_t k, int64_t base, int64_t *bad);
/* Moves the pages of tokens tok[0:k) to owner `to` (see mr_slots_transfer). */
int mr_kv_transfer(mr_kv *kv, const int64_t *tok, int64_t k, mr_from from, int32_t to,
                   int64_t *bad);

/* Why mr_kv_free / mr_kv_transfer refused tok[0:k) (their status rc and
 * *bad), in terms of the caller's list: the entry `at` (the first naming
 * the refused unit, or the second listing of a token) and its unit's
 * owner.  For the messages of a refused free / transfer / release. */
typedef enum {
    MR_KV_WHY_STATUS,        /* no entry to blame: report rc itself */
    MR_KV_WHY_TWICE,         /* tok[at] is tok[first] listed again */
    MR_KV_WHY_RANGE,         /* tok[at] is out of range [page_size, (n + 1) * page_size) */
    MR_KV_WHY_FREE,          /* tok[at]'s unit is not allocated */
    MR_KV_WHY_PENDING,       /* ... it was freed in the open free group */
    MR_KV_WHY_TREE,          /* the prefix tree owns it, not the caller */
    MR_KV_WHY_ALLOC_GROUP,   /* the open alloc group holds it (not handed out yet) */
    MR_KV_WHY_ROW,           /* request row `owner` owns it, not the prefix tree */
    MR_KV_WHY_HELD,          /* a caller holds it, not the prefix tree */
} mr_kv_why;

typedef struct {
    mr_kv_why why;
    int64_t at, first;   /* entries of tok (first: MR_KV_WHY_TWICE only) */
    int32_t owner;       /* the unit's owner (MR_OWNER_*, or a request row) */
    int64_t value;       /* tok[at] (0 when at < 0) */
    int64_t page;        /* its page with page_size > 1, else -1 */
    int64_t lo, hi;      /* the token indices in range: [lo, hi) */
} mr_kv_refusal;

void mr_kv_explain(const mr_kv *kv, int rc, const int64_t *tok, int64_t k, int64_t bad, mr_kv_refusal *out);

#endif /* MR_SLOT_ALLOC_H */
