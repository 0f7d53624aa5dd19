/*
 * VQ3R: 3-stage residual vector quantisation, 8 weights per vector, 256-entry codebooks per
 * stage. A row's weights w[r, 8k..8k+7] = S[r] * (C0[i0] + C1[i1] + C2[i2]) with one index byte
 * per stage per chunk k. Matvecs never rebuild weights: vq3r_lut tabulates, once per input
 * vector, every codebook entry's dot with every 8-column chunk of x, and matvec_vq3r then adds
 * three table entries per chunk.
 *
 * Layouts (nch = cols / 8; cols a multiple of 8):
 *   C   f32 [3][8][256]: stage s, dimension d, entry k (dimension-major, so the table build
 *       reads four entries per load);
 *   lut f32 [3][nch][256]: lut[s][k][e] = sum_d C[s][d][e] * x[8k + d];
 *   I   u8 [rows][3][nch]: per row, the stage-0 indices of all chunks, then stage 1, then 2;
 *   S   f32 [rows].
 */
#include "simd.h"

/* lut[s][k][e] = sum_d C[s][d][e] * x[8k + d], d summed in order 0..7. */
KEXPORT("vq3r_lut")
void vq3r_lut(const float *C, const float *x, float *lut, int cols) {
  int nch = cols / 8;
  for (int s = 0; s < 3; s++) {
    const float *cs = C + s * 8 * 256;
    for (int k = 0; k < nch; k++) {
      const float *xk = x + 8 * k;
      v128_t x0 = wasm_f32x4_splat(xk[0]), x1 = wasm_f32x4_splat(xk[1]);
      v128_t x2 = wasm_f32x4_splat(xk[2]), x3 = wasm_f32x4_splat(xk[3]);
      v128_t x4 = wasm_f32x4_splat(xk[4]), x5 = wasm_f32x4_splat(xk[5]);
      v128_t x6 = wasm_f32x4_splat(xk[6]), x7 = wasm_f32x4_splat(xk[7]);
      float *out = lut + ((size_t)s * nch + k) * 256;
      for (int e = 0; e < 256; e += 4) {
        v128_t v = wasm_f32x4_mul(wasm_v128_load(cs + e), x0);
        v = wasm_f32x4_relaxed_madd(wasm_v128_load(cs + 256 + e), x1, v);
        v = wasm_f32x4_relaxed_madd(wasm_v128_load(cs + 512 + e), x2, v);
        v = wasm_f32x4_relaxed_madd(wasm_v128_load(cs + 768 + e), x3, v);
        v = wasm_f32x4_relaxed_madd(wasm_v128_load(cs + 1024 + e), x4, v);
        v = wasm_f32x4_relaxed_madd(wasm_v128_load(cs + 1280 + e), x5, v);
        v = wasm_f32x4_relaxed_madd(wasm_v128_load(cs + 1536 + e), x6, v);
        v = wasm_f32x4_relaxed_madd(wasm_v128_load(cs + 1792 + e), x7, v);
        wasm_v128_store(out + e, v);
      }
    }
  }
}

/* Chunk k's three table entries: stage tables l0, l1, l2 (each [nch][256]) at indices a, b, c. */
#define VQ_TERM(k, a, b, c) (l0[(k) * 256 + (a)] + l1[(k) * 256 + (b)] + l2[(k) * 256 + (c)])

/*
 * y[r] = S[r] * sum_k (lut[0][k][i0] + lut[1][k][i1] + lut[2][k][i2]) for r in [r0, r1). Chunks go
 * 16 at a time (one 16-byte load of indices per stage) into four accumulators by k mod 4, the
 * rest into the first; each row is computed alone, so splits never change a row's bits.
 */
KEXPORT("matvec_vq3r")
void matvec_vq3r(const uint8_t *I, const float *S, const float *lut, float *y, int rows, int cols,
                 int r0, int r1) {
  if (r1 > rows) r1 = rows;
  size_t nch = (size_t)cols / 8;
  const float *l0 = lut, *l1 = lut + nch * 256, *l2 = lut + 2 * nch * 256;
  for (int r = r0 < 0 ? 0 : r0; r < r1; r++) {
    const uint8_t *i0 = I + (size_t)r * 3 * nch, *i1 = i0 + nch, *i2 = i1 + nch;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    size_t k = 0;
    for (; k + 16 <= nch; k += 16) {
      v128_t q0 = wasm_v128_load(i0 + k), q1 = wasm_v128_load(i1 + k), q2 = wasm_v128_load(i2 + k);
      const float *m0 = l0 + k * 256, *m1 = l1 + k * 256, *m2 = l2 + k * 256;
#define T(j)                                                                              \
  (m0[(j) * 256 + wasm_u8x16_extract_lane(q0, j)] +                                       \
   m1[(j) * 256 + wasm_u8x16_extract_lane(q1, j)] +                                       \
   m2[(j) * 256 + wasm_u8x16_extract_lane(q2, j)])
      a0 += T(0);
      a1 += T(1);
      a2 += T(2);
      a3 += T(3);
      a0 += T(4);
      a1 += T(5);
      a2 += T(6);
      a3 += T(7);
      a0 += T(8);
      a1 += T(9);
      a2 += T(10);
      a3 += T(11);
      a0 += T(12);
      a1 += T(13);
      a2 += T(14);
      a3 += T(15);
#undef T
    }
    for (; k < nch; k++) a0 += VQ_TERM(k, i0[k], i1[k], i2[k]);
    y[r] = S[r] * ((a0 + a1) + (a2 + a3));
  }
}
