/*
 * Element-wise vector kernels over n floats. Products and sums are separate IEEE operations
 * (never fused), so vector bodies and scalar tails agree bit for bit.
 */
#include "math.h"

/** g[i] = silu(g[i]) * u[i] (the gated FFN's activation). */
KEXPORT("silu_mul_f32")
void silu_mul_f32(float *g, const float *u, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4)
    wasm_v128_store(g + i, wasm_f32x4_mul(silu_f32x4(wasm_v128_load(g + i)),
                                          wasm_v128_load(u + i)));
  for (; i < n; i++) g[i] = lane0(silu_f32x4(wasm_f32x4_splat(g[i]))) * u[i];
}

/*
 * gpt-oss's clamped SwiGLU: gate = min(g, limit), up = clamp(u, -limit, limit),
 * g[i] = (up + 1) * gate * sigmoid(alpha * gate). min/max are the IEEE ones (NaN propagates).
 */
static inline v128_t swiglu_clamped_f32x4(v128_t g, v128_t u, v128_t lim, v128_t alpha) {
  v128_t gate = wasm_f32x4_min(g, lim);
  v128_t up = wasm_f32x4_max(wasm_f32x4_min(u, lim), wasm_f32x4_neg(lim));
  v128_t glu = wasm_f32x4_mul(gate, sigmoid_f32x4(wasm_f32x4_mul(alpha, gate)));
  return wasm_f32x4_mul(wasm_f32x4_add(up, wasm_f32x4_splat(1.0f)), glu);
}

KEXPORT("swiglu_clamped_f32")
void swiglu_clamped_f32(float *g, const float *u, int n, float limit, float alpha) {
  v128_t lim = wasm_f32x4_splat(limit), al = wasm_f32x4_splat(alpha);
  int i = 0;
  for (; i + 4 <= n; i += 4)
    wasm_v128_store(g + i, swiglu_clamped_f32x4(wasm_v128_load(g + i), wasm_v128_load(u + i), lim,
                                                al));
  for (; i < n; i++)
    g[i] = lane0(swiglu_clamped_f32x4(wasm_f32x4_splat(g[i]), wasm_f32x4_splat(u[i]), lim, al));
}

/** x[i] = 1 / (1 + e^-x[i]) in place. */
KEXPORT("sigmoid_f32")
void sigmoid_f32(float *x, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4) wasm_v128_store(x + i, sigmoid_f32x4(wasm_v128_load(x + i)));
  for (; i < n; i++) x[i] = lane0(sigmoid_f32x4(wasm_f32x4_splat(x[i])));
}

/** x[i] = e^x[i] in place (exposes math.h's exp for tests and the sampler). */
KEXPORT("exp_f32")
void exp_inplace_f32(float *x, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4) wasm_v128_store(x + i, exp_f32x4(wasm_v128_load(x + i)));
  for (; i < n; i++) x[i] = exp_f32(x[i]);
}

/** y[i] += x[i] (residual add). */
KEXPORT("add_f32")
void add_f32(float *y, const float *x, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4)
    wasm_v128_store(y + i, wasm_f32x4_add(wasm_v128_load(y + i), wasm_v128_load(x + i)));
  for (; i < n; i++) y[i] += x[i];
}

/** y[i] += a * x[i] (weighted expert sum). */
KEXPORT("axpy_f32")
void axpy_f32(float *y, const float *x, float a, int n) {
  v128_t av = wasm_f32x4_splat(a);
  int i = 0;
  for (; i + 4 <= n; i += 4)
    wasm_v128_store(y + i, wasm_f32x4_add(wasm_v128_load(y + i),
                                          wasm_f32x4_mul(av, wasm_v128_load(x + i))));
  for (; i < n; i++) y[i] += a * x[i];
}

/** y[i] *= a. */
KEXPORT("scale_f32")
void scale_f32(float *y, float a, int n) {
  v128_t av = wasm_f32x4_splat(a);
  int i = 0;
  for (; i + 4 <= n; i += 4) wasm_v128_store(y + i, wasm_f32x4_mul(wasm_v128_load(y + i), av));
  for (; i < n; i++) y[i] *= a;
}

/** dst[i] = src[i]; the regions may overlap (memory.copy has memmove semantics). */
KEXPORT("copy_f32")
void copy_f32(float *dst, const float *src, int n) {
  if (n > 0) __builtin_memmove(dst, src, (size_t)n * sizeof(float));
}

/** y[i] *= x[i] (a gate applied to a normalised output). */
KEXPORT("mul_f32")
void mul_f32(float *y, const float *x, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4)
    wasm_v128_store(y + i, wasm_f32x4_mul(wasm_v128_load(y + i), wasm_v128_load(x + i)));
  for (; i < n; i++) y[i] *= x[i];
}
