/* lc_batch.h - the lifecycle's key-view calls (mr_key, mr_lc_batch_keys)
 * over the tests' int32 keys, and int64 ones where a test gives them. */
#ifndef MR_TEST_LC_BATCH_H
#define MR_TEST_LC_BATCH_H

#include "lifecycle.h"

static inline int
match32(mr_lifecycle *lc, const int32_t *key, size_t len, int32_t ns, int cow, mr_req *st, int32_t owner,
        mr_match *m, int64_t *indices)
{
    const mr_key k = {key, len, 4};
    return mr_lc_match(lc, &k, ns, cow, st, owner, m, indices);
}

/* keys64 NULL: every key is keys[i]; else keys64[i] when not NULL */
static inline int
prefill_batch_key(mr_lifecycle *lc, size_t n, const int32_t *const *keys, const int64_t *const *keys64,
                  const size_t *lens, const int32_t *ns, mr_lc_prefill_out *out)
{
    const mr_lc_batch_keys k = {keys, keys64, lens, NULL, NULL, NULL};
    return mr_lc_prefill_batch(lc, n, &k, ns, out);
}

static inline int
prefill_batch32(mr_lifecycle *lc, size_t n, const int32_t *const *keys, const size_t *lens, const int32_t *ns,
                mr_lc_prefill_out *out)
{
    return prefill_batch_key(lc, n, keys, NULL, lens, ns, out);
}

static inline int
unfinished_batch_key(mr_lifecycle *lc, size_t n, const int64_t *rows, const int32_t *const *keys,
                     const int64_t *const *keys64, const int32_t *ns, int64_t *fork_src, int64_t *fork_dst,
                     int64_t *bad)
{
    const mr_lc_batch_keys k = {keys, keys64, NULL, NULL, NULL, NULL};
    return mr_lc_unfinished_batch(lc, n, rows, &k, ns, fork_src, fork_dst, bad);
}

static inline int
unfinished_batch32(mr_lifecycle *lc, size_t n, const int64_t *rows, const int32_t *const *keys, const int32_t *ns,
                   int64_t *fork_src, int64_t *fork_dst)
{
    int64_t bad[3];
    return unfinished_batch_key(lc, n, rows, keys, NULL, ns, fork_src, fork_dst, bad);
}

static inline int
finish_batch_key(mr_lifecycle *lc, size_t n, const int64_t *rows, const int32_t *const *keys,
                 const int64_t *const *keys64, const int32_t *ns, int is_insert, int64_t *bad)
{
    const mr_lc_batch_keys k = {keys, keys64, NULL, NULL, NULL, NULL};
    return mr_lc_finish_batch(lc, n, rows, &k, ns, is_insert, bad);
}

static inline int
finish_batch32(mr_lifecycle *lc, size_t n, const int64_t *rows, const int32_t *const *keys, const int32_t *ns,
               int is_insert)
{
    int64_t bad[3];
    return finish_batch_key(lc, n, rows, keys, NULL, ns, is_insert, bad);
}

#endif /* MR_TEST_LC_BATCH_H */
