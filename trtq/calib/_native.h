/* What the two C files of trtq.calib._native share: the kernels' statuses and constants, the
 * export macro, and the one-pass kernel the in-graph operator (_ingraph.c) calls. */
#ifndef TRTQ_NATIVE_H
#define TRTQ_NATIVE_H

#include <stdint.h>

#define NONFINITE_BITS 0x7F800000
#define NO_EXPONENT (-(1 << 30)) /* "only zeros so far" (trtq.calib.kernels.NO_EXPONENT) */

enum { POW2_OK = 0, POW2_NONFINITE = 1, POW2_TINY = 2 };

/* entry points are looked up by name (ctypes; ONNX Runtime's RegisterCustomOps) */
#if defined(_WIN32)
#define EXPORT __declspec(dllexport)
#elif defined(__GNUC__)
#define EXPORT __attribute__((visibility("default")))
#else
#define EXPORT
#endif

/* the one-pass power-of-two histogram (_native.c) */
int trtq_pow2_count(const float *x, int64_t rows, int64_t n, int64_t stride, int32_t e0, int32_t *lanes, int64_t nb,
                    int32_t min_exp, int32_t *e_out, int32_t *top_out, int64_t *zeros_out);

#endif
