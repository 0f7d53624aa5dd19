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

/** RMSNorm as in Hugging Face: x / sqrt(mean(x²) + eps) · weight, over `x[off, off + n)`. */
export function rmsNorm(
  x: Float64Array,
  weight: Float32Array,
  eps: number,
  what: string,
  off = 0,
  n = x.length,
): Float64Array {
  if (weight.length !== n) {
    throw new Error(`${what}: norm weight has ${weight.length} values, expected ${n}`);
  }
  let ss = 0;
  for (let i = 0; i < n; i++) ss += x[off + i] * x[off + i];
  const inv = 1 / Math.sqrt(ss / n + eps);
  const y = new Float64Array(n);
  for (let i = 0; i < n; i++) y[i] = x[off + i] * inv * weight[i];
  return y;
}

/** silu(v) = v · sigmoid(v). */
export function silu(v: number): number {
  return v / (1 + Math.exp(-v));
}

/** The logistic function. */
export function sigmoid(v: number): number {
  return 1 / (1 + Math.exp(-v));
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

/** gpt-oss's expert extras: bias vectors of gate, up and down, and the SwiGLU clamp. */
export interface SwigluExtras {
  biases?: [Float32Array, Float32Array, Float32Array];
  clamp?: { limit: number; alpha: number };
}

/**
 * SwiGLU MLP: down(silu(gate·x) ⊙ up·x). gpt-oss: each projection adds its bias, and the
 * activation is (clamp(up, ±limit) + 1) · g·σ(alpha·g) with g = min(gate, limit).
 */
export function swiglu(
  gate: Float32Array,
  up: Float32Array,
  down: Float32Array,
  x: Float64Array,
  inter: number,
  what: string,
  extra: SwigluExtras = {},
): Float64Array {
  const g = matvec(gate, x, inter, x.length, `${what} gate`);
  const u = matvec(up, x, inter, x.length, `${what} up`);
  const b = extra.biases;
  if (b) {
    addInto(g, Float64Array.from(b[0]));
    addInto(u, Float64Array.from(b[1]));
  }
  const c = extra.clamp;
  for (let i = 0; i < inter; i++) {
    if (c) {
      const gc = Math.min(g[i], c.limit);
      g[i] = (Math.min(Math.max(u[i], -c.limit), c.limit) + 1) * gc * sigmoid(c.alpha * gc);
    } else {
      g[i] = silu(g[i]) * u[i];
    }
  }
  const y = matvec(down, g, x.length, inter, `${what} down`);
  if (b) addInto(y, Float64Array.from(b[2]));
  return y;
}
