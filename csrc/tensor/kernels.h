/* kernels.h - the plain C ABI of the state kernels.
 *
 * Every kernel has a C twin (kernels_cpu.c, mr_cpu_*) used for host
 * tensors and a CUDA version (cuda/state_kernels.cu, mr_cuda_*) used for
 * device tensors; kernels_dispatch.c is the one place that chooses between
 * them (mr_k_*).  Arguments are raw pointers, byte strides, index vectors
 * and an opaque stream; functions return MR_OK or a negative MR_E* code and
 * never touch Python.
 *
 * The state pool's tensors are all shaped [layers, rows, ...] with
 * rows = slots + 1 (slot 0 is the padding slot).  A kernel sees each tensor
 * as rows of row_bytes bytes: row (layer, slot) starts at
 *     base + layer * layer_stride + slot * slot_stride.
 *
 * Index vectors (mr_index) are either host arrays of int64 (the binding
 * converts every host array to int64 first) or device arrays of
 * int32/int64 (masks: 8/32/64-bit, nonzero = true) that stay on the device
 * and are never read by the host.  Kernels skip an entry whose device-side
 * index is out of range (negative included) instead of writing out of
 * bounds; host-side indices are checked before any launch
 * (mr_state_pool_run for the state kernels, mr_rtt_check for a
 * req-to-token write). */
#ifndef MR_KERNELS_H
#define MR_KERNELS_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_MAX_STATE_TENSORS 8

/* One state tensor seen as rows of bytes. */
typedef struct {
    char *base;             /* element [0, 0, ...] */
    int64_t layer_stride;   /* bytes from layer l to layer l + 1 */
    int64_t slot_stride;    /* bytes from slot s to slot s + 1 */
    int64_t row_bytes;      /* bytes of one (layer, slot) row */
} mr_state_desc;

/* All state tensors of a pool (several conv tensors, then the temporal
 * tensor).  Every tensor has `layers` layers and `rows` rows per layer. */
typedef struct {
    int ntensors;
    int64_t layers;
    int64_t rows;
    mr_state_desc t[MR_MAX_STATE_TENSORS];
} mr_state_layout;

/* An index (or mask) vector. */
typedef struct {
    const void *ptr;        /* NULL when absent (optional arguments) */
    int64_t n;              /* number of entries */
    int bits;               /* element width: 64 (host), 8/32/64 (device) */
    int on_device;          /* 1: device memory on the pool's device */
} mr_index;

/* snapshot_ssm_from_h: dst[layer, slot[i]] = convert(h[chunk[i]]). */
typedef struct {
    char *dst;              /* the temporal tensor at [layer, 0] */
    int64_t dst_slot_stride;/* bytes */
    int64_t dst_rows;       /* rows per layer (slots + 1) */
    int dst_dtype;          /* MR_DTYPE_FLOAT32 / BFLOAT16 / FLOAT16 */
    const char *h;          /* h[0], compact [num_chunks, state elems] */
    int64_t h_chunks;       /* num_chunks */
    int h_dtype;
    int64_t elems;          /* elements of one state (H * V * K) */
} mr_ssm_snap;

/* snapshot_conv_window:
 *   for i, j < km1: dst[layer, slot[i], :, j] = x[clamp(pos[i] - km1 + j, 0, T - 1), :]
 * (the K - 1 pre-conv inputs before position pos[i], as SGLang's
 * _init_track_conv_indices picks them). */
typedef struct {
    char *dst;              /* the conv tensor at [layer, 0] */
    int64_t dst_slot_stride;/* bytes */
    int64_t dst_rows;
    const char *x;          /* x[0, 0], compact [T, dim] */
    int64_t tokens;         /* T */
    int64_t dim;
    int64_t km1;            /* K - 1 */
    int64_t elem_size;      /* bytes of one element (x and dst share the dtype) */
} mr_conv_snap;

/* write_req_to_token:
 *   ragged (ends given): table[rows[i], starts[i]:ends[i]] = values[off_i : off_i + len_i]
 *                        off_i = sum_{j<i} (ends[j] - starts[j])
 *   fixed  (no ends):    table[rows[i], starts[i]:starts[i] + width] = values[i*width : (i+1)*width] */
typedef struct {
    char *table;            /* table[0, 0], compact [nrows, ncols] */
    int64_t nrows;
    int64_t ncols;
    int table_bits;         /* 32 or 64 */
    const void *values;
    int64_t nvalues;
    int value_bits;         /* 32 or 64 */
    int values_on_device;
    int64_t width;          /* fixed mode: tokens per row; ignored when ends is given */
} mr_rtt_write;

/* Element-type helpers shared by the C twins and the CUDA kernels. */
#if defined(__CUDACC__)
#define MR_HD __host__ __device__ __forceinline__
#else
#define MR_HD static inline
#endif

/* bfloat16 <-> float32.  float -> bfloat16 rounds to nearest even and maps
 * every NaN to 0x7FC0, as torch does on the CPU. */
MR_HD float
mr_bf16_to_f32(uint16_t b)
{
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)b << 16;
    return v.f;
}

MR_HD uint16_t
mr_f32_to_bf16(float f)
{
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)0x7fc0u;
    }
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

/* ---- C twins (host pointers, host int64 indices) --------------------- */

/* Copies slot src[i] to slot dst[i] in every tensor and layer.  The
 * caller guarantees valid, pairwise distinct indices (dst unique and
 * disjoint from src).  Returns MR_OK. */
int mr_cpu_copy_slots(const mr_state_layout *L, const int64_t *src, const int64_t *dst, int64_t n);
/* Zeros slot idx[i] in every tensor and layer.  Returns MR_OK. */
int mr_cpu_clear_slots(const mr_state_layout *L, const int64_t *idx, int64_t n);
/* For each i with mask[i] != 0, copies slot running[i] to slot track[i].
 * Returns MR_OK. */
int mr_cpu_track_decode(const mr_state_layout *L, const int64_t *running, const int64_t *track,
                        const uint8_t *mask, int64_t n);
/* SSM snapshot; chunk/slot are host int64 arrays of n checked entries.
 * Returns MR_OK, or MR_EINVAL for an unsupported dtype pair. */
int mr_cpu_snapshot_ssm(const mr_ssm_snap *p, const int64_t *chunk, const int64_t *slot, int64_t n);
/* Conv window snapshot; pos/slot are host int64 arrays.  Returns MR_OK. */
int mr_cpu_snapshot_conv(const mr_conv_snap *p, const int64_t *pos, const int64_t *slot, int64_t n);
/* req-to-token write; rows/starts/ends (ends may be NULL) are host int64.
 * Returns MR_OK. */
int mr_cpu_write_req_to_token(const mr_rtt_write *p, const int64_t *rows, const int64_t *starts,
                              const int64_t *ends, int64_t n);

/* ---- CUDA (device pointers on `device`, launched on `stream`) -------- */

/* As the C twins.  Host index vectors are passed to the kernel by value
 * (in launches of up to MR_CUDA_INLINE_IDX entries); device index vectors
 * are read by the kernel, so these launches are capturable in a CUDA
 * graph (no host sync, no allocation).  Return MR_OK or MR_ECUDA. */
#define MR_CUDA_INLINE_IDX 192
int mr_cuda_copy_slots(int device, const mr_state_layout *L, mr_index src, mr_index dst,
                       mr_index mask, void *stream);
int mr_cuda_clear_slots(int device, const mr_state_layout *L, mr_index idx, void *stream);
int mr_cuda_snapshot_ssm(int device, const mr_ssm_snap *p, mr_index chunk, mr_index slot,
                         void *stream);
int mr_cuda_snapshot_conv(int device, const mr_conv_snap *p, mr_index pos, mr_index slot,
                          void *stream);
/* Device arrays only (rows/starts/ends/values all on the device), one
 * launch.  Returns MR_OK or MR_ECUDA. */
int mr_cuda_write_req_to_token(int device, const mr_rtt_write *p, mr_index rows, mr_index starts,
                               mr_index ends, void *stream);
/* Host-to-device copy of nbytes, ordered on stream (pageable source: the
 * call returns once the source may be reused).  Returns MR_OK or MR_ECUDA. */
int mr_cuda_memcpy_h2d(int device, void *dst, const void *src, size_t nbytes, void *stream);
/* cudaMalloc + zero fill (synchronous).  Returns MR_OK, MR_ENOMEM or MR_ECUDA. */
int mr_cuda_alloc_zeroed(int device, size_t nbytes, void **out);
/* cudaFree; errors are ignored (the memory is gone either way). */
void mr_cuda_free(int device, void *p);

/* ---- dispatch (kernels_dispatch.c) ----------------------------------- */

/* Same arguments as the CUDA versions plus the device type: host tensors
 * go to the C twins (every mr_index must then be a host int64 vector, a
 * mask a host uint8 vector), CUDA tensors to the CUDA kernels.  In a build
 * without CUDA, a CUDA device gives MR_ECUDA with the message "mambaradix
 * was built without CUDA". */
int mr_k_copy_slots(int32_t device_type, int device, const mr_state_layout *L, mr_index src,
                    mr_index dst, mr_index mask, void *stream);
int mr_k_clear_slots(int32_t device_type, int device, const mr_state_layout *L, mr_index idx,
                     void *stream);
int mr_k_snapshot_ssm(int32_t device_type, int device, const mr_ssm_snap *p, mr_index chunk,
                      mr_index slot, void *stream);
int mr_k_snapshot_conv(int32_t device_type, int device, const mr_conv_snap *p, mr_index pos,
                       mr_index slot, void *stream);
/* On CUDA with host index vectors, writes each row with one host-to-device
 * copy (values must then be host memory of the table's element type). */
int mr_k_write_req_to_token(int32_t device_type, int device, const mr_rtt_write *p, mr_index rows,
                            mr_index starts, mr_index ends, void *stream);
/* Reasons mr_rtt_check() refuses a host write plan. */
enum {
    MR_RTT_OK = 0,
    MR_RTT_ROW,       /* rows[at] is out of [0, nrows) */
    MR_RTT_ENDS,      /* ends[at] < starts[at] */
    MR_RTT_COLS,      /* the columns of entry at leave [0, ncols) */
    MR_RTT_TOTAL,     /* the ranges cover *at tokens, not nvalues */
    MR_RTT_INT32      /* values[at] does not fit an int32 table */
};
/* Checks a write with host rows/starts/ends (ends NULL: fixed width) and
 * host int64 values (p->values, p->nvalues), in the order above, before
 * anything is written.  Returns MR_OK, or MR_EINVAL with *reason and *at. */
int mr_rtt_check(const mr_rtt_write *p, const int64_t *rows, const int64_t *starts, const int64_t *ends,
                 int64_t n, int *reason, int64_t *at);
/* Checked host int64 values in a new buffer (MR_MALLOC) of the table's
 * element type (table_bits 32 or 64), for mr_k_write_req_to_token's copy
 * to a CUDA table: the caller may change its own values once the call
 * returns.  NULL when out of memory. */
void *mr_rtt_stage_values(const int64_t *values, int64_t n, int table_bits);
int mr_k_alloc_zeroed(int32_t device_type, int device, size_t nbytes, void **out);
void mr_k_free(int32_t device_type, int device, void *p);
/* 1 when this build has the CUDA kernels. */
int mr_k_have_cuda(void);

#ifdef __cplusplus
}
#endif

#endif /* MR_KERNELS_H */
