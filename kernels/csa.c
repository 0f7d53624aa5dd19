/*
 * DeepSeek-V4's compressed sparse attention pieces: one compressed entry from the per-position
 * projections a layer keeps, the Lightning indexer's scores of the entries, and the clamped
 * SwiGLU of its MLPs. Softmaxes and sums run in slot, head and channel order, so a result does
 * not depend on the batch it came in.
 */
#include "dot.h"
#include "math.h"

/*
 * Entry w of a compressor of `ratio` tokens per entry, `width` channels: position p's row is at
 * rows + p·row_floats, its kv projection at c_off and gate projection at z_off. Not indexed
 * (HCA): the slots are window w's positions, channels [0, width). Indexed (CSA, overlapping): the
 * previous window's positions on channels [0, width) (none for w = 0), then window w's on
 * [width, 2·width). Per channel: out = Σ_s softmax_s(z_s + ape[slot][ch]) · c_s, ape being
 * ratio × span floats (span = width, or 2·width when indexed).
 */
KEXPORT("csa_compress_f32")
void csa_compress_f32(const float *rows, int row_floats, int c_off, int z_off, const float *ape,
                      int ratio, int width, int indexed, int w, float *out) {
  int span = indexed ? 2 * width : width;
  int first = indexed && w > 0 ? (w - 1) * ratio : w * ratio;
  int n = (indexed && w > 0 ? 2 : 1) * ratio;
  for (int i = 0; i < width; i++) {
    float max = -F32_INF;
    for (int s = 0; s < n; s++) {
      int p = first + s, o = indexed && p >= w * ratio ? width : 0;
      float z = rows[(size_t)p * row_floats + z_off + o + i] + ape[(p % ratio) * span + o + i];
      if (z > max) max = z;
    }
    float sum = 0.0f, acc = 0.0f;
    for (int s = 0; s < n; s++) {
      int p = first + s, o = indexed && p >= w * ratio ? width : 0;
      const float *row = rows + (size_t)p * row_floats;
      float e = exp_f32(row[z_off + o + i] + ape[(p % ratio) * span + o + i] - max);
      sum += e;
      acc += e * row[c_off + o + i];
    }
    out[i] = acc / sum;
  }
}

/*
 * The indexer's score of `count` keys (key w at keys + w·key_stride floats, dim floats each):
 * score_w = Σ_h weights[h] · max(0, q_h · key_w), q being heads × dim floats.
 */
KEXPORT("csa_index_scores_f32")
void csa_index_scores_f32(const float *q, int heads, int dim, const float *weights,
                          const float *keys, int key_stride, int count, float *scores) {
  for (int w = 0; w < count; w++) {
    const float *k = keys + (size_t)w * key_stride;
    float s = 0.0f;
    for (int h = 0; h < heads; h++) {
      float d = dot1_f32(q + (size_t)h * dim, k, dim);
      s += weights[h] * (d > 0.0f ? d : 0.0f);
    }
    scores[w] = s;
  }
}

/* g[i] = silu(min(g[i], limit)) · clamp(u[i], ±limit) (DeepSeek-V4's clamped SwiGLU). */
KEXPORT("swiglu_limit_f32")
void swiglu_limit_f32(float *g, const float *u, int n, float limit) {
  v128_t hi = wasm_f32x4_splat(limit), lo = wasm_f32x4_splat(-limit);
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    v128_t gate = silu_f32x4(wasm_f32x4_min(wasm_v128_load(g + i), hi));
    v128_t up = wasm_f32x4_max(wasm_f32x4_min(wasm_v128_load(u + i), hi), lo);
    wasm_v128_store(g + i, wasm_f32x4_mul(gate, up));
  }
  for (; i < n; i++) {
    v128_t gate = silu_f32x4(wasm_f32x4_min(wasm_f32x4_splat(g[i]), hi));
    v128_t up = wasm_f32x4_max(wasm_f32x4_min(wasm_f32x4_splat(u[i]), hi), lo);
    g[i] = lane0(wasm_f32x4_mul(gate, up));
  }
}
