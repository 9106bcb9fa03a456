/* py_lifecycle.c - the Lifecycle type (being written). */
#include "py_pools.h"

int
mr_py_lifecycle_init(PyObject *m, mr_state *st)
{
    return 0;
}
