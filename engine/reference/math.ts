/**
 * Float64 building blocks of the reference forward pass. Weights arrive as float32 arrays
 * (row-major [out, in]); every product and sum is done in float64.
 *
 * @module
 */

/** y = W·x for W [rows, cols] stored row-major; `what` names W in errors. */
export function matvec(
  w: Float32Array,
  x: Float64Array,
  rows: number,
  cols: number,
  what: string,
): Float64Array {
  if (w.length !== rows * cols) {
    throw new Error(`${what}: expected ${rows}×${cols} = ${rows * cols} values, got ${w.length}`);
  }
  if (x.length !== cols) throw new Error(`${what}: input has ${x.length} values, expected ${cols}`);
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let acc = 0;
    const base = r * cols;
    for (let c = 0; c < cols; c++) acc += w[base + c] * x[c];
    y[r] = acc;
  }
  return y;
}

/**
 * RMSNorm as in Hugging Face: x / sqrt(mean(x²) + eps) · weight, over `x[off, off + n)`; with
 * `unitOffset`, · (1 + weight) (Qwen3-Next, Qwen3.5).
 */
export function rmsNorm(
  x: Float64Array,
  weight: Float32Array,
  eps: number,
  what: string,
  off = 0,
  n = x.length,
  unitOffset = false,
): Float64Array {
  if (weight.length !== n) {
    throw new Error(`${what}: norm weight has ${weight.length} values, expected ${n}`);
  }
  let ss = 0;
  for (let i = 0; i < n; i++) ss += x[off + i] * x[off + i];
  const inv = 1 / Math.sqrt(ss / n + eps);
  const y = new Float64Array(n);
  const one = unitOffset ? 1 : 0;
  for (let i = 0; i < n; i++) y[i] = x[off + i] * inv * (one + weight[i]);
  return y;
}

/** RMSNorm without a weight: x / sqrt(mean(x²) + eps) over `x[off, off + n)` (Gemma 4). */
export function unitRmsNorm(x: Float64Array, eps: number, off = 0, n = x.length): Float64Array {
  let ss = 0;
  for (let i = 0; i < n; i++) ss += x[off + i] * x[off + i];
  const inv = 1 / Math.sqrt(ss / n + eps);
  return Float64Array.from(x.subarray(off, off + n), (v) => v * inv);
}

/** silu(v) = v · sigmoid(v). */
export function silu(v: number): number {
  return v / (1 + Math.exp(-v));
}

/** The logistic function. */
export function sigmoid(v: number): number {
  return 1 / (1 + Math.exp(-v));
}

/** softplus(v) = ln(1 + e^v), without overflow for large v. */
export function softplus(v: number): number {
  return v > 0 ? v + Math.log1p(Math.exp(-v)) : Math.log1p(Math.exp(v));
}

/** Numerically stable softmax of `v[0, n)`. */
export function softmax(v: ArrayLike<number>, n = v.length): Float64Array {
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (v[i] > max) max = v[i];
  const out = new Float64Array(n);
  let sum = 0;
  for (let i = 0; i < n; i++) {
    out[i] = Math.exp(v[i] - max);
    sum += out[i];
  }
  for (let i = 0; i < n; i++) out[i] /= sum;
  return out;
}

/** Adds `b` into `a` in place. */
export function addInto(a: Float64Array, b: Float64Array): void {
  for (let i = 0; i < a.length; i++) a[i] += b[i];
}

/** The gated activation of a GLU: act(g, u) for gate and up pre-activations. */
export type GluActivation = (g: number, u: number) => number;

/** SwiGLU's activation: silu(g) · u. */
export const SWIGLU: GluActivation = (g, u) => silu(g) * u;

/**
 * Kimi K3's SiTU-GLU: [β1·tanh(g/β1)·σ(g)] · [β2·tanh(u/β2)]; the sigmoid takes the
 * uncapped g (kimi-k3-in-c tools/k3_ref.py `k3_situ_glu`).
 */
export function situ(beta: number, linearBeta: number): GluActivation {
  return (g, u) =>
    beta * Math.tanh(g / beta) * sigmoid(g) * (linearBeta * Math.tanh(u / linearBeta));
}

/** GELU, tanh approximation (PyTorch's `gelu(approximate="tanh")`, `gelu_pytorch_tanh`). */
export function geluTanh(v: number): number {
  return 0.5 * v * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (v + 0.044715 * v * v * v)));
}

/** GeGLU's activation with the tanh GELU (Gemma): gelu_tanh(g) · u. */
export const GELU_TANH_GLU: GluActivation = (g, u) => geluTanh(g) * u;

/** Soft cap: c · tanh(v / c), in place over `v` (Gemma's final logits). */
export function softcapInto(v: Float64Array, c: number): void {
  for (let i = 0; i < v.length; i++) v[i] = c * Math.tanh(v[i] / c);
}

/** gpt-oss's clamped SwiGLU: (clamp(u, ±limit) + 1) · g·σ(alpha·g) with g = min(gate, limit). */
export function clampedSwiglu(limit: number, alpha: number): GluActivation {
  return (g, u) => {
    const gc = Math.min(g, limit);
    return (Math.min(Math.max(u, -limit), limit) + 1) * gc * sigmoid(alpha * gc);
  };
}

/** DeepSeek-V4's clamped SwiGLU: silu(min(g, limit)) · clamp(u, ±limit). */
export function limitedSwiglu(limit: number): GluActivation {
  return (g, u) => silu(Math.min(g, limit)) * Math.min(Math.max(u, -limit), limit);
}

/**
 * Gated MLP: down(act(gate·x, up·x)), SwiGLU unless `act` says otherwise; gpt-oss's `biases`
 * (of gate, up and down) are added to each projection.
 */
export function swiglu(
  gate: Float32Array,
  up: Float32Array,
  down: Float32Array,
  x: Float64Array,
  inter: number,
  what: string,
  act: GluActivation = SWIGLU,
  biases?: [Float32Array, Float32Array, Float32Array],
): Float64Array {
  const g = matvec(gate, x, inter, x.length, `${what} gate`);
  const u = matvec(up, x, inter, x.length, `${what} up`);
  if (biases) {
    addInto(g, Float64Array.from(biases[0]));
    addInto(u, Float64Array.from(biases[1]));
  }
  for (let i = 0; i < inter; i++) g[i] = act(g[i], u[i]);
  const y = matvec(down, g, x.length, inter, `${what} down`);
  if (biases) addInto(y, Float64Array.from(biases[2]));
  return y;
}

/**
 * Kimi K3's Attention Residual over `sources`: key_i = V_i / sqrt(mean(V_i²) + eps), score_i =
 * key_i · (w_n ⊙ w_p), out = Σ softmax(score)_i · V_i (the values are the raw sources).
 */
export function attnRes(
  sources: Float64Array[],
  norm: Float32Array,
  proj: Float32Array,
  eps: number,
  what: string,
): Float64Array {
  const d = sources[0].length;
  if (norm.length !== d || proj.length !== d) {
    throw new Error(`${what}: weights of ${norm.length}/${proj.length} values, expected ${d}`);
  }
  const scores = sources.map((v) => {
    let ss = 0, dot = 0;
    for (let i = 0; i < d; i++) {
      ss += v[i] * v[i];
      dot += v[i] * norm[i] * proj[i];
    }
    return dot / Math.sqrt(ss / d + eps);
  });
  const p = softmax(scores);
  const out = new Float64Array(d);
  sources.forEach((v, s) => {
    for (let i = 0; i < d; i++) out[i] += p[s] * v[i];
  });
  return out;
}

/** `get` fetching each name once: later calls return the first call's array. */
export function fetchOnce(get: (name: string) => Float32Array): (name: string) => Float32Array {
  const memo = new Map<string, Float32Array>();
  return (name) => {
    let v = memo.get(name);
    if (!v) {
      v = get(name);
      memo.set(name, v);
    }
    return v;
  };
}

/** Hyper-connection weights of one sublayer: its input, post and comb ([j][k]). */
export interface HyperWeights {
  input: Float64Array;
  post: Float64Array;
  comb: Float64Array[];
}

/** m = fn · (X / sqrt(mean(X²) + eps)) over the flattened streams, `rows` mixes. */
function hyperMixes(
  streams: Float64Array[],
  fn: Float32Array,
  rows: number,
  eps: number,
  what: string,
): Float64Array {
  const flat = new Float64Array(streams.length * streams[0].length);
  streams.forEach((s, j) => flat.set(s, j * s.length));
  let ss = 0;
  for (const v of flat) ss += v * v;
  const inv = 1 / Math.sqrt(ss / flat.length + eps);
  return matvec(fn, flat.map((v) => v * inv), rows, flat.length, what);
}

/** Σ_j pre_j · X_j. */
function hyperCollapse(streams: Float64Array[], pre: ArrayLike<number>): Float64Array {
  const out = new Float64Array(streams[0].length);
  streams.forEach((s, j) => {
    for (let i = 0; i < out.length; i++) out[i] += pre[j] * s[i];
  });
  return out;
}

/**
 * The weights of hyper-connections (DeepSeek-V4, transformers `DeepseekV4HyperConnection`) before
 * one sublayer: m = fn · rms(X); pre = σ(m·s0 + b) + eps; post = 2σ(m·s1 + b); comb =
 * softmax_rows(m·s2 + b) + eps, then columns normalised, then `iters` − 1 rounds of rows then
 * columns (each sum + eps); the input is Σ_j pre_j X_j.
 */
export function hyperWeights(
  streams: Float64Array[],
  fn: Float32Array,
  base: Float32Array,
  scale: Float32Array,
  iters: number,
  normEps: number,
  eps: number,
  what: string,
): HyperWeights {
  const n = streams.length;
  if (base.length !== (2 + n) * n || scale.length !== 3) {
    throw new Error(`${what}: base/scale of ${base.length}/${scale.length} values`);
  }
  const m = hyperMixes(streams, fn, (2 + n) * n, normEps, what);
  const pre = Array.from({ length: n }, (_, j) => sigmoid(m[j] * scale[0] + base[j]) + eps);
  const post = Float64Array.from(
    { length: n },
    (_, j) => 2 * sigmoid(m[n + j] * scale[1] + base[n + j]),
  );
  const comb = Array.from({ length: n }, (_, a) => {
    const row = Float64Array.from(
      { length: n },
      (_, b) => m[2 * n + a * n + b] * scale[2] + base[2 * n + a * n + b],
    );
    return softmax(row).map((v) => v + eps);
  });
  const cols = () => {
    for (let b = 0; b < n; b++) {
      let s = 0;
      for (let a = 0; a < n; a++) s += comb[a][b];
      for (let a = 0; a < n; a++) comb[a][b] /= s + eps;
    }
  };
  const rows = () => {
    for (const row of comb) {
      const s = row.reduce((x, y) => x + y, 0);
      for (let b = 0; b < n; b++) row[b] /= s + eps;
    }
  };
  cols();
  for (let i = 1; i < iters; i++) {
    rows();
    cols();
  }
  return { input: hyperCollapse(streams, pre), post, comb };
}

/** The streams after a sublayer with output `y`: X'_k = post_k·y + Σ_j comb[j][k]·X_j. */
export function hyperPost(
  streams: Float64Array[],
  y: Float64Array,
  w: HyperWeights,
): Float64Array[] {
  return streams.map((_, k) => {
    const out = y.map((v) => w.post[k] * v);
    streams.forEach((s, j) => {
      for (let i = 0; i < out.length; i++) out[i] += w.comb[j][k] * s[i];
    });
    return out;
  });
}

/** The hyper head: Σ_j (σ(m_j·scale + base_j) + eps)·X_j with m = fn · rms(X). */
export function hyperHead(
  streams: Float64Array[],
  fn: Float32Array,
  base: Float32Array,
  scale: Float32Array,
  normEps: number,
  eps: number,
): Float64Array {
  const n = streams.length;
  const m = hyperMixes(streams, fn, n, normEps, "hc_head_fn");
  return hyperCollapse(streams, m.map((v, j) => sigmoid(v * scale[0] + base[j]) + eps));
}

/** The streams' unweighted mean (GLM-5.3-Flash's final collapse). */
export function hyperMean(streams: Float64Array[]): Float64Array {
  return hyperCollapse(streams, streams.map(() => 1 / streams.length));
}
