/**
 * Scalar references of Kimi K3's kernels (kernels/kimi_k3.c): SiTU-GLU and one token's
 * Attention Residual. Transcendentals and reductions run in float64 and round to f32
 * once, so the kernels are compared with a tolerance.
 *
 * @module
 */

const sigmoid = (x: number) => 1 / (1 + Math.exp(-x));

/** SiTU(g, u) = [β·tanh(g/β)·σ(g)]·[β₂·tanh(u/β₂)] (situ_mul_f32). */
export function situMulRef(
  g: Float32Array,
  u: Float32Array,
  beta: number,
  linearBeta: number,
): Float32Array {
  return g.map((x, i) =>
    beta * Math.tanh(x / beta) * sigmoid(x) * (linearBeta * Math.tanh(u[i] / linearBeta))
  );
}

/** Σ softmax(score)_i·V_i with score_i = V_i·(wn ⊙ wp) / rms(V_i) (attn_res_f32). */
export function attnResRef(
  sources: Float32Array[],
  wn: Float32Array,
  wp: Float32Array,
  eps: number,
): Float32Array {
  const d = wn.length;
  const scores = sources.map((v) => {
    let ss = 0, dot = 0;
    for (let j = 0; j < d; j++) {
      ss += v[j] * v[j];
      dot += v[j] * wn[j] * wp[j];
    }
    return dot / Math.sqrt(ss / d + eps);
  });
  const max = Math.max(...scores);
  const e = scores.map((s) => Math.exp(s - max));
  const sum = e.reduce((a, b) => a + b, 0);
  const out = new Float64Array(d);
  sources.forEach((v, i) => {
    for (let j = 0; j < d; j++) out[j] += (e[i] / sum) * v[j];
  });
  return Float32Array.from(out);
}
