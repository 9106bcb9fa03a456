/* unit.h - the small harness shared by the unit tests of one core file
 * (test_slot_alloc.c, test_req_pool.c, test_kernels_cpu.c).
 *
 * CHECK(cond, fmt, ...) counts a failed check and prints where; the binary
 * exits with unit_exit() (1 when any check failed, 0 otherwise).
 * unit_groups() reads which groups of tests run (--units, --fuzz, ...),
 * unit_args() --seed N and --ops N; unit_rnd() is a fixed-seed xorshift64
 * source. */
#ifndef MR_TEST_UNIT_H
#define MR_TEST_UNIT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static int unit_errors = 0;
static long unit_checks = 0;

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        unit_checks++;                                                    \
        if (!(cond)) {                                                    \
            if (++unit_errors <= 40) {                                    \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);      \
                fprintf(stderr, __VA_ARGS__);                             \
                fprintf(stderr, "\n");                                    \
            }                                                             \
        }                                                                 \
    } while (0)

/* rc == want, naming both codes on failure. */
#define CHECK_RC(rc, want, what)                                          \
    do {                                                                  \
        int rc_ = (rc), want_ = (want);                                   \
        CHECK(rc_ == want_, "%s: %s, expected %s", (what), mr_strerror(rc_), \
              mr_strerror(want_));                                        \
    } while (0)

static uint64_t unit_rs = 1;

static inline void
unit_seed(uint64_t seed)
{
    unit_rs = seed * 0x9E3779B97F4A7C15ull + 1;
}

/* Uniform in [0, n) (0 when n is 0). */
static inline uint32_t
unit_rnd(uint32_t n)
{
    unit_rs ^= unit_rs << 13;
    unit_rs ^= unit_rs >> 7;
    unit_rs ^= unit_rs << 17;
    return n ? (uint32_t)((unit_rs >> 11) % n) : 0;
}

/* Reads --seed and --ops (defaults as given). */
static inline void
unit_args(int argc, char **argv, uint64_t *seed, long *ops)
{
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0) {
            *seed = (uint64_t)strtoull(argv[++i], NULL, 10);
        }
        else if (strcmp(argv[i], "--ops") == 0) {
            *ops = strtol(argv[++i], NULL, 10);
        }
    }
}

/* Which test groups run: on[i] when --names[i] is given, every group when
 * none is. */
static inline void
unit_groups(int argc, char **argv, const char *const *names, int *on, int n)
{
    int any = 0;
    for (int g = 0; g < n; g++) {
        on[g] = 0;
        for (int i = 1; i < argc; i++) {
            on[g] |= argv[i][0] == '-' && argv[i][1] == '-' && strcmp(argv[i] + 2, names[g]) == 0;
        }
        any |= on[g];
    }
    for (int g = 0; !any && g < n; g++) {
        on[g] = 1;
    }
}

/* Parses the command line: the groups to run (see unit_groups()), --ops
 * (default *ops) and --seed (default 1234), and seeds unit_rnd(). */
static inline void
unit_start(int argc, char **argv, const char *const *groups, int *on, int n, long *ops)
{
    uint64_t seed = 1234;
    unit_groups(argc, argv, groups, on, n);
    unit_args(argc, argv, &seed, ops);
    unit_seed(seed);
}

/* For --oom in a build without -DMR_FAULT_INJECT. */
static inline void
unit_skip_oom(void)
{
    printf("oom: skipped (build with -DMR_FAULT_INJECT)\n");
}

/* Prints the summary line; the exit status is non-zero on any failure. */
static inline int
unit_exit(const char *name)
{
    printf("%s: %ld checks, %d failed: %s\n", name, unit_checks, unit_errors,
           unit_errors == 0 ? "passed" : "FAILED");
    return unit_errors == 0 ? 0 : 1;
}

#endif /* MR_TEST_UNIT_H */
