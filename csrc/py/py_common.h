/* py_common.h - declarations shared by the binding files (module.c, py_*.c).
 *
 * Only module.c and py_*.c include Python.h; the core (radix.c, pools, the
 * kernels' C twins) builds and is tested without Python. */
#ifndef MR_PY_COMMON_H
#define MR_PY_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "common.h"
#include "py_args.h"
#include "py_buf.h"

/* Per-module state (PEP 489): one named reference per exception and type.
 * MR_STATE_OBJECTS lists them once; the struct, the module's traverse and
 * clear, and nothing else, expand it. */
#define MR_STATE_OBJECTS(X)                                                    \
    X(Error)            /* mambaradix.Error (module.c) */                      \
    X(StaleNodeError)   /* mambaradix.StaleNodeError (module.c) */             \
    X(InvariantError)   /* mambaradix.InvariantError (module.c) */             \
    X(OwnershipError)   /* mambaradix.OwnershipError (py_pools.c) */           \
    X(RadixTree)        /* py_radix.c */                                       \
    X(Node)                                                                    \
    X(MatchResult)                                                             \
    X(InsertResult)                                                            \
    X(EvictResult)                                                             \
    X(Tensor)           /* py_dlpack.c */                                      \
    X(StatePool)        /* py_state_pool.c */                                  \
    X(SlotAllocator)    /* py_pools.c */                                       \
    X(ReqPool)                                                                 \
    X(Lifecycle)        /* py_lifecycle.c */                                   \
    X(ReqState)                                                                \
    X(UnfinishedResult)                                                        \
    X(FinishedResult)

typedef struct {
#define MR_STATE_FIELD(name) PyObject *name;
    MR_STATE_OBJECTS(MR_STATE_FIELD)
#undef MR_STATE_FIELD
} mr_state;

#include "py_status.h"

extern struct PyModuleDef mr_module_def;

static inline mr_state *
mr_get_state(PyObject *module)
{
    return (mr_state *)PyModule_GetState(module);
}

/* Module state from an instance of one of the module's heap types. */
mr_state *mr_state_from_type(PyTypeObject *tp);

/* Adds type (a new reference, or NULL after a failed creation) to m
 * under its own name and keeps it in *slot.  Returns 0 or -1. */
int mr_add_type(PyObject *m, PyObject **slot, PyObject *type);
/* Creates exception mambaradix.<name> into *slot and adds it to m: a
 * subclass of st->Error and base, or of Exception when base is NULL. */
int mr_add_exception(PyObject *m, mr_state *st, PyObject **slot, const char *name, const char *doc, PyObject *base);
/* The end of a heap type's tp_dealloc: frees self and drops its type. */
void mr_type_free(PyObject *self);
/* obj when it is an instance of type (a module-state type), else NULL
 * (no exception). */
static inline PyObject *
mr_instance(PyObject *obj, PyObject *type)
{
    return PyObject_TypeCheck(obj, (PyTypeObject *)type) ? obj : NULL;
}

/* The spec of one of the module's heap types (immutable; extra_flags
 * adds e.g. Py_TPFLAGS_HAVE_GC). */
#define MR_TYPE_SPEC(qualname, object, slot_table, extra_flags)                           \
    {.name = (qualname), .basicsize = sizeof(object),                                     \
     .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | (extra_flags), .slots = (slot_table)}

/* Builds a result struct sequence item by item:
 *
 *     mr_seq r = mr_seq_new(st->EvictResult);
 *     MR_SEQ_ADD(r, PyLong_FromSize_t(tokens));
 *     ...
 *     return r.res;
 *
 * Each item is a new reference (stolen).  Once the sequence or an item
 * fails, r.res is NULL (with that failure's exception) and the later item
 * expressions are not evaluated. */
typedef struct {
    PyObject *res;
    Py_ssize_t i;
} mr_seq;

static inline mr_seq
mr_seq_new(PyObject *type)
{
    mr_seq r = {PyStructSequence_New((PyTypeObject *)type), 0};
    return r;
}

static inline void
mr_seq_put(mr_seq *r, PyObject *v)
{
    if (v == NULL) {
        Py_CLEAR(r->res);
        return;
    }
    PyStructSequence_SetItem(r->res, r->i++, v);
}

#define MR_SEQ_ADD(r, expr) ((r).res != NULL ? mr_seq_put(&(r), (expr)) : (void)0)

/* The tree's policy settings shared by RadixTree and Lifecycle: the policy
 * name ("sglang", "consumed", "utility"; with order non-NULL also the leaf
 * orders "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru"),
 * policy_options (None or a mapping: for sglang / consumed / utility the
 * utility policy's alpha, flops_per_token, attn_flops_per_pos, state_bytes,
 * kv_bytes_per_token, evict_window, tune_window, mru; for slru
 * protected_threshold, for tlru threshold and next_prompt_estimate, as
 * SGLang's eviction_policy_config) and max_states_per_path (None or an
 * int >= 0).  Fills cfg's policy (an mr_radix_config), opt (an
 * mr_radix_options) and order (an mr_leaf_order, or NULL);
 * returns -1 with ValueError / TypeError naming fname and the argument. */
int mr_read_policy(const char *fname, const char *policy, PyObject *options, PyObject *budget, void *cfg,
                   void *opt, void *order);
/* The policy's name for a config. */
const char *mr_policy_name(int policy);

/* Registration hooks, one per binding file, called from the module's exec
 * slot.  Each adds its types/functions to m and fills its fields of the state.
 * Return 0 or -1 with an exception set. */
int mr_py_radix_init(PyObject *m, mr_state *st);
int mr_py_tensor_init(PyObject *m, mr_state *st);
int mr_py_pools_init(PyObject *m, mr_state *st);
int mr_py_rules_init(PyObject *m, mr_state *st);
int mr_py_sim_init(PyObject *m, mr_state *st);
int mr_py_unified_init(PyObject *m, mr_state *st);

/* py_radix.c's RadixTree for py_unified.c: its tree (NULL with TypeError when
 * obj is not a RadixTree) and a new Node handle. */
struct mr_radix;
struct mr_node;
struct mr_radix *mr_py_radix_tree(PyObject *obj);
PyObject *mr_py_radix_node(PyObject *tree, const struct mr_node *n);
/* The tree's namespace table (csrc/core/nstable.h) seen from Python: the id
 * of an extra_key (a str or None -> 0; TypeError otherwise; create = 0: -1
 * for an unknown name), the extra_key of an id (None for 0 or an unknown
 * id), and the namespace() / namespace_name() methods of RadixTree and
 * Lifecycle with their docstrings. */
int mr_py_namespace(struct mr_radix *t, PyObject *extra_key, int create, int32_t *ns);
/* mr_py_namespace with create = 1 for an insert: *made is the id when the
 * call added the name (else -1), which mr_ns_forget_newest drops again if
 * the insert is refused (a refused insert leaves the table as it was). */
int mr_py_namespace_new(struct mr_radix *t, PyObject *extra_key, int32_t *ns, int32_t *made);
PyObject *mr_py_namespace_name(struct mr_radix *t, int32_t ns);
PyObject *mr_py_namespace_call(struct mr_radix *t, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *mr_py_namespace_name_call(struct mr_radix *t, PyObject *arg);
extern const char mr_py_namespace__doc__[], mr_py_namespace_name__doc__[];
#define MR_PY_NAMESPACE_METHODS(ns_fn, name_fn)                                                             \
    {"namespace", (PyCFunction)(void (*)(void))(ns_fn), METH_FASTCALL | METH_KEYWORDS, mr_py_namespace__doc__}, \
    {"namespace_name", (PyCFunction)(name_fn), METH_O, mr_py_namespace_name__doc__}
/* The node API of a tree (py_radix.c), one implementation for RadixTree and
 * Lifecycle: a node as a Node handle of `owner` (a RadixTree), or as an
 * (id, gen) tuple when owner is NULL; a list of such: parent's children in
 * sorted order, or (parent NULL) an LRU list (which: 0 full, 1 state), most
 * recently used first; a node's tokens (int64 when wide, else int32) and
 * KV indices (None in a tree without values); the tree's dump (fname names
 * the call in an error); and the config attribute a getset closure names
 * ("page_size", "chunk_size", "lru_policy"). */
PyObject *mr_py_node_ref(PyObject *owner, const struct mr_node *n);
PyObject *mr_py_node_list(PyObject *owner, const struct mr_radix *t, const struct mr_node *parent, int which);
PyObject *mr_py_node_tokens(const struct mr_node *n, int wide);
PyObject *mr_py_node_values(const struct mr_radix *t, const struct mr_node *n);
PyObject *mr_py_tree_dump(const struct mr_radix *t, const char *fname);
PyObject *mr_py_tree_attr(const struct mr_radix *t, void *closure);
/* A RadixTree over a tree someone else owns (a tree-only Lifecycle's):
 * `owner` is kept alive by it, and the tree is not freed with it. */
PyObject *mr_py_radix_view(mr_state *st, struct mr_radix *tree, PyObject *owner);

#endif /* MR_PY_COMMON_H */
