/* py_pools.h - what py_pools.c shares with py_lifecycle.c: the slots of
 * the argument helpers and the C objects behind the pool types. */
#ifndef MR_PY_POOLS_H
#define MR_PY_POOLS_H

#include "py_common.h"
#include "req_pool.h"
#include "slot_alloc.h"

/* The C object behind a SlotAllocator / ReqPool, or NULL (no exception)
 * when obj is not one. */
mr_kv *mr_pools_slot_allocator_kv(PyObject *obj, mr_state *st);
mr_reqpool *mr_pools_req_pool(PyObject *obj, mr_state *st);

/* Registers the Lifecycle and ReqState types (py_lifecycle.c). */
int mr_py_lifecycle_init(PyObject *m, mr_state *st);

#endif /* MR_PY_POOLS_H */
