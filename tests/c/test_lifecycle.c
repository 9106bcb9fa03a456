/* test_lifecycle.c - the pools and the request lifecycle without Python.
 *
 *   --oom       out-of-memory injection (built with -DMR_FAULT_INJECT): every
 *               allocation of a round of batched calls made to fail in turn,
 *               at page sizes 1, 4 and 16, must leave the tree, the pools,
 *               their ownership accounting and the request records valid,
 *               and the call must succeed or report MR_ENOMEM;
 *   --room      pools too small (page sizes 4 and 16): every point where a
 *               batched call takes a row, a state slot or a KV page runs out
 *               of room in turn; a refused batch takes nothing;
 *   --bound     records of the per-request calls in their rows: a match with
 *               copy-on-write before admission, the record moved into its
 *               row, mr_lc_check accepting what a bound row may hold (a
 *               pending copy-on-write source, lengths the caller keeps, a
 *               slot a caller gave the tree) and catching a broken one;
 *   --protect   eviction with a node protected (mr_lc_evict_protected,
 *               tree-only and under mr_lc_alloc_state): the victims are
 *               the least recently used others, handed back once each, the
 *               protected node keeps its state and its path its KV, its
 *               lock is undone, nothing leaks;
 *   (default: all; --oom is skipped without -DMR_FAULT_INJECT).
 * Exits with 1 when a check failed.  tests/c/Makefile builds it in
 * the four variants (plain, ASan+UBSan, fault injection, valgrind).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "lifecycle.h"
#include "lc_batch.h"

static int errors = 0;

#define CHECK(cond, ...)                                 \
    do {                                                 \
        if (!(cond)) {                                   \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                \
            fprintf(stderr, "\n");                       \
            errors++;                                    \
        }                                                \
    } while (0)

typedef struct {
    mr_slots state;
    mr_kv kv;
    mr_reqpool rp;
    mr_lifecycle *lc;
} world;

/* A lifecycle over pools of the given sizes (KV in tokens). */
static int
world_make(world *w, int extra, int lazy, int64_t ps, int64_t slots, int64_t kv_tokens, int64_t rows)
{
    memset(w, 0, sizeof(*w));
    mr_lc_config cfg = {.page_size = (uint32_t)ps, .chunk_size = 16, .policy = MR_POLICY_SGLANG,
                        .extra_buffer = extra, .lazy = lazy, .track_buffer_size = 2, .track_interval = 8};
    if (mr_slots_init(&w->state, slots) != MR_OK || mr_kv_init(&w->kv, kv_tokens, ps) != MR_OK
        || mr_reqpool_init(&w->rp, rows, 256, 2) != MR_OK
        || mr_lc_new(&cfg, &w->state, &w->kv, &w->rp, &w->lc) != MR_OK) {
        return -1;
    }
    return 0;
}

static void
world_free(world *w)
{
    mr_lc_free(w->lc);
    mr_reqpool_destroy(&w->rp);
    mr_kv_destroy(&w->kv);
    mr_slots_destroy(&w->state);
}

static void
check_world(world *w, const char *where)
{
    char msg[512];
    int rc = mr_lc_check(w->lc, msg, sizeof(msg));
    CHECK(rc == MR_OK, "%s: %s", where, msg);
}

/* deterministic keys sharing prefixes */
static void
make_key(int32_t *k, size_t n, int base, int salt)
{
    for (size_t i = 0; i < n; i++) {
        k[i] = (int32_t)(i < 40 ? base * 100 + (int)i : 50000 + salt * 1000 + (int)i);
    }
}

/* Adds what a lifecycle's tree holds to per-unit counts: KV index i to
 * kv[i], state s to st[s - st_base]. */
static void
count_tree_units(mr_lifecycle *lc, int *kv, int *st, int64_t st_base)
{
    mr_radix *t = mr_lc_tree(lc);
    for (mr_node *x = mr_radix_lru_first(t, 0); x != NULL; x = mr_radix_lru_next(t, 0, x)) {
        for (size_t j = 0; j < mr_node_len(x); j++) {
            int64_t v = 0;
            mr_node_values_i64(t, x, j, 1, &v);
            kv[v]++;
        }
        if (mr_node_state(x) >= 0) {
            st[mr_node_state(x) - st_base]++;
        }
    }
}

#ifdef MR_FAULT_INJECT
/* A tree-only lifecycle (no pools) collects what eviction releases.  With
 * an allocation failing at every point of an eviction in turn, what was
 * handed out and what the tree still holds must split the inserted KV
 * indices and states exactly: nothing in both, nothing lost.  (The KV hook
 * reserves room for the node's state, so the state hook cannot fail after
 * the node's KV was handed out.) */
static void
test_tree_only_oom(void)
{
    enum { NK = 12, LEN = 6 };
    long n;
    for (n = 1; n < 10000; n++) {
        mr_lifecycle *lc = NULL;
        mr_lc_config cfg = {.page_size = 1, .chunk_size = 1, .policy = MR_POLICY_SGLANG, .track_buffer_size = 2,
                            .track_interval = 8};
        CHECK(mr_lc_new(&cfg, NULL, NULL, NULL, &lc) == MR_OK, "tree-only init");
        int32_t key[LEN];
        int64_t val[LEN], dup[LEN];
        for (int k = 0; k < NK; k++) {
            for (int j = 0; j < LEN; j++) {
                key[j] = k * 100 + j;
                val[j] = 1 + k * LEN + j;
            }
            mr_insert_result r;
            CHECK(mr_lc_insert(lc, key, val, LEN, 0, 1000 + k, 0, dup, &r, NULL) == MR_OK, "tree-only insert");
        }
        mr_fault_fail_at(n);
        int rc = mr_lc_evict(lc, NK * LEN, 0, NULL, NULL);
        long used = mr_fault_count();
        mr_fault_fail_at(0);
        CHECK(rc == MR_OK || rc == MR_ENOMEM, "tree-only evict: rc %d", rc);
        int seen_kv[1 + NK * LEN] = {0}, seen_st[NK] = {0};
        const int64_t *kv, *st;
        size_t nkv, nst;
        mr_lc_take_released(lc, &kv, &nkv, &st, &nst);
        for (size_t i = 0; i < nkv; i++) {
            seen_kv[kv[i]]++;
        }
        for (size_t i = 0; i < nst; i++) {
            seen_st[st[i] - 1000]++;
        }
        count_tree_units(lc, seen_kv, seen_st, 1000);
        for (int i = 1; i <= NK * LEN; i++) {
            CHECK(seen_kv[i] == 1, "fail_at=%ld: KV %d is held %d times (released + tree)", n, i, seen_kv[i]);
        }
        for (int i = 0; i < NK; i++) {
            CHECK(seen_st[i] == 1, "fail_at=%ld: state %d is held %d times (released + tree)", n, 1000 + i,
                  seen_st[i]);
        }
        char msg[256];
        CHECK(mr_lc_check(lc, msg, sizeof(msg)) == MR_OK, "%s", msg);
        mr_lc_free(lc);
        if (used < n) {
            break;
        }
    }
    printf("oom: tree-only eviction: %ld allocation failure points checked\n", n - 1);
}

static int
world_init(world *w, int extra, int64_t ps)
{
    return world_make(w, extra, 0, ps, 24, ps == 1 ? 600 : 64 * ps, 6);
}

/* One round: a batch of 3 requests through prefill, end-of-prefill
 * caching, 9 decode steps and finish.  Returns the first error code. */
static int
round_trip(world *w, int round)
{
    int32_t keys[3][90];
    const int32_t *kp[3];
    size_t lens[3] = {70, 90, 55};
    for (int i = 0; i < 3; i++) {
        make_key(keys[i], lens[i], i % 2, round * 3 + i);
        kp[i] = keys[i];
    }
    int64_t rows[3], pl[3], cs[3], cd[3], cl[3], ts[3], tl[3];
    uint8_t tm[3];
    mr_lc_prefill_out out = {rows, pl, cs, cd, cl, ts, tm, tl};
    int rc = prefill_batch32(w->lc, 3, kp, lens, NULL, &out);
    if (rc != MR_OK) {
        return rc;
    }
    int64_t fs[3], fd[3];
    rc = unfinished_batch32(w->lc, 3, rows, kp, NULL, fs, fd);
    for (int s = 0; rc == MR_OK && s < 9; s++) {
        rc = mr_lc_decode_batch(w->lc, 3, rows, ts, tm);
    }
    /* finish with keys long enough for the committed lengths */
    int32_t full[3][100];
    const int32_t *fp[3];
    for (int i = 0; i < 3; i++) {
        memcpy(full[i], keys[i], lens[i] * sizeof(int32_t));
        for (size_t j = lens[i]; j < 100; j++) {
            full[i][j] = 7;
        }
        fp[i] = full[i];
    }
    int rc2 = finish_batch32(w->lc, 3, rows, fp, NULL, 1);
    return rc != MR_OK ? rc : rc2;
}

static void
test_oom(int extra, int64_t ps)
{
    /* Fail allocation 1, 2, ... of the round until the round needs fewer. */
    long n;
    for (n = 1; n < 100000; n++) {
        world w;
        if (world_init(&w, extra, ps) != 0) {
            CHECK(0, "init");
            return;
        }
        for (int r = 0; r < 2; r++) {
            (void)round_trip(&w, r);   /* warm: the tree has content */
        }
        mr_fault_fail_at(n);
        int rc = round_trip(&w, 5);
        long used = mr_fault_count();
        mr_fault_fail_at(0);
        CHECK(rc == MR_OK || rc == MR_ENOMEM, "extra=%d ps=%lld fail_at=%ld: rc %d (%s)", extra, (long long)ps,
              n, rc, mr_strerror(rc));
        check_world(&w, "after injected failure");
        world_free(&w);
        if (used < n) {
            break;  /* the failure point is past the last allocation */
        }
    }
    CHECK(n > 3 && n < 100000, "extra=%d: %ld injection points", extra, n);
    printf("oom: extra_buffer=%d page_size=%lld: %ld allocation failure points checked\n", extra, (long long)ps,
           n - 1);
}
#endif

static void
test_double_free_and_tree_owned(void)
{
    mr_slots s;
    CHECK(mr_slots_init(&s, 4) == MR_OK, "init");
    int64_t a[2], bad = -1;
    CHECK(mr_slots_alloc(&s, 2, MR_OWNER_HELD, a) == MR_OK, "alloc");
    CHECK(mr_slots_transfer(&s, a, 1, MR_FROM_CALLER, MR_OWNER_TREE, NULL) == MR_OK, "transfer");
    CHECK(mr_slots_free(&s, a, 2, MR_FROM_CALLER, 0, &bad) == MR_EBUSY && bad == a[0], "tree-owned free");
    CHECK(mr_slots_free(&s, a + 1, 1, MR_FROM_CALLER, 0, NULL) == MR_OK, "free");
    CHECK(mr_slots_free(&s, a + 1, 1, MR_FROM_CALLER, 0, &bad) == MR_ENOENT && bad == a[1], "double free");
    char msg[256];
    CHECK(mr_slots_check(&s, msg, sizeof(msg)) == MR_OK, "%s", msg);
    mr_slots_destroy(&s);
}

/* ------------------------------------------------------------------------
 * Out of room */

/* What callers hold: a refused call must leave it as it was. */
typedef struct {
    int64_t rows_free, st_req, st_held, kv_req, kv_held;
} held;

static held
held_now(const world *w)
{
    held h = {mr_slots_available(&w->rp.rows), w->state.n_req, w->state.n_held, w->kv.pages.n_req,
              w->kv.pages.n_held};
    return h;
}

static int
same_held(held a, held b)
{
    return a.rows_free == b.rows_free && a.st_req == b.st_req && a.st_held == b.st_held && a.kv_req == b.kv_req
           && a.kv_held == b.kv_held;
}

/* A batch call's rows are checked before the first one changes: a row
 * listed twice (which finish_batch used to finish, then refuse at its
 * second entry) or not in use is MR_EINVAL with bad = {entry, -1}, and
 * every row, pool and the tree stay as they were. */
/* Admission of one row twice, a state slot for a row that does not exist,
 * the request's own running slot as the tree's fresh slot: refused, and
 * nothing changes. */
static void
test_refused_owners(void)
{
    world w;
    CHECK(world_make(&w, 0, 0, 1, 8, 64, 4) == 0, "init");
    int64_t row = -1;
    CHECK(mr_slots_alloc(&w.rp.rows, 1, MR_OWNER_HELD, &row) == MR_OK, "row");
    mr_req sts[2];
    mr_req_reset(&sts[0]);
    mr_req_reset(&sts[1]);
    int64_t rows[2] = {row, row};
    held h = held_now(&w);
    CHECK(mr_lc_admit(w.lc, sts, rows, 2, 0) == MR_EINVAL, "admit of one row twice");
    CHECK(same_held(h, held_now(&w)) && sts[0].running == -1 && sts[1].running == -1, "a refused admit took slots");
    int64_t s = -1;
    CHECK(mr_lc_alloc_state(w.lc, 5, NULL, &s) == MR_EINVAL && s == -1, "alloc_state for row 5 of 4");
    CHECK(mr_lc_alloc_state(w.lc, 0, NULL, &s) == MR_EINVAL, "alloc_state for row 0");
    CHECK(same_held(h, held_now(&w)), "a refused alloc_state took a slot");
    CHECK(mr_lc_alloc_state(w.lc, 4, NULL, &s) == MR_OK && s >= 1, "alloc_state for row 4");
    check_world(&w, "after the refusals");
    world_free(&w);

    mr_lifecycle *lc = NULL;
    mr_lc_config cfg = {.page_size = 1, .chunk_size = 1, .policy = MR_POLICY_SGLANG, .track_buffer_size = 2,
                        .track_interval = 8};
    CHECK(mr_lc_new(&cfg, NULL, NULL, NULL, &lc) == MR_OK, "tree-only init");
    mr_req st;
    mr_req_reset(&st);
    st.running = 1;
    int32_t key[3] = {1, 2, 3};
    int64_t kv[3] = {5, 6, 7}, prefix[3], fs, fd, te;
    CHECK(mr_lc_cache_unfinished_ext(lc, &st, key, kv, 3, 0, 1, prefix, &fs, &fd, &te) == MR_EBUSY,
          "the running slot as the tree's fresh slot");
    mr_radix_stats t;
    mr_radix_get_stats(mr_lc_tree(lc), &t);
    CHECK(t.nodes == 0 && st.running == 1, "a refused cache_unfinished changed the tree or the request");
    mr_lc_free(lc);
}

static void
test_batch_rows_checked_first(void)
{
    world w;
    CHECK(world_make(&w, 1, 0, 1, 24, 600, 6) == 0, "init");
    int32_t k0[6] = {1, 2, 3, 4, 5, 6}, k1[6] = {7, 8, 9, 10, 11, 12};
    const int32_t *kp[3] = {k0, k1, k0};
    size_t lens[2] = {6, 6};
    int64_t rows[3], pl[2], cs[2], cd[2], cl[2], ts[2], tl[2], fs[3], fd[3], bad[3];
    uint8_t tm[3];
    mr_lc_prefill_out out = {rows, pl, cs, cd, cl, ts, tm, tl};
    CHECK(prefill_batch32(w.lc, 2, kp, lens, NULL, &out) == MR_OK, "prefill");
    rows[2] = rows[0];
    mr_req r0 = w.rp.req[rows[0]];
    held h = held_now(&w);
    mr_radix_stats t0, t1;
    mr_radix_get_stats(mr_lc_tree(w.lc), &t0);
    CHECK(finish_batch_key(w.lc, 3, rows, kp, NULL, NULL, 1, bad) == MR_EINVAL && bad[0] == 2 && bad[1] == -1,
          "finish_batch of a row listed twice: bad {%lld, %lld}", (long long)bad[0], (long long)bad[1]);
    CHECK(unfinished_batch_key(w.lc, 3, rows, kp, NULL, NULL, fs, fd, bad) == MR_EINVAL && bad[0] == 2,
          "unfinished_batch of a row listed twice");
    CHECK(mr_lc_decode_batch(w.lc, 3, rows, fs, tm) == MR_EINVAL, "decode_batch of a row listed twice");
    int64_t gone[2] = {rows[1], 5};
    CHECK(finish_batch_key(w.lc, 2, gone, kp, NULL, NULL, 1, bad) == MR_EINVAL && bad[0] == 1,
          "finish_batch of a row not in use");
    mr_radix_get_stats(mr_lc_tree(w.lc), &t1);
    CHECK(same_held(h, held_now(&w)) && memcmp(&r0, &w.rp.req[rows[0]], sizeof(r0)) == 0
          && mr_reqpool_in_use(&w.rp, rows[0]) && t1.nodes == t0.nodes && t1.full_evictable == t0.full_evictable,
          "a refused batch call changed something");
    CHECK(finish_batch32(w.lc, 2, rows, kp, NULL, 1) == MR_OK, "finish");
    check_world(&w, "after the refusals");
    world_free(&w);
}

/* A row's table entry past its locked prefix that the insert would store
 * but the tree owns: unfinished_batch and finish_batch refuse it with the
 * entry and position in bad, changing nothing; put right, the row finishes.  The entry is the
 * tree's index right below one of the row's own (read one off it would
 * pass). */
static void
test_batch_refused_table_entry(void)
{
    world w;
    CHECK(world_make(&w, 1, 0, 1, 24, 600, 6) == 0, "init");
    int32_t k0[16], k1[16];
    for (int i = 0; i < 16; i++) {
        k0[i] = 1 + i;
        k1[i] = 101 + i;
    }
    const int32_t *kp[1] = {k1};
    size_t lens[1] = {16};
    int64_t rows[1], pl[1], cs[1], cd[1], cl[1], ts[1], tl[1], bad[3];
    uint8_t tm[1];
    mr_lc_prefill_out out = {rows, pl, cs, cd, cl, ts, tm, tl};
    CHECK(prefill_batch32(w.lc, 1, kp, lens, NULL, &out) == MR_OK && finish_batch32(w.lc, 1, rows, kp, NULL, 1) == MR_OK,
          "cache a key");
    kp[0] = k0;
    CHECK(prefill_batch32(w.lc, 1, kp, lens, NULL, &out) == MR_OK && pl[0] == 0, "prefill");
    int64_t beside = -1, own = -1;
    for (int64_t x = 1; x < 600; x++) {
        int32_t o = 0, o1 = 0;
        if (mr_slots_owner(&w.kv.pages, x, &o) == MR_OK && mr_slots_owner(&w.kv.pages, x + 1, &o1) == MR_OK
            && o == MR_OWNER_TREE && o1 == (int32_t)rows[0]) {
            beside = x;
        }
    }
    CHECK(beside > 0 && mr_reqpool_read(&w.rp, rows[0], 2, 1, &own) == MR_OK, "a tree index beside the row's");
    CHECK(mr_reqpool_write(&w.rp, rows[0], 2, &beside, 1) == MR_OK, "tamper");
    mr_req r0 = w.rp.req[rows[0]];
    held h = held_now(&w);
    int64_t fs[1], fd[1];
    CHECK(unfinished_batch_key(w.lc, 1, rows, kp, NULL, NULL, fs, fd, bad) == MR_EBUSY && bad[0] == 0 && bad[1] == 2
          && bad[2] == 1, "unfinished_batch, a tree-owned table entry: bad {%lld, %lld, %lld}", (long long)bad[0],
          (long long)bad[1], (long long)bad[2]);
    CHECK(finish_batch_key(w.lc, 1, rows, kp, NULL, NULL, 1, bad) == MR_EBUSY && bad[0] == 0 && bad[1] == 2
          && bad[2] == 1, "finish_batch, a tree-owned table entry: bad {%lld, %lld, %lld}", (long long)bad[0],
          (long long)bad[1], (long long)bad[2]);
    CHECK(same_held(h, held_now(&w)) && memcmp(&r0, &w.rp.req[rows[0]], sizeof(r0)) == 0
          && mr_reqpool_in_use(&w.rp, rows[0]), "a refused call changed something");
    CHECK(mr_reqpool_write(&w.rp, rows[0], 2, &own, 1) == MR_OK && finish_batch32(w.lc, 1, rows, kp, NULL, 1) == MR_OK,
          "finish");
    check_world(&w, "after the refusal");
    world_free(&w);
}

/* A decode step of three rows with one free KV token and one evictable
 * (a cached key) is refused before anything is evicted: the key stays. */
static void
test_refused_decode_keeps_the_tree(void)
{
    world w;
    CHECK(world_make(&w, 0, 0, 1, 24, 8, 6) == 0, "init");
    int32_t key = 9, k[3][2] = {{1, 2}, {3, 4}, {5, 6}};
    int64_t val = -1, slot = -1, dup, bad;
    mr_insert_result res;
    CHECK(mr_kv_alloc(&w.kv, 1, MR_OWNER_HELD, &val) == MR_OK
          && mr_lc_alloc_state(w.lc, MR_OWNER_HELD, NULL, &slot) == MR_OK
          && mr_lc_insert(w.lc, &key, &val, 1, 0, slot, 0, &dup, &res, &bad) == MR_OK, "cache a key");
    const int32_t *kp[3] = {k[0], k[1], k[2]};
    size_t lens[3] = {2, 2, 2};
    int64_t rows[3], pl[3], cs[3], cd[3], cl[3], ts[3], tl[3];
    uint8_t tm[3];
    mr_lc_prefill_out out = {rows, pl, cs, cd, cl, ts, tm, tl};
    CHECK(prefill_batch32(w.lc, 3, kp, lens, NULL, &out) == MR_OK && mr_kv_available(&w.kv) == 1, "prefill");
    mr_radix_stats t0, t1;
    mr_radix_get_stats(mr_lc_tree(w.lc), &t0);
    held h = held_now(&w);
    CHECK(t0.full_evictable == 1 && mr_lc_decode_batch(w.lc, 3, rows, ts, tm) == MR_ENOSPC, "a step short of KV");
    mr_radix_get_stats(mr_lc_tree(w.lc), &t1);
    CHECK(t1.full_evictable == 1 && t1.nodes == t0.nodes && mr_kv_available(&w.kv) == 1 && same_held(h, held_now(&w)),
          "a refused decode step evicted the cached key");
    CHECK(finish_batch32(w.lc, 3, rows, kp, NULL, 1) == MR_OK, "finish");
    check_world(&w, "after the refused step");
    world_free(&w);
}

/* The reproducer: three 2-token requests need three KV pages of 4;
 * two are free.  The batch is refused whole, then admitted with a third. */
static void expect_broken(world *w, const char *want, const char *what);

static void
test_batch_in_pages(void)
{
    /* no_buffer needs page size 1, as SGLang's MambaRadixCache asserts */
    {
        mr_slots s;
        mr_kv kv;
        mr_reqpool rp;
        mr_lifecycle *lc = NULL;
        mr_lc_config cfg = {.page_size = 4, .chunk_size = 4, .policy = MR_POLICY_SGLANG, .extra_buffer = 0,
                            .track_buffer_size = 2, .track_interval = 8};
        CHECK(mr_slots_init(&s, 4) == MR_OK && mr_kv_init(&kv, 16, 4) == MR_OK && mr_reqpool_init(&rp, 2, 8, 2) == MR_OK,
              "init");
        CHECK(mr_lc_new(&cfg, &s, &kv, &rp, &lc) == MR_EINVAL && lc == NULL, "no_buffer at page size 4 accepted");
        mr_reqpool_destroy(&rp);
        mr_kv_destroy(&kv);
        mr_slots_destroy(&s);
    }
    /* kv_pages 2: refused; 3: admitted; 3 with one page cached in the tree:
     * admitted once eviction frees a page (counted in pages, not tokens) */
    for (int c = 0; c < 3; c++) {
        int64_t kv_pages = c == 0 ? 2 : 3;
        world w;
        mr_lc_config cfg = {.page_size = 4, .chunk_size = 4, .policy = MR_POLICY_SGLANG, .extra_buffer = 1,
                            .track_buffer_size = 2, .track_interval = 8};
        memset(&w, 0, sizeof(w));
        CHECK(mr_slots_init(&w.state, 32) == MR_OK && mr_kv_init(&w.kv, kv_pages * 4, 4) == MR_OK
                  && mr_reqpool_init(&w.rp, 6, 64, 2) == MR_OK
                  && mr_lc_new(&cfg, &w.state, &w.kv, &w.rp, &w.lc) == MR_OK,
              "init");
        int64_t rows[3], pl[3], cs[3], cd[3], cl[3], ts[3], tl[3];
        uint8_t tm[3];
        mr_lc_prefill_out out = {rows, pl, cs, cd, cl, ts, tm, tl};
        int64_t slots0 = 32;
        if (c == 2) {
            /* 5 tokens: two pages; finishing caches the tracked first page */
            const int32_t k0[5] = {9, 9, 9, 9, 9};
            const int32_t *kp0[1] = {k0};
            size_t len0[1] = {5};
            CHECK(prefill_batch32(w.lc, 1, kp0, len0, NULL, &out) == MR_OK, "warm prefill");
            CHECK(finish_batch32(w.lc, 1, rows, kp0, NULL, 1) == MR_OK, "warm finish");
            CHECK(w.kv.pages.n_tree == 1 && mr_kv_available(&w.kv) == 8, "warm: %lld tree pages, %lld free tokens",
                  (long long)w.kv.pages.n_tree, (long long)mr_kv_available(&w.kv));
            slots0 = mr_slots_available(&w.state);
        }
        int32_t k[3][2] = {{1, 2}, {3, 4}, {5, 6}};
        const int32_t *kp[3] = {k[0], k[1], k[2]};
        size_t lens[3] = {2, 2, 2};
        int rc = prefill_batch32(w.lc, 3, kp, lens, NULL, &out);
        if (c == 0) {
            CHECK(rc == MR_ENOSPC, "2 pages for 3 requests: rc %d", rc);
            CHECK(mr_slots_available(&w.state) == 32 && mr_kv_available(&w.kv) == 8
                      && mr_slots_available(&w.rp.rows) == 6,
                  "a refused batch kept slots %lld, kv %lld, rows %lld", (long long)mr_slots_available(&w.state),
                  (long long)mr_kv_available(&w.kv), (long long)mr_slots_available(&w.rp.rows));
        }
        else {
            CHECK(rc == MR_OK, "3 pages for 3 requests (case %d): rc %d", c, rc);
            CHECK(mr_kv_available(&w.kv) == 0 && w.kv.pages.n_tree == 0
                      && mr_slots_available(&w.state) == slots0 - 9 + (c == 2),
                  "admitted batch (case %d)", c);
        }
        check_world(&w, "batch in pages");
        if (rc == MR_OK) {
            /* a row outside the drop-in (its record in the row, not bound):
             * its maps, what the kernels read, must name its record's slots */
            int64_t r = rows[0], *tmap = w.rp.track_map + r * 2, t0 = tmap[0];
            int32_t sm = w.rp.state_map[r];
            tmap[0] = tmap[1];
            tmap[1] = t0;
            expect_broken(&w, "track map entry 0 differs", "an unbound row's track map entries swapped");
            tmap[1] = tmap[0];
            tmap[0] = t0;
            w.rp.state_map[r] = (int32_t)t0;
            expect_broken(&w, "state map says", "an unbound row's state map naming its track slot");
            w.rp.state_map[r] = sm;
            check_world(&w, "maps restored");
        }
        world_free(&w);
    }
}

/* Which batched call ran out of room, and for what. */
enum { R_PREFILL_ROWS, R_PREFILL_SLOTS, R_PREFILL_KV, R_DECODE_KV, R_UNFINISHED_SLOT, R_ADMITTED, R_N };
static const char *const room_names[R_N] = {"prefill: rows", "prefill: state slots", "prefill: KV pages",
                                            "decode: KV page", "cache_unfinished: state slot",
                                            "(batches admitted)"};

static uint64_t rng_state = 88172645463325252ull;
static uint32_t
rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* Runs rounds of batches over small pools; a refused call must take
 * nothing and leave everything valid.  Counts refusals by cause in hits. */
static void
room_run(int extra, int lazy, int64_t ps, int64_t slots, int64_t kv_pages, int64_t nrows, long *hits)
{
    world w;
    if (world_make(&w, extra, lazy, ps, slots, kv_pages * ps, nrows) != 0) {
        CHECK(0, "init");
        world_free(&w);
        return;
    }
    enum { NB = 3, MAXLEN = 96 };
    int32_t keys[NB][MAXLEN + 40];
    const int32_t *kp[NB];
    for (int round = 0; round < 6; round++) {
        size_t n = 1 + rnd(NB), lens[NB];
        for (size_t i = 0; i < n; i++) {
            lens[i] = 1 + rnd(MAXLEN);
            make_key(keys[i], lens[i] + 40, (int)rnd(3), (int)rnd(4));
            kp[i] = keys[i];
        }
        int64_t rows[NB], pl[NB], cs[NB], cd[NB], cl[NB], ts[NB], tl[NB];
        uint8_t tm[NB];
        mr_lc_prefill_out out = {rows, pl, cs, cd, cl, ts, tm, tl};
        held before = held_now(&w);
        int64_t kv_free = mr_kv_available(&w.kv), st_free = mr_slots_available(&w.state);
        mr_radix_stats ts0;
        mr_radix_get_stats(mr_lc_tree(w.lc), &ts0);
        int rc = prefill_batch32(w.lc, n, kp, lens, NULL, &out);
        check_world(&w, "prefill_batch");
        if (rc != MR_OK) {
            mr_radix_stats ts1;
            mr_radix_get_stats(mr_lc_tree(w.lc), &ts1);
            CHECK(rc == MR_ENOSPC, "prefill_batch: rc %d", rc);
            CHECK(same_held(before, held_now(&w)), "a refused prefill batch took something");
            CHECK(mr_kv_available(&w.kv) == kv_free && mr_slots_available(&w.state) == st_free
                  && ts1.full_evictable == ts0.full_evictable && ts1.state_evictable == ts0.state_evictable
                  && ts1.nodes == ts0.nodes, "a refused prefill batch evicted or split");
            /* the cause: rows, else state slots when short even of every
             * unlocked state (the batch's own matches may lock more) */
            if ((int64_t)n > before.rows_free) {
                hits[R_PREFILL_ROWS]++;
            }
            else if ((int64_t)n * (1 + (extra ? (lazy ? 1 : 2) : 0)) > st_free + (int64_t)ts0.state_evictable) {
                hits[R_PREFILL_SLOTS]++;
            }
            else {
                hits[R_PREFILL_KV]++;
            }
            continue;
        }
        hits[R_ADMITTED]++;
        int64_t fs[NB], fd[NB];
        rc = unfinished_batch32(w.lc, n, rows, kp, NULL, fs, fd);
        check_world(&w, "unfinished_batch");
        if (rc != MR_OK) {
            CHECK(rc == MR_ENOSPC, "unfinished_batch: rc %d", rc);
            hits[R_UNFINISHED_SLOT]++;
        }
        for (int s = 0; s < 40; s++) {
            int64_t committed[NB];
            for (size_t i = 0; i < n; i++) {
                committed[i] = w.rp.req[rows[i]].committed;
            }
            before = held_now(&w);
            rc = mr_lc_decode_batch(w.lc, n, rows, ts, tm);
            check_world(&w, "decode_batch");
            if (rc != MR_OK) {
                CHECK(rc == MR_ENOSPC, "decode_batch: rc %d", rc);
                CHECK(same_held(before, held_now(&w)), "a refused decode step took something");
                for (size_t i = 0; i < n; i++) {
                    CHECK(w.rp.req[rows[i]].committed == committed[i], "a refused decode step advanced a row");
                }
                hits[R_DECODE_KV]++;
                break;
            }
        }
        rc = finish_batch32(w.lc, n, rows, kp, NULL, 1);
        CHECK(rc == MR_OK, "finish_batch: rc %d", rc);
        check_world(&w, "finish_batch");
        CHECK(w.state.n_req == 0 && w.kv.pages.n_req == 0 && mr_slots_available(&w.rp.rows) == nrows,
              "finished requests left units behind");
    }
    world_free(&w);
}

static void
test_out_of_room(void)
{
    const int64_t pss[2] = {4, 16};
    for (int p = 0; p < 2; p++) {
        long hits[R_N] = {0};
        long runs = 0;
        /* no_buffer needs page size 1 (as SGLang's MambaRadixCache asserts) */
        for (int mode = 1; mode < 3; mode++) {
            int extra = mode > 0, lazy = mode == 2;
            for (int64_t nrows = 1; nrows <= 3; nrows++) {
                for (int64_t slots = 1; slots <= 10; slots++) {
                    for (int64_t kv_pages = 1; kv_pages <= 3 + 96 / pss[p]; kv_pages += 1) {
                        room_run(extra, lazy, pss[p], slots, kv_pages, nrows, hits);
                        runs++;
                    }
                }
            }
        }
        printf("room: page_size=%lld: %ld pool shapes;", (long long)pss[p], runs);
        for (int r = 0; r < R_N; r++) {
            printf(" %s %ld%s", room_names[r], hits[r], r + 1 < R_N ? "," : "\n");
            CHECK(hits[r] > 0, "page_size=%lld: %s never ran out", (long long)pss[p], room_names[r]);
        }
    }
}

/* ------------------------------------------------------------------------
 * Records of the per-request calls, bound to their rows */

static void
expect_broken(world *w, const char *want, const char *what)
{
    char msg[512] = "";
    int rc = mr_lc_check(w->lc, msg, sizeof(msg));
    CHECK(rc == MR_ECORRUPT && strstr(msg, want) != NULL, "%s: not caught (want \"%s\", got \"%s\")", what, want,
          msg);
}

static void
test_bound_records(void)
{
    world w;
    CHECK(world_make(&w, 1, 0, 1, 16, 256, 4) == 0, "world");
    enum { L = 8 };
    int32_t key[L + 4];
    int64_t kv[L + 4], idx[L + 4], s = -1;
    make_key(key, L + 4, 3, 1);
    mr_insert_result ir;
    CHECK(mr_kv_alloc(&w.kv, L, MR_OWNER_HELD, kv) == MR_OK && mr_slots_alloc(&w.state, 1, MR_OWNER_HELD, &s) == MR_OK,
          "units for a cached prefix");
    CHECK(mr_lc_insert(w.lc, key, kv, L, 0, s, 0, NULL, &ir, NULL) == MR_OK, "insert");
    /* 0. a value listing a KV index twice past the tree's prefix (a
     *    duplicate the insert would free twice) is refused before the tree
     *    changes: nothing moves */
    {
        int64_t v[L + 4], s2 = -1, bad = -1;
        CHECK(mr_kv_alloc(&w.kv, L + 4, MR_OWNER_HELD, v) == MR_OK
              && mr_slots_alloc(&w.state, 1, MR_OWNER_HELD, &s2) == MR_OK, "units for a longer key");
        v[3] = v[1];
        held before = held_now(&w);
        mr_radix_stats t0, t1;
        memset(&t0, 0, sizeof(t0));
        memset(&t1, 0, sizeof(t1));
        mr_radix_get_stats(mr_lc_tree(w.lc), &t0);
        CHECK(mr_lc_insert(w.lc, key, v, L + 4, 0, s2, 0, NULL, &ir, &bad) == MR_EINVAL && bad == 3,
              "a repeated duplicate: refused at value[3] (bad %lld)", (long long)bad);
        mr_radix_get_stats(mr_lc_tree(w.lc), &t1);
        CHECK(same_held(before, held_now(&w)) && memcmp(&t0, &t1, sizeof(t0)) == 0 && w.kv.pages.n_tree == L
              && w.state.n_tree == 1, "the refused insert changed nothing");
        check_world(&w, "after a refused insert");
        CHECK(mr_kv_free(&w.kv, v, 3, MR_FROM_CALLER, NULL) == MR_OK
              && mr_kv_free(&w.kv, v + 4, L, MR_FROM_CALLER, NULL) == MR_OK
              && mr_slots_free(&w.state, &s2, 1, MR_FROM_CALLER, 0, NULL) == MR_OK, "give them back");
    }
    /* 1. match with copy-on-write before admission: the record is the
     *    caller's, its slot held */
    mr_req st;
    mr_req_reset(&st);
    mr_match m;
    CHECK(match32(w.lc, key, L, 0, 1, &st, MR_OWNER_HELD, &m, idx) == MR_OK && st.cow_src == s && st.running >= 1,
          "match with copy-on-write");
    CHECK(mr_radix_lock(mr_lc_tree(w.lc), m.node) == MR_OK, "the scheduler's lock");
    /* 2. admission, then the record moves into the row */
    int64_t row = -1;
    CHECK(mr_lc_admit(w.lc, &st, &row, 1, 0) == MR_OK && row >= 1, "admit");
    st.protected_len = L;
    st.branching_seqlen = -1;
    CHECK(mr_reqpool_bind(&w.rp, row, &st) == MR_OK, "bind");
    check_world(&w, "a bound row with a pending copy-on-write source");
    /* 3. what a bound row may not hold */
    mr_req keep = w.rp.req[row];
    int64_t freeslot = -1;
    CHECK(mr_slots_alloc(&w.state, 1, MR_OWNER_HELD, &freeslot) == MR_OK
          && mr_slots_free(&w.state, &freeslot, 1, MR_FROM_CALLER, 0, NULL) == MR_OK, "a free slot");
    w.rp.req[row].cow_src = freeslot;
    expect_broken(&w, "pending copy-on-write source", "a copy-on-write source that is not a tree state");
    w.rp.req[row] = keep;
    w.rp.bound[row] = 0;
    expect_broken(&w, "keeps a copy-on-write source between calls", "an unbound row with a copy-on-write source");
    w.rp.bound[row] = MR_ROW_BOUND;
    w.rp.req[row].committed = 3;
    expect_broken(&w, "Q5: bound row", "a bound row with a committed length");
    w.rp.req[row] = keep;
    w.rp.req[row].protected_len = w.rp.max_ctx + 1;
    expect_broken(&w, "Q5: bound row", "a bound row's protected length past the table");
    w.rp.req[row] = keep;
    int64_t t1 = w.rp.track_map[row * 2 + 1];
    w.rp.track_map[row * 2 + 1] = keep.running;  /* the track map is the row's track storage */
    expect_broken(&w, "holds slot", "a track map entry naming the running slot");
    w.rp.track_map[row * 2 + 1] = freeslot;
    expect_broken(&w, "is not owned by it", "a track map entry naming a free slot");
    w.rp.track_map[row * 2 + 1] = t1;
    check_world(&w, "restored");
    /* 4. the forward consumed the copy-on-write; a caller inserts the
     *    request's running slot itself (SGLang's tests do): the record keeps
     *    naming it, which the check accepts, also once it is evicted */
    mr_req cur;
    mr_reqpool_load(&w.rp, row, &cur);
    cur.cow_src = -1;
    mr_reqpool_store(&w.rp, row, &cur);
    CHECK(mr_kv_alloc(&w.kv, L + 4, MR_OWNER_HELD, kv) == MR_OK, "KV");
    int32_t key2[L + 4];
    make_key(key2, L + 4, 7, 2);
    CHECK(mr_lc_insert(w.lc, key2, kv, L + 4, 0, cur.running, 0, NULL, &ir, NULL) == MR_OK && !ir.state_existed, "insert");
    CHECK(w.rp.bound[row] == (MR_ROW_BOUND | MR_ROW_GAVE_RUNNING), "the running slot is marked given");
    check_world(&w, "a bound row naming the slot it gave the tree");
    CHECK(mr_lc_evict(w.lc, 0, 16, NULL, NULL) == MR_OK, "evict the unlocked states");
    check_world(&w, "a bound row naming a slot given and evicted");
    w.rp.bound[row] = MR_ROW_BOUND;
    expect_broken(&w, "is not owned by it", "a given slot not marked");
    w.rp.bound[row] |= MR_ROW_GAVE_RUNNING;
    /* 5. the record moves out with the row */
    mr_req out;
    CHECK(mr_reqpool_free_record(&w.rp, row, &out) == MR_OK && out.running == cur.running && out.protected_len == L,
          "free: the record comes out");
    CHECK(mr_radix_unlock(mr_lc_tree(w.lc), m.node) == MR_OK, "unlock");
    int64_t mine[2] = {out.track[0], out.track[1]};
    CHECK(mr_slots_free(&w.state, mine, 2, MR_FROM_CALLER, 0, NULL) == MR_OK, "the track slots");
    check_world(&w, "after the row was freed");
    w.rp.bound[row] = MR_ROW_BOUND;
    expect_broken(&w, "is bound", "a free row still bound");
    w.rp.bound[row] = 0;
    world_free(&w);
}

/* ------------------------------------------------------------------------
 * Eviction with a node protected */

enum { PK = 6, PL = 4 };

/* What a tree-only lifecycle handed back so far plus what its tree holds:
 * every KV index 1 .. PK * PL and state 100 .. 100 + PK - 1 exactly once. */
typedef struct {
    int kv[1 + PK * PL];
    int st[PK];
    size_t nkv, nst;   /* handed back so far */
} ledger;

static void
ledger_take(ledger *g, mr_lifecycle *lc, size_t tokens, size_t states, const char *where)
{
    const int64_t *kv, *st;
    size_t nkv, nst;
    mr_lc_take_released(lc, &kv, &nkv, &st, &nst);
    CHECK(nkv == tokens && nst == states, "%s: %zu KV / %zu states handed back, counted %zu / %zu", where, nkv,
          nst, tokens, states);
    for (size_t i = 0; i < nkv; i++) {
        CHECK(kv[i] >= 1 && kv[i] <= PK * PL, "%s: KV %lld handed back", where, (long long)kv[i]);
        if (kv[i] >= 1 && kv[i] <= PK * PL) {
            g->kv[kv[i]]++;
        }
    }
    for (size_t i = 0; i < nst; i++) {
        CHECK(st[i] >= 100 && st[i] < 100 + PK, "%s: state %lld handed back", where, (long long)st[i]);
        if (st[i] >= 100 && st[i] < 100 + PK) {
            g->st[st[i] - 100]++;
        }
    }
    g->nkv += nkv;
    g->nst += nst;
    mr_lc_clear_released(lc);
}

static void
ledger_check(const ledger *g, mr_lifecycle *lc, const char *where)
{
    int kv[1 + PK * PL], st[PK];
    memcpy(kv, g->kv, sizeof(kv));
    memcpy(st, g->st, sizeof(st));
    count_tree_units(lc, kv, st, 100);
    for (int i = 1; i <= PK * PL; i++) {
        CHECK(kv[i] == 1, "%s: KV %d is held %d times (handed back + tree)", where, i, kv[i]);
    }
    for (int i = 0; i < PK; i++) {
        CHECK(st[i] == 1, "%s: state %d is held %d times (handed back + tree)", where, 100 + i, st[i]);
    }
    mr_radix_stats s;
    mr_radix_get_stats(mr_lc_tree(lc), &s);
    CHECK(s.full_protected == 0 && s.state_protected == 0, "%s: a lock stayed (%zu KV, %zu states protected)",
          where, s.full_protected, s.state_protected);
    char msg[256];
    CHECK(mr_lc_check(lc, msg, sizeof(msg)) == MR_OK, "%s: %s", where, msg);
}

/* The nodes that hold a state, least recently used first. */
static size_t
states_lru(mr_lifecycle *lc, mr_node **out, size_t cap)
{
    mr_radix *t = mr_lc_tree(lc);
    size_t n = 0;
    for (mr_node *x = mr_radix_lru_first(t, 1); x != NULL && n < cap; x = mr_radix_lru_next(t, 1, x)) {
        out[n++] = x;
    }
    for (size_t i = 0; i < n / 2; i++) {
        mr_node *y = out[i];
        out[i] = out[n - 1 - i];
        out[n - 1 - i] = y;
    }
    return n;
}

/* A tree-only lifecycle with key 0 (state 100), key 1 under it (101) and
 * keys 2 .. PK-1 beside them, each PL tokens of KV 1 + k * PL ...; *a is
 * key 0's node, *b key 1's. */
static mr_lifecycle *
protect_tree(mr_node **a, mr_node **b)
{
    mr_lifecycle *lc = NULL;
    mr_lc_config cfg = {.page_size = 1, .chunk_size = 1, .policy = MR_POLICY_SGLANG, .track_buffer_size = 2,
                        .track_interval = 8};
    CHECK(mr_lc_new(&cfg, NULL, NULL, NULL, &lc) == MR_OK, "tree-only init");
    int32_t key[2 * PL];
    int64_t val[2 * PL], dup[2 * PL];
    for (int k = 0; k < PK; k++) {
        size_t len = k == 1 ? 2 * PL : PL;
        for (size_t j = 0; j < len; j++) {
            int owner = k == 1 && j < PL ? 0 : k;   /* key 1 extends key 0 */
            key[j] = owner * 100 + (int32_t)j;
            val[j] = owner == k ? 1 + k * PL + (int64_t)(j % PL) : 1 + (int64_t)j;
        }
        mr_insert_result r;
        CHECK(mr_lc_insert(lc, key, val, len, 0, 100 + k, k == 1 ? PL : 0, dup, &r, NULL) == MR_OK && !r.state_existed,
              "insert key %d", k);
        if (k <= 1) {
            *(k == 0 ? a : b) = r.node;
        }
    }
    return lc;
}

static void
test_evict_protected(void)
{
    mr_node *a = NULL, *b = NULL, *lru[PK];
    ledger g;
    /* 1. each state protected in turn: the victims are the least recently
     *    used others; a leaf goes with its KV, key 0 (it has a child) keeps
     *    its KV */
    for (int p = 0; p < PK; p++) {
        for (size_t k = 1; k <= PK; k++) {
            memset(&g, 0, sizeof(g));
            mr_lifecycle *lc = protect_tree(&a, &b);
            size_t n = states_lru(lc, lru, PK);
            CHECK(n == PK, "%zu states", n);
            mr_node *prot = NULL;
            for (size_t i = 0; i < n; i++) {
                if (mr_node_state(lru[i]) == 100 + p) {
                    prot = lru[i];
                }
            }
            mr_handle h = mr_node_handle(prot);
            size_t want_s = 0;
            int64_t want[PK];
            for (size_t i = 0; i < n && want_s < k; i++) {
                if (lru[i] != prot) {
                    want[want_s++] = mr_node_state(lru[i]);
                }
            }
            size_t t = 0, s = 0;
            CHECK(mr_lc_evict_protected(lc, 0, k, prot, &t, &s) == MR_OK, "evict %zu protecting %d", k, p);
            CHECK(s == want_s, "protecting %d, %zu asked: %zu states went, want %zu", p, k, s, want_s);
            const int64_t *kvp, *stp;
            size_t nkv, nst;
            mr_lc_take_released(lc, &kvp, &nkv, &stp, &nst);   /* looked at, kept for the ledger */
            for (size_t i = 0; i < nst && i < want_s; i++) {
                CHECK(stp[i] == want[i], "protecting %d: victim %zu is state %lld, want %lld", p, i,
                      (long long)stp[i], (long long)want[i]);
            }
            mr_node *again = NULL;
            CHECK(mr_radix_resolve(mr_lc_tree(lc), h, &again) == MR_OK && again == prot
                  && mr_node_state(prot) == 100 + p, "protecting %d: its state went", p);
            ledger_take(&g, lc, t, s, "protected eviction");
            ledger_check(&g, lc, "protected eviction");
            mr_lc_free(lc);
        }
    }
    /* 2. tokens too: with key 1 protected, every other leaf goes; key 0 is
     *    its path and keeps its KV (its state is not protected) */
    memset(&g, 0, sizeof(g));
    mr_lifecycle *lc = protect_tree(&a, &b);
    size_t t = 0, s = 0;
    CHECK(mr_lc_evict_protected(lc, 1000, 1000, b, &t, &s) == MR_OK, "evict all protecting key 1");
    CHECK(t == (PK - 2) * PL && s == PK - 1, "protecting key 1: %zu KV / %zu states went", t, s);
    CHECK(mr_node_state(b) == 101 && mr_node_state(a) == -1 && mr_node_nchildren(a) == 1,
          "key 1 keeps its state, key 0 its KV");
    ledger_take(&g, lc, t, s, "everything but a protected path");
    ledger_check(&g, lc, "everything but a protected path");
    /* nothing else to take: the protected node stays, and so does its lock count */
    CHECK(mr_lc_evict_protected(lc, 1000, 1000, b, &t, &s) == MR_OK && t == 0 && s == 0, "nothing left to evict");
    ledger_take(&g, lc, 0, 0, "nothing left");
    ledger_check(&g, lc, "nothing left");
    /* 3. a caller's own lock is kept too; unprotected, the rest goes */
    CHECK(mr_radix_lock(mr_lc_tree(lc), b) == MR_OK, "a caller's lock");
    CHECK(mr_lc_evict_protected(lc, 1000, 1000, b, &t, &s) == MR_OK && t == 0 && s == 0, "locked twice");
    CHECK(mr_node_state_lock(b) == 1 && mr_node_full_lock(a) == 1, "the caller's lock is still there");
    CHECK(mr_radix_unlock(mr_lc_tree(lc), b) == MR_OK, "unlock");
    CHECK(mr_lc_evict(lc, 1000, 1000, &t, &s) == MR_OK && t == 2 * PL && s == 1, "the rest, unprotected");
    ledger_take(&g, lc, t, s, "the rest");
    ledger_check(&g, lc, "the rest");
    mr_lc_free(lc);

    /* 4. mr_lc_alloc_state over pools takes the same step: a full state
     *    pool, the least recently used state protected */
    world w;
    CHECK(world_make(&w, 1, 0, 1, 4, 256, 2) == 0, "world");
    int32_t key[PL];
    int64_t kv[PL], slot[4], got = -1;
    mr_node *nodes[4];
    for (int k = 0; k < 4; k++) {
        make_key(key, PL, k, k);
        mr_insert_result r;
        CHECK(mr_kv_alloc(&w.kv, PL, MR_OWNER_HELD, kv) == MR_OK
              && mr_slots_alloc(&w.state, 1, MR_OWNER_HELD, &slot[k]) == MR_OK
              && mr_lc_insert(w.lc, key, kv, PL, 0, slot[k], 0, NULL, &r, NULL) == MR_OK, "cache key %d", k);
        nodes[k] = r.node;
    }
    CHECK(states_lru(w.lc, lru, PK) == 4 && lru[0] == nodes[0], "key 0 is the least recently used");
    CHECK(mr_lc_alloc_state(w.lc, MR_OWNER_HELD, nodes[0], &got) == MR_OK && got == slot[1],
          "protecting key 0, key 1's slot comes back (got %lld)", (long long)got);
    CHECK(mr_node_state(nodes[0]) == slot[0] && mr_node_state_lock(nodes[0]) == 0, "key 0 kept, unlocked");
    check_world(&w, "alloc_state protecting the LRU state");
    /* every other state locked: nothing to take, nothing changes */
    CHECK(mr_radix_lock(mr_lc_tree(w.lc), nodes[2]) == MR_OK && mr_radix_lock(mr_lc_tree(w.lc), nodes[3]) == MR_OK,
          "locks");
    int64_t none = -1;
    CHECK(mr_lc_alloc_state(w.lc, MR_OWNER_HELD, nodes[0], &none) == MR_ENOSPC && none == -1, "no slot to be had");
    CHECK(mr_node_state(nodes[0]) == slot[0] && mr_node_state_lock(nodes[0]) == 0, "key 0 kept, unlocked");
    check_world(&w, "alloc_state refused");
    /* unprotected, key 0 goes */
    CHECK(mr_lc_alloc_state(w.lc, MR_OWNER_HELD, NULL, &none) == MR_OK && none == slot[0], "key 0's slot");
    check_world(&w, "alloc_state unprotected");
    CHECK(mr_radix_unlock(mr_lc_tree(w.lc), nodes[2]) == MR_OK && mr_radix_unlock(mr_lc_tree(w.lc), nodes[3]) == MR_OK,
          "unlocks");
    int64_t mine[2] = {got, none};
    CHECK(mr_slots_free(&w.state, mine, 2, MR_FROM_CALLER, 0, NULL) == MR_OK, "the slots back");
    check_world(&w, "after");
    world_free(&w);
    printf("protect: evictions with a node protected checked\n");
}

/* An insert's values mixing units the caller holds straight from the
 * allocator (HELD) and units of a request row (REQ): the new tokens' units
 * go to the tree and the duplicates' are freed, each call told how many
 * are HELD (sanitized builds verify each count and abort on a wrong one).
 * The duplicates are the longer part in one insert, the shorter in the
 * next; the class counts after each are written out by hand. */
static void
test_insert_counts(void)
{
    int32_t key[120];
    int64_t v[120], s = -1;
    world w;
    CHECK(world_make(&w, 1, 0, 1, 16, 4096, 4) == 0, "world");
    for (int k = 0; k < 3; k++) {
        /* key 0: 100 tokens; key 1: its first 90 and 30 of its own (90
         * duplicates, 30 new); key 2: its first 10 and 100 of its own (10
         * duplicates, 100 new) */
        size_t len = k == 0 ? 100 : k == 1 ? 120 : 110, shared = k == 0 ? 0 : k == 1 ? 90 : 10;
        for (size_t i = 0; i < len; i++) {
            key[i] = (int32_t)(k == 0 || i < shared ? 1000 + i : 1000 * (k + 1) + 10000 + i);
        }
        /* even positions HELD, odd ones REQ(1) */
        for (size_t i = 0; i < len; i += 2) {
            CHECK(mr_slots_alloc(&w.kv.pages, 1, MR_OWNER_HELD, &v[i]) == MR_OK, "a HELD unit");
            if (i + 1 < len) {
                CHECK(mr_slots_alloc(&w.kv.pages, 1, 1, &v[i + 1]) == MR_OK, "a REQ unit");
            }
        }
        CHECK(mr_slots_alloc(&w.state, 1, MR_OWNER_HELD, &s) == MR_OK, "a state");
        const int64_t held0 = w.kv.pages.n_held, req0 = w.kv.pages.n_req, tree0 = w.kv.pages.n_tree;
        const int64_t free0 = w.kv.pages.count;
        mr_insert_result ir;
        CHECK(mr_lc_insert(w.lc, key, v, len, 0, s, 0, NULL, &ir, NULL) == MR_OK, "insert %d", k);
        CHECK(ir.prefix_len == shared && ir.ndup == shared, "insert %d: prefix %zu, %zu duplicates", k,
              ir.prefix_len, ir.ndup);
        const int64_t held = (int64_t)(len + 1) / 2, req = (int64_t)len / 2;
        CHECK(w.kv.pages.n_held == held0 - held && w.kv.pages.n_req == req0 - req
              && w.kv.pages.n_tree == tree0 + (int64_t)(len - shared) && w.kv.pages.count == free0 + (int64_t)shared,
              "insert %d: held %lld, req %lld, tree %lld, free %lld", k, (long long)w.kv.pages.n_held,
              (long long)w.kv.pages.n_req, (long long)w.kv.pages.n_tree, (long long)w.kv.pages.count);
        for (size_t i = 0; i < len; i++) {
            int32_t o = 0;
            CHECK(mr_slots_owner(&w.kv.pages, v[i], &o) == MR_OK && o == (i < shared ? MR_OWNER_FREE : MR_OWNER_TREE),
                  "insert %d: value[%zu] owned by %d", k, i, o);
        }
        check_world(&w, "after an insert of HELD and REQ units");
    }
    /* a unit an open alloc group holds for its next alloc(1) is HELD, but
     * no caller has it: an insert naming it is refused, nothing moves */
    {
        int64_t got = -1, held0 = w.kv.pages.n_held, tree0 = w.kv.pages.n_tree, bad = -1;
        mr_slots_group_begin(&w.kv.pages, 3);
        CHECK(mr_slots_alloc(&w.kv.pages, 1, MR_OWNER_HELD, &got) == MR_OK, "the group's first unit");
        int64_t val[2] = {got, w.kv.pages.group[w.kv.pages.group_pos]};
        int32_t k2[2] = {77, 78};
        mr_insert_result ir;
        CHECK(mr_slots_alloc(&w.state, 1, MR_OWNER_HELD, &s) == MR_OK, "a state");
        CHECK(mr_lc_insert(w.lc, k2, val, 2, 0, s, 0, NULL, &ir, &bad) == MR_EBUSY && bad == 1,
              "a unit the alloc group has not handed out: refused at value[1] (bad %lld)", (long long)bad);
        CHECK(w.kv.pages.n_held == held0 + 3 && w.kv.pages.n_tree == tree0, "the refused insert moved nothing");
        mr_slots_group_end(&w.kv.pages);
        CHECK(mr_slots_alloc(&w.kv.pages, 1, MR_OWNER_HELD, &val[1]) == MR_OK
              && mr_lc_insert(w.lc, k2, val, 2, 0, s, 0, NULL, &ir, NULL) == MR_OK && w.kv.pages.n_tree == tree0 + 2,
              "once handed out, accepted");
        check_world(&w, "after the alloc group");
    }
    world_free(&w);
    printf("counts: inserts of HELD and REQ units counted; an alloc group's unit refused\n");
}

/* A victim policy that names none (and counts its calls). */
static int
no_victim(void *ctx, const mr_node *protect, mr_node **victim)
{
    (void)protect;
    (*(int *)ctx)++;
    *victim = NULL;
    return MR_OK;
}

/* Counted pools (a tree-only lifecycle without values, the simulator's):
 * takes, frees and refusals worked by hand at page size 4. */
static void
test_counted_pools(void)
{
    mr_lifecycle *lc = NULL;
    mr_lc_config cfg = {.page_size = 4, .chunk_size = 16, .policy = MR_POLICY_SGLANG, .extra_buffer = 1,
                        .track_buffer_size = 2, .track_interval = 32, .no_values = 1};
    CHECK(mr_lc_new(&cfg, NULL, NULL, NULL, &lc) == MR_OK, "counted: init");
    CHECK(mr_lc_counts_of(lc) == NULL && mr_lc_count_kv(lc, 1, 1) == MR_ESTATE, "counted: not counting yet");
    CHECK(mr_lc_count_pools(lc, 30, 3, 2) == MR_OK, "counted: count_pools");
    CHECK(mr_lc_count_pools(lc, 30, 3, 2) == MR_EINVAL, "counted: counting twice refused");
    const mr_lc_counts *c = mr_lc_counts_of(lc);
    CHECK(c->kv_total == 28 && c->kv_free == 28, "counted: KV in whole pages (%lld)", (long long)c->kv_total);
    CHECK(mr_lc_count_admit(lc, 1, 0, 1) == MR_OK && c->rows_free == 1, "counted: a row taken");
    CHECK(mr_lc_count_kv(lc, 12, 12) == MR_OK && c->kv_free == 16 && c->peak_kv == 12, "counted: 12 tokens taken");
    CHECK(mr_lc_count_kv(lc, 20, 20) == MR_ENOSPC && c->kv_free == 16, "counted: a refused take takes nothing");
    CHECK(mr_lc_count_free_row(lc, 5, 4) == MR_EINVAL, "counted: allocated below committed refused");
    /* committed 5 (2 pages), allocated 9 (3 pages): one page back */
    CHECK(mr_lc_count_free_row(lc, 5, 9) == MR_OK && c->kv_free == 20 && c->rows_free == 2,
          "counted: free_row gave back %lld KV", (long long)c->kv_free - 16);
    CHECK(mr_lc_count_free_row(lc, 0, 0) == MR_EINVAL, "counted: no row in use");
    int64_t id = 0;
    for (int64_t i = 1; i <= 3; i++) {
        CHECK(mr_lc_count_slot(lc, NULL, &id) == MR_OK && id == i, "counted: slot %lld", (long long)i);
    }
    CHECK(mr_lc_count_slot(lc, NULL, &id) == MR_ENOSPC && c->slots_free == 0 && c->peak_slots == 3,
          "counted: no fourth slot");
    /* a cached state (slot 3, 4 of the tokens in use) for the policy to be asked about */
    int32_t key[4] = {7, 7, 7, 7};
    int64_t val[4] = {0}, dup[4];
    mr_insert_result ins;
    CHECK(mr_lc_insert(lc, key, val, 4, 0, 3, 0, dup, &ins, NULL) == MR_OK, "counted: insert");
    CHECK(mr_lc_count_admit(lc, 1, 2, 1) == MR_ENOSPC && c->rows_free == 2,
          "counted: more slots than free and evictable refused before evicting");
    int asked = 0;
    mr_lc_count_set_victims(lc, no_victim, &asked);
    CHECK(mr_lc_count_admit(lc, 1, 1, 1) == MR_ENOSPC && asked == 1 && c->rows_free == 2,
          "counted: a policy that names no victim stops the eviction (asked %d)", asked);
    char msg[256];
    CHECK(mr_lc_check(lc, msg, sizeof(msg)) == MR_OK, "%s", msg);
    mr_lc_free(lc);
    printf("counted: counted pools checked\n");
}

int
main(int argc, char **argv)
{
    int oom = 1, room = 1, bound = 1, protect = 1;
    if (argc > 1) {
        oom = room = bound = protect = 0;
        for (int i = 1; i < argc; i++) {
            oom |= strcmp(argv[i], "--oom") == 0;
            room |= strcmp(argv[i], "--room") == 0;
            bound |= strcmp(argv[i], "--bound") == 0;
            protect |= strcmp(argv[i], "--protect") == 0;
        }
    }
    test_double_free_and_tree_owned();
    test_insert_counts();
    test_counted_pools();
    test_batch_rows_checked_first();
    test_batch_refused_table_entry();
    test_refused_owners();
    test_refused_decode_keeps_the_tree();
    if (bound) {
        test_bound_records();
    }
    if (protect) {
        test_evict_protected();
    }
    if (room) {
        test_batch_in_pages();
        test_out_of_room();
    }
#ifdef MR_FAULT_INJECT
    if (oom) {
        test_tree_only_oom();
        const int64_t pss[3] = {1, 4, 16};
        for (int p = 0; p < 3; p++) {
            test_oom(1, pss[p]);
            if (pss[p] == 1) {
                test_oom(0, pss[p]);
            }
        }
    }
#else
    (void)oom;
#endif
    printf("%s: %d failed checks\n", errors == 0 ? "passed" : "FAILED", errors);
    return errors != 0;  /* not the count: 256 failures would exit 0 */
}
