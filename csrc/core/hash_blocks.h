/* hash_blocks.h - the simulator's token expansion of hash blocks
 * (mambaradix.sim.workloads.HashBlocks): a Mooncake prompt is kept as one
 * mixed 32-bit id per block, expanded into tokens when the replay first
 * matches it. */
#ifndef MR_HASH_BLOCKS_H
#define MR_HASH_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* Writes the tokens of blocks first, first + 1, ... of keys[0:nkeys) into
 * out[0:n) (the last block may be cut): token j of a block with id a is the
 * multiply-high (a * mults[j] mod 2**32) * vocab >> 32, the rule that
 * workloads.py documents, for bs = len(mults) >= 1 tokens per block and
 * vocab in [1, 2**32].  MR_EINVAL, nothing written, when out reaches past
 * the last key; *blocks (may be NULL) gets the blocks out spans. */
int mr_hash_blocks_write(const uint32_t *keys, size_t nkeys, const uint32_t *mults, size_t bs, int64_t first,
                         uint64_t vocab, int32_t *out, size_t n, size_t *blocks);

#endif /* MR_HASH_BLOCKS_H */
