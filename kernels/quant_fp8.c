/*
 * FP8 e4m3fn with 128x128 block scales (DeepSeek-V3 / Kimi-K2 weight_scale_inv) matrix-vector
 * product: w[r, c] = e4m3(W[r, c]) * S[r / 128, c / 128], S f32 [ceil(rows/128), ceil(cols/128)].
 * e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits, exponent 0 subnormal, 0x7F/0xFF NaN,
 * no infinities. Decoding puts sign | code << 20 into an f32 (exponent field = the e4m3 exponent)
 * and multiplies by 2^120 to rebias; that product is exact for normals and subnormals alike.
 */
#include "quant.h"

#define F32_2P120 0x7b800000

/* One e4m3fn code as f32; the scalar twin of the vector decoder below, bit for bit. */
static inline float fp8_to_f32(uint32_t b) {
  uint32_t bits = ((b & 0x80u) << 24) | ((b & 0x7fu) << 20);
  if ((b & 0x7fu) == 0x7fu) bits |= 0x7fc00000u;
  v128_t v = wasm_f32x4_mul(wasm_u32x4_splat(bits), wasm_i32x4_splat(F32_2P120));
  return wasm_f32x4_extract_lane(v, 0);
}

/* The loop's vector constants, hidden behind runtime_zero_v128 so they stay in registers. */
typedef struct {
  v128_t zero, rebias, sign_em, em, nan;
} fp8_consts;

static inline fp8_consts fp8_consts_make(const void *p) {
  v128_t z = runtime_zero_v128(p);
  return (fp8_consts){
      .zero = z,
      .rebias = wasm_v128_xor(wasm_i32x4_splat(F32_2P120), z),
      .sign_em = wasm_v128_xor(wasm_i16x8_splat((int16_t)0x87f0), z),
      .em = wasm_v128_xor(wasm_i16x8_splat(0x7f00), z),
      .nan = wasm_v128_xor(wasm_i16x8_splat(0x7fc0), z),
  };
}

/*
 * Eight codes, each in the high byte of an i16 lane, -> the top halves of their f32 values
 * before rebiasing: (lane >>s 4) & 0x87f0 keeps the sign and moves exponent|mantissa to bits
 * 10..4; NaN codes get an all-ones exponent.
 */
static inline __attribute__((always_inline)) v128_t fp8_hi16(v128_t lane, fp8_consts c) {
  v128_t h = wasm_v128_and(wasm_i16x8_shr(lane, 4), c.sign_em);
  v128_t nan = wasm_i16x8_eq(wasm_v128_and(lane, c.em), c.em);
  return wasm_v128_or(h, wasm_v128_and(nan, c.nan));
}

/* bf16 bits in the high halves of i32 lanes, zeros below: the f32 whose top half they are. */
#define FP8_LO(c, v) wasm_i16x8_shuffle((c).zero, (v), 0, 8, 1, 9, 2, 10, 3, 11)
#define FP8_HI(c, v) wasm_i16x8_shuffle((c).zero, (v), 4, 12, 5, 13, 6, 14, 7, 15)

/* Sixteen codes -> four f32 vectors (elements 0-3, 4-7, 8-11, 12-15). */
#define FP8_DECODE16(v, f0, f1, f2, f3, c)                                                \
  do {                                                                                    \
    v128_t l_ = fp8_hi16(wasm_i8x16_shuffle((c).zero, (v), 0, 16, 0, 17, 0, 18, 0, 19, 0, 20, 0, \
                                            21, 0, 22, 0, 23),                            \
                         (c));                                                            \
    v128_t h_ = fp8_hi16(wasm_i8x16_shuffle((c).zero, (v), 0, 24, 0, 25, 0, 26, 0, 27, 0, 28, 0, \
                                            29, 0, 30, 0, 31),                            \
                         (c));                                                            \
    (f0) = wasm_f32x4_mul(FP8_LO(c, l_), (c).rebias);                                     \
    (f1) = wasm_f32x4_mul(FP8_HI(c, l_), (c).rebias);                                     \
    (f2) = wasm_f32x4_mul(FP8_LO(c, h_), (c).rebias);                                     \
    (f3) = wasm_f32x4_mul(FP8_HI(c, h_), (c).rebias);                                     \
  } while (0)

/*
 * Dots of four rows with x as lanes [row0..row3]; si is row i's line of block scales. Per row and
 * 128-column block: 16 columns at a time into one vector, the block's last 1..15 columns one by
 * one into a scalar added to lane 0, then acc += block vector * scale. Rows never mix, so the
 * one-row path passes the same row four times and gets the same bits.
 */
static inline v128_t fp8_dot4(const uint8_t *w0, const uint8_t *w1, const uint8_t *w2,
                              const uint8_t *w3, const float *s0, const float *s1, const float *s2,
                              const float *s3, const float *x, int cols) {
  fp8_consts k = fp8_consts_make(x);
  v128_t z = k.zero;
  v128_t acc0 = z, acc1 = z, acc2 = z, acc3 = z;
  for (int c0 = 0, cb = 0; c0 < cols; c0 += 128, cb++) {
    int c1 = cols - c0 < 128 ? cols : c0 + 128;
    v128_t p0 = z, p1 = z, p2 = z, p3 = z;
    int c = c0;
    for (; c + 16 <= c1; c += 16) {
      v128_t x0 = wasm_v128_load(x + c), x1 = wasm_v128_load(x + c + 4);
      v128_t x2 = wasm_v128_load(x + c + 8), x3 = wasm_v128_load(x + c + 12);
      v128_t f0, f1, f2, f3;
#define ROW(w, p)                                                                         \
  FP8_DECODE16(wasm_v128_load((w) + c), f0, f1, f2, f3, k);                               \
  p = wasm_f32x4_relaxed_madd(f0, x0, p);                                                 \
  p = wasm_f32x4_relaxed_madd(f1, x1, p);                                                 \
  p = wasm_f32x4_relaxed_madd(f2, x2, p);                                                 \
  p = wasm_f32x4_relaxed_madd(f3, x3, p);
      ROW(w0, p0)
      ROW(w1, p1)
      ROW(w2, p2)
      ROW(w3, p3)
#undef ROW
    }
    if (c < c1) {
      float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;
      for (; c < c1; c++) {
        t0 += fp8_to_f32(w0[c]) * x[c];
        t1 += fp8_to_f32(w1[c]) * x[c];
        t2 += fp8_to_f32(w2[c]) * x[c];
        t3 += fp8_to_f32(w3[c]) * x[c];
      }
      p0 = wasm_f32x4_add(p0, wasm_f32x4_make(t0, 0.0f, 0.0f, 0.0f));
      p1 = wasm_f32x4_add(p1, wasm_f32x4_make(t1, 0.0f, 0.0f, 0.0f));
      p2 = wasm_f32x4_add(p2, wasm_f32x4_make(t2, 0.0f, 0.0f, 0.0f));
      p3 = wasm_f32x4_add(p3, wasm_f32x4_make(t3, 0.0f, 0.0f, 0.0f));
    }
    acc0 = wasm_f32x4_relaxed_madd(p0, wasm_f32x4_splat(s0[cb]), acc0);
    acc1 = wasm_f32x4_relaxed_madd(p1, wasm_f32x4_splat(s1[cb]), acc1);
    acc2 = wasm_f32x4_relaxed_madd(p2, wasm_f32x4_splat(s2[cb]), acc2);
    acc3 = wasm_f32x4_relaxed_madd(p3, wasm_f32x4_splat(s3[cb]), acc3);
  }
  return wasm_f32x4_make(hsum_f32x4(acc0), hsum_f32x4(acc1), hsum_f32x4(acc2), hsum_f32x4(acc3));
}

/*
 * y[r] = sum_c w[r, c] * x[c] for r in [r0, r1): W e4m3fn codes [rows, cols] (any cols), S the
 * f32 block scales [ceil(rows/128), ceil(cols/128)]. A step's four rows come from the four
 * quarters of the range (see DEFINE_Q4_MATVEC in quant.h).
 */
KEXPORT("matvec_fp8b128")
void matvec_fp8b128(const uint8_t *W, const float *S, const float *x, float *y, int rows, int cols,
                    int r0, int r1) {
  if (r1 > rows) r1 = rows;
  int r = r0 < 0 ? 0 : r0;
  if (r >= r1) return;
  int q = (r1 - r) / 4;
  size_t n = (size_t)cols, qn = (size_t)q * n, nsb = (size_t)(cols + 127) / 128;
#define SROW(i) (S + (size_t)((i) / 128) * nsb)
  for (int i = 0; i < q; i++) {
    int k = r + i;
    const uint8_t *w = W + (size_t)k * n;
    store_lanes_strided(y + k, (size_t)q,
                        fp8_dot4(w, w + qn, w + 2 * qn, w + 3 * qn, SROW(k), SROW(k + q),
                                 SROW(k + 2 * q), SROW(k + 3 * q), x, cols));
  }
  for (int k = r + 4 * q; k < r1; k++) {
    const uint8_t *w = W + (size_t)k * n;
    const float *s = SROW(k);
    y[k] = wasm_f32x4_extract_lane(fp8_dot4(w, w, w, w, s, s, s, s, x, cols), 0);
  }
#undef SROW
}
