/* hash_blocks.c - the simulator's synthetic tokens (hash_blocks.h), each in
 * one pass without numpy's passes and uint64 temporaries. */
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
     * right by 32 is the top b bits, as a shift would give, and that shift
     * (sh = 32 - b) makes the same tokens without the 64-bit product, in
     * 32-bit lanes that vectorise better (sh = 0: the product) */
    unsigned sh = 0;
    if (vocab >= 2 && vocab <= (UINT64_C(1) << 31) && (vocab & (vocab - 1)) == 0) {
        for (sh = 32; (UINT64_C(1) << (32 - sh)) < vocab; sh--) {
        }
    }
    for (size_t i = 0, b = 0; i < n; b++) {
        uint32_t key = keys[b];
        size_t len = n - i < bs ? n - i : bs;
        int32_t *o = out + i;
        if (sh != 0) {
            for (size_t j = 0; j < len; j++) {
                o[j] = (int32_t)((uint32_t)(key * mults[j]) >> sh);
            }
        }
        else {
            for (size_t j = 0; j < len; j++) {
                o[j] = (int32_t)(((uint64_t)(uint32_t)(key * mults[j]) * vocab) >> 32);
            }
        }
        i += len;
    }
    return MR_OK;
}

uint64_t
mr_fnv1a64(const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    uint64_t h = UINT64_C(1469598103934665603);
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * UINT64_C(1099511628211);
    }
    return h;
}

void
mr_pseudo_tokens_write(uint64_t seed, uint64_t vocab, int32_t *out, size_t n)
{
    uint64_t x = seed;
    for (size_t j = 0; j < n; j++, x += UINT64_C(0x9E3779B97F4A7C15)) {
        uint64_t z = x;
        z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
        z ^= z >> 31;
        out[j] = (int32_t)(z % vocab + 1);
    }
}
