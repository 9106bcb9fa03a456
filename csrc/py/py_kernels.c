/* py_kernels.c - the index arguments of the kernels (host arrays and
 * sequences, or device tensors through DLPack) and the end of a kernel
 * entry point.  The entry points are StatePool's methods (py_state_pool.c)
 * and write_req_to_token (py_req_to_token.c). */
#include "py_numpy.h"
#include "py_tensor.h"

#include <string.h>

/* ------------------------------------------------------------------------
 * Index arguments: host (numpy, lists, CPU DLPack) or device (CUDA DLPack) */

void
mr_idx_release(mr_idx_arg *a)
{
    Py_CLEAR(a->owner);
    mr_ints_release(&a->ints);
    mr_buf_free(&a->buf);
}

/* Host data that is not a DLPack tensor, through the one integer reader
 * (py_ints.h): numpy arrays of the dtypes a tensor may hold, sequences,
 * ints, always copied (MR_INTS_COPY).  A refusal reads as for a tensor:
 * TypeError for the type, ValueError for more than 1 dimension. */
static int
idx_read(PyObject *obj, int mask, const char *arg, const char *kind, mr_idx_arg *out)
{
    if (PyArray_Check(obj)) {
        PyArrayObject *ra = (PyArrayObject *)obj;
        int tn = PyArray_TYPE(ra);
        if (PyArray_NDIM(ra) > 1) {
            PyErr_Format(PyExc_ValueError, "%s must be 1-D (got %d dimensions)", arg, PyArray_NDIM(ra));
            return -1;
        }
        if (!(tn == NPY_INT32 || tn == NPY_INT64 || (mask && (tn == NPY_BOOL || tn == NPY_UINT8 || tn == NPY_INT8)))) {
            PyErr_Format(PyExc_TypeError, "%s must hold %s, not %S", arg, kind, (PyObject *)PyArray_DESCR(ra));
            return -1;
        }
    }
    /* a copy: the indices are checked once and must not change under the
     * kernel (an index array may alias the memory it writes, or another
     * thread may write it while the kernel runs without the GIL) */
    int flags = MR_INTS_SCALAR | MR_INTS_COPY | (mask ? MR_INTS_BOOL : 0);
    /* bytes are text to numpy, not uint8 indices */
    if (PyBytes_Check(obj) || mr_ints_read(obj, 8, INT64_MIN, INT64_MAX, arg, flags, &out->buf, &out->ints) < 0) {
        if (PyArray_Check(obj)
            || (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError)
                && !PyErr_ExceptionMatches(PyExc_ValueError))) {
            return -1;
        }
        /* nested sequences: numpy counts their dimensions */
        PyErr_Clear();
        PyObject *raw = PyArray_FromAny(obj, NULL, 0, 0, 0, NULL);
        int nd = raw != NULL ? PyArray_NDIM((PyArrayObject *)raw) : 0;
        Py_XDECREF(raw);
        PyErr_Clear();
        if (nd > 1) {
            PyErr_Format(PyExc_ValueError, "%s must be 1-D (got %d dimensions)", arg, nd);
        }
        else {
            PyErr_Format(PyExc_TypeError, "%s must be %s (an array, a tensor or a sequence of ints)", arg, kind);
        }
        return -1;
    }
    out->idx = (mr_index){out->ints.data, (int64_t)out->ints.len, 64, 0};
    return 0;
}

/* Converts an index (mask=0) or mask (mask=1) argument.  Host data ends
 * up as an int64 array; CUDA data stays on the device and must be on
 * (dev_type, dev_id).  Accepts 0-d or 1-d.  Returns 0 or -1 with an
 * exception naming arg. */
int
mr_idx_get(mr_state *st, PyObject *obj, int mask, int32_t dev_type, int32_t dev_id, uintptr_t stream,
        const char *arg, mr_idx_arg *out)
{
    memset(out, 0, sizeof(*out));
    const char *kind = mask ? "a bool or integer mask" : "int32 or int64 indices";
    /* numpy arrays (host memory, any strides) go to the integer reader */
    if (!PyCapsule_CheckExact(obj) && (PyArray_Check(obj) || !PyObject_HasAttrString(obj, "__dlpack__"))) {
        return idx_read(obj, mask, arg, kind, out);
    }
    TensorObject *t = mr_tensor_import(st, obj, stream, 0, arg);
    if (t == NULL) {
        return -1;
    }
    out->owner = (PyObject *)t;
    int problem;
    if (mr_index_view(&t->t, mask, dev_type, dev_id, &out->idx, &problem) != MR_OK) {
        char want[64];
        mr_device_format(want, sizeof(want), dev_type, dev_id);
        if (problem == MR_IX_DTYPE) {
            PyErr_Format(PyExc_TypeError, "%s must hold %s, not %s", arg, kind, mr_dtype_name(t->t.dtype));
        }
        else if (problem == MR_IX_NDIM) {
            PyErr_Format(PyExc_ValueError, "%s must be 1-D (got %d dimensions)", arg, t->t.ndim);
        }
        else {
            PyErr_Format(PyExc_ValueError, "%s is on cuda:%d, but the state tensors are on %s", arg,
                         (int)t->t.device_id, want);
        }
        goto error;
    }
    if (out->idx.on_device) {
        return 0;
    }
    /* Host data: copied into int64. */
    if (mr_buf_reserve(&out->buf, (size_t)out->idx.n, sizeof(int64_t)) < 0) {
        goto error;
    }
    mr_index_to_host(&t->t, out->buf.p);
    out->idx.ptr = out->buf.p;
    return 0;
error:
    mr_idx_release(out);
    return -1;
}

PyObject *
mr_kernel_done(mr_state *st, int rc, const char *what)
{
    return rc == MR_OK ? Py_NewRef(Py_None) : mr_raise(st, rc, what);
}
