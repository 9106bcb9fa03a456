/* test_lifecycle.c - the pools and the request lifecycle without Python:
 * out-of-memory injection (every allocation of a batch of operations made
 * to fail in turn) must leave the tree, the pools and their ownership
 * accounting valid, and the operation must either succeed or report
 * MR_ENOMEM.  Built with -DMR_FAULT_INJECT; exits with the error count.
 *
 *   cc -std=c11 -DMR_FAULT_INJECT -Icsrc tests/c/test_lifecycle.c \
 *      csrc/slot_alloc.c csrc/req_pool.c csrc/lifecycle.c csrc/radix.c csrc/common.c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "lifecycle.h"

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

static int
world_init(world *w, int extra)
{
    memset(w, 0, sizeof(*w));
    mr_lc_config cfg = {.page_size = 1, .chunk_size = 16, .policy = MR_POLICY_SGLANG, .extra_buffer = extra,
                        .lazy = 0, .track_buffer_size = 2, .track_interval = 8};
    if (mr_slots_init(&w->state, 24) != MR_OK || mr_kv_init(&w->kv, 600, 1) != MR_OK
        || mr_reqpool_init(&w->rp, 6, 256, 2) != MR_OK || mr_lc_new(&cfg, &w->state, &w->kv, &w->rp, &w->lc) != MR_OK) {
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
    int rc = mr_lc_prefill_batch(w->lc, 3, kp, lens, NULL, &out);
    if (rc != MR_OK) {
        return rc;
    }
    int64_t fs[3], fd[3];
    rc = mr_lc_unfinished_batch(w->lc, 3, rows, kp, NULL, fs, fd);
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
    int rc2 = mr_lc_finish_batch(w->lc, 3, rows, fp, NULL, 1);
    return rc != MR_OK ? rc : rc2;
}

static void
test_oom(int extra)
{
    /* Fail allocation 1, 2, ... of the round until the round needs fewer. */
    long n;
    for (n = 1; n < 100000; n++) {
        world w;
        if (world_init(&w, extra) != 0) {
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
        CHECK(rc == MR_OK || rc == MR_ENOMEM, "extra=%d fail_at=%ld: rc %d (%s)", extra, n, rc, mr_strerror(rc));
        check_world(&w, "after injected failure");
        world_free(&w);
        if (used < n) {
            break;  /* the failure point is past the last allocation */
        }
    }
    CHECK(n > 3 && n < 100000, "extra=%d: %ld injection points", extra, n);
    printf("extra_buffer=%d: %ld allocation failure points checked\n", extra, n - 1);
}

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

int
main(void)
{
    test_double_free_and_tree_owned();
    test_oom(1);
    test_oom(0);
    printf("%d passed, %d failed\n", errors == 0 ? 3 : 0, errors);
    return errors;
}
