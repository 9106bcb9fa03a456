/* lc_record.c - a front end's handle on a request record (lc_record.h). */
#include "lc_record.h"

void
mr_rec_init(mr_rec *h)
{
    mr_req_reset(&h->own);
    h->rp = NULL;
    h->row = -1;
    h->gen = 0;
    h->view = 0;
}

void
mr_rec_init_view(mr_rec *h, mr_reqpool *rp, int64_t r)
{
    mr_req_reset(&h->own);
    h->rp = rp;
    h->row = r;
    h->gen = mr_reqpool_gen(rp, r);
    h->view = 1;
}

int
mr_rec_live(const mr_rec *h)
{
    return h->rp == NULL || mr_reqpool_gen(h->rp, h->row) == h->gen;
}

void
mr_rec_get(const mr_rec *h, mr_req *out)
{
    if (h->rp == NULL) {
        *out = h->own;
    }
    else {
        mr_reqpool_load(h->rp, h->row, out);
    }
}

void
mr_rec_put(mr_rec *h, const mr_req *st)
{
    if (h->rp == NULL) {
        h->own = *st;
    }
    else {
        mr_reqpool_store(h->rp, h->row, st);
    }
}

void
mr_rec_bind(mr_rec *h, const mr_req *rec, mr_reqpool *rp, int64_t r)
{
    (void)mr_reqpool_bind(rp, r, rec);
    mr_req_reset(&h->own);
    h->rp = rp;
    h->row = r;
    h->gen = mr_reqpool_gen(rp, r);
}

/* The record leaves its row (rec: what the row held) and lives in h. */
static void
unbind(mr_rec *h, const mr_req *rec)
{
    h->own = *rec;
    h->row = -1;
    h->rp = NULL;
}

int
mr_rec_take_back(mr_rec *h, uint32_t gen, const mr_req *rec)
{
    if (h->rp == NULL || h->view || h->gen != gen) {
        return 0;
    }
    unbind(h, rec);
    return 1;
}

int64_t
mr_rec_finish(mr_rec *h, const mr_req *st)
{
    if (h->rp == NULL || h->view) {
        mr_rec_put(h, st);
        return -1;
    }
    int64_t r = h->row;
    (void)mr_reqpool_unbind(h->rp, r, NULL);
    unbind(h, st);
    return r;
}
