/*
 * Kimi K3's element-wise pieces: the SiTU-GLU activation and one token's Attention Residual (a
 * softmax-weighted mix of a few hidden-size sources). Products and
 * sums are separate IEEE operations, and scalar tails are lane 0 of the vector code, so vector
 * bodies and tails agree bit for bit.
 */
#include "math.h"

/* SiTU(g, u) = [b1 · tanh(g / b1) · sigmoid(g)] · [b2 · tanh(u / b2)]. */
static inline v128_t situ_f32x4(v128_t g, v128_t u, v128_t b1, v128_t b2) {
  v128_t gate = wasm_f32x4_mul(wasm_f32x4_mul(b1, tanh_f32x4(wasm_f32x4_div(g, b1))),
                               sigmoid_f32x4(g));
  return wasm_f32x4_mul(gate, wasm_f32x4_mul(b2, tanh_f32x4(wasm_f32x4_div(u, b2))));
}

/** g[i] = SiTU(g[i], u[i]) with caps beta (gate) and linear_beta (up). */
KEXPORT("situ_mul_f32")
void situ_mul_f32(float *g, const float *u, int n, float beta, float linear_beta) {
  v128_t b1 = wasm_f32x4_splat(beta), b2 = wasm_f32x4_splat(linear_beta);
  int i = 0;
  for (; i + 4 <= n; i += 4)
    wasm_v128_store(g + i, situ_f32x4(wasm_v128_load(g + i), wasm_v128_load(u + i), b1, b2));
  for (; i < n; i++)
    g[i] = lane0(situ_f32x4(wasm_f32x4_splat(g[i]), wasm_f32x4_splat(u[i]), b1, b2));
}

/* Σ v[j]² and Σ v[j]·(wn[j]·wp[j]) over d floats, lane sums combined in a fixed order. */
static void res_sums(const float *v, const float *wn, const float *wp, int d, float *ss,
                     float *dot) {
  v128_t s = wasm_f32x4_splat(0.0f), t = s;
  int j = 0;
  for (; j + 4 <= d; j += 4) {
    v128_t x = wasm_v128_load(v + j);
    s = wasm_f32x4_add(s, wasm_f32x4_mul(x, x));
    t = wasm_f32x4_add(t, wasm_f32x4_mul(x, wasm_f32x4_mul(wasm_v128_load(wn + j),
                                                           wasm_v128_load(wp + j))));
  }
  float a = hsum_f32x4(s), b = hsum_f32x4(t);
  for (; j < d; j++) {
    a += v[j] * v[j];
    b += v[j] * (wn[j] * wp[j]);
  }
  *ss = a;
  *dot = b;
}

/*
 * One token's Attention Residual over n sources: sources 0..n-2 at blocks + i·stride floats,
 * source n-1 at last. score_i = (V_i · (wn ⊙ wp)) / sqrt(mean(V_i²) + eps); p = softmax(score);
 * out = Σ_i p_i V_i, summed in source order. scores holds n floats of scratch. out must not
 * alias a source.
 */
KEXPORT("attn_res_f32")
void attn_res_f32(const float *blocks, int n, int stride, const float *last, const float *wn,
                  const float *wp, float *out, float *scores, int d, float eps) {
  if (n <= 0 || d <= 0) return;
  float max = -__builtin_inff();
  for (int i = 0; i < n; i++) {
    const float *v = i < n - 1 ? blocks + (long)i * stride : last;
    float ss, dot;
    res_sums(v, wn, wp, d, &ss, &dot);
    float s = dot / __builtin_sqrtf(ss / (float)d + eps);
    scores[i] = s;
    if (s > max) max = s;
  }
  float sum = 0.0f;
  for (int i = 0; i < n; i++) {
    scores[i] = exp_f32(scores[i] - max);
    sum += scores[i];
  }
  for (int i = 0; i < n; i++) scores[i] = scores[i] / sum;
  for (int i = 0; i < n; i++) {
    const float *v = i < n - 1 ? blocks + (long)i * stride : last;
    v128_t p = wasm_f32x4_splat(scores[i]);
    int j = 0;
    if (i == 0) {
      for (; j + 4 <= d; j += 4) wasm_v128_store(out + j, wasm_f32x4_mul(p, wasm_v128_load(v + j)));
      for (; j < d; j++) out[j] = scores[i] * v[j];
    } else {
      for (; j + 4 <= d; j += 4)
        wasm_v128_store(out + j, wasm_f32x4_add(wasm_v128_load(out + j),
                                                wasm_f32x4_mul(p, wasm_v128_load(v + j))));
      for (; j < d; j++) out[j] += scores[i] * v[j];
    }
  }
}

