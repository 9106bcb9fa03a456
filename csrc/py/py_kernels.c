/* py_kernels.c - index arguments (host arrays and sequences, or device
 * tensors through DLPack) and the entry points of the state kernels:
 * StatePool's copy_slots, clear_slots, track_decode, snapshot_ssm_from_h
 * and snapshot_conv_window (the methods table is in py_state_pool.c). */
#include "py_numpy.h"
#include "py_tensor.h"

#include <string.h>

#include "alloc.h"
#include "cuda_api.h"

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

/* An index (mask=0) or mask (mask=1) argument for a kernel on pool. */
static int
pool_idx(mr_state *st, const mr_state_pool *pool, PyObject *obj, int mask, uintptr_t stream, const char *arg,
         mr_idx_arg *out)
{
    return mr_idx_get(st, obj, mask, pool->device_type, pool->device_id, stream, arg, out);
}

int
mr_same_placement(const mr_idx_arg *a, const mr_idx_arg *b, const char *fname, const char *an, const char *bn)
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

/* The refusal of a host copy plan (mr_state_pool_check_pairs); sn NULL: of
 * destinations alone. */
static void
mr_raise_pair(const char *fname, int reason, int64_t bad, const int64_t *src, const int64_t *dst,
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
        PyErr_Format(PyExc_ValueError, "%s(): %s[%lld] = %lld appears twice%s%s", fname, dn, (long long)bad,
                     (long long)dst[bad], sn != NULL ? " in " : "", sn != NULL ? dn : "");
        break;
    default:
        PyErr_Format(PyExc_ValueError, "%s(): %s[%lld] = %lld is also a source slot", fname, dn,
                     (long long)bad, (long long)dst[bad]);
        break;
    }
}

/* Checks a host copy plan (mr_state_pool_check_pairs; src NULL: the
 * destinations of a snapshot alone, in range and distinct).  0, or -1 with
 * the refusal naming sn and dn. */
static int
pairs_ok(const mr_state_pool *pool, const char *fname, const int64_t *src, const int64_t *dst, int64_t n,
         const char *sn, const char *dn)
{
    int reason;
    int64_t bad;
    int rc = mr_state_pool_check_pairs(pool, src, dst, n, &reason, &bad);
    if (rc == MR_EINVAL) {
        mr_raise_pair(fname, reason, bad, src, dst, pool->slots, sn, dn);
    }
    else if (rc != MR_OK) {
        PyErr_NoMemory();
    }
    return rc == MR_OK ? 0 : -1;
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
    PyObject *ret = NULL;
    StatePoolObject *p = (StatePoolObject *)self;
    mr_idx_arg src = {0}, dst = {0};
    mr_state *st;
    uintptr_t stream;
    if (kernel_args(self, &spec, args, nargs, kwnames, a, &st, &stream) < 0) {
        return NULL;
    }
    const mr_state_pool *pool = &p->pool;
    if (pool_idx(st, pool, a[0], 0, stream, "copy_slots(): src", &src) < 0
        || pool_idx(st, pool, a[1], 0, stream, "copy_slots(): dst", &dst) < 0
        || mr_same_placement(&src, &dst, "copy_slots", "src", "dst") < 0) {
        goto error;
    }
    if (!src.idx.on_device && pairs_ok(pool, "copy_slots", src.idx.ptr, dst.idx.ptr, src.idx.n, "src", "dst") < 0) {
        goto error;
    }
    int rc;
    RUN_KERNEL(rc, mr_state_pool_copy(pool, src.idx, dst.idx, (void *)stream));
    ret = mr_kernel_done(st, rc, "copy_slots()");
error:
    mr_idx_release(&src);
    mr_idx_release(&dst);
    return ret;
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
    PyObject *ret = NULL;
    StatePoolObject *p = (StatePoolObject *)self;
    mr_idx_arg idx = {0};
    mr_state *st;
    uintptr_t stream;
    if (kernel_args(self, &spec, args, nargs, kwnames, a, &st, &stream) < 0) {
        return NULL;
    }
    const mr_state_pool *pool = &p->pool;
    if (pool_idx(st, pool, a[0], 0, stream, "clear_slots(): idx", &idx) < 0) {
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
    ret = mr_kernel_done(st, rc, "clear_slots()");
error:
    mr_idx_release(&idx);
    return ret;
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
    PyObject *ret = NULL;
    StatePoolObject *p = (StatePoolObject *)self;
    mr_idx_arg run = {0}, trk = {0}, msk = {0};
    int64_t *fs = NULL;
    mr_state *st;
    uintptr_t stream;
    if (kernel_args(self, &spec, args, nargs, kwnames, a, &st, &stream) < 0) {
        return NULL;
    }
    const mr_state_pool *pool = &p->pool;
    if (pool_idx(st, pool, a[0], 0, stream, "track_decode(): running", &run) < 0
        || pool_idx(st, pool, a[1], 0, stream, "track_decode(): track", &trk) < 0
        || pool_idx(st, pool, a[2], 1, stream, "track_decode(): mask", &msk) < 0
        || mr_same_placement(&run, &trk, "track_decode", "running", "track") < 0
        || mr_same_placement(&run, &msk, "track_decode", "running", "mask") < 0) {
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
        m = mr_index_select(run.idx.ptr, trk.idx.ptr, msk.idx.ptr, n, fs, fd);
        if (pairs_ok(pool, "track_decode", fs, fd, m, "running (masked)", "track (masked)") < 0) {
            goto error;
        }
        mr_index s = {fs, m, 64, 0}, d = {fd, m, 64, 0};
        RUN_KERNEL(rc, mr_state_pool_copy(pool, s, d, (void *)stream));
    }
    ret = mr_kernel_done(st, rc, "track_decode()");
error:
    MR_FREE(fs);
    mr_idx_release(&run);
    mr_idx_release(&trk);
    mr_idx_release(&msk);
    return ret;
}

/* The refusal of a snapshot's source tensor (mr_state_pool_ssm_plan,
 * mr_state_pool_conv_plan): arg "h" or "x", ci the conv tensor. */
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

const char StatePool_snapshot_ssm_from_h__doc__[] = PyDoc_STR(
"snapshot_ssm_from_h($self, layer, h, chunk_indices, dst_slots, /, *, stream=None)\n"
"--\n"
"\n"
"Prefill SSM snapshot: temporal[layer, dst_slots[i]] = h[chunk_indices[i]],\n"
"converted to the pool's dtype (bfloat16 <-> float32 rounds to nearest\n"
"even).  h holds the per-chunk states of a chunked prefill kernel,\n"
"[..., num_chunks, *temporal_shape] (e.g. FLA's [B, NT, H, V, K]; leading\n"
"dimensions are flattened), compact, on the pool's device.");

/* snapshot_ssm_from_h (conv 0) and snapshot_conv_window (conv 1): layer,
 * the source tensor (h or x), an index argument (chunk_indices or
 * positions), dst_slots, then conv_index for conv; the same checks in the
 * same order, each its own plan and kernel. */
static PyObject *
snapshot(PyObject *self, mr_argspec *spec, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
         PyObject **a, int conv)
{
    PyObject *ret = NULL;
    const mr_state_pool *pool = &((StatePoolObject *)self)->pool;
    TensorObject *src = NULL;
    mr_idx_arg ix = {0}, dst = {0};
    const char *fn = spec->fname, *sn = spec->names[1], *xn = spec->names[2];
    char what[96];
    mr_state *st;
    uintptr_t stream;
    if (kernel_args(self, spec, args, nargs, kwnames, a, &st, &stream) < 0) {
        return NULL;
    }
    int64_t layer, ci = conv ? 0 : pool->nconv;
    (void)snprintf(what, sizeof(what), "%s(): layer", fn);
    if (mr_as_int64(a[0], 0, pool->layers - 1, what, &layer) < 0
        || (conv && a[4] != NULL
            && mr_as_int64(a[4], 0, pool->nconv - 1, "snapshot_conv_window(): conv_index", &ci) < 0)) {
        return NULL;
    }
    mr_ssm_snap ssm;
    mr_conv_snap cs;
    int reason;
    if (conv && mr_state_pool_conv_plan(pool, layer, ci, NULL, &cs, &reason) != MR_OK) {
        mr_raise_snap(pool, reason, fn, sn, NULL, ci);
        return NULL;
    }
    (void)snprintf(what, sizeof(what), "%s(): %s", fn, sn);
    src = mr_tensor_import(st, a[1], stream, 0, what);
    if (src == NULL) {
        goto error;
    }
    if ((conv ? mr_state_pool_conv_plan(pool, layer, ci, &src->t, &cs, &reason)
              : mr_state_pool_ssm_plan(pool, layer, &src->t, &ssm, &reason)) != MR_OK) {
        mr_raise_snap(pool, reason, fn, sn, &src->t, ci);
        goto error;
    }
    char dwhat[96];
    (void)snprintf(what, sizeof(what), "%s(): %s", fn, xn);
    (void)snprintf(dwhat, sizeof(dwhat), "%s(): dst_slots", fn);
    if (pool_idx(st, pool, a[2], 0, stream, what, &ix) < 0 || pool_idx(st, pool, a[3], 0, stream, dwhat, &dst) < 0
        || mr_same_placement(&ix, &dst, fn, xn, "dst_slots") < 0
        || (!dst.idx.on_device && pairs_ok(pool, fn, NULL, dst.idx.ptr, dst.idx.n, NULL, "dst_slots") < 0)) {
        goto error;
    }
    int64_t bad;
    if (conv && src->t.shape[0] == 0 && ix.idx.n > 0) {
        PyErr_SetString(PyExc_ValueError, "snapshot_conv_window(): x has no tokens");
        goto error;
    }
    if (!conv && !ix.idx.on_device && mr_index_check_below(ix.idx.ptr, ix.idx.n, ssm.h_chunks, &bad) != MR_OK) {
        PyErr_Format(PyExc_IndexError, "snapshot_ssm_from_h(): chunk_indices[%lld] = %lld is out of range [0, %lld)",
                     (long long)bad, (long long)((const int64_t *)ix.idx.ptr)[bad], (long long)ssm.h_chunks);
        goto error;
    }
    int rc;
    int32_t dt = pool->device_type, di = pool->device_id;
    RUN_KERNEL(rc, conv ? mr_k_snapshot_conv(dt, di, &cs, ix.idx, dst.idx, (void *)stream)
                        : mr_k_snapshot_ssm(dt, di, &ssm, ix.idx, dst.idx, (void *)stream));
    (void)snprintf(what, sizeof(what), "%s()", fn);
    ret = mr_kernel_done(st, rc, what);
error:
    Py_XDECREF(src);
    mr_idx_release(&ix);
    mr_idx_release(&dst);
    return ret;
}

PyObject *
StatePool_snapshot_ssm_from_h(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "snapshot_ssm_from_h", 0, 4, 4, "layer", "h", "chunk_indices", "dst_slots", "stream");
    return snapshot(self, &spec, args, nargs, kwnames, a, 0);
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
    return snapshot(self, &spec, args, nargs, kwnames, a, 1);
}
