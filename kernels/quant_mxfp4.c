/*
 * MXFP4 (OCP MX) matrix-vector product. W: per row cols/2 bytes, 32-element blocks of 16 bytes,
 * element 2i in the low nibble of byte i, 2i+1 in the high; E2M1 codes. S: per row cols/32 E8M0
 * bytes, value = E2M1 * 2^(S - 127); S = 255 is NaN (the whole block, so the row's result is NaN).
 * x is the Q8 copy of the input (quant.h, quantize_act_q8), so cols must be a multiple of 32.
 */
#include "quant.h"

/* Nibble -> 2 * E2M1 + 12: the doubled values -12..12 are integers, the offset makes them 0..24. */
#define MX_LUT wasm_i8x16_const(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0)

/* 2^(e - 127) for E8M0 exponents e in i32 lanes; e = 0 gives 2^-127 (subnormal), 255 gives NaN. */
static inline v128_t e8m0_to_f32(v128_t e) {
  v128_t special = wasm_v128_or(wasm_i32x4_eq(e, wasm_i32x4_splat(0)),
                                wasm_i32x4_eq(e, wasm_i32x4_splat(255)));
  return wasm_v128_or(wasm_i32x4_shl(e, 23), wasm_v128_and(special, wasm_i32x4_splat(0x00400000)));
}

static inline v128_t mx_block(const uint8_t *w, v128_t xe, v128_t xo) {
  v128_t lo, hi, lut = MX_LUT;
  SPLIT_NIBBLES(wasm_v128_load(w), lo, hi);
  return dot_block_q8(wasm_i8x16_relaxed_swizzle(lut, lo), wasm_i8x16_relaxed_swizzle(lut, hi), xe,
                      xo);
}

#define MX_SCALE4(s, b)                                                                   \
  e8m0_to_f32(wasm_u32x4_extend_low_u16x8(                                                \
      wasm_u16x8_extend_low_u8x16(wasm_v128_load32_zero((s) + (b)))))
#define MX_SCALE_TAIL(s, b, m)                                                            \
  e8m0_to_f32(wasm_u32x4_make((s)[b], (m) > 1 ? (s)[(b) + 1] : 0u, (m) > 2 ? (s)[(b) + 2] : 0u, 0u))

/* The factor 1/2 undoes the doubled E2M1 values. */
DEFINE_Q4_DOT4(mx, uint8_t, mx_block, MX_SCALE4, MX_SCALE_TAIL, 12, 0.5f)

/*
 * y[r] = sum_c W[r, c] * x[c] for r in [r0, r1): W MXFP4 [rows, cols], scales S [rows, cols/32],
 * xq the Q8 copy of x (quantize_act_q8).
 */
DEFINE_Q4_MATVEC(matvec_mxfp4, mx, uint8_t)
