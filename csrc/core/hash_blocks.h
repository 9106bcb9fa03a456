/* hash_blocks.h - the simulator's synthetic tokens: the expansion of hash
 * blocks (mambaradix.sim.workloads.HashBlocks: a Mooncake prompt is kept as
 * one mixed 32-bit id per block, expanded into tokens when the replay first
 * matches it), and the pseudo output tokens of a request the trace gives
 * only an output length. */
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

/* The 64-bit FNV-1a hash of data[0:n). */
uint64_t mr_fnv1a64(const void *data, size_t n);

/* Writes a request's n pseudo output tokens: token j is
 * splitmix64's mix of seed + j * 0x9E3779B97F4A7C15 (no increment before the
 * mix), mod vocab, plus 1, so in [1, vocab] for vocab >= 1 (seed: the FNV-1a
 * hash of the request id, the rule mambaradix/sim/engine.py documents). */
void mr_pseudo_tokens_write(uint64_t seed, uint64_t vocab, int32_t *out, size_t n);

#endif /* MR_HASH_BLOCKS_H */
