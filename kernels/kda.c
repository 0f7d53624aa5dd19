/*
 * Kimi Delta Attention (KDA): the causal short convolution in front of it and the gated delta
 * rule itself, token by token. Both split by head: a head's channels and its state belong to the
 * thread that owns the head, so any split gives the same bits.
 *
 * The state of head h is S_h[dk][dv] (row i = key channel i), at S + h*dk*dv floats. Per token:
 *   S <- diag(a) S,  a = e^g          (decay first; g <= 0 is the log-decay per key channel)
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
      v128_t a = wasm_f32x4_splat(at[i]), ki = wasm_f32x4_splat(kt[i]);                        \
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
                       int v_stride, int g_stride, int beta_stride, int out_stride, int c) {
  for (int t = 0; t < T; t++) {
    const float *qt = q + (size_t)t * qk_stride, *kt = k + (size_t)t * qk_stride;
    const float *at = g + (size_t)t * g_stride;
    float u = 0.0f, o = 0.0f;
    for (int i = 0; i < dk; i++) {
      float s = Sh[(size_t)i * dv + c] * at[i];
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
 * The gated delta rule for heads [h0, h1) over T consecutive tokens. Token t's q and k of head h
 * are at q/k + t*qk_stride + h*dk, v at v + t*v_stride + h*dv, the log-decay g at
 * g + t*g_stride + h*dk, beta (already a sigmoid) at beta + t*beta_stride + h, and o goes to
 * out + t*out_stride + h*dv. q, k and g are rewritten in place (normalised q and k, e^g), so the
 * caller passes scratch copies. The state S (n_heads * dk * dv floats) carries over calls.
 */
KEXPORT("kda_recurrent_f32")
void kda_recurrent_f32(float *S, float *q, float *k, const float *v, float *g, const float *beta,
                       float *out, int T, int n_heads, int dk, int dv, int qk_stride,
                       int v_stride, int g_stride, int beta_stride, int out_stride, int h0,
                       int h1) {
  if (h1 > n_heads) h1 = n_heads;
  float scale = 1.0f / __builtin_sqrtf((float)dk);
  for (int h = h0 < 0 ? 0 : h0; h < h1; h++) {
    float *qh = q + (size_t)h * dk, *kh = k + (size_t)h * dk, *gh = g + (size_t)h * dk;
    for (int t = 0; t < T; t++) {
      l2norm_scale(qh + (size_t)t * qk_stride, dk, scale);
      l2norm_scale(kh + (size_t)t * qk_stride, dk, 1.0f);
      exp_inplace(gh + (size_t)t * g_stride, dk);
    }
    float *Sh = S + (size_t)h * dk * dv;
    const float *vh = v + (size_t)h * dv, *bh = beta + h;
    float *oh = out + (size_t)h * dv;
    int c = 0;
    for (; c + 16 <= dv; c += 16) KDA_STRIPE(4)
    for (; c + 4 <= dv; c += 4) KDA_STRIPE(1)
    for (; c < dv; c++)
      kda_column(Sh, qh, kh, vh, gh, bh, oh, T, dk, dv, qk_stride, v_stride, g_stride,
                 beta_stride, out_stride, c);
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

/* sum_i a[i]*b[i]*c[i] (4 lanes, then the tail). */
static float dot3(const float *a, const float *b, const float *c, int n) {
  v128_t acc = wasm_f32x4_splat(0.0f);
  int i = 0;
  for (; i + 4 <= n; i += 4)
    acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_mul(wasm_v128_load(a + i),
                                                            wasm_v128_load(b + i)),
                                             wasm_v128_load(c + i)));
  float s = hsum_f32x4(acc);
  for (; i < n; i++) s += (a[i] * b[i]) * c[i];
  return s;
}

/* d[i] *= a[i], then sum_i x[i]*y[i]*d[i] and sum_i z[i]*y[i]*d[i] in one pass: the same
   lane-wise operations and order as vmul followed by two dot3 calls. */
static inline void decay_dot2(float *d, const float *a, const float *x, const float *z,
                              const float *y, int n, float *sx, float *sz) {
  v128_t accx = wasm_f32x4_splat(0.0f), accz = accx;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    v128_t dv = wasm_f32x4_mul(wasm_v128_load(d + i), wasm_v128_load(a + i));
    wasm_v128_store(d + i, dv);
    v128_t yv = wasm_v128_load(y + i);
    accx = wasm_f32x4_add(accx, wasm_f32x4_mul(wasm_f32x4_mul(wasm_v128_load(x + i), yv), dv));
    accz = wasm_f32x4_add(accz, wasm_f32x4_mul(wasm_f32x4_mul(wasm_v128_load(z + i), yv), dv));
  }
  float rx = hsum_f32x4(accx), rz = hsum_f32x4(accz);
  for (; i < n; i++) {
    d[i] *= a[i];
    rx += (x[i] * y[i]) * d[i];
    rz += (z[i] * y[i]) * d[i];
  }
  *sx = rx;
  *sz = rz;
}

/* y[i] = y[i]*x[i]. */
static void vmul(float *y, const float *x, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4)
    wasm_v128_store(y + i, wasm_f32x4_mul(wasm_v128_load(y + i), wasm_v128_load(x + i)));
  for (; i < n; i++) y[i] *= x[i];
}

/* y[i] += a*x[i]. */
static void vaxpy(float *y, float a, const float *x, int n) {
  v128_t av = wasm_f32x4_splat(a);
  int i = 0;
  for (; i + 4 <= n; i += 4)
    wasm_v128_store(y + i, wasm_f32x4_add(wasm_v128_load(y + i),
                                          wasm_f32x4_mul(av, wasm_v128_load(x + i))));
  for (; i < n; i++) y[i] += a * x[i];
}

/* y[i] = a*x[i]*z[i]. */
static void vscale2(float *y, float a, const float *x, const float *z, int n) {
  v128_t av = wasm_f32x4_splat(a);
  int i = 0;
  for (; i + 4 <= n; i += 4)
    wasm_v128_store(y + i, wasm_f32x4_mul(wasm_f32x4_mul(av, wasm_v128_load(x + i)),
                                          wasm_v128_load(z + i)));
  for (; i < n; i++) y[i] = (a * x[i]) * z[i];
}

static void vfill(float *y, float a, int n) {
  for (int i = 0; i < n; i++) y[i] = a;
}

/*
 * The state-facing half of a chunk for columns [c0, c0 + 4*W) (inside kda_chunk_head): per token
 * v' = U - W S and o = (qP) S + M v', then S <- diag(P_last) S + (kR)^T v'. The stripe of S
 * (dk rows of 4*W floats) is read n times from L1 and written once.
 */
#define CHUNK_STRIPE(W)                                                                        \
  {                                                                                            \
    for (int i = 0; i < n; i++) {                                                              \
      v128_t aw[W], aq[W];                                                                     \
      for (int w = 0; w < W; w++) aw[w] = aq[w] = wasm_f32x4_splat(0.0f);                     \
      const float *Wi = W_ + (size_t)i * dk, *qi = Q(i);                                       \
      for (int c = 0; c < dk; c++) {                                                           \
        const float *s = Sh + (size_t)c * dv + c0;                                             \
        v128_t wc = wasm_f32x4_splat(Wi[c]), qc = wasm_f32x4_splat(qi[c]);                     \
        for (int w = 0; w < W; w++) {                                                          \
          v128_t sv = wasm_v128_load(s + 4 * w);                                               \
          aw[w] = wasm_f32x4_add(aw[w], wasm_f32x4_mul(wc, sv));                               \
          aq[w] = wasm_f32x4_add(aq[w], wasm_f32x4_mul(qc, sv));                               \
        }                                                                                      \
      }                                                                                        \
      float *ui = U + (size_t)i * dv + c0;                                                     \
      for (int w = 0; w < W; w++) aw[w] = wasm_f32x4_sub(wasm_v128_load(ui + 4 * w), aw[w]);  \
      for (int j = 0; j < i; j++) {                                                            \
        const float *uj = U + (size_t)j * dv + c0;                                             \
        v128_t mij = wasm_f32x4_splat(M[(size_t)i * C + j]);                                   \
        for (int w = 0; w < W; w++)                                                            \
          aq[w] = wasm_f32x4_add(aq[w], wasm_f32x4_mul(mij, wasm_v128_load(uj + 4 * w)));      \
      }                                                                                        \
      v128_t mii = wasm_f32x4_splat(M[(size_t)i * C + i]);                                     \
      float *oi = out + (size_t)i * out_stride + c0;                                           \
      for (int w = 0; w < W; w++) {                                                            \
        wasm_v128_store(ui + 4 * w, aw[w]);                                                    \
        wasm_v128_store(oi + 4 * w, wasm_f32x4_add(aq[w], wasm_f32x4_mul(mii, aw[w])));        \
      }                                                                                        \
    }                                                                                          \
    for (int c = 0; c < dk; c++) {                                                             \
      float *s = Sh + (size_t)c * dv + c0;                                                     \
      v128_t pl = wasm_f32x4_splat(Pl[c]), sv[W];                                              \
      for (int w = 0; w < W; w++) sv[w] = wasm_f32x4_mul(wasm_v128_load(s + 4 * w), pl);      \
      for (int j = 0; j < n; j++) {                                                            \
        const float *uj = U + (size_t)j * dv + c0;                                             \
        v128_t kj = wasm_f32x4_splat(K(j)[c]);                                                 \
        for (int w = 0; w < W; w++)                                                            \
          sv[w] = wasm_f32x4_add(sv[w], wasm_f32x4_mul(kj, wasm_v128_load(uj + 4 * w)));       \
      }                                                                                        \
      for (int w = 0; w < W; w++) wasm_v128_store(s + 4 * w, sv[w]);                           \
    }                                                                                          \
  }

/*
 * One chunk of n tokens of one head in the chunked (WY) form of the same recurrence, as fla and
 * transformers' chunk_kimi_delta_attention define it, with decays relative to the chunk start:
 *   P_t = prod_{m<=t} a_m,  D_ij = prod_{j<m<=i} a_m,  R_j = prod_{j<m<n} a_m   (a = e^g)
 *   A_ij = -beta_i sum_c k_i k_j D_ij  (j < i), made (I - A)^-1 - I by forward substitution
 *   W = (I+A)(beta k P),  U = (I+A)(beta v),  M_ij = sum_c q_i k_j D_ij  (j <= i)
 *   v' = U - W S,  o = (q P) S + M v',  S <- diag(P_{n-1}) S + sum_j (k_j R_j) (x) v'_j
 * The decays are running products of e^g rather than differences of a cumulative sum of g:
 * nothing overflows however strong the decay, and no cancellation loses digits.
 * Scratch: A, M (C*C each), W (C*dk), U (C*dv), P (C*dk), d (dk).
 */
static void kda_chunk_head(float *Sh, float *q, float *k, const float *v, const float *a,
                           const float *beta, float *out, float *scr, int n, int C, int dk,
                           int dv, int qk_stride, int v_stride, int g_stride, int beta_stride,
                           int out_stride) {
  float *A = scr, *M = A + (size_t)C * C, *W_ = M + (size_t)C * C, *U = W_ + (size_t)C * dk;
  float *P = U + (size_t)C * dv, *d = P + (size_t)C * dk;
#define Q(i) (q + (size_t)(i) * qk_stride)
#define K(i) (k + (size_t)(i) * qk_stride)
#define AT(i) (a + (size_t)(i) * g_stride)
#define B(i) (beta[(size_t)(i) * beta_stride])
  for (int i = 0; i < n; i++) {
    float *Pi = P + (size_t)i * dk;
    for (int c = 0; c < dk; c++) Pi[c] = i ? Pi[c - dk] * AT(i)[c] : AT(0)[c];
  }
  for (int i = 0; i < n; i++) {
    vfill(d, 1.0f, dk);
    M[(size_t)i * C + i] = dot3(Q(i), K(i), d, dk);
    for (int j = i - 1; j >= 0; j--) {
      float ak, aq;
      decay_dot2(d, AT(j + 1), K(i), Q(i), K(j), dk, &ak, &aq);
      A[(size_t)i * C + j] = -B(i) * ak;
      M[(size_t)i * C + j] = aq;
    }
  }
  /* Row i becomes row + row·A[:i, :i] over the already finished rows (ascending j is in place). */
  for (int i = 1; i < n; i++) {
    float *Ai = A + (size_t)i * C;
    for (int j = 0; j < i; j++) {
      float s = Ai[j];
      for (int m = j + 1; m < i; m++) s += Ai[m] * A[(size_t)m * C + j];
      Ai[j] = s;
    }
  }
  for (int i = 0; i < n; i++) {
    vscale2(W_ + (size_t)i * dk, B(i), K(i), P + (size_t)i * dk, dk);
    float *Ui = U + (size_t)i * dv;
    const float *vi = v + (size_t)i * v_stride;
    for (int c = 0; c < dv; c++) Ui[c] = B(i) * vi[c];
  }
  /* Descending i reads rows j < i before they are rewritten. */
  for (int i = n - 1; i > 0; i--) {
    for (int j = 0; j < i; j++) {
      float aij = A[(size_t)i * C + j];
      vaxpy(W_ + (size_t)i * dk, aij, W_ + (size_t)j * dk, dk);
      vaxpy(U + (size_t)i * dv, aij, U + (size_t)j * dv, dv);
    }
  }
  for (int i = 0; i < n; i++) vmul(Q(i), P + (size_t)i * dk, dk);
  vfill(d, 1.0f, dk);
  for (int j = n - 1; j >= 0; j--) {
    vmul(K(j), d, dk);
    vmul(d, AT(j), dk);
  }
  const float *Pl = P + (size_t)(n - 1) * dk;
  int c0 = 0;
  for (; c0 + 16 <= dv; c0 += 16) CHUNK_STRIPE(4)
  for (; c0 + 4 <= dv; c0 += 4) CHUNK_STRIPE(1)
  /* Leftover columns one at a time: the same per-lane arithmetic as the stripes. */
  for (; c0 < dv; c0++) {
    for (int i = 0; i < n; i++) {
      float aw = 0.0f, aq = 0.0f;
      const float *Wi = W_ + (size_t)i * dk, *qi = Q(i);
      for (int c = 0; c < dk; c++) {
        float sv = Sh[(size_t)c * dv + c0];
        aw = aw + Wi[c] * sv;
        aq = aq + qi[c] * sv;
      }
      float *ui = U + (size_t)i * dv + c0;
      float uv = ui[0] - aw;
      for (int j = 0; j < i; j++) aq = aq + M[(size_t)i * C + j] * U[(size_t)j * dv + c0];
      aq = aq + M[(size_t)i * C + i] * uv;
      ui[0] = uv;
      out[(size_t)i * out_stride + c0] = aq;
    }
    for (int c = 0; c < dk; c++) {
      float sv = Sh[(size_t)c * dv + c0] * Pl[c];
      for (int j = 0; j < n; j++) sv = sv + K(j)[c] * U[(size_t)j * dv + c0];
      Sh[(size_t)c * dv + c0] = sv;
    }
  }
#undef Q
#undef K
#undef AT
#undef B
}

/**
 * The same gated delta rule as kda_recurrent_f32 (same arguments and in-place rewrites), in the
 * chunked form for prefill: tokens in chunks of `chunk`, each chunk's intra-chunk interactions
 * as small dense matrices and one pass over the state per chunk. `scratch` holds scratch_stride
 * floats per head (at least 2*chunk^2 + 2*chunk*dk + chunk*dv + dk). Equal to the recurrence up
 * to rounding; docs/ENGINE.md has the measured difference.
 */
KEXPORT("kda_chunk_f32")
void kda_chunk_f32(float *S, float *q, float *k, const float *v, float *g, const float *beta,
                   float *out, float *scratch, int T, int n_heads, int dk, int dv, int qk_stride,
                   int v_stride, int g_stride, int beta_stride, int out_stride, int chunk,
                   int scratch_stride, int h0, int h1) {
  if (h1 > n_heads) h1 = n_heads;
  if (chunk < 1) return;
  float scale = 1.0f / __builtin_sqrtf((float)dk);
  for (int h = h0 < 0 ? 0 : h0; h < h1; h++) {
    float *qh = q + (size_t)h * dk, *kh = k + (size_t)h * dk, *gh = g + (size_t)h * dk;
    for (int t = 0; t < T; t++) {
      l2norm_scale(qh + (size_t)t * qk_stride, dk, scale);
      l2norm_scale(kh + (size_t)t * qk_stride, dk, 1.0f);
      exp_inplace(gh + (size_t)t * g_stride, dk);
    }
    float *scr = scratch + (size_t)h * scratch_stride;
    for (int t0 = 0; t0 < T; t0 += chunk) {
      int n = T - t0 < chunk ? T - t0 : chunk;
      kda_chunk_head(S + (size_t)h * dk * dv, qh + (size_t)t0 * qk_stride,
                     kh + (size_t)t0 * qk_stride, v + (size_t)h * dv + (size_t)t0 * v_stride,
                     gh + (size_t)t0 * g_stride, beta + h + (size_t)t0 * beta_stride,
                     out + (size_t)h * dv + (size_t)t0 * out_stride, scr, n, chunk, dk, dv,
                     qk_stride, v_stride, g_stride, beta_stride, out_stride);
    }
  }
}
