/* test_kernels_cpu.c - the C twins of the state kernels
 * (csrc/tensor/kernels_cpu.c) and their dispatch (kernels_dispatch.c)
 * against naive reference loops written here, without Python.
 *
 *   --fuzz    random shapes, strides (with padding between rows and layers),
 *             dtypes and index sets, from a fixed seed:
 *               copy_slots, clear_slots, track_decode (copy under a mask),
 *               snapshot_ssm (every pair of float32, bfloat16, float16 and
 *               float64: a copy when equal, round-to-nearest-even between
 *               float32 and bfloat16 with NaN, infinity, ties and overflow
 *               in the inputs, MR_EINVAL and nothing written otherwise),
 *               snapshot_conv (element sizes 1, 2, 4, 8, positions before,
 *               inside and past the tokens), write_req_to_token (int32 and
 *               int64 tables and values, ragged and fixed width);
 *             each called directly or through mr_k_* on a CPU device, on a
 *             buffer whose every byte is then compared with the reference's
 *             (padding and untouched rows included);
 *   --errors  the dispatch: a CUDA device in a build without CUDA gives
 *             MR_ECUDA for every kernel and writes nothing, mr_k_free on a
 *             CUDA device leaves host memory alone; mr_k_alloc_zeroed on the
 *             host: 64-byte aligned, zeroed, a distinct pointer for 0 bytes,
 *             MR_ENOMEM for a size that overflows its rounding;
 *   --checks  the checks before a launch (state_pool.c, tensor.c):
 *             mr_state_pool_run on random host index sets against a
 *             brute-force reading of its rules (placement and length, slot
 *             range, source == destination, a destination twice or also a
 *             source, after the mask for track, a snapshot's destinations
 *             and chunk range, x without tokens): the same reason, argument,
 *             entry and value, and nothing written when refused;
 *             mr_tensor_take_dl on test producers' tensors (version, layout,
 *             NULL data, device, read-only, reachability);
 *   --oom     (a build with -DMR_FAULT_INJECT) the kernels allocate nothing:
 *             with the next allocation set to fail, every kernel call of a
 *             fuzz run succeeds and the allocation counter stays at 0.
 * Default: every group.  --seed N, --ops N (kernel calls).  Exits 1 when a
 * check failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "cuda_api.h"
#include "dlpack_abi.h"
#include "kernels.h"
#include "state_pool.h"
#include "tensor.h"
#include "unit.h"

enum { MAXROWS = 12, MAXIDX = 12 };

static int fault_check = 0;  /* --oom: every kernel call must allocate nothing */

static void
fill(char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (char)unit_rnd(256);
    }
}

/* A destination of n random bytes for a kernel, and the reference's copy. */
static void
dst_pair(size_t n, char **dst, char **ref)
{
    *dst = malloc(n);
    *ref = malloc(n);
    fill(*dst, n);
    memcpy(*ref, *dst, n);
}

/* Compares the kernel's buffer with the reference's, byte by byte. */
static void
same_bytes(const char *got, const char *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            CHECK(0, "%s: byte %zu is 0x%02x, expected 0x%02x", what, i, (unsigned char)got[i],
                  (unsigned char)want[i]);
            return;
        }
    }
}

/* k distinct values of [0, n) into out, in random order. */
static void
distinct(int64_t n, int64_t k, int64_t *out)
{
    int64_t all[64];
    for (int64_t i = 0; i < n; i++) {
        all[i] = i;
    }
    for (int64_t i = 0; i < k; i++) {
        int64_t j = i + (int64_t)unit_rnd((uint32_t)(n - i)), x = all[i];
        all[i] = all[j];
        all[j] = x;
        out[i] = all[i];
    }
}

static mr_index
host_index(const void *p, int64_t n, int bits)
{
    mr_index x = {p, n, bits, 0};
    return x;
}

/* Runs one kernel call, checking under --oom that it allocates nothing. */
#ifdef MR_FAULT_INJECT
#define KCALL(rc, call)                                                        \
    do {                                                                       \
        if (fault_check) {                                                     \
            mr_fault_fail_at(1);                                               \
        }                                                                      \
        (rc) = (call);                                                         \
        if (fault_check) {                                                     \
            CHECK(mr_fault_count() == 0, "%s allocated", #call);               \
            mr_fault_fail_at(0);                                               \
        }                                                                      \
    } while (0)
#else
#define KCALL(rc, call) ((rc) = (call))
#endif

/* ------------------------------------------------------------------------
 * Slot kernels: copy, clear, track (masked copy) */

typedef struct {
    char *buf, *ref;
    size_t bytes;
    size_t off[MR_MAX_STATE_TENSORS];
    mr_state_layout L;
} pool;

static void
pool_make(pool *p)
{
    memset(p, 0, sizeof(*p));
    p->L.ntensors = 1 + (int)unit_rnd(3);
    p->L.layers = 1 + (int64_t)unit_rnd(3);
    p->L.rows = 2 + (int64_t)unit_rnd(MAXROWS - 1);
    size_t total = 0;
    for (int t = 0; t < p->L.ntensors; t++) {
        mr_state_desc *d = &p->L.t[t];
        d->row_bytes = 1 + (int64_t)unit_rnd(24);
        d->slot_stride = d->row_bytes + (int64_t)unit_rnd(3) * 4;
        d->layer_stride = p->L.rows * d->slot_stride + (int64_t)unit_rnd(9);
        p->off[t] = total + unit_rnd(5);
        total = p->off[t] + (size_t)(p->L.layers * d->layer_stride);
    }
    p->bytes = total + unit_rnd(5);
    dst_pair(p->bytes, &p->buf, &p->ref);
    for (int t = 0; t < p->L.ntensors; t++) {
        p->L.t[t].base = p->buf + p->off[t];
    }
}

static void
pool_free(pool *p)
{
    free(p->buf);
    free(p->ref);
}

/* Byte b of row (t, l, slot) in the reference copy. */
static char *
ref_at(pool *p, int t, int64_t l, int64_t slot, int64_t b)
{
    const mr_state_desc *d = &p->L.t[t];
    return p->ref + p->off[t] + l * d->layer_stride + slot * d->slot_stride + b;
}

static void
ref_copy_row(pool *p, int64_t from, int64_t to)
{
    for (int t = 0; t < p->L.ntensors; t++) {
        for (int64_t l = 0; l < p->L.layers; l++) {
            for (int64_t b = 0; b < p->L.t[t].row_bytes; b++) {
                *ref_at(p, t, l, to, b) = *ref_at(p, t, l, from, b);
            }
        }
    }
}

static void
fuzz_slots_op(int via_dispatch)
{
    pool p;
    pool_make(&p);
    int64_t rows = p.L.rows, n, src[MAXIDX], dst[MAXIDX], perm[MAXROWS];
    uint8_t mask[MAXIDX];
    int rc = MR_OK, kind = (int)unit_rnd(3);
    /* dst distinct and disjoint from src; src may repeat */
    n = (int64_t)unit_rnd((uint32_t)rows);
    distinct(rows, rows, perm);
    for (int64_t i = 0; i < n; i++) {
        dst[i] = perm[i];
        src[i] = perm[n + (int64_t)unit_rnd((uint32_t)(rows - n))];
        mask[i] = unit_rnd(2) ? 0 : (uint8_t)(1 + unit_rnd(255));
    }
    if (kind == 0) {
        for (int64_t i = 0; i < n; i++) {
            ref_copy_row(&p, src[i], dst[i]);
        }
        if (via_dispatch) {
            KCALL(rc, mr_k_copy_slots(MR_DL_CPU, 0, &p.L, host_index(src, n, 64), host_index(dst, n, 64),
                                      host_index(NULL, 0, 8), NULL));
        }
        else {
            KCALL(rc, mr_cpu_copy_slots(&p.L, src, dst, n));
        }
    }
    else if (kind == 1) {
        for (int64_t i = 0; i < n; i++) {
            for (int t = 0; t < p.L.ntensors; t++) {
                for (int64_t l = 0; l < p.L.layers; l++) {
                    for (int64_t b = 0; b < p.L.t[t].row_bytes; b++) {
                        *ref_at(&p, t, l, src[i], b) = 0;
                    }
                }
            }
        }
        if (via_dispatch) {
            KCALL(rc, mr_k_clear_slots(MR_DL_CPU, 0, &p.L, host_index(src, n, 64), NULL));
        }
        else {
            KCALL(rc, mr_cpu_clear_slots(&p.L, src, n));
        }
    }
    else {
        for (int64_t i = 0; i < n; i++) {
            if (mask[i] != 0) {
                ref_copy_row(&p, src[i], dst[i]);
            }
        }
        if (via_dispatch) {
            KCALL(rc, mr_k_copy_slots(MR_DL_CPU, 0, &p.L, host_index(src, n, 64), host_index(dst, n, 64),
                                      host_index(mask, n, 8), NULL));
        }
        else {
            KCALL(rc, mr_cpu_track_decode(&p.L, src, dst, mask, n));
        }
    }
    static const char *names[3] = {"copy_slots", "clear_slots", "track_decode"};
    CHECK_RC(rc, MR_OK, names[kind]);
    same_bytes(p.buf, p.ref, p.bytes, names[kind]);
    pool_free(&p);
}

/* ------------------------------------------------------------------------
 * snapshot_ssm */

/* float32 bits -> bfloat16 bits, round to nearest even; every NaN -> 0x7FC0. */
static uint16_t
ref_bf16(uint32_t u)
{
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
        return 0x7fc0;
    }
    uint16_t hi = (uint16_t)(u >> 16);
    uint32_t lo = u & 0xffffu;
    if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) {
        hi++;
    }
    return hi;
}

/* A float32 bit pattern: random, or one of the edges of the rounding. */
static uint32_t
rand_f32_bits(void)
{
    uint32_t sign = unit_rnd(2) ? 0x80000000u : 0;
    uint32_t r = (uint32_t)unit_rnd(1u << 16) << 16 | unit_rnd(1u << 16);
    switch (unit_rnd(12)) {
    case 0: return sign | 0x7f800000u;                                   /* infinity */
    case 1: return sign | 0x7f800000u | (1u + unit_rnd(0x7fffff));       /* NaN, any payload */
    case 5: return sign | 0x7f800000u | 1u << unit_rnd(23);              /* NaN, one payload bit */
    case 2: return (r & 0xffff0000u) | 0x8000u;                          /* a tie */
    case 3: return sign | 0x7f7f8000u | unit_rnd(0x8000);                /* rounds to infinity or not */
    case 4: return sign | unit_rnd(0x800000);                            /* subnormal */
    default: return r;
    }
}

static const int ssm_dtypes[4] = {MR_DTYPE_FLOAT32, MR_DTYPE_BFLOAT16, MR_DTYPE_FLOAT16, MR_DTYPE_FLOAT64};

static void
fuzz_ssm_op(int via_dispatch)
{
    int hdt = ssm_dtypes[unit_rnd(4)], ddt = unit_rnd(3) ? hdt : ssm_dtypes[unit_rnd(4)];
    if (unit_rnd(2) && hdt != ddt) {
        hdt = unit_rnd(2) ? MR_DTYPE_FLOAT32 : MR_DTYPE_BFLOAT16;
        ddt = hdt == MR_DTYPE_FLOAT32 ? MR_DTYPE_BFLOAT16 : MR_DTYPE_FLOAT32;
    }
    size_t hsz = hdt == MR_DTYPE_FLOAT64 ? 8 : hdt == MR_DTYPE_FLOAT32 ? 4 : 2;
    size_t dsz = ddt == MR_DTYPE_FLOAT64 ? 8 : ddt == MR_DTYPE_FLOAT32 ? 4 : 2;
    int64_t elems = 1 + (int64_t)unit_rnd(12), chunks = 1 + (int64_t)unit_rnd(6), rows = 2 + (int64_t)unit_rnd(9);
    int64_t stride = elems * (int64_t)dsz + (int64_t)unit_rnd(6);
    size_t hbytes = (size_t)(chunks * elems) * hsz, dbytes = (size_t)(rows * stride) + unit_rnd(4);
    char *h = malloc(hbytes), *dst, *ref;
    if (hdt == MR_DTYPE_FLOAT32) {
        for (int64_t k = 0; k < chunks * elems; k++) {
            uint32_t u = rand_f32_bits();
            memcpy(h + 4 * k, &u, 4);
        }
    }
    else {
        fill(h, hbytes);
    }
    dst_pair(dbytes, &dst, &ref);
    int64_t n = (int64_t)unit_rnd((uint32_t)rows + 1), slot[MAXROWS], chunk[MAXROWS];
    distinct(rows, n, slot);
    for (int64_t i = 0; i < n; i++) {
        chunk[i] = (int64_t)unit_rnd((uint32_t)chunks);
    }
    int supported = hdt == ddt || ((hdt == MR_DTYPE_FLOAT32 || hdt == MR_DTYPE_BFLOAT16)
                                   && (ddt == MR_DTYPE_FLOAT32 || ddt == MR_DTYPE_BFLOAT16));
    for (int64_t i = 0; supported && i < n; i++) {
        const unsigned char *s = (const unsigned char *)h + (size_t)(chunk[i] * elems) * hsz;
        char *d = ref + slot[i] * stride;
        for (int64_t k = 0; k < elems; k++) {
            if (hdt == ddt) {
                memcpy(d + k * (int64_t)dsz, s + k * (int64_t)hsz, dsz);
            }
            else if (hdt == MR_DTYPE_FLOAT32) {  /* to bfloat16, little-endian */
                uint32_t u = (uint32_t)s[4 * k] | (uint32_t)s[4 * k + 1] << 8 | (uint32_t)s[4 * k + 2] << 16
                             | (uint32_t)s[4 * k + 3] << 24;
                uint16_t b = ref_bf16(u);
                d[2 * k] = (char)(b & 0xff);
                d[2 * k + 1] = (char)(b >> 8);
            }
            else {  /* bfloat16 to float32: the two bytes become the high half */
                d[4 * k] = 0;
                d[4 * k + 1] = 0;
                d[4 * k + 2] = (char)s[2 * k];
                d[4 * k + 3] = (char)s[2 * k + 1];
            }
        }
    }
    mr_ssm_snap sp = {dst, stride, rows, ddt, h, chunks, hdt, elems};
    int rc;
    if (via_dispatch) {
        KCALL(rc, mr_k_snapshot_ssm(MR_DL_CPU, 0, &sp, host_index(chunk, n, 64), host_index(slot, n, 64), NULL));
    }
    else {
        KCALL(rc, mr_cpu_snapshot_ssm(&sp, chunk, slot, n));
    }
    char what[64];
    snprintf(what, sizeof(what), "snapshot_ssm %s -> %s", mr_dtype_name(hdt), mr_dtype_name(ddt));
    CHECK_RC(rc, supported ? MR_OK : MR_EINVAL, what);
    same_bytes(dst, ref, dbytes, what);
    free(h);
    free(dst);
    free(ref);
}

/* ------------------------------------------------------------------------
 * snapshot_conv */

static void
fuzz_conv_op(int via_dispatch)
{
    static const int64_t sizes[4] = {1, 2, 4, 8};
    int64_t es = sizes[unit_rnd(4)], T = 1 + (int64_t)unit_rnd(10), dim = 1 + (int64_t)unit_rnd(5);
    int64_t km1 = (int64_t)unit_rnd(5), rows = 2 + (int64_t)unit_rnd(9);
    int64_t stride = dim * km1 * es + (int64_t)unit_rnd(5);
    size_t xbytes = (size_t)(T * dim * es), dbytes = (size_t)(rows * stride) + unit_rnd(4) + 1;
    char *x = malloc(xbytes), *dst, *ref;
    fill(x, xbytes);
    dst_pair(dbytes, &dst, &ref);
    int64_t n = (int64_t)unit_rnd((uint32_t)rows + 1), slot[MAXROWS], pos[MAXROWS];
    distinct(rows, n, slot);
    for (int64_t i = 0; i < n; i++) {
        pos[i] = (int64_t)unit_rnd((uint32_t)T + 6) - 2;
    }
    for (int64_t i = 0; i < n; i++) {
        for (int64_t c = 0; c < dim; c++) {
            for (int64_t j = 0; j < km1; j++) {
                int64_t t = pos[i] - km1 + j;
                if (t < 0) {
                    t = 0;
                }
                if (t > T - 1) {
                    t = T - 1;
                }
                for (int64_t b = 0; b < es; b++) {
                    ref[slot[i] * stride + (c * km1 + j) * es + b] = x[(t * dim + c) * es + b];
                }
            }
        }
    }
    mr_conv_snap cp = {dst, stride, rows, x, T, dim, km1, es};
    int rc;
    if (via_dispatch) {
        KCALL(rc, mr_k_snapshot_conv(MR_DL_CPU, 0, &cp, host_index(pos, n, 64), host_index(slot, n, 64), NULL));
    }
    else {
        KCALL(rc, mr_cpu_snapshot_conv(&cp, pos, slot, n));
    }
    CHECK_RC(rc, MR_OK, "snapshot_conv");
    same_bytes(dst, ref, dbytes, "snapshot_conv");
    free(x);
    free(dst);
    free(ref);
}

/* ------------------------------------------------------------------------
 * write_req_to_token */

static void
fuzz_rtt_op(int via_dispatch)
{
    int tbits = unit_rnd(2) ? 32 : 64, vbits = unit_rnd(2) ? 32 : 64, ragged = (int)unit_rnd(2);
    int64_t nrows = 1 + (int64_t)unit_rnd(8), ncols = 1 + (int64_t)unit_rnd(16);
    size_t tbytes = (size_t)(nrows * ncols * tbits / 8);
    char *table, *ref;
    dst_pair(tbytes, &table, &ref);
    int64_t n = (int64_t)unit_rnd((uint32_t)nrows + 1), rows[MAXROWS], starts[MAXROWS], ends[MAXROWS];
    int64_t width = (int64_t)unit_rnd((uint32_t)ncols + 1), total = 0;
    distinct(nrows, n, rows);
    for (int64_t i = 0; i < n; i++) {
        if (ragged) {
            starts[i] = (int64_t)unit_rnd((uint32_t)ncols + 1);
            ends[i] = starts[i] + (int64_t)unit_rnd((uint32_t)(ncols - starts[i]) + 1);
            total += ends[i] - starts[i];
        }
        else {
            starts[i] = (int64_t)unit_rnd((uint32_t)(ncols - width) + 1);
            total += width;
        }
    }
    int64_t *v64 = malloc((size_t)(total + 1) * sizeof(int64_t));
    int32_t *v32 = malloc((size_t)(total + 1) * sizeof(int32_t));
    for (int64_t k = 0; k < total; k++) {
        int64_t v = (int64_t)unit_rnd(1u << 31) * (unit_rnd(2) ? 1 : -1);
        if (tbits == 64 && vbits == 64 && unit_rnd(2)) {
            v = v * 4294967296 + (int64_t)unit_rnd(1u << 31);  /* beyond int32 */
        }
        v64[k] = v;
        v32[k] = (int32_t)v;
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = ragged ? ends[i] - starts[i] : width;
        for (int64_t j = 0; j < len; j++, k++) {
            int64_t cell = rows[i] * ncols + starts[i] + j;
            if (tbits == 32) {
                int32_t w = vbits == 32 ? v32[k] : (int32_t)v64[k];
                memcpy(ref + cell * 4, &w, 4);
            }
            else {
                int64_t w = vbits == 32 ? (int64_t)v32[k] : v64[k];
                memcpy(ref + cell * 8, &w, 8);
            }
        }
    }
    const void *vals = vbits == 32 ? (const void *)v32 : (const void *)v64;
    mr_rtt_write wp = {table, nrows, ncols, tbits, vals, total, vbits, 0, ragged ? 0 : width};
    int rc;
    if (via_dispatch) {
        KCALL(rc, mr_k_write_req_to_token(MR_DL_CPU, 0, &wp, host_index(rows, n, 64), host_index(starts, n, 64),
                                          host_index(ragged ? ends : NULL, ragged ? n : 0, 64), NULL));
    }
    else {
        KCALL(rc, mr_cpu_write_req_to_token(&wp, rows, starts, ragged ? ends : NULL, n));
    }
    char what[80];
    snprintf(what, sizeof(what), "write_req_to_token int%d <- int%d %s", tbits, vbits, ragged ? "ragged" : "fixed");
    CHECK_RC(rc, MR_OK, what);
    same_bytes(table, ref, tbytes, what);
    free(table);
    free(ref);
    free(v64);
    free(v32);
}

static void
test_fuzz(long ops)
{
    long per[4] = {0, 0, 0, 0};
    for (long op = 0; op < ops && unit_errors == 0; op++) {
        int kind = (int)unit_rnd(4), via = (int)unit_rnd(2);
        per[kind]++;
        switch (kind) {
        case 0: fuzz_slots_op(via); break;
        case 1: fuzz_ssm_op(via); break;
        case 2: fuzz_conv_op(via); break;
        default: fuzz_rtt_op(via); break;
        }
    }
    printf("fuzz%s: %ld slot kernel calls, %ld snapshot_ssm, %ld snapshot_conv, %ld write_req_to_token\n",
           fault_check ? " (no allocation allowed)" : "", per[0], per[1], per[2], per[3]);
}

/* ------------------------------------------------------------------------
 * --errors: the dispatch */

static void
test_dispatch_errors(void)
{
    char buf[256], before[256];
    fill(buf, sizeof(buf));
    memcpy(before, buf, sizeof(buf));
    mr_state_layout L;
    memset(&L, 0, sizeof(L));
    L.ntensors = 1;
    L.layers = 1;
    L.rows = 4;
    L.t[0].base = buf;
    L.t[0].layer_stride = 64;
    L.t[0].slot_stride = 16;
    L.t[0].row_bytes = 16;
    int64_t a[2] = {1, 2}, b[2] = {3, 0};
    uint8_t m[2] = {1, 1};
    mr_index ia = host_index(a, 2, 64), ib = host_index(b, 2, 64), im = host_index(m, 2, 8);
    mr_index none = host_index(NULL, 0, 64);
    mr_ssm_snap sp = {buf, 16, 4, MR_DTYPE_FLOAT32, buf + 128, 2, MR_DTYPE_FLOAT32, 4};
    mr_conv_snap cp = {buf, 16, 4, buf + 128, 4, 2, 2, 4};
    mr_rtt_write wp = {buf, 4, 8, 32, a, 2, 64, 0, 1};
    CHECK(mr_k_have_cuda() == 0, "a build without CUDA says it has CUDA");
    CHECK_RC(mr_k_copy_slots(MR_DL_CUDA, 0, &L, ia, ib, none, NULL), MR_ECUDA, "copy_slots on CUDA");
    CHECK_RC(mr_k_copy_slots(MR_DL_CUDA, 0, &L, ia, ib, im, NULL), MR_ECUDA, "track on CUDA");
    CHECK_RC(mr_k_clear_slots(MR_DL_CUDA, 0, &L, ia, NULL), MR_ECUDA, "clear_slots on CUDA");
    CHECK_RC(mr_k_snapshot_ssm(MR_DL_CUDA, 0, &sp, ia, ib, NULL), MR_ECUDA, "snapshot_ssm on CUDA");
    CHECK_RC(mr_k_snapshot_conv(MR_DL_CUDA, 0, &cp, ia, ib, NULL), MR_ECUDA, "snapshot_conv on CUDA");
    CHECK_RC(mr_k_write_req_to_token(MR_DL_CUDA, 0, &wp, ia, ib, none, NULL), MR_ECUDA, "write_req_to_token on CUDA");
    same_bytes(buf, before, sizeof(buf), "a refused kernel writes nothing");
    CHECK(strstr(mr_last_cuda_error(), "built without CUDA") != NULL, "the CUDA error says why: %s",
          mr_last_cuda_error());
    CHECK(mr_cuda_device_count() == 0, "no CUDA device in a build without CUDA");
    void *p = (void *)buf;
    CHECK_RC(mr_k_alloc_zeroed(MR_DL_CUDA, 0, 64, &p), MR_ECUDA, "alloc on CUDA");
    CHECK(p == (void *)buf, "a refused alloc leaves *out");
    /* host allocations */
    static const size_t sizes[6] = {0, 1, 63, 64, 65, 1000};
    void *q[6];
    for (int i = 0; i < 6; i++) {
        q[i] = NULL;
        CHECK_RC(mr_k_alloc_zeroed(MR_DL_CPU, 0, sizes[i], &q[i]), MR_OK, "host alloc");
        CHECK(q[i] != NULL && (uintptr_t)q[i] % 64 == 0, "host alloc of %zu: 64-byte aligned", sizes[i]);
        size_t rounded = sizes[i] == 0 ? 64 : (sizes[i] + 63) / 64 * 64;
        for (size_t k = 0; q[i] != NULL && k < rounded; k++) {
            if (((unsigned char *)q[i])[k] != 0) {
                CHECK(0, "host alloc of %zu: byte %zu not zero", sizes[i], k);
                break;
            }
        }
    }
    CHECK(q[0] != q[1], "a 0-byte allocation has its own pointer");
    for (int i = 0; i < 6; i++) {
        mr_k_free(MR_DL_CUDA, 0, q[i]);  /* not CUDA memory: must not be freed here */
        memset(q[i], 1, sizes[i]);
        mr_k_free(MR_DL_CPU, 0, q[i]);
    }
    static const size_t huge[2] = {SIZE_MAX, SIZE_MAX - 62};
    for (int i = 0; i < 2; i++) {
        p = (void *)buf;
        CHECK_RC(mr_k_alloc_zeroed(MR_DL_CPU, 0, huge[i], &p), MR_ENOMEM, "a size whose rounding overflows");
        CHECK(p == (void *)buf, "a refused alloc leaves *out");
    }
    /* an unsupported dtype pair through the dispatch */
    sp.dst_dtype = MR_DTYPE_FLOAT16;
    int64_t c[2] = {0, 1};
    CHECK_RC(mr_k_snapshot_ssm(MR_DL_CPU, 0, &sp, host_index(c, 2, 64), ib, NULL), MR_EINVAL,
             "snapshot_ssm float32 -> float16");
    same_bytes(buf, before, sizeof(buf), "a refused snapshot writes nothing");
    printf("errors: dispatch without CUDA, host allocations\n");
}

/* ------------------------------------------------------------------------
 * --checks: what a launch refuses */

/* The refusal the rules give (brute force), in the order they are checked. */
static mr_refusal
expect_none(void)
{
    mr_refusal r = {MR_PAIR_OK, 0, -1, 0, 0, 0};
    return r;
}

static mr_refusal
expect(int reason, int arg, int arg2, int64_t pos, int64_t value, int64_t limit)
{
    mr_refusal r = {reason, arg, arg2, pos, value, limit};
    return r;
}

/* A copy of src[i] to dst[i] for a pool of slots (src NULL: destinations
 * alone), arguments sa and da. */
static mr_refusal
expect_pairs(const int64_t *src, const int64_t *dst, int64_t n, int64_t slots, int sa, int da)
{
    for (int64_t i = 0; i < n; i++) {
        if (src != NULL && (src[i] < 0 || src[i] > slots)) {
            return expect(MR_PAIR_RANGE, sa, da, i, src[i], slots);
        }
        if (dst[i] < 0 || dst[i] > slots) {
            return expect(MR_PAIR_RANGE, da, sa, i, dst[i], slots);
        }
        if (src != NULL && src[i] == dst[i]) {
            return expect(MR_PAIR_SAME, sa, da, i, src[i], slots);
        }
    }
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < i; j++) {
            if (dst[j] == dst[i]) {
                return expect(MR_PAIR_DST_TWICE, da, sa, i, dst[i], slots);
            }
        }
        for (int64_t j = 0; src != NULL && j < n; j++) {
            if (src[j] == dst[i]) {
                return expect(MR_PAIR_DST_IS_SRC, da, sa, i, dst[i], slots);
            }
        }
    }
    return expect_none();
}

static void
same_refusal(int rc, const mr_refusal *got, const mr_refusal *want, const char *what)
{
    CHECK_RC(rc, want->reason == MR_PAIR_OK ? MR_OK : MR_EINVAL, what);
    CHECK(got->reason == want->reason, "%s: reason %d, expected %d", what, got->reason, want->reason);
    if (want->reason != MR_PAIR_OK && got->reason == want->reason) {
        CHECK(got->arg == want->arg && got->arg2 == want->arg2 && got->pos == want->pos
                  && got->value == want->value && (want->reason == MR_PAIR_LENGTH || got->limit == want->limit),
              "%s: refused (arg %d, arg2 %d, pos %lld, value %lld, limit %lld), expected (%d, %d, %lld, %lld, %lld)",
              what, got->arg, got->arg2, (long long)got->pos, (long long)got->value, (long long)got->limit,
              want->arg, want->arg2, (long long)want->pos, (long long)want->value, (long long)want->limit);
    }
}

static void
test_run_checks(long ops)
{
    enum { SLOTS = 6 };
    int64_t cshape[4] = {2, SLOTS + 1, 3, 2}, tshape[3] = {2, SLOTS + 1, 5};
    mr_tensor conv, temporal;
    CHECK_RC(mr_tensor_alloc(&conv, MR_DL_CPU, 0, MR_DTYPE_FLOAT32, 4, cshape), MR_OK, "conv tensor");
    CHECK_RC(mr_tensor_alloc(&temporal, MR_DL_CPU, 0, MR_DTYPE_FLOAT32, 3, tshape), MR_OK, "temporal tensor");
    fill(conv.data, mr_tensor_nbytes(&conv));
    fill(temporal.data, mr_tensor_nbytes(&temporal));
    const mr_tensor *tensors[2] = {&conv, &temporal};
    mr_state_pool sp;
    int reason, which, other;
    CHECK_RC(mr_state_pool_init(&sp, tensors, 2, &reason, &which, &other), MR_OK, "the pool");
    int64_t x_shape[2] = {4, 3}, h_shape[2] = {3, 5};
    mr_tensor x, h;
    CHECK_RC(mr_tensor_alloc(&x, MR_DL_CPU, 0, MR_DTYPE_FLOAT32, 2, x_shape), MR_OK, "x");
    CHECK_RC(mr_tensor_alloc(&h, MR_DL_CPU, 0, MR_DTYPE_FLOAT32, 2, h_shape), MR_OK, "h");
    size_t cb = mr_tensor_nbytes(&conv), tb = mr_tensor_nbytes(&temporal);
    char *cbefore = malloc(cb), *tbefore = malloc(tb);
    long refused = 0;
    for (long op = 0; op < ops; op++) {
        int64_t a[MAXIDX], b[MAXIDX], m[MAXIDX];
        int64_t n = unit_rnd(7), nb = unit_rnd(8) == 0 ? unit_rnd(7) : n;
        /* mostly in range, sometimes just outside it */
        for (int64_t i = 0; i < MAXIDX; i++) {
            a[i] = (int64_t)unit_rnd(SLOTS + 3) - 1;
            b[i] = (int64_t)unit_rnd(SLOTS + 3) - 1;
            m[i] = unit_rnd(2);
        }
        mr_index ix[3] = {host_index(a, n, 64), host_index(b, nb, 64), host_index(m, n, 64)};
        int kind = (int)unit_rnd(5), conv_window = kind == 4;
        kind = conv_window ? MR_POOL_SNAPSHOT : kind;
        mr_snap_plan plan;
        mr_refusal want = expect_none(), got;
        if (nb != n && kind != MR_POOL_CLEAR) {
            want = expect(MR_PAIR_LENGTH, 0, 1, n, nb, 0);
        }
        else if (kind == MR_POOL_COPY) {
            want = expect_pairs(a, b, n, SLOTS, 0, 1);
        }
        else if (kind == MR_POOL_CLEAR) {
            for (int64_t i = n - 1; i >= 0; i--) {
                want = a[i] < 0 || a[i] > SLOTS ? expect(MR_PAIR_RANGE, 0, -1, i, a[i], SLOTS) : want;
            }
        }
        else if (kind == MR_POOL_TRACK) {
            int64_t fa[MAXIDX], fb[MAXIDX], k = 0;
            for (int64_t i = 0; i < n; i++) {
                if (m[i]) {
                    fa[k] = a[i];
                    fb[k++] = b[i];
                }
            }
            want = expect_pairs(fa, fb, k, SLOTS, MR_ARG_MASKED, MR_ARG_MASKED + 1);
        }
        else {
            CHECK_RC(mr_state_pool_snap_plan(&sp, conv_window, 1, 0, conv_window ? &x : &h, &plan, &reason), MR_OK,
                     "a snapshot's plan");
            x.shape[0] = unit_rnd(4) == 0 ? 0 : 4;
            plan.cs.tokens = x.shape[0];
            want = expect_pairs(NULL, b, n, SLOTS, -1, 1);
            if (want.reason == MR_PAIR_OK && conv_window && x.shape[0] == 0 && n > 0) {
                want = expect(MR_PAIR_NO_TOKENS, 0, -1, 0, 0, 0);
            }
            /* h has 3 chunks */
            for (int64_t i = 0; want.reason == MR_PAIR_OK && !conv_window && i < n; i++) {
                want = a[i] < 0 || a[i] >= 3 ? expect(MR_PAIR_BELOW, 0, -1, i, a[i], 3) : want;
            }
        }
        memcpy(cbefore, conv.data, cb);
        memcpy(tbefore, temporal.data, tb);
        int rc = mr_state_pool_run(&sp, kind, ix, &plan, NULL, &got);
        char what[64];
        snprintf(what, sizeof(what), "op %ld (kernel %d, n %lld)", op, kind, (long long)n);
        same_refusal(rc, &got, &want, what);
        if (want.reason != MR_PAIR_OK) {
            refused++;
            same_bytes(conv.data, cbefore, cb, "a refused call writes no conv state");
            same_bytes(temporal.data, tbefore, tb, "a refused call writes no temporal state");
        }
    }
    /* host data against device data, for each argument */
    int64_t one = 1;
    mr_index dev = {&one, 1, 64, 1}, host = host_index(&one, 1, 64);
    mr_index pl[3] = {host, dev, host};
    mr_refusal got, want = expect(MR_PAIR_PLACEMENT, 0, 1, 0, 0, 0);
    same_refusal(mr_state_pool_run(&sp, MR_POOL_COPY, pl, NULL, NULL, &got), &got, &want, "copy host/device");
    pl[1] = host;
    pl[2] = dev;
    want = expect(MR_PAIR_PLACEMENT, 0, 2, 0, 0, 0);
    same_refusal(mr_state_pool_run(&sp, MR_POOL_TRACK, pl, NULL, NULL, &got), &got, &want, "track host mask");
    same_refusal(mr_index_agree(&pl[0], &pl[2], &got), &got, &(mr_refusal){MR_PAIR_PLACEMENT, 0, 1, 0, 0, 0},
                 "mr_index_agree");
    free(cbefore);
    free(tbefore);
    x.shape[0] = 4;
    mr_tensor_release(&conv);
    mr_tensor_release(&temporal);
    mr_tensor_release(&x);
    mr_tensor_release(&h);
    printf("checks: %ld pool kernel calls (%ld refused)\n", ops, refused);
}

/* mr_tensor_take_dl on a test producer's tensor built from spec. */
static void
take_case(mr_dl_testing_spec spec, int writable, int want, const char *what)
{
    void *m = mr_dl_testing_make(&spec);
    mr_tensor t;
    int problem = -1;
    int rc = mr_tensor_take_dl(m, spec.versioned, writable, &t, &problem);
    CHECK_RC(rc, want == MR_TP_OK ? MR_OK : MR_EINVAL, what);
    CHECK(problem == want, "%s: problem %d, expected %d", what, problem, want);
    if (rc == MR_OK) {
        const unsigned char *d = (const unsigned char *)t.data;
        CHECK(t.ndim == spec.ndim && t.dtype == spec.dtype && (t.numel == 0 || d[0] == 11),
              "%s: the tensor read (ndim %d, first byte %d)", what, t.ndim, t.numel ? d[0] : -1);
    }
    long before = mr_dl_testing_deleted();
    mr_dl_delete(m, spec.versioned);
    CHECK(mr_dl_testing_deleted() == before + 1, "%s: mr_dl_delete runs the deleter once", what);
}

static void
test_take_checks(void)
{
    int64_t shape[2] = {2, 3}, strided[2] = {1, 2}, empty[2] = {0, 3};
    /* each case: a compact float32 [2, 3] CPU tensor, version 1.1, but for */
    static const struct {
        int legacy, offset, major, strided, null_data, empty, device_type, readonly, writable, want;
        const char *what;
    } cases[] = {
        {0, 0, 1, 0, 0, 0, MR_DL_CPU, 0, 1, MR_TP_OK, "a compact versioned tensor"},
        {1, 0, 1, 0, 0, 0, MR_DL_CPU, 0, 1, MR_TP_OK, "a legacy tensor"},
        {0, 8, 1, 0, 0, 0, MR_DL_CPU, 0, 0, MR_TP_OK, "a byte offset"},
        {0, 0, 2, 0, 0, 0, MR_DL_CPU, 0, 0, MR_TP_VERSION, "version 2.1"},
        {0, 0, 0, 0, 0, 0, MR_DL_CPU, 0, 0, MR_TP_VERSION, "version 0.1"},
        {0, 0, 1, 1, 0, 0, MR_DL_CPU, 0, 0, MR_TP_LAYOUT, "column-major strides"},
        {0, 0, 1, 0, 1, 0, MR_DL_CPU, 0, 0, MR_TP_NULL, "NULL data"},
        {0, 0, 1, 0, 1, 1, MR_DL_CPU, 0, 0, MR_TP_OK, "NULL data of no elements"},
        {0, 0, 1, 0, 0, 0, 4, 0, 0, MR_TP_DEVICE, "an OpenCL device"},
        {0, 0, 1, 0, 0, 0, MR_DL_CPU, 1, 1, MR_TP_READONLY, "read-only, written"},
        {0, 0, 1, 0, 0, 0, MR_DL_CPU, 1, 0, MR_TP_OK, "read-only, read"},
        {0, 0, 1, 0, 0, 0, MR_DL_CUDA, 0, 0, MR_TP_NO_CUDA, "a CUDA tensor without a device"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        mr_dl_testing_spec s = {2, cases[i].empty ? empty : shape, cases[i].strided ? strided : NULL,
                                MR_DTYPE_FLOAT32, cases[i].offset, cases[i].device_type, 0, cases[i].null_data,
                                !cases[i].legacy, (unsigned)cases[i].major, 1, cases[i].readonly};
        /* a CUDA build without a device: the device id is the problem */
        int want = cases[i].want == MR_TP_NO_CUDA && mr_k_have_cuda() ? MR_TP_CUDA_ID : cases[i].want;
        take_case(s, cases[i].writable, want, cases[i].what);
    }
    CHECK(mr_device_reachable(MR_DL_CPU, 7) == MR_TP_OK, "the host is always reachable");
    printf("checks: mr_tensor_take_dl\n");
}

int
main(int argc, char **argv)
{
    static const char *const groups[4] = {"fuzz", "errors", "oom", "checks"};
    int on[4];
    long ops = 20000;
    unit_start(argc, argv, groups, on, 4, &ops);
    if (on[1]) {
        test_dispatch_errors();
    }
    if (on[0]) {
        test_fuzz(ops);
    }
    if (on[3]) {
        test_run_checks(ops);
        test_take_checks();
    }
    if (on[2]) {
#ifdef MR_FAULT_INJECT
        fault_check = 1;
        test_fuzz(ops / 4);
        fault_check = 0;
#else
        unit_skip_oom();
#endif
    }
    return unit_exit("test_kernels_cpu");
}
