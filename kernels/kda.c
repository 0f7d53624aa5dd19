/*
 * The gated delta rule of Kimi Delta Attention (KDA) and of Gated DeltaNet (Qwen3-Next, Qwen3.5),
 * and the causal short convolution in front of both, token by token. KDA decays each key channel
 * of the state on its own; Gated DeltaNet decays a whole head by one scalar, and lets `ratio`
 * value heads share one key head's q and k. Both split by key head: a key head's q/k channels and
 * the states of its value heads belong to the thread that owns it, so any split gives the same bits.
 *
 * The state of value head h is S_h[dk][dv] (row i = key channel i), at S + h*dk*dv floats. Per
 * token:
 *   S <- diag(a) S,  a = e^g          (decay first; g <= 0 is the log-decay of each key channel,
 *                                       or of the head: the same a on every row)
 *   u  = S^T k                        (read the decayed state)
 *   S <- S + k (x) beta (v - u)       (delta-rule update)
 *   o  = S^T q                        (read after the update)
 * with q and k L2-normalised per head (x / sqrt(sum x^2 + 1e-6), as fla) and q scaled by dk^-1/2.
 *
 * Every output column c of S only involves column c: the recurrence runs column stripes of 16
 * floats (one cache line per state row) through all tokens of the call, so a stripe of
 * dk * 64 bytes stays in L1 and the state is read and written once per call. Within a stripe the
 * lanes are independent, so 16-, 4- and 1-wide code give the same value per column.
 */
#include "math.h"

/* x / sqrt(sum x^2 + eps) * scale over n floats in place (fla's l2norm, then the q scale). */
static void l2norm_scale(float *x, int n, float scale) {
  v128_t a = wasm_f32x4_splat(0.0f);
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    v128_t u = wasm_v128_load(x + i);
    a = wasm_f32x4_add(a, wasm_f32x4_mul(u, u));
  }
  float ss = hsum_f32x4(a);
  for (; i < n; i++) ss += x[i] * x[i];
  float norm = __builtin_sqrtf(ss + 1e-6f);
  v128_t nv = wasm_f32x4_splat(norm), sv = wasm_f32x4_splat(scale);
  for (i = 0; i + 4 <= n; i += 4)
    wasm_v128_store(x + i, wasm_f32x4_mul(wasm_f32x4_div(wasm_v128_load(x + i), nv), sv));
  for (; i < n; i++) x[i] = (x[i] / norm) * scale;
}

/* e^x over n floats in place. */
static void exp_inplace(float *x, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4) wasm_v128_store(x + i, exp_f32x4(wasm_v128_load(x + i)));
  for (; i < n; i++) x[i] = exp_f32(x[i]);
}

/* The recurrence for columns [c, c + 4*W) of head h (qh..oh), over T tokens; W vectors a row. */
#define KDA_STRIPE(W)                                                                          \
  for (int t = 0; t < T; t++) {                                                                \
    const float *qt = qh + (size_t)t * qk_stride, *kt = kh + (size_t)t * qk_stride;            \
    const float *at = gh + (size_t)t * g_stride;                                               \
    v128_t u[W], o[W];                                                                         \
    for (int w = 0; w < W; w++) u[w] = o[w] = wasm_f32x4_splat(0.0f);                          \
    for (int i = 0; i < dk; i++) {                                                             \
      float *row = Sh + (size_t)i * dv + c;                                                    \
      v128_t a = wasm_f32x4_splat(at[i * g_row]), ki = wasm_f32x4_splat(kt[i]);                \
      for (int w = 0; w < W; w++) {                                                            \
        v128_t s = wasm_f32x4_mul(wasm_v128_load(row + 4 * w), a);                             \
        wasm_v128_store(row + 4 * w, s);                                                       \
        u[w] = wasm_f32x4_add(u[w], wasm_f32x4_mul(ki, s));                                    \
      }                                                                                        \
    }                                                                                          \
    const float *vt = vh + (size_t)t * v_stride + c;                                           \
    v128_t b = wasm_f32x4_splat(bh[(size_t)t * beta_stride]);                               \
    for (int w = 0; w < W; w++)                                                                \
      u[w] = wasm_f32x4_mul(wasm_f32x4_sub(wasm_v128_load(vt + 4 * w), u[w]), b);              \
    for (int i = 0; i < dk; i++) {                                                             \
      float *row = Sh + (size_t)i * dv + c;                                                    \
      v128_t ki = wasm_f32x4_splat(kt[i]), qi = wasm_f32x4_splat(qt[i]);                       \
      for (int w = 0; w < W; w++) {                                                            \
        v128_t s = wasm_f32x4_add(wasm_v128_load(row + 4 * w), wasm_f32x4_mul(ki, u[w]));      \
        wasm_v128_store(row + 4 * w, s);                                                       \
        o[w] = wasm_f32x4_add(o[w], wasm_f32x4_mul(qi, s));                                    \
      }                                                                                        \
    }                                                                                          \
    float *ot = oh + (size_t)t * out_stride + c;                                               \
    for (int w = 0; w < W; w++) wasm_v128_store(ot + 4 * w, o[w]);                             \
  }

/* One scalar column c of one head (the same per-lane arithmetic as KDA_STRIPE). */
static void kda_column(float *Sh, const float *q, const float *k, const float *v, const float *g,
                       const float *beta, float *out, int T, int dk, int dv, int qk_stride,
                       int v_stride, int g_stride, int g_row, int beta_stride, int out_stride,
                       int c) {
  for (int t = 0; t < T; t++) {
    const float *qt = q + (size_t)t * qk_stride, *kt = k + (size_t)t * qk_stride;
    const float *at = g + (size_t)t * g_stride;
    float u = 0.0f, o = 0.0f;
    for (int i = 0; i < dk; i++) {
      float s = Sh[(size_t)i * dv + c] * at[i * g_row];
      Sh[(size_t)i * dv + c] = s;
      u = u + kt[i] * s;
    }
    float d = (v[(size_t)t * v_stride + c] - u) * beta[(size_t)t * beta_stride];
    for (int i = 0; i < dk; i++) {
      float s = Sh[(size_t)i * dv + c] + kt[i] * d;
      Sh[(size_t)i * dv + c] = s;
      o = o + qt[i] * s;
    }
    out[(size_t)t * out_stride + c] = o;
  }
}

/**
 * The gated delta rule for key heads [h0, h1) over T consecutive tokens; key head h serves value
 * heads h*ratio .. h*ratio + ratio - 1. Token t's q and k of key head h are at
 * q/k + t*qk_stride + h*dk, v of value head j at v + t*v_stride + j*dv, its log-decays at
 * g + t*g_stride + j*g_channels (g_channels = dk: one per key channel, KDA; 1: one per head,
 * Gated DeltaNet), beta (already a sigmoid) at beta + t*beta_stride + j, and o goes to
 * out + t*out_stride + j*dv. q, k and g are rewritten in place (normalised q and k, e^g), so the
 * caller passes scratch copies. The state S (value heads * dk * dv floats) carries over calls.
 */
KEXPORT("kda_recurrent_f32")
void kda_recurrent_f32(float *S, float *q, float *k, const float *v, float *g, const float *beta,
                       float *out, int T, int n_heads, int dk, int dv, int qk_stride,
                       int v_stride, int g_stride, int beta_stride, int out_stride, int ratio,
                       int g_channels, int h0, int h1) {
  if (h1 > n_heads) h1 = n_heads;
  float scale = 1.0f / __builtin_sqrtf((float)dk);
  /* Row i of the state decays by g[i * g_row]: its own channel's, or the head's one value. */
  int g_row = g_channels == 1 ? 0 : 1;
  for (int kh_i = h0 < 0 ? 0 : h0; kh_i < h1; kh_i++) {
    float *qh = q + (size_t)kh_i * dk, *kh = k + (size_t)kh_i * dk;
    for (int t = 0; t < T; t++) {
      l2norm_scale(qh + (size_t)t * qk_stride, dk, scale);
      l2norm_scale(kh + (size_t)t * qk_stride, dk, 1.0f);
    }
    for (int h = kh_i * ratio; h < (kh_i + 1) * ratio; h++) {
      float *gh = g + (size_t)h * g_channels;
      for (int t = 0; t < T; t++) exp_inplace(gh + (size_t)t * g_stride, g_channels);
      float *Sh = S + (size_t)h * dk * dv;
      const float *vh = v + (size_t)h * dv, *bh = beta + h;
      float *oh = out + (size_t)h * dv;
      int c = 0;
      for (; c + 16 <= dv; c += 16) KDA_STRIPE(4)
      for (; c + 4 <= dv; c += 4) KDA_STRIPE(1)
      for (; c < dv; c++)
        kda_column(Sh, qh, kh, vh, gh, bh, oh, T, dk, dv, qk_stride, v_stride, g_stride, g_row,
                   beta_stride, out_stride, c);
    }
  }
}

/**
 * Causal depthwise convolution of width K with SiLU, for channels [r0*group, r1*group) (rows are
 * heads of `group` channels). Token t's input is at x + t*x_stride, its output at y + t*y_stride
 * (y must not overlap x):
 *   y_t[c] = silu(sum_j w[c*K + j] * x_{t-K+1+j}[c]),  j = 0..K-1 in order,
 * where inputs before the call come from `state`, the last K-1 inputs ([K-1][channels], oldest
 * first), which is then advanced by T tokens.
 */
KEXPORT("short_conv_f32")
void short_conv_f32(const float *x, float *state, const float *w, float *y, int T, int channels,
                    int K, int x_stride, int y_stride, int group, int r0, int r1) {
  int c1 = r1 * group < channels ? r1 * group : channels;
  int hist = K - 1;
  for (int c = r0 * group; c < c1;) {
    int lanes = c1 - c >= 4 ? 4 : 1;
    /* Width 4 (every released checkpoint) with four channels: the taps are four rows of w,
       transposed in registers once, and the window slides through registers, ending as the new
       state. Same products, same order as the general path below. */
    if (K == 4 && lanes == 4) {
      v128_t a = wasm_v128_load(w + (size_t)c * 4), b = wasm_v128_load(w + (size_t)c * 4 + 4);
      v128_t e = wasm_v128_load(w + (size_t)c * 4 + 8), f = wasm_v128_load(w + (size_t)c * 4 + 12);
      v128_t ab0 = wasm_i32x4_shuffle(a, b, 0, 4, 1, 5), ab1 = wasm_i32x4_shuffle(a, b, 2, 6, 3, 7);
      v128_t ef0 = wasm_i32x4_shuffle(e, f, 0, 4, 1, 5), ef1 = wasm_i32x4_shuffle(e, f, 2, 6, 3, 7);
      v128_t w0 = wasm_i32x4_shuffle(ab0, ef0, 0, 1, 4, 5);
      v128_t w1 = wasm_i32x4_shuffle(ab0, ef0, 2, 3, 6, 7);
      v128_t w2 = wasm_i32x4_shuffle(ab1, ef1, 0, 1, 4, 5);
      v128_t w3 = wasm_i32x4_shuffle(ab1, ef1, 2, 3, 6, 7);
      v128_t r0 = wasm_v128_load(state + c), r1 = wasm_v128_load(state + (size_t)channels + c);
      v128_t r2 = wasm_v128_load(state + (size_t)2 * channels + c);
      for (int t = 0; t < T; t++) {
        v128_t xt = wasm_v128_load(x + (size_t)t * x_stride + c);
        v128_t acc = wasm_f32x4_add(wasm_f32x4_splat(0.0f), wasm_f32x4_mul(w0, r0));
        acc = wasm_f32x4_add(acc, wasm_f32x4_mul(w1, r1));
        acc = wasm_f32x4_add(acc, wasm_f32x4_mul(w2, r2));
        acc = wasm_f32x4_add(acc, wasm_f32x4_mul(w3, xt));
        wasm_v128_store(y + (size_t)t * y_stride + c, silu_f32x4(acc));
        r0 = r1;
        r1 = r2;
        r2 = xt;
      }
      wasm_v128_store(state + c, r0);
      wasm_v128_store(state + (size_t)channels + c, r1);
      wasm_v128_store(state + (size_t)2 * channels + c, r2);
      c += 4;
      continue;
    }
    for (int t = 0; t < T; t++) {
      v128_t acc = wasm_f32x4_splat(0.0f);
      for (int j = 0; j < K; j++) {
        int m = t + j; /* index into state ++ x */
        const float *src = m < hist ? state + (size_t)m * channels + c
                                    : x + (size_t)(m - hist) * x_stride + c;
        v128_t xv, wv;
        if (lanes == 4) {
          xv = wasm_v128_load(src);
          wv = wasm_f32x4_make(w[(size_t)c * K + j], w[(size_t)(c + 1) * K + j],
                               w[(size_t)(c + 2) * K + j], w[(size_t)(c + 3) * K + j]);
        } else {
          xv = wasm_f32x4_splat(src[0]);
          wv = wasm_f32x4_splat(w[(size_t)c * K + j]);
        }
        acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wv, xv));
      }
      v128_t r = silu_f32x4(acc);
      float *dst = y + (size_t)t * y_stride + c;
      if (lanes == 4) wasm_v128_store(dst, r);
      else dst[0] = wasm_f32x4_extract_lane(r, 0);
    }
    /* New history row j is input T + j of state ++ x; ascending j reads before it overwrites.
       (Not for the loop vectoriser: its overlap checks need a 128-bit multiply wasm lacks.) */
#pragma clang loop vectorize(disable) interleave(disable)
    for (int j = 0; j < hist; j++) {
      int m = T + j;
      const float *src;
      if (m < hist) src = state + (size_t)m * channels + c;
      else src = x + (size_t)(m - hist) * x_stride + c;
      float *dst = state + (size_t)j * channels + c;
      if (lanes == 4) wasm_v128_store(dst, wasm_v128_load(src));
      else dst[0] = src[0];
    }
    c += lanes;
  }
}
