/* radix_ops.h - the tree's operations in the form its front ends call them.
 *
 * mambaradix.RadixTree and the SGLang 0.5.23 TreeCore (csrc/py) expose the
 * tree's locks, evictions, NodeIds and policy names; the rules of those
 * calls live here, as plain C over radix.h: which lock call a kind of lock
 * is, what an eviction hands back and when a failed one is still a result,
 * how a NodeId names a node.  The bindings convert arguments and word the
 * status codes these return. */
#ifndef MR_RADIX_OPS_H
#define MR_RADIX_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "idset.h"
#include "radix.h"

/* ------------------------------------------------------------------------
 * Locks */

typedef enum {
    MR_LOCK = 0,       /* mr_radix_lock: the state and the path's KV */
    MR_UNLOCK,         /* mr_radix_unlock */
    MR_LOCK_KV,        /* mr_radix_lock_kv: the path's KV only */
    MR_UNLOCK_KV,      /* mr_radix_unlock_kv */
    MR_UNLOCK_STATE,   /* mr_radix_unlock_state: a full lock becomes a KV lock */
} mr_lock_op;

/* Applies op to node.  MR_EINVAL (the tree unchanged) when an unlock finds
 * no lock of its kind; *other (may be NULL) then counts the node's locks of
 * the other kind that the caller may have meant: for MR_UNLOCK the KV-only
 * locks on the node itself, for MR_UNLOCK_KV every lock through the node
 * (full_lock), for MR_UNLOCK_STATE 0. */
int mr_radix_lock_op(mr_radix *t, mr_node *node, mr_lock_op op, int32_t *other);

/* SGLang 0.5.23's lock components, as a mask of those a lock skipped (so
 * still holds after a release): 1 FULL, 2 MAMBA. */
#define MR_SKIP_FULL 1
#define MR_SKIP_MAMBA 2

/* The mask bit of SGLang's ComponentType value `component` (an int enum:
 * FULL 0, MAMBA 2), or 0 for any other value. */
int mr_skip_bit(long component);

/* Releases the components of one lock on node that `skipped` does not name,
 * as SGLang's cores do per component: none skipped, the whole lock
 * (mr_radix_unlock); FULL skipped, the MAMBA part alone (mr_radix_unlock_state:
 * the KV part stays as a KV lock, as SGLang's lazy slot allocation releases
 * a request's MAMBA lock first); MAMBA skipped, the KV lock
 * (mr_radix_unlock_kv: a lock that skipped MAMBA, or whose MAMBA part was
 * released); both skipped, nothing.  MR_EINVAL, the tree unchanged, when
 * node holds no lock of that kind. */
int mr_radix_release_components(mr_radix *t, mr_node *node, int skipped);
/* Undoes a successful mr_radix_release_components(t, node, skipped): the
 * released components are taken back (a MAMBA part released alone: the KV
 * lock it left goes back into a full lock). */
void mr_radix_retake_components(mr_radix *t, mr_node *node, int skipped);

/* ------------------------------------------------------------------------
 * Evictions into a collector */

/* What an eviction released: KV indices and state slots, grown as the
 * release callbacks hand them over (MR_MALLOC'd; mr_evict_out_free). */
typedef struct {
    int64_t *kv;
    size_t nkv, kvcap;
    int64_t *st;
    size_t nst, stcap;
    int count_only;   /* keep no KV indices (only the core's token count) */
} mr_evict_out;

typedef enum {
    MR_EVICT_FULL = 0,      /* mr_radix_evict_full(n tokens) */
    MR_EVICT_STATE,         /* mr_radix_evict_state(n states) */
    MR_EVICT_TRIM,          /* mr_radix_trim_path(node) */
    MR_EVICT_NODE_STATE,    /* mr_radix_evict_node_state(node) */
    MR_EVICT_PATH_STATES,   /* mr_radix_evict_path_states(node, cap n) */
} mr_evict_kind;

/* Runs one eviction of `kind` into out (zero-initialized by the caller;
 * freed by it with mr_evict_out_free whatever the outcome).  want_kv 0: out
 * keeps no KV indices, unless `owned` (RadixTree's ownership check, or
 * NULL) needs them to forget what the tree released; the caller then hides
 * them.  *tokens and *states receive what was released.  A failure after
 * something was released returns MR_OK (a partial eviction: the caller must
 * still free what out holds); otherwise the eviction's status. */
int mr_radix_evict_into(mr_radix *t, mr_evict_kind kind, mr_node *node, size_t n, int want_kv, mr_owned *owned,
                        mr_evict_out *out, size_t *tokens, size_t *states);
void mr_evict_out_free(mr_evict_out *out);

/* ------------------------------------------------------------------------
 * Names and ids */

/* RadixTree's page and chunk sizes: chunk 0 asks for the default,
 * max(64, page).  MR_EINVAL, with *chunk set, when neither divides the
 * other. */
int mr_radix_page_chunk(int64_t page, int64_t *chunk);

/* The integer attributes of a node that the front ends show. */
typedef enum {
    MR_NODE_IS_ROOT = 0,       /* 1 for the root, else 0 */
    MR_NODE_STATE,             /* the state slot, -1 for none (a tombstone, the root) */
    MR_NODE_FULL_LOCK,         /* mr_node_full_lock */
    MR_NODE_STATE_LOCK,        /* mr_node_state_lock */
    MR_NODE_CAN_EVICT_STATE,   /* mr_radix_can_evict_state: 1 or 0 */
    MR_NODE_HITS,              /* mr_node_hits */
    MR_NODE_PREFIX_LEN,        /* mr_radix_path_len: tokens root..node */
} mr_node_attr;

/* Attribute attr of node n (a live node of t); 0 for an unknown attr. */
int64_t mr_radix_node_attr(const mr_radix *t, const mr_node *n, mr_node_attr attr);

/* SGLang 0.5.23's NodeId of node: generation << 32 | node id, so that a
 * NodeId kept past an eviction that reused the id names no node. */
uint64_t mr_node_nodeid(const mr_node *node);
/* The live node a NodeId names, or NULL (a negative id, a stale generation,
 * no such node). */
mr_node *mr_radix_node_by_nodeid(const mr_radix *t, int64_t nodeid);

/* SGLang 0.5.23's --radix-eviction-policy names (lru is the consumed-state
 * policy), and past them any name of the tree's own policy table.
 * MR_EINVAL for another name. */
int mr_radix_policy_by_0523_name(const char *name, mr_lru_policy *out);

/* "v0.5.15" or "v0.5.23" -> the semantics; MR_EINVAL for another name. */
int mr_radix_semantics_by_name(const char *name, mr_semantics *out);

/* mr_radix_new, then mr_radix_set_options and mr_radix_set_policy (order
 * may be NULL): a tree ready for its first insert, or nothing (*out NULL)
 * and the first failure's status. */
int mr_radix_create(const mr_radix_config *cfg, const mr_radix_options *opt, const mr_leaf_order *order,
                    mr_radix **out);

/* ------------------------------------------------------------------------
 * Matches as SGLang 0.5.23's TreeCore reports them */

/* The device prefix of match m and its branching length: with a MAMBA
 * component the usable prefix is m's (the deepest node with a state) and
 * the branching length is kv_matched_len aligned down to chunk when that
 * goes deeper (else -1), or m's predicted junction when the adaptive
 * policy placed one (m->placed); without one the whole KV match is usable
 * and there is no branching length. */
void mr_match_device(const mr_match *m, int has_mamba, size_t chunk, size_t *device_len, int64_t *branching);

#endif /* MR_RADIX_OPS_H */
