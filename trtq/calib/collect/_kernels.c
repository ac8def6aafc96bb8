/* trtq.calib.collect._compiled: the kernels of mse / percentile calibration in C.
 *
 * Built at install when a C compiler is there (setup.py, optional); loaded with ctypes by
 * trtq.calib.collect.compiled. Each follows the rule of its numpy reference in trtq.calib.collect, so
 * both give the same integers (tests/calib/test_kernels.py, test_one_pass.py, test_search.py):
 * - trtq_pow2_count (one_pass.Pow2Histograms): the one-pass power-of-two histogram. Every
 *   element is read for the max, elements 0, stride, ... of each row are counted as
 *   floor(|x| * 2**-e * num_bins) in float32 into four int32 lanes, and a block whose max passes
 *   2**e first merges the lanes into the wider range (bin b -> b >> d, exact);
 * - trtq_histogram_f32 (kernels.histogram_into): the two-pass histograms (entropy, max --save-stats) over
 *   fixed edges: a block's max of the counted elements first, then its counts, clamped to the last
 *   bin (and flagged past exceed_at) only where the block reaches it;
 * - trtq_level_sums (kernels.level_sums): the gathered prefix sums of the range search (trtq.calib.search).
 *
 * Built as a CPython extension only so that setuptools places it next to the package and Python
 * finds it by name; the module itself is empty.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_kernels.h"

#define BLOCK 4096
#define SMALLEST_NORMAL_BITS 0x00800000


static int64_t block_step(int64_t stride) {
    return stride <= BLOCK / 4 ? BLOCK - BLOCK % stride : stride * 4;
}

/* max |x| of a block as an int32 bit pattern (bits & 0x7FFFFFFF orders like |x|) */
static inline int32_t block_max_bits(const int32_t *bits, int64_t n) {
    int32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t v = bits[i] & 0x7FFFFFFF;
        m = v > m ? v : m;
    }
    return m;
}

/* the same over elements 0, stride, ... of the block */
static inline int32_t block_max_bits_strided(const int32_t *bits, int64_t n, int64_t stride) {
    if (stride == 1)
        return block_max_bits(bits, n);
    int32_t m = 0;
    for (int64_t p = 0; p < n; p += stride) {
        int32_t v = bits[p] & 0x7FFFFFFF;
        m = v > m ? v : m;
    }
    return m;
}

/* add floor(|x| * scale) of elements 0, stride, ... of a block to four lanes in turn (so that runs
 * of one bin do not serialise on one counter), every value known below the last bin; returns the
 * exact zeros among them. Two lane types: int32 for the one-pass kernel (a task holds < 2**31
 * elements), int64 for the two-pass one. */
#define DEFINE_COUNT_BLOCK(NAME, LANE)                                                                  \
    static inline int64_t NAME(const float *seg, int64_t n, int64_t stride, float scale, LANE *lanes,  \
                               int64_t nb) {                                                            \
        LANE *l0 = lanes, *l1 = lanes + nb, *l2 = lanes + 2 * nb, *l3 = lanes + 3 * nb;                 \
        int64_t zeros = 0;                                                                              \
        int64_t p = 0;                                                                                  \
        for (; p + 3 * stride < n; p += 4 * stride) {                                                   \
            float y0 = fabsf(seg[p]) * scale;                                                           \
            float y1 = fabsf(seg[p + stride]) * scale;                                                  \
            float y2 = fabsf(seg[p + 2 * stride]) * scale;                                              \
            float y3 = fabsf(seg[p + 3 * stride]) * scale;                                              \
            zeros += (y0 == 0.0f) + (y1 == 0.0f) + (y2 == 0.0f) + (y3 == 0.0f);                         \
            l0[(uint32_t)y0]++;                                                                         \
            l1[(uint32_t)y1]++;                                                                         \
            l2[(uint32_t)y2]++;                                                                         \
            l3[(uint32_t)y3]++;                                                                         \
        }                                                                                               \
        for (; p < n; p += stride) {                                                                    \
            float y0 = fabsf(seg[p]) * scale;                                                           \
            zeros += y0 == 0.0f;                                                                        \
            l0[(uint32_t)y0]++;                                                                         \
        }                                                                                               \
        return zeros;                                                                                   \
    }

DEFINE_COUNT_BLOCK(count_block, int32_t)
DEFINE_COUNT_BLOCK(count_block64, int64_t)

/* count_block / count_block64 of a whole block (stride 1) on AVX2: eight bins from one multiply
 * and one convert, taken out of the register two at a time (no trip through memory) and added to
 * the lanes in turn; the same integers as the scalar loops, faster (the counting is most of what
 * mse calibration adds to inference on small models: docs/decisions.md D22). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_COUNT_AVX2 1

#define DEFINE_COUNT_BLOCK_AVX2(NAME, LANE, SCALAR)                                                      \
    __attribute__((target("avx2"))) static int64_t NAME(const float *seg, int64_t n, float scale, LANE *lanes, \
                                                        int64_t nb) {                                          \
        LANE *l0 = lanes, *l1 = lanes + nb, *l2 = lanes + 2 * nb, *l3 = lanes + 3 * nb;                        \
        const __m256 s = _mm256_set1_ps(scale);                                                                \
        const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));                           \
        __m256i zeros8 = _mm256_setzero_si256(); /* minus the zeros per position (a block < 2**31) */          \
        int64_t p = 0;                                                                                         \
        for (; p + 8 <= n; p += 8) {                                                                           \
            __m256 y = _mm256_mul_ps(_mm256_and_ps(_mm256_loadu_ps(seg + p), magnitude), s);                   \
            __m256 is_zero = _mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_EQ_OQ);                                \
            zeros8 = _mm256_add_epi32(zeros8, _mm256_castps_si256(is_zero));                                   \
            __m256i b = _mm256_cvttps_epi32(y);                                                                \
            __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);                       \
            uint64_t b01 = (uint64_t)_mm_cvtsi128_si64(lo), b23 = (uint64_t)_mm_extract_epi64(lo, 1);          \
            uint64_t b45 = (uint64_t)_mm_cvtsi128_si64(hi), b67 = (uint64_t)_mm_extract_epi64(hi, 1);          \
            l0[(uint32_t)b01]++, l1[b01 >> 32]++, l2[(uint32_t)b23]++, l3[b23 >> 32]++;                        \
            l0[(uint32_t)b45]++, l1[b45 >> 32]++, l2[(uint32_t)b67]++, l3[b67 >> 32]++;                        \
        }                                                                                                      \
        int32_t z[8];                                                                                          \
        _mm256_storeu_si256((__m256i *)z, zeros8);                                                             \
        int64_t zeros = 0;                                                                                     \
        for (int i = 0; i < 8; i++)                                                                            \
            zeros -= z[i];                                                                                     \
        return zeros + (p < n ? SCALAR(seg + p, n - p, 1, scale, lanes, nb) : 0);                              \
    }

DEFINE_COUNT_BLOCK_AVX2(count_block_avx2, int32_t, count_block)
DEFINE_COUNT_BLOCK_AVX2(count_block64_avx2, int64_t, count_block64)

static int use_avx2 = -1; /* -1: not yet asked (a benign race: every thread finds the same answer) */

static int cpu_has_avx2(void) {
    if (use_avx2 < 0)
        use_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    return use_avx2;
}
#endif

/* one block's counts: the AVX2 loop for an unstrided block where the CPU has it, else SCALAR's */
#ifdef HAVE_COUNT_AVX2
#define COUNT(AVX2, SCALAR, seg, n, stride, scale, lanes, nb)                                          \
    ((stride) == 1 && cpu_has_avx2() ? AVX2(seg, n, scale, lanes, nb) : SCALAR(seg, n, stride, scale, lanes, nb))
#else
#define COUNT(AVX2, SCALAR, seg, n, stride, scale, lanes, nb) SCALAR(seg, n, stride, scale, lanes, nb)
#endif

/* tests only: on = 0 makes the kernels take the scalar loops, 1 the AVX2 ones where the CPU has
 * them; returns 1 when the AVX2 loops are now in use (trtq.calib.collect.compiled.use_simd) */
EXPORT int trtq_native_simd(int on) {
#ifdef HAVE_COUNT_AVX2
    use_avx2 = on ? (__builtin_cpu_supports("avx2") ? 1 : 0) : 0;
    return use_avx2;
#else
    (void)on;
    return 0;
#endif
}

/* x: float32 [rows, n] (contiguous); lanes: int32 [4, nb], zero or holding counts over 2**e0.
 * out: e, max bits, zeros. Returns POW2_OK, POW2_NONFINITE (a NaN / Inf: the rest is incomplete)
 * or POW2_TINY (the range would stay below 2**min_exp). */
EXPORT HOST_CLONES int trtq_pow2_count(const float *x, int64_t rows, int64_t n, int64_t stride, int32_t e0, int32_t *lanes,
                    int64_t nb, int32_t min_exp, int32_t *e_out, int32_t *top_out, int64_t *zeros_out) {
    int32_t e = e0;
    float scale = e == NO_EXPONENT ? 0.0f : (float)ldexp((double)nb, -e);
    int32_t top = 0;
    int64_t zeros = 0;
    int64_t step = block_step(stride);
    int status = POW2_OK;
    for (int64_t r = 0; r < rows && status == POW2_OK; r++) {
        const float *xr = x + r * n;
        for (int64_t s = 0; s < n; s += step) {
            int64_t len = n - s < step ? n - s : step;
            int32_t m = block_max_bits((const int32_t *)(xr + s), len);
            if (m >= NONFINITE_BITS) {
                status = POW2_NONFINITE;
                break;
            }
            top = m > top ? m : top;
            /* a normal max m is below 2**((m >> 23) - 126); a denormal one is below any min_exp */
            int32_t em = m >= SMALLEST_NORMAL_BITS ? (m >> 23) - 126 : (m > 0 ? min_exp - 1 : NO_EXPONENT);
            if (em > e) {
                if (em < min_exp) {
                    status = POW2_TINY;
                    break;
                }
                if (e != NO_EXPONENT) {
                    int d = em - e < 62 ? em - e : 62;
                    for (int j = 0; j < 4; j++) {
                        int32_t *lane = lanes + j * nb;
                        for (int64_t b = 0; b < nb; b++) {
                            int32_t c = lane[b];
                            lane[b] = 0;
                            lane[b >> d] += c;
                        }
                    }
                }
                e = em;
                scale = (float)ldexp((double)nb, -e);
            }
            zeros += COUNT(count_block_avx2, count_block, xr + s, len, stride, scale, lanes, nb);
        }
    }
    *e_out = e;
    *top_out = top;
    *zeros_out = zeros;
    return status;
}

/* a block that reaches the last bin: values past it count there; *exceeded set by any value at or
 * above exceed_at */
static inline int64_t count_block_clipped64(const float *seg, int64_t n, int64_t stride, float scale, int64_t *lanes,
                                            int64_t nb, float exceed_at, int *exceeded) {
    float flast = (float)(nb - 1);
    int64_t zeros = 0;
    uint64_t j = 0;
    for (int64_t p = 0; p < n; p += stride, j++) {
        float y = fabsf(seg[p]) * scale;
        zeros += y == 0.0f;
        *exceeded |= y >= exceed_at;
        lanes[(int64_t)(j & 3) * nb + (int64_t)(y < flast ? y : flast)]++;
    }
    return zeros;
}

/* x: float32 [rows, n] (contiguous), elements 0, stride, ... of each row counted as
 * floor(|x| * scale) into lanes (int64 [4, nb]). out: zeros, exceeded (a value at or above
 * exceed_at). Returns 1 when a NaN / Inf was met (the counts are then incomplete), else 0. */
EXPORT HOST_CLONES int trtq_histogram_f32(const float *x, int64_t rows, int64_t n, float scale, int64_t *lanes, int64_t nb,
                                   float exceed_at, int64_t stride, int64_t *zeros_out, int32_t *exceeded_out) {
    float flast = (float)(nb - 1);
    int64_t zeros = 0;
    int exceeded = 0, nonfinite = 0;
    int64_t step = block_step(stride);
    for (int64_t r = 0; r < rows && !nonfinite; r++) {
        const float *xr = x + r * n;
        for (int64_t s = 0; s < n; s += step) {
            int64_t len = n - s < step ? n - s : step;
            int32_t m = block_max_bits_strided((const int32_t *)(xr + s), len, stride);
            if (m >= NONFINITE_BITS) {
                nonfinite = 1;
                break;
            }
            float top;
            memcpy(&top, &m, sizeof top);
            if (top * scale < flast) { /* the usual case: no clamp, no flags */
                zeros += COUNT(count_block64_avx2, count_block64, xr + s, len, stride, scale, lanes, nb);
            } else {
                zeros += count_block_clipped64(xr + s, len, stride, scale, lanes, nb, exceed_at, &exceeded);
            }
        }
    }
    *zeros_out = zeros;
    *exceeded_out = exceeded;
    return nonfinite;
}

/* a_out[j, t] = sum_k p1[starts[j, k], t]; b_out[j, t] = sum_k weights[k] * p0[starts[j, k], t]
 * (int64; p1, p0: [rows, tensors], starts: [J, K], all contiguous) */
EXPORT void trtq_level_sums(const int64_t *starts, int64_t nj, int64_t nk, const int64_t *weights, const int64_t *p1,
                     const int64_t *p0, int64_t nt, int64_t *a_out, int64_t *b_out) {
    memset(a_out, 0, (size_t)(nj * nt) * sizeof(int64_t));
    memset(b_out, 0, (size_t)(nj * nt) * sizeof(int64_t));
    for (int64_t j = 0; j < nj; j++) {
        int64_t *a = a_out + j * nt, *b = b_out + j * nt;
        for (int64_t k = 0; k < nk; k++) {
            const int64_t *r1 = p1 + starts[j * nk + k] * nt, *r0 = p0 + starts[j * nk + k] * nt;
            int64_t w = weights[k];
            for (int64_t t = 0; t < nt; t++) {
                a[t] += r1[t];
                b[t] += w * r0[t];
            }
        }
    }
}

/* the interface's version: trtq.calib.collect.compiled refuses a library built from another one (an editable
 * install not rebuilt after a pull); raise it with any change of a signature or a rule */
EXPORT int trtq_native_version(void) { return 5; }

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_compiled", "see trtq.calib.collect.compiled", -1,
                                    NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__compiled(void) { return PyModule_Create(&module); }
