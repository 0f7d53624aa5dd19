/*
 * Rotary position embedding, in place, for one position: the engine passes cos/sin tables of
 * rot_dim/2 entries. Pair (a, b) becomes (a*cos - b*sin, b*cos + a*sin). interleaved = 0 pairs
 * (i, i + rot_dim/2) (Hugging Face rotate_half); interleaved = 1 pairs (2i, 2i + 1). Dimensions
 * from rot_dim to the head's end are untouched. Vector and scalar paths use the same operations,
 * so results do not depend on rot_dim's alignment.
 */
#include "simd.h"

static inline void rope_half(float *x, int half, const float *cs, const float *sn) {
  int i = 0;
  for (; i + 4 <= half; i += 4) {
    v128_t a = wasm_v128_load(x + i), b = wasm_v128_load(x + half + i);
    v128_t c = wasm_v128_load(cs + i), s = wasm_v128_load(sn + i);
    wasm_v128_store(x + i, wasm_f32x4_sub(wasm_f32x4_mul(a, c), wasm_f32x4_mul(b, s)));
    wasm_v128_store(x + half + i, wasm_f32x4_add(wasm_f32x4_mul(b, c), wasm_f32x4_mul(a, s)));
  }
  for (; i < half; i++) {
    float a = x[i], b = x[half + i];
    x[i] = a * cs[i] - b * sn[i];
    x[half + i] = b * cs[i] + a * sn[i];
  }
}

static inline void rope_interleaved(float *x, int half, const float *cs, const float *sn) {
  int i = 0;
  for (; i + 4 <= half; i += 4) {
    v128_t v0 = wasm_v128_load(x + 2 * i), v1 = wasm_v128_load(x + 2 * i + 4);
    v128_t a = wasm_i32x4_shuffle(v0, v1, 0, 2, 4, 6), b = wasm_i32x4_shuffle(v0, v1, 1, 3, 5, 7);
    v128_t c = wasm_v128_load(cs + i), s = wasm_v128_load(sn + i);
    v128_t ra = wasm_f32x4_sub(wasm_f32x4_mul(a, c), wasm_f32x4_mul(b, s));
    v128_t rb = wasm_f32x4_add(wasm_f32x4_mul(b, c), wasm_f32x4_mul(a, s));
    wasm_v128_store(x + 2 * i, wasm_i32x4_shuffle(ra, rb, 0, 4, 1, 5));
    wasm_v128_store(x + 2 * i + 4, wasm_i32x4_shuffle(ra, rb, 2, 6, 3, 7));
  }
  for (; i < half; i++) {
    float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * cs[i] - b * sn[i];
    x[2 * i + 1] = b * cs[i] + a * sn[i];
  }
}

KEXPORT("rope_f32")
void rope_f32(float *x, int nheads, int head_stride, int rot_dim, const float *cs,
              const float *sn, int interleaved) {
  int half = rot_dim / 2;
  for (int h = 0; h < nheads; h++) {
    float *xh = x + (size_t)h * head_stride;
    if (interleaved)
      rope_interleaved(xh, half, cs, sn);
    else
      rope_half(xh, half, cs, sn);
  }
}
