/* py_numpy.h - include NumPy's C API the same way in every binding file.
 * module.c defines MR_NUMPY_IMPORT and imports the API in its exec slot. */
#ifndef MR_PY_NUMPY_H
#define MR_PY_NUMPY_H

#ifndef NPY_NO_DEPRECATED_API
#define NPY_NO_DEPRECATED_API NPY_1_23_API_VERSION
#endif
#define PY_ARRAY_UNIQUE_SYMBOL mambaradix_ARRAY_API
#ifndef MR_NUMPY_IMPORT
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#endif /* MR_PY_NUMPY_H */
