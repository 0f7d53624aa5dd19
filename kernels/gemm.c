/*
 * Batched matrix products Y[b*rows + r] = sum_c W[r*cols + c] * X[b*cols + c] for b < nb, rows
 * r in [r0, r1). For each block of four weight rows every batch column is computed before moving
 * on, so the block is fetched from DRAM once and then served from cache for the other columns.
 * Each column uses the gemv row dot, so column b equals gemv(W, X + b*cols) bit for bit.
 */
#include "dot.h"

#define DEFINE_GEMM(NAME, SUF, T)                                                       \
  KEXPORT(#NAME)                                                                        \
  void NAME(const T *W, const float *X, float *Y, int rows, int cols, int nb, int r0,   \
            int r1) {                                                                   \
    if (r1 > rows) r1 = rows;                                                           \
    int r = r0 < 0 ? 0 : r0;                                                            \
    for (; r + 4 <= r1; r += 4) {                                                       \
      const T *w = W + (size_t)r * cols;                                                \
      for (int b = 0; b < nb; b++)                                                      \
        dot4_##SUF(w, cols, X + (size_t)b * cols, cols, Y + (size_t)b * rows + r);      \
    }                                                                                   \
    for (; r < r1; r++) {                                                               \
      const T *w = W + (size_t)r * cols;                                                \
      for (int b = 0; b < nb; b++)                                                      \
        Y[(size_t)b * rows + r] = dot1_##SUF(w, X + (size_t)b * cols, cols);            \
    }                                                                                   \
  }

DEFINE_GEMM(gemm_f32, f32, float)
DEFINE_GEMM(gemm_bf16, bf16, uint16_t)
