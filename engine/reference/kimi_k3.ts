/**
 * The float64 reference pass of Kimi K3 (../shared/K3.md is the spec it follows): KDA layers with
 * the lower-bounded decay and the full-rank output gate, gated NoPE MLA in the expanded form,
 * Stable LatentMoE with SiTU-GLU, and Attention Residuals. One token at a time with the carried
 * state (KDA's recurrent state and conv history, MLA's keys and values); slow on purpose, and it
 * shares no code with the engine beyond the config type.
 *
 * @module
 */
import { type LayerTensor, layerTensorName, type ModelConfig } from "../../io/model_config.ts";
import type { WeightGetter } from "./forward.ts";
import { addInto, matvec, rmsNorm, sigmoid, silu, softmax } from "./math.ts";
import { routeReference } from "./moe_routing.ts";

/** SiTU(g, u) = [β1·tanh(g/β1)·σ(g)] · [β2·tanh(u/β2)]; the sigmoid takes the uncapped g. */
export function situ(g: number, u: number, beta: number, linearBeta: number): number {
  return beta * Math.tanh(g / beta) * sigmoid(g) * (linearBeta * Math.tanh(u / linearBeta));
}

/**
 * Attention Residuals over `sources`: key_i = V_i / rms(V_i), score_i = key_i · (w_n ⊙ w_p),
 * out = Σ softmax(score)_i · V_i (the values are the raw sources).
 */
export function attnRes(
  sources: Float64Array[],
  norm: Float32Array,
  proj: Float32Array,
  eps: number,
): Float64Array {
  const d = sources[0].length;
  if (norm.length !== d || proj.length !== d) {
    throw new Error(`attention residual: weights of ${norm.length}/${proj.length}, expected ${d}`);
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

/** x / sqrt(Σ x² + 1e-6) over x[off, off + n), in place. */
function l2NormInPlace(x: Float64Array, off: number, n: number): void {
  let ss = 0;
  for (let i = 0; i < n; i++) ss += x[off + i] * x[off + i];
  const inv = 1 / Math.sqrt(ss + 1e-6);
  for (let i = 0; i < n; i++) x[off + i] *= inv;
}

/** KDA state of one layer: per head S [D_k, D_v], and the last K−1 pre-conv q, k, v inputs. */
interface KdaState {
  s: Float64Array[];
  history: { q: Float64Array[]; k: Float64Array[]; v: Float64Array[] };
}

/** Keys and values of one MLA layer, one entry per cached position. */
interface MlaCache {
  keys: Float64Array[];
  values: Float64Array[];
}

/** Kimi K3 evaluated token by token. */
export class KimiK3Reference {
  /** Per layer: the experts chosen for the last token, in routing order ([] for dense layers). */
  lastRouting: number[][] = [];
  /** The model description the pass follows. */
  readonly cfg: ModelConfig;
  private readonly get: WeightGetter;
  private readonly memo = new Map<string, Float32Array>();
  private kda: KdaState[] = [];
  private mla: MlaCache[] = [];
  private positions = 0;

  /** `weight` maps a canonical name to its values; each name is fetched once. */
  constructor(cfg: ModelConfig, weight: WeightGetter) {
    if (!cfg.k3 || !cfg.mla || !cfg.moe) {
      throw new Error(`${cfg.modelType}: the Kimi K3 reference needs the k3, mla and moe sections`);
    }
    this.cfg = cfg;
    this.get = weight;
    this.reset();
  }

  /** Forgets every position (zero state, empty caches). */
  reset(): void {
    const { numHeads: H, headDim: D, convKernel: K } = this.cfg.k3!.kda;
    this.kda = Array.from({ length: this.cfg.numLayers }, () => ({
      s: Array.from({ length: H }, () => new Float64Array(D * D)),
      history: {
        q: Array.from({ length: K - 1 }, () => new Float64Array(H * D)),
        k: Array.from({ length: K - 1 }, () => new Float64Array(H * D)),
        v: Array.from({ length: K - 1 }, () => new Float64Array(H * D)),
      },
    }));
    this.mla = Array.from({ length: this.cfg.numLayers }, () => ({ keys: [], values: [] }));
    this.positions = 0;
    this.lastRouting = [];
  }

  /** Positions run so far. */
  get length(): number {
    return this.positions;
  }

  /** Logits (float32) for `token` at position `pos`; see {@link forward64}. */
  forward(token: number, pos: number): Float32Array {
    return Float32Array.from(this.forward64(token, pos));
  }

  /**
   * Runs `token` at position `pos` and returns the float64 logits. `pos` must be the next
   * position, or 0, which starts over (KDA's state cannot be rewound to a middle position).
   */
  forward64(token: number, pos: number): Float64Array {
    const cfg = this.cfg;
    const k3 = cfg.k3!;
    if (!Number.isInteger(token) || token < 0 || token >= cfg.vocabSize) {
      throw new Error(`token ${token} is outside the vocabulary [0, ${cfg.vocabSize})`);
    }
    if (pos === 0) this.reset();
    if (pos !== this.positions) {
      throw new Error(`position ${pos}: the state holds ${this.positions} positions`);
    }
    const d = cfg.hiddenSize, eps = cfg.rmsNormEps;
    let prefix: Float64Array | null = Float64Array.from(
      this.w("embed").subarray(token * d, (token + 1) * d),
    );
    const blocks: Float64Array[] = [];
    const routing: number[][] = [];
    for (let l = 0; l < cfg.numLayers; l++) {
      const p: Float64Array = prefix!;
      const a = blocks.length
        ? attnRes([...blocks, p], this.lw(l, "attn_res_norm"), this.lw(l, "attn_res_proj"), eps)
        : p;
      if (l % k3.attnResBlockSize === 0) {
        blocks.push(p);
        prefix = null;
      }
      const h = rmsNorm(a, this.lw(l, "attn_norm"), eps, `layer ${l} attn_norm`);
      const t = k3.attention[l] === "kda" ? this.kdaLayer(l, h) : this.mlaLayer(l, h);
      if (prefix) addInto(prefix, t);
      else prefix = t;
      const cur: Float64Array = prefix;
      const m = attnRes(
        [...blocks, cur],
        this.lw(l, "mlp_res_norm"),
        this.lw(l, "mlp_res_proj"),
        eps,
      );
      const h2 = rmsNorm(m, this.lw(l, "ffn_norm"), eps, `layer ${l} ffn_norm`);
      if (cfg.layerKinds[l] === "moe") {
        const { out, experts } = this.moe(l, h2);
        addInto(cur, out);
        routing.push(experts);
      } else {
        addInto(
          cur,
          this.glu(
            this.lw(l, "ffn_gate"),
            this.lw(l, "ffn_up"),
            this.lw(l, "ffn_down"),
            h2,
            cfg.intermediateSize,
            `layer ${l} mlp`,
          ),
        );
        routing.push([]);
      }
    }
    this.lastRouting = routing;
    this.positions++;
    const final = attnRes(
      [...blocks, prefix!],
      this.w("out_res_norm"),
      this.w("out_res_proj"),
      eps,
    );
    const xn = rmsNorm(final, this.w("final_norm"), eps, "final_norm");
    return matvec(this.w("lm_head"), xn, cfg.vocabSize, d, "lm_head");
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

  /** down · SiTU(gate·x, up·x). */
  private glu(
    gate: Float32Array,
    up: Float32Array,
    down: Float32Array,
    x: Float64Array,
    inter: number,
    what: string,
  ): Float64Array {
    const { situBeta, situLinearBeta } = this.cfg.k3!;
    const g = matvec(gate, x, inter, x.length, `${what} gate`);
    const u = matvec(up, x, inter, x.length, `${what} up`);
    for (let i = 0; i < inter; i++) g[i] = situ(g[i], u[i], situBeta, situLinearBeta);
    return matvec(down, g, down.length / inter, inter, `${what} down`);
  }

  /** Causal depthwise conv of `x` over the layer's history, SiLU fused; shifts the history. */
  private shortConv(l: number, which: "q" | "k" | "v", x: Float64Array): Float64Array {
    const K = this.cfg.k3!.kda.convKernel;
    const w = this.lw(
      l,
      which === "q" ? "kda_conv_q" : which === "k" ? "kda_conv_k" : "kda_conv_v",
    );
    const hist = this.kda[l].history[which];
    const y = new Float64Array(x.length);
    for (let c = 0; c < x.length; c++) {
      let acc = w[c * K + K - 1] * x[c];
      for (let j = 0; j < K - 1; j++) acc += w[c * K + j] * hist[j][c];
      y[c] = silu(acc);
    }
    hist.shift();
    hist.push(Float64Array.from(x));
    return y;
  }

  /** Kimi Delta Attention with the lower-bounded decay and the full-rank sigmoid output gate. */
  private kdaLayer(l: number, x: Float64Array): Float64Array {
    const cfg = this.cfg;
    const { numHeads: H, headDim: D, gateLowerBound: lb } = cfg.k3!.kda;
    const d = cfg.hiddenSize, P = H * D;
    const proj = (t: LayerTensor, rows: number, input = x, cols = d) =>
      matvec(this.lw(l, t), input, rows, cols, `layer ${l} ${t}`);
    const q = this.shortConv(l, "q", proj("wq", P));
    const k = this.shortConv(l, "k", proj("wk", P));
    const v = this.shortConv(l, "v", proj("wv", P));
    for (let h = 0; h < H; h++) {
      l2NormInPlace(q, h * D, D);
      l2NormInPlace(k, h * D, D);
      for (let i = 0; i < D; i++) q[h * D + i] /= Math.sqrt(D);
    }
    const beta = proj("kda_beta", H).map(sigmoid);
    const z = proj("kda_f_b", P, proj("kda_f_a", D), D);
    const dt = this.lw(l, "kda_dt_bias"), aLog = this.lw(l, "kda_a_log");
    const out = new Float64Array(P);
    for (let h = 0; h < H; h++) {
      const s = this.kda[l].s[h];
      const a = Math.exp(aLog[h]);
      for (let i = 0; i < D; i++) {
        const alpha = Math.exp(lb * sigmoid(a * (z[h * D + i] + dt[h * D + i])));
        for (let j = 0; j < D; j++) s[i * D + j] *= alpha;
      }
      for (let j = 0; j < D; j++) {
        let u = 0;
        for (let i = 0; i < D; i++) u += s[i * D + j] * k[h * D + i];
        const delta = beta[h] * (v[h * D + j] - u);
        for (let i = 0; i < D; i++) s[i * D + j] += k[h * D + i] * delta;
      }
      const o = new Float64Array(D);
      for (let j = 0; j < D; j++) {
        for (let i = 0; i < D; i++) o[j] += s[i * D + j] * q[h * D + i];
      }
      out.set(rmsNorm(o, this.lw(l, "kda_o_norm"), cfg.rmsNormEps, `layer ${l} o_norm`), h * D);
    }
    const gate = proj("attn_gate", P);
    for (let i = 0; i < P; i++) out[i] *= sigmoid(gate[i]);
    return matvec(this.lw(l, "wo"), out, d, P, `layer ${l} wo`);
  }

  /** Gated MLA without rotary embedding, expanded to full per-head keys and values. */
  private mlaLayer(l: number, x: Float64Array): Float64Array {
    const cfg = this.cfg;
    const mla = cfg.mla!;
    const { numHeads: H, hiddenSize: d, rmsNormEps: eps } = cfg;
    const nope = mla.qkNopeHeadDim, rope = mla.qkRopeHeadDim, qk = nope + rope;
    const vd = mla.vHeadDim, r = mla.kvLoraRank;
    const qa = matvec(this.lw(l, "wq_a"), x, mla.qLoraRank!, d, `layer ${l} wq_a`);
    const qn = rmsNorm(qa, this.lw(l, "q_a_norm"), eps, `layer ${l} q_a_norm`);
    const q = matvec(this.lw(l, "wq_b"), qn, H * qk, mla.qLoraRank!, `layer ${l} wq_b`);
    const kva = matvec(this.lw(l, "wkv_a"), x, r + rope, d, `layer ${l} wkv_a`);
    const latent = rmsNorm(kva, this.lw(l, "kv_a_norm"), eps, `layer ${l} kv_a_norm`, 0, r);
    const kv = matvec(this.lw(l, "wkv_b"), latent, H * (nope + vd), r, `layer ${l} wkv_b`);
    const keys = new Float64Array(H * qk), values = new Float64Array(H * vd);
    for (let h = 0; h < H; h++) {
      keys.set(kv.subarray(h * (nope + vd), h * (nope + vd) + nope), h * qk);
      keys.set(kva.subarray(r, r + rope), h * qk + nope);
      values.set(kv.subarray(h * (nope + vd) + nope, (h + 1) * (nope + vd)), h * vd);
    }
    const cache = this.mla[l];
    cache.keys.push(keys);
    cache.values.push(values);
    const y = new Float64Array(H * vd);
    for (let h = 0; h < H; h++) {
      const scores = cache.keys.map((key) => {
        let s = 0;
        for (let i = 0; i < qk; i++) s += q[h * qk + i] * key[h * qk + i];
        return s * cfg.attnScale;
      });
      const p = softmax(scores);
      cache.values.forEach((val, t) => {
        for (let i = 0; i < vd; i++) y[h * vd + i] += p[t] * val[h * vd + i];
      });
    }
    const gate = matvec(this.lw(l, "attn_gate"), x, H * vd, d, `layer ${l} attn_gate`);
    for (let i = 0; i < H * vd; i++) y[i] *= sigmoid(gate[i]);
    return matvec(this.lw(l, "wo"), y, d, H * vd, `layer ${l} wo`);
  }

  /** Stable LatentMoE: router on x, experts in the latent, one norm of the aggregate, shared. */
  private moe(l: number, x: Float64Array): { out: Float64Array; experts: number[] } {
    const cfg = this.cfg;
    const moe = cfg.moe!, L = cfg.k3!.latentDim, d = cfg.hiddenSize;
    const logits = matvec(this.lw(l, "router"), x, moe.numExperts, d, `layer ${l} router`);
    const route = routeReference(moe, logits, this.lw(l, "router_bias"));
    const z = matvec(this.lw(l, "latent_down"), x, L, d, `layer ${l} latent_down`);
    const agg = new Float64Array(L);
    route.experts.forEach((e, k) => {
      const y = this.glu(
        this.w(`experts.${l}.${e}.gate`),
        this.w(`experts.${l}.${e}.up`),
        this.w(`experts.${l}.${e}.down`),
        z,
        moe.expertIntermediate,
        `layer ${l} expert ${e}`,
      );
      for (let i = 0; i < L; i++) agg[i] += route.weights[k] * y[i];
    });
    const normed = rmsNorm(agg, this.lw(l, "latent_norm"), cfg.rmsNormEps, `layer ${l} latent`);
    const out = matvec(this.lw(l, "latent_up"), normed, d, L, `layer ${l} latent_up`);
    if (moe.sharedIntermediate > 0) {
      addInto(
        out,
        this.glu(
          this.lw(l, "shared_gate"),
          this.lw(l, "shared_up"),
          this.lw(l, "shared_down"),
          x,
          moe.sharedIntermediate,
          `layer ${l} shared experts`,
        ),
      );
    }
    return { out, experts: route.experts };
  }
}
