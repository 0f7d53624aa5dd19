/**
 * The scalar reference forward pass: one token at a time, float64 everywhere, straight from the
 * published model semantics (Hugging Face transformers' Llama, Mixtral, Qwen3-MoE and
 * DeepSeek-V3). It is slow on purpose: it is the oracle the WASM engine is tested against, so it
 * shares no code with the engine beyond the config type, and DeepSeek's MLA is computed in the
 * expanded form (full per-head keys and values) rather than the engine's absorbed form.
 *
 * Canonical weight names: `embed`, `final_norm`, `lm_head`, `layers.N.<LayerTensor>` and
 * `experts.N.E.gate|up|down`.
 *
 * @module
 */

import { type LayerTensor, layerTensorName, type ModelConfig } from "../../io/model_config.ts";
import { addInto, matvec, rmsNorm, softmax, swiglu } from "./math.ts";
import { routeReference } from "./moe_routing.ts";
import { applyRope, ropeAttentionFactor, ropeInvFreq } from "./rope.ts";

/** Returns the float32 values of a weight by canonical name; throws when it does not exist. */
export type WeightGetter = (canonical: string) => Float32Array;

/** Keys and values of one layer, one entry per cached position. */
interface LayerCache {
  keys: Float64Array[];
  values: Float64Array[];
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

  /** `weight` maps a canonical name to its values; each name is fetched once. */
  constructor(cfg: ModelConfig, weight: WeightGetter) {
    this.cfg = cfg;
    this.get = weight;
    this.invFreq = ropeInvFreq(cfg.rope);
    this.ropeMagnitude = ropeAttentionFactor(cfg.rope);
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
    this.lastRouting = [];
  }

  /** Number of positions in the KV cache. */
  get length(): number {
    return this.cache[0]?.keys.length ?? 0;
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
    for (const c of this.cache) {
      c.keys.length = pos;
      c.values.length = pos;
    }
    const d = cfg.hiddenSize;
    const x = Float64Array.from(this.w("embed").subarray(token * d, (token + 1) * d));
    const routing: number[][] = [];
    for (let l = 0; l < cfg.numLayers; l++) {
      const h = rmsNorm(x, this.lw(l, "attn_norm"), cfg.rmsNormEps, `layer ${l} attn_norm`);
      const attn = cfg.family === "deepseek_v3" ? this.mla(l, h, pos) : this.gqa(l, h, pos);
      addInto(x, attn);
      const h2 = rmsNorm(x, this.lw(l, "ffn_norm"), cfg.rmsNormEps, `layer ${l} ffn_norm`);
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
          ),
        );
        routing.push([]);
      }
    }
    this.lastRouting = routing;
    const xn = rmsNorm(x, this.w("final_norm"), cfg.rmsNormEps, "final_norm");
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
    this.rope(kpe, 0, pos);
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
      this.rope(q, hd * qk + nope, pos);
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
    return matvec(this.lw(l, "wo"), out, d, numHeads * vd, `layer ${l} wo`);
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
    const out = new Float64Array(d);
    route.experts.forEach((e, k) => {
      const y = swiglu(
        this.w(`experts.${l}.${e}.gate`),
        this.w(`experts.${l}.${e}.up`),
        this.w(`experts.${l}.${e}.down`),
        h,
        moe.expertIntermediate,
        `layer ${l} expert ${e}`,
      );
      for (let i = 0; i < d; i++) out[i] += route.weights[k] * y[i];
    });
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
        ),
      );
    }
    return { out, experts: route.experts };
  }
}
