/* py_kernels.c - index arguments (host arrays and sequences, or device
 * tensors through DLPack) and the entry points of the state kernels:
 * StatePool's copy_slots, clear_slots, track_decode, snapshot_ssm_from_h
 * and snapshot_conv_window (the methods table is in py_state_pool.c). */
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
 * (py_ints.h): numpy arrays of the dtypes a tensor may hold (in place when
 * int64 and contiguous), sequences, ints.  A refusal reads as for a
 * tensor: TypeError for the type, ValueError for more than 1 dimension. */
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
    int flags = MR_INTS_SCALAR | (mask ? MR_INTS_BOOL : 0);
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
    int dt = t->t.dtype;
    if (!mr_index_dtype_ok(dt, mask)) {
        PyErr_Format(PyExc_TypeError, "%s must hold %s, not %s", arg, kind, mr_dtype_name(dt));
        goto error;
    }
    if (t->t.ndim > 1) {
        PyErr_Format(PyExc_ValueError, "%s must be 1-D (got %d dimensions)", arg, t->t.ndim);
        goto error;
    }
    int64_t n = t->t.numel;
    if (t->t.device_type == MR_DL_CUDA) {
        if (dev_type != MR_DL_CUDA || dev_id != t->t.device_id) {
            char want[64];
            mr_device_format(want, sizeof(want), dev_type, dev_id);
            PyErr_Format(PyExc_ValueError, "%s is on cuda:%d, but the state tensors are on %s", arg,
                         (int)t->t.device_id, want);
            goto error;
        }
        out->idx = (mr_index){t->t.data, n, (int)mr_dtype_size(dt) * 8, 1};
        return 0;
    }
    /* Host data: copied into int64. */
    if (mr_buf_reserve(&out->buf, (size_t)n, sizeof(int64_t)) < 0) {
        goto error;
    }
    mr_index_to_host(&t->t, out->buf.p);
    out->idx = (mr_index){out->buf.p, n, 64, 0};
    return 0;
error:
    mr_idx_release(out);
    return -1;
}

/* The start of every kernel entry point: parses the call (its last
 * argument is the stream) and finds the module state and the stream.
 * Returns 0, or -1 with an exception. */
static int
kernel_args(PyObject *self, mr_argspec *spec, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
            PyObject **a, mr_state **st, uintptr_t *stream)
{
    if (mr_parse(spec, args, nargs, kwnames, a) < 0) {
        return -1;
    }
    *st = mr_state_from_type(Py_TYPE(self));
    if (*st == NULL) {
        return -1;
    }
    return mr_parse_stream(a[spec->n - 1], spec->fname, stream);
}

PyObject *
mr_kernel_done(mr_state *st, int rc, const char *what)
{
    return rc == MR_OK ? Py_NewRef(Py_None) : mr_raise(st, rc, what);
}

/* Index argument i of a call whose index arguments are names[]
 * (MR_ARG_MASKED + i: the entries its mask kept). */
static const char *
arg_name(const char *const *names, int i, char *buf, size_t n)
{
    if (i < MR_ARG_MASKED) {
        return names[i];
    }
    (void)snprintf(buf, n, "%s (masked)", names[i - MR_ARG_MASKED]);
    return buf;
}

/* Words a refusal of mr_state_pool_run / mr_index_agree for fname(), whose
 * index arguments are names[].  Returns NULL. */
static PyObject *
raise_refusal(const char *fname, const char *const *names, const mr_refusal *w)
{
    char b1[64], b2[64];
    const char *an = arg_name(names, w->arg, b1, sizeof(b1));
    const char *bn = w->arg2 >= 0 ? arg_name(names, w->arg2, b2, sizeof(b2)) : NULL;
    long long pos = w->pos, v = w->value, lim = w->limit;
    switch (w->reason) {
    case MR_PAIR_PLACEMENT:
        PyErr_Format(PyExc_ValueError, "%s(): %s and %s must both be host arrays or both device tensors",
                     fname, an, bn);
        break;
    case MR_PAIR_LENGTH:
        PyErr_Format(PyExc_ValueError, "%s(): %s has %lld entries, %s has %lld", fname, an, pos, bn, v);
        break;
    case MR_PAIR_RANGE:
        PyErr_Format(PyExc_IndexError, "%s(): %s[%lld] = %lld is out of range [0, %lld]", fname, an, pos, v, lim);
        break;
    case MR_PAIR_SAME:
        PyErr_Format(PyExc_ValueError, "%s(): %s[%lld] == %s[%lld] == %lld (source and destination are equal)",
                     fname, an, pos, bn, pos, v);
        break;
    case MR_PAIR_DST_TWICE:
        /* " in dst" only where there are sources too */
        PyErr_Format(PyExc_ValueError, "%s(): %s[%lld] = %lld appears twice%s%s", fname, an, pos, v,
                     bn != NULL ? " in " : "", bn != NULL ? an : "");
        break;
    case MR_PAIR_DST_IS_SRC:
        PyErr_Format(PyExc_ValueError, "%s(): %s[%lld] = %lld is also a source slot", fname, an, pos, v);
        break;
    case MR_PAIR_BELOW:
        PyErr_Format(PyExc_IndexError, "%s(): %s[%lld] = %lld is out of range [0, %lld)", fname, an, pos, v, lim);
        break;
    case MR_PAIR_NO_TOKENS:
        PyErr_Format(PyExc_ValueError, "%s(): x has no tokens", fname);
        break;
    default:
        PyErr_NoMemory();
        break;
    }
    return NULL;
}

int
mr_same_placement(const mr_idx_arg *a, const mr_idx_arg *b, const char *fname, const char *an, const char *bn)
{
    const char *names[2] = {an, bn};
    mr_refusal why;
    if (mr_index_agree(&a->idx, &b->idx, &why) != MR_OK) {
        raise_refusal(fname, names, &why);
        return -1;
    }
    return 0;
}

/* The refusal of a snapshot's source tensor (mr_state_pool_snap_plan): arg
 * "h" or "x", ci the conv tensor. */
static void
mr_raise_snap(const mr_state_pool *pool, int reason, const char *fname, const char *arg, const mr_tensor *src,
              int64_t ci)
{
    const mr_tensor *pt = pool->t[ci];
    int ssm = ci == pool->nconv;
    switch (reason) {
    case MR_SNAP_CONV_NDIM:
        PyErr_Format(PyExc_ValueError, "%s(): conv[%lld] must be [layers, slots + 1, dim, K - 1]", fname,
                     (long long)ci);
        break;
    case MR_SNAP_SHAPE:
        if (ssm) {
            PyErr_Format(PyExc_ValueError,
                         "%s(): h must be [..., num_chunks, *temporal_shape] with temporal_shape "
                         "= the pool's per-slot temporal shape (%d trailing dims)", fname, pt->ndim - 2);
        }
        else {
            PyErr_Format(PyExc_ValueError, "%s(): x must be [T, dim] with dim = %lld", fname,
                         (long long)pt->shape[2]);
        }
        break;
    case MR_SNAP_DTYPE:
        if (ssm) {
            PyErr_Format(PyExc_TypeError,
                         "%s(): h has dtype %s, the pool's temporal %s (same dtype, or "
                         "float32/bfloat16 on both sides)", fname, mr_dtype_name(src->dtype), mr_dtype_name(pt->dtype));
        }
        else {
            PyErr_Format(PyExc_TypeError, "%s(): x has dtype %s, conv[%lld] %s (must match)", fname,
                         mr_dtype_name(src->dtype), (long long)ci, mr_dtype_name(pt->dtype));
        }
        break;
    default:
        PyErr_Format(PyExc_ValueError, "%s(): %s is on another device than the pool", fname, arg);
        break;
    }
}

/* A snapshot's layer, conv_index (conv only) and source tensor a[1] (h or
 * x), planned into *plan.  Returns the source, or NULL with an exception. */
static TensorObject *
snapshot_source(const mr_state_pool *pool, mr_state *st, PyObject **a, const char *fn, const char *sn, int conv,
                uintptr_t stream, mr_snap_plan *plan)
{
    char what[96];
    int64_t layer, ci = conv ? 0 : pool->nconv;
    int reason;
    (void)snprintf(what, sizeof(what), "%s(): layer", fn);
    if (mr_as_int64(a[0], 0, pool->layers - 1, what, &layer) < 0
        || (conv && a[4] != NULL
            && mr_as_int64(a[4], 0, pool->nconv - 1, "snapshot_conv_window(): conv_index", &ci) < 0)) {
        return NULL;
    }
    /* conv[ci]'s rank is refused before x is read */
    if (conv && mr_state_pool_snap_plan(pool, 1, layer, ci, NULL, plan, &reason) != MR_OK) {
        mr_raise_snap(pool, reason, fn, sn, NULL, ci);
        return NULL;
    }
    (void)snprintf(what, sizeof(what), "%s(): %s", fn, sn);
    TensorObject *src = mr_tensor_import(st, a[1], stream, 0, what);
    if (src != NULL && mr_state_pool_snap_plan(pool, conv, layer, ci, &src->t, plan, &reason) != MR_OK) {
        mr_raise_snap(pool, reason, fn, sn, &src->t, ci);
        Py_CLEAR(src);
    }
    return src;
}

/* Every state kernel entry point: op's index arguments (all but the
 * stream, or a snapshot's a[2] and a[3]; track_decode's last one a mask)
 * converted for the pool, then checked and run by mr_state_pool_run with
 * the GIL released.  A snapshot first reads and plans its source. */
static PyObject *
pool_kernel(PyObject *self, mr_argspec *spec, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
            PyObject **a, int op, int conv)
{
    PyObject *ret = NULL;
    const mr_state_pool *pool = &((StatePoolObject *)self)->pool;
    TensorObject *src = NULL;
    mr_idx_arg ix[3] = {{0}};
    mr_index v[3];
    mr_snap_plan plan;
    char what[96];
    mr_state *st;
    uintptr_t stream;
    if (kernel_args(self, spec, args, nargs, kwnames, a, &st, &stream) < 0) {
        return NULL;
    }
    const char *fn = spec->fname;
    int first = op == MR_POOL_SNAPSHOT ? 2 : 0, nidx = op == MR_POOL_SNAPSHOT ? 2 : spec->n - 1;
    const char *const *names = spec->names + first;
    if (op == MR_POOL_SNAPSHOT
        && (src = snapshot_source(pool, st, a, fn, spec->names[1], conv, stream, &plan)) == NULL) {
        return NULL;
    }
    for (int i = 0; i < nidx; i++) {
        (void)snprintf(what, sizeof(what), "%s(): %s", fn, names[i]);
        if (mr_idx_get(st, a[first + i], op == MR_POOL_TRACK && i == 2, pool->device_type, pool->device_id, stream,
                       what, &ix[i]) < 0) {
            goto error;
        }
        v[i] = ix[i].idx;
    }
    mr_refusal why;
    int rc;
    RUN_KERNEL(rc, mr_state_pool_run(pool, op, v, &plan, (void *)stream, &why));
    if (why.reason != MR_PAIR_OK) {
        raise_refusal(fn, names, &why);
        goto error;
    }
    (void)snprintf(what, sizeof(what), "%s()", fn);
    ret = mr_kernel_done(st, rc, what);
error:
    Py_XDECREF(src);
    for (int i = 0; i < 3; i++) {
        mr_idx_release(&ix[i]);
    }
    return ret;
}

const char StatePool_copy_slots__doc__[] = PyDoc_STR(
"copy_slots($self, src, dst, /, *, stream=None)\n"
"--\n"
"\n"
"Copy slot src[i] to slot dst[i] in every state tensor and layer, in one\n"
"kernel launch, on `stream`.  src/dst: int32/int64 host arrays or\n"
"sequences (checked: in [0, num_slots], dst distinct and never a source)\n"
"or device tensors on the pool's device (not read by the host; entries\n"
"out of range are skipped).");

PyObject *
StatePool_copy_slots(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "copy_slots", 0, 2, 2, "src", "dst", "stream");
    return pool_kernel(self, &spec, args, nargs, kwnames, a, MR_POOL_COPY, 0);
}

const char StatePool_clear_slots__doc__[] = PyDoc_STR(
"clear_slots($self, idx, /, *, stream=None)\n"
"--\n"
"\n"
"Zero slot idx[i] in every state tensor and layer, in one launch.");

PyObject *
StatePool_clear_slots(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "clear_slots", 0, 1, 1, "idx", "stream");
    return pool_kernel(self, &spec, args, nargs, kwnames, a, MR_POOL_CLEAR, 0);
}

const char StatePool_track_decode__doc__[] = PyDoc_STR(
"track_decode($self, running, track, mask, /, *, stream=None)\n"
"--\n"
"\n"
"After a decode step: for every i with mask[i] true, copy slot running[i]\n"
"to slot track[i] (all tensors, all layers), in one launch.  With device\n"
"tensors the launch reads everything on the device: no host sync, no\n"
"allocation, so it can be captured in a CUDA graph and replayed with new\n"
"values written into the same tensors.");

PyObject *
StatePool_track_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "track_decode", 0, 3, 3, "running", "track", "mask", "stream");
    return pool_kernel(self, &spec, args, nargs, kwnames, a, MR_POOL_TRACK, 0);
}

const char StatePool_snapshot_ssm_from_h__doc__[] = PyDoc_STR(
"snapshot_ssm_from_h($self, layer, h, chunk_indices, dst_slots, /, *, stream=None)\n"
"--\n"
"\n"
"Prefill SSM snapshot: temporal[layer, dst_slots[i]] = h[chunk_indices[i]],\n"
"converted to the pool's dtype (bfloat16 <-> float32 rounds to nearest\n"
"even).  h holds the per-chunk states of a chunked prefill kernel,\n"
"[..., num_chunks, *temporal_shape] (e.g. FLA's [B, NT, H, V, K]; leading\n"
"dimensions are flattened), compact, on the pool's device.");

PyObject *
StatePool_snapshot_ssm_from_h(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "snapshot_ssm_from_h", 0, 4, 4, "layer", "h", "chunk_indices", "dst_slots", "stream");
    return pool_kernel(self, &spec, args, nargs, kwnames, a, MR_POOL_SNAPSHOT, 0);
}

const char StatePool_snapshot_conv_window__doc__[] = PyDoc_STR(
"snapshot_conv_window($self, layer, x, positions, dst_slots, /, *, conv_index=0, stream=None)\n"
"--\n"
"\n"
"Prefill conv snapshot: with conv[conv_index] per slot [dim, K - 1] and x\n"
"the layer's pre-conv input [T, dim] (the whole flattened batch), write\n"
"conv[conv_index][layer, dst_slots[i], :, j] = x[t, :] for j < K - 1 and\n"
"t = clamp(positions[i] - (K - 1) + j, 0, T - 1): the K - 1 raw inputs\n"
"before token position positions[i], as SGLang's tracked conv state.");

PyObject *
StatePool_snapshot_conv_window(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "snapshot_conv_window", 0, 4, 4, "layer", "x", "positions", "dst_slots", "conv_index",
            "stream");
    return pool_kernel(self, &spec, args, nargs, kwnames, a, MR_POOL_SNAPSHOT, 1);
}
