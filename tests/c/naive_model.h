/* naive_model.h - a naive reference for the radix tree, and a driver that
 * runs random operations on the tree and on the reference and compares
 * them after every step.
 *
 * Used by test_radix.c (--fuzz, --oom, with a seeded generator) and by the
 * libFuzzer target tests/fuzz/fuzz_radix.c (with the fuzzer's bytes as the
 * source of choices).
 *
 * The reference is a trie of pages (page_size tokens each), one per
 * namespace.  It knows nothing of nodes, splits or LRU order; it records
 * which pages the tree must hold, with which KV indices (the first
 * inserter's), which state slot ends at which page, and which locks cover
 * which page.  It learns about evictions from the mr_release callbacks and
 * checks each release as it happens.
 */
#ifndef MR_NAIVE_MODEL_H
#define MR_NAIVE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "radix.h"

/* Where the driver takes its choices from. */
typedef struct {
    uint32_t (*next)(void *ctx);   /* at least 16 random bits */
    int (*exhausted)(void *ctx);   /* non-zero: stop the run (NULL: never) */
    void *ctx;
} nm_source;

typedef struct {
    mr_radix_config cfg;   /* page_size 1, 2 or 4 */
    long max_ops;
    uint32_t corpus_seed;  /* the base token sequences keys are cut from */
    size_t kv_pool;        /* KV indices available to the "scheduler" */
    size_t state_pool;     /* state slots available */
    int inject_oom;        /* make random allocations fail: needs a build
                              with -DMR_FAULT_INJECT */
    int few_evictions;     /* evict mostly when a pool runs dry, so the
                              tree grows to the pools' size */
} nm_options;

/* What a run did, to show that it reached the interesting cases. */
typedef struct {
    long ops;
    long inserts, matches, locks, unlocks, evict_full, evict_state, resets;
    long splits;           /* operations that added a node without a new page */
    long revived;          /* inserts that gave a tombstone a state */
    long einval;           /* odd-length inserts refused */
    long enomem;           /* operations failed by fault injection */
    long max_nodes;
} nm_counts;

/* Runs up to opts->max_ops operations and releases everything at the end.
 * Returns 0, or 1 after the first mismatch (described on stderr, with the
 * operation number).  *counts (may be NULL) receives what was run. */
int nm_run(const nm_options *opts, const nm_source *src, nm_counts *counts);

#endif /* MR_NAIVE_MODEL_H */
