/* The in-graph statistics' shared types (trtq.calib.collect._compiled, parts 2 and 3): a collection per
 * calibration session, a slot per calibrated tensor, and the three ways a slot folds a tensor in.
 * _ingraph.c holds the collections and the ONNX Runtime operator, _ingraph_fold.c the folding. */
#ifndef TRTQ_INGRAPH_H
#define TRTQ_INGRAPH_H

#include <stddef.h>
#include <stdint.h>

#define NO_MEMORY 3 /* a slot's status besides POW2_OK / POW2_NONFINITE */

/* what a collection's slots take from the tensors (trtq_ingraph_set_mode) */
enum {
    MODE_POW2 = 0,     /* mse / percentile: power-of-two histograms (trtq.calib.collect.one_pass.Pow2Histograms) */
    MODE_EXTREMES = 1, /* pass 1 of entropy / max: signed min and max (stats.AbsMaxAccumulator) */
    MODE_FIXED = 2     /* pass 2: histograms over [0, range] (stats.HistogramAccumulator) */
};
/* how a MODE_FIXED slot counts (HistogramAccumulator: a float32 scale, a range of 0, float64) */
enum { FIXED_SCALED = 0, FIXED_RANGE_ZERO = 1, FIXED_FLOAT64 = 2 };

typedef struct {
    int32_t e;       /* MODE_POW2: counts cover [0, 2**e); NO_EXPONENT: only zeros so far */
    int32_t status;  /* POW2_NONFINITE once a NaN / Inf was met, NO_MEMORY (sticky) */
    int32_t leading; /* leading dim is the batch (trtq.calib.collect.batch_leading): subsampled per sample */
    int32_t seen;    /* MODE_EXTREMES: lo / hi hold a value */
    int32_t fixed;   /* MODE_FIXED: FIXED_* */
    int32_t exceeded; /* MODE_FIXED: a value past the range (the data changed between passes) */
    float scale;     /* MODE_FIXED, FIXED_SCALED: bins per unit, float32 */
    double range;    /* MODE_FIXED: the pass-1 max */
    double max;      /* MODE_POW2: max |x| (a float32 value) */
    double lo, hi;   /* MODE_EXTREMES: signed min and max (float32 values) */
    int64_t zeros;
    int64_t stride; /* MODE_POW2: the last stride taken (1: every element) */
    int64_t *counts;
} slot_t;

/* one thread's counts while a node folds its tensor (_ingraph_fold.c): every piece the thread
 * takes adds to them (MODE_POW2 at their own range, MODE_FIXED over the slot's), and the node merges
 * them into the slot */
typedef struct {
    int32_t *lanes;   /* MODE_POW2: int32 [4, nb], all zero between nodes */
    int64_t *lanes64; /* MODE_FIXED: int64 [4, nb], all zero between nodes */
    int32_t e, top, status, exceeded;
    int64_t zeros;
} worker_t;

#define MAX_WORKERS 256

typedef struct {
    int64_t nb, cap, nslots;
    int32_t one_sample;   /* each call holds one sample: every tensor subsampled as one row */
    int32_t mode;         /* MODE_* */
    int64_t batch, valid; /* of the coming run: rows of batch-sized tensors past `valid` are padding */
    slot_t *slots;
    worker_t workers[MAX_WORKERS]; /* the threads of the node running now, in the order they came */
    int32_t nworkers;
} collection_t;

/* what trtq_ingraph_read hands Python besides the counts (trtq.calib.collect.ingraph._Stats: same layout) */
typedef struct {
    int64_t zeros, stride;
    double max, lo, hi;
    int32_t e, status, seen, exceeded;
} ingraph_stats_t;

/* runs fn(data, 0 .. total - 1), maybe side by side (ONNX Runtime's ParallelFor): in `batches`
 * runs of consecutive calls, each on one thread (so at most that many threads), or as ONNX Runtime
 * picks for 0 */
typedef void (*parallel_for_fn)(void *ctx, void (*fn)(void *, size_t), size_t total, size_t batches, void *data);

/* fold a float32 tensor of `dims` into slot s of c, by c's mode (_ingraph_fold.c) */
void ingraph_fold(collection_t *c, slot_t *s, const float *x, const int64_t *dims, size_t ndims,
                  parallel_for_fn parallel, void *ctx);

#endif
