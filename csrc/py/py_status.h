/* py_status.h - from a core status code (common.h MR_E*) to a Python
 * exception.
 *
 * One table (py_status.c) gives each code its exception and message; a call
 * whose code means something more precise declares a named override table
 * and raises through it:
 *
 *     static const mr_status_override free_overrides[] = {
 *         {MR_ENOENT, MR_EXC_OWNERSHIP, "%s: %s %lld is already free (double free)"},
 *         MR_STATUS_END(NULL),
 *     };
 *     mr_raise_detail(st, rc, "free()", free_overrides, "slot", bad);
 *
 * A message is a PyErr_Format string given, in order, the operation (what),
 * a detail string and a long long; it uses as many of them as it needs.
 * The default messages use what only, except MR_ECUDA (the CUDA error's
 * text as detail).  Include through py_common.h (it needs mr_state). */
#ifndef MR_PY_STATUS_H
#define MR_PY_STATUS_H

/* The exception an entry raises: a builtin or one of the module's own. */
typedef enum {
    MR_EXC_RUNTIME = 0,
    MR_EXC_MEMORY,
    MR_EXC_VALUE,
    MR_EXC_KEY,
    MR_EXC_TYPE,
    MR_EXC_STALE,       /* mambaradix.StaleNodeError */
    MR_EXC_INVARIANT,   /* mambaradix.InvariantError */
    MR_EXC_OWNERSHIP,   /* mambaradix.OwnershipError */
} mr_exc_kind;

typedef struct mr_status_override {
    int code;               /* an MR_E* code; 0 ends a table */
    mr_exc_kind exc;
    const char *fmt;
    const struct mr_status_override *more;   /* on the end entry: a table to look in next */
} mr_status_override;

/* The end of an override table; more (NULL or another table) is looked up
 * after it, so a call's table can extend its file's. */
#define MR_STATUS_END(more) {0, MR_EXC_RUNTIME, NULL, (more)}

/* Sets the exception for code (the default table) and returns NULL. */
PyObject *mr_raise(mr_state *st, int code, const char *what);
/* The same through overrides first (NULL: none), with a detail string and
 * number for their messages. */
PyObject *mr_raise_detail(mr_state *st, int code, const char *what, const mr_status_override *overrides,
                          const char *detail, long long num);

#endif /* MR_PY_STATUS_H */
