/* ints.c - range checks and conversions of integer arrays (ints.h). */
#include "ints.h"

#include <string.h>

/* The first element of p[0:n) outside [lo, hi], element by element. */
static int64_t
first_out_scan(const void *p, int width, size_t n, int64_t lo, int64_t hi)
{
    for (size_t i = 0; i < n; i++) {
        int64_t x = width == 8 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
        if (x < lo || x > hi) {
            return (int64_t)i;
        }
    }
    return -1;
}

int64_t
mr_ints_first_out(const void *p, int width, size_t n, int64_t lo, int64_t hi)
{
    int64_t mn = INT64_MAX, mx = INT64_MIN;
    if (width == 8 && lo == INT64_MIN && hi == INT64_MAX) {
        return -1;   /* every int64 is in range: no pass */
    }
    if (width == 8 && lo == 0 && hi == INT64_MAX) {
        /* Only the sign bits matter: one OR over the array (vectorised
         * without 64-bit compares, which baseline x86-64 lacks). */
        const uint64_t *a = p;
        uint64_t any = 0;
        for (size_t i = 0; i < n; i++) {
            any |= a[i];
        }
        if ((any >> 63) == 0) {
            return -1;
        }
        mn = -1;   /* some element is negative: the scan below finds it */
    }
    else if (width == 8) {
        const int64_t *a = p;
        for (size_t i = 0; i < n; i++) {
            mn = a[i] < mn ? a[i] : mn;
            mx = a[i] > mx ? a[i] : mx;
        }
    }
    else {
        if (lo <= INT32_MIN && hi >= INT32_MAX) {
            return -1;
        }
        const int32_t *a = p;
        int32_t mn32 = INT32_MAX, mx32 = INT32_MIN;
        for (size_t i = 0; i < n; i++) {
            mn32 = a[i] < mn32 ? a[i] : mn32;
            mx32 = a[i] > mx32 ? a[i] : mx32;
        }
        mn = mn32;
        mx = mx32;
    }
    if (n == 0 || (mn >= lo && mx <= hi)) {
        return -1;
    }
    return first_out_scan(p, width, n, lo, hi);
}

/* Element at p as int64: signed or unsigned of itemsize bytes (an unsigned
 * value above INT64_MAX sets *overflow). */
static int64_t
item(const char *p, int itemsize, int is_signed, int *overflow)
{
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
    switch (itemsize) {
    case 1:
        memcpy(&u8, p, 1);
        return is_signed ? (int64_t)(int8_t)u8 : (int64_t)u8;
    case 2:
        memcpy(&u16, p, 2);
        return is_signed ? (int64_t)(int16_t)u16 : (int64_t)u16;
    case 4:
        memcpy(&u32, p, 4);
        return is_signed ? (int64_t)(int32_t)u32 : (int64_t)u32;
    default:
        memcpy(&u64, p, 8);
        if (!is_signed && u64 > (uint64_t)INT64_MAX) {
            *overflow = 1;
        }
        return (int64_t)u64;
    }
}

int64_t
mr_ints_convert(const void *src, int itemsize, int is_signed, ptrdiff_t stride, size_t n, void *dst,
                int width, int64_t lo, int64_t hi, int64_t *val, int *overflow)
{
    int contiguous = stride == itemsize;
    *overflow = 0;
    if (is_signed && itemsize == 8 && width == 4 && contiguous) {
        /* int64 keys (SGLang's array('q') tokens): one narrowing pass. */
        const int64_t *s = src;
        int32_t *d = dst;
        if (lo <= INT32_MIN && hi >= INT32_MAX) {
            if (!mr_narrow_i32(s, n, d)) {
                return -1;
            }
        }
        else {
            int64_t mn = 0, mx = 0;
            for (size_t i = 0; i < n; i++) {
                int64_t x = s[i];
                mn = x < mn ? x : mn;
                mx = x > mx ? x : mx;
                d[i] = (int32_t)x;
            }
            if (mn >= lo && mx <= hi) {
                return -1;
            }
        }
        /* Out of range somewhere: the loop below finds the first index. */
    }
    else if (is_signed && itemsize == 4 && width == 8 && contiguous) {
        /* int32 indices (SGLang's req_to_token rows): one widening pass,
         * the range checked by its min and max */
        const int32_t *s = src;
        int64_t *d = dst;
        int32_t mn = INT32_MAX, mx = INT32_MIN;
        for (size_t i = 0; i < n; i++) {
            int32_t x = s[i];
            mn = x < mn ? x : mn;
            mx = x > mx ? x : mx;
            d[i] = x;
        }
        if (n == 0 || (mn >= lo && mx <= hi)) {
            return -1;
        }
        /* Out of range somewhere: the loop below finds the first index. */
    }
    for (size_t i = 0; i < n; i++) {
        int64_t x = item((const char *)src + (ptrdiff_t)i * stride, itemsize, is_signed, overflow);
        if (*overflow || x < lo || x > hi) {
            *val = x;
            return (int64_t)i;
        }
        mr_ints_put(dst, width, i, x);
    }
    return -1;
}
