/* req_pool.h - the req-to-token pool: request rows, their KV table and the
 * per-request recurrent-state bookkeeping.
 *
 *   table (int32, host)          state_map     track_map (pp = 2)
 *   row 0 [0 0 0 0 ...] pad      0             [0  0]
 *   row 1 [7 8 9 . ...]          12            [13 14]
 *   row 2 [7 8 4 5 ...]          15            [16 -1]   <- lazy: 1 held
 *
 * Row 0 is the padding row (CUDA-graph padded batches point at it) and is
 * never handed out.  A row's table entries are the KV indices of its tokens
 * in order.  state_map / track_map mirror SGLang's
 * req_index_to_mamba_index_mapping (int32) and
 * req_index_to_mamba_ping_pong_track_buffer_mapping (int64, -1 = empty).
 *
 * Every write through mr_reqpool_write() records the changed column range of
 * its row, so a device mirror of the table can be refreshed by copying only
 * those ranges (mr_reqpool_take_dirty()).
 *
 * Errors: MR_OK or a negative MR_E* code; a failed call changes nothing.
 */
#ifndef MR_REQ_POOL_H
#define MR_REQ_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "radix.h"
#include "slot_alloc.h"

/* The cache-side state of one request (SGLang's Req mamba_* fields, the
 * lock it holds, and the lengths the cache needs).  -1 means None. */
typedef struct {
    int64_t running;            /* mamba_pool_idx: the slot the forward updates */
    int64_t track[2];           /* mamba_ping_pong_track_buffer; -1 = empty */
    int32_t next_track;         /* mamba_next_track_idx (0/1), -1 = no buffer */
    uint8_t needs_clear;        /* mamba_needs_clear */
    uint8_t lazy_is_insert;     /* mamba_lazy_is_insert */
    uint8_t has_node;           /* last_node is set (root counts) */
    uint8_t locked;             /* last_node holds one lock of this request */
    int64_t last_track_seqlen;  /* mamba_last_track_seqlen */
    int64_t branching_seqlen;   /* mamba_branching_seqlen */
    int64_t cow_src;            /* mamba_cow_src_index */
    int64_t protected_len;      /* cache_protected_len */
    int64_t prefix_len;         /* len(prefix_indices) */
    int64_t committed;          /* kv_committed_len (batched calls) */
    mr_handle last_node;        /* last_node */
} mr_req;

/* Resets st to a fresh request: every field None / 0, lazy_is_insert = 1. */
void mr_req_reset(mr_req *st);

/* Where a request's record lives.  The batched calls keep it in the row
 * from admission to finish.  A per-request caller (the drop-in) keeps it
 * itself until the request has a row (a match with copy-on-write gives it a
 * slot before that), moves it into the row at admission (mr_reqpool_bind)
 * and gets it back when the row is freed (mr_reqpool_free_record): one
 * record per request, in its row while it holds one. */

/* How a row keeps its record (mr_reqpool.bound, bits; lifecycle.h, Q1..Q6).
 * 0: the batched calls' (or a reset record: a free row, a 13-tuple
 * caller's). */
enum {
    MR_ROW_BOUND = 1,      /* moved in by mr_reqpool_bind (the per-request calls): its track
                            * entries live in the row's track map (track_map[r]), which
                            * mr_reqpool_load / _store read and write */
    /* a slot the record names (running, track[0], track[1]) that a caller
     * handed to the tree with an insert outside the request calls: the
     * record keeps naming it, as SGLang's Req does, until the field changes */
    MR_ROW_GAVE_RUNNING = 2,
    MR_ROW_GAVE_TRACK0 = 4,
    MR_ROW_GAVE_TRACK1 = 8,
    MR_ROW_BATCH = 16,     /* admitted by prefill_batch: its record lives in the row (req[r]), and the
                            * per-request calls take only that record (a view of the row), not an
                            * outside one */
};

typedef struct {
    int64_t size;          /* rows 1..size */
    int64_t max_ctx;       /* columns of the table */
    int32_t pp;            /* track buffer width: 1 or 2 */
    int32_t *table;        /* (size + 1) * max_ctx, zeroed */
    int32_t *state_map;    /* size + 1 */
    int64_t *track_map;    /* (size + 1) * pp */
    mr_slots rows;         /* row allocator (owner HELD = in use) */
    mr_req *req;           /* size + 1 records: each request's, while it holds the row */
    uint32_t *gen;         /* size + 1: bumped whenever the row is taken or freed, so a
                            * handle (row, gen) kept past a free is detected */
    uint8_t *bound;        /* size + 1: MR_ROW_* (how the row keeps its record) */
    /* dirty column ranges since the last take: [lo, hi) per row */
    int64_t *dirty_lo;
    int64_t *dirty_hi;
    int64_t *dirty_rows;   /* rows with a non-empty range, in first-touch order */
    int64_t ndirty;
} mr_reqpool;

/* size >= 0 rows, max_ctx >= 1 columns, pp in {1, 2}.  MR_EINVAL, MR_ENOMEM
 * (p left zeroed). */
int mr_reqpool_init(mr_reqpool *p, int64_t size, int64_t max_ctx, int32_t pp);
void mr_reqpool_destroy(mr_reqpool *p);
/* Frees every row, zeroes both maps and resets every record (SGLang's
 * clear(); the table keeps its contents, as SGLang's does); every row's
 * generation changes. */
void mr_reqpool_clear(mr_reqpool *p);

/* Takes k rows (FIFO) into out.  MR_ENOSPC if fewer are free (none taken). */
int mr_reqpool_alloc(mr_reqpool *p, int64_t k, int64_t *out);
/* Returns row r.  MR_EINVAL if r is out of [1, size], MR_ENOENT if it is
 * free already (double free).  The row's record is reset. */
int mr_reqpool_free(mr_reqpool *p, int64_t r);
/* The same, first moving the row's record into *out (when not NULL; left
 * untouched on error). */
int mr_reqpool_free_record(mr_reqpool *p, int64_t r, mr_req *out);
/* Moves st into row r's record, marks the row bound and syncs its maps.
 * MR_EINVAL if r is not in use. */
int mr_reqpool_bind(mr_reqpool *p, int64_t r, const mr_req *st);
/* Row r's record (r in [0, size]); a bound row's track entries come from
 * its track map. */
void mr_reqpool_load(const mr_reqpool *p, int64_t r, mr_req *out);
/* Writes row r's record; a bound row's track entries go to its track map
 * too, and a field that changes is no longer a given-away slot. */
void mr_reqpool_store(mr_reqpool *p, int64_t r, const mr_req *st);
/* Moves row r's record out into *out (when not NULL) and resets it; the row
 * stays in use, unbound.  MR_EINVAL if r is not in use. */
int mr_reqpool_unbind(mr_reqpool *p, int64_t r, mr_req *out);
/* Row r's generation (0 out of range): it changes whenever the row is
 * taken or freed. */
uint32_t mr_reqpool_gen(const mr_reqpool *p, int64_t r);
/* 1 if row r is in use, 0 if free or out of range. */
int mr_reqpool_in_use(const mr_reqpool *p, int64_t r);
/* The rows of a batch call: each in use and listed once.  MR_EINVAL with
 * *bad = the first entry that is not a row in use or repeats an earlier
 * one (a repeated row would be finished, cached or stepped twice).  One
 * pass with the row allocator's scratch marks, cleared before returning. */
int mr_reqpool_rows_check(mr_reqpool *p, const int64_t *rows, size_t n, int64_t *bad);

/* Writes vals[0:n) to row r, columns [start, start + n), and records the
 * range as dirty.  MR_EINVAL when r, start or n is out of the table, or a
 * value does not fit int32. */
int mr_reqpool_write(mr_reqpool *p, int64_t r, int64_t start, const int64_t *vals, int64_t n);
/* mr_reqpool_write of values the caller has validated (KV indices the
 * tree or the KV pool holds, which fit int32), for the lifecycle's own
 * writes: the row and columns are checked, the values are not (builds with
 * MR_VERIFY_TRUSTED check them and abort). */
int mr_reqpool_write_trusted(mr_reqpool *p, int64_t r, int64_t start, const int64_t *vals, int64_t n);
/* Row r's columns [start, start + n) for the lifecycle to write in place
 * (values it has validated, as mr_reqpool_write_trusted's; it marks them
 * dirty with mr_reqpool_mark_dirty once written); NULL when they leave the
 * table. */
int32_t *mr_reqpool_span(mr_reqpool *p, int64_t r, int64_t start, int64_t n);
/* Row r, columns start + i * step for i in [0, n) (step may be negative),
 * gets the int32 (width 4) or int64 (width 8) value at vals + i * vstride
 * bytes (vstride 0: the one value, broadcast); the columns' span is
 * recorded as dirty.  Every column and value is checked before anything is
 * written: MR_EINVAL when r or a column is out of the table (*bad = -1) or
 * value i does not fit int32 (*bad = i); nothing changes then. */
int mr_reqpool_write_cols(mr_reqpool *p, int64_t r, int64_t start, int64_t step, int64_t n, const void *vals,
                          int width, int64_t vstride, int64_t *bad);
/* Why mr_reqpool_assign refused. */
typedef enum {
    MR_RP_ASSIGN_COUNT = 1,   /* nv values for n columns: neither n nor 1 */
    MR_RP_ASSIGN_COLS,        /* row r or a column leaves the table */
    MR_RP_ASSIGN_VALUE,       /* values[*bad] = *val does not fit int32 */
} mr_rp_assign_why;

/* table[r, columns start + i * step for i in [0, n)] = nv values, as torch
 * assigns them: nv is n, or 1 (the one value broadcast); width and vstride
 * as mr_reqpool_write_cols's.  MR_OK, or MR_EINVAL with *why (for
 * MR_RP_ASSIGN_VALUE the value's index in *bad and the value in *val);
 * nothing changes then. */
int mr_reqpool_assign(mr_reqpool *p, int64_t r, int64_t start, int64_t step, int64_t n, const void *vals, int width,
                      int64_t nv, int64_t vstride, int *why, int64_t *bad, int64_t *val);
/* 1 when nv values of width bytes, vstride bytes apart from vals (vstride
 * may be negative), share memory with the table: a copy between them is
 * not element by element then. */
int mr_reqpool_overlaps(const mr_reqpool *p, const void *vals, int width, int64_t nv, int64_t vstride);
/* Row r of the table, counted from the end when negative (a Python index
 * of its size + 1 rows) into *out.  MR_EINVAL when it leaves the table. */
int mr_reqpool_row_index(const mr_reqpool *p, int64_t r, int64_t *out);
/* Reads row r, columns [start, start + n) into out (int64). */
int mr_reqpool_read(const mr_reqpool *p, int64_t r, int64_t start, int64_t n, int64_t *out);
/* Records columns [start, end) of row r as dirty (for writes made through
 * the table view directly). */
void mr_reqpool_mark_dirty(mr_reqpool *p, int64_t r, int64_t start, int64_t end);
/* Copies out the dirty ranges (at most cap of them, none for cap <= 0;
 * rows, starts, ends) and forgets those copied.  Returns the number
 * written. */
int64_t mr_reqpool_take_dirty(mr_reqpool *p, int64_t *rows, int64_t *starts, int64_t *ends,
                              int64_t cap);

/* Sets row r's state_map entry and track_map row from st (SGLang writes
 * both on alloc and on every ping-pong slot change). */
void mr_reqpool_sync_maps(mr_reqpool *p, int64_t r, const mr_req *st);

/* Row allocator invariant (slot_alloc.h) plus: no free row is bound (free
 * rows having zeroed maps is NOT required: SGLang leaves them); returns
 * MR_OK or MR_ECORRUPT. */
int mr_reqpool_check(const mr_reqpool *p, char *msg, size_t msglen);

#endif /* MR_REQ_POOL_H */
