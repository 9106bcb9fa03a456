/* py_radix.h - what py_radix.c lends the other bindings of a tree beyond
 * py_common.h's node API. */
#ifndef MR_PY_RADIX_H
#define MR_PY_RADIX_H

#include <Python.h>

#include "radix.h"

/* The KV indices from the root to n (len of them: its prefix length), as a
 * numpy int64 array; None in a tree without values. */
PyObject *mr_py_path_indices(const mr_radix *t, const mr_node *n, size_t len);

#endif /* MR_PY_RADIX_H */
