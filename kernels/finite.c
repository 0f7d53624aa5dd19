/*
 * The packer's NaN / infinity scan (tools/pack/finite.ts): finds the first value whose bits under
 * `mask` (its dtype's exponent) are all set. Four vectors (64 bytes) are tested per branch, and
 * only the block that hits is searched value by value, so the scan runs at memory speed.
 */
#include "simd.h"

/* Value i of width w (1, 2 or 4 bytes, little-endian) at p, read byte by byte: p may be odd. */
static inline uint32_t value_at(const uint8_t *p, int i, int w) {
  const uint8_t *q = p + (size_t)i * w;
  if (w == 1) return q[0];
  if (w == 2) return q[0] | (uint32_t)q[1] << 8;
  return q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}

/* Lanes of v whose bits under m are all set, as all-ones lanes, for lane width w. */
static inline v128_t all_ones_lanes(v128_t v, v128_t m, int w) {
  v128_t x = wasm_v128_and(v, m);
  return w == 1 ? wasm_i8x16_eq(x, m) : w == 2 ? wasm_i16x8_eq(x, m) : wasm_i32x4_eq(x, m);
}

/*
 * Index of the first of the n values of w bytes (1, 2 or 4) at p whose bits under mask are all
 * set; n when there is none. p needs no alignment.
 */
KEXPORT("find_all_ones")
int find_all_ones(const uint8_t *p, int n, int w, int mask) {
  v128_t m = w == 1 ? wasm_i8x16_splat((int8_t)mask)
             : w == 2 ? wasm_i16x8_splat((int16_t)mask)
                      : wasm_i32x4_splat(mask);
  int per = 64 / w, i = 0;
  for (; i + per <= n; i += per) {
    const uint8_t *q = p + (size_t)i * w;
    v128_t a = all_ones_lanes(wasm_v128_load(q), m, w);
    v128_t b = all_ones_lanes(wasm_v128_load(q + 16), m, w);
    v128_t c = all_ones_lanes(wasm_v128_load(q + 32), m, w);
    v128_t d = all_ones_lanes(wasm_v128_load(q + 48), m, w);
    if (wasm_v128_any_true(wasm_v128_or(wasm_v128_or(a, b), wasm_v128_or(c, d)))) break;
  }
  for (; i < n; i++)
    if ((value_at(p, i, w) & (uint32_t)mask) == (uint32_t)mask) return i;
  return n;
}
