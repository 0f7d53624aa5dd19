/*
 * Causal attention over a KV cache in key tiles with an online softmax (flash-attention style), so
 * no score row ever grows with the context: the scratch is a tile of scores per head.
 *
 * Query token i of a call sits at position p = pos0 + i and attends to positions s .. p, s = 0, or
 * max(0, p − window + 1) on a sliding-window layer. Position x's key is in slot x (a linear cache,
 * slots = 0) or x mod slots (a ring). Query head h reads kv head h / (n_heads / n_kv_heads)
 * (grouped-query attention); keys have head_dim floats, values v_head_dim (they differ for MLA):
 * key of slot t, kv head g at kcache + t*k_stride + g*head_dim, value at vcache + t*v_stride +
 * g*v_head_dim (floats). Token i's query h is at q + i*q_stride + h*head_dim, its output at
 * out + i*out_stride + h*v_head_dim.
 *
 * The keys are cut into tiles at multiples of `tile` positions. Per query and tile, in position
 * order: s_x = dot(q, k_x)·scale; m' = max(m, max s); o = o·e^(m−m') + Σ_x e^(s_x−m')·v_x;
 * l = l·e^(m−m') + Σ e^(s_x−m'), starting from m = sink (or −∞), l = 0, o = 0; finally
 * out = o / (l + e^(sink−m)). A query's tiles and their
 * arithmetic depend only on its own position, window and the tile size, so its result is the same
 * bit for bit whether it runs alone (decode) or with other tokens of a prefill chunk, and whatever
 * heads a worker was given. Tiles run outermost so the K and V rows of a tile stay in cache while
 * every token and head of the call reads them.
 * sinks (NULL for none) holds one logit per query head that joins the denominator only (gpt-oss).
 * A query whose scores are all −∞ gets NaN (no key carries weight); NaN or +∞ scores give NaN.
 * scratch: per query head h, at scratch + h*(tile4 + 2*n_tok) floats (tile4 = tile rounded up to
 * 4): the tile's scores, then the running max and sum of each token; heads never share scratch, so
 * workers given disjoint heads never collide.
 */
#include "dot.h"
#include "math.h"

/*
 * out[d] = out[d]·alpha, then out[d] = p[t]·v_t[d] + out[d] (relaxed madd, as the dots) for t in
 * order, for every d; alpha = 1 continues a sum exactly, so two calls over consecutive segments
 * equal one. weighted_value_sum2 does the same for two heads of one kv head, sharing each load of
 * v; a head's lanes see the same operations in either, so pairing never changes a result.
 */
static inline void weighted_value_sum(const float *p, const float *v, size_t v_stride, int T,
                                      int dim, float *out, float alpha) {
  v128_t a4 = wasm_f32x4_splat(alpha);
  int d = 0;
  for (; d + 16 <= dim; d += 16) {
    v128_t o0 = wasm_f32x4_mul(wasm_v128_load(out + d), a4);
    v128_t o1 = wasm_f32x4_mul(wasm_v128_load(out + d + 4), a4);
    v128_t o2 = wasm_f32x4_mul(wasm_v128_load(out + d + 8), a4);
    v128_t o3 = wasm_f32x4_mul(wasm_v128_load(out + d + 12), a4);
    for (int t = 0; t < T; t++) {
      const float *vt = v + (size_t)t * v_stride + d;
      v128_t pt = wasm_f32x4_splat(p[t]);
      o0 = MADD(pt, wasm_v128_load(vt), o0);
      o1 = MADD(pt, wasm_v128_load(vt + 4), o1);
      o2 = MADD(pt, wasm_v128_load(vt + 8), o2);
      o3 = MADD(pt, wasm_v128_load(vt + 12), o3);
    }
    wasm_v128_store(out + d, o0);
    wasm_v128_store(out + d + 4, o1);
    wasm_v128_store(out + d + 8, o2);
    wasm_v128_store(out + d + 12, o3);
  }
  for (; d + 4 <= dim; d += 4) {
    v128_t o = wasm_f32x4_mul(wasm_v128_load(out + d), a4);
    for (int t = 0; t < T; t++)
      o = MADD(wasm_f32x4_splat(p[t]), wasm_v128_load(v + (size_t)t * v_stride + d), o);
    wasm_v128_store(out + d, o);
  }
  /* The last 1-3 dims run as lane 0 of a vector, so they see the same madd as the rest. */
  for (; d < dim; d++) {
    v128_t o = wasm_f32x4_mul(wasm_f32x4_splat(out[d]), a4);
    for (int t = 0; t < T; t++)
      o = MADD(wasm_f32x4_splat(p[t]), wasm_f32x4_splat(v[(size_t)t * v_stride + d]), o);
    out[d] = lane0(o);
  }
}

static inline void weighted_value_sum2(const float *pa, const float *pb, const float *v,
                                       size_t v_stride, int T, int dim, float *oa, float *ob,
                                       float alpha_a, float alpha_b) {
  v128_t aa = wasm_f32x4_splat(alpha_a), ab = wasm_f32x4_splat(alpha_b);
  int d = 0;
  for (; d + 16 <= dim; d += 16) {
    v128_t a0 = wasm_f32x4_mul(wasm_v128_load(oa + d), aa);
    v128_t a1 = wasm_f32x4_mul(wasm_v128_load(oa + d + 4), aa);
    v128_t a2 = wasm_f32x4_mul(wasm_v128_load(oa + d + 8), aa);
    v128_t a3 = wasm_f32x4_mul(wasm_v128_load(oa + d + 12), aa);
    v128_t b0 = wasm_f32x4_mul(wasm_v128_load(ob + d), ab);
    v128_t b1 = wasm_f32x4_mul(wasm_v128_load(ob + d + 4), ab);
    v128_t b2 = wasm_f32x4_mul(wasm_v128_load(ob + d + 8), ab);
    v128_t b3 = wasm_f32x4_mul(wasm_v128_load(ob + d + 12), ab);
    for (int t = 0; t < T; t++) {
      const float *vt = v + (size_t)t * v_stride + d;
      v128_t x = wasm_f32x4_splat(pa[t]), y = wasm_f32x4_splat(pb[t]);
      v128_t v0 = wasm_v128_load(vt), v1 = wasm_v128_load(vt + 4);
      a0 = MADD(x, v0, a0);
      b0 = MADD(y, v0, b0);
      a1 = MADD(x, v1, a1);
      b1 = MADD(y, v1, b1);
      v128_t v2 = wasm_v128_load(vt + 8), v3 = wasm_v128_load(vt + 12);
      a2 = MADD(x, v2, a2);
      b2 = MADD(y, v2, b2);
      a3 = MADD(x, v3, a3);
      b3 = MADD(y, v3, b3);
    }
    wasm_v128_store(oa + d, a0);
    wasm_v128_store(oa + d + 4, a1);
    wasm_v128_store(oa + d + 8, a2);
    wasm_v128_store(oa + d + 12, a3);
    wasm_v128_store(ob + d, b0);
    wasm_v128_store(ob + d + 4, b1);
    wasm_v128_store(ob + d + 8, b2);
    wasm_v128_store(ob + d + 12, b3);
  }
  /* The rest of the dims (fewer than 16) one head at a time, as weighted_value_sum does them. */
  if (d < dim) {
    weighted_value_sum(pa, v + d, v_stride, T, dim - d, oa + d, alpha_a);
    weighted_value_sum(pb, v + d, v_stride, T, dim - d, ob + d, alpha_b);
  }
}

/* s[t] = dot(k_t, q) for T consecutive keys k_stride floats apart (dot4 and dot1 agree per key). */
static inline void key_scores(const float *k, size_t k_stride, const float *q, int head_dim, int T,
                              float *s) {
  int t = 0;
  for (; t + 4 <= T; t += 4) dot4_f32(k + (size_t)t * k_stride, k_stride, q, head_dim, s + t, 1);
  for (; t < T; t++) s[t] = dot1_f32(k + (size_t)t * k_stride, q, head_dim);
}

/*
 * One query head over positions x0 .. x0 + n − 1 (one tile's share), whose keys start at slot a
 * and run `first` slots before the ring wraps to slot 0: the weights e^(s − m') into s (padded to
 * a multiple of 4), the running max *m and sum *l updated; returns e^(m − m'), the factor the
 * output is rescaled by.
 */
static inline float tile_weights(const float *qh, const float *k, int n, int a, int first,
                                 size_t k_stride, int head_dim, float scale, float *s, float *m,
                                 float *l) {
  key_scores(k + (size_t)a * k_stride, k_stride, qh, head_dim, first, s);
  key_scores(k, k_stride, qh, head_dim, n - first, s + first);
  int n4 = (n + 3) & ~3;
  for (int t = n; t < n4; t++) s[t] = -F32_INF;
  v128_t sc = wasm_f32x4_splat(scale), mv = wasm_f32x4_splat(*m);
  for (int t = 0; t < n4; t += 4) {
    v128_t x = wasm_f32x4_mul(wasm_v128_load(s + t), sc);
    wasm_v128_store(s + t, x);
    mv = wasm_f32x4_max(mv, x);
  }
  float mnew = hmax_f32x4(mv);
  /* All −∞ so far: exponents relative to 0 keep e^(−∞ − m) = 0 instead of NaN. */
  float mref = mnew == -F32_INF ? 0.0f : mnew;
  float alpha = exp_f32(*m - mref);
  v128_t m4 = wasm_f32x4_splat(mref), sum = wasm_f32x4_splat(0.0f);
  for (int t = 0; t < n4; t += 4) {
    v128_t e = exp_f32x4(wasm_f32x4_sub(wasm_v128_load(s + t), m4));
    wasm_v128_store(s + t, e);
    sum = wasm_f32x4_add(sum, e);
  }
  *l = *l * alpha + hsum_f32x4(sum);
  *m = mnew;
  return alpha;
}

KEXPORT("attention_f32")
void attention_f32(const float *q, int q_stride, const float *kcache, const float *vcache,
                   float *out, int out_stride, int n_tok, int pos0, int window, int slots,
                   int n_heads, int n_kv_heads, int head_dim, int v_head_dim, int k_stride,
                   int v_stride, float scale, const float *sinks, int tile, float *scratch,
                   int h0, int h1) {
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || n_tok <= 0 || pos0 < 0 || window < 0 ||
      slots < 0 || tile <= 0)
    return;
  int group = n_heads / n_kv_heads, tile4 = (tile + 3) & ~3, per_head = tile4 + 2 * n_tok;
  int last = pos0 + n_tok - 1;
  int lo = window > 0 && pos0 - window + 1 > 0 ? pos0 - window + 1 : 0;
  /* A ring must hold every key a query reads: the last token reads the most. */
  int widest = last - (window > 0 && last - window + 1 > 0 ? last - window + 1 : 0) + 1;
  if (slots > 0 && widest > slots) return;
  if (h0 < 0) h0 = 0;
  if (h1 > n_heads) h1 = n_heads;
  for (int h = h0; h < h1; h++) {
    float *ms = scratch + (size_t)h * per_head + tile4, *ls = ms + n_tok;
    for (int i = 0; i < n_tok; i++) {
      ms[i] = sinks ? sinks[h] : -F32_INF;
      ls[i] = 0.0f;
      float *o = out + (size_t)i * out_stride + (size_t)h * v_head_dim;
      for (int d = 0; d < v_head_dim; d++) o[d] = 0.0f;
    }
  }
  for (int x = lo - lo % tile; x <= last; x += tile) {
    for (int i = 0; i < n_tok; i++) {
      int p = pos0 + i;
      int s = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
      int x0 = x > s ? x : s, x1 = x + tile - 1 < p ? x + tile - 1 : p;
      if (x0 > x1) continue;
      int n = x1 - x0 + 1;
      /* A ring wraps at most once inside a tile: slots [a, slots) then [0, ...). */
      int a = slots > 0 ? x0 % slots : x0;
      int first = slots > 0 && a + n > slots ? slots - a : n;
      const float *qi = q + (size_t)i * q_stride;
      float *oi = out + (size_t)i * out_stride;
      for (int h = h0; h < h1; h++) {
        int g = h / group;
        const float *kg = kcache + (size_t)g * head_dim, *vg = vcache + (size_t)g * v_head_dim;
        float *sh = scratch + (size_t)h * per_head;
        float alpha = tile_weights(qi + (size_t)h * head_dim, kg, n, a, first, k_stride, head_dim,
                                   scale, sh, sh + tile4 + i, sh + tile4 + n_tok + i);
        float *oh = oi + (size_t)h * v_head_dim;
        if (h + 1 < h1 && (h + 1) / group == g) {
          /* The next head reads the same kv head: both share each load of the values. */
          float *sh2 = sh + per_head, *oh2 = oh + v_head_dim;
          float alpha2 =
              tile_weights(qi + (size_t)(h + 1) * head_dim, kg, n, a, first, k_stride, head_dim,
                           scale, sh2, sh2 + tile4 + i, sh2 + tile4 + n_tok + i);
          weighted_value_sum2(sh, sh2, vg + (size_t)a * v_stride, v_stride, first, v_head_dim, oh,
                              oh2, alpha, alpha2);
          if (n > first)
            weighted_value_sum2(sh + first, sh2 + first, vg, v_stride, n - first, v_head_dim, oh,
                                oh2, 1.0f, 1.0f);
          h++;
          continue;
        }
        weighted_value_sum(sh, vg + (size_t)a * v_stride, v_stride, first, v_head_dim, oh, alpha);
        if (n > first) weighted_value_sum(sh + first, vg, v_stride, n - first, v_head_dim, oh, 1.0f);
      }
    }
  }
  for (int h = h0; h < h1; h++) {
    float *ms = scratch + (size_t)h * per_head + tile4, *ls = ms + n_tok;
    for (int i = 0; i < n_tok; i++) {
      float m = ms[i] == -F32_INF ? 0.0f : ms[i];
      float l = ls[i] + (sinks ? exp_f32(sinks[h] - m) : 0.0f);
      float *o = out + (size_t)i * out_stride + (size_t)h * v_head_dim;
      for (int d = 0; d < v_head_dim; d++) o[d] = o[d] / l;
    }
  }
}
