/* py_tensor.c - the Python face of the tensor code: the mambaradix.Tensor
 * owner type (DLPack consumer and producer), the StatePool type, the
 * module-level write_req_to_token(), and a test-only DLPack producer.
 *
 * DLPack consumer sequence (see the project's style guide, section 3.3):
 * __dlpack_device__(), then __dlpack__(stream=S, max_version=(1, 1)) with
 * a retry without max_version for old producers, then the capsule name
 * decides versioned or legacy; all checks run before the capsule is renamed
 * to "used_*", which is the last step that can fail.  From then on the
 * Tensor object owns the managed tensor and its deallocation calls the
 * producer's deleter exactly once. */
#include "py_common.h"

#include <string.h>

#include "alloc.h"
#include "cuda_api.h"
#include "dlpack_abi.h"
#include "kernels.h"
#include "py_numpy.h"
#include "state_pool.h"
#include "tensor.h"

static const char CAP_VERSIONED[] = "dltensor_versioned";
static const char CAP_LEGACY[] = "dltensor";
static const char CAP_USED_VERSIONED[] = "used_dltensor_versioned";
static const char CAP_USED_LEGACY[] = "used_dltensor";

/* ------------------------------------------------------------------------
 * Argument parsing: positional-or-keyword parameters by name. */

/* Fills out[0..n) from positional args then keywords (NULL when absent).
 * The first nreq names are required; nposmax limits positional use.
 * Returns 0, or -1 with TypeError set. */
static int
parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
           const char *const *names, int n, int nreq, int nposmax, PyObject **out)
{
    if (nargs > nposmax) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional arguments (%zd given)", fname,
                     nposmax, nargs);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        out[i] = i < nargs ? args[i] : NULL;
    }
    if (kwnames != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; k++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, k);
            int found = -1;
            for (int i = 0; i < n; i++) {
                if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) {
                    found = i;
                    break;
                }
            }
            if (found < 0) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, key);
                return -1;
            }
            if (out[found] != NULL) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname,
                             names[found]);
                return -1;
            }
            out[found] = args[nargs + k];
        }
    }
    for (int i = 0; i < nreq; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[i]);
            return -1;
        }
    }
    return 0;
}

/* Parses a stream argument: None -> 0 (the legacy default stream), or a
 * non-negative int (a cudaStream_t as an int, e.g. torch's
 * current_stream().cuda_stream).  Returns 0 or -1 with an exception. */
static int
parse_stream(PyObject *o, const char *fname, uintptr_t *out)
{
    *out = 0;
    if (o == NULL || o == Py_None) {
        return 0;
    }
    if (PyBool_Check(o) || !PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s(): stream must be an int (a cudaStream_t handle) or None, not %.100s",
                     fname, Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s(): stream must be a non-negative int", fname);
        return -1;
    }
    *out = (uintptr_t)v;
    return 0;
}

/* Parses a device: "cpu", "cuda", "cuda:N", anything whose str() is one
 * of those (torch.device), or a (device_type, device_id) tuple. */
static int
parse_device(PyObject *o, const char *what, int32_t *type, int32_t *id)
{
    if (PyTuple_Check(o) && PyTuple_GET_SIZE(o) == 2) {
        int64_t t, i;
        if (mr_as_int64(PyTuple_GET_ITEM(o, 0), 0, INT32_MAX, what, &t) < 0
            || mr_as_int64(PyTuple_GET_ITEM(o, 1), 0, INT32_MAX, what, &i) < 0) {
            return -1;
        }
        *type = (int32_t)t;
        *id = (int32_t)i;
        return 0;
    }
    PyObject *s = PyObject_Str(o);
    if (s == NULL) {
        return -1;
    }
    const char *c = PyUnicode_AsUTF8(s);
    int rc = -1;
    if (c == NULL) {
        goto done;
    }
    if (strcmp(c, "cpu") == 0) {
        *type = MR_DL_CPU;
        *id = 0;
        rc = 0;
    }
    else if (strcmp(c, "cuda") == 0) {
        *type = MR_DL_CUDA;
        *id = 0;
        rc = 0;
    }
    else if (strncmp(c, "cuda:", 5) == 0 && c[5] >= '0' && c[5] <= '9') {
        char *end = NULL;
        long v = strtol(c + 5, &end, 10);
        if (*end == '\0' && v >= 0 && v <= INT32_MAX) {
            *type = MR_DL_CUDA;
            *id = (int32_t)v;
            rc = 0;
        }
    }
    if (rc < 0) {
        PyErr_Format(PyExc_ValueError, "%s must be 'cpu', 'cuda' or 'cuda:N', not %R", what, o);
    }
done:
    Py_DECREF(s);
    return rc;
}

/* Parses a dtype: a name ("bfloat16", "bf16", "torch.float32") or any
 * object whose str() is one (numpy/torch dtypes). */
static int
parse_dtype(PyObject *o, const char *what, int *out)
{
    PyObject *s = PyUnicode_Check(o) ? Py_NewRef(o) : PyObject_Str(o);
    if (s == NULL) {
        return -1;
    }
    const char *c = PyUnicode_AsUTF8(s);
    int rc = -1;
    if (c != NULL) {
        if (mr_dtype_from_name(c, out) == MR_OK) {
            rc = 0;
        }
        else {
            PyErr_Format(PyExc_TypeError, "%s: unknown dtype %R", what, o);
        }
    }
    Py_DECREF(s);
    return rc;
}

/* Parses a shape (sequence of non-negative ints). */
static int
parse_shape(PyObject *o, const char *what, int64_t *shape, int *ndim)
{
    PyObject *seq = PySequence_Fast(o, "shape must be a sequence of ints");
    if (seq == NULL) {
        PyErr_Format(PyExc_TypeError, "%s must be a sequence of ints", what);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MR_TENSOR_MAX_NDIM - 2) {
        PyErr_Format(PyExc_ValueError, "%s has too many dimensions (at most %d)", what, MR_TENSOR_MAX_NDIM - 2);
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (mr_as_int64(PySequence_Fast_GET_ITEM(seq, i), 0, INT64_MAX / 16, what, &shape[i]) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    *ndim = (int)n;
    Py_DECREF(seq);
    return 0;
}

static void
format_device(char *buf, size_t n, int32_t type, int32_t id)
{
    if (type == MR_DL_CPU) {
        snprintf(buf, n, "cpu");
    }
    else if (type == MR_DL_CUDA) {
        snprintf(buf, n, "cuda:%d", (int)id);
    }
    else {
        snprintf(buf, n, "dlpack-device(%d, %d)", (int)type, (int)id);
    }
}

/* ------------------------------------------------------------------------
 * Tensor: the owner type */

typedef struct {
    PyObject_HEAD
    mr_tensor t;
} TensorObject;

static void
Tensor_dealloc(PyObject *self)
{
    TensorObject *o = (TensorObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    mr_tensor_release(&o->t);
    freefunc tp_free = PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

/* A new, empty Tensor object.  Returns NULL with an exception set. */
static TensorObject *
tensor_new_empty(mr_state *st)
{
    PyTypeObject *tp = (PyTypeObject *)st->Tensor;
    allocfunc alloc = PyType_GetSlot(tp, Py_tp_alloc);
    TensorObject *o = (TensorObject *)alloc(tp, 0);
    if (o != NULL) {
        memset(&o->t, 0, sizeof(o->t));
    }
    return o;
}

/* Refuses CUDA memory when this build or machine cannot reach it. */
static int
check_cuda_reachable(int32_t device_type, int32_t device_id, const char *arg)
{
    if (device_type != MR_DL_CUDA) {
        return 0;
    }
    if (!mr_k_have_cuda()) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s is a CUDA tensor, but mambaradix was built without CUDA "
                     "(rebuild with nvcc available, MAMBARADIX_CUDA=1)", arg);
        return -1;
    }
    int n = mr_cuda_device_count();
    if (device_id < 0 || device_id >= n) {
        PyErr_Format(PyExc_RuntimeError, "%s is on cuda:%d, but %d CUDA device(s) are visible", arg,
                     (int)device_id, n);
        return -1;
    }
    return 0;
}

/* Calls obj.__dlpack__ with (stream, max_version), retrying for older
 * producers: without max_version on TypeError or BufferError.  Returns a
 * new reference or NULL with an exception set. */
static PyObject *
call_dlpack(PyObject *obj, PyObject *stream_arg)
{
    PyObject *meth = PyObject_GetAttrString(obj, "__dlpack__");
    if (meth == NULL) {
        return NULL;
    }
    PyObject *kw = Py_BuildValue("{s:O,s:(ii)}", "stream", stream_arg, "max_version", MR_DLPACK_MAJOR,
                                 MR_DLPACK_MINOR);
    PyObject *empty = PyTuple_New(0);
    PyObject *cap = NULL;
    if (kw == NULL || empty == NULL) {
        goto done;
    }
    cap = PyObject_Call(meth, empty, kw);
    if (cap == NULL && (PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_BufferError))) {
        /* max_version may be unknown to this producer. */
        PyErr_Clear();
        Py_DECREF(kw);
        kw = NULL;
        if (stream_arg != Py_None) {
            kw = Py_BuildValue("{s:O}", "stream", stream_arg);
            if (kw == NULL) {
                goto done;
            }
        }
        cap = PyObject_Call(meth, empty, kw);
    }
done:
    Py_XDECREF(kw);
    Py_XDECREF(empty);
    Py_DECREF(meth);
    return cap;
}

/* Imports obj (a DLPack producer, or a DLPack capsule) as a new Tensor
 * that owns the producer's tensor.  stream is the stream the data will be
 * used on (0 = legacy default).  Checks structure, dtype, device
 * reachability and, when writable, the read-only flag; arg names the
 * argument in errors.  Returns a new reference or NULL with an exception
 * set; on every failure the producer's deleter runs exactly once (through
 * the capsule's own destructor, or ours). */
static TensorObject *
tensor_import(mr_state *st, PyObject *obj, uintptr_t stream, int writable, const char *arg)
{
    PyObject *cap = NULL;
    TensorObject *out = NULL;
    if (PyCapsule_CheckExact(obj)) {
        cap = Py_NewRef(obj);
    }
    else {
        if (!PyObject_HasAttrString(obj, "__dlpack__")) {
            PyErr_Format(PyExc_TypeError, "%s must support DLPack (__dlpack__), not %.100s", arg,
                         Py_TYPE(obj)->tp_name);
            return NULL;
        }
        int32_t dtype_dev = MR_DL_CPU;
        PyObject *dev = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
        if (dev == NULL) {
            return NULL;
        }
        if (!PyTuple_Check(dev) || PyTuple_GET_SIZE(dev) != 2) {
            Py_DECREF(dev);
            PyErr_Format(PyExc_TypeError, "%s.__dlpack_device__() must return a (type, id) tuple", arg);
            return NULL;
        }
        long dt = PyLong_AsLong(PyTuple_GET_ITEM(dev, 0));
        Py_DECREF(dev);
        if (dt == -1 && PyErr_Occurred()) {
            return NULL;
        }
        dtype_dev = (int32_t)dt;
        PyObject *stream_arg;
        if (dtype_dev == MR_DL_CUDA) {
            /* DLPack: 1 is the legacy default stream; 0 is invalid. */
            stream_arg = PyLong_FromUnsignedLongLong(stream == 0 ? 1 : (unsigned long long)stream);
            if (stream_arg == NULL) {
                return NULL;
            }
        }
        else {
            stream_arg = Py_NewRef(Py_None);
        }
        cap = call_dlpack(obj, stream_arg);
        Py_DECREF(stream_arg);
        if (cap == NULL) {
            return NULL;
        }
        if (!PyCapsule_CheckExact(cap)) {
            PyErr_Format(PyExc_TypeError, "%s.__dlpack__() returned %.100s, not a capsule", arg,
                         Py_TYPE(cap)->tp_name);
            goto error;
        }
    }

    int versioned;
    if (PyCapsule_IsValid(cap, CAP_VERSIONED)) {
        versioned = 1;
    }
    else if (PyCapsule_IsValid(cap, CAP_LEGACY)) {
        versioned = 0;
    }
    else {
        const char *name = PyCapsule_GetName(cap);
        PyErr_Clear();
        if (name != NULL && strncmp(name, "used_", 5) == 0) {
            PyErr_Format(PyExc_BufferError, "%s: the DLPack capsule was already consumed", arg);
        }
        else {
            PyErr_Format(PyExc_TypeError, "%s: not a DLPack capsule (name %s)", arg, name ? name : "NULL");
        }
        goto error;
    }
    void *managed = PyCapsule_GetPointer(cap, versioned ? CAP_VERSIONED : CAP_LEGACY);
    if (managed == NULL) {
        goto error;
    }
    const mr_dl_tensor *dl;
    uint64_t flags = 0;
    if (versioned) {
        mr_dl_managed_versioned *m = managed;
        if (m->version.major != MR_DLPACK_MAJOR) {
            PyErr_Format(PyExc_BufferError, "%s: unsupported DLPack version %u.%u (this build reads 1.x)",
                         arg, m->version.major, m->version.minor);
            goto error;
        }
        dl = &m->dl_tensor;
        flags = m->flags;
    }
    else {
        dl = &((mr_dl_managed *)managed)->dl_tensor;
    }

    out = tensor_new_empty(st);
    if (out == NULL) {
        goto error;
    }
    int problem;
    if (mr_tensor_from_dl(dl, &out->t, &problem) != MR_OK) {
        switch (problem) {
        case MR_TP_NDIM:
            PyErr_Format(PyExc_ValueError, "%s: bad DLPack tensor (ndim %d, at most %d)", arg,
                         (int)dl->ndim, MR_TENSOR_MAX_NDIM);
            break;
        case MR_TP_DTYPE:
            PyErr_Format(PyExc_TypeError, "%s: unsupported dtype (DLPack code %u, bits %u, lanes %u)", arg,
                         dl->dtype.code, dl->dtype.bits, dl->dtype.lanes);
            break;
        case MR_TP_DEVICE:
            PyErr_Format(PyExc_ValueError, "%s: unsupported device type %d (only CPU and CUDA)", arg,
                         (int)dl->device.device_type);
            break;
        case MR_TP_LAYOUT:
            PyErr_Format(PyExc_BufferError,
                         "%s: the tensor is not compact row-major (call .contiguous() first)", arg);
            break;
        default:
            PyErr_Format(PyExc_BufferError, "%s: NULL data pointer", arg);
            break;
        }
        goto error;
    }
    if (writable && (flags & MR_DL_FLAG_READ_ONLY)) {
        PyErr_Format(PyExc_BufferError, "%s is read-only, but mambaradix writes to it", arg);
        goto error;
    }
    if (check_cuda_reachable(out->t.device_type, out->t.device_id, arg) < 0) {
        goto error;
    }
    /* Last fallible step: take ownership. */
    if (PyCapsule_SetName(cap, versioned ? CAP_USED_VERSIONED : CAP_USED_LEGACY) < 0) {
        goto error;
    }
    mr_tensor_adopt(&out->t, managed, versioned);
    Py_DECREF(cap);
    return out;

error:
    if (out != NULL) {
        memset(&out->t, 0, sizeof(out->t));   /* owns nothing yet */
        Py_DECREF(out);
    }
    Py_XDECREF(cap);
    return NULL;
}

/* Called (with or without the GIL) when a consumer releases an export. */
static void
export_release(void *ctx)
{
    if (!Py_IsInitialized()) {
        return;   /* interpreter gone: leak rather than crash */
    }
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF((PyObject *)ctx);
    PyGILState_Release(g);
}

/* Destructor of the capsules we hand out: runs the deleter unless a
 * consumer took ownership (renamed the capsule).  It may run while an
 * exception is pending (a failed call dropping its arguments), so it
 * must neither raise nor clear one: PyCapsule_IsValid sets nothing. */
static void
export_capsule_destructor(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, CAP_VERSIONED)) {
        mr_dl_managed_versioned *m = PyCapsule_GetPointer(cap, CAP_VERSIONED);
        m->deleter(m);
    }
    else if (PyCapsule_IsValid(cap, CAP_LEGACY)) {
        mr_dl_managed *m = PyCapsule_GetPointer(cap, CAP_LEGACY);
        m->deleter(m);
    }
}

PyDoc_STRVAR(Tensor_dlpack__doc__,
"__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n"
"--\n"
"\n"
"Export the tensor as a DLPack capsule (no copy).  A versioned capsule\n"
"when max_version >= (1, 0), else a legacy one.  The capsule keeps this\n"
"Tensor alive until the consumer releases it.  mambaradix records no\n"
"pending work, so stream only has to be valid: order your work on the\n"
"stream you passed to mambaradix's kernels.");

static PyObject *
Tensor_dlpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"stream", "max_version", "dl_device", "copy"};
    PyObject *a[4];
    TensorObject *o = (TensorObject *)self;
    if (parse_args("__dlpack__", args, nargs, kwnames, names, 4, 0, 0, a) < 0) {
        return NULL;
    }
    PyObject *stream = a[0], *maxv = a[1], *dl_device = a[2], *copy = a[3];
    if (o->t.data == NULL && o->t.numel > 0) {
        PyErr_SetString(PyExc_BufferError, "__dlpack__: the tensor was released");
        return NULL;
    }
    if (stream != NULL && stream != Py_None) {
        if (o->t.device_type == MR_DL_CPU) {
            PyErr_SetString(PyExc_BufferError, "__dlpack__: stream must be None for a CPU tensor");
            return NULL;
        }
        /* Any stream handle is fine: mambaradix records no pending work
         * (its kernels run on the streams callers pass), so there is
         * nothing to order.  0, which the protocol calls ambiguous and old
         * consumers still send, is taken as the default stream. */
        if (!PyLong_Check(stream)) {
            PyErr_SetString(PyExc_TypeError, "__dlpack__: stream must be an int or None");
            return NULL;
        }
    }
    if (copy != NULL && copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "__dlpack__: copy=True is not supported (mambaradix exports views)");
        return NULL;
    }
    if (dl_device != NULL && dl_device != Py_None) {
        int32_t t, i;
        if (!PyTuple_Check(dl_device) || parse_device(dl_device, "__dlpack__: dl_device", &t, &i) < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "__dlpack__: dl_device must be a (type, id) tuple");
            }
            return NULL;
        }
        if (t != o->t.device_type || i != o->t.device_id) {
            PyErr_SetString(PyExc_BufferError, "__dlpack__: dl_device differs from the tensor's device (no copies)");
            return NULL;
        }
    }
    int versioned = 0;
    if (maxv != NULL && maxv != Py_None) {
        if (!PyTuple_Check(maxv) || PyTuple_GET_SIZE(maxv) != 2) {
            PyErr_SetString(PyExc_TypeError, "__dlpack__: max_version must be a (major, minor) tuple");
            return NULL;
        }
        long major = PyLong_AsLong(PyTuple_GET_ITEM(maxv, 0));
        if (major == -1 && PyErr_Occurred()) {
            return NULL;
        }
        versioned = major >= 1;
    }
    void *managed = NULL;
    Py_INCREF(self);   /* released by export_release */
    if (mr_tensor_export(&o->t, versioned, self, export_release, &managed) != MR_OK) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(managed, versioned ? CAP_VERSIONED : CAP_LEGACY, export_capsule_destructor);
    if (cap == NULL) {
        if (versioned) {
            ((mr_dl_managed_versioned *)managed)->deleter(managed);
        }
        else {
            ((mr_dl_managed *)managed)->deleter(managed);
        }
        return NULL;
    }
    return cap;
}

PyDoc_STRVAR(Tensor_dlpack_device__doc__,
"__dlpack_device__($self, /)\n"
"--\n"
"\n"
"(device_type, device_id) in DLPack numbering: (1, 0) for the CPU,\n"
"(2, N) for CUDA device N.");

static PyObject *
Tensor_dlpack_device(PyObject *self, PyObject *unused)
{
    TensorObject *o = (TensorObject *)self;
    return Py_BuildValue("(ii)", (int)o->t.device_type, (int)o->t.device_id);
}

PyDoc_STRVAR(Tensor_from_dlpack__doc__,
"from_dlpack(obj, /, *, stream=None, writable=False)\n"
"--\n"
"\n"
"Import any DLPack producer (numpy, torch, CuPy, JAX...) or a DLPack\n"
"capsule without a copy.  The Tensor keeps the producer's memory alive and\n"
"releases it exactly once when it is freed.  The tensor must be compact\n"
"row-major; writable=True also refuses read-only tensors.");

static PyObject *
Tensor_from_dlpack(PyObject *cls, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"obj", "stream", "writable"};
    PyObject *a[3];
    if (parse_args("from_dlpack", args, nargs, kwnames, names, 3, 1, 1, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_state_from_type((PyTypeObject *)cls);
    if (st == NULL) {
        return NULL;
    }
    uintptr_t stream;
    if (parse_stream(a[1], "from_dlpack", &stream) < 0) {
        return NULL;
    }
    int writable = a[2] != NULL ? PyObject_IsTrue(a[2]) : 0;
    if (writable < 0) {
        return NULL;
    }
    return (PyObject *)tensor_import(st, a[0], stream, writable, "from_dlpack(): obj");
}

/* A failed tensor allocation, with the tensor's shape and size: MemoryError
 * when the memory is not there, ValueError when the size overflows. */
static void
raise_alloc_failed(mr_state *st, int rc, const char *what, int dtype, int ndim, const int64_t *shape)
{
    char dims[MR_TENSOR_MAX_NDIM * 24 + 4];
    size_t off = 0;
    double bytes = (double)mr_dtype_size(dtype);
    for (int i = 0; i < ndim && off < sizeof(dims); i++) {
        off += (size_t)snprintf(dims + off, sizeof(dims) - off, "%s%lld", i ? ", " : "[", (long long)shape[i]);
        bytes *= (double)shape[i];
    }
    if (off < sizeof(dims)) {
        snprintf(dims + off, sizeof(dims) - off, "]");
    }
    char size[32];
    snprintf(size, sizeof(size), "%.4g", bytes / 1073741824.0);
    if (rc == MR_ENOMEM) {
        PyErr_Format(PyExc_MemoryError, "%s %s needs %s GiB: out of memory", what, dims, size);
    }
    else if (rc == MR_EINVAL) {
        PyErr_Format(PyExc_ValueError, "%s %s is too large (%s GiB)", what, dims, size);
    }
    else {
        mr_raise(st, rc, what);
    }
}

PyDoc_STRVAR(Tensor_zeros__doc__,
"zeros(shape, dtype, device='cpu')\n"
"--\n"
"\n"
"A new zero-filled compact tensor allocated by mambaradix (host memory,\n"
"or cudaMalloc on 'cuda:N').");

static PyObject *
Tensor_zeros(PyObject *cls, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"shape", "dtype", "device"};
    PyObject *a[3];
    if (parse_args("zeros", args, nargs, kwnames, names, 3, 2, 3, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_state_from_type((PyTypeObject *)cls);
    if (st == NULL) {
        return NULL;
    }
    int64_t shape[MR_TENSOR_MAX_NDIM];
    int ndim, dtype;
    int32_t dev_type = MR_DL_CPU, dev_id = 0;
    if (parse_shape(a[0], "zeros(): shape", shape, &ndim) < 0 || parse_dtype(a[1], "zeros(): dtype", &dtype) < 0
        || (a[2] != NULL && parse_device(a[2], "zeros(): device", &dev_type, &dev_id) < 0)
        || check_cuda_reachable(dev_type, dev_id, "zeros(): device") < 0) {
        return NULL;
    }
    TensorObject *o = tensor_new_empty(st);
    if (o == NULL) {
        return NULL;
    }
    int rc = mr_tensor_alloc(&o->t, dev_type, dev_id, dtype, ndim, shape);
    if (rc != MR_OK) {
        Py_DECREF(o);
        raise_alloc_failed(st, rc, "zeros(): tensor", dtype, ndim, shape);
        return NULL;
    }
    return (PyObject *)o;
}

static PyObject *
Tensor_get_shape(PyObject *self, void *closure)
{
    TensorObject *o = (TensorObject *)self;
    PyObject *t = PyTuple_New(o->t.ndim);
    if (t == NULL) {
        return NULL;
    }
    for (int i = 0; i < o->t.ndim; i++) {
        PyObject *v = PyLong_FromLongLong(o->t.shape[i]);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *
Tensor_get_dtype(PyObject *self, void *closure)
{
    return PyUnicode_FromString(mr_dtype_name(((TensorObject *)self)->t.dtype));
}

static PyObject *
Tensor_get_device(PyObject *self, void *closure)
{
    TensorObject *o = (TensorObject *)self;
    char buf[64];
    format_device(buf, sizeof(buf), o->t.device_type, o->t.device_id);
    return PyUnicode_FromString(buf);
}

static PyObject *
Tensor_get_data_ptr(PyObject *self, void *closure)
{
    return PyLong_FromVoidPtr(((TensorObject *)self)->t.data);
}

static PyObject *
Tensor_get_nbytes(PyObject *self, void *closure)
{
    return PyLong_FromSize_t(mr_tensor_nbytes(&((TensorObject *)self)->t));
}

static PyObject *
Tensor_get_owned(PyObject *self, void *closure)
{
    return PyBool_FromLong(((TensorObject *)self)->t.own != NULL);
}

static PyObject *
Tensor_repr(PyObject *self)
{
    TensorObject *o = (TensorObject *)self;
    char dev[64];
    format_device(dev, sizeof(dev), o->t.device_type, o->t.device_id);
    PyObject *shape = Tensor_get_shape(self, NULL);
    if (shape == NULL) {
        return NULL;
    }
    PyObject *r = PyUnicode_FromFormat("mambaradix.Tensor(shape=%R, dtype=%s, device=%s)", shape,
                                       mr_dtype_name(o->t.dtype), dev);
    Py_DECREF(shape);
    return r;
}

static PyGetSetDef Tensor_getset[] = {
    {"shape", Tensor_get_shape, NULL, "Extents, a tuple of ints.", NULL},
    {"dtype", Tensor_get_dtype, NULL, "Element type name ('bfloat16', 'float32', ...).", NULL},
    {"device", Tensor_get_device, NULL, "'cpu' or 'cuda:N'.", NULL},
    {"data_ptr", Tensor_get_data_ptr, NULL, "Address of the first element.", NULL},
    {"nbytes", Tensor_get_nbytes, NULL, "Bytes of data.", NULL},
    {"owned", Tensor_get_owned, NULL, "True when mambaradix allocated the memory.", NULL},
    {NULL},
};

static PyMethodDef Tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))Tensor_dlpack, METH_FASTCALL | METH_KEYWORDS, Tensor_dlpack__doc__},
    {"__dlpack_device__", Tensor_dlpack_device, METH_NOARGS, Tensor_dlpack_device__doc__},
    {"from_dlpack", (PyCFunction)(void (*)(void))Tensor_from_dlpack, METH_FASTCALL | METH_KEYWORDS | METH_CLASS,
     Tensor_from_dlpack__doc__},
    {"zeros", (PyCFunction)(void (*)(void))Tensor_zeros, METH_FASTCALL | METH_KEYWORDS | METH_CLASS,
     Tensor_zeros__doc__},
    {NULL},
};

PyDoc_STRVAR(Tensor__doc__,
"A compact tensor on the CPU or a CUDA device, owned by mambaradix:\n"
"either memory it allocated or a producer's DLPack tensor it keeps alive.\n"
"Exportable with DLPack (torch.from_dlpack, numpy.from_dlpack, cupy...).");

static PyType_Slot Tensor_slots[] = {
    {Py_tp_dealloc, Tensor_dealloc},
    {Py_tp_repr, Tensor_repr},
    {Py_tp_getset, Tensor_getset},
    {Py_tp_methods, Tensor_methods},
    {Py_tp_doc, (void *)Tensor__doc__},
    {0, NULL},
};

static PyType_Spec Tensor_spec = {
    .name = "mambaradix.Tensor",
    .basicsize = sizeof(TensorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = Tensor_slots,
};

/* ------------------------------------------------------------------------
 * Index arguments: host (numpy, lists, CPU DLPack) or device (CUDA DLPack) */

typedef struct {
    PyObject *owner;          /* Tensor or ndarray keeping the data alive */
    int64_t *host;            /* our int64 (or uint8 mask) copy of host data */
    mr_index idx;
    int dtype;                /* MR_DTYPE_* of the source */
} idx_arg;

static void
idx_release(idx_arg *a)
{
    Py_CLEAR(a->owner);
    MR_FREE(a->host);
    a->host = NULL;
}

/* Converts an index (mask=0) or mask (mask=1) argument.  Host data ends
 * up as an int64 array (a mask as uint8); CUDA data stays on the device
 * and must be on (dev_type, dev_id).  Accepts 0-d or 1-d.  Returns 0 or -1
 * with an exception naming arg. */
static int
idx_get(mr_state *st, PyObject *obj, int mask, int32_t dev_type, int32_t dev_id, uintptr_t stream,
        const char *arg, idx_arg *out)
{
    memset(out, 0, sizeof(*out));
    const char *kind = mask ? "a bool or integer mask" : "int32 or int64 indices";
    if (PyCapsule_CheckExact(obj) || PyObject_HasAttrString(obj, "__dlpack__")) {
        TensorObject *t = tensor_import(st, obj, stream, 0, arg);
        if (t == NULL) {
            return -1;
        }
        out->owner = (PyObject *)t;
        int dt = t->t.dtype;
        int ok = mask ? (dt == MR_DTYPE_BOOL || dt == MR_DTYPE_UINT8 || dt == MR_DTYPE_INT8
                         || dt == MR_DTYPE_INT32 || dt == MR_DTYPE_INT64)
                      : (dt == MR_DTYPE_INT32 || dt == MR_DTYPE_INT64);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s must hold %s, not %s", arg, kind, mr_dtype_name(dt));
            goto error;
        }
        if (t->t.ndim > 1) {
            PyErr_Format(PyExc_ValueError, "%s must be 1-D (got %d dimensions)", arg, t->t.ndim);
            goto error;
        }
        out->dtype = dt;
        int64_t n = t->t.numel;
        if (t->t.device_type == MR_DL_CUDA) {
            if (dev_type != MR_DL_CUDA || dev_id != t->t.device_id) {
                char want[64];
                format_device(want, sizeof(want), dev_type, dev_id);
                PyErr_Format(PyExc_ValueError, "%s is on cuda:%d, but the state tensors are on %s", arg,
                             (int)t->t.device_id, want);
                goto error;
            }
            out->idx.ptr = t->t.data;
            out->idx.n = n;
            out->idx.bits = (int)mr_dtype_size(dt) * 8;
            out->idx.on_device = 1;
            return 0;
        }
        /* Host data: copy into int64 (or uint8 for masks). */
        out->host = MR_MALLOC((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
        if (out->host == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        uint8_t *m8 = (uint8_t *)out->host;
        for (int64_t i = 0; i < n; i++) {
            int64_t v;
            switch (mr_dtype_size(dt)) {
            case 1: v = ((const uint8_t *)t->t.data)[i]; break;
            case 4: v = ((const int32_t *)t->t.data)[i]; break;
            default: v = ((const int64_t *)t->t.data)[i]; break;
            }
            if (mask) {
                m8[i] = v != 0;
            }
            else {
                out->host[i] = v;
            }
        }
        out->idx.ptr = out->host;
        out->idx.n = n;
        out->idx.bits = mask ? 8 : 64;
        out->idx.on_device = 0;
        return 0;
    }
    /* Anything else: a Python int or sequence, through numpy.  Convert
     * without a dtype first, so that floats are refused, not truncated. */
    PyObject *raw = PyArray_FromAny(obj, NULL, 0, 0, NPY_ARRAY_CARRAY_RO, NULL);
    if (raw == NULL) {
        if (PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be %s (an array, a tensor or a sequence of ints)", arg, kind);
        }
        return -1;
    }
    PyArrayObject *ra = (PyArrayObject *)raw;
    if (PyArray_NDIM(ra) > 1) {
        PyErr_Format(PyExc_ValueError, "%s must be 1-D (got %d dimensions)", arg, PyArray_NDIM(ra));
        Py_DECREF(raw);
        return -1;
    }
    if (PyArray_SIZE(ra) > 0 && !PyArray_ISINTEGER(ra) && !(mask && PyArray_ISBOOL(ra))) {
        PyErr_Format(PyExc_TypeError, "%s must be %s (an array, a tensor or a sequence of ints)", arg, kind);
        Py_DECREF(raw);
        return -1;
    }
    PyArray_Descr *descr = PyArray_DescrFromType(mask ? NPY_BOOL : NPY_INT64);
    PyObject *arr = PyArray_FromAny(raw, descr, 0, 1, NPY_ARRAY_CARRAY_RO | NPY_ARRAY_FORCECAST, NULL);
    Py_DECREF(raw);
    if (arr == NULL) {
        return -1;
    }
    out->owner = arr;
    out->dtype = mask ? MR_DTYPE_BOOL : MR_DTYPE_INT64;
    out->idx.ptr = PyArray_DATA((PyArrayObject *)arr);
    out->idx.n = (int64_t)PyArray_SIZE((PyArrayObject *)arr);
    out->idx.bits = mask ? 8 : 64;
    out->idx.on_device = 0;
    return 0;
error:
    idx_release(out);
    return -1;
}

/* ------------------------------------------------------------------------
 * StatePool */

typedef struct {
    PyObject_HEAD
    PyObject *tensors;        /* tuple of Tensor: conv..., temporal */
    mr_state_pool pool;
} StatePoolObject;

static int
StatePool_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((StatePoolObject *)self)->tensors);
    return 0;
}

static int
StatePool_clear(PyObject *self)
{
    Py_CLEAR(((StatePoolObject *)self)->tensors);
    return 0;
}

static void
StatePool_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    StatePool_clear(self);
    freefunc tp_free = PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

static const char *
tensor_role(int i, int nconv, char *buf, size_t n)
{
    if (i < nconv) {
        snprintf(buf, n, "conv[%d]", i);
    }
    else {
        snprintf(buf, n, "temporal");
    }
    return buf;
}

/* Builds a StatePool object over a tuple of Tensor objects (conv...,
 * temporal).  Steals the reference to tensors.  Returns NULL with an
 * exception set. */
static PyObject *
statepool_make(mr_state *st, PyObject *tensors, const char *fname)
{
    PyTypeObject *tp = (PyTypeObject *)st->StatePool;
    int n = (int)PyTuple_GET_SIZE(tensors);
    const mr_tensor *conv[MR_MAX_STATE_TENSORS];
    for (int i = 0; i < n - 1 && i < MR_MAX_STATE_TENSORS; i++) {
        conv[i] = &((TensorObject *)PyTuple_GET_ITEM(tensors, i))->t;
    }
    const mr_tensor *temporal = &((TensorObject *)PyTuple_GET_ITEM(tensors, n - 1))->t;
    allocfunc alloc = PyType_GetSlot(tp, Py_tp_alloc);
    StatePoolObject *o = (StatePoolObject *)alloc(tp, 0);
    if (o == NULL) {
        Py_DECREF(tensors);
        return NULL;
    }
    o->tensors = tensors;
    int reason, which;
    char role[32];
    if (mr_state_pool_init(&o->pool, conv, n - 1, temporal, &reason, &which) != MR_OK) {
        tensor_role(which, n - 1, role, sizeof(role));
        switch (reason) {
        case MR_SP_COUNT:
            PyErr_Format(PyExc_ValueError, "%s: conv must hold 1 to %d tensors (got %d)", fname,
                         MR_MAX_STATE_TENSORS - 1, n - 1);
            break;
        case MR_SP_NDIM:
            PyErr_Format(PyExc_ValueError, "%s: %s must be shaped [layers, slots + 1, ...]", fname, role);
            break;
        case MR_SP_LAYERS:
            PyErr_Format(PyExc_ValueError, "%s: %s has %lld layers (dim 0), conv[0] has %lld", fname, role,
                         (long long)((which < n - 1 ? conv[which] : temporal)->shape[0]),
                         (long long)conv[0]->shape[0]);
            break;
        case MR_SP_ROWS:
            PyErr_Format(PyExc_ValueError, "%s: %s has %lld slot rows (dim 1), conv[0] has %lld (rows >= 1)",
                         fname, role, (long long)((which < n - 1 ? conv[which] : temporal)->shape[1]),
                         (long long)conv[0]->shape[1]);
            break;
        default:
            PyErr_Format(PyExc_ValueError, "%s: %s is on another device than conv[0]", fname, role);
            break;
        }
        Py_DECREF(o);
        return NULL;
    }
    return (PyObject *)o;   /* tp_alloc already tracked it */
}

PyDoc_STRVAR(StatePool_new__doc__,
"StatePool(conv, temporal, *, stream=None)\n"
"--\n"
"\n"
"A state pool over tensors the caller allocated (torch, CuPy, JAX,\n"
"numpy...), adopted through DLPack without a copy.  conv is a sequence of\n"
"tensors shaped [layers, slots + 1, ...], temporal one tensor shaped\n"
"[layers, slots + 1, ...]; all compact, writable and on one device.  The\n"
"pool keeps them alive until it is freed.  Slot 0 is the padding slot.");

static PyObject *
StatePool_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"conv", "temporal", "stream", NULL};
    PyObject *conv, *temporal, *stream_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$O:StatePool", kwlist, &conv, &temporal, &stream_o)) {
        return NULL;
    }
    mr_state *st = mr_state_from_type(type);
    if (st == NULL) {
        return NULL;
    }
    uintptr_t stream;
    if (parse_stream(stream_o, "StatePool", &stream) < 0) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(conv, "StatePool(): conv must be a sequence of tensors");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t nconv = PySequence_Fast_GET_SIZE(seq);
    if (nconv < 1 || nconv > MR_MAX_STATE_TENSORS - 1) {
        PyErr_Format(PyExc_ValueError, "StatePool(): conv must hold 1 to %d tensors (got %zd)",
                     MR_MAX_STATE_TENSORS - 1, nconv);
        Py_DECREF(seq);
        return NULL;
    }
    PyObject *tensors = PyTuple_New(nconv + 1);
    if (tensors == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    char arg[64];
    for (Py_ssize_t i = 0; i <= nconv; i++) {
        PyObject *src = i < nconv ? PySequence_Fast_GET_ITEM(seq, i) : temporal;
        if (i < nconv) {
            snprintf(arg, sizeof(arg), "StatePool(): conv[%zd]", i);
        }
        else {
            snprintf(arg, sizeof(arg), "StatePool(): temporal");
        }
        TensorObject *t = tensor_import(st, src, stream, 1, arg);
        if (t == NULL) {
            Py_DECREF(tensors);
            Py_DECREF(seq);
            return NULL;
        }
        PyTuple_SET_ITEM(tensors, i, (PyObject *)t);
    }
    Py_DECREF(seq);
    return statepool_make(st, tensors, "StatePool()");
}

PyDoc_STRVAR(StatePool_allocate__doc__,
"allocate(layers, slots, conv_shapes, conv_dtypes, temporal_shape, temporal_dtype, device='cpu')\n"
"--\n"
"\n"
"A state pool whose zero-filled tensors mambaradix allocates (host memory,\n"
"or cudaMalloc for 'cuda:N'): conv[i] is [layers, slots + 1, *conv_shapes[i]]\n"
"of conv_dtypes[i] (one dtype for all also works), temporal is\n"
"[layers, slots + 1, *temporal_shape].");

static PyObject *
StatePool_allocate(PyObject *cls, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"layers", "slots", "conv_shapes", "conv_dtypes",
                                        "temporal_shape", "temporal_dtype", "device"};
    PyObject *a[7];
    PyObject *shapes = NULL, *dtypes = NULL, *tensors = NULL;
    if (parse_args("allocate", args, nargs, kwnames, names, 7, 6, 7, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_state_from_type((PyTypeObject *)cls);
    if (st == NULL) {
        return NULL;
    }
    int64_t layers, slots;
    int32_t dev_type = MR_DL_CPU, dev_id = 0;
    if (mr_as_int64(a[0], 1, INT32_MAX, "allocate(): layers", &layers) < 0
        || mr_as_int64(a[1], 0, INT32_MAX - 1, "allocate(): slots", &slots) < 0
        || (a[6] != NULL && parse_device(a[6], "allocate(): device", &dev_type, &dev_id) < 0)
        || check_cuda_reachable(dev_type, dev_id, "allocate(): device") < 0) {
        return NULL;
    }
    shapes = PySequence_Fast(a[2], "allocate(): conv_shapes must be a sequence of shapes");
    if (shapes == NULL) {
        goto error;
    }
    Py_ssize_t nconv = PySequence_Fast_GET_SIZE(shapes);
    if (nconv < 1 || nconv > MR_MAX_STATE_TENSORS - 1) {
        PyErr_Format(PyExc_ValueError, "allocate(): conv_shapes must hold 1 to %d shapes (got %zd)",
                     MR_MAX_STATE_TENSORS - 1, nconv);
        goto error;
    }
    int single_dtype = PyUnicode_Check(a[3]) || !PySequence_Check(a[3]);
    if (!single_dtype) {
        dtypes = PySequence_Fast(a[3], "allocate(): conv_dtypes must be a dtype or a sequence of dtypes");
        if (dtypes == NULL) {
            goto error;
        }
        if (PySequence_Fast_GET_SIZE(dtypes) != nconv) {
            PyErr_Format(PyExc_ValueError, "allocate(): conv_dtypes has %zd entries, conv_shapes %zd",
                         PySequence_Fast_GET_SIZE(dtypes), nconv);
            goto error;
        }
    }
    tensors = PyTuple_New(nconv + 1);
    if (tensors == NULL) {
        goto error;
    }
    for (Py_ssize_t i = 0; i <= nconv; i++) {
        int64_t shape[MR_TENSOR_MAX_NDIM];
        int ndim, dtype;
        char what[64];
        shape[0] = layers;
        shape[1] = slots + 1;
        if (i < nconv) {
            snprintf(what, sizeof(what), "allocate(): conv_shapes[%zd]", i);
            if (parse_shape(PySequence_Fast_GET_ITEM(shapes, i), what, shape + 2, &ndim) < 0) {
                goto error;
            }
            snprintf(what, sizeof(what), "allocate(): conv_dtypes[%zd]", i);
            if (parse_dtype(single_dtype ? a[3] : PySequence_Fast_GET_ITEM(dtypes, i), what, &dtype) < 0) {
                goto error;
            }
        }
        else {
            if (parse_shape(a[4], "allocate(): temporal_shape", shape + 2, &ndim) < 0
                || parse_dtype(a[5], "allocate(): temporal_dtype", &dtype) < 0) {
                goto error;
            }
        }
        TensorObject *t = tensor_new_empty(st);
        if (t == NULL) {
            goto error;
        }
        PyTuple_SET_ITEM(tensors, i, (PyObject *)t);
        int rc = mr_tensor_alloc(&t->t, dev_type, dev_id, dtype, ndim + 2, shape);
        if (rc != MR_OK) {
            raise_alloc_failed(st, rc, i < nconv ? "allocate(): conv tensor" : "allocate(): temporal tensor",
                               dtype, ndim + 2, shape);
            goto error;
        }
    }
    Py_DECREF(shapes);
    Py_XDECREF(dtypes);
    return statepool_make(st, tensors, "allocate()");
error:
    Py_XDECREF(shapes);
    Py_XDECREF(dtypes);
    Py_XDECREF(tensors);
    return NULL;
}

/* Runs a pool kernel with the GIL released. */
#define RUN_KERNEL(rc, call)      \
    do {                          \
        Py_BEGIN_ALLOW_THREADS    \
        rc = (call);              \
        Py_END_ALLOW_THREADS      \
    } while (0)

static int
same_placement(const idx_arg *a, const idx_arg *b, const char *fname, const char *an, const char *bn)
{
    if (a->idx.on_device != b->idx.on_device) {
        PyErr_Format(PyExc_ValueError, "%s(): %s and %s must both be host arrays or both device tensors",
                     fname, an, bn);
        return -1;
    }
    if (a->idx.n != b->idx.n) {
        PyErr_Format(PyExc_ValueError, "%s(): %s has %lld entries, %s has %lld", fname, an,
                     (long long)a->idx.n, bn, (long long)b->idx.n);
        return -1;
    }
    return 0;
}

static void
raise_pair(const char *fname, int reason, int64_t bad, const int64_t *src, const int64_t *dst,
           int64_t slots, const char *sn, const char *dn)
{
    switch (reason) {
    case MR_PAIR_RANGE_SRC:
        PyErr_Format(PyExc_IndexError, "%s(): %s[%lld] = %lld is out of range [0, %lld]", fname, sn,
                     (long long)bad, (long long)src[bad], (long long)slots);
        break;
    case MR_PAIR_RANGE_DST:
        PyErr_Format(PyExc_IndexError, "%s(): %s[%lld] = %lld is out of range [0, %lld]", fname, dn,
                     (long long)bad, (long long)dst[bad], (long long)slots);
        break;
    case MR_PAIR_SAME:
        PyErr_Format(PyExc_ValueError, "%s(): %s[%lld] == %s[%lld] == %lld (source and destination are equal)",
                     fname, sn, (long long)bad, dn, (long long)bad, (long long)src[bad]);
        break;
    case MR_PAIR_DST_TWICE:
        PyErr_Format(PyExc_ValueError, "%s(): %s[%lld] = %lld appears twice in %s", fname, dn, (long long)bad,
                     (long long)dst[bad], dn);
        break;
    default:
        PyErr_Format(PyExc_ValueError, "%s(): %s[%lld] = %lld is also a source slot", fname, dn,
                     (long long)bad, (long long)dst[bad]);
        break;
    }
}

PyDoc_STRVAR(StatePool_copy_slots__doc__,
"copy_slots($self, src, dst, /, *, stream=None)\n"
"--\n"
"\n"
"Copy slot src[i] to slot dst[i] in every state tensor and layer, in one\n"
"kernel launch, on `stream`.  src/dst: int32/int64 host arrays or\n"
"sequences (checked: in [0, num_slots], dst distinct and never a source)\n"
"or device tensors on the pool's device (not read by the host; entries\n"
"out of range are skipped).");

static PyObject *
StatePool_copy_slots(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"src", "dst", "stream"};
    PyObject *a[3];
    StatePoolObject *p = (StatePoolObject *)self;
    idx_arg src = {0}, dst = {0};
    if (parse_args("copy_slots", args, nargs, kwnames, names, 3, 2, 2, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_state_from_type(Py_TYPE(self));
    uintptr_t stream;
    if (st == NULL || parse_stream(a[2], "copy_slots", &stream) < 0) {
        return NULL;
    }
    const mr_state_pool *pool = &p->pool;
    if (idx_get(st, a[0], 0, pool->device_type, pool->device_id, stream, "copy_slots(): src", &src) < 0
        || idx_get(st, a[1], 0, pool->device_type, pool->device_id, stream, "copy_slots(): dst", &dst) < 0
        || same_placement(&src, &dst, "copy_slots", "src", "dst") < 0) {
        goto error;
    }
    if (!src.idx.on_device) {
        int reason;
        int64_t bad;
        int rc = mr_state_pool_check_pairs(pool, src.idx.ptr, dst.idx.ptr, src.idx.n, &reason, &bad);
        if (rc == MR_ENOMEM) {
            PyErr_NoMemory();
            goto error;
        }
        if (rc != MR_OK) {
            raise_pair("copy_slots", reason, bad, src.idx.ptr, dst.idx.ptr, pool->slots, "src", "dst");
            goto error;
        }
    }
    int rc;
    RUN_KERNEL(rc, mr_state_pool_copy(pool, src.idx, dst.idx, (void *)stream));
    if (rc != MR_OK) {
        mr_raise(st, rc, "copy_slots()");
        goto error;
    }
    idx_release(&src);
    idx_release(&dst);
    Py_RETURN_NONE;
error:
    idx_release(&src);
    idx_release(&dst);
    return NULL;
}

PyDoc_STRVAR(StatePool_clear_slots__doc__,
"clear_slots($self, idx, /, *, stream=None)\n"
"--\n"
"\n"
"Zero slot idx[i] in every state tensor and layer, in one launch.");

static PyObject *
StatePool_clear_slots(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"idx", "stream"};
    PyObject *a[2];
    StatePoolObject *p = (StatePoolObject *)self;
    idx_arg idx = {0};
    if (parse_args("clear_slots", args, nargs, kwnames, names, 2, 1, 1, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_state_from_type(Py_TYPE(self));
    uintptr_t stream;
    if (st == NULL || parse_stream(a[1], "clear_slots", &stream) < 0) {
        return NULL;
    }
    const mr_state_pool *pool = &p->pool;
    if (idx_get(st, a[0], 0, pool->device_type, pool->device_id, stream, "clear_slots(): idx", &idx) < 0) {
        goto error;
    }
    if (!idx.idx.on_device) {
        int64_t bad;
        if (mr_state_pool_check_slots(pool, idx.idx.ptr, idx.idx.n, &bad) != MR_OK) {
            PyErr_Format(PyExc_IndexError, "clear_slots(): idx[%lld] = %lld is out of range [0, %lld]",
                         (long long)bad, (long long)((const int64_t *)idx.idx.ptr)[bad], (long long)pool->slots);
            goto error;
        }
    }
    int rc;
    RUN_KERNEL(rc, mr_state_pool_clear(pool, idx.idx, (void *)stream));
    if (rc != MR_OK) {
        mr_raise(st, rc, "clear_slots()");
        goto error;
    }
    idx_release(&idx);
    Py_RETURN_NONE;
error:
    idx_release(&idx);
    return NULL;
}

PyDoc_STRVAR(StatePool_track_decode__doc__,
"track_decode($self, running, track, mask, /, *, stream=None)\n"
"--\n"
"\n"
"After a decode step: for every i with mask[i] true, copy slot running[i]\n"
"to slot track[i] (all tensors, all layers), in one launch.  With device\n"
"tensors the launch reads everything on the device: no host sync, no\n"
"allocation, so it can be captured in a CUDA graph and replayed with new\n"
"values written into the same tensors.");

static PyObject *
StatePool_track_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"running", "track", "mask", "stream"};
    PyObject *a[4];
    StatePoolObject *p = (StatePoolObject *)self;
    idx_arg run = {0}, trk = {0}, msk = {0};
    int64_t *fs = NULL;
    if (parse_args("track_decode", args, nargs, kwnames, names, 4, 3, 3, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_state_from_type(Py_TYPE(self));
    uintptr_t stream;
    if (st == NULL || parse_stream(a[3], "track_decode", &stream) < 0) {
        return NULL;
    }
    const mr_state_pool *pool = &p->pool;
    if (idx_get(st, a[0], 0, pool->device_type, pool->device_id, stream, "track_decode(): running", &run) < 0
        || idx_get(st, a[1], 0, pool->device_type, pool->device_id, stream, "track_decode(): track", &trk) < 0
        || idx_get(st, a[2], 1, pool->device_type, pool->device_id, stream, "track_decode(): mask", &msk) < 0
        || same_placement(&run, &trk, "track_decode", "running", "track") < 0
        || same_placement(&run, &msk, "track_decode", "running", "mask") < 0) {
        goto error;
    }
    int rc;
    if (run.idx.on_device) {
        RUN_KERNEL(rc, mr_state_pool_track(pool, run.idx, trk.idx, msk.idx, (void *)stream));
    }
    else {
        /* Host: apply the mask here, check the selected pairs, copy. */
        int64_t n = run.idx.n, m = 0;
        fs = MR_MALLOC((size_t)(2 * n + 1) * sizeof(int64_t));
        if (fs == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        int64_t *fd = fs + n;
        const int64_t *r = run.idx.ptr, *t = trk.idx.ptr;
        const uint8_t *mk = msk.idx.ptr;
        for (int64_t i = 0; i < n; i++) {
            if (mk[i]) {
                fs[m] = r[i];
                fd[m] = t[i];
                m++;
            }
        }
        int reason;
        int64_t bad;
        rc = mr_state_pool_check_pairs(pool, fs, fd, m, &reason, &bad);
        if (rc == MR_ENOMEM) {
            PyErr_NoMemory();
            goto error;
        }
        if (rc != MR_OK) {
            raise_pair("track_decode", reason, bad, fs, fd, pool->slots, "running (masked)", "track (masked)");
            goto error;
        }
        mr_index s = {fs, m, 64, 0}, d = {fd, m, 64, 0};
        RUN_KERNEL(rc, mr_state_pool_copy(pool, s, d, (void *)stream));
    }
    if (rc != MR_OK) {
        mr_raise(st, rc, "track_decode()");
        goto error;
    }
    MR_FREE(fs);
    idx_release(&run);
    idx_release(&trk);
    idx_release(&msk);
    Py_RETURN_NONE;
error:
    MR_FREE(fs);
    idx_release(&run);
    idx_release(&trk);
    idx_release(&msk);
    return NULL;
}

/* Checks host destination slots of a snapshot: in range and distinct. */
static int
check_dst_slots(const mr_state_pool *pool, const idx_arg *dst, const char *fname)
{
    if (dst->idx.on_device) {
        return 0;
    }
    const int64_t *d = dst->idx.ptr;
    int64_t bad;
    if (mr_state_pool_check_slots(pool, d, dst->idx.n, &bad) != MR_OK) {
        PyErr_Format(PyExc_IndexError, "%s(): dst_slots[%lld] = %lld is out of range [0, %lld]", fname,
                     (long long)bad, (long long)d[bad], (long long)pool->slots);
        return -1;
    }
    uint8_t *seen = MR_CALLOC((size_t)pool->slots + 1, 1);
    if (seen == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int64_t i = 0; i < dst->idx.n; i++) {
        if (seen[d[i]]) {
            PyErr_Format(PyExc_ValueError, "%s(): dst_slots[%lld] = %lld appears twice", fname,
                         (long long)i, (long long)d[i]);
            MR_FREE(seen);
            return -1;
        }
        seen[d[i]] = 1;
    }
    MR_FREE(seen);
    return 0;
}

PyDoc_STRVAR(StatePool_snapshot_ssm_from_h__doc__,
"snapshot_ssm_from_h($self, layer, h, chunk_indices, dst_slots, /, *, stream=None)\n"
"--\n"
"\n"
"Prefill SSM snapshot: temporal[layer, dst_slots[i]] = h[chunk_indices[i]],\n"
"converted to the pool's dtype (bfloat16 <-> float32 rounds to nearest\n"
"even).  h holds the per-chunk states of a chunked prefill kernel,\n"
"[..., num_chunks, *temporal_shape] (e.g. FLA's [B, NT, H, V, K]; leading\n"
"dimensions are flattened), compact, on the pool's device.");

static PyObject *
StatePool_snapshot_ssm_from_h(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"layer", "h", "chunk_indices", "dst_slots", "stream"};
    PyObject *a[5];
    StatePoolObject *p = (StatePoolObject *)self;
    TensorObject *h = NULL;
    idx_arg ci = {0}, dst = {0};
    const char *fn = "snapshot_ssm_from_h";
    if (parse_args(fn, args, nargs, kwnames, names, 5, 4, 4, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_state_from_type(Py_TYPE(self));
    uintptr_t stream;
    int64_t layer;
    const mr_state_pool *pool = &p->pool;
    if (st == NULL || parse_stream(a[4], fn, &stream) < 0
        || mr_as_int64(a[0], 0, pool->layers - 1, "snapshot_ssm_from_h(): layer", &layer) < 0) {
        return NULL;
    }
    const mr_tensor *tt = pool->t[pool->nconv];
    h = tensor_import(st, a[1], stream, 0, "snapshot_ssm_from_h(): h");
    if (h == NULL) {
        goto error;
    }
    const mr_tensor *ht = &h->t;
    int sd = tt->ndim - 2;   /* per-slot dims */
    int shape_ok = ht->ndim >= sd + 1;
    for (int d = 0; shape_ok && d < sd; d++) {
        shape_ok = ht->shape[ht->ndim - sd + d] == tt->shape[2 + d];
    }
    if (!shape_ok) {
        PyErr_Format(PyExc_ValueError,
                     "snapshot_ssm_from_h(): h must be [..., num_chunks, *temporal_shape] with temporal_shape "
                     "= the pool's per-slot temporal shape (%d trailing dims)", sd);
        goto error;
    }
    if (ht->device_type != pool->device_type || ht->device_id != pool->device_id) {
        PyErr_SetString(PyExc_ValueError, "snapshot_ssm_from_h(): h is on another device than the pool");
        goto error;
    }
    int convertible = (ht->dtype == MR_DTYPE_FLOAT32 || ht->dtype == MR_DTYPE_BFLOAT16)
                      && (tt->dtype == MR_DTYPE_FLOAT32 || tt->dtype == MR_DTYPE_BFLOAT16);
    if (ht->dtype != tt->dtype && !convertible) {
        PyErr_Format(PyExc_TypeError,
                     "snapshot_ssm_from_h(): h has dtype %s, the pool's temporal %s (same dtype, or "
                     "float32/bfloat16 on both sides)", mr_dtype_name(ht->dtype), mr_dtype_name(tt->dtype));
        goto error;
    }
    mr_ssm_snap s;
    memset(&s, 0, sizeof(s));
    s.elems = 1;
    for (int d = 0; d < sd; d++) {
        s.elems *= tt->shape[2 + d];
    }
    s.h_chunks = s.elems > 0 ? ht->numel / s.elems : 0;
    s.h = ht->data;
    s.h_dtype = ht->dtype;
    s.dst_dtype = tt->dtype;
    s.dst_rows = pool->slots + 1;
    s.dst_slot_stride = pool->layout.t[pool->nconv].slot_stride;
    s.dst = pool->layout.t[pool->nconv].base + layer * pool->layout.t[pool->nconv].layer_stride;
    if (idx_get(st, a[2], 0, pool->device_type, pool->device_id, stream, "snapshot_ssm_from_h(): chunk_indices", &ci) < 0
        || idx_get(st, a[3], 0, pool->device_type, pool->device_id, stream, "snapshot_ssm_from_h(): dst_slots", &dst) < 0
        || same_placement(&ci, &dst, fn, "chunk_indices", "dst_slots") < 0
        || check_dst_slots(pool, &dst, fn) < 0) {
        goto error;
    }
    if (!ci.idx.on_device) {
        const int64_t *c = ci.idx.ptr;
        for (int64_t i = 0; i < ci.idx.n; i++) {
            if (c[i] < 0 || c[i] >= s.h_chunks) {
                PyErr_Format(PyExc_IndexError,
                             "snapshot_ssm_from_h(): chunk_indices[%lld] = %lld is out of range [0, %lld)",
                             (long long)i, (long long)c[i], (long long)s.h_chunks);
                goto error;
            }
        }
    }
    int rc;
    RUN_KERNEL(rc, mr_k_snapshot_ssm(pool->device_type, pool->device_id, &s, ci.idx, dst.idx, (void *)stream));
    if (rc != MR_OK) {
        mr_raise(st, rc, "snapshot_ssm_from_h()");
        goto error;
    }
    Py_DECREF(h);
    idx_release(&ci);
    idx_release(&dst);
    Py_RETURN_NONE;
error:
    Py_XDECREF(h);
    idx_release(&ci);
    idx_release(&dst);
    return NULL;
}

PyDoc_STRVAR(StatePool_snapshot_conv_window__doc__,
"snapshot_conv_window($self, layer, x, positions, dst_slots, /, *, conv_index=0, stream=None)\n"
"--\n"
"\n"
"Prefill conv snapshot: with conv[conv_index] per slot [dim, K - 1] and x\n"
"the layer's pre-conv input [T, dim] (the whole flattened batch), write\n"
"conv[conv_index][layer, dst_slots[i], :, j] = x[t, :] for j < K - 1 and\n"
"t = clamp(positions[i] - (K - 1) + j, 0, T - 1): the K - 1 raw inputs\n"
"before token position positions[i], as SGLang's tracked conv state.");

static PyObject *
StatePool_snapshot_conv_window(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"layer", "x", "positions", "dst_slots", "conv_index", "stream"};
    PyObject *a[6];
    StatePoolObject *p = (StatePoolObject *)self;
    TensorObject *x = NULL;
    idx_arg pos = {0}, dst = {0};
    const char *fn = "snapshot_conv_window";
    if (parse_args(fn, args, nargs, kwnames, names, 6, 4, 4, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_state_from_type(Py_TYPE(self));
    uintptr_t stream;
    int64_t layer, ci = 0;
    const mr_state_pool *pool = &p->pool;
    if (st == NULL || parse_stream(a[5], fn, &stream) < 0
        || mr_as_int64(a[0], 0, pool->layers - 1, "snapshot_conv_window(): layer", &layer) < 0
        || (a[4] != NULL && mr_as_int64(a[4], 0, pool->nconv - 1, "snapshot_conv_window(): conv_index", &ci) < 0)) {
        return NULL;
    }
    const mr_tensor *ct = pool->t[ci];
    if (ct->ndim != 4) {
        PyErr_Format(PyExc_ValueError,
                     "snapshot_conv_window(): conv[%lld] must be [layers, slots + 1, dim, K - 1]", (long long)ci);
        return NULL;
    }
    x = tensor_import(st, a[1], stream, 0, "snapshot_conv_window(): x");
    if (x == NULL) {
        goto error;
    }
    if (x->t.ndim != 2 || x->t.shape[1] != ct->shape[2]) {
        PyErr_Format(PyExc_ValueError, "snapshot_conv_window(): x must be [T, dim] with dim = %lld",
                     (long long)ct->shape[2]);
        goto error;
    }
    if (x->t.dtype != ct->dtype) {
        PyErr_Format(PyExc_TypeError, "snapshot_conv_window(): x has dtype %s, conv[%lld] %s (must match)",
                     mr_dtype_name(x->t.dtype), (long long)ci, mr_dtype_name(ct->dtype));
        goto error;
    }
    if (x->t.device_type != pool->device_type || x->t.device_id != pool->device_id) {
        PyErr_SetString(PyExc_ValueError, "snapshot_conv_window(): x is on another device than the pool");
        goto error;
    }
    if (idx_get(st, a[2], 0, pool->device_type, pool->device_id, stream, "snapshot_conv_window(): positions", &pos) < 0
        || idx_get(st, a[3], 0, pool->device_type, pool->device_id, stream, "snapshot_conv_window(): dst_slots", &dst) < 0
        || same_placement(&pos, &dst, fn, "positions", "dst_slots") < 0
        || check_dst_slots(pool, &dst, fn) < 0) {
        goto error;
    }
    if (x->t.shape[0] == 0 && pos.idx.n > 0) {
        PyErr_SetString(PyExc_ValueError, "snapshot_conv_window(): x has no tokens");
        goto error;
    }
    mr_conv_snap s;
    memset(&s, 0, sizeof(s));
    s.dst = pool->layout.t[ci].base + layer * pool->layout.t[ci].layer_stride;
    s.dst_slot_stride = pool->layout.t[ci].slot_stride;
    s.dst_rows = pool->slots + 1;
    s.x = x->t.data;
    s.tokens = x->t.shape[0];
    s.dim = x->t.shape[1];
    s.km1 = ct->shape[3];
    s.elem_size = (int64_t)mr_dtype_size(ct->dtype);
    int rc;
    RUN_KERNEL(rc, mr_k_snapshot_conv(pool->device_type, pool->device_id, &s, pos.idx, dst.idx, (void *)stream));
    if (rc != MR_OK) {
        mr_raise(st, rc, "snapshot_conv_window()");
        goto error;
    }
    Py_DECREF(x);
    idx_release(&pos);
    idx_release(&dst);
    Py_RETURN_NONE;
error:
    Py_XDECREF(x);
    idx_release(&pos);
    idx_release(&dst);
    return NULL;
}

static PyObject *
StatePool_get_conv(PyObject *self, void *closure)
{
    StatePoolObject *p = (StatePoolObject *)self;
    return PyTuple_GetSlice(p->tensors, 0, p->pool.nconv);
}

static PyObject *
StatePool_get_temporal(PyObject *self, void *closure)
{
    StatePoolObject *p = (StatePoolObject *)self;
    return Py_NewRef(PyTuple_GET_ITEM(p->tensors, p->pool.nconv));
}

static PyObject *
StatePool_get_num_slots(PyObject *self, void *closure)
{
    return PyLong_FromLongLong(((StatePoolObject *)self)->pool.slots);
}

static PyObject *
StatePool_get_num_layers(PyObject *self, void *closure)
{
    return PyLong_FromLongLong(((StatePoolObject *)self)->pool.layers);
}

static PyObject *
StatePool_get_bytes_per_slot(PyObject *self, void *closure)
{
    return PyLong_FromLongLong(((StatePoolObject *)self)->pool.bytes_per_slot);
}

static PyObject *
StatePool_get_device(PyObject *self, void *closure)
{
    StatePoolObject *p = (StatePoolObject *)self;
    char buf[64];
    format_device(buf, sizeof(buf), p->pool.device_type, p->pool.device_id);
    return PyUnicode_FromString(buf);
}

static PyObject *
StatePool_repr(PyObject *self)
{
    StatePoolObject *p = (StatePoolObject *)self;
    char dev[64];
    format_device(dev, sizeof(dev), p->pool.device_type, p->pool.device_id);
    return PyUnicode_FromFormat("mambaradix.StatePool(layers=%lld, slots=%lld, conv=%d, bytes_per_slot=%lld, device=%s)",
                                (long long)p->pool.layers, (long long)p->pool.slots, p->pool.nconv,
                                (long long)p->pool.bytes_per_slot, dev);
}

static PyGetSetDef StatePool_getset[] = {
    {"conv", StatePool_get_conv, NULL, "The conv state tensors (a tuple of Tensor).", NULL},
    {"temporal", StatePool_get_temporal, NULL, "The temporal (SSM) state tensor.", NULL},
    {"num_slots", StatePool_get_num_slots, NULL, "Usable slots (1..num_slots); slot 0 is padding.", NULL},
    {"num_layers", StatePool_get_num_layers, NULL, "Layers (dim 0 of every tensor).", NULL},
    {"bytes_per_slot", StatePool_get_bytes_per_slot, NULL, "Bytes of one slot over all tensors and layers.", NULL},
    {"device", StatePool_get_device, NULL, "'cpu' or 'cuda:N'.", NULL},
    {NULL},
};

static PyMethodDef StatePool_methods[] = {
    {"allocate", (PyCFunction)(void (*)(void))StatePool_allocate, METH_FASTCALL | METH_KEYWORDS | METH_CLASS,
     StatePool_allocate__doc__},
    {"copy_slots", (PyCFunction)(void (*)(void))StatePool_copy_slots, METH_FASTCALL | METH_KEYWORDS,
     StatePool_copy_slots__doc__},
    {"clear_slots", (PyCFunction)(void (*)(void))StatePool_clear_slots, METH_FASTCALL | METH_KEYWORDS,
     StatePool_clear_slots__doc__},
    {"track_decode", (PyCFunction)(void (*)(void))StatePool_track_decode, METH_FASTCALL | METH_KEYWORDS,
     StatePool_track_decode__doc__},
    {"snapshot_ssm_from_h", (PyCFunction)(void (*)(void))StatePool_snapshot_ssm_from_h, METH_FASTCALL | METH_KEYWORDS,
     StatePool_snapshot_ssm_from_h__doc__},
    {"snapshot_conv_window", (PyCFunction)(void (*)(void))StatePool_snapshot_conv_window,
     METH_FASTCALL | METH_KEYWORDS, StatePool_snapshot_conv_window__doc__},
    {NULL},
};

static PyType_Slot StatePool_slots[] = {
    {Py_tp_new, StatePool_new},
    {Py_tp_dealloc, StatePool_dealloc},
    {Py_tp_traverse, StatePool_traverse},
    {Py_tp_clear, StatePool_clear},
    {Py_tp_repr, StatePool_repr},
    {Py_tp_getset, StatePool_getset},
    {Py_tp_methods, StatePool_methods},
    {Py_tp_doc, (void *)StatePool_new__doc__},
    {0, NULL},
};

static PyType_Spec StatePool_spec = {
    .name = "mambaradix.StatePool",
    .basicsize = sizeof(StatePoolObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = StatePool_slots,
};

/* ------------------------------------------------------------------------
 * write_req_to_token */

PyDoc_STRVAR(write_req_to_token__doc__,
"write_req_to_token(table, rows, starts, values, /, *, ends=None, stream=None)\n"
"--\n"
"\n"
"Scatter token indices into a req-to-token table (int32 or int64,\n"
"[num_rows, max_context_len], CPU or CUDA).  With ends:\n"
"table[rows[i], starts[i]:ends[i]] = the next ends[i] - starts[i] entries\n"
"of values (1-D, concatenated in row order).  Without ends, values is\n"
"[n] or [n, w] and table[rows[i], starts[i]:starts[i] + w] = values[i].\n"
"Device index tensors give one launch (entries out of range are skipped;\n"
"values are not range-checked); host ones are checked (OverflowError for a\n"
"value an int32 table cannot hold) and, for a CUDA table, copied row by row.");

static PyObject *
mod_write_req_to_token(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"table", "rows", "starts", "values", "ends", "stream"};
    PyObject *a[6];
    const char *fn = "write_req_to_token";
    TensorObject *table = NULL, *vals_t = NULL;
    idx_arg rows = {0}, starts = {0}, ends = {0}, vals = {0};
    void *conv = NULL;
    if (parse_args(fn, args, nargs, kwnames, names, 6, 4, 4, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_get_state(module);
    uintptr_t stream;
    if (parse_stream(a[5], fn, &stream) < 0) {
        return NULL;
    }
    table = tensor_import(st, a[0], stream, 1, "write_req_to_token(): table");
    if (table == NULL) {
        return NULL;
    }
    const mr_tensor *tt = &table->t;
    if (tt->dtype != MR_DTYPE_INT32 && tt->dtype != MR_DTYPE_INT64) {
        PyErr_Format(PyExc_TypeError, "write_req_to_token(): table must be int32 or int64, not %s",
                     mr_dtype_name(tt->dtype));
        goto error;
    }
    if (tt->ndim != 2) {
        PyErr_SetString(PyExc_ValueError, "write_req_to_token(): table must be 2-D [rows, max_context_len]");
        goto error;
    }
    int32_t dvt = tt->device_type, dvi = tt->device_id;
    int has_ends = a[4] != NULL && a[4] != Py_None;
    if (idx_get(st, a[1], 0, dvt, dvi, stream, "write_req_to_token(): rows", &rows) < 0
        || idx_get(st, a[2], 0, dvt, dvi, stream, "write_req_to_token(): starts", &starts) < 0
        || same_placement(&rows, &starts, fn, "rows", "starts") < 0
        || (has_ends && (idx_get(st, a[4], 0, dvt, dvi, stream, "write_req_to_token(): ends", &ends) < 0
                         || same_placement(&rows, &ends, fn, "rows", "ends") < 0))) {
        goto error;
    }
    int64_t n = rows.idx.n, nvalues, width = 0;
    mr_rtt_write w;
    memset(&w, 0, sizeof(w));
    if (rows.idx.on_device) {
        /* values: a device tensor of int32/int64. */
        vals_t = tensor_import(st, a[3], stream, 0, "write_req_to_token(): values");
        if (vals_t == NULL) {
            goto error;
        }
        if (vals_t->t.dtype != MR_DTYPE_INT32 && vals_t->t.dtype != MR_DTYPE_INT64) {
            PyErr_Format(PyExc_TypeError, "write_req_to_token(): values must be int32 or int64, not %s",
                         mr_dtype_name(vals_t->t.dtype));
            goto error;
        }
        if (vals_t->t.device_type != dvt || vals_t->t.device_id != dvi) {
            PyErr_SetString(PyExc_ValueError,
                            "write_req_to_token(): values must be on the table's device when rows is");
            goto error;
        }
        if (n > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "write_req_to_token(): too many rows");
            goto error;
        }
        nvalues = vals_t->t.numel;
        if (!has_ends) {
            if (vals_t->t.ndim == 2 && vals_t->t.shape[0] == n) {
                width = vals_t->t.shape[1];
            }
            else if (vals_t->t.ndim == 1 && vals_t->t.shape[0] == n) {
                width = 1;
            }
            else {
                PyErr_SetString(PyExc_ValueError, "write_req_to_token(): without ends, values must be [n] or [n, w]");
                goto error;
            }
        }
        w.values = vals_t->t.data;
        w.value_bits = (int)mr_dtype_size(vals_t->t.dtype) * 8;
        w.values_on_device = 1;
    }
    else {
        /* Host values: read as int64 (through the index path), checked. */
        if (idx_get(st, a[3], 0, dvt, dvi, stream, "write_req_to_token(): values", &vals) < 0) {
            /* a 2-D host array is allowed without ends: flatten it */
            if (!has_ends && PyErr_ExceptionMatches(PyExc_ValueError)) {
                PyErr_Clear();
                /* a DLPack producer (a torch CPU tensor) goes through
                 * numpy.from_dlpack: its __array__ may not take copy= */
                PyObject *src = a[3], *tmp = NULL;
                if (!PyArray_Check(src) && PyObject_HasAttrString(src, "__dlpack__")) {
                    PyObject *np = PyImport_ImportModule("numpy");
                    tmp = np != NULL ? PyObject_CallMethod(np, "from_dlpack", "O", src) : NULL;
                    Py_XDECREF(np);
                    if (tmp == NULL) {
                        goto error;
                    }
                    src = tmp;
                }
                PyObject *flat = PyArray_FromAny(src, PyArray_DescrFromType(NPY_INT64), 2, 2,
                                                 NPY_ARRAY_CARRAY_RO | NPY_ARRAY_ENSURECOPY, NULL);
                Py_XDECREF(tmp);
                if (flat == NULL) {
                    goto error;
                }
                if (PyArray_DIM((PyArrayObject *)flat, 0) != n) {
                    Py_DECREF(flat);
                    PyErr_SetString(PyExc_ValueError, "write_req_to_token(): values must be [n] or [n, w]");
                    goto error;
                }
                width = PyArray_DIM((PyArrayObject *)flat, 1);
                vals.owner = flat;
                vals.idx.ptr = PyArray_DATA((PyArrayObject *)flat);
                vals.idx.n = (int64_t)PyArray_SIZE((PyArrayObject *)flat);
                vals.idx.bits = 64;
            }
            else {
                goto error;
            }
        }
        else if (vals.idx.on_device) {
            PyErr_SetString(PyExc_ValueError,
                            "write_req_to_token(): values must be a host array when rows/starts are host arrays");
            goto error;
        }
        else if (!has_ends) {
            if (vals.idx.n != n) {
                PyErr_Format(PyExc_ValueError, "write_req_to_token(): values has %lld entries, rows %lld",
                             (long long)vals.idx.n, (long long)n);
                goto error;
            }
            width = 1;
        }
        nvalues = vals.idx.n;
        const int64_t *r = rows.idx.ptr, *s = starts.idx.ptr, *e = has_ends ? ends.idx.ptr : NULL;
        int64_t total = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t len = e != NULL ? e[i] - s[i] : width;
            if (r[i] < 0 || r[i] >= tt->shape[0]) {
                PyErr_Format(PyExc_IndexError, "write_req_to_token(): rows[%lld] = %lld is out of range [0, %lld)",
                             (long long)i, (long long)r[i], (long long)tt->shape[0]);
                goto error;
            }
            if (s[i] < 0 || len < 0 || s[i] + len > tt->shape[1]) {
                PyErr_Format(PyExc_IndexError,
                             "write_req_to_token(): row %lld writes [%lld, %lld), outside [0, %lld]",
                             (long long)i, (long long)s[i], (long long)(s[i] + len), (long long)tt->shape[1]);
                goto error;
            }
            total += len;
        }
        if (total != nvalues) {
            PyErr_Format(PyExc_ValueError, "write_req_to_token(): the ranges cover %lld tokens, values has %lld",
                         (long long)total, (long long)nvalues);
            goto error;
        }
        if (tt->dtype == MR_DTYPE_INT32) {
            const int64_t *v = vals.idx.ptr;
            for (int64_t k = 0; k < nvalues; k++) {
                if (v[k] < INT32_MIN || v[k] > INT32_MAX) {
                    PyErr_Format(PyExc_OverflowError,
                                 "write_req_to_token(): values[%lld] = %lld does not fit the int32 table",
                                 (long long)k, (long long)v[k]);
                    goto error;
                }
            }
        }
        w.values = vals.idx.ptr;
        w.value_bits = 64;
        if (dvt == MR_DL_CUDA && tt->dtype == MR_DTYPE_INT32) {
            /* The row-by-row device copy needs values in the table's type. */
            conv = MR_MALLOC((size_t)(nvalues > 0 ? nvalues : 1) * sizeof(int32_t));
            if (conv == NULL) {
                PyErr_NoMemory();
                goto error;
            }
            const int64_t *v = vals.idx.ptr;
            for (int64_t k = 0; k < nvalues; k++) {
                ((int32_t *)conv)[k] = (int32_t)v[k];  /* in range: checked above */
            }
            w.values = conv;
            w.value_bits = 32;
        }
    }
    w.table = tt->data;
    w.nrows = tt->shape[0];
    w.ncols = tt->shape[1];
    w.table_bits = (int)mr_dtype_size(tt->dtype) * 8;
    w.nvalues = nvalues;
    w.width = width;
    int rc;
    RUN_KERNEL(rc, mr_k_write_req_to_token(dvt, dvi, &w, rows.idx, starts.idx, ends.idx, (void *)stream));
    if (rc != MR_OK) {
        mr_raise(st, rc, "write_req_to_token()");
        goto error;
    }
    MR_FREE(conv);
    Py_DECREF(table);
    Py_XDECREF(vals_t);
    idx_release(&rows);
    idx_release(&starts);
    idx_release(&ends);
    idx_release(&vals);
    Py_RETURN_NONE;
error:
    MR_FREE(conv);
    Py_XDECREF(table);
    Py_XDECREF(vals_t);
    idx_release(&rows);
    idx_release(&starts);
    idx_release(&ends);
    idx_release(&vals);
    return NULL;
}

/* ------------------------------------------------------------------------
 * Test-only DLPack producer */

/* Deleter calls of _testing_make_capsule's tensors, process-wide. */
static long mr_testing_deleted = 0;

typedef struct {
    union {
        mr_dl_managed_versioned v;
        mr_dl_managed l;
    } m;
    int64_t shape[MR_TENSOR_MAX_NDIM];
    int64_t strides[MR_TENSOR_MAX_NDIM];
    void *buf;
} testing_holder;

static void
testing_free(testing_holder *h)
{
    mr_testing_deleted++;
    MR_FREE(h->buf);
    MR_FREE(h);
}

static void
testing_deleter_v(mr_dl_managed_versioned *m)
{
    testing_free(m->manager_ctx);
}

static void
testing_deleter_l(mr_dl_managed *m)
{
    testing_free(m->manager_ctx);
}

PyDoc_STRVAR(testing_make_capsule__doc__,
"_testing_make_capsule(shape, dtype='float32', *, versioned=True, version=(1, 1), readonly=False,\n"
"                      strides=None, byte_offset=0, device=(1, 0), null_data=False)\n"
"--\n"
"\n"
"Test helper: a DLPack capsule over new host memory filled with byte i of\n"
"the data = (i * 37 + 11) & 0xFF (after byte_offset).  The device tuple\n"
"only labels the tensor (the memory is always host memory).  Deleter calls\n"
"are counted by _testing_deleter_calls().");

static PyObject *
mod_testing_make_capsule(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"shape", "dtype", "versioned", "version", "readonly",
                                        "strides", "byte_offset", "device", "null_data"};
    PyObject *a[9];
    if (parse_args("_testing_make_capsule", args, nargs, kwnames, names, 9, 1, 2, a) < 0) {
        return NULL;
    }
    int64_t shape[MR_TENSOR_MAX_NDIM], strides[MR_TENSOR_MAX_NDIM];
    int ndim, nstr = -1, dtype = MR_DTYPE_FLOAT32;
    int versioned = a[2] ? PyObject_IsTrue(a[2]) : 1;
    int readonly = a[4] ? PyObject_IsTrue(a[4]) : 0;
    int null_data = a[8] ? PyObject_IsTrue(a[8]) : 0;
    unsigned major = 1, minor = 1;
    int64_t byte_offset = 0;
    int32_t dev_type = MR_DL_CPU, dev_id = 0;
    if (versioned < 0 || readonly < 0 || null_data < 0
        || parse_shape(a[0], "shape", shape, &ndim) < 0
        || (a[1] && parse_dtype(a[1], "dtype", &dtype) < 0)
        || (a[3] && !PyArg_ParseTuple(a[3], "II", &major, &minor))
        || (a[5] && a[5] != Py_None && parse_shape(a[5], "strides", strides, &nstr) < 0)
        || (a[6] && mr_as_int64(a[6], 0, 1 << 20, "byte_offset", &byte_offset) < 0)
        || (a[7] && parse_device(a[7], "device", &dev_type, &dev_id) < 0)) {
        return NULL;
    }
    if (nstr >= 0 && nstr != ndim) {
        PyErr_SetString(PyExc_ValueError, "strides must have one entry per dimension");
        return NULL;
    }
    /* Memory large enough for the strided extent. */
    int64_t span = 1, numel = 1;
    for (int i = 0; i < ndim; i++) {
        numel *= shape[i];
        span += nstr >= 0 ? (shape[i] - 1) * strides[i] : 0;
    }
    if (nstr < 0 || numel == 0) {
        span = numel;
    }
    size_t nbytes = (size_t)span * mr_dtype_size(dtype) + (size_t)byte_offset;
    testing_holder *h = MR_CALLOC(1, sizeof(*h));
    if (h == NULL) {
        return PyErr_NoMemory();
    }
    h->buf = MR_MALLOC(nbytes + 16);
    if (h->buf == NULL) {
        MR_FREE(h);
        return PyErr_NoMemory();
    }
    unsigned char *b = h->buf;
    for (size_t i = 0; i < nbytes; i++) {
        b[i] = i < (size_t)byte_offset ? 0xEE : (unsigned char)(((i - (size_t)byte_offset) * 37 + 11) & 0xFF);
    }
    mr_dl_tensor dl;
    memset(&dl, 0, sizeof(dl));
    memcpy(h->shape, shape, sizeof(int64_t) * (size_t)ndim);
    if (nstr >= 0) {
        memcpy(h->strides, strides, sizeof(int64_t) * (size_t)ndim);
    }
    dl.data = null_data ? NULL : h->buf;
    dl.device.device_type = dev_type;
    dl.device.device_id = dev_id;
    dl.ndim = ndim;
    dl.dtype = mr_dtype_to_dl(dtype);
    dl.shape = h->shape;
    dl.strides = nstr >= 0 ? h->strides : NULL;
    dl.byte_offset = (uint64_t)byte_offset;
    PyObject *cap;
    if (versioned) {
        h->m.v.version.major = major;
        h->m.v.version.minor = minor;
        h->m.v.manager_ctx = h;
        h->m.v.deleter = testing_deleter_v;
        h->m.v.flags = readonly ? MR_DL_FLAG_READ_ONLY : 0;
        h->m.v.dl_tensor = dl;
        cap = PyCapsule_New(&h->m.v, CAP_VERSIONED, export_capsule_destructor);
    }
    else {
        h->m.l.dl_tensor = dl;
        h->m.l.manager_ctx = h;
        h->m.l.deleter = testing_deleter_l;
        cap = PyCapsule_New(&h->m.l, CAP_LEGACY, export_capsule_destructor);
    }
    if (cap == NULL) {
        testing_free(h);
        mr_testing_deleted--;
    }
    return cap;
}

PyDoc_STRVAR(testing_deleter_calls__doc__,
"_testing_deleter_calls()\n"
"--\n"
"\n"
"Test helper: how many _testing_make_capsule tensors were deleted so far.");

static PyObject *
mod_testing_deleter_calls(PyObject *module, PyObject *unused)
{
    return PyLong_FromLong(mr_testing_deleted);
}

static PyMethodDef tensor_functions[] = {
    {"write_req_to_token", (PyCFunction)(void (*)(void))mod_write_req_to_token, METH_FASTCALL | METH_KEYWORDS,
     write_req_to_token__doc__},
    {"_testing_make_capsule", (PyCFunction)(void (*)(void))mod_testing_make_capsule, METH_FASTCALL | METH_KEYWORDS,
     testing_make_capsule__doc__},
    {"_testing_deleter_calls", mod_testing_deleter_calls, METH_NOARGS, testing_deleter_calls__doc__},
    {NULL},
};

/* ------------------------------------------------------------------------
 * Registration */

int
mr_py_tensor_init(PyObject *m, mr_state *st)
{
    if (mr_add_type(m, &st->Tensor, PyType_FromModuleAndSpec(m, &Tensor_spec, NULL)) < 0
        || mr_add_type(m, &st->StatePool, PyType_FromModuleAndSpec(m, &StatePool_spec, NULL)) < 0
        || PyModule_AddFunctions(m, tensor_functions) < 0) {
        return -1;
    }
    return 0;
}
