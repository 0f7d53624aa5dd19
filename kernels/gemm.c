/* EXPERIMENT */
#include "dot.h"

#ifndef TILE_R
#define TILE_R 2
#endif
#ifndef TILE_C
#define TILE_C 5
#endif

#define LO4_F32(p) wasm_v128_load(p)
#define LO4_BF16(p) bf16_lo_f32x4(wasm_v128_load64_zero(p))

#define DEFINE_TILE(SUF, T, LO4, TAIL, C)                                                \
  static inline void tile_##SUF(const T *w, size_t stride, const float *x, int n, \
                                       float *y, size_t rows) {                          \
    v128_t a[TILE_R][C], b[TILE_R][C], xv[C];                                                      \
    for (int i = 0; i < TILE_R; i++)                                                          \
      for (int j = 0; j < C; j++) a[i][j] = b[i][j] = wasm_f32x4_splat(0.0f);            \
    int c = 0;                                                                           \
    for (; c + 8 <= n; c += 8) {                                                         \
      for (int j = 0; j < C; j++) xv[j] = wasm_v128_load(x + j * (size_t)n + c);         \
      for (int i = 0; i < TILE_R; i++) {                                                      \
        v128_t wv = LO4(w + i * stride + c);                                             \
        for (int j = 0; j < C; j++) a[i][j] = MADD(wv, xv[j], a[i][j]);                  \
      }                                                                                  \
    }                                                                                    \
    if (c + 4 <= n) {                                                                    \
      for (int j = 0; j < C; j++) xv[j] = wasm_v128_load(x + j * (size_t)n + c);         \
      for (int i = 0; i < TILE_R; i++) {                                                      \
        v128_t wv = LO4(w + i * stride + c);                                             \
        for (int j = 0; j < C; j++) a[i][j] = MADD(wv, xv[j], a[i][j]);                  \
      }                                                                                  \
    }                                                                                    \
    for (c = 0; c + 8 <= n; c += 8) {                                                    \
      for (int j = 0; j < C; j++) xv[j] = wasm_v128_load(x + j * (size_t)n + c + 4);     \
      for (int i = 0; i < TILE_R; i++) {                                                      \
        v128_t wv = LO4(w + i * stride + c + 4);                                         \
        for (int j = 0; j < C; j++) b[i][j] = MADD(wv, xv[j], b[i][j]);                  \
      }                                                                                  \
    }                                                                                    \
    c = n & ~3;                                                                          \
    if (c < n) {                                                                         \
      int m = n - c;                                                                     \
      for (int j = 0; j < C; j++) xv[j] = load_tail_f32(x + j * (size_t)n + c, m);       \
      for (int i = 0; i < TILE_R; i++) {                                                      \
        v128_t wv = TAIL(w + i * stride + c, m);                                         \
        for (int j = 0; j < C; j++) b[i][j] = MADD(wv, xv[j], b[i][j]);                  \
      }                                                                                  \
    }                                                                                    \
    for (int j = 0; j < C; j++)                                                          \
      for (int i = 0; i < TILE_R; i++)                                                        \
        y[j * rows + i] = hsum_f32x4(wasm_f32x4_add(a[i][j], b[i][j]));                  \
  }

#define CAT_(a, b, c) a##b##c
#define TILE(C, SUF) CAT_(tile4x, C, _##SUF)

#define DEFINE_GEMM(NAME, SUF, T, LO4, TAIL)                                            \
  DEFINE_TILE(SUF, T, LO4, TAIL, TILE_C)                                                \
  KEXPORT(#NAME)                                                                        \
  void NAME(const T *W, const float *X, float *Y, int rows, int cols, int nb, int r0,   \
            int r1) {                                                                   \
    if (r1 > rows) r1 = rows;                                                           \
    int r = r0 < 0 ? 0 : r0;                                                            \
    for (; r + TILE_R <= r1; r += TILE_R) {                                                       \
      const T *w = W + (size_t)r * cols;                                                \
      int b = 0;                                                                        \
      for (; b + TILE_C <= nb; b += TILE_C)                                             \
        tile_##SUF(w, cols, X + (size_t)b * cols, cols, Y + (size_t)b * rows + r, rows); \
      for (; b < nb; b++)                                                               \
        for (int i = 0; i < TILE_R; i++)                                                \
          Y[(size_t)b * rows + r + i] = dot1_##SUF(w + (size_t)i * cols, X + (size_t)b * cols, cols); \
    }                                                                                   \
    for (; r < r1; r++) {                                                               \
      const T *w = W + (size_t)r * cols;                                                \
      for (int b = 0; b < nb; b++)                                                      \
        Y[(size_t)b * rows + r] = dot1_##SUF(w, X + (size_t)b * cols, cols);            \
    }                                                                                   \
  }

DEFINE_GEMM(gemm_f32, f32, float, LO4_F32, load_tail_f32)
DEFINE_GEMM(gemm_bf16, bf16, uint16_t, LO4_BF16, load_tail_bf16)
