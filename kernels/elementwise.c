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
 * silu_mul_f32 on elements [r0, r1) of n, a pool job's share (the bits of each element do not
 * depend on where a call starts).
 */
KEXPORT("silu_mul_range_f32")
void silu_mul_range_f32(float *g, const float *u, int n, int r0, int r1) {
  if (r1 > n) r1 = n;
  if (r0 < 0) r0 = 0;
  if (r0 < r1) silu_mul_f32(g + r0, u + r0, r1 - r0);
}

/*
 * PyTorch's tanh GELU times the up projection (Gemma's GeGLU):
 * 0.5 · g · (1 + tanh(sqrt(2/pi) · (g + 0.044715 · g³))) · u. For |g| past ~1e13, g³ is ±Inf and
 * tanh ±1, which gives g or −0 as the exact GELU does.
 */
static inline v128_t gelu_tanh_f32x4(v128_t g) {
  v128_t g3 = wasm_f32x4_mul(wasm_f32x4_mul(g, g), g);
  v128_t inner = wasm_f32x4_mul(wasm_f32x4_splat(0.7978845608028654f),
                                wasm_f32x4_add(g, wasm_f32x4_mul(wasm_f32x4_splat(0.044715f), g3)));
  v128_t t = wasm_f32x4_add(wasm_f32x4_splat(1.0f), tanh_f32x4(inner));
  return wasm_f32x4_mul(wasm_f32x4_mul(wasm_f32x4_splat(0.5f), g), t);
}

/** g[i] = gelu_tanh(g[i]) * u[i]. */
KEXPORT("gelu_tanh_mul_f32")
void gelu_tanh_mul_f32(float *g, const float *u, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4)
    wasm_v128_store(g + i, wasm_f32x4_mul(gelu_tanh_f32x4(wasm_v128_load(g + i)),
                                          wasm_v128_load(u + i)));
  for (; i < n; i++) g[i] = lane0(wasm_f32x4_mul(gelu_tanh_f32x4(wasm_f32x4_splat(g[i])),
                                                 wasm_f32x4_splat(u[i])));
}

static inline v128_t softcap_f32x4(v128_t x, v128_t c) {
  return wasm_f32x4_mul(c, tanh_f32x4(wasm_f32x4_div(x, c)));
}

/** x[i] = cap · tanh(x[i] / cap) in place (a soft cap on logits; ±Inf go to ±cap). */
KEXPORT("softcap_f32")
void softcap_f32(float *x, int n, float cap) {
  v128_t c = wasm_f32x4_splat(cap);
  int i = 0;
  for (; i + 4 <= n; i += 4)
    wasm_v128_store(x + i, softcap_f32x4(wasm_v128_load(x + i), c));
  for (; i < n; i++) x[i] = lane0(softcap_f32x4(wasm_f32x4_splat(x[i]), c));
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
