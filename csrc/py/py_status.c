/* py_status.c - the table from core status codes to exceptions
 * (py_status.h). */
#include "py_common.h"
#include "cuda_api.h"

static const mr_status_override defaults[] = {
    {MR_ENOMEM, MR_EXC_MEMORY, "%s: out of memory"},
    {MR_EINVAL, MR_EXC_VALUE, "%s: invalid argument"},
    {MR_ENOENT, MR_EXC_KEY, "%s: not found"},
    {MR_EBUSY, MR_EXC_RUNTIME, "%s: in use (locked)"},
    {MR_ESTALE, MR_EXC_STALE, "%s: the node was removed from the tree (stale handle)"},
    {MR_ECUDA, MR_EXC_RUNTIME, "%s: CUDA error: %s"},
    {MR_ECORRUPT, MR_EXC_INVARIANT, "%s"},
    {MR_ENOSPC, MR_EXC_RUNTIME, "%s: pool exhausted"},
    {MR_ESTATE, MR_EXC_RUNTIME, "%s: not valid in the current state"},
    MR_STATUS_END(NULL),
};

static PyObject *
exc_of(mr_state *st, mr_exc_kind k)
{
    switch (k) {
    case MR_EXC_MEMORY: return PyExc_MemoryError;
    case MR_EXC_VALUE: return PyExc_ValueError;
    case MR_EXC_KEY: return PyExc_KeyError;
    case MR_EXC_TYPE: return PyExc_TypeError;
    case MR_EXC_STALE: return st && st->StaleNodeError ? st->StaleNodeError : PyExc_ValueError;
    case MR_EXC_INVARIANT: return st && st->InvariantError ? st->InvariantError : PyExc_AssertionError;
    case MR_EXC_OWNERSHIP: return st && st->OwnershipError ? st->OwnershipError : PyExc_ValueError;
    case MR_EXC_RUNTIME:
    default: return PyExc_RuntimeError;
    }
}

static const mr_status_override *
lookup(const mr_status_override *t, int code)
{
    while (t != NULL) {
        for (; t->code != 0; t++) {
            if (t->code == code) {
                return t;
            }
        }
        t = t->more;
    }
    return NULL;
}

PyObject *
mr_raise_detail(mr_state *st, int code, const char *what, const mr_status_override *overrides,
                const char *detail, long long num)
{
    const mr_status_override *e = lookup(overrides, code);
    if (e == NULL) {
        e = lookup(defaults, code);
        if (code == MR_ECUDA) {
            detail = mr_last_cuda_error();
        }
    }
    if (e == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s: error %d (%s)", what, code, mr_strerror(code));
        return NULL;
    }
    PyErr_Format(exc_of(st, e->exc), e->fmt, what, detail ? detail : "", num);
    return NULL;
}

PyObject *
mr_raise(mr_state *st, int code, const char *what)
{
    return mr_raise_detail(st, code, what, NULL, NULL, 0);
}
