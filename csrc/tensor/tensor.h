/* tensor.h - one owner type for tensor memory, whoever allocated it.
 *
 * An mr_tensor describes a compact row-major tensor on the CPU or on a CUDA
 * device and owns exactly one of:
 *   - a producer's DLPack managed tensor (imported through a capsule): the
 *     producer's deleter is called exactly once, by mr_tensor_release();
 *   - memory mambaradix allocated itself (host memory or cudaMalloc).
 * Tensors we allocate can be exported as DLPack managed tensors that keep
 * their owner alive through a caller-supplied reference (see
 * mr_tensor_export()).
 *
 * No Python here: the binding (py_dlpack.c) does the capsule protocol. */
#ifndef MR_TENSOR_H
#define MR_TENSOR_H

#include "common.h"
#include "dlpack_abi.h"
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MR_TENSOR_MAX_NDIM 8

/* Element types mambaradix understands. */
enum {
    MR_DTYPE_BOOL = 0,
    MR_DTYPE_INT8,
    MR_DTYPE_UINT8,
    MR_DTYPE_INT16,
    MR_DTYPE_INT32,
    MR_DTYPE_INT64,
    MR_DTYPE_FLOAT16,
    MR_DTYPE_BFLOAT16,
    MR_DTYPE_FLOAT32,
    MR_DTYPE_FLOAT64,
    MR_DTYPE_COUNT
};

typedef struct {
    char *data;                           /* first element (DLPack data + byte_offset) */
    int32_t device_type;                  /* MR_DL_CPU or MR_DL_CUDA */
    int32_t device_id;
    int dtype;                            /* MR_DTYPE_* */
    int ndim;
    int64_t shape[MR_TENSOR_MAX_NDIM];
    int64_t numel;
    /* Ownership: at most one of managed / own is set. */
    void *managed;                        /* producer's managed tensor */
    int versioned;                        /* managed is mr_dl_managed_versioned */
    void *own;                            /* our allocation, freed by release */
} mr_tensor;

/* ---- dtypes ---------------------------------------------------------- */

/* Maps a DLPack dtype to MR_DTYPE_*.  Returns MR_OK, or MR_EINVAL for
 * lanes != 1 or a type we do not handle. */
int mr_dtype_from_dl(mr_dl_dtype dt, int *out);
/* The DLPack dtype of an MR_DTYPE_*. */
mr_dl_dtype mr_dtype_to_dl(int dtype);
/* Element size in bytes of an MR_DTYPE_*. */
size_t mr_dtype_size(int dtype);
/* Canonical name ("bfloat16"), as numpy/torch spell it. */
const char *mr_dtype_name(int dtype);
/* Parses a dtype name: canonical names, "torch."-prefixed names and the
 * short forms bf16, fp16, fp32, fp64, half, float, double.  Returns MR_OK
 * or MR_EINVAL. */
int mr_dtype_from_name(const char *name, int *out);

/* ---- import ---------------------------------------------------------- */

/* Reasons mr_tensor_from_dl() refuses a tensor. */
enum {
    MR_TP_OK = 0,
    MR_TP_NDIM,        /* ndim < 0, > MR_TENSOR_MAX_NDIM, or shape NULL */
    MR_TP_DTYPE,       /* unknown dtype or lanes != 1 */
    MR_TP_DEVICE,      /* neither CPU nor CUDA */
    MR_TP_LAYOUT,      /* strides not compact row-major, or negative extent */
    MR_TP_NULL,        /* data NULL for a non-empty tensor */
    MR_TP_VERSION,     /* a versioned tensor of another major version than MR_DLPACK_MAJOR */
    MR_TP_READONLY,    /* flagged read-only, but the caller writes to it */
    MR_TP_NO_CUDA,     /* CUDA memory, but this build has no CUDA */
    MR_TP_CUDA_ID      /* a CUDA device this machine does not show */
};

/* True when strides (in elements; NULL means compact) describe a compact
 * row-major layout.  Dimensions of extent 1 are ignored, and any strides
 * are accepted when the tensor has at most one element. */
int mr_dl_is_compact(int ndim, const int64_t *shape, const int64_t *strides);

/* The DLTensor of a producer's managed tensor (an mr_dl_managed_versioned
 * when versioned, else an mr_dl_managed) and its flags (0 for a legacy
 * one).  Returns MR_OK, or MR_EINVAL for a versioned tensor of another
 * major version than MR_DLPACK_MAJOR. */
int mr_dl_unwrap(void *managed, int versioned, const mr_dl_tensor **dl, uint64_t *flags);

/* Fills *out from a DLTensor without taking ownership.  Returns MR_OK, or
 * MR_EINVAL with *problem set to one of MR_TP_*; *out is then unusable. */
int mr_tensor_from_dl(const mr_dl_tensor *dl, mr_tensor *out, int *problem);

/* Whether this build and machine reach memory on a device: MR_TP_OK,
 * MR_TP_NO_CUDA or MR_TP_CUDA_ID. */
int mr_device_reachable(int32_t device_type, int32_t device_id);

/* Everything a consumer checks of a producer's managed tensor before it
 * takes it (versioned: an mr_dl_managed_versioned, else an mr_dl_managed),
 * in this order: the version, the DLTensor (mr_tensor_from_dl), the
 * read-only flag when writable, the device's reachability.  Fills *out
 * without taking ownership (mr_tensor_adopt does).  Returns MR_OK, or
 * MR_EINVAL with *problem (MR_TP_*); *out is then unusable. */
int mr_tensor_take_dl(void *managed, int versioned, int writable, mr_tensor *out, int *problem);

/* Calls a managed tensor's deleter, when it has one. */
void mr_dl_delete(void *managed, int versioned);

/* ---- ownership ------------------------------------------------------- */

/* Gives *t ownership of a producer's managed tensor (versioned or not).
 * After this, mr_tensor_release() calls its deleter exactly once. */
void mr_tensor_adopt(mr_tensor *t, void *managed, int versioned);

/* Allocates a zero-filled compact tensor on the host (64-byte aligned) or
 * on CUDA device device_id.  Returns MR_OK; MR_ENOMEM, MR_EINVAL (bad
 * shape or dtype, or a size that overflows) or MR_ECUDA (also for a CUDA
 * device in a build without CUDA).  On failure *t is left empty. */
int mr_tensor_alloc(mr_tensor *t, int32_t device_type, int32_t device_id, int dtype,
                    int ndim, const int64_t *shape);

/* Releases what *t owns (producer deleter, or our memory) and empties it.
 * Safe on an empty tensor and on a tensor released before. */
void mr_tensor_release(mr_tensor *t);

/* Bytes of the tensor's data. */
static inline size_t
mr_tensor_nbytes(const mr_tensor *t)
{
    return (size_t)t->numel * mr_dtype_size(t->dtype);
}

/* ---- index tensors ---------------------------------------------------- */

/* 1 when a tensor of dtype may hold indices (int32, int64) or, with mask,
 * a mask (those and bool, uint8, int8). */
int mr_index_dtype_ok(int dtype, int mask);
/* Host data of an index tensor (a dtype mr_index_dtype_ok accepts) into
 * out as numel int64 values. */
void mr_index_to_host(const mr_tensor *t, int64_t *out);

/* Reasons mr_index_view() refuses an index tensor. */
enum {
    MR_IX_OK = 0,
    MR_IX_DTYPE,       /* not a dtype mr_index_dtype_ok accepts */
    MR_IX_NDIM,        /* more than one dimension */
    MR_IX_DEVICE       /* CUDA data on another device than the kernel's */
};

/* An index (mask 0) or mask (mask 1) tensor for a kernel on (dev_type,
 * dev_id): 0-d or 1-d, of an accepted dtype, and CUDA data only on that
 * very device.  Returns MR_OK with *out the tensor's data in place for
 * CUDA data, or with out->on_device 0 and out->ptr NULL for host data
 * (mr_index_to_host copies it); or MR_EINVAL with *problem (MR_IX_*). */
int mr_index_view(const mr_tensor *t, int mask, int32_t dev_type, int32_t dev_id, mr_index *out, int *problem);

/* ---- devices ---------------------------------------------------------- */

/* "cpu", "cuda:N", or "dlpack-device(type, id)" for another device. */
void mr_device_format(char *buf, size_t n, int32_t type, int32_t id);
/* Parses "cpu", "cuda" or "cuda:N".  Returns MR_OK, or MR_EINVAL. */
int mr_device_from_name(const char *name, int32_t *type, int32_t *id);
/* "[2, 3, 4]" and the size of such a tensor of dtype in GiB, as text
 * ("%.4g"): what an allocation's error reports. */
void mr_shape_format(char *dims, size_t ndims, char *gib, size_t ngib, int dtype, int ndim, const int64_t *shape);

/* ---- export ---------------------------------------------------------- */

/* Builds a managed tensor describing *t (compact strides given
 * explicitly).  versioned selects mr_dl_managed_versioned (version 1.1,
 * flags 0) or the legacy mr_dl_managed.  When the consumer calls the
 * deleter, the holder is freed and on_release(ctx) runs once; the caller
 * uses ctx to keep the memory's owner alive until then.  Returns MR_OK
 * with *out set, or MR_ENOMEM (on_release is then not called). */
int mr_tensor_export(const mr_tensor *t, int versioned, void *ctx, void (*on_release)(void *ctx),
                     void **out);

/* ---- a test producer --------------------------------------------------- */

/* What mr_dl_testing_make() builds. */
typedef struct {
    int ndim;
    const int64_t *shape;
    const int64_t *strides;            /* NULL: compact */
    int dtype;
    int64_t byte_offset;
    int32_t device_type, device_id;    /* a label only: the memory is host memory */
    int null_data;                     /* a NULL data pointer */
    int versioned;
    unsigned major, minor;             /* versioned only */
    int readonly;                      /* versioned only: MR_DL_FLAG_READ_ONLY */
} mr_dl_testing_spec;

/* A producer's managed tensor for tests (an mr_dl_managed_versioned or an
 * mr_dl_managed) over new host memory large enough for the strided extent:
 * byte_offset bytes of 0xEE, then byte i of the data = (i * 37 + 11) &
 * 0xFF.  Its deleter frees it and counts in mr_dl_testing_deleted().
 * Returns NULL when out of memory. */
void *mr_dl_testing_make(const mr_dl_testing_spec *s);
/* Frees such a tensor that was never handed out, without counting it. */
void mr_dl_testing_discard(void *managed, int versioned);
/* Deleter calls of mr_dl_testing_make's tensors, process-wide. */
long mr_dl_testing_deleted(void);

#ifdef __cplusplus
}
#endif

#endif /* MR_TENSOR_H */
