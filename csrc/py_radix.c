/* py_radix.c - RadixTree and Node types (being written). */
#include "py_common.h"

int
mr_py_radix_init(PyObject *m, mr_state *st)
{
    return 0;
}
