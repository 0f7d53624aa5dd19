/*
 * The exact matvec template for 4-bit codes with a per-32-block scale (MXFP4 in quant_mxfp4.c,
 * INT4 g32 as shipped in quant_int4.c): x stays f32, every weight is its exact value (code times
 * block scale, an f32 without rounding), and a row's dot is formed as dot.h forms it (groups of
 * 8 columns: [c, c+4) into accumulator a, [c+4, c+8) into b, relaxed madd, hsum(a + b)). That is
 * the order of gemm_bf16 / gemm_f32, so a batch is the format's dequant kernel, then the GEMM on
 * the decoded rows (DEFINE_Q4_EXACT_GEMM), and every column equals this matvec bit for bit.
 *
 * Decoding: every 4-bit code of such a format has a value with at most 8 significant bits (E2M1's
 * 0..6 and int4's -8..7), so it is a bf16. The nibbles of a block are put in column order, two
 * byte swizzles give the low and the high byte of each code's bf16, and interleaving those gives
 * 8 columns of bf16 per vector; interleaving with zero gives the f32 lanes (bf16 is the top half
 * of an f32). Scales: MXFP4's are powers of two, so the scale is added to the bf16 exponent field
 * with one saturating u16 subtract per 8 weights (quant_mxfp4.c), INT4's bf16 scale is an f32
 * multiply per 4 weights (q * s has up to 11 significant bits: exact in f32, not in bf16).
 *
 * Two rows per pass share each x load: the loads are the cost here (Deno bounds-checks every one),
 * and two rows' decoded blocks (8 vectors), their accumulators (4), x (2) and the zero fit the 16
 * vector registers V8 gives wasm on x86.
 */
#ifndef SLUICE_QUANT_EXACT_H
#define SLUICE_QUANT_EXACT_H

#include "dot.h"
#include "quant.h"

/* The loop's vector constants, hidden behind runtime_zero_v128 so they stay in registers. */
typedef struct {
  v128_t zero, lo, hi, nibble;
} q4x_consts;

static inline q4x_consts q4x_consts_make(const void *p, v128_t lo, v128_t hi) {
  v128_t z = runtime_zero_v128(p);
  return (q4x_consts){z, wasm_v128_xor(lo, z), wasm_v128_xor(hi, z),
                      wasm_v128_xor(wasm_i8x16_splat(0x0f), z)};
}

/*
 * The 32 codes of the block at w as the u16 table values (the bf16 bytes LO, HI of a code) in
 * column order: out[k] holds columns 8k..8k+7. A byte holds column 2i in its low nibble, 2i+1 in
 * its high one, so the nibbles are interleaved back before the lookups. Every shuffle here is an
 * interleave, which V8 turns into one instruction (other patterns cost three to five).
 */
static inline __attribute__((always_inline)) void q4x_decode(const uint8_t *w, q4x_consts c,
                                                             v128_t out[4]) {
  v128_t v = wasm_v128_load(w);
  v128_t lo = wasm_v128_and(v, c.nibble), hi = wasm_v128_and(wasm_u16x8_shr(v, 4), c.nibble);
  v128_t n[2] = {
      wasm_i8x16_shuffle(lo, hi, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
      wasm_i8x16_shuffle(lo, hi, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
  };
  for (int h = 0; h < 2; h++) {
    v128_t l = wasm_i8x16_relaxed_swizzle(c.lo, n[h]), u = wasm_i8x16_relaxed_swizzle(c.hi, n[h]);
    out[2 * h] = wasm_i8x16_shuffle(l, u, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    out[2 * h + 1] =
        wasm_i8x16_shuffle(l, u, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  }
}

/* f32 lanes of the bf16 in u16 lanes 0..3 (half 0) or 4..7 (half 1). */
static inline __attribute__((always_inline)) v128_t q4x_f32(v128_t zero, v128_t v, int half) {
  return half ? wasm_i16x8_shuffle(zero, v, 4, 12, 5, 13, 6, 14, 7, 15)
              : wasm_i16x8_shuffle(zero, v, 0, 8, 1, 9, 2, 10, 3, 11);
}

/*
 * Two rows' decoded blocks d0, d1 (q4x_decode) against the block's x at xb into the accumulators
 * (a, b) of row 0 in acc[0], acc[1] and of row 1 in acc[2], acc[3], in dot.h's order. With mul,
 * each f32 weight is first multiplied by the row's f32 scale splat m0 / m1 (exact: the weights
 * are f32 values code * scale).
 */
static inline __attribute__((always_inline)) void q4x_madd2(const v128_t d0[4],
                                                           const v128_t d1[4], const float *xb,
                                                           int mul, v128_t m0, v128_t m1,
                                                           v128_t zero, v128_t acc[4]) {
  for (int g = 0; g < 4; g++) {
    v128_t xl = wasm_v128_load(xb + 8 * g), xh = wasm_v128_load(xb + 8 * g + 4);
    v128_t w[4] = {q4x_f32(zero, d0[g], 0), q4x_f32(zero, d0[g], 1), q4x_f32(zero, d1[g], 0),
                   q4x_f32(zero, d1[g], 1)};
    if (mul) {
      w[0] = wasm_f32x4_mul(w[0], m0);
      w[1] = wasm_f32x4_mul(w[1], m0);
      w[2] = wasm_f32x4_mul(w[2], m1);
      w[3] = wasm_f32x4_mul(w[3], m1);
    }
    acc[0] = MADD(w[0], xl, acc[0]);
    acc[1] = MADD(w[1], xh, acc[1]);
    acc[2] = MADD(w[2], xl, acc[2]);
    acc[3] = MADD(w[3], xh, acc[3]);
  }
}

/* The two rows' dots from their accumulators, as lanes [row0, row1, row0, row1]. */
static inline v128_t q4x_result2(const v128_t acc[4]) {
  float r0 = hsum_f32x4(wasm_f32x4_add(acc[0], acc[1]));
  float r1 = hsum_f32x4(wasm_f32x4_add(acc[2], acc[3]));
  return wasm_f32x4_make(r0, r1, r0, r1);
}

/*
 * Four rows' dots (lanes [row0..row3]) from a two-row dot q4x_dot2_SUF(w0, w1, s0, s1, x, cols),
 * and the matvec NAME(W, S, x, y, rows, cols, r0, r1) with f32 x passed through the xq pointer.
 */
#define DEFINE_Q4_EXACT(NAME, SUF, ST)                                                      \
  static inline v128_t q4_dot4_##SUF(const uint8_t *w0, const uint8_t *w1, const uint8_t *w2, \
                                     const uint8_t *w3, const ST *s0, const ST *s1,          \
                                     const ST *s2, const ST *s3, const int8_t *xq, int cols) { \
    const float *x = (const float *)xq;                                                      \
    v128_t p = q4x_dot2_##SUF(w0, w1, s0, s1, x, cols);                                      \
    v128_t q = q4x_dot2_##SUF(w2, w3, s2, s3, x, cols);                                      \
    return wasm_i64x2_shuffle(p, q, 0, 3);                                                   \
  }                                                                                          \
  DEFINE_Q4_MATVEC(NAME, SUF, ST)

/*
 * The batched exact kernel NAME(W, S, X, Y, D, rows, cols, nb, r0, r1): Y[b*rows + r] for the nb
 * vectors of X, rows [r0, r1), as the format's dequant kernel DEQUANT then GEMM on the decoded
 * rows, a tile of rows at a time. Every tile is decoded to the same place, D's rows r0.. (about
 * 256 KiB), so the decoded copy stays in cache between its decode and its GEMM instead of going
 * to memory and back; the GEMM's result per row and column does not depend on the row range it
 * is given, so tiles change no bit. Each call writes only D's rows from its r0, so workers
 * splitting the rows share one D of [rows, cols].
 */
#define Q4X_TILE_BYTES (256 * 1024)
#define DEFINE_Q4_EXACT_GEMM(NAME, ST, DT, DEQUANT, GEMM)                                     \
  KEXPORT(#NAME)                                                                              \
  void NAME(const uint8_t *W, const ST *S, const float *X, float *Y, DT *D, int rows, int cols, \
            int nb, int r0, int r1) {                                                         \
    if (r1 > rows) r1 = rows;                                                                 \
    if (r0 < 0) r0 = 0;                                                                       \
    if (cols <= 0) return;                                                                    \
    int tile = Q4X_TILE_BYTES / (cols * (int)sizeof(DT)) / 4 * 4;                             \
    if (tile < 4) tile = 4;                                                                   \
    uintptr_t place = (uintptr_t)(D + (size_t)r0 * cols);                                     \
    for (int r = r0; r < r1; r += tile) {                                                     \
      int e = r1 - r > tile ? r + tile : r1;                                                  \
      /* Rows [r, e) of this view are D's rows r0.. */                                        \
      DT *view = (DT *)(place - (size_t)r * cols * sizeof(DT));                              \
      DEQUANT(W, S, view, rows, cols, r, e);                                                  \
      GEMM(view, X, Y, rows, cols, nb, r, e);                                                 \
    }                                                                                         \
  }

/* The GEMMs of gemm.c, which the batched exact kernels call on their decoded tiles. */
void gemm_bf16(const uint16_t *W, const float *X, float *Y, int rows, int cols, int nb, int r0,
               int r1);
void gemm_f32(const float *W, const float *X, float *Y, int rows, int cols, int nb, int r0,
              int r1);

/* The f32 with bits u. */
static inline float f32_from_bits(uint32_t u) {
  union {
    uint32_t u;
    float f;
  } v = {u};
  return v.f;
}

#endif
