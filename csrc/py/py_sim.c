/* py_sim.c - the simulator's token expansion of hash blocks
 * (csrc/core/hash_blocks.h) as hash_blocks_write(). */
#include "py_common.h"
#include "py_args.h"
#include "py_numpy.h"
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
    int64_t first, vocab;
    if (sim_array(a[0], "keys", NPY_UINT32, "uint32", 0) < 0 || sim_array(a[1], "mults", NPY_UINT32, "uint32", 0) < 0
        || mr_arg_int64(a[2], "hash_blocks_write", "first", 0, INT64_MAX, &first) < 0
        || mr_arg_int64(a[3], "hash_blocks_write", "vocab_size", 1, (int64_t)1 << 32, &vocab) < 0
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

static PyMethodDef sim_methods[] = {
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
