/* state_pool.h - the state pool (SGLang's MambaPool) in C.
 *
 * A pool is a set of state tensors, all shaped [layers, slots + 1, ...]:
 * nconv conv tensors (per-slot shape e.g. [dim, K - 1], bf16) followed by
 * one temporal (SSM) tensor (per-slot shape e.g. [H, V, K], fp32), possibly
 * with different dtypes, all on one device.  Slot 0 is the padding slot
 * that padded batch rows point at; slots 1..slots hold request states.
 *
 * The pool borrows its mr_tensor structs: their owner (the Python
 * StatePool object) keeps them alive for the pool's lifetime.  Every
 * operation checks its host-side indices before it writes anything, and
 * leaves device-side indices to the kernels, which bounds-check them. */
#ifndef MR_STATE_POOL_H
#define MR_STATE_POOL_H

#include "kernels.h"
#include "tensor.h"

typedef struct {
    int ntensors;                                  /* nconv + 1 */
    int nconv;
    const mr_tensor *t[MR_MAX_STATE_TENSORS];      /* conv..., temporal (borrowed) */
    int64_t layers;
    int64_t slots;                                 /* usable slots; rows = slots + 1 */
    int32_t device_type;
    int32_t device_id;
    int64_t bytes_per_slot;                        /* all tensors, all layers */
    mr_state_layout layout;
} mr_state_pool;

/* Reasons mr_state_pool_init() refuses its tensors. */
enum {
    MR_SP_OK = 0,
    MR_SP_COUNT,      /* no conv tensor, or more than MR_MAX_STATE_TENSORS - 1 */
    MR_SP_NDIM,       /* fewer than 2 dimensions */
    MR_SP_LAYERS,     /* dim 0 differs from the first tensor's, or is < 1 */
    MR_SP_ROWS,       /* dim 1 differs from the first tensor's, or is < 2 (no slot past padding row 0) */
    MR_SP_DEVICE,     /* device differs from the first tensor's */
    MR_SP_OVERLAP     /* memory overlaps an earlier tensor's (*other that one) */
};

/* Builds the pool over t[0..n): the conv tensors, then the temporal one
 * (compact tensors).  Returns MR_OK, or MR_EINVAL with *reason (MR_SP_*)
 * and *which (the tensor's position: 0..n-2 for conv, n-1 for temporal)
 * set, and for MR_SP_OVERLAP *other, the earlier tensor it overlaps. */
int mr_state_pool_init(mr_state_pool *p, const mr_tensor *const *t, int n, int *reason, int *which, int *other);

/* Why mr_state_pool_run() (or mr_index_agree()) refuses a call's index
 * arguments.  Arguments are counted from 0 in the call's order of index
 * arguments; MR_ARG_MASKED + i is argument i after track_decode's mask
 * kept its selected entries. */
enum {
    MR_PAIR_OK = 0,
    MR_PAIR_PLACEMENT,    /* arg and arg2: one host data, the other device data */
    MR_PAIR_LENGTH,       /* arg has pos entries, arg2 has value */
    MR_PAIR_RANGE,        /* arg[pos] = value is out of [0, limit] (limit: slots) */
    MR_PAIR_SAME,         /* arg[pos] == arg2[pos] == value (source == destination) */
    MR_PAIR_DST_TWICE,    /* arg[pos] = value appears earlier in arg; arg2 the sources, -1 when none */
    MR_PAIR_DST_IS_SRC,   /* arg[pos] = value is also a source (order would matter) */
    MR_PAIR_BELOW,        /* arg[pos] = value is out of [0, limit) (limit: h's chunks) */
    MR_PAIR_NO_TOKENS,    /* the conv window's x has no tokens, but positions were given */
    MR_PAIR_NOMEM         /* no memory for the checks themselves */
};

#define MR_ARG_MASKED 8

typedef struct {
    int reason;           /* MR_PAIR_* */
    int arg, arg2;        /* the argument at fault, the other one involved (-1: none) */
    int64_t pos;          /* the entry */
    int64_t value;        /* its value */
    int64_t limit;        /* the bound it broke */
} mr_refusal;

/* Both host data or both device data, and of one length: MR_OK, or
 * MR_EINVAL with *why (arguments 0 and 1). */
int mr_index_agree(const mr_index *a, const mr_index *b, mr_refusal *why);

/* Reasons the source tensor of a snapshot is refused. */
enum {
    MR_SNAP_OK = 0,
    MR_SNAP_CONV_NDIM,   /* conv[ci] is not [layers, slots + 1, dim, K - 1] */
    MR_SNAP_SHAPE,       /* h: not [..., num_chunks, *temporal_shape]; x: not [T, dim] */
    MR_SNAP_DTYPE,       /* h: not the temporal dtype nor float32/bfloat16 both sides; x: not conv's */
    MR_SNAP_DEVICE,      /* not on the pool's device */
    MR_SNAP_OVERLAP      /* its memory overlaps one of the pool's state tensors (the copy would read
                          * what it writes) */
};

/* A snapshot's plan: snapshot_conv_window's (conv) or snapshot_ssm_from_h's. */
typedef struct {
    int conv;
    mr_ssm_snap ssm;
    mr_conv_snap cs;
} mr_snap_plan;

/* The plan of a snapshot into layer (in range) from src: for the SSM
 * snapshot src is h, the per-chunk states (its shape, device and dtype are
 * checked in that order); for the conv window src is the pre-conv input x
 * and ci the conv tensor (in range): conv[ci]'s rank first, then x's
 * shape, dtype and device, and with src NULL only conv[ci].  Returns MR_OK
 * with *s filled (when src is given), or MR_EINVAL with *reason. */
int mr_state_pool_snap_plan(const mr_state_pool *p, int conv, int64_t layer, int64_t ci, const mr_tensor *src,
                            mr_snap_plan *s, int *reason);

/* The kernels over the whole pool, and the index arguments of each. */
enum {
    MR_POOL_COPY,        /* src, dst: slot src[i] to slot dst[i] */
    MR_POOL_CLEAR,       /* idx: zero slot idx[i] */
    MR_POOL_TRACK,       /* running, track, mask: copy running[i] to track[i] where mask[i] */
    MR_POOL_SNAPSHOT     /* chunk indices or positions, dst slots (see plan) */
};

/* Checks op's index arguments ix (plan: the snapshot's, else NULL), then
 * runs its kernel on stream.  All arguments must be host data or all
 * device data, of one length.  Host indices are checked here: slots in
 * [0, slots], a copy's destinations distinct and never a source (after
 * the mask, for track), a snapshot's destinations distinct and its chunk
 * indices below h's chunk count; device indices are left to the kernels,
 * which skip entries out of range.  Returns the kernel's status, or
 * MR_EINVAL (MR_ENOMEM for MR_PAIR_NOMEM) with why->reason set; why->reason
 * is MR_PAIR_OK whenever the kernel ran. */
int mr_state_pool_run(const mr_state_pool *p, int op, const mr_index *ix, const mr_snap_plan *plan,
                      void *stream, mr_refusal *why);

#endif /* MR_STATE_POOL_H */
