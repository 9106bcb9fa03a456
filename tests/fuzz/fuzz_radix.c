/* fuzz_radix.c - libFuzzer target for the radix tree.
 *
 * The first byte picks the configuration (page size, chunk size, LRU
 * policy); the remaining bytes are the choices of the random-operation
 * driver of tests/c/naive_model.c (insert, match, lock, unlock, both
 * evictions, dump, reset over a small token alphabet), which compares the
 * tree with its naive reference and runs mr_radix_check() after every
 * operation.  A mismatch aborts, so libFuzzer keeps the input.
 *
 * Build and run: make -C tests/c fuzz-run (clang with -fsanitize=fuzzer). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "naive_model.h"

typedef struct {
    const uint8_t *data;
    size_t size, pos;
} byte_source;

static uint32_t
bytes_next(void *ctx)
{
    byte_source *b = ctx;
    uint32_t v = 0;
    int i;
    for (i = 0; i < 2; i++) {
        v = v << 8 | (b->pos < b->size ? b->data[b->pos++] : 0);
    }
    return v;
}

static int
bytes_exhausted(void *ctx)
{
    const byte_source *b = ctx;
    return b->pos >= b->size;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const mr_radix_config cfgs[8] = {
        {1, 1, MR_POLICY_SGLANG}, {1, 4, MR_POLICY_CONSUMED},
        {2, 4, MR_POLICY_SGLANG}, {4, 2, MR_POLICY_CONSUMED},
        {1, 3, MR_POLICY_CONSUMED}, {2, 2, MR_POLICY_SGLANG},
        {4, 8, MR_POLICY_SGLANG}, {1, 2, MR_POLICY_CONSUMED},
    };
    byte_source b;
    nm_source src;
    nm_options o;

    if (size < 2) {
        return 0;
    }
    b.data = data + 1;
    b.size = size - 1;
    b.pos = 0;
    src.next = bytes_next;
    src.exhausted = bytes_exhausted;
    src.ctx = &b;
    o.cfg = cfgs[data[0] % 8];
    o.max_ops = 100000;
    o.corpus_seed = data[0] >> 3;
    o.kv_pool = 32 + 16 * o.cfg.page_size;
    o.state_pool = 8;
    o.inject_oom = 0;
    o.few_evictions = 0;
    if (nm_run(&o, &src, NULL) != 0) {
        abort();
    }
    return 0;
}
