/* py_tensor.h - what the tensor binding files share: py_dlpack.c (the
 * Tensor type, DLPack in and out, the argument converters, a test-only
 * producer), py_state_pool.c (the StatePool type and its kernel methods),
 * py_kernels.c (the kernels' index arguments) and py_req_to_token.c
 * (write_req_to_token). */
#ifndef MR_PY_TENSOR_H
#define MR_PY_TENSOR_H

#include "py_common.h"
#include "py_ints.h"
#include "kernels.h"
#include "state_pool.h"
#include "tensor.h"

typedef struct {
    PyObject_HEAD
    mr_tensor t;
} TensorObject;

typedef struct {
    PyObject_HEAD
    PyObject *tensors;        /* tuple of Tensor: conv..., temporal */
    mr_state_pool pool;
} StatePoolObject;

/* ------------------------------------------------------------------------
 * Argument converters (py_dlpack.c); each returns 0 or -1 with an exception. */

/* None -> 0 (the legacy default stream), or a cudaStream_t as an int. */
int mr_parse_stream(PyObject *o, const char *fname, uintptr_t *out);
/* "cpu", "cuda", "cuda:N", a torch.device or (device_type, device_id). */
int mr_parse_device(PyObject *o, const char *what, int32_t *type, int32_t *id);
int mr_alloc_device_check(const char *what, int32_t type, int32_t id);
int mr_parse_dtype(PyObject *o, const char *what, int *out);
int mr_parse_shape(PyObject *o, const char *what, int64_t *shape, int *ndim);

/* ------------------------------------------------------------------------
 * Tensors (py_dlpack.c) */

/* Imports obj (a DLPack producer or capsule) as a Tensor naming arg in errors. */
TensorObject *mr_tensor_import(mr_state *st, PyObject *obj, uintptr_t stream, int writable, const char *arg);
/* Refuses CUDA memory when this build or machine cannot reach it. */
int mr_check_cuda_reachable(int32_t device_type, int32_t device_id, const char *arg);
/* A new zero-filled tensor, or NULL with MemoryError / ValueError naming
 * what, the shape and the size. */
TensorObject *mr_tensor_zeros(mr_state *st, int32_t dev_type, int32_t dev_id, int dtype, int ndim,
                              const int64_t *shape, const char *what);
void export_capsule_destructor(PyObject *cap);

/* ------------------------------------------------------------------------
 * Index arguments and kernels (py_kernels.c) */

/* An index or mask argument: device data stays where it is (idx.on_device),
 * host data is read as int64 (a mask's entries too: nonzero is true). */
typedef struct {
    PyObject *owner;          /* Tensor or ndarray keeping the data alive */
    mr_ints ints;             /* host data read by mr_ints_read (py_ints.h) */
    mr_buf buf;               /* its scratch, or the int64 copy of a host tensor */
    mr_index idx;
} mr_idx_arg;

int mr_idx_get(mr_state *st, PyObject *obj, int mask, int32_t dev_type, int32_t dev_id,
               uintptr_t stream, const char *arg, mr_idx_arg *out);
void mr_idx_release(mr_idx_arg *a);
/* Both host or both device, and the same length; ValueError otherwise
 * (py_state_pool.c). */
int mr_same_placement(const mr_idx_arg *a, const mr_idx_arg *b, const char *fname, const char *an, const char *bn);

/* The end of a kernel entry point: None, or NULL with the kernel's error
 * (rc, an MR_E* code) for what. */
PyObject *mr_kernel_done(mr_state *st, int rc, const char *what);

/* Runs a pool kernel with the GIL released. */
#define RUN_KERNEL(rc, call)      \
    do {                          \
        Py_BEGIN_ALLOW_THREADS    \
        rc = (call);              \
        Py_END_ALLOW_THREADS      \
    } while (0)

/* Registration hooks, called by mr_py_tensor_init (py_dlpack.c). */
int mr_py_state_pool_init(PyObject *m, mr_state *st);
int mr_py_req_to_token_init(PyObject *m, mr_state *st);

#endif /* MR_PY_TENSOR_H */
