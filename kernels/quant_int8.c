/*
 * int8 weights with one f32 scale per row (w = q * S[r], q in -127..127), and the Q8 activation
 * quantiser the 4-bit kernels share (layout in quant.h).
 */
#include "quant.h"

/*
 * x[0..cols) -> Q8 blocks at xq (cols a multiple of 32). Per block: scale = max|x| / 127,
 * q = round-half-even(x * (127 / max|x|)); an all-zero block gets scale 0 and q = 0.
 */
static void quantize_q8_blocks(const float *x, int8_t *xq, int cols, int b0, int b1) {
  int nb = cols / 32;
  float *scales = (float *)(xq + cols);
  int32_t *sums = (int32_t *)(xq + cols + 4 * nb);
  for (int b = b0; b < b1; b++) {
    const float *p = x + 32 * b;
    v128_t v0 = wasm_v128_load(p), v1 = wasm_v128_load(p + 4), v2 = wasm_v128_load(p + 8);
    v128_t v3 = wasm_v128_load(p + 12), v4 = wasm_v128_load(p + 16), v5 = wasm_v128_load(p + 20);
    v128_t v6 = wasm_v128_load(p + 24), v7 = wasm_v128_load(p + 28);
#define AMAX2(a, b) wasm_f32x4_max(wasm_f32x4_abs(a), wasm_f32x4_abs(b))
    v128_t m = wasm_f32x4_max(wasm_f32x4_max(AMAX2(v0, v1), AMAX2(v2, v3)),
                              wasm_f32x4_max(AMAX2(v4, v5), AMAX2(v6, v7)));
#undef AMAX2
    float amax = hmax_f32x4(m);
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scales[b] = amax > 0.0f ? amax / 127.0f : 0.0f;
    v128_t s = wasm_f32x4_splat(inv);
#define Q(v) wasm_i32x4_trunc_sat_f32x4(wasm_f32x4_nearest(wasm_f32x4_mul((v), s)))
    v128_t q0 = Q(v0), q1 = Q(v1), q2 = Q(v2), q3 = Q(v3), q4 = Q(v4), q5 = Q(v5), q6 = Q(v6),
           q7 = Q(v7);
#undef Q
    v128_t t = wasm_i32x4_add(wasm_i32x4_add(wasm_i32x4_add(q0, q1), wasm_i32x4_add(q2, q3)),
                              wasm_i32x4_add(wasm_i32x4_add(q4, q5), wasm_i32x4_add(q6, q7)));
    t = wasm_i32x4_add(t, wasm_i32x4_shuffle(t, t, 2, 3, 0, 1));
    sums[b] = wasm_i32x4_extract_lane(t, 0) + wasm_i32x4_extract_lane(t, 1);
    v128_t a = wasm_i8x16_narrow_i16x8(wasm_i16x8_narrow_i32x4(q0, q1),
                                       wasm_i16x8_narrow_i32x4(q2, q3));
    v128_t c = wasm_i8x16_narrow_i16x8(wasm_i16x8_narrow_i32x4(q4, q5),
                                       wasm_i16x8_narrow_i32x4(q6, q7));
    int8_t *o = xq + 32 * b;
    wasm_v128_store(o, wasm_i8x16_shuffle(a, c, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                          28, 30));
    wasm_v128_store(o + 16, wasm_i8x16_shuffle(a, c, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25,
                                               27, 29, 31));
  }
}

KEXPORT("quantize_act_q8")
void quantize_act_q8(const float *x, int8_t *xq, int cols) {
  quantize_q8_blocks(x, xq, cols, 0, cols / 32);
}

void silu_mul_f32(float *g, const float *u, int n);

/*
 * A gated MLP's activation and its down projection's Q8 input in one pool job: g = silu(g) · u
 * on blocks [b0, b1) of 32 floats, then those blocks of g quantised into xq as quantize_act_q8
 * lays them out (the same bits: both are per element and per block).
 */
KEXPORT("silu_mul_q8_range")
void silu_mul_q8_range(float *g, const float *u, int8_t *xq, int cols, int b0, int b1) {
  int nb = cols / 32;
  if (b1 > nb) b1 = nb;
  if (b0 < 0) b0 = 0;
  if (b0 >= b1) return;
  silu_mul_f32(g + 32 * b0, u + 32 * b0, 32 * (b1 - b0));
  quantize_q8_blocks(g, xq, cols, b0, b1);
}

/* Sixteen int8 weights as four f32 vectors. */
#define I8_TO_F32(v, f0, f1, f2, f3)                                                      \
  do {                                                                                    \
    v128_t l_ = wasm_i16x8_extend_low_i8x16(v), h_ = wasm_i16x8_extend_high_i8x16(v);     \
    (f0) = wasm_f32x4_convert_i32x4(wasm_i32x4_extend_low_i16x8(l_));                     \
    (f1) = wasm_f32x4_convert_i32x4(wasm_i32x4_extend_high_i16x8(l_));                    \
    (f2) = wasm_f32x4_convert_i32x4(wasm_i32x4_extend_low_i16x8(h_));                     \
    (f3) = wasm_f32x4_convert_i32x4(wasm_i32x4_extend_high_i16x8(h_));                    \
  } while (0)

/*
 * Dots of four int8 rows with x, as lanes [row0..row3]. Per row: columns in 16s into four
 * accumulators, then the last 1..15 columns one at a time into lane 0 of a fifth; a row's sum
 * never depends on the other three rows, so the one-row path calls this with the row repeated.
 */
static inline v128_t dot4_i8(const int8_t *w0, const int8_t *w1, const int8_t *w2,
                             const int8_t *w3, const float *x, int cols) {
  v128_t z = wasm_f32x4_splat(0.0f);
  v128_t a0 = z, b0 = z, c0 = z, d0 = z, a1 = z, b1 = z, c1 = z, d1 = z;
  v128_t a2 = z, b2 = z, c2 = z, d2 = z, a3 = z, b3 = z, c3 = z, d3 = z;
  int c = 0;
  for (; c + 16 <= cols; c += 16) {
    v128_t x0 = wasm_v128_load(x + c), x1 = wasm_v128_load(x + c + 4);
    v128_t x2 = wasm_v128_load(x + c + 8), x3 = wasm_v128_load(x + c + 12);
    v128_t f0, f1, f2, f3;
#define ROW(w, a, b, cc, d)                                                               \
  I8_TO_F32(wasm_v128_load((w) + c), f0, f1, f2, f3);                                     \
  a = wasm_f32x4_relaxed_madd(f0, x0, a);                                                 \
  b = wasm_f32x4_relaxed_madd(f1, x1, b);                                                 \
  cc = wasm_f32x4_relaxed_madd(f2, x2, cc);                                               \
  d = wasm_f32x4_relaxed_madd(f3, x3, d);
    ROW(w0, a0, b0, c0, d0)
    ROW(w1, a1, b1, c1, d1)
    ROW(w2, a2, b2, c2, d2)
    ROW(w3, a3, b3, c3, d3)
#undef ROW
  }
  v128_t t0 = z, t1 = z, t2 = z, t3 = z;
  for (; c < cols; c++) {
    v128_t xv = wasm_f32x4_splat(x[c]);
    t0 = wasm_f32x4_relaxed_madd(wasm_f32x4_splat((float)w0[c]), xv, t0);
    t1 = wasm_f32x4_relaxed_madd(wasm_f32x4_splat((float)w1[c]), xv, t1);
    t2 = wasm_f32x4_relaxed_madd(wasm_f32x4_splat((float)w2[c]), xv, t2);
    t3 = wasm_f32x4_relaxed_madd(wasm_f32x4_splat((float)w3[c]), xv, t3);
  }
#define FIN(a, b, cc, d, t)                                                               \
  (hsum_f32x4(wasm_f32x4_add(wasm_f32x4_add(a, b), wasm_f32x4_add(cc, d))) +              \
   wasm_f32x4_extract_lane(t, 0))
  return wasm_f32x4_make(FIN(a0, b0, c0, d0, t0), FIN(a1, b1, c1, d1, t1), FIN(a2, b2, c2, d2, t2),
                         FIN(a3, b3, c3, d3, t3));
#undef FIN
}

/*
 * y[r] = S[r] * sum_c W[r, c] * x[c] for r in [r0, r1); W int8 row-major [rows, cols]. A step's
 * four rows come from the four quarters of the range (see DEFINE_Q4_MATVEC in quant.h).
 */
KEXPORT("matvec_int8row")
void matvec_int8row(const int8_t *W, const float *S, const float *x, float *y, int rows, int cols,
                    int r0, int r1) {
  if (r1 > rows) r1 = rows;
  int r = r0 < 0 ? 0 : r0;
  if (r >= r1) return;
  int q = (r1 - r) / 4;
  size_t n = (size_t)cols, qn = (size_t)q * n;
  for (int i = 0; i < q; i++) {
    int k = r + i;
    const int8_t *w = W + (size_t)k * n;
    v128_t d = dot4_i8(w, w + qn, w + 2 * qn, w + 3 * qn, x, cols);
    v128_t s = wasm_f32x4_make(S[k], S[k + q], S[k + 2 * q], S[k + 3 * q]);
    store_lanes_strided(y + k, (size_t)q, wasm_f32x4_mul(d, s));
  }
  for (int k = r + 4 * q; k < r1; k++) {
    const int8_t *w = W + (size_t)k * n;
    y[k] = wasm_f32x4_extract_lane(dot4_i8(w, w, w, w, x, cols), 0) * S[k];
  }
}
