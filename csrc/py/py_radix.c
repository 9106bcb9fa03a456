/* py_radix.c - mambaradix.RadixTree and mambaradix.Node.
 *
 * RadixTree owns one mr_radix.  Keys are read through the buffer protocol
 * (int32 C-contiguous buffers without a copy) or converted from any int
 * sequence into a per-tree scratch buffer.  Index results are numpy int64
 * arrays.  A Node is a (tree, id, generation) handle: it never points into
 * tree memory, so it stays safe after its node is split or evicted
 * (StaleNodeError when used then). */
#include "py_common.h"
#include "py_numpy.h"
#include "py_ints.h"
#include "idset.h"
#include "radix.h"
#include "radix_ops.h"
#include "py_radix.h"

#include <string.h>

#include "structmember.h"

typedef struct {
    PyObject_HEAD
    mr_radix *tree;
    mr_buf keybuf;         /* scratch for converted keys */
    mr_buf valbuf;         /* scratch for converted values */
    PyObject *weakreflist;
    int check_ownership;   /* RadixTree(check_ownership=True): */
    mr_owned owned;        /*   what the tree holds (idset.h) */
    PyObject *tree_owner;  /* a view (mr_py_radix_view): the owner of `tree` */
} RadixTree;

typedef struct {
    PyObject_HEAD
    RadixTree *owner;      /* strong reference */
    mr_handle h;
} Node;

static inline mr_state *
tree_state(PyObject *self)
{
    return mr_state_from_type(Py_TYPE(self));
}

/* ------------------------------------------------------------------------
 * Reading arguments */

static int
read_key(PyObject *obj, mr_buf *scratch, mr_ints *v)
{
    return mr_ints_read(obj, 4, INT32_MIN, INT32_MAX, "key", 0, scratch, v);
}

int
mr_py_namespace_new(mr_radix *t, PyObject *extra_key, int32_t *ns, int32_t *made)
{
    int32_t before = mr_radix_namespaces(t)->n;
    if (mr_py_namespace(t, extra_key, 1, ns) < 0) {
        return -1;
    }
    *made = mr_radix_namespaces(t)->n > before ? *ns : -1;
    return 0;
}

/* extra_key (SGLang's namespace: a str or None) -> its id in the tree's
 * table (csrc/core/nstable.h).  None -> 0; an unknown name gets a new id when
 * `create`, else -1 (matches nothing).  The name is the str's UTF-8 bytes
 * (lone surrogates kept as they are). */
int
mr_py_namespace(mr_radix *t, PyObject *extra_key, int create, int32_t *ns)
{
    if (extra_key == NULL || extra_key == Py_None) {
        *ns = 0;
        return 0;
    }
    if (!PyUnicode_Check(extra_key)) {
        PyErr_Format(PyExc_TypeError, "extra_key must be a str or None, not %.100s", Py_TYPE(extra_key)->tp_name);
        return -1;
    }
    Py_ssize_t len;
    PyObject *bytes = NULL;
    const char *name = PyUnicode_AsUTF8AndSize(extra_key, &len);
    if (name == NULL) {
        PyErr_Clear();
        bytes = PyUnicode_AsEncodedString(extra_key, "utf-8", "surrogatepass");
        if (bytes == NULL) {
            return -1;
        }
        name = PyBytes_AS_STRING(bytes);
        len = PyBytes_GET_SIZE(bytes);
    }
    int rc = mr_ns_lookup(mr_radix_namespaces(t), name, (size_t)len, create, ns);
    Py_XDECREF(bytes);
    if (rc == MR_ENOSPC) {
        PyErr_Format(PyExc_OverflowError, "too many distinct extra_key values (at most %d)", MR_NS_MAX);
        return -1;
    }
    return rc == MR_OK ? 0 : (mr_raise(NULL, rc, "extra_key"), -1);
}

/* The extra_key of namespace id ns: None for 0 or an id the table never
 * handed out. */
PyObject *
mr_py_namespace_name(mr_radix *t, int32_t ns)
{
    const char *name;
    size_t len;
    if (mr_ns_name(mr_radix_namespaces(t), ns, &name, &len) != MR_OK) {
        Py_RETURN_NONE;
    }
    return PyUnicode_DecodeUTF8(name, (Py_ssize_t)len, "surrogatepass");
}

/* ------------------------------------------------------------------------
 * Results */

static PyObject *
node_new_handle(mr_state *st, RadixTree *owner, const mr_node *n)
{
    Node *obj = PyObject_New(Node, (PyTypeObject *)st->Node);
    if (obj == NULL) {
        return NULL;
    }
    obj->owner = (RadixTree *)Py_NewRef(owner);
    obj->h = mr_node_handle(n);
    return (PyObject *)obj;
}

static PyObject *
state_or_none(int64_t s)
{
    return s >= 0 ? PyLong_FromLongLong(s) : Py_NewRef(Py_None);
}

/* Resolves a Node argument of this tree; raises TypeError / StaleNodeError
 * naming `arg`. */
static int
resolve_node(mr_state *st, RadixTree *self, PyObject *obj, const char *arg, mr_node **out)
{
    if (!PyObject_TypeCheck(obj, (PyTypeObject *)st->Node)) {
        PyErr_Format(PyExc_TypeError, "%s must be a mambaradix.Node, not %.100s", arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    Node *n = (Node *)obj;
    if (n->owner != self) {
        PyErr_Format(st->StaleNodeError, "%s belongs to another tree", arg);
        return -1;
    }
    if (mr_radix_resolve(self->tree, n->h, out) != MR_OK) {
        PyErr_Format(st->StaleNodeError, "%s was removed from the tree (stale handle)", arg);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * The node API of a tree, one implementation for RadixTree (nodes as Node
 * handles of `owner`) and Lifecycle (nodes as (id, gen) tuples: owner
 * NULL); declared in py_common.h. */

PyObject *
mr_py_node_ref(PyObject *owner, const mr_node *n)
{
    if (owner != NULL) {
        return node_new_handle(tree_state(owner), (RadixTree *)owner, n);
    }
    mr_handle h = mr_node_handle(n);
    return Py_BuildValue("(kk)", (unsigned long)h.id, (unsigned long)h.gen);
}

PyObject *
mr_py_node_list(PyObject *owner, const mr_radix *t, const mr_node *parent, int which)
{
    PyObject *list = PyList_New(0);
    size_t pos = 0;
    const mr_node *n = parent != NULL ? mr_node_child_next(parent, &pos) : mr_radix_lru_first(t, which);
    while (n != NULL && list != NULL) {
        PyObject *e = mr_py_node_ref(owner, n);
        if (e == NULL || PyList_Append(list, e) < 0) {
            Py_CLEAR(list);
        }
        Py_XDECREF(e);
        n = parent != NULL ? mr_node_child_next(parent, &pos) : mr_radix_lru_next(t, which, n);
    }
    return list;
}

PyObject *
mr_py_node_tokens(const mr_node *n, int wide)
{
    size_t len = mr_node_len(n);
    const int32_t *key = mr_node_key(n);
    npy_intp dims[1] = {(npy_intp)len};
    PyObject *a = PyArray_SimpleNew(1, dims, wide ? NPY_INT64 : NPY_INT32);
    if (a != NULL && !wide && len > 0) {
        memcpy(PyArray_DATA((PyArrayObject *)a), key, len * sizeof(int32_t));
    }
    for (size_t i = 0; a != NULL && wide && i < len; i++) {
        ((int64_t *)PyArray_DATA((PyArrayObject *)a))[i] = key[i];
    }
    return a;
}

PyObject *
mr_py_node_values(const mr_radix *t, const mr_node *n)
{
    if (mr_node_values(n) == NULL && mr_node_len(n) > 0) {
        return Py_NewRef(Py_None);   /* a tree without values */
    }
    PyObject *a = mr_i64_array(NULL, mr_node_len(n));
    if (a != NULL) {
        mr_node_values_i64(t, n, 0, mr_node_len(n), PyArray_DATA((PyArrayObject *)a));
    }
    return a;
}

PyObject *
mr_py_tree_dump(const mr_radix *t, const char *fname)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = mr_radix_dump(t, &buf, &len);
    if (rc != MR_OK) {
        return mr_raise(NULL, rc, fname);
    }
    PyObject *s = PyUnicode_FromStringAndSize(buf, (Py_ssize_t)len);
    free(buf);
    return s;
}

PyObject *
mr_py_tree_attr(const mr_radix *t, void *closure)
{
    const mr_radix_config *c = mr_radix_config_of(t);
    const char *name = closure;
    if (name[0] == 'l') {   /* lru_policy */
        return PyUnicode_FromString(mr_policy_name(c->policy));
    }
    return PyLong_FromUnsignedLong(name[0] == 'p' ? c->page_size : c->chunk_size);
}

/* ------------------------------------------------------------------------
 * RadixTree */

static PyObject *
RadixTree_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    MR_ARGS(spec, a, "RadixTree", 0, 3, 0, "page_size", "chunk_size", "lru_policy", "check_ownership",
            "policy_options", "max_states_per_path", "semantics", "kv_only", "values");
    const char *policy = "consumed", *semantics = "v0.5.15";
    int check_ownership = 0, kv_only = 0, values = 1;
    if (mr_parse_tuple(&spec, args, kwds, a) < 0 || mr_arg_str(a[2], "RadixTree", "lru_policy", 0, &policy) < 0
        || mr_arg_bool(a[3], "RadixTree", "check_ownership", &check_ownership) < 0
        || mr_arg_str(a[6], "RadixTree", "semantics", 0, &semantics) < 0
        || mr_arg_bool(a[7], "RadixTree", "kv_only", &kv_only) < 0
        || mr_arg_bool(a[8], "RadixTree", "values", &values) < 0) {
        return NULL;
    }
    if (!values && check_ownership) {
        PyErr_SetString(PyExc_ValueError,
                        "RadixTree(): check_ownership checks KV indices, which a tree made with values=False "
                        "does not hold");
        return NULL;
    }
    PyObject *page_obj = a[0], *chunk_obj = a[1] ? a[1] : Py_None, *opts = a[4] ? a[4] : Py_None,
             *budget = a[5] ? a[5] : Py_None;
    int64_t page = 1, chunk = 0;
    if ((page_obj != NULL && mr_as_int64(page_obj, 1, 1 << 20, "page_size", &page) < 0)
        || (chunk_obj != Py_None && mr_as_int64(chunk_obj, 1, 1 << 24, "chunk_size", &chunk) < 0)) {
        return NULL;
    }
    if (mr_radix_page_chunk(page, &chunk) != MR_OK) {
        PyErr_Format(PyExc_ValueError, "chunk_size (%lld) and page_size (%lld): one must divide the other",
                     (long long)chunk, (long long)page);
        return NULL;
    }
    mr_radix_config cfg = {.page_size = (uint32_t)page, .chunk_size = (uint32_t)chunk, .policy = MR_POLICY_CONSUMED};
    mr_radix_options opt = {0};
    mr_leaf_order order;
    if (mr_read_policy("RadixTree()", policy, opts, budget, &cfg, &opt, &order) < 0) {
        return NULL;
    }
    cfg.kv_only = kv_only;
    cfg.no_values = !values;
    if (mr_radix_semantics_by_name(semantics, &cfg.semantics) != MR_OK) {
        PyErr_Format(PyExc_ValueError, "semantics must be 'v0.5.15' or 'v0.5.23', not '%s'", semantics);
        return NULL;
    }
    RadixTree *self = (RadixTree *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->check_ownership = check_ownership;
    mr_owned_init(&self->owned);
    int rc = mr_radix_create(&cfg, &opt, &order, &self->tree);
    if (rc != MR_OK) {
        mr_raise(mr_state_from_type(type), rc, "RadixTree()");
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
RadixTree_dealloc(RadixTree *self)
{
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    if (self->tree_owner == NULL) {
        mr_radix_free(self->tree);
    }
    Py_XDECREF(self->tree_owner);
    mr_owned_free(&self->owned);
    mr_buf_free(&self->keybuf);
    mr_buf_free(&self->valbuf);
    mr_type_free((PyObject *)self);
}

PyObject *
mr_py_path_indices(const mr_radix *t, const mr_node *n, size_t len)
{
    if (mr_radix_config_of(t)->no_values) {
        return Py_NewRef(Py_None);
    }
    PyObject *idx = mr_i64_array(NULL, len);
    if (idx != NULL) {
        mr_radix_path_values(t, n, PyArray_DATA((PyArrayObject *)idx));
    }
    return idx;
}

/* An insert's duplicates, the caller's val[start : start + n): a view of a
 * numpy int64 value array, else a new array. */
static PyObject *
duplicates_of(PyObject *value, const int64_t *val, size_t start, size_t n)
{
    if (PyArray_CheckExact(value) && val == PyArray_DATA((PyArrayObject *)value)) {
        return PySequence_GetSlice(value, (Py_ssize_t)start, (Py_ssize_t)(start + n));
    }
    return mr_i64_array(val + start, n);
}

PyDoc_STRVAR(RadixTree_match_prefix__doc__,
"match_prefix($self, key, /, extra_key=None, indices=True)\n"
"--\n"
"\n"
"Longest usable cached prefix of key (truncated to whole pages).\n"
"\n"
"Returns MatchResult(indices, node, state, kv_matched_len, branching_seqlen):\n"
"the KV indices from the root to the deepest matched node that has a state,\n"
"that node (the root when none), its state slot, how many tokens matched\n"
"KV-wise (through stateless nodes), and that length aligned down to\n"
"chunk_size when it goes deeper than node (else None).  A partially matched\n"
"edge is split, as in SGLang; LRU lists are refreshed.  indices=False:\n"
"MatchResult.indices is None (no copy of the path's indices).");

/* A lookup's key into the tree's keybuf (taken here), then extra_key's
 * namespace id (-1: a name the tree does not know), in that order: reading
 * the key may run Python code (an item's __index__) that inserts under
 * extra_key, creating its id.  0, or -1 with an exception and nothing to
 * give back; on 0 the caller hands key and *ks to lookup_done. */
static int
lookup_args(RadixTree *self, PyObject *key_obj, PyObject *extra_key, mr_buf *ks, mr_ints *key, int32_t *ns)
{
    *ks = mr_buf_take(&self->keybuf);
    if (read_key(key_obj, ks, key) < 0) {
        mr_buf_give(&self->keybuf, ks);
        return -1;
    }
    if (mr_py_namespace(self->tree, extra_key, 0, ns) < 0) {
        mr_ints_release(key);
        mr_buf_give(&self->keybuf, ks);
        return -1;
    }
    return 0;
}

static void
lookup_done(RadixTree *self, mr_buf *ks, mr_ints *key)
{
    mr_ints_release(key);
    mr_buf_give(&self->keybuf, ks);
}

static PyObject *
RadixTree_match_prefix(RadixTree *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "match_prefix", 1, 2, 1, "key", "extra_key", "indices");
    mr_state *st = tree_state((PyObject *)self);
    int32_t ns;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    int want = 1;
    if (mr_arg_bool(a[2], "match_prefix", "indices", &want) < 0) {
        return NULL;
    }
    mr_ints key;
    mr_buf ks;
    if (lookup_args(self, a[0], a[1], &ks, &key, &ns) < 0) {
        return NULL;
    }
    mr_match m;
    int rc = mr_radix_match(self->tree, key.data, key.len, ns, &m);
    lookup_done(self, &ks, &key);
    if (rc != MR_OK) {
        return mr_raise(st, rc, "match_prefix()");
    }
    mr_seq r = mr_seq_new(st->MatchResult);
    MR_SEQ_ADD(r, want ? mr_py_path_indices(self->tree, m.node, m.prefix_len) : Py_NewRef(Py_None));
    MR_SEQ_ADD(r, node_new_handle(st, self, m.node));
    MR_SEQ_ADD(r, state_or_none(m.state));
    MR_SEQ_ADD(r, PyLong_FromSize_t(m.kv_matched_len));
    MR_SEQ_ADD(r, state_or_none(m.branching_seqlen));
    MR_SEQ_ADD(r, node_new_handle(st, self, m.kv_node));
    return r.res;
}

PyDoc_STRVAR(RadixTree_cached_len__doc__,
"cached_len($self, key, /, extra_key=None)\n"
"--\n"
"\n"
"How many leading tokens of key the tree holds under extra_key (whole\n"
"pages): the kv_matched_len match_prefix would report, without its effects\n"
"(no split, no recency touched, no result objects).  An extra_key the tree\n"
"has never seen holds nothing.");

static PyObject *
RadixTree_cached_len(RadixTree *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "cached_len", 1, 2, 1, "key", "extra_key");
    int32_t ns;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    mr_ints key;
    mr_buf ks;
    if (lookup_args(self, a[0], a[1], &ks, &key, &ns) < 0) {
        return NULL;
    }
    size_t n = ns < 0 ? 0 : mr_radix_cached_len(self->tree, key.data, key.len, ns);
    lookup_done(self, &ks, &key);
    return PyLong_FromSize_t(n);
}

/* An insert the tree refused (mr_owned_insert: rc, and why the ownership
 * check of RadixTree(check_ownership=True) refused it), raised: the check's
 * refusals as ValueError naming the argument. */
static void
insert_refused(mr_state *st, int rc, mr_owned_why why, size_t i, const int64_t *val, size_t klen, int64_t state,
               int64_t prev)
{
    switch (why) {
    case MR_OWNED_OK:
        mr_raise(st, rc, "insert()");
        break;
    case MR_OWNED_PREV_PAST_KEY:
        PyErr_Format(PyExc_ValueError, "insert(): prev_prefix_len %lld exceeds the key's %zu tokens",
                     (long long)prev, klen);
        break;
    case MR_OWNED_STATE_HELD:
        PyErr_Format(PyExc_ValueError,
                     "insert(): state %lld is already in the tree (a slot cannot be inserted twice)",
                     (long long)state);
        break;
    case MR_OWNED_KV_HELD:
        PyErr_Format(PyExc_ValueError,
                     "insert(): value[%zu] = %lld is already in the tree (a KV index cannot be "
                     "inserted twice; pass the tree's own prefix as prev_prefix_len)",
                     i, (long long)val[i]);
        break;
    case MR_OWNED_KV_TWICE:
        PyErr_Format(PyExc_ValueError, "insert(): value[%zu] = %lld is listed twice", i, (long long)val[i]);
        break;
    }
}

PyDoc_STRVAR(RadixTree_insert__doc__,
"insert($self, key, value, state, /, *, extra_key=None, prev_prefix_len=0,\n"
"       priority=0, inserted_len=0)\n"
"--\n"
"\n"
"Insert key with its KV indices (value, same length) and the state slot at\n"
"its end (None: no state, semantics='v0.5.23' only).  len(key) must be a\n"
"multiple of page_size.\n"
"\n"
"Returns InsertResult(prefix_len, state_existed, node, duplicates):\n"
"tokens already cached; whether the end node already had a state (then the\n"
"caller keeps and frees its slot); the node ending at the key's end; and\n"
"the caller's indices for already-cached tokens past prev_prefix_len,\n"
"which the caller must free.  The tree frees nothing itself.\n"
"\n"
"priority and inserted_len feed SGLang 0.5.23's leaf orders: every node the\n"
"insert walks or creates keeps the highest priority inserted through it\n"
"('priority'), and counts a hit ('lfu', 'slru') when it ends past\n"
"inserted_len, the tokens this request inserted before.");

static PyObject *
RadixTree_insert(RadixTree *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "insert", 3, 3, 3, "key", "value", "state", "extra_key", "prev_prefix_len", "priority",
            "inserted_len");
    mr_state *st = tree_state((PyObject *)self);
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    PyObject *extra = a[3], *prev_obj = a[4];
    int64_t state = MR_NO_STATE, prev = 0;
    /* None (no state) is SGLang 0.5.23's insert without a Mamba value. */
    int stateless = args[2] == Py_None && mr_radix_config_of(self->tree)->semantics == MR_SEMANTICS_V0523;
    if (!stateless && mr_as_int64(args[2], 0, INT64_MAX, "state", &state) < 0) {
        return NULL;
    }
    if (prev_obj != NULL && mr_as_int64(prev_obj, 0, INT64_MAX, "prev_prefix_len", &prev) < 0) {
        return NULL;
    }
    mr_insert_opts io = {0, 0, NULL, NULL};
    int64_t inserted = 0;
    if ((a[5] != NULL && mr_as_int64(a[5], INT64_MIN, INT64_MAX, "priority", &io.priority) < 0)
        || (a[6] != NULL && mr_as_int64(a[6], 0, INT64_MAX, "inserted_len", &inserted) < 0)) {
        return NULL;
    }
    io.inserted_len = (size_t)inserted;
    mr_ints kb = {0}, vb = {0};
    PyObject *res = NULL;
    int32_t ns, made = -1;
    if (mr_py_namespace(self->tree, extra, 0, &ns) < 0) {   /* its type; a new name is made at the insert */
        return NULL;
    }
    const int novals = mr_radix_config_of(self->tree)->no_values;
    if (novals && args[1] != Py_None) {
        PyErr_SetString(PyExc_ValueError, "insert(): value must be None in a tree made with values=False");
        return NULL;
    }
    mr_buf ks = mr_buf_take(&self->keybuf), vs = mr_buf_take(&self->valbuf);
    if (read_key(args[0], &ks, &kb) < 0
        || (!novals && mr_ints_read(args[1], 8, 0, INT64_MAX, "value", 0, &vs, &vb) < 0)) {
        goto done;
    }
    const int32_t *key = kb.data;
    const int64_t *val = vb.data;
    size_t klen = kb.len, vlen = novals ? kb.len : vb.len;
    if (vlen != klen) {
        PyErr_Format(PyExc_ValueError, "value has %zu indices but key has %zu tokens", vlen, klen);
        goto done;
    }
    if (klen % mr_radix_config_of(self->tree)->page_size != 0) {
        PyErr_Format(PyExc_ValueError, "key length %zu is not a multiple of page_size %u",
                     klen, mr_radix_config_of(self->tree)->page_size);
        goto done;
    }
    if (ns < 0 && mr_py_namespace_new(self->tree, extra, &ns, &made) < 0) {
        goto done;
    }
    mr_insert_result ir;
    mr_owned_why why;
    size_t bad = 0;
    int rc = mr_owned_insert(self->check_ownership ? &self->owned : NULL, self->tree, key, val, klen, ns, state,
                             (size_t)prev, &io, &why, &bad, &ir);
    if (rc != MR_OK) {
        mr_ns_forget_newest(mr_radix_namespaces(self->tree), made);   /* a refused insert names nothing */
        insert_refused(st, rc, why, bad, val, klen, state, prev);
        goto done;
    }
    /* Past this point the tree changed: build the result, and on a
     * (memory) failure still report it as an exception. */
    mr_seq r = mr_seq_new(st->InsertResult);
    MR_SEQ_ADD(r, PyLong_FromSize_t(ir.prefix_len));
    MR_SEQ_ADD(r, Py_NewRef(ir.state_existed ? Py_True : Py_False));
    MR_SEQ_ADD(r, node_new_handle(st, self, ir.node));
    MR_SEQ_ADD(r, novals ? Py_NewRef(Py_None) : duplicates_of(args[1], val, ir.prefix_len - ir.ndup, ir.ndup));
    res = r.res;
done:
    mr_ints_release(&kb);
    mr_ints_release(&vb);
    mr_buf_give(&self->keybuf, &ks);
    mr_buf_give(&self->valbuf, &vs);
    return res;
}

/* Runs one eviction of `kind` (mr_radix_evict_into) and builds its result:
 * the EvictResult (want 0: kv_indices empty, the tokens only counted), or
 * for MR_EVICT_PATH_STATES the dropped state slots.  A partial eviction
 * still returns what was released: the caller must free it. */
static PyObject *
evict_call(RadixTree *self, mr_evict_kind kind, mr_node *node, size_t n, int want, const char *fname)
{
    mr_state *st = tree_state((PyObject *)self);
    mr_evict_out out = {0};
    size_t tokens, nstates;
    int rc = mr_radix_evict_into(self->tree, kind, node, n, want, self->check_ownership ? &self->owned : NULL,
                                 &out, &tokens, &nstates);
    PyObject *res = NULL;
    if (rc != MR_OK) {
        mr_raise(st, rc, fname);
    }
    else if (kind == MR_EVICT_PATH_STATES) {
        res = mr_i64_array(out.st, out.nst);
    }
    else {
        mr_seq r = mr_seq_new(st->EvictResult);
        MR_SEQ_ADD(r, PyLong_FromSize_t(tokens));
        MR_SEQ_ADD(r, PyLong_FromSize_t(nstates));
        MR_SEQ_ADD(r, mr_i64_array(out.kv, want ? out.nkv : 0));
        MR_SEQ_ADD(r, mr_i64_array(out.st, out.nst));
        res = r.res;
    }
    mr_evict_out_free(&out);
    return res;
}

/* evict_full / evict_mamba: the count, then the eviction. */
static PyObject *
do_evict(RadixTree *self, PyObject *arg, PyObject *indices, int states, const char *fname)
{
    int64_t n;
    int want = 1;
    if (mr_as_int64(arg, 0, INT64_MAX, states ? "num_states" : "num_tokens", &n) < 0
        || mr_arg_bool(indices, states ? "evict_mamba" : "evict_full", "indices", &want) < 0) {
        return NULL;
    }
    return evict_call(self, states ? MR_EVICT_STATE : MR_EVICT_FULL, NULL, (size_t)n, want, fname);
}

PyDoc_STRVAR(RadixTree_evict_full__doc__,
"evict_full($self, num_tokens, /, *, indices=True)\n"
"--\n"
"\n"
"Evict least recently used unlocked leaves (with their states and the\n"
"stateless nodes left childless above them) until at least num_tokens KV\n"
"tokens are released.  Returns EvictResult(tokens_evicted, states_evicted,\n"
"kv_indices, state_slots); the caller frees the returned indices and slots.\n"
"indices=False: kv_indices is empty (the tokens are only counted), for a\n"
"caller that keeps no KV pool.");

static PyObject *
RadixTree_evict_full(RadixTree *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "evict_full", 1, 1, 1, "num_tokens", "indices");
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    return do_evict(self, a[0], a[1], 0, "evict_full()");
}

PyDoc_STRVAR(RadixTree_evict_mamba__doc__,
"evict_mamba($self, num_states, /, *, indices=True)\n"
"--\n"
"\n"
"Evict least recently used unlocked states until num_states are released:\n"
"an internal node keeps its KV and becomes stateless; a leaf is removed\n"
"with its KV.  A leaf whose KV is locked is never picked.  Returns\n"
"EvictResult; the caller frees the returned indices and slots.\n"
"indices=False: kv_indices is empty (the tokens are only counted).");

static PyObject *
RadixTree_evict_mamba(RadixTree *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "evict_mamba", 1, 1, 1, "num_states", "indices");
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0) {
        return NULL;
    }
    return do_evict(self, a[0], a[1], 1, "evict_mamba()");
}

PyDoc_STRVAR(RadixTree_inc_kv_lock__doc__,
"inc_kv_lock($self, node, /)\n"
"--\n"
"\n"
"Protect the KV of node's path, not its state (SGLang 0.5.23's lock that\n"
"skips the Mamba component).  Undo with dec_kv_lock.");

PyDoc_STRVAR(RadixTree_dec_kv_lock__doc__,
"dec_kv_lock($self, node, /)\n"
"--\n"
"\n"
"Undo one inc_kv_lock(node).  ValueError if node holds none (a lock of\n"
"inc_lock_ref is undone by dec_lock_ref).");

/* The lock calls on a node, one mr_radix_lock_op each.  A refused unlock
 * says which kind of lock the node holds instead, when it holds one. */
static PyObject *
lock_call(RadixTree *self, PyObject *arg, mr_lock_op op)
{
    static const struct {
        const char *fname;        /* a lock the core refused */
        const char *not_locked;   /* an unlock without a lock of its kind */
        const char *other;        /* ... when the node holds `other` locks of the other kind */
    } words[] = {
        [MR_LOCK] = {"inc_lock_ref(): node", NULL, NULL},
        [MR_UNLOCK] = {NULL, "dec_lock_ref(): node is not locked",
                       "dec_lock_ref(): node holds no lock of inc_lock_ref, only %d of inc_kv_lock (undo those "
                       "with dec_kv_lock)"},
        [MR_LOCK_KV] = {"inc_kv_lock(): node", NULL, NULL},
        [MR_UNLOCK_KV] = {NULL, "dec_kv_lock(): node is not locked",
                          "dec_kv_lock(): node holds no lock of inc_kv_lock (a lock of inc_lock_ref is undone by "
                          "dec_lock_ref)"},
        [MR_UNLOCK_STATE] = {NULL, "dec_state_lock(): node holds no lock of inc_lock_ref", NULL},
    };
    mr_state *st = tree_state((PyObject *)self);
    mr_node *n;
    if (resolve_node(st, self, arg, "node", &n) < 0) {
        return NULL;
    }
    int32_t other = 0;
    int rc = mr_radix_lock_op(self->tree, n, op, &other);
    if (rc != MR_OK) {
        if (words[op].fname != NULL) {
            return mr_raise(st, rc, words[op].fname);
        }
        if (other > 0 && words[op].other != NULL) {
            return PyErr_Format(PyExc_ValueError, words[op].other, (int)other);
        }
        PyErr_SetString(PyExc_ValueError, words[op].not_locked);
        return NULL;
    }
    Py_RETURN_NONE;
}

#define LOCK_METHOD(name, op)                                 \
    static PyObject *                                         \
    RadixTree_##name(RadixTree *self, PyObject *arg)          \
    {                                                         \
        return lock_call(self, arg, op);                      \
    }

LOCK_METHOD(inc_kv_lock, MR_LOCK_KV)
LOCK_METHOD(dec_kv_lock, MR_UNLOCK_KV)

PyDoc_STRVAR(RadixTree_dec_state_lock__doc__,
"dec_state_lock($self, node, /)\n"
"--\n"
"\n"
"Release the state part of one inc_lock_ref(node) and keep its KV part as\n"
"one inc_kv_lock(node) lock (SGLang 0.5.23 releasing a lock's MAMBA\n"
"component first; dec_kv_lock releases the rest).  ValueError if node holds\n"
"no lock of inc_lock_ref.");

LOCK_METHOD(dec_state_lock, MR_UNLOCK_STATE)

PyDoc_STRVAR(RadixTree_path_indices__doc__,
"path_indices($self, node, /)\n"
"--\n"
"\n"
"KV indices of the path from the root to node's end, in token order\n"
"(numpy int64).");

static PyObject *
RadixTree_path_indices(RadixTree *self, PyObject *arg)
{
    mr_state *st = tree_state((PyObject *)self);
    mr_node *n;
    if (resolve_node(st, self, arg, "node", &n) < 0) {
        return NULL;
    }
    if (mr_radix_config_of(self->tree)->no_values) {
        PyErr_SetString(PyExc_ValueError, "path_indices(): a tree made with values=False holds no KV indices");
        return NULL;
    }
    return mr_py_path_indices(self->tree, n, mr_radix_path_len(self->tree, n));
}

PyDoc_STRVAR(RadixTree_negative_tokens__doc__,
"negative_tokens($self, /)\n"
"--\n"
"\n"
"The negative tokens in the tree's keys (numpy int64; a run of one value\n"
"once per node, so not deduplicated): the stand-ins a front end that maps\n"
"ids outside int32 to negative ones still needs.");

static PyObject *
RadixTree_negative_tokens(RadixTree *self, PyObject *Py_UNUSED(ignored))
{
    size_t n = mr_radix_negative_tokens(self->tree, NULL, 0);
    PyObject *arr = mr_i64_array(NULL, n);
    if (arr != NULL && n > 0) {
        mr_radix_negative_tokens(self->tree, PyArray_DATA((PyArrayObject *)arr), n);
    }
    return arr;
}

PyDoc_STRVAR(RadixTree_evict_path_states__doc__,
"evict_path_states($self, node, cap, /)\n"
"--\n"
"\n"
"SGLang 0.5.23's mamba_max_states_per_path: drop the shallowest states on\n"
"the path to node beyond cap (KV kept), skipping node itself, locked states,\n"
"forks and leaves.  Returns the dropped state slots (numpy int64) to free.");

static PyObject *
RadixTree_evict_path_states(RadixTree *self, PyObject *const *args, Py_ssize_t nargs)
{
    mr_state *st = tree_state((PyObject *)self);
    mr_node *n;
    int64_t cap;
    MR_ARGS(spec, a, "evict_path_states", 2, 2, 2, "node", "cap");
    /* cap before the node: its __index__ may run Python code that removes
     * the node (evict, reset) */
    if (mr_parse(&spec, args, nargs, NULL, a) < 0
        || mr_as_int64(args[1], 0, INT64_MAX, "cap", &cap) < 0
        || resolve_node(st, self, args[0], "node", &n) < 0) {
        return NULL;
    }
    return evict_call(self, MR_EVICT_PATH_STATES, n, (size_t)cap, 1, "evict_path_states()");
}

PyDoc_STRVAR(RadixTree_trim_path__doc__,
"trim_path($self, node, /)\n"
"--\n"
"\n"
"Per-path state budget: while the path root..node holds more than\n"
"max_states_per_path states, drop the deepest state above node on a node\n"
"with one child (the one the new state makes most redundant; a fork's\n"
"state also serves its other branches and stays; its node keeps its KV);\n"
"stop at a locked one.  Does nothing without a budget.\n"
"Returns EvictResult; the caller frees the returned state slots.");

static PyObject *
RadixTree_trim_path(RadixTree *self, PyObject *arg)
{
    mr_state *st = tree_state((PyObject *)self);
    mr_node *n;
    if (resolve_node(st, self, arg, "node", &n) < 0) {
        return NULL;
    }
    return evict_call(self, MR_EVICT_TRIM, n, 0, 1, "trim_path()");
}

PyDoc_STRVAR(RadixTree_evict_node_state__doc__,
"evict_node_state($self, node, /)\n"
"--\n"
"\n"
"Evict node's state as evict_mamba would if it picked node (for a policy\n"
"decided outside the tree).  ValueError unless node.can_evict_state (the\n"
"root, no state, a locked state, a leaf whose KV is locked).  Returns\n"
"EvictResult.");

static PyObject *
RadixTree_evict_node_state(RadixTree *self, PyObject *arg)
{
    mr_state *st = tree_state((PyObject *)self);
    mr_node *n;
    if (resolve_node(st, self, arg, "node", &n) < 0) {
        return NULL;
    }
    if (!mr_radix_can_evict_state(self->tree, n)) {
        PyErr_SetString(PyExc_ValueError,
                        "evict_node_state(): node must have an unlocked state (and, for a leaf, unlocked KV under v0.5.15 rules)");
        return NULL;
    }
    return evict_call(self, MR_EVICT_NODE_STATE, n, 0, 1, "evict_node_state()");
}

PyDoc_STRVAR(RadixTree_policy_stats__doc__,
"policy_stats($self, /)\n"
"--\n"
"\n"
"A dict: states_admitted (states inserted), states_used (of those, used by\n"
"a match at least once), states_trimmed (dropped by the per-path budget),\n"
"alpha (the utility policy's weight in use), kv_weight (1 when a leaf's KV\n"
"bytes count), mru (True when the recency order is reversed: the most\n"
"recently used state goes first) and tunes (its re-tunings); for the\n"
"adaptive policy adaptive_inflation (L, the priority of its last victim),\n"
"ghost_hits (matches that wanted an evicted state), states_superseded (states\n"
"whose uses a new state below them superseded), unused_handovers (of those,\n"
"the ones no match had used that handed their value over), admissions_probation\n"
"(states admitted at the LRU end), placements (matches whose\n"
"branching_seqlen is a predicted junction) and end_placements (of those, the\n"
"end snapshots moved up for requests that part a little above states).");

static PyObject *
RadixTree_policy_stats(RadixTree *self, PyObject *unused)
{
    mr_radix_stats s;
    mr_radix_get_stats(self->tree, &s);
    return Py_BuildValue("{sKsKsKsdsdsNsKsdsKsKsKsKsKsK}", "states_admitted",
                         (unsigned long long)s.states_admitted, "states_used", (unsigned long long)s.states_used,
                         "states_trimmed", (unsigned long long)s.states_trimmed, "alpha", s.alpha, "kv_weight",
                         s.kv_weight, "mru", PyBool_FromLong(s.mru), "tunes", (unsigned long long)s.tunes,
                         "adaptive_inflation", s.adaptive_inflation,
                         "ghost_hits", (unsigned long long)s.ghost_hits, "states_superseded",
                         (unsigned long long)s.states_superseded, "unused_handovers",
                         (unsigned long long)s.unused_handovers, "admissions_probation",
                         (unsigned long long)s.admissions_probation, "placements",
                         (unsigned long long)s.placements, "end_placements", (unsigned long long)s.end_placements);
}

PyDoc_STRVAR(RadixTree_inc_lock_ref__doc__,
"inc_lock_ref($self, node, /)\n"
"--\n"
"\n"
"Protect node's state (if it has one) and the KV of its whole path from\n"
"eviction.  Locking the root does nothing.");

LOCK_METHOD(inc_lock_ref, MR_LOCK)

PyDoc_STRVAR(RadixTree_dec_lock_ref__doc__,
"dec_lock_ref($self, node, /)\n"
"--\n"
"\n"
"Undo one inc_lock_ref(node).  ValueError if node holds no such lock (a\n"
"lock of inc_kv_lock is undone by dec_kv_lock).");

LOCK_METHOD(dec_lock_ref, MR_UNLOCK)

#undef LOCK_METHOD

PyDoc_STRVAR(RadixTree_match_node__doc__,
"match_node($self, node, /)\n"
"--\n"
"\n"
"The effects of match_prefix on the key that ends exactly at node, without\n"
"reading the key: LRU refresh and the state's first use, as the match would\n"
"do.  Returns node's prefix length.  For the match that follows an insert\n"
"(cache_unfinished_req), whose result names the node.  ValueError if node\n"
"has no state (a match would stop above it).");

static PyObject *
RadixTree_match_node(RadixTree *self, PyObject *arg)
{
    mr_state *st = tree_state((PyObject *)self);
    mr_node *n;
    if (resolve_node(st, self, arg, "node", &n) < 0) {
        return NULL;
    }
    size_t len = 0;
    if (mr_radix_match_node(self->tree, n, &len) != MR_OK) {
        PyErr_SetString(PyExc_ValueError, "match_node(): node has no state (a match would stop above it)");
        return NULL;
    }
    return PyLong_FromSize_t(len);
}

/* One-field getters of the tree's counters (mr_radix_get_stats). */
#define STAT_METHOD(name, field)                                  \
    static PyObject *                                             \
    RadixTree_##name(RadixTree *self, PyObject *unused)           \
    {                                                             \
        mr_radix_stats s;                                         \
        mr_radix_get_stats(self->tree, &s);                       \
        return PyLong_FromSize_t(s.field);                        \
    }

STAT_METHOD(full_evictable_size, full_evictable)
STAT_METHOD(full_protected_size, full_protected)
STAT_METHOD(mamba_evictable_size, state_evictable)
STAT_METHOD(mamba_protected_size, state_protected)
STAT_METHOD(node_count, nodes)
STAT_METHOD(memory_bytes, memory_bytes)

#undef STAT_METHOD

PyDoc_STRVAR(RadixTree_total_size__doc__,
"total_size($self, /)\n"
"--\n"
"\n"
"(KV tokens, states) held by the tree.");

static PyObject *
RadixTree_total_size(RadixTree *self, PyObject *unused)
{
    mr_radix_stats s;
    mr_radix_get_stats(self->tree, &s);
    return Py_BuildValue("(nn)", (Py_ssize_t)(s.full_evictable + s.full_protected),
                         (Py_ssize_t)(s.state_evictable + s.state_protected));
}

PyDoc_STRVAR(RadixTree_memory_bytes__doc__,
"memory_bytes($self, /)\n"
"--\n"
"\n"
"Bytes of memory the tree holds: nodes, edges (4-byte token + 8-byte index\n"
"per token), child arrays and the handle registry.");

PyDoc_STRVAR(RadixTree_sanity_check__doc__,
"sanity_check($self, /)\n"
"--\n"
"\n"
"Verify every invariant of the tree (structure, lock counts, LRU lists,\n"
"size counters).  Raises InvariantError naming the broken one.");

static PyObject *
RadixTree_sanity_check(RadixTree *self, PyObject *unused)
{
    char msg[256] = "";
    int rc = mr_radix_check(self->tree, msg, sizeof(msg));
    if (rc == MR_ENOMEM) {
        return PyErr_NoMemory();
    }
    if (rc != MR_OK) {
        return mr_raise(tree_state((PyObject *)self), MR_ECORRUPT, msg);
    }
    Py_RETURN_NONE;
}

/* namespace() and namespace_name() of a RadixTree and of a Lifecycle: one
 * implementation over the tree's table (py_common.h). */
const char mr_py_namespace__doc__[] =
"namespace($self, extra_key, /, create=True)\n"
"--\n"
"\n"
"The namespace id of extra_key (None: 0) as insert and match_prefix assign\n"
"them: a new name gets the next id, or -1 (matches nothing) when not\n"
"create.  Ids stay fixed for the tree's life (reset keeps them).";

PyObject *
mr_py_namespace_call(mr_radix *t, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "namespace", 1, 2, 1, "extra_key", "create");
    int create = 1;
    int32_t ns = 0;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || mr_arg_bool(a[1], "namespace", "create", &create) < 0
        || mr_py_namespace(t, a[0], create, &ns) < 0) {
        return NULL;
    }
    return PyLong_FromLong((long)ns);
}

const char mr_py_namespace_name__doc__[] =
"namespace_name($self, ns, /)\n"
"--\n"
"\n"
"The extra_key of namespace id ns, or None (0, or an id never assigned).";

PyObject *
mr_py_namespace_name_call(mr_radix *t, PyObject *arg)
{
    int64_t ns;
    if (mr_as_int64(arg, INT32_MIN, INT32_MAX, "namespace_name(): ns", &ns) < 0) {
        return NULL;
    }
    return mr_py_namespace_name(t, (int32_t)ns);
}

static PyObject *
RadixTree_namespace(RadixTree *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return mr_py_namespace_call(self->tree, args, nargs, kwnames);
}

static PyObject *
RadixTree_namespace_name(RadixTree *self, PyObject *arg)
{
    return mr_py_namespace_name_call(self->tree, arg);
}

PyDoc_STRVAR(RadixTree_reset__doc__,
"reset($self, /)\n"
"--\n"
"\n"
"Drop every node.  Pool slots are not freed (clear the pools); handles of\n"
"removed nodes become stale.");

static PyObject *
RadixTree_reset(RadixTree *self, PyObject *unused)
{
    mr_radix_reset(self->tree);
    mr_owned_clear(&self->owned);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(RadixTree_pretty_print__doc__,
"pretty_print($self, /)\n"
"--\n"
"\n"
"A readable dump of the tree, one node a line, indented by depth.");

static PyObject *
RadixTree_pretty_print(RadixTree *self, PyObject *unused)
{
    return mr_py_tree_dump(self->tree, "pretty_print()");
}

PyDoc_STRVAR(RadixTree_lru_order__doc__,
"lru_order($self, which='full', /)\n"
"--\n"
"\n"
"Nodes of an LRU list ('full': every node; 'mamba': nodes with a state),\n"
"most recently used first.");

static PyObject *
RadixTree_lru_order(RadixTree *self, PyObject *const *args, Py_ssize_t nargs)
{
    MR_ARGS(spec, a, "lru_order", 1, 1, 0, "which");
    if (mr_parse(&spec, args, nargs, NULL, a) < 0) {
        return NULL;
    }
    int which = 0;
    if (nargs == 1) {
        if (!PyUnicode_Check(args[0])) {
            PyErr_SetString(PyExc_TypeError, "which must be 'full' or 'mamba'");
            return NULL;
        }
        if (PyUnicode_CompareWithASCIIString(args[0], "mamba") == 0
            || PyUnicode_CompareWithASCIIString(args[0], "state") == 0) {
            which = 1;
        }
        else if (PyUnicode_CompareWithASCIIString(args[0], "full") != 0) {
            PyErr_SetString(PyExc_ValueError, "which must be 'full' or 'mamba'");
            return NULL;
        }
    }
    return mr_py_node_list((PyObject *)self, self->tree, NULL, which);
}

static PyObject *
RadixTree_get_root(RadixTree *self, void *closure)
{
    return mr_py_node_ref((PyObject *)self, mr_radix_root(self->tree));
}

static PyObject *
RadixTree_get_attr(RadixTree *self, void *closure)
{
    return mr_py_tree_attr(self->tree, closure);
}

static PyObject *
RadixTree_repr(RadixTree *self)
{
    mr_radix_stats s;
    mr_radix_get_stats(self->tree, &s);
    const mr_radix_config *c = mr_radix_config_of(self->tree);
    return PyUnicode_FromFormat("<mambaradix.RadixTree page_size=%u chunk_size=%u nodes=%zu tokens=%zu states=%zu>",
                                c->page_size, c->chunk_size, s.nodes, s.full_evictable + s.full_protected,
                                s.state_evictable + s.state_protected);
}

static PyMethodDef RadixTree_methods[] = {
    {"match_prefix", (PyCFunction)(void (*)(void))RadixTree_match_prefix, METH_FASTCALL | METH_KEYWORDS,
     RadixTree_match_prefix__doc__},
    {"cached_len", (PyCFunction)(void (*)(void))RadixTree_cached_len, METH_FASTCALL | METH_KEYWORDS,
     RadixTree_cached_len__doc__},
    {"insert", (PyCFunction)(void (*)(void))RadixTree_insert, METH_FASTCALL | METH_KEYWORDS, RadixTree_insert__doc__},
    {"evict_full", (PyCFunction)(void (*)(void))RadixTree_evict_full, METH_FASTCALL | METH_KEYWORDS,
     RadixTree_evict_full__doc__},
    {"evict_mamba", (PyCFunction)(void (*)(void))RadixTree_evict_mamba, METH_FASTCALL | METH_KEYWORDS,
     RadixTree_evict_mamba__doc__},
    {"inc_kv_lock", (PyCFunction)RadixTree_inc_kv_lock, METH_O, RadixTree_inc_kv_lock__doc__},
    {"dec_kv_lock", (PyCFunction)RadixTree_dec_kv_lock, METH_O, RadixTree_dec_kv_lock__doc__},
    {"dec_state_lock", (PyCFunction)RadixTree_dec_state_lock, METH_O, RadixTree_dec_state_lock__doc__},
    {"path_indices", (PyCFunction)RadixTree_path_indices, METH_O, RadixTree_path_indices__doc__},
    {"evict_path_states", (PyCFunction)(void (*)(void))RadixTree_evict_path_states, METH_FASTCALL,
     RadixTree_evict_path_states__doc__},
    {"inc_lock_ref", (PyCFunction)RadixTree_inc_lock_ref, METH_O, RadixTree_inc_lock_ref__doc__},
    {"dec_lock_ref", (PyCFunction)RadixTree_dec_lock_ref, METH_O, RadixTree_dec_lock_ref__doc__},
    {"match_node", (PyCFunction)RadixTree_match_node, METH_O, RadixTree_match_node__doc__},
    {"full_evictable_size", (PyCFunction)RadixTree_full_evictable_size, METH_NOARGS,
     "full_evictable_size($self, /)\n--\n\nKV tokens in unlocked nodes."},
    {"full_protected_size", (PyCFunction)RadixTree_full_protected_size, METH_NOARGS,
     "full_protected_size($self, /)\n--\n\nKV tokens in locked nodes."},
    {"mamba_evictable_size", (PyCFunction)RadixTree_mamba_evictable_size, METH_NOARGS,
     "mamba_evictable_size($self, /)\n--\n\nStates not locked."},
    {"mamba_protected_size", (PyCFunction)RadixTree_mamba_protected_size, METH_NOARGS,
     "mamba_protected_size($self, /)\n--\n\nStates locked."},
    {"total_size", (PyCFunction)RadixTree_total_size, METH_NOARGS, RadixTree_total_size__doc__},
    {"node_count", (PyCFunction)RadixTree_node_count, METH_NOARGS,
     "node_count($self, /)\n--\n\nNon-root nodes."},
    {"memory_bytes", (PyCFunction)RadixTree_memory_bytes, METH_NOARGS, RadixTree_memory_bytes__doc__},
    {"negative_tokens", (PyCFunction)RadixTree_negative_tokens, METH_NOARGS, RadixTree_negative_tokens__doc__},
    {"trim_path", (PyCFunction)RadixTree_trim_path, METH_O, RadixTree_trim_path__doc__},
    {"evict_node_state", (PyCFunction)RadixTree_evict_node_state, METH_O, RadixTree_evict_node_state__doc__},
    {"policy_stats", (PyCFunction)RadixTree_policy_stats, METH_NOARGS, RadixTree_policy_stats__doc__},
    {"sanity_check", (PyCFunction)RadixTree_sanity_check, METH_NOARGS, RadixTree_sanity_check__doc__},
    {"reset", (PyCFunction)RadixTree_reset, METH_NOARGS, RadixTree_reset__doc__},
    MR_PY_NAMESPACE_METHODS(RadixTree_namespace, RadixTree_namespace_name),
    {"pretty_print", (PyCFunction)RadixTree_pretty_print, METH_NOARGS, RadixTree_pretty_print__doc__},
    {"lru_order", (PyCFunction)(void (*)(void))RadixTree_lru_order, METH_FASTCALL, RadixTree_lru_order__doc__},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef RadixTree_getset[] = {
    {"root", (getter)RadixTree_get_root, NULL, "The root node.", NULL},
    {"page_size", (getter)RadixTree_get_attr, NULL, "Tokens per page.", "page_size"},
    {"chunk_size", (getter)RadixTree_get_attr, NULL, "Alignment of branching lengths.", "chunk_size"},
    {"lru_policy", (getter)RadixTree_get_attr, NULL,
     "'consumed', 'sglang', 'utility', 'adaptive', 'lfu', 'fifo', 'mru', 'filo', 'priority', 'slru' or 'tlru'.",
     "lru_policy"},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef RadixTree_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(RadixTree, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(RadixTree__doc__,
"RadixTree(page_size=1, chunk_size=None, lru_policy='consumed', *,\n"
"          check_ownership=False, policy_options=None, max_states_per_path=None,\n"
"          semantics='v0.5.15', kv_only=False, values=True)\n"
"--\n"
"\n"
"SGLang MambaRadixCache's tree in C: token-id keys, a KV index per token and\n"
"an optional recurrent-state slot per node.\n"
"\n"
"page_size: tokens per page; matches and splits are per page and inserted\n"
"keys must be whole pages.  chunk_size: alignment of branching lengths\n"
"(default max(64, page_size)).  lru_policy: 'consumed' (a match refreshes\n"
"only the node whose state is used), 'sglang' (v0.5.15 behaviour) or\n"
"'utility' (touches as 'consumed'; the victim scores lowest on\n"
"alpha * FLOPs-saved-per-byte + recency, Marconi-style) or 'adaptive'\n"
"(touches as 'consumed'; the victim has the least priority L + uses *\n"
"FLOPs-spared-per-byte, L the last victim's: GreedyDual-Size-Frequency;\n"
"see docs/adaptive.md).  policy_options:\n"
"a dict of the utility policy's alpha, flops_per_token, attn_flops_per_pos,\n"
"state_bytes, kv_bytes_per_token, evict_window (candidates scored per\n"
"victim, default and most 1024), tune_window (> 0: re-tune alpha, the KV\n"
"weight and the recency order by replaying that many insertions against a\n"
"snapshot), mru (1: start with the recency order reversed) and\n"
"chunked_prefill_size ('adaptive': the scheduler's chunked prefill budget,\n"
"0 none; no predicted junction for an extend longer than it).\n"
"lru_policy may also be one of SGLang 0.5.23's leaf orders for the KV victim\n"
"(--radix-eviction-policy; touches as 'consumed'): 'lfu' (fewest hits),\n"
"'fifo' (oldest node), 'mru' (most recently used), 'filo' (newest node),\n"
"'priority' (lowest insert priority), 'slru' (hits below\n"
"policy_options['protected_threshold'], default 2, first) or 'tlru'\n"
"(leaves past the branch's budget first; policy_options 'threshold' and\n"
"'next_prompt_estimate', default 0); ties go to the least recently used.\n"
"max_states_per_path: a per-path state budget enforced by trim_path().\n"
"check_ownership: track the KV indices and state slots the tree holds and\n"
"make insert() raise ValueError, leaving the tree unchanged, for a KV index\n"
"past prev_prefix_len or a state slot the tree already holds (a later\n"
"eviction would return it twice), an index listed twice, or a\n"
"prev_prefix_len longer than the key (SGLang accepts all of these).\n"
"semantics: 'v0.5.15' (MambaRadixCache) or 'v0.5.23' (UnifiedRadixCache's\n"
"tree rules: inserts without a state, no cascade through stateless\n"
"ancestors on eviction).  kv_only: the whole KV match is usable\n"
"(attention-only trees).  values=False: keys only, no KV index per token (a\n"
"third of the memory, for trees that only measure prefixes): insert() takes\n"
"value=None, match_prefix() and insert() return None for the indices and the\n"
"duplicates, Node.value is None, evictions count tokens and return no KV\n"
"indices, and path_indices() raises ValueError.");

static PyType_Slot RadixTree_slots[] = {
    {Py_tp_new, RadixTree_new},
    {Py_tp_dealloc, RadixTree_dealloc},
    {Py_tp_repr, RadixTree_repr},
    {Py_tp_methods, RadixTree_methods},
    {Py_tp_getset, RadixTree_getset},
    {Py_tp_members, RadixTree_members},
    {Py_tp_doc, (void *)RadixTree__doc__},
    {0, NULL},
};

static PyType_Spec RadixTree_spec = MR_TYPE_SPEC("mambaradix.RadixTree", RadixTree, RadixTree_slots, 0);

/* ------------------------------------------------------------------------
 * Node */

static void
Node_dealloc(Node *self)
{
    Py_DECREF(self->owner);
    mr_type_free((PyObject *)self);
}

/* The live node, or NULL with StaleNodeError. */
static mr_node *
Node_get(Node *self)
{
    mr_node *n;
    if (mr_radix_resolve(self->owner->tree, self->h, &n) != MR_OK) {
        mr_state *st = tree_state((PyObject *)self);
        PyErr_SetString(st ? st->StaleNodeError : PyExc_ValueError,
                        "the node was removed from the tree (stale handle)");
        return NULL;
    }
    return n;
}

static PyObject *
Node_get_id(Node *self, void *c)
{
    return PyLong_FromUnsignedLong(self->h.id);
}

static PyObject *
Node_get_gen(Node *self, void *c)
{
    return PyLong_FromUnsignedLong(self->h.gen);
}

static PyObject *
Node_get_valid(Node *self, void *c)
{
    mr_node *n;
    return PyBool_FromLong(mr_radix_resolve(self->owner->tree, self->h, &n) == MR_OK);
}

/* The integer attributes (mr_radix_node_attr; the getset closure names
 * it): is_root and can_evict_state read as a bool, state as None when
 * negative, the others as an int. */
static PyObject *
Node_get_attr(Node *self, void *closure)
{
    mr_node_attr attr = (mr_node_attr)(intptr_t)closure;
    mr_node *n = Node_get(self);
    if (n == NULL) {
        return NULL;
    }
    int64_t v = mr_radix_node_attr(self->owner->tree, n, attr);
    if (attr == MR_NODE_IS_ROOT || attr == MR_NODE_CAN_EVICT_STATE) {
        return PyBool_FromLong(v != 0);
    }
    return attr == MR_NODE_STATE ? state_or_none(v) : PyLong_FromLongLong(v);
}

/* The other attributes of the live node n (StaleNodeError once removed). */
#define NODE_GETTER(name, expr)                   \
    static PyObject *                             \
    Node_get_##name(Node *self, void *c)          \
    {                                             \
        mr_node *n = Node_get(self);              \
        return n == NULL ? NULL : (expr);         \
    }

NODE_GETTER(key, mr_py_node_tokens(n, 0))
NODE_GETTER(value, mr_py_node_values(self->owner->tree, n))
NODE_GETTER(parent, mr_node_parent(n) == NULL ? Py_NewRef(Py_None)
                                              : node_new_handle(tree_state((PyObject *)self), self->owner,
                                                                mr_node_parent(n)))
NODE_GETTER(children, mr_py_node_list((PyObject *)self->owner, self->owner->tree, n, 0))
NODE_GETTER(extra_key, mr_py_namespace_name(self->owner->tree, mr_node_namespace(n)))

#undef NODE_GETTER

static Py_ssize_t
Node_len(Node *self)
{
    mr_node *n = Node_get(self);
    return n == NULL ? -1 : (Py_ssize_t)mr_node_len(n);
}

static Py_hash_t
Node_hash(Node *self)
{
    Py_uhash_t x = (Py_uhash_t)((uintptr_t)self->owner >> 4);
    x ^= ((Py_uhash_t)self->h.id * 1000003u) ^ ((Py_uhash_t)self->h.gen << 17);
    return x == (Py_uhash_t)-1 ? -2 : (Py_hash_t)x;
}

static PyObject *
Node_richcompare(PyObject *a, PyObject *b, int op)
{
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(a) != Py_TYPE(b)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    Node *x = (Node *)a, *y = (Node *)b;
    int eq = x->owner == y->owner && x->h.id == y->h.id && x->h.gen == y->h.gen;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static PyObject *
Node_repr(Node *self)
{
    mr_node *n;
    if (mr_radix_resolve(self->owner->tree, self->h, &n) != MR_OK) {
        return PyUnicode_FromFormat("<mambaradix.Node #%u (removed)>", self->h.id);
    }
    if (n == mr_radix_root(self->owner->tree)) {
        return PyUnicode_FromString("<mambaradix.Node root>");
    }
    int64_t s = mr_node_state(n);
    if (s >= 0) {
        return PyUnicode_FromFormat("<mambaradix.Node #%u len=%zu state=%lld>", self->h.id, mr_node_len(n),
                                    (long long)s);
    }
    return PyUnicode_FromFormat("<mambaradix.Node #%u len=%zu tombstone>", self->h.id, mr_node_len(n));
}

static PyGetSetDef Node_getset[] = {
    {"id", (getter)Node_get_id, NULL, "Node id (reused after removal; equality also checks the generation).", NULL},
    {"gen", (getter)Node_get_gen, NULL, "The id's generation: a reused id gets a new one.", NULL},
    {"valid", (getter)Node_get_valid, NULL, "False once the node was removed.", NULL},
    {"is_root", (getter)Node_get_attr, NULL, "True for the root.", (void *)MR_NODE_IS_ROOT},
    {"key", (getter)Node_get_key, NULL, "Copy of the edge tokens (int32).", NULL},
    {"value", (getter)Node_get_value, NULL,
     "Copy of the edge's KV indices (int64); None in a tree made with values=False.", NULL},
    {"state", (getter)Node_get_attr, NULL, "State slot at the node's end, or None.", (void *)MR_NODE_STATE},
    {"parent", (getter)Node_get_parent, NULL, "Parent node (None for the root).", NULL},
    {"children", (getter)Node_get_children, NULL, "Child nodes.", NULL},
    {"full_lock_ref", (getter)Node_get_attr, NULL, "KV lock count.", (void *)MR_NODE_FULL_LOCK},
    {"state_lock_ref", (getter)Node_get_attr, NULL, "State lock count.", (void *)MR_NODE_STATE_LOCK},
    {"can_evict_state", (getter)Node_get_attr, NULL,
     "True when a state eviction may take the node's state now (the tree's own rule, which evict_mamba's "
     "victims and evict_node_state follow): it has an unlocked state and is not a leaf whose KV is locked "
     "(v0.5.23 semantics take that leaf's state too).", (void *)MR_NODE_CAN_EVICT_STATE},
    {"prefix_len", (getter)Node_get_attr, NULL, "Tokens from the root to the node's end.",
     (void *)MR_NODE_PREFIX_LEN},
    {"hits", (getter)Node_get_attr, NULL,
     "Inserts that walked through or created the node (SGLang 0.5.23's hit_count; the lfu / slru key).",
     (void *)MR_NODE_HITS},
    {"extra_key", (getter)Node_get_extra_key, NULL, "The node's extra_key namespace, or None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Node_slots[] = {
    {Py_tp_dealloc, Node_dealloc},
    {Py_tp_repr, Node_repr},
    {Py_tp_hash, Node_hash},
    {Py_tp_richcompare, Node_richcompare},
    {Py_tp_getset, Node_getset},
    {Py_sq_length, Node_len},
    {Py_tp_doc, (void *)"A handle to one tree node; safe to keep after the node is removed."},
    {0, NULL},
};

static PyType_Spec Node_spec = MR_TYPE_SPEC("mambaradix.Node", Node, Node_slots,
                                            Py_TPFLAGS_DISALLOW_INSTANTIATION);

/* ------------------------------------------------------------------------
 * Result types and registration */

static PyStructSequence_Field MatchResult_fields[] = {
    {"indices", "KV indices of the usable prefix (numpy int64)"},
    {"node", "deepest matched node with a state, or the root"},
    {"state", "its state slot, or None"},
    {"kv_matched_len", "tokens whose KV matched, through stateless nodes"},
    {"branching_seqlen", "kv_matched_len aligned down to chunk_size when deeper than node, else None"},
    {"kv_node", "deepest node whose KV matched (attribute only, not unpacked)"},
    {NULL, NULL},
};
static PyStructSequence_Desc MatchResult_desc = {"mambaradix.MatchResult", "Result of RadixTree.match_prefix.",
                                                 MatchResult_fields, 5};

static PyStructSequence_Field InsertResult_fields[] = {
    {"prefix_len", "tokens of the key already in the tree"},
    {"state_existed", "the end node already had a state: the caller frees its slot"},
    {"node", "the node ending at the key's end"},
    {"duplicates", "the caller's KV indices for already-cached tokens, to free"},
    {NULL, NULL},
};
static PyStructSequence_Desc InsertResult_desc = {"mambaradix.InsertResult", "Result of RadixTree.insert.",
                                                  InsertResult_fields, 4};

static PyStructSequence_Field EvictResult_fields[] = {
    {"tokens_evicted", "KV tokens released"},
    {"states_evicted", "states released"},
    {"kv_indices", "the released KV indices, to free (numpy int64)"},
    {"state_slots", "the released state slots, to free (numpy int64)"},
    {NULL, NULL},
};
static PyStructSequence_Desc EvictResult_desc = {"mambaradix.EvictResult",
                                                 "Result of RadixTree.evict_full / evict_mamba.",
                                                 EvictResult_fields, 4};

int
mr_py_radix_init(PyObject *m, mr_state *st)
{
    if (mr_add_type(m, &st->RadixTree, PyType_FromModuleAndSpec(m, &RadixTree_spec, NULL)) < 0
        || mr_add_type(m, &st->Node, PyType_FromModuleAndSpec(m, &Node_spec, NULL)) < 0
        || mr_add_type(m, &st->MatchResult, (PyObject *)PyStructSequence_NewType(&MatchResult_desc)) < 0
        || mr_add_type(m, &st->InsertResult, (PyObject *)PyStructSequence_NewType(&InsertResult_desc)) < 0
        || mr_add_type(m, &st->EvictResult, (PyObject *)PyStructSequence_NewType(&EvictResult_desc)) < 0) {
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * For py_unified.c (declared in py_common.h) */

mr_radix *
mr_py_radix_tree(PyObject *obj)
{
    mr_state *st = mr_state_from_type(Py_TYPE(obj));
    if (st == NULL || !PyObject_TypeCheck(obj, (PyTypeObject *)st->RadixTree)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "tree must be a mambaradix.RadixTree, not %.100s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return ((RadixTree *)obj)->tree;
}

PyObject *
mr_py_radix_node(PyObject *tree, const mr_node *n)
{
    return node_new_handle(tree_state(tree), (RadixTree *)tree, n);
}

PyObject *
mr_py_radix_view(mr_state *st, mr_radix *tree, PyObject *owner)
{
    PyTypeObject *type = (PyTypeObject *)st->RadixTree;
    RadixTree *self = (RadixTree *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    mr_owned_init(&self->owned);
    self->tree = tree;
    self->tree_owner = Py_NewRef(owner);
    return (PyObject *)self;
}
