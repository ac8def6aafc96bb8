/* trtq.calib.collect._compiled, part 3: how the in-graph operator (_ingraph.c) folds a tensor into its slot,
 * by the rules of the Python accumulators it stands in for, so that the statistics are the same
 * integers as the outputs collector's (tests/calib/test_ingraph.py):
 * - MODE_POW2: trtq.calib.collect.one_pass.Pow2Histograms (one pass: the per-sample stride, exact range
 *   merges, the float64 path below 2**-100);
 * - MODE_EXTREMES: trtq.calib.stats.AbsMaxAccumulator (signed min and max of every element);
 * - MODE_FIXED: trtq.calib.stats.HistogramAccumulator (counts over [0, range], clamped to the last
 *   bin, values past the range flagged).
 * Rows of a batch-sized tensor past the run's valid ones are padding and left out in every mode
 * (trtq.calib.collect.exposed.OrtCollector.run). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_kernels.h"
#include "_ingraph.h"

#define THREAD_LOCAL __thread
#define FETCH_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)

#define MIN_EXP (-100) /* trtq.calib.collect.one_pass._MIN_EXP / _MAX_EXP */
#define MAX_EXP 128
#define TASK_ELEMENTS (1 << 16) /* elements read per parallel task (MODE_EXTREMES) */
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

/* fn(tasks, 0 .. n - 1): side by side where a ParallelFor is given and there is more than one
 * (`batches`: see parallel_for_fn) */
static void run_tasks(parallel_for_fn parallel, void *ctx, void (*fn)(void *, size_t), int64_t n, size_t batches,
                      void *tasks) {
    if (parallel != NULL && n > 1)
        parallel(ctx, fn, (size_t)n, batches, tasks);
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

/* One node's tensor cut into pieces, each counted by whichever thread takes it into that thread's
 * worker; pieces are small, so that both threads of a 2-core machine share even a 100K-element
 * tensor, and the merge costs one set of lanes per thread, not per piece. What every job starts
 * with: */
typedef struct {
    collection_t *c;
    uint64_t node;    /* this node's run (tells a thread's earlier claim from one of this node) */
    int32_t e0;       /* MODE_POW2: the slot's range, where a worker starts */
    int32_t wide;     /* MODE_FIXED: the workers count into int64 lanes */
    int32_t overflow; /* more threads than MAX_WORKERS came (then the node runs again, alone) */
} node_run_t;

/* MODE_POW2: the lanes and range of a worker grow as trtq_pow2_count's do */
typedef struct {
    node_run_t run;
    const float *x;
    int64_t rows, n, stride; /* the tensor as rows of n (one row unless strided) */
    int64_t per;             /* elements a piece, or whole rows a piece when strided */
} pow2_job_t;

static THREAD_LOCAL uint64_t my_node; /* the node run this thread last claimed a worker for */
static THREAD_LOCAL int32_t my_worker;
static uint64_t node_runs;            /* one number per node run, in any session */
#define NEXT_NODE() (FETCH_ADD(&node_runs, 1) + 1)

/* this thread's worker for the node, claimed on its first piece; NULL when the piece is not to be
 * counted: no worker was left (the node is marked to run again, alone) or the worker met trouble */
static worker_t *claim(node_run_t *r) {
    if (my_node != r->node) {
        int32_t w = FETCH_ADD(&r->c->nworkers, 1);
        if (w >= MAX_WORKERS) {
            r->overflow = 1;
            return NULL;
        }
        worker_t *wk = &r->c->workers[w];
        size_t n = (size_t)(4 * r->c->nb);
        if (r->wide && wk->lanes64 == NULL) /* kept for the collection's life, zero between nodes */
            wk->lanes64 = calloc(n, sizeof(int64_t));
        else if (!r->wide && wk->lanes == NULL)
            wk->lanes = calloc(n, sizeof(int32_t));
        wk->status = (r->wide ? (void *)wk->lanes64 : (void *)wk->lanes) == NULL ? NO_MEMORY : POW2_OK;
        wk->e = r->e0, wk->top = 0, wk->zeros = 0, wk->exceeded = 0;
        my_node = r->node, my_worker = w;
    }
    worker_t *wk = &r->c->workers[my_worker];
    return wk->status == POW2_OK ? wk : NULL;
}

/* the first trouble any of the node's workers met, POW2_OK when none */
static int32_t first_trouble(const collection_t *c, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (c->workers[i].status != POW2_OK)
            return c->workers[i].status;
    return POW2_OK;
}

static void run_piece(void *data, size_t i) {
    pow2_job_t *j = data;
    worker_t *w = claim(&j->run);
    if (w == NULL)
        return;
    int64_t first = (int64_t)i * j->per;
    const float *x;
    int64_t rows, n;
    if (j->stride == 1) { /* a cut of the one row */
        x = j->x + first, rows = 1, n = j->n - first < j->per ? j->n - first : j->per;
    } else { /* whole rows: the stride restarts on each */
        x = j->x + first * j->n, rows = j->rows - first < j->per ? j->rows - first : j->per, n = j->n;
    }
    int32_t e, top;
    int64_t zeros;
    w->status = trtq_pow2_count(x, rows, n, j->stride, w->e, w->lanes, j->run.c->nb, MIN_EXP, &e, &top, &zeros);
    w->e = e, w->top = top > w->top ? top : w->top, w->zeros += zeros;
}

/* how many workers the node ran (at most MAX_WORKERS); *trouble: the first status not OK among them */
static int32_t node_workers(collection_t *c, int32_t *trouble) {
    int32_t n = c->nworkers < MAX_WORKERS ? c->nworkers : MAX_WORKERS;
    *trouble = first_trouble(c, n);
    return n;
}

/* the highest bin a worker's lanes can hold: that of its max at its range */
static int64_t top_bin(const worker_t *w, int64_t nb) {
    if (w->e == NO_EXPONENT || w->e < MIN_EXP || w->e > MAX_EXP)
        return nb - 1;
    float m;
    memcpy(&m, &w->top, sizeof m);
    float y = m * (float)ldexp((double)nb, -w->e);
    return y < (float)(nb - 1) ? (int64_t)y : nb - 1;
}

/* the workers of a node into slot s (Pow2Histograms.add, each at its own range); their lanes are
 * left zero. Returns POW2_OK, or the first trouble a worker met (its counts are then dropped) */
static int32_t merge_workers(collection_t *c, slot_t *s, int keep) {
    int32_t trouble, n = node_workers(c, &trouble);
    int64_t nb = c->nb;
    for (int32_t i = 0; i < n; i++) {
        worker_t *w = &c->workers[i];
        if (w->lanes == NULL)
            continue;
        int64_t last = w->status == POW2_OK ? top_bin(w, nb) : nb - 1;
        int32_t d = 0;
        if (keep && trouble == POW2_OK) {
            float m;
            memcpy(&m, &w->top, sizeof m);
            if ((double)m > s->max)
                s->max = (double)m;
            if (w->e != NO_EXPONENT) {
                raise_to(s, nb, w->e);
                d = s->e - w->e;
            }
            d = d > 62 ? 62 : d;
            s->zeros += w->zeros;
        }
        for (int j = 0; j < 4; j++) {
            int32_t *lane = w->lanes + j * nb;
            if (keep && trouble == POW2_OK)
                for (int64_t b = 0; b <= last; b++)
                    s->counts[b >> d] += lane[b];
            memset(lane, 0, (size_t)(last + 1) * sizeof(int32_t));
        }
    }
    c->nworkers = 0;
    return trouble;
}

#define PIECE_ELEMENTS (1 << 14) /* elements a piece (rows of at least this many when strided) */

typedef int32_t (*merge_fn)(collection_t *c, slot_t *s, int keep);

/* the job's pieces on ONNX Runtime's threads, in at most MAX_WORKERS runs so that at most that many
 * threads claim a worker, then merged (`merge`); returns what the merge found */
static int32_t run_node(collection_t *c, slot_t *s, node_run_t *r, void (*piece)(void *, size_t), int64_t pieces,
                        void *job, merge_fn merge, parallel_for_fn parallel, void *ctx) {
    c->nworkers = 0;
    run_tasks(parallel, ctx, piece, pieces, (size_t)(pieces < MAX_WORKERS ? pieces : MAX_WORKERS), job);
    if (r->overflow) { /* more threads than runs after all: drop it all, count again on this thread */
        merge(c, s, 0);
        r->node = NEXT_NODE(), r->overflow = 0;
        run_tasks(NULL, ctx, piece, pieces, 0, job);
    }
    return merge(c, s, 1);
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
    pow2_job_t job = {{c, NEXT_NODE(), s->e, 0, 0}, x, rows, n, k, 0};
    int64_t pieces;
    if (k == 1) {
        job.per = PIECE_ELEMENTS;
        pieces = (n + job.per - 1) / job.per;
    } else {
        job.per = PIECE_ELEMENTS / n > 1 ? PIECE_ELEMENTS / n : 1;
        pieces = (rows + job.per - 1) / job.per;
    }
    int32_t trouble = run_node(c, s, &job.run, run_piece, pieces, &job, merge_workers, parallel, ctx);
    if (trouble == POW2_TINY)
        fold_float64(s, c->nb, x, used, rows, n, k);
    else if (trouble != POW2_OK)
        s->status = trouble;
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
    run_tasks(parallel, ctx, run_extremes_task, ntasks, 0, tasks);
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

/* MODE_FIXED: every worker counts its pieces over the slot's fixed range */
typedef struct {
    node_run_t run;
    const float *x;
    int64_t n;
    float scale, exceed_at;
} fixed_job_t;

static void run_fixed_piece(void *data, size_t i) {
    fixed_job_t *j = data;
    worker_t *w = claim(&j->run);
    if (w == NULL)
        return;
    int64_t first = (int64_t)i * PIECE_ELEMENTS, len = j->n - first < PIECE_ELEMENTS ? j->n - first : PIECE_ELEMENTS;
    int64_t zeros;
    int32_t exceeded;
    if (trtq_histogram_f32(j->x + first, 1, len, j->scale, w->lanes64, j->run.c->nb, j->exceed_at, 1, &zeros,
                           &exceeded))
        w->status = POW2_NONFINITE;
    w->zeros += zeros, w->exceeded |= exceeded;
}

/* the workers of a MODE_FIXED node into slot s; their lanes are left zero. Returns POW2_OK, or the
 * first trouble a worker met (the node's counts are then dropped) */
static int32_t merge_fixed(collection_t *c, slot_t *s, int keep) {
    int32_t trouble, n = node_workers(c, &trouble);
    for (int32_t i = 0; i < n; i++) {
        worker_t *w = &c->workers[i];
        if (w->lanes64 == NULL)
            continue;
        int64_t nb = c->nb;
        if (keep && trouble == POW2_OK) {
            for (int j = 0; j < 4; j++)
                for (int64_t b = 0; b < nb; b++)
                    s->counts[b] += w->lanes64[j * nb + b];
            s->zeros += w->zeros;
            s->exceeded |= w->exceeded;
        }
        memset(w->lanes64, 0, (size_t)(4 * nb) * sizeof(int64_t));
    }
    c->nworkers = 0;
    return trouble;
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
static void fold_fixed(collection_t *c, slot_t *s, const float *x, int64_t used, parallel_for_fn parallel,
                       void *ctx) {
    if (s->fixed != FIXED_SCALED) {
        fold_fixed_special(s, c->nb, x, used);
        return;
    }
    float exceed_at = (float)((double)c->nb * (1.0 + 1e-6)); /* kernels._EXCEED_TOLERANCE */
    fixed_job_t job = {{c, NEXT_NODE(), 0, 1, 0}, x, used, s->scale, exceed_at};
    int64_t pieces = (used + PIECE_ELEMENTS - 1) / PIECE_ELEMENTS;
    int32_t trouble = run_node(c, s, &job.run, run_fixed_piece, pieces, &job, merge_fixed, parallel, ctx);
    if (trouble != POW2_OK)
        s->status = trouble;
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
        fold_fixed(c, s, x, used, parallel, ctx);
    else
        fold_pow2(c, s, x, dims, ndims, lead, used, parallel, ctx);
}
