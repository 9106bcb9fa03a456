/* py_args.h - the argument parser every binding function uses.
 *
 * A function declares its signature once, in a static mr_argspec:
 *
 *     static mr_argspec insert_spec = MR_ARGSPEC("insert", 0, 3, 3,
 *                                                "key", "value", "state", "extra_key");
 *
 * reads as the Python signature insert(key, value, state, *, extra_key=None):
 * the first `posonly` names are positional-only, the first `maxpos` may be
 * given by position (the rest are keyword-only), and the first `required`
 * must be given (required > maxpos makes leading keyword-only ones required).
 *
 * mr_parse() fills one PyObject* per name (a borrowed reference, or NULL
 * when the caller left it out).  On the first call the names are interned
 * into a tuple kept in the spec; a keyword is then matched by pointer
 * (CPython interns the keyword names of a call site) and only on a miss by
 * string compare.  Errors are CPython's own for a Python function of that
 * signature: missing required, unexpected keyword, given twice, too many
 * positional, positional-only passed as keyword.
 *
 * The module is single-interpreter (module.c), so the interned tuple can
 * live in the static spec for the life of the process. */
#ifndef MR_PY_ARGS_H
#define MR_PY_ARGS_H

#include <stdint.h>

#define MR_ARGS_MAX 16

typedef struct {
    const char *fname;            /* as errors name it: "insert" gives "insert() ..." */
    int posonly;
    int maxpos;
    int required;
    const char *names[MR_ARGS_MAX + 1];   /* NULL-terminated */
    /* filled on first use */
    int n;
    PyObject *interned;           /* tuple of the names, interned */
} mr_argspec;

#define MR_ARGSPEC(fname, posonly, maxpos, required, ...) \
    {(fname), (posonly), (maxpos), (required), {__VA_ARGS__, NULL}, 0, NULL}

/* Declares a function's spec and the array mr_parse fills, sized by the
 * names:  MR_ARGS(spec, a, "zeros", 0, 3, 2, "shape", "dtype", "device");  */
#define MR_ARGS(spec, a, fname, posonly, maxpos, required, ...)                             \
    static mr_argspec spec = MR_ARGSPEC(fname, posonly, maxpos, required, __VA_ARGS__);     \
    PyObject *a[sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)]

/* METH_FASTCALL | METH_KEYWORDS arguments into out[0 .. number of names).
 * Returns 0, or -1 with TypeError set. */
int mr_parse(mr_argspec *spec, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **out);

/* The same for a tuple and a dict (tp_new, tp_init). */
int mr_parse_tuple(mr_argspec *spec, PyObject *args, PyObject *kwds, PyObject **out);

/* Converters for parsed arguments.  Each names fname and arg in its error
 * (TypeError for a wrong type, ValueError for a value out of range), leaves
 * *out alone when o is NULL (argument left out) and returns 0 or -1. */

/* The one reading of a Python int: o (anything with __index__ but bool;
 * a bool too, as 1 or 0, when bool_ok) as a long long.  Returns 0 with *v
 * (*overflow set when the value does not fit), 1 when o is no int (no
 * exception set), or -1 with the exception its __index__ raised.  Every
 * converter below and the integer-array reader (py_ints.c) word their
 * errors around it. */
int mr_int_value(PyObject *o, int bool_ok, long long *v, int *overflow);

/* An int (anything with __index__, not bool) within [lo, hi]. */
int mr_as_int64(PyObject *o, int64_t lo, int64_t hi, const char *arg, int64_t *out);
/* An exact int within [lo, hi] into *out: 0, or -1 with no exception set
 * (anything else: the caller takes its slow path, which words the error). */
int mr_exact_int64(PyObject *o, int64_t lo, int64_t hi, int64_t *out);
int mr_arg_int64(PyObject *o, const char *fname, const char *arg, int64_t lo, int64_t hi, int64_t *out);
/* A flag: True or False (or a numpy.bool_); anything else, truthy or not
 * (a str, an int, None), is TypeError naming fname and arg.  The one reader
 * of every boolean argument of the binding. */
int mr_arg_bool(PyObject *o, const char *fname, const char *arg, int *out);
/* A str, as UTF-8 owned by o; None too when none_ok (then *out = NULL). */
int mr_arg_str(PyObject *o, const char *fname, const char *arg, int none_ok, const char **out);

/* _C._testing_parse (module.c): the parser under a signature given at run
 * time, for tests against CPython's own argument binding. */
PyObject *mr_testing_parse(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

#endif /* MR_PY_ARGS_H */
