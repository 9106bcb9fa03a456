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

/* The ReqState whose record each row of a ReqPool holds (size + 1
 * entries, borrowed: a ReqState clears its entry when it goes), or NULL
 * (no exception) when pool is not a ReqPool. */
PyObject **mr_pools_req_holders(PyObject *pool, mr_state *st);

/* py_lifecycle.c: the row a ReqState's record lived in (at generation
 * gen) was freed or unbound and rec is that record: the ReqState keeps it
 * again.  A ReqState bound to another generation of the row is left as it
 * is (it reports itself stale). */
void mr_py_req_state_take_back(PyObject *rs, uint32_t gen, const mr_req *rec);
/* py_lifecycle.c: ReqPool.record(row), a ReqState that reads and writes
 * the row's record while the row keeps its generation. */
PyObject *mr_py_req_state_view(PyObject *pool, mr_reqpool *rp, int64_t row, mr_state *st);

/* Registers the Lifecycle and ReqState types (py_lifecycle.c). */
int mr_py_lifecycle_init(PyObject *m, mr_state *st);

#endif /* MR_PY_POOLS_H */
