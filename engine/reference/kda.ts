/**
 * The float64 reference of Kimi Delta Attention (Kimi-Linear's linear-attention layers), token
 * by token as transformers 5.x's `recurrent_kimi_delta_attention` and `causal_conv1d_update`
 * compute it: causal short convs with SiLU on q̃/k̃/ṽ (zero before the first token), q and k
 * L2-normalised per head (q also by dk^−½), the forget gate g per key channel, β per head, then
 * per head S ← diag(e^g)·S, S ← S + k ⊗ β(v − Sᵀk), o = Sᵀq; a per-head RMSNorm of o times
 * σ(W_gb·W_ga·u) (σ(W_g·u) with a full-rank gate); o_proj. It keeps its own conv window and state and shares no math with the
 * engine's kernels.
 *
 * @module
 */
import type { ReferenceAttention } from "./forward.ts";
import { matvec, rmsNorm, sigmoid, silu } from "./math.ts";

/** One KDA layer's recurrent state: per-head S (key rows) and the last pre-conv q̃/k̃/ṽ. */
interface KdaState {
  S: Float64Array;
  /** Oldest first, the current token last; each entry is [q̃ | k̃ | ṽ] of one token. */
  window: Float64Array[];
}

/** KDA attention of layer `l` for the normalised input `h` (one token), through o_proj. */
export const kdaReference: ReferenceAttention = (m, l, h) => {
  const cfg = m.cfg;
  const k = cfg.kda;
  if (!k) throw new Error(`${cfg.modelType}: a KDA layer needs the kda config`);
  const d = cfg.hiddenSize, H = k.numHeads, dk = k.headDim, p = H * dk, K = k.convKernel;
  const st = m.stateOf<KdaState>(l, () => ({ S: new Float64Array(H * dk * dk), window: [] }));
  const pre = new Float64Array(3 * p);
  (["wq", "wk", "wv"] as const).forEach((t, i) => {
    pre.set(matvec(m.lw(l, t), h, p, d, `layer ${l} ${t}`), i * p);
  });
  st.window.push(pre);
  while (st.window.length > K) st.window.shift();
  const taps = [m.lw(l, "q_conv"), m.lw(l, "k_conv"), m.lw(l, "v_conv")];
  const post = new Float64Array(3 * p);
  for (let c = 0; c < 3 * p; c++) {
    const w = taps[Math.floor(c / p)], ch = c % p;
    let acc = 0;
    // Tap K−1 multiplies the current token, tap j the token K−1−j back.
    for (let j = 0; j < K; j++) {
      const x = st.window[st.window.length - K + j];
      if (x) acc += w[ch * K + j] * x[c];
    }
    post[c] = silu(acc);
  }
  const fa = matvec(m.lw(l, "f_a"), h, dk, d, `layer ${l} f_a`);
  const z = matvec(m.lw(l, "f_b"), fa, p, dk, `layer ${l} f_b`);
  const aLog = m.lw(l, "a_log"), dt = m.lw(l, "dt_bias");
  const beta = matvec(m.lw(l, "beta_proj"), h, H, d, `layer ${l} beta_proj`).map(sigmoid);
  const gate = k.fullRankOutputGate
    ? matvec(m.lw(l, "g_proj"), h, p, d, `layer ${l} g_proj`)
    : matvec(
      m.lw(l, "g_b"),
      matvec(m.lw(l, "g_a"), h, dk, d, `layer ${l} g_a`),
      p,
      dk,
      `layer ${l} g_b`,
    );
  const y = new Float64Array(p);
  const l2 = (off: number, scale: number) => {
    let ss = 0;
    for (let i = 0; i < dk; i++) ss += post[off + i] ** 2;
    const n = Math.sqrt(ss + 1e-6);
    return Array.from({ length: dk }, (_, i) => post[off + i] / n * scale);
  };
  for (let hd = 0; hd < H; hd++) {
    const q = l2(hd * dk, 1 / Math.sqrt(dk));
    const kv = l2(p + hd * dk, 1);
    const v = post.subarray(2 * p + hd * dk, 2 * p + (hd + 1) * dk);
    const S = st.S.subarray(hd * dk * dk, (hd + 1) * dk * dk);
    const a = Math.exp(aLog[hd]);
    for (let i = 0; i < dk; i++) {
      const x = z[hd * dk + i] + dt[hd * dk + i];
      const g = k.gateLowerBound === null
        ? -a * (x > 20 ? x : Math.log(1 + Math.exp(x)))
        : k.gateLowerBound * sigmoid(a * x);
      const decay = Math.exp(g);
      for (let c = 0; c < dk; c++) S[i * dk + c] *= decay;
    }
    for (let c = 0; c < dk; c++) {
      let u = 0;
      for (let i = 0; i < dk; i++) u += kv[i] * S[i * dk + c];
      const delta = beta[hd] * (v[c] - u);
      for (let i = 0; i < dk; i++) S[i * dk + c] += kv[i] * delta;
    }
    const o = new Float64Array(dk);
    for (let c = 0; c < dk; c++) {
      for (let i = 0; i < dk; i++) o[c] += q[i] * S[i * dk + c];
    }
    const on = rmsNorm(o, m.lw(l, "o_norm"), cfg.rmsNormEps, `layer ${l} o_norm`);
    for (let c = 0; c < dk; c++) y[hd * dk + c] = on[c] * sigmoid(gate[hd * dk + c]);
  }
  return matvec(m.lw(l, "wo"), y, d, p, `layer ${l} wo`);
};
