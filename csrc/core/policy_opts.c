/* policy_opts.c - the keys of a cache policy's options (policy_opts.h). */
#include "policy_opts.h"

#include <math.h>

#define OPT(field) offsetof(mr_radix_options, field)
#define ORDER(field) offsetof(mr_leaf_order, field)

/* The utility policy's options (any scoring policy takes them): the
 * model's costs, then the windows. */
static const mr_policy_key classic_keys[] = {
    {"alpha", MR_KEY_REAL, 0, OPT(alpha)},
    {"flops_per_token", MR_KEY_REAL, 0, OPT(flops_per_token)},
    {"attn_flops_per_pos", MR_KEY_REAL, 0, OPT(attn_flops_per_pos)},
    {"state_bytes", MR_KEY_REAL, 0, OPT(state_bytes)},
    {"kv_bytes_per_token", MR_KEY_REAL, 0, OPT(kv_bytes_per_token)},
    {"evict_window", MR_KEY_WINDOW, 1024, OPT(evict_window)},
    {"tune_window", MR_KEY_WINDOW, 1 << 20, OPT(tune_window)},
    {"mru", MR_KEY_WINDOW, 1, OPT(mru)},
    {"chunked_prefill_size", MR_KEY_WINDOW, INT32_MAX, OPT(chunked_prefill_size)},
};

/* The leaf orders' keys, as SGLang's eviction_policy_config names them:
 * SLRU takes the first, TLRU the other two. */
static const mr_policy_key order_keys[] = {
    {"protected_threshold", MR_KEY_ORDER, (int64_t)1 << 60, ORDER(slru_protected_threshold)},
    {"threshold", MR_KEY_ORDER, (int64_t)1 << 60, ORDER(tlru_threshold)},
    {"next_prompt_estimate", MR_KEY_ORDER, (int64_t)1 << 60, ORDER(tlru_next_prompt_estimate)},
};

int
mr_policy_is_classic(mr_lru_policy p)
{
    return p == MR_POLICY_SGLANG || p == MR_POLICY_CONSUMED || p == MR_POLICY_UTILITY || p == MR_POLICY_ADAPTIVE;
}

mr_leaf_order
mr_policy_default_order(void)
{
    return (mr_leaf_order){2, 0, 0};
}

const mr_policy_key *
mr_policy_keys(mr_lru_policy p, size_t *n)
{
    if (mr_policy_is_classic(p)) {
        *n = sizeof(classic_keys) / sizeof(classic_keys[0]);
        return classic_keys;
    }
    *n = p == MR_POLICY_SLRU ? 1 : p == MR_POLICY_TLRU ? 2 : 0;
    return p == MR_POLICY_TLRU ? order_keys + 1 : order_keys;
}

int
mr_policy_key_set(const mr_policy_key *k, double real, int64_t v, mr_radix_options *opt, mr_leaf_order *order)
{
    switch (k->type) {
    case MR_KEY_REAL:
        if (!(real >= 0.0) || isinf(real)) {
            return MR_EINVAL;
        }
        *(double *)((char *)opt + k->offset) = real;
        return MR_OK;
    case MR_KEY_WINDOW:
        if (v < 0 || v > k->max) {
            return MR_EINVAL;
        }
        *(uint32_t *)((char *)opt + k->offset) = (uint32_t)v;
        return MR_OK;
    default:
        if (v < 0 || v > k->max) {
            return MR_EINVAL;
        }
        *(int64_t *)((char *)order + k->offset) = v;
        return MR_OK;
    }
}
