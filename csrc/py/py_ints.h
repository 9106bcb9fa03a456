/* py_ints.h - the one reader of integer-array arguments, and the numpy
 * int64 results.
 *
 * mr_ints_read() takes a C-contiguous numpy array or any buffer of the
 * wanted signed type in place (no copy), and converts everything else into
 * a scratch mr_buf: buffers of other integer types or strides, objects
 * numpy converts (__array__: CPU torch tensors), sequences of ints.  Every
 * element is checked against [lo, hi]; errors name the argument:
 *
 *   TypeError   "<arg> must hold integers, not buffer format 'd'"
 *               "<arg> must be a sequence or buffer of ints, not float"
 *               "<arg>[3] must be an int, not str"
 *   ValueError  "<arg> must be 1-dimensional, not 2-dimensional"
 *               "<arg>[3] = -1 is out of range [0, 9]"   (or without "= v"
 *               when the value does not fit int64)
 *
 * Include after py_numpy.h. */
#ifndef MR_PY_INTS_H
#define MR_PY_INTS_H

#include "py_buf.h"

#define MR_INTS_SCALAR 1   /* a lone int is read as one element */
#define MR_INTS_BOOL 2     /* bools (True, False, bool buffers) read as 1 and 0: a mask */
#define MR_INTS_COPY 4     /* never in place: the ints are the reader's own copy (a kernel's host
                            * indices, which the kernel may overwrite or another thread change) */

typedef struct {
    const void *data;      /* len ints of the wanted width */
    size_t len;
    /* private */
    Py_buffer view;
    int have_view;
    PyObject *arr;
} mr_ints;

/* Reads obj as ints of width 4 (int32) or 8 (int64) in [lo, hi].  Returns
 * 0 with *out filled (release it with mr_ints_release: an array read in
 * place is held until then), or -1 with an exception (nothing to release). */
int mr_ints_read(PyObject *obj, int width, int64_t lo, int64_t hi, const char *arg, int flags, mr_buf *scratch,
                 mr_ints *out);
void mr_ints_release(mr_ints *v);

/* Reads obj as int32 tokens (mr_ints_read's rules and errors, a lone int
 * accepted) and appends them to dst at element `at` (dst grown as needed,
 * one element of room left past them); *len gets their number.  A
 * contiguous int64 buffer (SGLang's array('q') tokens) is narrowed straight
 * into dst; anything else goes through scratch.  Returns 0, or -1 with an
 * exception (dst's first `at` elements unchanged). */
int mr_ints_append_i32(PyObject *obj, const char *arg, mr_buf *scratch, mr_buf *dst, size_t at, size_t *len);

/* obj as a C-contiguous 1-D int64 numpy array (a new reference; obj itself
 * when it is one), through mr_ints_read with a lone int accepted. */
PyObject *mr_ints_array(PyObject *obj, const char *arg);

/* A new 1-D int64 numpy array of n elements: a copy of src, or
 * uninitialised when src is NULL. */
PyObject *mr_i64_array(const int64_t *src, size_t n);

#endif /* MR_PY_INTS_H */
