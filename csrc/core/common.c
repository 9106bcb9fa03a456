/* common.c - status names and the fault-injecting allocator. */
#include "common.h"
#include "alloc.h"

const char *
mr_strerror(int code)
{
    switch (code) {
    case MR_OK: return "MR_OK";
    case MR_ENOMEM: return "MR_ENOMEM";
    case MR_EINVAL: return "MR_EINVAL";
    case MR_ENOENT: return "MR_ENOENT";
    case MR_EBUSY: return "MR_EBUSY";
    case MR_ESTALE: return "MR_ESTALE";
    case MR_ECUDA: return "MR_ECUDA";
    case MR_ECORRUPT: return "MR_ECORRUPT";
    case MR_ENOSPC: return "MR_ENOSPC";
    case MR_ESTATE: return "MR_ESTATE";
    default: return "MR_E?";
    }
}

#ifdef MR_FAULT_INJECT
static long fault_target = 0;   /* 0: never fail */
static long fault_counter = 0;

void mr_fault_fail_at(long n) { fault_target = n; fault_counter = 0; }
long mr_fault_count(void) { return fault_counter; }

static int
fault_hit(void)
{
    fault_counter++;
    return fault_target > 0 && fault_counter == fault_target;
}

void *mr_fault_malloc(size_t n) { return fault_hit() ? NULL : malloc(n); }
void *mr_fault_calloc(size_t n, size_t sz) { return fault_hit() ? NULL : calloc(n, sz); }
void *mr_fault_realloc(void *p, size_t n) { return fault_hit() ? NULL : realloc(p, n); }
#endif

int
mr_verifies_trusted(void)
{
#ifdef MR_VERIFY_TRUSTED
    return 1;
#else
    return 0;
#endif
}
