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
