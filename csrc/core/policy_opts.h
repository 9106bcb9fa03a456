/* policy_opts.h - the keys of a cache policy's options: the utility
 * policy's costs and windows (mr_radix_options) and the 0.5.23 leaf
 * orders' parameters (SGLang's eviction_policy_config, mr_leaf_order).
 * Which keys a policy takes, in which range, and where each value goes
 * live here; the binding reads them from a mapping (mr_read_policy,
 * module.c) and words its errors. */
#ifndef MR_POLICY_OPTS_H
#define MR_POLICY_OPTS_H

#include <stddef.h>
#include <stdint.h>

#include "radix.h"

typedef enum {
    MR_KEY_REAL,     /* a double, finite and >= 0, in mr_radix_options */
    MR_KEY_WINDOW,   /* a uint32 in [0, max], in mr_radix_options */
    MR_KEY_ORDER,    /* an int64 in [0, max], in mr_leaf_order */
} mr_policy_key_type;

typedef struct {
    const char *name;          /* the mapping's key */
    mr_policy_key_type type;
    int64_t max;               /* MR_KEY_WINDOW, MR_KEY_ORDER: the largest value */
    size_t offset;             /* of the field in its struct */
} mr_policy_key;

/* 1 for the policies that score states (sglang, consumed, utility,
 * adaptive), which take the utility policy's options; 0 for the leaf
 * orders. */
int mr_policy_is_classic(mr_lru_policy p);

/* The leaf orders' parameters before any option (evict_policy.py's
 * defaults). */
mr_leaf_order mr_policy_default_order(void);

/* The keys policy p takes, in the order they are read (*n of them; none
 * for a leaf order without parameters). */
const mr_policy_key *mr_policy_keys(mr_lru_policy p, size_t *n);

/* Stores key k's value (real for MR_KEY_REAL, v otherwise) in opt or
 * order.  MR_EINVAL, nothing stored, when it is out of the key's range
 * (a real that is negative, NaN or infinite). */
int mr_policy_key_set(const mr_policy_key *k, double real, int64_t v, mr_radix_options *opt, mr_leaf_order *order);

#endif /* MR_POLICY_OPTS_H */
