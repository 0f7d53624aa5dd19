/*
 * FP8 e4m3fn with 128x128 block scales (DeepSeek-V3 / Kimi-K2 weight_scale_inv) matrix-vector
 * and matrix-batch products: w[r, c] = e4m3(W[r, c]) * S[r / 128, c / 128], S f32
 * [ceil(rows/128), ceil(cols/128)]. e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits,
 * exponent 0 subnormal, 0x7F/0xFF NaN, no infinities.
 *
 * Decoding puts sign | code << 20 into an f32 (exponent field = the e4m3 exponent, so subnormal
 * codes are f32 subnormals): that f32 is the code's value times 2^-120, exactly. The factor 2^120
 * goes on x instead of on every weight when every |x| < 2^8 (x * 2^120 then stays finite and
 * exact), else on the weights; w * (x * 2^120) and (w * 2^120) * x are the same real number, so
 * either way each product, and every sum below, has the same bits.
 *
 * Order, per row: per 128-column block, 16 columns at a time into one vector p (four relaxed
 * madds, columns c..c+3 first), the block's last 1..15 columns one by one into a scalar added to
 * lane 0, then acc += p * scale (relaxed madd); the result is hsum(acc). Rows and batch columns
 * never mix, so a row's bits do not depend on the row range, the grouping or the batch.
 * A NaN code is not decoded as NaN in the vector loops: a row holding one gets the quiet NaN
 * 0x7fc00000 as its result, in both kernels (rare: the loops only flag it).
 */
#include "quant.h"

/* Widest column group of gemm_fp8b128. */
#define FP8_GN_MAX 16

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
  v128_t zero, rebias, sign_em, top;
} fp8_consts;

static inline fp8_consts fp8_consts_make(const void *p) {
  v128_t z = runtime_zero_v128(p);
  return (fp8_consts){
      .zero = z,
      .rebias = wasm_v128_xor(wasm_i32x4_splat(F32_2P120), z),
      .sign_em = wasm_v128_xor(wasm_i16x8_splat((int16_t)0x87f0), z),
      .top = wasm_v128_xor(wasm_i8x16_splat((int8_t)0x80), z),
  };
}

/*
 * Eight codes (bytes 0-7 of v when H is 0, 8-15 when 1) -> two f32 vectors of their values times
 * 2^-120: each code to the high byte of an i16 lane, >>s 4 & 0x87f0 keeps the sign and moves
 * exponent|mantissa to bits 10..4, then zero low halves make f32 lanes. Both shuffles are plain
 * interleaves with the zero vector, which V8 emits as one unpack instruction each.
 */
#define FP8_HALF(c, v, H, f0, f1)                                                             \
  do {                                                                                        \
    v128_t b_ = wasm_i8x16_shuffle((c).zero, (v), 8 * H, 8 * H + 16, 8 * H + 1, 8 * H + 17,  \
                                   8 * H + 2, 8 * H + 18, 8 * H + 3, 8 * H + 19, 8 * H + 4,  \
                                   8 * H + 20, 8 * H + 5, 8 * H + 21, 8 * H + 6, 8 * H + 22, \
                                   8 * H + 7, 8 * H + 23);                                    \
    v128_t h_ = wasm_v128_and(wasm_i16x8_shr(b_, 4), (c).sign_em);                            \
    (f0) = wasm_i16x8_shuffle((c).zero, h_, 0, 8, 1, 9, 2, 10, 3, 11);                        \
    (f1) = wasm_i16x8_shuffle((c).zero, h_, 4, 12, 5, 13, 6, 14, 7, 15);                      \
  } while (0)

/* Whether every |x[c]| < 2^8 (false for NaN and infinities): then x * 2^120 is exact. */
static int fp8_x_folds(const float *x, int cols) {
  v128_t m = wasm_f32x4_splat(0.0f);
  int c = 0;
  for (; c + 4 <= cols; c += 4) m = wasm_f32x4_max(m, wasm_f32x4_abs(wasm_v128_load(x + c)));
  float t = hmax_f32x4(m);
  for (; c < cols; c++) t = __builtin_wasm_max_f32(t, __builtin_fabsf(x[c]));
  return t < 256.0f;
}

/* Whether row w of cols codes holds a NaN code. */
static int fp8_row_has_nan(const uint8_t *w, int cols) {
  for (int c = 0; c < cols; c++)
    if ((w[c] & 0x7f) == 0x7f) return 1;
  return 0;
}

/*
 * The block's last 1..15 columns [c, c1) of row w, one by one, added to lane 0 of p: the scalar
 * twin with x as given (these products are rounded separately, so 2^120 stays on the weight).
 * Sets *nan when one of the codes is NaN, as the vector part does.
 */
static inline v128_t fp8_tail(v128_t p, const uint8_t *w, const float *x, int c, int c1,
                              int *nan) {
  float t = 0.0f;
  for (; c < c1; c++) {
    t += fp8_to_f32(w[c]) * x[c];
    if ((w[c] & 0x7f) == 0x7f) *nan = 1;
  }
  return wasm_f32x4_add(p, wasm_f32x4_make(t, 0.0f, 0.0f, 0.0f));
}

/*
 * Dots of four rows with x as lanes [row0..row3]; si is row i's line of block scales. FOLD: x is
 * multiplied by 2^120 as loaded (fp8_x_folds), else the decoded weights are. *nan is set when
 * some code is NaN (the lanes are then meaningless). The one-row path passes the same row four
 * times and gets the same bits.
 */
static inline __attribute__((always_inline)) v128_t
fp8_dot4(const uint8_t *w0, const uint8_t *w1, const uint8_t *w2, const uint8_t *w3,
         const float *s0, const float *s1, const float *s2, const float *s3, const float *x,
         int cols, int fold, int *nan) {
  fp8_consts k = fp8_consts_make(x);
  v128_t z = k.zero, top = z;
  v128_t acc0 = z, acc1 = z, acc2 = z, acc3 = z;
  for (int c0 = 0, cb = 0; c0 < cols; c0 += 128, cb++) {
    int c1 = cols - c0 < 128 ? cols : c0 + 128;
    v128_t p0 = z, p1 = z, p2 = z, p3 = z;
    int c = c0;
    for (; c + 16 <= c1; c += 16) {
      v128_t x0 = wasm_v128_load(x + c), x1 = wasm_v128_load(x + c + 4);
      v128_t x2 = wasm_v128_load(x + c + 8), x3 = wasm_v128_load(x + c + 12);
      if (fold) {
        x0 = wasm_f32x4_mul(x0, k.rebias);
        x1 = wasm_f32x4_mul(x1, k.rebias);
        x2 = wasm_f32x4_mul(x2, k.rebias);
        x3 = wasm_f32x4_mul(x3, k.rebias);
      }
      v128_t f0, f1;
#define HALF(v, H, p, xa, xb)                                                     \
  FP8_HALF(k, v, H, f0, f1);                                                      \
  if (!fold) {                                                                    \
    f0 = wasm_f32x4_mul(f0, k.rebias);                                            \
    f1 = wasm_f32x4_mul(f1, k.rebias);                                            \
  }                                                                               \
  p = wasm_f32x4_relaxed_madd(f0, xa, p);                                         \
  p = wasm_f32x4_relaxed_madd(f1, xb, p);
#define ROW(w, p)                                                                 \
  {                                                                               \
    v128_t v = wasm_v128_load((w) + c);                                           \
    top = wasm_u8x16_max(top, wasm_v128_or(v, k.top));                            \
    HALF(v, 0, p, x0, x1)                                                         \
    HALF(v, 1, p, x2, x3)                                                         \
  }
      ROW(w0, p0)
      ROW(w1, p1)
      ROW(w2, p2)
      ROW(w3, p3)
#undef ROW
#undef HALF
    }
    if (c < c1) {
      p0 = fp8_tail(p0, w0, x, c, c1, nan);
      p1 = fp8_tail(p1, w1, x, c, c1, nan);
      p2 = fp8_tail(p2, w2, x, c, c1, nan);
      p3 = fp8_tail(p3, w3, x, c, c1, nan);
    }
    acc0 = wasm_f32x4_relaxed_madd(p0, wasm_f32x4_splat(s0[cb]), acc0);
    acc1 = wasm_f32x4_relaxed_madd(p1, wasm_f32x4_splat(s1[cb]), acc1);
    acc2 = wasm_f32x4_relaxed_madd(p2, wasm_f32x4_splat(s2[cb]), acc2);
    acc3 = wasm_f32x4_relaxed_madd(p3, wasm_f32x4_splat(s3[cb]), acc3);
  }
  /* A code | 0x80 is 0xff only for the NaN codes; the tails' NaNs propagate by themselves. */
  if (wasm_v128_any_true(wasm_i8x16_eq(top, wasm_i8x16_splat(-1)))) *nan = 1;
  return wasm_f32x4_make(hsum_f32x4(acc0), hsum_f32x4(acc1), hsum_f32x4(acc2), hsum_f32x4(acc3));
}

/* fp8_dot4 with FOLD a constant in each branch, so each loop is compiled for its case. */
static v128_t fp8_dot4_any(const uint8_t *w0, const uint8_t *w1, const uint8_t *w2,
                           const uint8_t *w3, const float *s0, const float *s1, const float *s2,
                           const float *s3, const float *x, int cols, int fold) {
  int nan = 0;
  v128_t v = fold ? fp8_dot4(w0, w1, w2, w3, s0, s1, s2, s3, x, cols, 1, &nan)
                  : fp8_dot4(w0, w1, w2, w3, s0, s1, s2, s3, x, cols, 0, &nan);
  if (nan) {
    const uint8_t *w[4] = {w0, w1, w2, w3};
    float y[4];
    wasm_v128_store(y, v);
    for (int i = 0; i < 4; i++)
      if (fp8_row_has_nan(w[i], cols)) y[i] = __builtin_nanf("");
    v = wasm_v128_load(y);
  }
  return v;
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
  int q = (r1 - r) / 4, fold = fp8_x_folds(x, cols);
  size_t n = (size_t)cols, qn = (size_t)q * n, nsb = (size_t)(cols + 127) / 128;
#define SROW(i) (S + (size_t)((i) / 128) * nsb)
  for (int i = 0; i < q; i++) {
    int k = r + i;
    const uint8_t *w = W + (size_t)k * n;
    store_lanes_strided(y + k, (size_t)q,
                        fp8_dot4_any(w, w + qn, w + 2 * qn, w + 3 * qn, SROW(k), SROW(k + q),
                                     SROW(k + 2 * q), SROW(k + 3 * q), x, cols, fold));
  }
  for (int k = r + 4 * q; k < r1; k++) {
    const uint8_t *w = W + (size_t)k * n;
    const float *s = SROW(k);
    y[k] = wasm_f32x4_extract_lane(fp8_dot4_any(w, w, w, w, s, s, s, s, x, cols, fold), 0);
  }
#undef SROW
}

/*
 * Row w against the C batch columns at X (cols floats apart), each sum as fp8_dot4 forms it, to
 * Y[j * rows]. Every 8 codes are decoded once (2^120 on the weights) and used for all C columns.
 * C = 16 holds 32 sums, more than V8's registers, yet beats C = 4 by 1.2x; C = 32 and 64 spill
 * too much (docs/PERFORMANCE.md). Returns whether the row holds a NaN code.
 */
static inline __attribute__((always_inline)) int
fp8_row_tile(const uint8_t *w, const float *s, const float *X, int cols, float *Y, size_t rows,
             const int C) {
  fp8_consts k = fp8_consts_make(X);
  v128_t z = k.zero, top = z, acc[FP8_GN_MAX], p[FP8_GN_MAX];
  int nan = 0;
  _Pragma("clang loop unroll(full)") for (int j = 0; j < C; j++) acc[j] = z;
  for (int c0 = 0, cb = 0; c0 < cols; c0 += 128, cb++) {
    int c1 = cols - c0 < 128 ? cols : c0 + 128, cv = c0 + ((c1 - c0) & ~15);
    _Pragma("clang loop unroll(full)") for (int j = 0; j < C; j++) p[j] = z;
    for (int c = c0; c < cv; c += 8) {
      v128_t v = wasm_v128_load64_zero(w + c), f0, f1;
      top = wasm_u8x16_max(top, wasm_v128_or(v, k.top));
      FP8_HALF(k, v, 0, f0, f1);
      f0 = wasm_f32x4_mul(f0, k.rebias);
      f1 = wasm_f32x4_mul(f1, k.rebias);
      _Pragma("clang loop unroll(full)") for (int j = 0; j < C; j++) {
        const float *x = X + (size_t)j * cols + c;
        p[j] = wasm_f32x4_relaxed_madd(f0, wasm_v128_load(x), p[j]);
        p[j] = wasm_f32x4_relaxed_madd(f1, wasm_v128_load(x + 4), p[j]);
      }
    }
    v128_t sc = wasm_f32x4_splat(s[cb]);
    _Pragma("clang loop unroll(full)") for (int j = 0; j < C; j++) {
      if (cv < c1) p[j] = fp8_tail(p[j], w, X + (size_t)j * cols, cv, c1, &nan);
      acc[j] = wasm_f32x4_relaxed_madd(p[j], sc, acc[j]);
    }
  }
  _Pragma("clang loop unroll(full)") for (int j = 0; j < C; j++) Y[j * rows] = hsum_f32x4(acc[j]);
  return nan || wasm_v128_any_true(wasm_i8x16_eq(top, wasm_i8x16_splat(-1)));
}

/*
 * Columns [b0, b0 + C * groups) of the gemm below, rows [r0, r1) through each group in turn (the
 * group's x stays in cache; blocking the rows as well measured no faster).
 */
static inline __attribute__((always_inline)) void
fp8_gemm_groups(const uint8_t *W, const float *S, const float *X, float *Y, int rows, int cols,
                int b0, int groups, int r0, int r1, const int C) {
  size_t n = (size_t)cols, nsb = (size_t)(cols + 127) / 128;
  for (int b = b0; b < b0 + C * groups; b += C)
    for (int r = r0; r < r1; r++) {
      float *y = Y + (size_t)b * rows + r;
      if (fp8_row_tile(W + (size_t)r * n, S + (size_t)(r / 128) * nsb, X + (size_t)b * n, cols, y,
                       (size_t)rows, C))
        for (int j = 0; j < C; j++) y[(size_t)j * rows] = __builtin_nanf("");
    }
}

/* Each width's loops compiled once, C a constant. */
static void fp8_gemm_16(const uint8_t *W, const float *S, const float *X, float *Y, int rows,
                        int cols, int b0, int groups, int r0, int r1) {
  fp8_gemm_groups(W, S, X, Y, rows, cols, b0, groups, r0, r1, 16);
}
static void fp8_gemm_8(const uint8_t *W, const float *S, const float *X, float *Y, int rows,
                       int cols, int b0, int groups, int r0, int r1) {
  fp8_gemm_groups(W, S, X, Y, rows, cols, b0, groups, r0, r1, 8);
}
static void fp8_gemm_4(const uint8_t *W, const float *S, const float *X, float *Y, int rows,
                       int cols, int b0, int groups, int r0, int r1) {
  fp8_gemm_groups(W, S, X, Y, rows, cols, b0, groups, r0, r1, 4);
}

/*
 * Y[b*rows + r] = sum_c w[r, c] * X[b*cols + c] for the nb columns of X and r in [r0, r1): every
 * column equal to matvec_fp8b128 of it, bit for bit (so batching never changes output). Columns
 * go 16, then 8, then 4 at a time through fp8_row_tile; the last nb % 4 through the matvec,
 * which is faster per column than a tile of 1-3 (its four rows share each load of x).
 */
KEXPORT("gemm_fp8b128")
void gemm_fp8b128(const uint8_t *W, const float *S, const float *X, float *Y, int rows, int cols,
                  int nb, int r0, int r1) {
  if (r1 > rows) r1 = rows;
  int r = r0 < 0 ? 0 : r0, b = 0;
  if (r >= r1) return;
  fp8_gemm_16(W, S, X, Y, rows, cols, b, nb / 16, r, r1);
  b += nb / 16 * 16;
  fp8_gemm_8(W, S, X, Y, rows, cols, b, (nb - b) / 8, r, r1);
  b += (nb - b) / 8 * 8;
  fp8_gemm_4(W, S, X, Y, rows, cols, b, (nb - b) / 4, r, r1);
  for (b += (nb - b) / 4 * 4; b < nb; b++)
    matvec_fp8b128(W, S, X + (size_t)b * (size_t)cols, Y + (size_t)b * rows, rows, cols, r0, r1);
}
