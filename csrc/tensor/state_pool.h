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
 * operation takes host-side indices already checked with the functions
 * below, or device-side indices that the kernels bounds-check. */
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
    MR_SP_OVERLAP     /* memory overlaps an earlier tensor's (*which2 that one) */
};

/* Builds the pool over conv[0..nconv) and temporal (compact tensors).
 * Returns MR_OK, or MR_EINVAL with *reason (MR_SP_*) and *which (the
 * tensor's position: 0..nconv-1 for conv, nconv for temporal) set; for
 * MR_SP_OVERLAP the earlier tensor it overlaps is *which >> 8. */
int mr_state_pool_init(mr_state_pool *p, const mr_tensor *const *conv, int nconv,
                       const mr_tensor *temporal, int *reason, int *which);

/* Checks host slot indices: each in [0, slots].  Returns MR_OK, or
 * MR_EINVAL with *bad the first offending position. */
int mr_state_pool_check_slots(const mr_state_pool *p, const int64_t *idx, int64_t n, int64_t *bad);

/* Reasons mr_state_pool_check_pairs() refuses a copy. */
enum {
    MR_PAIR_OK = 0,
    MR_PAIR_RANGE_SRC,    /* src[i] out of [0, slots] */
    MR_PAIR_RANGE_DST,    /* dst[i] out of [0, slots] */
    MR_PAIR_SAME,         /* src[i] == dst[i] */
    MR_PAIR_DST_TWICE,    /* dst[i] appears earlier in dst */
    MR_PAIR_DST_IS_SRC    /* dst[i] is also a source (order would matter) */
};

/* Checks a host copy plan: indices in range, destinations distinct and
 * never a source.  Returns MR_OK; MR_EINVAL with *reason (MR_PAIR_*) and
 * *bad (position) set; or MR_ENOMEM.  With src NULL it checks the
 * destinations alone (a snapshot's: in range and distinct). */
int mr_state_pool_check_pairs(const mr_state_pool *p, const int64_t *src, const int64_t *dst,
                              int64_t n, int *reason, int64_t *bad);

/* Host index vectors: every x[i] in [0, end)?  MR_OK, or MR_EINVAL with
 * *bad the first position that is not. */
int mr_index_check_below(const int64_t *x, int64_t n, int64_t end, int64_t *bad);
/* Keeps the pairs (a[i], b[i]) whose mask[i] is nonzero, in order, in
 * oa[] and ob[]; returns how many. */
int64_t mr_index_select(const int64_t *a, const int64_t *b, const int64_t *mask, int64_t n, int64_t *oa,
                        int64_t *ob);

/* Reasons the source tensor of a snapshot is refused. */
enum {
    MR_SNAP_OK = 0,
    MR_SNAP_CONV_NDIM,   /* conv[ci] is not [layers, slots + 1, dim, K - 1] */
    MR_SNAP_SHAPE,       /* h: not [..., num_chunks, *temporal_shape]; x: not [T, dim] */
    MR_SNAP_DTYPE,       /* h: not the temporal dtype nor float32/bfloat16 both sides; x: not conv's */
    MR_SNAP_DEVICE       /* not on the pool's device */
};

/* The plan of snapshot_ssm_from_h for layer (in range) and the per-chunk
 * states h.  Returns MR_OK with *s filled, or MR_EINVAL with *reason
 * (shape, device, dtype: checked in that order). */
int mr_state_pool_ssm_plan(const mr_state_pool *p, int64_t layer, const mr_tensor *h, mr_ssm_snap *s,
                           int *reason);
/* The plan of snapshot_conv_window for layer and conv tensor ci (both in
 * range) and the pre-conv input x: conv[ci]'s rank first, then x's shape,
 * dtype and device.  With x NULL only conv[ci] is checked.  Returns MR_OK
 * with *s filled (when x is given), or MR_EINVAL with *reason. */
int mr_state_pool_conv_plan(const mr_state_pool *p, int64_t layer, int64_t ci, const mr_tensor *x,
                            mr_conv_snap *s, int *reason);

/* The kernels over the whole pool (see kernels.h for index vectors).
 * Return MR_OK or the kernel's status. */
int mr_state_pool_copy(const mr_state_pool *p, mr_index src, mr_index dst, void *stream);
int mr_state_pool_clear(const mr_state_pool *p, mr_index idx, void *stream);
int mr_state_pool_track(const mr_state_pool *p, mr_index running, mr_index track, mr_index mask,
                        void *stream);

#endif /* MR_STATE_POOL_H */
