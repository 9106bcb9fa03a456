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
        if (src[i] < 0 || src[i] > p->slots) {
            *reason = MR_PAIR_RANGE_SRC;
            return MR_EINVAL;
        }
        if (dst[i] < 0 || dst[i] > p->slots) {
            *reason = MR_PAIR_RANGE_DST;
            return MR_EINVAL;
        }
        if (src[i] == dst[i]) {
            *reason = MR_PAIR_SAME;
            return MR_EINVAL;
        }
    }
    /* One byte per slot: bit 0 = is a source, bit 1 = is a destination. */
    uint8_t *role = MR_CALLOC((size_t)p->slots + 1, 1);
    if (role == NULL) {
        return MR_ENOMEM;
    }
    for (int64_t i = 0; i < n; i++) {
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
