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

/* Reads those of the int keys names[0..n) that options holds into vals
 * (each in 0..hi[i]), counting them in *seen. */
static int
read_int_keys(PyObject *options, const char *const *names, size_t n, const int64_t *hi, int64_t *vals,
              Py_ssize_t *seen)
{
    for (size_t i = 0; i < n; i++) {
        PyObject *v = PyMapping_GetItemString(options, names[i]);
        if (v == NULL) {
            PyErr_Clear();
            continue;
        }
        ++*seen;
        char arg[64];
        snprintf(arg, sizeof(arg), "policy_options['%s']", names[i]);
        int r = mr_as_int64(v, 0, hi[i], arg, &vals[i]);
        Py_DECREF(v);
        if (r < 0) {
            return -1;
        }
    }
    return 0;
}

/* ValueError unless options holds only the seen keys. */
static int
no_other_keys(const char *fname, PyObject *options, Py_ssize_t seen, const char *policy, const char *known)
{
    Py_ssize_t n = PyMapping_Size(options);
    if (n < 0) {
        return -1;
    }
    if (n != seen) {
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
    static const char *const dnames[] = {"alpha", "flops_per_token", "attn_flops_per_pos", "state_bytes",
                                         "kv_bytes_per_token"};
    double *dvals[] = {&cfg->alpha, &cfg->flops_per_token, &cfg->attn_flops_per_pos, &cfg->state_bytes,
                       &cfg->kv_bytes_per_token};
    static const char *const inames[] = {"evict_window", "tune_window", "mru"};
    uint32_t *ivals[] = {&cfg->evict_window, &cfg->tune_window, &cfg->mru};
    static const int64_t imax[] = {1024, 1 << 20, 1};
    /* the leaf orders' keys, as SGLang's eviction_policy_config names them */
    static const char *const onames[] = {"protected_threshold", "threshold", "next_prompt_estimate"};
    static const int64_t omax[] = {(int64_t)1 << 60, (int64_t)1 << 60, (int64_t)1 << 60};
    mr_lru_policy p;
    int known = mr_radix_policy_by_name(policy, &p) == MR_OK;
    int classic = known && (p == MR_POLICY_SGLANG || p == MR_POLICY_CONSUMED || p == MR_POLICY_UTILITY
                            || p == MR_POLICY_ADAPTIVE);
    if (!classic && (orderp == NULL || !known)) {
        PyErr_Format(PyExc_ValueError, "%s: lru_policy must be %s, not '%s'", fname,
                     orderp == NULL ? "'sglang', 'consumed', 'utility' or 'adaptive'"
                                    : "'sglang', 'consumed', 'utility', 'adaptive', 'lfu', 'fifo', 'mru', "
                                      "'filo', 'priority', 'slru' or 'tlru'",
                     policy);
        return -1;
    }
    pcfg->policy = p;
    mr_leaf_order *order = orderp;
    if (order != NULL) {
        *order = (mr_leaf_order){2, 0, 0};
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
    Py_ssize_t seen = 0;
    if (!classic) {
        int64_t o[3] = {order->slru_protected_threshold, order->tlru_threshold, order->tlru_next_prompt_estimate};
        size_t first = p == MR_POLICY_SLRU ? 0 : 1, count = p == MR_POLICY_SLRU ? 1 : p == MR_POLICY_TLRU ? 2 : 0;
        if (read_int_keys(options, onames + first, count, omax, o + first, &seen) < 0) {
            return -1;
        }
        *order = (mr_leaf_order){o[0], o[1], o[2]};
        return no_other_keys(fname, options, seen, policy,
                             p == MR_POLICY_SLRU   ? "protected_threshold"
                             : p == MR_POLICY_TLRU ? "threshold, next_prompt_estimate"
                                                   : "none");
    }
    for (size_t i = 0; i < sizeof(dnames) / sizeof(dnames[0]); i++) {
        PyObject *v = PyMapping_GetItemString(options, dnames[i]);
        if (v == NULL) {
            PyErr_Clear();
            continue;
        }
        seen++;
        double d = PyFloat_AsDouble(v);
        Py_DECREF(v);
        if (d == -1.0 && PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError, "%s: policy_options['%s'] must be a number", fname, dnames[i]);
            return -1;
        }
        if (!(d >= 0.0) || d == Py_HUGE_VAL) {
            PyErr_Format(PyExc_ValueError, "%s: policy_options['%s'] must be finite and >= 0", fname,
                         dnames[i]);
            return -1;
        }
        *dvals[i] = d;
    }
    int64_t iv[3] = {*ivals[0], *ivals[1], *ivals[2]};
    if (read_int_keys(options, inames, 3, imax, iv, &seen) < 0) {
        return -1;
    }
    for (size_t i = 0; i < 3; i++) {
        *ivals[i] = (uint32_t)iv[i];
    }
    return no_other_keys(fname, options, seen, policy,
                         "alpha, flops_per_token, attn_flops_per_pos, state_bytes, kv_bytes_per_token, "
                         "evict_window, tune_window, mru");
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
