/* py_state_pool.c - the mambaradix.StatePool type: a model's conv and
 * temporal state tensors (imported through DLPack or allocated here) seen
 * as one pool of slots, and its kernel methods (copy_slots, clear_slots,
 * track_decode, snapshot_ssm_from_h, snapshot_conv_window): arguments
 * converted here, checked and launched by mr_state_pool_run. */
#include "py_tensor.h"

#include <stddef.h>
#include <string.h>

#include "structmember.h"

/* ------------------------------------------------------------------------
 * StatePool */

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
    PyObject_GC_UnTrack(self);
    StatePool_clear(self);
    mr_type_free((PyObject *)self);
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
    const mr_tensor *t[MR_MAX_STATE_TENSORS];
    for (int i = 0; i < n && i < MR_MAX_STATE_TENSORS; i++) {
        t[i] = &((TensorObject *)PyTuple_GET_ITEM(tensors, i))->t;
    }
    allocfunc alloc = PyType_GetSlot(tp, Py_tp_alloc);
    StatePoolObject *o = (StatePoolObject *)alloc(tp, 0);
    if (o == NULL) {
        Py_DECREF(tensors);
        return NULL;
    }
    o->tensors = tensors;
    int reason, which, other;
    if (mr_state_pool_init(&o->pool, t, n, &reason, &which, &other) != MR_OK) {
        char role[32], role2[32];
        tensor_role(which, n - 1, role, sizeof(role));
        tensor_role(other, n - 1, role2, sizeof(role2));
        switch (reason) {
        case MR_SP_COUNT:
            PyErr_Format(PyExc_ValueError, "%s: conv must hold 1 to %d tensors (got %d)", fname,
                         MR_MAX_STATE_TENSORS - 1, n - 1);
            break;
        case MR_SP_NDIM:
            PyErr_Format(PyExc_ValueError, "%s: %s must be shaped [layers, slots + 1, ...]", fname, role);
            break;
        case MR_SP_LAYERS:
            PyErr_Format(PyExc_ValueError, "%s: %s has %lld layers (dim 0), conv[0] has %lld (layers >= 1)", fname,
                         role, (long long)t[which]->shape[0], (long long)t[0]->shape[0]);
            break;
        case MR_SP_ROWS:
            PyErr_Format(PyExc_ValueError, "%s: %s has %lld slot rows (dim 1), conv[0] has %lld (rows >= 2: row 0 is "
                         "padding, so at least one usable slot)",
                         fname, role, (long long)t[which]->shape[1], (long long)t[0]->shape[1]);
            break;
        case MR_SP_OVERLAP:
            PyErr_Format(PyExc_ValueError, "%s: %s and %s share memory (each state tensor needs its own)", fname,
                         role2, role);
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
    MR_ARGS(spec, a, "StatePool", 0, 2, 2, "conv", "temporal", "stream");
    if (mr_parse_tuple(&spec, args, kwargs, a) < 0) {
        return NULL;
    }
    PyObject *conv = a[0], *temporal = a[1], *stream_o = a[2];
    mr_state *st = mr_state_from_type(type);
    if (st == NULL) {
        return NULL;
    }
    uintptr_t stream;
    if (mr_parse_stream(stream_o, "StatePool", &stream) < 0) {
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
    char arg[64], role[32];
    for (Py_ssize_t i = 0; i <= nconv; i++) {
        PyObject *src = i < nconv ? PySequence_Fast_GET_ITEM(seq, i) : temporal;
        snprintf(arg, sizeof(arg), "StatePool(): %s", tensor_role((int)i, (int)nconv, role, sizeof(role)));
        TensorObject *t = mr_tensor_import(st, src, stream, 1, arg);
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
    MR_ARGS(spec, a, "allocate", 0, 7, 6, "layers", "slots", "conv_shapes", "conv_dtypes", "temporal_shape",
            "temporal_dtype", "device");
    PyObject *shapes = NULL, *dtypes = NULL, *tensors = NULL;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    mr_state *st = mr_state_from_type((PyTypeObject *)cls);
    if (st == NULL) {
        return NULL;
    }
    int64_t layers, slots;
    int32_t dev_type = MR_DL_CPU, dev_id = 0;
    if (mr_as_int64(a[0], 1, INT32_MAX, "allocate(): layers", &layers) < 0
        || mr_as_int64(a[1], 1, INT32_MAX - 1, "allocate(): slots", &slots) < 0
        || (a[6] != NULL && (mr_parse_device(a[6], "allocate(): device", &dev_type, &dev_id) < 0
                             || mr_alloc_device_check("allocate(): device", dev_type, dev_id) < 0))
        || mr_check_cuda_reachable(dev_type, dev_id, "allocate(): device") < 0) {
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
            if (mr_parse_shape(PySequence_Fast_GET_ITEM(shapes, i), what, shape + 2, &ndim) < 0) {
                goto error;
            }
            snprintf(what, sizeof(what), "allocate(): conv_dtypes[%zd]", i);
            if (mr_parse_dtype(single_dtype ? a[3] : PySequence_Fast_GET_ITEM(dtypes, i), what, &dtype) < 0) {
                goto error;
            }
        }
        else {
            if (mr_parse_shape(a[4], "allocate(): temporal_shape", shape + 2, &ndim) < 0
                || mr_parse_dtype(a[5], "allocate(): temporal_dtype", &dtype) < 0) {
                goto error;
            }
        }
        TensorObject *t = mr_tensor_zeros(st, dev_type, dev_id, dtype, ndim + 2, shape,
                                          i < nconv ? "allocate(): conv tensor" : "allocate(): temporal tensor");
        if (t == NULL) {
            goto error;
        }
        PyTuple_SET_ITEM(tensors, i, (PyObject *)t);
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

/* ------------------------------------------------------------------------
 * The state kernels' entry points */

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
    case MR_SNAP_OVERLAP:
        PyErr_Format(PyExc_ValueError, "%s(): %s shares memory with the pool's state tensors (the snapshot would "
                     "read what it writes)", fname, arg);
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
    mr_state *st = NULL;
    uintptr_t stream;
    /* the last argument is the stream */
    if (mr_parse(spec, args, nargs, kwnames, a) < 0 || (st = mr_state_from_type(Py_TYPE(self))) == NULL
        || mr_parse_stream(a[spec->n - 1], spec->fname, &stream) < 0) {
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
    MR_ARGS(spec, a, "copy_slots", 0, 2, 2, "src", "dst", "stream");
    return pool_kernel(self, &spec, args, nargs, kwnames, a, MR_POOL_COPY, 0);
}

PyDoc_STRVAR(StatePool_clear_slots__doc__,
"clear_slots($self, idx, /, *, stream=None)\n"
"--\n"
"\n"
"Zero slot idx[i] in every state tensor and layer, in one launch.");

static PyObject *
StatePool_clear_slots(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "clear_slots", 0, 1, 1, "idx", "stream");
    return pool_kernel(self, &spec, args, nargs, kwnames, a, MR_POOL_CLEAR, 0);
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
    MR_ARGS(spec, a, "track_decode", 0, 3, 3, "running", "track", "mask", "stream");
    return pool_kernel(self, &spec, args, nargs, kwnames, a, MR_POOL_TRACK, 0);
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
    MR_ARGS(spec, a, "snapshot_ssm_from_h", 0, 4, 4, "layer", "h", "chunk_indices", "dst_slots", "stream");
    return pool_kernel(self, &spec, args, nargs, kwnames, a, MR_POOL_SNAPSHOT, 0);
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
    MR_ARGS(spec, a, "snapshot_conv_window", 0, 4, 4, "layer", "x", "positions", "dst_slots", "conv_index",
            "stream");
    return pool_kernel(self, &spec, args, nargs, kwnames, a, MR_POOL_SNAPSHOT, 1);
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
StatePool_get_device(PyObject *self, void *closure)
{
    StatePoolObject *p = (StatePoolObject *)self;
    char buf[64];
    mr_device_format(buf, sizeof(buf), p->pool.device_type, p->pool.device_id);
    return PyUnicode_FromString(buf);
}

static PyObject *
StatePool_repr(PyObject *self)
{
    StatePoolObject *p = (StatePoolObject *)self;
    char dev[64];
    mr_device_format(dev, sizeof(dev), p->pool.device_type, p->pool.device_id);
    return PyUnicode_FromFormat("mambaradix.StatePool(layers=%lld, slots=%lld, conv=%d, bytes_per_slot=%lld, device=%s)",
                                (long long)p->pool.layers, (long long)p->pool.slots, p->pool.nconv,
                                (long long)p->pool.bytes_per_slot, dev);
}

static PyGetSetDef StatePool_getset[] = {
    {"conv", StatePool_get_conv, NULL, "The conv state tensors (a tuple of Tensor).", NULL},
    {"temporal", StatePool_get_temporal, NULL, "The temporal (SSM) state tensor.", NULL},
    {"device", StatePool_get_device, NULL, "'cpu' or 'cuda:N'.", NULL},
    {NULL},
};

static PyMemberDef StatePool_members[] = {
    {"num_slots", T_LONGLONG, offsetof(StatePoolObject, pool.slots), READONLY,
     "Usable slots (1..num_slots); slot 0 is padding."},
    {"num_layers", T_LONGLONG, offsetof(StatePoolObject, pool.layers), READONLY, "Layers (dim 0 of every tensor)."},
    {"bytes_per_slot", T_LONGLONG, offsetof(StatePoolObject, pool.bytes_per_slot), READONLY,
     "Bytes of one slot over all tensors and layers."},
    {NULL, 0, 0, 0, NULL},
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
    {Py_tp_members, StatePool_members},
    {Py_tp_methods, StatePool_methods},
    {Py_tp_doc, (void *)StatePool_new__doc__},
    {0, NULL},
};

static PyType_Spec StatePool_spec = MR_TYPE_SPEC("mambaradix.StatePool", StatePoolObject, StatePool_slots,
                                                 Py_TPFLAGS_HAVE_GC);

int
mr_py_state_pool_init(PyObject *m, mr_state *st)
{
    return mr_add_type(m, &st->StatePool, PyType_FromModuleAndSpec(m, &StatePool_spec, NULL));
}
