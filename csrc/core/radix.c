/* radix.c - the prefix tree of a hybrid cache.  See radix.h for the model,
 * the invariants (I1..I10) and the ownership rules. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "radix.h"

/* ------------------------------------------------------------------------
 * Data layout
 *
 * Nodes carry parent pointers (eviction walks leaf -> root) and a sorted
 * array of child entries (namespace, first token, pointer): a child is
 * found by binary search, so a root with thousands of children costs a few
 * comparisons.  With page_size > 1 several children may share a first token
 * (not a first page); their entries are adjacent and compared page-wise.
 * A removed child leaves a hole (its entry keeps its key, the pointer is
 * NULL) instead of shifting the entries after it: removing one of n
 * siblings is O(log n) (an LRU eviction takes the oldest, often the first
 * entry), and the holes are squeezed out in one pass when they are more
 * than half the entries (or a quarter when the array is full), so the
 * shifts cost O(1) a removal amortized.  An added child fills a hole next
 * to its place when there is one.
 *
 * Each node's KV indices and tokens live in one allocation: `len` int64
 * values followed by `len` int32 tokens.
 *
 * Two intrusive LRU lists (0: every non-root node, 1: nodes with a state)
 * are circular doubly-linked lists around a sentinel in the tree; the most
 * recently used node follows the sentinel. */

typedef struct mr_link {
    struct mr_link *prev;   /* NULL when not in the list */
    struct mr_link *next;
} mr_link;

typedef struct {
    int32_t ns;       /* namespace of the child */
    int32_t tok;      /* first token of the child */
    mr_node *child;
} mr_child;

struct mr_node {
    mr_node *parent;
    mr_child *children;
    uint32_t nchildren;    /* live children */
    uint32_t nent;         /* entries in use: the live ones and the holes among them */
    uint32_t cap;
    uint32_t len;          /* edge length in tokens */
    int32_t ns;
    void *vals;            /* len KV indices (int64, int32 in a val32 tree), then the key (NULL: no values) */
    int32_t *key;          /* len int32 tokens: after val, or alone without values */
    int64_t state;         /* -1: tombstone */
    int32_t full_lock;
    int32_t state_lock;
    int32_t nostate_lock;  /* v0.5.15: mr_radix_lock calls taken while it had no state */
    int32_t kv_lock;       /* mr_radix_lock_kv calls (locks that skip the state) */
    uint32_t id;
    uint32_t gen;
    uint32_t rank;         /* position in the full list from its LRU end, as of the leaf heap's build */
    mr_link lru[2];
    uint64_t stamp;        /* state-list recency: larger is more recent */
    uint64_t end;          /* tokens from the root to the node's end (fixed for its life) */
    uint8_t used;          /* a match used this node's current state */
    /* SGLang 0.5.23's leaf orders (MR_POLICY_LFU ... MR_POLICY_TLRU). */
    uint32_t hits;         /* inserts that walked through or created the node */
    int64_t prio;          /* highest insert priority through the node */
    uint64_t born;         /* creation order (a split's upper part keeps the child's) */
    uint64_t hist;         /* TLRU: deepest end ever inserted below the node (its own end included) */
    /* The adaptive policy's marks (see "Adaptive"). */
    uint8_t reused;        /* a match used the current state (not counting match_node) */
    uint8_t ghost;         /* the adaptive policy evicted this node's state (an AD_GHOST_* kind) */
    uint8_t forked;        /* the node has had two children at once (adaptive supersession) */
    uint8_t ad_prob;       /* admitted on probation and not used since: its priority is ad_base */
    uint32_t ad_f;         /* uses of the current state (1 at admission) */
    double ad_base;        /* the inflation when its uses last changed (priority: adaptive_prio) */
    double ad_eff;         /* its value then (adaptive_eff): the most it counts until f changes */
    double ad_floor;       /* the least its value counts: what the used state it superseded counted */
    uint32_t kid_used;     /* states attached under this node that a match used, or wanted (ghost hit) */
    uint32_t kid_wasted;   /* states attached under this node evicted without a use */
    /* Adaptive placement (see "Adaptive placement"). */
    uint64_t top;          /* depth where the node's branch began (the insert that created it parted there) */
    uint32_t br_shared;    /* branches begun at this node's end that a later match parted from */
    uint32_t br_cont;      /* branches begun at this node's end that a later match continued */
    uint64_t placed_at;    /* the junction the last placement at this node's end predicted (0: none) */
    uint16_t shared;       /* branch head: 1 + the deepest bucket a match parted from it at (0: none) */
    uint8_t cont;          /* branch head: a match continued past its whole path */
    uint8_t placed;        /* branch head: its insert ended at the junction predicted where it began */
};

enum { LRU_FULL = 0, LRU_STATE = 1 };

/* Adaptive end-relative placement: partings up to AD_NB steps above a state. */
#define AD_NB 64

struct mr_radix {
    mr_radix_config cfg;
    mr_radix_options opt;
    double kv_weight;         /* utility: share of a leaf's KV bytes counted (0 at first; tuned: 0 or 1) */
    double recency;           /* utility: sign of the recency term: +1 evicts the least recently
                                 used first, -1 the most recently used (tuned) */
    mr_node *root;
    mr_link head[2];          /* LRU sentinels */
    mr_nstable ns;            /* extra_key names -> namespace ids (kept by reset) */
    /* Node registry for handles (I9). */
    mr_node **by_id;
    uint32_t *gens;           /* next generation of each id */
    uint32_t *free_ids;       /* stack of unused ids, capacity == id_cap */
    uint32_t nfree;
    uint32_t nids;            /* ids handed out so far (high-water mark) */
    uint32_t id_cap;
    /* Counters (I7). */
    size_t full_evictable;
    size_t full_protected;
    size_t state_evictable;
    size_t state_protected;
    size_t nodes;
    size_t bytes;             /* memory held by nodes, edges and child arrays */
    /* State admission / use counters (mr_radix_stats). */
    uint64_t clock;           /* state-list stamps */
    uint64_t states_admitted;
    uint64_t states_used;
    uint64_t states_trimmed;
    uint64_t tunes;
    /* Utility policy's alpha tuner: a snapshot taken at the window's start
     * and the keys inserted since (concatenated). */
    mr_radix *snap;
    int32_t *log_keys;
    size_t log_len, log_cap;
    size_t *log_off;          /* nlog + 1 offsets */
    int32_t *log_ns;
    size_t nlog, log_ncap;
    size_t snap_tokens;       /* KV tokens of the snapshot */
    uint64_t work;            /* tokens walked by matches and insertions */
    uint64_t child_moves;     /* child-array entries shifted or copied (their upkeep's cost) */
    uint64_t spent;           /* tokens the tuner copied or replayed */
    size_t max_states;        /* most states the tree held during the window */
    uint64_t births;          /* creation counter (mr_node.born) */
    mr_leaf_order order;      /* the 0.5.23 leaf orders' parameters */
    /* The leaf orders' victim heap (see "Leaf heap"): valid while heap_ok
     * and nothing but its own evictions changed the tree since (ver). */
    struct leaf_ent *heap;
    size_t heap_len, heap_cap;
    uint64_t ver;             /* bumped by every change a leaf order can see */
    uint64_t heap_ver;        /* ver when the heap was last brought up to date */
    int heap_ok;
    /* An insert's path from the root to opts->from, in walk order. */
    mr_node **walk;
    size_t walk_cap;
    int64_t *wide;            /* a val32 node's KV widened for free_kv (no free_kv32) */
    size_t wide_cap;
    /* The adaptive policy (see "Adaptive"). */
    double ad_inflation;      /* L: the highest priority a victim has had */
    mr_node *ad_victim;       /* the victim chosen last (its eviction leaves a ghost) */
    struct ad_ghost *ghosts;  /* ghosts of removed leaves (AD_GHOSTS entries, or NULL) */
    mr_node *last_up;         /* evict_leaf: the ancestor that survived, and the first */
    int32_t last_tok;         /* token of the branch removed below it */
    uint64_t ad_ghost_hits, ad_probation, ad_superseded, ad_handed_unused;
    uint32_t ad_wanted, ad_found;  /* recent matches that found a ghost / used a state and found none */
    uint32_t ad_parted, ad_continued;  /* recent ghost hits of the upper / lower state of a supersession */
    uint32_t *ad_depth;       /* placement: junction depths per bucket (AD_PB, or NULL) */
    uint64_t ad_events;       /* placement: observations since the last halving */
    uint32_t ad_near[AD_NB];  /* placement: partings r steps above the first state below them (bucket r) */
    uint32_t ad_ends;         /* placement: branches continued past their whole path */
    uint64_t ad_placed_end;   /* placement: end snapshots moved up (adaptive_place_end) */
    uint64_t ad_placed;       /* placement: predicted junctions proposed */
};

static void tune_start(mr_radix *t);
static void tune_log(mr_radix *t, const int32_t *key, size_t len, int32_t ns, size_t nwalk);

MR_INLINE int32_t *
node_key(const mr_node *n)
{
    return n->key;
}

/* Bytes of one KV index as the tree keeps it (0 without values). */
MR_INLINE size_t
val_bytes(const mr_radix *t)
{
    return t->cfg.no_values ? 0 : t->cfg.val32 ? sizeof(int32_t) : sizeof(int64_t);
}

/* Bytes a node stores per token: its KV index and its token. */
MR_INLINE size_t
token_bytes(const mr_radix *t)
{
    return val_bytes(t) + sizeof(int32_t);
}

/* Points vals and key into n's storage mem (vals first: int64 alignment). */
MR_INLINE void
node_place(const mr_radix *t, mr_node *n, void *mem)
{
    if (t->cfg.no_values) {
        n->vals = NULL;
        n->key = mem;
    }
    else {
        n->vals = mem;
        n->key = mem == NULL ? NULL : (int32_t *)((char *)mem + n->len * val_bytes(t));
    }
}

MR_INLINE void *
node_mem(const mr_node *n)
{
    return n->vals != NULL ? n->vals : (void *)n->key;
}

/* n's KV indices [from, from + k) into dst as int64. */
static void
node_vals_out(const mr_radix *t, const mr_node *n, size_t from, size_t k, int64_t *dst)
{
    if (t->cfg.val32) {
        const int32_t *v = (const int32_t *)n->vals + from;
        for (size_t i = 0; i < k; i++) {
            dst[i] = v[i];
        }
    }
    else {
        memcpy(dst, (const int64_t *)n->vals + from, k * sizeof(int64_t));
    }
}

/* src[0:k) into n's KV indices from `from` (narrowed in a val32 tree: the
 * caller vouches that they fit). */
static void
node_vals_in(const mr_radix *t, mr_node *n, size_t from, const int64_t *src, size_t k)
{
    if (t->cfg.val32) {
        int32_t *v = (int32_t *)n->vals + from;
        for (size_t i = 0; i < k; i++) {
            v[i] = (int32_t)src[i];
        }
    }
    else {
        memcpy((int64_t *)n->vals + from, src, k * sizeof(int64_t));
    }
}

MR_INLINE mr_node *
link_node(mr_link *l, int which)
{
    return (mr_node *)((char *)l - offsetof(mr_node, lru) - (size_t)which * sizeof(mr_link));
}

/* ------------------------------------------------------------------------
 * LRU lists */

MR_INLINE int
lru_in(const mr_node *n, int w)
{
    return n->lru[w].prev != NULL;
}

MR_INLINE void
lru_remove(mr_node *n, int w)
{
    mr_link *l = &n->lru[w];
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->prev = l->next = NULL;
}

/* Inserts n right after pos (toward the LRU end). */
MR_INLINE void
lru_insert_after(mr_link *pos, mr_node *n, int w)
{
    mr_link *l = &n->lru[w];
    l->prev = pos;
    l->next = pos->next;
    pos->next->prev = l;
    pos->next = l;
}

MR_INLINE void
lru_push_mru(mr_radix *t, mr_node *n, int w)
{
    t->ver++;
    lru_insert_after(&t->head[w], n, w);
    if (w == LRU_STATE) {
        n->stamp = ++t->clock;
    }
}

MR_INLINE void
lru_touch(mr_radix *t, mr_node *n, int w)
{
    lru_remove(n, w);
    lru_push_mru(t, n, w);
}

/* Moves n and its ancestors (state list: only those with a state) to the
 * MRU end so the chain reads n, parent, grandparent, ... from the MRU side:
 * nodes closer to the root are evicted first. */
static void
lru_touch_path(mr_radix *t, mr_node *n, int w)
{
    mr_link *prev = &t->head[w];
    uint64_t k = 0;   /* stamps decrease along the chain, as the list order */
    t->ver++;
    for (const mr_node *m = n; w == LRU_STATE && m != t->root; m = m->parent) {
        k += m->state >= 0;
    }
    uint64_t stamp = t->clock + k;
    t->clock += k;
    for (; n != t->root; n = n->parent) {
        if (w == LRU_FULL || n->state >= 0) {
            lru_remove(n, w);
            lru_insert_after(prev, n, w);
            prev = &n->lru[w];
            if (w == LRU_STATE) {
                n->stamp = stamp--;
            }
        }
    }
}

/* ------------------------------------------------------------------------
 * Eviction policy: which touches refresh the state list, and which node is
 * the next victim.  Keeping this in one table lets a utility-based policy
 * (recency + FLOPs saved per byte) replace the victim choice later without
 * touching the tree operations. */

typedef struct {
    const char *name;
    /* A match used the state of `used` (the root when none). */
    void (*on_match)(mr_radix *t, mr_node *used);
    /* Insert walked through n, or ended at n which already had a state. */
    void (*on_insert_visit)(mr_radix *t, mr_node *n);
    /* A split moved child below a new upper node (child keeps its state). */
    void (*on_split)(mr_radix *t, mr_node *child);
    /* Least valuable evictable state at or before `from` (NULL: the LRU
     * end), walking toward the MRU end; NULL if none. */
    mr_node *(*state_victim)(const mr_radix *t, const mr_link *from);
    /* Least valuable evictable leaf, likewise. */
    mr_node *(*leaf_victim)(const mr_radix *t, const mr_link *from);
    /* 1: the victims are not an order along a list: the eviction loops ask
     * for a fresh victim (from = NULL) after each one. */
    int rescan;
    /* 1: the leaf victim is the smallest (heap_key, LRU rank) and
     * evict_full takes it from the leaf heap; leaf_victim is its scan, used
     * when the heap cannot be allocated. */
    int keyed;
    /* 1: state victims only are asked for afresh after each one (leaves
     * follow the list as without rescan). */
    int state_rescan;
} mr_evict_policy;

static void
sglang_on_match(mr_radix *t, mr_node *used)
{
    lru_touch_path(t, used, LRU_FULL);
    lru_touch_path(t, used, LRU_STATE);
}

static void
sglang_on_insert_visit(mr_radix *t, mr_node *n)
{
    lru_touch(t, n, LRU_FULL);
    if (n->state >= 0) {
        lru_touch(t, n, LRU_STATE);
    }
}

static void
sglang_on_split(mr_radix *t, mr_node *child)
{
    if (child->state >= 0) {
        lru_touch(t, child, LRU_STATE);
    }
}

static void
consumed_on_match(mr_radix *t, mr_node *used)
{
    lru_touch_path(t, used, LRU_FULL);
    if (used != t->root && used->state >= 0) {
        lru_touch(t, used, LRU_STATE);
    }
}

static void
consumed_on_insert_visit(mr_radix *t, mr_node *n)
{
    lru_touch(t, n, LRU_FULL);
}

static void
consumed_on_split(mr_radix *t, mr_node *child)
{
    (void)t;
    (void)child;
}

/* Which states an eviction may take.  A state can go when it is not
 * locked, and, on a leaf (whose removal also frees its KV), when the KV is
 * not locked either (a fix of SGLang issue #21379); v0.5.23 takes a
 * KV-locked leaf's state too (its KV stays). */
int
mr_radix_can_evict_state(const mr_radix *t, const mr_node *n)
{
    return n != t->root && n->state >= 0 && n->state_lock == 0
           && (n->nchildren > 0 || n->full_lock == 0 || t->cfg.semantics == MR_SEMANTICS_V0523);
}

size_t
mr_radix_states_evictable_min(const mr_radix *t, size_t enough)
{
    size_t k = 0;
    const mr_link *head = &t->head[LRU_STATE];
    for (const mr_link *l = head->prev; l != head && k < enough; l = l->prev) {
        const mr_node *n = link_node((mr_link *)l, LRU_STATE);
        k += mr_radix_can_evict_state(t, n) && n->nostate_lock == 0 && n->kv_lock == 0;
    }
    return k;
}

/* LRU victims: the least recently used state an eviction may take; a leaf
 * can go when it is not locked. */
static mr_node *
lru_state_victim(const mr_radix *t, const mr_link *from)
{
    const mr_link *head = &t->head[LRU_STATE];
    for (const mr_link *l = from ? from : head->prev; l != head; l = l->prev) {
        mr_node *n = link_node((mr_link *)l, LRU_STATE);
        if (mr_radix_can_evict_state(t, n)) {
            return n;
        }
    }
    return NULL;
}

static mr_node *
lru_leaf_victim(const mr_radix *t, const mr_link *from)
{
    const mr_link *head = &t->head[LRU_FULL];
    for (const mr_link *l = from ? from : head->prev; l != head; l = l->prev) {
        mr_node *n = link_node((mr_link *)l, LRU_FULL);
        if (n->full_lock == 0 && n->nchildren == 0) {
            return n;
        }
    }
    return NULL;
}

/* Utility (Marconi): among the evict_window least recently used candidates
 * of a list, the one with the lowest
 *     alpha * minmax(FLOPs saved / bytes) + recency * minmax(recency rank)
 * where the rank counts from the LRU end (0) and ties go to the less
 * recently used.  recency is +1 (Marconi's order) or -1 (options.mru; the
 * tuner may flip it): among states of like efficiency the most recently
 * used goes first.  That is the scan-resistant order for a cyclic reuse
 * pattern the pool cannot hold (many conversations, fewer slots): LRU
 * evicts every state just before its reuse and hits nothing, the reversed
 * order keeps a fixed subset alive.  A state's FLOPs saved are those of the
 * replay it spares: prefilling from the nearest ancestor with a state to
 * the node's end.  A tombstone leaf (leaf list) saves nothing. */
static double
node_flops_per_byte(const mr_radix *t, const mr_node *n)
{
    const mr_radix_options *c = &t->opt;
    double bytes = c->state_bytes + (n->nchildren == 0 ? t->kv_weight * c->kv_bytes_per_token * n->len : 0.0);
    if (n->state < 0) {
        return 0.0;
    }
    const mr_node *a = n->parent;
    while (a != t->root && a->state < 0) {
        a = a->parent;
    }
    size_t start = (size_t)a->end, span = (size_t)(n->end - a->end);
    double end = (double)n->end;
    double flops = c->flops_per_token * (double)span
                   + c->attn_flops_per_pos * ((double)start + end - 1.0) * (double)span / 2.0;
    return flops / (bytes > 0.0 ? bytes : 1.0);
}

static mr_node *
utility_victim(const mr_radix *t, int w)
{
    enum { MAXWIN = 1024 };
    mr_node *cand[MAXWIN];
    double eff[MAXWIN];
    size_t win = t->opt.evict_window ? t->opt.evict_window : MAXWIN, k = 0;
    if (win > MAXWIN) {
        win = MAXWIN;
    }
    const mr_link *head = &t->head[w];
    for (const mr_link *l = head->prev; l != head && k < win; l = l->prev) {
        mr_node *n = link_node((mr_link *)l, w);
        int ok = w == LRU_STATE ? mr_radix_can_evict_state(t, n) : n->full_lock == 0 && n->nchildren == 0;
        if (ok) {
            cand[k] = n;
            eff[k] = node_flops_per_byte(t, n);
            k++;
        }
    }
    if (k <= 1) {
        return k ? cand[0] : NULL;
    }
    double lo = eff[0], hi = eff[0];
    for (size_t i = 1; i < k; i++) {
        lo = eff[i] < lo ? eff[i] : lo;
        hi = eff[i] > hi ? eff[i] : hi;
    }
    size_t best = 0;
    double best_u = 0.0;
    for (size_t i = 0; i < k; i++) {
        double e = hi > lo ? (eff[i] - lo) / (hi - lo) : 0.0;
        double u = t->opt.alpha * e + t->recency * (double)i / (double)(k - 1);
        if (i == 0 || u < best_u) {
            best = i;
            best_u = u;
        }
    }
    return cand[best];
}

static mr_node *
utility_state_victim(const mr_radix *t, const mr_link *from)
{
    (void)from;
    return utility_victim(t, LRU_STATE);
}

static mr_node *
utility_leaf_victim(const mr_radix *t, const mr_link *from)
{
    (void)from;
    return utility_victim(t, LRU_FULL);
}

/* Adaptive: GreedyDual-Size-Frequency over the prefill a state spares,
 * touches as CONSUMED.  Each state has a priority
 *     h = L0 + f * eff
 * eff the FLOPs per byte of the replay it spares, from the nearest state
 * above it to its end (attention included; the replayed tokens when no
 * costs are set): read at each eviction, at most its value when f was
 * last set, so a state cached above it later (a junction above a request's
 * end state) lowers it at once, and one evicted above it raises it at its
 * next use only; f its uses (1 at admission, one more at each match that
 * uses it; a state attached where one was evicted, its tombstone kept,
 * starts from the uses that one had: a shared prompt's junction
 * re-admitted after a miss is not a stranger); L0 the tree's inflation L
 * when f was last set.  L is the
 * highest priority a victim has had.
 * The victim is the state of least h among the evict_window least recently
 * used evictable ones (ties: the less recently used), and L becomes its h
 * when that is higher.
 * A state's value thus counts against L, which every eviction raises: a
 * state that is not used again ages out, one used often or sparing much
 * stays, with no weight to tune.
 *
 * Supersession: a new state whose nearest state above (A) reaches it along
 * a path that never branched (A and every node between never had two
 * children at once: forked) takes A's place on that path; A keeps only
 * what it spares a future branch: its uses are forgotten (f = 1,
 * h = L + eff(A)).  (A chat turn's state, once the next turn's is cached;
 * not a shared prompt's, whose earlier branches may be gone.)
 *
 * Admission on probation: the tree counts the matches that found a ghost
 * (a state evicted before this reuse: the pool too small for the reuse
 * distance) and those that used a state and found none, both halved once
 * they reach AD_THRASH_WINDOW together.  While the first are at least
 * twice the second plus two (by the rule of succession, a reuse finds its
 * state a third of the time or less: the pool thrashes, as a least-
 * recently-used order does on cyclic reuse larger than the pool), a new
 * state that supersedes nothing (below) enters with h = L, at the LRU end:
 * it goes first unless a match uses it first, so the states that did get
 * used stay and a fixed subset of the cycle hits.  One-shot states that are
 * never asked for again leave no ghost and do not count.
 *
 * Ghosts: an evicted state's node keeps a ghost mark (a tombstone keeps
 * it), and a removed leaf's ghost goes into a direct-mapped table
 * (AD_GHOSTS entries; a newer ghost overwrites an older one of the same
 * hash) under the ancestor that survived and the branch's first token.  A
 * match whose usable prefix stops above a ghost it walked (the deepest: an
 * own-state ghost between the used state and the end of the KV match, or a
 * branch ghost at that end whose first token is the key's next one) counts
 * the state as wanted below its parent (for the handover) and in the
 * tree's thrash count (for probation).
 *
 * Which state of a supersession to keep: a ghost also records whether the
 * evicted state was the upper one of a supersession whose lower state was
 * still cached (AD_GHOST_UPPER: a request that wants it parted between the
 * two) or the lower one, its upper state still cached (AD_GHOST_LOWER: a
 * request that wants it continued past the upper one).  Their hits are
 * counted, both halved once they reach AD_PAIR_WINDOW together.  While the
 * lower ones are at least twice the upper ones plus four, requests go on
 * past a request's newest state (a follow-up question after an answer)
 * rather than part above it (a conversation's next prompt, which differs
 * from the last one before its end): a superseded state that no match
 * used hands its value over too (see adaptive_admit). */
#define AD_GHOST_BITS 13
#define AD_GHOSTS ((size_t)1 << AD_GHOST_BITS)
#define AD_THRASH_WINDOW 4096
#define AD_PAIR_WINDOW 256
enum { AD_GHOST_PLAIN = 1, AD_GHOST_UPPER = 2, AD_GHOST_LOWER = 3 };
/* placement (see "Adaptive placement") */
#define AD_PB 512
#define AD_PLACE_MARGIN 4
#define AD_PLACE_WINDOW 4096
#define AD_NEAR_MIN 2   /* end-relative placement: partings seen before an end snapshot moves up */

struct ad_ghost {
    uint32_t id, gen;   /* the surviving ancestor's handle */
    int32_t tok;        /* the removed branch's first token */
    uint8_t kind;       /* an AD_GHOST_* kind (0: free) */
};

/* The table entry of a removed branch below node (id, gen) starting with tok. */
MR_INLINE size_t
ad_ghost_slot(uint32_t id, uint32_t gen, int32_t tok)
{
    uint64_t h = (uint64_t)id * 0x9E3779B97F4A7C15ull ^ (uint64_t)gen * 0xC2B2AE3D27D4EB4Full
                 ^ (uint64_t)(uint32_t)tok * 0x165667B19E3779F9ull;
    return (size_t)(h >> (64 - AD_GHOST_BITS));
}

static void
adaptive_reset(mr_radix *t)
{
    t->ad_inflation = 0.0;
    t->ad_victim = NULL;
    if (t->ghosts != NULL) {
        memset(t->ghosts, 0, AD_GHOSTS * sizeof(struct ad_ghost));
    }
    if (t->ad_depth != NULL) {
        memset(t->ad_depth, 0, AD_PB * sizeof(uint32_t));
    }
    t->ad_events = 0;
    memset(t->ad_near, 0, sizeof(t->ad_near));
    t->ad_ends = 0;
    t->ad_wanted = t->ad_found = 0;
    t->ad_parted = t->ad_continued = 0;
}

static double
adaptive_eff(const mr_radix *t, const mr_node *n)
{
    if (t->opt.flops_per_token > 0.0 || t->opt.attn_flops_per_pos > 0.0) {
        return node_flops_per_byte(t, n);
    }
    const mr_node *a = n->parent;
    while (a != t->root && a->state < 0) {
        a = a->parent;
    }
    return (double)(n->end - a->end);
}

/* n's uses were set now: its priority counts from L and its value now
 * (see "Adaptive"). */
static void
adaptive_uses_set(const mr_radix *t, mr_node *n)
{
    n->ad_base = t->ad_inflation;
    n->ad_eff = adaptive_eff(t, n);
    n->ad_prob = 0;
}

/* What a state's value counts now: its value as the tree stands, at most
 * its value when its uses were set, at least the floor a handover gave it. */
static double
adaptive_value(const mr_radix *t, const mr_node *n)
{
    double v = adaptive_eff(t, n);
    v = n->ad_eff < v ? n->ad_eff : v;
    return v > n->ad_floor ? v : n->ad_floor;
}

/* A state's priority (see "Adaptive"). */
static double
adaptive_prio(const mr_radix *t, const mr_node *n)
{
    return n->ad_prob ? n->ad_base : n->ad_base + (double)n->ad_f * adaptive_value(t, n);
}

/* The evictable state of least priority among the evict_window least
 * recently used (NULL: none); L rises to its priority. */
static mr_node *
adaptive_state_victim(const mr_radix *ct, const mr_link *from)
{
    (void)from;
    mr_radix *t = (mr_radix *)ct;   /* the eviction loop's own tree: L is policy state */
    size_t win = t->opt.evict_window ? t->opt.evict_window : 1024, k = 0;
    mr_node *v = NULL;
    double vh = 0.0;
    const mr_link *head = &t->head[LRU_STATE];
    for (const mr_link *l = head->prev; l != head && k < win; l = l->prev) {
        mr_node *n = link_node((mr_link *)l, LRU_STATE);
        if (mr_radix_can_evict_state(t, n)) {
            double h = adaptive_prio(t, n);
            if (v == NULL || h < vh) {
                v = n;
                vh = h;
            }
            k++;
        }
    }
    if (v != NULL && vh > t->ad_inflation) {
        t->ad_inflation = vh;   /* (a value read now may be below it: L never falls) */
    }
    t->ad_victim = v;
    return v;
}

/* The state n supersedes (see "Adaptive"): the nearest state above n when
 * the path from it to n never branched (it and every node between them
 * never had two children at once), else NULL. */
static mr_node *
adaptive_superseded(const mr_radix *t, const mr_node *n)
{
    mr_node *a = n->parent;
    int branched = 0;
    for (; a != t->root && a->state < 0; a = a->parent) {
        branched |= a->forked;
    }
    return a != t->root && !branched && !a->forked ? a : NULL;
}

static mr_node *child_next(const mr_node *n, uint32_t *pos);

/* The ghost kind x's state leaves when it is evicted: AD_GHOST_UPPER when a
 * state below it supersedes it, AD_GHOST_LOWER when it supersedes one
 * above, AD_GHOST_PLAIN otherwise. */
static uint8_t
adaptive_ghost_kind(const mr_radix *t, const mr_node *x)
{
    for (const mr_node *c = x; c->nchildren == 1 && !c->forked;) {
        uint32_t pos = 0;
        c = child_next(c, &pos);
        if (c->state >= 0) {
            return AD_GHOST_UPPER;
        }
    }
    return adaptive_superseded(t, x) != NULL ? AD_GHOST_LOWER : AD_GHOST_PLAIN;
}

/* A match found a ghost of this kind. */
static void
adaptive_ghost_hit(mr_radix *t, uint8_t kind)
{
    t->ad_ghost_hits++;
    t->ad_wanted++;
    t->ad_parted += kind == AD_GHOST_UPPER;
    t->ad_continued += kind == AD_GHOST_LOWER;
    if (t->ad_parted + t->ad_continued >= AD_PAIR_WINDOW) {
        t->ad_parted /= 2;
        t->ad_continued /= 2;
    }
}

/* A match used best's state (the root: none) and matched KV down to the end
 * of kv; next is the key's token after it (has_next: the key goes on). */
static void
adaptive_on_lookup(mr_radix *t, mr_node *best, mr_node *kv, int has_next, int32_t next)
{
    if (best != t->root) {
        best->ad_f++;
        adaptive_uses_set(t, best);
    }
    if (t->ad_wanted + t->ad_found >= AD_THRASH_WINDOW) {
        t->ad_wanted /= 2;
        t->ad_found /= 2;
    }
    struct ad_ghost *e = has_next && t->ghosts != NULL ? &t->ghosts[ad_ghost_slot(kv->id, kv->gen, next)] : NULL;
    if (e != NULL && e->kind && e->id == kv->id && e->gen == kv->gen && e->tok == next) {
        /* the deepest: a removed branch below the end of the KV match */
        adaptive_ghost_hit(t, e->kind);
        kv->kid_used++;
        e->kind = 0;
        return;
    }
    for (mr_node *n = kv; n != best && n != t->root; n = n->parent) {
        if (n->ghost) {
            adaptive_ghost_hit(t, n->ghost);
            n->parent->kid_used++;
            n->ghost = 0;
            return;
        }
    }
    t->ad_found += best != t->root;
}

/* A state was attached to n: its priority, the supersession of the state
 * above it, and its place in the state list (the MRU end, or on probation
 * the LRU end).  The superseded state hands n its value when a match used
 * it, no other request runs from it (one lock at most: the superseding
 * request's own) and no state was attached below it before: a path
 * continued for the first time, as a chat's next turn continues the last;
 * or, when no match used it, while matches continue past superseded states
 * more than they part above their successors (see "Adaptive": which state
 * of a supersession to keep). */
static void
adaptive_admit(mr_radix *t, mr_node *n)
{
    mr_node *a = adaptive_superseded(t, n), *handed = NULL;
    n->ad_floor = 0.0;
    const int supersedes = a != NULL;
    if (supersedes) {
        if (a->reused ? a->full_lock <= 1 && a->kid_used == 0 && a->kid_wasted == 0
                      : t->ad_continued >= 2 * (uint64_t)t->ad_parted + 4) {
            n->ad_floor = adaptive_value(t, a);
            handed = a;
            t->ad_handed_unused += !a->reused;
        }
        a->ad_f = 1;
        adaptive_uses_set(t, a);
        t->ad_superseded++;
    }
    n->ghost = 0;
    n->ad_f = n->ad_f > 1 ? n->ad_f : 1;   /* a tombstone's: the evicted state's uses */
    adaptive_uses_set(t, n);
    if (handed != NULL) {
        /* the superseded state counts at most n's own value until a match uses it */
        handed->ad_floor = 0.0;
        handed->ad_eff = n->ad_eff < handed->ad_eff ? n->ad_eff : handed->ad_eff;
    }
    if (!supersedes && t->ad_wanted >= 2 * (uint64_t)t->ad_found + 2) {
        n->ad_prob = 1;
        t->ver++;
        lru_insert_after(t->head[LRU_STATE].prev, n, LRU_STATE);
        n->stamp = 0;
        t->ad_probation++;
        return;
    }
    lru_push_mru(t, n, LRU_STATE);
}

/* Adaptive placement.  In extra_buffer mode an extend snapshots the state
 * once (mr_rule_prefill_track): at its chunk-aligned end, or at the match's
 * branching point B when the KV match went deeper than the state (two
 * requests part mid-path: a junction checkpoint).  Where the match proposes
 * no junction past its state, the adaptive policy may propose a predicted
 * one: a point p inside the new extend where later requests are likely to
 * part from it, by the one-checkpoint case of the overlap-depth dynamic
 * program of Sparse Prefix Caching over the depths it has observed.
 *
 * Branches: a node's top is the depth where the insert that created its
 * branch parted from the tree (a split's halves keep it); the branch's head
 * is its first node, and the node above the head, X, is where it began.
 * Observations: a match whose key goes on past its KV match end d, in a
 * branch (not at the root), either parted from that branch (the KV node has
 * children: a junction) or continued past its whole path (a leaf: a next
 * turn; but a junction when the branch ends at a junction this policy
 * predicted where it began, X's placed_at: the later request parted from
 * it there).  The first junction of a branch counts in X's br_shared, the first
 * continuation in X's br_cont; the deepest junction depth of each branch,
 * relative to its top in units of step = max(chunk_size, page_size),
 * counts in a histogram of AD_PB buckets (the last: deeper), halved after
 * every AD_PLACE_WINDOW observations so old evidence fades.
 *
 * Decision, for a match whose state ends at s = prefix_len, a multiple of
 * step (s0 = s / step), whose KV ends at k in node X (the new request's
 * branch will begin there), with key length L (e = floor(L / step): the end
 * snapshot, as far as the key shows), and no junction past s: with A = X's
 * br_shared, C = X's br_cont + 1 (a continuation is presumed until X shows
 * otherwise), S(x) the branches whose deepest junction is x buckets or more
 * below their top and S0 all of them, a checkpoint at j steps serves a later
 * request that parts at least j * step - k below the new branch's top, or
 * continues it:
 *     gain(j) = A * S(ceil((j * step - k) / step)) * (j - s0)
 *     gain(e) = (C * S0 + A * S(min(ceil((e * step - k) / step), AD_PB - 1))) * (e - s0)
 * (each the expected prefill saved, in steps, times X's branches and S0).
 * The j of largest gain in (s0, e) (the first; its bucket below AD_PB - 1)
 * is proposed when gain(j) > AD_PLACE_MARGIN * gain(e): the checkpoint
 * replaces the end snapshot a next turn would use, so it must be clearly
 * worth more (with C >= 1 and, until the first halving, S(.) <= S0, that
 * takes A > AD_PLACE_MARGIN branches parted from at X first).  No junction
 * is predicted for a key whose extend (L - s) is longer than the
 * scheduler's chunked prefill budget (options.chunked_prefill_size, when
 * set): it is prefilled in several extends, and the one p falls in would
 * snapshot at p instead of its chunk end, a state deep in a long prompt that
 * a later prompt parting below it uses (a conversation's next turn parts
 * near the end of the previous prompt, past its chunk ends; the end
 * snapshot, past the parting point, serves it nothing).  p = j * step is a
 * multiple of chunk_size and of page_size and p - s of chunk_size, with
 * k < p < L: SGLang's own branching rule takes it as it takes B, and the
 * snapshot at p is exact.
 *
 * The other way round, a match may drop SGLang's own junction B for the end
 * snapshot (adaptive_skip_junction): the state last cached at B was evicted
 * unused and the end spares more than AD_PLACE_MARGIN times as much.
 *
 * End-relative placement (adaptive_place_end), where the rule above
 * proposes nothing: later requests may part from a path a little above the
 * state its request left at its end, as a conversation's next prompt parts
 * from the last one before its end (its last, partial block differs), past
 * every chunk end, so the end snapshot serves it nothing.  Observations: the
 * first match that parts from a branch, at depth d, in a node with one
 * child, with the first state below d on that unbranched path at d + r,
 * r < d - top (the request shared more of the branch than it left above
 * that state), counts in bucket ceil(r / step) - 1 of ad_near (AD_NB
 * buckets; deeper: not counted): a snapshot that many steps and one up
 * would have served it.  The first continuation of each branch counts in
 * ad_ends.  Both are halved with the histogram above.  Decision, for a match as above:
 * with N(j) the partings of buckets below j, the end snapshot moves up j
 * steps, to p = (e - j) * step, for the j in [1, AD_NB) of largest
 *     N(j) * (e - j - s0) - AD_PLACE_MARGIN * ad_ends * j
 * (the prefill a parting request is spared, against what a continuation
 * past the end loses, AD_PLACE_MARGIN times over), when that is positive,
 * N(j) >= AD_NEAR_MIN and k < p, s < p (the first such j on a tie).  A chat,
 * whose next turns continue past the end, never moves it; a system prompt's
 * requests part at the branch's top (r >= d - top) and leave no
 * observation.  A chunked extend is no exception here: p lies within AD_NB
 * steps of the end, and the extend it falls in snapshots at p.  p is a
 * multiple of step, as above, and the snapshot at p is exact. */

MR_INLINE size_t
adaptive_step(const mr_radix *t)
{
    return t->cfg.chunk_size > t->cfg.page_size ? t->cfg.chunk_size : t->cfg.page_size;
}

/* a * b and a + b, or UINT64_MAX when it does not fit (no prediction then). */
MR_INLINE uint64_t
mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

MR_INLINE uint64_t
add_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

/* Whether a match drops SGLang's junction at b (its KV match went past its
 * state at s) for the end snapshot: the state last cached at b was evicted
 * without a use (its tombstone kept one use) and the end snapshot, at the
 * key's last chunk boundary, spares more than AD_PLACE_MARGIN times what the
 * junction would.  A document's junction under a retrieval prompt, evicted
 * for its small value while its KV stays, would otherwise take the next
 * prompt's only snapshot, and that prompt's follow-up finds no state. */
static int
adaptive_skip_junction(const mr_radix *t, const mr_node *kv, size_t b, size_t s, size_t len)
{
    const mr_node *j = kv;
    while (j != t->root && j->end > b) {
        j = j->parent;
    }
    size_t e = len / t->cfg.chunk_size * t->cfg.chunk_size;
    return j != t->root && j->end == b && j->state < 0 && j->ad_f == 1 && e > s
           && (double)AD_PLACE_MARGIN * (double)(b - s) < (double)(e - s);
}

/* The end snapshot moved up for the partings seen above states (0: none;
 * see "End-relative placement" above). */
static size_t
adaptive_place_end(const mr_radix *t, size_t s, size_t k, size_t len)
{
    size_t step = adaptive_step(t);
    if (s % step != 0) {
        return 0;
    }
    size_t s0 = s / step, e = len / step, best = 0;
    uint64_t n = 0, gbest = 0;
    for (size_t j = 1; j < AD_NB && e > s0 + j + 1 && (e - j) * step > k; j++) {
        n += t->ad_near[j - 1];
        uint64_t gain = mul_sat(n, e - j - s0), cost = mul_sat(mul_sat(AD_PLACE_MARGIN, t->ad_ends), j);
        if (n >= AD_NEAR_MIN && gain != UINT64_MAX && gain > cost && gain - cost > gbest) {
            gbest = gain - cost;
            best = j;
        }
    }
    return best > 0 ? (e - best) * step : 0;
}

/* The predicted junction of a match (0: none), before its observation. */
static size_t
adaptive_place(const mr_radix *t, size_t s, const mr_node *x, size_t k, size_t len)
{
    size_t step = adaptive_step(t);
    if (t->ad_depth == NULL || s % step != 0 || x->br_shared == 0) {
        return 0;
    }
    size_t s0 = s / step, e = len / step;
    if (e < s0 + 2) {
        return 0;
    }
    if (t->opt.chunked_prefill_size > 0 && len - s > t->opt.chunked_prefill_size) {
        return 0;   /* a chunked extend: the junction would displace a chunk end's snapshot */
    }
    uint64_t sg[AD_PB + 1];
    sg[AD_PB] = 0;
    for (size_t b = AD_PB; b-- > 0;) {
        sg[b] = sg[b + 1] + t->ad_depth[b];
    }
    uint64_t a = x->br_shared, c = (uint64_t)x->br_cont + 1;
    size_t xe = (e * step - k + step - 1) / step, best = 0;
    xe = xe < AD_PB - 1 ? xe : AD_PB - 1;
    uint64_t gbest = 0, ge = mul_sat(add_sat(mul_sat(c, sg[0]), mul_sat(a, sg[xe])), e - s0);
    for (size_t j = s0 + 1; j < e; j++) {
        size_t xb = (j * step - k + step - 1) / step;
        if (xb >= AD_PB - 1) {
            break;
        }
        uint64_t g = mul_sat(mul_sat(a, sg[xb]), j - s0);
        if (g > gbest) {
            gbest = g;
            best = j;
        }
    }
    if (best == 0 || gbest == UINT64_MAX || gbest <= mul_sat(AD_PLACE_MARGIN, ge)) {
        return 0;
    }
    return best * step;
}

/* A match parted at depth d from the branch headed by h, in node kv, the
 * first time one parted from that branch: the first state below d on kv's
 * unbranched path, within AD_NB steps, counts in ad_near (see "End-relative
 * placement"). */
static void
adaptive_observe_end(mr_radix *t, const mr_node *kv, const mr_node *h, size_t d)
{
    const size_t step = adaptive_step(t), reach = AD_NB * step;
    if (kv->nchildren != 1 || d <= (size_t)h->top || h->shared != 0) {
        return;   /* (once a branch: a request matched again while it waits counts once) */
    }
    const mr_node *c = kv;
    while (c->nchildren == 1) {
        uint32_t pos = 0;
        c = child_next(c, &pos);
        size_t r = (size_t)c->end - d;   /* >= 1 */
        if (c->state >= 0) {
            if (r < d - (size_t)h->top && r <= reach) {
                size_t b = (r - 1) / step;   /* a snapshot b + 1 steps up serves it */
                t->ad_near[b] += t->ad_near[b] < UINT32_MAX;
            }
            return;
        }
        if (r >= reach) {
            return;
        }
    }
}

/* Counts a match that stopped at depth d in node kv with its key going on
 * (see above). */
static void
adaptive_observe(mr_radix *t, mr_node *kv, size_t d)
{
    if (t->ad_depth == NULL) {
        t->ad_depth = MR_CALLOC(AD_PB, sizeof(uint32_t));
        if (t->ad_depth == NULL) {
            return;   /* no placement without its table: nothing else depends on it */
        }
    }
    if (kv != t->root) {
        mr_node *h = kv;
        while (h->parent != t->root && h->parent->top == h->top) {
            h = h->parent;
        }
        adaptive_observe_end(t, kv, h, d);
        if (kv->nchildren > 0 || h->placed) {
            size_t step = adaptive_step(t), rb = (d - (size_t)kv->top) / step;
            rb = rb < AD_PB - 1 ? rb : AD_PB - 1;
            if (h->shared == 0 && h->parent->br_shared < UINT32_MAX) {
                h->parent->br_shared++;
            }
            if (h->shared < rb + 1) {
                if (h->shared > 0 && t->ad_depth[h->shared - 1] > 0) {
                    t->ad_depth[h->shared - 1]--;
                }
                t->ad_depth[rb]++;
                h->shared = (uint16_t)(rb + 1);
            }
        }
        else if (!h->cont) {
            h->cont = 1;
            h->parent->br_cont += h->parent->br_cont < UINT32_MAX;
            t->ad_ends += t->ad_ends < UINT32_MAX;
        }
    }
    if (++t->ad_events >= AD_PLACE_WINDOW) {
        for (size_t i = 0; i < AD_PB; i++) {
            t->ad_depth[i] >>= 1;
        }
        for (size_t i = 0; i < AD_NB; i++) {
            t->ad_near[i] >>= 1;
        }
        t->ad_ends >>= 1;
        t->ad_events = 0;
    }
}

/* SGLang 0.5.23's leaf orders (evict_policy.py).  Its FULL eviction pops
 * the evictable leaf with the smallest (key, last access) from a heap; the
 * full list is in last-access order, so the first leaf of smallest key met
 * from the LRU end is that leaf.  evict_full keeps such a heap too (see
 * "Leaf heap"); the scans below are its reference and its fallback.  Keys are unique where SGLang's would need
 * a tie-break beyond the last access (creation orders: only one leaf of a
 * split chain exists at a time). */
static int64_t
leaf_order_key(const mr_radix *t, const mr_node *n)
{
    switch (t->cfg.policy) {
    case MR_POLICY_LFU:
        return n->hits;
    case MR_POLICY_FIFO:
        return (int64_t)n->born;
    case MR_POLICY_FILO:
        return -(int64_t)n->born;
    case MR_POLICY_PRIORITY:
        return n->prio;
    case MR_POLICY_SLRU:
        return (int64_t)n->hits >= t->order.slru_protected_threshold;
    case MR_POLICY_TLRU: {
        /* Tokens past the branch's budget cannot improve its tail latency:
         * such a leaf is "infinitely old". */
        /* (in 128 bits: any int64 threshold and estimate, as SGLang's
         * Python ints take them, without overflow) */
        __int128 budget = (__int128)n->hist + t->order.tlru_next_prompt_estimate - t->order.tlru_threshold;
        return (__int128)(n->end - n->len) >= (budget > 0 ? budget : 0) ? -1 : 0;
    }
    default:
        return 0;
    }
}

static mr_node *
keyed_leaf_victim(const mr_radix *t, const mr_link *from)
{
    (void)from;
    const mr_link *head = &t->head[LRU_FULL];
    mr_node *best = NULL;
    int64_t best_key = 0;
    for (const mr_link *l = head->prev; l != head; l = l->prev) {
        mr_node *n = link_node((mr_link *)l, LRU_FULL);
        if (n->full_lock == 0 && n->nchildren == 0) {
            int64_t k = leaf_order_key(t, n);
            if (best == NULL || k < best_key) {
                best = n;
                best_key = k;
            }
        }
    }
    return best;
}

/* MRU: the most recently used evictable leaf. */
static mr_node *
mru_leaf_victim(const mr_radix *t, const mr_link *from)
{
    (void)from;
    const mr_link *head = &t->head[LRU_FULL];
    for (const mr_link *l = head->next; l != head; l = l->next) {
        mr_node *n = link_node((mr_link *)l, LRU_FULL);
        if (n->full_lock == 0 && n->nchildren == 0) {
            return n;
        }
    }
    return NULL;
}

#define MR_LEAF_ORDER_ROW(name, victim) \
    {name, consumed_on_match, consumed_on_insert_visit, consumed_on_split, lru_state_victim, victim, 1, 1}

static const mr_evict_policy policies[] = {
    [MR_POLICY_SGLANG] = {"sglang", sglang_on_match, sglang_on_insert_visit, sglang_on_split,
                          lru_state_victim, lru_leaf_victim, 0, 0},
    [MR_POLICY_CONSUMED] = {"consumed", consumed_on_match, consumed_on_insert_visit, consumed_on_split,
                            lru_state_victim, lru_leaf_victim, 0, 0},
    [MR_POLICY_UTILITY] = {"utility", consumed_on_match, consumed_on_insert_visit, consumed_on_split,
                           utility_state_victim, utility_leaf_victim, 1, 0},
    [MR_POLICY_LFU] = MR_LEAF_ORDER_ROW("lfu", keyed_leaf_victim),
    [MR_POLICY_FIFO] = MR_LEAF_ORDER_ROW("fifo", keyed_leaf_victim),
    [MR_POLICY_MRU] = MR_LEAF_ORDER_ROW("mru", mru_leaf_victim),
    [MR_POLICY_FILO] = MR_LEAF_ORDER_ROW("filo", keyed_leaf_victim),
    [MR_POLICY_PRIORITY] = MR_LEAF_ORDER_ROW("priority", keyed_leaf_victim),
    [MR_POLICY_SLRU] = MR_LEAF_ORDER_ROW("slru", keyed_leaf_victim),
    [MR_POLICY_TLRU] = MR_LEAF_ORDER_ROW("tlru", keyed_leaf_victim),
    [MR_POLICY_ADAPTIVE] = {"adaptive", consumed_on_match, consumed_on_insert_visit, consumed_on_split,
                            adaptive_state_victim, lru_leaf_victim, 0, 0, 1},
};
#define MR_NPOLICIES (sizeof(policies) / sizeof(policies[0]))

MR_INLINE const mr_evict_policy *
policy_of(const mr_radix *t)
{
    return &policies[t->cfg.policy];
}

/* ------------------------------------------------------------------------
 * Leaf heap
 *
 * A keyed policy's victim is the evictable leaf (unlocked, childless) with
 * the smallest (heap_key, rank), rank being the position in the full list
 * counted from its LRU end: the leaf the scan would meet first.  Instead of
 * scanning every node per victim, evict_full pops it from a binary heap of
 * the evictable leaves, built in one pass over the full list, and pushes a
 * parent that the eviction leaves an evictable leaf: O(log n) a victim.
 *
 * The heap is kept between evict_full calls (SGLang's eviction walk asks
 * for one leaf per call) as long as nothing but its own evictions touched
 * the tree: every change a key, a rank or a leaf's evictability can see
 * (LRU refreshes, node creation and removal, locks, inserts, a policy
 * change) bumps t->ver, and a heap whose heap_ver is older is rebuilt.
 * Evictions only remove nodes from the full list, so the ranks given at the
 * build keep their order, and no key changes while the heap is current: the
 * frozen entries equal a fresh scan's view, victim for victim.  (MRU probes
 * the MRU end first: see mru_probe.) */

#ifndef MR_LEAF_SCAN_ONLY
#define MR_LEAF_SCAN_ONLY 0   /* 1: no heap, a scan per victim (benchmarks/bench_leaf_orders.py's baseline) */
#endif

struct leaf_ent {
    int64_t key;
    uint32_t rank;
    uint32_t id;   /* the node's id (t->by_id) */
};

/* The key a leaf is ordered by: the policy's, or for MRU its recency
 * reversed (the most recently used first). */
MR_INLINE int64_t
heap_key(const mr_radix *t, const mr_node *n)
{
    return t->cfg.policy == MR_POLICY_MRU ? -(int64_t)n->rank : leaf_order_key(t, n);
}

MR_INLINE int
leaf_ent_less(const struct leaf_ent *a, const struct leaf_ent *b)
{
    return a->key < b->key || (a->key == b->key && a->rank < b->rank);
}

static void
leaf_heap_sift_down(struct leaf_ent *h, size_t len, size_t i)
{
    struct leaf_ent e = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= len) {
            break;
        }
        if (c + 1 < len && leaf_ent_less(&h[c + 1], &h[c])) {
            c++;
        }
        if (!leaf_ent_less(&h[c], &e)) {
            break;
        }
        h[i] = h[c];
        i = c;
    }
    h[i] = e;
}

static void
leaf_heap_push(mr_radix *t, mr_node *n)
{
    struct leaf_ent e = {heap_key(t, n), n->rank, n->id}, *h = t->heap;
    size_t i = t->heap_len++;   /* room: the heap never holds more entries than the nodes at its build */
    while (i > 0 && leaf_ent_less(&e, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static void
leaf_heap_pop(mr_radix *t)
{
    t->heap[0] = t->heap[--t->heap_len];
    leaf_heap_sift_down(t->heap, t->heap_len, 0);
}

static void
leaf_heap_release(mr_radix *t)
{
    t->bytes -= t->heap_cap * sizeof(struct leaf_ent);
    MR_FREE(t->heap);
    t->heap = NULL;
    t->heap_len = t->heap_cap = 0;
    t->heap_ok = 0;
}

/* Makes the heap current (rebuilding it unless it is); MR_ENOMEM: no heap,
 * the caller scans. */
static int
leaf_heap_ready(mr_radix *t)
{
    if (t->heap_ok && t->heap_ver == t->ver) {
        return MR_OK;
    }
    t->heap_ok = 0;
    if (MR_LEAF_SCAN_ONLY) {
        return MR_ENOMEM;   /* the benchmark's baseline: no heap, ever */
    }
    size_t need = t->nodes ? t->nodes : 1;
    if (need > t->heap_cap || (need > 64 && need * 4 < t->heap_cap)) {
        struct leaf_ent *h = MR_REALLOC(t->heap, need * sizeof(*h));
        if (h == NULL) {
            return MR_ENOMEM;
        }
        t->bytes += need * sizeof(*h);
        t->bytes -= t->heap_cap * sizeof(*h);
        t->heap = h;
        t->heap_cap = need;
    }
    const mr_link *head = &t->head[LRU_FULL];
    uint32_t rank = 0;
    size_t k = 0;
    for (const mr_link *l = head->prev; l != head; l = l->prev) {
        mr_node *n = link_node((mr_link *)l, LRU_FULL);
        n->rank = rank++;
        if (n->full_lock == 0 && n->nchildren == 0) {
            t->heap[k++] = (struct leaf_ent){heap_key(t, n), n->rank, n->id};
        }
    }
    t->heap_len = k;
    for (size_t i = k / 2; i-- > 0;) {
        leaf_heap_sift_down(t->heap, k, i);
    }
    t->heap_ok = 1;
    t->heap_ver = t->ver;
    return MR_OK;
}

/* ------------------------------------------------------------------------
 * Node registry and allocation */

/* Makes room for one more id.  MR_ENOMEM leaves the registry unchanged. */
static int
ids_reserve(mr_radix *t)
{
    if (t->nfree > 0 || t->nids < t->id_cap) {
        return MR_OK;
    }
    uint32_t cap = t->id_cap ? t->id_cap * 2 : 64;
    if (cap <= t->id_cap) {
        return MR_ENOMEM;
    }
    mr_node **by_id = MR_REALLOC(t->by_id, cap * sizeof(*by_id));
    if (by_id == NULL) {
        return MR_ENOMEM;
    }
    t->by_id = by_id;
    uint32_t *gens = MR_REALLOC(t->gens, cap * sizeof(*gens));
    if (gens == NULL) {
        return MR_ENOMEM;
    }
    memset(gens + t->id_cap, 0, (cap - t->id_cap) * sizeof(*gens));
    t->gens = gens;
    uint32_t *free_ids = MR_REALLOC(t->free_ids, cap * sizeof(*free_ids));
    if (free_ids == NULL) {
        return MR_ENOMEM;
    }
    t->free_ids = free_ids;
    t->bytes += (size_t)(cap - t->id_cap) * (sizeof(*by_id) + sizeof(*gens) + sizeof(*free_ids));
    t->id_cap = cap;
    return MR_OK;
}

/* Allocates a node with room for len tokens and registers it.  On success
 * the node has no parent, children, state, locks or list membership.
 * MR_ENOMEM: nothing changed. */
static int
node_new(mr_radix *t, size_t len, int32_t ns, mr_node **out)
{
    if (len > UINT32_MAX) {
        return MR_EINVAL;
    }
    if (ids_reserve(t) != MR_OK) {
        return MR_ENOMEM;
    }
    mr_node *n = MR_CALLOC(1, sizeof(*n));
    if (n == NULL) {
        return MR_ENOMEM;
    }
    void *mem = NULL;
    if (len > 0) {
        mem = MR_MALLOC(len * token_bytes(t));
        if (mem == NULL) {
            MR_FREE(n);
            return MR_ENOMEM;
        }
    }
    n->len = (uint32_t)len;
    node_place(t, n, mem);
    n->ns = ns;
    n->state = -1;
    uint32_t id = t->nfree > 0 ? t->free_ids[--t->nfree] : t->nids++;
    n->id = id;
    n->gen = t->gens[id];
    t->by_id[id] = n;
    t->ver++;
    t->bytes += sizeof(*n) + len * token_bytes(t);
    *out = n;
    return MR_OK;
}

/* Unregisters and frees n (its handles become stale).  Does not touch the
 * parent, the lists or the counters. */
static void
node_free(mr_radix *t, mr_node *n)
{
    t->ver++;
    t->by_id[n->id] = NULL;
    t->gens[n->id] = n->gen + 1;
    t->free_ids[t->nfree++] = n->id;
    t->bytes -= sizeof(*n) + (size_t)n->len * token_bytes(t);
    t->bytes -= (size_t)n->cap * sizeof(mr_child);
    MR_FREE(n->children);
    MR_FREE(node_mem(n));
    MR_FREE(n);
}

/* ------------------------------------------------------------------------
 * Children */

/* Index of the first entry >= (ns, tok) (a hole's entry keeps its key). */
static uint32_t
child_lower_bound(const mr_node *n, int32_t ns, int32_t tok)
{
    uint32_t lo = 0, hi = n->nent;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const mr_child *c = &n->children[mid];
        if (c->ns < ns || (c->ns == ns && c->tok < tok)) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo;
}

/* Index of n's child in namespace ns whose first page equals key[0:page]
 * (key holds at least one page), or -1. */
static int64_t
child_find(const mr_radix *t, const mr_node *n, int32_t ns, const int32_t *key)
{
    uint32_t i = child_lower_bound(n, ns, key[0]);
    uint32_t page = t->cfg.page_size;
    for (; i < n->nent; i++) {
        const mr_child *c = &n->children[i];
        if (c->ns != ns || c->tok != key[0]) {
            return -1;
        }
        if (c->child != NULL && (page == 1 || memcmp(node_key(c->child), key, page * sizeof(int32_t)) == 0)) {
            return i;
        }
    }
    return -1;
}

/* child_find for an int64 key (read in place): a token outside int32
 * matches no child. */
static int64_t
child_find64(const mr_radix *t, const mr_node *n, int32_t ns, const int64_t *key)
{
    if (key[0] < INT32_MIN || key[0] > INT32_MAX) {
        return -1;
    }
    uint32_t i = child_lower_bound(n, ns, (int32_t)key[0]);
    uint32_t page = t->cfg.page_size;
    for (; i < n->nent; i++) {
        const mr_child *c = &n->children[i];
        if (c->ns != ns || c->tok != key[0]) {
            return -1;
        }
        if (c->child == NULL) {
            continue;
        }
        const int32_t *ck = node_key(c->child);
        uint32_t j = 1;
        while (j < page && ck[j] == key[j]) {
            j++;
        }
        if (j == page) {
            return i;
        }
    }
    return -1;
}

/* Index of the entry that points at child. */
static uint32_t
child_index(const mr_node *n, const mr_node *child)
{
    uint32_t i = child_lower_bound(n, child->ns, node_key(child)[0]);
    while (n->children[i].child != child) {
        i++;
    }
    return i;
}

/* Squeezes the holes out of n's entries (order kept). */
static void
child_compact(mr_radix *t, mr_node *n)
{
    uint32_t k = 0;
    t->child_moves += n->nent;
    for (uint32_t i = 0; i < n->nent; i++) {
        if (n->children[i].child != NULL) {
            n->children[k++] = n->children[i];
        }
    }
    n->nent = k;
}

/* Room for one more child of n: a free entry at the end, or a hole (when a
 * full array is at least a quarter holes, they are squeezed out instead of
 * the array growing).  MR_ENOMEM: n unchanged. */
static int
child_reserve(mr_radix *t, mr_node *n)
{
    if (n->nent < n->cap) {
        return MR_OK;
    }
    uint32_t holes = n->nent - n->nchildren;
    if (holes > 0 && holes >= n->cap / 4) {
        child_compact(t, n);
        return MR_OK;
    }
    uint32_t cap = n->cap ? n->cap * 2 : 2;
    mr_child *c = MR_REALLOC(n->children, cap * sizeof(*c));
    if (c == NULL) {
        return MR_ENOMEM;
    }
    t->bytes += (size_t)(cap - n->cap) * sizeof(*c);
    n->children = c;
    n->cap = cap;
    return MR_OK;
}

/* Adds child below n in sorted position; room must be reserved
 * (child_reserve: then nent < cap).  A hole
 * at that position or right before it takes the entry: the entries around
 * stay in order (the ones before are <= the key, the ones from the
 * position on > it). */
static void
child_add(mr_radix *t, mr_node *n, mr_node *child)
{
    int32_t tok = node_key(child)[0];
    uint32_t i = child_lower_bound(n, child->ns, tok);
    while (i < n->nent && n->children[i].ns == child->ns && n->children[i].tok == tok) {
        i++;
    }
    if (i > 0 && n->children[i - 1].child == NULL) {
        i--;
    }
    else if (i == n->nent || n->children[i].child != NULL) {
        memmove(&n->children[i + 1], &n->children[i], (n->nent - i) * sizeof(mr_child));
        t->child_moves += n->nent - i;
        n->nent++;
    }
    n->children[i] = (mr_child){child->ns, tok, child};
    n->nchildren++;
    n->forked |= n->nchildren > 1;
    child->parent = n;
}

/* Removes child's entry: a hole, or the end shrinks; the holes go when
 * they are more than half the entries. */
static void
child_remove(mr_radix *t, mr_node *n, mr_node *child)
{
    uint32_t i = child_index(n, child);
    n->children[i].child = NULL;
    n->nchildren--;
    while (n->nent > 0 && n->children[n->nent - 1].child == NULL) {
        n->nent--;
    }
    if (n->nent - n->nchildren > n->nent / 2) {
        child_compact(t, n);
    }
}

/* The entry index of n's next live child from entry *pos on (advancing
 * *pos past it), or NULL. */
static mr_node *
child_next(const mr_node *n, uint32_t *pos)
{
    while (*pos < n->nent) {
        mr_node *c = n->children[(*pos)++].child;
        if (c != NULL) {
            return c;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------------
 * Lifetime */

int
mr_radix_new(const mr_radix_config *cfg, mr_radix **out)
{
    if (cfg == NULL || cfg->page_size == 0 || cfg->chunk_size == 0
        || (cfg->page_size % cfg->chunk_size != 0 && cfg->chunk_size % cfg->page_size != 0)
        || (unsigned)cfg->policy >= MR_NPOLICIES
        || (cfg->semantics != MR_SEMANTICS_V0515 && cfg->semantics != MR_SEMANTICS_V0523)) {
        return MR_EINVAL;
    }
    mr_radix *t = MR_CALLOC(1, sizeof(*t));
    if (t == NULL) {
        return MR_ENOMEM;
    }
    t->cfg = *cfg;
    t->order = (mr_leaf_order){2, 0, 0};
    t->kv_weight = 0.0;   /* the KV pool is assumed plentiful until the tuner finds otherwise */
    t->recency = 1.0;
    adaptive_reset(t);
    mr_ns_init(&t->ns);
    for (int w = 0; w < 2; w++) {
        t->head[w].prev = t->head[w].next = &t->head[w];
    }
    if (node_new(t, 0, 0, &t->root) != MR_OK) {
        MR_FREE(t->by_id);
        MR_FREE(t->gens);
        MR_FREE(t->free_ids);
        MR_FREE(t);
        return MR_ENOMEM;
    }
    *out = t;
    return MR_OK;
}

mr_nstable *
mr_radix_namespaces(mr_radix *t)
{
    return &t->ns;
}

/* Frees every non-root node; each is in the full list (I4). */
static void
free_all_nodes(mr_radix *t)
{
    mr_link *head = &t->head[LRU_FULL];
    mr_link *l = head->next;
    while (l != head) {
        mr_link *next = l->next;
        node_free(t, link_node(l, LRU_FULL));
        l = next;
    }
    for (int w = 0; w < 2; w++) {
        t->head[w].prev = t->head[w].next = &t->head[w];
    }
}

void
mr_radix_free(mr_radix *t)
{
    if (t == NULL) {
        return;
    }
    free_all_nodes(t);
    node_free(t, t->root);
    mr_radix_free(t->snap);
    mr_ns_free(&t->ns);
    MR_FREE(t->log_keys);
    MR_FREE(t->log_off);
    MR_FREE(t->log_ns);
    MR_FREE(t->by_id);
    MR_FREE(t->gens);
    MR_FREE(t->free_ids);
    MR_FREE(t->heap);
    MR_FREE(t->walk);
    MR_FREE(t->wide);
    MR_FREE(t->ghosts);
    MR_FREE(t->ad_depth);
    MR_FREE(t);
}

void
mr_radix_reset(mr_radix *t)
{
    free_all_nodes(t);
    leaf_heap_release(t);
    mr_node *root = t->root;
    root->nchildren = root->nent = 0;
    root->full_lock = root->state_lock = root->nostate_lock = root->kv_lock = 0;
    root->ghost = 0;
    root->kid_used = root->kid_wasted = 0;
    root->br_shared = root->br_cont = 0;
    root->placed_at = 0;
    adaptive_reset(t);
    /* Root handles stay valid: the root is the same node. */
    t->full_evictable = t->full_protected = 0;
    t->state_evictable = t->state_protected = 0;
    t->nodes = 0;
    mr_radix_free(t->snap);
    t->snap = NULL;
    t->nlog = t->log_len = 0;
}

const mr_radix_config *
mr_radix_config_of(const mr_radix *t)
{
    return &t->cfg;
}

int
mr_radix_set_options(mr_radix *t, const mr_radix_options *o)
{
    if (!(o->alpha >= 0.0) || !(o->flops_per_token >= 0.0) || !(o->attn_flops_per_pos >= 0.0)
        || !(o->state_bytes >= 0.0) || !(o->kv_bytes_per_token >= 0.0) || o->evict_window > 1024) {
        return MR_EINVAL;
    }
    t->opt = *o;
    t->recency = o->mru ? -1.0 : 1.0;
    /* a new tuning window starts at the next eviction */
    mr_radix_free(t->snap);
    t->snap = NULL;
    MR_FREE(t->log_off);
    MR_FREE(t->log_ns);
    t->log_off = NULL;
    t->log_ns = NULL;
    t->nlog = t->log_len = t->log_ncap = 0;
    return MR_OK;
}

const mr_radix_options *
mr_radix_options_of(const mr_radix *t)
{
    return &t->opt;
}

/* ------------------------------------------------------------------------
 * Split */

/* Length of the common prefix of a[0:na) and b[0:nb), rounded down to
 * whole pages. */
static size_t
common_prefix(const mr_radix *t, const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t n = na < nb ? na : nb;
    size_t i = 0;
    if (memcmp(a, b, n * sizeof(int32_t)) == 0) {
        i = n;
    }
    else {
        while (i < n && a[i] == b[i]) {
            i++;
        }
    }
    return i / t->cfg.page_size * t->cfg.page_size;
}

/* common_prefix of a[0:na) and an int64 key b[0:nb) (int32 tokens widened:
 * a key token outside int32 differs from every token). */
static size_t
common_prefix64(const mr_radix *t, const int32_t *a, size_t na, const int64_t *b, size_t nb)
{
    size_t n = na < nb ? na : nb;
    size_t i = 0;
    /* blocks of 32 with no exit inside, which vectorise on plain SSE2: a[j]
     * and b[j] are equal iff a[j] with its sign bit flipped, zero-extended,
     * equals b[j] + 2^31 (a b[j] outside int32 has a bit above bit 31 there,
     * so it differs from every token); the block with the first difference
     * is walked one by one */
    while (i + 32 <= n) {
        uint64_t d = 0;
        MR_PREFETCH(b + i, MR_AHEAD);   /* the key is usually cold: its next lines */
        MR_PREFETCH(b + i, MR_AHEAD + 64);
        MR_PREFETCH(b + i, MR_AHEAD + 128);
        MR_PREFETCH(b + i, MR_AHEAD + 192);
        for (size_t j = 0; j < 32; j++) {
            d |= (uint64_t)((uint32_t)a[i + j] ^ UINT32_C(0x80000000)) ^ ((uint64_t)b[i + j] + UINT64_C(0x80000000));
        }
        if (d != 0) {
            break;
        }
        i += 32;
    }
    while (i < n && a[i] == b[i]) {
        i++;
    }
    return i / t->cfg.page_size * t->cfg.page_size;
}

/* Splits child at p (0 < p < child->len, a page multiple): a new upper node
 * takes child's first p tokens and child's place below the parent; child
 * keeps the rest, its state, its locks and its handle.  The upper node is a
 * tombstone whose full lock copies child's (every lock on child also covers
 * it).  Full list: child becomes MRU with upper right behind it.
 * MR_ENOMEM: nothing changed. */
static int
split_node(mr_radix *t, mr_node *child, size_t p, mr_node **upper_out)
{
    mr_node *upper;
    if (node_new(t, p, child->ns, &upper) != MR_OK) {
        return MR_ENOMEM;
    }
    if (child_reserve(t, upper) != MR_OK) {
        node_free(t, upper);
        return MR_ENOMEM;
    }
    size_t len = child->len, rest = len - p;
    int32_t *ckey = node_key(child);
    const size_t vb = val_bytes(t);
    if (!t->cfg.no_values) {
        memcpy(upper->vals, child->vals, p * vb);
    }
    memcpy(node_key(upper), ckey, p * sizeof(int32_t));
    upper->full_lock = child->full_lock;
    upper->end = child->end - (child->len - p);
    upper->hits = child->hits;
    upper->prio = child->prio;
    upper->born = child->born;
    upper->hist = child->hist;
    upper->top = child->top;       /* adaptive placement: the same branch, its head now upper */
    upper->shared = child->shared;
    upper->cont = child->cont;
    upper->placed = child->placed;

    mr_node *parent = child->parent;
    uint32_t idx = child_index(parent, child);
    parent->children[idx].child = upper;   /* same namespace and first page */
    upper->parent = parent;

    /* Shift child's edge: values then tokens, in place. */
    void *mem = node_mem(child);
    if (!t->cfg.no_values) {
        memmove(child->vals, (char *)child->vals + p * vb, rest * vb);
        memmove((char *)child->vals + rest * vb, ckey + p, rest * sizeof(int32_t));
    }
    else {
        memmove(ckey, ckey + p, rest * sizeof(int32_t));
    }
    child->len = (uint32_t)rest;
    void *shrunk = MR_REALLOC(mem, rest * token_bytes(t));
    node_place(t, child, shrunk != NULL ? shrunk : mem);
    t->bytes -= p * token_bytes(t);
    child_add(t, upper, child);

    lru_remove(child, LRU_FULL);
    lru_push_mru(t, upper, LRU_FULL);
    lru_push_mru(t, child, LRU_FULL);
    policy_of(t)->on_split(t, child);
    t->nodes++;
    *upper_out = upper;
    return MR_OK;
}

/* ------------------------------------------------------------------------
 * Match */

int
mr_radix_match(mr_radix *t, const int32_t *key, size_t len, int32_t ns, mr_match *out)
{
    return mr_radix_match_key(t, key, NULL, len, ns, out);
}

static int match_walk_from(mr_radix *t, mr_node *from, size_t pos, const int32_t *key, const int64_t *key64,
                           size_t len, int32_t ns, int peek, mr_match *out);

/* The walk of a match.  peek: change nothing (no split: a partially
 * matched node stays whole, and kv_node is that node; no LRU refresh, no
 * counter), for mr_radix_peek_key; t is then only read. */
static int
match_walk(mr_radix *t, const int32_t *key, const int64_t *key64, size_t len, int32_t ns, int peek, mr_match *out)
{
    return match_walk_from(t, t->root, 0, key, key64, len, ns, peek, out);
}

/* match_walk from node `from` (pos tokens from the root, at most len):
 * the caller vouches that its path is the key's first pos tokens and that
 * no node above it ends a longer match (from has a state, or is the root),
 * so the walk from the root would pass through it; those tokens are not
 * read (MR_VERIFY_TRUSTED builds compare them and abort on a mismatch). */
static int
match_walk_from(mr_radix *t, mr_node *from, size_t pos, const int32_t *key, const int64_t *key64, size_t len,
                int32_t ns, int peek, mr_match *out)
{
    const size_t page = t->cfg.page_size;
    int rc = MR_OK;
    len = len / page * page;
    mr_node *node = from, *best = from;
    size_t best_len = pos;
#ifdef MR_VERIFY_TRUSTED
    size_t at = pos;
    for (const mr_node *n = from; n != t->root; n = n->parent) {
        at -= n->len;
        for (size_t i = 0; i < n->len; i++) {
            int64_t k = key64 != NULL ? key64[at + i] : key[at + i];
            if (n->ns != ns || k != node_key(n)[i]) {
                abort();   /* the caller's path is not the key's */
            }
        }
    }
#endif

    while (pos < len) {
        int64_t idx = key64 != NULL ? child_find64(t, node, ns, key64 + pos) : child_find(t, node, ns, key + pos);
        if (idx < 0) {
            break;
        }
        mr_node *child = node->children[idx].child;
        if (node->state >= 0) {
            best = node;
            best_len = pos;
        }
        size_t p = key64 != NULL ? common_prefix64(t, node_key(child), child->len, key64 + pos, len - pos)
                                 : common_prefix(t, node_key(child), child->len, key + pos, len - pos);
        if (p < child->len) {
            mr_node *upper;
            if (peek) {
                out->kv_node = child;
                pos += p;
                goto found;
            }
            rc = split_node(t, child, p, &upper);
            if (rc == MR_OK) {
                node = upper;
                pos += p;
            }
            break;
        }
        node = child;
        pos += p;
    }
    if (node->state >= 0 || t->cfg.kv_only) {
        best = node;
        best_len = pos;
    }
    out->kv_node = node;
found:
    if (!peek) {
        policy_of(t)->on_match(t, best);
        t->work += len;
        if (best != t->root && !best->used) {
            best->used = 1;
            t->states_used++;
        }
        if (t->cfg.policy == MR_POLICY_ADAPTIVE) {
            if (best != t->root && !best->reused) {
                best->reused = 1;
                best->parent->kid_used++;
            }
            int has_next = pos < len && (key64 == NULL || (key64[pos] >= INT32_MIN && key64[pos] <= INT32_MAX));
            int32_t next = !has_next ? 0 : key64 != NULL ? (int32_t)key64[pos] : key[pos];
            adaptive_on_lookup(t, best, out->kv_node, has_next, next);
        }
    }
    out->node = best;
    out->prefix_len = best_len;
    out->kv_matched_len = pos;
    out->state = best->state;
    out->branching_seqlen = -1;
    out->placed = 0;
    if (pos > best_len) {
        size_t aligned = pos / t->cfg.chunk_size * t->cfg.chunk_size;
        if (aligned > 0) {
            out->branching_seqlen = (int64_t)aligned;
        }
        if (aligned > best_len && !peek && t->cfg.policy == MR_POLICY_ADAPTIVE && !t->cfg.kv_only
            && adaptive_skip_junction(t, out->kv_node, aligned, best_len, len)) {
            out->branching_seqlen = -1;   /* the end snapshot instead (see "Adaptive placement") */
        }
    }
    if (!peek && t->cfg.policy == MR_POLICY_ADAPTIVE && !t->cfg.kv_only && pos < len) {
        /* adaptive placement: a predicted junction where the match has none
         * past its state, then this match's own overlap depth */
        if (out->branching_seqlen <= (int64_t)best_len) {
            size_t p = adaptive_place(t, best_len, out->kv_node, pos, len);
            if (p == 0 && (p = adaptive_place_end(t, best_len, pos, len)) > 0) {
                t->ad_placed_end++;
            }
            if (p > 0) {
                out->branching_seqlen = (int64_t)p;
                out->placed = 1;
                out->kv_node->placed_at = p;
                t->ad_placed++;
            }
        }
        adaptive_observe(t, out->kv_node, pos);
    }
    return rc;
}

int
mr_radix_match_key(mr_radix *t, const int32_t *key, const int64_t *key64, size_t len, int32_t ns, mr_match *out)
{
    return match_walk(t, key, key64, len, ns, 0, out);
}

int
mr_radix_match_key_from(mr_radix *t, mr_node *from, const int32_t *key, const int64_t *key64, size_t len,
                        int32_t ns, mr_match *out)
{
    if (from == NULL || from == t->root) {
        return match_walk(t, key, key64, len, ns, 0, out);
    }
    size_t pos = mr_radix_path_len(t, from);
    if (from->state < 0 || pos > len / t->cfg.page_size * t->cfg.page_size) {
        return MR_EINVAL;
    }
    return match_walk_from(t, from, pos, key, key64, len, ns, 0, out);
}

int
mr_radix_peek_key(const mr_radix *t, const int32_t *key, const int64_t *key64, size_t len, int32_t ns,
                  mr_match *out)
{
    if (t->cfg.kv_only) {
        return MR_EINVAL;   /* its match may end inside a node, which only a split makes a node */
    }
    return match_walk((mr_radix *)t, key, key64, len, ns, 1, out);
}

int
mr_radix_match_node(mr_radix *t, mr_node *node, size_t *prefix_len)
{
    if (node != t->root && node->state < 0 && !t->cfg.kv_only) {
        return MR_EINVAL;
    }
    size_t len = mr_radix_path_len(t, node);
    policy_of(t)->on_match(t, node);
    t->work += len;
    if (node != t->root && !node->used) {
        node->used = 1;
        t->states_used++;
    }
    *prefix_len = len;
    return MR_OK;
}

size_t
mr_radix_path_len(const mr_radix *t, const mr_node *node)
{
    size_t n = 0;
    for (; node != t->root; node = node->parent) {
        n += node->len;
    }
    return n;
}

size_t
mr_radix_path_values(const mr_radix *t, const mr_node *node, int64_t *dst)
{
    if (t->cfg.no_values) {
        return 0;   /* no indices to copy */
    }
    size_t total = mr_radix_path_len(t, node), off = total;
    for (; node != t->root; node = node->parent) {
        off -= node->len;
        node_vals_out(t, node, 0, node->len, dst + off);
    }
    return total;
}

/* ------------------------------------------------------------------------
 * Insert */

int
mr_radix_insert(mr_radix *t, const int32_t *key, const int64_t *val, size_t len,
                int32_t ns, int64_t state, size_t prev_prefix_len,
                int64_t *dup_out, mr_insert_result *out)
{
    return mr_radix_insert_ex(t, key, val, len, ns, state, prev_prefix_len, NULL, dup_out, out);
}

int
mr_radix_insert_ex(mr_radix *t, const int32_t *key, const int64_t *val, size_t len,
                   int32_t ns, int64_t state, size_t prev_prefix_len, const mr_insert_opts *opts,
                   int64_t *dup_out, mr_insert_result *out)
{
    const mr_evict_policy *pol = policy_of(t);
    const mr_insert_opts zero = {0, 0, NULL, NULL};
    if (opts == NULL) {
        opts = &zero;
    }
    t->ver++;   /* keys (hits, prio, hist) change below */
    if (len % t->cfg.page_size != 0
        || (state < 0 && !(state == MR_NO_STATE && t->cfg.semantics == MR_SEMANTICS_V0523))) {
        return MR_EINVAL;
    }
    out->prefix_len = 0;
    out->state_existed = 1;
    out->node = t->root;
    out->ndup = 0;
    if (len == 0) {
        return MR_OK;
    }

    /* 1. Walk the existing path.  Each visited node is refreshed; the
     *    caller's indices for tokens already cached, past its locked
     *    prefix, are reported as duplicates.  A partial edge is split and
     *    ends the walk. */
    mr_node *node = t->root;
    size_t pos = 0, ndup = 0, nwalk = 0, w = 0;
    if (opts->from != NULL && opts->from != t->root) {
        /* the caller's path: its nodes in walk order, none of its tokens read */
        size_t depth = 0, plen = 0;
        for (const mr_node *n = opts->from; n != t->root; n = n->parent) {
            depth++;
            plen += n->len;
        }
        if (plen > len) {
            return MR_EINVAL;
        }
        if (depth > t->walk_cap) {
            size_t cap = depth < 16 ? 16 : depth * 2;
            mr_node **walk = MR_REALLOC(t->walk, cap * sizeof(mr_node *));
            if (walk == NULL) {
                return MR_ENOMEM;
            }
            t->walk = walk;
            t->walk_cap = cap;
        }
        nwalk = depth;
        for (mr_node *n = (mr_node *)opts->from; n != t->root; n = n->parent) {
            t->walk[--depth] = n;
        }
#ifdef MR_VERIFY_TRUSTED
        for (size_t i = 0, at = 0; i < nwalk; at += t->walk[i++]->len) {
            if (t->walk[i]->ns != ns || memcmp(node_key(t->walk[i]), key + at, t->walk[i]->len * sizeof(int32_t)) != 0) {
                abort();   /* the caller's path is not the key's */
            }
        }
#endif
    }
    while (pos < len) {
        mr_node *child;
        size_t p;
        if (w < nwalk) {
            child = t->walk[w++];
            p = child->len;
        }
        else {
            int64_t idx = child_find(t, node, ns, key + pos);
            if (idx < 0) {
                break;
            }
            child = node->children[idx].child;
            p = common_prefix(t, node_key(child), child->len, key + pos, len - pos);
        }
        pol->on_insert_visit(t, child);
        if (prev_prefix_len < pos + p) {
            size_t start = prev_prefix_len > pos ? prev_prefix_len - pos : 0;
            if (dup_out != NULL && opts->val32 != NULL) {
                for (size_t i = pos + start; i < pos + p; i++) {
                    dup_out[ndup + i - pos - start] = opts->val32[i];
                }
            }
            else if (dup_out != NULL && val != NULL) {
                memcpy(dup_out + ndup, val + pos + start, (p - start) * sizeof(int64_t));
            }
            ndup += p - start;
        }
        if (p < child->len) {
            mr_node *upper;
            if (split_node(t, child, p, &upper) != MR_OK) {
                return MR_ENOMEM;
            }
            child = upper;
        }
        /* 0.5.23's leaf-order bookkeeping: a hit past what the request
         * already inserted, and the insert's priority. */
        child->hits += pos + p > opts->inserted_len;
        child->prio = opts->priority > child->prio ? opts->priority : child->prio;
        node = child;
        pos += p;
    }

    /* 2. Three ways to end (SGLang's cases): a new leaf for the rest of the
     *    key; the key ends at a tombstone, which is revived with the
     *    caller's state; or the key ends at a node that has a state. */
    if (pos < len) {
        mr_node *leaf;
        if (child_reserve(t, node) != MR_OK || node_new(t, len - pos, ns, &leaf) != MR_OK) {
            return MR_ENOMEM;
        }
        size_t rest = len - pos;
        if (t->cfg.no_values) {
            /* keys only */
        }
        else if (opts->val32 != NULL && t->cfg.val32) {
            memcpy(leaf->vals, opts->val32 + pos, rest * sizeof(int32_t));
        }
        else if (opts->val32 != NULL) {
            for (size_t i = 0; i < rest; i++) {
                ((int64_t *)leaf->vals)[i] = opts->val32[pos + i];
            }
        }
        else {
            node_vals_in(t, leaf, 0, val + pos, rest);
        }
        memcpy(node_key(leaf), key + pos, rest * sizeof(int32_t));
        leaf->state = state;
        leaf->end = (uint64_t)len;
        leaf->hits = len > opts->inserted_len;
        leaf->prio = opts->priority;
        leaf->born = ++t->births;
        leaf->hist = leaf->end;
        leaf->top = pos;   /* a new branch begins here */
        leaf->placed = node->placed_at != 0 && node->placed_at == len;
        if (t->cfg.policy == MR_POLICY_TLRU) {
            /* raise the branch's high-water mark */
            for (mr_node *a = node; a != t->root && a->hist < leaf->end; a = a->parent) {
                a->hist = leaf->end;
            }
        }
        t->states_admitted++;
        child_add(t, node, leaf);
        lru_push_mru(t, leaf, LRU_FULL);
        if (state != MR_NO_STATE) {
            if (t->cfg.policy == MR_POLICY_ADAPTIVE) {
                adaptive_admit(t, leaf);
            }
            else {
                lru_push_mru(t, leaf, LRU_STATE);
            }
            t->state_evictable += 1;
        }
        t->full_evictable += rest;
        t->nodes++;
        out->state_existed = 0;
        out->node = leaf;
    }
    else if (state == MR_NO_STATE) {
        /* Stateless insert ending at an existing node: nothing to attach. */
        out->state_existed = node->state >= 0;
        out->node = node;
    }
    else if (node->state < 0) {
        node->state = state;
        node->used = 0;
        node->reused = 0;
        t->states_admitted++;
        lru_touch(t, node, LRU_FULL);
        if (t->cfg.policy == MR_POLICY_ADAPTIVE) {
            adaptive_admit(t, node);
        }
        else {
            lru_push_mru(t, node, LRU_STATE);
        }
        if (node->state_lock > 0) {   /* v0.5.23: locked while a tombstone */
            t->state_protected += 1;
        }
        else {
            t->state_evictable += 1;  /* v0.5.15: state_lock is 0 on a tombstone (I6) */
        }
        out->state_existed = 0;
        out->node = node;
    }
    else {
        pol->on_insert_visit(t, node);
        if (t->cfg.semantics == MR_SEMANTICS_V0523) {
            /* 0.5.23: re-inserting an existing state refreshes it. */
            lru_touch(t, node, LRU_STATE);
        }
        out->node = node;
    }
    out->prefix_len = pos;
    out->ndup = ndup;
    tune_log(t, key, len, ns, nwalk);
    return MR_OK;
}

size_t
mr_radix_cached_len(const mr_radix *t, const int32_t *key, size_t len, int32_t ns)
{
    const mr_node *node = t->root;
    size_t pos = 0;
    while (pos + t->cfg.page_size <= len) {
        int64_t idx = child_find(t, node, ns, key + pos);
        if (idx < 0) {
            break;
        }
        const mr_node *child = node->children[idx].child;
        size_t p = common_prefix(t, node_key(child), child->len, key + pos, len - pos);
        pos += p;
        if (p < child->len) {
            break;
        }
        node = child;
    }
    return pos;
}

/* ------------------------------------------------------------------------
 * Locks */

static void
path_lock_delta(mr_radix *t, mr_node *node, int delta)
{
    t->ver++;
    for (mr_node *n = node; n != t->root; n = n->parent) {
        if (delta > 0 && n->full_lock++ == 0) {
            t->full_evictable -= n->len;
            t->full_protected += n->len;
        }
        else if (delta < 0 && --n->full_lock == 0) {
            t->full_protected -= n->len;
            t->full_evictable += n->len;
        }
    }
}

int
mr_radix_lock(mr_radix *t, mr_node *node)
{
    if (node == t->root) {
        return MR_OK;
    }
    t->ver++;
    if (node->state >= 0 || t->cfg.semantics == MR_SEMANTICS_V0523) {
        /* v0.5.23 counts the state lock on a tombstone too (SGLang's Mamba
         * lock_ref); a state attached under it is protected at once. */
        if (node->state_lock == 0 && node->state >= 0) {
            t->state_evictable--;
            t->state_protected++;
        }
        node->state_lock++;
    }
    else {
        node->nostate_lock++;
    }
    for (mr_node *n = node; n != t->root; n = n->parent) {
        if (n->full_lock == 0) {
            t->full_evictable -= n->len;
            t->full_protected += n->len;
        }
        n->full_lock++;
    }
    return MR_OK;
}

int
mr_radix_unlock(mr_radix *t, mr_node *node)
{
    if (node == t->root) {
        return MR_OK;
    }
    t->ver++;
    if (t->cfg.semantics == MR_SEMANTICS_V0523) {
        /* Locks are told apart (mr_radix_lock vs mr_radix_lock_kv). */
        if (node->state_lock == 0) {
            return MR_EINVAL;
        }
        if (--node->state_lock == 0 && node->state >= 0) {
            t->state_protected--;
            t->state_evictable++;
        }
        path_lock_delta(t, node, -1);
        return MR_OK;
    }
    if (node->state_lock + node->nostate_lock == 0) {
        return MR_EINVAL;
    }
    /* Release a lock that took no state reference first: when the lock
     * holders cannot be told apart, keeping the state protected longer is
     * the safe direction. */
    if (node->nostate_lock > 0) {
        node->nostate_lock--;
    }
    else if (--node->state_lock == 0) {
        t->state_protected--;
        t->state_evictable++;
    }
    for (mr_node *n = node; n != t->root; n = n->parent) {
        if (--n->full_lock == 0) {
            t->full_protected -= n->len;
            t->full_evictable += n->len;
        }
    }
    return MR_OK;
}

int
mr_radix_lock_kv(mr_radix *t, mr_node *node)
{
    if (node == t->root) {
        return MR_OK;
    }
    node->kv_lock++;
    path_lock_delta(t, node, +1);
    return MR_OK;
}

int
mr_radix_unlock_kv(mr_radix *t, mr_node *node)
{
    if (node == t->root) {
        return MR_OK;
    }
    if (node->kv_lock == 0) {
        return MR_EINVAL;
    }
    node->kv_lock--;
    path_lock_delta(t, node, -1);
    return MR_OK;
}

int
mr_radix_unlock_state(mr_radix *t, mr_node *node)
{
    if (node == t->root) {
        return MR_OK;
    }
    if (node->nostate_lock > 0 && t->cfg.semantics != MR_SEMANTICS_V0523) {
        node->nostate_lock--;   /* a lock taken on a tombstone holds no state reference */
    }
    else if (node->state_lock > 0) {
        if (--node->state_lock == 0 && node->state >= 0) {
            t->state_protected--;
            t->state_evictable++;
        }
    }
    else {
        return MR_EINVAL;
    }
    t->ver++;
    node->kv_lock += 1;   /* the path's KV stays locked, as by mr_radix_lock_kv */
    return MR_OK;
}

/* ------------------------------------------------------------------------
 * Eviction */

/* Hands n's KV (and state) to the release callbacks; 0 or their error. */
static int
release_node(mr_radix *t, const mr_release *rel, mr_node *n, int with_state)
{
    int rc = MR_OK;
    if (n->len == 0) {
        /* nothing to hand over */
    }
    else if (t->cfg.val32 && rel->free_kv32 != NULL) {
        rc = rel->free_kv32(rel->ctx, n->vals, n->len);
    }
    else if (t->cfg.val32 && rel->free_kv != NULL) {
        if (t->wide_cap < n->len) {
            int64_t *w = MR_REALLOC(t->wide, (size_t)n->len * sizeof(int64_t));
            if (w == NULL) {
                return MR_ENOMEM;
            }
            t->wide = w;
            t->wide_cap = n->len;
        }
        node_vals_out(t, n, 0, n->len, t->wide);
        rc = rel->free_kv(rel->ctx, t->wide, n->len);
    }
    else if (rel->free_kv != NULL) {
        rc = rel->free_kv(rel->ctx, n->vals, n->len);
    }
    if (rc != MR_OK) {
        return rc;
    }
    if (with_state && n->state >= 0 && rel->free_state != NULL
        && (rc = rel->free_state(rel->ctx, n->state)) != 0) {
        return rc;
    }
    return MR_OK;
}

/* Removes an unlocked leaf and its KV and state, then every tombstone above
 * it that is left an unlocked leaf (SGLang's cascade).  *emptied is the
 * first ancestor that survives if it was left without children (then it may
 * be the next victim), else NULL.  A callback
 * error leaves the leaf in place (or stops the cascade, leaving an unlocked
 * tombstone leaf that evict_full removes later). */
static int
evict_leaf(mr_radix *t, mr_node *x, const mr_release *rel, size_t *tokens, size_t *states,
           mr_node **emptied)
{
    int rc = release_node(t, rel, x, 1);
    if (rc != MR_OK) {
        return rc;
    }
    mr_node *parent = x->parent;
    t->last_tok = node_key(x)[0];
    *tokens += x->len;
    t->full_evictable -= x->len;
    if (x->state >= 0) {
        *states += 1;
        t->state_evictable -= 1;
        lru_remove(x, LRU_STATE);
    }
    lru_remove(x, LRU_FULL);
    child_remove(t, parent, x);
    node_free(t, x);
    t->nodes--;

    while (t->cfg.semantics == MR_SEMANTICS_V0515 && parent != t->root && parent->state < 0
           && parent->nchildren == 0 && parent->full_lock == 0) {
        if ((rc = release_node(t, rel, parent, 0)) != MR_OK) {
            return rc;
        }
        mr_node *up = parent->parent;
        t->last_tok = node_key(parent)[0];
        *tokens += parent->len;
        t->full_evictable -= parent->len;
        lru_remove(parent, LRU_FULL);
        child_remove(t, up, parent);
        node_free(t, parent);
        t->nodes--;
        parent = up;
    }
    *emptied = parent->nchildren == 0 ? parent : NULL;
    t->last_up = parent;
    return MR_OK;
}

/* MRU's victim is usually within a few nodes of the MRU end: while the heap
 * is not current, MRU_PROBE nodes from that end are probed first, and the
 * heap (an O(n) build) is made only when they hold no evictable leaf. */
#define MRU_PROBE 64

static mr_node *
mru_probe(const mr_radix *t)
{
    const mr_link *head = &t->head[LRU_FULL];
    int k = 0;
    for (const mr_link *l = head->next; l != head && k < MRU_PROBE; l = l->next, k++) {
        mr_node *n = link_node((mr_link *)l, LRU_FULL);
        if (n->full_lock == 0 && n->nchildren == 0) {
            return n;
        }
    }
    return NULL;
}

/* evict_full for a keyed policy: victims from the leaf heap (MRU: from the
 * probe first), or from the policy's scan when the heap cannot be had. */
static int
evict_full_keyed(mr_radix *t, size_t num_tokens, const mr_release *rel, size_t *tokens, size_t *states)
{
    int rc = MR_OK;
    while (*tokens < num_tokens) {
        mr_node *x = NULL, *up;
        int heaped = t->heap_ok && t->heap_ver == t->ver;
        if (!heaped && t->cfg.policy == MR_POLICY_MRU) {
            x = mru_probe(t);
        }
        if (x == NULL && !heaped) {
            heaped = leaf_heap_ready(t) == MR_OK;
        }
        if (x == NULL) {
            x = !heaped ? policy_of(t)->leaf_victim(t, NULL) : t->heap_len > 0 ? t->by_id[t->heap[0].id] : NULL;
        }
        if (x == NULL) {
            break;
        }
        /* a callback error before any change leaves x in place (on top), the heap current */
        if ((rc = evict_leaf(t, x, rel, tokens, states, &up)) != MR_OK) {
            return rc;
        }
        if (heaped) {
            leaf_heap_pop(t);
            if (up != NULL && up != t->root && up->full_lock == 0) {
                leaf_heap_push(t, up);
            }
            t->heap_ver = t->ver;
        }
    }
    return rc;
}

int
mr_radix_evict_full(mr_radix *t, size_t num_tokens, const mr_release *rel,
                    size_t *tokens_out, size_t *states_out)
{
    const mr_evict_policy *pol = policy_of(t);
    size_t tokens = 0, states = 0;
    int rc = MR_OK;
    if (num_tokens > 0) {
        tune_start(t);
    }
    if (pol->keyed && num_tokens > 0) {
        rc = evict_full_keyed(t, num_tokens, rel, &tokens, &states);
    }
    else {
        mr_node *x = pol->leaf_victim(t, NULL);
        while (tokens < num_tokens && x != NULL) {
            mr_node *next = pol->rescan ? NULL : pol->leaf_victim(t, x->lru[LRU_FULL].prev);
            mr_node *emptied;
            if ((rc = evict_leaf(t, x, rel, &tokens, &states, &emptied)) != MR_OK) {
                break;
            }
            /* The parent may have become the least recently used leaf. */
            x = emptied != NULL || pol->rescan ? pol->leaf_victim(t, NULL) : next;
        }
    }
    if (tokens_out) {
        *tokens_out = tokens;
    }
    if (states_out) {
        *states_out = states;
    }
    return rc;
}

/* Evicts x's state: an internal node becomes a tombstone (KV kept); an
 * unlocked leaf goes with its KV and the tombstones above it. */
static int
evict_one_state(mr_radix *t, mr_node *x, const mr_release *rel, size_t *tokens, size_t *states)
{
    int rc;
    /* the adaptive policy's own victim leaves a ghost (see "Adaptive") */
    const uint8_t ghost = t->cfg.policy == MR_POLICY_ADAPTIVE && x == t->ad_victim ? adaptive_ghost_kind(t, x) : 0;
    uint32_t *wasted = x->reused ? NULL : &x->parent->kid_wasted;
    t->ad_victim = NULL;
    /* a leaf whose KV is locked loses only its state (v0.5.23; v0.5.15 never
     * picks one) */
    if (x->nchildren > 0 || x->full_lock > 0) {
        if (rel->free_state != NULL && (rc = rel->free_state(rel->ctx, x->state)) != 0) {
            return rc;
        }
        lru_remove(x, LRU_STATE);
        x->state = -1;
        t->state_evictable -= 1;
        *states += 1;
        if (ghost) {
            if (wasted != NULL) {
                (*wasted)++;
            }
            x->ghost = ghost;
        }
        return MR_OK;
    }
    mr_node *emptied;
    if (ghost && wasted != NULL) {
        wasted = NULL;
        x->parent->kid_wasted++;   /* the parent outlives x unless the cascade takes it too */
    }
    if ((rc = evict_leaf(t, x, rel, tokens, states, &emptied)) != MR_OK || !ghost) {
        return rc;
    }
    mr_node *up = t->last_up;
    if (t->ghosts == NULL && (t->ghosts = MR_CALLOC(AD_GHOSTS, sizeof(struct ad_ghost))) != NULL) {
        t->bytes += AD_GHOSTS * sizeof(struct ad_ghost);
    }
    if (t->ghosts != NULL) {   /* out of memory: no ghost, nothing else lost */
        t->ghosts[ad_ghost_slot(up->id, up->gen, t->last_tok)]
            = (struct ad_ghost){up->id, up->gen, t->last_tok, ghost};
    }
    return MR_OK;
}

int
mr_radix_evict_state(mr_radix *t, size_t num_states, const mr_release *rel,
                     size_t *tokens_out, size_t *states_out)
{
    const mr_evict_policy *pol = policy_of(t);
    size_t tokens = 0, states = 0;
    int rc = MR_OK;
    if (num_states > 0) {
        tune_start(t);
    }
    const int rescan = pol->rescan || pol->state_rescan;
    mr_node *x = num_states > 0 ? pol->state_victim(t, NULL) : NULL;
    int first = 1;
    while (states < num_states && x != NULL) {
        /* Re-validate: evicting the previous victim may have made x a leaf
         * whose KV is locked, which must not be taken.  (A rescanning policy
         * picks afresh after each victim; its first pick is current.) */
        if (!(rescan && first)) {
            x = pol->state_victim(t, rescan ? NULL : &x->lru[LRU_STATE]);
        }
        first = 0;
        if (x == NULL) {
            break;
        }
        mr_node *next = rescan ? t->root : pol->state_victim(t, x->lru[LRU_STATE].prev);
        if ((rc = evict_one_state(t, x, rel, &tokens, &states)) != MR_OK) {
            break;
        }
        x = next;
    }
    if (tokens_out) {
        *tokens_out = tokens;
    }
    if (states_out) {
        *states_out = states;
    }
    return rc;
}

int
mr_radix_evict_node_state(mr_radix *t, mr_node *x, const mr_release *rel, size_t *tokens_out,
                          size_t *states_out)
{
    size_t tokens = 0, states = 0;
    if (!mr_radix_can_evict_state(t, x)) {
        return MR_EINVAL;
    }
    int rc = evict_one_state(t, x, rel, &tokens, &states);
    if (tokens_out) {
        *tokens_out = tokens;
    }
    if (states_out) {
        *states_out = states;
    }
    return rc;
}

int
mr_radix_evict_path_states(mr_radix *t, mr_node *tail, size_t cap, const mr_release *rel,
                           size_t *states_out)
{
    size_t held = 0, dropped = 0;
    int rc = MR_OK;
    for (mr_node *n = tail; n != t->root; n = n->parent) {
        held += n->state >= 0;
    }
    if (held > cap) {
        size_t excess = held - cap;
        mr_node **path = MR_MALLOC(held * sizeof(*path));
        if (path == NULL) {
            return MR_ENOMEM;
        }
        size_t k = held;
        for (mr_node *n = tail; n != t->root; n = n->parent) {
            if (n->state >= 0) {
                path[--k] = n;   /* root first */
            }
        }
        for (k = 0; k < held && excess > 0; k++) {
            mr_node *x = path[k];
            if (x == tail) {
                break;
            }
            if (x->state_lock > 0 || x->nchildren != 1) {
                continue;
            }
            if (rel->free_state != NULL && (rc = rel->free_state(rel->ctx, x->state)) != 0) {
                break;
            }
            lru_remove(x, LRU_STATE);
            x->state = -1;
            t->state_evictable -= 1;
            dropped++;
            excess--;
        }
        MR_FREE(path);
    }
    if (states_out) {
        *states_out = dropped;
    }
    return rc;
}

/* ------------------------------------------------------------------------
 * Per-path state budget */

int
mr_radix_trim_path(mr_radix *t, mr_node *node, const mr_release *rel, size_t *states_out)
{
    size_t dropped = 0, budget = t->opt.max_states_per_path;
    int rc = MR_OK;
    while (budget > 0 && node != t->root) {
        size_t count = 0;
        mr_node *victim = NULL;
        for (mr_node *a = node; a != t->root; a = a->parent) {
            if (a->state < 0) {
                continue;
            }
            count++;
            /* the deepest that is not a fork: the one the new state makes
             * most redundant (a fork's state also serves its other branches) */
            if (a != node && victim == NULL && a->nchildren == 1) {
                victim = a;
            }
        }
        /* a locked victim (a request still resumes from it) waits: dropping
         * a shallower, shared one instead would cost more */
        if (count <= budget || victim == NULL || victim->state_lock > 0) {
            break;
        }
        /* victim is an ancestor, so internal: it keeps its KV */
        if (rel != NULL && rel->free_state != NULL && (rc = rel->free_state(rel->ctx, victim->state)) != 0) {
            break;
        }
        lru_remove(victim, LRU_STATE);
        victim->state = -1;
        t->state_evictable -= 1;
        t->states_trimmed++;
        dropped++;
    }
    if (states_out != NULL) {
        *states_out = dropped;
    }
    return rc;
}

/* ------------------------------------------------------------------------
 * Utility policy: alpha tuning by replay
 *
 * At the first eviction the tree takes a snapshot of itself and logs the
 * keys of the insertions that follow.  When the window holds tune_window
 * insertions and at least as many tokens as the snapshot, one copy of the
 * snapshot per alpha of a fixed grid, each with a leaf's KV bytes counted
 * or not (the KV pool may be no bottleneck) and with the recency order as
 * it is or reversed (LRU thrashes on a cyclic reuse pattern the pool
 * cannot hold), replays it (match, then insert with a state, then state
 * evictions down to the most states the tree held during the window),
 * summing the prefill FLOPs each match saved; the best choice is adopted
 * (the one in use wins ties).  A new window then starts from a
 * snapshot of the tree as it is, if the tuner's own work (tokens copied
 * and replayed) with the window's projected cost stays within TUNE_BUDGET
 * times the tree's (tokens walked by matches and insertions): its cost is
 * a bounded share of the cache's. */

static const double tune_grid[] = {0.0, 1.0, 4.0, 16.0, 64.0};
/* grid points per window: alpha x (KV counted or not) x (order as is or reversed) */
enum { TUNE_GRID = sizeof(tune_grid) / sizeof(tune_grid[0]), TUNE_POINTS = 4 * TUNE_GRID };
#define TUNE_BUDGET 0.75

/* What the tuner chooses. */
typedef struct {
    double alpha, kv_weight, recency;
} tune_point;

MR_INLINE tune_point
tune_current(const mr_radix *t)
{
    return (tune_point){t->opt.alpha, t->kv_weight, t->recency};
}

/* A copy of src's nodes, edges, states and list orders, without locks, with
 * the tuned choice p and no tuning.  MR_ENOMEM: *out untouched. */
static int
radix_clone(const mr_radix *src, tune_point p, mr_radix **out)
{
    mr_radix *t;
    int rc = mr_radix_new(&src->cfg, &t);
    if (rc != MR_OK) {
        return rc;
    }
    t->opt = src->opt;
    t->opt.alpha = p.alpha;
    t->opt.tune_window = 0;
    t->kv_weight = p.kv_weight;
    t->recency = p.recency;
    mr_node **map = MR_CALLOC(src->nids + 1, sizeof(*map));
    size_t cap = 64, top = 0;
    const mr_node **stack = MR_MALLOC(cap * sizeof(*stack));
    if (map == NULL || stack == NULL) {
        rc = MR_ENOMEM;
        goto done;
    }
    map[src->root->id] = t->root;
    stack[top++] = src->root;
    while (top > 0) {
        const mr_node *n = stack[--top];
        mr_node *dn = map[n->id];
        uint32_t pos = 0;
        for (const mr_node *c; (c = child_next(n, &pos)) != NULL;) {
            mr_node *d;
            if ((rc = child_reserve(t, dn)) != MR_OK || (rc = node_new(t, c->len, c->ns, &d)) != MR_OK) {
                goto done;
            }
            memcpy(node_mem(d), node_mem(c), (size_t)c->len * token_bytes(t));
            d->state = c->state;
            d->used = c->used;
            d->end = c->end;
            child_add(t, dn, d);
            /* in the lists now (so a failure frees it); reordered below */
            lru_insert_after(&t->head[LRU_FULL], d, LRU_FULL);
            if (d->state >= 0) {
                lru_insert_after(&t->head[LRU_STATE], d, LRU_STATE);
            }
            t->nodes++;
            t->full_evictable += c->len;
            t->state_evictable += c->state >= 0;
            map[c->id] = d;
            if (top == cap) {
                const mr_node **ns = MR_REALLOC(stack, 2 * cap * sizeof(*stack));
                if (ns == NULL) {
                    rc = MR_ENOMEM;
                    goto done;
                }
                stack = ns;
                cap *= 2;
            }
            stack[top++] = c;
        }
    }
    for (int w = 0; w < 2; w++) {
        const mr_link *head = &src->head[w];
        t->head[w].prev = t->head[w].next = &t->head[w];
        for (const mr_link *l = head->prev; l != head; l = l->prev) {
            const mr_node *n = link_node((mr_link *)l, w);
            mr_node *d = map[n->id];
            lru_insert_after(&t->head[w], d, w);
            d->stamp = n->stamp;
        }
    }
    t->clock = src->clock;
done:
    MR_FREE(map);
    MR_FREE(stack);
    if (rc != MR_OK) {
        mr_radix_free(t);
        return rc;
    }
    *out = t;
    return MR_OK;
}

static void
tune_start(mr_radix *t)
{
    if (t->cfg.policy != MR_POLICY_UTILITY || t->opt.tune_window == 0 || t->snap != NULL) {
        return;
    }
    /* what the window will cost: copies of the tree and replays of a window
     * at least as large, once per grid point */
    double size = (double)(t->full_evictable + t->full_protected);
    double projected = (double)(TUNE_POINTS + 1) * 3.0 * size;
    if ((double)t->spent + projected > TUNE_BUDGET * (double)t->work) {
        return;
    }
    if (t->log_off == NULL) {
        t->log_ncap = (size_t)t->opt.tune_window + 1;
        t->log_off = MR_MALLOC(t->log_ncap * sizeof(size_t));
        t->log_ns = MR_MALLOC(t->log_ncap * sizeof(int32_t));
        if (t->log_off == NULL || t->log_ns == NULL) {
            MR_FREE(t->log_off);
            MR_FREE(t->log_ns);
            t->log_off = NULL;
            t->log_ns = NULL;
            return;
        }
    }
    if (radix_clone(t, tune_current(t), &t->snap) != MR_OK) {
        t->snap = NULL;
        return;
    }
    t->nlog = t->log_len = 0;
    t->log_off[0] = 0;
    t->max_states = t->state_evictable + t->state_protected;
    t->snap_tokens = t->full_evictable + t->full_protected;
    t->spent += t->snap_tokens;
}

/* Replays the log on a copy of the snapshot with p; the FLOPs saved. */
static double
tune_replay(mr_radix *t, tune_point p, const int64_t *zeros)
{
    mr_radix *c;
    if (radix_clone(t->snap, p, &c) != MR_OK) {
        return -1.0;
    }
    const mr_radix_options *cf = &t->opt;
    double saved = 0.0;
    mr_release none = {NULL, NULL, NULL, NULL};
    for (size_t i = 0; i < t->nlog; i++) {
        const int32_t *key = t->log_keys + t->log_off[i];
        size_t len = t->log_off[i + 1] - t->log_off[i];
        mr_match m;
        if (mr_radix_match(c, key, len, t->log_ns[i], &m) != MR_OK) {
            break;
        }
        double p = (double)m.prefix_len;
        saved += cf->flops_per_token * p + cf->attn_flops_per_pos * p * (p - 1.0) / 2.0;
        mr_insert_result ir;
        if (mr_radix_insert(c, key, zeros, len, t->log_ns[i], 1, 0, NULL, &ir) != MR_OK) {
            break;
        }
        size_t states = c->state_evictable + c->state_protected;
        if (states > t->max_states) {
            (void)mr_radix_evict_state(c, states - t->max_states, &none, NULL, NULL);
        }
    }
    mr_radix_free(c);
    return saved;
}

static void
tune_run(mr_radix *t)
{
    size_t longest = 1;
    for (size_t i = 0; i < t->nlog; i++) {
        size_t len = t->log_off[i + 1] - t->log_off[i];
        longest = len > longest ? len : longest;
    }
    int64_t *zeros = MR_CALLOC(longest, sizeof(int64_t));
    if (zeros != NULL) {
        tune_point cur = tune_current(t), best_p = cur;
        double best = tune_replay(t, cur, zeros);
        for (int r = 0; r < 2; r++) {
            for (int g = 0; g < TUNE_GRID; g++) {
                for (int w = 1; w >= 0; w--) {
                    tune_point p = {tune_grid[g], (double)w, r ? -cur.recency : cur.recency};
                    if (p.alpha == cur.alpha && p.kv_weight == cur.kv_weight && p.recency == cur.recency) {
                        continue;
                    }
                    double v = tune_replay(t, p, zeros);
                    if (v > best) {
                        best = v;
                        best_p = p;
                    }
                }
            }
        }
        t->opt.alpha = best_p.alpha;
        t->kv_weight = best_p.kv_weight;
        t->recency = best_p.recency;
        t->tunes++;
        t->spent += (uint64_t)TUNE_POINTS * (t->snap_tokens + 2 * t->log_len);
        MR_FREE(zeros);
    }
    mr_radix_free(t->snap);
    t->snap = NULL;
    tune_start(t);
}

/* Logs an insertion's key; its first tokens are the nodes t->walk[0:nwalk)
 * (an insert from a caller's node does not read them from the key). */
static void
tune_log(mr_radix *t, const int32_t *key, size_t len, int32_t ns, size_t nwalk)
{
    t->work += len;
    if (t->snap == NULL) {
        if (t->tunes > 0) {
            tune_start(t);   /* a window deferred by the budget */
        }
        return;
    }
    size_t states = t->state_evictable + t->state_protected;
    t->max_states = states > t->max_states ? states : t->max_states;
    if (t->log_len + len > t->log_cap) {
        size_t cap = t->log_cap ? t->log_cap : 4096;
        while (cap < t->log_len + len) {
            cap *= 2;
        }
        int32_t *k = MR_REALLOC(t->log_keys, cap * sizeof(int32_t));
        if (k == NULL) {
            return;   /* the window just misses this insertion */
        }
        t->log_keys = k;
        t->log_cap = cap;
    }
    if (t->nlog + 2 > t->log_ncap) {
        size_t cap = t->log_ncap * 2;
        size_t *off = MR_REALLOC(t->log_off, cap * sizeof(size_t));
        if (off == NULL) {
            return;
        }
        t->log_off = off;
        int32_t *ns_arr = MR_REALLOC(t->log_ns, cap * sizeof(int32_t));
        if (ns_arr == NULL) {
            return;
        }
        t->log_ns = ns_arr;
        t->log_ncap = cap;
    }
    size_t at = 0;
    for (size_t i = 0; i < nwalk; i++) {
        memcpy(t->log_keys + t->log_len + at, node_key(t->walk[i]), t->walk[i]->len * sizeof(int32_t));
        at += t->walk[i]->len;
    }
    memcpy(t->log_keys + t->log_len + at, key + at, (len - at) * sizeof(int32_t));
    t->log_len += len;
    t->log_ns[t->nlog] = ns;
    t->log_off[++t->nlog] = t->log_len;
    if (t->nlog >= t->opt.tune_window && t->log_len >= t->snap_tokens) {
        tune_run(t);
    }
}

/* ------------------------------------------------------------------------
 * Inspection */

void
mr_radix_get_stats(const mr_radix *t, mr_radix_stats *out)
{
    memset(out, 0, sizeof(*out));   /* padding too: callers may compare snapshots bytewise */
    out->full_evictable = t->full_evictable;
    out->full_protected = t->full_protected;
    out->state_evictable = t->state_evictable;
    out->state_protected = t->state_protected;
    out->nodes = t->nodes;
    out->memory_bytes = sizeof(*t) + t->bytes;
    out->states_admitted = t->states_admitted;
    out->states_used = t->states_used;
    out->states_trimmed = t->states_trimmed;
    out->alpha = t->opt.alpha;
    out->kv_weight = t->kv_weight;
    out->mru = t->recency < 0.0;
    out->tunes = t->tunes;
    out->child_moves = t->child_moves;
    out->adaptive_inflation = t->ad_inflation;
    out->ghost_hits = t->ad_ghost_hits;
    out->states_superseded = t->ad_superseded;
    out->unused_handovers = t->ad_handed_unused;
    out->admissions_probation = t->ad_probation;
    out->placements = t->ad_placed;
    out->end_placements = t->ad_placed_end;
}

mr_node *mr_radix_root(const mr_radix *t) { return t->root; }
mr_handle mr_node_handle(const mr_node *n) { return (mr_handle){n->id, n->gen}; }

int
mr_radix_resolve(const mr_radix *t, mr_handle h, mr_node **out)
{
    if (h.id >= t->nids || t->by_id[h.id] == NULL || t->by_id[h.id]->gen != h.gen) {
        return MR_ESTALE;
    }
    *out = t->by_id[h.id];
    return MR_OK;
}

int
mr_radix_set_policy(mr_radix *t, mr_lru_policy policy, const mr_leaf_order *order)
{
    if ((unsigned)policy >= MR_NPOLICIES || t->nodes != 0) {
        return MR_EINVAL;
    }
    t->cfg.policy = policy;
    t->order = order != NULL ? *order : (mr_leaf_order){2, 0, 0};
    t->ver++;
    return MR_OK;
}

const char *
mr_radix_policy_name(mr_lru_policy policy)
{
    return (unsigned)policy < MR_NPOLICIES ? policies[policy].name : NULL;
}

int
mr_radix_policy_by_name(const char *name, mr_lru_policy *out)
{
    for (unsigned i = 0; i < MR_NPOLICIES; i++) {
        if (strcmp(policies[i].name, name) == 0) {
            *out = (mr_lru_policy)i;
            return MR_OK;
        }
    }
    return MR_EINVAL;
}

size_t
mr_radix_negative_tokens(const mr_radix *t, int64_t *out, size_t cap)
{
    size_t count = 0;
    for (uint32_t id = 0; id < t->nids; id++) {
        const mr_node *n = t->by_id[id];
        if (n == NULL) {
            continue;
        }
        const int32_t *key = node_key(n);
        for (uint32_t i = 0; i < n->len; i++) {
            if (key[i] < 0 && (i == 0 || key[i] != key[i - 1])) {
                if (count < cap) {
                    out[count] = key[i];
                }
                count++;
            }
        }
    }
    return count;
}

uint32_t mr_node_hits(const mr_node *n) { return n->hits; }

mr_node *
mr_radix_node_by_id(const mr_radix *t, uint32_t id)
{
    return id < t->nids ? t->by_id[id] : NULL;
}

size_t mr_node_len(const mr_node *n) { return n->len; }
const int32_t *mr_node_key(const mr_node *n) { return node_key(n); }
const void *mr_node_values(const mr_node *n) { return n->vals; }

void
mr_node_values_i64(const mr_radix *t, const mr_node *n, size_t from, size_t k, int64_t *dst)
{
    if (n->vals != NULL && from <= n->len && k <= n->len - from) {
        node_vals_out(t, n, from, k, dst);
    }
}
int64_t mr_node_state(const mr_node *n) { return n->state; }
int32_t mr_node_namespace(const mr_node *n) { return n->ns; }
mr_node *mr_node_parent(const mr_node *n) { return n->parent; }
size_t mr_node_nchildren(const mr_node *n) { return n->nchildren; }
mr_node *
mr_node_child(const mr_node *n, size_t i)
{
    if (i >= n->nchildren) {
        return NULL;
    }
    if (n->nent == n->nchildren) {
        return n->children[i].child;
    }
    uint32_t pos = 0;
    mr_node *c = child_next(n, &pos);
    for (; i > 0; i--) {
        c = child_next(n, &pos);
    }
    return c;
}

mr_node *
mr_node_child_next(const mr_node *n, size_t *pos)
{
    uint32_t p = *pos < n->nent ? (uint32_t)*pos : n->nent;
    mr_node *c = child_next(n, &p);
    *pos = p;
    return c;
}
int32_t mr_node_full_lock(const mr_node *n) { return n->full_lock; }
int32_t mr_node_state_lock(const mr_node *n) { return n->state_lock; }
int32_t mr_node_kv_lock(const mr_node *n) { return n->kv_lock; }

mr_node *
mr_radix_lru_first(const mr_radix *t, int which)
{
    const mr_link *head = &t->head[which ? 1 : 0];
    return head->next == head ? NULL : link_node(head->next, which ? 1 : 0);
}

mr_node *
mr_radix_lru_next(const mr_radix *t, int which, const mr_node *n)
{
    int w = which ? 1 : 0;
    const mr_link *l = n->lru[w].next;
    return l == &t->head[w] ? NULL : link_node((mr_link *)l, w);
}

/* ------------------------------------------------------------------------
 * Invariant check */

#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            if (msg != NULL && msglen > 0) {              \
                snprintf(msg, msglen, __VA_ARGS__);       \
            }                                             \
            rc = MR_ECORRUPT;                             \
            goto done;                                    \
        }                                                 \
    } while (0)

int
mr_radix_check(const mr_radix *t, char *msg, size_t msglen)
{
    int rc = MR_OK;
    const mr_node *root = t->root;
    const size_t page = t->cfg.page_size;
    size_t cap = 64, top = 0;
    const mr_node **stack = MR_MALLOC(cap * sizeof(*stack));
    if (stack == NULL) {
        return MR_ENOMEM;
    }
    size_t nodes = 0, fe = 0, fp = 0, se = 0, sp = 0, nstate = 0;

    CHECK(root->len == 0 && root->state < 0 && root->parent == NULL, "I1: root has a key, a state or a parent");
    CHECK(!lru_in(root, LRU_FULL) && !lru_in(root, LRU_STATE), "I1: root is in an LRU list");
    CHECK(root->state_lock == 0 && root->nostate_lock == 0 && root->kv_lock == 0 && root->full_lock == 0,
          "I1: root holds locks");

    stack[top++] = root;
    while (top > 0) {
        const mr_node *n = stack[--top];
        CHECK(n->id < t->nids && t->by_id[n->id] == n, "I9: node %u is not registered under its id", n->id);
        int64_t lock_sum = (int64_t)n->state_lock + n->nostate_lock + n->kv_lock;
        uint32_t live = 0;
        CHECK(n->nent <= n->cap && (n->nent == 0 || n->children[n->nent - 1].child != NULL),
              "I2: node %u has %u child entries (capacity %u) or ends in a hole", n->id, n->nent, n->cap);
        for (uint32_t i = 0; i < n->nent; i++) {
            const mr_child *c = &n->children[i];
            const mr_node *ch = c->child;
            if (i > 0) {
                const mr_child *b = &n->children[i - 1];
                CHECK(b->ns < c->ns || (b->ns == c->ns && b->tok <= c->tok), "I2: children of node %u are not sorted",
                      n->id);
            }
            if (ch == NULL) {
                continue;   /* a hole keeps its place in the order */
            }
            live++;
            CHECK(ch->parent == n, "I2: child %u of node %u has a wrong parent", i, n->id);
            CHECK(ch->len > 0 && ch->len % page == 0, "I2: node %u has length %u (page size %zu)", ch->id, ch->len, page);
            CHECK(c->ns == ch->ns && c->tok == node_key(ch)[0], "I2: child entry of node %u is stale", ch->id);
            CHECK(ch->end == n->end + ch->len, "I2: node %u ends at %llu, not %llu", ch->id,
                  (unsigned long long)ch->end, (unsigned long long)(n->end + ch->len));
            CHECK(n == root || ch->ns == n->ns, "I3: node %u is in namespace %d below namespace %d", ch->id, ch->ns, n->ns);
            for (uint32_t j = i; j-- > 0 && n->children[j].ns == c->ns && n->children[j].tok == c->tok;) {
                CHECK(n->children[j].child == NULL
                      || memcmp(node_key(n->children[j].child), node_key(ch), page * sizeof(int32_t)) != 0,
                      "I2: two children of node %u share a first page", n->id);
            }
            lock_sum += ch->full_lock;
            if (top == cap) {
                const mr_node **s = MR_REALLOC(stack, 2 * cap * sizeof(*stack));
                if (s == NULL) {
                    rc = MR_ENOMEM;
                    goto done;
                }
                stack = s;
                cap *= 2;
            }
            stack[top++] = ch;
        }
        CHECK(live == n->nchildren, "I2: node %u counts %u children, has %u", n->id, n->nchildren, live);
        if (n == root) {
            continue;
        }
        nodes++;
        CHECK(n->full_lock == lock_sum, "I5: node %u full_lock %d != %lld (own locks + children)",
              n->id, n->full_lock, (long long)lock_sum);
        CHECK(n->state_lock >= 0 && n->nostate_lock >= 0 && n->kv_lock >= 0, "I5: node %u has a negative lock count",
              n->id);
        CHECK(n->state_lock == 0 || n->state >= 0 || t->cfg.semantics == MR_SEMANTICS_V0523,
              "I6: node %u has a state lock but no state", n->id);
        CHECK(lru_in(n, LRU_FULL), "I4: node %u is missing from the full LRU list", n->id);
        CHECK(lru_in(n, LRU_STATE) == (n->state >= 0), "I4: node %u state-list membership is wrong", n->id);
        if (n->full_lock > 0) {
            fp += n->len;
        }
        else {
            fe += n->len;
        }
        if (n->state >= 0) {
            nstate++;
            if (n->state_lock > 0) {
                sp++;
            }
            else {
                se++;
            }
        }
    }
    CHECK(nodes == t->nodes, "I7: node count %zu != %zu", t->nodes, nodes);
    CHECK(fe == t->full_evictable && fp == t->full_protected,
          "I7: full counters (%zu evictable, %zu protected) != (%zu, %zu)",
          t->full_evictable, t->full_protected, fe, fp);
    CHECK(se == t->state_evictable && sp == t->state_protected,
          "I7: state counters (%zu evictable, %zu protected) != (%zu, %zu)",
          t->state_evictable, t->state_protected, se, sp);

    for (int w = 0; w < 2; w++) {
        size_t expect = w == LRU_FULL ? nodes : nstate, seen = 0;
        const mr_link *head = &t->head[w];
        for (const mr_link *l = head->next; l != head; l = l->next) {
            CHECK(seen < expect, "I4: %s LRU list is longer than %zu", w ? "state" : "full", expect);
            CHECK(l->next->prev == l, "I4: %s LRU list links are broken", w ? "state" : "full");
            const mr_node *n = link_node((mr_link *)l, w);
            CHECK(n->id < t->nids && t->by_id[n->id] == n, "I4: %s LRU list holds a freed node", w ? "state" : "full");
            CHECK(w == LRU_FULL || n->state >= 0, "I4: state LRU list holds tombstone %u", n->id);
            seen++;
        }
        CHECK(seen == expect, "I4: %s LRU list has %zu nodes, expected %zu", w ? "state" : "full", seen, expect);
    }

    if (t->heap_ok && t->heap_ver == t->ver) {
        const mr_link *head = &t->head[LRU_FULL];
        size_t leaves = 0;
        int64_t last = -1;
        for (const mr_link *l = head->prev; l != head; l = l->prev) {
            const mr_node *n = link_node((mr_link *)l, LRU_FULL);
            CHECK((int64_t)n->rank > last, "I10: leaf heap rank of node %u is out of list order", n->id);
            last = n->rank;
            leaves += n->full_lock == 0 && n->nchildren == 0;
        }
        CHECK(t->heap_len == leaves, "I10: leaf heap holds %zu entries for %zu evictable leaves", t->heap_len,
              leaves);
        for (size_t i = 0; i < t->heap_len; i++) {
            const struct leaf_ent *e = &t->heap[i];
            const mr_node *n = e->id < t->nids ? t->by_id[e->id] : NULL;
            CHECK(n != NULL && n->full_lock == 0 && n->nchildren == 0,
                  "I10: leaf heap entry %zu is not an evictable leaf", i);
            CHECK(e->rank == n->rank && e->key == heap_key(t, n), "I10: leaf heap entry of node %u is stale", n->id);
            CHECK(i == 0 || !leaf_ent_less(e, &t->heap[(i - 1) / 2]), "I10: leaf heap order broken at %zu", i);
        }
    }
done:
    MR_FREE(stack);
    return rc;
}

#undef CHECK

/* ------------------------------------------------------------------------
 * Dump */

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} strbuf;

static void
sb_printf(strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
sb_printf(strbuf *sb, const char *fmt, ...)
{
    if (sb->oom) {
        return;
    }
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(sb->buf + sb->len, sb->cap - sb->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            sb->oom = 1;
            return;
        }
        if ((size_t)n < sb->cap - sb->len) {
            sb->len += (size_t)n;
            return;
        }
        size_t cap = (sb->cap + (size_t)n + 1) * 2;
        char *b = MR_REALLOC(sb->buf, cap);
        if (b == NULL) {
            sb->oom = 1;
            return;
        }
        sb->buf = b;
        sb->cap = cap;
    }
}

/* One node's line of mr_radix_dump, indented by its depth d. */
static void
dump_node(const mr_radix *t, strbuf *sb, const mr_node *n, size_t d)
{
    sb_printf(sb, "%*s#%u len=%u", (int)(2 * d), "", n->id, n->len);
    if (n->ns != 0) {
        sb_printf(sb, " ns=%d", n->ns);
    }
    sb_printf(sb, " tokens=[");
    const int32_t *k = node_key(n);
    for (uint32_t i = 0; i < n->len && i < 8; i++) {
        sb_printf(sb, i ? " %d" : "%d", k[i]);
    }
    sb_printf(sb, n->len > 8 ? " ...]" : "]");
    if (n->vals != NULL) {
        int64_t v0 = 0;
        node_vals_out(t, n, 0, 1, &v0);
        sb_printf(sb, " kv=[%lld..]", (long long)v0);
    }
    if (n->state >= 0) {
        sb_printf(sb, " state=%lld", (long long)n->state);
    }
    else {
        sb_printf(sb, " tombstone");
    }
    sb_printf(sb, " lock=%d/%d\n", n->full_lock, n->state_lock);
}

int
mr_radix_dump(const mr_radix *t, char **out, size_t *outlen)
{
    strbuf sb = {MR_MALLOC(256), 0, 256, 0};
    if (sb.buf == NULL) {
        return MR_ENOMEM;
    }
    sb.buf[0] = '\0';
    size_t cap = 64, top = 0;
    const mr_node **stack = MR_MALLOC(cap * sizeof(*stack));
    size_t *depth = MR_MALLOC(cap * sizeof(*depth));
    if (stack == NULL || depth == NULL) {
        MR_FREE(stack);
        MR_FREE(depth);
        MR_FREE(sb.buf);
        return MR_ENOMEM;
    }
    sb_printf(&sb, "root (page_size=%u chunk_size=%u policy=%s) nodes=%zu full=%zu+%zu states=%zu+%zu\n",
              t->cfg.page_size, t->cfg.chunk_size, policy_of(t)->name, t->nodes,
              t->full_evictable, t->full_protected, t->state_evictable, t->state_protected);
    /* The root first (its line is the header above); children are pushed
     * in reverse so they print in sorted order, the stack grown for them. */
    stack[top] = t->root;
    depth[top++] = 0;
    while (top > 0 && !sb.oom) {
        const mr_node *n = stack[--top];
        size_t d = depth[top];
        if (n != t->root) {
            dump_node(t, &sb, n, d);
        }
        if (top + n->nchildren > cap) {
            size_t ncap = (top + n->nchildren) * 2;
            const mr_node **s = MR_REALLOC(stack, ncap * sizeof(*stack));
            if (s == NULL) {
                sb.oom = 1;
                break;
            }
            stack = s;
            size_t *dd = MR_REALLOC(depth, ncap * sizeof(*depth));
            if (dd == NULL) {
                sb.oom = 1;
                break;
            }
            depth = dd;
            cap = ncap;
        }
        for (uint32_t i = n->nent; i-- > 0;) {
            if ((stack[top] = n->children[i].child) != NULL) {
                depth[top++] = d + 1;
            }
        }
    }
    MR_FREE(stack);
    MR_FREE(depth);
    if (sb.oom) {
        MR_FREE(sb.buf);
        return MR_ENOMEM;
    }
    *out = sb.buf;
    *outlen = sb.len;
    return MR_OK;
}
