/*
 * Matrix-vector products y[r] = sum_c W[r*cols + c] * x[c] for rows r in [r0, r1), W row-major
 * f32, bf16 or IEEE half. Rows go four at a time (each x load serves four rows; Deno bounds-checks
 * every load) with a one-row path for the rest; both accumulate a row identically (dot.h), so how
 * rows are grouped never changes a result.
 *
 * The four rows of a step come from the four quarters of the range, not from four neighbours:
 * neighbouring short rows share 4 KiB pages, and two interleaved streams in one page defeat the
 * hardware prefetcher (1024-column bf16 rows ran at 7 GB/s against 11.5 for 4096 columns).
 */
#include "dot.h"

#define DEFINE_GEMV(NAME, SUF, T)                                                       \
  KEXPORT(#NAME)                                                                        \
  void NAME(const T *W, const float *x, float *y, int rows, int cols, int r0, int r1) { \
    if (r1 > rows) r1 = rows;                                                           \
    int r = r0 < 0 ? 0 : r0;                                                            \
    if (r >= r1) return;                                                                \
    int q = (r1 - r) / 4;                                                               \
    for (int i = 0; i < q; i++) {                                                       \
      dot4_##SUF(W + (size_t)(r + i) * cols, (size_t)q * cols, x, cols, y + r + i,      \
                 (size_t)q);                                                            \
    }                                                                                   \
    for (int k = r + 4 * q; k < r1; k++) y[k] = dot1_##SUF(W + (size_t)k * cols, x, cols); \
  }

DEFINE_GEMV(gemv_f32, f32, float)
DEFINE_GEMV(gemv_bf16, bf16, uint16_t)
DEFINE_GEMV(gemv_f16, f16, uint16_t)
