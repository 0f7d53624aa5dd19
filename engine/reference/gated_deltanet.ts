/**
 * The float64 reference of a Gated DeltaNet layer (Qwen3-Next, Qwen3.5/3.6-MoE), token by token
 * as transformers 5.18's `torch_recurrent_gated_delta_rule` and `causal_conv1d_update` compute
 * it: the q/k/v projection through a causal depthwise conv with SiLU (zero before the first
 * token), q and k L2-normalised per key head (x·(Σx² + 1e−6)^−½) and q scaled by dk^−½, value
 * head j reading key head j / (value heads / key heads), β = σ(b), the decay
 * g = −exp(A_log)·softplus(a + dt_bias) (softplus(x) = x above 20), then per value head
 * S ← e^g·S, S ← S + k ⊗ β(v − Sᵀk), o = Sᵀq; an RMSNorm of each head's o with its plain weight
 * times SiLU(z); out_proj. Qwen3-Next's fused projections (one block per key head) are split
 * here on their own. It keeps its own conv window and state and shares no math with the engine.
 *
 * @module
 */
import type { GatedDeltaNetConfig } from "../../io/model_config.ts";
import type { ReferenceAttention, ReferenceContext } from "./forward.ts";
import { matvec, rmsNorm, sigmoid, silu } from "./math.ts";

/** One layer's recurrent state: per value head S (key rows) and the last pre-conv q/k/v. */
interface GdnState {
  S: Float64Array;
  /** Oldest first, the current token last; each entry is one token's [q | k | v]. */
  window: Float64Array[];
}

/** The projections of one token: q/k/v (flat order, before the conv), z, b and a. */
interface GdnInputs {
  qkv: Float64Array;
  z: Float64Array;
  b: Float64Array;
  a: Float64Array;
}

/**
 * Projects `h` and returns q/k/v in flat order [q of every key head | k of every key head |
 * v of every value head] and z, b, a per value head, from either storage.
 */
function project(m: ReferenceContext, l: number, h: Float64Array): GdnInputs {
  const g = m.cfg.gdn!;
  const d = m.cfg.hiddenSize, Hk = g.numKeyHeads, Hv = g.numValueHeads;
  const dk = g.keyHeadDim, dv = g.valueHeadDim, r = Hv / Hk;
  const qk = Hk * dk, vDim = Hv * dv;
  const mv = (t: Parameters<ReferenceContext["lw"]>[1], rows: number) =>
    matvec(m.lw(l, t), h, rows, d, `layer ${l} ${t}`);
  if (g.projections === "flat") {
    return {
      qkv: mv("gdn_qkv", 2 * qk + vDim),
      z: mv("gdn_z", vDim),
      b: mv("gdn_b", Hv),
      a: mv("gdn_a", Hv),
    };
  }
  // Qwen3-Next: per key head i, [q_i | k_i | v of its r value heads | z of them], and
  // [b of its r value heads | a of them].
  const block = 2 * dk + 2 * r * dv;
  const qkvz = mv("gdn_qkvz", Hk * block);
  const ba = mv("gdn_ba", Hk * 2 * r);
  const out: GdnInputs = {
    qkv: new Float64Array(2 * qk + vDim),
    z: new Float64Array(vDim),
    b: new Float64Array(Hv),
    a: new Float64Array(Hv),
  };
  for (let i = 0; i < Hk; i++) {
    const at = i * block;
    out.qkv.set(qkvz.subarray(at, at + dk), i * dk);
    out.qkv.set(qkvz.subarray(at + dk, at + 2 * dk), qk + i * dk);
    out.qkv.set(qkvz.subarray(at + 2 * dk, at + 2 * dk + r * dv), 2 * qk + i * r * dv);
    out.z.set(qkvz.subarray(at + 2 * dk + r * dv, at + block), i * r * dv);
    out.b.set(ba.subarray(i * 2 * r, i * 2 * r + r), i * r);
    out.a.set(ba.subarray(i * 2 * r + r, (i + 1) * 2 * r), i * r);
  }
  return out;
}

/** x·(Σx² + 1e−6)^−½·scale over `n` values from `off`. */
function l2(x: Float64Array, off: number, n: number, scale: number): Float64Array {
  let ss = 0;
  for (let i = 0; i < n; i++) ss += x[off + i] ** 2;
  const inv = 1 / Math.sqrt(ss + 1e-6);
  return Float64Array.from({ length: n }, (_, i) => x[off + i] * inv * scale);
}

/** The model's Gated DeltaNet config, or an error naming its model_type. */
function gdnOf(m: ReferenceContext): GatedDeltaNetConfig {
  const g = m.cfg.gdn;
  if (!g) throw new Error(`${m.cfg.modelType}: a Gated DeltaNet layer needs the gdn config`);
  return g;
}

/** Gated DeltaNet of layer `l` for the normalised input `h` (one token), through out_proj. */
export const gatedDeltaNetReference: ReferenceAttention = (m, l, h) => {
  const g = gdnOf(m);
  const d = m.cfg.hiddenSize, Hk = g.numKeyHeads, Hv = g.numValueHeads;
  const dk = g.keyHeadDim, dv = g.valueHeadDim, K = g.convKernel, r = Hv / Hk;
  if (!Number.isInteger(r)) throw new Error(`${Hv} value heads do not share ${Hk} key heads`);
  const C = 2 * Hk * dk + Hv * dv;
  const st = m.stateOf<GdnState>(l, () => ({ S: new Float64Array(Hv * dk * dv), window: [] }));
  const inp = project(m, l, h);
  st.window.push(inp.qkv);
  while (st.window.length > K) st.window.shift();
  const w = m.lw(l, "qkv_conv");
  const c = new Float64Array(C);
  for (let ch = 0; ch < C; ch++) {
    let acc = 0;
    // Tap K−1 multiplies the current token, tap j the token K−1−j back.
    for (let j = 0; j < K; j++) {
      const x = st.window[st.window.length - K + j];
      if (x) acc += w[ch * K + j] * x[ch];
    }
    c[ch] = silu(acc);
  }
  const aLog = m.lw(l, "a_log"), dt = m.lw(l, "dt_bias"), normW = m.lw(l, "o_norm");
  const y = new Float64Array(Hv * dv);
  for (let j = 0; j < Hv; j++) {
    const kh = Math.floor(j / r);
    const q = l2(c, kh * dk, dk, 1 / Math.sqrt(dk));
    const k = l2(c, Hk * dk + kh * dk, dk, 1);
    const v = c.subarray(2 * Hk * dk + j * dv, 2 * Hk * dk + (j + 1) * dv);
    const beta = sigmoid(inp.b[j]);
    const x = inp.a[j] + dt[j];
    const decay = Math.exp(-Math.exp(aLog[j]) * (x > 20 ? x : Math.log1p(Math.exp(x))));
    const S = st.S.subarray(j * dk * dv, (j + 1) * dk * dv);
    for (let i = 0; i < dk * dv; i++) S[i] *= decay;
    for (let col = 0; col < dv; col++) {
      let u = 0;
      for (let i = 0; i < dk; i++) u += k[i] * S[i * dv + col];
      const delta = beta * (v[col] - u);
      for (let i = 0; i < dk; i++) S[i * dv + col] += k[i] * delta;
    }
    const o = new Float64Array(dv);
    for (let col = 0; col < dv; col++) {
      for (let i = 0; i < dk; i++) o[col] += q[i] * S[i * dv + col];
    }
    const on = rmsNorm(o, normW, m.cfg.rmsNormEps, `layer ${l} o_norm`);
    for (let col = 0; col < dv; col++) y[j * dv + col] = on[col] * silu(inp.z[j * dv + col]);
  }
  return matvec(m.lw(l, "wo"), y, d, Hv * dv, `layer ${l} wo`);
};
