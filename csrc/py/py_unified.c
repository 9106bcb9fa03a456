/* py_unified.c - the per-call work of the SGLang 0.5.23 TreeCore in C.
 *
 * mambaradix.sglang.unified's TreeCore (a Python class: it subclasses
 * SGLang's interface) binds its hot methods to a _C.UnifiedCore object, so
 * that UnifiedRadixCache's calls
 *
 *     match_prefix(params), begin_insert(params), end_insert(),
 *     has_ongoing_insert(), collect_full_device_indices(from, until),
 *     node(node_id)
 *
 * are each one C function over the RadixTree's mr_radix that reads SGLang's
 * parameter objects and builds SGLang's result objects directly (the result
 * classes are handed over once, at construction).  Anything off the common
 * path (namespaced keys, keys that are not int64 buffers, tensors off the
 * CPU, KV events) takes the same C path with a Python helper for that part,
 * or goes to the adapter's Python method of the same name (`fallback`),
 * which stays the reference for the semantics. */
#include "py_common.h"
#include "py_numpy.h"
#include "py_args.h"
#include "py_ints.h"
#include "radix.h"
#include "radix_ops.h"
#include "py_radix.h"

#include <string.h>

/* The object references a UnifiedCore holds, by name and as one array (for
 * traverse and clear). */
#define UC_NOBJS 17

typedef struct {
    PyObject_HEAD
    mr_radix *tree;              /* tree_obj's tree */
    union {
        struct {
            PyObject *tree_obj;          /* the RadixTree */
            PyObject *core;              /* the Python TreeCore (fallbacks, namespaces, events) */
            /* SGLang's classes */
            PyObject *RadixKey, *Tensor, *MatchResult, *InsertStepResult, *InsertResult, *FreeDeviceKV,
                *EvictExcess;
            PyObject *insert_template;   /* InsertResult(prefix_len=0).__dict__ */
            PyObject *IncLockRefResult, *DecLockRefResult, *inc_template, *dec_template;
            PyObject *to_tensor;         /* numpy int64 array -> device tensor */
            PyObject *int64;             /* torch.int64 */
            PyObject *empty_tensor;
        };
        PyObject *objs[UC_NOBJS];
    };
    /* configuration */
    int has_mamba, events;
    int64_t page_size, chunk, path_cap;
    mr_buf keybuf;               /* scratch for narrowed keys, taken for a call (mr_buf_take) */
} UnifiedCore;

_Static_assert(offsetof(UnifiedCore, empty_tensor)
                   == offsetof(UnifiedCore, objs) + (UC_NOBJS - 1) * sizeof(PyObject *),
               "UC_NOBJS counts the named references");

/* interned attribute names */
static PyObject *s_key, *s_token_ids, *s_extra_key, *s_cache_salt, *s_is_bigram, *s_limit, *s_value,
    *s_mamba_value, *s_prev_prefix_len, *s_session_id, *s_item, *s_numel, *s_dict,
    *s_prefix_len, *s_last_device_node, *s_mamba_exist, *s_cache_actions, *s_namespace, *s_record_store,
    *s_fb_match, *s_fb_begin_insert, *s_fb_collect, *s_inserted_len, *s_priority,
    *s_dtype, *s_is_cpu, *s_is_contiguous, *s_dim, *s_data_ptr,
    *s_node_id, *s_skipped, *s_fb_inc_lock, *s_fb_dec_lock;

static int
intern_names(void)
{
#define INTERN(var, text) if ((var) == NULL && ((var) = PyUnicode_InternFromString(text)) == NULL) return -1
    INTERN(s_key, "key");
    INTERN(s_token_ids, "token_ids");
    INTERN(s_extra_key, "extra_key");
    INTERN(s_cache_salt, "cache_salt");
    INTERN(s_is_bigram, "is_bigram");
    INTERN(s_limit, "limit");
    INTERN(s_value, "value");
    INTERN(s_mamba_value, "mamba_value");
    INTERN(s_prev_prefix_len, "prev_prefix_len");
    INTERN(s_session_id, "session_id");
    INTERN(s_item, "item");
    INTERN(s_numel, "numel");
    INTERN(s_dict, "__dict__");
    INTERN(s_prefix_len, "prefix_len");
    INTERN(s_last_device_node, "last_device_node");
    INTERN(s_mamba_exist, "mamba_exist");
    INTERN(s_cache_actions, "cache_actions");
    INTERN(s_namespace, "_namespace");
    INTERN(s_record_store, "_record_store");
    INTERN(s_fb_match, "_match_prefix_py");
    INTERN(s_fb_begin_insert, "_begin_insert_py");
    INTERN(s_fb_collect, "_collect_full_device_indices_py");
    INTERN(s_inserted_len, "inserted_len");
    INTERN(s_priority, "priority");
    INTERN(s_dtype, "dtype");
    INTERN(s_is_cpu, "is_cpu");
    INTERN(s_is_contiguous, "is_contiguous");
    INTERN(s_dim, "dim");
    INTERN(s_data_ptr, "data_ptr");
    INTERN(s_node_id, "node_id");
    INTERN(s_skipped, "skipped_lock_components");
    INTERN(s_fb_inc_lock, "_inc_lock_ref_py");
    INTERN(s_fb_dec_lock, "_dec_lock_ref_py");
#undef INTERN
    return 0;
}

/* ------------------------------------------------------------------------
 * Construction */

static int
UnifiedCore_traverse(UnifiedCore *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    for (int i = 0; i < UC_NOBJS; i++) {
        Py_VISIT(self->objs[i]);
    }
    return 0;
}

static int
UnifiedCore_clear(UnifiedCore *self)
{
    self->tree = NULL;
    for (int i = 0; i < UC_NOBJS; i++) {
        Py_CLEAR(self->objs[i]);
    }
    return 0;
}

static void
UnifiedCore_dealloc(UnifiedCore *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    UnifiedCore_clear(self);
    mr_buf_free(&self->keybuf);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *
UnifiedCore_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    MR_ARGS(spec, a, "UnifiedCore", 0, 13, 11, "tree", "core", "classes", "templates", "to_tensor", "empty_tensor",
            "has_mamba", "events", "page_size", "chunk", "path_cap", "policy", "order");
    PyObject *tree, *core, *classes, *tmpl, *inc_tmpl, *dec_tmpl, *to_tensor, *empty;
    int has_mamba, events;
    int64_t ps, chunk, cap;
    const char *policy = "lru";
    long long order[3] = {2, 0, 0};
    if (mr_parse_tuple(&spec, args, kwds, a) < 0) {
        return NULL;
    }
    tree = a[0];
    core = a[1];
    classes = a[2];
    to_tensor = a[4];
    empty = a[5];
    if (!PyTuple_Check(classes)) {
        PyErr_Format(PyExc_TypeError, "UnifiedCore(): classes must be a tuple, not %.100s", Py_TYPE(classes)->tp_name);
        return NULL;
    }
    if (!PyTuple_Check(a[3]) || PyTuple_GET_SIZE(a[3]) != 3 || !PyDict_Check(PyTuple_GET_ITEM(a[3], 0))
        || !PyDict_Check(PyTuple_GET_ITEM(a[3], 1)) || !PyDict_Check(PyTuple_GET_ITEM(a[3], 2))) {
        PyErr_SetString(PyExc_TypeError, "UnifiedCore(): templates must be a tuple of 3 dicts");
        return NULL;
    }
    tmpl = PyTuple_GET_ITEM(a[3], 0);
    inc_tmpl = PyTuple_GET_ITEM(a[3], 1);
    dec_tmpl = PyTuple_GET_ITEM(a[3], 2);
    if (mr_arg_bool(a[6], spec.fname, "has_mamba", &has_mamba) < 0
        || mr_arg_bool(a[7], spec.fname, "events", &events) < 0
        || mr_arg_int64(a[8], spec.fname, "page_size", 1, INT64_MAX, &ps) < 0
        || mr_arg_int64(a[9], spec.fname, "chunk", 1, INT64_MAX, &chunk) < 0
        || mr_arg_int64(a[10], spec.fname, "path_cap", INT64_MIN, INT64_MAX, &cap) < 0
        || mr_arg_str(a[11], spec.fname, "policy", 0, &policy) < 0) {
        return NULL;
    }
    if (a[12] != NULL) {
        if (!PyTuple_Check(a[12]) || PyTuple_GET_SIZE(a[12]) != 3) {
            PyErr_SetString(PyExc_TypeError, "UnifiedCore(): order must be a tuple of 3 ints");
            return NULL;
        }
        for (int i = 0; i < 3; i++) {
            int64_t x;
            if (mr_arg_int64(PyTuple_GET_ITEM(a[12], i), spec.fname, "order[i]", INT64_MIN, INT64_MAX, &x) < 0) {
                return NULL;
            }
            order[i] = x;
        }
    }
    mr_lru_policy chosen = MR_POLICY_CONSUMED;
    if (mr_radix_policy_by_0523_name(policy, &chosen) != MR_OK) {
        PyErr_Format(PyExc_ValueError,
                     "policy must be one of lru, lfu, fifo, mru, filo, priority, slru, tlru or a name of the "
                     "tree's policy table (mambaradix.RadixTree's lru_policy), not '%s'",
                     policy);
        return NULL;
    }
    if (intern_names() < 0) {
        return NULL;
    }
    mr_radix *t = mr_py_radix_tree(tree);
    if (t == NULL) {
        return NULL;
    }
    if (PyTuple_GET_SIZE(classes) != 10) {
        PyErr_SetString(PyExc_ValueError,
                        "classes must be (RadixKey, Tensor, MatchResult, InsertStepResult, InsertResult, "
                        "FreeDeviceKV, MambaEvictExcessPathStates, torch.int64, IncLockRefResult, "
                        "DecLockRefResult)");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < 10; i++) {
        if (i != 7 && !PyType_Check(PyTuple_GET_ITEM(classes, i))) {
            PyErr_Format(PyExc_TypeError, "classes[%zd] must be a class", i);
            return NULL;
        }
    }
    PyObject *mr = PyTuple_GET_ITEM(classes, 2);
    if (!PyType_IsSubtype((PyTypeObject *)mr, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "classes[2] (MatchResult) must be a NamedTuple");
        return NULL;
    }
    /* the object first: a core that cannot be made leaves the tree's policy as it was */
    UnifiedCore *self = (UnifiedCore *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    mr_leaf_order lo = {order[0], order[1], order[2]};
    if (mr_radix_set_policy(t, chosen, &lo) != MR_OK) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_ValueError, "tree must be empty (the policy is set before the first insert)");
        return NULL;
    }
    self->tree_obj = Py_NewRef(tree);
    self->tree = t;
    self->core = Py_NewRef(core);
    self->RadixKey = Py_NewRef(PyTuple_GET_ITEM(classes, 0));
    self->Tensor = Py_NewRef(PyTuple_GET_ITEM(classes, 1));
    self->MatchResult = Py_NewRef(mr);
    self->InsertStepResult = Py_NewRef(PyTuple_GET_ITEM(classes, 3));
    self->InsertResult = Py_NewRef(PyTuple_GET_ITEM(classes, 4));
    self->FreeDeviceKV = Py_NewRef(PyTuple_GET_ITEM(classes, 5));
    self->EvictExcess = Py_NewRef(PyTuple_GET_ITEM(classes, 6));
    self->insert_template = Py_NewRef(tmpl);
    self->to_tensor = Py_NewRef(to_tensor);
    self->empty_tensor = Py_NewRef(empty);
    self->int64 = Py_NewRef(PyTuple_GET_ITEM(classes, 7));
    self->IncLockRefResult = Py_NewRef(PyTuple_GET_ITEM(classes, 8));
    self->DecLockRefResult = Py_NewRef(PyTuple_GET_ITEM(classes, 9));
    self->inc_template = Py_NewRef(inc_tmpl);
    self->dec_template = Py_NewRef(dec_tmpl);
    self->has_mamba = has_mamba;
    self->events = events;
    self->page_size = ps;
    self->chunk = chunk;
    self->path_cap = cap;
    return (PyObject *)self;
}

/* ------------------------------------------------------------------------
 * Reading SGLang's arguments */

/* Calls the adapter's Python method `name` with the original arguments. */
static PyObject *
fallback(UnifiedCore *self, PyObject *name, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *fn = PyObject_GetAttr(self->core, name);
    if (fn == NULL) {
        return NULL;
    }
    PyObject *r = PyObject_Vectorcall(fn, args, nargsf, kwnames);
    Py_DECREF(fn);
    return r;
}

/* A key read for the tree. */
typedef struct {
    const int32_t *tok;
    size_t len;          /* page-aligned */
    int32_t ns;
    int fast;            /* 0: take the fallback */
    PyObject *name;      /* a new name whose id the caller makes (new reference; NULL: none) */
} keyread;

/* Reads params.key (a RadixKey over an int64 buffer, limit honoured,
 * truncated to whole pages) into kb, with its namespace id: an unknown name
 * gets -1, and kr->name holds the name for the caller to make its id at the
 * step that inserts (keyread_name), which no refused argument precedes; the
 * caller releases kr->name.  kb is the UnifiedCore's keybuf taken for the
 * call (mr_buf_take; the caller gives it back): reading the key's other
 * attributes, and the call's other arguments after it, may run Python code
 * (a property, __index__, the adapter's _namespace) that calls this
 * UnifiedCore again, which then works on a buffer of its own.  Returns -1
 * with an exception, 0 with kr->fast = 0 when the key needs the Python
 * path (a token list, a narrower buffer, a token outside [0, INT32_MAX]),
 * else 0. */
static int
read_key(UnifiedCore *self, PyObject *key, mr_buf *kb, keyread *kr)
{
    kr->fast = 0;
    kr->name = NULL;
    if (Py_TYPE(key) != (PyTypeObject *)self->RadixKey
        && !PyObject_TypeCheck(key, (PyTypeObject *)self->RadixKey)) {
        PyErr_Format(PyExc_TypeError, "params.key must be a RadixKey, not %.100s", Py_TYPE(key)->tp_name);
        return -1;
    }
    PyObject *big = PyObject_GetAttr(key, s_is_bigram);
    if (big == NULL) {
        return -1;
    }
    int is_big = PyObject_IsTrue(big);
    Py_DECREF(big);
    if (is_big != 0) {
        if (is_big > 0) {
            PyErr_SetString(PyExc_ValueError, "params.key: bigram (EAGLE) keys are served by the Python TreeCore");
        }
        return -1;
    }
    PyObject *toks = PyObject_GetAttr(key, s_token_ids);
    if (toks == NULL) {
        return -1;
    }
    if (!PyObject_CheckBuffer(toks)) {
        Py_DECREF(toks);
        return 0;
    }
    Py_buffer v;
    if (PyObject_GetBuffer(toks, &v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(toks);
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(toks);
    const char *f = v.format ? v.format : "B";
    if (*f == '@' || *f == '=' || *f == '<') {
        f++;
    }
    if (v.ndim != 1 || v.itemsize != 8 || !(f[0] == 'q' || f[0] == 'l' || f[0] == 'n') || f[1] != '\0') {
        PyBuffer_Release(&v);
        return 0;
    }
    size_t n = (size_t)v.shape[0];
    PyObject *lim = PyObject_GetAttr(key, s_limit);
    if (lim == NULL) {
        PyBuffer_Release(&v);
        return -1;
    }
    if (lim != Py_None) {
        Py_ssize_t l = PyLong_Check(lim) ? PyLong_AsSsize_t(lim) : -1;
        if (l == -1 && PyErr_Occurred()) {
            PyErr_Clear();
        }
        if (!PyLong_Check(lim) || l < 0) {
            Py_DECREF(lim);
            PyBuffer_Release(&v);
            return 0;
        }
        if ((size_t)l < n) {
            n = (size_t)l;
        }
    }
    Py_DECREF(lim);
    n -= n % (size_t)self->page_size;
    if (mr_buf_reserve(kb, n, sizeof(int32_t)) < 0) {
        PyBuffer_Release(&v);
        return -1;
    }
    /* A token outside [0, INT32_MAX] (SGLang's 62-bit multimodal pad ids, a
     * negative id) takes the Python path, which gives it its negative
     * stand-in in the tree (the adapter's _tokens). */
    int out_of_range = mr_narrow_i32_nonneg(v.buf, n, kb->p);
    PyBuffer_Release(&v);
    if (out_of_range) {
        return 0;
    }
    /* Namespace: none for a plain key; else the adapter's name for
     * (extra_key, cache_salt), then the tree's id for that name. */
    PyObject *extra = PyObject_GetAttr(key, s_extra_key);
    if (extra == NULL) {
        return -1;
    }
    PyObject *salt = PyObject_GetAttr(key, s_cache_salt);
    if (salt == NULL) {
        Py_DECREF(extra);
        return -1;
    }
    int plain = extra == Py_None && salt == Py_None;
    Py_DECREF(extra);
    Py_DECREF(salt);
    kr->ns = 0;
    if (!plain) {
        PyObject *name = PyObject_CallMethodOneArg(self->core, s_namespace, key);
        if (name == NULL) {
            return -1;
        }
        int rc = mr_py_namespace(self->tree, name, 0, &kr->ns);
        if (rc < 0 || kr->ns >= 0) {
            Py_DECREF(name);
        }
        else {
            kr->name = name;
        }
        if (rc < 0) {
            return -1;
        }
    }
    kr->tok = kb->p;
    kr->len = n;
    kr->fast = 1;
    return 0;
}

static PyObject *
node_id_obj(const mr_node *n)
{
    return PyLong_FromUnsignedLongLong(mr_node_nodeid(n));
}

/* Resolves a NodeId: 1 found, 0 not an exact int (the caller falls back),
 * -1 KeyError naming arg. */
static int
resolve_id(UnifiedCore *self, PyObject *obj, const char *arg, mr_node **out)
{
    if (!PyLong_CheckExact(obj)) {
        return 0;
    }
    int overflow = 0;
    long long id = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (id == -1 && PyErr_Occurred()) {
        return -1;
    }
    mr_node *n = overflow ? NULL : mr_radix_node_by_nodeid(self->tree, id);
    if (n == NULL) {
        PyObject *r = PyObject_Repr(obj);
        if (r != NULL) {
            PyErr_Format(PyExc_KeyError, "%s=%U names no live node", arg, r);
            Py_DECREF(r);
        }
        return -1;
    }
    *out = n;
    return 1;
}

/* ------------------------------------------------------------------------
 * match_prefix */

/* params.key, or a TypeError naming `params` when params has no key. */
static PyObject *
params_key(PyObject *params, const char *want)
{
    PyObject *key = PyObject_GetAttr(params, s_key);
    if (key == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "params must be a %s (with a key), not %.100s", want,
                     Py_TYPE(params)->tp_name);
    }
    return key;
}

static PyObject *
UnifiedCore_match_prefix(UnifiedCore *self, PyObject *params)
{
    PyObject *key = params_key(params, "MatchPrefixParams");
    if (key == NULL) {
        return NULL;
    }
    keyread kr;
    mr_buf kb = mr_buf_take(&self->keybuf);
    int rc = read_key(self, key, &kb, &kr);
    Py_DECREF(key);
    Py_CLEAR(kr.name);   /* a name the tree does not know matches nothing */
    if (rc < 0 || !kr.fast) {
        mr_buf_give(&self->keybuf, &kb);
        return rc < 0 ? NULL : fallback(self, s_fb_match, &params, 1, NULL);
    }
    mr_radix *t = self->tree;
    mr_match m;
    if (kr.len == 0) {
        memset(&m, 0, sizeof(m));
        m.node = m.kv_node = mr_radix_root(t);
        rc = MR_OK;
    }
    else {
        rc = mr_radix_match(t, kr.tok, kr.len, kr.ns, &m);
    }
    mr_buf_give(&self->keybuf, &kb);
    if (rc != MR_OK) {
        PyErr_Format(PyExc_RuntimeError, "match_prefix(): the tree failed (status %d)", rc);
        return NULL;
    }
    size_t dev_len, kv_len = m.kv_matched_len;
    int64_t blen;
    mr_match_device(&m, self->has_mamba, (size_t)self->chunk, &dev_len, &blen);
    PyObject *branching = blen < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(blen);
    if (branching == NULL) {
        return NULL;
    }
    mr_node *root = mr_radix_root(t);
    PyObject *bid = node_id_obj(m.node);
    PyObject *vis = m.kv_node == root ? Py_NewRef(Py_None) : node_id_obj(m.kv_node);
    PyObject *dl = PyLong_FromSize_t(dev_len);
    PyObject *kl = PyLong_FromSize_t(kv_len);
    PyObject *acts = PyList_New(0);
    PyTypeObject *tp = (PyTypeObject *)self->MatchResult;
    PyObject *res = (bid && vis && dl && kl && acts) ? tp->tp_alloc(tp, 14) : NULL;
    if (res == NULL) {
        Py_XDECREF(bid);
        Py_XDECREF(vis);
        Py_XDECREF(dl);
        Py_XDECREF(kl);
        Py_XDECREF(acts);
        Py_DECREF(branching);
        return NULL;
    }
    PyObject *zero = PyLong_FromLong(0);   /* a cached small int */
    /* MatchResult's field order (checked by the adapter). */
    PyTuple_SET_ITEM(res, 0, dl);
    PyTuple_SET_ITEM(res, 1, Py_NewRef(bid));
    PyTuple_SET_ITEM(res, 2, Py_NewRef(bid));
    PyTuple_SET_ITEM(res, 3, bid);
    PyTuple_SET_ITEM(res, 4, Py_NewRef(zero));
    PyTuple_SET_ITEM(res, 5, Py_NewRef(zero));
    PyTuple_SET_ITEM(res, 6, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(res, 7, zero);
    PyTuple_SET_ITEM(res, 8, branching);
    PyTuple_SET_ITEM(res, 9, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(res, 10, kl);
    PyTuple_SET_ITEM(res, 11, acts);
    PyTuple_SET_ITEM(res, 12, vis);
    PyTuple_SET_ITEM(res, 13, Py_NewRef(Py_None));
    return res;
}

/* ------------------------------------------------------------------------
 * Paths */

static PyObject *
path_tensor(UnifiedCore *self, const mr_node *node)
{
    size_t n = mr_radix_path_len(self->tree, node);
    if (n == 0) {
        return Py_NewRef(self->empty_tensor);
    }
    PyObject *arr = mr_py_path_indices(self->tree, node, n);
    if (arr == NULL) {
        return NULL;
    }
    PyObject *t = PyObject_CallOneArg(self->to_tensor, arr);
    Py_DECREF(arr);
    return t;
}

static PyObject *
UnifiedCore_collect_full_device_indices(UnifiedCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    MR_ARGS(spec, a, "collect_full_device_indices", 2, 2, 2, "from_node_id", "until_node_id");
    if (mr_parse(&spec, args, nargs, NULL, a) < 0) {
        return NULL;
    }
    mr_node *from, *until;
    int rc = resolve_id(self, a[0], "from_node_id", &from);
    if (rc == 1) {
        rc = resolve_id(self, a[1], "until_node_id", &until);
    }
    if (rc < 0) {
        return NULL;
    }
    if (rc == 0 || until != mr_radix_root(self->tree)) {
        return fallback(self, s_fb_collect, args, 2, NULL);
    }
    return path_tensor(self, from);
}

static PyObject *
UnifiedCore_path_device_indices(UnifiedCore *self, PyObject *node_id)
{
    mr_node *n;
    int rc = resolve_id(self, node_id, "node_id", &n);
    if (rc <= 0) {
        if (rc == 0) {
            PyErr_Format(PyExc_TypeError, "node_id must be an int NodeId, not %.100s", Py_TYPE(node_id)->tp_name);
        }
        return NULL;
    }
    return path_tensor(self, n);
}

/* node(node_id) -> the RadixTree's Node handle for a NodeId (KeyError when
 * no live node has it, TypeError when it is not an int). */
static PyObject *
UnifiedCore_node(UnifiedCore *self, PyObject *node_id)
{
    mr_node *n;
    int rc = resolve_id(self, node_id, "node_id", &n);
    if (rc == 0) {
        if (PyBool_Check(node_id) || !PyIndex_Check(node_id)) {
            PyErr_Format(PyExc_TypeError, "node_id must be an int NodeId, not %.100s", Py_TYPE(node_id)->tp_name);
            return NULL;
        }
        PyObject *i = PyNumber_Index(node_id);
        if (i == NULL) {
            return NULL;
        }
        rc = resolve_id(self, i, "node_id", &n);
        Py_DECREF(i);
    }
    if (rc < 0) {
        return NULL;
    }
    return mr_py_radix_node(self->tree_obj, n);
}

/* ------------------------------------------------------------------------
 * Insert */

/* Calls obj.name() and returns its truth (-1: error). */
static int
call_truth(PyObject *obj, PyObject *name)
{
    PyObject *r = PyObject_CallMethodNoArgs(obj, name);
    if (r == NULL) {
        return -1;
    }
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    return t;
}

/* Calls obj.name() and reads an int (-1 with an exception on error). */
static long long
call_int(PyObject *obj, PyObject *name)
{
    PyObject *r = PyObject_CallMethodNoArgs(obj, name);
    if (r == NULL) {
        return -1;
    }
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v;
}

/* The caller's KV indices: a 1-D, contiguous int64 CPU tensor of at least n
 * elements, read in place through its data pointer (a handful of cheap
 * attribute calls; Tensor.numpy() costs more than the whole insert walk).
 * value_kind: 1 when the value can be read so, 0 when it needs the Python
 * path (another dtype or device, strided, a Tensor subclass), -1 with
 * TypeError naming params.value.  Only an exact torch.Tensor is read in
 * place: its attributes and methods are C, so no Python code runs between
 * value_kind and value_data.  begin_insert asks value_kind again right
 * before value_data, after every other argument (whose Python code may
 * have replaced the tensor's storage).  value_data reads the pointer: 0
 * with *data set, -1 with ValueError naming params.value. */
static int
value_kind(UnifiedCore *self, PyObject *value)
{
    if (!PyObject_TypeCheck(value, (PyTypeObject *)self->Tensor)) {
        PyErr_Format(PyExc_TypeError, "params.value must be a torch.Tensor, not %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    if (Py_TYPE(value) != (PyTypeObject *)self->Tensor) {
        return 0;   /* a subclass: its methods may be Python code */
    }
    PyObject *dt = PyObject_GetAttr(value, s_dtype);
    if (dt == NULL) {
        return -1;
    }
    Py_DECREF(dt);
    if (dt != self->int64) {
        return 0;
    }
    PyObject *cpu = PyObject_GetAttr(value, s_is_cpu);
    if (cpu == NULL) {
        return -1;
    }
    Py_DECREF(cpu);
    if (cpu != Py_True) {
        return 0;
    }
    int c = call_truth(value, s_is_contiguous);
    long long dim = c > 0 ? call_int(value, s_dim) : 0;
    if (c < 0 || (dim == -1 && PyErr_Occurred())) {
        return -1;
    }
    return c == 1 && dim == 1;
}

static int
value_data(PyObject *value, size_t n, const int64_t **data)
{
    long long ne = call_int(value, s_numel);
    if (ne == -1 && PyErr_Occurred()) {
        return -1;
    }
    if ((size_t)ne < n) {
        PyErr_Format(PyExc_ValueError, "params.value has %lld indices for a key of %zu tokens", ne, n);
        return -1;
    }
    PyObject *ptr = PyObject_CallMethodNoArgs(value, s_data_ptr);
    if (ptr == NULL) {
        return -1;
    }
    const int64_t *v = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    if (v == NULL && PyErr_Occurred()) {
        return -1;
    }
    uint64_t neg = 0;
    for (size_t i = 0; i < n; i++) {
        neg |= (uint64_t)v[i] >> 63;
    }
    if (neg) {
        PyErr_SetString(PyExc_ValueError, "params.value: KV indices must be >= 0");
        return -1;
    }
    *data = v;
    return 0;
}

/* obj.name as an int64 >= lo (None: 0); ValueError / TypeError name arg. */
static int
int_attr(PyObject *obj, PyObject *name, int64_t lo, const char *arg, int64_t *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        return -1;
    }
    *out = 0;
    if (v != Py_None) {
        int rc = mr_as_int64(v, lo, INT64_MAX, arg, out);
        Py_DECREF(v);
        return rc;
    }
    Py_DECREF(v);
    return 0;
}

/* An instance of the dataclass tp from its default __dict__ (tmpl), without
 * running its __init__: the dict is copied, each dict or list default (a
 * default_factory's) replaced by a fresh empty one, then the n fields in
 * keys/vals set. */
static PyObject *
from_template(PyObject *tp_obj, PyObject *tmpl, Py_ssize_t n, PyObject *const *keys, PyObject *const *vals)
{
    PyTypeObject *tp = (PyTypeObject *)tp_obj;
    PyObject *d = PyDict_Copy(tmpl);
    if (d == NULL) {
        return NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(tmpl, &pos, &k, &v)) {
        if (PyDict_CheckExact(v) || PyList_CheckExact(v)) {
            PyObject *fresh = PyDict_CheckExact(v) ? PyDict_New() : PyList_New(0);
            if (fresh == NULL || PyDict_SetItem(d, k, fresh) < 0) {
                Py_XDECREF(fresh);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(fresh);
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (vals[i] == NULL || PyDict_SetItem(d, keys[i], vals[i]) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    PyObject *obj = tp->tp_alloc(tp, 0);
    if (obj == NULL || PyObject_SetAttr(obj, s_dict, d) < 0) {
        Py_XDECREF(obj);
        Py_DECREF(d);
        return NULL;
    }
    Py_DECREF(d);
    return obj;
}

static PyObject *
new_insert_result(UnifiedCore *self, size_t prefix_len, PyObject *node_id, int mamba_exist)
{
    PyObject *keys[3] = {s_prefix_len, s_last_device_node, s_mamba_exist};
    PyObject *vals[3] = {PyLong_FromSize_t(prefix_len), Py_NewRef(node_id),
                         Py_NewRef(mamba_exist ? Py_True : Py_False)};
    PyObject *r = from_template(self->InsertResult, self->insert_template, 3, keys, vals);
    for (int i = 0; i < 3; i++) {
        Py_XDECREF(vals[i]);
    }
    return r;
}

/* ------------------------------------------------------------------------
 * Locks: inc_lock_ref(node_id, skip_lock_components=()) when nothing is
 * skipped (a lock that skips the Mamba component takes the Python path), and
 * dec_lock_ref(node_id, params, skip_swa=False), which releases the
 * components the receipt's skipped_lock_components does not name, as
 * SGLang's cores do per component (mr_radix_release_components). */

/* The components a receipt's skipped_lock_components names, as a mask
 * (mr_skip_bit's), or -1 when it is not a tuple of those (the Python
 * path names the problem).  Reads exact ints and int enums only: no Python
 * code runs. */
static int
skipped_mask(PyObject *sk)
{
    if (!PyTuple_CheckExact(sk)) {
        return -1;
    }
    int mask = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sk); i++) {
        PyObject *c = PyTuple_GET_ITEM(sk, i);
        if (!PyLong_Check(c)) {
            return -1;
        }
        int overflow = 0;
        long v = PyLong_AsLongAndOverflow(c, &overflow);
        int bit = overflow ? 0 : mr_skip_bit(v);
        if (bit == 0) {
            PyErr_Clear();
            return -1;
        }
        mask |= bit;
    }
    return mask;
}

static PyObject *
UnifiedCore_inc_lock_ref(UnifiedCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *skip = nargs > 1 ? args[1] : NULL;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) == 1 && nargs == 1
        && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "skip_lock_components") == 0) {
        skip = args[1];
    }
    else if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        skip = Py_None;   /* anything else: the Python path names the problem */
    }
    mr_node *n;
    int rc = nargs >= 1 && nargs <= 2 ? resolve_id(self, args[0], "node_id", &n) : 0;
    if (rc < 0) {
        return NULL;
    }
    int empty = skip == NULL || (PyTuple_CheckExact(skip) && PyTuple_GET_SIZE(skip) == 0)
                || (PyList_CheckExact(skip) && PyList_GET_SIZE(skip) == 0);
    if (rc == 0 || !empty) {
        return fallback(self, s_fb_inc_lock, args, nargsf, kwnames);
    }
    mr_radix_lock(self->tree, n);   /* cannot fail */
    PyObject *keys[1] = {s_node_id};
    PyObject *vals[1] = {node_id_obj(n)};
    PyObject *r = from_template(self->IncLockRefResult, self->inc_template, 1, keys, vals);
    Py_XDECREF(vals[0]);
    if (r == NULL) {
        mr_radix_unlock(self->tree, n);
    }
    return r;
}

static PyObject *
UnifiedCore_dec_lock_ref(UnifiedCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    mr_node *n = NULL;
    int fast = nargs >= 2 && nargs <= 3 && kwnames == NULL && PyLong_CheckExact(args[0]) && args[1] != Py_None;
    int mask = -1;
    if (fast) {
        /* the receipt must be anchored on this node (the same NodeId) and
         * skip FULL / MAMBA only (none of them without a MAMBA component);
         * read before the node is resolved, as its attributes may run
         * Python code that changes the tree */
        PyObject *rid = PyObject_GetAttr(args[1], s_node_id);
        PyObject *sk = rid ? PyObject_GetAttr(args[1], s_skipped) : NULL;
        fast = rid != NULL && sk != NULL && PyLong_CheckExact(rid);
        mask = fast ? skipped_mask(sk) : -1;
        fast = fast && (mask == 0 || (self->has_mamba && mask > 0));
        fast = fast && PyObject_RichCompareBool(rid, args[0], Py_EQ) == 1;   /* exact ints: no Python code */
        Py_XDECREF(rid);
        Py_XDECREF(sk);
        PyErr_Clear();
    }
    int rc = nargs >= 2 && nargs <= 3 && kwnames == NULL ? resolve_id(self, args[0], "node_id", &n) : 0;
    if (rc < 0) {
        return NULL;
    }
    if (rc == 0 || !fast) {
        return fallback(self, s_fb_dec_lock, args, nargsf, kwnames);
    }
    /* mask: the components left held (MR_SKIP_FULL, MR_SKIP_MAMBA) */
    if (mr_radix_release_components(self->tree, n, mask) != MR_OK) {
        PyErr_Format(PyExc_ValueError, "dec_lock_ref(): node %u holds no lock %s", mr_node_handle(n).id,
                     mask == 0   ? "to release"
                     : mask == 1 ? "whose MAMBA component is held"
                                 : "whose FULL component is held without its MAMBA one");
        return NULL;
    }
    PyObject *r = from_template(self->DecLockRefResult, self->dec_template, 0, NULL, NULL);
    if (r == NULL) {
        mr_radix_retake_components(self->tree, n, mask);   /* undo */
    }
    return r;
}

/* begin_insert reads every argument before it calls the tree: the key into
 * the keybuf taken for the call, then the value's kind (the Python path
 * decided before any other argument is read), the state slot (a tensor of
 * another dtype than int64: the Python path, which names it) and the ints,
 * and the value's data pointer last.  The node the insert ends at is made
 * into its NodeId (and Node) at once: building the actions and the result
 * runs Python code (to_tensor, the result classes, _record_store) that may
 * change the tree. */
static PyObject *
UnifiedCore_begin_insert(UnifiedCore *self, PyObject *params)
{
    PyObject *key = params_key(params, "InsertParams");
    if (key == NULL) {
        return NULL;
    }
    keyread kr;
    mr_buf kb = mr_buf_take(&self->keybuf);
    int rc = read_key(self, key, &kb, &kr);
    PyObject *value = NULL, *res = NULL, *actions = NULL, *nid = NULL, *node = NULL;
    const int64_t *vals = NULL;
    if (rc < 0) {
        goto done;
    }
    if (!kr.fast || kr.len == 0) {
        goto python_path;
    }
    value = PyObject_GetAttr(params, s_value);
    if (value == NULL) {
        goto done;
    }
    if (value == Py_None || (rc = value_kind(self, value)) == 0) {
        goto python_path;
    }
    if (rc < 0) {
        goto done;
    }
    int64_t state = MR_NO_STATE;
    if (self->has_mamba) {
        PyObject *mv = PyObject_GetAttr(params, s_mamba_value);
        if (mv == NULL) {
            goto done;
        }
        if (mv == Py_None) {
            PyErr_SetString(PyExc_ValueError, "params.mamba_value is required with a MAMBA component");
            Py_DECREF(mv);
            goto done;
        }
        int is_tensor = PyObject_TypeCheck(mv, (PyTypeObject *)self->Tensor);
        if (is_tensor) {
            /* A slot tensor that is not int64 takes the Python path, which
             * names its dtype: item() would read a bool as slot 0 or 1. */
            PyObject *mdt = PyObject_GetAttr(mv, s_dtype);
            if (mdt == NULL) {
                Py_DECREF(mv);
                goto done;
            }
            Py_DECREF(mdt);
            if (mdt != self->int64) {
                Py_DECREF(mv);
                goto python_path;
            }
        }
        /* Tensor.item() refuses anything but one element. */
        PyObject *item = is_tensor ? PyObject_CallMethodNoArgs(mv, s_item) : NULL;
        Py_DECREF(mv);
        if (item == NULL || !PyLong_Check(item)) {
            Py_XDECREF(item);
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "params.mamba_value must be a one-element tensor (the state slot)");
            goto done;
        }
        state = PyLong_AsLongLong(item);
        Py_DECREF(item);
        if (state < 0) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "params.mamba_value: the state slot must be >= 0");
            goto done;
        }
    }
    int64_t prev = 0, inserted = 0, prio = 0;
    if (int_attr(params, s_prev_prefix_len, 0, "params.prev_prefix_len", &prev) < 0
        || int_attr(params, s_inserted_len, 0, "params.inserted_len", &inserted) < 0
        || int_attr(params, s_priority, INT64_MIN, "params.priority", &prio) < 0
        || (rc = value_kind(self, value)) < 0) {   /* again: the ints' Python code may have changed it */
        goto done;
    }
    if (rc == 0) {
        goto python_path;
    }
    if (value_data(value, kr.len, &vals) < 0) {
        goto done;
    }
    /* a new name gets its id now (no Python code runs: the name is a str),
     * and loses it again if the tree refuses the insert */
    int32_t made = -1;
    if (kr.ns < 0 && mr_py_namespace_new(self->tree, kr.name, &kr.ns, &made) < 0) {
        goto done;
    }
    mr_insert_result ir;
    mr_insert_opts io = {(size_t)inserted, prio, NULL, NULL};
    rc = mr_radix_insert_ex(self->tree, kr.tok, vals, kr.len, kr.ns, state,
                            (size_t)prev, &io, NULL, &ir);
    mr_buf_give(&self->keybuf, &kb);
    if (rc != MR_OK) {
        mr_ns_forget_newest(mr_radix_namespaces(self->tree), made);
        PyErr_Format(rc == MR_ENOMEM ? PyExc_MemoryError : PyExc_RuntimeError,
                     "begin_insert(): the tree refused the insert (status %d); nothing changed", rc);
        goto done;
    }
    /* The tree changed: from here on, report every failure as an exception
     * (the result objects are all that is left to build), and use ir.node
     * only through nid / node (neither allocation runs Python code). */
    nid = node_id_obj(ir.node);
    int record = self->events && ir.prefix_len < kr.len;
    if (nid == NULL || (record && (node = mr_py_radix_node(self->tree_obj, ir.node)) == NULL)) {
        goto done;
    }
    actions = PyList_New(0);
    if (actions == NULL) {
        goto done;
    }
    if (ir.ndup) {
        /* The duplicates are the caller's value[prefix_len - ndup : prefix_len]. */
        /* A view of the caller's tensor, as SGLang's core hands back (no
         * copy: a scheduler holds these until its free group ends), made
         * through a numpy view that keeps the tensor alive (a tensor slice
         * costs twice as much). */
        npy_intp dims[1] = {(npy_intp)ir.ndup};
        PyObject *dup = PyArray_SimpleNewFromData(1, dims, NPY_INT64, (void *)(vals + (ir.prefix_len - ir.ndup)));
        if (dup != NULL && PyArray_SetBaseObject((PyArrayObject *)dup, Py_NewRef(value)) < 0) {
            Py_CLEAR(dup);
        }
        PyObject *sl = dup ? PyObject_CallOneArg(self->to_tensor, dup) : NULL;
        Py_XDECREF(dup);
        PyObject *lst = sl ? PyList_New(1) : NULL;
        if (lst == NULL) {
            Py_XDECREF(sl);
            goto done;
        }
        PyList_SET_ITEM(lst, 0, sl);
        PyObject *act = PyObject_CallOneArg(self->FreeDeviceKV, lst);
        Py_DECREF(lst);
        if (act == NULL || PyList_Append(actions, act) < 0) {
            Py_XDECREF(act);
            goto done;
        }
        Py_DECREF(act);
    }
    if (state != MR_NO_STATE && !ir.state_existed && self->path_cap >= 0) {
        PyObject *act = PyObject_CallOneArg(self->EvictExcess, nid);
        if (act == NULL || PyList_Append(actions, act) < 0) {
            Py_XDECREF(act);
            goto done;
        }
        Py_DECREF(act);
    }
    if (record) {
        PyObject *sid = PyObject_GetAttr(params, s_session_id);
        PyObject *r = NULL;
        if (sid != NULL) {
            PyObject *a[4] = {self->core, node, key, sid};
            r = PyObject_VectorcallMethod(s_record_store, a, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        }
        Py_XDECREF(sid);
        Py_XDECREF(r);
        if (r == NULL) {
            goto done;
        }
    }
    PyObject *ires = new_insert_result(self, ir.prefix_len, nid, self->has_mamba && ir.state_existed);
    if (ires == NULL) {
        goto done;
    }
    PyObject *a[2] = {actions, ires};
    res = PyObject_Vectorcall(self->InsertStepResult, a, 2, NULL);
    Py_DECREF(ires);
    goto done;
python_path:
    mr_buf_give(&self->keybuf, &kb);   /* the Python path's tree_insert reuses it */
    res = fallback(self, s_fb_begin_insert, &params, 1, NULL);
done:
    mr_buf_give(&self->keybuf, &kb);   /* a no-op when given back already */
    Py_XDECREF(kr.name);
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(actions);
    Py_XDECREF(nid);
    Py_XDECREF(node);
    return res;
}

/* tree_insert(tokens, values, state, extra_key, prev_prefix_len, inserted_len, priority)
 * -> (prefix_len, state_existed, node, ndup): the adapter's Python path's
 * insert (numpy int64 tokens and values of whole pages; state None: none). */
static PyObject *
UnifiedCore_tree_insert(UnifiedCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    MR_ARGS(spec, a, "tree_insert", 7, 7, 7, "tokens", "values", "state", "extra_key", "prev_prefix_len",
            "inserted_len", "priority");
    int64_t state = MR_NO_STATE, prev, inserted, prio;
    if (mr_parse(&spec, args, nargs, NULL, a) < 0
        || (a[2] != Py_None && mr_arg_int64(a[2], spec.fname, "state", 0, INT64_MAX, &state) < 0)
        || mr_arg_int64(a[4], spec.fname, "prev_prefix_len", 0, INT64_MAX, &prev) < 0
        || mr_arg_int64(a[5], spec.fname, "inserted_len", 0, INT64_MAX, &inserted) < 0
        || mr_arg_int64(a[6], spec.fname, "priority", INT64_MIN, INT64_MAX, &prio) < 0) {
        return NULL;
    }
    mr_buf ks = mr_buf_take(&self->keybuf), vs = {NULL, 0};
    mr_ints key, val;
    if (mr_ints_read(a[0], 4, INT32_MIN, INT32_MAX, "tree_insert(): tokens", 0, &ks, &key) < 0) {
        mr_buf_give(&self->keybuf, &ks);
        return NULL;
    }
    PyObject *res = NULL;
    if (mr_ints_read(a[1], 8, 0, INT64_MAX, "tree_insert(): values", 0, &vs, &val) < 0) {
        goto out_key;
    }
    size_t n = key.len;
    int32_t ns = 0, made = -1;
    if (val.len != n) {
        PyErr_Format(PyExc_ValueError, "tree_insert(): %zu values for %zu tokens", val.len, n);
    }
    else if (n % (size_t)self->page_size != 0) {
        PyErr_Format(PyExc_ValueError, "tree_insert(): %zu tokens are not whole pages", n);
    }
    else if (mr_py_namespace_new(self->tree, a[3], &ns, &made) == 0) {
        mr_insert_result ir;
        mr_insert_opts io = {(size_t)inserted, prio, NULL, NULL};
        int rc = mr_radix_insert_ex(self->tree, key.data, val.data, n, ns, state, (size_t)prev, &io, NULL, &ir);
        if (rc != MR_OK) {
            mr_ns_forget_newest(mr_radix_namespaces(self->tree), made);   /* a refused insert names nothing */
            mr_raise(mr_state_from_type(Py_TYPE(self)), rc, "tree_insert()");
        }
        else {
            PyObject *node = mr_py_radix_node(self->tree_obj, ir.node);
            if (node != NULL) {
                res = Py_BuildValue("(nNNn)", (Py_ssize_t)ir.prefix_len, PyBool_FromLong(ir.state_existed), node,
                                    (Py_ssize_t)ir.ndup);
            }
        }
    }
    mr_ints_release(&val);
    mr_buf_free(&vs);
out_key:
    mr_ints_release(&key);
    mr_buf_give(&self->keybuf, &ks);
    return res;
}

static PyObject *
UnifiedCore_end_insert(UnifiedCore *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyList_New(0);
}

static PyObject *
UnifiedCore_has_ongoing_insert(UnifiedCore *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    Py_RETURN_FALSE;
}

static PyMethodDef UnifiedCore_methods[] = {
    {"match_prefix", (PyCFunction)UnifiedCore_match_prefix, METH_O,
     "match_prefix(params) -> SGLang's MatchResult (the TreeCore's match, one C call)."},
    {"begin_insert", (PyCFunction)UnifiedCore_begin_insert, METH_O,
     "begin_insert(params) -> SGLang's InsertStepResult (the whole insert: one step)."},
    {"end_insert", (PyCFunction)UnifiedCore_end_insert, METH_NOARGS, "end_insert() -> [] (nothing deferred)."},
    {"has_ongoing_insert", (PyCFunction)UnifiedCore_has_ongoing_insert, METH_NOARGS,
     "has_ongoing_insert() -> False (an insert is one step)."},
    {"collect_full_device_indices", (PyCFunction)(void (*)(void))UnifiedCore_collect_full_device_indices,
     METH_FASTCALL, "collect_full_device_indices(from_node_id, until_node_id) -> the path's KV indices."},
    {"path_device_indices", (PyCFunction)UnifiedCore_path_device_indices, METH_O,
     "path_device_indices(node_id) -> the KV indices root..node."},
    {"inc_lock_ref", (PyCFunction)(void (*)(void))UnifiedCore_inc_lock_ref, METH_FASTCALL | METH_KEYWORDS,
     "inc_lock_ref(node_id, skip_lock_components=()) -> SGLang's IncLockRefResult."},
    {"dec_lock_ref", (PyCFunction)(void (*)(void))UnifiedCore_dec_lock_ref, METH_FASTCALL | METH_KEYWORDS,
     "dec_lock_ref(node_id, params, skip_swa=False) -> SGLang's DecLockRefResult."},
    {"node", (PyCFunction)UnifiedCore_node, METH_O, "node(node_id) -> the tree's Node handle for a NodeId."},
    {"tree_insert", (PyCFunction)(void (*)(void))UnifiedCore_tree_insert, METH_FASTCALL,
     "tree_insert(tokens, values, state, extra_key, prev_prefix_len, inserted_len, priority) -> "
     "(prefix_len, state_existed, node, ndup): the Python path's insert."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot UnifiedCore_slots[] = {
    {Py_tp_new, UnifiedCore_new},
    {Py_tp_dealloc, UnifiedCore_dealloc},
    {Py_tp_traverse, UnifiedCore_traverse},
    {Py_tp_clear, UnifiedCore_clear},
    {Py_tp_methods, UnifiedCore_methods},
    {Py_tp_doc, (void *)"The hot calls of mambaradix.sglang.unified's TreeCore over a RadixTree "
                        "(built by the adapter; not a public API)."},
    {0, NULL},
};

static PyType_Spec UnifiedCore_spec = {
    .name = "mambaradix._C.UnifiedCore",
    .basicsize = sizeof(UnifiedCore),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = UnifiedCore_slots,
};

int
mr_py_unified_init(PyObject *m, mr_state *st)
{
    (void)st;
    PyObject *tp = PyType_FromModuleAndSpec(m, &UnifiedCore_spec, NULL);
    if (tp == NULL) {
        return -1;
    }
    int rc = PyModule_AddType(m, (PyTypeObject *)tp);
    Py_DECREF(tp);
    return rc;
}
