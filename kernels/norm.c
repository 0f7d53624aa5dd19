/*
 * RMS normalisation: y[i] = (x[i] * inv) * w[i], inv = 1 / sqrt(mean(x^2) + eps), or with the
 * unit offset (Qwen3-Next, Qwen3.5) (x[i] * inv) * (1 + w[i]). y may alias x
 * (each element is read before it is written). NaN anywhere in x makes every output NaN; an
 * infinite x[i] gives inv = 0, so that element becomes NaN (Inf * 0) and the others 0.
 */
#include "simd.h"

static inline void rmsnorm_row(const float *x, const float *w, float *y, int n, float eps,
                               int unit) {
  v128_t a = wasm_f32x4_splat(0.0f), b = a;
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    v128_t u = wasm_v128_load(x + i), v = wasm_v128_load(x + i + 4);
    a = wasm_f32x4_add(a, wasm_f32x4_mul(u, u));
    b = wasm_f32x4_add(b, wasm_f32x4_mul(v, v));
  }
  float ss = hsum_f32x4(wasm_f32x4_add(a, b));
  for (; i < n; i++) ss += x[i] * x[i];
  float inv = 1.0f / __builtin_sqrtf(ss / (float)n + eps);
  v128_t iv = wasm_f32x4_splat(inv);
  i = 0;
  if (unit) {
    /* transformers' (1 + w) in float32, then the product. */
    v128_t one = wasm_f32x4_splat(1.0f);
    for (; i + 4 <= n; i += 4) {
      v128_t v = wasm_f32x4_mul(wasm_v128_load(x + i), iv);
      wasm_v128_store(y + i, wasm_f32x4_mul(v, wasm_f32x4_add(one, wasm_v128_load(w + i))));
    }
    for (; i < n; i++) y[i] = (x[i] * inv) * (1.0f + w[i]);
    return;
  }
  for (; i + 4 <= n; i += 4) {
    v128_t v = wasm_f32x4_mul(wasm_v128_load(x + i), iv);
    wasm_v128_store(y + i, wasm_f32x4_mul(v, wasm_v128_load(w + i)));
  }
  for (; i < n; i++) y[i] = (x[i] * inv) * w[i];
}

/** One vector of n. */
KEXPORT("rmsnorm_f32")
void rmsnorm_f32(const float *x, const float *w, float *y, int n, float eps) {
  if (n > 0) rmsnorm_row(x, w, y, n, eps, 0);
}

/**
 * nrows consecutive rows of n (per-head q/k norm), all with the same weight w; `unit` non-zero
 * scales by (1 + w).
 */
KEXPORT("rmsnorm_rows_f32")
void rmsnorm_rows_f32(const float *x, const float *w, float *y, int n, int nrows, float eps,
                      int unit) {
  if (n <= 0) return;
  for (int r = 0; r < nrows; r++)
    rmsnorm_row(x + (size_t)r * n, w, y + (size_t)r * n, n, eps, unit);
}
