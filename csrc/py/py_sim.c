/* py_sim.c - the simulator's synthetic tokens (csrc/core/hash_blocks.h) as
 * hash_blocks_write() and pseudo_tokens(). */
#include "py_common.h"
#include "py_args.h"
#include "py_numpy.h"
#include "py_ints.h"
#include "hash_blocks.h"

/* arr as a 1-D C-contiguous array of type `type` (writable when `writable`),
 * or a TypeError naming the argument. */
static int
sim_array(PyObject *arr, const char *arg, int type, const char *tname, int writable)
{
    if (!PyArray_Check(arr) || PyArray_NDIM((PyArrayObject *)arr) != 1
        || PyArray_TYPE((PyArrayObject *)arr) != type || !PyArray_ISCARRAY_RO((PyArrayObject *)arr)
        || !PyArray_ISNOTSWAPPED((PyArrayObject *)arr)
        || (writable && !PyArray_ISWRITEABLE((PyArrayObject *)arr))) {
        PyErr_Format(PyExc_TypeError, "hash_blocks_write(): %s must be a 1-D C-contiguous %s%s numpy array",
                     arg, writable ? "writable " : "", tname);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(hash_blocks_write__doc__,
"hash_blocks_write(keys, mults, first, vocab_size, out)\n"
"--\n"
"\n"
"Writes the tokens of hash blocks first, first + 1, ... into out (int32,\n"
"any length; the last block may be cut): token j of block b is\n"
"(keys[b] * mults[j] mod 2**32) * vocab_size >> 32.  keys and mults are\n"
"uint32 arrays (len(mults) is the block size, >= 1); vocab_size lies in\n"
"[1, 2**32].  ValueError when out reaches past the last key.");

static PyObject *
sim_hash_blocks_write(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)m;
    MR_ARGS(spec, a, "hash_blocks_write", 0, 5, 5, "keys", "mults", "first", "vocab_size", "out");
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    /* the ints first: their __index__ may change an array (its dtype, its
     * shape), so the arrays are checked and read with no Python code in
     * between */
    int64_t first, vocab;
    if (mr_arg_int64(a[2], "hash_blocks_write", "first", 0, INT64_MAX, &first) < 0
        || mr_arg_int64(a[3], "hash_blocks_write", "vocab_size", 1, (int64_t)1 << 32, &vocab) < 0
        || sim_array(a[0], "keys", NPY_UINT32, "uint32", 0) < 0 || sim_array(a[1], "mults", NPY_UINT32, "uint32", 0) < 0
        || sim_array(a[4], "out", NPY_INT32, "int32", 1) < 0) {
        return NULL;
    }
    const uint32_t *keys = (const uint32_t *)PyArray_DATA((PyArrayObject *)a[0]);
    const uint32_t *mults = (const uint32_t *)PyArray_DATA((PyArrayObject *)a[1]);
    int32_t *out = (int32_t *)PyArray_DATA((PyArrayObject *)a[4]);
    size_t nkeys = (size_t)PyArray_DIM((PyArrayObject *)a[0], 0);
    size_t bs = (size_t)PyArray_DIM((PyArrayObject *)a[1], 0);
    size_t n = (size_t)PyArray_DIM((PyArrayObject *)a[4], 0);
    if (bs == 0) {
        PyErr_SetString(PyExc_ValueError, "hash_blocks_write(): mults is empty (the block size must be >= 1)");
        return NULL;
    }
    size_t blocks;
    if (mr_hash_blocks_write(keys, nkeys, mults, bs, first, (uint64_t)vocab, out, n, &blocks) != MR_OK) {
        PyErr_Format(PyExc_ValueError,
                     "hash_blocks_write(): out holds %zu tokens, %zu blocks from block %lld, but keys has %zu",
                     n, blocks, (long long)first, nkeys);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(pseudo_tokens__doc__,
"pseudo_tokens(rids, counts, vocab_size)\n"
"--\n"
"\n"
"The pseudo output tokens of requests rids[i] (str), counts[i] (>= 0) of\n"
"each, as (tokens, starts): an int32 array with request i's tokens at\n"
"tokens[starts[i]:starts[i + 1]], and the int64 offsets (len(rids) + 1).\n"
"Token j of a request is splitmix64's mix of h + j * 0x9E3779B97F4A7C15,\n"
"mod vocab_size, plus 1, where h is the FNV-1a 64-bit hash of the rid's\n"
"UTF-8 bytes; vocab_size lies in [1, 2**31 - 1].");

static PyObject *
sim_pseudo_tokens(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)m;
    MR_ARGS(spec, a, "pseudo_tokens", 0, 3, 3, "rids", "counts", "vocab_size");
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    int64_t vocab;
    if (mr_arg_int64(a[2], "pseudo_tokens", "vocab_size", 1, INT32_MAX, &vocab) < 0) {
        return NULL;
    }
    /* a tuple of our own: reading counts may run Python code (__index__),
     * which must not free the items under us by changing the caller's list */
    if (!PyList_Check(a[0]) && !PyTuple_Check(a[0])) {
        PyErr_Format(PyExc_TypeError, "pseudo_tokens(): rids must be a sequence of str (a list or tuple), not %.100s",
                     Py_TYPE(a[0])->tp_name);
        return NULL;
    }
    PyObject *rids = PySequence_Tuple(a[0]);
    if (rids == NULL) {
        return NULL;
    }
    Py_ssize_t nr = PyTuple_GET_SIZE(rids);
    PyObject *const *items = &PyTuple_GET_ITEM(rids, 0);
    mr_buf scratch = {0};
    mr_ints counts;
    PyObject *tokens = NULL, *starts = NULL;
    if (mr_ints_read(a[1], 8, 0, INT32_MAX, "counts", 0, &scratch, &counts) < 0) {
        goto done;
    }
    const int64_t *c = (const int64_t *)counts.data;
    if ((size_t)nr != counts.len) {
        PyErr_Format(PyExc_ValueError, "pseudo_tokens(): rids has %zd items but counts has %zu", nr,
                     counts.len);
        goto release;
    }
    for (Py_ssize_t i = 0; i < nr; i++) {
        if (!PyUnicode_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "pseudo_tokens(): rids[%zd] must be a str, not %.100s", i,
                         Py_TYPE(items[i])->tp_name);
            goto release;
        }
    }
    starts = mr_i64_array(NULL, (size_t)nr + 1);
    if (starts == NULL) {
        goto release;
    }
    int64_t *at = (int64_t *)PyArray_DATA((PyArrayObject *)starts);
    at[0] = 0;
    for (Py_ssize_t i = 0; i < nr; i++) {
        at[i + 1] = at[i] + c[i];     /* counts <= 2**31 - 1 each: no overflow */
    }
    npy_intp total = (npy_intp)at[nr];
    tokens = PyArray_SimpleNew(1, &total, NPY_INT32);
    if (tokens == NULL) {
        Py_CLEAR(starts);
        goto release;
    }
    int32_t *out = (int32_t *)PyArray_DATA((PyArrayObject *)tokens);
    for (Py_ssize_t i = 0; i < nr; i++) {
        Py_ssize_t len;
        const char *utf8 = PyUnicode_AsUTF8AndSize(items[i], &len);
        if (utf8 == NULL) {      /* a lone surrogate */
            Py_CLEAR(tokens);
            Py_CLEAR(starts);
            goto release;
        }
        mr_pseudo_tokens_write(mr_fnv1a64(utf8, (size_t)len), (uint64_t)vocab, out + at[i], (size_t)c[i]);
    }
release:
    mr_ints_release(&counts);
done:
    mr_buf_free(&scratch);
    Py_DECREF(rids);
    if (tokens == NULL) {
        return NULL;
    }
    PyObject *res = PyTuple_Pack(2, tokens, starts);
    Py_DECREF(tokens);
    Py_DECREF(starts);
    return res;
}

static PyMethodDef sim_methods[] = {
    {"pseudo_tokens", (PyCFunction)(void (*)(void))sim_pseudo_tokens, METH_FASTCALL | METH_KEYWORDS,
     pseudo_tokens__doc__},
    {"hash_blocks_write", (PyCFunction)(void (*)(void))sim_hash_blocks_write, METH_FASTCALL | METH_KEYWORDS,
     hash_blocks_write__doc__},
    {NULL, NULL, 0, NULL},
};

int
mr_py_sim_init(PyObject *m, mr_state *st)
{
    (void)st;
    return PyModule_AddFunctions(m, sim_methods);
}
