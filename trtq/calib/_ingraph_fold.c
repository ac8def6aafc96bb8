/* trtq.calib._native, part 3: how the in-graph operator (_ingraph.c) folds a tensor into its slot,
 * by the rules of the Python accumulators it stands in for, so that the statistics are the same
 * integers as the outputs collector's (tests/calib/test_ingraph.py):
 * - MODE_POW2: trtq.calib.pow2.Pow2Histograms (one pass: the per-sample stride, exact range
 *   merges, the float64 path below 2**-100);
 * - MODE_EXTREMES: trtq.calib.stats.AbsMaxAccumulator (signed min and max of every element);
 * - MODE_FIXED: trtq.calib.stats.HistogramAccumulator (counts over [0, range], clamped to the last
 *   bin, values past the range flagged).
 * Rows of a batch-sized tensor past the run's valid ones are padding and left out in every mode
 * (trtq.calib.collect.OrtCollector.run). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_native.h"
#include "_ingraph.h"

#define MIN_EXP (-100) /* trtq.calib.pow2._MIN_EXP / _MAX_EXP */
#define MAX_EXP 128
#define TASK_ELEMENTS (1 << 16) /* elements read per parallel task */
#define MAX_TASKS 256

/* units (elements or rows) per task for `total` units: `per` each, fewer than `most` tasks (the
 * per-task size grows past that); returns the task count and sets *per_out */
static int64_t split(int64_t total, int64_t per, int64_t most, int64_t *per_out) {
    int64_t n = (total + per - 1) / per;
    if (n > most)
        per = (total + most - 1) / most, n = (total + per - 1) / per;
    *per_out = per;
    return n;
}

/* fn(tasks, 0 .. n - 1): side by side where a ParallelFor is given and there is more than one */
static void run_tasks(parallel_for_fn parallel, void *ctx, void (*fn)(void *, size_t), int64_t n, void *tasks) {
    if (parallel != NULL && n > 1)
        parallel(ctx, fn, (size_t)n, tasks);
    else
        for (int64_t t = 0; t < n; t++)
            fn(tasks, (size_t)t);
}

/* counts over [0, 2**from) -> over [0, 2**to), to >= from (pow2.regrow) */
static void regrow(int64_t *counts, int64_t nb, int32_t d) {
    if (d <= 0)
        return;
    if (d > 62)
        d = 62;
    for (int64_t b = 0; b < nb; b++) {
        int64_t v = counts[b];
        counts[b] = 0;
        counts[b >> d] += v;
    }
}

static void raise_to(slot_t *s, int64_t nb, int32_t e) {
    if (s->e == NO_EXPONENT)
        s->e = e; /* only zeros so far: they stay in bin 0 */
    else if (e > s->e) {
        regrow(s->counts, nb, e - s->e);
        s->e = e;
    }
}

/* pow2.stride_for: 1, or the smallest prime k with ceil(elements / k) <= cap dividing no dim */
static int64_t stride_for(int64_t elements, int64_t cap, const int64_t *dims, size_t ndims) {
    if (cap <= 0 || elements <= cap)
        return 1;
    int64_t k = (elements + cap - 1) / cap;
    if (k < 2)
        k = 2;
    for (;; k++) {
        int ok = 1;
        for (int64_t p = 2; p * p <= k && ok; p++)
            ok = k % p != 0;
        for (size_t i = 0; i < ndims && ok; i++)
            ok = dims[i] <= 0 || dims[i] % k != 0;
        if (ok)
            return k;
    }
}

typedef struct {
    const float *x;
    int64_t rows, n, stride;
    int32_t e0, e, top, status;
    int64_t nb, zeros;
    int32_t *lanes; /* [4, nb] */
} task_t;

static void run_task(void *data, size_t i) {
    task_t *t = (task_t *)data + i;
    t->status = trtq_pow2_count(t->x, t->rows, t->n, t->stride, t->e0, t->lanes, t->nb, MIN_EXP, &t->e, &t->top,
                                &t->zeros);
}

/* exponent_of(m): smallest e with m < 2**e */
static int32_t exponent_of(double m) {
    int e;
    frexp(m, &e);
    return e;
}

/* pow2.Pow2Histograms._update_two_reads for one tensor: ranges below the float32 counting range */
static void fold_float64(slot_t *s, int64_t nb, const float *x, int64_t used, int64_t rows, int64_t n, int64_t k) {
    const int32_t *bits = (const int32_t *)x;
    int32_t top = 0;
    for (int64_t i = 0; i < used; i++) {
        int32_t v = bits[i] & 0x7FFFFFFF;
        top = v > top ? v : top;
    }
    if (top >= NONFINITE_BITS) {
        s->status = POW2_NONFINITE;
        return;
    }
    float m;
    memcpy(&m, &top, sizeof m);
    if ((double)m > s->max)
        s->max = (double)m;
    if (m > 0.0f)
        raise_to(s, nb, exponent_of((double)m));
    int32_t e = s->e;
    float flast = (float)(nb - 1);
    float scale = e >= MIN_EXP && e <= MAX_EXP ? (float)ldexp((double)nb, -e) : 0.0f;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j += k) {
            float v = fabsf(x[r * n + j]);
            int64_t b;
            if (e == NO_EXPONENT) {
                b = 0, s->zeros++;
            } else if (e >= MIN_EXP && e <= MAX_EXP) {
                float y = v * scale;
                s->zeros += y == 0.0f;
                b = (int64_t)(y < flast ? y : flast);
            } else {
                double y = ldexp((double)v, -e) * (double)nb;
                s->zeros += v == 0.0f;
                b = y < (double)(nb - 1) ? (int64_t)y : nb - 1;
            }
            s->counts[b]++;
        }
}

/* MODE_POW2: the first `used` elements of x (`lead` rows of dims[0]) */
static void fold_pow2(collection_t *c, slot_t *s, const float *x, const int64_t *dims, size_t ndims, int64_t lead,
                      int64_t used, parallel_for_fn parallel, void *ctx) {
    int64_t rows = 1, n = used, k = 1;
    if (c->cap > 0 && ndims >= 1 && (c->one_sample || s->leading)) { /* Pow2Histograms._stride */
        int64_t r = c->one_sample ? 1 : lead;
        int64_t sample_dims[16];
        size_t nd = 0;
        for (size_t i = c->one_sample ? 0 : 1; i < ndims && nd < 16; i++)
            sample_dims[nd++] = i == 0 ? lead : dims[i];
        int64_t kk = stride_for(used / r, c->cap, sample_dims, nd);
        if (kk > 1)
            rows = r, n = used / r, k = kk, s->stride = kk;
    }
    if (s->e != NO_EXPONENT && s->e < MIN_EXP) {
        fold_float64(s, c->nb, x, used, rows, n, k);
        return;
    }
    /* tasks: whole rows when strided (the stride restarts on each row), else any cut */
    task_t tasks[MAX_TASKS];
    int64_t per; /* elements, or whole rows when strided */
    int64_t ntasks = k == 1 ? split(used, TASK_ELEMENTS, MAX_TASKS, &per)
                            : split(rows, TASK_ELEMENTS / n > 1 ? TASK_ELEMENTS / n : 1, MAX_TASKS, &per);
    int64_t nb = c->nb;
    int32_t *lanes = calloc((size_t)(ntasks * 4 * nb), sizeof(int32_t));
    if (lanes == NULL) {
        s->status = NO_MEMORY;
        return;
    }
    for (int64_t t = 0; t < ntasks; t++) {
        task_t *tk = &tasks[t];
        if (k == 1) {
            int64_t start = t * per, len = used - start < per ? used - start : per;
            tk->x = x + start, tk->rows = 1, tk->n = len;
        } else {
            int64_t r0 = t * per, nr = rows - r0 < per ? rows - r0 : per;
            tk->x = x + r0 * n, tk->rows = nr, tk->n = n;
        }
        tk->stride = k, tk->e0 = s->e, tk->nb = nb, tk->lanes = lanes + t * 4 * nb;
    }
    run_tasks(parallel, ctx, run_task, ntasks, tasks);
    int tiny = 0;
    for (int64_t t = 0; t < ntasks; t++) {
        if (tasks[t].status == POW2_NONFINITE) {
            s->status = POW2_NONFINITE;
            free(lanes);
            return;
        }
        tiny |= tasks[t].status == POW2_TINY;
    }
    if (tiny) {
        free(lanes);
        fold_float64(s, nb, x, used, rows, n, k);
        return;
    }
    for (int64_t t = 0; t < ntasks; t++) { /* Pow2Histograms.add, each task at its own range */
        task_t *tk = &tasks[t];
        float m;
        memcpy(&m, &tk->top, sizeof m);
        if ((double)m > s->max)
            s->max = (double)m;
        int32_t d = 0;
        if (tk->e != NO_EXPONENT) {
            raise_to(s, nb, tk->e);
            d = s->e - tk->e;
        }
        if (d > 62)
            d = 62;
        for (int j = 0; j < 4; j++)
            for (int64_t b = 0; b < nb; b++)
                s->counts[b >> d] += tk->lanes[j * nb + b];
        s->zeros += tk->zeros;
    }
    free(lanes);
}


/* MODE_EXTREMES, one task: max |x| and the signed min and max of elements [0, n) as ordered keys
 * (int32: a float's bits, the magnitude bits flipped for negatives, order like the floats), so
 * that the loop is integer max / min and vectorises (float min / max would not, for NaN's sake) */
typedef struct {
    const float *x;
    int64_t n;
    int32_t top, kmin, kmax;
} extremes_task_t;

static inline int32_t order_key(int32_t bits) { return bits ^ ((bits >> 31) & 0x7FFFFFFF); }

static HOST_CLONES void run_extremes_task(void *data, size_t i) {
    extremes_task_t *t = (extremes_task_t *)data + i;
    const int32_t *bits = (const int32_t *)t->x;
    int32_t top = 0, kmin = INT32_MAX, kmax = INT32_MIN;
    for (int64_t j = 0; j < t->n; j++) {
        int32_t b = bits[j], v = b & 0x7FFFFFFF, k = order_key(b);
        top = v > top ? v : top;
        kmin = k < kmin ? k : kmin;
        kmax = k > kmax ? k : kmax;
    }
    t->top = top, t->kmin = kmin, t->kmax = kmax;
}

/* MODE_EXTREMES: signed min and max of every element (stats.batch_extremes) */
static void fold_extremes(slot_t *s, const float *x, int64_t used, parallel_for_fn parallel, void *ctx) {
    extremes_task_t tasks[MAX_TASKS];
    int64_t per, ntasks = split(used, TASK_ELEMENTS, MAX_TASKS, &per);
    for (int64_t t = 0; t < ntasks; t++)
        tasks[t] = (extremes_task_t){x + t * per, used - t * per < per ? used - t * per : per, 0, 0, 0};
    run_tasks(parallel, ctx, run_extremes_task, ntasks, tasks);
    int32_t top = 0, kmin = INT32_MAX, kmax = INT32_MIN;
    for (int64_t t = 0; t < ntasks; t++) {
        top = tasks[t].top > top ? tasks[t].top : top;
        kmin = tasks[t].kmin < kmin ? tasks[t].kmin : kmin;
        kmax = tasks[t].kmax > kmax ? tasks[t].kmax : kmax;
    }
    if (top >= NONFINITE_BITS) {
        s->status = POW2_NONFINITE;
        return;
    }
    int32_t lo_bits = order_key(kmin), hi_bits = order_key(kmax); /* the key is its own inverse */
    float lo, hi;
    memcpy(&lo, &lo_bits, sizeof lo);
    memcpy(&hi, &hi_bits, sizeof hi);
    if (!s->seen || (double)lo < s->lo)
        s->lo = (double)lo;
    if (!s->seen || (double)hi > s->hi)
        s->hi = (double)hi;
    s->seen = 1;
}

typedef struct {
    const float *x;
    int64_t n, nb, zeros;
    float scale, exceed_at;
    int32_t exceeded, nonfinite;
    int64_t *lanes; /* [4, nb] */
} fixed_task_t;

static void run_fixed_task(void *data, size_t i) {
    fixed_task_t *t = (fixed_task_t *)data + i;
    t->nonfinite = trtq_histogram_f32(t->x, 1, t->n, t->scale, t->lanes, t->nb, t->exceed_at, 1, &t->zeros,
                                      &t->exceeded);
}

/* MODE_FIXED, a range of 0 or one whose scale is no float32 (HistogramAccumulator._update_special) */
static void fold_fixed_special(slot_t *s, int64_t nb, const float *x, int64_t used) {
    const int32_t *bits = (const int32_t *)x;
    for (int64_t i = 0; i < used; i++)
        if ((bits[i] & 0x7FFFFFFF) >= NONFINITE_BITS) {
            s->status = POW2_NONFINITE;
            return;
        }
    if (s->fixed == FIXED_RANGE_ZERO) { /* everything in bin 0; anything but zero is past the range */
        int64_t nonzero = 0;
        for (int64_t i = 0; i < used; i++)
            nonzero += x[i] != 0.0f;
        s->exceeded |= nonzero > 0;
        s->counts[0] += used;
        s->zeros += used - nonzero;
        return;
    }
    double last = (double)(nb - 1), exceed_at = (double)nb * (1.0 + 1e-6);
    for (int64_t i = 0; i < used; i++) {
        double y = fabs((double)x[i]) / s->range * (double)nb;
        s->exceeded |= y >= exceed_at;
        y = y < last ? y : last;
        s->zeros += y == 0.0;
        s->counts[(int64_t)y]++;
    }
}

/* MODE_FIXED: floor(|x| * scale) in float32, clamped to the last bin (kernels.histogram_into) */
static void fold_fixed(slot_t *s, int64_t nb, const float *x, int64_t used, parallel_for_fn parallel, void *ctx) {
    if (s->fixed != FIXED_SCALED) {
        fold_fixed_special(s, nb, x, used);
        return;
    }
    /* int64 lanes: at most 64 tasks' worth (16 MiB at 2048 bins) */
    int64_t per, ntasks = split(used, TASK_ELEMENTS, MAX_TASKS / 4, &per);
    fixed_task_t tasks[MAX_TASKS / 4];
    int64_t *lanes = calloc((size_t)(ntasks * 4 * nb), sizeof(int64_t));
    if (lanes == NULL) {
        s->status = NO_MEMORY;
        return;
    }
    float exceed_at = (float)((double)nb * (1.0 + 1e-6)); /* kernels._EXCEED_TOLERANCE */
    for (int64_t t = 0; t < ntasks; t++) {
        int64_t start = t * per;
        tasks[t] = (fixed_task_t){x + start, used - start < per ? used - start : per, nb, 0, s->scale, exceed_at,
                                  0, 0, lanes + t * 4 * nb};
    }
    run_tasks(parallel, ctx, run_fixed_task, ntasks, tasks);
    for (int64_t t = 0; t < ntasks; t++)
        if (tasks[t].nonfinite) {
            s->status = POW2_NONFINITE;
            free(lanes);
            return;
        }
    for (int64_t t = 0; t < ntasks; t++) {
        for (int64_t j = 0; j < 4 * nb; j++)
            s->counts[j % nb] += tasks[t].lanes[j];
        s->zeros += tasks[t].zeros;
        s->exceeded |= tasks[t].exceeded;
    }
    free(lanes);
}

void ingraph_fold(collection_t *c, slot_t *s, const float *x, const int64_t *dims, size_t ndims,
                  parallel_for_fn parallel, void *ctx) {
    if (s->status != POW2_OK)
        return;
    int64_t size = 1;
    for (size_t i = 0; i < ndims; i++)
        size *= dims[i];
    int64_t lead = ndims > 0 ? dims[0] : 1;
    int64_t used = size;
    if (ndims > 0 && lead == c->batch && c->valid < c->batch && lead > 0) { /* collect.OrtCollector.run */
        lead = c->valid;
        used = size / dims[0] * lead;
    }
    if (used <= 0)
        return;
    if (c->mode == MODE_EXTREMES)
        fold_extremes(s, x, used, parallel, ctx);
    else if (c->mode == MODE_FIXED)
        fold_fixed(s, c->nb, x, used, parallel, ctx);
    else
        fold_pow2(c, s, x, dims, ndims, lead, used, parallel, ctx);
}
