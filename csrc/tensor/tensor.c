/* tensor.c - the tensor owner type: dtypes, DLPack import checks,
 * ownership and export.  See tensor.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "cuda_api.h"
#include "kernels.h"
#include "tensor.h"

/* ------------------------------------------------------------------------
 * dtypes */

static const struct {
    const char *name;
    uint8_t code;
    uint8_t bits;
} mr_dtypes[MR_DTYPE_COUNT] = {
    [MR_DTYPE_BOOL] = {"bool", MR_DL_BOOL, 8},
    [MR_DTYPE_INT8] = {"int8", MR_DL_INT, 8},
    [MR_DTYPE_UINT8] = {"uint8", MR_DL_UINT, 8},
    [MR_DTYPE_INT16] = {"int16", MR_DL_INT, 16},
    [MR_DTYPE_INT32] = {"int32", MR_DL_INT, 32},
    [MR_DTYPE_INT64] = {"int64", MR_DL_INT, 64},
    [MR_DTYPE_FLOAT16] = {"float16", MR_DL_FLOAT, 16},
    [MR_DTYPE_BFLOAT16] = {"bfloat16", MR_DL_BFLOAT, 16},
    [MR_DTYPE_FLOAT32] = {"float32", MR_DL_FLOAT, 32},
    [MR_DTYPE_FLOAT64] = {"float64", MR_DL_FLOAT, 64},
};

int
mr_dtype_from_dl(mr_dl_dtype dt, int *out)
{
    if (dt.lanes != 1) {
        return MR_EINVAL;
    }
    for (int i = 0; i < MR_DTYPE_COUNT; i++) {
        if (mr_dtypes[i].code == dt.code && mr_dtypes[i].bits == dt.bits) {
            *out = i;
            return MR_OK;
        }
    }
    return MR_EINVAL;
}

mr_dl_dtype
mr_dtype_to_dl(int dtype)
{
    mr_dl_dtype dt = {mr_dtypes[dtype].code, mr_dtypes[dtype].bits, 1};
    return dt;
}

size_t
mr_dtype_size(int dtype)
{
    return mr_dtypes[dtype].bits / 8;
}

const char *
mr_dtype_name(int dtype)
{
    if (dtype < 0 || dtype >= MR_DTYPE_COUNT) {
        return "unknown";
    }
    return mr_dtypes[dtype].name;
}

int
mr_dtype_from_name(const char *name, int *out)
{
    static const struct {
        const char *alias;
        int dtype;
    } aliases[] = {
        {"bf16", MR_DTYPE_BFLOAT16}, {"fp16", MR_DTYPE_FLOAT16}, {"half", MR_DTYPE_FLOAT16},
        {"fp32", MR_DTYPE_FLOAT32},  {"float", MR_DTYPE_FLOAT32}, {"fp64", MR_DTYPE_FLOAT64},
        {"double", MR_DTYPE_FLOAT64}, {"long", MR_DTYPE_INT64},   {"int", MR_DTYPE_INT32},
    };
    if (strncmp(name, "torch.", 6) == 0) {
        name += 6;
    }
    for (int i = 0; i < MR_DTYPE_COUNT; i++) {
        if (strcmp(name, mr_dtypes[i].name) == 0) {
            *out = i;
            return MR_OK;
        }
    }
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++) {
        if (strcmp(name, aliases[i].alias) == 0) {
            *out = aliases[i].dtype;
            return MR_OK;
        }
    }
    return MR_EINVAL;
}

/* ------------------------------------------------------------------------
 * Import */

int
mr_dl_is_compact(int ndim, const int64_t *shape, const int64_t *strides)
{
    if (strides == NULL) {
        return 1;
    }
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        numel *= shape[i];
    }
    if (numel <= 1) {
        return 1;
    }
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] != 1 && strides[i] != expect) {
            return 0;
        }
        expect *= shape[i];
    }
    return 1;
}

int
mr_dl_unwrap(void *managed, int versioned, const mr_dl_tensor **dl, uint64_t *flags)
{
    *flags = 0;
    if (!versioned) {
        *dl = &((mr_dl_managed *)managed)->dl_tensor;
        return MR_OK;
    }
    mr_dl_managed_versioned *m = managed;
    *dl = &m->dl_tensor;
    *flags = m->flags;
    return m->version.major == MR_DLPACK_MAJOR ? MR_OK : MR_EINVAL;
}

int
mr_tensor_from_dl(const mr_dl_tensor *dl, mr_tensor *out, int *problem)
{
    memset(out, 0, sizeof(*out));
    *problem = MR_TP_OK;
    if (dl->ndim < 0 || dl->ndim > MR_TENSOR_MAX_NDIM || (dl->ndim > 0 && dl->shape == NULL)) {
        *problem = MR_TP_NDIM;
        return MR_EINVAL;
    }
    if (mr_dtype_from_dl(dl->dtype, &out->dtype) != MR_OK) {
        *problem = MR_TP_DTYPE;
        return MR_EINVAL;
    }
    if (dl->device.device_type != MR_DL_CPU && dl->device.device_type != MR_DL_CUDA) {
        *problem = MR_TP_DEVICE;
        return MR_EINVAL;
    }
    int64_t numel = 1;
    for (int i = 0; i < dl->ndim; i++) {
        if (dl->shape[i] < 0) {
            *problem = MR_TP_LAYOUT;
            return MR_EINVAL;
        }
        out->shape[i] = dl->shape[i];
        if (dl->shape[i] != 0 && numel > INT64_MAX / dl->shape[i]) {
            *problem = MR_TP_LAYOUT;
            return MR_EINVAL;
        }
        numel *= dl->shape[i];
    }
    if (!mr_dl_is_compact(dl->ndim, dl->shape, dl->strides)) {
        *problem = MR_TP_LAYOUT;
        return MR_EINVAL;
    }
    if (dl->data == NULL && numel > 0) {
        *problem = MR_TP_NULL;
        return MR_EINVAL;
    }
    out->ndim = dl->ndim;
    out->numel = numel;
    out->data = (char *)dl->data + dl->byte_offset;
    out->device_type = dl->device.device_type;
    out->device_id = dl->device.device_id;
    return MR_OK;
}

int
mr_device_reachable(int32_t device_type, int32_t device_id)
{
    if (device_type != MR_DL_CUDA) {
        return MR_TP_OK;
    }
    if (!mr_k_have_cuda()) {
        return MR_TP_NO_CUDA;
    }
    return device_id >= 0 && device_id < mr_cuda_device_count() ? MR_TP_OK : MR_TP_CUDA_ID;
}

int
mr_tensor_take_dl(void *managed, int versioned, int writable, mr_tensor *out, int *problem)
{
    const mr_dl_tensor *dl;
    uint64_t flags;
    memset(out, 0, sizeof(*out));
    if (mr_dl_unwrap(managed, versioned, &dl, &flags) != MR_OK) {
        *problem = MR_TP_VERSION;
        return MR_EINVAL;
    }
    if (mr_tensor_from_dl(dl, out, problem) != MR_OK) {
        return MR_EINVAL;
    }
    *problem = writable && (flags & MR_DL_FLAG_READ_ONLY) ? MR_TP_READONLY
                                                          : mr_device_reachable(out->device_type, out->device_id);
    return *problem == MR_TP_OK ? MR_OK : MR_EINVAL;
}

void
mr_dl_delete(void *managed, int versioned)
{
    if (versioned) {
        mr_dl_managed_versioned *m = managed;
        if (m->deleter != NULL) {
            m->deleter(m);
        }
    }
    else {
        mr_dl_managed *m = managed;
        if (m->deleter != NULL) {
            m->deleter(m);
        }
    }
}

/* ------------------------------------------------------------------------
 * Index tensors */

int
mr_index_dtype_ok(int dtype, int mask)
{
    return dtype == MR_DTYPE_INT32 || dtype == MR_DTYPE_INT64
           || (mask && (dtype == MR_DTYPE_BOOL || dtype == MR_DTYPE_UINT8 || dtype == MR_DTYPE_INT8));
}

void
mr_index_to_host(const mr_tensor *t, int64_t *out)
{
    for (int64_t i = 0; i < t->numel; i++) {
        switch (mr_dtype_size(t->dtype)) {
        case 1: out[i] = ((const uint8_t *)t->data)[i]; break;
        case 4: out[i] = ((const int32_t *)t->data)[i]; break;
        default: out[i] = ((const int64_t *)t->data)[i]; break;
        }
    }
}

int
mr_index_view(const mr_tensor *t, int mask, int32_t dev_type, int32_t dev_id, mr_index *out, int *problem)
{
    int dev = t->device_type == MR_DL_CUDA;
    *problem = MR_IX_OK;
    if (!mr_index_dtype_ok(t->dtype, mask)) {
        *problem = MR_IX_DTYPE;
    }
    else if (t->ndim > 1) {
        *problem = MR_IX_NDIM;
    }
    else if (dev && (dev_type != MR_DL_CUDA || dev_id != t->device_id)) {
        /* kernels read device indices where they run */
        *problem = MR_IX_DEVICE;
    }
    *out = (mr_index){dev ? t->data : NULL, t->numel, dev ? (int)mr_dtype_size(t->dtype) * 8 : 64, dev};
    return *problem == MR_IX_OK ? MR_OK : MR_EINVAL;
}

/* ------------------------------------------------------------------------
 * Devices */

void
mr_device_format(char *buf, size_t n, int32_t type, int32_t id)
{
    if (type == MR_DL_CPU) {
        snprintf(buf, n, "cpu");
    }
    else if (type == MR_DL_CUDA) {
        snprintf(buf, n, "cuda:%d", (int)id);
    }
    else {
        snprintf(buf, n, "dlpack-device(%d, %d)", (int)type, (int)id);
    }
}

int
mr_device_from_name(const char *c, int32_t *type, int32_t *id)
{
    if (strcmp(c, "cpu") == 0 || strcmp(c, "cuda") == 0) {
        *type = c[1] == 'p' ? MR_DL_CPU : MR_DL_CUDA;
        *id = 0;
        return MR_OK;
    }
    if (strncmp(c, "cuda:", 5) == 0 && c[5] >= '0' && c[5] <= '9') {
        char *end = NULL;
        long v = strtol(c + 5, &end, 10);
        if (*end == '\0' && v >= 0 && v <= INT32_MAX) {
            *type = MR_DL_CUDA;
            *id = (int32_t)v;
            return MR_OK;
        }
    }
    return MR_EINVAL;
}

void
mr_shape_format(char *dims, size_t ndims, char *gib, size_t ngib, int dtype, int ndim, const int64_t *shape)
{
    size_t off = 0;
    double bytes = (double)mr_dtype_size(dtype);
    for (int i = 0; i < ndim && off < ndims; i++) {
        off += (size_t)snprintf(dims + off, ndims - off, "%s%lld", i ? ", " : "[", (long long)shape[i]);
        bytes *= (double)shape[i];
    }
    if (off < ndims) {
        snprintf(dims + off, ndims - off, "]");
    }
    snprintf(gib, ngib, "%.4g", bytes / 1073741824.0);
}

/* ------------------------------------------------------------------------
 * Ownership */

void
mr_tensor_adopt(mr_tensor *t, void *managed, int versioned)
{
    t->managed = managed;
    t->versioned = versioned;
    t->own = NULL;
}

int
mr_tensor_alloc(mr_tensor *t, int32_t device_type, int32_t device_id, int dtype, int ndim,
                const int64_t *shape)
{
    memset(t, 0, sizeof(*t));
    if (dtype < 0 || dtype >= MR_DTYPE_COUNT || ndim < 0 || ndim > MR_TENSOR_MAX_NDIM) {
        return MR_EINVAL;
    }
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] != 0 && numel > INT64_MAX / 8 / shape[i])) {
            return MR_EINVAL;
        }
        numel *= shape[i];
        t->shape[i] = shape[i];
    }
    size_t nbytes = (size_t)numel * mr_dtype_size(dtype);
    void *p = NULL;
    int rc = mr_k_alloc_zeroed(device_type, device_id, nbytes, &p);
    if (rc != MR_OK) {
        memset(t, 0, sizeof(*t));
        return rc;
    }
    t->data = p;
    t->own = p;
    t->device_type = device_type;
    t->device_id = device_id;
    t->dtype = dtype;
    t->ndim = ndim;
    t->numel = numel;
    return MR_OK;
}

void
mr_tensor_release(mr_tensor *t)
{
    if (t->managed != NULL) {
        mr_dl_delete(t->managed, t->versioned);
    }
    else if (t->own != NULL) {
        mr_k_free(t->device_type, t->device_id, t->own);
    }
    memset(t, 0, sizeof(*t));
}

/* ------------------------------------------------------------------------
 * Export */

/* A managed tensor of either kind. */
typedef union {
    mr_dl_managed_versioned v;
    mr_dl_managed l;
} mr_managed_any;

/* Fills *m: a DLTensor over data (the other fields as DLPack names them),
 * ctx as manager_ctx, deleter dv (versioned: with version major.minor and
 * flags) or dl (legacy). */
static void
mr_managed_fill(mr_managed_any *m, int versioned, void *data, int32_t dev_type, int32_t dev_id, int ndim, int dtype,
                int64_t *shape, int64_t *strides, uint64_t byte_offset, void *ctx, unsigned major, unsigned minor,
                uint64_t flags, void (*dv)(mr_dl_managed_versioned *), void (*dl)(mr_dl_managed *))
{
    mr_dl_tensor t;
    memset(&t, 0, sizeof(t));
    t.data = data;
    t.device.device_type = dev_type;
    t.device.device_id = dev_id;
    t.ndim = ndim;
    t.dtype = mr_dtype_to_dl(dtype);
    t.shape = shape;
    t.strides = strides;
    t.byte_offset = byte_offset;
    if (versioned) {
        m->v.version.major = major;
        m->v.version.minor = minor;
        m->v.manager_ctx = ctx;
        m->v.deleter = dv;
        m->v.flags = flags;
        m->v.dl_tensor = t;
    }
    else {
        m->l.dl_tensor = t;
        m->l.manager_ctx = ctx;
        m->l.deleter = dl;
    }
}

/* What we hand to a consumer: the managed struct first (so its address is
 * the holder's), then the shape and strides it points to. */
typedef struct {
    mr_managed_any m;
    void *ctx;
    void (*on_release)(void *ctx);
    int64_t shape[MR_TENSOR_MAX_NDIM];
    int64_t strides[MR_TENSOR_MAX_NDIM];
} mr_export_holder;

static void
mr_export_free(mr_export_holder *h)
{
    void *ctx = h->ctx;
    void (*on_release)(void *) = h->on_release;
    MR_FREE(h);
    if (on_release != NULL) {
        on_release(ctx);
    }
}

static void
mr_export_deleter_versioned(mr_dl_managed_versioned *self)
{
    mr_export_free((mr_export_holder *)self);
}

static void
mr_export_deleter_legacy(mr_dl_managed *self)
{
    mr_export_free((mr_export_holder *)self);
}

int
mr_tensor_export(const mr_tensor *t, int versioned, void *ctx, void (*on_release)(void *ctx),
                 void **out)
{
    mr_export_holder *h = MR_CALLOC(1, sizeof(*h));
    if (h == NULL) {
        return MR_ENOMEM;
    }
    h->ctx = ctx;
    h->on_release = on_release;
    int64_t stride = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        h->shape[i] = t->shape[i];
        h->strides[i] = stride;
        stride *= t->shape[i];
    }
    mr_managed_fill(&h->m, versioned, t->data, t->device_type, t->device_id, t->ndim, t->dtype, h->shape, h->strides,
                    0, h, MR_DLPACK_MAJOR, MR_DLPACK_MINOR, 0, mr_export_deleter_versioned, mr_export_deleter_legacy);
    *out = h;
    return MR_OK;
}

/* ------------------------------------------------------------------------
 * A test producer */

static long mr_testing_deleted = 0;

typedef struct {
    mr_managed_any m;
    int64_t shape[MR_TENSOR_MAX_NDIM];
    int64_t strides[MR_TENSOR_MAX_NDIM];
    void *buf;
} mr_testing_holder;

static void
mr_testing_free(mr_testing_holder *h)
{
    mr_testing_deleted++;
    MR_FREE(h->buf);
    MR_FREE(h);
}

static void
mr_testing_deleter_v(mr_dl_managed_versioned *m)
{
    mr_testing_free(m->manager_ctx);
}

static void
mr_testing_deleter_l(mr_dl_managed *m)
{
    mr_testing_free(m->manager_ctx);
}

void *
mr_dl_testing_make(const mr_dl_testing_spec *s)
{
    int64_t span = 1, numel = 1;
    for (int i = 0; i < s->ndim; i++) {
        numel *= s->shape[i];
        span += s->strides != NULL ? (s->shape[i] - 1) * s->strides[i] : 0;
    }
    if (s->strides == NULL || numel == 0) {
        span = numel;
    }
    size_t nbytes = (size_t)span * mr_dtype_size(s->dtype) + (size_t)s->byte_offset;
    mr_testing_holder *h = MR_CALLOC(1, sizeof(*h));
    if (h == NULL) {
        return NULL;
    }
    h->buf = MR_MALLOC(nbytes + 16);
    if (h->buf == NULL) {
        MR_FREE(h);
        return NULL;
    }
    unsigned char *b = h->buf;
    for (size_t i = 0; i < nbytes; i++) {
        b[i] = i < (size_t)s->byte_offset ? 0xEE : (unsigned char)(((i - (size_t)s->byte_offset) * 37 + 11) & 0xFF);
    }
    memcpy(h->shape, s->shape, sizeof(int64_t) * (size_t)s->ndim);
    if (s->strides != NULL) {
        memcpy(h->strides, s->strides, sizeof(int64_t) * (size_t)s->ndim);
    }
    mr_managed_fill(&h->m, s->versioned, s->null_data ? NULL : h->buf, s->device_type, s->device_id, s->ndim,
                    s->dtype, h->shape, s->strides != NULL ? h->strides : NULL, (uint64_t)s->byte_offset, h, s->major,
                    s->minor, s->readonly ? MR_DL_FLAG_READ_ONLY : 0, mr_testing_deleter_v, mr_testing_deleter_l);
    return h;
}

void
mr_dl_testing_discard(void *managed, int versioned)
{
    mr_testing_free(versioned ? ((mr_dl_managed_versioned *)managed)->manager_ctx
                              : ((mr_dl_managed *)managed)->manager_ctx);
    mr_testing_deleted--;
}

long
mr_dl_testing_deleted(void)
{
    return mr_testing_deleted;
}
