/* dlpack_abi.h - the DLPack ABI (version 1.x), declared here so the build
 * needs no dlpack header.  Layouts follow the DLPack C specification; the
 * static assertions below pin the sizes and offsets of the x86-64/aarch64
 * LP64 ABI that every producer we talk to (numpy, torch, CuPy, JAX) uses.
 *
 * Capsule protocol (Python side): a producer hands out a PyCapsule named
 * "dltensor_versioned" (pointer to mr_dl_managed_versioned) or, for old
 * producers, "dltensor" (pointer to mr_dl_managed).  A consumer that takes
 * ownership renames it to "used_dltensor_versioned" / "used_dltensor" and
 * then calls the deleter exactly once. */
#ifndef MR_DLPACK_ABI_H
#define MR_DLPACK_ABI_H

#include <stddef.h>
#include <stdint.h>

/* The newest version we produce and understand. */
#define MR_DLPACK_MAJOR 1
#define MR_DLPACK_MINOR 1

/* Device types (DLDeviceType). */
#define MR_DL_CPU          1
#define MR_DL_CUDA         2
#define MR_DL_CUDA_HOST    3
#define MR_DL_CUDA_MANAGED 13

/* Data type codes (DLDataTypeCode). */
#define MR_DL_INT    0
#define MR_DL_UINT   1
#define MR_DL_FLOAT  2
#define MR_DL_BFLOAT 4
#define MR_DL_BOOL   6

/* Flag bits of mr_dl_managed_versioned.flags. */
#define MR_DL_FLAG_READ_ONLY ((uint64_t)1 << 0)
#define MR_DL_FLAG_IS_COPIED ((uint64_t)1 << 1)

typedef struct {
    uint32_t major;
    uint32_t minor;
} mr_dl_version;

typedef struct {
    int32_t device_type;
    int32_t device_id;
} mr_dl_device;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} mr_dl_dtype;

typedef struct {
    void *data;              /* base pointer; the first element is at data + byte_offset */
    mr_dl_device device;
    int32_t ndim;
    mr_dl_dtype dtype;
    int64_t *shape;          /* ndim extents */
    int64_t *strides;        /* ndim strides in elements, or NULL for compact row-major */
    uint64_t byte_offset;
} mr_dl_tensor;

/* Legacy (pre-1.0) managed tensor: no version, no flags. */
typedef struct mr_dl_managed {
    mr_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct mr_dl_managed *self);
} mr_dl_managed;

/* Versioned managed tensor (DLPack >= 1.0).  Everything up to and including
 * `deleter` keeps its place in every future version, so the deleter can be
 * called whatever the major version. */
typedef struct mr_dl_managed_versioned {
    mr_dl_version version;
    void *manager_ctx;
    void (*deleter)(struct mr_dl_managed_versioned *self);
    uint64_t flags;
    mr_dl_tensor dl_tensor;
} mr_dl_managed_versioned;

#ifndef __cplusplus
_Static_assert(sizeof(mr_dl_version) == 8, "DLPackVersion is 8 bytes");
_Static_assert(sizeof(mr_dl_device) == 8, "DLDevice is 8 bytes");
_Static_assert(sizeof(mr_dl_dtype) == 4, "DLDataType is 4 bytes");
_Static_assert(offsetof(mr_dl_tensor, device) == 8, "DLTensor.device offset");
_Static_assert(offsetof(mr_dl_tensor, ndim) == 16, "DLTensor.ndim offset");
_Static_assert(offsetof(mr_dl_tensor, dtype) == 20, "DLTensor.dtype offset");
_Static_assert(offsetof(mr_dl_tensor, shape) == 24, "DLTensor.shape offset");
_Static_assert(offsetof(mr_dl_tensor, strides) == 32, "DLTensor.strides offset");
_Static_assert(offsetof(mr_dl_tensor, byte_offset) == 40, "DLTensor.byte_offset offset");
_Static_assert(sizeof(mr_dl_tensor) == 48, "DLTensor is 48 bytes");
_Static_assert(offsetof(mr_dl_managed, manager_ctx) == 48, "DLManagedTensor.manager_ctx offset");
_Static_assert(offsetof(mr_dl_managed, deleter) == 56, "DLManagedTensor.deleter offset");
_Static_assert(sizeof(mr_dl_managed) == 64, "DLManagedTensor is 64 bytes");
_Static_assert(offsetof(mr_dl_managed_versioned, manager_ctx) == 8, "versioned manager_ctx offset");
_Static_assert(offsetof(mr_dl_managed_versioned, deleter) == 16, "versioned deleter offset");
_Static_assert(offsetof(mr_dl_managed_versioned, flags) == 24, "versioned flags offset");
_Static_assert(offsetof(mr_dl_managed_versioned, dl_tensor) == 32, "versioned dl_tensor offset");
_Static_assert(sizeof(mr_dl_managed_versioned) == 80, "DLManagedTensorVersioned is 80 bytes");
#endif

#endif /* MR_DLPACK_ABI_H */
