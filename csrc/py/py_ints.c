/* py_ints.c - the integer-array reader and the int64 results (py_ints.h). */
#include "py_common.h"
#include "py_numpy.h"
#include "py_ints.h"
#include "ints.h"

#include <string.h>

/* Classifies a buffer format: returns 's' (signed int), 'u' (unsigned int;
 * bool '?' too with MR_INTS_BOOL) or 0 (anything else), with native byte
 * order only. */
static char
int_kind(const char *fmt, int flags)
{
    if (fmt == NULL) {
        return 'u';   /* plain bytes */
    }
    if (*fmt == '@' || *fmt == '=' || *fmt == '<') {
        fmt++;
    }
    if (fmt[0] == '\0' || fmt[1] != '\0') {
        return 0;
    }
    switch (fmt[0]) {
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n':
        return 's';
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N':
        return 'u';
    case '?':
        return flags & MR_INTS_BOOL ? 'u' : 0;
    default:
        return 0;
    }
}

static void
view_release(mr_ints *v)
{
    if (v->have_view) {
        PyBuffer_Release(&v->view);
        v->have_view = 0;
    }
}

void
mr_ints_release(mr_ints *v)
{
    view_release(v);
    Py_CLEAR(v->arr);
}

static int
out_of_range(const char *arg, Py_ssize_t i, int overflow, int64_t x, int64_t lo, int64_t hi)
{
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] is out of range [%lld, %lld]", arg, i, (long long)lo,
                     (long long)hi);
    }
    else {
        PyErr_Format(PyExc_ValueError, "%s[%zd] = %lld is out of range [%lld, %lld]", arg, i, (long long)x,
                     (long long)lo, (long long)hi);
    }
    return -1;
}

/* Checks that every element of a contiguous int32 (width 4) or int64
 * (width 8) array lies in [lo, hi] (mr_ints_first_out); raises ValueError
 * naming arg and the first offending index. */
static int
check_range(const void *p, int width, size_t n, int64_t lo, int64_t hi, const char *arg)
{
    int64_t i = mr_ints_first_out(p, width, n, lo, hi);
    if (i < 0) {
        return 0;
    }
    int64_t x = width == 8 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
    return out_of_range(arg, (Py_ssize_t)i, 0, x, lo, hi);
}

/* One Python int (mr_int_value; a bool too with MR_INTS_BOOL), element i,
 * into *x. */
static int
one_int(PyObject *it, const char *arg, Py_ssize_t i, int64_t lo, int64_t hi, int flags, int64_t *x)
{
    long long v;
    int overflow, r = mr_int_value(it, flags & MR_INTS_BOOL, &v, &overflow);
    if (r > 0) {
        PyErr_Format(PyExc_TypeError, "%s[%zd] must be an int, not %.100s", arg, i, Py_TYPE(it)->tp_name);
    }
    if (r != 0) {
        return -1;
    }
    if (overflow || v < lo || v > hi) {
        return out_of_range(arg, i, overflow, v, lo, hi);
    }
    *x = v;
    return 0;
}

/* A buffer (out->view, already taken): in place or converted. */
static int
read_view(mr_ints *out, int width, int64_t lo, int64_t hi, const char *arg, int flags, mr_buf *scratch)
{
    Py_buffer *v = &out->view;
    char kind = int_kind(v->format, flags);
    if (kind == 0 || !(v->itemsize == 1 || v->itemsize == 2 || v->itemsize == 4 || v->itemsize == 8)) {
        PyErr_Format(PyExc_TypeError, "%s must hold integers, not buffer format '%s'", arg,
                     v->format ? v->format : "B");
        return -1;
    }
    Py_ssize_t n, step = v->itemsize;   /* the bytes between elements */
    if (v->ndim == 0 && (flags & MR_INTS_SCALAR)) {
        n = 1;
    }
    else if (v->ndim != 1) {
        PyErr_Format(PyExc_ValueError, "%s must be 1-dimensional, not %d-dimensional", arg, v->ndim);
        return -1;
    }
    else {
        n = v->shape[0];
        step = v->strides != NULL ? v->strides[0] : v->itemsize;
    }
    if (kind == 's' && v->itemsize == width && step == v->itemsize && !(flags & MR_INTS_COPY)) {
        if (check_range(v->buf, width, (size_t)n, lo, hi, arg) < 0) {
            return -1;
        }
        out->data = v->buf;
        out->len = (size_t)n;
        return 0;
    }
    if (mr_buf_reserve(scratch, (size_t)n, (size_t)width) < 0) {
        return -1;
    }
    int overflow = 0;
    int64_t x = 0, bad = mr_ints_convert(v->buf, (int)v->itemsize, kind == 's', step, (size_t)n, scratch->p, width,
                                         lo, hi, &x, &overflow);
    if (bad >= 0) {
        return out_of_range(arg, (Py_ssize_t)bad, overflow, x, lo, hi);
    }
    view_release(out);
    out->data = scratch->p;
    out->len = (size_t)n;
    return 0;
}

int
mr_ints_read(PyObject *obj, int width, int64_t lo, int64_t hi, const char *arg, int flags, mr_buf *scratch,
             mr_ints *out)
{
    memset(out, 0, sizeof(*out));
    /* Fast path: a contiguous 1-D numpy array of exactly the wanted type
     * is read in place without building a Py_buffer. */
    if (PyArray_CheckExact(obj) && !(flags & MR_INTS_COPY)) {
        PyArrayObject *arr = (PyArrayObject *)obj;
        int want = width == 4 ? NPY_INT32 : NPY_INT64;
        if (PyArray_NDIM(arr) == 1 && PyArray_TYPE(arr) == want && PyArray_ISCARRAY_RO(arr)
            && PyArray_ISNOTSWAPPED(arr)) {
            npy_intp n = PyArray_DIM(arr, 0);
            if (check_range(PyArray_DATA(arr), width, (size_t)n, lo, hi, arg) < 0) {
                return -1;
            }
            /* held until released: a later argument's Python code cannot
             * resize it away (numpy refuses while others hold it) */
            out->arr = Py_NewRef(obj);
            out->data = PyArray_DATA(arr);
            out->len = (size_t)n;
            return 0;
        }
    }
    /* a lone int: an __index__ object that is not an array (a torch tensor
     * has __index__ too, for one element only: it is read through numpy) */
    if ((flags & MR_INTS_SCALAR) && !PyObject_CheckBuffer(obj) && PyIndex_Check(obj)
        && (PyLong_Check(obj) || !PyObject_HasAttrString(obj, "__array__"))) {
        int64_t x;
        if (mr_buf_reserve(scratch, 1, (size_t)width) < 0 || one_int(obj, arg, 0, lo, hi, flags, &x) < 0) {
            return -1;
        }
        mr_ints_put(scratch->p, width, 0, x);
        out->data = scratch->p;
        out->len = 1;
        return 0;
    }
    PyObject *src = obj;
    if (!PyObject_CheckBuffer(obj) && !PyList_Check(obj) && !PyTuple_Check(obj)) {
        /* CPU torch tensors and other __array__ objects: numpy's view */
        int has = PyObject_HasAttrString(obj, "__array__");
        if (has) {
            out->arr = PyArray_FROM_OF(obj, NPY_ARRAY_CARRAY_RO);
            if (out->arr == NULL) {
                return -1;
            }
            src = out->arr;
        }
    }
    if (PyObject_CheckBuffer(src) && !PyUnicode_Check(src)) {
        if (PyObject_GetBuffer(src, &out->view, PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
            mr_ints_release(out);
            return -1;
        }
        out->have_view = 1;
        if (read_view(out, width, lo, hi, arg, flags, scratch) < 0) {
            mr_ints_release(out);
            return -1;
        }
        return 0;
    }
    /* a set or a dict iterates in hash order, not as a token sequence */
    PyObject *seq = PyAnySet_Check(src) || PyDict_Check(src) ? NULL : PySequence_Fast(src, "");
    if (seq == NULL) {
        mr_ints_release(out);
        PyErr_Format(PyExc_TypeError, "%s must be a sequence or buffer of ints, not %.100s", arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (mr_buf_reserve(scratch, (size_t)n, (size_t)width) < 0) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t x;
        /* items are re-read each time: an __index__ may shrink a list */
        if (i >= PySequence_Fast_GET_SIZE(seq)) {
            n = i;
            break;
        }
        PyObject *it = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
        int r = one_int(it, arg, i, lo, hi, flags, &x);
        Py_DECREF(it);
        if (r < 0) {
            goto fail;
        }
        mr_ints_put(scratch->p, width, (size_t)i, x);
    }
    Py_DECREF(seq);
    mr_ints_release(out);
    out->data = scratch->p;
    out->len = (size_t)n;
    return 0;
fail:
    Py_DECREF(seq);
    mr_ints_release(out);
    return -1;
}

int
mr_ints_append_i32(PyObject *obj, const char *arg, mr_buf *scratch, mr_buf *dst, size_t at, size_t *len)
{
    if (PyObject_CheckBuffer(obj) && !PyUnicode_Check(obj)) {
        Py_buffer v;
        if (PyObject_GetBuffer(obj, &v, PyBUF_FORMAT | PyBUF_STRIDES) < 0) {
            return -1;
        }
        if (v.ndim == 1 && v.itemsize == 8 && int_kind(v.format, 0) == 's'
            && (v.strides == NULL || v.strides[0] == 8)) {
            size_t n = (size_t)v.shape[0];
            if (mr_buf_reserve(dst, at + n + 1, sizeof(int32_t)) < 0) {
                PyBuffer_Release(&v);
                return -1;
            }
            int out_of_range = mr_narrow_i32(v.buf, n, (int32_t *)dst->p + at);
            PyBuffer_Release(&v);
            if (!out_of_range) {
                *len = n;
                return 0;
            }
            /* mr_ints_read below names the first value out of range */
        }
        else {
            PyBuffer_Release(&v);
        }
    }
    mr_ints v;
    if (mr_ints_read(obj, 4, INT32_MIN, INT32_MAX, arg, MR_INTS_SCALAR, scratch, &v) < 0) {
        return -1;
    }
    int rc = mr_buf_reserve(dst, at + v.len + 1, sizeof(int32_t));
    if (rc == 0 && v.len > 0) {
        memcpy((int32_t *)dst->p + at, v.data, v.len * sizeof(int32_t));
    }
    *len = v.len;
    mr_ints_release(&v);
    return rc;
}

PyObject *
mr_ints_array(PyObject *obj, const char *arg)
{
    if (PyArray_CheckExact(obj) && PyArray_NDIM((PyArrayObject *)obj) == 1
        && PyArray_TYPE((PyArrayObject *)obj) == NPY_INT64 && PyArray_ISCARRAY_RO((PyArrayObject *)obj)
        && PyArray_ISNOTSWAPPED((PyArrayObject *)obj)) {
        return Py_NewRef(obj);
    }
    mr_buf scratch = {0};
    mr_ints v;
    if (mr_ints_read(obj, 8, INT64_MIN, INT64_MAX, arg, MR_INTS_SCALAR, &scratch, &v) < 0) {
        mr_buf_free(&scratch);
        return NULL;
    }
    PyObject *a = mr_i64_array(v.data, v.len);
    mr_ints_release(&v);
    mr_buf_free(&scratch);
    return a;
}

PyObject *
mr_i64_array(const int64_t *src, size_t n)
{
    npy_intp dims[1] = {(npy_intp)n};
    PyObject *a = PyArray_SimpleNew(1, dims, NPY_INT64);
    if (a != NULL && n > 0 && src != NULL) {
        memcpy(PyArray_DATA((PyArrayObject *)a), src, n * sizeof(int64_t));
    }
    return a;
}
