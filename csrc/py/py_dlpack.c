/* py_dlpack.c - the mambaradix.Tensor owner type (DLPack consumer and
 * producer), the tensor argument converters, a test-only DLPack producer,
 * and the registration of the tensor bindings (py_tensor.h).
 *
 * DLPack consumer sequence (see the project's style guide, section 3.3):
 * __dlpack_device__(), then __dlpack__(stream=S, max_version=(1, 1)) with
 * a retry without max_version for old producers, then the capsule name
 * decides versioned or legacy; all checks run before the capsule is renamed
 * to "used_*", which is the last step that can fail.  From then on the
 * Tensor object owns the managed tensor and its deallocation calls the
 * producer's deleter exactly once. */
#include "py_tensor.h"

#include <string.h>

#include "cuda_api.h"
#include "dlpack_abi.h"
#include "py_numpy.h"

static const char CAP_VERSIONED[] = "dltensor_versioned";
static const char CAP_LEGACY[] = "dltensor";
static const char CAP_USED_VERSIONED[] = "used_dltensor_versioned";
static const char CAP_USED_LEGACY[] = "used_dltensor";

/* ------------------------------------------------------------------------
 * Argument converters */

/* Parses a stream argument: None -> 0 (the legacy default stream), or a
 * non-negative int (a cudaStream_t as an int, e.g. torch's
 * current_stream().cuda_stream).  Returns 0 or -1 with an exception. */
int
mr_parse_stream(PyObject *o, const char *fname, uintptr_t *out)
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

/* A device memory is allocated on: kDLCPU (id 0) or kDLCUDA, else a
 * ValueError naming `what`. */
int
mr_alloc_device_check(const char *what, int32_t type, int32_t id)
{
    if ((type == MR_DL_CPU && id == 0) || type == MR_DL_CUDA) {
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s must be the CPU, (1, 0), or a CUDA device, (2, N); not (%d, %d)", what,
                 (int)type, (int)id);
    return -1;
}

/* Parses a device: "cpu", "cuda", "cuda:N", anything whose str() is one
 * of those (torch.device), or a (device_type, device_id) tuple. */
int
mr_parse_device(PyObject *o, const char *what, int32_t *type, int32_t *id)
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
    int rc = c == NULL ? -1 : mr_device_from_name(c, type, id) == MR_OK ? 0 : -2;
    if (rc == -2) {
        PyErr_Format(PyExc_ValueError, "%s must be 'cpu', 'cuda' or 'cuda:N', not %R", what, o);
        rc = -1;
    }
    Py_DECREF(s);
    return rc;
}

/* Parses a dtype: a name ("bfloat16", "bf16", "torch.float32"), any
 * object whose str() is one (numpy/torch dtypes) or a numpy scalar type
 * (np.float16, read as np.dtype(np.float16)). */
int
mr_parse_dtype(PyObject *o, const char *what, int *out)
{
    PyObject *s = NULL;
    if (PyType_Check(o) && PyType_IsSubtype((PyTypeObject *)o, &PyGenericArrType_Type)) {
        PyArray_Descr *d = PyArray_DescrFromTypeObject(o);
        if (d == NULL) {
            return -1;
        }
        s = PyObject_Str((PyObject *)d);
        Py_DECREF(d);
    }
    else {
        s = PyUnicode_Check(o) ? Py_NewRef(o) : PyObject_Str(o);
    }
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

/* Parses a shape (a sequence or buffer of non-negative ints, through the
 * integer reader: errors name the entry). */
int
mr_parse_shape(PyObject *o, const char *what, int64_t *shape, int *ndim)
{
    mr_buf scratch = {0};
    mr_ints v;
    if (mr_ints_read(o, 8, 0, INT64_MAX / 16, what, 0, &scratch, &v) < 0) {
        mr_buf_free(&scratch);
        return -1;
    }
    int rc = 0;
    if (v.len > MR_TENSOR_MAX_NDIM - 2) {
        PyErr_Format(PyExc_ValueError, "%s has too many dimensions (at most %d)", what, MR_TENSOR_MAX_NDIM - 2);
        rc = -1;
    }
    else {
        memcpy(shape, v.data, v.len * sizeof(int64_t));
        *ndim = (int)v.len;
    }
    mr_ints_release(&v);
    mr_buf_free(&scratch);
    return rc;
}

/* ------------------------------------------------------------------------
 * Tensor: the owner type */

static void
Tensor_dealloc(PyObject *self)
{
    TensorObject *o = (TensorObject *)self;
    mr_tensor_release(&o->t);
    mr_type_free((PyObject *)self);
}

/* A new, empty Tensor object.  Returns NULL with an exception set. */
static TensorObject *
mr_tensor_new_empty(mr_state *st)
{
    PyTypeObject *tp = (PyTypeObject *)st->Tensor;
    allocfunc alloc = PyType_GetSlot(tp, Py_tp_alloc);
    TensorObject *o = (TensorObject *)alloc(tp, 0);
    if (o != NULL) {
        memset(&o->t, 0, sizeof(o->t));
    }
    return o;
}

/* Words an unreachable device (mr_device_reachable) of arg: -1 with a
 * RuntimeError, or 0 for MR_TP_OK. */
static int
raise_unreachable(int problem, int32_t device_id, const char *arg)
{
    if (problem == MR_TP_NO_CUDA) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s is a CUDA tensor, but mambaradix was built without CUDA "
                     "(rebuild with nvcc available, MAMBARADIX_CUDA=1)", arg);
        return -1;
    }
    if (problem == MR_TP_CUDA_ID) {
        PyErr_Format(PyExc_RuntimeError, "%s is on cuda:%d, but %d CUDA device(s) are visible", arg,
                     (int)device_id, mr_cuda_device_count());
        return -1;
    }
    return 0;
}

int
mr_check_cuda_reachable(int32_t device_type, int32_t device_id, const char *arg)
{
    return raise_unreachable(mr_device_reachable(device_type, device_id), device_id, arg);
}

/* Words a refusal (MR_TP_*, mr_tensor_take_dl) of the producer's tensor
 * managed, passed as arg. */
static void
raise_dl_problem(int problem, void *managed, int versioned, const char *arg)
{
    const mr_dl_tensor *dl;
    uint64_t flags;
    (void)mr_dl_unwrap(managed, versioned, &dl, &flags);
    switch (problem) {
    case MR_TP_VERSION:
        PyErr_Format(PyExc_BufferError, "%s: unsupported DLPack version %u.%u (this build reads 1.x)", arg,
                     ((mr_dl_managed_versioned *)managed)->version.major,
                     ((mr_dl_managed_versioned *)managed)->version.minor);
        break;
    case MR_TP_NDIM:
        PyErr_Format(PyExc_ValueError, "%s: bad DLPack tensor (ndim %d, at most %d)", arg, (int)dl->ndim,
                     MR_TENSOR_MAX_NDIM);
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
        PyErr_Format(PyExc_BufferError, "%s: the tensor is not compact row-major (call .contiguous() first)", arg);
        break;
    case MR_TP_NULL:
        PyErr_Format(PyExc_BufferError, "%s: NULL data pointer", arg);
        break;
    case MR_TP_READONLY:
        PyErr_Format(PyExc_BufferError, "%s is read-only, but mambaradix writes to it", arg);
        break;
    default:
        raise_unreachable(problem, dl->device.device_id, arg);
        break;
    }
}

/* Calls obj.__dlpack__ with (stream, max_version), retrying for older
 * producers: without max_version on TypeError or BufferError.  Returns a
 * new reference or NULL with an exception set. */
static PyObject *
mr_call_dlpack(PyObject *obj, PyObject *stream_arg)
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
TensorObject *
mr_tensor_import(mr_state *st, PyObject *obj, uintptr_t stream, int writable, const char *arg)
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
        cap = mr_call_dlpack(obj, stream_arg);
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

    int versioned = PyCapsule_IsValid(cap, CAP_VERSIONED);
    if (!versioned && !PyCapsule_IsValid(cap, CAP_LEGACY)) {
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
    out = mr_tensor_new_empty(st);
    if (out == NULL) {
        goto error;
    }
    int problem;
    if (mr_tensor_take_dl(managed, versioned, writable, &out->t, &problem) != MR_OK) {
        raise_dl_problem(problem, managed, versioned, arg);
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
void
export_capsule_destructor(PyObject *cap)
{
    int versioned = PyCapsule_IsValid(cap, CAP_VERSIONED);
    if (versioned || PyCapsule_IsValid(cap, CAP_LEGACY)) {
        mr_dl_delete(PyCapsule_GetPointer(cap, versioned ? CAP_VERSIONED : CAP_LEGACY), versioned);
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
    MR_ARGS(spec, a, "__dlpack__", 0, 0, 0, "stream", "max_version", "dl_device", "copy");
    TensorObject *o = (TensorObject *)self;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
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
    int want_copy = 0;
    if (copy != NULL && copy != Py_None && mr_arg_bool(copy, "__dlpack__", "copy", &want_copy) < 0) {
        return NULL;
    }
    if (want_copy) {
        PyErr_SetString(PyExc_BufferError, "__dlpack__: copy=True is not supported (mambaradix exports views)");
        return NULL;
    }
    if (dl_device != NULL && dl_device != Py_None) {
        int64_t t, i;
        if (!PyTuple_Check(dl_device) || PyTuple_GET_SIZE(dl_device) != 2
            || mr_as_int64(PyTuple_GET_ITEM(dl_device, 0), 0, INT32_MAX, "__dlpack__: dl_device", &t) < 0
            || mr_as_int64(PyTuple_GET_ITEM(dl_device, 1), 0, INT32_MAX, "__dlpack__: dl_device", &i) < 0) {
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
        mr_dl_delete(managed, versioned);
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
    MR_ARGS(spec, a, "from_dlpack", 0, 1, 1, "obj", "stream", "writable");
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_state_from_type((PyTypeObject *)cls);
    if (st == NULL) {
        return NULL;
    }
    uintptr_t stream;
    if (mr_parse_stream(a[1], "from_dlpack", &stream) < 0) {
        return NULL;
    }
    int writable = 0;
    if (mr_arg_bool(a[2], "from_dlpack", "writable", &writable) < 0) {
        return NULL;
    }
    return (PyObject *)mr_tensor_import(st, a[0], stream, writable, "from_dlpack(): obj");
}

/* A new zero-filled tensor (mr_tensor_alloc), or NULL with the failure
 * naming what, the shape and the size: MemoryError when the memory is not
 * there, ValueError when the size overflows. */
TensorObject *
mr_tensor_zeros(mr_state *st, int32_t dev_type, int32_t dev_id, int dtype, int ndim, const int64_t *shape,
                const char *what)
{
    TensorObject *o = mr_tensor_new_empty(st);
    if (o == NULL) {
        return NULL;
    }
    int rc = mr_tensor_alloc(&o->t, dev_type, dev_id, dtype, ndim, shape);
    if (rc == MR_OK) {
        return o;
    }
    Py_DECREF(o);
    char dims[MR_TENSOR_MAX_NDIM * 24 + 4], size[32];
    mr_shape_format(dims, sizeof(dims), size, sizeof(size), dtype, ndim, shape);
    if (rc == MR_ENOMEM) {
        PyErr_Format(PyExc_MemoryError, "%s %s needs %s GiB: out of memory", what, dims, size);
    }
    else if (rc == MR_EINVAL) {
        PyErr_Format(PyExc_ValueError, "%s %s is too large (%s GiB)", what, dims, size);
    }
    else {
        mr_raise(st, rc, what);
    }
    return NULL;
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
    MR_ARGS(spec, a, "zeros", 0, 3, 2, "shape", "dtype", "device");
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_state_from_type((PyTypeObject *)cls);
    if (st == NULL) {
        return NULL;
    }
    int64_t shape[MR_TENSOR_MAX_NDIM];
    int ndim, dtype;
    int32_t dev_type = MR_DL_CPU, dev_id = 0;
    if (mr_parse_shape(a[0], "zeros(): shape", shape, &ndim) < 0 || mr_parse_dtype(a[1], "zeros(): dtype", &dtype) < 0
        || (a[2] != NULL && (mr_parse_device(a[2], "zeros(): device", &dev_type, &dev_id) < 0
                             || mr_alloc_device_check("zeros(): device", dev_type, dev_id) < 0))
        || mr_check_cuda_reachable(dev_type, dev_id, "zeros(): device") < 0) {
        return NULL;
    }
    return (PyObject *)mr_tensor_zeros(st, dev_type, dev_id, dtype, ndim, shape, "zeros(): tensor");
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

/* The other properties, one per closure value (Tensor_getset). */
enum { TP_DTYPE, TP_DEVICE, TP_DATA_PTR, TP_NBYTES, TP_OWNED };

static PyObject *
Tensor_get(PyObject *self, void *closure)
{
    const mr_tensor *t = &((TensorObject *)self)->t;
    char dev[64];
    switch ((int)(intptr_t)closure) {
    case TP_DTYPE:
        return PyUnicode_FromString(mr_dtype_name(t->dtype));
    case TP_DEVICE:
        mr_device_format(dev, sizeof(dev), t->device_type, t->device_id);
        return PyUnicode_FromString(dev);
    case TP_DATA_PTR:
        return PyLong_FromVoidPtr(t->data);
    case TP_NBYTES:
        return PyLong_FromSize_t(mr_tensor_nbytes(t));
    default:
        return PyBool_FromLong(t->own != NULL);
    }
}

static PyObject *
Tensor_repr(PyObject *self)
{
    TensorObject *o = (TensorObject *)self;
    char dev[64];
    mr_device_format(dev, sizeof(dev), o->t.device_type, o->t.device_id);
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
    {"dtype", Tensor_get, NULL, "Element type name ('bfloat16', 'float32', ...).", (void *)TP_DTYPE},
    {"device", Tensor_get, NULL, "'cpu' or 'cuda:N'.", (void *)TP_DEVICE},
    {"data_ptr", Tensor_get, NULL, "Address of the first element.", (void *)TP_DATA_PTR},
    {"nbytes", Tensor_get, NULL, "Bytes of data.", (void *)TP_NBYTES},
    {"owned", Tensor_get, NULL, "True when mambaradix allocated the memory.", (void *)TP_OWNED},
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

static PyType_Spec Tensor_spec = MR_TYPE_SPEC("mambaradix.Tensor", TensorObject, Tensor_slots,
                                              Py_TPFLAGS_DISALLOW_INSTANTIATION);

/* ------------------------------------------------------------------------
 * Test-only DLPack producer */

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
    MR_ARGS(spec, a, "_testing_make_capsule", 0, 2, 1, "shape", "dtype", "versioned", "version", "readonly",
            "strides", "byte_offset", "device", "null_data");
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    int64_t shape[MR_TENSOR_MAX_NDIM], strides[MR_TENSOR_MAX_NDIM];
    int ndim, nstr = -1, dtype = MR_DTYPE_FLOAT32;
    int versioned = 1, readonly = 0, null_data = 0;
    unsigned major = 1, minor = 1;
    int64_t byte_offset = 0;
    int32_t dev_type = MR_DL_CPU, dev_id = 0;
    if (mr_arg_bool(a[2], spec.fname, "versioned", &versioned) < 0
        || mr_arg_bool(a[4], spec.fname, "readonly", &readonly) < 0
        || mr_arg_bool(a[8], spec.fname, "null_data", &null_data) < 0 || mr_parse_shape(a[0], "shape", shape, &ndim) < 0
        || (a[1] && mr_parse_dtype(a[1], "dtype", &dtype) < 0)
        || (a[3] && !PyArg_ParseTuple(a[3], "II", &major, &minor))
        || (a[5] && a[5] != Py_None && mr_parse_shape(a[5], "strides", strides, &nstr) < 0)
        || (a[6] && mr_as_int64(a[6], 0, 1 << 20, "byte_offset", &byte_offset) < 0)
        || (a[7] && mr_parse_device(a[7], "device", &dev_type, &dev_id) < 0)) {
        return NULL;
    }
    if (nstr >= 0 && nstr != ndim) {
        PyErr_SetString(PyExc_ValueError, "strides must have one entry per dimension");
        return NULL;
    }
    mr_dl_testing_spec ts = {ndim, shape, nstr >= 0 ? strides : NULL, dtype, byte_offset, dev_type, dev_id,
                             null_data, versioned, major, minor, readonly};
    void *m = mr_dl_testing_make(&ts);
    if (m == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(m, versioned ? CAP_VERSIONED : CAP_LEGACY, export_capsule_destructor);
    if (cap == NULL) {
        mr_dl_testing_discard(m, versioned);
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
    return PyLong_FromLong(mr_dl_testing_deleted());
}

static PyMethodDef dlpack_functions[] = {
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
        || PyModule_AddFunctions(m, dlpack_functions) < 0 || mr_py_state_pool_init(m, st) < 0
        || mr_py_req_to_token_init(m, st) < 0) {
        return -1;
    }
    return 0;
}
