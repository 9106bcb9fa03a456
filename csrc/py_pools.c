/* py_pools.c - req-to-token pool, slot allocators and the request lifecycle. */
#include "py_common.h"

int
mr_py_pools_init(PyObject *m, mr_state *st)
{
    return 0;
}
