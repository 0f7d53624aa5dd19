/*
 * In-place softmax shared by softmax_f32 and attention: p = exp(x - max) / sum, all in f32.
 * Special values: NaN anywhere -> every output NaN. +Inf anywhere -> every output NaN (Inf - Inf),
 * as in PyTorch. All entries -Inf (a fully masked row) -> uniform 1/n: the limit of equal logits
 * all tending to -Inf, and never NaN. n <= 0 does nothing.
 * softmax_sink_inplace adds one more logit `sink` to the denominator only (gpt-oss's attention
 * sinks): p = exp(x - m) / (sum + exp(sink - m)), m = max(max x, sink); with sink = -Inf it is
 * softmax_inplace bit for bit.
 */
#ifndef SLUICE_SOFTMAX_H
#define SLUICE_SOFTMAX_H

#include "math.h"

static inline void softmax_sink_inplace(float *x, int n, float sink) {
  if (n <= 0) return;
  v128_t mv = wasm_f32x4_splat(-F32_INF);
  int i = 0;
  for (; i + 4 <= n; i += 4) mv = wasm_f32x4_max(mv, wasm_v128_load(x + i));
  float m = hmax_f32x4(mv);
  for (; i < n; i++) m = __builtin_wasm_max_f32(m, x[i]);
  if (sink != -F32_INF) m = __builtin_wasm_max_f32(m, sink);
  if (m == -F32_INF) {
    float u = 1.0f / (float)n;
    for (i = 0; i < n; i++) x[i] = u;
    return;
  }
  v128_t m4 = wasm_f32x4_splat(m), sv = wasm_f32x4_splat(0.0f);
  for (i = 0; i + 4 <= n; i += 4) {
    v128_t e = exp_f32x4(wasm_f32x4_sub(wasm_v128_load(x + i), m4));
    wasm_v128_store(x + i, e);
    sv = wasm_f32x4_add(sv, e);
  }
  float s = hsum_f32x4(sv);
  for (; i < n; i++) {
    float e = exp_f32(x[i] - m);
    x[i] = e;
    s += e;
  }
  if (sink != -F32_INF) s += exp_f32(sink - m);
  v128_t s4 = wasm_f32x4_splat(s);
  for (i = 0; i + 4 <= n; i += 4) wasm_v128_store(x + i, wasm_f32x4_div(wasm_v128_load(x + i), s4));
  for (; i < n; i++) x[i] = x[i] / s;
}

static inline void softmax_inplace(float *x, int n) { softmax_sink_inplace(x, n, -F32_INF); }

#endif
