/**
 * The scalar reference forward pass: one token at a time, float64 everywhere, straight from the
 * published model semantics (Hugging Face transformers' Llama, Mixtral, Qwen3-MoE and
 * DeepSeek-V3). It is slow on purpose: it is the oracle the WASM engine is tested against, so it
 * shares no math with the engine and imports nothing of it: the layer skeleton, residual streams,
 * FFN and routing are here, and each mixer kind is a function beside this file (gqa.ts, mla.ts,
 * kda.ts; MLA in the expanded form rather than the engine's absorbed form) that mixers.ts names
 * by the kind `mixerOf` gives a layer. This file is the place to start reading how a model
 * computes. Config features change the skeleton here: the SiTU, clamped-SwiGLU or tanh-GELU gate
 * (`glu`, `moe.swigluLimit`), a latent MoE (`moe.latentDim`), a dense MLP beside the MoE with its
 * router on the scaled stream (`moe.denseBeside`, `moe.scaledRouterInput`, `moe.expertScale`),
 * Attention Residuals, hyper-connections or sandwich norms (`residual`) in place of the plain
 * stream, and a soft cap on the logits (`logitSoftcap`).
 *
 * Canonical weight names: `embed`, `final_norm`, `lm_head`, `layers.N.<LayerTensor>` and
 * `experts.N.E.gate|up|down` (and gpt-oss's `experts.N.E.gate_bias|up_bias|down_bias`).
 *
 * @module
 */

import {
  layerKindOf,
  type LayerTensor,
  layerTensorName,
  mixerOf,
  type ModelConfig,
  mtpLayerIds,
  type RopeConfig,
} from "../../io/model_config.ts";
import {
  addInto,
  attnRes as attnResMix,
  clampedSwiglu,
  fetchOnce,
  GELU_TANH_GLU,
  type GluActivation,
  hyperHead,
  hyperMean,
  hyperPost,
  hyperWeights,
  limitedSwiglu,
  matvec,
  rmsNorm,
  sigmoid,
  situ,
  softcapInto,
  softmax,
  SWIGLU,
  swiglu,
  unitRmsNorm,
} from "./math.ts";
import { mixExperts, routeReference } from "./moe_routing.ts";
import { REFERENCE_MIXERS } from "./mixers.ts";
import { applyRope, ropeAttentionFactor, ropeInvFreq } from "./rope.ts";

/** Returns the float32 values of a weight by canonical name; throws when it does not exist. */
export type WeightGetter = (canonical: string) => Float32Array;

/** Keys and values of one layer, one entry per cached position. */
export interface LayerCache {
  keys: Float64Array[];
  values: Float64Array[];
}

/**
 * Causal softmax attention of one head (query `q` from `qOff`) over the positions of `cache` from
 * `opts.from` on (all by default; keys from `kOff`, `kDim` long; values from `vOff`, `vDim`
 * long), or over the positions `opts.keep` only (DeepSeek Sparse Attention), added into `out`
 * from `outOff`. `opts.sink` is a logit that joins the softmax denominator only (gpt-oss).
 */
export type Attend = (
  q: Float64Array,
  qOff: number,
  cache: LayerCache,
  kOff: number,
  vOff: number,
  kDim: number,
  vDim: number,
  out: Float64Array,
  outOff: number,
  opts?: { from?: number; sink?: number; keep?: readonly number[] },
) => void;

/**
 * What a mixer's reference (engine/reference/<mixer>.ts, named in mixers.ts) uses of the
 * reference model.
 */
export interface ReferenceContext {
  /** The model description. */
  readonly cfg: ModelConfig;
  /** The float32 values of a layer tensor. */
  lw(layer: number, t: LayerTensor): Float32Array;
  /** Layer `layer`'s cached keys and values (append this position's). */
  cacheOf(layer: number): LayerCache;
  /**
   * RoPE of the rotary dimensions of `v` from offset `off`, at position `pos`, in place, by the
   * model's rope or `rope` (a layer geometry's own).
   */
  rope(v: Float64Array, off: number, pos: number, rope?: RopeConfig): void;
  /** Causal softmax attention of one head over every cached position, added into `out`. */
  attend: Attend;
  /** RMSNorm of each head (headDim wide unless `hd` says) of `v` in place (q_norm / k_norm). */
  normHeads(v: Float64Array, heads: number, weight: Float32Array, what: string, hd?: number): void;
  /**
   * Layer `layer`'s recurrent state (KDA), made by `make` at position 0. A model with one can
   * restart at position 0 but not rewind to another earlier position.
   */
  stateOf<T>(layer: number, make: () => T): T;
}

/** A mixer's float64 reference of layer `l` for the normalised input `h` at position `pos`. */
export type ReferenceAttention = (
  m: ReferenceContext,
  l: number,
  h: Float64Array,
  pos: number,
) => Float64Array;

/** The residual stream between layers: plain `x`, hyper-connection streams, or AttnRes blocks. */
interface StreamState {
  x: Float64Array;
  streams: Float64Array[];
  blocks: Float64Array[];
}

/** One MTP step: logits (float64) and the head-normed output a chained step reads. */
export interface ReferenceMtpStep {
  logits: Float64Array;
  hidden: Float64Array;
}

/** A model evaluated token by token, with a KV cache per layer. */
export class ReferenceModel implements ReferenceContext {
  /** Per layer: the experts chosen for the last token, in routing order ([] for dense layers). */
  lastRouting: number[][] = [];
  /** The last token's hidden state after the final norm (what the LM head and MTP read). */
  lastHidden: Float64Array = new Float64Array();
  /** The model description the pass follows. */
  readonly cfg: ModelConfig;
  /** Weights by canonical name, each fetched once. */
  private readonly w: WeightGetter;
  /** Each rope's inverse frequencies and cos/sin magnitude, made on first use. */
  private readonly ropes = new Map<RopeConfig, { invFreq: Float64Array; magnitude: number }>();
  private cache: LayerCache[] = [];
  private states: unknown[] = [];
  private positions = 0;
  /** The GLU activation of every MLP: SwiGLU, SiTU-GLU, DeepSeek-V4's clamped SwiGLU or GeGLU. */
  private readonly act: GluActivation;

  /**
   * `weight` maps a canonical name to its values; each name is fetched once. `act` replaces the
   * config's gate (a test runs another, such as the exact GELU, to show what it changes).
   */
  constructor(cfg: ModelConfig, weight: WeightGetter, act?: GluActivation) {
    this.cfg = cfg;
    this.w = fetchOnce(weight);
    const glu = cfg.glu;
    const limit = cfg.moe?.swigluLimit;
    this.act = act ??
      (glu?.kind === "situ"
        ? situ(glu.beta, glu.linearBeta)
        : glu?.kind === "gelu_tanh"
        ? GELU_TANH_GLU
        : limit !== undefined
        ? limitedSwiglu(limit)
        : SWIGLU);
    if (cfg.layerKinds.length !== cfg.numLayers) {
      throw new Error(
        `layerKinds has ${cfg.layerKinds.length} entries for ${cfg.numLayers} layers`,
      );
    }
    this.reset();
  }

  /** Forgets every cached position. */
  reset(): void {
    this.cache = Array.from(
      { length: this.cfg.numLayers + (this.cfg.mtp?.layers ?? 0) },
      () => ({ keys: [], values: [] }),
    );
    this.states = [];
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
    if (pos < this.length && this.states.length > 0) {
      if (pos !== 0) {
        throw new Error(`position ${pos}: a recurrent state is at ${this.length}; restart at 0`);
      }
      this.reset();
    }
    for (const c of this.cache) {
      c.keys.length = pos;
      c.values.length = pos;
    }
    this.positions = pos + 1;
    const d = cfg.hiddenSize;
    // x is the residual stream; with Attention Residuals the running sum of the current block,
    // `blocks` holding the snapshots taken at each block start; with hyper-connections `streams`
    // are the stream copies and x is unused after the embedding. Sandwich norms scale the
    // embedding, norm each sublayer's output before it joins x, and scale x after each layer.
    const sandwich = cfg.residual?.kind === "sandwich" ? cfg.residual : undefined;
    const x: Float64Array = Float64Array.from(
      this.w("embed").subarray(token * d, (token + 1) * d),
      (v) => v * (sandwich?.embedScale ?? 1),
    );
    const hyper = cfg.residual?.kind === "hyper" ? cfg.residual : undefined;
    const state: StreamState = {
      x,
      streams: Array.from({ length: hyper?.streams ?? 0 }, () => x.slice()),
      blocks: [],
    };
    const routing: number[][] = [];
    for (let l = 0; l < cfg.numLayers; l++) routing.push(this.layer(l, state, token, pos));
    this.lastRouting = routing;
    const { blocks, streams } = state;
    const attnRes = cfg.residual?.kind === "attn_res" ? cfg.residual : undefined;
    const eps = cfg.rmsNormEps;
    let final = state.x;
    if (attnRes) {
      final = attnResMix(
        [...blocks, state.x],
        this.w("out_res_norm"),
        this.w("out_res_proj"),
        eps,
        "out_res",
      );
    } else if (hyper?.collapse === "mean") {
      final = hyperMean(streams);
    } else if (hyper) {
      final = hyperHead(
        streams,
        this.w("hc_head_fn"),
        this.w("hc_head_base"),
        this.w("hc_head_scale"),
        eps,
        hyper.eps,
      );
    }
    const xn = this.norm(final, this.w("final_norm"), "final_norm");
    this.lastHidden = xn;
    const head = this.w(cfg.tieWordEmbeddings ? "embed" : "lm_head");
    const logits = matvec(head, xn, cfg.vocabSize, d, "lm_head");
    if (cfg.logitSoftcap) softcapInto(logits, cfg.logitSoftcap);
    return logits;
  }

  /**
   * One step of the first multi-token-prediction layer (DeepSeek-V3 tech report §2.2) at
   * position `pos`, reading `hidden` (the main pass's hidden state after the final norm at
   * `pos`, or the previous step's head-normed output) and `token` (the one after `pos`):
   * x = M·[RMSNorm_e(Emb(token)); RMSNorm_h(hidden)] (the embedding zero at position 0), one
   * decoder layer on the MTP layer's own cache (dropped from `pos` on), then its head norm and
   * the shared LM head. The logits predict the token two after `pos`.
   */
  mtp64(hidden: Float64Array, token: number, pos: number): ReferenceMtpStep {
    const cfg = this.cfg;
    const l = mtpLayerIds(cfg)[0];
    if (l === undefined) throw new Error(`${cfg.modelType}: the config has no MTP layer`);
    if (cfg.residual) throw new Error("mtp64: only the plain residual stream");
    const d = cfg.hiddenSize;
    const cache = this.cache[l];
    if (pos > cache.keys.length) {
      throw new Error(`mtp64: position ${pos}, the MTP cache holds ${cache.keys.length}`);
    }
    cache.keys.length = pos;
    cache.values.length = pos;
    const e = Float64Array.from(this.w("embed").subarray(token * d, (token + 1) * d));
    if (pos === 0) e.fill(0);
    const cat = new Float64Array(2 * d);
    cat.set(this.norm(e, this.lw(l, "mtp_enorm"), "mtp enorm"));
    cat.set(this.norm(hidden, this.lw(l, "mtp_hnorm"), "mtp hnorm"), d);
    const x = matvec(this.lw(l, "mtp_proj"), cat, d, 2 * d, "mtp proj");
    const state: StreamState = { x, streams: [], blocks: [] };
    this.layer(l, state, token, pos);
    const xn = this.norm(state.x, this.lw(l, "mtp_head_norm"), "mtp head norm");
    const head = this.w(cfg.tieWordEmbeddings ? "embed" : "lm_head");
    const logits = matvec(head, xn, cfg.vocabSize, d, "lm_head");
    if (cfg.logitSoftcap) softcapInto(logits, cfg.logitSoftcap);
    return { logits, hidden: xn };
  }

  /** The float32 values of a layer tensor. */
  lw(layer: number, t: LayerTensor): Float32Array {
    return this.w(layerTensorName(layer, t));
  }

  /** The skeleton's RMSNorm of `x`: · w, or · (1 + w) with `normUnitOffset`. */
  private norm(x: Float64Array, w: Float32Array, what: string): Float64Array {
    return rmsNorm(x, w, this.cfg.rmsNormEps, what, 0, x.length, this.cfg.normUnitOffset);
  }

  /** Layer `layer`'s cached keys and values. */
  cacheOf(layer: number): LayerCache {
    return this.cache[layer];
  }

  /** Layer `layer`'s recurrent state, made on first use after a reset. */
  stateOf<T>(layer: number, make: () => T): T {
    this.states[layer] ??= make();
    return this.states[layer] as T;
  }

  /** Causal softmax attention of one head over every cached position, added into `out`. */
  readonly attend: Attend = (q, qOff, cache, kOff, vOff, kDim, vDim, out, outOff, opts = {}) => {
    const from = opts.from ?? 0;
    const at = opts.keep ?? Array.from({ length: cache.keys.length - from }, (_, t) => from + t);
    const n = at.length;
    const logits = new Float64Array(n + (opts.sink === undefined ? 0 : 1));
    for (let t = 0; t < n; t++) {
      const key = cache.keys[at[t]];
      let s = 0;
      for (let i = 0; i < kDim; i++) s += q[qOff + i] * key[kOff + i];
      logits[t] = s * this.cfg.attnScale;
    }
    if (opts.sink !== undefined) logits[n] = opts.sink;
    const p = softmax(logits);
    for (let t = 0; t < n; t++) {
      const val = cache.values[at[t]];
      for (let i = 0; i < vDim; i++) out[outOff + i] += p[t] * val[vOff + i];
    }
  };

  /** RoPE of `v` from offset `off` at position `pos`, in place. */
  rope(v: Float64Array, off: number, pos: number, rope = this.cfg.rope): void {
    let r = this.ropes.get(rope);
    if (!r) {
      r = { invFreq: ropeInvFreq(rope), magnitude: ropeAttentionFactor(rope) };
      this.ropes.set(rope, r);
    }
    applyRope(v, off, pos, r.invFreq, rope.layout, r.magnitude);
  }

  /** RMSNorm of each head (headDim wide unless `hd` says) of `v` in place (q_norm / k_norm). */
  normHeads(
    v: Float64Array,
    heads: number,
    weight: Float32Array,
    what: string,
    hd = this.cfg.headDim,
  ): void {
    for (let i = 0; i < heads; i++) {
      v.set(
        rmsNorm(v, weight, this.cfg.rmsNormEps, what, i * hd, hd, this.cfg.normUnitOffset),
        i * hd,
      );
    }
  }

  /**
   * Routed experts (plus the shared expert) of a MoE layer on `h` for `token`. With
   * `moe.scaledRouterInput` the router reads unit RMSNorm(`residual`) × router_scale × hidden^−½
   * instead (Gemma 4), and with `moe.expertScale` each chosen weight is × its expert's
   * expert_scale.
   */
  private moe(
    l: number,
    h: Float64Array,
    token: number,
    residual = h,
  ): { out: Float64Array; experts: number[] } {
    const moe = this.cfg.moe;
    if (!moe) throw new Error(`layer ${l} is a MoE layer but the config has no moe section`);
    const d = this.cfg.hiddenSize;
    let routerIn = h;
    if (moe.scaledRouterInput) {
      const scale = this.lw(l, "router_scale");
      routerIn = unitRmsNorm(residual, this.cfg.rmsNormEps).map((v, i) =>
        v * scale[i] / Math.sqrt(d)
      );
    }
    const logits = matvec(this.lw(l, "router"), routerIn, moe.numExperts, d, `layer ${l} router`);
    if (moe.routerLogitBias) addInto(logits, Float64Array.from(this.lw(l, "router_b")));
    // DeepSeek-V4's hash layers take their experts from the token's row of tid2eid.
    const hash = l < (moe.hashLayers ?? 0);
    const chosen = hash
      ? Array.from(this.lw(l, "router_tid2eid").subarray(token * moe.topK, (token + 1) * moe.topK))
      : undefined;
    const bias = moe.selectionBias && !hash ? this.lw(l, "router_bias") : undefined;
    const route = routeReference(moe, logits, bias, chosen);
    const perExpert = moe.expertScale ? this.lw(l, "expert_scale") : undefined;
    const weights = route.weights.map((w, k) => w * (perExpert?.[route.experts[k]] ?? 1));
    // A latent MoE: the experts work on a down-projection of h, and their weighted sum is
    // RMS-normed and projected back up.
    const latent = moe.latentDim;
    const input = latent
      ? matvec(this.lw(l, "latent_down"), h, latent, d, `layer ${l} latent_down`)
      : h;
    const sum = mixExperts(
      this.w,
      l,
      route.experts,
      weights,
      input,
      moe.expertIntermediate,
      moe.clampedSwiglu
        ? clampedSwiglu(moe.clampedSwiglu.limit, moe.clampedSwiglu.alpha)
        : this.act,
      moe.expertBias,
    );
    const out = latent
      ? matvec(
        this.lw(l, "latent_up"),
        rmsNorm(sum, this.lw(l, "latent_norm"), this.cfg.rmsNormEps, `layer ${l} latent_norm`),
        d,
        latent,
        `layer ${l} latent_up`,
      )
      : sum;
    if (moe.sharedIntermediate > 0) {
      const shared = swiglu(
        this.lw(l, "shared_gate"),
        this.lw(l, "shared_up"),
        this.lw(l, "shared_down"),
        h,
        moe.sharedIntermediate,
        `layer ${l} shared expert`,
        this.act,
      );
      // Qwen3-Next / Qwen3.5: the shared expert is scaled by σ(w·h).
      if (moe.sharedExpertGate) {
        const [z] = matvec(this.lw(l, "shared_expert_gate"), h, 1, d, `layer ${l} shared gate`);
        for (let i = 0; i < shared.length; i++) shared[i] *= sigmoid(z);
      }
      addInto(out, shared);
    }
    return { out, experts: route.experts };
  }

  /**
   * Layer `l` on the stream state `s` (the plain stream `x`, hyper-connection `streams`, or
   * Attention Residuals' `blocks`) for `token` at `pos`; returns the experts it routed to.
   */
  private layer(l: number, s: StreamState, token: number, pos: number): number[] {
    const cfg = this.cfg;
    const d = cfg.hiddenSize;
    const eps = cfg.rmsNormEps;
    const sandwich = cfg.residual?.kind === "sandwich" ? cfg.residual : undefined;
    const attnRes = cfg.residual?.kind === "attn_res" ? cfg.residual : undefined;
    const hyper = cfg.residual?.kind === "hyper" ? cfg.residual : undefined;
    const joining = (out: Float64Array, norm: LayerTensor) =>
      sandwich ? rmsNorm(out, this.lw(l, norm), eps, `layer ${l} ${norm}`) : out;
    const hyperAt = (site: "attn" | "ffn") =>
      hyperWeights(
        s.streams,
        this.lw(l, `hc_${site}_fn`),
        this.lw(l, `hc_${site}_base`),
        this.lw(l, `hc_${site}_scale`),
        hyper!.sinkhornIters,
        eps,
        hyper!.eps,
        `layer ${l} hc_${site}`,
      );
    const mix = (norm: LayerTensor, proj: LayerTensor) =>
      attnResMix([...s.blocks, s.x], this.lw(l, norm), this.lw(l, proj), eps, `layer ${l} ${norm}`);
    const hcAttn = hyper ? hyperAt("attn") : undefined;
    const a = hcAttn?.input ??
      (attnRes && s.blocks.length ? mix("attn_res_norm", "attn_res_proj") : s.x);
    const restart = attnRes !== undefined && l % attnRes.blockSize === 0;
    if (restart) s.blocks.push(s.x);
    const h = this.norm(a, this.lw(l, "attn_norm"), `layer ${l} attn_norm`);
    const attn = joining(REFERENCE_MIXERS[mixerOf(cfg, l)](this, l, h, pos), "attn_post_norm");
    if (hcAttn) s.streams = hyperPost(s.streams, attn, hcAttn);
    else if (restart) s.x = attn;
    else addInto(s.x, attn);
    const hcFfn = hyper ? hyperAt("ffn") : undefined;
    const m = hcFfn?.input ?? (attnRes ? mix("mlp_res_norm", "mlp_res_proj") : s.x);
    const h2 = this.norm(m, this.lw(l, "ffn_norm"), `layer ${l} ffn_norm`);
    const dense = () =>
      swiglu(
        this.lw(l, "ffn_gate"),
        this.lw(l, "ffn_up"),
        this.lw(l, "ffn_down"),
        h2,
        cfg.intermediateSize,
        `layer ${l} ffn`,
        this.act,
      );
    let ffn: Float64Array;
    let experts: number[] = [];
    if (layerKindOf(cfg, l) !== "moe") {
      ffn = dense();
    } else if (cfg.moe?.denseBeside) {
      // Gemma 4: the dense MLP and the experts side by side, each normed before and after,
      // the experts routed from the stream itself.
      const routed = this.moe(
        l,
        rmsNorm(m, this.lw(l, "moe_norm"), eps, `layer ${l} moe_norm`),
        token,
        m,
      );
      ffn = rmsNorm(dense(), this.lw(l, "dense_post_norm"), eps, `layer ${l} dense_post_norm`);
      addInto(
        ffn,
        rmsNorm(routed.out, this.lw(l, "moe_post_norm"), eps, `layer ${l} moe_post_norm`),
      );
      experts = routed.experts;
    } else {
      const routed = this.moe(l, h2, token);
      ffn = routed.out;
      experts = routed.experts;
    }
    ffn = joining(ffn, "ffn_post_norm");
    if (hcFfn) s.streams = hyperPost(s.streams, ffn, hcFfn);
    else addInto(s.x, ffn);
    if (sandwich) {
      const scalar = this.lw(l, "layer_scalar")[0];
      for (let i = 0; i < d; i++) s.x[i] *= scalar;
    }
    return experts;
  }
}
