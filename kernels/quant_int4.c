/*
 * INT4 group-32 symmetric matrix-vector product, compressed-tensors "pack-quantized" as
 * Kimi-K2-Thinking ships it: weight_packed int32 [rows, cols/8], element 8k+i of a row in bits
 * 4i..4i+3 of word k, stored as q + 8 for q in -8..7 (so, little-endian, byte j holds element 2j
 * in its low nibble and 2j+1 in its high); weight_scale bf16 [rows, cols/32]; w = q * scale.
 * x is the Q8 copy of the input (quant.h), so cols must be a multiple of 32. The stored nibble
 * q + 8 (0..15) goes into the dot as is and 8 * the x block sum comes off afterwards.
 */
#include "quant_exact.h"

#define INT4_OFFSET 8

/* The loop's vector constants, hidden behind runtime_zero_v128 so they stay in registers. */
typedef struct {
  v128_t zero, nibble, neg_offset;
} int4_consts;

static inline int4_consts int4_consts_make(const void *p) {
  v128_t z = runtime_zero_v128(p);
  return (int4_consts){
      .zero = z,
      .nibble = wasm_v128_xor(wasm_i8x16_splat(0x0f), z),
      .neg_offset = wasm_v128_xor(wasm_i32x4_splat(-INT4_OFFSET), z),
  };
}

/*
 * One 32-block: i16 lanes of the dot of its stored nibbles with the Q8 block. A lane sums four
 * products of at most 127 * 15, so the pairwise 16-bit adds of hsum4_i16x8 stay in range.
 */
static inline __attribute__((always_inline)) v128_t int4_block(const uint8_t *w, v128_t xe,
                                                               v128_t xo, int4_consts c) {
  v128_t v = wasm_v128_load(w);
  v128_t lo = wasm_v128_and(v, c.nibble);
  v128_t hi = wasm_v128_and(wasm_u16x8_shr(v, 4), c.nibble);
  return wasm_i16x8_add(wasm_i16x8_relaxed_dot_i8x16_i7x16(xe, lo),
                        wasm_i16x8_relaxed_dot_i8x16_i7x16(xo, hi));
}

/*
 * Blocks b..b+m-1 (m = 1..4) of one row into its accumulator: the integer block dots, corrected
 * by bias (-offset * the x block sums), converted and scaled by weight scale * x scale.
 */
static inline __attribute__((always_inline)) v128_t int4_group(
    const uint8_t *w, const uint16_t *s, int b, int m, const v128_t *xv, v128_t xsv, v128_t bias,
    v128_t acc, int4_consts c) {
  const uint8_t *p = w + 16 * b;
  v128_t d0 = int4_block(p, xv[0], xv[1], c);
  v128_t d1 = m > 1 ? int4_block(p + 16, xv[2], xv[3], c) : c.zero;
  v128_t d2 = m > 2 ? int4_block(p + 32, xv[4], xv[5], c) : c.zero;
  v128_t d3 = m > 3 ? int4_block(p + 48, xv[6], xv[7], c) : c.zero;
  /* bf16 -> f32: the scale bits go to the upper half of each lane, zeros below. */
  v128_t ws = m == 4 ? wasm_i16x8_shuffle(c.zero, wasm_v128_load64_zero(s + b), 0, 8, 1, 9, 2,
                                          10, 3, 11)
                     : load_tail_bf16(s + b, m);
  v128_t t = wasm_i32x4_add(hsum4_i16x8(d0, d1, d2, d3), bias);
  return wasm_f32x4_relaxed_madd(wasm_f32x4_convert_i32x4(t), wasm_f32x4_mul(ws, xsv), acc);
}


/*
 * Dots of four rows with the Q8 vector, lanes [row0..row3]. Blocks go four at a time into each
 * row's f32 accumulator (lane = block mod 4), the last 1..3 blocks the same way with absent
 * blocks as zero; rows never mix, so the one-row path passes the same row four times and gets
 * the same bits.
 */
static inline v128_t q4_dot4_int4(const uint8_t *w0, const uint8_t *w1, const uint8_t *w2,
                                  const uint8_t *w3, const uint16_t *s0, const uint16_t *s1,
                                  const uint16_t *s2, const uint16_t *s3, const int8_t *xq,
                                  int cols) {
  int nb = cols / 32;
  const float *xs = Q8_SCALES(xq, cols);
  const int32_t *xsum = Q8_SUMS(xq, cols);
  int4_consts c = int4_consts_make(xq);
  v128_t acc0 = c.zero, acc1 = c.zero, acc2 = c.zero, acc3 = c.zero;
  int b = 0;
  for (; b + 4 <= nb; b += 4) Q4_GROUP_STEP(int4_group, 4);
  if (b < nb) Q4_GROUP_STEP(int4_group, nb - b);
  return wasm_f32x4_make(hsum_f32x4(acc0), hsum_f32x4(acc1), hsum_f32x4(acc2), hsum_f32x4(acc3));
}

/*
 * y[r] = sum_c W[r, c] * x[c] for r in [r0, r1): W the packed int4 bytes [rows, cols/2], S the bf16
 * group scales [rows, cols/32], xq the Q8 copy of x (quantize_act_q8).
 */
DEFINE_Q4_MATVEC(matvec_int4g32, int4, uint16_t)

/*
 * The exact variant (quant_exact.h) for Kimi-K2's shipped INT4 experts: x stays f32, each weight
 * is q times its group's bf16 scale (exact in f32), each row's dot formed as gemm_f32 forms it, so
 * a batch is dequant_int4g32_f32, then gemm_f32 (gemm_int4g32_exact), with every column this
 * matvec's bits. The Q8 copy of x costs 5.9e-3 relative in the logits of tests/int4_checkpoint.ts.
 */
/* Stored nibble (q + 8) -> the low and the high byte of q as bf16. */
#define INT4X_LO                                                                               \
  wasm_i8x16_const(0, -32, -64, -96, -128, 64, 0, -128, 0, -128, 0, 64, -128, -96, -64, -32)
#define INT4X_HI                                                                               \
  wasm_i8x16_const(-63, -64, -64, -64, -64, -64, -64, -65, 0, 0x3f, 0x40, 0x40, 0x40, 0x40, 0x40, \
                   0x40)

/* bf16 scale -> f32. */
static inline float int4x_scale(uint16_t s) { return f32_from_bits((uint32_t)s << 16); }

/* Rows w0, w1 (bf16 scales s0, s1) against f32 x: lanes [row0, row1, row0, row1]. */
static inline v128_t q4x_dot2_int4x(const uint8_t *w0, const uint8_t *w1, const uint16_t *s0,
                                    const uint16_t *s1, const float *x, int cols) {
  q4x_consts c = q4x_consts_make(x, INT4X_LO, INT4X_HI);
  v128_t acc[4] = {c.zero, c.zero, c.zero, c.zero};
  for (int b = 0; b < cols / 32; b++) {
    v128_t d0[4], d1[4];
    q4x_decode(w0 + 16 * (size_t)b, c, d0);
    q4x_decode(w1 + 16 * (size_t)b, c, d1);
    q4x_madd2(d0, d1, x + 32 * (size_t)b, 1, wasm_f32x4_splat(int4x_scale(s0[b])),
              wasm_f32x4_splat(int4x_scale(s1[b])), c.zero, acc);
  }
  return q4x_result2(acc);
}

/* y[r] = sum_c W[r, c] * x[c] for r in [r0, r1) with f32 x: INT4 g32 weights, exact products. */
DEFINE_Q4_EXACT(matvec_int4g32_exact, int4x, uint16_t)

/*
 * Rows [r0, r1) of W (INT4 g32, bf16 scales S) written to out as f32 [rows, cols], exactly (the
 * values the exact matvec multiplies), for gemm_f32 to multiply a batch with.
 */
KEXPORT("dequant_int4g32_f32")
void dequant_int4g32_f32(const uint8_t *W, const uint16_t *S, float *out, int rows, int cols,
                         int r0, int r1) {
  if (r1 > rows) r1 = rows;
  q4x_consts c = q4x_consts_make(W, INT4X_LO, INT4X_HI);
  for (int r = r0 < 0 ? 0 : r0; r < r1; r++) {
    const uint8_t *w = W + (size_t)r * (cols / 2);
    const uint16_t *s = S + (size_t)r * (cols / 32);
    for (int b = 0; b < cols / 32; b++) {
      float *o = out + (size_t)r * cols + 32 * (size_t)b;
      v128_t sc = wasm_f32x4_splat(int4x_scale(s[b])), d[4];
      q4x_decode(w + 16 * (size_t)b, c, d);
      for (int k = 0; k < 4; k++) {
        wasm_v128_store(o + 8 * k, wasm_f32x4_mul(bf16_lo_f32x4(d[k]), sc));
        wasm_v128_store(o + 8 * k + 4, wasm_f32x4_mul(bf16_hi_f32x4(d[k]), sc));
      }
    }
  }
}

/* A batch through INT4 g32 W with f32 X, every column matvec_int4g32_exact's bits (quant_exact.h). */
DEFINE_Q4_EXACT_GEMM(gemm_int4g32_exact, uint16_t, float, dequant_int4g32_f32, gemm_f32)
