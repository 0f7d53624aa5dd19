/*
 * Row dot products shared by the matrix kernels and attention. Every path (one row, or four rows
 * that share each load of x) accumulates a row in exactly the same order, so a row's result never
 * depends on how rows were grouped or split between workers:
 *   columns in groups of 8: [c, c+4) into accumulator a, [c+4, c+8) into b (relaxed madd);
 *   then a group of 4 into a if one remains; then the last 1-3 columns, zero padded, into b;
 *   result = hsum(a + b).
 */
#ifndef SLUICE_DOT_H
#define SLUICE_DOT_H

#include "simd.h"

#define MADD(w, x, acc) wasm_f32x4_relaxed_madd((w), (x), (acc))

/* Weight loaders per storage type: a group of 8 columns as two f32 vectors, a group of 4. */
#define GRP8_F32(p, lo, hi) ((lo) = wasm_v128_load(p), (hi) = wasm_v128_load((p) + 4))
#define GRP4_F32(p) wasm_v128_load(p)
#define GRP8_BF16(p, lo, hi)                                                            \
  do {                                                                                  \
    v128_t v_ = wasm_v128_load(p);                                                      \
    (lo) = bf16_lo_f32x4(v_);                                                           \
    (hi) = bf16_hi_f32x4(v_);                                                           \
  } while (0)
/* Widening load + shift: unlike the shuffle of GRP8 it needs no zero vector in a register. */
#define GRP4_BF16(p) wasm_i32x4_shl(wasm_u32x4_load16x4(p), 16)
#define GRP8_F16(p, lo, hi)                                                             \
  do {                                                                                  \
    v128_t v_ = wasm_v128_load(p);                                                      \
    (lo) = f16_lo_f32x4(v_);                                                            \
    (hi) = f16_hi_f32x4(v_);                                                            \
  } while (0)
#define GRP4_F16(p) f16_lo_f32x4(wasm_v128_load64_zero(p))

#define DEFINE_ROW_DOTS(SUF, T, GRP8, GRP4, TAIL)                                       \
  static inline float dot1_##SUF(const T *w, const float *x, int n) {                  \
    v128_t a = wasm_f32x4_splat(0.0f), b = a;                                           \
    int c = 0;                                                                          \
    for (; c + 8 <= n; c += 8) {                                                        \
      v128_t lo, hi;                                                                    \
      GRP8(w + c, lo, hi);                                                              \
      a = MADD(lo, wasm_v128_load(x + c), a);                                           \
      b = MADD(hi, wasm_v128_load(x + c + 4), b);                                       \
    }                                                                                   \
    if (c + 4 <= n) {                                                                   \
      a = MADD(GRP4(w + c), wasm_v128_load(x + c), a);                                  \
      c += 4;                                                                           \
    }                                                                                   \
    if (c < n) b = MADD(TAIL(w + c, n - c), load_tail_f32(x + c, n - c), b);            \
    return hsum_f32x4(wasm_f32x4_add(a, b));                                            \
  }                                                                                     \
  /* Rows w, w + stride, w + 2*stride, w + 3*stride; dots written to dst[0], dst[ds],    \
   * dst[2*ds], dst[3*ds]. */                                                           \
  static inline void dot4_##SUF(const T *w, size_t stride, const float *x, int n,      \
                                float *dst, size_t ds) {                                \
    const T *w0 = w, *w1 = w + stride, *w2 = w + 2 * stride, *w3 = w + 3 * stride;      \
    v128_t a0 = wasm_f32x4_splat(0.0f), b0 = a0, a1 = a0, b1 = a0;                      \
    v128_t a2 = a0, b2 = a0, a3 = a0, b3 = a0;                                          \
    int c = 0;                                                                          \
    for (; c + 8 <= n; c += 8) {                                                        \
      v128_t xl = wasm_v128_load(x + c), xh = wasm_v128_load(x + c + 4), lo, hi;        \
      GRP8(w0 + c, lo, hi);                                                             \
      a0 = MADD(lo, xl, a0);                                                            \
      b0 = MADD(hi, xh, b0);                                                            \
      GRP8(w1 + c, lo, hi);                                                             \
      a1 = MADD(lo, xl, a1);                                                            \
      b1 = MADD(hi, xh, b1);                                                            \
      GRP8(w2 + c, lo, hi);                                                             \
      a2 = MADD(lo, xl, a2);                                                            \
      b2 = MADD(hi, xh, b2);                                                            \
      GRP8(w3 + c, lo, hi);                                                             \
      a3 = MADD(lo, xl, a3);                                                            \
      b3 = MADD(hi, xh, b3);                                                            \
    }                                                                                   \
    if (c + 4 <= n) {                                                                   \
      v128_t xv = wasm_v128_load(x + c);                                                \
      a0 = MADD(GRP4(w0 + c), xv, a0);                                                  \
      a1 = MADD(GRP4(w1 + c), xv, a1);                                                  \
      a2 = MADD(GRP4(w2 + c), xv, a2);                                                  \
      a3 = MADD(GRP4(w3 + c), xv, a3);                                                  \
      c += 4;                                                                           \
    }                                                                                   \
    if (c < n) {                                                                        \
      int m = n - c;                                                                    \
      v128_t xv = load_tail_f32(x + c, m);                                              \
      b0 = MADD(TAIL(w0 + c, m), xv, b0);                                               \
      b1 = MADD(TAIL(w1 + c, m), xv, b1);                                               \
      b2 = MADD(TAIL(w2 + c, m), xv, b2);                                               \
      b3 = MADD(TAIL(w3 + c, m), xv, b3);                                               \
    }                                                                                   \
    dst[0] = hsum_f32x4(wasm_f32x4_add(a0, b0));                                        \
    dst[ds] = hsum_f32x4(wasm_f32x4_add(a1, b1));                                       \
    dst[2 * ds] = hsum_f32x4(wasm_f32x4_add(a2, b2));                                   \
    dst[3 * ds] = hsum_f32x4(wasm_f32x4_add(a3, b3));                                   \
  }

DEFINE_ROW_DOTS(f32, float, GRP8_F32, GRP4_F32, load_tail_f32)
DEFINE_ROW_DOTS(bf16, uint16_t, GRP8_BF16, GRP4_BF16, load_tail_bf16)
DEFINE_ROW_DOTS(f16, uint16_t, GRP8_F16, GRP4_F16, load_tail_f16)

#endif
