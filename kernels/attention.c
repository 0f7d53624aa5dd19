/*
 * Decode attention over a KV cache for heads h in [h0, h1) (the row range of the worker split).
 * Query head h reads kv head h / (n_heads / n_kv_heads) (grouped-query attention). Keys have
 * head_dim floats, values v_head_dim (they differ for MLA); key t of kv head g is at
 * kcache + t*k_stride + g*head_dim, value t at vcache + t*v_stride + g*v_head_dim (floats).
 *   s[t] = scale * dot(q_h, k_t),  p = softmax(s),  out[h*v_head_dim + d] = sum_t p[t] * v_t[d]
 * scores + h*T (floats) is scratch for head h, so heads never share scratch across workers.
 * The cache is a ring of `ring` slots (ring >= T): key t (t = 0 oldest .. T-1 newest) is in slot
 * (t0 + t) mod ring, so a sliding-window layer keeps only its window. A linear cache passes t0 = 0.
 * sinks (NULL for none) holds one logit per query head that joins the softmax denominator only
 * (gpt-oss). Values are summed oldest first whether or not the ring wraps.
 */
#include "dot.h"
#include "softmax.h"

/*
 * out[d] (+)= sum_t p[t] * v_t[d], summed in t order for every d (vector and scalar alike); with
 * acc the sum continues from out, so two calls over consecutive segments equal one call.
 */
static inline void weighted_value_sum(const float *p, const float *v, size_t v_stride, int T,
                                      int dim, float *out, int acc) {
  int d = 0;
  for (; d + 16 <= dim; d += 16) {
    v128_t o0 = wasm_f32x4_splat(0.0f), o1 = o0, o2 = o0, o3 = o0;
    if (acc) {
      o0 = wasm_v128_load(out + d);
      o1 = wasm_v128_load(out + d + 4);
      o2 = wasm_v128_load(out + d + 8);
      o3 = wasm_v128_load(out + d + 12);
    }
    for (int t = 0; t < T; t++) {
      const float *vt = v + (size_t)t * v_stride + d;
      v128_t pt = wasm_f32x4_splat(p[t]);
      o0 = wasm_f32x4_add(o0, wasm_f32x4_mul(pt, wasm_v128_load(vt)));
      o1 = wasm_f32x4_add(o1, wasm_f32x4_mul(pt, wasm_v128_load(vt + 4)));
      o2 = wasm_f32x4_add(o2, wasm_f32x4_mul(pt, wasm_v128_load(vt + 8)));
      o3 = wasm_f32x4_add(o3, wasm_f32x4_mul(pt, wasm_v128_load(vt + 12)));
    }
    wasm_v128_store(out + d, o0);
    wasm_v128_store(out + d + 4, o1);
    wasm_v128_store(out + d + 8, o2);
    wasm_v128_store(out + d + 12, o3);
  }
  for (; d + 4 <= dim; d += 4) {
    v128_t o = acc ? wasm_v128_load(out + d) : wasm_f32x4_splat(0.0f);
    for (int t = 0; t < T; t++)
      o = wasm_f32x4_add(o, wasm_f32x4_mul(wasm_f32x4_splat(p[t]),
                                           wasm_v128_load(v + (size_t)t * v_stride + d)));
    wasm_v128_store(out + d, o);
  }
  for (; d < dim; d++) {
    float o = acc ? out[d] : 0.0f;
    for (int t = 0; t < T; t++) o = o + p[t] * v[(size_t)t * v_stride + d];
    out[d] = o;
  }
}

/* s[t] = dot(k_t, q) for T consecutive keys k_stride floats apart. */
static inline void key_scores(const float *k, size_t k_stride, const float *q, int head_dim, int T,
                              float *s) {
  int t = 0;
  for (; t + 4 <= T; t += 4) dot4_f32(k + (size_t)t * k_stride, k_stride, q, head_dim, s + t, 1);
  for (; t < T; t++) s[t] = dot1_f32(k + (size_t)t * k_stride, q, head_dim);
}

KEXPORT("attention_f32")
void attention_f32(const float *q, const float *kcache, const float *vcache, float *out,
                   float *scores, int n_heads, int n_kv_heads, int head_dim, int v_head_dim,
                   int T, int k_stride, int v_stride, float scale, const float *sinks, int t0,
                   int ring, int h0, int h1) {
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || t0 < 0 || ring < T || t0 >= ring) return;
  int group = n_heads / n_kv_heads;
  /* The oldest keys run from slot t0 to the ring's end, the rest from slot 0. */
  int first = T < ring - t0 ? T : ring - t0;
  if (h1 > n_heads) h1 = n_heads;
  for (int h = h0 < 0 ? 0 : h0; h < h1; h++) {
    int g = h / group;
    const float *qh = q + (size_t)h * head_dim;
    const float *k = kcache + (size_t)g * head_dim;
    float *s = scores + (size_t)h * T;
    key_scores(k + (size_t)t0 * k_stride, k_stride, qh, head_dim, first, s);
    key_scores(k, k_stride, qh, head_dim, T - first, s + first);
    for (int t = 0; t < T; t++) s[t] *= scale;
    softmax_sink_inplace(s, T, sinks ? sinks[h] : -F32_INF);
    const float *v = vcache + (size_t)g * v_head_dim;
    float *oh = out + (size_t)h * v_head_dim;
    weighted_value_sum(s, v + (size_t)t0 * v_stride, v_stride, first, v_head_dim, oh, 0);
    if (T > first) weighted_value_sum(s + first, v, v_stride, T - first, v_head_dim, oh, 1);
  }
}
