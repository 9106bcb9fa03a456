/* common.h - status codes and small helpers shared by every C file.
 *
 * Core functions return 0 on success or a negative MR_E* code; results go
 * through out-parameters.  Nothing in the core prints, sets errno or uses
 * Python.  The binding turns a code into an exception in one place
 * (mr_raise() in py_common.h). */
#ifndef MR_COMMON_H
#define MR_COMMON_H

#include <stddef.h>
#include <stdint.h>

#define MR_OK        0
#define MR_ENOMEM   (-1)  /* an allocation failed; the structure is unchanged */
#define MR_EINVAL   (-2)  /* a bad argument; the structure is unchanged */
#define MR_ENOENT   (-3)  /* no such element */
#define MR_EBUSY    (-4)  /* the element is locked or in use */
#define MR_ESTALE   (-5)  /* a node handle refers to a node that no longer exists */
#define MR_ECUDA    (-6)  /* a CUDA call failed; see mr_last_cuda_error() */
#define MR_ECORRUPT (-7)  /* an invariant check failed */
#define MR_ENOSPC   (-8)  /* a pool has no free element left */
#define MR_ESTATE   (-9)  /* the operation is not valid in the object's current state */

#if defined(__GNUC__) || defined(__clang__)
#define MR_LIKELY(x)   __builtin_expect(!!(x), 1)
#define MR_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define MR_INLINE      static inline __attribute__((always_inline))
#define MR_PREFETCH(p, off) __builtin_prefetch((const void *)((uintptr_t)(p) + (off)))
#else
#define MR_LIKELY(x)   (x)
#define MR_UNLIKELY(x) (x)
#define MR_INLINE      static inline
#define MR_PREFETCH(p, off) ((void)(p), (void)(off))
#endif

/* How far ahead (bytes) a pass over a caller's key asks for its memory.
 * A request's tokens are usually cold (written long before the cache sees
 * them), and a pass over them waits on memory, not on arithmetic: asking
 * 2 KiB ahead made the C calls on a cold 2,176-token key 1.07-1.28x faster
 * (miss 1.26x, insert 1.07x, hit 1.17x; docs/performance.md, "Per-token
 * passes and cold keys").
 * MR_PREFETCH(p, off) asks for the byte off past p; the address is formed
 * as an integer, so it may lie past the key's end (a prefetch never
 * faults). */
#define MR_AHEAD 2048

/* MR_VERIFY_TRUSTED (defined by debug and sanitizer builds, setup.py, and
 * by the sanitized C tests): the few hot paths that trust the core's own
 * invariants instead of validating each unit (a tree eviction's KV frees,
 * an insert's ownership transfer, the lifecycle's row writes of indices it
 * holds, an insert from a request's locked node, which trusts the request's
 * tokens to begin with that node's path) validate anyway and abort on a
 * breach. */

/* 1 when this build defines MR_VERIFY_TRUSTED (a test that feeds a
 * trusting path what it may not read asks first). */
int mr_verifies_trusted(void);

/* 1 when every value of src[0:n) fits int32: one branch-free pass (x fits
 * when x + 2^31 has no bit above bit 31), which vectorises. */
MR_INLINE int
mr_fits_i32(const int64_t *src, size_t n)
{
    uint64_t out = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {   /* a cache line a step, read ahead */
        MR_PREFETCH(src + i, MR_AHEAD);
        for (size_t j = i; j < i + 8; j++) {
            out |= ((uint64_t)src[j] + UINT64_C(0x80000000)) >> 32;
        }
    }
    for (; i < n; i++) {
        out |= ((uint64_t)src[i] + UINT64_C(0x80000000)) >> 32;
    }
    return out == 0;
}

/* Narrows src[0:n) (int64) into dst (int32) in one pass, read ahead as
 * mr_fits_i32; nonzero when some value x has (x + bias) >> shift != 0 as
 * uint64 (dst then holds every value truncated).  Add, shift and or
 * vectorise on plain SSE2 (a 64-bit min/max does not). */
MR_INLINE int
mr_narrow_checked(const int64_t *src, size_t n, int32_t *dst, uint64_t bias, int shift)
{
    uint64_t out = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        MR_PREFETCH(src + i, MR_AHEAD);
        for (size_t j = i; j < i + 8; j++) {
            uint64_t x = (uint64_t)src[j];
            out |= (x + bias) >> shift;
            dst[j] = (int32_t)(uint32_t)x;
        }
    }
    for (; i < n; i++) {
        uint64_t x = (uint64_t)src[i];
        out |= (x + bias) >> shift;
        dst[i] = (int32_t)(uint32_t)x;
    }
    return out != 0;
}

/* mr_narrow_checked: nonzero when some value does not fit int32. */
MR_INLINE int
mr_narrow_i32(const int64_t *src, size_t n, int32_t *dst)
{
    return mr_narrow_checked(src, n, dst, UINT64_C(0x80000000), 32);
}

/* mr_narrow_checked: nonzero when some value lies outside [0, INT32_MAX]. */
MR_INLINE int
mr_narrow_i32_nonneg(const int64_t *src, size_t n, int32_t *dst)
{
    return mr_narrow_checked(src, n, dst, 0, 31);
}

/* Short name of a status code ("MR_ENOMEM"), for messages. */
const char *mr_strerror(int code);

#endif /* MR_COMMON_H */
