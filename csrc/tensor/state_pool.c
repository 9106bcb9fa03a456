/* state_pool.c - the state pool: layout and host-side index checks.
 * See state_pool.h. */
#include <string.h>

#include "alloc.h"
#include "state_pool.h"

int
mr_state_pool_init(mr_state_pool *p, const mr_tensor *const *tensors, int n, int *reason, int *which, int *other)
{
    memset(p, 0, sizeof(*p));
    *reason = MR_SP_OK;
    *which = *other = 0;
    if (n < 2 || n > MR_MAX_STATE_TENSORS) {
        *reason = MR_SP_COUNT;
        return MR_EINVAL;
    }
    memcpy(p->t, tensors, (size_t)n * sizeof(tensors[0]));
    p->nconv = n - 1;
    p->ntensors = n;
    const mr_tensor *first = p->t[0];
    for (int i = 0; i < p->ntensors; i++) {
        const mr_tensor *t = p->t[i];
        *which = i;
        if (t->ndim < 2) {
            *reason = MR_SP_NDIM;
            return MR_EINVAL;
        }
        if (t->shape[0] < 1 || t->shape[0] != first->shape[0]) {
            *reason = MR_SP_LAYERS;
            return MR_EINVAL;
        }
        if (t->shape[1] < 2 || t->shape[1] != first->shape[1]) {
            *reason = MR_SP_ROWS;
            return MR_EINVAL;
        }
        if (t->device_type != first->device_type || t->device_id != first->device_id) {
            *reason = MR_SP_DEVICE;
            return MR_EINVAL;
        }
        /* one slot's state in two tensors would be written twice */
        uintptr_t lo = (uintptr_t)t->data, hi = lo + (uintptr_t)t->numel * mr_dtype_size(t->dtype);
        for (int j = 0; j < i; j++) {
            const mr_tensor *u = p->t[j];
            uintptr_t ulo = (uintptr_t)u->data, uhi = ulo + (uintptr_t)u->numel * mr_dtype_size(u->dtype);
            if (lo < uhi && ulo < hi) {
                *reason = MR_SP_OVERLAP;
                *other = j;
                return MR_EINVAL;
            }
        }
    }
    *which = 0;
    p->layers = first->shape[0];
    p->slots = first->shape[1] - 1;
    p->device_type = first->device_type;
    p->device_id = first->device_id;
    p->layout.ntensors = p->ntensors;
    p->layout.layers = p->layers;
    p->layout.rows = p->slots + 1;
    p->bytes_per_slot = 0;
    for (int i = 0; i < p->ntensors; i++) {
        const mr_tensor *t = p->t[i];
        int64_t row = (int64_t)mr_dtype_size(t->dtype);
        for (int d = 2; d < t->ndim; d++) {
            row *= t->shape[d];
        }
        mr_state_desc *d = &p->layout.t[i];
        d->base = t->data;
        d->row_bytes = row;
        d->slot_stride = row;
        d->layer_stride = row * (p->slots + 1);
        p->bytes_per_slot += row * p->layers;
    }
    return MR_OK;
}

/* Sets *why and returns MR_EINVAL (MR_ENOMEM for MR_PAIR_NOMEM). */
static int
refuse_at(mr_refusal *why, int reason, int arg, int arg2, int64_t pos, int64_t value, int64_t limit)
{
    *why = (mr_refusal){reason, arg, arg2, pos, value, limit};
    return reason == MR_PAIR_NOMEM ? MR_ENOMEM : MR_EINVAL;
}

/* Arguments 0 (a) and bi (b) agree in placement and length. */
static int
agree(const mr_index *a, const mr_index *b, int bi, mr_refusal *why)
{
    if (a->on_device != b->on_device) {
        return refuse_at(why, MR_PAIR_PLACEMENT, 0, bi, 0, 0, 0);
    }
    if (a->n != b->n) {
        return refuse_at(why, MR_PAIR_LENGTH, 0, bi, a->n, b->n, 0);
    }
    return MR_OK;
}

int
mr_index_agree(const mr_index *a, const mr_index *b, mr_refusal *why)
{
    why->reason = MR_PAIR_OK;
    return agree(a, b, 1, why);
}

/* The first position i with x[i] outside [0, end), or -1. */
static int64_t
first_outside(const int64_t *x, int64_t n, int64_t end)
{
    for (int64_t i = 0; i < n; i++) {
        if (x[i] < 0 || x[i] >= end) {
            return i;
        }
    }
    return -1;
}

/* A host copy plan (arguments sa and da): indices in range, destinations
 * distinct and never a source.  With src NULL (sa -1) the destinations
 * alone are checked (a snapshot's: in range and distinct). */
static int
check_pairs(const mr_state_pool *p, const int64_t *src, const int64_t *dst, int64_t n, int sa, int da,
            mr_refusal *why)
{
    for (int64_t i = 0; i < n; i++) {
        if (src != NULL && (src[i] < 0 || src[i] > p->slots)) {
            return refuse_at(why, MR_PAIR_RANGE, sa, da, i, src[i], p->slots);
        }
        if (dst[i] < 0 || dst[i] > p->slots) {
            return refuse_at(why, MR_PAIR_RANGE, da, sa, i, dst[i], p->slots);
        }
        if (src != NULL && src[i] == dst[i]) {
            return refuse_at(why, MR_PAIR_SAME, sa, da, i, src[i], p->slots);
        }
    }
    /* One byte per slot: bit 0 = is a source, bit 1 = is a destination. */
    uint8_t *role = MR_CALLOC((size_t)p->slots + 1, 1);
    if (role == NULL) {
        return refuse_at(why, MR_PAIR_NOMEM, da, sa, 0, 0, 0);
    }
    for (int64_t i = 0; src != NULL && i < n; i++) {
        role[src[i]] |= 1;
    }
    int rc = MR_OK;
    for (int64_t i = 0; i < n; i++) {
        if (role[dst[i]] & 2) {
            rc = refuse_at(why, MR_PAIR_DST_TWICE, da, sa, i, dst[i], p->slots);
            break;
        }
        if (role[dst[i]] & 1) {
            rc = refuse_at(why, MR_PAIR_DST_IS_SRC, da, sa, i, dst[i], p->slots);
            break;
        }
        role[dst[i]] |= 2;
    }
    MR_FREE(role);
    return rc;
}

/* Keeps the pairs (a[i], b[i]) whose mask[i] is nonzero, in order, in
 * oa[] and ob[]; returns how many. */
static int64_t
index_select(const int64_t *a, const int64_t *b, const int64_t *mask, int64_t n, int64_t *oa, int64_t *ob)
{
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (mask[i]) {
            oa[m] = a[i];
            ob[m] = b[i];
            m++;
        }
    }
    return m;
}

static int
refuse(int *reason, int why)
{
    *reason = why;
    return MR_EINVAL;
}

/* 1 when src's memory overlaps one of the pool's state tensors. */
static int
overlaps_pool(const mr_state_pool *p, const mr_tensor *src)
{
    uintptr_t lo = (uintptr_t)src->data, hi = lo + (uintptr_t)src->numel * mr_dtype_size(src->dtype);
    for (int j = 0; j < p->ntensors; j++) {
        const mr_tensor *u = p->t[j];
        uintptr_t ulo = (uintptr_t)u->data, uhi = ulo + (uintptr_t)u->numel * mr_dtype_size(u->dtype);
        if (lo < uhi && ulo < hi) {
            return 1;
        }
    }
    return 0;
}

static int
ssm_plan(const mr_state_pool *p, int64_t layer, const mr_tensor *h, mr_ssm_snap *s, int *reason)
{
    const mr_tensor *tt = p->t[p->nconv];
    const mr_state_desc *td = &p->layout.t[p->nconv];
    int sd = tt->ndim - 2;   /* per-slot dims: h ends with them */
    int shape_ok = h->ndim >= sd + 1;
    for (int d = 0; shape_ok && d < sd; d++) {
        shape_ok = h->shape[h->ndim - sd + d] == tt->shape[2 + d];
    }
    if (!shape_ok) {
        return refuse(reason, MR_SNAP_SHAPE);
    }
    if (h->device_type != p->device_type || h->device_id != p->device_id) {
        return refuse(reason, MR_SNAP_DEVICE);
    }
    int convertible = (h->dtype == MR_DTYPE_FLOAT32 || h->dtype == MR_DTYPE_BFLOAT16)
                      && (tt->dtype == MR_DTYPE_FLOAT32 || tt->dtype == MR_DTYPE_BFLOAT16);
    if (h->dtype != tt->dtype && !convertible) {
        return refuse(reason, MR_SNAP_DTYPE);
    }
    if (overlaps_pool(p, h)) {
        return refuse(reason, MR_SNAP_OVERLAP);
    }
    memset(s, 0, sizeof(*s));
    s->elems = 1;
    for (int d = 0; d < sd; d++) {
        s->elems *= tt->shape[2 + d];
    }
    s->h_chunks = s->elems > 0 ? h->numel / s->elems : 0;
    s->h = h->data;
    s->h_dtype = h->dtype;
    s->dst_dtype = tt->dtype;
    s->dst_rows = p->slots + 1;
    s->dst_slot_stride = td->slot_stride;
    s->dst = td->base + layer * td->layer_stride;
    *reason = MR_SNAP_OK;
    return MR_OK;
}

static int
conv_plan(const mr_state_pool *p, int64_t layer, int64_t ci, const mr_tensor *x, mr_conv_snap *s,
                        int *reason)
{
    const mr_tensor *ct = p->t[ci];
    if (ct->ndim != 4) {
        return refuse(reason, MR_SNAP_CONV_NDIM);
    }
    *reason = MR_SNAP_OK;
    if (x == NULL) {
        return MR_OK;
    }
    if (x->ndim != 2 || x->shape[1] != ct->shape[2]) {
        return refuse(reason, MR_SNAP_SHAPE);
    }
    if (x->dtype != ct->dtype) {
        return refuse(reason, MR_SNAP_DTYPE);
    }
    if (x->device_type != p->device_type || x->device_id != p->device_id) {
        return refuse(reason, MR_SNAP_DEVICE);
    }
    if (overlaps_pool(p, x)) {
        return refuse(reason, MR_SNAP_OVERLAP);
    }
    const mr_state_desc *cd = &p->layout.t[ci];
    memset(s, 0, sizeof(*s));
    s->dst = cd->base + layer * cd->layer_stride;
    s->dst_slot_stride = cd->slot_stride;
    s->dst_rows = p->slots + 1;
    s->x = x->data;
    s->tokens = x->shape[0];
    s->dim = x->shape[1];
    s->km1 = ct->shape[3];
    s->elem_size = (int64_t)mr_dtype_size(ct->dtype);
    return MR_OK;
}

int
mr_state_pool_snap_plan(const mr_state_pool *p, int conv, int64_t layer, int64_t ci, const mr_tensor *src,
                        mr_snap_plan *s, int *reason)
{
    s->conv = conv;
    return conv ? conv_plan(p, layer, ci, src, &s->cs, reason) : ssm_plan(p, layer, src, &s->ssm, reason);
}

/* track_decode on host indices: the mask applied here, then the selected
 * pairs checked and copied. */
static int
track_host(const mr_state_pool *p, const mr_index *ix, void *stream, mr_refusal *why)
{
    int64_t n = ix[0].n;
    int64_t *fs = MR_MALLOC((size_t)(2 * n + 1) * sizeof(int64_t));
    if (fs == NULL) {
        return refuse_at(why, MR_PAIR_NOMEM, 0, -1, 0, 0, 0);
    }
    int64_t *fd = fs + n;
    int64_t m = index_select(ix[0].ptr, ix[1].ptr, ix[2].ptr, n, fs, fd);
    int rc = check_pairs(p, fs, fd, m, MR_ARG_MASKED + 0, MR_ARG_MASKED + 1, why);
    if (rc == MR_OK) {
        mr_index s = {fs, m, 64, 0}, d = {fd, m, 64, 0}, none = {NULL, 0, 0, 0};
        rc = mr_k_copy_slots(p->device_type, p->device_id, &p->layout, s, d, none, stream);
    }
    MR_FREE(fs);
    return rc;
}

/* A snapshot: the destinations checked like a copy's (without sources),
 * then the source indices against the plan. */
static int
snapshot(const mr_state_pool *p, const mr_snap_plan *s, const mr_index *ix, void *stream, mr_refusal *why)
{
    int rc = ix[1].on_device ? MR_OK : check_pairs(p, NULL, ix[1].ptr, ix[1].n, -1, 1, why);
    if (rc != MR_OK) {
        return rc;
    }
    if (s->conv && s->cs.tokens == 0 && ix[0].n > 0) {
        return refuse_at(why, MR_PAIR_NO_TOKENS, 0, -1, 0, 0, 0);
    }
    const int64_t *chunk = ix[0].ptr;
    int64_t bad = s->conv || ix[0].on_device ? -1 : first_outside(chunk, ix[0].n, s->ssm.h_chunks);
    if (bad >= 0) {
        return refuse_at(why, MR_PAIR_BELOW, 0, -1, bad, chunk[bad], s->ssm.h_chunks);
    }
    int32_t dt = p->device_type, di = p->device_id;
    return s->conv ? mr_k_snapshot_conv(dt, di, &s->cs, ix[0], ix[1], stream)
                   : mr_k_snapshot_ssm(dt, di, &s->ssm, ix[0], ix[1], stream);
}

int
mr_state_pool_run(const mr_state_pool *p, int op, const mr_index *ix, const mr_snap_plan *plan,
                  void *stream, mr_refusal *why)
{
    static const int nargs[] = {2, 1, 3, 2};
    why->reason = MR_PAIR_OK;
    for (int i = 1; i < nargs[op]; i++) {
        if (agree(&ix[0], &ix[i], i, why) != MR_OK) {
            return MR_EINVAL;
        }
    }
    int host = !ix[0].on_device;
    int32_t dt = p->device_type, di = p->device_id;
    mr_index none = {NULL, 0, 0, 0};
    int64_t bad;
    int rc;
    switch (op) {
    case MR_POOL_COPY:
        rc = host ? check_pairs(p, ix[0].ptr, ix[1].ptr, ix[0].n, 0, 1, why) : MR_OK;
        return rc != MR_OK ? rc : mr_k_copy_slots(dt, di, &p->layout, ix[0], ix[1], none, stream);
    case MR_POOL_CLEAR:
        bad = host ? first_outside(ix[0].ptr, ix[0].n, p->slots + 1) : -1;
        if (bad >= 0) {
            return refuse_at(why, MR_PAIR_RANGE, 0, -1, bad, ((const int64_t *)ix[0].ptr)[bad], p->slots);
        }
        return mr_k_clear_slots(dt, di, &p->layout, ix[0], stream);
    case MR_POOL_TRACK:
        return host ? track_host(p, ix, stream, why) : mr_k_copy_slots(dt, di, &p->layout, ix[0], ix[1], ix[2], stream);
    default:
        return snapshot(p, plan, ix, stream, why);
    }
}
