/* kernels_dispatch.c - the one place that chooses between the C twins and
 * the CUDA kernels, on the tensors' DLPack device type.  This and module.c
 * are the only C files that test MR_WITH_CUDA. */
#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "dlpack_abi.h"
#include "kernels.h"

#ifndef MR_WITH_CUDA
/* The CPU-only build has no CUDA error buffer of its own: cuda_stub.c's
 * mr_last_cuda_error() already says "built without CUDA". */
#define MR_NO_CUDA() return MR_ECUDA
#endif

int
mr_k_have_cuda(void)
{
#ifdef MR_WITH_CUDA
    return 1;
#else
    return 0;
#endif
}

int
mr_k_copy_slots(int32_t device_type, int device, const mr_state_layout *L, mr_index src,
                mr_index dst, mr_index mask, void *stream)
{
    if (device_type == MR_DL_CPU) {
        if (mask.ptr != NULL) {
            return mr_cpu_track_decode(L, src.ptr, dst.ptr, mask.ptr, src.n);
        }
        return mr_cpu_copy_slots(L, src.ptr, dst.ptr, src.n);
    }
#ifdef MR_WITH_CUDA
    return mr_cuda_copy_slots(device, L, src, dst, mask, stream);
#else
    MR_NO_CUDA();
#endif
}

int
mr_k_clear_slots(int32_t device_type, int device, const mr_state_layout *L, mr_index idx,
                 void *stream)
{
    if (device_type == MR_DL_CPU) {
        return mr_cpu_clear_slots(L, idx.ptr, idx.n);
    }
#ifdef MR_WITH_CUDA
    return mr_cuda_clear_slots(device, L, idx, stream);
#else
    MR_NO_CUDA();
#endif
}

int
mr_k_snapshot_ssm(int32_t device_type, int device, const mr_ssm_snap *p, mr_index chunk,
                  mr_index slot, void *stream)
{
    if (device_type == MR_DL_CPU) {
        return mr_cpu_snapshot_ssm(p, chunk.ptr, slot.ptr, chunk.n);
    }
#ifdef MR_WITH_CUDA
    return mr_cuda_snapshot_ssm(device, p, chunk, slot, stream);
#else
    MR_NO_CUDA();
#endif
}

int
mr_k_snapshot_conv(int32_t device_type, int device, const mr_conv_snap *p, mr_index pos,
                   mr_index slot, void *stream)
{
    if (device_type == MR_DL_CPU) {
        return mr_cpu_snapshot_conv(p, pos.ptr, slot.ptr, pos.n);
    }
#ifdef MR_WITH_CUDA
    return mr_cuda_snapshot_conv(device, p, pos, slot, stream);
#else
    MR_NO_CUDA();
#endif
}

int
mr_k_write_req_to_token(int32_t device_type, int device, const mr_rtt_write *p, mr_index rows,
                        mr_index starts, mr_index ends, void *stream)
{
    if (device_type == MR_DL_CPU) {
        return mr_cpu_write_req_to_token(p, rows.ptr, starts.ptr, ends.ptr, rows.n);
    }
#ifdef MR_WITH_CUDA
    if (rows.on_device) {
        return mr_cuda_write_req_to_token(device, p, rows, starts, ends, stream);
    }
    /* Host indices: each row's range is contiguous in the table, so it is
     * one host-to-device copy of values already in the table's type. */
    const int64_t *r = rows.ptr, *s = starts.ptr, *e = ends.ptr;
    size_t es = (size_t)p->table_bits / 8;
    int64_t off = 0;
    for (int64_t i = 0; i < rows.n; i++) {
        int64_t len = e != NULL ? e[i] - s[i] : p->width;
        int64_t voff = e != NULL ? off : i * p->width;
        if (len > 0) {
            int rc = mr_cuda_memcpy_h2d(device, p->table + (r[i] * p->ncols + s[i]) * (int64_t)es,
                                        (const char *)p->values + voff * (int64_t)es,
                                        (size_t)len * es, stream);
            if (rc != MR_OK) {
                return rc;
            }
        }
        off += len;
    }
    return MR_OK;
#else
    MR_NO_CUDA();
#endif
}

int
mr_rtt_check(const mr_rtt_write *p, const int64_t *r, const int64_t *s, const int64_t *e, int64_t n, int *reason,
             int64_t *at)
{
    int64_t total = 0;
    *reason = MR_RTT_OK;
    for (int64_t i = 0; i < n; i++) {
        /* every bound compared without a difference or sum that could
         * overflow (starts and ends take any int64) */
        int64_t len = p->width;
        *at = i;
        if (r[i] < 0 || r[i] >= p->nrows) {
            *reason = MR_RTT_ROW;
        }
        else if (e != NULL && e[i] < s[i]) {
            *reason = MR_RTT_ENDS;
        }
        else if (s[i] < 0 || s[i] > p->ncols) {
            *reason = MR_RTT_COLS;
        }
        else {
            len = e != NULL ? e[i] - s[i] : p->width;   /* e[i] >= s[i] >= 0 */
            if (len > p->ncols - s[i]) {
                *reason = MR_RTT_COLS;
            }
        }
        if (*reason != MR_RTT_OK) {
            return MR_EINVAL;
        }
        if (len > p->nvalues - total) {
            *reason = MR_RTT_TOTAL;   /* more values than given, already */
            *at = total > INT64_MAX - len ? INT64_MAX : total + len;
            return MR_EINVAL;
        }
        total += len;
    }
    if (total != p->nvalues) {
        *reason = MR_RTT_TOTAL;
        *at = total;
        return MR_EINVAL;
    }
    const int64_t *v = p->values;
    for (int64_t k = 0; p->table_bits == 32 && k < p->nvalues; k++) {
        if (v[k] < INT32_MIN || v[k] > INT32_MAX) {
            *reason = MR_RTT_INT32;
            *at = k;
            return MR_EINVAL;
        }
    }
    return MR_OK;
}

void *
mr_rtt_stage_values(const int64_t *v, int64_t n, int table_bits)
{
    size_t es = (size_t)table_bits / 8;
    void *buf = MR_MALLOC((size_t)(n > 0 ? n : 1) * es);
    if (buf == NULL) {
        return NULL;
    }
    if (es == sizeof(int32_t)) {
        for (int64_t k = 0; k < n; k++) {
            ((int32_t *)buf)[k] = (int32_t)v[k];   /* in range: mr_rtt_check */
        }
    }
    else if (n > 0) {
        memcpy(buf, v, (size_t)n * es);
    }
    return buf;
}

int
mr_k_alloc_zeroed(int32_t device_type, int device, size_t nbytes, void **out)
{
    if (device_type == MR_DL_CPU) {
        /* 64-byte aligned, at least one line so that a 0-byte tensor still
         * has a distinct non-NULL pointer. */
        size_t n = (nbytes + 63) / 64 * 64;
        void *p = NULL;
        if (n == 0) {
            n = 64;
        }
        if (n < nbytes || posix_memalign(&p, 64, n) != 0) {
            return MR_ENOMEM;
        }
        memset(p, 0, n);
        *out = p;
        return MR_OK;
    }
#ifdef MR_WITH_CUDA
    return mr_cuda_alloc_zeroed(device, nbytes, out);
#else
    MR_NO_CUDA();
#endif
}

void
mr_k_free(int32_t device_type, int device, void *p)
{
    if (device_type == MR_DL_CPU) {
        free(p);
        return;
    }
#ifdef MR_WITH_CUDA
    mr_cuda_free(device, p);
#endif
}
