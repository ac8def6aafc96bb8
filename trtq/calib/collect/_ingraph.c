/* trtq.calib.collect._compiled, part 2: calibration statistics as an ONNX Runtime custom operator.
 *
 * trtq.calib.collect.ingraph puts one node of the operator (domain ai.trtq.calib, type Pow2Stats) after
 * each activation to calibrate, and hands this library to ONNX Runtime
 * (SessionOptions.register_custom_ops_library). Each node then folds its input into the
 * power-of-two histogram of its slot (trtq_pow2_count, _kernels.c) while the tensor is still in
 * cache, and ONNX Runtime frees or reuses the tensor as in plain inference: no activation is
 * exposed as a graph output, copied back or held for a whole batch. The counts follow the rules of
 * trtq.calib.collect.one_pass.Pow2Histograms exactly (rows past the batch's valid ones left out, the
 * per-sample stride, exact merges of ranges), so the statistics are the same integers.
 *
 * ONNX Runtime's C API is used through the table it hands to RegisterCustomOps, by slot number
 * (the table only ever grows at its end; the numbers below are those of API version 16, checked
 * against ONNX Runtime 1.16 to 1.32). No ONNX Runtime header or library is needed to build.
 *
 * Threading: collections are created and freed by Python between sessions (never while one runs);
 * each node writes only its own slot; ONNX Runtime runs one node at a time here (sequential
 * executor), a node spreading its tensor over ONNX Runtime's threads (ParallelFor, API >= 17).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_kernels.h"
#include "_ingraph.h"

#define MAX_COLLECTIONS 64

/* ---------------------------------------------------------------------------------------------
 * collections: one per calibration session, one slot per calibrated tensor
 * ------------------------------------------------------------------------------------------- */

static collection_t *collections[MAX_COLLECTIONS];

static void free_collection(collection_t *c) {
    if (c == NULL)
        return;
    if (c->slots != NULL)
        for (int64_t i = 0; i < c->nslots; i++)
            free(c->slots[i].counts);
    for (int i = 0; i < MAX_WORKERS; i++)
        free(c->workers[i].lanes), free(c->workers[i].lanes64);
    free(c->slots);
    free(c);
}

/* a collection of `nslots` histograms of `nb` bins (leading: nslots flags); returns its id (> 0),
 * or 0 when out of memory or ids */
EXPORT int32_t trtq_ingraph_create(int64_t nslots, int64_t nb, int64_t cap, int32_t one_sample,
                                   const int32_t *leading) {
    int32_t id = 0;
    for (int32_t i = 1; i < MAX_COLLECTIONS && id == 0; i++)
        if (collections[i] == NULL)
            id = i;
    if (id == 0 || nslots < 1 || nb < 1)
        return 0;
    collection_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return 0;
    c->nb = nb, c->cap = cap, c->nslots = nslots, c->one_sample = one_sample;
    c->slots = calloc((size_t)nslots, sizeof *c->slots);
    if (c->slots == NULL) {
        free_collection(c);
        return 0;
    }
    for (int64_t i = 0; i < nslots; i++) {
        slot_t *s = &c->slots[i];
        s->e = NO_EXPONENT;
        s->leading = leading[i];
        s->stride = 1;
        s->counts = calloc((size_t)nb, sizeof(int64_t));
        if (s->counts == NULL) {
            free_collection(c);
            return 0;
        }
    }
    collections[id] = c;
    return id;
}

EXPORT void trtq_ingraph_free(int32_t id) {
    if (id > 0 && id < MAX_COLLECTIONS) {
        free_collection(collections[id]);
        collections[id] = NULL;
    }
}

static collection_t *lookup(int64_t id) {
    return id > 0 && id < MAX_COLLECTIONS ? collections[id] : NULL;
}

/* slot `slot` of collection `id` (and the collection in *c), or NULL for an unknown one */
static slot_t *slot_of(int32_t id, int64_t slot, collection_t **c) {
    *c = lookup(id);
    return *c != NULL && slot >= 0 && slot < (*c)->nslots ? &(*c)->slots[slot] : NULL;
}

/* the next run's batch rows and how many of them are samples (the rest repeat the last one) */
EXPORT int32_t trtq_ingraph_set_run(int32_t id, int64_t batch, int64_t valid) {
    collection_t *c = lookup(id);
    if (c == NULL)
        return -1;
    c->batch = batch, c->valid = valid;
    return 0;
}

/* the first slot whose status is not OK, -1 when none (-2: unknown id); checked after each run */
EXPORT int64_t trtq_ingraph_first_error(int32_t id) {
    collection_t *c = lookup(id);
    if (c == NULL)
        return -2;
    for (int64_t i = 0; i < c->nslots; i++)
        if (c->slots[i].status != POW2_OK)
            return i;
    return -1;
}

/* the mode of the coming runs (MODE_*); every slot's statistics start again */
EXPORT int32_t trtq_ingraph_set_mode(int32_t id, int32_t mode) {
    collection_t *c = lookup(id);
    if (c == NULL || mode < MODE_POW2 || mode > MODE_FIXED)
        return -1;
    c->mode = mode;
    for (int64_t i = 0; i < c->nslots; i++) {
        slot_t *s = &c->slots[i];
        int64_t *counts = s->counts;
        int32_t leading = s->leading;
        memset(counts, 0, (size_t)c->nb * sizeof(int64_t));
        memset(s, 0, sizeof *s);
        s->counts = counts, s->leading = leading, s->e = NO_EXPONENT, s->stride = 1;
    }
    return 0;
}

/* MODE_FIXED: a slot's range, the pass-1 max; its bins as HistogramAccumulator sets them */
EXPORT int32_t trtq_ingraph_set_range(int32_t id, int64_t slot, double range) {
    collection_t *c;
    slot_t *s = slot_of(id, slot, &c);
    if (s == NULL || !(range >= 0.0) || isinf(range))
        return -1;
    double scale = range > 0.0 ? (double)c->nb / range : 0.0;
    s->range = range;
    s->fixed = range == 0.0 ? FIXED_RANGE_ZERO : scale < 1e38 ? FIXED_SCALED : FIXED_FLOAT64;
    s->scale = (float)scale;
    return 0;
}

/* a slot's statistics (the counts: num_bins int64) in every mode; -1 for an unknown id or slot */
EXPORT int32_t trtq_ingraph_read(int32_t id, int64_t slot, int64_t *counts, ingraph_stats_t *out) {
    collection_t *c;
    slot_t *s = slot_of(id, slot, &c);
    if (s == NULL)
        return -1;
    memcpy(counts, s->counts, (size_t)c->nb * sizeof(int64_t));
    *out = (ingraph_stats_t){s->zeros, s->stride, s->max, s->lo, s->hi, s->e, s->status, s->seen, s->exceeded};
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * the ONNX Runtime operator
 * ------------------------------------------------------------------------------------------- */

typedef void *status_t; /* OrtStatus* */
typedef const void *const *api_t; /* the OrtApi table, by slot */

/* slots of the OrtApi table used here (0-based) */
#define API_CREATE_STATUS 0
#define API_CREATE_CUSTOM_OP_DOMAIN 26
#define API_CUSTOM_OP_DOMAIN_ADD 27
#define API_ADD_CUSTOM_OP_DOMAIN 28
#define API_GET_TENSOR_MUTABLE_DATA 51
#define API_GET_TENSOR_ELEMENT_TYPE 60
#define API_GET_DIMENSIONS_COUNT 61
#define API_GET_DIMENSIONS 62
#define API_GET_TENSOR_TYPE_AND_SHAPE 65
#define API_KERNEL_INFO_GET_ATTRIBUTE_INT64 86
#define API_KERNEL_CONTEXT_GET_INPUT 90
#define API_KERNEL_CONTEXT_GET_OUTPUT 91
#define API_RELEASE_STATUS 93
#define API_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO 99
#define API_KERNEL_CONTEXT_PARALLEL_FOR 274 /* API version 17 */

#define ORT_FAIL 1
#define ORT_INVALID_ARGUMENT 2
#define TYPE_FLOAT 1
#define API_VERSION 16

typedef status_t (*create_status_fn)(int code, const char *msg);
typedef void (*release_status_fn)(status_t);
typedef status_t (*create_domain_fn)(const char *, void **);
typedef status_t (*domain_add_fn)(void *, const void *);
typedef status_t (*add_domain_fn)(void *, void *);
typedef status_t (*mutable_data_fn)(void *, void **);
typedef status_t (*element_type_fn)(const void *, int *);
typedef status_t (*dims_count_fn)(const void *, size_t *);
typedef status_t (*dims_fn)(const void *, int64_t *, size_t);
typedef status_t (*type_and_shape_fn)(const void *, void **);
typedef void (*release_info_fn)(void *);
typedef status_t (*attr_int64_fn)(const void *, const char *, int64_t *);
typedef status_t (*get_input_fn)(const void *, size_t, const void **);
typedef status_t (*get_output_fn)(void *, size_t, const int64_t *, size_t, void **);
typedef status_t (*ort_parallel_for_fn)(const void *, void (*)(void *, size_t), size_t, size_t, void *);

#define CALL(api, slot, type) ((type)(api)[slot])

static api_t ort_api;        /* the table of the runtime that loaded this library */
static int has_parallel_for; /* its API version is >= 17 */

typedef struct {
    int64_t collection, slot;
} kernel_t;

/* the OrtCustomOp of API version 16: a version number, then its callbacks in order */
typedef struct {
    uint32_t version;
    void *(*create_kernel)(const void *, const void *, const void *);
    const char *(*get_name)(const void *);
    const char *(*get_execution_provider_type)(const void *);
    int (*get_input_type)(const void *, size_t);
    size_t (*get_input_type_count)(const void *);
    int (*get_output_type)(const void *, size_t);
    size_t (*get_output_type_count)(const void *);
    void (*kernel_compute)(void *, void *);
    void (*kernel_destroy)(void *);
    int (*get_input_characteristic)(const void *, size_t);
    int (*get_output_characteristic)(const void *, size_t);
    int (*get_input_memory_type)(const void *, size_t);
    int (*get_variadic_input_min_arity)(const void *);
    int (*get_variadic_input_homogeneity)(const void *);
    int (*get_variadic_output_min_arity)(const void *);
    int (*get_variadic_output_homogeneity)(const void *);
    status_t (*create_kernel_v2)(const void *, const void *, const void *, void **);
    status_t (*kernel_compute_v2)(void *, void *);
} custom_op_t;

static status_t fail(int code, const char *msg) { return CALL(ort_api, API_CREATE_STATUS, create_status_fn)(code, msg); }

static status_t create_kernel(const void *op, const void *api, const void *info, void **out) {
    (void)op, (void)api;
    kernel_t k;
    status_t st = CALL(ort_api, API_KERNEL_INFO_GET_ATTRIBUTE_INT64, attr_int64_fn)(info, "collection", &k.collection);
    if (st == NULL)
        st = CALL(ort_api, API_KERNEL_INFO_GET_ATTRIBUTE_INT64, attr_int64_fn)(info, "slot", &k.slot);
    if (st != NULL)
        return st;
    collection_t *c = lookup(k.collection);
    if (c == NULL || k.slot < 0 || k.slot >= c->nslots)
        return fail(ORT_INVALID_ARGUMENT, "trtq Pow2Stats: unknown collection or slot (built for another session)");
    kernel_t *kp = malloc(sizeof *kp);
    if (kp == NULL)
        return fail(ORT_FAIL, "trtq Pow2Stats: out of memory");
    *kp = k;
    *out = kp;
    return NULL;
}

static void parallel_via_ort(void *ctx, void (*fn)(void *, size_t), size_t total, size_t batches, void *data) {
    status_t st = CALL(ort_api, API_KERNEL_CONTEXT_PARALLEL_FOR, ort_parallel_for_fn)(ctx, fn, total, batches, data);
    if (st != NULL) { /* no pool after all: run them here */
        CALL(ort_api, API_RELEASE_STATUS, release_status_fn)(st);
        for (size_t i = 0; i < total; i++)
            fn(data, i);
    }
}

static status_t compute(void *kernel, void *ctx) {
    kernel_t *k = kernel;
    collection_t *c = lookup(k->collection);
    if (c == NULL || k->slot >= c->nslots)
        return fail(ORT_INVALID_ARGUMENT, "trtq Pow2Stats: the collection was freed");
    const void *input;
    void *output, *info, *data;
    status_t st = CALL(ort_api, API_KERNEL_CONTEXT_GET_INPUT, get_input_fn)(ctx, 0, &input);
    if (st != NULL)
        return st;
    st = CALL(ort_api, API_GET_TENSOR_TYPE_AND_SHAPE, type_and_shape_fn)(input, &info);
    if (st != NULL)
        return st;
    int type = 0;
    size_t ndims = 0;
    int64_t dims[16];
    st = CALL(ort_api, API_GET_TENSOR_ELEMENT_TYPE, element_type_fn)(info, &type);
    if (st == NULL)
        st = CALL(ort_api, API_GET_DIMENSIONS_COUNT, dims_count_fn)(info, &ndims);
    if (st == NULL && ndims > 16)
        st = fail(ORT_INVALID_ARGUMENT, "trtq Pow2Stats: more than 16 dims");
    if (st == NULL)
        st = CALL(ort_api, API_GET_DIMENSIONS, dims_fn)(info, dims, ndims);
    CALL(ort_api, API_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO, release_info_fn)(info);
    if (st != NULL)
        return st;
    if (type != TYPE_FLOAT)
        return fail(ORT_INVALID_ARGUMENT, "trtq Pow2Stats: input is not float32");
    st = CALL(ort_api, API_GET_TENSOR_MUTABLE_DATA, mutable_data_fn)((void *)input, &data);
    if (st != NULL)
        return st;
    int64_t one = 1;
    st = CALL(ort_api, API_KERNEL_CONTEXT_GET_OUTPUT, get_output_fn)(ctx, 0, &one, 1, &output);
    if (st != NULL)
        return st;
    void *out_data;
    st = CALL(ort_api, API_GET_TENSOR_MUTABLE_DATA, mutable_data_fn)(output, &out_data);
    if (st != NULL)
        return st;
    *(float *)out_data = 0.0f;
    ingraph_fold(c, &c->slots[k->slot], (const float *)data, dims, ndims,
                 has_parallel_for ? parallel_via_ort : NULL, ctx);
    return NULL;
}

static void destroy_kernel(void *kernel) { free(kernel); }
static const char *op_name(const void *op) { (void)op; return "Pow2Stats"; }
static const char *op_provider(const void *op) { (void)op; return NULL; /* CPU */ }
static int op_type(const void *op, size_t i) { (void)op, (void)i; return TYPE_FLOAT; }
static size_t op_one(const void *op) { (void)op; return 1; }
static int op_zero(const void *op, size_t i) { (void)op, (void)i; return 0; /* required; default memory */ }
static int op_arity(const void *op) { (void)op; return 1; }

static custom_op_t pow2_stats_op = {
    API_VERSION, NULL, op_name, op_provider, op_type, op_one, op_type, op_one,
    NULL, /* KernelCompute NULL: ONNX Runtime 1.16 takes the V2 callbacks only then */
    destroy_kernel, op_zero, op_zero, op_zero, op_arity, op_arity, op_arity, op_arity, create_kernel, compute,
};

static void *domain; /* created once, kept for the life of the process (sessions point at it) */

/* called by ONNX Runtime when Python registers this library with a SessionOptions */
EXPORT status_t RegisterCustomOps(void *options, const void *api_base) {
    typedef api_t (*get_api_fn)(uint32_t);
    typedef const char *(*version_fn)(void);
    const void *const *base = api_base; /* OrtApiBase: GetApi, GetVersionString */
    api_t api = ((get_api_fn)base[0])(API_VERSION);
    if (api == NULL)
        return NULL; /* older than 1.16: nothing is registered, and the session refuses the nodes */
    ort_api = api;
    const char *v = ((version_fn)base[1])();
    int major = 0, minor = 0;
    if (v != NULL)
        major = atoi(v), minor = strchr(v, '.') != NULL ? atoi(strchr(v, '.') + 1) : 0;
    has_parallel_for = major > 1 || (major == 1 && minor >= 17);
    status_t st;
    if (domain == NULL) {
        void *d = NULL;
        st = CALL(api, API_CREATE_CUSTOM_OP_DOMAIN, create_domain_fn)("ai.trtq.calib", &d);
        if (st != NULL)
            return st;
        st = CALL(api, API_CUSTOM_OP_DOMAIN_ADD, domain_add_fn)(d, &pow2_stats_op);
        if (st != NULL)
            return st;
        domain = d;
    }
    return CALL(api, API_ADD_CUSTOM_OP_DOMAIN, add_domain_fn)(options, domain);
}

/* 1 when the runtime that registered the operator spreads a tensor over its threads (API >= 17) */
EXPORT int32_t trtq_ingraph_parallel(void) { return has_parallel_for; }
