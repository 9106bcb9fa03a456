/* hash_blocks.c - the token expansion of hash blocks (hash_blocks.h), in
 * one pass without numpy's two passes and uint64 temporaries. */
#include "hash_blocks.h"

int
mr_hash_blocks_write(const uint32_t *keys, size_t nkeys, const uint32_t *mults, size_t bs, int64_t first,
                     uint64_t vocab, int32_t *out, size_t n, size_t *blocks)
{
    size_t nb = bs == 0 ? 0 : n / bs + (n % bs != 0);
    if (blocks != NULL) {
        *blocks = nb;
    }
    if (bs == 0 || first < 0 || (uint64_t)first > nkeys || nb > nkeys - (size_t)first) {
        return MR_EINVAL;
    }
    keys += first;
    /* one rule for every vocabulary: with vocab = 2**b the product shifted
     * right by 32 is the top b bits, as a shift would give */
    for (size_t i = 0, b = 0; i < n; b++) {
        uint32_t key = keys[b];
        size_t len = n - i < bs ? n - i : bs;
        int32_t *o = out + i;
        for (size_t j = 0; j < len; j++) {
            o[j] = (int32_t)(((uint64_t)(uint32_t)(key * mults[j]) * vocab) >> 32);
        }
        i += len;
    }
    return MR_OK;
}
