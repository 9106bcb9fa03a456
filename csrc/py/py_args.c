/* py_args.c - the argument parser and converters (py_args.h).
 *
 * The checks run in CPython's order for a Python function (the frame
 * set-up in ceval.c): positionals are placed, then each keyword is placed or
 * rejected (unexpected, positional-only passed as keyword, given twice),
 * then too many positionals, then missing positional, then missing
 * keyword-only arguments; the messages read the same. */
#include "py_common.h"
#include "py_numpy.h"

#include <limits.h>
#include <string.h>

static int
spec_ready(mr_argspec *spec)
{
    if (spec->interned != NULL) {
        return 0;
    }
    int n = 0;
    while (spec->names[n] != NULL) {
        n++;
    }
    PyObject *t = PyTuple_New(n);
    if (t == NULL) {
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *s = PyUnicode_InternFromString(spec->names[i]);
        if (s == NULL) {
            Py_DECREF(t);
            return -1;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    spec->n = n;
    spec->interned = t;
    return 0;
}

/* Index of keyword key among the names a keyword may set (from posonly
 * on), -1 when none. */
static int
find_name(const mr_argspec *spec, PyObject *key)
{
    PyObject *const *names = &PyTuple_GET_ITEM(spec->interned, 0);
    for (int i = spec->posonly; i < spec->n; i++) {
        if (names[i] == key) {
            return i;
        }
    }
    if (!PyUnicode_Check(key)) {
        return -1;
    }
    for (int i = spec->posonly; i < spec->n; i++) {
        if (PyUnicode_Compare(names[i], key) == 0) {
            return i;
        }
    }
    return -1;
}

/* 'a'; 'a' and 'b'; 'a', 'b', and 'c' */
static PyObject *
name_list(const char *const *names, int k)
{
    PyObject *s = PyUnicode_FromString("");
    for (int i = 0; s != NULL && i < k; i++) {
        const char *sep = i == 0 ? "" : (k == 2 ? " and " : (i == k - 1 ? ", and " : ", "));
        PyObject *t = PyUnicode_FromFormat("%U%s'%s'", s, sep, names[i]);
        Py_DECREF(s);
        s = t;
    }
    return s;
}

static int
raise_missing(const mr_argspec *spec, PyObject **out, int from, int to, const char *kind)
{
    const char *miss[MR_ARGS_MAX];
    int k = 0;
    for (int i = from; i < to; i++) {
        if (out[i] == NULL) {
            miss[k++] = spec->names[i];
        }
    }
    if (k == 0) {
        return 0;
    }
    PyObject *list = name_list(miss, k);
    if (list != NULL) {
        PyErr_Format(PyExc_TypeError, "%s() missing %d required %s argument%s: %U", spec->fname, k, kind,
                     k == 1 ? "" : "s", list);
        Py_DECREF(list);
    }
    return -1;
}

static void
raise_too_many(const mr_argspec *spec, PyObject **out, Py_ssize_t given)
{
    int nreq_pos = spec->required < spec->maxpos ? spec->required : spec->maxpos;
    int kwonly_given = 0;
    for (int i = spec->maxpos; i < spec->n; i++) {
        kwonly_given += out[i] != NULL;
    }
    char sig[64], kw[96] = "";
    if (nreq_pos < spec->maxpos) {
        snprintf(sig, sizeof(sig), "from %d to %d positional arguments", nreq_pos, spec->maxpos);
    }
    else {
        snprintf(sig, sizeof(sig), "%d positional argument%s", spec->maxpos, spec->maxpos == 1 ? "" : "s");
    }
    if (kwonly_given) {
        snprintf(kw, sizeof(kw), " positional argument%s (and %d keyword-only argument%s)", given != 1 ? "s" : "",
                 kwonly_given, kwonly_given != 1 ? "s" : "");
    }
    PyErr_Format(PyExc_TypeError, "%s() takes %s but %zd%s %s given", spec->fname, sig, given, kw,
                 given == 1 && !kwonly_given ? "was" : "were");
}

/* The core: positionals args[0..nargs), keywords keys[k] = vals[k]. */
static int
parse(mr_argspec *spec, PyObject *const *args, Py_ssize_t nargs, PyObject *const *keys, PyObject *const *vals,
      Py_ssize_t nkw, PyObject **out)
{
    if (spec_ready(spec) < 0) {
        return -1;
    }
    int n = spec->n;
    for (int i = 0; i < n; i++) {
        out[i] = i < nargs && i < spec->maxpos ? args[i] : NULL;
    }
    for (Py_ssize_t k = 0; k < nkw; k++) {
        int j = find_name(spec, keys[k]);
        if (j < 0) {
            if (PyErr_Occurred()) {
                return -1;
            }
            /* the positional-only names given as keywords, in parameter order
             * (CPython's message) */
            PyObject *posonly = NULL;
            for (int i = 0; i < spec->posonly; i++) {
                for (Py_ssize_t q = 0; q < nkw; q++) {
                    if (PyUnicode_Check(keys[q]) && PyUnicode_CompareWithASCIIString(keys[q], spec->names[i]) == 0) {
                        PyObject *t = posonly == NULL ? PyUnicode_FromString(spec->names[i])
                                                      : PyUnicode_FromFormat("%U, %s", posonly, spec->names[i]);
                        Py_XDECREF(posonly);
                        posonly = t;
                        if (posonly == NULL) {
                            return -1;
                        }
                        break;
                    }
                }
            }
            if (posonly != NULL) {
                PyErr_Format(PyExc_TypeError,
                             "%s() got some positional-only arguments passed as keyword arguments: '%U'",
                             spec->fname, posonly);
                Py_DECREF(posonly);
                return -1;
            }
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%S'", spec->fname, keys[k]);
            return -1;
        }
        if (out[j] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", spec->fname,
                         spec->names[j]);
            return -1;
        }
        out[j] = vals[k];
    }
    if (nargs > spec->maxpos) {
        raise_too_many(spec, out, nargs);
        return -1;
    }
    int nreq_pos = spec->required < spec->maxpos ? spec->required : spec->maxpos;
    if (raise_missing(spec, out, (int)nargs, nreq_pos, "positional") < 0
        || raise_missing(spec, out, spec->maxpos, spec->required, "keyword-only") < 0) {
        return -1;
    }
    return 0;
}

int
mr_parse(mr_argspec *spec, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **out)
{
    if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) {
        /* the common call: positionals only */
        if (spec->interned != NULL && nargs >= spec->required && nargs <= spec->maxpos) {
            int i = 0;
            for (; i < nargs; i++) {
                out[i] = args[i];
            }
            for (; i < spec->n; i++) {
                out[i] = NULL;
            }
            return 0;
        }
        return parse(spec, args, nargs, NULL, NULL, 0, out);
    }
    return parse(spec, args, nargs, &PyTuple_GET_ITEM(kwnames, 0), args + nargs, PyTuple_GET_SIZE(kwnames), out);
}

int
mr_parse_tuple(mr_argspec *spec, PyObject *args, PyObject *kwds, PyObject **out)
{
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    Py_ssize_t nkw = kwds == NULL ? 0 : PyDict_GET_SIZE(kwds);
    if (nkw == 0) {
        return parse(spec, &PyTuple_GET_ITEM(args, 0), nargs, NULL, NULL, 0, out);
    }
    PyObject **kv = PyMem_Malloc(2 * (size_t)nkw * sizeof(PyObject *));
    if (kv == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t pos = 0, k = 0;
    PyObject *key, *val;
    while (k < nkw && PyDict_Next(kwds, &pos, &key, &val)) {
        kv[k] = key;
        kv[nkw + k] = val;
        k++;
    }
    int rc = parse(spec, &PyTuple_GET_ITEM(args, 0), nargs, kv, kv + nkw, k, out);
    PyMem_Free(kv);
    return rc;
}

/* ------------------------------------------------------------------------
 * Converters */

int
mr_int_value(PyObject *o, int bool_ok, long long *v, int *overflow)
{
    *overflow = 0;
    if (PyLong_CheckExact(o)) {
        *v = PyLong_AsLongLongAndOverflow(o, overflow);
        return 0;
    }
    if (PyBool_Check(o) && bool_ok) {
        *v = o == Py_True;
        return 0;
    }
    if (PyBool_Check(o) || !PyIndex_Check(o)) {
        return 1;
    }
    PyObject *idx = PyNumber_Index(o);
    if (idx == NULL) {
        return -1;
    }
    *v = PyLong_AsLongLongAndOverflow(idx, overflow);
    Py_DECREF(idx);
    return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

int
mr_as_int64(PyObject *o, int64_t lo, int64_t hi, const char *arg, int64_t *out)
{
    long long v;
    int overflow, r = mr_int_value(o, 0, &v, &overflow);
    if (r > 0) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", arg, Py_TYPE(o)->tp_name);
    }
    if (r != 0) {
        return -1;
    }
    if (overflow || v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s must be in [%lld, %lld]", arg, (long long)lo, (long long)hi);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

int
mr_exact_int64(PyObject *o, int64_t lo, int64_t hi, int64_t *out)
{
    if (PyLong_CheckExact(o)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (!overflow && v >= lo && v <= hi) {
            *out = (int64_t)v;
            return 0;
        }
    }
    return -1;
}

int
mr_arg_int64(PyObject *o, const char *fname, const char *arg, int64_t lo, int64_t hi, int64_t *out)
{
    if (o == NULL) {
        return 0;
    }
    if (mr_exact_int64(o, lo, hi, out) == 0) {   /* the common case, without formatting a name */
        return 0;
    }
    char what[128];
    snprintf(what, sizeof(what), "%s(): %s", fname, arg);
    return mr_as_int64(o, lo, hi, what, out);
}

int
mr_arg_bool(PyObject *o, const char *fname, const char *arg, int *out)
{
    if (o == NULL) {
        return 0;
    }
    if (PyBool_Check(o)) {
        *out = o == Py_True;
        return 0;
    }
    if (PyArray_IsScalar(o, Bool)) {
        *out = PyObject_IsTrue(o);   /* a numpy.bool_'s truth is its value */
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s() argument '%s' must be bool, not %.100s", fname, arg, Py_TYPE(o)->tp_name);
    return -1;
}

int
mr_arg_str(PyObject *o, const char *fname, const char *arg, int none_ok, const char **out)
{
    if (o == NULL) {
        return 0;
    }
    if (none_ok && o == Py_None) {
        *out = NULL;
        return 0;
    }
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s() argument '%s' must be str%s, not %.50s", fname, arg,
                     none_ok ? " or None" : "", Py_TYPE(o)->tp_name);
        return -1;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (s == NULL) {
        return -1;
    }
    if ((size_t)n != strlen(s)) {
        PyErr_SetString(PyExc_ValueError, "embedded null character");
        return -1;
    }
    *out = s;
    return 0;
}

/* ------------------------------------------------------------------------
 * Test hook: _testing_parse((posonly, maxpos, required, names), *args, **kwargs)
 * parses args and kwargs against a signature built for the call (fname
 * "f") and returns one value per name, Ellipsis for a name left out. */

PyObject *
mr_testing_parse(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int posonly, maxpos, required;
    PyObject *names;
    if (nargs < 1 || !PyArg_ParseTuple(args[0], "iiiO!", &posonly, &maxpos, &required, &PyTuple_Type, &names)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "_testing_parse(sig, *args, **kwargs)");
        }
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n > MR_ARGS_MAX || posonly < 0 || posonly > maxpos || maxpos > n || required < 0 || required > n) {
        PyErr_SetString(PyExc_ValueError, "_testing_parse(): bad signature");
        return NULL;
    }
    mr_argspec spec = {.fname = "f", .posonly = posonly, .maxpos = maxpos, .required = required};
    for (Py_ssize_t i = 0; i < n; i++) {
        spec.names[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i));
        if (spec.names[i] == NULL) {
            return NULL;
        }
    }
    PyObject *out[MR_ARGS_MAX];
    int rc = mr_parse(&spec, args + 1, nargs - 1, kwnames, out);
    Py_XDECREF(spec.interned);
    if (rc < 0) {
        return NULL;
    }
    PyObject *res = PyTuple_New(n);
    for (Py_ssize_t i = 0; res != NULL && i < n; i++) {
        PyTuple_SET_ITEM(res, i, Py_NewRef(out[i] != NULL ? out[i] : Py_Ellipsis));
    }
    return res;
}
