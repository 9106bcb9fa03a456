/* module.c - the mambaradix._C module: definition, per-module state,
 * exceptions and the policy-settings reader shared by RadixTree and
 * Lifecycle.  The binding toolkit is in py_args.c, py_status.c, py_ints.c
 * and py_buf.h.
 *
 * Multi-phase initialisation (PEP 489): PyInit__C only returns the
 * definition; mr_exec creates the exceptions and asks the binding files to
 * add their types (mr_py_radix_init, mr_py_tensor_init in py_dlpack.c,
 * mr_py_pools_init). */
#include "py_common.h"
#include "cuda_api.h"
#include "policy_opts.h"
#include "radix.h"

#define MR_NUMPY_IMPORT
#include "py_numpy.h"

/* ------------------------------------------------------------------------
 * Helpers */

mr_state *
mr_state_from_type(PyTypeObject *tp)
{
    PyObject *m = PyType_GetModuleByDef(tp, &mr_module_def);
    if (m == NULL) {
        return NULL;
    }
    return mr_get_state(m);
}

int
mr_add_type(PyObject *m, PyObject **slot, PyObject *type)
{
    if (type == NULL) {
        return -1;
    }
    *slot = type;
    return PyModule_AddType(m, (PyTypeObject *)type);
}

int
mr_add_exception(PyObject *m, mr_state *st, PyObject **slot, const char *name, const char *doc, PyObject *base)
{
    char full[64];
    PyObject *bases = base != NULL ? PyTuple_Pack(2, st->Error, base) : NULL;
    if (base != NULL && bases == NULL) {
        return -1;
    }
    (void)snprintf(full, sizeof(full), "mambaradix.%s", name);
    *slot = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
    Py_XDECREF(bases);
    return *slot == NULL || PyModule_AddObjectRef(m, name, *slot) < 0 ? -1 : 0;
}

void
mr_type_free(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    freefunc tp_free = PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);   /* instances of heap types hold their type */
}

const char *
mr_policy_name(int policy)
{
    const char *name = mr_radix_policy_name((mr_lru_policy)policy);
    return name != NULL ? name : "?";
}

/* policy_options: 1 when a mapping was given, 0 for None / absent, -1 with
 * TypeError otherwise. */
static int
options_given(const char *fname, PyObject *options)
{
    if (options == NULL || options == Py_None) {
        return 0;
    }
    if (!PyMapping_Check(options) || PyList_Check(options) || PyTuple_Check(options)) {
        PyErr_Format(PyExc_TypeError, "%s: policy_options must be a mapping, not %s", fname,
                     Py_TYPE(options)->tp_name);
        return -1;
    }
    return 1;
}

/* Reads options[k->name] (present: v) into opt or order. */
static int
read_key(const char *fname, const mr_policy_key *k, PyObject *v, mr_radix_options *opt, mr_leaf_order *order)
{
    double d = 0.0;
    int64_t iv = 0;
    if (k->type == MR_KEY_REAL) {
        d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) {
            /* an int too large for a double is a number, only not a finite one */
            int big = PyErr_ExceptionMatches(PyExc_OverflowError);
            PyErr_Format(big ? PyExc_ValueError : PyExc_TypeError, "%s: policy_options['%s'] must be %s", fname,
                         k->name, big ? "finite and >= 0" : "a number");
            return -1;
        }
    }
    else {
        char arg[64];
        snprintf(arg, sizeof(arg), "policy_options['%s']", k->name);
        if (mr_as_int64(v, 0, k->max, arg, &iv) < 0) {
            return -1;
        }
    }
    if (mr_policy_key_set(k, d, iv, opt, order) != MR_OK) {
        PyErr_Format(PyExc_ValueError, "%s: policy_options['%s'] must be finite and >= 0", fname, k->name);
        return -1;
    }
    return 0;
}

/* ValueError unless options holds only the seen keys, naming the n
 * known ones. */
static int
no_other_keys(const char *fname, PyObject *options, Py_ssize_t seen, const char *policy, const mr_policy_key *keys,
              size_t n)
{
    Py_ssize_t size = PyMapping_Size(options);
    if (size < 0) {
        return -1;
    }
    if (size != seen) {
        char known[256] = "none";
        size_t at = 0;
        for (size_t i = 0; i < n && at < sizeof(known); i++) {
            at += (size_t)snprintf(known + at, sizeof(known) - at, "%s%s", i == 0 ? "" : ", ", keys[i].name);
        }
        PyErr_Format(PyExc_ValueError, "%s: policy_options has unknown keys for lru_policy '%s' (known: %s)", fname,
                     policy, known);
        return -1;
    }
    return 0;
}

int
mr_read_policy(const char *fname, const char *policy, PyObject *options, PyObject *budget, void *cfgp,
               void *optp, void *orderp)
{
    mr_radix_config *pcfg = cfgp;
    mr_radix_options *cfg = optp;
    mr_leaf_order *order = orderp;
    mr_lru_policy p;
    int known = mr_radix_policy_by_name(policy, &p) == MR_OK;
    int classic = known && mr_policy_is_classic(p);
    if (!classic && (order == NULL || !known)) {
        PyErr_Format(PyExc_ValueError, "%s: lru_policy must be %s, not '%s'", fname,
                     order == NULL ? "'sglang', 'consumed', 'utility' or 'adaptive'"
                                   : "'sglang', 'consumed', 'utility', 'adaptive', 'lfu', 'fifo', 'mru', "
                                     "'filo', 'priority', 'slru' or 'tlru'",
                     policy);
        return -1;
    }
    pcfg->policy = p;
    if (order != NULL) {
        *order = mr_policy_default_order();
    }
    if (budget != NULL && budget != Py_None) {
        int64_t b;
        if (mr_as_int64(budget, 0, UINT32_MAX, "max_states_per_path", &b) < 0) {
            return -1;
        }
        cfg->max_states_per_path = (uint32_t)b;
    }
    int given = options_given(fname, options);
    if (given <= 0) {
        return given;
    }
    size_t n;
    const mr_policy_key *keys = mr_policy_keys(p, &n);
    Py_ssize_t seen = 0;
    for (size_t i = 0; i < n; i++) {
        PyObject *v = PyMapping_GetItemString(options, keys[i].name);
        if (v == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
                return -1;   /* the mapping's own failure, not an absent key */
            }
            PyErr_Clear();
            continue;
        }
        seen++;
        int r = read_key(fname, &keys[i], v, cfg, order);
        Py_DECREF(v);
        if (r < 0) {
            return -1;
        }
    }
    return no_other_keys(fname, options, seen, policy, keys, n);
}

/* ------------------------------------------------------------------------
 * Module-level functions */

PyDoc_STRVAR(cuda_device_count__doc__,
"cuda_device_count()\n"
"--\n"
"\n"
"Number of CUDA devices visible to mambaradix's kernels: 0 without a GPU,\n"
"a driver, or a CUDA build.");

static PyObject *
mod_cuda_device_count(PyObject *module, PyObject *unused)
{
    return PyLong_FromLong(mr_cuda_device_count());
}

static PyMethodDef mr_methods[] = {
    {"cuda_device_count", (PyCFunction)mod_cuda_device_count, METH_NOARGS, cuda_device_count__doc__},
    {"_testing_parse", (PyCFunction)(void (*)(void))mr_testing_parse, METH_FASTCALL | METH_KEYWORDS,
     "Test hook: the bindings' argument parser under a given signature."},
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------------------
 * Module definition */

static int
mr_exec(PyObject *m)
{
    mr_state *st = mr_get_state(m);
    if (_import_array() < 0) {
        return -1;
    }
#ifdef MR_WITH_CUDA
    PyObject *cuda_compiled = Py_True;
#else
    PyObject *cuda_compiled = Py_False;
#endif
    if (mr_add_exception(m, st, &st->Error, "Error", "Base class of mambaradix's own errors.", NULL) < 0
        || mr_add_exception(m, st, &st->StaleNodeError, "StaleNodeError",
                            "A node handle refers to a node that was removed, or to another tree.",
                            PyExc_ValueError) < 0
        || mr_add_exception(m, st, &st->InvariantError, "InvariantError", "sanity_check() found a broken invariant.",
                            PyExc_AssertionError) < 0
        || PyModule_AddObjectRef(m, "cuda_compiled", cuda_compiled) < 0) {
        return -1;
    }
    if (mr_py_radix_init(m, st) < 0 || mr_py_tensor_init(m, st) < 0 || mr_py_pools_init(m, st) < 0
        || mr_py_rules_init(m, st) < 0 || mr_py_sim_init(m, st) < 0
        || mr_py_unified_init(m, st) < 0) {
        return -1;
    }
    return 0;
}

static int
mr_traverse(PyObject *m, visitproc visit, void *arg)
{
    mr_state *st = mr_get_state(m);
#define MR_STATE_VISIT(name) Py_VISIT(st->name);
    MR_STATE_OBJECTS(MR_STATE_VISIT)
#undef MR_STATE_VISIT
    return 0;
}

static int
mr_clear(PyObject *m)
{
    mr_state *st = mr_get_state(m);
#define MR_STATE_CLEAR(name) Py_CLEAR(st->name);
    MR_STATE_OBJECTS(MR_STATE_CLEAR)
#undef MR_STATE_CLEAR
    return 0;
}

static void
mr_free(void *m)
{
    mr_clear((PyObject *)m);
}

static PyModuleDef_Slot mr_slots[] = {
    {Py_mod_exec, mr_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

struct PyModuleDef mr_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mambaradix._C",
    .m_doc = "Native core of mambaradix: radix tree, pools, DLPack and state kernels.",
    .m_size = sizeof(mr_state),
    .m_methods = mr_methods,
    .m_slots = mr_slots,
    .m_traverse = mr_traverse,
    .m_clear = mr_clear,
    .m_free = mr_free,
};

PyMODINIT_FUNC
PyInit__C(void)
{
    return PyModuleDef_Init(&mr_module_def);
}
