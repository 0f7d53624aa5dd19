/*
 * MXFP4 (OCP MX) matrix-vector product. W: per row cols/2 bytes, 32-element blocks of 16 bytes,
 * element 2i in the low nibble of byte i, 2i+1 in the high; E2M1 codes. S: per row cols/32 E8M0
 * bytes, value = E2M1 * 2^(S - 127); S = 255 is NaN (the whole block, so the row's result is NaN).
 * x is the Q8 copy of the input (quant.h, quantize_act_q8), so cols must be a multiple of 32.
 */
#include "quant_exact.h"

/* Nibble -> 2 * E2M1 + 12: the doubled values -12..12 are integers, the offset makes them 0..24. */
#define MX_LUT wasm_i8x16_const(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0)
#define MX_OFFSET 12

/* The loop's vector constants, hidden behind runtime_zero_v128 so they stay in registers. */
typedef struct {
  v128_t zero, lut, nibble, neg_offset, e255, e_min;
} mx_consts;

static inline mx_consts mx_consts_make(const void *p) {
  v128_t z = runtime_zero_v128(p);
  return (mx_consts){
      .zero = z,
      .lut = wasm_v128_xor(MX_LUT, z),
      .nibble = wasm_v128_xor(wasm_i8x16_splat(0x0f), z),
      .neg_offset = wasm_v128_xor(wasm_i32x4_splat(-MX_OFFSET), z),
      .e255 = wasm_v128_xor(wasm_i16x8_splat(255), z),
      .e_min = wasm_v128_xor(wasm_i16x8_splat(0x0040), z),
  };
}

/*
 * 2^(e - 127) as f32 for the E8M0 exponents in u16 lanes 0..3, built as bf16 e << 7: e = 0 is
 * raised to 0x0040 (2^-127, subnormal) by the unsigned max, and e = 255 (0x7f80, infinity) gets
 * its lowest mantissa bit from subtracting the all-ones equality mask, which makes it NaN.
 */
static inline v128_t mx_scales_f32(v128_t e, mx_consts c) {
  v128_t b = wasm_i16x8_sub(wasm_i16x8_shl(e, 7), wasm_i16x8_eq(e, c.e255));
  b = wasm_u16x8_max(b, c.e_min);
  return wasm_i16x8_shuffle(c.zero, b, 0, 8, 1, 9, 2, 10, 3, 11);
}

/* One 32-block: i16 lanes of the dot of its offset doubled-E2M1 weights with the Q8 block. */
static inline __attribute__((always_inline)) v128_t mx_block(const uint8_t *w, v128_t xe,
                                                             v128_t xo, mx_consts c) {
  v128_t v = wasm_v128_load(w);
  v128_t lo = wasm_i8x16_relaxed_swizzle(c.lut, wasm_v128_and(v, c.nibble));
  v128_t hi = wasm_i8x16_relaxed_swizzle(c.lut, wasm_v128_and(wasm_u16x8_shr(v, 4), c.nibble));
  return wasm_i16x8_add(wasm_i16x8_relaxed_dot_i8x16_i7x16(xe, lo),
                        wasm_i16x8_relaxed_dot_i8x16_i7x16(xo, hi));
}

/*
 * Blocks b..b+m-1 (m = 1..4) of one row into its accumulator: the integer block dots, corrected
 * by bias (-offset * the x block sums), converted and scaled by weight scale * x scale.
 */
static inline __attribute__((always_inline)) v128_t mx_group(
    const uint8_t *w, const uint8_t *s, int b, int m, const v128_t *xv, v128_t xsv, v128_t bias,
    v128_t acc, mx_consts c) {
  const uint8_t *p = w + 16 * b;
  v128_t d0 = mx_block(p, xv[0], xv[1], c);
  v128_t d1 = m > 1 ? mx_block(p + 16, xv[2], xv[3], c) : c.zero;
  v128_t d2 = m > 2 ? mx_block(p + 32, xv[4], xv[5], c) : c.zero;
  v128_t d3 = m > 3 ? mx_block(p + 48, xv[6], xv[7], c) : c.zero;
  v128_t e = m == 4 ? wasm_u16x8_extend_low_u8x16(wasm_v128_load32_zero(s + b))
                    : wasm_u16x8_make(s[b], m > 1 ? s[b + 1] : 0, m > 2 ? s[b + 2] : 0, 0, 0, 0,
                                      0, 0);
  v128_t t = wasm_i32x4_add(hsum4_i16x8(d0, d1, d2, d3), bias);
  return wasm_f32x4_relaxed_madd(wasm_f32x4_convert_i32x4(t),
                                 wasm_f32x4_mul(mx_scales_f32(e, c), xsv), acc);
}


/*
 * Dots of four rows with the Q8 vector, lanes [row0..row3]. Blocks go four at a time into each
 * row's f32 accumulator (lane = block mod 4), the last 1..3 blocks the same way with absent
 * blocks as zero; rows never mix, so the one-row path passes the same row four times and gets
 * the same bits. The final 1/2 undoes the doubled E2M1 values.
 */
static inline v128_t q4_dot4_mx(const uint8_t *w0, const uint8_t *w1, const uint8_t *w2,
                                const uint8_t *w3, const uint8_t *s0, const uint8_t *s1,
                                const uint8_t *s2, const uint8_t *s3, const int8_t *xq, int cols) {
  int nb = cols / 32;
  const float *xs = Q8_SCALES(xq, cols);
  const int32_t *xsum = Q8_SUMS(xq, cols);
  mx_consts c = mx_consts_make(xq);
  v128_t acc0 = c.zero, acc1 = c.zero, acc2 = c.zero, acc3 = c.zero;
  int b = 0;
  for (; b + 4 <= nb; b += 4) Q4_GROUP_STEP(mx_group, 4);
  if (b < nb) Q4_GROUP_STEP(mx_group, nb - b);
  return wasm_f32x4_mul(wasm_f32x4_make(hsum_f32x4(acc0), hsum_f32x4(acc1), hsum_f32x4(acc2),
                                        hsum_f32x4(acc3)),
                        wasm_f32x4_splat(0.5f));
}

/*
 * y[r] = sum_c W[r, c] * x[c] for r in [r0, r1): W MXFP4 [rows, cols], scales S [rows, cols/32],
 * xq the Q8 copy of x (quantize_act_q8).
 */
DEFINE_Q4_MATVEC(matvec_mxfp4, mx, uint8_t)

/*
 * The exact variant (quant_exact.h): x stays f32 (no Q8 copy) and each weight is its exact f32
 * value, E2M1 times the block scale (at most 2 significant bits, so bf16 holds it too), each row's
 * dot formed as gemm_bf16 forms it. So a batch is dequant_mxfp4_bf16, then gemm_bf16 on the
 * decoded rows (gemm_mxfp4_exact), and every column equals this matvec bit for bit. gpt-oss is
 * defined by these values, and the Q8 path's error (~1e-2 relative in its logits) flips its
 * greedy tokens.
 *
 * The tables hold each code's bf16 plus MXS_BIAS (codes 0 and 8, the zeros, hold 0): a block with
 * scale byte e in [2, 252] then gets its exact weights as bf16 by one saturating subtract of
 * MXS_BIAS - (e - 127) * 128 per 8 weights, which moves the exponent field by e - 127 and leaves
 * the zeros at 0 (MXS_BIAS keeps every biased value below the sign bit and every shift in range).
 * Scale bytes 0, 1 (subnormal weights), 253, 254 (overflow to infinity) and 255 (NaN) take the
 * unscaled codes times the f32 scale instead, which gives the same values.
 */
#define MXS_BIAS 0x3f00
#define MXS_LO                                                                                \
  wasm_i8x16_const(0, 0, -128, -64, 0, 64, -128, -64, 0, 0, -128, -64, 0, 64, -128, -64)
#define MXS_HI                                                                                \
  wasm_i8x16_const(0, 0x7e, 0x7e, 0x7e, 0x7f, 0x7f, 0x7f, 0x7f, 0, -2, -2, -2, -1, -1, -1, -1)

/* Whether scale byte e takes the exponent shift (the block's weights stay normal and finite). */
static inline int mxs_fast(unsigned e) { return (uint8_t)(e - 2) <= 250; }

/* The u16 subtrahend that scales a table value by 2^(e - 127) (e = 127 for the unscaled code). */
static inline v128_t mxs_shift(unsigned e) {
  return wasm_i16x8_splat((int16_t)(MXS_BIAS + 127 * 128 - 128 * e));
}

/* 2^(e - 127) as f32: e = 255 is NaN, e = 0 the subnormal 2^-127. */
static inline float mxs_scale(unsigned e) {
  return f32_from_bits(e == 255 ? 0x7fc00000u : e ? e << 23 : 0x00400000u);
}

/* Four u16 vectors of table values minus the shift s (saturating at 0). */
static inline __attribute__((always_inline)) void mxs_apply(v128_t d[4], v128_t s) {
  for (int k = 0; k < 4; k++) d[k] = wasm_u16x8_sub_sat(d[k], s);
}

/* Rows w0, w1 (scales s0, s1) against f32 x: lanes [row0, row1, row0, row1]. */
static inline v128_t q4x_dot2_mxs(const uint8_t *w0, const uint8_t *w1, const uint8_t *s0,
                                  const uint8_t *s1, const float *x, int cols) {
  q4x_consts c = q4x_consts_make(x, MXS_LO, MXS_HI);
  v128_t acc[4] = {c.zero, c.zero, c.zero, c.zero};
  for (int b = 0; b < cols / 32; b++) {
    unsigned e0 = s0[b], e1 = s1[b];
    v128_t d0[4], d1[4];
    q4x_decode(w0 + 16 * (size_t)b, c, d0);
    q4x_decode(w1 + 16 * (size_t)b, c, d1);
    const float *xb = x + 32 * (size_t)b;
    if (mxs_fast(e0) && mxs_fast(e1)) {
      mxs_apply(d0, mxs_shift(e0));
      mxs_apply(d1, mxs_shift(e1));
      q4x_madd2(d0, d1, xb, 0, c.zero, c.zero, c.zero, acc);
    } else {
      mxs_apply(d0, mxs_shift(127));
      mxs_apply(d1, mxs_shift(127));
      q4x_madd2(d0, d1, xb, 1, wasm_f32x4_splat(mxs_scale(e0)), wasm_f32x4_splat(mxs_scale(e1)),
                c.zero, acc);
    }
  }
  return q4x_result2(acc);
}

/* y[r] = sum_c W[r, c] * x[c] for r in [r0, r1) with f32 x: MXFP4 weights, exact products. */
DEFINE_Q4_EXACT(matvec_mxfp4_exact, mxs, uint8_t)

/*
 * Rows [r0, r1) of W (MXFP4, scales S) written to out as bf16 [rows, cols], exactly (the values
 * the exact matvec multiplies), for gemm_bf16 to multiply a batch with.
 */
KEXPORT("dequant_mxfp4_bf16")
void dequant_mxfp4_bf16(const uint8_t *W, const uint8_t *S, uint16_t *out, int rows, int cols,
                        int r0, int r1) {
  if (r1 > rows) r1 = rows;
  q4x_consts c = q4x_consts_make(W, MXS_LO, MXS_HI);
  for (int r = r0 < 0 ? 0 : r0; r < r1; r++) {
    const uint8_t *w = W + (size_t)r * (cols / 2);
    const uint8_t *s = S + (size_t)r * (cols / 32);
    for (int b = 0; b < cols / 32; b++) {
      uint16_t *o = out + (size_t)r * cols + 32 * (size_t)b;
      unsigned e = s[b];
      v128_t d[4];
      q4x_decode(w + 16 * (size_t)b, c, d);
      mxs_apply(d, mxs_shift(mxs_fast(e) ? e : 127));
      for (int k = 0; k < 4; k++) {
        if (!mxs_fast(e)) {
          /* Exact values: the low 16 bits of each f32 are zero, its high half is the bf16. */
          v128_t sc = wasm_f32x4_splat(mxs_scale(e));
          v128_t lo = wasm_f32x4_mul(bf16_lo_f32x4(d[k]), sc);
          v128_t hi = wasm_f32x4_mul(bf16_hi_f32x4(d[k]), sc);
          d[k] = wasm_i16x8_shuffle(lo, hi, 1, 3, 5, 7, 9, 11, 13, 15);
        }
        wasm_v128_store(o + 8 * k, d[k]);
      }
    }
  }
}

/* A batch through MXFP4 W with f32 X, every column matvec_mxfp4_exact's bits (quant_exact.h). */
DEFINE_Q4_EXACT_GEMM(gemm_mxfp4_exact, uint8_t, uint16_t, dequant_mxfp4_bf16, gemm_bf16)
