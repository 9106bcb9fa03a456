/* radix.h - the prefix tree of a hybrid (attention + recurrent state) cache.
 *
 * A path from the root spells a token sequence.  Every node holds one edge:
 * `len` tokens (int32) and the KV-pool index (int64) of each of them, and
 * optionally one *state slot*: the recurrent state after every token from
 * the root to the end of the node.  A node without a state is a
 * *tombstone*.  The tree behaves like SGLang v0.5.15's MambaRadixCache.
 *
 *   insert "a b c d" (state S1), then "a b x y" (state S2):
 *
 *       (root)                      (root)
 *         |                           |
 *     [a b c d] S1       ==>       [a b] --        <- split: the upper half
 *                                  /      \           is a tombstone
 *                             [c d] S1   [x y] S2
 *
 *   evict_state(1) picks the least recently used state.  An internal node
 *   loses only its state (tombstone, KV kept); a leaf is removed with its
 *   KV, and so is every tombstone above it that is left childless.
 *
 * Invariants (mr_radix_check() verifies I1..I7, I9 and I10, by number):
 *   I1  The root has an empty key, no state, and is in no LRU list.
 *   I2  Every other node has len > 0 and len % page_size == 0; its children
 *       are kept sorted by (namespace, first token) and no two children of a
 *       node share a first page.  A child's parent pointer is its parent.
 *       (The child array may hold holes, removed children's entries that
 *       keep their key: sorted with the rest, never the last entry, and
 *       nchildren counts the live ones.)
 *   I3  Every node below the root has the namespace (extra_key id) of its
 *       root child; keys of different namespaces never match.
 *   I4  The full LRU list holds every non-root node exactly once; the state
 *       LRU list holds exactly the nodes that have a state.
 *   I5  full_lock(n) == state_lock(n) + nostate_lock(n) + kv_lock(n) + sum
 *       over children of full_lock(child): a lock taken on a node also locks
 *       every ancestor's KV; the state is locked only on the node itself,
 *       and only when the node had a state when the lock was taken
 *       (nostate_lock counts the locks taken on a tombstone, so a later
 *       unlock never releases a state reference that was never taken;
 *       kv_lock the mr_radix_lock_kv locks, which only
 *       mr_radix_unlock_kv releases).
 *   I6  state_lock(n) > 0 implies n has a state (v0.5.15 semantics; in
 *       v0.5.23 a lock counts on a tombstone too, like SGLang's Mamba
 *       lock_ref, and a state attached under it is protected).
 *   I7  The four counters equal their definitions: full_evictable (resp.
 *       full_protected) is the number of tokens of non-root nodes with
 *       full_lock == 0 (resp. > 0); state_evictable (resp. state_protected)
 *       is the number of states on nodes with state_lock == 0 (resp. > 0).
 *   I8  A leaf has a state, except a tombstone that was full-locked when its
 *       last child was removed (or whose release callback failed during the
 *       cascade); evict_full() removes such a leaf like any other once it is
 *       unlocked.  This one depends on history, so mr_radix_check() cannot
 *       verify it; the C tests check it against a model.
 *   I9  Every live node is registered under its id with its current
 *       generation; handles of removed nodes are detected as stale.
 *   I10 While the leaf orders' victim heap is current (nothing but its own
 *       evictions changed the tree since it was built), it holds exactly the
 *       evictable leaves, each under its present key and rank, and the
 *       ranks rise along the full list from its LRU end.
 *
 * Ownership: the tree copies the keys and KV indices it is given.  It never
 * frees KV indices or state slots itself: insert reports the caller's
 * duplicate indices in an output buffer, and eviction hands what it removes
 * to the mr_release callbacks, which return them to their pools.
 *
 * Errors: every function returns MR_OK or a negative MR_E* code.  A failed
 * call leaves the tree valid (mr_radix_check() passes) and releases nothing.
 */
#ifndef MR_RADIX_H
#define MR_RADIX_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "nstable.h"

typedef struct mr_radix mr_radix;
typedef struct mr_node mr_node;

/* Which state-LRU touches the tree makes.  The choice of eviction victim
 * itself lives behind one internal interface (mr_evict_policy in radix.c),
 * so a utility-based policy can be added without touching the tree. */
typedef enum {
    /* SGLang v0.5.15: a match refreshes every state-bearing node on the
     * matched path; insert and split refresh states they walk through. */
    MR_POLICY_SGLANG = 0,
    /* SGLang PR #31643: a match refreshes only the node whose state is used;
     * insert walks and splits leave the state LRU alone. */
    MR_POLICY_CONSUMED = 1,
    /* Marconi-style utility: touches as CONSUMED; the victim is the lowest
     * alpha * norm(FLOPs saved per byte) + norm(recency) among the
     * evict_window least recently used candidates (see mr_radix_options). */
    MR_POLICY_UTILITY = 2,
    /* SGLang 0.5.23's --radix-eviction-policy orders for the KV leaf victim
     * (sglang/srt/mem_cache/evict_policy.py), touches as CONSUMED: the
     * victim is the evictable leaf with the smallest (key, last access),
     * the key being the hit count (LFU), the creation order (FIFO), the
     * insert priority (PRIORITY), hit count >= a threshold (SLRU), or
     * "tail-safe" (TLRU: -1 when the tokens above the leaf already cover the
     * branch's history + next prompt - threshold); MRU takes the most
     * recently used leaf and FILO the newest.  LRU is CONSUMED itself.
     * evict_full takes these victims from a heap of the evictable leaves
     * (O(log n) a victim), kept across calls while only its own evictions
     * change the tree.  Set in the config, or with mr_radix_set_policy (and
     * the orders' parameters) on an empty tree. */
    MR_POLICY_LFU = 3,
    MR_POLICY_FIFO = 4,
    MR_POLICY_MRU = 5,
    MR_POLICY_FILO = 6,
    MR_POLICY_PRIORITY = 7,
    MR_POLICY_SLRU = 8,
    MR_POLICY_TLRU = 9,
    /* GreedyDual-Size-Frequency, touches as CONSUMED: each state victim is
     * the state of least priority L + uses * FLOPs spared per byte (as in
     * UTILITY), L the last victim's priority; a new state below a path
     * that never branched supersedes the uses of the state above it; a state
     * whose siblings' states were mostly evicted unused is admitted on
     * probation (priority L, at the LRU end).  KV leaf victims as CONSUMED.
     * See radix.c, "Adaptive" and docs/adaptive.md. */
    MR_POLICY_ADAPTIVE = 10,
} mr_lru_policy;

/* Which SGLang release's tree rules the tree follows where they differ. */
typedef enum {
    /* v0.5.15 MambaRadixCache: removing a leaf also removes every tombstone
     * above it that is left childless and unlocked. */
    MR_SEMANTICS_V0515 = 0,
    /* 0.5.23 UnifiedRadixCache: a node lives as long as its KV does, so a
     * tombstone left childless stays (a stateless leaf) until the KV
     * eviction picks it; stateless inserts are its "insert without state". */
    MR_SEMANTICS_V0523 = 1,
} mr_semantics;

typedef struct {
    uint32_t page_size;   /* >= 1: matching, splits and children are per page */
    uint32_t chunk_size;  /* >= 1: branching lengths are aligned down to it */
    mr_lru_policy policy;
    mr_semantics semantics;  /* zero-initialized: v0.5.15 */
    /* Non-zero: attention-only model (SGLang's [FULL] tree).  No node needs a
     * state to be usable: a match uses the whole KV-matched path. */
    int kv_only;
    /* Non-zero: the tree keeps keys only, no KV index per token (a third of
     * the memory; for trees that only measure prefixes, such as a
     * simulator's record of every key seen).  Inserts read no values (val
     * may be NULL), mr_radix_path_values writes nothing and returns 0, and
     * the release callbacks get free_kv(ctx, NULL, n). */
    int no_values;
    /* Non-zero (with values): each KV index is kept as int32, two thirds of
     * the memory of int64 ones and what a req-to-token table holds.  The
     * caller vouches that every value it inserts fits int32 (a lifecycle
     * with pools: its KV indices fit its int32 table); inserts narrow them
     * unchecked.  Eviction hands them to free_kv32 when set, else widened
     * to free_kv. */
    int val32;
} mr_radix_config;

/* Options beyond SGLang, set after creation (mr_radix_set_options); all
 * zero by default. */
typedef struct {
    /* MR_POLICY_UTILITY only.  The model's costs: prefill
     * FLOPs of a token at position p are flops_per_token +
     * attn_flops_per_pos * p; a state slot is state_bytes, one token of KV
     * kv_bytes_per_token.  A state's FLOPs saved are those of prefilling
     * from the nearest state-bearing ancestor to the node's end (the
     * replay it spares); its bytes are state_bytes plus, for a leaf, its
     * edge's KV once the alpha tuner finds that counting it pays (at first
     * the KV pool is assumed plentiful). */
    double alpha;               /* initial weight of the FLOP efficiency */
    double flops_per_token;
    double attn_flops_per_pos;
    double state_bytes;
    double kv_bytes_per_token;
    uint32_t evict_window;      /* candidates scored per victim (0: 1024, the most) */
    /* MR_POLICY_ADAPTIVE: the scheduler's chunked prefill budget (SGLang's
     * chunked_prefill_size; 0: none).  Placement predicts no junction for
     * a key whose extend is longer (see "Adaptive placement"). */
    uint32_t chunked_prefill_size;
    /* > 0: alpha is re-tuned every tune_window insertions (after the first
     * eviction) by replaying them against a snapshot of the tree taken at
     * the window's start, once per alpha of a fixed grid (with and without
     * a leaf's KV bytes, with the recency order as is and reversed), and
     * keeping the choice that saved the most prefill FLOPs (Marconi's
     * tuner, plus the order). */
    uint32_t tune_window;
    /* Any policy: > 0 caps the states on one root-to-node path
     * (mr_radix_trim_path). */
    uint32_t max_states_per_path;
    /* MR_POLICY_UTILITY only.  Non-zero: the recency term starts reversed
     * (the most recently used state goes first) until the tuner finds
     * otherwise. */
    uint32_t mru;
} mr_radix_options;

/* Parameters of the 0.5.23 leaf orders (evict_policy.py's defaults: 2, 0, 0). */
typedef struct {
    int64_t slru_protected_threshold;   /* SLRU: hits that move a leaf to the protected segment */
    int64_t tlru_threshold;             /* TLRU: the TTFT budget, in tokens */
    int64_t tlru_next_prompt_estimate;  /* TLRU: expected tokens of the next prompt */
} mr_leaf_order;

/* Switches the tree's policy (any mr_lru_policy).  MR_EINVAL, nothing
 * changed, unless the tree is empty (the orders' bookkeeping starts with the
 * first node) or for an unknown policy.  order may be NULL (defaults). */
int mr_radix_set_policy(mr_radix *t, mr_lru_policy policy, const mr_leaf_order *order);

/* The policy table's names: "sglang", "consumed", "utility", "lfu", "fifo",
 * "mru", "filo", "priority", "slru", "tlru", "adaptive".  mr_radix_policy_name: NULL for
 * an unknown policy; mr_radix_policy_by_name: MR_EINVAL for an unknown name. */
const char *mr_radix_policy_name(mr_lru_policy policy);
int mr_radix_policy_by_name(const char *name, mr_lru_policy *out);

/* A node handle: stays comparable after the node is gone, and resolves to
 * MR_ESTALE then. */
typedef struct {
    uint32_t id;
    uint32_t gen;
} mr_handle;

/* Where eviction sends what it removes.  Each callback is called before the
 * node is changed; a non-zero return stops the eviction with that node left
 * in place, and the eviction returns that code.  For a leaf, free_kv is
 * called before free_state; free_state must not fail once free_kv accepted
 * the same node (reserve room for one slot in free_kv if needed), since the
 * KV handed over cannot be taken back. */
typedef struct {
    int (*free_kv)(void *ctx, const int64_t *indices, size_t n);
    int (*free_state)(void *ctx, int64_t slot);
    void *ctx;
    /* a val32 tree's KV as it keeps it (NULL: widened, to free_kv) */
    int (*free_kv32)(void *ctx, const int32_t *indices, size_t n);
} mr_release;

/* ------------------------------------------------------------------------
 * Lifetime */

/* Creates an empty tree.  MR_EINVAL if page_size or chunk_size is 0 or
 * neither divides the other, MR_ENOMEM on out of memory. */
int mr_radix_new(const mr_radix_config *cfg, mr_radix **out);
/* Frees the tree and every node.  Releases nothing to pools. */
void mr_radix_free(mr_radix *t);
/* Removes every node (SGLang's reset()).  Releases nothing to pools: the
 * caller clears them.  Handles of removed nodes become stale; the root
 * (and its handle) stays. */
void mr_radix_reset(mr_radix *t);

const mr_radix_config *mr_radix_config_of(const mr_radix *t);
/* Sets the options.  MR_EINVAL (nothing changed) for a negative or NaN cost
 * or alpha, or evict_window > 1024. */
int mr_radix_set_options(mr_radix *t, const mr_radix_options *opt);
const mr_radix_options *mr_radix_options_of(const mr_radix *t);

/* ------------------------------------------------------------------------
 * Match and insert */

typedef struct {
    mr_node *node;             /* deepest node on the path with a state, or root */
    size_t prefix_len;         /* tokens from the root to node (usable prefix) */
    size_t kv_matched_len;     /* tokens whose KV matched, through tombstones */
    int64_t branching_seqlen;  /* kv_matched_len aligned down to chunk_size when
                                  the KV match goes deeper than node, else -1;
                                  also -1 when the aligned value is 0; under
                                  the adaptive policy, when that gives no
                                  junction past node, possibly a predicted one
                                  (placed) */
    int64_t state;             /* node's state slot, -1 at the root */
    mr_node *kv_node;          /* deepest node whose KV matched (end of
                                  kv_matched_len; root when none) */
    int placed;                /* 1: branching_seqlen is the adaptive policy's
                                  predicted junction (see radix.c, "Adaptive
                                  placement"): inside the key, past
                                  kv_matched_len, a multiple of chunk_size and of
                                  page_size, and (branching_seqlen - prefix_len)
                                  a multiple of chunk_size */
} mr_match;

/* Matches key[0:len) (truncated to whole pages) in namespace ns (0 = none).
 * Splits a partially matched node, as SGLang does, even though the match
 * only reads: the upper half is a tombstone.  Refreshes the LRU lists.
 * MR_ENOMEM if a split could not be allocated: the tree is unchanged apart
 * from LRU order, and *out describes the match without the split part. */
int mr_radix_match(mr_radix *t, const int32_t *key, size_t len, int32_t ns,
                   mr_match *out);
/* mr_radix_match over an int64 key (key64, read in place, when key is
 * NULL; SGLang's array('q') tokens): only the tokens the walk compares are
 * read, and a token outside int32 matches nothing (no inserted key holds
 * one).  Exactly one of key and key64 is not NULL. */
int mr_radix_match_key(mr_radix *t, const int32_t *key, const int64_t *key64, size_t len, int32_t ns,
                       mr_match *out);
/* mr_radix_match_key for a key whose first mr_radix_path_len(from)
 * tokens are the path to `from`, a node with a state (the caller vouches
 * for the path: a lock held since a match of this key ended there); the
 * walk starts at from, those tokens unread, with the same result and
 * effects.  from NULL or the root: mr_radix_match_key.  MR_EINVAL, nothing
 * changed, when from has no state or its path is longer than the key's
 * whole pages. */
int mr_radix_match_key_from(mr_radix *t, mr_node *from, const int32_t *key, const int64_t *key64, size_t len,
                            int32_t ns, mr_match *out);
/* What mr_radix_match_key would return now (node, prefix_len, state,
 * kv_matched_len, branching_seqlen), without changing anything: no split
 * (kv_node is the node the match enters last, whose end may lie past
 * kv_matched_len), no LRU refresh, no counter.  For a decision that must
 * precede any change (mr_lc_prefill_batch).  MR_EINVAL on a kv_only tree,
 * whose match may end inside a node. */
int mr_radix_peek_key(const mr_radix *t, const int32_t *key, const int64_t *key64, size_t len, int32_t ns,
                      mr_match *out);

/* The effects of mr_radix_match on the key that ends exactly at node (a
 * node with a state, or any node with kv_only, or the root), without
 * walking the key: the policy's LRU refresh, the walked-token count and the
 * state's first use.  *prefix_len gets the node's prefix length.  What a
 * cache_unfinished_req does after its insert, whose result names the node.
 * MR_EINVAL if node has no state (a match would stop above it). */
int mr_radix_match_node(mr_radix *t, mr_node *node, size_t *prefix_len);

/* Writes the KV indices of the path root..node (node's prefix length of
 * them) to dst, in token order.  Returns the number written (0 in a tree
 * without values). */
size_t mr_radix_path_values(const mr_radix *t, const mr_node *node, int64_t *dst);
/* Number of tokens from the root to the end of node. */
size_t mr_radix_path_len(const mr_radix *t, const mr_node *node);

/* The negative tokens in the tree's keys, a run of one value once per node
 * (the caller deduplicates): the first min(count, cap) go to out, and the
 * count is returned.  A front end that stores ids outside int32 as
 * negative stand-ins (the 0.5.23 TreeCore's multimodal pad ids) learns
 * which stand-ins the tree still holds. */
size_t mr_radix_negative_tokens(const mr_radix *t, int64_t *out, size_t cap);

#define MR_NO_STATE ((int64_t)-1)

/* SGLang 0.5.23 insert parameters that feed the leaf orders: the request
 * already inserted [0, inserted_len) (only nodes ending past it count a
 * hit), and its priority (the walked nodes and a new leaf keep the highest
 * priority inserted through them). */
typedef struct {
    size_t inserted_len;
    int64_t priority;
    /* NULL, or a node of this tree whose path is the key's first
     * mr_radix_path_len(from) tokens (at most len), in the key's namespace:
     * the caller vouches for it (a request's locked node, matched from this
     * key), and those tokens are not read (key may hold garbage there).  The
     * insert visits the path's nodes as a walk from the root would. */
    const mr_node *from;
    /* NULL, or the values as int32 (val is not read then): a lifecycle's
     * req-to-token row, stored as it is in a val32 tree; duplicates are
     * written to dup_out widened. */
    const int32_t *val32;
} mr_insert_opts;

typedef struct {
    size_t prefix_len;   /* tokens of the key that were already in the tree */
    int state_existed;   /* 1: the node at the key's end already had a state;
                            the caller keeps (and must free) its slot */
    mr_node *node;       /* the node that ends at the key's end (root for an
                            empty key) */
    size_t ndup;         /* caller KV indices written to dup_out */
} mr_insert_result;

/* Inserts key/val[0:len) in namespace ns with state slot `state` (>= 0) at
 * its end, or (MR_SEMANTICS_V0523 only) with no state when state is MR_NO_STATE (SGLang 0.5.23's
 * insert without a Mamba value: a new leaf is a tombstone, an existing end
 * node keeps what it has; state_existed then tells whether it has one).  len must be a multiple of page_size (MR_EINVAL otherwise).
 * Indices the caller passed for tokens already in the tree are written to
 * dup_out (capacity len) for the caller to free, except those of the first
 * prev_prefix_len tokens (the caller's locked prefix, which are the tree's
 * own).  They are always the contiguous range val[min(prev_prefix_len,
 * prefix_len) : prefix_len), so dup_out may be NULL (only ndup is set).  An empty key inserts nothing and reports state_existed = 1.
 * On MR_ENOMEM the caller still owns every index and its slot, ndup is 0,
 * and the tree is valid (a split already made may remain). */
int mr_radix_insert(mr_radix *t, const int32_t *key, const int64_t *val, size_t len,
                    int32_t ns, int64_t state, size_t prev_prefix_len,
                    int64_t *dup_out, mr_insert_result *out);

/* Tokens of key[0:len) already in the tree in namespace ns: the prefix_len
 * mr_radix_insert would report.  Changes nothing (no split, no LRU touch). */
/* mr_radix_insert with SGLang 0.5.23's insert parameters (NULL: zeros). */
int mr_radix_insert_ex(mr_radix *t, const int32_t *key, const int64_t *val, size_t len,
                       int32_t ns, int64_t state, size_t prev_prefix_len, const mr_insert_opts *opts,
                       int64_t *dup_out, mr_insert_result *out);

size_t mr_radix_cached_len(const mr_radix *t, const int32_t *key, size_t len, int32_t ns);

/* ------------------------------------------------------------------------
 * Locks */

/* Locks node: its state (if it has one) and the KV of the whole path to the
 * root.  Locking the root does nothing. */
int mr_radix_lock(mr_radix *t, mr_node *node);
/* Undoes one mr_radix_lock(node).  MR_EINVAL if node holds no such lock
 * (one mr_radix_lock_kv took is not one: it takes mr_radix_unlock_kv), the
 * tree unchanged.  Unlocking the root does nothing. */
int mr_radix_unlock(mr_radix *t, mr_node *node);

/* Locks only the KV of the path root..node, never node's state (SGLang
 * 0.5.23's lock that skips the Mamba component, and its FULL pin).  Counted
 * apart (kv_lock) under both semantics: only mr_radix_unlock_kv undoes it. */
int mr_radix_lock_kv(mr_radix *t, mr_node *node);
/* Undoes one mr_radix_lock_kv(node).  MR_EINVAL if node holds no such lock. */
int mr_radix_unlock_kv(mr_radix *t, mr_node *node);
/* Releases the state part of one mr_radix_lock(node) and keeps its KV part
 * as one mr_radix_lock_kv(node) lock (SGLang 0.5.23 releasing a lock's
 * Mamba component first, then the rest: mr_radix_unlock_kv).  MR_EINVAL,
 * the tree unchanged, if node holds no mr_radix_lock lock. */
int mr_radix_unlock_state(mr_radix *t, mr_node *node);

/* ------------------------------------------------------------------------
 * Eviction */

/* Evicts least recently used unlocked leaves (with their state and the
 * tombstone chain above them) until at least num_tokens KV tokens were
 * released or nothing more can go.  *tokens_out / *states_out (may be
 * NULL) receive what was released, possibly more than asked. */
int mr_radix_evict_full(mr_radix *t, size_t num_tokens, const mr_release *rel,
                        size_t *tokens_out, size_t *states_out);
/* Evicts least recently used unlocked states until num_states were
 * released: an internal node becomes a tombstone (KV kept); a leaf is
 * removed with its KV and the tombstones above it.  A leaf whose KV is
 * locked is never picked. */
int mr_radix_evict_state(mr_radix *t, size_t num_states, const mr_release *rel,
                         size_t *tokens_out, size_t *states_out);

/* Per-path state budget: while the path root..node holds more than
 * max_states_per_path states, drops the deepest state above node on a node
 * with one child (the one the new state makes most redundant; a fork's
 * state also serves its other branches and is never dropped; the node keeps
 * its KV), through rel; stops at a locked one, or when only forks are
 * left.  node's own state is never dropped.  Does nothing when the budget
 * is 0.
 * *states_out (may be NULL) receives the number dropped. */
int mr_radix_trim_path(mr_radix *t, mr_node *node, const mr_release *rel, size_t *states_out);

/* 1 if a state eviction may take node's state now, 0 if not: the one rule
 * mr_radix_evict_state's victims (every policy) and
 * mr_radix_evict_node_state follow.  node is not the root, has a state
 * that is not locked, and is not a leaf whose KV is locked (v0.5.15;
 * v0.5.23 takes such a leaf's state, its KV staying). */
int mr_radix_can_evict_state(const mr_radix *t, const mr_node *node);
/* How many states evictions can surely free now, counted up to `enough`
 * (from the state list's LRU end): the states mr_radix_can_evict_state
 * allows on nodes that hold no lock of their own.  (A node holding a
 * KV-only lock, or a lock taken while it was a tombstone, may become a leaf
 * whose KV is locked once its children go, and such a leaf keeps its
 * state; so its state is not counted.)  Every state of a node without a
 * lock is freed sooner or later by mr_radix_evict_state (or with its leaf
 * by mr_radix_evict_full), whatever the order. */
size_t mr_radix_states_evictable_min(const mr_radix *t, size_t enough);

/* Evicts node's state as mr_radix_evict_state would if it picked node (an
 * external policy's choice, e.g. the simulator's belady one).
 * MR_EINVAL (nothing changed) unless mr_radix_can_evict_state(t, node). */
int mr_radix_evict_node_state(mr_radix *t, mr_node *node, const mr_release *rel, size_t *tokens_out,
                              size_t *states_out);

/* SGLang 0.5.23's mamba_max_states_per_path: when the path root..tail holds
 * more than cap states, drops the shallowest ones (KV kept, tombstones)
 * until it holds cap, skipping the tail, locked states and nodes that are
 * not a single-child link (forks and leaves): a best-effort cap, as in
 * SGLang.  *states_out (may be NULL) receives how many were dropped. */
int mr_radix_evict_path_states(mr_radix *t, mr_node *tail, size_t cap, const mr_release *rel,
                               size_t *states_out);

/* ------------------------------------------------------------------------
 * Sizes, checks, inspection */

typedef struct {
    size_t full_evictable;
    size_t full_protected;
    size_t state_evictable;
    size_t state_protected;
    size_t nodes;          /* non-root nodes */
    size_t memory_bytes;   /* bytes the tree holds (nodes, edges, tables) */
    /* State admission and use (every policy). */
    uint64_t states_admitted;   /* states inserted (new leaf or revived tombstone) */
    uint64_t states_used;       /* of those, states a match used at least once */
    uint64_t states_trimmed;    /* states dropped by the per-path budget */
    double alpha;               /* utility policy: the alpha in use */
    double kv_weight;           /* utility policy: share of a leaf's KV bytes counted (1 or 0) */
    int mru;                    /* utility policy: 1 when the recency order is reversed */
    uint64_t tunes;             /* utility policy: alpha re-tunings done */
    /* adaptive policy: its inflation L (the priority of the last victim),
     * the matches that wanted an evicted state (a ghost hit), the states
     * whose uses a new state below them superseded, and the states admitted
     * on probation. */
    double adaptive_inflation;
    uint64_t ghost_hits;
    uint64_t states_superseded;
    uint64_t unused_handovers;  /* adaptive: superseded states no match used that handed their value over */
    uint64_t admissions_probation;
    uint64_t placements;        /* adaptive: matches that proposed a predicted junction */
    uint64_t end_placements;    /* adaptive: of those, end snapshots moved up (end-relative placement) */
    /* Child-array entries shifted or copied to keep the arrays sorted and
     * without holes (see radix.c, "Children"): their upkeep's whole cost,
     * O(1) a removal amortized.  For tests of that bound. */
    uint64_t child_moves;
} mr_radix_stats;

void mr_radix_get_stats(const mr_radix *t, mr_radix_stats *out);

/* Verifies I1..I7, I9, I10 and the counters.  Returns MR_OK, or MR_ECORRUPT with
 * a message naming the invariant written to msg (capacity msglen), or
 * MR_ENOMEM if its traversal stack could not be allocated. */
int mr_radix_check(const mr_radix *t, char *msg, size_t msglen);

/* Appends a readable dump of the tree to *buf (a MR_MALLOC'd string the
 * caller frees), one node a line, indented by depth.  MR_ENOMEM possible. */
int mr_radix_dump(const mr_radix *t, char **buf, size_t *len);

mr_node *mr_radix_root(const mr_radix *t);
/* The tree's namespace table (nstable.h): the extra_key names of its
 * namespace ids, freed with the tree; mr_radix_reset keeps it. */
mr_nstable *mr_radix_namespaces(mr_radix *t);
mr_handle mr_node_handle(const mr_node *n);
/* Resolves a handle.  MR_ESTALE if the node was removed. */
int mr_radix_resolve(const mr_radix *t, mr_handle h, mr_node **out);
/* The live node that has id `id` (whatever its generation), or NULL. */
mr_node *mr_radix_node_by_id(const mr_radix *t, uint32_t id);

size_t mr_node_len(const mr_node *n);
const int32_t *mr_node_key(const mr_node *n);
/* The node's KV indices as the tree keeps them: int64, or int32 in a val32
 * tree (mr_radix_config); NULL without values. */
const void *mr_node_values(const mr_node *n);
/* n's KV indices [from, from + k) into dst, as int64 (whatever width t keeps
 * them in); nothing without values. */
void mr_node_values_i64(const mr_radix *t, const mr_node *n, size_t from, size_t k, int64_t *dst);
int64_t mr_node_state(const mr_node *n);          /* -1: tombstone or root */
int32_t mr_node_namespace(const mr_node *n);
mr_node *mr_node_parent(const mr_node *n);        /* NULL for the root */
size_t mr_node_nchildren(const mr_node *n);
/* The i-th child in sorted order (NULL past the last): O(1) unless removals
 * left holes in the node's child array, then a scan; a walk over every
 * child takes mr_node_child_next. */
mr_node *mr_node_child(const mr_node *n, size_t i);
/* The children in sorted order: *pos starts at 0; each call returns the
 * next child (NULL past the last) and moves *pos past it. */
mr_node *mr_node_child_next(const mr_node *n, size_t *pos);
int32_t mr_node_full_lock(const mr_node *n);
int32_t mr_node_state_lock(const mr_node *n);
int32_t mr_node_kv_lock(const mr_node *n);      /* mr_radix_lock_kv locks held on n itself */
uint32_t mr_node_hits(const mr_node *n);         /* 0.5.23 hit count (inserts through the node) */

/* LRU traversal, most recently used first.  which: 0 = full list, 1 = state
 * list.  Returns NULL past the end. */
mr_node *mr_radix_lru_first(const mr_radix *t, int which);
mr_node *mr_radix_lru_next(const mr_radix *t, int which, const mr_node *n);

#endif /* MR_RADIX_H */
