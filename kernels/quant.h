/*
 * Helpers shared by the compact-weight kernels (quant_*.c).
 *
 * Q8 activations: the 4-bit kernels (MXFP4, INT4) multiply int8 weights by an int8 copy of x with
 * i32x4.relaxed_dot_i8x16_i7x16_add. quantize_act_q8 (quant_int8.c) writes that copy once per
 * input vector, so every row, expert and worker that reads the same x reuses it. Layout for
 * cols = 32 * nb (cols + 8 * nb bytes):
 *   bytes [0, cols): per 32-block, 16 bytes x[2i] (i = 0..15) then 16 bytes x[2i+1], int8;
 *     even/odd split because a packed byte holds element 2i in its low nibble, 2i+1 in its high;
 *   f32 [nb] at byte cols: the block scale, x ~= q * scale (scale = max|block| / 127);
 *   i32 [nb] at byte cols + 4 * nb: the sum of the block's 32 int8 values.
 * The dot's second operand must be 0..127 for a deterministic result (x86 pmaddubsw reads it as
 * unsigned), so weights go in with an offset (MXFP4 2*E2M1 + 12, INT4 stored nibble q + 8) and the
 * kernels subtract offset * block sum afterwards.
 */
#ifndef SLUICE_QUANT_H
#define SLUICE_QUANT_H

#include "simd.h"

#define Q8_SCALES(xq, cols) ((const float *)((const uint8_t *)(xq) + (cols)))
#define Q8_SUMS(xq, cols) ((const int32_t *)((const uint8_t *)(xq) + (cols) + (cols) / 8))

/* The four lane sums of a, b, c, d as one vector [sum a, sum b, sum c, sum d]. */
static inline v128_t hsum4_i32x4(v128_t a, v128_t b, v128_t c, v128_t d) {
  /* ab = [a0 + a2, b0 + b2, a1 + a3, b1 + b3], cd likewise; then pair them up. */
  v128_t ab = wasm_i32x4_add(wasm_i32x4_shuffle(a, b, 0, 4, 1, 5),
                             wasm_i32x4_shuffle(a, b, 2, 6, 3, 7));
  v128_t cd = wasm_i32x4_add(wasm_i32x4_shuffle(c, d, 0, 4, 1, 5),
                             wasm_i32x4_shuffle(c, d, 2, 6, 3, 7));
  return wasm_i32x4_add(wasm_i32x4_shuffle(ab, cd, 0, 1, 4, 5),
                        wasm_i32x4_shuffle(ab, cd, 2, 3, 6, 7));
}

/*
 * A zero that neither clang nor wasm-opt can prove: the top bit of a wasm64 address (memory64
 * is capped far below 2^63). V8 materialises every v128.const again at each use inside a loop,
 * so a kernel that xors its loop constants with this zero before the loop keeps them in
 * registers instead (matvec_mxfp4: 9.0 -> 18.5 G weights/s on one thread).
 */
static inline v128_t runtime_zero_v128(const void *p) {
  return wasm_i32x4_splat((int32_t)((uintptr_t)p >> 63));
}

/*
 * The four lane sums of i16x8 a, b, c, d as i32 [sum a, sum b, sum c, sum d]. Pairs of lanes are
 * added in 16 bits first, so every lane must stay within +-16383 (two relaxed dots of Q8 x with
 * weights 0..24 reach at most 12192).
 */
static inline v128_t hsum4_i16x8(v128_t a, v128_t b, v128_t c, v128_t d) {
  v128_t ab = wasm_i16x8_add(wasm_i32x4_shuffle(a, b, 0, 4, 1, 5),
                             wasm_i32x4_shuffle(a, b, 2, 6, 3, 7));
  v128_t cd = wasm_i16x8_add(wasm_i32x4_shuffle(c, d, 0, 4, 1, 5),
                             wasm_i32x4_shuffle(c, d, 2, 6, 3, 7));
  v128_t ab32 = wasm_i32x4_extadd_pairwise_i16x8(ab), cd32 = wasm_i32x4_extadd_pairwise_i16x8(cd);
  return wasm_i32x4_add(wasm_i64x2_shuffle(ab32, cd32, 0, 2), wasm_i64x2_shuffle(ab32, cd32, 1, 3));
}

/* Low nibbles (elements 2i) and high nibbles (elements 2i+1) of 16 packed bytes, as 0..15. */
#define SPLIT_NIBBLES(v, lo, hi)                                                          \
  do {                                                                                    \
    v128_t m_ = wasm_i8x16_splat(0x0f);                                                   \
    (lo) = wasm_v128_and((v), m_);                                                        \
    (hi) = wasm_v128_and(wasm_u16x8_shr((v), 4), m_);                                     \
  } while (0)

/* One 32-block: dot of 32 offset weights (lo = even elements, hi = odd) with the Q8 block. */
static inline v128_t dot_block_q8(v128_t lo, v128_t hi, v128_t xe, v128_t xo) {
  v128_t d = wasm_i16x8_add(wasm_i16x8_relaxed_dot_i8x16_i7x16(xe, lo),
                            wasm_i16x8_relaxed_dot_i8x16_i7x16(xo, hi));
  return wasm_i32x4_extadd_pairwise_i16x8(d);
}

/* Loads n (1..3) consecutive i32 (or f32 bits) as lanes, zero padded, never past p[n-1]. */
static inline v128_t load_tail_i32(const int32_t *p, int n) {
  return wasm_i32x4_make(p[0], n > 1 ? p[1] : 0, n > 2 ? p[2] : 0, 0);
}

/* Blocks b..b+M-1 (M = 1..4) of the four rows in q4_dot4_SUF: x loaded once for all rows. */
#define Q4_GROUP(SUF, OFFSET, M)                                                          \
  do {                                                                                    \
    int m_ = (M);                                                                         \
    const int8_t *xb = xq + 32 * b;                                                       \
    v128_t z_ = wasm_i32x4_splat(0);                                                      \
    v128_t xe0 = wasm_v128_load(xb), xo0 = wasm_v128_load(xb + 16);                       \
    v128_t xe1 = m_ > 1 ? wasm_v128_load(xb + 32) : z_;                                   \
    v128_t xo1 = m_ > 1 ? wasm_v128_load(xb + 48) : z_;                                   \
    v128_t xe2 = m_ > 2 ? wasm_v128_load(xb + 64) : z_;                                   \
    v128_t xo2 = m_ > 2 ? wasm_v128_load(xb + 80) : z_;                                   \
    v128_t xe3 = m_ > 3 ? wasm_v128_load(xb + 96) : z_;                                   \
    v128_t xo3 = m_ > 3 ? wasm_v128_load(xb + 112) : z_;                                  \
    v128_t xsv = m_ == 4 ? wasm_v128_load(xs + b)                                         \
                         : load_tail_i32((const int32_t *)(xs + b), m_);                  \
    v128_t bias = wasm_i32x4_mul(m_ == 4 ? wasm_v128_load(xsum + b) : load_tail_i32(xsum + b, m_), \
                                 wasm_i32x4_splat(-(OFFSET)));                            \
    acc0 = q4_group_##SUF(w0, s0, b, m_, xe0, xo0, xe1, xo1, xe2, xo2, xe3, xo3, xsv, bias, acc0); \
    acc1 = q4_group_##SUF(w1, s1, b, m_, xe0, xo0, xe1, xo1, xe2, xo2, xe3, xo3, xsv, bias, acc1); \
    acc2 = q4_group_##SUF(w2, s2, b, m_, xe0, xo0, xe1, xo1, xe2, xo2, xe3, xo3, xsv, bias, acc2); \
    acc3 = q4_group_##SUF(w3, s3, b, m_, xe0, xo0, xe1, xo1, xe2, xo2, xe3, xo3, xsv, bias, acc3); \
  } while (0)

/*
 * Row dots of a 4-bit format against a Q8 vector (cols a multiple of 32), four rows at a time.
 * Blocks go four at a time: each row's four integer block dots (BLOCK(p, xe, xo), weights offset
 * by OFFSET) become one vector, are corrected by -OFFSET * the x block sums, converted, and
 * scaled by (weight scale * x scale) into that row's f32 accumulator; the last 1..3 blocks take
 * the same path with absent blocks as zero. SCALE4(s, b) / SCALE_TAIL(s, b, m) give a row's
 * weight scales of blocks b.. as f32 lanes. Rows never mix, so the one-row path passes the same
 * row four times and gets the same bits. Result: lanes [row0..row3] times FINAL.
 */
#define DEFINE_Q4_DOT4(SUF, ST, BLOCK, SCALE4, SCALE_TAIL, OFFSET, FINAL)                  \
  static inline v128_t q4_group_##SUF(const uint8_t *w, const ST *s, int b, int m, v128_t xe0, \
                                      v128_t xo0, v128_t xe1, v128_t xo1, v128_t xe2,     \
                                      v128_t xo2, v128_t xe3, v128_t xo3, v128_t xsv,     \
                                      v128_t bias, v128_t acc) {                          \
    const uint8_t *p = w + 16 * b;                                                        \
    v128_t z = wasm_i32x4_splat(0);                                                       \
    v128_t d0 = BLOCK(p, xe0, xo0);                                                       \
    v128_t d1 = m > 1 ? BLOCK(p + 16, xe1, xo1) : z;                                      \
    v128_t d2 = m > 2 ? BLOCK(p + 32, xe2, xo2) : z;                                      \
    v128_t d3 = m > 3 ? BLOCK(p + 48, xe3, xo3) : z;                                      \
    v128_t ws = m == 4 ? SCALE4(s, b) : SCALE_TAIL(s, b, m);                              \
    v128_t t = wasm_i32x4_add(hsum4_i32x4(d0, d1, d2, d3), bias);                         \
    return wasm_f32x4_relaxed_madd(wasm_f32x4_convert_i32x4(t), wasm_f32x4_mul(ws, xsv), acc); \
  }                                                                                       \
  static inline v128_t q4_dot4_##SUF(const uint8_t *w0, const uint8_t *w1, const uint8_t *w2, \
                                     const uint8_t *w3, const ST *s0, const ST *s1,       \
                                     const ST *s2, const ST *s3, const int8_t *xq, int cols) { \
    int nb = cols / 32;                                                                   \
    const float *xs = Q8_SCALES(xq, cols);                                                \
    const int32_t *xsum = Q8_SUMS(xq, cols);                                              \
    v128_t acc0 = wasm_f32x4_splat(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0;          \
    int b = 0;                                                                            \
    for (; b + 4 <= nb; b += 4) Q4_GROUP(SUF, OFFSET, 4);                                 \
    if (b < nb) Q4_GROUP(SUF, OFFSET, nb - b);                                            \
    return wasm_f32x4_mul(wasm_f32x4_make(hsum_f32x4(acc0), hsum_f32x4(acc1), hsum_f32x4(acc2), \
                                          hsum_f32x4(acc3)),                              \
                          wasm_f32x4_splat(FINAL));                                       \
  }

/* Lanes 0..3 of v to y[0], y[ds], y[2*ds], y[3*ds]: the results of one step's four rows. */
static inline void store_lanes_strided(float *y, size_t ds, v128_t v) {
  y[0] = wasm_f32x4_extract_lane(v, 0);
  y[ds] = wasm_f32x4_extract_lane(v, 1);
  y[2 * ds] = wasm_f32x4_extract_lane(v, 2);
  y[3 * ds] = wasm_f32x4_extract_lane(v, 3);
}

/*
 * matvec NAME(W, S, xq, y, rows, cols, r0, r1) over a DEFINE_Q4_DOT4 format; per row cols/2
 * weight bytes and cols/32 scales of type ST. A step's four rows come from the four quarters of
 * [r0, r1) (rows r+i, r+q+i, r+2q+i, r+3q+i), the last (r1-r0)%4 rows go one at a time: as in
 * gemv.c, neighbouring short rows would share 4 KiB pages and defeat the hardware prefetcher.
 */
#define DEFINE_Q4_MATVEC(NAME, SUF, ST)                                                   \
  KEXPORT(#NAME)                                                                          \
  void NAME(const uint8_t *W, const ST *S, const int8_t *xq, float *y, int rows, int cols, \
            int r0, int r1) {                                                             \
    if (r1 > rows) r1 = rows;                                                             \
    int r = r0 < 0 ? 0 : r0;                                                              \
    if (r >= r1) return;                                                                  \
    int q = (r1 - r) / 4;                                                                 \
    size_t wb = (size_t)cols / 2, sb = (size_t)cols / 32;                                 \
    size_t qw = (size_t)q * wb, qs = (size_t)q * sb;                                      \
    for (int i = 0; i < q; i++) {                                                         \
      const uint8_t *w = W + (size_t)(r + i) * wb;                                        \
      const ST *s = S + (size_t)(r + i) * sb;                                             \
      store_lanes_strided(y + r + i, (size_t)q,                                           \
                          q4_dot4_##SUF(w, w + qw, w + 2 * qw, w + 3 * qw, s, s + qs,     \
                                        s + 2 * qs, s + 3 * qs, xq, cols));               \
    }                                                                                     \
    for (int k = r + 4 * q; k < r1; k++) {                                                \
      const uint8_t *w = W + (size_t)k * wb;                                              \
      const ST *s = S + (size_t)k * sb;                                                   \
      y[k] = wasm_f32x4_extract_lane(q4_dot4_##SUF(w, w, w, w, s, s, s, s, xq, cols), 0); \
    }                                                                                     \
  }

#endif
