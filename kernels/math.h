/*
 * exp for f32 lanes without libm. Range reduction x = n*ln2 + r with |r| <= ln2/2 (Cody-Waite,
 * ln2 split in two so n*LN2_HI is exact), e^r by its degree-7 Taylor polynomial (truncation error
 * about 5e-9 relative), then a scale by 2^n done as two exact power-of-two factors so results that
 * are subnormal, overflow to +Inf, or underflow to 0 all come out right. NaN propagates.
 * Measured against a double-precision exp over 4M points in [-104, 89]: at most 1 ulp (the test
 * allows 2).
 */
#ifndef SLUICE_MATH_H
#define SLUICE_MATH_H

#include "simd.h"

static inline v128_t exp_f32x4(v128_t x) {
  /* Beyond these bounds the result is already +Inf or 0; clamping keeps n within 8 bits. */
  x = wasm_f32x4_min(wasm_f32x4_max(x, wasm_f32x4_splat(-104.0f)), wasm_f32x4_splat(89.0f));
  v128_t n = wasm_f32x4_nearest(wasm_f32x4_mul(x, wasm_f32x4_splat(1.44269504088896341f)));
  v128_t r = wasm_f32x4_sub(x, wasm_f32x4_mul(n, wasm_f32x4_splat(0.693145751953125f)));
  r = wasm_f32x4_sub(r, wasm_f32x4_mul(n, wasm_f32x4_splat(1.428606765330187e-06f)));
  v128_t p = wasm_f32x4_splat(1.0f / 5040.0f);
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(1.0f / 720.0f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(1.0f / 120.0f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(1.0f / 24.0f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(1.0f / 6.0f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(0.5f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(1.0f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(1.0f));
  /* n in [-150, 128]: halves n1, n2 in [-75, 64] are both normal exponents. */
  v128_t ni = wasm_i32x4_trunc_sat_f32x4(n);
  v128_t n1 = wasm_i32x4_shr(ni, 1);
  v128_t n2 = wasm_i32x4_sub(ni, n1);
  v128_t s1 = wasm_i32x4_shl(wasm_i32x4_add(n1, wasm_i32x4_splat(127)), 23);
  v128_t s2 = wasm_i32x4_shl(wasm_i32x4_add(n2, wasm_i32x4_splat(127)), 23);
  return wasm_f32x4_mul(wasm_f32x4_mul(p, s1), s2);
}

/* Scalar exp: lane 0 of the vector version, so scalar tails match vector bodies bit for bit. */
static inline float exp_f32(float x) {
  return wasm_f32x4_extract_lane(exp_f32x4(wasm_f32x4_splat(x)), 0);
}

/* silu(g) = g * sigmoid(g), written as g / (1 + e^-g): large negative g gives -0, not NaN. */
static inline v128_t silu_f32x4(v128_t g) {
  v128_t e = exp_f32x4(wasm_f32x4_neg(g));
  return wasm_f32x4_div(g, wasm_f32x4_add(wasm_f32x4_splat(1.0f), e));
}

static inline v128_t sigmoid_f32x4(v128_t x) {
  v128_t e = exp_f32x4(wasm_f32x4_neg(x));
  return wasm_f32x4_div(wasm_f32x4_splat(1.0f), wasm_f32x4_add(wasm_f32x4_splat(1.0f), e));
}

/*
 * tanh without libm. Below |x| = 0.25 its odd Taylor series to x^9 (truncation below 1e-8
 * relative); above, 1 − 2 / (e^{2|x|} + 1), which loses at most two bits to cancellation there
 * and saturates to exactly ±1 once e^{2|x|} overflows. NaN propagates.
 */
static inline v128_t tanh_f32x4(v128_t x) {
  v128_t a = wasm_f32x4_abs(x);
  v128_t x2 = wasm_f32x4_mul(x, x);
  v128_t p = wasm_f32x4_splat(62.0f / 2835.0f);
  p = wasm_f32x4_add(wasm_f32x4_mul(p, x2), wasm_f32x4_splat(-17.0f / 315.0f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, x2), wasm_f32x4_splat(2.0f / 15.0f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, x2), wasm_f32x4_splat(-1.0f / 3.0f));
  v128_t small = wasm_f32x4_add(x, wasm_f32x4_mul(wasm_f32x4_mul(p, x2), x));
  v128_t e = exp_f32x4(wasm_f32x4_add(a, a));
  v128_t big = wasm_f32x4_sub(
      wasm_f32x4_splat(1.0f),
      wasm_f32x4_div(wasm_f32x4_splat(2.0f), wasm_f32x4_add(e, wasm_f32x4_splat(1.0f))));
  /* The sign of x on the large branch (copysign). */
  v128_t sign = wasm_v128_and(x, wasm_i32x4_splat((int)0x80000000));
  big = wasm_v128_or(big, sign);
  return wasm_v128_bitselect(small, big, wasm_f32x4_lt(a, wasm_f32x4_splat(0.25f)));
}

/* Lane 0: scalar tails run the vector code on a splat so they match vector bodies bit for bit. */
static inline float lane0(v128_t v) { return wasm_f32x4_extract_lane(v, 0); }

#endif
