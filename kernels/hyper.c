/*
 * Hyper-connections (manifold-constrained, Xie et al. 2026; DeepSeek-V4): a token's residual is n
 * streams of d floats. Before a sublayer, weights come from the flattened streams: m = fn · rms(X)
 * ((2 + n)·n rows); pre = σ(m·s0 + b) + eps collapses the streams into the sublayer's input,
 * post = 2σ(m·s1 + b) spreads its output back, and comb = Sinkhorn(softmax_rows(m·s2 + b) + eps)
 * mixes the old streams: X'_k = post_k·y + Σ_j comb[j][k]·X_j. The hyper head is the collapse
 * alone (n rows, one scale). Every sum runs in a fixed order, so a token's result does not
 * depend on the batch it came in.
 */
#include "dot.h"
#include "math.h"

/* m[r] = (fn_r · x) / sqrt(mean(x²) + eps) for r < rows; x is nd floats. */
static void hc_mixes(const float *x, const float *fn, int rows, int nd, float eps, float *m) {
  v128_t a = wasm_f32x4_splat(0.0f);
  int i = 0;
  for (; i + 4 <= nd; i += 4) {
    v128_t v = wasm_v128_load(x + i);
    a = wasm_f32x4_add(a, wasm_f32x4_mul(v, v));
  }
  float ss = hsum_f32x4(a);
  for (; i < nd; i++) ss += x[i] * x[i];
  float inv = 1.0f / __builtin_sqrtf(ss / (float)nd + eps);
  for (int r = 0; r < rows; r++) m[r] = dot1_f32(fn + (size_t)r * nd, x, nd) * inv;
}

static inline float sigmoid_f32(float v) { return lane0(sigmoid_f32x4(wasm_f32x4_splat(v))); }

/* out = Σ_j pre[j]·x_j over n streams of d floats. */
static void hc_collapse(const float *x, const float *pre, int n, int d, float *out) {
  int i = 0;
  for (; i + 4 <= d; i += 4) {
    v128_t s = wasm_f32x4_splat(0.0f);
    for (int j = 0; j < n; j++)
      s = wasm_f32x4_add(s, wasm_f32x4_mul(wasm_f32x4_splat(pre[j]),
                                           wasm_v128_load(x + (size_t)j * d + i)));
    wasm_v128_store(out + i, s);
  }
  for (; i < d; i++) {
    float s = 0.0f;
    for (int j = 0; j < n; j++) s += pre[j] * x[(size_t)j * d + i];
    out[i] = s;
  }
}

/* Divides each row (by_rows) or column of the n×n matrix c by its sum + eps. */
static void hc_normalise(float *c, int n, int by_rows, float eps) {
  for (int a = 0; a < n; a++) {
    float s = 0.0f;
    for (int b = 0; b < n; b++) s += by_rows ? c[a * n + b] : c[b * n + a];
    float q = s + eps;
    for (int b = 0; b < n; b++) {
      if (by_rows) c[a * n + b] /= q;
      else c[b * n + a] /= q;
    }
  }
}

/*
 * Before a sublayer, for `tokens` tokens of n streams (x: tokens·n·d floats): the collapsed
 * input (tokens·d), post (tokens·n) and comb (tokens·n·n, [j][k]). fn is (2+n)·n × n·d, base
 * (2+n)·n, scale 3; mix is (2+n)·n floats of scratch. iters ≥ 1 Sinkhorn iterations, the first
 * normalising columns only.
 */
KEXPORT("hc_pre_f32")
void hc_pre_f32(const float *x, int tokens, int n, int d, const float *fn, const float *base,
                const float *scale, int iters, float norm_eps, float hc_eps, float *mix,
                float *collapsed, float *post, float *comb) {
  int rows = (2 + n) * n, nn = n * n;
  size_t nd = (size_t)n * d;
  for (int t = 0; t < tokens; t++) {
    const float *xt = x + t * nd;
    float *pt = post + (size_t)t * n, *ct = comb + (size_t)t * nn;
    hc_mixes(xt, fn, rows, (int)nd, norm_eps, mix);
    for (int j = 0; j < n; j++) {
      pt[j] = 2.0f * sigmoid_f32(mix[n + j] * scale[1] + base[n + j]);
      /* pre overwrites its own mixes: each is read once, before. */
      mix[j] = sigmoid_f32(mix[j] * scale[0] + base[j]) + hc_eps;
    }
    for (int a = 0; a < n; a++) {
      float *row = ct + a * n;
      float max = -F32_INF;
      for (int b = 0; b < n; b++) {
        row[b] = mix[2 * n + a * n + b] * scale[2] + base[2 * n + a * n + b];
        if (row[b] > max) max = row[b];
      }
      float s = 0.0f;
      for (int b = 0; b < n; b++) {
        row[b] = exp_f32(row[b] - max);
        s += row[b];
      }
      for (int b = 0; b < n; b++) row[b] = row[b] / s + hc_eps;
    }
    hc_normalise(ct, n, 0, hc_eps);
    for (int i = 1; i < iters; i++) {
      hc_normalise(ct, n, 1, hc_eps);
      hc_normalise(ct, n, 0, hc_eps);
    }
    hc_collapse(xt, mix, n, d, collapsed + (size_t)t * d);
  }
}

/* After a sublayer: out_k = post_k·y + Σ_j comb[j][k]·x_j per token. out must not alias x. */
KEXPORT("hc_post_f32")
void hc_post_f32(const float *x, const float *y, const float *post, const float *comb, float *out,
                 int tokens, int n, int d) {
  size_t nd = (size_t)n * d;
  for (int t = 0; t < tokens; t++) {
    const float *xt = x + t * nd, *yt = y + (size_t)t * d;
    const float *pt = post + (size_t)t * n, *ct = comb + (size_t)t * n * n;
    for (int k = 0; k < n; k++) {
      float *o = out + t * nd + (size_t)k * d;
      int i = 0;
      for (; i + 4 <= d; i += 4) {
        v128_t s = wasm_f32x4_mul(wasm_f32x4_splat(pt[k]), wasm_v128_load(yt + i));
        for (int j = 0; j < n; j++)
          s = wasm_f32x4_add(s, wasm_f32x4_mul(wasm_f32x4_splat(ct[j * n + k]),
                                               wasm_v128_load(xt + (size_t)j * d + i)));
        wasm_v128_store(o + i, s);
      }
      for (; i < d; i++) {
        float s = pt[k] * yt[i];
        for (int j = 0; j < n; j++) s += ct[j * n + k] * xt[(size_t)j * d + i];
        o[i] = s;
      }
    }
  }
}

/*
 * The hyper head: per token, pre = σ(m·scale + base) + eps with m = fn · rms(X) (n rows), and
 * out = Σ_j pre_j·X_j. mix is n floats of scratch.
 */
KEXPORT("hc_head_f32")
void hc_head_f32(const float *x, int tokens, int n, int d, const float *fn, const float *base,
                 float scale, float norm_eps, float hc_eps, float *mix, float *out) {
  size_t nd = (size_t)n * d;
  for (int t = 0; t < tokens; t++) {
    const float *xt = x + t * nd;
    hc_mixes(xt, fn, n, (int)nd, norm_eps, mix);
    for (int j = 0; j < n; j++) mix[j] = sigmoid_f32(mix[j] * scale + base[j]) + hc_eps;
    hc_collapse(xt, mix, n, d, out + (size_t)t * d);
  }
}
