/*
 * VQ4P: 4-stage residual vector quantisation, 8 weights per vector, 64-entry codebooks per
 * stage, 3 bits per weight (engine/quant/vq4p.ts). vq4p_lut tabulates once per input vector
 * every entry's dot with every 8-column chunk of x and rounds the table to int8, so one stage's
 * table for one chunk is 64 bytes: four registers, indexed by a byte shuffle each and merged by
 * two lane selects. matvec_vq4p serves 16 rows (one byte lane each) per lookup. Each stage of
 * each group of 16 chunks (128 columns) has its own table scale, so an outlier column or a large
 * first stage costs the other tables no precision; a group's lookups are summed exactly in
 * integers and scaled once.
 *
 * Layouts (nch = cols / 8, cols a multiple of 8, ng = ceil(nch / 16)):
 *   C   f32 [4][8][64]: stage s, dimension d, entry e;
 *   lut i8 [nch][4][64], then f32 q [ng][4] at byte nch * 256:
 *       lut[k][s][e] = round(sum_d C[s][d][e] * x[8k + d] / q[k / 16][s]), |lut| <= 127;
 *   I   u8 [ceil(rows/16)][nch][3][16]: vectors A, B, C per (row group, chunk), lane j = row
 *       16g + j; A = i0 | (i3 & 3) << 6, B = i1 | (i3 >> 2 & 3) << 6, C = i2 | (i3 >> 4) << 6;
 *   S   f32 [rows].
 * y[r] = S[r] * acc, acc = sum over groups g then stages s (in that order, f32, unfused) of
 * q[g][s] * (float)sum_{k in g} lut[k][s][i_s(r, k)].
 */
#include "quant.h"

/* Largest table magnitude: 16 chunks of one stage sum to 2032 in a 16-bit lane. */
#define VQ4P_LUT_MAX 127.0f
/* Chunks per table-scale group. */
#define VQ4P_GROUP 16

/* Entries e..e+3 of stage table cs ([8][64]) dotted with the splatted chunk xs, d in order. */
static inline __attribute__((always_inline)) v128_t vq4p_dot4(const float *cs, const v128_t *xs,
                                                              int e) {
  v128_t v = wasm_f32x4_mul(wasm_v128_load(cs + e), xs[0]);
  for (int d = 1; d < 8; d++) {
    v = wasm_f32x4_relaxed_madd(wasm_v128_load(cs + d * 64 + e), xs[d], v);
  }
  return v;
}

static inline __attribute__((always_inline)) void vq4p_splat(const float *xk, v128_t *xs) {
  for (int d = 0; d < 8; d++) xs[d] = wasm_f32x4_splat(xk[d]);
}

KEXPORT("vq4p_lut")
void vq4p_lut(const float *C, const float *x, int8_t *lut, int cols) {
  int nch = cols / 8;
  float *q = (float *)(lut + (size_t)nch * 256);
  v128_t xs[8];
  v128_t hi = wasm_i32x4_splat(127), lo = wasm_i32x4_splat(-127);
  for (int k0 = 0; k0 < nch; k0 += VQ4P_GROUP) {
    int k1 = nch - k0 < VQ4P_GROUP ? nch : k0 + VQ4P_GROUP;
    for (int s = 0; s < 4; s++) {
      const float *cs = C + s * 512;
      /* Pass 1: the group's largest |entry| of this stage; pass 2 recomputes and rounds. */
      v128_t mx = wasm_f32x4_splat(0.0f);
      for (int k = k0; k < k1; k++) {
        vq4p_splat(x + 8 * k, xs);
        for (int e = 0; e < 64; e += 4) {
          mx = wasm_f32x4_max(mx, wasm_f32x4_abs(vq4p_dot4(cs, xs, e)));
        }
      }
      float m = hmax_f32x4(mx);
      q[(k0 / VQ4P_GROUP) * 4 + s] = m > 0.0f ? m / VQ4P_LUT_MAX : 0.0f;
      v128_t inv = wasm_f32x4_splat(m > 0.0f ? VQ4P_LUT_MAX / m : 0.0f);
      for (int k = k0; k < k1; k++) {
        vq4p_splat(x + 8 * k, xs);
        int8_t *out = lut + (size_t)k * 256 + s * 64;
        for (int e = 0; e < 64; e += 16) {
          v128_t r[4];
          for (int j = 0; j < 4; j++) {
            v128_t t = wasm_f32x4_nearest(wasm_f32x4_mul(vq4p_dot4(cs, xs, e + 4 * j), inv));
            r[j] = wasm_i32x4_max(wasm_i32x4_min(wasm_i32x4_trunc_sat_f32x4(t), hi), lo);
          }
          v128_t h0 = wasm_i16x8_narrow_i32x4(r[0], r[1]), h1 = wasm_i16x8_narrow_i32x4(r[2], r[3]);
          wasm_v128_store(out + e, wasm_i8x16_narrow_i16x8(h0, h1));
        }
      }
    }
  }
}

/* Loop constants, made opaque so V8 keeps them in registers (see runtime_zero_v128). */
struct vq4p_consts {
  v128_t m15, mc0, zero;
};

/*
 * t[i] for a 64-byte table t: lo = i & 15 picks within each 16-byte quarter (relaxed_swizzle is
 * exact for indices below 16), then the quarter by bits 4 and 5 of i, given as all-ones masks
 * m4, m5 (relaxed_laneselect is exact for such masks).
 */
static inline __attribute__((always_inline)) v128_t vq4p_look(const int8_t *t, v128_t lo, v128_t m4,
                                                              v128_t m5) {
  v128_t r0 = wasm_i8x16_relaxed_swizzle(wasm_v128_load(t), lo);
  v128_t r1 = wasm_i8x16_relaxed_swizzle(wasm_v128_load(t + 16), lo);
  v128_t r2 = wasm_i8x16_relaxed_swizzle(wasm_v128_load(t + 32), lo);
  v128_t r3 = wasm_i8x16_relaxed_swizzle(wasm_v128_load(t + 48), lo);
  v128_t a = wasm_i8x16_relaxed_laneselect(r1, r0, m4);
  v128_t b = wasm_i8x16_relaxed_laneselect(r3, r2, m4);
  return wasm_i8x16_relaxed_laneselect(b, a, m5);
}

/* All-ones where bit `b` of each byte of v is set: a 16-bit shift moves it to the top bit. */
#define VQ4P_BIT(v, b, kc) wasm_i8x16_lt(wasm_i16x8_shl(v, 7 - (b)), (kc)->zero)

/* acc[0..3] (rows 0-3, 4-7, 8-11, 12-15) += q * (float)(16-bit sums lo: rows 0-7, hi: 8-15). */
static inline __attribute__((always_inline)) void vq4p_scale_add(v128_t *acc, v128_t lo, v128_t hi,
                                                                 float q) {
  v128_t vq = wasm_f32x4_splat(q);
  v128_t w[4] = {wasm_i32x4_extend_low_i16x8(lo), wasm_i32x4_extend_high_i16x8(lo),
                 wasm_i32x4_extend_low_i16x8(hi), wasm_i32x4_extend_high_i16x8(hi)};
  for (int j = 0; j < 4; j++) {
    acc[j] = wasm_f32x4_add(acc[j], wasm_f32x4_mul(vq, wasm_f32x4_convert_i32x4(w[j])));
  }
}

/* One row group's 16 sums (before the row scale) as f32 lanes in acc[0..3]. */
static inline __attribute__((always_inline)) void vq4p_group(const uint8_t *p, const int8_t *lut,
                                                             int nch,
                                                             const struct vq4p_consts *kc,
                                                             v128_t *acc) {
  const float *q = (const float *)(lut + (size_t)nch * 256);
  for (int j = 0; j < 4; j++) acc[j] = wasm_f32x4_splat(0.0f);
  for (int k0 = 0; k0 < nch; k0 += VQ4P_GROUP) {
    int k1 = nch - k0 < VQ4P_GROUP ? nch : k0 + VQ4P_GROUP;
    v128_t z = wasm_i16x8_splat(0);
    v128_t l0 = z, h0 = z, l1 = z, h1 = z, l2 = z, h2 = z, l3 = z, h3 = z;
    for (int k = k0; k < k1; k++) {
      const uint8_t *b = p + (size_t)k * 48;
      v128_t A = wasm_v128_load(b), B = wasm_v128_load(b + 16), C = wasm_v128_load(b + 32);
      const int8_t *t = lut + (size_t)k * 256;
      v128_t m15 = kc->m15;
      v128_t v0 = vq4p_look(t, wasm_v128_and(A, m15), VQ4P_BIT(A, 4, kc), VQ4P_BIT(A, 5, kc));
      v128_t v1 = vq4p_look(t + 64, wasm_v128_and(B, m15), VQ4P_BIT(B, 4, kc), VQ4P_BIT(B, 5, kc));
      v128_t v2 = vq4p_look(t + 128, wasm_v128_and(C, m15), VQ4P_BIT(C, 4, kc), VQ4P_BIT(C, 5, kc));
      /* Stage 3: bits 0-1 in A's top bits, 2-3 in B's, 4-5 in C's (16-bit shifts of masked bytes
         never carry across bytes). */
      v128_t lo3 = wasm_v128_or(wasm_u16x8_shr(wasm_v128_and(A, kc->mc0), 6),
                                wasm_u16x8_shr(wasm_v128_and(B, kc->mc0), 4));
      v128_t v3 = vq4p_look(t + 192, lo3, VQ4P_BIT(C, 6, kc), wasm_i8x16_lt(C, kc->zero));
      l0 = wasm_i16x8_add(l0, wasm_i16x8_extend_low_i8x16(v0));
      h0 = wasm_i16x8_add(h0, wasm_i16x8_extend_high_i8x16(v0));
      l1 = wasm_i16x8_add(l1, wasm_i16x8_extend_low_i8x16(v1));
      h1 = wasm_i16x8_add(h1, wasm_i16x8_extend_high_i8x16(v1));
      l2 = wasm_i16x8_add(l2, wasm_i16x8_extend_low_i8x16(v2));
      h2 = wasm_i16x8_add(h2, wasm_i16x8_extend_high_i8x16(v2));
      l3 = wasm_i16x8_add(l3, wasm_i16x8_extend_low_i8x16(v3));
      h3 = wasm_i16x8_add(h3, wasm_i16x8_extend_high_i8x16(v3));
    }
    const float *qg = q + (k0 / VQ4P_GROUP) * 4;
    vq4p_scale_add(acc, l0, h0, qg[0]);
    vq4p_scale_add(acc, l1, h1, qg[1]);
    vq4p_scale_add(acc, l2, h2, qg[2]);
    vq4p_scale_add(acc, l3, h3, qg[3]);
  }
}

/*
 * y[r] for r in [r0, r1): whole 16-row groups are computed and only the rows in range stored,
 * so a group split between two workers is summed by both, to the same bits.
 */
KEXPORT("matvec_vq4p")
void matvec_vq4p(const uint8_t *I, const float *S, const int8_t *lut, float *y, int rows,
                 int cols, int r0, int r1) {
  if (r1 > rows) r1 = rows;
  if (r0 < 0) r0 = 0;
  if (r0 >= r1) return;
  int nch = cols / 8;
  v128_t z = runtime_zero_v128(I);
  struct vq4p_consts kc = {
      wasm_v128_xor(wasm_i8x16_splat(15), z),
      wasm_v128_xor(wasm_i8x16_splat((int8_t)0xc0), z),
      z,
  };
  for (int g = r0 / 16; g * 16 < r1; g++) {
    v128_t acc[4];
    vq4p_group(I + (size_t)g * nch * 48, lut, nch, &kc, acc);
    for (int j = 0; j < 4; j++) {
      int r = g * 16 + 4 * j;
      v128_t f = acc[j];
      if (r >= r0 && r + 4 <= r1) {
        wasm_v128_store(y + r, wasm_f32x4_mul(wasm_v128_load(S + r), f));
        continue;
      }
      if (r >= r0 && r < r1) y[r] = S[r] * wasm_f32x4_extract_lane(f, 0);
      if (r + 1 >= r0 && r + 1 < r1) y[r + 1] = S[r + 1] * wasm_f32x4_extract_lane(f, 1);
      if (r + 2 >= r0 && r + 2 < r1) y[r + 2] = S[r + 2] * wasm_f32x4_extract_lane(f, 2);
      if (r + 3 >= r0 && r + 3 < r1) y[r + 3] = S[r + 3] * wasm_f32x4_extract_lane(f, 3);
    }
  }
}
