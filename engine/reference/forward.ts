/**
 * The scalar reference forward pass: one token at a time, float64 everywhere, straight from the
 * published model semantics (Hugging Face transformers' Llama, Mixtral, Qwen3-MoE and
 * DeepSeek-V3). It is slow on purpose: it is the oracle the WASM engine is tested against, so it
 * shares no code with the engine beyond the config type, and DeepSeek's MLA is computed in the
 * expanded form (full per-head keys and values) rather than the engine's absorbed form. KDA
 * (Kimi-Linear's linear attention) is the plain token-by-token recurrence with its own conv
 * window, from the formulas of the model card rather than the engine's kernels. Kimi K3
 * (../shared/K3.md) adds KDA's bounded decay and full-rank gate, MLA's output gate, SiTU-GLU,
 * Stable LatentMoE and Attention Residuals.
 *
 * Canonical weight names: `embed`, `final_norm`, `lm_head`, `layers.N.<LayerTensor>` and
 * `experts.N.E.gate|up|down`.
 *
 * @module
 */

import {
  isKdaLayer,
  type LayerTensor,
  layerTensorName,
  type ModelConfig,
} from "../../io/model_config.ts";
import {
  addInto,
  attnRes,
  type GluActivation,
  matvec,
  rmsNorm,
  sigmoid,
  silu,
  situ,
  softmax,
  SWIGLU,
  swiglu,
} from "./math.ts";
import { routeReference } from "./moe_routing.ts";
import { applyRope, ropeAttentionFactor, ropeInvFreq } from "./rope.ts";

/** Returns the float32 values of a weight by canonical name; throws when it does not exist. */
export type WeightGetter = (canonical: string) => Float32Array;

/** Keys and values of one layer, one entry per cached position. */
interface LayerCache {
  keys: Float64Array[];
  values: Float64Array[];
}

/** A KDA layer's recurrent state: per-head S (key rows) and the last K−1 pre-conv q/k/v. */
interface KdaState {
  S: Float64Array;
  /** Oldest first; each entry is [q̃ | k̃ | ṽ] of one past token. */
  window: Float64Array[];
}

/** A model evaluated token by token, with a KV cache per layer. */
export class ReferenceModel {
  /** Per layer: the experts chosen for the last token, in routing order ([] for dense layers). */
  lastRouting: number[][] = [];
  /** The model description the pass follows. */
  readonly cfg: ModelConfig;
  private readonly get: WeightGetter;
  private readonly memo = new Map<string, Float32Array>();
  private readonly invFreq: Float64Array;
  private readonly ropeMagnitude: number;
  private cache: LayerCache[] = [];
  private kdaState: (KdaState | null)[] = [];
  private positions = 0;
  /** The GLU activation of every MLP: SwiGLU, or K3's SiTU-GLU. */
  private readonly act: GluActivation;

  /** `weight` maps a canonical name to its values; each name is fetched once. */
  constructor(cfg: ModelConfig, weight: WeightGetter) {
    this.cfg = cfg;
    this.get = weight;
    this.invFreq = ropeInvFreq(cfg.rope);
    this.ropeMagnitude = ropeAttentionFactor(cfg.rope);
    this.act = cfg.k3 ? situ(cfg.k3.situBeta, cfg.k3.situLinearBeta) : SWIGLU;
    if (cfg.family === "deepseek_v3" && !cfg.mla) {
      throw new Error(`${cfg.modelType}: the deepseek_v3 family needs an MLA config`);
    }
    if (cfg.layerKinds.length !== cfg.numLayers) {
      throw new Error(
        `layerKinds has ${cfg.layerKinds.length} entries for ${cfg.numLayers} layers`,
      );
    }
    this.reset();
  }

  /** Forgets every cached position. */
  reset(): void {
    this.cache = Array.from({ length: this.cfg.numLayers }, () => ({ keys: [], values: [] }));
    const k = this.cfg.kda;
    this.kdaState = Array.from(
      { length: this.cfg.numLayers },
      (_, l) =>
        k && isKdaLayer(this.cfg, l)
          ? { S: new Float64Array(k.numHeads * k.headDim * k.headDim), window: [] }
          : null,
    );
    this.positions = 0;
    this.lastRouting = [];
  }

  /** Number of positions seen (the KV cache length). */
  get length(): number {
    return this.positions;
  }

  /** Logits (float32) for `token` at position `pos`; see {@link forward64}. */
  forward(token: number, pos: number): Float32Array {
    return Float32Array.from(this.forward64(token, pos));
  }

  /**
   * Runs `token` at position `pos` and returns the float64 logits. `pos` must be the next
   * position, or an earlier one, which drops the cache from there on (rewind).
   */
  forward64(token: number, pos: number): Float64Array {
    const cfg = this.cfg;
    if (!Number.isInteger(token) || token < 0 || token >= cfg.vocabSize) {
      throw new Error(`token ${token} is outside the vocabulary [0, ${cfg.vocabSize})`);
    }
    if (!Number.isInteger(pos) || pos < 0 || pos > this.length) {
      throw new Error(
        `position ${pos}: the cache holds ${this.length} positions, expected 0..${this.length}`,
      );
    }
    if (pos >= cfg.maxPositions) {
      throw new Error(`position ${pos} is beyond the model's ${cfg.maxPositions} positions`);
    }
    if (pos < this.length && this.cfg.kda) {
      // A recurrent state cannot rewind except to the start.
      if (pos !== 0) {
        throw new Error(
          `position ${pos}: KDA state is at ${this.length} and can only restart at 0`,
        );
      }
      this.reset();
    }
    for (const c of this.cache) {
      c.keys.length = pos;
      c.values.length = pos;
    }
    this.positions = pos + 1;
    const d = cfg.hiddenSize;
    const eps = cfg.rmsNormEps;
    // x is the residual stream; with Attention Residuals (K3) the running sum of the current
    // block, `blocks` holding the snapshots taken at each block start.
    let x: Float64Array = Float64Array.from(this.w("embed").subarray(token * d, (token + 1) * d));
    const k3 = cfg.k3;
    const blocks: Float64Array[] = [];
    const mix = (l: number, norm: LayerTensor, proj: LayerTensor) =>
      attnRes([...blocks, x], this.lw(l, norm), this.lw(l, proj), eps, `layer ${l} ${norm}`);
    const routing: number[][] = [];
    for (let l = 0; l < cfg.numLayers; l++) {
      const a = k3 && blocks.length ? mix(l, "attn_res_norm", "attn_res_proj") : x;
      const restart = k3 !== undefined && l % k3.attnResBlockSize === 0;
      if (restart) blocks.push(x);
      const h = rmsNorm(a, this.lw(l, "attn_norm"), eps, `layer ${l} attn_norm`);
      const attn = isKdaLayer(cfg, l)
        ? this.kda(l, h)
        : cfg.mla
        ? this.mla(l, h, pos)
        : this.gqa(l, h, pos);
      if (restart) x = attn;
      else addInto(x, attn);
      const m = k3 ? mix(l, "mlp_res_norm", "mlp_res_proj") : x;
      const h2 = rmsNorm(m, this.lw(l, "ffn_norm"), eps, `layer ${l} ffn_norm`);
      if (cfg.layerKinds[l] === "moe") {
        const { out, experts } = this.moe(l, h2);
        addInto(x, out);
        routing.push(experts);
      } else {
        addInto(
          x,
          swiglu(
            this.lw(l, "ffn_gate"),
            this.lw(l, "ffn_up"),
            this.lw(l, "ffn_down"),
            h2,
            cfg.intermediateSize,
            `layer ${l} ffn`,
            this.act,
          ),
        );
        routing.push([]);
      }
    }
    this.lastRouting = routing;
    const final = k3
      ? attnRes([...blocks, x], this.w("out_res_norm"), this.w("out_res_proj"), eps, "out_res")
      : x;
    const xn = rmsNorm(final, this.w("final_norm"), eps, "final_norm");
    const head = this.w(cfg.tieWordEmbeddings ? "embed" : "lm_head");
    return matvec(head, xn, cfg.vocabSize, d, "lm_head");
  }

  private w(name: string): Float32Array {
    let v = this.memo.get(name);
    if (!v) {
      v = this.get(name);
      this.memo.set(name, v);
    }
    return v;
  }

  private lw(layer: number, t: LayerTensor): Float32Array {
    return this.w(layerTensorName(layer, t));
  }

  /** Grouped-query attention with optional biases, q/k RMSNorm per head, and RoPE. */
  private gqa(l: number, h: Float64Array, pos: number): Float64Array {
    const cfg = this.cfg;
    const { numHeads, numKvHeads, headDim, hiddenSize: d } = cfg;
    const proj = (t: "wq" | "wk" | "wv", b: "bq" | "bk" | "bv", heads: number) => {
      const y = matvec(this.lw(l, t), h, heads * headDim, d, `layer ${l} ${t}`);
      if (cfg.attentionBias) addInto(y, Float64Array.from(this.lw(l, b)));
      return y;
    };
    const q = proj("wq", "bq", numHeads);
    const k = proj("wk", "bk", numKvHeads);
    const v = proj("wv", "bv", numKvHeads);
    if (cfg.qkNorm) {
      this.normHeads(q, numHeads, this.lw(l, "q_norm"), `layer ${l} q_norm`);
      this.normHeads(k, numKvHeads, this.lw(l, "k_norm"), `layer ${l} k_norm`);
    }
    for (let hd = 0; hd < numHeads; hd++) this.rope(q, hd * headDim, pos);
    for (let hd = 0; hd < numKvHeads; hd++) this.rope(k, hd * headDim, pos);
    const cache = this.cache[l];
    cache.keys.push(k);
    cache.values.push(v);
    if (numHeads % numKvHeads !== 0) {
      throw new Error(`${numHeads} heads do not share ${numKvHeads} kv heads evenly`);
    }
    const group = numHeads / numKvHeads;
    const out = new Float64Array(numHeads * headDim);
    for (let hd = 0; hd < numHeads; hd++) {
      const kvOff = Math.floor(hd / group) * headDim;
      this.attend(q, hd * headDim, cache, kvOff, kvOff, headDim, headDim, out, hd * headDim);
    }
    return matvec(this.lw(l, "wo"), out, d, numHeads * headDim, `layer ${l} wo`);
  }

  /** DeepSeek-V3 multi-head latent attention, expanded to full per-head keys and values. */
  private mla(l: number, h: Float64Array, pos: number): Float64Array {
    const cfg = this.cfg;
    const mla = cfg.mla!;
    const { numHeads, hiddenSize: d, rmsNormEps: eps } = cfg;
    const nope = mla.qkNopeHeadDim;
    const rope = mla.qkRopeHeadDim;
    const qk = nope + rope;
    const vd = mla.vHeadDim;
    let q: Float64Array;
    if (mla.qLoraRank === null) {
      q = matvec(this.lw(l, "wq"), h, numHeads * qk, d, `layer ${l} wq`);
    } else {
      const qa = matvec(this.lw(l, "wq_a"), h, mla.qLoraRank, d, `layer ${l} wq_a`);
      const qn = rmsNorm(qa, this.lw(l, "q_a_norm"), eps, `layer ${l} q_a_norm`);
      q = matvec(this.lw(l, "wq_b"), qn, numHeads * qk, mla.qLoraRank, `layer ${l} wq_b`);
    }
    const kva = matvec(this.lw(l, "wkv_a"), h, mla.kvLoraRank + rope, d, `layer ${l} wkv_a`);
    const ckv = rmsNorm(
      kva,
      this.lw(l, "kv_a_norm"),
      eps,
      `layer ${l} kv_a_norm`,
      0,
      mla.kvLoraRank,
    );
    const kpe = kva.slice(mla.kvLoraRank);
    if (!mla.nope) this.rope(kpe, 0, pos);
    const kv = matvec(
      this.lw(l, "wkv_b"),
      ckv,
      numHeads * (nope + vd),
      mla.kvLoraRank,
      `layer ${l} wkv_b`,
    );
    const keys = new Float64Array(numHeads * qk);
    const values = new Float64Array(numHeads * vd);
    for (let hd = 0; hd < numHeads; hd++) {
      if (!mla.nope) this.rope(q, hd * qk + nope, pos);
      keys.set(kv.subarray(hd * (nope + vd), hd * (nope + vd) + nope), hd * qk);
      keys.set(kpe, hd * qk + nope);
      values.set(kv.subarray(hd * (nope + vd) + nope, (hd + 1) * (nope + vd)), hd * vd);
    }
    const cache = this.cache[l];
    cache.keys.push(keys);
    cache.values.push(values);
    const out = new Float64Array(numHeads * vd);
    for (let hd = 0; hd < numHeads; hd++) {
      this.attend(q, hd * qk, cache, hd * qk, hd * vd, qk, vd, out, hd * vd);
    }
    if (mla.outputGate) {
      // K3: a sigmoid gate on the heads' values, from the layer's normed input.
      const gate = matvec(this.lw(l, "attn_gate"), h, numHeads * vd, d, `layer ${l} attn_gate`);
      for (let i = 0; i < numHeads * vd; i++) out[i] *= sigmoid(gate[i]);
    }
    return matvec(this.lw(l, "wo"), out, d, numHeads * vd, `layer ${l} wo`);
  }

  /**
   * Kimi Delta Attention for one token: causal short convs with SiLU on q̃/k̃/ṽ, L2-normalised q
   * and k (q also by dk^−½), the forget gate, β, then per head S ← diag(e^g)·S,
   * S ← S + k ⊗ β(v − Sᵀk), o = Sᵀq; gated per-head RMSNorm; o_proj.
   */
  private kda(l: number, h: Float64Array): Float64Array {
    const cfg = this.cfg;
    const k = cfg.kda!;
    const st = this.kdaState[l]!;
    const d = cfg.hiddenSize, H = k.numHeads, dk = k.headDim, p = H * dk, K = k.convKernel;
    const pre = new Float64Array(3 * p);
    (["wq", "wk", "wv"] as const).forEach((t, i) => {
      pre.set(matvec(this.lw(l, t), h, p, d, `layer ${l} ${t}`), i * p);
    });
    st.window.push(pre);
    while (st.window.length > K) st.window.shift();
    const taps = [this.lw(l, "q_conv"), this.lw(l, "k_conv"), this.lw(l, "v_conv")];
    const post = new Float64Array(3 * p);
    for (let c = 0; c < 3 * p; c++) {
      const w = taps[Math.floor(c / p)], ch = c % p;
      let acc = 0;
      // Tap K−1 multiplies the current token; missing (earlier than 0) tokens are zero.
      for (let j = 0; j < K; j++) {
        const back = K - 1 - j;
        const x = st.window[st.window.length - 1 - back];
        if (x) acc += w[ch * K + j] * x[c];
      }
      post[c] = silu(acc);
    }
    const fa = matvec(this.lw(l, "f_a"), h, dk, d, `layer ${l} f_a`);
    const z = matvec(this.lw(l, "f_b"), fa, p, dk, `layer ${l} f_b`);
    const aLog = this.lw(l, "a_log"), dt = this.lw(l, "dt_bias");
    const beta = matvec(this.lw(l, "beta_proj"), h, H, d, `layer ${l} beta_proj`).map(sigmoid);
    // The output gate: K3's one full-rank projection, or Kimi-Linear's low-rank pair.
    const gate = k.fullRankGate
      ? matvec(this.lw(l, "attn_gate"), h, p, d, `layer ${l} attn_gate`)
      : matvec(
        this.lw(l, "g_b"),
        matvec(this.lw(l, "g_a"), h, dk, d, `layer ${l} g_a`),
        p,
        dk,
        `layer ${l} g_b`,
      );
    const y = new Float64Array(p);
    for (let hd = 0; hd < H; hd++) {
      const l2 = (off: number, scale: number) => {
        let ss = 0;
        for (let i = 0; i < dk; i++) ss += post[off + i] ** 2;
        const n = Math.sqrt(ss + 1e-6);
        return Array.from({ length: dk }, (_, i) => post[off + i] / n * scale);
      };
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
      const on = rmsNorm(o, this.lw(l, "o_norm"), cfg.rmsNormEps, `layer ${l} o_norm`);
      for (let c = 0; c < dk; c++) y[hd * dk + c] = on[c] * sigmoid(gate[hd * dk + c]);
    }
    return matvec(this.lw(l, "wo"), y, d, p, `layer ${l} wo`);
  }

  /** Causal softmax attention of one head over every cached position, written into `out`. */
  private attend(
    q: Float64Array,
    qOff: number,
    cache: LayerCache,
    kOff: number,
    vOff: number,
    kDim: number,
    vDim: number,
    out: Float64Array,
    outOff: number,
  ): void {
    const n = cache.keys.length;
    const scores = new Float64Array(n);
    for (let t = 0; t < n; t++) {
      const key = cache.keys[t];
      let s = 0;
      for (let i = 0; i < kDim; i++) s += q[qOff + i] * key[kOff + i];
      scores[t] = s * this.cfg.attnScale;
    }
    const p = softmax(scores);
    for (let t = 0; t < n; t++) {
      const val = cache.values[t];
      for (let i = 0; i < vDim; i++) out[outOff + i] += p[t] * val[vOff + i];
    }
  }

  private rope(v: Float64Array, off: number, pos: number): void {
    applyRope(v, off, pos, this.invFreq, this.cfg.rope.layout, this.ropeMagnitude);
  }

  /** RMSNorm of each head of `v` in place (Qwen3's q_norm / k_norm). */
  private normHeads(v: Float64Array, heads: number, weight: Float32Array, what: string): void {
    const hd = this.cfg.headDim;
    for (let i = 0; i < heads; i++) {
      v.set(rmsNorm(v, weight, this.cfg.rmsNormEps, what, i * hd, hd), i * hd);
    }
  }

  /** Routed experts (plus the shared expert) of a MoE layer. */
  private moe(l: number, h: Float64Array): { out: Float64Array; experts: number[] } {
    const moe = this.cfg.moe;
    if (!moe) throw new Error(`layer ${l} is a MoE layer but the config has no moe section`);
    const d = this.cfg.hiddenSize;
    const logits = matvec(this.lw(l, "router"), h, moe.numExperts, d, `layer ${l} router`);
    const bias = moe.selectionBias ? this.lw(l, "router_bias") : undefined;
    const route = routeReference(moe, logits, bias);
    // K3's Stable LatentMoE: the experts work on a down-projection of h, and their weighted sum
    // is RMS-normed and projected back up.
    const k3 = this.cfg.k3;
    const input = k3
      ? matvec(this.lw(l, "latent_down"), h, k3.latentDim, d, `layer ${l} latent_down`)
      : h;
    const sum = new Float64Array(input.length);
    route.experts.forEach((e, k) => {
      const y = swiglu(
        this.w(`experts.${l}.${e}.gate`),
        this.w(`experts.${l}.${e}.up`),
        this.w(`experts.${l}.${e}.down`),
        input,
        moe.expertIntermediate,
        `layer ${l} expert ${e}`,
        this.act,
      );
      for (let i = 0; i < sum.length; i++) sum[i] += route.weights[k] * y[i];
    });
    const out = k3
      ? matvec(
        this.lw(l, "latent_up"),
        rmsNorm(sum, this.lw(l, "latent_norm"), this.cfg.rmsNormEps, `layer ${l} latent_norm`),
        d,
        k3.latentDim,
        `layer ${l} latent_up`,
      )
      : sum;
    if (moe.sharedIntermediate > 0) {
      addInto(
        out,
        swiglu(
          this.lw(l, "shared_gate"),
          this.lw(l, "shared_up"),
          this.lw(l, "shared_down"),
          h,
          moe.sharedIntermediate,
          `layer ${l} shared expert`,
          this.act,
        ),
      );
    }
    return { out, experts: route.experts };
  }
}
