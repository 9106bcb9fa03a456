/* py_lifecycle.c - the Lifecycle type: a prefix tree that owns its
 * ownership bookkeeping, over a SlotAllocator (state slots), a
 * SlotAllocator (KV tokens) and a ReqPool, or with no pools (then
 * evictions are handed back as arrays).
 *
 * Per-request calls take the request's cache-side state ("rs") as a
 * ReqState: a C record (mr_req) that the call updates in place and hands
 * back, so nothing is packed or unpacked per request; mambaradix.sglang's
 * Req keeps its mamba_* fields in one.  The record lives in the ReqState
 * until admit() gives the request a row, then in that ReqPool row (the
 * ReqState is a handle to it), until ReqPool.free or cache_finished hands
 * it back (lifecycle.h).  A 13-tuple of ints (-1 = None)
 *   (running, track0, track1, next_track, last_track_seqlen,
 *    branching_seqlen, cow_src, needs_clear, lazy_is_insert,
 *    protected_len, node_id, node_gen, locked)
 * is still accepted (a new tuple comes back), for request objects that are
 * not ours.  A call that fails leaves the record unchanged.  The batched
 * calls (prefill_batch, decode_batch, finish_batch) keep that state in the
 * ReqPool's records instead and do a whole batch in one call. */
#include "py_pools.h"
#include "py_ints.h"
#include "py_numpy.h"
#include "lifecycle.h"
#include "lc_check.h"
#include "lc_record.h"

#include <stddef.h>
#include <string.h>

#define RS_LEN 13

/* an int64 array's data */
#define I64(a) ((int64_t *)PyArray_DATA((PyArrayObject *)(a)))

typedef struct {
    PyObject_HEAD
    mr_lifecycle *lc;
    PyObject *state_obj;   /* SlotAllocator or NULL */
    PyObject *kv_obj;      /* SlotAllocator or NULL */
    PyObject *rp_obj;      /* ReqPool or NULL */
    mr_buf keybuf;         /* int32 tokens of the call's key */
    mr_buf buf;            /* int64 results of the core */
    PyObject *kv_ends;     /* kv_free_ends: the last handed-out KV array's free calls */
    PyObject *victims;     /* counted pools: the state victims' policy (set_victims) or NULL */
    int victims_failed;    /* it raised or named a node it may not: the exception is set */
} LifecycleObject;

static int victims_raised(LifecycleObject *self);

/* ------------------------------------------------------------------------
 * Helpers */

static mr_state *
lc_state(LifecycleObject *self)
{
    return mr_state_from_type(Py_TYPE(self));
}

/* An int64 key that a match can read in place: a 1-D C-contiguous int64
 * numpy array or buffer (SGLang's array('q') tokens).  Returns 1 with *p and
 * *n set (release *view with PyBuffer_Release when *have_view), or 0 when
 * obj is not one (then key_read converts it). */
static int
key64_view(PyObject *obj, Py_buffer *view, int *have_view, const int64_t **p, size_t *n)
{
    *have_view = 0;
    if (PyArray_CheckExact(obj)) {
        PyArrayObject *a = (PyArrayObject *)obj;
        if (PyArray_NDIM(a) == 1 && PyArray_TYPE(a) == NPY_INT64 && PyArray_ISCARRAY_RO(a)
            && PyArray_ISNOTSWAPPED(a)) {
            *p = (const int64_t *)PyArray_DATA(a);
            *n = (size_t)PyArray_DIM(a, 0);
            return 1;
        }
        return 0;
    }
    if (PyUnicode_Check(obj) || PyBytes_Check(obj) || PyByteArray_Check(obj) || !PyObject_CheckBuffer(obj)) {
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();   /* key_read reads it, or names the problem */
        return 0;
    }
    const char *f = view->format != NULL ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') {
        f++;
    }
    if (view->ndim == 1 && view->itemsize == 8 && (f[0] == 'q' || f[0] == 'l' || f[0] == 'n') && f[1] == '\0') {
        *have_view = 1;
        *p = (const int64_t *)view->buf;
        *n = (size_t)view->shape[0];
        return 1;
    }
    PyBuffer_Release(view);
    return 0;
}

/* A key argument read once into a view (mr_key, lc_check.h).  An int64
 * key that key64_view accepts is read where it is when the call can read it
 * in place (in_place); any other (ints; int64 or int32 arrays, array('q'),
 * lists, CPU torch tensors) is narrowed to int32 into the Lifecycle's
 * keybuf taken for the call (mr_buf_take): reading may run Python code (an
 * item's __index__, __array__) that calls this Lifecycle again, which then
 * cannot change the tokens under the call.  The caller hands k to
 * key_release. */
typedef struct {
    mr_key key;
    mr_buf kb;
    Py_buffer view;
    int have_view;
    int took;
} key_arg;

static void
key_release(LifecycleObject *self, key_arg *k)
{
    if (k->have_view) {
        PyBuffer_Release(&k->view);
        k->have_view = 0;
    }
    if (k->took) {
        mr_buf_give(&self->keybuf, &k->kb);
        k->took = 0;
    }
}

/* Appends obj's tokens (the argument arg) to the *len tokens in kb, up to
 * `limit` in all when limit >= 0. */
static int
key_append(mr_buf *kb, PyObject *obj, Py_ssize_t limit, const char *arg, size_t *len)
{
    mr_buf tmp = {0};
    mr_ints v;
    /* the first part converts in kb itself (no copy when it is narrowed) */
    if (mr_ints_read(obj, 4, INT32_MIN, INT32_MAX, arg, MR_INTS_SCALAR, *len == 0 ? kb : &tmp, &v) < 0) {
        mr_buf_free(&tmp);
        return -1;
    }
    size_t m = v.len;
    if (limit >= 0 && m > (size_t)limit - *len) {
        m = (size_t)limit - *len;
    }
    int rc = 0;
    if (v.data != kb->p) {
        rc = mr_buf_reserve(kb, *len + m, sizeof(int32_t));
        if (rc == 0 && m > 0) {
            memcpy((int32_t *)kb->p + *len, v.data, m * sizeof(int32_t));
        }
    }
    *len += m;
    mr_ints_release(&v);
    mr_buf_free(&tmp);
    return rc;
}

/* Reads obj into k (the first `limit` tokens only when limit >= 0), then,
 * when fewer than `limit` tokens were read and tail is given (not NULL or
 * None), the tokens of tail after them (up to limit in all): SGLang's
 * origin_input_ids + output_ids without building the sum.  A call with a
 * tail reads its key as a copy (in_place 0): a key read in place has no
 * tail. */
static int
key_read(LifecycleObject *self, PyObject *obj, PyObject *tail, Py_ssize_t limit, int in_place, const char *arg,
         const char *tail_arg, key_arg *k)
{
    const int64_t *p64 = NULL;
    size_t n = 0;
    memset(k, 0, sizeof(*k));
    if (in_place && key64_view(obj, &k->view, &k->have_view, &p64, &n)) {
        k->key = (mr_key){p64, limit >= 0 && (size_t)limit < n ? (size_t)limit : n, 8};
        return 0;
    }
    k->kb = mr_buf_take(&self->keybuf);
    k->took = 1;
    if (key_append(&k->kb, obj, limit, arg, &n) < 0
        || (tail != NULL && tail != Py_None && (limit < 0 || (size_t)limit > n)
            && key_append(&k->kb, tail, limit, tail_arg, &n) < 0)) {
        key_release(self, k);
        return -1;
    }
    k->key = (mr_key){k->kb.p, n, 4};
    return 0;
}

static int
need_pools(LifecycleObject *self, const char *fname)
{
    if (self->rp_obj == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s(): this Lifecycle has no pools", fname);
        return -1;
    }
    return 0;
}

/* A per-request call's row and length, named when bad (the core refuses
 * them too, with one message for every reason): the row in use, the length
 * within the table's max_context_len. */
static int
row_and_len(LifecycleObject *self, const char *fname, int64_t row, const char *len_arg, int64_t len)
{
    mr_lc_why why;
    switch (mr_lc_row_len_check(mr_pools_req_pool(self->rp_obj, lc_state(self)), row, len, &why)) {
    case MR_LC_WHY_ROW_FREE:
        PyErr_Format(PyExc_ValueError, "%s(): row %lld is not a request row in use (the ReqPool has rows 1..%lld)",
                     fname, (long long)why.value, (long long)why.other);
        return -1;
    case MR_LC_WHY_LEN_LONG:
        PyErr_Format(PyExc_ValueError, "%s(): %s = %lld is more than max_context_len = %lld", fname, len_arg,
                     (long long)why.value, (long long)why.other);
        return -1;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------------
 * ReqState: one request's record */

/* A request's record lives in the object until admission; from then on in
 * its ReqPool row, until the row is freed (ReqPool.free moves it back) or
 * the request is finished (cache_finished moves it back): the object's
 * handle (mr_rec, lc_record.h) says where.  A view (ReqPool.record(row))
 * points at a row without ever holding the record.  A row freed behind the
 * object's back (a batched call, or a view's row) changes the row's
 * generation: then any use raises. */
typedef struct {
    PyObject_HEAD
    mr_rec h;              /* where the record lives */
    PyObject *pool;        /* the ReqPool whose row holds it (a reference), or NULL */
} ReqStateObject;

static PyTypeObject *
req_state_type(LifecycleObject *self)
{
    return (PyTypeObject *)lc_state(self)->ReqState;
}

/* 0 when o's record can be used: it is the object's own, or its row still
 * has the generation it had when the record moved in; -1 with
 * ReferenceError otherwise (what: the field or call, for the message). */
static int
rs_live(ReqStateObject *o, const char *what)
{
    if (!mr_rec_live(&o->h)) {
        PyErr_Format(PyExc_ReferenceError,
                     "%s: this ReqState's record lived in request row %lld, which was freed since "
                     "(a stale handle: the record is gone)",
                     what, (long long)o->h.row);
        return -1;
    }
    return 0;
}

/* Copies the record out (mr_rec_get); writing it back is mr_rec_put, once
 * rs_get succeeded. */
static int
rs_get(ReqStateObject *o, const char *what, mr_req *out)
{
    if (rs_live(o, what) < 0) {
        return -1;
    }
    mr_rec_get(&o->h, out);
    return 0;
}

/* Moves the record of o (not in a row; rec: its new value) into row `row`
 * of the pool object. */
static void
rs_bind(ReqStateObject *o, const mr_req *rec, PyObject *pool, mr_reqpool *rp, PyObject **holders, int64_t row)
{
    mr_rec_bind(&o->h, rec, rp, row);
    o->pool = Py_NewRef(pool);
    holders[row] = (PyObject *)o;
}

void
mr_py_req_state_take_back(PyObject *rs, uint32_t gen, const mr_req *rec)
{
    ReqStateObject *o = (ReqStateObject *)rs;
    if (mr_rec_take_back(&o->h, gen, rec)) {
        Py_CLEAR(o->pool);
    }
}

PyObject *
mr_py_req_state_view(PyObject *pool, mr_reqpool *rp, int64_t row, mr_state *st)
{
    PyTypeObject *tp = (PyTypeObject *)st->ReqState;
    ReqStateObject *o = (ReqStateObject *)tp->tp_alloc(tp, 0);
    if (o == NULL) {
        return NULL;
    }
    mr_rec_init_view(&o->h, rp, row);
    o->pool = Py_NewRef(pool);
    return (PyObject *)o;
}

/* The record's fields by number (lc_check.h), in the 13-tuple's order;
 * ReqState's attributes are its entries, named so in messages. */
static const char *const rs_names[RS_LEN] = {
    "ReqState.running",
    "ReqState.track0",
    "ReqState.track1",
    "ReqState.next_track",
    "ReqState.last_track_seqlen",
    "ReqState.branching_seqlen",
    "ReqState.cow_src",
    "ReqState.needs_clear",
    "ReqState.lazy_is_insert",
    "ReqState.protected_len",
    "ReqState.node_id",
    "ReqState.node_gen",
    "ReqState.locked",
};

/* A tuple holding obj's items (obj itself when it is a tuple): the
 * binding's own references, which an item's __index__ changing the
 * caller's list cannot take away.  TypeError `msg` when obj is not
 * iterable. */
static PyObject *
own_tuple(PyObject *obj, const char *msg)
{
    PyObject *t = PySequence_Tuple(obj);
    if (t == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_SetString(PyExc_TypeError, msg);
    }
    return t;
}

static int
tuple_to_req(PyObject *obj, mr_req *st)
{
    /* a tuple of our own: an item's __index__ may change the caller's list */
    PyObject *seq = own_tuple(obj, "rs must be a ReqState or a sequence of 13 ints");
    if (seq == NULL) {
        return -1;
    }
    if (PyTuple_GET_SIZE(seq) != RS_LEN) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "rs must have 13 items");
        return -1;
    }
    /* each item in its field's range, as the ReqState setters check it */
    static const char *const names[RS_LEN] = {"rs[0]", "rs[1]", "rs[2]", "rs[3]", "rs[4]", "rs[5]", "rs[6]",
                                              "rs[7]", "rs[8]", "rs[9]", "rs[10]", "rs[11]", "rs[12]"};
    int64_t v[RS_LEN];
    for (int i = 0; i < RS_LEN; i++) {
        int64_t lo, hi;
        mr_req_field_range(i, &lo, &hi);
        if (mr_as_int64(PyTuple_GET_ITEM(seq, i), lo, hi, names[i], &v[i]) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    mr_req_from_fields(st, v);
    return 0;
}

static PyObject *
req_to_tuple(const mr_req *st)
{
    PyObject *t = PyTuple_New(RS_LEN);
    for (int i = 0; t != NULL && i < RS_LEN; i++) {
        PyObject *v = PyLong_FromLongLong((long long)mr_req_field(st, i));
        if (v == NULL) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

/* Reads rs (a ReqState or a 13-tuple) into *st, a working copy.
 *
 * The rule for reading a request record: a ReqState is copied into *st
 * after every other argument of the call is converted (an argument's
 * __index__, __bool__ or __array__ may call this Lifecycle again and change
 * the record; a copy taken before would be written back over that change),
 * and nothing that runs Python code comes between the copy and the core
 * call.  A tuple cannot change, so its conversion may run anywhere. */
static int
parse_rs(LifecycleObject *self, PyObject *obj, mr_req *st)
{
    if (Py_IS_TYPE(obj, req_state_type(self))) {
        return rs_get((ReqStateObject *)obj, "rs", st);
    }
    return tuple_to_req(obj, st);
}

/* parse_rs for a call on request row `row`: a record in a row must be in
 * that one (of this lifecycle's pool). */
static int
parse_rs_row(LifecycleObject *self, PyObject *obj, int64_t row, const char *fname, mr_req *st)
{
    if (parse_rs(self, obj, st) < 0) {
        return -1;
    }
    ReqStateObject *o = (ReqStateObject *)obj;
    int in_row = Py_IS_TYPE(obj, req_state_type(self)) && o->pool != NULL;
    if (in_row && ((self->rp_obj != NULL && o->pool != self->rp_obj) || o->h.row != row)) {
        PyErr_Format(PyExc_ValueError, "%s(): rs is the record of request row %lld%s, not of row %lld", fname,
                     (long long)o->h.row, o->pool != self->rp_obj ? " of another ReqPool" : "", (long long)row);
        return -1;
    }
    if (self->rp_obj == NULL) {
        return 0;
    }
    /* with pools the calls write the row's maps: a row in use, whose record
     * (when one is bound to it) is rs (checked after rs was read: reading
     * it may run Python code) */
    const mr_reqpool *rp = mr_pools_req_pool(self->rp_obj, lc_state(self));
    if (!mr_reqpool_in_use(rp, row)) {
        PyErr_Format(PyExc_ValueError, "%s(): row %lld is not a request row in use (the ReqPool has rows 1..%lld)",
                     fname, (long long)row, (long long)rp->size);
        return -1;
    }
    if (!in_row && (rp->bound[row] & (MR_ROW_BOUND | MR_ROW_BATCH))) {
        PyErr_Format(PyExc_ValueError,
                     "%s(): row %lld holds another request's record; rs (a record outside any row) is not it", fname,
                     (long long)row);
        return -1;
    }
    return 0;
}

/* The call succeeded: a ReqState gets the working copy back, in its row
 * or in itself (and is returned, a new reference; parse_rs checked that
 * the row is still its); for a tuple a new tuple is built. */
static PyObject *
build_rs(LifecycleObject *self, PyObject *obj, const mr_req *st)
{
    if (Py_IS_TYPE(obj, req_state_type(self))) {
        mr_rec_put(&((ReqStateObject *)obj)->h, st);
        return Py_NewRef(obj);
    }
    return req_to_tuple(st);
}

/* The node a converted handle names, or -1 with StaleNodeError & co. */
static int
resolve_handle(LifecycleObject *self, int64_t id, int64_t gen, const char *what, mr_node **out)
{
    mr_handle h = {(uint32_t)id, (uint32_t)gen};
    int rc = mr_radix_resolve(mr_lc_tree(self->lc), h, out);
    if (rc != MR_OK) {
        mr_raise(lc_state(self), rc, what);
        return -1;
    }
    return 0;
}

/* A cache call refused with MR_EINVAL because the request was matched (and
 * is locked) under another namespace than ns: raised, 1; else 0.  `entry`
 * >= 0 names a batch entry. */
static int
ns_refused(LifecycleObject *self, const char *fname, const mr_req *st, int64_t ns, int64_t entry)
{
    int32_t at = mr_lc_locked_ns(self->lc, st);
    if (at < 0 || at == ns) {
        return 0;
    }
    if (entry >= 0) {
        PyErr_Format(PyExc_ValueError, "%s(): ns[%lld] = %lld, but rows[%lld]'s request was matched under "
                     "namespace %d (its lock is there)", fname, (long long)entry, (long long)ns, (long long)entry,
                     (int)at);
    }
    else {
        PyErr_Format(PyExc_ValueError, "%s(): ns = %lld, but the request was matched under namespace %d (its lock "
                     "is there)", fname, (long long)ns, (int)at);
    }
    return 1;
}

/* A (node_id, node_gen) handle, resolved; errors name it `what` ("node":
 * "node id must be ...", "node: the node was removed ... (stale handle)"). */
static int
parse_handle_named(LifecycleObject *self, PyObject *id_obj, PyObject *gen_obj, const char *what, mr_node **out)
{
    int64_t id = 0, gen = 0;
    if (mr_exact_int64(id_obj, 0, UINT32_MAX, &id) < 0 || mr_exact_int64(gen_obj, 0, UINT32_MAX, &gen) < 0) {
        char id_name[96], gen_name[96];   /* the names only for the slow path and its errors */
        (void)snprintf(id_name, sizeof(id_name), "%s id", what);
        (void)snprintf(gen_name, sizeof(gen_name), "%s generation", what);
        if (mr_as_int64(id_obj, 0, UINT32_MAX, id_name, &id) < 0
            || mr_as_int64(gen_obj, 0, UINT32_MAX, gen_name, &gen) < 0) {
            return -1;
        }
    }
    return resolve_handle(self, id, gen, what, out);
}

static int
parse_handle(LifecycleObject *self, PyObject *id_obj, PyObject *gen_obj, mr_node **out)
{
    return parse_handle_named(self, id_obj, gen_obj, "node", out);
}

/* The (node_id, node_gen, /) arguments of a call, resolved: the node, or
 * NULL with an exception. */
static mr_node *
node_args(LifecycleObject *self, mr_argspec *spec, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *pa[2];
    mr_node *n = NULL;
    if (mr_parse(spec, args, nargs, NULL, pa) < 0 || parse_handle(self, pa[0], pa[1], &n) < 0) {
        return NULL;
    }
    return n;
}

/* the signature of every call that takes a node handle */
#define NODE_ARGSPEC(fname) MR_ARGSPEC(fname, 2, 2, 2, "node_id", "node_gen")

/* A lifecycle status with the message it means for a request's slots
 * (py_status.h). */
static const mr_status_override lifecycle_overrides[] = {
    {MR_ENOSPC, MR_EXC_RUNTIME, "%s: the state pool is exhausted even after evicting every unlocked state "
                                "(increase the number of state slots)"},
    {MR_ESTATE, MR_EXC_OWNERSHIP, "%s: the request's state slots were already freed or donated "
                                  "(finished or released twice?)"},
    {MR_ENOENT, MR_EXC_OWNERSHIP, "%s: a slot is already free (double free)"},
    {MR_EBUSY, MR_EXC_OWNERSHIP, "%s: a slot is owned by the prefix tree, not by the request"},
    MR_STATUS_END(NULL),
};

static PyObject *
lc_raise(LifecycleObject *self, int rc, const char *what)
{
    return mr_raise_detail(lc_state(self), rc, what, lifecycle_overrides, NULL, 0);
}

/* The same through a call's own override table first (it ends in
 * MR_STATUS_END(lifecycle_overrides)); a message may show the row:
 * "%s: %srow %lld ..." (the detail string is empty). */
static PyObject *
lc_raise_row(LifecycleObject *self, int rc, const char *what, const mr_status_override *overrides, int64_t row)
{
    return mr_raise_detail(lc_state(self), rc, what, overrides, NULL, (long long)row);
}

/* What a bad argument (MR_EINVAL) or a slot a request brings means, per call. */
static const mr_status_override admit_overrides[] = {
    {MR_EINVAL, MR_EXC_VALUE, "%s: a request's row is not allocated or a slot is out of range"},
    {MR_ENOENT, MR_EXC_OWNERSHIP, "%s: a request brings a state slot that is free (freed already?)"},
    {MR_EBUSY, MR_EXC_OWNERSHIP, "%s: a request brings a state slot owned by the tree or another request"},
    MR_STATUS_END(lifecycle_overrides),
};
static const mr_status_override cache_unfinished_overrides[] = {
    {MR_EINVAL, MR_EXC_VALUE, "%s: %srow %lld is not allocated, or the tracked length is not page aligned / "
                              "beyond fill_len"},
    MR_STATUS_END(lifecycle_overrides),
};
static const mr_status_override cache_finished_overrides[] = {
    {MR_EINVAL, MR_EXC_VALUE, "%s: %srow %lld is not allocated or committed_len is too long"},
    MR_STATUS_END(lifecycle_overrides),
};
static const mr_status_override unfinished_tree_overrides[] = {
    {MR_EINVAL, MR_EXC_VALUE, "%s: the tracked length is not page aligned or beyond len(kv)"},
    {MR_EBUSY, MR_EXC_OWNERSHIP, "%s: fresh is one of the request's own state slots (running or track buffer); "
                                 "the tree's node and the request would share it"},
    MR_STATUS_END(lifecycle_overrides),
};
static const mr_status_override prefill_batch_overrides[] = {
    {MR_EINVAL, MR_EXC_VALUE, "%s: a key is longer than max_context_len"},
    MR_STATUS_END(lifecycle_overrides),
};
static const mr_status_override unfinished_batch_overrides[] = {
    {MR_ENOSPC, MR_EXC_RUNTIME, "%s: the rows that cache need more state slots than are free or can be evicted "
                                "(refused: no row changed; increase the number of state slots)"},
    MR_STATUS_END(lifecycle_overrides),
};
static const mr_status_override decode_batch_overrides[] = {
    {MR_EINVAL, MR_EXC_VALUE, "%s: a row is not in use or its table row is full"},
    MR_STATUS_END(lifecycle_overrides),
};

/* ------------------------------------------------------------------------
 * Lifetime */

/* Words a refused configuration (mr_lc_config_check). */
static PyObject *
config_raise(const mr_lc_why *why, int64_t page, int64_t pp)
{
    switch (why->why) {
    case MR_LC_WHY_CHUNK_PAGE:
        return PyErr_Format(PyExc_ValueError, "Lifecycle(): chunk_size (%lld) and page_size (%lld): one must divide "
                            "the other", (long long)why->value, (long long)page);
    case MR_LC_WHY_LAZY:
        PyErr_SetString(PyExc_ValueError, "Lifecycle(): lazy needs extra_buffer and track_buffer_size 2");
        return NULL;
    case MR_LC_WHY_NO_VALUES_POOLS:
        PyErr_SetString(PyExc_ValueError, "Lifecycle(): values=False is for a Lifecycle without pools (its pools "
                        "own KV indices, which the tree must keep)");
        return NULL;
    case MR_LC_WHY_POOL_TYPE:
        PyErr_SetString(PyExc_TypeError,
                        "Lifecycle(): state_allocator and kv_allocator must be SlotAllocator and req_pool a "
                        "ReqPool (or all three None)");
        return NULL;
    case MR_LC_WHY_SAME_POOL:
        PyErr_SetString(PyExc_ValueError, "Lifecycle(): state_allocator and kv_allocator must be different "
                        "SlotAllocator objects (one pool cannot hold both state slots and KV indices)");
        return NULL;
    case MR_LC_WHY_STATE_PAGE:
        PyErr_SetString(PyExc_ValueError, "Lifecycle(): the state allocator must have page_size 1");
        return NULL;
    case MR_LC_WHY_KV_PAGE:
        return PyErr_Format(PyExc_ValueError, "Lifecycle(): kv_allocator page_size %lld != page_size %lld",
                            (long long)why->value, (long long)page);
    case MR_LC_WHY_TRACK_WIDTH:
        return PyErr_Format(PyExc_ValueError, "Lifecycle(): req_pool track_buffer_size %d != track_buffer_size %d",
                            (int)why->value, (int)pp);
    default:
        return PyErr_Format(PyExc_ValueError, "Lifecycle(): kv_allocator's %lld tokens exceed the req-to-token "
                            "table's int32 indices", (long long)why->value);
    }
}

/* counts=(kv_tokens, state_slots, rows): counted pools (mr_lc_count_pools),
 * for a lifecycle without pools or values. */
static int
count_pools(LifecycleObject *self, PyObject *o, int refused)
{
    int64_t n[3];
    static const char *const what[3] = {"Lifecycle(): counts[0] (KV tokens)", "Lifecycle(): counts[1] (state slots)",
                                        "Lifecycle(): counts[2] (request rows)"};
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 3) {
        PyErr_Format(PyExc_TypeError, "Lifecycle(): counts must be None or a (kv_tokens, state_slots, rows) tuple, "
                     "not %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    if (refused) {
        PyErr_SetString(PyExc_ValueError, "Lifecycle(): counts needs a Lifecycle without pools and with values=False "
                                          "(counted pools hold no indices)");
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        if (mr_as_int64(PyTuple_GET_ITEM(o, i), 0, INT64_MAX / 2, what[i], &n[i]) < 0) {
            return -1;
        }
    }
    return mr_lc_count_pools(self->lc, n[0], n[1], n[2]) == MR_OK ? 0 : (PyErr_SetString(PyExc_ValueError,
                                                                        "Lifecycle(): counts refused"), -1);
}

static PyObject *
Lifecycle_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    MR_ARGS(spec, a, "Lifecycle", 0, 3, 0, "state_allocator", "kv_allocator", "req_pool", "page_size",
            "chunk_size", "lru_policy", "extra_buffer", "lazy", "track_buffer_size", "track_interval",
            "end_of_turn_states", "policy_options", "max_states_per_path", "semantics", "values", "counts");
    int64_t page = 1, chunk = 64, interval = 256, pp = 2;
    const char *policy = "sglang", *semantics = "v0.5.15";
    int extra = 0, lazy = 0, eot = 0, values = 1;
    mr_state *st = mr_state_from_type(tp);
    if (mr_parse_tuple(&spec, args, kwds, a) < 0
        || mr_arg_int64(a[3], "Lifecycle", "page_size", 1, 1 << 24, &page) < 0
        || mr_arg_int64(a[4], "Lifecycle", "chunk_size", 1, 1 << 24, &chunk) < 0
        || mr_arg_str(a[5], "Lifecycle", "lru_policy", 0, &policy) < 0
        || mr_arg_bool(a[6], "Lifecycle", "extra_buffer", &extra) < 0
        || mr_arg_bool(a[7], "Lifecycle", "lazy", &lazy) < 0
        || mr_arg_int64(a[8], "Lifecycle", "track_buffer_size", 1, 2, &pp) < 0
        || mr_arg_int64(a[9], "Lifecycle", "track_interval", 1, INT64_MAX, &interval) < 0
        || mr_arg_bool(a[10], "Lifecycle", "end_of_turn_states", &eot) < 0
        || mr_arg_str(a[13], "Lifecycle", "semantics", 0, &semantics) < 0
        || mr_arg_bool(a[14], "Lifecycle", "values", &values) < 0) {
        return NULL;
    }
    PyObject *so = a[0] ? a[0] : Py_None, *ko = a[1] ? a[1] : Py_None, *ro = a[2] ? a[2] : Py_None,
             *opts = a[11] ? a[11] : Py_None, *budget = a[12] ? a[12] : Py_None;
    mr_lc_config cfg = {0};
    cfg.end_of_turn = eot;
    cfg.page_size = (uint32_t)page;
    cfg.chunk_size = (uint32_t)chunk;
    cfg.extra_buffer = extra;
    cfg.lazy = lazy;
    cfg.track_buffer_size = (int32_t)pp;
    cfg.track_interval = interval;
    cfg.no_values = !values;
    int none = so == Py_None && ko == Py_None && ro == Py_None;
    mr_kv *state_kv = mr_pools_slot_allocator_kv(so, st), *kv = mr_pools_slot_allocator_kv(ko, st);
    mr_reqpool *rp = mr_pools_req_pool(ro, st);
    mr_lc_why why;
    /* the configuration's first problem, worded in the order of the
     * arguments: chunk_size before the policy's, the rest after */
    if (mr_lc_config_check(&cfg, !none, state_kv, kv, rp, &why) == MR_LC_WHY_CHUNK_PAGE) {
        return config_raise(&why, page, pp);
    }
    mr_radix_config pc = {1, 1, MR_POLICY_SGLANG};
    if (mr_read_policy("Lifecycle()", policy, opts, budget, &pc, &cfg.tree, NULL) < 0) {
        return NULL;
    }
    cfg.policy = pc.policy;
    if (strcmp(semantics, "v0.5.23") == 0) {
        cfg.semantics = MR_SEMANTICS_V0523;
    }
    else if (strcmp(semantics, "v0.5.15") != 0) {
        PyErr_Format(PyExc_ValueError, "Lifecycle(): semantics must be 'v0.5.15' or 'v0.5.23', not '%s'", semantics);
        return NULL;
    }
    if (why.why != MR_LC_WHY_NONE) {
        return config_raise(&why, page, pp);
    }
    LifecycleObject *self = (LifecycleObject *)tp->tp_alloc(tp, 0);
    if (self == NULL) {
        return NULL;
    }
    int rc = mr_lc_new(&cfg, none ? NULL : &state_kv->pages, kv, rp, &self->lc);
    if (rc != MR_OK) {
        Py_DECREF(self);
        return mr_raise(st, rc, "Lifecycle()");
    }
    if (a[15] != NULL && a[15] != Py_None && count_pools(self, a[15], !none || values) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    if (!none) {
        self->state_obj = Py_NewRef(so);
        self->kv_obj = Py_NewRef(ko);
        self->rp_obj = Py_NewRef(ro);
    }
    return (PyObject *)self;
}

static void
Lifecycle_dealloc(LifecycleObject *self)
{
    mr_lc_free(self->lc);
    Py_XDECREF(self->state_obj);
    Py_XDECREF(self->kv_obj);
    Py_XDECREF(self->rp_obj);
    mr_buf_free(&self->keybuf);
    mr_buf_free(&self->buf);
    Py_XDECREF(self->kv_ends);
    Py_XDECREF(self->victims);
    mr_type_free((PyObject *)self);
}

/* ------------------------------------------------------------------------
 * Tree operations */

PyDoc_STRVAR(Lifecycle_match__doc__,
"match($self, key, /, ns=0, cow=False, running=-1, owner=-2, limit=-1, rs=None)\n"
"--\n"
"\n"
"Match key (its first `limit` tokens when limit >= 0) in namespace ns.\n"
"An int64 key (array('q'), an int64 array) is read in place, only as far\n"
"as the walk goes; a token outside int32 matches nothing.\n"
"Returns (indices, node_id, node_gen, node_state, branching_seqlen, running)\n"
"(-1 = None).  With cow and a node that has a state, running gets a slot\n"
"(owner: -2 held, or a request row) if it is -1.  rs: the request's\n"
"ReqState (then `running` is its own); with cow and a hit it records the\n"
"running slot, the copy-on-write source and needs_clear = False.\n"
"A row's state and track maps follow its request's record, so cow with\n"
"owner a request row needs a row in use and its request's record as rs.\n"
"A free row (or one past the pool), no rs (the slot would be only in the\n"
"result, the row's record would not name it), rs the record of another\n"
"row, or a record outside the row while the row holds one: the call\n"
"raises ValueError and changes nothing.  Without a record, use owner=-2:\n"
"the slot is held, only in the result.");

/* match(cow=True, owner=row): the core writes the row's maps from the
 * record it is given, so the row must be in use and that record the row's
 * request's: rs itself (not None), bound to that row, or, while the row
 * holds no record, one outside any row (a request whose record its caller
 * keeps). */
static int
match_row_record(LifecycleObject *self, ReqStateObject *rs, int64_t owner)
{
    if (rs == NULL) {
        PyErr_Format(PyExc_ValueError,
                     "match(): cow with owner=%lld (a request row) needs rs, that request's record: the row's "
                     "maps follow its record (use owner=-2 for a slot held only in the result)",
                     (long long)owner);
        return -1;
    }
    if (rs_live(rs, "match(): rs") < 0) {
        return -1;
    }
    const mr_reqpool *rp = mr_pools_req_pool(self->rp_obj, lc_state(self));
    if (!mr_reqpool_in_use(rp, owner)) {
        PyErr_Format(PyExc_ValueError, "match(): owner=%lld is not a request row in use (the ReqPool has rows 1..%lld)",
                     (long long)owner, (long long)rp->size);
        return -1;
    }
    if (rs->pool != NULL && (rs->pool != self->rp_obj || rs->h.row != owner)) {
        PyErr_Format(PyExc_ValueError, "match(): rs is the record of request row %lld%s, not of owner=%lld",
                     (long long)rs->h.row, rs->pool != self->rp_obj ? " of another ReqPool" : "", (long long)owner);
        return -1;
    }
    if (rs->pool == NULL && (rp->bound[owner] & (MR_ROW_BOUND | MR_ROW_BATCH))) {
        PyErr_Format(PyExc_ValueError,
                     "match(): owner=%lld holds another request's record; rs (a record outside any row) is not it",
                     (long long)owner);
        return -1;
    }
    return 0;
}

static PyObject *
Lifecycle_match(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "match", 1, 1, 1, "key", "ns", "cow", "running", "owner", "limit", "rs");
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0) {
        return NULL;
    }
    int64_t ns = 0, running = -1, owner = MR_OWNER_HELD, limit = -1;
    int cow = 0;
    PyObject *o;
    if ((o = pa[1]) && mr_as_int64(o, 0, INT32_MAX, "match(): ns", &ns) < 0) {
        return NULL;
    }
    if (mr_arg_bool(pa[2], "match", "cow", &cow) < 0) {
        return NULL;
    }
    if ((o = pa[3])
        && mr_as_int64(o, -1, INT64_MAX, "match(): running", &running) < 0) {
        return NULL;
    }
    if ((o = pa[4])
        && mr_as_int64(o, MR_OWNER_HELD, INT32_MAX, "match(): owner", &owner) < 0) {
        return NULL;
    }
    if ((o = pa[5])
        && mr_as_int64(o, -1, INT64_MAX, "match(): limit", &limit) < 0) {
        return NULL;
    }
    if (owner == -1 || owner == 0) {
        PyErr_SetString(PyExc_ValueError, "match(): owner must be -2 (held) or a request row >= 1");
        return NULL;
    }
    if (cow && self->rp_obj == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "match(): cow needs pools");
        return NULL;
    }
    PyObject *rs = pa[6];
    if (rs == Py_None) {
        rs = NULL;
    }
    if (rs != NULL && !Py_IS_TYPE(rs, req_state_type(self))) {
        PyErr_SetString(PyExc_TypeError, "match(): rs must be a ReqState");
        return NULL;
    }
    /* the key first: converting it may run Python code that calls this
     * Lifecycle again, so a converted key lives in keybuf taken for the
     * call, and the row and the record are read after it */
    key_arg k;
    if (key_read(self, args[0], NULL, (Py_ssize_t)limit, 1, "match(): key", NULL, &k) < 0) {
        return NULL;
    }
    mr_req st;
    int ok = !(cow && owner >= 1 && match_row_record(self, (ReqStateObject *)rs, owner) < 0);
    if (ok && rs != NULL) {
        ok = rs_get((ReqStateObject *)rs, "match(): rs", &st) == 0;
    }
    else if (ok) {
        mr_req_reset(&st);
        st.running = running;
    }
    mr_match m;
    /* the indices go straight into the result array (below) */
    int rc = ok ? mr_lc_match(self->lc, &k.key, (int32_t)ns, cow, &st, (int32_t)owner, &m, NULL) : MR_OK;
    key_release(self, &k);
    if (!ok) {
        return NULL;
    }
    if (rc != MR_OK && rc != MR_ENOSPC) {
        return lc_raise(self, rc, "match()");
    }
    if (rc == MR_ENOSPC) {
        return lc_raise(self, rc, "match(): copy-on-write slot");
    }
    /* The request holds what the copy-on-write gave it (a running slot, the
     * source) before anything below can fail, as SGLang's Req gets them
     * before its result is built: a failure then leaves it holding them,
     * nothing leaked.  Without rs the slot is only in the result (held:
     * match_row_record refused a row as its owner): a failure gives it
     * back. */
    if (rs != NULL) {
        Py_DECREF(build_rs(self, rs, &st));
    }
    PyObject *res = NULL, *idx = mr_i64_array(NULL, m.prefix_len);
    if (idx != NULL) {
        (void)mr_radix_path_values(mr_lc_tree(self->lc), m.node, (int64_t *)PyArray_DATA((PyArrayObject *)idx));
        mr_handle h = mr_node_handle(m.node);
        res = Py_BuildValue("(NkkLLL)", idx, (unsigned long)h.id, (unsigned long)h.gen, (long long)m.state,
                            (long long)m.branching_seqlen, (long long)st.running);
    }
    if (res == NULL && rs == NULL && st.running != running) {
        (void)mr_lc_free_states(self->lc, &st, -1);
    }
    return res;
}

/* A refused insert (nothing changed): what is wrong with which argument.
 * what: the call ("insert()"); subject: how the message names val[bad]
 * (NULL: "value[bad]"), val: the insert's values up to bad at least. */
static void
insert_raise(LifecycleObject *self, int rc, const char *what, const char *subject, const int64_t *val, int64_t bad,
             int64_t state)
{
    mr_state *st = lc_state(self);
    if (bad < 0) {
        if (rc == MR_EINVAL) {
            PyErr_Format(PyExc_ValueError, "insert(): state %lld is not a state slot (out of range)", (long long)state);
        }
        else if (rc == MR_ENOENT || rc == MR_EBUSY) {
            PyErr_Format(st->OwnershipError, "insert(): state %lld is %s", (long long)state,
                         rc == MR_ENOENT ? "free (never allocated, or a double free)" : "owned by the prefix tree already");
        }
        else {
            lc_raise(self, rc, "insert()");
        }
        return;
    }
    char name[64];
    if (subject == NULL) {
        (void)snprintf(name, sizeof(name), "value[%lld]", (long long)bad);
        subject = name;
    }
    long long x = (long long)val[bad];
    mr_lc_why why;
    switch (rc) {
    case MR_EINVAL:
        PyErr_Format(PyExc_ValueError, "%s: %s = %lld is %s", what, subject, x,
                     mr_lc_insert_why(mr_pools_slot_allocator_kv(self->kv_obj, st), rc, val, bad, &why)
                             == MR_LC_WHY_KV_TWICE
                         ? "listed twice past the tree's own prefix (an index the insert would store or free twice)"
                         : "out of range");
        break;
    case MR_ENOENT:
        PyErr_Format(st->OwnershipError, "%s: %s = %lld is free (never allocated, or a double free)", what, subject, x);
        break;
    case MR_EBUSY:
        PyErr_Format(st->OwnershipError, "%s: %s = %lld is owned by the prefix tree past %s", what, subject, x,
                     name == subject   /* insert()'s own value array */
                         ? "its own prefix (pass that prefix's length as prev_prefix_len)"
                         : "the request's matched prefix, or by an alloc group that has not handed it out");
        break;
    default:
        lc_raise(self, rc, what);
    }
}

/* kv_free_ends: where each free call of the KV array the last call handed
 * out ends.  -1 with an exception. */
static int
set_kv_ends(LifecycleObject *self, const int64_t *ends, size_t n)
{
    PyObject *a = mr_i64_array(ends, n);
    if (a == NULL) {
        return -1;
    }
    PyArray_CLEARFLAGS((PyArrayObject *)a, NPY_ARRAY_WRITEABLE);   /* handed out as it is */
    Py_XSETREF(self->kv_ends, a);
    return 0;
}

/* The collected KV array's free calls (before mr_lc_clear_released). */
static int
keep_kv_ends(LifecycleObject *self)
{
    const int64_t *ends;
    size_t n;
    mr_lc_take_released_calls(self->lc, &ends, &n);
    return set_kv_ends(self, ends, n);
}

/* The collected frees as two int64 arrays (then forgotten). */
static int
take_frees(LifecycleObject *self, PyObject **kv, PyObject **states)
{
    const int64_t *kvp, *stp;
    size_t nkv, nst;
    mr_lc_take_released(self->lc, &kvp, &nkv, &stp, &nst);
    *kv = mr_i64_array(kvp, nkv);
    *states = mr_i64_array(stp, nst);
    if (keep_kv_ends(self) < 0) {
        Py_CLEAR(*kv);
    }
    mr_lc_clear_released(self->lc);
    if (*kv == NULL || *states == NULL) {
        Py_CLEAR(*kv);
        Py_CLEAR(*states);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(Lifecycle_insert__doc__,
"insert($self, key, value, state, /, ns=0, prev_prefix_len=0, duplicates=True)\n"
"--\n"
"\n"
"Insert key with KV indices value and state slot `state` at its end.\n"
"Returns (prefix_len, state_existed, node_id, node_gen, duplicates).  With\n"
"pools the new tokens and the state (unless it existed) become tree-owned\n"
"and the duplicates are freed (the array is then empty); without pools the\n"
"caller frees the duplicates: value[min(prev_prefix_len, prefix_len):\n"
"prefix_len], which the array copies (duplicates=False: None instead, for a\n"
"caller that frees that slice of its own value), in the free calls\n"
"kv_free_ends gives (one per node of the path, as SGLang's insert frees\n"
"them; they matter to a paged allocator).  With pools what the\n"
"insert stores or frees, value[min(prev_prefix_len, cached):] (from the page\n"
"boundary at or before it), is checked before the tree changes (owners,\n"
"each KV index listed once past the tree's own prefix): a refused insert\n"
"raises naming value[i] or state and changes nothing.");

static PyObject *
Lifecycle_insert(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "insert", 3, 3, 3, "key", "value", "state", "ns", "prev_prefix_len", "duplicates");
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0) {
        return NULL;
    }
    int64_t ns = 0, prev = 0, state = 0;
    int want_dups = 1;
    PyObject *o;
    if (mr_arg_bool(pa[5], "insert", "duplicates", &want_dups) < 0) {
        return NULL;
    }
    if ((o = pa[3]) && mr_as_int64(o, 0, INT32_MAX, "insert(): ns", &ns) < 0) {
        return NULL;
    }
    if ((o = pa[4])
        && mr_as_int64(o, 0, INT64_MAX, "insert(): prev_prefix_len", &prev) < 0) {
        return NULL;
    }
    if (mr_as_int64(args[2], 0, INT64_MAX, "insert(): state", &state) < 0) {
        return NULL;
    }
    PyObject *val = NULL, *dups = NULL, *res = NULL;
    /* reading the value may run Python code: the key is a copy */
    key_arg k;
    if (key_read(self, args[0], NULL, -1, 0, "insert(): key", NULL, &k) < 0) {
        return NULL;
    }
    size_t len = k.key.len;
    val = mr_ints_array(args[1], "insert(): value");
    if (val == NULL) {
        goto error;
    }
    mr_lc_why why;
    switch (mr_lc_insert_check(self->lc, len, (size_t)PyArray_SIZE((PyArrayObject *)val), prev, &why)) {
    case MR_LC_WHY_VALUE_COUNT:
        PyErr_Format(PyExc_ValueError, "insert(): value has %lld indices for %zu tokens", (long long)why.value, len);
        goto error;
    case MR_LC_WHY_KEY_PAGES:
        PyErr_Format(PyExc_ValueError, "insert(): key length %zu is not a multiple of page_size %lld", len,
                     (long long)why.other);
        goto error;
    case MR_LC_WHY_PREV_LONG:
        PyErr_Format(PyExc_ValueError, "insert(): prev_prefix_len %lld exceeds the key's %zu tokens",
                     (long long)prev, len);
        goto error;
    default:
        break;
    }
    /* with pools the lifecycle frees the duplicates; without, they are
     * copied out only for a caller that wants the array */
    int copy_dups = want_dups && self->rp_obj == NULL;
    if (mr_buf_reserve(&self->buf, len + 1, sizeof(int64_t)) < 0) {
        goto error;
    }
    mr_insert_result r;
    int64_t bad = -1;
    const int64_t *v = (const int64_t *)PyArray_DATA((PyArrayObject *)val);
    int rc = mr_lc_insert(self->lc, k.key.p, v, len, (int32_t)ns, state, (size_t)prev,
                          copy_dups ? (int64_t *)self->buf.p : NULL, &r, &bad);
    if (rc != MR_OK) {
        insert_raise(self, rc, "insert()", NULL, v, bad, state);
        goto error;
    }
    if (self->rp_obj == NULL) {   /* the duplicates' free calls, one per node (kv_free_ends) */
        const int64_t *ends;
        size_t nends;
        mr_lc_insert_runs(self->lc, &ends, &nends);
        if (set_kv_ends(self, ends, nends) < 0) {
            goto error;
        }
    }
    if (want_dups) {
        dups = mr_i64_array((int64_t *)self->buf.p, copy_dups ? r.ndup : 0);
        if (dups == NULL) {
            goto error;
        }
    }
    else {
        dups = Py_NewRef(Py_None);
    }
    mr_handle h = mr_node_handle(r.node);
    res = Py_BuildValue("(nOkkO)", (Py_ssize_t)r.prefix_len, r.state_existed ? Py_True : Py_False,
                        (unsigned long)h.id, (unsigned long)h.gen, dups);
error:
    key_release(self, &k);
    Py_XDECREF(dups);
    Py_XDECREF(val);
    return res;
}

PyDoc_STRVAR(Lifecycle_evict__doc__,
"evict($self, num_tokens=0, num_states=0, /, *, protect=None)\n"
"--\n"
"\n"
"Evict LRU leaves until num_tokens KV tokens went, then LRU states until\n"
"num_states went.  protect: None or a node handle (node_id, node_gen)\n"
"locked meanwhile (inc_lock_ref, undone after): its state and the KV of\n"
"its path stay, as SGLang's match_prefix protects the matched node when it\n"
"evicts for a copy-on-write slot.  Returns (tokens_evicted,\n"
"states_evicted, kv_indices, state_slots); the arrays hold what the tree\n"
"released when it has no pools (the caller frees them, the KV in the calls\n"
"kv_free_ends gives: one per node), and are empty with pools (already\n"
"freed).");

static PyObject *
Lifecycle_evict(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "evict", 2, 2, 0, "num_tokens", "num_states", "protect");
    int64_t nt = 0, ns = 0;
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0) {
        return NULL;
    }
    if ((pa[0] != NULL && mr_as_int64(pa[0], 0, INT64_MAX, "evict(): num_tokens", &nt) < 0)
        || (pa[1] != NULL && mr_as_int64(pa[1], 0, INT64_MAX, "evict(): num_states", &ns) < 0)) {
        return NULL;
    }
    mr_node *protect = NULL;
    if (pa[2] != NULL && pa[2] != Py_None) {
        if (!PyTuple_Check(pa[2]) || PyTuple_GET_SIZE(pa[2]) != 2) {
            PyErr_Format(PyExc_TypeError, "evict(): protect must be None or a (node_id, node_gen) tuple, not %.100s",
                         Py_TYPE(pa[2])->tp_name);
            return NULL;
        }
        if (parse_handle_named(self, PyTuple_GET_ITEM(pa[2], 0), PyTuple_GET_ITEM(pa[2], 1),
                               "evict(): protect's node", &protect) < 0) {
            return NULL;
        }
    }
    mr_lc_clear_released(self->lc);
    size_t t = 0, s = 0;
    int rc = mr_lc_counts_of(self->lc) != NULL ? mr_lc_count_evict(self->lc, (size_t)nt, (size_t)ns, protect, &t, &s)
                                                : mr_lc_evict_protected(self->lc, (size_t)nt, (size_t)ns, protect, &t, &s);
    if (victims_raised(self)) {
        return NULL;
    }
    PyObject *a = NULL, *b = NULL;
    if (take_frees(self, &a, &b) < 0 || rc != MR_OK) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        return rc != MR_OK ? lc_raise(self, rc, "evict()") : NULL;
    }
    return Py_BuildValue("(nnNN)", (Py_ssize_t)t, (Py_ssize_t)s, a, b);
}

PyDoc_STRVAR(Lifecycle_lock__doc__,
"lock($self, node_id, node_gen, /)\n"
"--\n"
"\n"
"inc_lock_ref: lock the node's state and the KV of its path.");

/* lock() / unlock() */
static PyObject *
lock_call(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, int lock)
{
    static mr_argspec lock_spec = NODE_ARGSPEC("lock"), unlock_spec = NODE_ARGSPEC("unlock");
    mr_node *n = node_args(self, lock ? &lock_spec : &unlock_spec, args, nargs);
    if (n == NULL) {
        return NULL;
    }
    int rc = lock ? mr_radix_lock(mr_lc_tree(self->lc), n) : mr_radix_unlock(mr_lc_tree(self->lc), n);
    if (rc != MR_OK) {
        return lc_raise(self, rc, lock ? "lock()" : "unlock(): node is not locked");
    }
    Py_RETURN_NONE;
}

static PyObject *
Lifecycle_lock(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return lock_call(self, args, nargs, 1);
}

PyDoc_STRVAR(Lifecycle_unlock__doc__,
"unlock($self, node_id, node_gen, /)\n"
"--\n"
"\n"
"dec_lock_ref: undo one lock; ValueError if the node is not locked.");

static PyObject *
Lifecycle_unlock(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return lock_call(self, args, nargs, 0);
}

PyDoc_STRVAR(Lifecycle_node_info__doc__,
"node_info($self, node_id, node_gen, /)\n"
"--\n"
"\n"
"(valid, edge_len, state, parent_id, parent_gen, full_lock_ref, state_lock_ref,\n"
"prefix_len, namespace) of a node; valid is False (and the rest -1) for a\n"
"removed node.  parent_id is -1 for the root.");

static PyObject *
Lifecycle_node_info(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static mr_argspec spec = NODE_ARGSPEC("node_info");
    PyObject *pa[2];
    int64_t id = 0, gen = 0;
    if (mr_parse(&spec, args, nargs, NULL, pa) < 0 || mr_as_int64(args[0], 0, UINT32_MAX, "node id", &id) < 0
        || mr_as_int64(args[1], 0, UINT32_MAX, "node generation", &gen) < 0) {
        return NULL;
    }
    mr_handle h = {(uint32_t)id, (uint32_t)gen};
    mr_node *n = NULL;
    mr_radix *t = mr_lc_tree(self->lc);
    if (mr_radix_resolve(t, h, &n) != MR_OK) {
        return Py_BuildValue("(Oiiiiiiii)", Py_False, -1, -1, -1, -1, -1, -1, -1, -1);
    }
    mr_node *p = mr_node_parent(n);
    mr_handle ph = p != NULL ? mr_node_handle(p) : (mr_handle){0, 0};
    return Py_BuildValue("(OnLLkiinl)", Py_True, (Py_ssize_t)mr_node_len(n), (long long)mr_node_state(n),
                         (long long)(p != NULL ? (int64_t)ph.id : -1), (unsigned long)ph.gen,
                         (int)mr_node_full_lock(n), (int)mr_node_state_lock(n),
                         (Py_ssize_t)mr_radix_path_len(t, n), (long)mr_node_namespace(n));
}

PyDoc_STRVAR(Lifecycle_node_key__doc__,
"node_key($self, node_id, node_gen, /)\n"
"--\n"
"\n"
"(tokens, kv_indices) of the node's edge, as int64 arrays.");

static PyObject *
Lifecycle_node_key(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static mr_argspec spec = NODE_ARGSPEC("node_key");
    mr_node *n = node_args(self, &spec, args, nargs);
    return n == NULL ? NULL : Py_BuildValue("(NN)", mr_py_node_tokens(n, 1), mr_py_node_values(mr_lc_tree(self->lc), n));
}

PyDoc_STRVAR(Lifecycle_node_children__doc__,
"node_children($self, node_id, node_gen, /)\n"
"--\n"
"\n"
"[(id, gen), ...] of the node's children, in sorted order.");

static PyObject *
Lifecycle_node_children(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static mr_argspec spec = NODE_ARGSPEC("node_children");
    mr_node *n = node_args(self, &spec, args, nargs);
    return n == NULL ? NULL : mr_py_node_list(NULL, mr_lc_tree(self->lc), n, 0);
}

PyDoc_STRVAR(Lifecycle_lru__doc__,
"lru($self, which=0, /)\n"
"--\n"
"\n"
"[(id, gen), ...] of an LRU list, most recently used first (0: full, 1: state).");

static PyObject *
Lifecycle_lru(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MR_ARGS(spec, pa, "lru", 1, 1, 0, "which");
    int64_t which = 0;
    if (mr_parse(&spec, args, nargs, NULL, pa) < 0
        || (nargs > 0 && mr_as_int64(args[0], 0, 1, "lru(): which", &which) < 0)) {
        return NULL;
    }
    return mr_py_node_list(NULL, mr_lc_tree(self->lc), NULL, (int)which);
}

PyDoc_STRVAR(Lifecycle_root__doc__,
"root($self, /)\n"
"--\n"
"\n"
"(id, gen) of the root.");

static PyObject *
Lifecycle_root(LifecycleObject *self, PyObject *unused)
{
    return mr_py_node_ref(NULL, mr_radix_root(mr_lc_tree(self->lc)));
}

PyDoc_STRVAR(Lifecycle_sizes__doc__,
"sizes($self, /)\n"
"--\n"
"\n"
"(full_evictable, full_protected, state_evictable, state_protected, nodes).");

static PyObject *
Lifecycle_sizes(LifecycleObject *self, PyObject *unused)
{
    mr_radix_stats s;
    mr_radix_get_stats(mr_lc_tree(self->lc), &s);
    return Py_BuildValue("(nnnnn)", (Py_ssize_t)s.full_evictable, (Py_ssize_t)s.full_protected,
                         (Py_ssize_t)s.state_evictable, (Py_ssize_t)s.state_protected, (Py_ssize_t)s.nodes);
}

PyDoc_STRVAR(Lifecycle_check__doc__,
"check($self, /)\n"
"--\n"
"\n"
"Verify the tree's invariants, every pool's accounting, and that the tree's\n"
"tokens and states are exactly the tree-owned units of the pools.\n"
"InvariantError naming the broken rule otherwise.");

static PyObject *
Lifecycle_check(LifecycleObject *self, PyObject *unused)
{
    char msg[512];
    if (mr_lc_check(self->lc, msg, sizeof(msg)) != MR_OK) {
        return mr_raise(lc_state(self), MR_ECORRUPT, msg);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Lifecycle_tree_view__doc__,
"tree_view($self, /)\n"
"--\n"
"\n"
"A RadixTree over this Lifecycle's own tree (no pools only: a view's\n"
"insert and evictions bypass the pools' ownership): the node API (Node\n"
"handles, lru_order, evict_node_state, trim_path, policy_stats ...), and\n"
"namespace(extra_key) for the ns of this Lifecycle's calls.  The view\n"
"keeps the Lifecycle alive.");

static PyObject *
Lifecycle_tree_view(LifecycleObject *self, PyObject *unused)
{
    if (self->rp_obj != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "tree_view(): this Lifecycle has its own pools (a view would bypass them)");
        return NULL;
    }
    return mr_py_radix_view(lc_state(self), mr_lc_tree(self->lc), (PyObject *)self);
}

static PyObject *
Lifecycle_namespace(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return mr_py_namespace_call(mr_lc_tree(self->lc), args, nargs, kwnames);
}

static PyObject *
Lifecycle_namespace_name(LifecycleObject *self, PyObject *arg)
{
    return mr_py_namespace_name_call(mr_lc_tree(self->lc), arg);
}

PyDoc_STRVAR(Lifecycle_reset__doc__,
"reset($self, /)\n"
"--\n"
"\n"
"Drop every node (the pools are not touched: clear them; counted pools get\n"
"back what the tree held).");

static PyObject *
Lifecycle_reset(LifecycleObject *self, PyObject *unused)
{
    mr_lc_reset(self->lc);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Lifecycle_dump__doc__,
"dump($self, /)\n"
"--\n"
"\n"
"The tree, one node a line.");

static PyObject *
Lifecycle_dump(LifecycleObject *self, PyObject *unused)
{
    return mr_py_tree_dump(mr_lc_tree(self->lc), "dump()");
}

PyDoc_STRVAR(Lifecycle_stats__doc__,
"stats($self, /)\n"
"--\n"
"\n"
"State traffic so far: dict(cow=, forks=, donated=, clears=, states_evicted=,\n"
"tokens_evicted=).  cow and forks are state copies; donated slots moved\n"
"to the tree without one.");

static PyObject *
Lifecycle_stats(LifecycleObject *self, PyObject *unused)
{
    const mr_lc_stats *s = mr_lc_stats_of(self->lc);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K}", "cow", (unsigned long long)s->cow, "forks",
                         (unsigned long long)s->forks, "donated", (unsigned long long)s->donated, "clears",
                         (unsigned long long)s->clears, "states_evicted", (unsigned long long)s->states_evicted,
                         "tokens_evicted", (unsigned long long)s->tokens_evicted);
}

/* ------------------------------------------------------------------------
 * Per-request calls (rs tuples) */

/* The same calls on a Lifecycle without pools (below): the record first
 * (there is no row), the caller's slot ids in, its frees out. */
static PyObject *tree_admit(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
static PyObject *tree_cache(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                            int finished);

PyDoc_STRVAR(Lifecycle_alloc_state__doc__,
"alloc_state($self, /, owner=-2)\n"
"--\n"
"\n"
"One state slot, evicting one cached state when none is free.  RuntimeError\n"
"when none can be had.");

static PyObject *
Lifecycle_alloc_state(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "alloc_state", 0, 0, 0, "owner");
    int64_t owner = MR_OWNER_HELD;
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0
        || need_pools(self, "alloc_state") < 0) {
        return NULL;
    }
    PyObject *o = pa[0];
    if (o != NULL && mr_as_int64(o, MR_OWNER_HELD, INT32_MAX, "alloc_state(): owner", &owner) < 0) {
        return NULL;
    }
    int64_t s = -1;
    int rc = mr_lc_alloc_state(self->lc, (int32_t)owner, NULL, &s);
    if (rc == MR_EINVAL) {
        PyErr_Format(PyExc_ValueError, "alloc_state(): owner must be -2 (held) or a request row in [1, %lld], not %lld",
                     (long long)mr_pools_req_pool(self->rp_obj, lc_state(self))->size, (long long)owner);
        return NULL;
    }
    if (rc != MR_OK) {
        return lc_raise(self, rc, "alloc_state()");
    }
    return PyLong_FromLongLong(s);
}

PyDoc_STRVAR(Lifecycle_admit__doc__,
"admit($self, rows, rs_list, /, headroom=False)\n"
"--\n"
"\n"
"HybridReqToTokenPool.alloc for a batch: rows[i] <= 0 gets a new row, every\n"
"request a running slot (and its track buffer with extra_buffer) if it has\n"
"none.  headroom: first evict states short of n * (lazy ? 2 : 3), as the\n"
"scheduler does.  Returns (rows, rs_list), or None when rows or slots are\n"
"short (nothing taken).\n"
"\n"
"Without pools: admit(rs, fresh=(), /), the state slots for one request.\n"
"Returns\n"
"(rs, need): with no fresh slots, need = how many the request wants (a\n"
"running slot if it has none; with extra_buffer, its track buffer if it has\n"
"none) and nothing changed; allocate that many and call again with them\n"
"(distinct ints >= 1): they become the running slot (needs_clear set) and the\n"
"track slots (next_track 0), in that order, and need is 0.  ValueError for a\n"
"wrong count or a bad slot (nothing changes).  fresh an int (a slot\n"
"counter): one call, the slots wanted are fresh, fresh + 1, ...; returns\n"
"(rs, used), used = how many it took (0: none wanted, nothing changed).");

static PyObject *
Lifecycle_admit(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "admit", 2, 2, 2, "rows", "rs_list", "headroom");
    if (self->rp_obj == NULL) {
        return tree_admit(self, args, nargs, kwnames);
    }
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0) {
        return NULL;
    }
    int headroom = 0;
    if (mr_arg_bool(pa[2], "admit", "headroom", &headroom) < 0) {
        return NULL;
    }
    /* tuples of their own: an item's __index__ may change the caller's lists */
    PyObject *rows_seq = own_tuple(args[0], "admit(): rows must be a sequence");
    PyObject *rs_seq = NULL, *out_rows = NULL, *out_rs = NULL, *res = NULL;
    mr_req *sts = NULL;
    int64_t *rows = NULL;
    if (rows_seq == NULL) {
        return NULL;
    }
    rs_seq = own_tuple(args[1], "admit(): rs_list must be a sequence");
    if (rs_seq == NULL) {
        goto error;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(rows_seq);
    if (PySequence_Fast_GET_SIZE(rs_seq) != n) {
        PyErr_SetString(PyExc_ValueError, "admit(): rows and rs_list differ in length");
        goto error;
    }
    sts = PyMem_Calloc((size_t)n + 1, sizeof(mr_req));
    rows = PyMem_Calloc((size_t)n + 1, sizeof(int64_t));
    if (sts == NULL || rows == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    mr_reqpool *rp = mr_pools_req_pool(self->rp_obj, lc_state(self));
    PyObject **holders = mr_pools_req_holders(self->rp_obj, lc_state(self));
    PyTypeObject *rs_type = req_state_type(self);
    /* the rows and the tuple records (conversions that may run Python
     * code) first, the ReqState records last (parse_rs) */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = PySequence_Fast_GET_ITEM(rs_seq, i);
        if (mr_as_int64(PySequence_Fast_GET_ITEM(rows_seq, i), INT64_MIN, INT64_MAX, "admit(): rows", &rows[i]) < 0
            || (!Py_IS_TYPE(obj, rs_type) && parse_rs(self, obj, &sts[i]) < 0)) {
            goto error;
        }
    }
    mr_lc_why why;
    if (mr_lc_admit_rows_check(rp, rows, (size_t)n, &why) == MR_LC_WHY_ROW_FREE) {
        PyErr_Format(PyExc_ValueError, "admit(): rows[%lld] = %lld is not a request row in use (-1 takes a new "
                     "row)", (long long)why.at, (long long)why.value);
        goto error;
    }
    if (why.why == MR_LC_WHY_ROW_TWICE) {
        PyErr_Format(PyExc_ValueError, "admit(): rows[%lld] = %lld is rows[%lld] too (one row per request)",
                     (long long)why.at, (long long)why.value, (long long)why.other);
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = PySequence_Fast_GET_ITEM(rs_seq, i);
        if (!Py_IS_TYPE(obj, rs_type)) {
            continue;
        }
        if (parse_rs(self, obj, &sts[i]) < 0) {
            goto error;
        }
        /* a record in a row is admitted in that row; one that is not moves
         * into the row it gets, which must not hold another's */
        ReqStateObject *o = (ReqStateObject *)obj;
        if (o->pool != NULL && (o->pool != self->rp_obj || o->h.row != rows[i])) {
            PyErr_Format(PyExc_ValueError, "admit(): rs_list[%zd] is the record of request row %lld%s, not of row %lld",
                         i, (long long)o->h.row, o->pool != self->rp_obj ? " of another ReqPool" : "",
                         (long long)rows[i]);
            goto error;
        }
        if (o->pool == NULL && rows[i] >= 1 && rows[i] <= rp->size && holders[rows[i]] != NULL
            && ((ReqStateObject *)holders[rows[i]])->h.gen == mr_reqpool_gen(rp, rows[i])) {
            PyErr_Format(PyExc_ValueError, "admit(): request row %lld holds another request's record", (long long)rows[i]);
            goto error;
        }
        for (Py_ssize_t j = 0; j < i; j++) {
            if (PySequence_Fast_GET_ITEM(rs_seq, j) == obj) {
                PyErr_Format(PyExc_ValueError, "admit(): rs_list[%zd] is rs_list[%zd] (one record per request)", i, j);
                goto error;
            }
        }
    }
    int rc = mr_lc_admit(self->lc, sts, rows, (size_t)n, headroom);
    if (rc == MR_ENOSPC) {
        res = Py_NewRef(Py_None);
        goto error;
    }
    if (rc != MR_OK) {
        lc_raise_row(self, rc, "admit()", admit_overrides, 0);
        goto error;
    }
    /* records not in a row move into theirs, the others are written back
     * (nothing below fails before every record is in place) */
    for (Py_ssize_t i = 0; i < n; i++) {
        ReqStateObject *o = (ReqStateObject *)PySequence_Fast_GET_ITEM(rs_seq, i);
        if (Py_IS_TYPE((PyObject *)o, rs_type) && o->pool == NULL) {
            rs_bind(o, &sts[i], self->rp_obj, rp, holders, rows[i]);
        }
        else if (Py_IS_TYPE((PyObject *)o, rs_type)) {
            mr_rec_put(&o->h, &sts[i]);
        }
    }
    out_rows = PyList_New(n);
    out_rs = PyList_New(n);
    if (out_rows == NULL || out_rs == NULL) {
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyLong_FromLongLong(rows[i]);
        PyObject *obj = PySequence_Fast_GET_ITEM(rs_seq, i);
        PyObject *t = Py_IS_TYPE(obj, rs_type) ? Py_NewRef(obj) : req_to_tuple(&sts[i]);
        if (r == NULL || t == NULL) {
            Py_XDECREF(r);
            Py_XDECREF(t);
            goto error;
        }
        PyList_SET_ITEM(out_rows, i, r);
        PyList_SET_ITEM(out_rs, i, t);
    }
    res = PyTuple_Pack(2, out_rows, out_rs);
error:
    PyMem_Free(sts);
    PyMem_Free(rows);
    Py_XDECREF(rows_seq);
    Py_XDECREF(rs_seq);
    Py_XDECREF(out_rows);
    Py_XDECREF(out_rs);
    return res;
}

PyDoc_STRVAR(Lifecycle_prepare_extend__doc__,
"prepare_extend($self, row, rs, prefix_len, extend_len, /)\n"
"--\n"
"\n"
"The prefill tracking decision.  Returns (rs, track_slot, track_mask,\n"
"track_seqlen).");

static PyObject *
Lifecycle_prepare_extend(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MR_ARGS(spec, pa, "prepare_extend", 4, 4, 4, "row", "rs", "prefix_len", "extend_len");
    int64_t row = 0, p = 0, e = 0;
    mr_req st;
    if (mr_parse(&spec, args, nargs, NULL, pa) < 0
        || mr_as_int64(args[0], INT64_MIN, INT64_MAX, "prepare_extend(): row", &row) < 0
        || mr_as_int64(args[2], 0, INT64_MAX, "prepare_extend(): prefix_len", &p) < 0
        || mr_as_int64(args[3], 0, INT64_MAX, "prepare_extend(): extend_len", &e) < 0
        || parse_rs_row(self, args[1], row, "prepare_extend", &st) < 0) {   /* the record last */
        return NULL;
    }
    int64_t slot = -1, seqlen = -1;
    uint8_t mask = 0;
    mr_lc_prepare_extend(self->lc, row, &st, p, e, &slot, &mask, &seqlen);
    return Py_BuildValue("(NLOL)", build_rs(self, args[1], &st), (long long)slot, mask ? Py_True : Py_False, (long long)seqlen);
}

PyDoc_STRVAR(Lifecycle_cache_unfinished__doc__,
"cache_unfinished($self, row, rs, tokens, fill_len, /, ns=0)\n"
"--\n"
"\n"
"cache_unfinished_req for the request in `row`.  Returns (rs, prefix_indices,\n"
"fork_src, fork_dst): fork_* is the no_buffer state copy to do now (-1:\n"
"none).  C-contiguous int64 tokens (array('q'), numpy) are read in place;\n"
"they must begin with the tokens the request's locked node was matched\n"
"from (its insert starts there and reads none of them).\n"
"\n"
"Without pools (the pools are someone else's): cache_unfinished(rs, tokens,\n"
"kv, fresh, /, ns=0, prefix=True), no row; kv holds the request's KV indices (fill_len = len(kv)), fresh the\n"
"state slot the caller allocated for it.  Returns (rs, prefix_indices,\n"
"fork_src, fork_dst, kv_to_free, slots_to_free, table_end): the caller's\n"
"table must hold prefix_indices[:new protected_len], and differs from it\n"
"only on [old protected_len, table_end) (the duplicates the tree replaced\n"
"with its own indices; past them the tree took kv's), so the caller writes\n"
"prefix_indices[old protected_len : table_end] (nothing when table_end is\n"
"not past it), frees the slots with one call and the KV in the calls\n"
"kv_free_ends gives (fresh is among the slots when it was not needed).\n"
"prefix=False: prefix_indices is None (not built).  The result is an\n"
"UnfinishedResult: those seven items, and by name cache_len (the tokens\n"
"the call inserted, 0: none) and kv_free_ends.  A Lifecycle with\n"
"values=False takes kv as a count (its KV indices carry no value).");

static PyObject *
Lifecycle_cache_unfinished(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "cache_unfinished", 4, 4, 4, "row", "rs", "tokens", "fill_len", "ns");
    if (self->rp_obj == NULL) {
        return tree_cache(self, args, nargs, kwnames, 0);
    }
    int64_t row = 0, fill = 0, ns = 0;
    mr_req st;
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0
        || mr_as_int64(args[0], 1, INT64_MAX, "cache_unfinished(): row", &row) < 0
        || mr_as_int64(args[3], 0, INT64_MAX, "cache_unfinished(): fill_len", &fill) < 0
        || row_and_len(self, "cache_unfinished", row, "fill_len", fill) < 0) {
        return NULL;
    }
    PyObject *o = pa[4];
    if (o != NULL && mr_as_int64(o, 0, INT32_MAX, "cache_unfinished(): ns", &ns) < 0) {
        return NULL;
    }
    /* the tokens first: reading them may run Python code that calls this
     * Lifecycle again; the row's record is read after it, and the key
     * stays in kb, or is read in place (int64: SGLang's array('q'), whose
     * insert narrows only what it reads) */
    PyObject *prefix = NULL, *res = NULL;
    key_arg k;
    if (key_read(self, args[2], NULL, (Py_ssize_t)fill, 1, "cache_unfinished(): tokens", NULL, &k) < 0) {
        return NULL;
    }
    if ((int64_t)k.key.len < fill) {
        PyErr_Format(PyExc_ValueError, "cache_unfinished(): %zu tokens for fill_len %lld", k.key.len, (long long)fill);
        goto done;
    }
    if (parse_rs_row(self, args[1], row, "cache_unfinished", &st) < 0) {
        goto done;
    }
    prefix = mr_i64_array(NULL, (Py_ssize_t)fill);
    if (prefix == NULL) {
        goto done;
    }
    int64_t fs = -1, fd = -1, bad = -1;
    int rc = mr_lc_cache_unfinished(self->lc, row, &st, &k.key, (size_t)fill, (int32_t)ns,
                                         (int64_t *)PyArray_DATA((PyArrayObject *)prefix), &fs, &fd, &bad);
    if (rc == MR_EINVAL && k.key.width == 8 && bad >= 0) {
        Py_CLEAR(prefix);   /* as the narrowing of a copied key names it */
        PyErr_Format(PyExc_ValueError, "cache_unfinished(): tokens[%lld] = %lld is out of range [%d, %d]",
                     (long long)bad, (long long)mr_key_at(&k.key, (size_t)bad), INT32_MIN, INT32_MAX);
        goto done;
    }
    if (rc != MR_OK) {
        Py_CLEAR(prefix);
        if (!(rc == MR_EINVAL && ns_refused(self, "cache_unfinished", &st, ns, -1))) {
            lc_raise_row(self, rc, "cache_unfinished()", cache_unfinished_overrides, row);
        }
        goto done;
    }
    res = Py_BuildValue("(NNLL)", build_rs(self, args[1], &st), prefix, (long long)fs, (long long)fd);
    prefix = NULL;   /* stolen by "N" */
done:
    key_release(self, &k);
    Py_XDECREF(prefix);
    return res;
}

PyDoc_STRVAR(Lifecycle_cache_finished__doc__,
"cache_finished($self, row, rs, tokens, committed_len, /, ns=0, is_insert=True, tail=None)\n"
"--\n"
"\n"
"cache_finished_req for the request in `row`: insert what is cacheable, free\n"
"the tail KV and every state slot the tree does not keep, drop the lock.\n"
"tail: more tokens after `tokens` (the key is tokens + tail, not built).\n"
"Returns rs.  OwnershipError when the request was already finished or its\n"
"slot donated (nothing changes).\n"
"\n"
"Without pools: cache_finished(rs, tokens, kv, /, ns=0, is_insert=True,\n"
"state_available=-1), no row; kv holds the request's committed KV indices.  Returns (rs, kv_to_free, slots_to_free): the slots\n"
"for one free call of the caller's allocator, the KV for the calls\n"
"kv_free_ends gives (the tail, then the duplicates node by node).  state_available: the\n"
"caller's free state slots, for the end-of-turn rule (end_of_turn_states);\n"
"-1: unknown, no end-of-turn state.  The result is a FinishedResult: those\n"
"three items, and by name cache_len (the tokens the call inserted, 0:\n"
"none) and kv_free_ends.  A Lifecycle with values=False takes kv as a\n"
"count.");

static PyObject *
Lifecycle_cache_finished(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "cache_finished", 4, 4, 4, "row", "rs", "tokens", "committed_len", "ns", "is_insert", "tail");
    if (self->rp_obj == NULL) {
        return tree_cache(self, args, nargs, kwnames, 1);
    }
    int64_t row = 0, c = 0, ns = 0;
    int ins = 1;
    mr_req st;
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0
        || mr_as_int64(args[0], 1, INT64_MAX, "cache_finished(): row", &row) < 0
        || mr_as_int64(args[3], 0, INT64_MAX, "cache_finished(): committed_len", &c) < 0
        || row_and_len(self, "cache_finished", row, "committed_len", c) < 0) {
        return NULL;
    }
    PyObject *o = pa[4];
    if (o != NULL && mr_as_int64(o, 0, INT32_MAX, "cache_finished(): ns", &ns) < 0) {
        return NULL;
    }
    if (mr_arg_bool(pa[5], "cache_finished", "is_insert", &ins) < 0) {
        return NULL;
    }
    /* the tokens first (cache_unfinished says why), into kb */
    key_arg k;
    if (key_read(self, args[2], pa[6], (Py_ssize_t)c, 0, "cache_finished(): tokens", "cache_finished(): tail",
                 &k) < 0) {
        return NULL;
    }
    int ok = 1;
    if ((int64_t)k.key.len < c) {
        PyErr_Format(PyExc_ValueError, "cache_finished(): %zu tokens for committed_len %lld", k.key.len, (long long)c);
        ok = 0;
    }
    ok = ok && parse_rs_row(self, args[1], row, "cache_finished", &st) == 0;
    int rc = ok ? mr_lc_cache_finished(self->lc, row, &st, k.key.p, (size_t)c, (int32_t)ns, ins) : MR_OK;
    key_release(self, &k);
    if (!ok) {
        return NULL;
    }
    if (rc != MR_OK) {
        return rc == MR_EINVAL && ns_refused(self, "cache_finished", &st, ns, -1)
                   ? NULL
                   : lc_raise_row(self, rc, "cache_finished()", cache_finished_overrides, row);
    }
    /* the request is done with the cache: its record leaves the row (which
     * the scheduler frees next) and stays with the request, as SGLang's
     * Req keeps its fields */
    ReqStateObject *ro = (ReqStateObject *)args[1];
    if (Py_IS_TYPE(args[1], req_state_type(self))) {
        PyObject **holders = ro->pool != NULL ? mr_pools_req_holders(ro->pool, lc_state(self)) : NULL;
        int64_t left = mr_rec_finish(&ro->h, &st);
        if (left >= 0) {
            if (holders[left] == args[1]) {
                holders[left] = NULL;
            }
            Py_CLEAR(ro->pool);
        }
        return Py_NewRef(args[1]);
    }
    return build_rs(self, args[1], &st);
}

/* ------------------------------------------------------------------------
 * Tree-only: the calls above over someone else's pools */

/* What foreign_args took: both arrays released, both buffers given back. */
static void
foreign_release(LifecycleObject *self, mr_ints *tok, mr_ints *kvv, mr_buf *kvbuf, mr_buf *tokbuf)
{
    mr_ints_release(tok);
    mr_ints_release(kvv);
    mr_buf_give(&self->buf, kvbuf);
    mr_buf_give(&self->keybuf, tokbuf);
}

/* Common arguments: rs, tokens, kv (the request's KV indices, n of them),
 * ns.  The tokens are read in place when they are int32 (*tok), else
 * converted into *tokbuf; the KV indices in place when they are int64
 * (*kvv), else widened into *kvbuf (SGLang's int32 req_to_token rows: no
 * array is made).  *kvbuf and *tokbuf are the Lifecycle's buf and keybuf,
 * taken for the call (mr_buf_take): reading the arrays may run Python code
 * (__array__, __index__, a finalizer) that calls this Lifecycle again,
 * which must not move or change them under us; for the same reason the
 * request's record (rs) is read last.  The caller hands all four to
 * foreign_release.  Returns 0, or -1 with an exception (nothing to release
 * or give back). */
static int
foreign_args(LifecycleObject *self, const char *fname, PyObject *rs, PyObject *tokens, PyObject *kv,
             PyObject *ns_obj, mr_req *st, int64_t *ns, mr_ints *kvv, mr_ints *tok, mr_buf *kvbuf, mr_buf *tokbuf)
{
    char arg[96];
    if (mr_arg_int64(ns_obj, fname, "ns", 0, INT32_MAX, ns) < 0) {
        return -1;
    }
    int64_t nkv = 0;
    if (mr_lc_config_of(self->lc)->no_values) {   /* keys only: kv is a count */
        if (!PyLong_Check(kv) && !(PyIndex_Check(kv) && !PyObject_CheckBuffer(kv))) {
            PyErr_Format(PyExc_TypeError, "%s(): kv must be an int (the number of KV indices: this Lifecycle "
                         "keeps no values), not %.100s", fname, Py_TYPE(kv)->tp_name);
            return -1;
        }
        if (mr_arg_int64(kv, fname, "kv", 0, INT64_MAX, &nkv) < 0) {
            return -1;
        }
    }
    *kvbuf = mr_buf_take(&self->buf);
    *tokbuf = mr_buf_take(&self->keybuf);
    if (mr_lc_config_of(self->lc)->no_values) {
        memset(kvv, 0, sizeof(*kvv));
        kvv->len = (size_t)nkv;
    }
    else {
        snprintf(arg, sizeof(arg), "%s(): kv", fname);
        if (mr_ints_read(kv, 8, 0, INT64_MAX, arg, MR_INTS_SCALAR, kvbuf, kvv) < 0) {
            goto fail;
        }
    }
    snprintf(arg, sizeof(arg), "%s(): tokens", fname);
    if (mr_ints_read(tokens, 4, INT32_MIN, INT32_MAX, arg, MR_INTS_SCALAR, tokbuf, tok) < 0) {
        mr_ints_release(kvv);
        goto fail;
    }
    if (tok->len < kvv->len) {
        PyErr_Format(PyExc_ValueError, "%s(): %zu tokens for %zu KV indices", fname, tok->len, kvv->len);
        goto fail_both;
    }
    /* the request's record last: reading the arrays may have run Python
     * code that calls this Lifecycle again */
    if (parse_rs(self, rs, st) < 0) {
        goto fail_both;
    }
    mr_lc_clear_released(self->lc);
    return 0;
fail_both:
    foreign_release(self, tok, kvv, kvbuf, tokbuf);
    return -1;
fail:
    mr_buf_give(&self->buf, kvbuf);
    mr_buf_give(&self->keybuf, tokbuf);
    return -1;
}

/* The result of a cache call without pools: rs and the call's own outputs
 * (items, new references), then the frees (kv, slots), and the named
 * fields past the unpacked ones: cache_len, kv_free_ends (and for
 * cache_unfinished table_end, unpacked).  Steals every reference, also on
 * failure. */
static PyObject *
cache_result(LifecycleObject *self, PyObject *type, PyObject *const *items, Py_ssize_t n)
{
    mr_seq r = mr_seq_new(type);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (r.res == NULL) {
            Py_XDECREF(items[i]);
            continue;
        }
        MR_SEQ_ADD(r, items[i]);
    }
    MR_SEQ_ADD(r, PyLong_FromLongLong((long long)mr_lc_cached_len(self->lc)));
    MR_SEQ_ADD(r, Py_NewRef(self->kv_ends != NULL ? self->kv_ends : Py_None));
    return r.res;
}


/* cache_unfinished (finished 0) and cache_finished (1) without pools. */
static PyObject *
tree_cache(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int finished)
{
    MR_ARGS(uspec, upa, "cache_unfinished", 4, 4, 4, "rs", "tokens", "kv", "fresh", "ns", "prefix");
    MR_ARGS(fspec, fpa, "cache_finished", 3, 3, 3, "rs", "tokens", "kv", "ns", "is_insert", "state_available");
    const char *fname = finished ? "cache_finished" : "cache_unfinished";
    PyObject **pa = finished ? fpa : upa;
    int64_t ns = 0, fresh = 0, avail = -1;
    int flag = 1;   /* cache_unfinished's prefix, cache_finished's is_insert */
    mr_req st;
    if (mr_parse(finished ? &fspec : &uspec, args, nargs, kwnames, pa) < 0
        || (!finished && mr_as_int64(args[3], mr_lc_counts_of(self->lc) != NULL ? 0 : 1, INT64_MAX,
                                     "cache_unfinished(): fresh", &fresh) < 0)
        || mr_arg_bool(pa[finished ? 4 : 5], fname, finished ? "is_insert" : "prefix", &flag) < 0
        || (finished && pa[5] != NULL
            && mr_as_int64(pa[5], -1, INT64_MAX, "cache_finished(): state_available", &avail) < 0)) {
        return NULL;
    }
    mr_ints tok, kv;
    mr_buf kvbuf, tokbuf;
    if (foreign_args(self, fname, args[0], args[1], args[2], pa[finished ? 3 : 4], &st, &ns, &kv, &tok, &kvbuf,
                     &tokbuf) < 0) {
        return NULL;
    }
    PyObject *prefix = finished || !flag ? Py_NewRef(Py_None) : mr_i64_array(NULL, (Py_ssize_t)kv.len);
    if (prefix == NULL) {
        foreign_release(self, &tok, &kv, &kvbuf, &tokbuf);
        return NULL;
    }
    int64_t fs = -1, fd = -1, table_end = 0;
    int rc = mr_lc_cache_ext(self->lc, finished, &st, (const int32_t *)tok.data, (const int64_t *)kv.data, kv.len,
                             (int32_t)ns, finished ? flag : fresh, avail, prefix != Py_None ? I64(prefix) : NULL,
                             &fs, &fd, &table_end);
    foreign_release(self, &tok, &kv, &kvbuf, &tokbuf);
    if (victims_raised(self)) {
        Py_DECREF(prefix);
        return NULL;
    }
    PyObject *kvf = NULL, *stf = NULL;
    if (take_frees(self, &kvf, &stf) < 0 || rc != MR_OK) {
        Py_DECREF(prefix);
        Py_XDECREF(kvf);
        Py_XDECREF(stf);
        if (rc == MR_EINVAL && ns_refused(self, fname, &st, ns, -1)) {
            return NULL;
        }
        return rc != MR_OK ? lc_raise_row(self, rc, finished ? "cache_finished()" : "cache_unfinished()",
                                          finished ? lifecycle_overrides : unfinished_tree_overrides, 0)
                           : NULL;
    }
    PyObject *rs = build_rs(self, args[0], &st);
    if (finished) {
        Py_DECREF(prefix);
        PyObject *items[3] = {rs, kvf, stf};
        return cache_result(self, lc_state(self)->FinishedResult, items, 3);
    }
    PyObject *items[7] = {rs, prefix, PyLong_FromLongLong((long long)fs), PyLong_FromLongLong((long long)fd), kvf,
                          stf, PyLong_FromLongLong((long long)table_end)};
    return cache_result(self, lc_state(self)->UnfinishedResult, items, 7);
}

static PyObject *
tree_admit(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "admit", 2, 2, 1, "rs", "fresh");
    mr_req st;
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0) {
        return NULL;
    }
    int64_t fresh[3] = {-1, -1, -1}, first = 0, out = 0;
    size_t nfresh = 0;
    /* fresh a slot counter (mr_lc_admit_ids), or none with counted pools */
    int ids = (nargs > 1 && PyIndex_Check(args[1])) || (nargs == 1 && mr_lc_counts_of(self->lc) != NULL);
    if (ids && nargs > 1 && mr_as_int64(args[1], 1, INT64_MAX, "admit(): fresh", &first) < 0) {
        return NULL;
    }
    if (!ids && nargs > 1) {
        /* a tuple of its own: an item's __index__ may change the caller's list */
        PyObject *seq = own_tuple(args[1], "admit(): fresh must be a sequence of slot ids");
        if (seq == NULL) {
            return NULL;
        }
        Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
        if (m > 3) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "admit(): fresh has more slots than a request takes");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < m; i++) {
            if (mr_as_int64(PySequence_Fast_GET_ITEM(seq, i), INT64_MIN, INT64_MAX, "admit(): fresh",
                            &fresh[i]) < 0) {
                Py_DECREF(seq);
                return NULL;
            }
        }
        Py_DECREF(seq);
        nfresh = (size_t)m;
    }
    if (parse_rs(self, args[0], &st) < 0) {   /* the record last */
        return NULL;
    }
    /* out: the slots used (a counter), or wanted (none given) */
    int rc = ids ? mr_lc_admit_ids(self->lc, &st, first, &out) : mr_lc_admit_ext(self->lc, &st, fresh, nfresh, &out);
    if (rc != MR_OK && ids) {
        return PyErr_Format(PyExc_ValueError, "admit(): fresh = %lld: the slot ids from it would include one "
                            "the request holds", (long long)first);
    }
    if (rc != MR_OK) {
        return PyErr_Format(PyExc_ValueError, "admit(): fresh must be %lld distinct new slot ids >= 1",
                            (long long)out);
    }
    return Py_BuildValue("(NL)", build_rs(self, args[0], &st), (long long)out);
}

PyDoc_STRVAR(Lifecycle_cow__doc__,
"cow($self, rs, node_id, node_gen, fresh=-1, /)\n"
"--\n"
"\n"
"match's copy-on-write step on a Lifecycle without pools, for the node a\n"
"match returned: when it holds a state, the record's cow_src becomes that\n"
"state and needs_clear False, after its running slot becomes fresh if it has\n"
"none.  Returns (rs, need_slot): need_slot when it wants a running slot and\n"
"fresh gave none (allocate one with the node locked and call again; nothing\n"
"changed).  ValueError for a fresh slot it does not take.");

static PyObject *
Lifecycle_cow(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MR_ARGS(spec, pa, "cow", 4, 4, 3, "rs", "node_id", "node_gen", "fresh");
    int64_t fresh = -1, id = 0, gen = 0;
    mr_req st;
    mr_node *node = NULL;
    /* every int first, then the record, then the node (resolving runs no
     * Python code, so no call in between can free it) */
    if (mr_parse(&spec, args, nargs, NULL, pa) < 0
        || mr_as_int64(args[1], 0, UINT32_MAX, "node id", &id) < 0
        || mr_as_int64(args[2], 0, UINT32_MAX, "node generation", &gen) < 0
        || (nargs > 3 && mr_as_int64(args[3], -1, INT64_MAX, "cow(): fresh", &fresh) < 0)
        || parse_rs(self, args[0], &st) < 0
        || resolve_handle(self, id, gen, "node", &node) < 0) {
        return NULL;
    }
    if (self->rp_obj != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cow(): this Lifecycle has its own pools; use match(cow=True)");
        return NULL;
    }
    int need = 0;
    int rc = mr_lc_cow_ext(self->lc, &st, node, fresh, &need);
    if (victims_raised(self)) {
        return NULL;
    }
    if (rc == MR_ENOSPC) {
        return lc_raise(self, rc, "cow()");
    }
    if (rc != MR_OK) {
        PyErr_SetString(PyExc_ValueError, "cow(): fresh is a slot the request does not take "
                                          "(it already has a running slot, or the node holds no state)");
        return NULL;
    }
    return Py_BuildValue("(NO)", build_rs(self, args[0], &st), need ? Py_True : Py_False);
}

PyDoc_STRVAR(Lifecycle_decode_prepare__doc__,
"decode_prepare($self, row, rs, seq_len, /)\n"
"--\n"
"\n"
"Before a decode forward (seq_len includes the new token): lazy mode\n"
"borrows a second track slot at a boundary.  Returns (rs, track_slot,\n"
"track_mask).  Without pools: decode_prepare(rs, seq_len, fresh=-1), no\n"
"row, returns (rs, track_slot, track_mask, need_slot): need_slot when lazy\n"
"mode wants to borrow a slot at this boundary and fresh gave none (call\n"
"again with one; nothing changed).");

static PyObject *
Lifecycle_decode_prepare(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* with pools the row comes first; without, fresh comes last; the record
     * is read last (a record without pools may sit in any ReqPool's row) */
    MR_ARGS(pspec, ppa, "decode_prepare", 3, 3, 3, "row", "rs", "seq_len");
    MR_ARGS(tspec, tpa, "decode_prepare", 3, 3, 2, "rs", "seq_len", "fresh");
    int pools = self->rp_obj != NULL;
    int64_t row = -1, sl = 0, fresh = -1;
    mr_req st;
    if (mr_parse(pools ? &pspec : &tspec, args, nargs, NULL, pools ? ppa : tpa) < 0
        || (pools && mr_as_int64(args[0], INT64_MIN, INT64_MAX, "decode_prepare(): row", &row) < 0)
        || mr_as_int64(args[pools + 1], 0, INT64_MAX, "decode_prepare(): seq_len", &sl) < 0
        || (!pools && nargs > 2 && mr_as_int64(args[2], -1, INT64_MAX, "decode_prepare(): fresh", &fresh) < 0)
        || (pools ? parse_rs_row(self, args[1], row, "decode_prepare", &st) : parse_rs(self, args[0], &st)) < 0) {
        return NULL;
    }
    int64_t slot = -1;
    uint8_t mask = 0;
    int need = 0;
    if (pools) {
        (void)mr_lc_decode_prepare(self->lc, row, &st, sl, &slot, &mask);
        return Py_BuildValue("(NLO)", build_rs(self, args[1], &st), (long long)slot, mask ? Py_True : Py_False);
    }
    (void)mr_lc_decode_prepare_ext(self->lc, &st, sl, fresh, &slot, &mask, &need);
    if (victims_raised(self)) {
        return NULL;
    }
    return Py_BuildValue("(NLOO)", build_rs(self, args[0], &st), (long long)slot, mask ? Py_True : Py_False,
                         need ? Py_True : Py_False);
}

PyDoc_STRVAR(Lifecycle_decode_finish__doc__,
"decode_finish($self, row, rs, committed_len, finished, /)\n"
"--\n"
"\n"
"After a decode result: at a boundary (committed_len % interval == 0) record\n"
"the tracked length and flip the ping-pong index (lazy: give the borrowed\n"
"slot back).  Returns (rs, at_boundary).  Without pools:\n"
"decode_finish(rs, committed_len, finished), no row, returns (rs,\n"
"at_boundary, slots_to_free).");

static PyObject *
Lifecycle_decode_finish(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* with pools the row comes first; the record is read last */
    MR_ARGS(pspec, ppa, "decode_finish", 4, 4, 4, "row", "rs", "committed_len", "finished");
    MR_ARGS(tspec, tpa, "decode_finish", 3, 3, 3, "rs", "committed_len", "finished");
    int pools = self->rp_obj != NULL;
    int64_t row = -1, c = 0;
    int fin = 0;
    mr_req st;
    if (mr_parse(pools ? &pspec : &tspec, args, nargs, NULL, pools ? ppa : tpa) < 0
        || (pools && mr_as_int64(args[0], INT64_MIN, INT64_MAX, "decode_finish(): row", &row) < 0)
        || mr_as_int64(args[pools + 1], 0, INT64_MAX, "decode_finish(): committed_len", &c) < 0
        || mr_arg_bool(args[pools + 2], "decode_finish", "finished", &fin) < 0
        || (pools ? parse_rs_row(self, args[1], row, "decode_finish", &st) : parse_rs(self, args[0], &st)) < 0) {
        return NULL;
    }
    if (pools) {
        int at = mr_lc_decode_finish(self->lc, row, &st, c, fin);
        return Py_BuildValue("(NO)", build_rs(self, args[1], &st), at ? Py_True : Py_False);
    }
    mr_lc_clear_released(self->lc);
    int at = mr_lc_decode_finish(self->lc, -1, &st, c, fin);
    PyObject *kvf = NULL, *stf = NULL;
    if (take_frees(self, &kvf, &stf) < 0) {
        return NULL;
    }
    Py_DECREF(kvf);
    return Py_BuildValue("(NON)", build_rs(self, args[0], &st), at ? Py_True : Py_False, stf);
}

PyDoc_STRVAR(Lifecycle_unfinished_cache_len__doc__,
"unfinished_cache_len($self, rs, fill_len, /)\n"
"--\n"
"\n"
"The tokens cache_unfinished would cache of a request with fill_len\n"
"tokens: its tracked length (rs.last_track_seqlen) with extra_buffer,\n"
"fill_len without; -1 when nothing was tracked: the call would cache\n"
"nothing and take no slot, the request keeping all its KV (SGLang's\n"
"cache_unfinished_req returns at once).  Changes nothing.");

static PyObject *
Lifecycle_unfinished_cache_len(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MR_ARGS(spec, pa, "unfinished_cache_len", 2, 2, 2, "rs", "fill_len");
    int64_t fill = 0;
    mr_req st;
    if (mr_parse(&spec, args, nargs, NULL, pa) < 0
        || mr_as_int64(args[1], 0, INT64_MAX, "unfinished_cache_len(): fill_len", &fill) < 0
        || parse_rs(self, args[0], &st) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong((long long)mr_lc_unfinished_cache_len(self->lc, &st, (size_t)fill));
}

PyDoc_STRVAR(Lifecycle_free_states__doc__,
"free_states($self, rs, /, keep=-1)\n"
"--\n"
"\n"
"free_mamba_cache: free the running slot and every track slot but\n"
"track[keep].  Returns rs.  OwnershipError when there is nothing to free\n"
"(double free) or a slot is not the request's.");

static PyObject *
Lifecycle_free_states(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "free_states", 1, 1, 1, "rs", "keep");
    int64_t keep = -1;
    mr_req st;
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0
        || (mr_lc_counts_of(self->lc) == NULL && need_pools(self, "free_states") < 0)) {
        return NULL;
    }
    PyObject *o = pa[1];
    if ((o != NULL && o != Py_None && mr_as_int64(o, -1, 1, "free_states(): keep", &keep) < 0)
        || parse_rs(self, args[0], &st) < 0) {   /* the record last */
        return NULL;
    }
    int rc = mr_lc_free_states(self->lc, &st, (int)keep);
    if (rc != MR_OK) {
        return lc_raise(self, rc, "free_states()");
    }
    return build_rs(self, args[0], &st);
}

/* ------------------------------------------------------------------------
 * Counted pools (Lifecycle(counts=...)) */

/* The counts, or NULL with RuntimeError when the pools are not counted. */
static const mr_lc_counts *
need_counts(LifecycleObject *self, const char *fname)
{
    const mr_lc_counts *c = mr_lc_counts_of(self->lc);
    if (c == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s(): this Lifecycle's pools are not counted (Lifecycle(counts=...))", fname);
    }
    return c;
}

PyDoc_STRVAR(Lifecycle_take_kv__doc__,
"take_kv($self, n, /, evict_below=None)\n"
"--\n"
"\n"
"Counted pools: take n KV tokens, first evicting what the release's rule\n"
"asks for when fewer than evict_below (default n) are free.  RuntimeError\n"
"when fewer than n are free even then (nothing taken).");

static PyObject *
Lifecycle_take_kv(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "take_kv", 1, 2, 1, "n", "evict_below");
    int64_t n = 0, below = 0;
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0 || need_counts(self, "take_kv") == NULL
        || mr_as_int64(pa[0], 0, INT64_MAX, "take_kv(): n", &n) < 0
        || (pa[1] != NULL && pa[1] != Py_None && mr_as_int64(pa[1], 0, INT64_MAX, "take_kv(): evict_below", &below) < 0)) {
        return NULL;
    }
    const mr_lc_counts *c = mr_lc_counts_of(self->lc);
    int rc = mr_lc_count_kv(self->lc, n, pa[1] != NULL && pa[1] != Py_None ? below : n);
    if (victims_raised(self)) {
        return NULL;
    }
    if (rc == MR_ENOSPC) {
        return PyErr_Format(PyExc_RuntimeError, "take_kv(): the KV pool is exhausted taking %lld tokens (free %lld of "
                            "%lld after eviction)", (long long)n, (long long)c->kv_free, (long long)c->kv_total);
    }
    if (rc != MR_OK) {
        return lc_raise(self, rc, "take_kv()");
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Lifecycle_take_admission__doc__,
"take_admission($self, n_reqs, slots, rows, /)\n"
"--\n"
"\n"
"Counted pools: HybridReqToTokenPool.alloc's pools for a batch of n_reqs\n"
"requests that admit() numbered: `rows` new rows and the `slots` they took,\n"
"after the scheduler's state eviction for them.  RuntimeError when rows\n"
"(nothing changed) or slots (after the eviction) are short.");

static PyObject *
Lifecycle_take_admission(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MR_ARGS(spec, pa, "take_admission", 3, 3, 3, "n_reqs", "slots", "rows");
    int64_t n = 0, slots = 0, rows = 0;
    if (mr_parse(&spec, args, nargs, NULL, pa) < 0 || need_counts(self, "take_admission") == NULL
        || mr_as_int64(pa[0], 0, INT64_MAX / 4, "take_admission(): n_reqs", &n) < 0
        || mr_as_int64(pa[1], 0, INT64_MAX, "take_admission(): slots", &slots) < 0
        || mr_as_int64(pa[2], 0, n, "take_admission(): rows", &rows) < 0) {
        return NULL;
    }
    const mr_lc_counts *c = mr_lc_counts_of(self->lc);
    int64_t rows_free = c->rows_free;
    int rc = mr_lc_count_admit(self->lc, n, slots, rows);
    if (victims_raised(self)) {
        return NULL;
    }
    if (rc == MR_ENOSPC && rows > rows_free) {
        return PyErr_Format(PyExc_RuntimeError, "take_admission(): request rows exhausted (%lld wanted, %lld free)",
                            (long long)rows, (long long)rows_free);
    }
    if (rc == MR_ENOSPC) {
        return PyErr_Format(PyExc_RuntimeError, "take_admission(): the state pool is exhausted admitting %lld "
                            "requests (%lld slots wanted, %lld free after eviction)", (long long)n, (long long)slots,
                            (long long)c->slots_free);
    }
    if (rc != MR_OK) {
        return lc_raise(self, rc, "take_admission()");
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Lifecycle_free_row__doc__,
"free_row($self, committed_len, allocated_len, /)\n"
"--\n"
"\n"
"Counted pools: a finished request's row goes back, with the KV it\n"
"allocated past its committed length (whole pages).  ValueError when no\n"
"row is in use or more KV would go back than is in use.");

static PyObject *
Lifecycle_free_row(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MR_ARGS(spec, pa, "free_row", 2, 2, 2, "committed_len", "allocated_len");
    int64_t c = 0, a = 0;
    if (mr_parse(&spec, args, nargs, NULL, pa) < 0 || need_counts(self, "free_row") == NULL
        || mr_as_int64(pa[0], 0, INT64_MAX, "free_row(): committed_len", &c) < 0
        || mr_as_int64(pa[1], c, INT64_MAX, "free_row(): allocated_len", &a) < 0) {
        return NULL;
    }
    if (mr_lc_count_free_row(self->lc, c, a) != MR_OK) {
        PyErr_SetString(PyExc_ValueError, "free_row(): no request row is in use, or more KV would go back than is "
                                          "in use");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* mr_lc_victim_fn over the Python policy: fn(protect) -> (node_id,
 * node_gen) or None.  An exception, or a node that does not resolve, stops
 * the eviction (MR_EINVAL) with the exception set and victims_failed. */
static int
victim_call(void *ctx, const mr_node *protect, mr_node **victim)
{
    LifecycleObject *self = ctx;
    *victim = NULL;
    PyObject *arg = Py_None;
    if (protect != NULL) {
        mr_handle h = mr_node_handle(protect);
        arg = Py_BuildValue("(kk)", (unsigned long)h.id, (unsigned long)h.gen);
    }
    PyObject *r = arg != NULL ? PyObject_CallOneArg(self->victims, arg) : NULL;
    if (protect != NULL) {
        Py_XDECREF(arg);
    }
    int64_t id = 0, gen = 0;
    if (r == Py_None) {
        Py_DECREF(r);
        return MR_OK;
    }
    if (r != NULL && (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2)) {
        PyErr_Format(PyExc_TypeError, "set_victims(): the policy must return None or a (node_id, node_gen) tuple, "
                     "not %.100s", Py_TYPE(r)->tp_name);
        Py_CLEAR(r);
    }
    if (r == NULL || mr_as_int64(PyTuple_GET_ITEM(r, 0), 0, UINT32_MAX, "set_victims(): node id", &id) < 0
        || mr_as_int64(PyTuple_GET_ITEM(r, 1), 0, UINT32_MAX, "set_victims(): node generation", &gen) < 0
        || resolve_handle(self, id, gen, "set_victims(): the policy's node", victim) < 0) {
        Py_XDECREF(r);
        self->victims_failed = 1;
        return MR_EINVAL;
    }
    Py_DECREF(r);
    if (*victim == protect || !mr_radix_can_evict_state(mr_lc_tree(self->lc), *victim)) {
        PyErr_Format(PyExc_ValueError, "set_victims(): the policy named node (%lld, %lld), whose state cannot be "
                     "evicted (none, locked, or the one to keep)", (long long)id, (long long)gen);
        self->victims_failed = 1;
        *victim = NULL;
        return MR_EINVAL;
    }
    return MR_OK;
}

/* After a call that may evict states: 1 with the policy's exception set
 * when it failed (the call's own error is not raised), else 0. */
static int
victims_raised(LifecycleObject *self)
{
    if (!self->victims_failed) {
        return 0;
    }
    self->victims_failed = 0;
    return 1;
}

PyDoc_STRVAR(Lifecycle_set_victims__doc__,
"set_victims($self, policy, /)\n"
"--\n"
"\n"
"Counted pools: every state eviction evicts the victims policy(protect)\n"
"names, one call each, instead of the tree's own: protect is None or the\n"
"(node_id, node_gen) to keep; it returns None (no victim: the eviction\n"
"stops) or the handle of a node whose state the tree's rule lets go\n"
"(Node.can_evict_state).  It must not change the Lifecycle.  None restores\n"
"the tree's eviction.  The Lifecycle holds the policy strongly: set None\n"
"when done if it refers back to the Lifecycle.");

static PyObject *
Lifecycle_set_victims(LifecycleObject *self, PyObject *policy)
{
    if (need_counts(self, "set_victims") == NULL) {
        return NULL;
    }
    if (policy != Py_None && !PyCallable_Check(policy)) {
        return PyErr_Format(PyExc_TypeError, "set_victims(): policy must be callable or None, not %.100s",
                            Py_TYPE(policy)->tp_name);
    }
    Py_XSETREF(self->victims, policy == Py_None ? NULL : Py_NewRef(policy));
    mr_lc_count_set_victims(self->lc, self->victims != NULL ? victim_call : NULL, self);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Lifecycle_counts__doc__,
"counts($self, /)\n"
"--\n"
"\n"
"Counted pools: a dict of the totals, free counts and peaks (kv_*, slots_*,\n"
"rows_*), and the eviction and donation counters.");

static PyObject *
Lifecycle_counts(LifecycleObject *self, PyObject *unused)
{
    const mr_lc_counts *c = need_counts(self, "counts");
    if (c == NULL) {
        return NULL;
    }
    return Py_BuildValue("{sLsLsLsLsLsLsLsLsKsKsKsK}", "kv_total", (long long)c->kv_total, "kv_free",
                         (long long)c->kv_free, "slots_total", (long long)c->slots_total, "slots_free",
                         (long long)c->slots_free, "rows_total", (long long)c->rows_total, "rows_free",
                         (long long)c->rows_free, "peak_kv", (long long)c->peak_kv, "peak_slots",
                         (long long)c->peak_slots, "full_evictions", (unsigned long long)c->full_evictions,
                         "kv_evicted", (unsigned long long)c->kv_evicted, "states_evicted",
                         (unsigned long long)c->states_evicted, "donated", (unsigned long long)c->donated);
}

/* kv_free, slots_free, rows_free (closure: the field's offset) */
static PyObject *
Lifecycle_get_count(LifecycleObject *self, void *off)
{
    const mr_lc_counts *c = mr_lc_counts_of(self->lc);
    if (c == NULL) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong(*(const int64_t *)((const char *)c + (size_t)off));
}

/* ------------------------------------------------------------------------
 * Batched calls */

/* Writes "<i>]" and a NUL at dst (room for 23 bytes). */
static void
put_index(char *dst, size_t i)
{
    char d[20];
    int m = 0;
    do {
        d[m++] = (char)('0' + i % 10);
        i /= 10;
    } while (i > 0);
    while (m > 0) {
        *dst++ = d[--m];
    }
    *dst++ = ']';
    *dst = '\0';
}

typedef struct {
    mr_buf data;           /* every key's int32 tokens, back to back */
    const int32_t **ptrs;
    const int64_t **ptrs64;  /* in place (keyset_read's in_place): int64 keys read where they are, else NULL */
    Py_buffer *views;      /* the buffers ptrs64 point into, where have[i] */
    uint8_t *have;
    size_t *lens;
    int32_t *ns;
    size_t n;
    PyObject *seq;         /* the keys, a tuple of our own: it keeps the arrays ptrs64 points into alive */
    void *block;           /* one allocation holding the arrays above (but data) */
} keyset;

static void
keyset_free(keyset *k)
{
    for (size_t i = 0; k->have != NULL && i < k->n; i++) {
        if (k->have[i]) {
            PyBuffer_Release(&k->views[i]);
        }
    }
    mr_buf_free(&k->data);
    PyMem_Free(k->block);
    Py_XDECREF(k->seq);
    memset(k, 0, sizeof(*k));
}

/* keys: a list of token sequences (the argument `what`: "keys" or
 * "outputs"); ns_obj: None or a list of ints.  in_place: a key key64_view
 * accepts (C-contiguous int64) is read where it is (ptrs64[i], its view
 * held until keyset_free), for a call that only matches; every other key
 * is narrowed into data.  The keys' tuple is held until keyset_free, so a
 * key read in place outlives any Python code the call runs after (an
 * output's __index__ dropping the caller's last reference to it). */
static int
keyset_read(PyObject *keys, PyObject *ns_obj, keyset *k, const char *fname, const char *what, int in_place)
{
    memset(k, 0, sizeof(*k));
    /* tuples of their own: an item's __index__ may change the caller's lists */
    PyObject *seq = PySequence_Tuple(keys);
    if (seq == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Format(PyExc_TypeError, "%s must be a sequence of token sequences", what);
        }
        return -1;
    }
    k->seq = seq;    /* held until keyset_free: a key read in place lives as long */
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    k->n = (size_t)n;
    /* every per-key array in one zeroed block: the 8-byte ones first (the
     * views, pointers, lengths and offsets into data), then ns and have */
    const size_t m = (size_t)n + 1;
    const size_t views_b = in_place ? m * sizeof(Py_buffer) : 0, p64_b = in_place ? m * sizeof(int64_t *) : 0;
    size_t *at = NULL;   /* offsets into data */
    k->block = PyMem_Calloc(1, views_b + p64_b + m * (sizeof(int32_t *) + 2 * sizeof(size_t) + sizeof(int32_t))
                                   + (in_place ? m : 0));
    int ok = k->block != NULL;
    if (ok) {
        char *b = k->block;
        k->views = in_place ? (Py_buffer *)b : NULL;
        b += views_b;
        k->ptrs64 = in_place ? (const int64_t **)b : NULL;
        b += p64_b;
        k->ptrs = (const int32_t **)b;
        b += m * sizeof(int32_t *);
        k->lens = (size_t *)b;
        b += m * sizeof(size_t);
        at = (size_t *)b;
        b += m * sizeof(size_t);
        k->ns = (int32_t *)b;
        b += m * sizeof(int32_t);
        k->have = in_place ? (uint8_t *)b : NULL;
    }
    size_t total = 0;
    if (!ok) {
        PyErr_NoMemory();
    }
    mr_buf scratch = {0};
    /* the argument's name for errors: "<fname>(): keys[" once (at the
     * first key not read in place), the index written per key (no
     * formatting call per key) */
    char arg[96];
    int plen = -1;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, i);
        int have = 0;
        if (in_place && key64_view(key, &k->views[i], &have, &k->ptrs64[i], &k->lens[i])) {
            k->have[i] = (uint8_t)have;
            continue;
        }
        if (plen < 0) {
            plen = snprintf(arg, sizeof(arg), "%s(): %s[", fname, what);
            if (plen < 0 || plen > (int)sizeof(arg) - 24) {
                plen = 0;
            }
        }
        put_index(arg + plen, (size_t)i);
        size_t len = 0;
        ok = mr_ints_append_i32(key, arg, &scratch, &k->data, total, &len) == 0;
        if (!ok) {
            break;
        }
        k->lens[i] = len;
        at[i] = total;
        total += len;
    }
    mr_buf_free(&scratch);
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        if (k->ptrs64 == NULL || k->ptrs64[i] == NULL) {
            k->ptrs[i] = (const int32_t *)k->data.p + at[i];
        }
    }
    if (ok && ns_obj != NULL && ns_obj != Py_None) {
        PyObject *nseq = own_tuple(ns_obj, "ns must be a sequence of ints");
        if (nseq == NULL || PySequence_Fast_GET_SIZE(nseq) != n) {
            if (nseq != NULL) {
                PyErr_Format(PyExc_ValueError, "%s(): ns and keys differ in length", fname);
            }
            ok = 0;
        }
        for (Py_ssize_t i = 0; ok && i < n; i++) {
            int64_t v = 0;
            if (mr_as_int64(PySequence_Fast_GET_ITEM(nseq, i), 0, INT32_MAX, "ns[i]", &v) < 0) {
                ok = 0;
            }
            k->ns[i] = (int32_t)v;
        }
        Py_XDECREF(nseq);
    }
    if (!ok) {
        keyset_free(k);
        return -1;
    }
    return 0;
}

/* The core's view of a batch's keys, and of their outputs (o, or NULL). */
static mr_lc_batch_keys
batch_keys(const keyset *k, const keyset *o)
{
    mr_lc_batch_keys b = {k->ptrs, k->ptrs64, k->lens, NULL, NULL, NULL};
    if (o != NULL) {
        b.outs = o->ptrs;
        b.outs64 = o->ptrs64;
        b.olens = o->lens;
    }
    return b;
}

/* Words a refusal of a batch call's rows or keys that the core's checks
 * found (lc_check.h); rows: the call's rows, for the messages that show
 * one.  Returns -1. */
static int
batch_raise(LifecycleObject *self, const char *fname, const mr_lc_why *w, const int64_t *rows)
{
    long long at = (long long)w->at, other = (long long)w->other, v = (long long)w->value;
    const char *what = w->in_outputs ? "outputs" : "keys";
    switch (w->why) {
    case MR_LC_WHY_KEY_COUNT:
        PyErr_Format(PyExc_ValueError, "%s(): rows has %lld entries, %s %lld", fname, at, what, v);
        break;
    case MR_LC_WHY_ROW_FREE:
        PyErr_Format(lc_state(self)->OwnershipError,
                     "%s(): rows[%lld] = %lld is not a request row in use (finished twice?)", fname, at, v);
        break;
    case MR_LC_WHY_ROW_TWICE:
        PyErr_Format(PyExc_ValueError, "%s(): rows[%lld] = %lld is listed twice (also at rows[%lld])", fname, at, v,
                     other);
        break;
    case MR_LC_WHY_ROW_SHORT:
        PyErr_Format(PyExc_ValueError, "%s(): keys[%lld]%s has %lld tokens, fewer than the %lld that rows[%lld] = "
                     "%lld has committed", fname, at, w->in_outputs ? " with its outputs" : "", v, other, at,
                     (long long)rows[w->at]);
        break;
    case MR_LC_WHY_ROW_FULL:
        PyErr_Format(PyExc_ValueError, "%s(): rows[%lld] = %lld is full: its %lld tokens fill max_context_len",
                     fname, at, v, other);
        break;
    case MR_LC_WHY_KEY_LONG:
        PyErr_Format(PyExc_ValueError, "%s(): keys[%lld] has %lld tokens, more than max_context_len = %lld", fname,
                     at, v, other);
        break;
    default:   /* as the narrowing of a copied key names it */
        PyErr_Format(PyExc_ValueError, "%s(): %s[%lld][%lld] = %lld is out of range [%d, %d]", fname, what, at,
                     other, v, INT32_MIN, INT32_MAX);
        break;
    }
    return -1;
}

static PyObject *
new_u8(Py_ssize_t n)
{
    npy_intp dims[1] = {n};
    return PyArray_SimpleNew(1, dims, NPY_BOOL);
}


/* prefill_batch's result: a dict of the arrays a[0..7] under their names
 * (interned once), in this order.  NULL with an exception. */
static PyObject *
prefill_result(PyObject *const a[8])
{
    static const char *const text[8] = {"rows", "prefix_len", "cow_src", "cow_dst", "clear", "track_slot",
                                        "track_seqlen", "track_mask"};
    static PyObject *names[8];
    PyObject *d = PyDict_New();
    for (int j = 0; d != NULL && j < 8; j++) {
        if ((names[j] == NULL && (names[j] = PyUnicode_InternFromString(text[j])) == NULL)
            || PyDict_SetItem(d, names[j], a[j]) < 0) {
            Py_CLEAR(d);
        }
    }
    return d;
}

PyDoc_STRVAR(Lifecycle_prefill_batch__doc__,
"prefill_batch($self, keys, /, ns=None)\n"
"--\n"
"\n"
"Schedule a batch of new requests in one call: match (capped at len - 1,\n"
"copy-on-write), admission with state headroom, locks, KV for the extend\n"
"tokens written to each row, and the tracking decision.  Returns a dict of\n"
"int64 arrays: rows, prefix_len, cow_src, cow_dst, clear, track_slot,\n"
"track_seqlen (-1 = none) and the bool array track_mask.  None when rows,\n"
"state slots or KV are short even counting what eviction could free,\n"
"decided before anything is evicted: nothing admitted, nothing changed.\n"
"Keys are token sequences; C-contiguous int64 ones (array('q'), numpy) are\n"
"read in place.");

static PyObject *
Lifecycle_prefill_batch(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "prefill_batch", 1, 1, 1, "keys", "ns");
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0
        || need_pools(self, "prefill_batch") < 0) {
        return NULL;
    }
    keyset k;
    if (keyset_read(args[0], pa[1], &k, "prefill_batch", "keys", 1) < 0) {
        return NULL;
    }
    Py_ssize_t n = (Py_ssize_t)k.n;
    mr_lc_why why;
    if (mr_lc_keys_fit(k.lens, k.n, mr_pools_req_pool(self->rp_obj, lc_state(self))->max_ctx, &why)) {
        batch_raise(self, "prefill_batch", &why, NULL);
        keyset_free(&k);
        return NULL;
    }
    PyObject *a[8] = {NULL};
    PyObject *res = NULL;
    for (int j = 0; j < 7; j++) {
        a[j] = mr_i64_array(NULL, n);
    }
    a[7] = new_u8(n);
    for (int j = 0; j < 8; j++) {
        if (a[j] == NULL) {
            goto error;
        }
    }
    mr_lc_prefill_out out = {I64(a[0]), I64(a[1]), I64(a[2]), I64(a[3]), I64(a[4]), I64(a[5]),
                             (uint8_t *)PyArray_DATA((PyArrayObject *)a[7]), I64(a[6])};
    const mr_lc_batch_keys bk = batch_keys(&k, NULL);
    int rc = mr_lc_prefill_batch(self->lc, k.n, &bk, k.ns, &out);
    if (rc == MR_ENOSPC) {
        res = Py_NewRef(Py_None);
        goto error;
    }
    if (rc == MR_EINVAL && mr_lc_batch_bad_token(&bk, k.n, NULL, &why)) {
        batch_raise(self, "prefill_batch", &why, NULL);
        goto error;   /* an in-place key held a token outside int32 */
    }
    if (rc != MR_OK) {
        lc_raise_row(self, rc, "prefill_batch()", prefill_batch_overrides, 0);
        goto error;
    }
    res = prefill_result(a);
error:
    for (int j = 0; j < 8; j++) {
        Py_XDECREF(a[j]);
    }
    keyset_free(&k);
    return res;
}

/* The rows of a batch call (n of them), checked before the call with
 * messages that name the entry (mr_lc_batch_rows_check: each a row in use,
 * listed once; with keys, each key with its outputs at least its row's
 * committed length; a decode step's rows with room for one more token). */
static int
batch_rows_check(LifecycleObject *self, const char *fname, const int64_t *rows, Py_ssize_t n,
                 const mr_lc_batch_keys *keys, size_t nk, size_t no, int step)
{
    mr_reqpool *rp = mr_pools_req_pool(self->rp_obj, lc_state(self));
    mr_lc_why why;
    if (mr_lc_batch_rows_check(rp, rows, (size_t)n, keys, nk, no, step, &why)) {
        return batch_raise(self, fname, &why, rows);
    }
    return 0;
}

/* A cache batch call's arguments: its rows (an int64 array), keys (with
 * ns) and outputs (None: none), read and checked (batch_rows_check); the
 * caller hands them to batch_args_free. */
typedef struct {
    PyObject *rows;
    Py_ssize_t n;
    keyset k, o;
    mr_lc_batch_keys bk;
} batch_args;

static void
batch_args_free(batch_args *b)
{
    Py_CLEAR(b->rows);
    keyset_free(&b->k);
    keyset_free(&b->o);
}

static int
batch_args_read(LifecycleObject *self, const char *fname, PyObject *rows, PyObject *keys, PyObject *ns,
                PyObject *outputs, batch_args *b)
{
    memset(b, 0, sizeof(*b));
    const int outs = outputs != NULL && outputs != Py_None;
    b->rows = mr_ints_array(rows, "rows");
    if (b->rows == NULL || keyset_read(keys, ns, &b->k, fname, "keys", 1) < 0
        || (outs && keyset_read(outputs, NULL, &b->o, fname, "outputs", 1) < 0)) {
        batch_args_free(b);
        return -1;
    }
    b->n = PyArray_SIZE((PyArrayObject *)b->rows);
    b->bk = batch_keys(&b->k, outs ? &b->o : NULL);
    if (batch_rows_check(self, fname, I64(b->rows), b->n, &b->bk, b->k.n, b->o.n, 0) < 0) {
        batch_args_free(b);
        return -1;
    }
    return 0;
}

/* A cache batch call refused (rc): the in-place token that bad names, or
 * the refusal's own message (overrides).  Returns -1. */
static int
batch_refused(LifecycleObject *self, const char *fname, const batch_args *b, int rc, const int64_t *bad,
              const mr_status_override *overrides)
{
    char what[48];
    mr_lc_why why;
    if (bad[2] && bad[0] >= 0 && bad[0] < (int64_t)b->n && bad[1] >= 0) {
        /* an insert refused the KV index at table position bad[1] of rows[bad[0]] */
        int64_t row = I64(b->rows)[bad[0]];
        int64_t *val = PyMem_Malloc(((size_t)bad[1] + 1) * sizeof(int64_t));
        if (val == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        (void)mr_reqpool_read(mr_pools_req_pool(self->rp_obj, lc_state(self)), row, 0, bad[1] + 1, val);
        char who[48], subject[96];
        (void)snprintf(who, sizeof(who), "%s()", fname);
        (void)snprintf(subject, sizeof(subject), "rows[%lld] (row %lld): its table[%lld]", (long long)bad[0],
                       (long long)row, (long long)bad[1]);
        insert_raise(self, rc, who, subject, val, bad[1], -1);
        PyMem_Free(val);
        return -1;
    }
    if (rc == MR_EINVAL && mr_lc_batch_bad_token(&b->bk, b->k.n, bad, &why)) {
        return batch_raise(self, fname, &why, NULL);   /* an in-place key held a token outside int32 */
    }
    if (rc == MR_EINVAL && bad[0] >= 0 && bad[1] < 0 && bad[0] < (int64_t)b->n
        && ns_refused(self, fname, &mr_pools_req_pool(self->rp_obj, lc_state(self))->req[I64(b->rows)[bad[0]]],
                      b->k.ns != NULL ? b->k.ns[bad[0]] : 0, bad[0])) {
        return -1;
    }
    (void)snprintf(what, sizeof(what), "%s()", fname);
    mr_raise_detail(lc_state(self), rc, what, overrides, NULL, 0);
    return -1;
}

PyDoc_STRVAR(Lifecycle_unfinished_batch__doc__,
"unfinished_batch($self, rows, keys, /, ns=None, outputs=None)\n"
"--\n"
"\n"
"cache_unfinished_req for each row (end of prefill of requests that go on\n"
"decoding; keys: each request's tokens so far, or its origin tokens with\n"
"outputs: per row the output tokens that follow them, so that the caller\n"
"needs not join the two; the call reads up to the row's committed length).\n"
"Returns (fork_src,\n"
"fork_dst): the no_buffer state copies to run now (-1 = none).\n"
"C-contiguous int64 keys (array('q'), numpy) are read in place.  A key\n"
"must begin with the tokens its row was matched from: the insert starts at\n"
"the row's locked node and reads none of its locked prefix.  RuntimeError,\n"
"before any row changed, when the rows that cache (one state slot each)\n"
"need more slots than are free or can be evicted.");

static PyObject *
Lifecycle_unfinished_batch(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "unfinished_batch", 2, 2, 2, "rows", "keys", "ns", "outputs");
    batch_args b;
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0 || need_pools(self, "unfinished_batch") < 0
        || batch_args_read(self, "unfinished_batch", args[0], args[1], pa[2], pa[3], &b) < 0) {
        return NULL;
    }
    PyObject *fs = mr_i64_array(NULL, b.n), *fd = mr_i64_array(NULL, b.n), *res = NULL;
    if (fs == NULL || fd == NULL) {
        goto error;
    }
    int64_t bad[3];
    int rc = mr_lc_unfinished_batch(self->lc, b.k.n, I64(b.rows), &b.bk, b.k.ns, I64(fs), I64(fd), bad);
    if (rc != MR_OK) {
        batch_refused(self, "unfinished_batch", &b, rc, bad, unfinished_batch_overrides);
        goto error;
    }
    res = PyTuple_Pack(2, fs, fd);
error:
    Py_XDECREF(fs);
    Py_XDECREF(fd);
    batch_args_free(&b);
    return res;
}

PyDoc_STRVAR(Lifecycle_decode_batch__doc__,
"decode_batch($self, rows, /)\n"
"--\n"
"\n"
"One decode step for the rows: a KV token each (written to the table), the\n"
"track slot / mask for the forward and the boundary bookkeeping.  Returns\n"
"(track_slot, track_mask), or None when KV is short even counting what\n"
"eviction could free: decided before anything is evicted, nothing changed\n"
"(retract a request and step again).");

static PyObject *
Lifecycle_decode_batch(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MR_ARGS(spec, pa, "decode_batch", 1, 1, 1, "rows");
    if (mr_parse(&spec, args, nargs, NULL, pa) < 0 || need_pools(self, "decode_batch") < 0) {
        return NULL;
    }
    PyObject *rows = NULL, *ts = NULL, *tm = NULL, *res = NULL;
    if ((rows = mr_ints_array(args[0], "rows")) == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyArray_SIZE((PyArrayObject *)rows);
    if (batch_rows_check(self, "decode_batch", I64(rows), n, NULL, 0, 0, 1) < 0) {
        goto error;
    }
    ts = mr_i64_array(NULL, n);
    tm = new_u8(n);
    if (ts == NULL || tm == NULL) {
        goto error;
    }
    int rc = mr_lc_decode_batch(self->lc, (size_t)n, I64(rows), I64(ts), (uint8_t *)PyArray_DATA((PyArrayObject *)tm));
    if (rc == MR_ENOSPC) {
        res = Py_NewRef(Py_None);
        goto error;
    }
    if (rc != MR_OK) {
        lc_raise_row(self, rc, "decode_batch()", decode_batch_overrides, 0);
        goto error;
    }
    res = PyTuple_Pack(2, ts, tm);
error:
    Py_XDECREF(rows);
    Py_XDECREF(ts);
    Py_XDECREF(tm);
    return res;
}

PyDoc_STRVAR(Lifecycle_finish_batch__doc__,
"finish_batch($self, rows, keys, /, ns=None, is_insert=True, outputs=None)\n"
"--\n"
"\n"
"cache_finished_req for each row (keys: origin + output tokens, or the\n"
"origin tokens with outputs: per row its output tokens) and free the rows.\n"
"ValueError for a row that is not in use (finished twice).  Keys and\n"
"outputs are read as unfinished_batch reads them.");

static PyObject *
Lifecycle_finish_batch(LifecycleObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, pa, "finish_batch", 2, 2, 2, "rows", "keys", "ns", "is_insert", "outputs");
    int ins = 1;
    batch_args b;
    if (mr_parse(&spec, args, nargs, kwnames, pa) < 0 || need_pools(self, "finish_batch") < 0
        || mr_arg_bool(pa[3], "finish_batch", "is_insert", &ins) < 0
        || batch_args_read(self, "finish_batch", args[0], args[1], pa[2], pa[4], &b) < 0) {
        return NULL;
    }
    int64_t bad[3];
    int rc = mr_lc_finish_batch(self->lc, b.k.n, I64(b.rows), &b.bk, b.k.ns, ins, bad);
    if (rc != MR_OK) {
        batch_refused(self, "finish_batch", &b, rc, bad, lifecycle_overrides);
    }
    batch_args_free(&b);
    return rc != MR_OK ? NULL : Py_NewRef(Py_None);
}

/* ------------------------------------------------------------------------
 * Type */

static PyObject *
Lifecycle_get_attr(LifecycleObject *self, void *c)
{
    return mr_py_tree_attr(mr_lc_tree(self->lc), c);
}

static PyObject *
Lifecycle_get_has_pools(LifecycleObject *self, void *c)
{
    return PyBool_FromLong(self->rp_obj != NULL);
}

static PyObject *
Lifecycle_get_kv_free_ends(LifecycleObject *self, void *c)
{
    if (self->kv_ends == NULL) {
        return mr_i64_array(NULL, 0);
    }
    return Py_NewRef(self->kv_ends);
}

static PyMethodDef Lifecycle_methods[] = {
    {"match", (PyCFunction)(void (*)(void))Lifecycle_match, METH_FASTCALL | METH_KEYWORDS, Lifecycle_match__doc__},
    {"insert", (PyCFunction)(void (*)(void))Lifecycle_insert, METH_FASTCALL | METH_KEYWORDS, Lifecycle_insert__doc__},
    {"evict", (PyCFunction)(void (*)(void))Lifecycle_evict, METH_FASTCALL | METH_KEYWORDS, Lifecycle_evict__doc__},
    {"lock", (PyCFunction)(void (*)(void))Lifecycle_lock, METH_FASTCALL, Lifecycle_lock__doc__},
    {"unlock", (PyCFunction)(void (*)(void))Lifecycle_unlock, METH_FASTCALL, Lifecycle_unlock__doc__},
    {"node_info", (PyCFunction)(void (*)(void))Lifecycle_node_info, METH_FASTCALL, Lifecycle_node_info__doc__},
    {"node_key", (PyCFunction)(void (*)(void))Lifecycle_node_key, METH_FASTCALL, Lifecycle_node_key__doc__},
    {"node_children", (PyCFunction)(void (*)(void))Lifecycle_node_children, METH_FASTCALL, Lifecycle_node_children__doc__},
    {"lru", (PyCFunction)(void (*)(void))Lifecycle_lru, METH_FASTCALL, Lifecycle_lru__doc__},
    {"root", (PyCFunction)Lifecycle_root, METH_NOARGS, Lifecycle_root__doc__},
    {"sizes", (PyCFunction)Lifecycle_sizes, METH_NOARGS, Lifecycle_sizes__doc__},
    {"check", (PyCFunction)Lifecycle_check, METH_NOARGS, Lifecycle_check__doc__},
    {"reset", (PyCFunction)Lifecycle_reset, METH_NOARGS, Lifecycle_reset__doc__},
    {"tree_view", (PyCFunction)Lifecycle_tree_view, METH_NOARGS, Lifecycle_tree_view__doc__},
    MR_PY_NAMESPACE_METHODS(Lifecycle_namespace, Lifecycle_namespace_name),
    {"dump", (PyCFunction)Lifecycle_dump, METH_NOARGS, Lifecycle_dump__doc__},
    {"stats", (PyCFunction)Lifecycle_stats, METH_NOARGS, Lifecycle_stats__doc__},
    {"alloc_state", (PyCFunction)(void (*)(void))Lifecycle_alloc_state, METH_FASTCALL | METH_KEYWORDS, Lifecycle_alloc_state__doc__},
    {"admit", (PyCFunction)(void (*)(void))Lifecycle_admit, METH_FASTCALL | METH_KEYWORDS, Lifecycle_admit__doc__},
    {"prepare_extend", (PyCFunction)(void (*)(void))Lifecycle_prepare_extend, METH_FASTCALL, Lifecycle_prepare_extend__doc__},
    {"decode_prepare", (PyCFunction)(void (*)(void))Lifecycle_decode_prepare, METH_FASTCALL, Lifecycle_decode_prepare__doc__},
    {"decode_finish", (PyCFunction)(void (*)(void))Lifecycle_decode_finish, METH_FASTCALL, Lifecycle_decode_finish__doc__},
    {"unfinished_cache_len", (PyCFunction)(void (*)(void))Lifecycle_unfinished_cache_len, METH_FASTCALL,
     Lifecycle_unfinished_cache_len__doc__},
    {"cache_unfinished", (PyCFunction)(void (*)(void))Lifecycle_cache_unfinished, METH_FASTCALL | METH_KEYWORDS, Lifecycle_cache_unfinished__doc__},
    {"cache_finished", (PyCFunction)(void (*)(void))Lifecycle_cache_finished, METH_FASTCALL | METH_KEYWORDS, Lifecycle_cache_finished__doc__},
    {"cow", (PyCFunction)(void (*)(void))Lifecycle_cow, METH_FASTCALL, Lifecycle_cow__doc__},
    {"free_states", (PyCFunction)(void (*)(void))Lifecycle_free_states, METH_FASTCALL | METH_KEYWORDS, Lifecycle_free_states__doc__},
    {"prefill_batch", (PyCFunction)(void (*)(void))Lifecycle_prefill_batch, METH_FASTCALL | METH_KEYWORDS, Lifecycle_prefill_batch__doc__},
    {"unfinished_batch", (PyCFunction)(void (*)(void))Lifecycle_unfinished_batch, METH_FASTCALL | METH_KEYWORDS, Lifecycle_unfinished_batch__doc__},
    {"decode_batch", (PyCFunction)(void (*)(void))Lifecycle_decode_batch, METH_FASTCALL, Lifecycle_decode_batch__doc__},
    {"finish_batch", (PyCFunction)(void (*)(void))Lifecycle_finish_batch, METH_FASTCALL | METH_KEYWORDS, Lifecycle_finish_batch__doc__},
    {"take_kv", (PyCFunction)(void (*)(void))Lifecycle_take_kv, METH_FASTCALL | METH_KEYWORDS, Lifecycle_take_kv__doc__},
    {"take_admission", (PyCFunction)(void (*)(void))Lifecycle_take_admission, METH_FASTCALL, Lifecycle_take_admission__doc__},
    {"free_row", (PyCFunction)(void (*)(void))Lifecycle_free_row, METH_FASTCALL, Lifecycle_free_row__doc__},
    {"set_victims", (PyCFunction)Lifecycle_set_victims, METH_O, Lifecycle_set_victims__doc__},
    {"counts", (PyCFunction)Lifecycle_counts, METH_NOARGS, Lifecycle_counts__doc__},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Lifecycle_getset[] = {
    {"page_size", (getter)Lifecycle_get_attr, NULL, "KV page size.", "page_size"},
    {"chunk_size", (getter)Lifecycle_get_attr, NULL, "mamba_cache_chunk_size.", "chunk_size"},
    {"has_pools", (getter)Lifecycle_get_has_pools, NULL, "True when built over mambaradix's own pools.", NULL},
    {"kv_free", (getter)Lifecycle_get_count, NULL, "Counted pools: free KV tokens (None: not counted).",
     (void *)offsetof(mr_lc_counts, kv_free)},
    {"slots_free", (getter)Lifecycle_get_count, NULL, "Counted pools: free state slots.",
     (void *)offsetof(mr_lc_counts, slots_free)},
    {"rows_free", (getter)Lifecycle_get_count, NULL, "Counted pools: free request rows.",
     (void *)offsetof(mr_lc_counts, rows_free)},
    {"kv_free_ends", (getter)Lifecycle_get_kv_free_ends, NULL,
     "Tree-only: where each free call of the KV array the last call handed out ends (numpy int64,\n"
     "increasing, the last = its length): SGLang frees each evicted node's KV, and a finished\n"
     "request's tail before its duplicates, with calls of their own; a paged allocator puts each\n"
     "call's pages, sorted, at the head of its free list, so the caller makes the same calls.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(Lifecycle__doc__,
"Lifecycle(state_allocator=None, kv_allocator=None, req_pool=None, *, page_size=1,\n"
"          chunk_size=64, lru_policy='sglang', extra_buffer=False, lazy=False,\n"
"          track_buffer_size=2, track_interval=256, end_of_turn_states=False,\n"
"          policy_options=None, max_states_per_path=None, semantics='v0.5.15',\n"
"          values=True, counts=None)\n"
"--\n"
"\n"
"A prefix tree plus the request lifecycle over mambaradix's pools (or, with\n"
"no pools, a tree whose evictions are handed back for the caller to free).\n"
"lru_policy, policy_options and max_states_per_path as RadixTree's (the\n"
"budget is applied after every insertion that adds a state).\n"
"end_of_turn_states (extra_buffer): a finished request whose length is\n"
"whole pages leaves the state at its exact end in the tree (its running\n"
"slot, no copy) instead of the last track snapshot.\n"
"values=False (no pools): the tree keeps keys only, for a caller whose KV\n"
"pool is a count; the cache calls without pools take kv as the number of the\n"
"request's KV indices, and every KV index they hand out is 0 (only how\n"
"many counts).  counts=(kv_tokens, state_slots, rows) with values=False:\n"
"the pools are counts the Lifecycle keeps (take_kv, take_admission,\n"
"free_row, evict_node, counts()); every free goes back to them, and\n"
"cache_unfinished (fresh 0), admit (no fresh), cow and decode_prepare take\n"
"their slots from them.");

static PyType_Slot Lifecycle_slots[] = {
    {Py_tp_new, Lifecycle_new},
    {Py_tp_dealloc, Lifecycle_dealloc},
    {Py_tp_methods, Lifecycle_methods},
    {Py_tp_getset, Lifecycle_getset},
    {Py_tp_doc, (void *)Lifecycle__doc__},
    {0, NULL},
};

static PyType_Spec Lifecycle_spec = MR_TYPE_SPEC("mambaradix._C.Lifecycle", LifecycleObject, Lifecycle_slots, 0);

/* ------------------------------------------------------------------------
 * ReqState type */

static PyObject *
ReqState_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static mr_argspec spec = MR_ARGSPEC("ReqState", 0, 1, 0, "rs");
    PyObject *init;
    if (mr_parse_tuple(&spec, args, kwds, &init) < 0) {
        return NULL;
    }
    ReqStateObject *self = (ReqStateObject *)tp->tp_alloc(tp, 0);
    if (self == NULL) {
        return NULL;
    }
    mr_rec_init(&self->h);
    if (init != NULL && init != Py_None && tuple_to_req(init, &self->h.own) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
ReqState_dealloc(ReqStateObject *self)
{
    /* a record left in its row stays there (the row is freed later) */
    if (self->pool != NULL && !self->h.view) {
        PyObject **holders = mr_pools_req_holders(self->pool, mr_state_from_type(Py_TYPE(self)));
        if (holders != NULL && holders[self->h.row] == (PyObject *)self) {
            holders[self->h.row] = NULL;
        }
    }
    Py_CLEAR(self->pool);
    mr_type_free((PyObject *)self);
}

static PyObject *
ReqState_astuple(ReqStateObject *self, PyObject *unused)
{
    mr_req rec;
    return rs_get(self, "ReqState.astuple()", &rec) < 0 ? NULL : req_to_tuple(&rec);
}

static PyObject *
ReqState_reset(ReqStateObject *self, PyObject *unused)
{
    mr_req rec;
    if (rs_live(self, "ReqState.reset()") < 0) {
        return NULL;
    }
    mr_req_reset(&rec);
    mr_rec_put(&self->h, &rec);
    Py_RETURN_NONE;
}

static PyObject *
ReqState_get_row(ReqStateObject *self, void *c)
{
    if (rs_live(self, "ReqState.row") < 0) {
        return NULL;
    }
    return PyLong_FromLongLong((long long)self->h.row);   /* -1: in no row */
}

/* The track buffer's two int64 entries of a record that lives in this
 * object, as a writable buffer: a CPU tensor over it (torch.frombuffer) is
 * the ping-pong buffer of a request whose record is not in a row (SGLang's
 * own pools write into it in place).  A record in a row has the row of the
 * pool's track map as its buffer instead: BufferError. */
static int
ReqState_getbuffer(ReqStateObject *self, Py_buffer *view, int flags)
{
    if (self->pool != NULL) {
        PyErr_Format(PyExc_BufferError,
                     "ReqState: the record lives in request row %lld; its track buffer is that row of the "
                     "pool's track map",
                     (long long)self->h.row);
        view->obj = NULL;
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *)self, self->h.own.track, (Py_ssize_t)sizeof(self->h.own.track), 0,
                             flags);
}

static PyObject *
ReqState_get_field(ReqStateObject *self, void *c)
{
    const char *const *name = c;
    mr_req rec;
    if (rs_get(self, *name, &rec) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong((long long)mr_req_field(&rec, (int)(name - rs_names)));
}

static int
ReqState_set_field(ReqStateObject *self, PyObject *v, void *c)
{
    const char *const *name = c;
    int i = (int)(name - rs_names);
    if (v == NULL) {
        PyErr_Format(PyExc_AttributeError, "%s cannot be deleted", *name);
        return -1;
    }
    int64_t x = 0, lo = 0, hi = 0;
    mr_req rec;
    mr_req_field_range(i, &lo, &hi);
    /* the value first: its __index__ may change the record (parse_rs) */
    if (mr_as_int64(v, lo, hi, *name, &x) < 0 || rs_get(self, *name, &rec) < 0) {
        return -1;
    }
    mr_req_set_field(&rec, i, x);
    mr_rec_put(&self->h, &rec);
    return 0;
}

#define RS_GETSET(i, name, doc) \
    {name, (getter)ReqState_get_field, (setter)ReqState_set_field, doc, (void *)&rs_names[i]}

static PyGetSetDef ReqState_getset[] = {
    RS_GETSET(0, "running", "mamba_pool_idx (-1 = None)."),
    RS_GETSET(1, "track0", "mamba_ping_pong_track_buffer[0] (-1 = empty)."),
    RS_GETSET(2, "track1", "mamba_ping_pong_track_buffer[1] (-1 = empty)."),
    RS_GETSET(3, "next_track", "mamba_next_track_idx (-1 = None)."),
    RS_GETSET(4, "last_track_seqlen", "mamba_last_track_seqlen (-1 = None)."),
    RS_GETSET(5, "branching_seqlen", "mamba_branching_seqlen (-1 = None)."),
    RS_GETSET(6, "cow_src", "mamba_cow_src_index (-1 = None)."),
    RS_GETSET(7, "needs_clear", "mamba_needs_clear."),
    RS_GETSET(8, "lazy_is_insert", "mamba_lazy_is_insert."),
    RS_GETSET(9, "protected_len", "cache_protected_len."),
    RS_GETSET(10, "node_id", "last_node's id (-1 = None)."),
    RS_GETSET(11, "node_gen", "last_node's generation."),
    RS_GETSET(12, "locked", "last_node holds a lock of this request."),
    {"row", (getter)ReqState_get_row, NULL,
     "The ReqPool row the record lives in (-1: it lives in this object, not admitted or done).  ReferenceError "
     "when that row was freed behind this handle's back.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef ReqState_methods[] = {
    {"astuple", (PyCFunction)ReqState_astuple, METH_NOARGS, "The record as the 13-tuple the calls also accept."},
    {"reset", (PyCFunction)ReqState_reset, METH_NOARGS, "Every field None / 0 (lazy_is_insert 1)."},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(ReqState__doc__,
"ReqState(rs=None)\n"
"--\n"
"\n"
"One request's cache-side record (running slot, ping-pong track buffer,\n"
"tracked and branching lengths, copy-on-write source, lock): the C struct\n"
"the Lifecycle's per-request calls read and update in place.  It lives in\n"
"this object until Lifecycle.admit gives the request a row, then in that\n"
"ReqPool row (`row`), until the row is freed or the request finished\n"
"(cache_finished): then it is this object's again.  rs: a 13-tuple to\n"
"start from.  Its buffer is the two track entries (int64) while the record\n"
"is not in a row.");

static PyType_Slot ReqState_slots[] = {
    {Py_tp_new, ReqState_new},
    {Py_tp_dealloc, ReqState_dealloc},
    {Py_tp_getset, ReqState_getset},
    {Py_tp_methods, ReqState_methods},
    {Py_bf_getbuffer, ReqState_getbuffer},
    {Py_tp_doc, (void *)ReqState__doc__},
    {0, NULL},
};

static PyType_Spec ReqState_spec = MR_TYPE_SPEC("mambaradix._C.ReqState", ReqStateObject, ReqState_slots, 0);

static PyStructSequence_Field UnfinishedResult_fields[] = {
    {"rs", "the request's record"},
    {"prefix_indices", "the request's KV indices, the tree's for its new protected prefix (None: not built)"},
    {"fork_src", "no_buffer: the state copy to do now, from (-1: none)"},
    {"fork_dst", "to"},
    {"kv_to_free", "KV indices the caller's allocator frees, in the calls kv_free_ends gives (numpy int64)"},
    {"slots_to_free", "state slots the caller's allocator frees, in one call (numpy int64)"},
    {"table_end", "the caller's table differs from prefix_indices on [old protected_len, table_end)"},
    {"cache_len", "tokens the call inserted into the tree (0: none; attribute only, not unpacked)"},
    {"kv_free_ends", "where each free call of kv_to_free ends (attribute only)"},
    {NULL, NULL},
};
static PyStructSequence_Desc UnfinishedResult_desc = {
    "mambaradix._C.UnfinishedResult", "Result of Lifecycle.cache_unfinished without pools.", UnfinishedResult_fields, 7};

static PyStructSequence_Field FinishedResult_fields[] = {
    {"rs", "the request's record"},
    {"kv_to_free", "KV indices the caller's allocator frees, in the calls kv_free_ends gives (numpy int64)"},
    {"slots_to_free", "state slots the caller's allocator frees, in one call (numpy int64)"},
    {"cache_len", "tokens the call inserted into the tree (0: none; attribute only, not unpacked)"},
    {"kv_free_ends", "where each free call of kv_to_free ends (attribute only)"},
    {NULL, NULL},
};
static PyStructSequence_Desc FinishedResult_desc = {
    "mambaradix._C.FinishedResult", "Result of Lifecycle.cache_finished without pools.", FinishedResult_fields, 3};

int
mr_py_lifecycle_init(PyObject *m, mr_state *st)
{
    if (mr_add_type(m, &st->Lifecycle, PyType_FromModuleAndSpec(m, &Lifecycle_spec, NULL)) < 0
        || mr_add_type(m, &st->ReqState, PyType_FromModuleAndSpec(m, &ReqState_spec, NULL)) < 0
        || mr_add_type(m, &st->UnfinishedResult, (PyObject *)PyStructSequence_NewType(&UnfinishedResult_desc)) < 0
        || mr_add_type(m, &st->FinishedResult, (PyObject *)PyStructSequence_NewType(&FinishedResult_desc)) < 0) {
        return -1;
    }
    return 0;
}
