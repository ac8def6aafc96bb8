/* What the C files of trtq.calib.collect._compiled share: the kernels' statuses and constants, the
 * target_clones and export macros, and the kernels the in-graph operator (_ingraph_fold.c) calls. */
#ifndef TRTQ_KERNELS_H
#define TRTQ_KERNELS_H

#include <stdint.h>

#define NONFINITE_BITS 0x7F800000
#define NO_EXPONENT (-(1 << 30)) /* "only zeros so far" (trtq.calib.collect.kernels.NO_EXPONENT) */

enum { POW2_OK = 0, POW2_NONFINITE = 1, POW2_TINY = 2 };

/* x86-64's baseline (SSE2) has no int32 max instruction: the block max would take four
 * instructions per vector. GCC / clang on glibc compile the kernel for SSE4.1 and AVX2 too and
 * pick one when the library loads (the timings: benchmarks/README.md, "Compiled kernels"). */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones) && defined(__GLIBC__)
#define HOST_CLONES __attribute__((target_clones("avx2", "sse4.1", "default")))
#endif
#endif
#ifndef HOST_CLONES
#define HOST_CLONES
#endif

/* entry points are looked up by name (ctypes; ONNX Runtime's RegisterCustomOps); Linux only
 * (setup.py builds the library there, with GCC or clang; elsewhere trtq runs numpy) */
#define EXPORT __attribute__((visibility("default")))

/* the one-pass power-of-two histogram and the two-pass fixed-edge one (_kernels.c) */
int trtq_pow2_count(const float *x, int64_t rows, int64_t n, int64_t stride, int32_t e0, int32_t *lanes, int64_t nb,
                    int32_t min_exp, int32_t *e_out, int32_t *top_out, int64_t *zeros_out);
int trtq_histogram_f32(const float *x, int64_t rows, int64_t n, float scale, int64_t *lanes, int64_t nb,
                       float exceed_at, int64_t stride, int64_t *zeros_out, int32_t *exceeded_out);

#endif
