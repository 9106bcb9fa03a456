/* state_pool.c - the state pool: layout and host-side index checks.
 * See state_pool.h. */
#include <string.h>

#include "alloc.h"
#include "state_pool.h"

int
mr_state_pool_init(mr_state_pool *p, const mr_tensor *const *conv, int nconv,
                   const mr_tensor *temporal, int *reason, int *which)
{
    memset(p, 0, sizeof(*p));
    *reason = MR_SP_OK;
    *which = 0;
    if (nconv < 1 || nconv > MR_MAX_STATE_TENSORS - 1) {
        *reason = MR_SP_COUNT;
        return MR_EINVAL;
    }
    for (int i = 0; i < nconv; i++) {
        p->t[i] = conv[i];
    }
    p->t[nconv] = temporal;
    p->nconv = nconv;
    p->ntensors = nconv + 1;
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
                *which = i | (j << 8);
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

int
mr_state_pool_check_slots(const mr_state_pool *p, const int64_t *idx, int64_t n, int64_t *bad)
{
    for (int64_t i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] > p->slots) {
            *bad = i;
            return MR_EINVAL;
        }
    }
    return MR_OK;
}

int
mr_state_pool_check_pairs(const mr_state_pool *p, const int64_t *src, const int64_t *dst,
                          int64_t n, int *reason, int64_t *bad)
{
    *reason = MR_PAIR_OK;
    for (int64_t i = 0; i < n; i++) {
        *bad = i;
        if (src != NULL && (src[i] < 0 || src[i] > p->slots)) {
            *reason = MR_PAIR_RANGE_SRC;
            return MR_EINVAL;
        }
        if (dst[i] < 0 || dst[i] > p->slots) {
            *reason = MR_PAIR_RANGE_DST;
            return MR_EINVAL;
        }
        if (src != NULL && src[i] == dst[i]) {
            *reason = MR_PAIR_SAME;
            return MR_EINVAL;
        }
    }
    /* One byte per slot: bit 0 = is a source, bit 1 = is a destination. */
    uint8_t *role = MR_CALLOC((size_t)p->slots + 1, 1);
    if (role == NULL) {
        return MR_ENOMEM;
    }
    for (int64_t i = 0; src != NULL && i < n; i++) {
        role[src[i]] |= 1;
    }
    int rc = MR_OK;
    for (int64_t i = 0; i < n; i++) {
        if (role[dst[i]] & 2) {
            *reason = MR_PAIR_DST_TWICE;
            *bad = i;
            rc = MR_EINVAL;
            break;
        }
        if (role[dst[i]] & 1) {
            *reason = MR_PAIR_DST_IS_SRC;
            *bad = i;
            rc = MR_EINVAL;
            break;
        }
        role[dst[i]] |= 2;
    }
    MR_FREE(role);
    return rc;
}

int
mr_index_check_below(const int64_t *x, int64_t n, int64_t end, int64_t *bad)
{
    for (int64_t i = 0; i < n; i++) {
        if (x[i] < 0 || x[i] >= end) {
            *bad = i;
            return MR_EINVAL;
        }
    }
    return MR_OK;
}

int64_t
mr_index_select(const int64_t *a, const int64_t *b, const int64_t *mask, int64_t n, int64_t *oa, int64_t *ob)
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

int
mr_state_pool_ssm_plan(const mr_state_pool *p, int64_t layer, const mr_tensor *h, mr_ssm_snap *s, int *reason)
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

int
mr_state_pool_conv_plan(const mr_state_pool *p, int64_t layer, int64_t ci, const mr_tensor *x, mr_conv_snap *s,
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
mr_state_pool_copy(const mr_state_pool *p, mr_index src, mr_index dst, void *stream)
{
    mr_index none = {NULL, 0, 0, 0};
    return mr_k_copy_slots(p->device_type, p->device_id, &p->layout, src, dst, none, stream);
}

int
mr_state_pool_clear(const mr_state_pool *p, mr_index idx, void *stream)
{
    return mr_k_clear_slots(p->device_type, p->device_id, &p->layout, idx, stream);
}

int
mr_state_pool_track(const mr_state_pool *p, mr_index running, mr_index track, mr_index mask,
                    void *stream)
{
    return mr_k_copy_slots(p->device_type, p->device_id, &p->layout, running, track, mask, stream);
}
