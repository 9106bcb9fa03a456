/* py_pools.h - what py_pools.c shares with py_lifecycle.c: the slots of
 * the module state's pools[] block and the argument helpers. */
#ifndef MR_PY_POOLS_H
#define MR_PY_POOLS_H

#include "py_common.h"
#include "req_pool.h"
#include "slot_alloc.h"

/* indices into mr_state.pools[] */
#define MR_POOLS_OWNERSHIP_ERROR 0
#define MR_POOLS_SLOT_ALLOCATOR  1
#define MR_POOLS_REQ_POOL        2
#define MR_POOLS_LIFECYCLE       3
#define MR_POOLS_REQ_STATE       4

/* obj as a C-contiguous 1-D int64 numpy array (a new reference); TypeError
 * naming arg otherwise.  A scalar becomes a 1-element array. */
PyObject *mr_pools_index_array(PyObject *obj, const char *arg);
/* A new uninitialised 1-D int64 numpy array of n elements. */
PyObject *mr_pools_new_i64(Py_ssize_t n);
/* Sets the exception for a failed free/transfer of `unit` number bad and
 * returns NULL: OwnershipError for a double free (MR_ENOENT) or a unit owned
 * by someone else (MR_EBUSY), ValueError for out of range (MR_EINVAL). */
PyObject *mr_pools_raise_owner(mr_state *st, int rc, const char *what, const char *unit, int64_t bad);

/* The C object behind a SlotAllocator / ReqPool, or NULL (no exception)
 * when obj is not one. */
mr_kv *mr_pools_slot_allocator_kv(PyObject *obj, mr_state *st);
mr_reqpool *mr_pools_req_pool(PyObject *obj, mr_state *st);

/* Registers the Lifecycle and ReqState types (py_lifecycle.c). */
int mr_py_lifecycle_init(PyObject *m, mr_state *st);

#endif /* MR_PY_POOLS_H */
