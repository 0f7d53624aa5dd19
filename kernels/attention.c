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
 * equal one.
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

/*
 * The value sums of H (1..3) heads of one kv head, p[h] their weights, o[h] their outputs and
 * alpha[h] their rescale factors, sharing each load of v (16 dims: H·4 accumulators and 4 value
 * vectors live); the dims after the last block of 16 go head by head through weighted_value_sum.
 * A head's lanes see weighted_value_sum's operations, so grouping never changes a result.
 */
static inline __attribute__((always_inline)) void value_sums(int H, const float *const *p,
                                                             const float *v, size_t v_stride,
                                                             int T, int dim, float *const *o,
                                                             const float *alpha) {
  int d = 0;
  for (; d + 16 <= dim; d += 16) {
    v128_t acc[3][4];
    for (int h = 0; h < H; h++) {
      v128_t a4 = wasm_f32x4_splat(alpha[h]);
      for (int j = 0; j < 4; j++) acc[h][j] = wasm_f32x4_mul(wasm_v128_load(o[h] + d + 4 * j), a4);
    }
    for (int t = 0; t < T; t++) {
      const float *vt = v + (size_t)t * v_stride + d;
      v128_t v0 = wasm_v128_load(vt), v1 = wasm_v128_load(vt + 4);
      v128_t v2 = wasm_v128_load(vt + 8), v3 = wasm_v128_load(vt + 12);
      for (int h = 0; h < H; h++) {
        v128_t x = wasm_v128_load32_splat(p[h] + t);
        acc[h][0] = MADD(x, v0, acc[h][0]);
        acc[h][1] = MADD(x, v1, acc[h][1]);
        acc[h][2] = MADD(x, v2, acc[h][2]);
        acc[h][3] = MADD(x, v3, acc[h][3]);
      }
    }
    for (int h = 0; h < H; h++)
      for (int j = 0; j < 4; j++) wasm_v128_store(o[h] + d + 4 * j, acc[h][j]);
  }
  if (d < dim)
    for (int h = 0; h < H; h++)
      weighted_value_sum(p[h], v + d, v_stride, T, dim - d, o[h] + d, alpha[h]);
}

/*
 * Scores of the R keys k[i] against C query heads at q + j*head_dim (j < C), into s[j*ss + i]:
 * the GEMM's register tile (kernels/gemm.c), keys as the rows. Each (key, head) sum runs in
 * dot.h's order, as the pass a and pass b chains, so a score is dot1_f32(k, q) bit for bit
 * whatever keys and heads share its tile. Per step R key vectors and C query vectors are loaded
 * for R·C multiply-adds, where a row dot loads 2 (dot1) or 1.25 (dot4) per multiply-add.
 */
#define SCORE_STEP(acc, c, R, C)                                                           \
  do {                                                                                     \
    v128_t w[R];                                                                           \
    for (int i = 0; i < R; i++) w[i] = wasm_v128_load(k[i] + (c));                         \
    for (int j = 0; j < C; j++) {                                                          \
      v128_t xv = wasm_v128_load(q + j * (size_t)hd + (c));                                \
      for (int i = 0; i < R; i++) acc[i][j] = MADD(w[i], xv, acc[i][j]);                   \
    }                                                                                      \
  } while (0)

#define DEFINE_SCORE_TILE(R, C)                                                            \
  static inline __attribute__((always_inline)) void score_tile_##R##x##C(                 \
      const float *const *k, const float *q, int hd, float *s, size_t ss) {                \
    v128_t a[R][C], b[R][C];                                                               \
    for (int i = 0; i < R; i++)                                                            \
      for (int j = 0; j < C; j++) a[i][j] = b[i][j] = wasm_f32x4_splat(0.0f);              \
    int c = 0;                                                                             \
    for (; c + 8 <= hd; c += 8) SCORE_STEP(a, c, R, C);                                    \
    if (c + 4 <= hd) SCORE_STEP(a, c, R, C);                                               \
    for (c = 0; c + 8 <= hd; c += 8) SCORE_STEP(b, c + 4, R, C);                           \
    c = hd & ~3;                                                                           \
    if (c < hd) {                                                                          \
      int m = hd - c;                                                                      \
      v128_t w[R];                                                                         \
      for (int i = 0; i < R; i++) w[i] = load_tail_f32(k[i] + c, m);                       \
      for (int j = 0; j < C; j++) {                                                        \
        v128_t xv = load_tail_f32(q + j * (size_t)hd + c, m);                              \
        for (int i = 0; i < R; i++) b[i][j] = MADD(w[i], xv, b[i][j]);                     \
      }                                                                                    \
    }                                                                                      \
    for (int j = 0; j < C; j++)                                                            \
      for (int i = 0; i < R; i++) s[j * ss + i] = hsum_f32x4(wasm_f32x4_add(a[i][j], b[i][j])); \
  }

DEFINE_SCORE_TILE(2, 1)
DEFINE_SCORE_TILE(2, 2)
DEFINE_SCORE_TILE(2, 3)
DEFINE_SCORE_TILE(2, 4)
DEFINE_SCORE_TILE(2, 5)
DEFINE_SCORE_TILE(2, 6)
DEFINE_SCORE_TILE(4, 1)
DEFINE_SCORE_TILE(4, 2)
DEFINE_SCORE_TILE(4, 3)

/*
 * Raw scores of n keys (slots a .. a + first − 1, then 0 ..: a ring's wrap) against the C heads at
 * q, head j's into s + j*ss. Up to 3 heads take keys four at a time (four key streams: a decode
 * query reads its keys from memory, and 2-key tiles of 4 heads ran its attention 10–20% slower
 * than the per-head 4-key dots before them), then two at a time; an odd last key is paired with
 * itself, its copy landing in the padding slot s[n] (n < the tile rounded up to 4), which
 * tile_weights fills. Tiles of 3 keys × 4 heads and 3 × 5 were no faster (docs/LEARNED.md).
 */
static inline void tile_scores(const float *kc, int n, int a, int first, size_t k_stride,
                               const float *q, int hd, int C, float *s, size_t ss) {
#define KEY(t) (kc + (size_t)((t) < first ? a + (t) : (t) - first) * k_stride)
  int t = 0;
  if (C <= 3)
    for (; t + 4 <= n; t += 4) {
      const float *k[4] = {KEY(t), KEY(t + 1), KEY(t + 2), KEY(t + 3)};
      if (C == 3) score_tile_4x3(k, q, hd, s + t, ss);
      else if (C == 2) score_tile_4x2(k, q, hd, s + t, ss);
      else score_tile_4x1(k, q, hd, s + t, ss);
    }
  for (; t < n; t += 2) {
    const float *k[2] = {KEY(t), KEY(t + 1 < n ? t + 1 : t)};
    switch (C) {
      case 6: score_tile_2x6(k, q, hd, s + t, ss); break;
      case 5: score_tile_2x5(k, q, hd, s + t, ss); break;
      case 4: score_tile_2x4(k, q, hd, s + t, ss); break;
      case 3: score_tile_2x3(k, q, hd, s + t, ss); break;
      case 2: score_tile_2x2(k, q, hd, s + t, ss); break;
      default: score_tile_2x1(k, q, hd, s + t, ss); break;
    }
  }
#undef KEY
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
      /* The heads of one kv head at a time: they share every key and value load. */
      for (int hs = h0; hs < h1;) {
        int g = hs / group, he = (g + 1) * group < h1 ? (g + 1) * group : h1;
        const float *kg = kcache + (size_t)g * head_dim, *vg = vcache + (size_t)g * v_head_dim;
        /* Heads in threes (4 as 2 + 2): scores, weights, then the value sums on their weights. */
        for (int h = hs; h < he;) {
          int c = he - h > 3 ? (he - h == 4 ? 2 : 3) : he - h;
          tile_scores(kg, n, a, first, k_stride, qi + (size_t)h * head_dim, head_dim, c,
                      scratch + (size_t)h * per_head, per_head);
          float alpha[3], one[3] = {1.0f, 1.0f, 1.0f}, *o[3];
          const float *p[3], *p2[3];
          for (int j = 0; j < c; j++) {
            float *sh = scratch + (size_t)(h + j) * per_head;
            alpha[j] = tile_weights(n, scale, sh, sh + tile4 + i, sh + tile4 + n_tok + i);
            p[j] = sh;
            p2[j] = sh + first;
            o[j] = oi + (size_t)(h + j) * v_head_dim;
          }
          const float *va = vg + (size_t)a * v_stride;
          /* The tile's keys before a ring's wrap, then those after it (alpha 1 continues). */
          switch (c) {
            case 3:
              value_sums(3, p, va, v_stride, first, v_head_dim, o, alpha);
              if (n > first) value_sums(3, p2, vg, v_stride, n - first, v_head_dim, o, one);
              break;
            case 2:
              value_sums(2, p, va, v_stride, first, v_head_dim, o, alpha);
              if (n > first) value_sums(2, p2, vg, v_stride, n - first, v_head_dim, o, one);
              break;
            default:
              value_sums(1, p, va, v_stride, first, v_head_dim, o, alpha);
              if (n > first) value_sums(1, p2, vg, v_stride, n - first, v_head_dim, o, one);
              break;
          }
          h += c;
        }
        hs = he;
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
