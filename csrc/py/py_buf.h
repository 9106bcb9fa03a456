/* py_buf.h - the one growable buffer of the bindings.
 *
 * An mr_buf is a PyMem block that grows by doubling (from 256 items): the
 * scratch a key is converted into, and the accumulator a result is
 * gathered in before it becomes a numpy array.  Capacity is counted in
 * bytes, so one buffer can serve int32 keys and int64 values in turn. */
#ifndef MR_PY_BUF_H
#define MR_PY_BUF_H

#include <stdint.h>
#include <string.h>

typedef struct {
    void *p;
    size_t cap;     /* bytes */
} mr_buf;

/* Room for n items of itemsize bytes (contents kept).  0, or -1 with
 * MemoryError. */
static inline int
mr_buf_reserve(mr_buf *b, size_t n, size_t itemsize)
{
    if (n > SIZE_MAX / 2 / (itemsize ? itemsize : 1)) {
        PyErr_NoMemory();
        return -1;
    }
    size_t need = n * itemsize;
    if (need <= b->cap) {
        return 0;
    }
    size_t cap = b->cap ? b->cap : 256 * itemsize;
    while (cap < need) {
        cap *= 2;
    }
    void *p = PyMem_Realloc(b->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline void
mr_buf_free(mr_buf *b)
{
    PyMem_Free(b->p);
    b->p = NULL;
    b->cap = 0;
}

/* A call borrows an object's scratch buffer for its whole duration
 * (mr_buf_take), so a re-entrant call (an __index__ that calls back into
 * the object while a key is read) works on a buffer of its own; the larger
 * of the two is kept when it comes back (mr_buf_give). */
static inline mr_buf
mr_buf_take(mr_buf *slot)
{
    mr_buf b = *slot;
    slot->p = NULL;
    slot->cap = 0;
    return b;
}

static inline void
mr_buf_give(mr_buf *slot, mr_buf *b)
{
    if (slot->p == NULL || b->cap > slot->cap) {
        PyMem_Free(slot->p);
        *slot = *b;
    }
    else {
        PyMem_Free(b->p);
    }
    b->p = NULL;
    b->cap = 0;
}

#endif /* MR_PY_BUF_H */
