/* lc_record.h - where a front end's handle on a request record finds the
 * record (lifecycle.h, "Request records"): in the handle itself until the
 * request is admitted, then in its ReqPool row, which the handle names by
 * pool, row and the row's generation when the record moved in, until the
 * row is freed (the record comes back: mr_rec_take_back) or the request is
 * finished (mr_rec_finish).  A view names a row without ever holding the
 * record.  A row freed behind the handle's back changes the row's
 * generation: the handle is stale and its record gone (mr_rec_live). */
#ifndef MR_LC_RECORD_H
#define MR_LC_RECORD_H

#include <stdint.h>

#include "req_pool.h"

typedef struct {
    mr_req own;            /* the record while it is in no row */
    mr_reqpool *rp;        /* the pool whose row holds it, or NULL */
    int64_t row;           /* that row, -1 when none */
    uint32_t gen;          /* the row's generation when the record moved in */
    uint8_t view;          /* a view of the row: never takes the record */
} mr_rec;

/* A handle holding a fresh record (mr_req_reset), in no row. */
void mr_rec_init(mr_rec *h);
/* A view of row r of rp. */
void mr_rec_init_view(mr_rec *h, mr_reqpool *rp, int64_t r);
/* 1 when the record can be used: the handle's own, or its row still has
 * the generation it had when the record moved in; 0 when stale. */
int mr_rec_live(const mr_rec *h);
/* Copies the record out (a row's through mr_reqpool_load: its track
 * entries are the row's track map); the handle is live. */
void mr_rec_get(const mr_rec *h, mr_req *out);
/* Writes the record back where it lives; the handle is live. */
void mr_rec_put(mr_rec *h, const mr_req *st);
/* The record (rec, its new value) moves from the handle into row r of rp
 * (mr_reqpool_bind). */
void mr_rec_bind(mr_rec *h, const mr_req *rec, mr_reqpool *rp, int64_t r);
/* Row r's record was freed with generation gen (rec: what the row held):
 * it comes back to the handle when the handle's record is the one that
 * moved in then (not a view, not an older handle).  Returns 1 when it came
 * back. */
int mr_rec_take_back(mr_rec *h, uint32_t gen, const mr_req *rec);
/* The request is finished with the cache (st: its record's final value):
 * a record in its row leaves the row (mr_reqpool_unbind) and lives in the
 * handle again, as SGLang's Req keeps its fields; else it is written back.
 * Returns the row it left, or -1. */
int64_t mr_rec_finish(mr_rec *h, const mr_req *st);

#endif /* MR_LC_RECORD_H */
