/**
 * The kimi_linear family (`KimiLinearForCausalLM`, Kimi-Linear-48B-A3B): a hybrid of KDA layers
 * (engine/kda.ts: short convs, gated delta rule, a fixed-size recurrent state per layer) and
 * full-attention MLA layers without rotary (NoPE; the deepseek_v3 family's absorbed latent
 * attention and latent cache), chosen per layer by `linear_attn_config`. The FFN side (dense
 * first layer, sigmoid routing with the correction bias, routed scaling, shared expert) is the
 * shared skeleton's. This file holds the config normaliser, each layer kind's tensors and their
 * Hugging Face names, the planner's sizes, the stored-config check, the engine's attention and
 * the pointer to its float64 references (engine/reference/kda.ts and mla.ts).
 *
 * @module
 */
import { manifestField, MAX_DIM } from "../../io/manifest.ts";
import {
  isKdaLayer,
  type LayerTensor,
  type ModelConfig,
  type MoeConfig,
} from "../../io/model_config.ts";
import { PAGE } from "../arena.ts";
import { KdaAttention, kdaLayerStateBytes, kdaScratchFloats, kdaTensorSpec } from "../kda.ts";
import type { Ops } from "../ops.ts";
import type { Arena } from "../arena.ts";
import { kdaReference } from "../reference/kda.ts";
import { mlaReference } from "../reference/mla.ts";
import type { ReferenceAttention } from "../reference/forward.ts";
import type { Attention, CacheRegion, StateRegion } from "../transformer.ts";
import type { LayerWeights } from "../weights.ts";
import { DEEPSEEK_V3, MlaAttention, mlaShape, mlaTensors } from "./deepseek_v3.ts";
import type { Family } from "./family.ts";
import { checkTopK, Fields, type Json, type Normaliser, requireSilu } from "./hf_config.ts";

/**
 * Kimi-Linear as transformers 5.x reads it: `linear_attn_config` with 1-based
 * `full_attn_layers` / `kda_layers` (or `layer_types`), NoPE MLA, DeepSeek-style sigmoid routing
 * with a correction bias under the checkpoint's own key names, dense layers before
 * first_k_dense_replace (transformers ignores moe_layer_freq, and so does this).
 */
export const normaliseKimiLinear: Normaliser = (f, mt) => {
  requireSilu(f);
  const hidden = f.int("hidden_size", { min: 1 });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  const numLayers = f.int("num_hidden_layers", { min: 1 });
  const qkNope = f.int("qk_nope_head_dim", { min: 1 });
  const qkRope = f.int("qk_rope_head_dim", { min: 2 });
  if (qkRope % 2) throw new Error(`${f.where}: qk_rope_head_dim ${qkRope} must be even`);
  if (!f.bool("mla_use_nope", true)) {
    throw new Error(`${f.where}: mla_use_nope false is not supported (transformers has no rotary)`);
  }
  const lacRaw = f.src.linear_attn_config;
  if (lacRaw === null || typeof lacRaw !== "object" || Array.isArray(lacRaw)) {
    throw new Error(`${f.where}: required field linear_attn_config is missing or not an object`);
  }
  const lac = new Fields(lacRaw as Json, `${f.where} linear_attn_config`);
  const kdaLayers = new Array<boolean>(numLayers).fill(false);
  if (f.has("layer_types")) {
    const types = f.src.layer_types;
    if (!Array.isArray(types) || types.length !== numLayers) {
      throw new Error(`${f.where}: field layer_types must list ${numLayers} layer types`);
    }
    types.forEach((t, i) => {
      if (t !== "linear_attention" && t !== "full_attention") {
        throw new Error(`${f.where}: layer_types[${i}] ${JSON.stringify(t)} is not a layer type`);
      }
      kdaLayers[i] = t === "linear_attention";
    });
  } else {
    const seen = new Set<number>();
    for (const key of ["full_attn_layers", "kda_layers"]) {
      for (const n of lac.intList(key)) {
        if (n < 1 || n > numLayers || seen.has(n)) {
          throw new Error(
            `${lac.where}: ${key} entry ${n} must be a distinct 1-based layer in 1..${numLayers}`,
          );
        }
        seen.add(n);
        kdaLayers[n - 1] = key === "kda_layers";
      }
    }
    if (seen.size !== numLayers) {
      throw new Error(
        `${lac.where}: full_attn_layers and kda_layers must cover all ${numLayers} layers`,
      );
    }
  }
  const kdaHeads = lac.int("num_heads", { min: 1 });
  const kdaDim = lac.int("head_dim", { min: 1 });
  const convKernel = lac.int("short_conv_kernel_size", { min: 1 });
  const numExperts = f.int("num_experts", { min: 1 });
  const firstDense = f.int("first_k_dense_replace", { def: 1 });
  const layerKinds = Array.from(
    { length: numLayers },
    (_, l) => l >= firstDense ? "moe" : "dense",
  ) as ("dense" | "moe")[];
  let moe: MoeConfig | null = null;
  if (layerKinds.includes("moe")) {
    const topK = f.int("num_experts_per_token", { min: 1 });
    checkTopK(f, numExperts, topK);
    const act = f.str("moe_router_activation_func", "sigmoid");
    if (act !== "sigmoid") {
      throw new Error(`${f.where}: moe_router_activation_func ${act} is not supported (sigmoid)`);
    }
    const nGroup = f.int("num_expert_group", { def: 1, min: 1 });
    const topkGroup = f.int("topk_group", { def: 1, min: 1 });
    if (numExperts % nGroup || topkGroup > nGroup) {
      throw new Error(
        `${f.where}: num_expert_group ${nGroup} must divide num_experts ${numExperts} and be >= ` +
          `topk_group ${topkGroup}`,
      );
    }
    const inter = f.int("moe_intermediate_size", { min: 1 });
    moe = {
      numExperts,
      topK,
      expertIntermediate: inter,
      scoring: "sigmoid",
      normTopK: f.bool("moe_renormalize", true),
      routedScaling: f.num("routed_scaling_factor"),
      nGroup,
      topkGroup,
      selectionBias: true,
      sharedIntermediate: inter * f.int("num_shared_experts", { def: 1 }),
    };
  }
  const qLora = f.src.q_lora_rank === null || f.src.q_lora_rank === undefined
    ? null
    : f.int("q_lora_rank", { min: 1 });
  return {
    family: "kimi_linear",
    modelType: mt,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: hidden,
    numLayers,
    numHeads,
    numKvHeads: numHeads,
    headDim: qkNope + qkRope,
    intermediateSize: layerKinds.includes("dense") ? f.int("intermediate_size", { min: 1 }) : 0,
    rmsNormEps: f.num("rms_norm_eps", 1e-6),
    // Unused (NoPE), kept valid so every consumer of a RopeConfig can read it.
    rope: {
      theta: f.num("rope_theta", 10000),
      layout: "half",
      dim: qkRope,
      scaling: { type: "none" },
    },
    maxPositions: f.int("model_max_length", { def: 1048576, min: 1 }),
    tieWordEmbeddings: f.bool("tie_word_embeddings", false),
    qkNorm: false,
    attentionBias: false,
    layerKinds,
    moe,
    mla: {
      qLoraRank: qLora,
      kvLoraRank: f.int("kv_lora_rank", { min: 1 }),
      qkNopeHeadDim: qkNope,
      qkRopeHeadDim: qkRope,
      vHeadDim: f.int("v_head_dim", { min: 1 }),
      nope: true,
    },
    kda: {
      numHeads: kdaHeads,
      headDim: kdaDim,
      convKernel,
      layers: kdaLayers,
      gateLowerBound: null,
      fullRankOutputGate: false,
    },
    attnScale: 1 / Math.sqrt(qkNope + qkRope),
  };
};

/** KDA tensors of a layer, relative to `model.layers.N.` (the released checkpoint's names). */
export const KDA_TENSORS: Partial<Record<LayerTensor, string>> = {
  wq: "self_attn.q_proj.weight",
  wk: "self_attn.k_proj.weight",
  wv: "self_attn.v_proj.weight",
  wo: "self_attn.o_proj.weight",
  q_conv: "self_attn.q_conv1d.weight",
  k_conv: "self_attn.k_conv1d.weight",
  v_conv: "self_attn.v_conv1d.weight",
  f_a: "self_attn.f_a_proj.weight",
  f_b: "self_attn.f_b_proj.weight",
  dt_bias: "self_attn.dt_bias",
  a_log: "self_attn.A_log",
  beta_proj: "self_attn.b_proj.weight",
  g_a: "self_attn.g_a_proj.weight",
  g_b: "self_attn.g_b_proj.weight",
  o_norm: "self_attn.o_norm.weight",
};

/** Each layer's attention: KDA or NoPE MLA. */
export class KimiLinearAttention implements Attention {
  #cfg: ModelConfig;
  #kda: KdaAttention;
  #mla: MlaAttention;

  constructor(ops: Ops, arena: Arena, cfg: ModelConfig, maxBatch: number, maxCtx: number) {
    this.#cfg = cfg;
    this.#kda = new KdaAttention(ops, arena, cfg, maxBatch);
    this.#mla = new MlaAttention(ops, arena, cfg, maxBatch, maxCtx);
  }

  /** The MLA layers' latent caches. */
  cacheRegions(): CacheRegion[] {
    return this.#mla.cacheRegions().filter((r) => r.offset >= 0);
  }

  /** The KDA layers' recurrent states. */
  stateRegions(): StateRegion[] {
    return this.#kda.stateRegions();
  }

  /** Declares restored KDA states to be at position `pos`. */
  resumeAt(pos: number): void {
    this.#kda.resumeAt(pos);
  }

  /** Refuses a position the KDA state cannot continue from, before any layer runs. */
  begin(pos: number): void {
    this.#kda.checkPosition(pos);
  }

  /** Runs layer `layer`'s own kind of attention. */
  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void {
    if (isKdaLayer(this.#cfg, layer)) this.#kda.forward(layer, lw, h, out, nb, pos);
    else this.#mla.forward(layer, lw, h, out, nb, pos);
  }
}

const reference: ReferenceAttention = (m, l, h, pos) =>
  isKdaLayer(m.cfg, l) ? kdaReference(m, l, h, pos) : mlaReference(m, l, h, pos);

/** The kimi_linear family. */
export const KIMI_LINEAR: Family = {
  name: "kimi_linear",
  attentionTensors: (cfg, layer) => isKdaLayer(cfg, layer) ? KDA_TENSORS : mlaTensors(cfg),
  attentionShape: (cfg, t, layer) =>
    isKdaLayer(cfg, layer) ? kdaTensorSpec(cfg, t) : mlaShape(cfg, t),
  validateConfig(c, where) {
    DEEPSEEK_V3.validateConfig(c, where);
    const k = manifestField.obj(c.kda, `${where}.kda`);
    for (const key of ["numHeads", "headDim", "convKernel"]) {
      manifestField.int(k[key], `${where}.kda.${key}`, 1, MAX_DIM);
    }
    const layers = k.layers;
    if (!Array.isArray(layers) || layers.length !== c.numLayers) {
      throw new Error(`${where}.kda.layers: expected ${c.numLayers} entries`);
    }
    layers.forEach((x, i) => manifestField.bool(x, `${where}.kda.layers[${i}]`));
    manifestField.bool(k.fullRankOutputGate, `${where}.kda.fullRankOutputGate`);
    if (k.gateLowerBound !== null) {
      manifestField.num(k.gateLowerBound, `${where}.kda.gateLowerBound`);
    }
  },
  // A KDA layer's state does not grow with the context; an MLA layer's latent cache does.
  stateBytes(cfg, layer, ctx, maxBatch) {
    if (!isKdaLayer(cfg, layer)) return DEEPSEEK_V3.stateBytes(cfg, layer, ctx, maxBatch);
    const { state, conv } = kdaLayerStateBytes(cfg.kda!);
    return state + conv;
  },
  // KDA's scratch regions are page-rounded one by one: a page each on top of their floats.
  scratchFloats: (cfg, maxBatch) =>
    DEEPSEEK_V3.scratchFloats(cfg, maxBatch) + kdaScratchFloats(cfg.kda!, maxBatch) +
    KdaAttention.REGIONS * (PAGE / 4),
  persistentBytes: (cfg) => DEEPSEEK_V3.persistentBytes(cfg),
  createAttention: (ops, arena, cfg, maxBatch, maxCtx) =>
    new KimiLinearAttention(ops, arena, cfg, maxBatch, maxCtx),
  reference,
};
