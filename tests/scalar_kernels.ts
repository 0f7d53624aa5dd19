/**
 * Scalar TypeScript versions of every kernel in wasm/mod.ts, on plain typed arrays. They define
 * the semantics the tests hold the kernels to. Reductions (dot products, sums of squares, softmax
 * sums) run in float64 and round to f32 once at the store, so they are more accurate than the
 * kernels, which are compared with a tolerance. Element-wise arithmetic (add, axpy, scale, RoPE)
 * rounds to f32 after every operation exactly as the kernels do, so those compare bit for bit.
 *
 * @module
 */

const f32 = Math.fround;
const scratch = new DataView(new ArrayBuffer(4));

/** The f32 whose top 16 bits are `h` (bf16 → f32 is exact). */
export function bf16ToF32(h: number): number {
  scratch.setUint32(0, (h & 0xffff) << 16);
  return scratch.getFloat32(0);
}

/** IEEE binary16 `h` as a number (exact), NaN payloads aside. */
export function f16ToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 31) return mant === 0 ? sign * Infinity : NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** A weight matrix in any stored type, decoded element by element. */
export type Weights =
  | { type: "f32"; data: Float32Array }
  | { type: "bf16"; data: Uint16Array }
  | { type: "f16"; data: Uint16Array };

/** Element i of `w` as a number. */
export function weightAt(w: Weights, i: number): number {
  if (w.type === "f32") return w.data[i];
  return w.type === "bf16" ? bf16ToF32(w.data[i]) : f16ToF32(w.data[i]);
}

/** y[r] = Σ_c W[r·cols + c]·x[c] for every row (gemv_f32 / gemv_bf16 / gemv_f16). */
export function gemvRef(w: Weights, x: Float32Array, rows: number, cols: number): Float32Array {
  const y = new Float32Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    for (let c = 0; c < cols; c++) s += weightAt(w, r * cols + c) * x[c];
    y[r] = s;
  }
  return y;
}

/** Σ_c |W[r,c]·x[c]| per row: the scale against which a dot product's rounding is judged. */
export function gemvAbsRef(w: Weights, x: Float32Array, rows: number, cols: number): Float64Array {
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    for (let c = 0; c < cols; c++) s += Math.abs(weightAt(w, r * cols + c) * x[c]);
    y[r] = s;
  }
  return y;
}

/** Y[b·rows + r] = Σ_c W[r,c]·X[b·cols + c] for b < nb (gemm_f32 / gemm_bf16). */
export function gemmRef(
  w: Weights,
  X: Float32Array,
  rows: number,
  cols: number,
  nb: number,
): Float32Array {
  const Y = new Float32Array(nb * rows);
  for (let b = 0; b < nb; b++) {
    Y.set(gemvRef(w, X.subarray(b * cols, (b + 1) * cols), rows, cols), b * rows);
  }
  return Y;
}

/** x / sqrt(mean(x²) + eps) · w (rmsnorm_f32). */
export function rmsnormRef(x: Float32Array, w: Float32Array, eps: number): Float32Array {
  let ss = 0;
  for (const v of x) ss += v * v;
  const inv = 1 / Math.sqrt(ss / x.length + f32(eps));
  return Float32Array.from(x, (v, i) => v * inv * w[i]);
}

/** rmsnormRef applied to each of nrows consecutive rows of n (rmsnorm_rows_f32). */
export function rmsnormRowsRef(
  x: Float32Array,
  w: Float32Array,
  n: number,
  nrows: number,
  eps: number,
): Float32Array {
  const y = new Float32Array(n * nrows);
  for (let r = 0; r < nrows; r++) y.set(rmsnormRef(x.subarray(r * n, (r + 1) * n), w, eps), r * n);
  return y;
}

/** RoPE in place on `x` (rope_f32): pair (a, b) → (a·cos − b·sin, b·cos + a·sin), f32 ops. */
export function ropeRef(
  x: Float32Array,
  nheads: number,
  headStride: number,
  rotDim: number,
  cos: Float32Array,
  sin: Float32Array,
  interleaved: boolean,
): void {
  const half = rotDim >> 1;
  for (let h = 0; h < nheads; h++) {
    const base = h * headStride;
    for (let i = 0; i < half; i++) {
      const ia = base + (interleaved ? 2 * i : i);
      const ib = base + (interleaved ? 2 * i + 1 : half + i);
      const a = x[ia], b = x[ib];
      x[ia] = f32(f32(a * cos[i]) - f32(b * sin[i]));
      x[ib] = f32(f32(b * cos[i]) + f32(a * sin[i]));
    }
  }
}

/** Softmax (softmax_f32): NaN or +Inf anywhere → all NaN; all −Inf → uniform 1/n. */
export function softmaxRef(x: Float32Array): Float32Array {
  let m = -Infinity;
  for (const v of x) m = Number.isNaN(v) || Number.isNaN(m) ? NaN : Math.max(m, v);
  if (m === -Infinity) return new Float32Array(x.length).fill(1 / x.length);
  const e = Array.from(x, (v) => Math.exp(v - m));
  const s = e.reduce((a, b) => a + b, 0);
  return Float32Array.from(e, (v) => v / s);
}

/** silu(g)·u (silu_mul_f32), silu(g) = g / (1 + e^−g). */
export function siluMulRef(g: Float32Array, u: Float32Array): Float32Array {
  return Float32Array.from(g, (v, i) => v / (1 + Math.exp(-v)) * u[i]);
}

/** 1 / (1 + e^−x) (sigmoid_f32). */
export function sigmoidRef(x: Float32Array): Float32Array {
  return Float32Array.from(x, (v) => 1 / (1 + Math.exp(-v)));
}

/** e^x (exp_f32). */
export function expRef(x: Float32Array): Float32Array {
  return Float32Array.from(x, Math.exp);
}

/** y + x (add_f32). */
export function addRef(y: Float32Array, x: Float32Array): Float32Array {
  return Float32Array.from(y, (v, i) => v + x[i]);
}

/** y + f32(a·x) (axpy_f32: the product is rounded before the sum). */
export function axpyRef(y: Float32Array, x: Float32Array, a: number): Float32Array {
  return Float32Array.from(y, (v, i) => v + f32(f32(a) * x[i]));
}

/** y·a (scale_f32). */
export function scaleRef(y: Float32Array, a: number): Float32Array {
  return Float32Array.from(y, (v) => v * f32(a));
}

/** True when value v at a higher index ranks before u at a lower index: NaN highest, then >. */
function laterRanksBefore(v: number, u: number): boolean {
  return Number.isNaN(v) ? !Number.isNaN(u) : v > u;
}

/** Index of the first maximum; first NaN if any; −1 for an empty x (argmax_f32). */
export function argmaxRef(x: Float32Array): number {
  if (x.length === 0) return -1;
  let best = 0;
  for (let i = 1; i < x.length; i++) if (laterRanksBefore(x[i], x[best])) best = i;
  return best;
}

/** The k best indices, best first, ties to the lower index, −1 beyond x.length (topk_f32). */
export function topkRef(x: Float32Array, k: number): Int32Array {
  const rank = (i: number, j: number): number => {
    const ni = Number.isNaN(x[i]), nj = Number.isNaN(x[j]);
    if (ni !== nj) return ni ? -1 : 1;
    if (!ni && x[i] !== x[j]) return x[i] > x[j] ? -1 : 1;
    return i - j;
  };
  const order = Array.from(x, (_, i) => i).sort(rank);
  const out = new Int32Array(k).fill(-1);
  out.set(order.slice(0, k));
  return out;
}

/** Shapes and strides of attention calls (attention_f32), strides in floats. */
export interface AttentionShape {
  nHeads: number;
  nKvHeads: number;
  headDim: number;
  vHeadDim: number;
  kStride: number;
  vStride: number;
  scale: number;
}

/** Where a query's keys are: a sliding window, a ring of slots, sink logits (attention_f32). */
export interface AttentionKeys {
  /** Position p sees p − window + 1 .. p; 0 or absent: every earlier position. */
  window?: number;
  /** Position x's key is in slot x mod slots; 0 or absent: slot x. */
  slots?: number;
  /** One logit per query head that joins the softmax denominator only. */
  sinks?: Float32Array;
}

/**
 * Causal attention of one query token at position `pos` for all heads, in float64 with a plain
 * softmax over all its keys at once; returns nHeads·vHeadDim values.
 */
export function attentionRef(
  q: Float32Array,
  kcache: Float32Array,
  vcache: Float32Array,
  s: AttentionShape,
  pos: number,
  keys: AttentionKeys = {},
): Float64Array {
  const out = new Float64Array(s.nHeads * s.vHeadDim);
  const group = s.nHeads / s.nKvHeads;
  const start = keys.window ? Math.max(0, pos - keys.window + 1) : 0;
  const slot = (x: number) => keys.slots ? x % keys.slots : x;
  for (let h = 0; h < s.nHeads; h++) {
    const g = Math.floor(h / group);
    const scores: number[] = [];
    for (let x = start; x <= pos; x++) {
      let d = 0;
      for (let i = 0; i < s.headDim; i++) {
        d += q[h * s.headDim + i] * kcache[slot(x) * s.kStride + g * s.headDim + i];
      }
      scores.push(f32(s.scale) * d);
    }
    const sink = keys.sinks ? keys.sinks[h] : -Infinity;
    const m = Math.max(...scores, sink);
    const e = scores.map((v) => Math.exp(v - m));
    const sum = e.reduce((a, v) => a + v, 0) + Math.exp(sink - m);
    for (let i = 0; i < s.vHeadDim; i++) {
      let o = 0;
      e.forEach((w, t) => o += w * vcache[slot(start + t) * s.vStride + g * s.vHeadDim + i]);
      out[h * s.vHeadDim + i] = o / sum;
    }
  }
  return out;
}

/** gpt-oss's clamped SwiGLU (swiglu_clamped_f32). */
export function swigluClampedRef(
  g: Float32Array,
  u: Float32Array,
  limit: number,
  alpha: number,
): Float32Array {
  return Float32Array.from(g, (v, i) => {
    const gate = Math.min(v, limit);
    const up = Math.min(Math.max(u[i], -limit), limit);
    return (up + 1) * gate / (1 + Math.exp(-alpha * gate));
  });
}

/** Shape of a delta-rule call (see {@link kdaRecurrentRef}). */
export interface KdaShape {
  T: number;
  /** Key heads. */
  nHeads: number;
  dk: number;
  dv: number;
  /** Value heads per key head (Gated DeltaNet); 1 when absent (KDA). */
  ratio?: number;
  /** Log-decays per value head: dk when absent (KDA, per key channel), or 1 (Gated DeltaNet). */
  gChannels?: number;
}

/**
 * The gated delta rule in float64, straight from its definition, over T tokens laid out densely
 * (q, k: [T][nHeads][dk]; v, out: [T][nHeads·ratio][dv]; g: [T][nHeads·ratio][gChannels];
 * beta: [T][nHeads·ratio]); value head j reads key head j / ratio; q and k are raw (this
 * normalises them), g is the log-decay of each key row, or of the whole head. `S`
 * (nHeads·ratio·dk·dv, key rows) is updated in place.
 */
export function kdaRecurrentRef(
  S: Float64Array,
  q: ArrayLike<number>,
  k: ArrayLike<number>,
  v: ArrayLike<number>,
  g: ArrayLike<number>,
  beta: ArrayLike<number>,
  s: KdaShape,
): Float64Array {
  const { T, nHeads: H, dk, dv } = s;
  const r = s.ratio ?? 1, gc = s.gChannels ?? dk, V = H * r;
  const out = new Float64Array(T * V * dv);
  const norm = (x: ArrayLike<number>, off: number, scale: number) => {
    let ss = 0;
    for (let i = 0; i < dk; i++) ss += x[off + i] ** 2;
    const n = Math.sqrt(ss + 1e-6);
    return Array.from({ length: dk }, (_, i) => x[off + i] / n * scale);
  };
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < V; h++) {
      const kh0 = Math.floor(h / r);
      const qh = norm(q, (t * H + kh0) * dk, 1 / Math.sqrt(dk));
      const kh = norm(k, (t * H + kh0) * dk, 1);
      const base = h * dk * dv;
      const u = new Float64Array(dv);
      for (let i = 0; i < dk; i++) {
        const a = Math.exp(g[(t * V + h) * gc + (gc === 1 ? 0 : i)]);
        for (let c = 0; c < dv; c++) {
          S[base + i * dv + c] *= a;
          u[c] += kh[i] * S[base + i * dv + c];
        }
      }
      const b = beta[t * V + h];
      for (let i = 0; i < dk; i++) {
        for (let c = 0; c < dv; c++) {
          S[base + i * dv + c] += kh[i] * b * (v[(t * V + h) * dv + c] - u[c]);
        }
      }
      for (let c = 0; c < dv; c++) {
        let o = 0;
        for (let i = 0; i < dk; i++) o += qh[i] * S[base + i * dv + c];
        out[(t * V + h) * dv + c] = o;
      }
    }
  }
  return out;
}

/**
 * Causal depthwise conv of width K with SiLU in float64: x is [T][channels], w [channels][K],
 * `state` the K−1 previous inputs ([K−1][channels], oldest first), advanced in place.
 */
export function shortConvRef(
  x: ArrayLike<number>,
  state: Float64Array,
  w: ArrayLike<number>,
  T: number,
  channels: number,
  K: number,
): Float64Array {
  const hist = K - 1;
  const seq = [...state.subarray(0, hist * channels), ...Array.from(x).slice(0, T * channels)];
  const y = new Float64Array(T * channels);
  for (let t = 0; t < T; t++) {
    for (let c = 0; c < channels; c++) {
      let acc = 0;
      for (let j = 0; j < K; j++) acc += w[c * K + j] * seq[(t + j) * channels + c];
      y[t * channels + c] = acc / (1 + Math.exp(-acc));
    }
  }
  state.set(seq.slice(T * channels, (T + hist) * channels));
  return y;
}

// Gemma 4 (kernels/elementwise.c): in float64, rounded once.

/** gelu_tanh(g)·u with PyTorch's tanh GELU (gelu_tanh_mul_f32). */
export function geluTanhMulRef(g: Float32Array, u: Float32Array): Float32Array {
  return g.map((x, i) =>
    0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3))) * u[i]
  );
}

/** cap·tanh(x/cap) (softcap_f32). */
export function softcapRef(x: Float32Array, cap: number): Float32Array {
  return x.map((v) => cap * Math.tanh(v / cap));
}

// Kimi K3 (kernels/kimi_k3.c): transcendentals and reductions in float64, rounded once.

/** SiTU(g, u) = [β·tanh(g/β)·σ(g)]·[β₂·tanh(u/β₂)] (situ_mul_f32). */
export function situMulRef(
  g: Float32Array,
  u: Float32Array,
  beta: number,
  linearBeta: number,
): Float32Array {
  return g.map((x, i) =>
    beta * Math.tanh(x / beta) * (1 / (1 + Math.exp(-x))) *
    (linearBeta * Math.tanh(u[i] / linearBeta))
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

/** DeepSeek-V4's clamped SwiGLU: silu(min(g, limit)) · clamp(u, ±limit) (swiglu_limit_f32). */
export function swigluLimitRef(g: Float32Array, u: Float32Array, limit: number): Float32Array {
  return Float32Array.from(g, (v, i) => {
    const gate = Math.min(v, limit);
    return gate / (1 + Math.exp(-gate)) * Math.min(Math.max(u[i], -limit), limit);
  });
}

/**
 * Entry w of a DeepSeek-V4 compressor (csa_compress_f32): `c(p, ch)` and `z(p, ch)` are position
 * p's kv and gate projections; the slots are window w's positions (indexed: after the previous
 * window's, whose first halves they read), softmax per channel of z + ape over the slots.
 */
export function csaCompressRef(
  c: (p: number, ch: number) => number,
  z: (p: number, ch: number) => number,
  ape: Float32Array,
  ratio: number,
  width: number,
  indexed: boolean,
  w: number,
): Float32Array {
  const span = indexed ? 2 * width : width;
  const slots: [number, number][] = [];
  if (indexed && w > 0) { for (let j = 0; j < ratio; j++) slots.push([(w - 1) * ratio + j, 0]); }
  for (let j = 0; j < ratio; j++) slots.push([w * ratio + j, indexed ? width : 0]);
  return Float32Array.from({ length: width }, (_, i) => {
    const logit = slots.map(([p, o]) => z(p, o + i) + ape[(p % ratio) * span + o + i]);
    const max = Math.max(...logit);
    const e = logit.map((v) => Math.exp(v - max));
    const sum = e.reduce((a, b) => a + b, 0);
    return slots.reduce((acc, [p, o], s) => acc + (e[s] / sum) * c(p, o + i), 0);
  });
}

/** The Lightning indexer's scores (csa_index_scores_f32): Σ_h weight_h · max(0, q_h · key). */
export function csaIndexScoresRef(
  q: Float32Array,
  heads: number,
  weights: Float32Array,
  keys: Float32Array[],
): Float32Array {
  const dim = q.length / heads;
  return Float32Array.from(keys, (k) => {
    let s = 0;
    for (let h = 0; h < heads; h++) {
      let d = 0;
      for (let j = 0; j < dim; j++) d += q[h * dim + j] * k[j];
      s += weights[h] * Math.max(0, d);
    }
    return s;
  });
}
