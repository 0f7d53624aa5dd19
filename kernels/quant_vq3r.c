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

/* Chunks per column tile: the three stage tables of a tile take 3 * 32 KiB. */
#define VQ_TILE_CHUNKS 32
/* Rows per block: a block's index bytes (rows * 3 * cols / 8) stay in L2 across its tiles. */
#define VQ_BLOCK_ROWS 256

static inline uint64_t load_u64(const uint8_t *p) {
  uint64_t v;
  __builtin_memcpy(&v, p, 8);
  return v;
}

/*
 * Eight chunks of one row from its 8 index bytes per stage (little-endian words u0, u1, u2),
 * into acc0 (even chunks) and acc1 (odd): one 8-byte load per stage instead of byte extracts.
 */
#define VQ_CHUNKS8(acc0, acc1, u0, u1, u2)                                                \
  do {                                                                                    \
    uint64_t v0_ = (u0), v1_ = (u1), v2_ = (u2);                                          \
    for (int j_ = 0; j_ < 8; j_++) {                                                      \
      float t_ = (m0[j_ * 256 + (size_t)((v0_ >> (8 * j_)) & 255)] +                      \
                  m1[j_ * 256 + (size_t)((v1_ >> (8 * j_)) & 255)]) +                     \
                 m2[j_ * 256 + (size_t)((v2_ >> (8 * j_)) & 255)];                        \
      if (j_ & 1)                                                                         \
        acc1 += t_;                                                                       \
      else                                                                                \
        acc0 += t_;                                                                       \
    }                                                                                     \
  } while (0)

/* Chunks [k, k1) of the row whose stage-0 indices start at i0, one at a time; returns the sum. */
static inline float vq_finish(const float *l0, const float *l1, const float *l2,
                              const uint8_t *i0, size_t k, size_t k1, size_t nch, float acc0,
                              float acc1) {
  for (; k < k1; k++) {
    float t = (l0[k * 256 + i0[k]] + l1[k * 256 + i0[nch + k]]) + l2[k * 256 + i0[2 * nch + k]];
    if (k & 1)
      acc1 += t;
    else
      acc0 += t;
  }
  return acc0 + acc1;
}

/*
 * Sums over chunks [k0, k1) of four rows (index rows p0..p3), lanes [row0..row3]: eight chunks
 * at a time, then one at a time, into two accumulators per row by chunk parity. Rows never mix,
 * so the one-row path passes the same row four times and gets the same bits.
 */
static inline v128_t vq_tile4(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2,
                              const uint8_t *p3, const float *l0, const float *l1,
                              const float *l2, size_t nch, size_t k0, size_t k1) {
  float a0 = 0.0f, a1 = 0.0f, b0 = 0.0f, b1 = 0.0f, c0 = 0.0f, c1 = 0.0f, d0 = 0.0f, d1 = 0.0f;
  size_t k = k0;
  for (; k + 8 <= k1; k += 8) {
    const float *m0 = l0 + k * 256, *m1 = l1 + k * 256, *m2 = l2 + k * 256;
    VQ_CHUNKS8(a0, a1, load_u64(p0 + k), load_u64(p0 + nch + k), load_u64(p0 + 2 * nch + k));
    VQ_CHUNKS8(b0, b1, load_u64(p1 + k), load_u64(p1 + nch + k), load_u64(p1 + 2 * nch + k));
    VQ_CHUNKS8(c0, c1, load_u64(p2 + k), load_u64(p2 + nch + k), load_u64(p2 + 2 * nch + k));
    VQ_CHUNKS8(d0, d1, load_u64(p3 + k), load_u64(p3 + nch + k), load_u64(p3 + 2 * nch + k));
  }
  return wasm_f32x4_make(vq_finish(l0, l1, l2, p0, k, k1, nch, a0, a1),
                         vq_finish(l0, l1, l2, p1, k, k1, nch, b0, b1),
                         vq_finish(l0, l1, l2, p2, k, k1, nch, c0, c1),
                         vq_finish(l0, l1, l2, p3, k, k1, nch, d0, d1));
}

/*
 * y[r] = S[r] * sum_k (lut[0][k][i0] + lut[1][k][i1] + lut[2][k][i2]) for r in [r0, r1). The
 * table of a wide x outgrows L2 (1.5 MiB at 4096 columns) and its random reads then miss, so
 * rows go in blocks and each block sweeps the columns in tiles of VQ_TILE_CHUNKS, adding each
 * tile's sum into y in tile order: the tiles start at chunk 0 whatever [r0, r1) is, so a row's
 * bits never depend on the split.
 */
KEXPORT("matvec_vq3r")
void matvec_vq3r(const uint8_t *I, const float *S, const float *lut, float *y, int rows, int cols,
                 int r0, int r1) {
  if (r1 > rows) r1 = rows;
  size_t nch = (size_t)cols / 8, rb = 3 * nch;
  const float *l0 = lut, *l1 = lut + nch * 256, *l2 = lut + 2 * nch * 256;
  for (int a = r0 < 0 ? 0 : r0; a < r1; a += VQ_BLOCK_ROWS) {
    int e = r1 - a < VQ_BLOCK_ROWS ? r1 : a + VQ_BLOCK_ROWS;
    for (size_t k0 = 0; k0 < nch; k0 += VQ_TILE_CHUNKS) {
      size_t k1 = nch - k0 < VQ_TILE_CHUNKS ? nch : k0 + VQ_TILE_CHUNKS;
      int i = a;
      for (; i + 4 <= e; i += 4) {
        const uint8_t *p = I + (size_t)i * rb;
        v128_t v = vq_tile4(p, p + rb, p + 2 * rb, p + 3 * rb, l0, l1, l2, nch, k0, k1);
        wasm_v128_store(y + i, k0 == 0 ? v : wasm_f32x4_add(wasm_v128_load(y + i), v));
      }
      for (; i < e; i++) {
        const uint8_t *p = I + (size_t)i * rb;
        float v = wasm_f32x4_extract_lane(vq_tile4(p, p, p, p, l0, l1, l2, nch, k0, k1), 0);
        y[i] = k0 == 0 ? v : y[i] + v;
      }
    }
    for (int i = a; i < e; i++) y[i] *= S[i];
  }
}
