/*
 * Shared definitions of the sluice kernels: the export macro, SIMD helpers and the half-precision
 * decoders. Everything here is static inline so each kernel file compiles on its own and nothing
 * needs the shadow stack (workers share one memory, and a shared __stack_pointer would collide).
 */
#ifndef SLUICE_SIMD_H
#define SLUICE_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <wasm_simd128.h>

/* Exported kernel: the JS-visible name is exactly `name`. */
#define KEXPORT(name) __attribute__((export_name(name), used))

#define F32_INF __builtin_inff()

/* Horizontal sum in a fixed order: (v0 + v2) + (v1 + v3). */
static inline float hsum_f32x4(v128_t v) {
  v128_t pair = wasm_f32x4_add(v, wasm_i32x4_shuffle(v, v, 2, 3, 0, 1));
  return wasm_f32x4_extract_lane(pair, 0) + wasm_f32x4_extract_lane(pair, 1);
}

/* Lane-wise maximum that propagates NaN, reduced in a fixed order. */
static inline float hmax_f32x4(v128_t v) {
  v128_t pair = wasm_f32x4_max(v, wasm_i32x4_shuffle(v, v, 2, 3, 0, 1));
  return __builtin_wasm_max_f32(wasm_f32x4_extract_lane(pair, 0),
                                wasm_f32x4_extract_lane(pair, 1));
}

/* The last m (1..3) floats at p as a vector, zero padded; never reads past p[m-1]. */
static inline v128_t load_tail_f32(const float *p, int m) {
  return wasm_f32x4_make(p[0], m > 1 ? p[1] : 0.0f, m > 2 ? p[2] : 0.0f, 0.0f);
}

/* bf16 -> f32 is a 16-bit left shift: interleave zero halves below the bf16 bits. */
static inline v128_t bf16_lo_f32x4(v128_t v) {
  return wasm_i16x8_shuffle(wasm_i64x2_const(0, 0), v, 0, 8, 1, 9, 2, 10, 3, 11);
}
static inline v128_t bf16_hi_f32x4(v128_t v) {
  return wasm_i16x8_shuffle(wasm_i64x2_const(0, 0), v, 4, 12, 5, 13, 6, 14, 7, 15);
}

/* The last m (1..3) bf16 values at p as f32 lanes, zero padded. */
static inline v128_t load_tail_bf16(const uint16_t *p, int m) {
  v128_t u = wasm_u32x4_make(p[0], m > 1 ? p[1] : 0u, m > 2 ? p[2] : 0u, 0u);
  return wasm_i32x4_shl(u, 16);
}

/*
 * IEEE half (in the low 16 bits of each u32 lane) -> f32. Exponent and mantissa move up 13 bits
 * and a multiply by 2^112 rebiases the exponent; this is exact for normals and subnormals alike.
 * Inf/NaN (half exponent 31) get the f32 exponent 255 instead, keeping the NaN payload.
 */
static inline v128_t f16_u32x4_to_f32x4(v128_t h) {
  v128_t sign = wasm_i32x4_shl(wasm_v128_and(h, wasm_i32x4_splat(0x8000)), 16);
  v128_t em = wasm_i32x4_shl(wasm_v128_and(h, wasm_i32x4_splat(0x7fff)), 13);
  v128_t scaled = wasm_f32x4_mul(em, wasm_i32x4_splat(0x77800000)); /* 2^112 */
  v128_t special = wasm_i32x4_ge(em, wasm_i32x4_splat(0x0f800000));
  v128_t infnan = wasm_v128_or(em, wasm_i32x4_splat(0x7f800000));
  return wasm_v128_or(wasm_v128_bitselect(infnan, scaled, special), sign);
}
static inline v128_t f16_lo_f32x4(v128_t v) {
  return f16_u32x4_to_f32x4(wasm_u32x4_extend_low_u16x8(v));
}
static inline v128_t f16_hi_f32x4(v128_t v) {
  return f16_u32x4_to_f32x4(wasm_u32x4_extend_high_u16x8(v));
}

/* The last m (1..3) halves at p as f32 lanes, zero padded. */
static inline v128_t load_tail_f16(const uint16_t *p, int m) {
  return f16_u32x4_to_f32x4(
      wasm_u32x4_make(p[0], m > 1 ? p[1] : 0u, m > 2 ? p[2] : 0u, 0u));
}

#endif
