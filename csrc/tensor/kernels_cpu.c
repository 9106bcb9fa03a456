/* kernels_cpu.c - the C twins of the state kernels (host tensors).
 *
 * They are the reference the CUDA kernels are tested against: the same
 * arguments, the same results, bit for bit.  Index arguments are host int64
 * arrays already checked (mr_state_pool_run, mr_rtt_check). */
#include <string.h>

#include "kernels.h"
#include "tensor.h"

/* Start of row (layer, slot) of tensor d. */
static inline char *
row_ptr(const mr_state_desc *d, int64_t layer, int64_t slot)
{
    return d->base + layer * d->layer_stride + slot * d->slot_stride;
}

int
mr_cpu_copy_slots(const mr_state_layout *L, const int64_t *src, const int64_t *dst, int64_t n)
{
    for (int t = 0; t < L->ntensors; t++) {
        const mr_state_desc *d = &L->t[t];
        for (int64_t l = 0; l < L->layers; l++) {
            for (int64_t i = 0; i < n; i++) {
                memcpy(row_ptr(d, l, dst[i]), row_ptr(d, l, src[i]), (size_t)d->row_bytes);
            }
        }
    }
    return MR_OK;
}

int
mr_cpu_clear_slots(const mr_state_layout *L, const int64_t *idx, int64_t n)
{
    for (int t = 0; t < L->ntensors; t++) {
        const mr_state_desc *d = &L->t[t];
        for (int64_t l = 0; l < L->layers; l++) {
            for (int64_t i = 0; i < n; i++) {
                memset(row_ptr(d, l, idx[i]), 0, (size_t)d->row_bytes);
            }
        }
    }
    return MR_OK;
}

int
mr_cpu_track_decode(const mr_state_layout *L, const int64_t *running, const int64_t *track,
                    const uint8_t *mask, int64_t n)
{
    for (int t = 0; t < L->ntensors; t++) {
        const mr_state_desc *d = &L->t[t];
        for (int64_t l = 0; l < L->layers; l++) {
            for (int64_t i = 0; i < n; i++) {
                if (mask[i]) {
                    memcpy(row_ptr(d, l, track[i]), row_ptr(d, l, running[i]), (size_t)d->row_bytes);
                }
            }
        }
    }
    return MR_OK;
}

/* Reads element k of a float array of dtype dt as float32 (float64 is
 * narrowed).  Only called for the float dtypes accepted below. */
static inline float
load_f(const char *p, int dt, int64_t k)
{
    switch (dt) {
    case MR_DTYPE_BFLOAT16: {
        uint16_t b;
        memcpy(&b, p + 2 * k, 2);
        return mr_bf16_to_f32(b);
    }
    default: {
        float f;
        memcpy(&f, p + 4 * k, 4);
        return f;
    }
    }
}

static inline void
store_f(char *p, int dt, int64_t k, float f)
{
    if (dt == MR_DTYPE_BFLOAT16) {
        uint16_t b = mr_f32_to_bf16(f);
        memcpy(p + 2 * k, &b, 2);
    }
    else {
        memcpy(p + 4 * k, &f, 4);
    }
}

int
mr_cpu_snapshot_ssm(const mr_ssm_snap *p, const int64_t *chunk, const int64_t *slot, int64_t n)
{
    size_t hsz = mr_dtype_size(p->h_dtype);
    size_t dsz = mr_dtype_size(p->dst_dtype);
    int same = p->h_dtype == p->dst_dtype;
    if (!same && !((p->h_dtype == MR_DTYPE_FLOAT32 || p->h_dtype == MR_DTYPE_BFLOAT16)
                   && (p->dst_dtype == MR_DTYPE_FLOAT32 || p->dst_dtype == MR_DTYPE_BFLOAT16))) {
        return MR_EINVAL;
    }
    for (int64_t i = 0; i < n; i++) {
        const char *s = p->h + chunk[i] * p->elems * (int64_t)hsz;
        char *d = p->dst + slot[i] * p->dst_slot_stride;
        if (same) {
            memcpy(d, s, (size_t)p->elems * dsz);
            continue;
        }
        for (int64_t k = 0; k < p->elems; k++) {
            store_f(d, p->dst_dtype, k, load_f(s, p->h_dtype, k));
        }
    }
    return MR_OK;
}

int
mr_cpu_snapshot_conv(const mr_conv_snap *p, const int64_t *pos, const int64_t *slot, int64_t n)
{
    size_t es = (size_t)p->elem_size;
    for (int64_t i = 0; i < n; i++) {
        char *d = p->dst + slot[i] * p->dst_slot_stride;
        for (int64_t j = 0; j < p->km1; j++) {
            /* (clamped below 0 without the subtraction wrapping: positions take any int64) */
            int64_t t = pos[i] < INT64_MIN + p->km1 ? 0 : pos[i] - p->km1 + j;
            t = t < 0 ? 0 : (t > p->tokens - 1 ? p->tokens - 1 : t);
            const char *xrow = p->x + t * p->dim * (int64_t)es;
            for (int64_t c = 0; c < p->dim; c++) {
                memcpy(d + (c * p->km1 + j) * (int64_t)es, xrow + c * (int64_t)es, es);
            }
        }
    }
    return MR_OK;
}

/* Reads value k of an int32/int64 array as int64. */
static inline int64_t
load_i(const void *p, int bits, int64_t k)
{
    if (bits == 32) {
        return ((const int32_t *)p)[k];
    }
    return ((const int64_t *)p)[k];
}

int
mr_cpu_write_req_to_token(const mr_rtt_write *p, const int64_t *rows, const int64_t *starts,
                          const int64_t *ends, int64_t n)
{
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = ends != NULL ? ends[i] - starts[i] : p->width;
        int64_t voff = ends != NULL ? off : i * p->width;
        char *row = p->table + rows[i] * p->ncols * (p->table_bits / 8);
        for (int64_t k = 0; k < len; k++) {
            int64_t v = load_i(p->values, p->value_bits, voff + k);
            if (p->table_bits == 32) {
                ((int32_t *)row)[starts[i] + k] = (int32_t)v;
            }
            else {
                ((int64_t *)row)[starts[i] + k] = v;
            }
        }
        off += len;
    }
    return MR_OK;
}
