/* alloc.h - every allocation of the C core goes through these macros.
 *
 * Built with -DMR_FAULT_INJECT, mr_fault_fail_at(n) makes the n-th
 * allocation from now on fail (returns NULL), so tests can prove that every
 * operation leaves its structure valid on out-of-memory (the rax
 * rax_oom_malloc.h idea). */
#ifndef MR_ALLOC_H
#define MR_ALLOC_H

#include <stdlib.h>

#ifdef MR_FAULT_INJECT
void *mr_fault_malloc(size_t n);
void *mr_fault_calloc(size_t n, size_t sz);
void *mr_fault_realloc(void *p, size_t n);
/* Make allocation number n (1 = the next one) fail; 0 disables. */
void mr_fault_fail_at(long n);
/* Number of allocations attempted since the last mr_fault_fail_at(). */
long mr_fault_count(void);
#define MR_MALLOC(n)     mr_fault_malloc(n)
#define MR_CALLOC(n, sz) mr_fault_calloc((n), (sz))
#define MR_REALLOC(p, n) mr_fault_realloc((p), (n))
#else
#define MR_MALLOC(n)     malloc(n)
#define MR_CALLOC(n, sz) calloc((n), (sz))
#define MR_REALLOC(p, n) realloc((p), (n))
#endif
#define MR_FREE(p)       free(p)

#endif /* MR_ALLOC_H */
