/*
 * Batched matrix products Y[b*rows + r] = sum_c W[r*cols + c] * X[b*cols + c] for b < nb, rows
 * r in [r0, r1). Column b must equal gemv(W, X + b*cols) bit for bit (chunked prefill relies on
 * it), so every (row, column) sum is formed exactly as the row dots of dot.h form it.
 *
 * Speed comes from register tiles of 2 rows x C columns: each weight vector is loaded (and, for
 * bf16, decoded) once per tile and each activation vector once per tile, because Deno
 * bounds-checks every wasm load. The dot.h order keeps two accumulators per (row, column): a takes
 * the first half of every group of 8 columns and the group of 4 left after them, b the second
 * halves and the zero-padded 1-3 column tail; the result is hsum(a + b). The a and b chains never
 * mix before that final add, so a tile runs them as two passes over the row, and only C*2
 * accumulators are live in the loop. A 2 x 6 tile then holds 12 accumulators, 2 weight vectors
 * and 1 activation vector: 15 of the 16 xmm registers V8 has for wasm SIMD on x86, so nothing
 * spills, provided the bf16 decode needs no constant register (GRP4_BF16 widens with a load, not
 * a shuffle against a zero vector). Fewer than 3 columns go through the gemv row dot itself.
 */
#include "dot.h"

/*
 * One step of 4 columns from c: both rows' weights first, then each activation vector loaded once
 * and used for both rows. Loading all C activation vectors first (then a weight at a time) keeps
 * C + 1 more vectors live and spilled the 2 x 6 bf16 tile (half the speed).
 */
#define TILE_STEP(acc, W0, W1, c, C)                                                       \
  do {                                                                                     \
    v128_t w0 = (W0), w1 = (W1);                                                           \
    for (int j = 0; j < C; j++) {                                                          \
      v128_t xv = wasm_v128_load(x + j * (size_t)n + (c));                                 \
      acc[0][j] = MADD(w0, xv, acc[0][j]);                                                 \
      acc[1][j] = MADD(w1, xv, acc[1][j]);                                                 \
    }                                                                                      \
  } while (0)

/*
 * Rows w and w + stride against columns x + j*n (j < C), the sums written to y[j*ystride] and
 * y[j*ystride + ds].
 * GRP4 loads 4 weights as f32 lanes, TAIL the last 1-3 zero padded (the dot.h loaders).
 * Inlined: as a separate function clang-19 hoists all C activation loads of an f32 step ahead
 * of their multiply-adds, which needs C more registers and made V8 spill (no gain at all).
 */
#define DEFINE_TILE(SUF, T, GRP4, TAIL, C)                                                 \
  static inline __attribute__((always_inline)) void tile2x##C##_##SUF(                     \
      const T *w, size_t stride, const float *x, int n, float *y, size_t ystride,         \
      size_t ds) {                                                                         \
    v128_t a[2][C], b[2][C];                                                               \
    for (int i = 0; i < 2; i++)                                                            \
      for (int j = 0; j < C; j++) a[i][j] = b[i][j] = wasm_f32x4_splat(0.0f);              \
    /* Pass a: columns [c, c+4) of each group of 8, then a last group of 4. */             \
    int c = 0;                                                                             \
    for (; c + 8 <= n; c += 8) TILE_STEP(a, GRP4(w + c), GRP4(w + stride + c), c, C);      \
    if (c + 4 <= n) TILE_STEP(a, GRP4(w + c), GRP4(w + stride + c), c, C);                 \
    /* Pass b: columns [c+4, c+8) of each group of 8, then the 1-3 column tail. */         \
    for (c = 0; c + 8 <= n; c += 8) {                                                      \
      TILE_STEP(b, GRP4(w + c + 4), GRP4(w + stride + c + 4), c + 4, C);                   \
    }                                                                                      \
    c = n & ~3;                                                                            \
    if (c < n) {                                                                           \
      int m = n - c;                                                                       \
      v128_t w0 = TAIL(w + c, m), w1 = TAIL(w + stride + c, m);                            \
      for (int j = 0; j < C; j++) {                                                        \
        v128_t xv = load_tail_f32(x + j * (size_t)n + c, m);                               \
        b[0][j] = MADD(w0, xv, b[0][j]);                                                   \
        b[1][j] = MADD(w1, xv, b[1][j]);                                                   \
      }                                                                                    \
    }                                                                                      \
    for (int j = 0; j < C; j++)                                                            \
      for (int i = 0; i < 2; i++)                                                          \
        y[j * ystride + i * ds] = hsum_f32x4(wasm_f32x4_add(a[i][j], b[i][j]));            \
  }

#define DEFINE_TILES(SUF, T, GRP4, TAIL)  \
  DEFINE_TILE(SUF, T, GRP4, TAIL, 3)      \
  DEFINE_TILE(SUF, T, GRP4, TAIL, 4)      \
  DEFINE_TILE(SUF, T, GRP4, TAIL, 5)      \
  DEFINE_TILE(SUF, T, GRP4, TAIL, 6)

/*
 * Rows w, w + qs, w + 2qs, w + 3qs (one of each quarter of the row range) against the C columns
 * at x: the first two, then the last two, written q apart from y.
 */
#define TILE_PAIR(SUF, C)                                                                 \
  do {                                                                                    \
    tile2x##C##_##SUF(w, qs, x, cols, y, rows, q);                                        \
    tile2x##C##_##SUF(w + 2 * qs, qs, x, cols, y + 2 * q, rows, q);                       \
  } while (0)

/*
 * A step's four rows come from the four quarters of [r0, r1) (rows r+i, r+q+i, r+2q+i, r+3q+i),
 * the last (r1-r0)%4 rows go one at a time, as in gemv.c: a tile's rows read from neighbouring
 * rows would be interleaved streams in one 4 KiB page, which the hardware prefetcher does not
 * follow (weights not in cache, as every expert's are: 18-21 -> 20-23 GMAC/s on one thread).
 */
/*
 * Columns run in blocks of about this many activation floats (256 KiB; a multiple of 6 columns),
 * each block through every row: a prefill chunk's activations (512 tokens x 2048 floats = 4 MiB)
 * do not stay in L2 while all of them pass once per row quad, and a block does. It changes no
 * (row, column) sum. 4096x2048 bf16 at 512 columns: 11.6 -> 18.6 GMAC/s on one thread (loaded);
 * blocks of 128 KiB or 512 KiB were no better.
 */
#ifndef GEMM_BLOCK_FLOATS
#define GEMM_BLOCK_FLOATS 65536
#endif
#define DEFINE_GEMM(NAME, SUF, T)                                                       \
  KEXPORT(#NAME)                                                                        \
  void NAME(const T *W, const float *X, float *Y, int rows, int cols, int nb, int r0,   \
            int r1) {                                                                   \
    if (r1 > rows) r1 = rows;                                                           \
    int r = r0 < 0 ? 0 : r0;                                                            \
    if (r >= r1) return;                                                                \
    int q = (r1 - r) / 4;                                                               \
    size_t qs = (size_t)q * cols;                                                       \
    int blk = GEMM_BLOCK_FLOATS / (cols > 0 ? cols : 1) / 6 * 6;                         \
    if (blk < 6) blk = 6;                                                               \
    for (int b0 = 0; b0 < nb; b0 += blk) {                                              \
    int be = nb - b0 < blk ? nb : b0 + blk;                                             \
    for (int i = 0; i < q; i++) {                                                       \
      const T *w = W + (size_t)(r + i) * cols;                                          \
      int b = b0;                                                                       \
      for (; b + 6 <= be; b += 6) {                                                     \
        const float *x = X + (size_t)b * cols;                                          \
        float *y = Y + (size_t)b * rows + r + i;                                        \
        TILE_PAIR(SUF, 6);                                                              \
      }                                                                                 \
      const float *x = X + (size_t)b * cols;                                            \
      float *y = Y + (size_t)b * rows + r + i;                                          \
      switch (be - b) {                                                                 \
        case 5: TILE_PAIR(SUF, 5); break;                                               \
        case 4: TILE_PAIR(SUF, 4); break;                                               \
        case 3: TILE_PAIR(SUF, 3); break;                                               \
        default: /* 0-2 columns: the gemv row dot is as fast when weights stream. */    \
          for (; b < be; b++, x += cols, y += rows) dot4_##SUF(w, qs, x, cols, y, q);   \
          break;                                                                        \
      }                                                                                 \
    }                                                                                   \
    }                                                                                   \
    for (int k = r + 4 * q; k < r1; k++) {                                              \
      const T *w = W + (size_t)k * cols;                                                \
      for (int b = 0; b < nb; b++)                                                      \
        Y[(size_t)b * rows + k] = dot1_##SUF(w, X + (size_t)b * cols, cols);            \
    }                                                                                   \
  }

DEFINE_TILES(f32, float, GRP4_F32, load_tail_f32)
DEFINE_TILES(bf16, uint16_t, GRP4_BF16, load_tail_bf16)
DEFINE_GEMM(gemm_f32, f32, float)
DEFINE_GEMM(gemm_bf16, bf16, uint16_t)
