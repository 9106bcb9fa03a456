/* ints.h - range checks and conversions of integer arrays: the numeric work
 * behind the binding's integer-array reader (py_ints.c), which reads every
 * index, key and value argument.
 *
 * The functions only compute; the caller words the refusal (which argument,
 * which element, which value) from what they return. */
#ifndef MR_INTS_H
#define MR_INTS_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* Element i of dst (int32 when width is 4, int64 otherwise) = x. */
MR_INLINE void
mr_ints_put(void *dst, int width, size_t i, int64_t x)
{
    if (width == 4) {
        ((int32_t *)dst)[i] = (int32_t)x;
    }
    else {
        ((int64_t *)dst)[i] = x;
    }
}

/* The index of the first element of p[0:n) (int32 when width is 4, int64
 * when 8) outside [lo, hi], or -1 when every element is in range.  The
 * common all-in-range case is one scan with no early exit (it vectorises);
 * only a failed scan looks for the element. */
int64_t mr_ints_first_out(const void *p, int width, size_t n, int64_t lo, int64_t hi);

/* Converts n integers of itemsize bytes (1, 2, 4 or 8; signed when
 * is_signed, else unsigned), `stride` bytes apart from src, into dst[0:n)
 * (int32 when width is 4, int64 when 8), each checked against [lo, hi].
 * Returns -1 when every element is in range.  Otherwise the index of the
 * first that is not, with *val its value, or *overflow set (and *val
 * meaningless) when it is an unsigned value above INT64_MAX; dst is then
 * partly written.  Contiguous int64 -> int32 (SGLang's array('q') tokens)
 * and int32 -> int64 (its int32 req_to_token rows) take one vectorisable
 * pass. */
int64_t mr_ints_convert(const void *src, int itemsize, int is_signed, ptrdiff_t stride, size_t n, void *dst,
                        int width, int64_t lo, int64_t hi, int64_t *val, int *overflow);

#endif /* MR_INTS_H */
