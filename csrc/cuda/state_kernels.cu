// state_kernels.cu - CUDA versions of the state kernels (see kernels.h).
//
// Every kernel runs on the caller's stream, allocates nothing and never
// synchronises, so launches with device-side index vectors can be captured
// in a CUDA graph.  Host index vectors travel inside the kernel parameters
// (up to MR_CUDA_INLINE_IDX entries per launch).
//
// copy/clear/track share one kernel.  Its grid is one block per work item
// (index pair, tensor, layer, chunk of CHUNK_BYTES of the row), so a single
// slot of a large model (36 layers x 2 MiB) still spreads over thousands of
// blocks.  Each block moves its chunk with 16-byte accesses when the
// tensor's base, strides and row size allow it, else 4-byte or 1-byte ones.
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels.h"
#include "tensor.h"

extern "C" void mr_set_cuda_error(cudaError_t err, const char *where);

namespace {

constexpr int THREADS = 256;
constexpr int64_t CHUNK_BYTES = 32768;        // bytes of a row moved by one block
constexpr int VEC_PER_THREAD = CHUNK_BYTES / 16 / THREADS;
constexpr int INL = MR_CUDA_INLINE_IDX;

// ---- index sources ---------------------------------------------------------

struct DevVec {
    const void *p;
    int bits;
};

__device__ __forceinline__ int64_t
load_index(DevVec v, int64_t i)
{
    if (v.bits == 32) {
        return static_cast<const int32_t *>(v.p)[i];
    }
    return static_cast<const int64_t *>(v.p)[i];
}

__device__ __forceinline__ bool
load_mask(DevVec v, int64_t i)
{
    switch (v.bits) {
    case 8: return static_cast<const uint8_t *>(v.p)[i] != 0;
    case 16: return static_cast<const uint16_t *>(v.p)[i] != 0;
    case 32: return static_cast<const uint32_t *>(v.p)[i] != 0;
    default: return static_cast<const uint64_t *>(v.p)[i] != 0;
    }
}

// Two index vectors (a, b) and an optional mask: host values inline, or
// device pointers.
template <bool INLINE> struct Pairs;

template <> struct Pairs<true> {
    int64_t a[INL];
    int64_t b[INL];
    __device__ __forceinline__ bool get(int64_t i, int64_t *x, int64_t *y) const
    {
        *x = a[i];
        *y = b[i];
        return true;
    }
};

template <> struct Pairs<false> {
    DevVec a, b, mask;   // a.p may be NULL (clear: only b is used)
    int64_t first;       // entry of this launch's first pair
    __device__ __forceinline__ bool get(int64_t i, int64_t *x, int64_t *y) const
    {
        i += first;
        if (mask.p != nullptr && !load_mask(mask, i)) {
            return false;
        }
        *x = a.p != nullptr ? load_index(a, i) : 0;
        *y = load_index(b, i);
        return true;
    }
};

// ---- copy / clear / track ---------------------------------------------------

struct RowsGeom {
    mr_state_layout L;
    int64_t chunks[MR_MAX_STATE_TENSORS];      // chunks per row
    int64_t cum[MR_MAX_STATE_TENSORS + 1];     // prefix sums of layers * chunks
    int32_t width[MR_MAX_STATE_TENSORS];       // access width in bytes: 16, 4 or 1
};

template <bool INLINE> struct RowsParams {
    RowsGeom g;
    Pairs<INLINE> idx;
};

// Copies (or zeroes, src == nullptr) nbytes from src to dst with 16-byte
// accesses: every thread issues all its loads before its stores.
__device__ __forceinline__ void
move16(char *__restrict__ dst, const char *__restrict__ src, int64_t nbytes)
{
    const int64_t n = nbytes / 16;
    uint4 v[VEC_PER_THREAD];
    uint4 *d = reinterpret_cast<uint4 *>(dst);
    const uint4 *s = reinterpret_cast<const uint4 *>(src);
#pragma unroll
    for (int k = 0; k < VEC_PER_THREAD; k++) {
        const int64_t e = threadIdx.x + (int64_t)k * THREADS;
        if (src == nullptr) {
            v[k] = make_uint4(0, 0, 0, 0);
        }
        else if (e < n) {
            v[k] = s[e];
        }
    }
#pragma unroll
    for (int k = 0; k < VEC_PER_THREAD; k++) {
        const int64_t e = threadIdx.x + (int64_t)k * THREADS;
        if (e < n) {
            d[e] = v[k];
        }
    }
}

template <typename T>
__device__ __forceinline__ void
move_scalar(char *__restrict__ dst, const char *__restrict__ src, int64_t nbytes)
{
    const int64_t n = nbytes / (int64_t)sizeof(T);
    T *d = reinterpret_cast<T *>(dst);
    const T *s = reinterpret_cast<const T *>(src);
    for (int64_t e = threadIdx.x; e < n; e += THREADS) {
        d[e] = src == nullptr ? T(0) : s[e];
    }
}

template <bool CLEAR, bool INLINE>
__global__ void __launch_bounds__(THREADS)
rows_kernel(const __grid_constant__ RowsParams<INLINE> p)
{
    const RowsGeom &g = p.g;
    const int nt = g.L.ntensors;
    const int64_t per_pair = g.cum[nt];
    const int64_t b = blockIdx.x;
    const int64_t pair = b / per_pair;
    int64_t r = b - pair * per_pair;
    int t = 0;
    while (t + 1 < nt && r >= g.cum[t + 1]) {
        t++;
    }
    r -= g.cum[t];
    const int64_t layer = r / g.chunks[t];
    const int64_t chunk = r - layer * g.chunks[t];

    int64_t s, d;
    if (!p.idx.get(pair, &s, &d)) {
        return;
    }
    const int64_t rows = g.L.rows;
    if (d < 0 || d >= rows || (!CLEAR && (s < 0 || s >= rows))) {
        return;
    }
    const mr_state_desc &D = g.L.t[t];
    const int64_t off = chunk * CHUNK_BYTES;
    const int64_t left = D.row_bytes - off;
    const int64_t nbytes = left < CHUNK_BYTES ? left : CHUNK_BYTES;
    char *dp = D.base + layer * D.layer_stride + d * D.slot_stride + off;
    const char *sp = CLEAR ? nullptr : D.base + layer * D.layer_stride + s * D.slot_stride + off;
    switch (g.width[t]) {
    case 16: move16(dp, sp, nbytes); break;
    case 4: move_scalar<uint32_t>(dp, sp, nbytes); break;
    default: move_scalar<uint8_t>(dp, sp, nbytes); break;
    }
}

// Fills the per-tensor chunking of a layout.  Returns the blocks per pair.
int64_t
rows_geom(const mr_state_layout *L, RowsGeom *g)
{
    g->L = *L;
    g->cum[0] = 0;
    for (int t = 0; t < L->ntensors; t++) {
        const mr_state_desc &D = L->t[t];
        int64_t ch = (D.row_bytes + CHUNK_BYTES - 1) / CHUNK_BYTES;
        if (ch == 0) {
            ch = 1;
        }
        g->chunks[t] = ch;
        g->cum[t + 1] = g->cum[t] + L->layers * ch;
        uintptr_t all = (uintptr_t)D.base | (uintptr_t)D.layer_stride | (uintptr_t)D.slot_stride
                        | (uintptr_t)D.row_bytes;
        g->width[t] = (all % 16 == 0) ? 16 : (all % 4 == 0) ? 4 : 1;
    }
    return g->cum[L->ntensors];
}

// ---- device guard -------------------------------------------------------------

// Makes `device` current for the lifetime of the guard.
struct DeviceGuard {
    int prev = -1;
    int dev;
    cudaError_t err = cudaSuccess;
    explicit DeviceGuard(int device) : dev(device)
    {
        err = cudaGetDevice(&prev);
        if (err == cudaSuccess && prev != dev) {
            err = cudaSetDevice(dev);
        }
    }
    ~DeviceGuard()
    {
        if (prev >= 0 && prev != dev) {
            cudaSetDevice(prev);
        }
    }
};

int
fail(cudaError_t err, const char *where)
{
    mr_set_cuda_error(err, where);
    return MR_ECUDA;
}

int
check_launch(const char *where)
{
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? MR_OK : fail(err, where);
}

DevVec
devvec(mr_index v)
{
    DevVec d;
    d.p = v.ptr;
    d.bits = v.bits;
    return d;
}

constexpr int64_t MAX_GRID = 0x7fffffff;

// One entry point for copy (a = src), clear (a absent) and track (mask).
template <bool CLEAR>
int
launch_rows(int device, const mr_state_layout *L, mr_index a, mr_index b, mr_index mask,
            void *stream, const char *where)
{
    DeviceGuard guard(device);
    if (guard.err != cudaSuccess) {
        return fail(guard.err, where);
    }
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const int64_t n = b.n;
    if (n == 0 || L->ntensors == 0 || L->layers == 0) {
        return MR_OK;
    }
    cudaGetLastError();   // drop a stale, non-sticky error from earlier work
    if (b.on_device) {
        RowsParams<false> p;
        const int64_t per_pair = rows_geom(L, &p.g);
        const int64_t step = MAX_GRID / per_pair;
        p.idx.a = devvec(a);
        p.idx.b = devvec(b);
        p.idx.mask = devvec(mask);
        for (int64_t first = 0; first < n; first += step) {
            const int64_t cnt = n - first < step ? n - first : step;
            p.idx.first = first;
            rows_kernel<CLEAR, false><<<(unsigned)(cnt * per_pair), THREADS, 0, st>>>(p);
            int rc = check_launch(where);
            if (rc != MR_OK) {
                return rc;
            }
        }
        return MR_OK;
    }
    // Host vectors: the binding already applied the mask and checked them.
    RowsParams<true> p;
    const int64_t per_pair = rows_geom(L, &p.g);
    const int64_t *ha = static_cast<const int64_t *>(a.ptr);
    const int64_t *hb = static_cast<const int64_t *>(b.ptr);
    int64_t step = MAX_GRID / per_pair;
    if (step > INL) {
        step = INL;
    }
    for (int64_t first = 0; first < n; first += step) {
        const int64_t cnt = n - first < step ? n - first : step;
        for (int64_t i = 0; i < cnt; i++) {
            p.idx.a[i] = ha != nullptr ? ha[first + i] : 0;
            p.idx.b[i] = hb[first + i];
        }
        rows_kernel<CLEAR, true><<<(unsigned)(cnt * per_pair), THREADS, 0, st>>>(p);
        int rc = check_launch(where);
        if (rc != MR_OK) {
            return rc;
        }
    }
    return MR_OK;
}

// ---- SSM snapshot from h ----------------------------------------------------------

constexpr int SNAP_PER_THREAD = 16;
constexpr int64_t SNAP_ELEMS = (int64_t)THREADS * SNAP_PER_THREAD;

template <bool INLINE> struct SsmParams {
    mr_ssm_snap s;
    int64_t blocks_per_item;
    Pairs<INLINE> idx;   // a = chunk of h, b = destination slot
};

struct F32 {
    typedef float T;
    __device__ static float load(T v) { return v; }
    __device__ static T store(float f) { return f; }
};
struct BF16 {
    typedef uint16_t T;
    __device__ static float load(T v) { return mr_bf16_to_f32(v); }
    __device__ static T store(float f) { return mr_f32_to_bf16(f); }
};
// Same type on both sides: a plain copy of the bits.
template <typename U> struct Bits {
    typedef U T;
};

template <typename S, typename D>
__device__ __forceinline__ typename D::T
convert(typename S::T v)
{
    return D::store(S::load(v));
}

template <typename S, typename D, bool SAME, bool INLINE>
__global__ void __launch_bounds__(THREADS)
ssm_kernel(const __grid_constant__ SsmParams<INLINE> p)
{
    const int64_t item = blockIdx.x / p.blocks_per_item;
    const int64_t part = blockIdx.x - item * p.blocks_per_item;
    int64_t c, slot;
    if (!p.idx.get(item, &c, &slot)) {
        return;
    }
    if (c < 0 || c >= p.s.h_chunks || slot < 0 || slot >= p.s.dst_rows) {
        return;
    }
    typedef typename S::T ST;
    typedef typename D::T DT;
    const ST *__restrict__ src = reinterpret_cast<const ST *>(p.s.h) + c * p.s.elems;
    DT *__restrict__ dst = reinterpret_cast<DT *>(p.s.dst + slot * p.s.dst_slot_stride);
    const int64_t e0 = part * SNAP_ELEMS + threadIdx.x;
    ST v[SNAP_PER_THREAD];
#pragma unroll
    for (int k = 0; k < SNAP_PER_THREAD; k++) {
        const int64_t e = e0 + (int64_t)k * THREADS;
        if (e < p.s.elems) {
            v[k] = src[e];
        }
    }
#pragma unroll
    for (int k = 0; k < SNAP_PER_THREAD; k++) {
        const int64_t e = e0 + (int64_t)k * THREADS;
        if (e < p.s.elems) {
            if constexpr (SAME) {
                dst[e] = v[k];
            }
            else {
                dst[e] = convert<S, D>(v[k]);
            }
        }
    }
}

template <bool INLINE>
int
launch_ssm_typed(const SsmParams<INLINE> &p, unsigned blocks, cudaStream_t st)
{
    const int hd = p.s.h_dtype, dd = p.s.dst_dtype;
    if (hd == dd) {
        switch (mr_dtype_size(hd)) {
        case 1: ssm_kernel<Bits<uint8_t>, Bits<uint8_t>, true, INLINE><<<blocks, THREADS, 0, st>>>(p); break;
        case 2: ssm_kernel<Bits<uint16_t>, Bits<uint16_t>, true, INLINE><<<blocks, THREADS, 0, st>>>(p); break;
        case 4: ssm_kernel<Bits<uint32_t>, Bits<uint32_t>, true, INLINE><<<blocks, THREADS, 0, st>>>(p); break;
        default: ssm_kernel<Bits<uint64_t>, Bits<uint64_t>, true, INLINE><<<blocks, THREADS, 0, st>>>(p); break;
        }
    }
    else if (hd == MR_DTYPE_BFLOAT16 && dd == MR_DTYPE_FLOAT32) {
        ssm_kernel<BF16, F32, false, INLINE><<<blocks, THREADS, 0, st>>>(p);
    }
    else if (hd == MR_DTYPE_FLOAT32 && dd == MR_DTYPE_BFLOAT16) {
        ssm_kernel<F32, BF16, false, INLINE><<<blocks, THREADS, 0, st>>>(p);
    }
    else {
        return MR_EINVAL;
    }
    return check_launch("snapshot_ssm_from_h");
}

// ---- conv window snapshot ---------------------------------------------------------

template <bool INLINE> struct ConvParams {
    mr_conv_snap s;
    int64_t blocks_per_item;
    Pairs<INLINE> idx;   // a = position, b = destination slot
};

template <typename T, bool INLINE>
__global__ void __launch_bounds__(THREADS)
conv_kernel(const __grid_constant__ ConvParams<INLINE> p)
{
    const int64_t item = blockIdx.x / p.blocks_per_item;
    const int64_t part = blockIdx.x - item * p.blocks_per_item;
    int64_t pos, slot;
    if (!p.idx.get(item, &pos, &slot)) {
        return;
    }
    if (slot < 0 || slot >= p.s.dst_rows) {
        return;
    }
    const int64_t c = part * THREADS + threadIdx.x;
    if (c >= p.s.dim) {
        return;
    }
    const T *__restrict__ x = reinterpret_cast<const T *>(p.s.x);
    T *__restrict__ dst = reinterpret_cast<T *>(p.s.dst + slot * p.s.dst_slot_stride) + c * p.s.km1;
    for (int64_t j = 0; j < p.s.km1; j++) {
        // (clamped below 0 without the subtraction wrapping: pos takes any int64)
        int64_t t = pos < INT64_MIN + p.s.km1 ? 0 : pos - p.s.km1 + j;
        t = t < 0 ? 0 : (t > p.s.tokens - 1 ? p.s.tokens - 1 : t);
        dst[j] = x[t * p.s.dim + c];
    }
}

template <bool INLINE>
int
launch_conv_typed(const ConvParams<INLINE> &p, unsigned blocks, cudaStream_t st)
{
    switch (p.s.elem_size) {
    case 1: conv_kernel<uint8_t, INLINE><<<blocks, THREADS, 0, st>>>(p); break;
    case 2: conv_kernel<uint16_t, INLINE><<<blocks, THREADS, 0, st>>>(p); break;
    case 4: conv_kernel<uint32_t, INLINE><<<blocks, THREADS, 0, st>>>(p); break;
    case 8: conv_kernel<uint64_t, INLINE><<<blocks, THREADS, 0, st>>>(p); break;
    default: return MR_EINVAL;
    }
    return check_launch("snapshot_conv_window");
}

// Launches a per-item kernel family (ssm or conv) over host or device
// index vectors, splitting the items into launches that fit the grid.
template <template <bool> class Params, typename Snap, typename LaunchInl, typename LaunchDev>
int
launch_items(int device, const Snap *s, int64_t blocks_per_item, mr_index a, mr_index b,
             void *stream, const char *where, LaunchInl launch_inl, LaunchDev launch_dev)
{
    DeviceGuard guard(device);
    if (guard.err != cudaSuccess) {
        return fail(guard.err, where);
    }
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const int64_t n = a.n;
    if (n == 0 || blocks_per_item == 0) {
        return MR_OK;
    }
    cudaGetLastError();
    int64_t step = MAX_GRID / blocks_per_item;
    if (a.on_device) {
        Params<false> p;
        p.s = *s;
        p.blocks_per_item = blocks_per_item;
        p.idx.a = devvec(a);
        p.idx.b = devvec(b);
        p.idx.mask.p = nullptr;
        p.idx.mask.bits = 0;
        for (int64_t first = 0; first < n; first += step) {
            const int64_t cnt = n - first < step ? n - first : step;
            p.idx.first = first;
            int rc = launch_dev(p, (unsigned)(cnt * blocks_per_item), st);
            if (rc != MR_OK) {
                return rc;
            }
        }
        return MR_OK;
    }
    if (step > INL) {
        step = INL;
    }
    Params<true> p;
    p.s = *s;
    p.blocks_per_item = blocks_per_item;
    const int64_t *ha = static_cast<const int64_t *>(a.ptr);
    const int64_t *hb = static_cast<const int64_t *>(b.ptr);
    for (int64_t first = 0; first < n; first += step) {
        const int64_t cnt = n - first < step ? n - first : step;
        for (int64_t i = 0; i < cnt; i++) {
            p.idx.a[i] = ha[first + i];
            p.idx.b[i] = hb[first + i];
        }
        int rc = launch_inl(p, (unsigned)(cnt * blocks_per_item), st);
        if (rc != MR_OK) {
            return rc;
        }
    }
    return MR_OK;
}

// ---- req-to-token ---------------------------------------------------------------------

struct RttParams {
    mr_rtt_write w;
    DevVec rows, starts, ends;   // ends.p == NULL: fixed width
};

__global__ void __launch_bounds__(THREADS)
rtt_kernel(const __grid_constant__ RttParams p)
{
    const int64_t i = blockIdx.x;
    const int64_t row = load_index(p.rows, i);
    const int64_t start = load_index(p.starts, i);
    int64_t len, off;
    if (p.ends.p != nullptr) {
        __shared__ unsigned long long total;
        if (threadIdx.x == 0) {
            total = 0;
        }
        __syncthreads();
        unsigned long long part = 0;
        for (int64_t j = threadIdx.x; j < i; j += THREADS) {
            // (an entry's length only when it is one: no signed overflow)
            const int64_t sj = load_index(p.starts, j), ej = load_index(p.ends, j);
            part += sj >= 0 && ej > sj ? (unsigned long long)ej - (unsigned long long)sj : 0ull;
        }
        atomicAdd(&total, part);
        __syncthreads();
        const int64_t end = load_index(p.ends, i);
        if (total > (unsigned long long)INT64_MAX || start < 0 || end < start) {
            return;
        }
        off = (int64_t)total;
        len = end - start;   // start >= 0, end >= start: no overflow
    }
    else {
        len = p.w.width;
        off = i * p.w.width;
    }
    // each bound compared without a sum that could overflow
    if (row < 0 || row >= p.w.nrows || start < 0 || start > p.w.ncols || len < 0 || len > p.w.ncols - start
        || len > p.w.nvalues || off > p.w.nvalues - len) {
        return;
    }
    for (int64_t k = threadIdx.x; k < len; k += THREADS) {
        const int64_t v = p.w.value_bits == 32 ? (int64_t) static_cast<const int32_t *>(p.w.values)[off + k]
                                               : static_cast<const int64_t *>(p.w.values)[off + k];
        const int64_t at = row * p.w.ncols + start + k;
        if (p.w.table_bits == 32) {
            reinterpret_cast<int32_t *>(p.w.table)[at] = (int32_t)v;
        }
        else {
            reinterpret_cast<int64_t *>(p.w.table)[at] = v;
        }
    }
}

}  // namespace

// ---- the C ABI ------------------------------------------------------------------------

extern "C" int
mr_cuda_copy_slots(int device, const mr_state_layout *L, mr_index src, mr_index dst, mr_index mask,
                   void *stream)
{
    return launch_rows<false>(device, L, src, dst, mask, stream, mask.ptr ? "track_decode" : "copy_slots");
}

extern "C" int
mr_cuda_clear_slots(int device, const mr_state_layout *L, mr_index idx, void *stream)
{
    mr_index none = {nullptr, 0, 0, 0};
    return launch_rows<true>(device, L, none, idx, none, stream, "clear_slots");
}

extern "C" int
mr_cuda_snapshot_ssm(int device, const mr_ssm_snap *s, mr_index chunk, mr_index slot, void *stream)
{
    const int64_t bpi = (s->elems + SNAP_ELEMS - 1) / SNAP_ELEMS;
    return launch_items<SsmParams>(
        device, s, bpi, chunk, slot, stream, "snapshot_ssm_from_h",
        [](const SsmParams<true> &p, unsigned blocks, cudaStream_t st) { return launch_ssm_typed<true>(p, blocks, st); },
        [](const SsmParams<false> &p, unsigned blocks, cudaStream_t st) { return launch_ssm_typed<false>(p, blocks, st); });
}

extern "C" int
mr_cuda_snapshot_conv(int device, const mr_conv_snap *s, mr_index pos, mr_index slot, void *stream)
{
    const int64_t bpi = (s->dim + THREADS - 1) / THREADS;
    return launch_items<ConvParams>(
        device, s, bpi, pos, slot, stream, "snapshot_conv_window",
        [](const ConvParams<true> &p, unsigned blocks, cudaStream_t st) { return launch_conv_typed<true>(p, blocks, st); },
        [](const ConvParams<false> &p, unsigned blocks, cudaStream_t st) { return launch_conv_typed<false>(p, blocks, st); });
}

extern "C" int
mr_cuda_write_req_to_token(int device, const mr_rtt_write *w, mr_index rows, mr_index starts,
                           mr_index ends, void *stream)
{
    DeviceGuard guard(device);
    if (guard.err != cudaSuccess) {
        return fail(guard.err, "write_req_to_token");
    }
    if (rows.n == 0) {
        return MR_OK;
    }
    cudaGetLastError();
    RttParams p;
    p.w = *w;
    p.rows = devvec(rows);
    p.starts = devvec(starts);
    p.ends = devvec(ends);
    // rows.n is bounded by the binding (it fits a grid).
    rtt_kernel<<<(unsigned)rows.n, THREADS, 0, static_cast<cudaStream_t>(stream)>>>(p);
    return check_launch("write_req_to_token");
}

extern "C" int
mr_cuda_memcpy_h2d(int device, void *dst, const void *src, size_t nbytes, void *stream)
{
    DeviceGuard guard(device);
    if (guard.err != cudaSuccess) {
        return fail(guard.err, "cudaSetDevice");
    }
    cudaError_t err = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream));
    return err == cudaSuccess ? MR_OK : fail(err, "cudaMemcpyAsync");
}

extern "C" int
mr_cuda_alloc_zeroed(int device, size_t nbytes, void **out)
{
    DeviceGuard guard(device);
    if (guard.err != cudaSuccess) {
        return fail(guard.err, "cudaSetDevice");
    }
    void *p = nullptr;
    cudaError_t err = cudaMalloc(&p, nbytes ? nbytes : 1);
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return MR_ENOMEM;
    }
    if (err != cudaSuccess) {
        return fail(err, "cudaMalloc");
    }
    err = cudaMemset(p, 0, nbytes);
    if (err == cudaSuccess) {
        err = cudaDeviceSynchronize();
    }
    if (err != cudaSuccess) {
        cudaFree(p);
        return fail(err, "cudaMemset");
    }
    *out = p;
    return MR_OK;
}

extern "C" void
mr_cuda_free(int device, void *p)
{
    DeviceGuard guard(device);
    cudaFree(p);
}
