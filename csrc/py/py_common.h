/* py_common.h - declarations shared by the binding files (module.c, py_*.c).
 *
 * Only module.c and py_*.c include Python.h; the core (radix.c, pools, the
 * kernels' C twins) builds and is tested without Python. */
#ifndef MR_PY_COMMON_H
#define MR_PY_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "common.h"

/* Per-module state (PEP 489).  Each binding file owns a block of it; the
 * arrays let a file add types without touching this header. */
#define MR_STATE_SLOTS 16
typedef struct {
    PyObject *Error;            /* mambaradix.Error */
    PyObject *StaleNodeError;   /* mambaradix.StaleNodeError */
    PyObject *InvariantError;   /* mambaradix.InvariantError */
    PyObject *radix[MR_STATE_SLOTS];   /* py_radix.c */
    PyObject *tensor[MR_STATE_SLOTS];  /* py_tensor.c */
    PyObject *pools[MR_STATE_SLOTS];   /* py_pools.c */
} mr_state;

extern struct PyModuleDef mr_module_def;

static inline mr_state *
mr_get_state(PyObject *module)
{
    return (mr_state *)PyModule_GetState(module);
}

/* Module state from an instance of one of the module's heap types. */
mr_state *mr_state_from_type(PyTypeObject *tp);

/* Sets a Python exception for a core status code and returns NULL.
 * what names the argument or operation, e.g. "insert(): value". */
PyObject *mr_raise(mr_state *st, int code, const char *what);

/* Argument helpers (METH_FASTCALL without Argument Clinic). */
int mr_check_nargs(const char *fname, Py_ssize_t nargs, Py_ssize_t min, Py_ssize_t max);
/* Looks up keyword `name` in kwnames; returns a borrowed reference or NULL
 * (no exception) when absent. */
PyObject *mr_find_kw(PyObject *kwnames, PyObject *const *kwstack, const char *name);
/* Raises TypeError for any keyword not in allowed (NULL-terminated);
 * returns -1 then. */
int mr_check_kwnames(const char *fname, PyObject *kwnames, const char *const *allowed);
/* Converts an int-like object to int64 within [lo, hi]; names arg in errors. */
int mr_as_int64(PyObject *o, int64_t lo, int64_t hi, const char *arg, int64_t *out);

/* The tree's policy settings shared by RadixTree and Lifecycle: the policy
 * name ("sglang", "consumed", "utility"), policy_options (None or a mapping
 * with the utility policy's alpha, flops_per_token, attn_flops_per_pos,
 * state_bytes, kv_bytes_per_token, evict_window, tune_window) and
 * max_states_per_path (None or an int >= 0).  Fills cfg's policy (an
 * mr_radix_config) and opt (an mr_radix_options);
 * returns -1 with ValueError / TypeError naming fname and the argument. */
int mr_read_policy(const char *fname, const char *policy, PyObject *options, PyObject *budget, void *cfg,
                   void *opt);
/* The policy's name for a config. */
const char *mr_policy_name(int policy);

/* Registration hooks, one per binding file, called from the module's exec
 * slot.  Each adds its types/functions to m and fills its block of state.
 * Return 0 or -1 with an exception set. */
int mr_py_radix_init(PyObject *m, mr_state *st);
int mr_py_tensor_init(PyObject *m, mr_state *st);
int mr_py_pools_init(PyObject *m, mr_state *st);
int mr_py_unified_init(PyObject *m, mr_state *st);

/* py_radix.c's RadixTree for py_unified.c: its tree (NULL with TypeError when
 * obj is not a RadixTree), the namespace id of an extra_key name (as
 * RadixTree.insert / match_prefix assign them; create = 0: -1 for an unknown
 * name), and a new Node handle. */
struct mr_radix;
struct mr_node;
struct mr_radix *mr_py_radix_tree(PyObject *obj);
int mr_py_radix_namespace(PyObject *tree, PyObject *extra_key, int create, int32_t *ns);
PyObject *mr_py_radix_node(PyObject *tree, const struct mr_node *n);

#endif /* MR_PY_COMMON_H */
