/*
 * Matrix-vector products y[r] = sum_c W[r*cols + c] * x[c] for rows r in [r0, r1), W row-major
 * f32, bf16 or IEEE half. Rows go four at a time (each x load serves four rows; Deno bounds-checks
 * every load) with a one-row path for the rest; both accumulate a row identically (dot.h).
 */
#include "dot.h"

#define DEFINE_GEMV(NAME, SUF, T)                                                       \
  KEXPORT(#NAME)                                                                        \
  void NAME(const T *W, const float *x, float *y, int rows, int cols, int r0, int r1) { \
    if (r1 > rows) r1 = rows;                                                           \
    int r = r0 < 0 ? 0 : r0;                                                            \
    for (; r + 4 <= r1; r += 4) dot4_##SUF(W + (size_t)r * cols, cols, x, cols, y + r); \
    for (; r < r1; r++) y[r] = dot1_##SUF(W + (size_t)r * cols, x, cols);               \
  }

DEFINE_GEMV(gemv_f32, f32, float)
DEFINE_GEMV(gemv_bf16, bf16, uint16_t)
DEFINE_GEMV(gemv_f16, f16, uint16_t)
