/*
 * The exact matvec template for 4-bit codes with a per-32-block scale (INT4 g32 as shipped, in
 * quant_int4.c): x stays f32, every weight is decoded to its exact value, products and sums are
 * separate f32 operations (no fused multiply-add, no Q8 copy). A format supplies a 16-entry code
 * table and the block scale. (MXFP4's exact matvec is in quant_mxfp4.c instead: it must give
 * gemm_bf16's bits on its decoded weights, so that its batches can run as a GEMM.)
 *
 * Decoding: every 4-bit code of such a format has a value with at most 8 significant bits (E2M1's
 * 0..6 and int4's -8..7), so it is a bf16. Two byte swizzles give the low and the high byte of
 * that bf16 for 16 codes; interleaving them gives bf16 lanes, and interleaving those with zero
 * gives the f32 lanes (bf16 is the top half of an f32). That costs fewer shuffles than widening
 * integer codes i8 -> i16 -> i32 and converting them (1.3x, docs/PERFORMANCE.md).
 *
 * Order (tests/scalar_quant_kernels.ts's matvecQ4ExactRef is its twin): in a 32-block, lane k of
 * product vector m (m = 0..3) is element 8m + 2k for the even elements and 8m + 2k + 1 for the
 * odd; the block sum is ((e0 + e1) + (e2 + e3)) + ((o0 + o1) + (o2 + o3)), times the block scale
 * once, added to the row's lane accumulator; the row's dot is hsum_f32x4 of it. Four rows share
 * each x load; a row's arithmetic never depends on the rows beside it.
 */
#ifndef SLUICE_QUANT_EXACT_H
#define SLUICE_QUANT_EXACT_H

#include "quant.h"

/* The loop's vector constants, hidden behind runtime_zero_v128 so they stay in registers. */
typedef struct {
  v128_t zero, lo, hi, nibble;
} q4x_consts;

/* The block sum (before its scale) of one row's 32-block w with x split into even and odd. */
static inline __attribute__((always_inline)) v128_t q4x_block(const uint8_t *w, const v128_t *xe,
                                                              const v128_t *xo, q4x_consts c) {
  v128_t v = wasm_v128_load(w);
  v128_t codes[2] = {wasm_v128_and(v, c.nibble), wasm_v128_and(wasm_u16x8_shr(v, 4), c.nibble)};
  const v128_t *xs[2] = {xe, xo};
  v128_t half[2];
  for (int h = 0; h < 2; h++) {
    v128_t lo = wasm_i8x16_relaxed_swizzle(c.lo, codes[h]);
    v128_t hi = wasm_i8x16_relaxed_swizzle(c.hi, codes[h]);
    v128_t bf[2] = {
        wasm_i8x16_shuffle(lo, hi, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
        wasm_i8x16_shuffle(lo, hi, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
    };
    v128_t p[4];
    for (int m = 0; m < 4; m++) {
      v128_t wf = m & 1 ? wasm_i16x8_shuffle(c.zero, bf[m >> 1], 4, 12, 5, 13, 6, 14, 7, 15)
                        : wasm_i16x8_shuffle(c.zero, bf[m >> 1], 0, 8, 1, 9, 2, 10, 3, 11);
      p[m] = wasm_f32x4_mul(wf, xs[h][m]);
    }
    half[h] = wasm_f32x4_add(wasm_f32x4_add(p[0], p[1]), wasm_f32x4_add(p[2], p[3]));
  }
  return wasm_f32x4_add(half[0], half[1]);
}

/*
 * matvec NAME(W, S, x, y, rows, cols, r0, r1) with f32 x (passed through the xq pointer) for a
 * 4-bit format: LO and HI the bytes of each code's bf16 value (i8x16 constants), SCALE(e) the f32
 * scale of scale element e (type ST). cols must be a multiple of 32.
 */
#define DEFINE_Q4_EXACT(NAME, SUF, ST, LO, HI, SCALE)                                        \
  static inline v128_t q4_dot4_##SUF(const uint8_t *w0, const uint8_t *w1, const uint8_t *w2, \
                                     const uint8_t *w3, const ST *s0, const ST *s1,          \
                                     const ST *s2, const ST *s3, const int8_t *xq, int cols) { \
    const float *x = (const float *)xq;                                                      \
    v128_t z = runtime_zero_v128(xq);                                                        \
    q4x_consts c = {z, wasm_v128_xor(LO, z), wasm_v128_xor(HI, z),                           \
                    wasm_v128_xor(wasm_i8x16_splat(0x0f), z)};                               \
    v128_t acc0 = z, acc1 = z, acc2 = z, acc3 = z;                                           \
    for (int b = 0; b < cols / 32; b++) {                                                    \
      const float *xb = x + 32 * b;                                                          \
      v128_t xe[4], xo[4];                                                                   \
      for (int k = 0; k < 4; k++) {                                                          \
        v128_t a = wasm_v128_load(xb + 8 * k), d = wasm_v128_load(xb + 8 * k + 4);           \
        xe[k] = wasm_i32x4_shuffle(a, d, 0, 2, 4, 6);                                        \
        xo[k] = wasm_i32x4_shuffle(a, d, 1, 3, 5, 7);                                        \
      }                                                                                      \
      size_t o = 16 * (size_t)b;                                                             \
      acc0 = wasm_f32x4_add(acc0, wasm_f32x4_mul(q4x_block(w0 + o, xe, xo, c),               \
                                                 wasm_f32x4_splat(SCALE(s0[b]))));           \
      acc1 = wasm_f32x4_add(acc1, wasm_f32x4_mul(q4x_block(w1 + o, xe, xo, c),               \
                                                 wasm_f32x4_splat(SCALE(s1[b]))));           \
      acc2 = wasm_f32x4_add(acc2, wasm_f32x4_mul(q4x_block(w2 + o, xe, xo, c),               \
                                                 wasm_f32x4_splat(SCALE(s2[b]))));           \
      acc3 = wasm_f32x4_add(acc3, wasm_f32x4_mul(q4x_block(w3 + o, xe, xo, c),               \
                                                 wasm_f32x4_splat(SCALE(s3[b]))));           \
    }                                                                                        \
    return wasm_f32x4_make(hsum_f32x4(acc0), hsum_f32x4(acc1), hsum_f32x4(acc2),             \
                           hsum_f32x4(acc3));                                                \
  }                                                                                          \
  DEFINE_Q4_MATVEC(NAME, SUF, ST)

/* The f32 with bits u. */
static inline float f32_from_bits(uint32_t u) {
  union {
    uint32_t u;
    float f;
  } v = {u};
  return v.f;
}

#endif
