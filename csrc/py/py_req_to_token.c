/* py_req_to_token.c - the module-level write_req_to_token(): scatter
 * token indices into a req-to-token table on the host or the device. */
#include "py_tensor.h"

#include <string.h>

#include "alloc.h"
#include "cuda_api.h"
#include "py_numpy.h"

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

/* The refusal of a host write plan (mr_rtt_check) at entry i (for
 * MR_RTT_TOTAL: i tokens covered; for MR_RTT_INT32: values[i]). */
static void
raise_rtt(int reason, int64_t i, const int64_t *r, const int64_t *s, const int64_t *e, int64_t width,
          const int64_t *v, int64_t nvalues, const mr_tensor *tt)
{
    const char *fn = "write_req_to_token()";
    /* the entry's end column, as given (ends) or saturated (starts + width) */
    int64_t end = 0;
    if (reason == MR_RTT_COLS && (e != NULL ? (end = e[i], 0) : __builtin_add_overflow(s[i], width, &end))) {
        end = INT64_MAX;
    }
    char span[96];
    switch (reason) {
    case MR_RTT_ROW:
        PyErr_Format(PyExc_IndexError, "%s: rows[%lld] = %lld is out of range [0, %lld)", fn, (long long)i,
                     (long long)r[i], (long long)tt->shape[0]);
        break;
    case MR_RTT_ENDS:
        PyErr_Format(PyExc_IndexError, "%s: ends[%lld] = %lld is before starts[%lld] = %lld", fn, (long long)i,
                     (long long)e[i], (long long)i, (long long)s[i]);
        break;
    case MR_RTT_COLS:
        /* entry i: the columns it writes of row rows[i] */
        if (e != NULL) {
            (void)snprintf(span, sizeof(span), "ends[%lld] = %lld", (long long)i, (long long)e[i]);
        }
        else {
            (void)snprintf(span, sizeof(span), "%lld values", (long long)width);
        }
        PyErr_Format(PyExc_IndexError,
                     "%s: starts[%lld] = %lld, %s: columns [%lld, %lld) of rows[%lld] = %lld "
                     "are outside the table's [0, %lld)",
                     fn, (long long)i, (long long)s[i], span, (long long)s[i], (long long)end,
                     (long long)i, (long long)r[i], (long long)tt->shape[1]);
        break;
    case MR_RTT_TOTAL:
        PyErr_Format(PyExc_ValueError, "%s: the ranges cover %s%lld tokens, values has %lld", fn,
                     i > nvalues ? "at least " : "", (long long)i, (long long)nvalues);
        break;
    default:
        PyErr_Format(PyExc_OverflowError, "%s: values[%lld] = %lld does not fit the int32 table", fn,
                     (long long)i, (long long)v[i]);
        break;
    }
}

static PyObject *
mod_write_req_to_token(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "write_req_to_token", 0, 4, 4, "table", "rows", "starts", "values", "ends", "stream");
    const char *fn = "write_req_to_token";
    TensorObject *table = NULL, *vals_t = NULL;
    PyObject *ret = NULL;
    mr_idx_arg rows = {0}, starts = {0}, ends = {0}, vals = {0};
    void *conv = NULL;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_get_state(module);
    uintptr_t stream;
    if (mr_parse_stream(a[5], fn, &stream) < 0) {
        return NULL;
    }
    table = mr_tensor_import(st, a[0], stream, 1, "write_req_to_token(): table");
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
    if (mr_idx_get(st, a[1], 0, dvt, dvi, stream, "write_req_to_token(): rows", &rows) < 0
        || mr_idx_get(st, a[2], 0, dvt, dvi, stream, "write_req_to_token(): starts", &starts) < 0
        || mr_same_placement(&rows, &starts, fn, "rows", "starts") < 0
        || (has_ends && (mr_idx_get(st, a[4], 0, dvt, dvi, stream, "write_req_to_token(): ends", &ends) < 0
                         || mr_same_placement(&rows, &ends, fn, "rows", "ends") < 0))) {
        goto error;
    }
    int64_t n = rows.idx.n, nvalues, width = 0;
    mr_rtt_write w;
    memset(&w, 0, sizeof(w));
    w.table = tt->data;
    w.nrows = tt->shape[0];
    w.ncols = tt->shape[1];
    w.table_bits = (int)mr_dtype_size(tt->dtype) * 8;
    if (rows.idx.on_device) {
        /* values: a device tensor of int32/int64. */
        vals_t = mr_tensor_import(st, a[3], stream, 0, "write_req_to_token(): values");
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
        if (mr_idx_get(st, a[3], 0, dvt, dvi, stream, "write_req_to_token(): values", &vals) < 0) {
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
                    if (PyErr_ExceptionMatches(PyExc_ValueError)) {   /* numpy's "object too deep" */
                        PyErr_Clear();
                        PyErr_SetString(PyExc_ValueError, "write_req_to_token(): values must be [n] or [n, w]");
                    }
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
        w.values = vals.idx.ptr;
        w.nvalues = nvalues;
        w.width = width;
        int reason;
        int64_t i;
        if (mr_rtt_check(&w, r, s, e, n, &reason, &i) != MR_OK) {
            raise_rtt(reason, i, r, s, e, width, vals.idx.ptr, nvalues, tt);
            goto error;
        }
        w.value_bits = 64;
        if (dvt == MR_DL_CUDA) {
            /* The row-by-row device copy reads values in the table's type,
             * from a buffer of our own: a host-to-device copy from pageable
             * memory has read its source when it returns, one from
             * page-locked memory (a pinned tensor of the caller's) only
             * when the stream reaches it, and the caller may change or free
             * its values as soon as this call returns. */
            conv = mr_rtt_stage_values(vals.idx.ptr, nvalues, w.table_bits);
            if (conv == NULL) {
                PyErr_NoMemory();
                goto error;
            }
            w.values = conv;
            w.value_bits = w.table_bits;
        }
    }
    w.nvalues = nvalues;
    w.width = width;
    int rc;
    RUN_KERNEL(rc, mr_k_write_req_to_token(dvt, dvi, &w, rows.idx, starts.idx, ends.idx, (void *)stream));
    ret = mr_kernel_done(st, rc, "write_req_to_token()");
error:
    MR_FREE(conv);
    Py_XDECREF(table);
    Py_XDECREF(vals_t);
    mr_idx_release(&rows);
    mr_idx_release(&starts);
    mr_idx_release(&ends);
    mr_idx_release(&vals);
    return ret;
}

static PyMethodDef req_to_token_functions[] = {
    {"write_req_to_token", (PyCFunction)(void (*)(void))mod_write_req_to_token, METH_FASTCALL | METH_KEYWORDS,
     write_req_to_token__doc__},
    {NULL},
};

int
mr_py_req_to_token_init(PyObject *m, mr_state *st)
{
    return PyModule_AddFunctions(m, req_to_token_functions);
}
