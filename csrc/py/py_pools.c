/* py_pools.c - Python types of the pools: SlotAllocator (state slots, KV
 * tokens or KV pages), ReqPool (request rows, the req-to-token table and
 * the state maps) and, in py_lifecycle.c, the Lifecycle.
 *
 * Index arguments are anything numpy turns into a 1-D int64 array (lists,
 * numpy arrays, CPU torch tensors); index results are numpy int64 arrays.
 * The tables are exposed as zero-copy numpy views that keep their pool
 * alive. */
#include "py_common.h"
#include "py_numpy.h"
#include "py_pools.h"
#include "py_ints.h"

#include <stddef.h>
#include <string.h>

#include "structmember.h"

/* ------------------------------------------------------------------------
 * Shared helpers */

/* A failed free/transfer of unit `bad` (py_status.h: what, unit, bad). */
static const mr_status_override owner_overrides[] = {
    {MR_EINVAL, MR_EXC_VALUE, "%s: %s %lld is out of range or listed twice"},
    {MR_ENOENT, MR_EXC_OWNERSHIP, "%s: %s %lld is already free (double free)"},
    {MR_EBUSY, MR_EXC_OWNERSHIP,
     "%s: %s %lld is not owned by the caller (owned by the prefix tree or a request, or held by the open "
     "alloc group)"},
    MR_STATUS_END(NULL),
};

/* ------------------------------------------------------------------------
 * SlotAllocator */

typedef struct {
    PyObject_HEAD
    mr_kv kv;
} SlotAllocatorObject;

mr_kv *
mr_pools_slot_allocator_kv(PyObject *obj, mr_state *st)
{
    SlotAllocatorObject *o = (SlotAllocatorObject *)mr_instance(obj, st->SlotAllocator);
    return o != NULL ? &o->kv : NULL;
}

static PyObject *
SlotAllocator_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    MR_ARGS(spec, a, "SlotAllocator", 0, 2, 1, "size", "page_size");
    int64_t size = 0, page_size = 1;
    /* a pool of no unit could never hand one out */
    if (mr_parse_tuple(&spec, args, kwds, a) < 0
        || mr_arg_int64(a[0], "SlotAllocator", "size", 1, INT64_MAX, &size) < 0
        || mr_arg_int64(a[1], "SlotAllocator", "page_size", 1, INT64_MAX, &page_size) < 0) {
        return NULL;
    }
    SlotAllocatorObject *self = (SlotAllocatorObject *)tp->tp_alloc(tp, 0);
    if (self == NULL) {
        return NULL;
    }
    int rc = mr_kv_init(&self->kv, size, page_size);
    if (rc != MR_OK) {
        Py_DECREF(self);
    }
    if (rc == MR_EINVAL) {   /* with size and page_size >= 1: too many units */
        PyErr_Format(PyExc_ValueError, "SlotAllocator(): %lld units (size / page_size) exceed %lld: slot and KV "
                     "indices are int32", (long long)(size / page_size), (long long)MR_SLOTS_MAX);
        return NULL;
    }
    if (rc != MR_OK) {
        return mr_raise(mr_state_from_type(tp), rc, "SlotAllocator()");
    }
    return (PyObject *)self;
}

static void
SlotAllocator_dealloc(SlotAllocatorObject *self)
{
    mr_kv_destroy(&self->kv);
    mr_type_free((PyObject *)self);
}

PyDoc_STRVAR(SlotAllocator_alloc__doc__,
"alloc($self, n, /, owner=None)\n"
"--\n"
"\n"
"Take n units (tokens; whole pages when page_size > 1) from the front of\n"
"the free list.  Returns an int64 array, or None when fewer are free\n"
"(nothing is taken).  owner: None (held by the caller) or a request row\n"
">= 1 the units are attributed to.");

static PyObject *
SlotAllocator_alloc(SlotAllocatorObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "alloc", 1, 2, 1, "n", "owner");
    mr_state *st = mr_state_from_type(Py_TYPE(self));
    int64_t n = 0, owner = MR_OWNER_HELD;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || mr_as_int64(a[0], 0, INT64_MAX / 2, "alloc(): n", &n) < 0) {
        return NULL;
    }
    PyObject *o = a[1];
    if (o != NULL && o != Py_None && mr_as_int64(o, 1, INT32_MAX, "alloc(): owner", &owner) < 0) {
        return NULL;
    }
    int rc = mr_kv_alloc_check(&self->kv, n);
    if (rc == MR_EINVAL) {
        PyErr_Format(PyExc_ValueError, "alloc(): n=%lld is not a multiple of page_size=%lld",
                     (long long)n, (long long)self->kv.page_size);
        return NULL;
    }
    if (rc == MR_ENOSPC) {
        Py_RETURN_NONE;
    }
    PyObject *out = mr_i64_array(NULL, (npy_intp)n);
    if (out == NULL) {
        return NULL;
    }
    rc = mr_kv_alloc(&self->kv, n, (int32_t)owner, (int64_t *)PyArray_DATA((PyArrayObject *)out));
    if (rc == MR_ENOSPC) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    if (rc != MR_OK) {
        Py_DECREF(out);
        return mr_raise(st, rc, "alloc()");
    }
    return out;
}

/* Raises the refusal of a free / transfer / release_tree of idx[0:k) as
 * the core explains it (mr_kv_explain): the entry it stopped at and why. */
static PyObject *
move_refused(mr_state *st, const mr_kv *kv, int rc, const char *fname, int is_free, const int64_t *idx, int64_t k,
             int64_t bad)
{
    mr_kv_refusal r;
    mr_kv_explain(kv, rc, idx, k, bad, &r);
    long long i = (long long)r.at, v = (long long)r.value;
    char unit[48] = "";
    if (r.page >= 0) {
        (void)snprintf(unit, sizeof(unit), " (page %lld)", (long long)r.page);
    }
    PyObject *own = st->OwnershipError;
    switch (r.why) {
    case MR_KV_WHY_TWICE:
        return PyErr_Format(PyExc_ValueError, "%s(): indices[%lld] = %lld is listed twice (also at indices[%lld])",
                            fname, i, v, (long long)r.first);
    case MR_KV_WHY_RANGE:
        return PyErr_Format(PyExc_ValueError, "%s(): indices[%lld] = %lld is out of range [%lld, %lld)", fname, i,
                            v, (long long)r.lo, (long long)r.hi);
    case MR_KV_WHY_FREE:
    case MR_KV_WHY_PENDING:
        return PyErr_Format(own, "%s(): indices[%lld] = %lld%s is not allocated (%s%s)", fname, i, v, unit,
                            r.why == MR_KV_WHY_PENDING ? "freed in the open free group" : "already free",
                            is_free ? ": a double free" : "");
    case MR_KV_WHY_TREE:
        return PyErr_Format(own, "%s(): indices[%lld] = %lld%s is not owned by the caller: the prefix tree "
                            "holds it", fname, i, v, unit);
    case MR_KV_WHY_ALLOC_GROUP:
        return PyErr_Format(own, "%s(): indices[%lld] = %lld%s is not owned by the caller: the open alloc "
                            "group holds it (not handed out yet)", fname, i, v, unit);
    case MR_KV_WHY_ROW:
        return PyErr_Format(own, "%s(): indices[%lld] = %lld%s is not the prefix tree's: request row %d "
                            "owns it", fname, i, v, unit, (int)r.owner);
    case MR_KV_WHY_HELD:
        return PyErr_Format(own, "%s(): indices[%lld] = %lld%s is not the prefix tree's: a caller holds it",
                            fname, i, v, unit);
    default:
        return mr_raise(st, rc, fname);
    }
}

/* free / transfer share the argument handling */
static PyObject *
slot_move(SlotAllocatorObject *self, PyObject *idx_obj, mr_from from, int32_t to, int is_free,
          const char *fname)
{
    mr_state *st = mr_state_from_type(Py_TYPE(self));
    char what[64];
    (void)snprintf(what, sizeof(what), "%s(): indices", fname);
    PyObject *arr = mr_ints_array(idx_obj, what);
    if (arr == NULL) {
        return NULL;
    }
    int64_t bad = -1;
    const int64_t *p = (const int64_t *)PyArray_DATA((PyArrayObject *)arr);
    int64_t k = (int64_t)PyArray_SIZE((PyArrayObject *)arr);
    int rc = is_free ? mr_kv_free(&self->kv, p, k, from, &bad)
                     : mr_kv_transfer(&self->kv, p, k, from, to, &bad);
    if (rc != MR_OK) {
        move_refused(st, &self->kv, rc, fname, is_free, p, k, bad);
        Py_DECREF(arr);
        return NULL;
    }
    Py_DECREF(arr);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(SlotAllocator_free__doc__,
"free($self, indices, /)\n"
"--\n"
"\n"
"Return a caller's units (tokens; their pages when page_size > 1).\n"
"OwnershipError for a unit that is already free (double free) or that the\n"
"prefix tree owns; ValueError for an index out of range.  Nothing is freed\n"
"when any index is bad.");

static PyObject *
SlotAllocator_free(SlotAllocatorObject *self, PyObject *idx)
{
    return slot_move(self, idx, MR_FROM_CALLER, 0, 1, "free");
}

PyDoc_STRVAR(SlotAllocator_release_tree__doc__,
"release_tree($self, indices, /)\n"
"--\n"
"\n"
"Return units the prefix tree released (eviction).  OwnershipError for a\n"
"unit the tree does not own.");

static PyObject *
SlotAllocator_release_tree(SlotAllocatorObject *self, PyObject *idx)
{
    return slot_move(self, idx, MR_FROM_TREE, 0, 1, "release_tree");
}

PyDoc_STRVAR(SlotAllocator_transfer__doc__,
"transfer($self, indices, to, /)\n"
"--\n"
"\n"
"Hand a caller's units to a new owner: \"tree\", \"held\" or a request row\n"
"(int >= 1).  Units the new owner already has are left alone.");

static PyObject *
SlotAllocator_transfer(SlotAllocatorObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MR_ARGS(spec, parsed, "transfer", 2, 2, 2, "indices", "to");
    if (mr_parse(&spec, args, nargs, NULL, parsed) < 0) {
        return NULL;
    }
    int64_t to = 0;
    if (PyUnicode_Check(args[1])) {
        if (PyUnicode_CompareWithASCIIString(args[1], "tree") == 0) {
            to = MR_OWNER_TREE;
        }
        else if (PyUnicode_CompareWithASCIIString(args[1], "held") == 0) {
            to = MR_OWNER_HELD;
        }
        else {
            PyErr_SetString(PyExc_ValueError, "transfer(): to must be \"tree\", \"held\" or a row >= 1");
            return NULL;
        }
    }
    else if (mr_as_int64(args[1], 1, INT32_MAX, "transfer(): to", &to) < 0) {
        return NULL;
    }
    return slot_move(self, args[0], MR_FROM_CALLER, (int32_t)to, 0, "transfer");
}

PyDoc_STRVAR(SlotAllocator_available_size__doc__,
"available_size($self, /)\n"
"--\n"
"\n"
"Free tokens (free pages times page_size).");

static PyObject *
SlotAllocator_available_size(SlotAllocatorObject *self, PyObject *unused)
{
    return PyLong_FromLongLong(mr_kv_available(&self->kv));
}

PyDoc_STRVAR(SlotAllocator_owner__doc__,
"owner($self, index, /)\n"
"--\n"
"\n"
"Owner of the unit holding token/slot index: \"free\", \"tree\", \"held\",\n"
"\"reserved\", \"pending\" (freed inside the open free group) or the\n"
"request row (int).");

static PyObject *
SlotAllocator_owner(SlotAllocatorObject *self, PyObject *arg)
{
    int64_t i = 0;
    if (mr_as_int64(arg, 0, INT64_MAX, "owner(): index", &i) < 0) {
        return NULL;
    }
    int32_t o = 0;
    if (mr_slots_owner(&self->kv.pages, i / self->kv.page_size, &o) != MR_OK) {
        PyErr_Format(PyExc_ValueError, "owner(): index %lld is out of range", (long long)i);
        return NULL;
    }
    const char *name = mr_owner_name(o);
    return name != NULL ? PyUnicode_FromString(name) : PyLong_FromLong(o);
}

PyDoc_STRVAR(SlotAllocator_counts__doc__,
"counts($self, /)\n"
"--\n"
"\n"
"Units (pages) per owner class: dict(free=, held=, req=, tree=, pending=,\n"
"total=).");

static PyObject *
SlotAllocator_counts(SlotAllocatorObject *self, PyObject *unused)
{
    const mr_slots *s = &self->kv.pages;
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:L}", "free", (long long)s->count, "held",
                         (long long)s->n_held, "req", (long long)s->n_req, "tree",
                         (long long)s->n_tree, "pending", (long long)s->n_pending, "total", (long long)s->n);
}

PyDoc_STRVAR(SlotAllocator_check__doc__,
"check($self, /)\n"
"--\n"
"\n"
"Verify free + held + request-owned + tree-owned == total and that the\n"
"free list holds exactly the free units; InvariantError otherwise.");

static PyObject *
SlotAllocator_check(SlotAllocatorObject *self, PyObject *unused)
{
    char msg[256];
    if (mr_slots_check(&self->kv.pages, msg, sizeof(msg)) != MR_OK) {
        return mr_raise(mr_state_from_type(Py_TYPE(self)), MR_ECORRUPT, msg);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(SlotAllocator_clear__doc__,
"clear($self, /)\n"
"--\n"
"\n"
"Make every unit free again, in order 1..n (owners are forgotten).");

static PyObject *
SlotAllocator_clear(SlotAllocatorObject *self, PyObject *unused)
{
    mr_slots_clear(&self->kv.pages);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(SlotAllocator_group_begin__doc__,
"alloc_group_begin($self, n, /)\n"
"--\n"
"\n"
"Pre-allocate n units (if n are free) that the following alloc(1) calls\n"
"hand out in order; alloc_group_end() returns the unused ones.");

static PyObject *
SlotAllocator_group_begin(SlotAllocatorObject *self, PyObject *arg)
{
    int64_t n = 0;
    if (mr_as_int64(arg, 0, INT64_MAX, "alloc_group_begin(): n", &n) < 0) {
        return NULL;
    }
    mr_slots_group_begin(&self->kv.pages, n);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(SlotAllocator_group_end__doc__,
"alloc_group_end($self, /)\n"
"--\n"
"\n"
"Return the unused units of the current alloc group.");

static PyObject *
SlotAllocator_group_end(SlotAllocatorObject *self, PyObject *unused)
{
    mr_slots_group_end(&self->kv.pages);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(SlotAllocator_free_group_begin__doc__,
"free_group_begin($self, /)\n"
"--\n"
"\n"
"Open a free group (SGLang's free_group_begin): until free_group_end(),\n"
"free() checks the units at once (a double free raises then) and sets them\n"
"aside; they rejoin the free list at the group's end.  Frees by the prefix\n"
"tree are not deferred.  Called while a group is open, it keeps that\n"
"group open with its pending frees (SGLang's allocator loses them there,\n"
"a leak this one does not copy).");

static PyObject *
SlotAllocator_free_group_begin(SlotAllocatorObject *self, PyObject *unused)
{
    int rc = mr_kv_free_group_begin(&self->kv);
    if (rc != MR_OK) {
        return mr_raise(mr_state_from_type(Py_TYPE(self)), rc, "free_group_begin()");
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(SlotAllocator_free_group_end__doc__,
"free_group_end($self, /)\n"
"--\n"
"\n"
"Close the free group: the units freed in it join the free list, in the\n"
"order they were freed (page_size > 1: sorted, at the front).  RuntimeError\n"
"when no group is open.");

static PyObject *
SlotAllocator_free_group_end(SlotAllocatorObject *self, PyObject *unused)
{
    if (mr_kv_free_group_end(&self->kv) != MR_OK) {
        PyErr_SetString(PyExc_RuntimeError,
                        "free_group_end(): no free group is open (free_group_begin() was not called)");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
SlotAllocator_in_free_group(SlotAllocatorObject *self, void *c)
{
    return PyBool_FromLong(self->kv.pages.free_group);
}

static PyObject *
SlotAllocator_get_size(SlotAllocatorObject *self, void *c)
{
    return PyLong_FromLongLong(self->kv.pages.n * self->kv.page_size);
}

static PyMethodDef SlotAllocator_methods[] = {
    {"alloc", (PyCFunction)(void (*)(void))SlotAllocator_alloc, METH_FASTCALL | METH_KEYWORDS, SlotAllocator_alloc__doc__},
    {"free", (PyCFunction)SlotAllocator_free, METH_O, SlotAllocator_free__doc__},
    {"release_tree", (PyCFunction)SlotAllocator_release_tree, METH_O, SlotAllocator_release_tree__doc__},
    {"transfer", (PyCFunction)(void (*)(void))SlotAllocator_transfer, METH_FASTCALL, SlotAllocator_transfer__doc__},
    {"available_size", (PyCFunction)SlotAllocator_available_size, METH_NOARGS, SlotAllocator_available_size__doc__},
    {"owner", (PyCFunction)SlotAllocator_owner, METH_O, SlotAllocator_owner__doc__},
    {"counts", (PyCFunction)SlotAllocator_counts, METH_NOARGS, SlotAllocator_counts__doc__},
    {"check", (PyCFunction)SlotAllocator_check, METH_NOARGS, SlotAllocator_check__doc__},
    {"clear", (PyCFunction)SlotAllocator_clear, METH_NOARGS, SlotAllocator_clear__doc__},
    {"alloc_group_begin", (PyCFunction)SlotAllocator_group_begin, METH_O, SlotAllocator_group_begin__doc__},
    {"alloc_group_end", (PyCFunction)SlotAllocator_group_end, METH_NOARGS, SlotAllocator_group_end__doc__},
    {"free_group_begin", (PyCFunction)SlotAllocator_free_group_begin, METH_NOARGS,
     SlotAllocator_free_group_begin__doc__},
    {"free_group_end", (PyCFunction)SlotAllocator_free_group_end, METH_NOARGS, SlotAllocator_free_group_end__doc__},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SlotAllocator_getset[] = {
    {"size", (getter)SlotAllocator_get_size, NULL, "Units (tokens) managed, slot 0 / page 0 excluded.", NULL},
    {"in_free_group", (getter)SlotAllocator_in_free_group, NULL, "True while a free group is open.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef SlotAllocator_members[] = {
    {"page_size", T_LONGLONG, offsetof(SlotAllocatorObject, kv.page_size), READONLY, "Tokens per page."},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(SlotAllocator__doc__,
"SlotAllocator(size, page_size=1)\n"
"--\n"
"\n"
"A FIFO allocator of units 1..size (unit 0 is reserved) that records the\n"
"owner of every unit: free, held by a caller, owned by a request row, or\n"
"owned by the prefix tree.  With page_size > 1 it hands out whole pages of\n"
"tokens (token t is in page t // page_size) and size counts tokens.");

static PyType_Slot SlotAllocator_slots[] = {
    {Py_tp_new, SlotAllocator_new},
    {Py_tp_dealloc, SlotAllocator_dealloc},
    {Py_tp_methods, SlotAllocator_methods},
    {Py_tp_getset, SlotAllocator_getset},
    {Py_tp_members, SlotAllocator_members},
    {Py_tp_doc, (void *)SlotAllocator__doc__},
    {0, NULL},
};

static PyType_Spec SlotAllocator_spec = MR_TYPE_SPEC("mambaradix._C.SlotAllocator", SlotAllocatorObject,
                                                     SlotAllocator_slots, 0);

/* ------------------------------------------------------------------------
 * ReqPool */

typedef struct {
    PyObject_HEAD
    mr_reqpool pool;
    PyObject **holders;    /* per row: the ReqState whose record it holds (borrowed) */
} ReqPoolObject;

mr_reqpool *
mr_pools_req_pool(PyObject *obj, mr_state *st)
{
    ReqPoolObject *o = (ReqPoolObject *)mr_instance(obj, st->ReqPool);
    return o != NULL ? &o->pool : NULL;
}

PyObject **
mr_pools_req_holders(PyObject *obj, mr_state *st)
{
    ReqPoolObject *o = (ReqPoolObject *)mr_instance(obj, st->ReqPool);
    return o != NULL ? o->holders : NULL;
}

/* Row r is freed: its holder (if any) takes the record back. */
static int
free_row(ReqPoolObject *self, int64_t r)
{
    uint32_t gen = mr_reqpool_gen(&self->pool, r);
    mr_req rec;
    int rc = mr_reqpool_free_record(&self->pool, r, &rec);
    if (rc == MR_OK && self->holders[r] != NULL) {
        PyObject *h = self->holders[r];
        self->holders[r] = NULL;
        mr_py_req_state_take_back(h, gen, &rec);
    }
    return rc;
}

static PyObject *
ReqPool_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    MR_ARGS(spec, a, "ReqPool", 0, 3, 2, "size", "max_context_len", "track_buffer_size");
    int64_t size = 0, max_ctx = 0, pp = 2;
    /* a pool of no request row could never admit one */
    if (mr_parse_tuple(&spec, args, kwds, a) < 0 || mr_arg_int64(a[0], "ReqPool", "size", 1, MR_SLOTS_MAX, &size) < 0
        || mr_arg_int64(a[1], "ReqPool", "max_context_len", 1, INT64_MAX, &max_ctx) < 0
        || mr_arg_int64(a[2], "ReqPool", "track_buffer_size", 1, 2, &pp) < 0) {
        return NULL;
    }
    ReqPoolObject *self = (ReqPoolObject *)tp->tp_alloc(tp, 0);
    if (self == NULL) {
        return NULL;
    }
    int rc = mr_reqpool_init(&self->pool, size, max_ctx, (int32_t)pp);
    if (rc != MR_OK) {
        Py_DECREF(self);
    }
    if (rc == MR_EINVAL) {   /* with the arguments in their ranges: the table is too large */
        PyErr_Format(PyExc_ValueError, "ReqPool(): the table of (size + 1) x max_context_len = %lld x %lld int32 "
                     "entries exceeds the address space", (long long)(size + 1), (long long)max_ctx);
        return NULL;
    }
    if (rc != MR_OK) {
        return mr_raise(mr_state_from_type(tp), rc, "ReqPool()");
    }
    self->holders = PyMem_Calloc((size_t)size + 1, sizeof(PyObject *));
    if (self->holders == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void
ReqPool_dealloc(ReqPoolObject *self)
{
    /* every holder keeps a reference to the pool: none is left */
    PyMem_Free(self->holders);
    mr_reqpool_destroy(&self->pool);
    mr_type_free((PyObject *)self);
}

/* The getter of the table (closure "t"), state_map ("s") or track_map
 * ("k"): a numpy view of the pool's memory that keeps the pool alive. */
static PyObject *
ReqPool_get_view(ReqPoolObject *self, void *closure)
{
    const mr_reqpool *p = &self->pool;
    char which = *(const char *)closure;
    npy_intp dims[2] = {(npy_intp)p->size + 1, which == 't' ? (npy_intp)p->max_ctx : (npy_intp)p->pp};
    void *data = which == 't' ? (void *)p->table : which == 's' ? (void *)p->state_map : (void *)p->track_map;
    PyObject *arr = PyArray_SimpleNewFromData(which == 's' ? 1 : 2, dims, which == 'k' ? NPY_INT64 : NPY_INT32,
                                              data);
    if (arr != NULL && PyArray_SetBaseObject((PyArrayObject *)arr, Py_NewRef(self)) < 0) {
        Py_CLEAR(arr);
    }
    return arr;
}

PyDoc_STRVAR(ReqPool_alloc__doc__,
"alloc($self, n, /)\n"
"--\n"
"\n"
"Take n request rows (FIFO).  Returns an int64 array, or None when fewer\n"
"are free (none taken).");

static PyObject *
ReqPool_alloc(ReqPoolObject *self, PyObject *arg)
{
    int64_t n = 0;
    if (mr_as_int64(arg, 0, INT64_MAX / 2, "alloc(): n", &n) < 0) {
        return NULL;
    }
    if (n > mr_slots_available(&self->pool.rows)) {
        Py_RETURN_NONE;
    }
    PyObject *out = mr_i64_array(NULL, (npy_intp)n);
    if (out == NULL) {
        return NULL;
    }
    int rc = mr_reqpool_alloc(&self->pool, n, (int64_t *)PyArray_DATA((PyArrayObject *)out));
    if (rc != MR_OK) {
        Py_DECREF(out);
        return mr_raise(mr_state_from_type(Py_TYPE(self)), rc, "alloc()");
    }
    return out;
}

PyDoc_STRVAR(ReqPool_free__doc__,
"free($self, row, /)\n"
"--\n"
"\n"
"Return request row `row`.  A request record that moved into the row at\n"
"admission moves back into its ReqState.  ValueError when it is out of\n"
"range, OwnershipError when it is already free.");

static PyObject *
ReqPool_free(ReqPoolObject *self, PyObject *arg)
{
    mr_state *st = mr_state_from_type(Py_TYPE(self));
    int64_t r = 0;
    if (mr_as_int64(arg, 1, self->pool.size, "free(): row", &r) < 0) {
        return NULL;
    }
    int rc = free_row(self, r);
    if (rc != MR_OK) {
        return mr_raise_detail(st, rc, "free(): row", owner_overrides, "request row", r);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ReqPool_record__doc__,
"record($self, row, /)\n"
"--\n"
"\n"
"A ReqState over row `row`'s request record (the record a request moved in\n"
"at admission; a reset one otherwise).  It reads and writes the row while\n"
"the row stays allocated; after the row is freed, any use raises\n"
"ReferenceError.  ValueError when the row is not allocated.");

static PyObject *
ReqPool_record(ReqPoolObject *self, PyObject *arg)
{
    int64_t r = 0;
    if (mr_as_int64(arg, 1, self->pool.size, "record(): row", &r) == 0 && !mr_reqpool_in_use(&self->pool, r)) {
        PyErr_Format(PyExc_ValueError, "record(): request row %lld is not allocated", (long long)r);
    }
    return PyErr_Occurred() ? NULL
                            : mr_py_req_state_view((PyObject *)self, &self->pool, r, mr_state_from_type(Py_TYPE(self)));
}

PyDoc_STRVAR(ReqPool_in_use__doc__,
"in_use($self, row, /)\n"
"--\n"
"\n"
"True when request row `row` is allocated.");

static PyObject *
ReqPool_in_use(ReqPoolObject *self, PyObject *arg)
{
    int64_t r = 0;
    if (mr_as_int64(arg, INT64_MIN, INT64_MAX, "in_use(): row", &r) < 0) {
        return NULL;
    }
    return PyBool_FromLong(mr_reqpool_in_use(&self->pool, r));
}

PyDoc_STRVAR(ReqPool_write__doc__,
"write($self, row, start, values, /)\n"
"--\n"
"\n"
"Write KV indices `values` into row `row` from column `start` and record\n"
"the range as changed for the device mirror.  ValueError when the range\n"
"leaves the table or a value does not fit int32.");

static PyObject *
ReqPool_write(ReqPoolObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t r = 0, start = 0;
    MR_ARGS(spec, parsed, "write", 3, 3, 3, "row", "start", "values");
    if (mr_parse(&spec, args, nargs, NULL, parsed) < 0) {
        return NULL;
    }
    if (mr_as_int64(args[0], 0, self->pool.size, "write(): row", &r) < 0
        || mr_as_int64(args[1], 0, self->pool.max_ctx, "write(): start", &start) < 0) {
        return NULL;
    }
    PyObject *arr = mr_ints_array(args[2], "write(): values");
    if (arr == NULL) {
        return NULL;
    }
    int rc = mr_reqpool_write(&self->pool, r, start, (const int64_t *)PyArray_DATA((PyArrayObject *)arr),
                              (int64_t)PyArray_SIZE((PyArrayObject *)arr));
    Py_DECREF(arr);
    if (rc != MR_OK) {
        PyErr_Format(PyExc_ValueError,
                     "write(): values do not fit row %lld from column %lld (max_context_len %lld, int32 values)",
                     (long long)r, (long long)start, (long long)self->pool.max_ctx);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ReqPool_write_index__doc__,
"write_index($self, indices, values, /)\n"
"--\n"
"\n"
"table[indices] = values for the common case of SGLang's write: indices a\n"
"(row, slice) tuple with an int row (negative counts from the end, as in\n"
"torch) and a slice of step >= 1, and values a 0-d or 1-D int32/int64 numpy array or an int (one\n"
"value or as many as the slice has columns; one is broadcast).  Returns\n"
"True when written, False when the case is not one of these (the caller\n"
"assigns through the table view, torch's semantics, instead).  IndexError\n"
"when the row is out of the table, RuntimeError when the number of values\n"
"is not the slice's, OverflowError when a value does not fit int32: the\n"
"table is unchanged then.");

static PyObject *
ReqPool_write_index(ReqPoolObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    MR_ARGS(spec, parsed, "write_index", 2, 2, 2, "indices", "values");
    if (mr_parse(&spec, args, nargs, NULL, parsed) < 0) {
        return NULL;
    }
    PyObject *ix = args[0], *vo = args[1];
    if (!PyTuple_CheckExact(ix) || PyTuple_GET_SIZE(ix) != 2 || !PyLong_CheckExact(PyTuple_GET_ITEM(ix, 0))
        || !PySlice_Check(PyTuple_GET_ITEM(ix, 1))) {
        Py_RETURN_FALSE;
    }
    mr_reqpool *rp = &self->pool;
    /* the slice first: its bounds' __index__ may run Python code, which
     * could change the values array read below */
    Py_ssize_t start, stop, step;
    if (PySlice_Unpack(PyTuple_GET_ITEM(ix, 1), &start, &stop, &step) < 0 || step < 1) {
        PyErr_Clear();
        Py_RETURN_FALSE;   /* torch refuses a step below 1: its own error */
    }
    /* the values: an int, or an int32/int64 numpy array of at most one
     * dimension not sharing memory with the table */
    const void *data = NULL;
    int width = 8;
    int64_t nv = 1, vstride = 0, one = 0;
    if (PyLong_CheckExact(vo)) {
        int ovf = 0;
        one = PyLong_AsLongLongAndOverflow(vo, &ovf);
        if (ovf != 0 || (one == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            PyErr_SetString(PyExc_OverflowError, "write(): values does not fit the int32 table");
            return NULL;
        }
        data = &one;
    }
    else if (PyArray_CheckExact(vo)) {
        PyArrayObject *a = (PyArrayObject *)vo;
        int t = PyArray_TYPE(a), nd = PyArray_NDIM(a);
        width = t == NPY_INT32 ? 4 : 8;
        if ((t != NPY_INT32 && t != NPY_INT64) || !PyArray_ISNOTSWAPPED(a) || nd > 1) {
            Py_RETURN_FALSE;
        }
        nv = nd == 0 ? 1 : (int64_t)PyArray_DIM(a, 0);
        vstride = nd == 0 ? 0 : (int64_t)PyArray_STRIDE(a, 0);
        if (vstride % width != 0) {
            Py_RETURN_FALSE;
        }
        data = PyArray_DATA(a);
        if (mr_reqpool_overlaps(rp, data, width, nv, vstride)) {
            Py_RETURN_FALSE;   /* torch decides what an overlapping copy does */
        }
    }
    else {
        Py_RETURN_FALSE;
    }
    int ovf = 0;
    int64_t r = 0;
    long long ri = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(ix, 0), &ovf);
    if (ovf != 0 || mr_reqpool_row_index(rp, ri, &r) != MR_OK) {
        PyErr_Format(PyExc_IndexError, "write(): row %R of indices is out of the table's %lld rows",
                     PyTuple_GET_ITEM(ix, 0), (long long)(rp->size + 1));
        return NULL;
    }
    Py_ssize_t n = PySlice_AdjustIndices((Py_ssize_t)rp->max_ctx, &start, &stop, step);
    int why;
    int64_t bad, x;
    if (mr_reqpool_assign(rp, r, start, step, n, data, width, nv, vstride, &why, &bad, &x) == MR_OK) {
        Py_RETURN_TRUE;
    }
    if (why == MR_RP_ASSIGN_COUNT) {
        PyErr_Format(PyExc_RuntimeError,
                     "write(): %lld values for the %zd columns of slice %R (max_context_len %lld) of row %lld",
                     (long long)nv, n, PyTuple_GET_ITEM(ix, 1), (long long)rp->max_ctx, (long long)r);
    }
    else if (why == MR_RP_ASSIGN_VALUE) {
        PyErr_Format(PyExc_OverflowError, "write(): values[%lld] = %lld does not fit the int32 table",
                     (long long)bad, (long long)x);
    }
    else {
        PyErr_Format(PyExc_IndexError, "write(): indices (%lld, %R) leave the table", (long long)r,
                     PyTuple_GET_ITEM(ix, 1));
    }
    return NULL;
}

PyDoc_STRVAR(ReqPool_mark_dirty__doc__,
"mark_dirty($self, row, start, end, /)\n"
"--\n"
"\n"
"Record columns [start, end) of row as changed (after writing the table\n"
"view directly).");

static PyObject *
ReqPool_mark_dirty(ReqPoolObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t r = 0, a = 0, b = 0;
    MR_ARGS(spec, parsed, "mark_dirty", 3, 3, 3, "row", "start", "end");
    if (mr_parse(&spec, args, nargs, NULL, parsed) < 0) {
        return NULL;
    }
    if (mr_as_int64(args[0], 0, self->pool.size, "mark_dirty(): row", &r) < 0
        || mr_as_int64(args[1], 0, self->pool.max_ctx, "mark_dirty(): start", &a) < 0
        || mr_as_int64(args[2], 0, self->pool.max_ctx, "mark_dirty(): end", &b) < 0) {
        return NULL;
    }
    mr_reqpool_mark_dirty(&self->pool, r, a, b);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ReqPool_take_dirty__doc__,
"take_dirty($self, /)\n"
"--\n"
"\n"
"The ranges written since the last call, as (rows, starts, ends) int64\n"
"arrays (one range per row, the union of its writes), and forget them.");

static PyObject *
ReqPool_take_dirty(ReqPoolObject *self, PyObject *unused)
{
    npy_intp n = (npy_intp)self->pool.ndirty;
    PyObject *rows = mr_i64_array(NULL, n), *starts = mr_i64_array(NULL, n), *ends = mr_i64_array(NULL, n);
    PyObject *res = NULL;
    if (rows == NULL || starts == NULL || ends == NULL) {
        goto error;
    }
    mr_reqpool_take_dirty(&self->pool, (int64_t *)PyArray_DATA((PyArrayObject *)rows),
                          (int64_t *)PyArray_DATA((PyArrayObject *)starts),
                          (int64_t *)PyArray_DATA((PyArrayObject *)ends), (int64_t)n);
    res = PyTuple_Pack(3, rows, starts, ends);
error:
    Py_XDECREF(rows);
    Py_XDECREF(starts);
    Py_XDECREF(ends);
    return res;
}

PyDoc_STRVAR(ReqPool_available_size__doc__,
"available_size($self, /)\n"
"--\n"
"\n"
"Free request rows.");

static PyObject *
ReqPool_available_size(ReqPoolObject *self, PyObject *unused)
{
    return PyLong_FromLongLong(mr_slots_available(&self->pool.rows));
}

PyDoc_STRVAR(ReqPool_clear__doc__,
"clear($self, /)\n"
"--\n"
"\n"
"Free every row and zero the state maps.");

static PyObject *
ReqPool_clear(ReqPoolObject *self, PyObject *unused)
{
    for (int64_t r = 1; r <= self->pool.size; r++) {
        if (mr_reqpool_in_use(&self->pool, r)) {
            (void)free_row(self, r);  /* a holder takes its record back */
        }
    }
    mr_reqpool_clear(&self->pool);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ReqPool_check__doc__,
"check($self, /)\n"
"--\n"
"\n"
"Verify the row accounting; InvariantError otherwise.");

static PyObject *
ReqPool_check(ReqPoolObject *self, PyObject *unused)
{
    char msg[256];
    if (mr_reqpool_check(&self->pool, msg, sizeof(msg)) != MR_OK) {
        return mr_raise(mr_state_from_type(Py_TYPE(self)), MR_ECORRUPT, msg);
    }
    Py_RETURN_NONE;
}

static PyMethodDef ReqPool_methods[] = {
    {"alloc", (PyCFunction)ReqPool_alloc, METH_O, ReqPool_alloc__doc__},
    {"free", (PyCFunction)ReqPool_free, METH_O, ReqPool_free__doc__},
    {"record", (PyCFunction)ReqPool_record, METH_O, ReqPool_record__doc__},
    {"in_use", (PyCFunction)ReqPool_in_use, METH_O, ReqPool_in_use__doc__},
    {"write", (PyCFunction)(void (*)(void))ReqPool_write, METH_FASTCALL, ReqPool_write__doc__},
    {"write_index", (PyCFunction)(void (*)(void))ReqPool_write_index, METH_FASTCALL, ReqPool_write_index__doc__},
    {"mark_dirty", (PyCFunction)(void (*)(void))ReqPool_mark_dirty, METH_FASTCALL, ReqPool_mark_dirty__doc__},
    {"take_dirty", (PyCFunction)ReqPool_take_dirty, METH_NOARGS, ReqPool_take_dirty__doc__},
    {"available_size", (PyCFunction)ReqPool_available_size, METH_NOARGS, ReqPool_available_size__doc__},
    {"clear", (PyCFunction)ReqPool_clear, METH_NOARGS, ReqPool_clear__doc__},
    {"check", (PyCFunction)ReqPool_check, METH_NOARGS, ReqPool_check__doc__},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ReqPool_getset[] = {
    {"table", (getter)ReqPool_get_view, NULL, "The req-to-token table, int32 [size + 1, max_context_len] (a view).", "t"},
    {"state_map", (getter)ReqPool_get_view, NULL, "Row -> running state slot, int32 [size + 1] (a view).", "s"},
    {"track_map", (getter)ReqPool_get_view, NULL, "Row -> track slots, int64 [size + 1, track_buffer_size] (a view).", "k"},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef ReqPool_members[] = {
    {"size", T_LONGLONG, offsetof(ReqPoolObject, pool.size), READONLY, "Request rows (row 0 excluded)."},
    {"max_context_len", T_LONGLONG, offsetof(ReqPoolObject, pool.max_ctx), READONLY, "Columns of the table."},
    {"track_buffer_size", T_INT, offsetof(ReqPoolObject, pool.pp), READONLY, "Width of the track buffer (1 or 2)."},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(ReqPool__doc__,
"ReqPool(size, max_context_len, track_buffer_size=2)\n"
"--\n"
"\n"
"Request rows 1..size (row 0 is the padding row), the req-to-token table\n"
"of their KV indices and the row -> state slot maps.");

static PyType_Slot ReqPool_slots[] = {
    {Py_tp_new, ReqPool_new},
    {Py_tp_dealloc, ReqPool_dealloc},
    {Py_tp_methods, ReqPool_methods},
    {Py_tp_getset, ReqPool_getset},
    {Py_tp_members, ReqPool_members},
    {Py_tp_doc, (void *)ReqPool__doc__},
    {0, NULL},
};

static PyType_Spec ReqPool_spec = MR_TYPE_SPEC("mambaradix._C.ReqPool", ReqPoolObject, ReqPool_slots, 0);

/* ------------------------------------------------------------------------
 * Registration */

int
mr_py_pools_init(PyObject *m, mr_state *st)
{
    if (mr_add_exception(m, st, &st->OwnershipError, "OwnershipError",
                         "A slot, token or request row was freed twice, or freed by someone who does not own it.",
                         PyExc_ValueError) < 0) {
        return -1;
    }
    if (mr_add_type(m, &st->SlotAllocator, PyType_FromModuleAndSpec(m, &SlotAllocator_spec, NULL)) < 0
        || mr_add_type(m, &st->ReqPool, PyType_FromModuleAndSpec(m, &ReqPool_spec, NULL)) < 0) {
        return -1;
    }
    return mr_py_lifecycle_init(m, st);
}
