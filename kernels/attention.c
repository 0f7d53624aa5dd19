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
 * out = o / (l + e^(sink−m)), where every e^x below x = −87 is taken as 0 (weight_f32x4). A
 * query's tiles and their arithmetic depend only on its own position, window and the tile size, so
 * its result is the same bit for bit whether it runs alone (decode) or with other tokens of a
 * prefill chunk, and whatever heads a worker was given. Tiles run outermost, then kv heads, so one
 * kv head's keys and values of a tile stay in cache while every token and query head of it reads
 * them; two query heads of a kv head share each key and value load (a head's sums are formed in
 * the same order either way, so a lone head, as the last of an odd group or of a worker's share,
 * gets the same bits).
 * sinks (NULL for none) holds one logit per query head that joins the denominator only (gpt-oss).
 * A query whose scores are all −∞ gets NaN (no key carries weight); NaN or +∞ scores give NaN.
 * [h0, h1) are rows of row_heads query heads (1: heads h0 .. h1 − 1).
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

/*
 * Scores of four keys against H (1 or 2) query heads, each (key, head) sum formed in dot.h's
 * order: pass a over the columns [c, c+4) of every group of 8 (and a last group of 4), pass b over
 * [c+4, c+8) and the zero-padded last 1-3 columns, then hsum(a + b), the four keys' hsums taken
 * together (same adds, same operand order as hsum_f32x4). So a score equals dot1_f32(k, q) bit for
 * bit whatever heads and keys share its tile; the tile loads 4 + H vectors per 4·H multiply-adds
 * where dot4 loads 5 per 4. Head j's four scores land in s[j][0..3].
 */
#define SCORE_STEP(acc, c)                                                                    \
  do {                                                                                        \
    v128_t k0_ = wasm_v128_load(k0 + (c)), k1_ = wasm_v128_load(k1 + (c));                    \
    v128_t k2_ = wasm_v128_load(k2 + (c)), k3_ = wasm_v128_load(k3 + (c));                    \
    for (int j = 0; j < H; j++) {                                                             \
      v128_t x_ = wasm_v128_load(q[j] + (c));                                                 \
      acc[j][0] = MADD(k0_, x_, acc[j][0]);                                                   \
      acc[j][1] = MADD(k1_, x_, acc[j][1]);                                                   \
      acc[j][2] = MADD(k2_, x_, acc[j][2]);                                                   \
      acc[j][3] = MADD(k3_, x_, acc[j][3]);                                                   \
    }                                                                                         \
  } while (0)

static inline __attribute__((always_inline)) void score_tile4(int H, const float *k0,
                                                              const float *k1, const float *k2,
                                                              const float *k3,
                                                              const float *const *q, int hd,
                                                              float *const *s) {
  v128_t a[2][4], b[2][4];
  for (int j = 0; j < H; j++)
    for (int i = 0; i < 4; i++) a[j][i] = b[j][i] = wasm_f32x4_splat(0.0f);
  int c = 0;
  for (; c + 8 <= hd; c += 8) SCORE_STEP(a, c);
  if (c + 4 <= hd) SCORE_STEP(a, c);
  for (c = 0; c + 8 <= hd; c += 8) SCORE_STEP(b, c + 4);
  c = hd & ~3;
  if (c < hd) {
    int m = hd - c;
    v128_t t0 = load_tail_f32(k0 + c, m), t1 = load_tail_f32(k1 + c, m);
    v128_t t2 = load_tail_f32(k2 + c, m), t3 = load_tail_f32(k3 + c, m);
    for (int j = 0; j < H; j++) {
      v128_t x = load_tail_f32(q[j] + c, m);
      b[j][0] = MADD(t0, x, b[j][0]);
      b[j][1] = MADD(t1, x, b[j][1]);
      b[j][2] = MADD(t2, x, b[j][2]);
      b[j][3] = MADD(t3, x, b[j][3]);
    }
  }
  for (int j = 0; j < H; j++) {
    v128_t v0 = wasm_f32x4_add(a[j][0], b[j][0]), v1 = wasm_f32x4_add(a[j][1], b[j][1]);
    v128_t v2 = wasm_f32x4_add(a[j][2], b[j][2]), v3 = wasm_f32x4_add(a[j][3], b[j][3]);
    /* Lanes (v0 + v2, v1 + v3) of keys 0 and 1, then of keys 2 and 3. */
    v128_t p01 = wasm_f32x4_add(wasm_i32x4_shuffle(v0, v1, 0, 1, 4, 5),
                                wasm_i32x4_shuffle(v0, v1, 2, 3, 6, 7));
    v128_t p23 = wasm_f32x4_add(wasm_i32x4_shuffle(v2, v3, 0, 1, 4, 5),
                                wasm_i32x4_shuffle(v2, v3, 2, 3, 6, 7));
    wasm_v128_store(s[j], wasm_f32x4_add(wasm_i32x4_shuffle(p01, p23, 0, 2, 4, 6),
                                         wasm_i32x4_shuffle(p01, p23, 1, 3, 5, 7)));
  }
}
#undef SCORE_STEP

/*
 * Raw scores of the n keys of one tile (slots a .. a + first − 1, then 0 ..: a ring's wrap)
 * against the H query heads at q[j], head j's into s[j]; rounded up to 4 keys, the last ones
 * repeated (their scores land in the padding, which tile_weights overwrites).
 */
static inline __attribute__((always_inline)) void tile_scores(int H, const float *kc, int n,
                                                              int a, int first, size_t k_stride,
                                                              const float *const *q, int hd,
                                                              float *const *s) {
#define KEY(t) (kc + (size_t)((t) < n ? ((t) < first ? a + (t) : (t) - first)                 \
                                      : (n - 1 < first ? a + n - 1 : n - 1 - first)) * k_stride)
  for (int t = 0; t < n; t += 4) {
    float *st[2] = {s[0] + t, H > 1 ? s[1] + t : 0};
    score_tile4(H, KEY(t), KEY(t + 1), KEY(t + 2), KEY(t + 3), q, hd, st);
  }
#undef KEY
}

/*
 * e^x as every weight of the kernel (keys, the rescale factor, a sink) takes it, for x <= 0 (a
 * score less the running max): 0 below x = −87, where e^x would be subnormal (below 2^−126 ≈
 * e^−87.3) or 0, so no subnormal is ever formed (arithmetic on them takes microcode assists on x86:
 * peaked scores made the kernel 1.6–2.4× slower with them). In [−87, 0] the exponent n = round(x /
 * ln 2) is in [−126, 0], so one normal power of two scales the result, and e^r on |r| <= ln 2 / 2
 * is 1 + r + r²·P(r) with Cephes expf's degree-5 coefficients (within 1 ulp of e^x on 2 million
 * points of [−87, 0], emulated op by op), 5% faster for the kernel than exp_f32x4's general form.
 * NaN stays NaN.
 */
static inline v128_t weight_f32x4(v128_t x) {
  v128_t lim = wasm_f32x4_splat(-87.0f), xc = wasm_f32x4_max(x, lim);
  v128_t n = wasm_f32x4_nearest(wasm_f32x4_mul(xc, wasm_f32x4_splat(1.44269504088896341f)));
  v128_t r = wasm_f32x4_sub(xc, wasm_f32x4_mul(n, wasm_f32x4_splat(0.693145751953125f)));
  r = wasm_f32x4_sub(r, wasm_f32x4_mul(n, wasm_f32x4_splat(1.428606765330187e-06f)));
  v128_t p = wasm_f32x4_splat(1.9875691500e-4f);
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(1.3981999507e-3f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(8.3334519073e-3f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(4.1665795894e-2f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(1.6666665459e-1f));
  p = wasm_f32x4_add(wasm_f32x4_mul(p, r), wasm_f32x4_splat(5.0000001201e-1f));
  p = wasm_f32x4_add(wasm_f32x4_add(wasm_f32x4_mul(p, wasm_f32x4_mul(r, r)), r),
                     wasm_f32x4_splat(1.0f));
  v128_t sc =
      wasm_i32x4_shl(wasm_i32x4_add(wasm_i32x4_trunc_sat_f32x4(n), wasm_i32x4_splat(127)), 23);
  return wasm_v128_andnot(wasm_f32x4_mul(p, sc), wasm_f32x4_lt(x, lim));
}

/*
 * One query head's raw scores s[0 .. n) of one tile (padded to a multiple of 4) turned into the
 * weights e^(s·scale − m'), its running max *m and sum *l updated; returns e^(m − m'), the factor
 * the output is rescaled by.
 */
static inline float tile_weights(int n, float scale, float *s, float *m, float *l) {
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
  float alpha = lane0(weight_f32x4(wasm_f32x4_splat(*m - mref)));
  v128_t m4 = wasm_f32x4_splat(mref), sum = wasm_f32x4_splat(0.0f);
  for (int t = 0; t < n4; t += 4) {
    v128_t e = weight_f32x4(wasm_f32x4_sub(wasm_v128_load(s + t), m4));
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
                   int row_heads, int h0, int h1) {
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || n_tok <= 0 || pos0 < 0 || window < 0 ||
      slots < 0 || tile <= 0 || row_heads <= 0 || n_heads % row_heads != 0)
    return;
  /* [h0, h1) counts rows of row_heads heads: the pool splits rows, and rows of whole kv heads
   * leave each kv head's keys and values to one thread. */
  if (h1 > n_heads / row_heads) h1 = n_heads / row_heads;
  h0 *= row_heads;
  h1 *= row_heads;
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
    /* One kv head at a time: its tile of keys and values stays in cache for every token. */
    for (int hs = h0; hs < h1;) {
      int g = hs / group, he = (g + 1) * group < h1 ? (g + 1) * group : h1;
      const float *kg = kcache + (size_t)g * head_dim, *vg = vcache + (size_t)g * v_head_dim;
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
        for (int h = hs; h < he; h++) {
          float *sh = scratch + (size_t)h * per_head, *oh = oi + (size_t)h * v_head_dim;
          const float *qh[2] = {qi + (size_t)h * head_dim, qi + (size_t)(h + 1) * head_dim};
          float *sp[2] = {sh, sh + per_head};
          if (h + 1 < he) {
            /* Two heads of the kv head share each load of the keys and of the values. */
            tile_scores(2, kg, n, a, first, k_stride, qh, head_dim, sp);
            float alpha = tile_weights(n, scale, sh, sh + tile4 + i, sh + tile4 + n_tok + i);
            float *sh2 = sp[1], *oh2 = oh + v_head_dim;
            float alpha2 = tile_weights(n, scale, sh2, sh2 + tile4 + i, sh2 + tile4 + n_tok + i);
            weighted_value_sum2(sh, sh2, vg + (size_t)a * v_stride, v_stride, first, v_head_dim,
                                oh, oh2, alpha, alpha2);
            if (n > first)
              weighted_value_sum2(sh + first, sh2 + first, vg, v_stride, n - first, v_head_dim,
                                  oh, oh2, 1.0f, 1.0f);
            h++;
            continue;
          }
          tile_scores(1, kg, n, a, first, k_stride, qh, head_dim, sp);
          float alpha = tile_weights(n, scale, sh, sh + tile4 + i, sh + tile4 + n_tok + i);
          weighted_value_sum(sh, vg + (size_t)a * v_stride, v_stride, first, v_head_dim, oh,
                             alpha);
          if (n > first)
            weighted_value_sum(sh + first, vg, v_stride, n - first, v_head_dim, oh, 1.0f);
        }
      }
      hs = he;
    }
  }
  for (int h = h0; h < h1; h++) {
    float *ms = scratch + (size_t)h * per_head + tile4, *ls = ms + n_tok;
    for (int i = 0; i < n_tok; i++) {
      float m = ms[i] == -F32_INF ? 0.0f : ms[i];
      float l = ls[i] + (sinks ? lane0(weight_f32x4(wasm_f32x4_splat(sinks[h] - m))) : 0.0f);
      float *o = out + (size_t)i * out_stride + (size_t)h * v_head_dim;
      for (int d = 0; d < v_head_dim; d++) o[d] = o[d] / l;
    }
  }
}
