/**
 * The deepseek_v4 family (DeepSeek-V4-Flash, `DeepseekV4ForCausalLM`, as transformers 5.18
 * computes it): every layer runs compressed sparse attention (engine/parts/csa.ts: shared-KV MQA
 * with a window, sinks, and per layer CSA or HCA compressed entries), a hash-routed or
 * sqrt(softplus)-routed MoE with a shared expert and the clamped SwiGLU
 * (engine/parts/feed_forward.ts), and hyper-connections as the residual stream
 * (engine/parts/hyper.ts). This file holds the config normaliser (the release's own config.json
 * keys), the original DeepSeek tensor names (`embed.weight`, `layers.N.attn.wq_a.weight`,
 * `layers.N.ffn.experts.E.w1.weight`, `hc_head_fn`, `layers.N.ffn.gate.tid2eid`) and the
 * stored-config check.
 *
 * @module
 */
import { manifestField, MAX_DIM } from "../../io/manifest.ts";
import type { CsaLayer, LayerTensor, ModelConfig } from "../../io/model_config.ts";
import type { Family, MoeNaming } from "./family.ts";
import {
  checkTopK,
  Fields,
  type Json,
  MAX_LAYERS,
  type Normaliser,
  requireSilu,
} from "./hf_config.ts";

/** Later releases with parts no reference covers yet, refused by name. */
export const REFUSED_ARCHITECTURES: Readonly<Record<string, string>> = {
  DeepseekV41ForCausalLM:
    "DeepSeek-V4.1 (DeepseekV41ForCausalLM) adds Engram n-gram memory, which sluice cannot run " +
    "until a reference implementation of it exists",
};

/** The compress_ratios values transformers accepts: 4 → CSA (indexed), 128 → HCA. */
const RATIOS: Readonly<Record<number, CsaLayer>> = {
  0: { ratio: 0, indexed: false },
  4: { ratio: 4, indexed: true },
  128: { ratio: 128, indexed: false },
};

/** DeepSeek-V4's config.json (the release's keys). */
export const normaliseDeepseekV4: Normaliser = (f, mt) => {
  for (const a of Array.isArray(f.src.architectures) ? f.src.architectures : []) {
    if (typeof a === "string" && Object.hasOwn(REFUSED_ARCHITECTURES, a)) {
      throw new Error(`${f.where}: architectures: ${REFUSED_ARCHITECTURES[a]}`);
    }
  }
  requireSilu(f);
  // transformers' DeepseekV4Config defaults these (its router always renormalises); a config
  // that sets another value asks for a model sluice does not run.
  for (const [key, want] of [["topk_method", "noaux_tc"], ["attention_bias", false]] as const) {
    if (f.has(key)) f.exactly(key, want);
  }
  const numLayers = f.int("num_hidden_layers", { min: 1, max: MAX_LAYERS });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  if (f.has("num_key_value_heads")) f.exactly("num_key_value_heads", 1);
  const headDim = f.int("head_dim", { min: 1 });
  const ropeDim = f.int("qk_rope_head_dim", { min: 2, max: headDim });
  if (ropeDim % 2) throw new Error(`${f.where}: qk_rope_head_dim ${ropeDim} must be even`);
  const ratios = f.intList("compress_ratios", true);
  // The release lists one more entry than layers: the MTP layer's, which sluice skips.
  if (ratios.length < numLayers) {
    throw new Error(
      `${f.where}: compress_ratios has ${ratios.length} entries for ${numLayers} layers`,
    );
  }
  const layers = ratios.slice(0, numLayers).map((r, l) => {
    if (!Object.hasOwn(RATIOS, r)) {
      throw new Error(
        `${f.where}: compress_ratios[${l}] is ${r}; DeepSeek-V4 layers use 0, 4 (CSA) or 128 (HCA)`,
      );
    }
    return RATIOS[r];
  });
  const mtp = f.int("num_nextn_predict_layers", { def: 0, min: 0 });
  if (mtp > 0) {
    console.error(
      `${f.where}: skipping ${mtp} multi-token-prediction layer(s) (num_nextn_predict_layers)`,
    );
  }
  const oGroups = f.int("o_groups", { min: 1 });
  if (numHeads % oGroups) {
    throw new Error(`${f.where}: o_groups ${oGroups} must divide num_attention_heads ${numHeads}`);
  }
  const scoring = f.str("scoring_func");
  if (scoring !== "sqrtsoftplus") {
    throw new Error(`${f.where}: scoring_func ${scoring} is not supported (sqrtsoftplus)`);
  }
  const numExperts = f.int("n_routed_experts", { min: 1 });
  const topK = f.int("num_experts_per_tok", { min: 1 });
  checkTopK(f, numExperts, topK);
  const inter = f.int("moe_intermediate_size", { min: 1 });
  // transformers' default_num_hash_layers.
  const hashLayers = f.int("num_hash_layers", { def: 3, min: 0, max: numLayers });
  const scaling = new Fields(f.obj("rope_scaling").src as Json, `${f.where} rope_scaling`);
  const yarnType = scaling.str("type", scaling.has("rope_type") ? scaling.str("rope_type") : "");
  if (yarnType !== "yarn") {
    throw new Error(`${f.where}: rope_scaling type ${yarnType} is not supported (yarn)`);
  }
  return {
    family: "deepseek_v4",
    modelType: mt,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: f.int("hidden_size", { min: 1 }),
    numLayers,
    numHeads,
    numKvHeads: 1,
    headDim,
    intermediateSize: 0,
    rmsNormEps: f.num("rms_norm_eps"),
    rope: {
      theta: f.num("rope_theta"),
      layout: "interleaved",
      dim: ropeDim,
      scaling: { type: "none" },
    },
    maxPositions: f.int("max_position_embeddings", { min: 1 }),
    tieWordEmbeddings: f.bool("tie_word_embeddings", false),
    qkNorm: false,
    attentionBias: false,
    layerKinds: Array(numLayers).fill("moe"),
    moe: {
      numExperts,
      topK,
      expertIntermediate: inter,
      scoring: "sqrtsoftplus",
      normTopK: true,
      routedScaling: f.num("routed_scaling_factor"),
      nGroup: 1,
      topkGroup: 1,
      // Hash layers have no bias (their gate is a table); the others' is `ffn.gate.bias`.
      selectionBias: hashLayers < numLayers,
      sharedIntermediate: inter * f.int("n_shared_experts", { min: 0 }),
      swigluLimit: f.num("swiglu_limit"),
      hashLayers,
    },
    mla: null,
    csa: {
      qLoraRank: f.int("q_lora_rank", { min: 1 }),
      oGroups,
      oLoraRank: f.int("o_lora_rank", { min: 1 }),
      window: f.int("sliding_window", { min: 1 }),
      layers,
      // transformers forces YaRN's attention factor to 1 on the compressed layers' table.
      compressRope: {
        theta: f.num("compress_rope_theta"),
        layout: "interleaved",
        dim: ropeDim,
        scaling: {
          type: "yarn",
          factor: scaling.num("factor"),
          originalMaxPositions: scaling.int("original_max_position_embeddings", { min: 1 }),
          betaFast: scaling.num("beta_fast", 32),
          betaSlow: scaling.num("beta_slow", 1),
          // Equal mscales make YaRN's attention factor 1, as transformers forces it here.
          mscale: 1,
          mscaleAllDim: 1,
        },
      },
      indexer: {
        heads: f.int("index_n_heads", { min: 1 }),
        headDim: f.int("index_head_dim", { min: 2 }),
        topK: f.int("index_topk", { min: 1 }),
      },
    },
    residual: {
      kind: "hyper",
      streams: f.int("hc_mult", { min: 1 }),
      sinkhornIters: f.int("hc_sinkhorn_iters", { min: 1 }),
      eps: f.num("hc_eps"),
    },
    attnScale: 1 / Math.sqrt(headDim),
  };
};

/** The MoE block as DeepSeek's original checkpoints name it (`ffn.experts.E.w1`). */
export const DEEPSEEK_V4_NAMING: MoeNaming = {
  moe: "ffn",
  expert: { gate: "w1", up: "w3", down: "w2" },
};

/** Layer tensors under their original DeepSeek names (relative to `layers.N.`). */
const LAYER_NAMES: Partial<Record<LayerTensor, string>> = {
  attn_norm: "attn_norm.weight",
  ffn_norm: "ffn_norm.weight",
  wq_a: "attn.wq_a.weight",
  q_a_norm: "attn.q_norm.weight",
  wq_b: "attn.wq_b.weight",
  wkv: "attn.wkv.weight",
  kv_norm: "attn.kv_norm.weight",
  wo_a: "attn.wo_a.weight",
  wo_b: "attn.wo_b.weight",
  sinks: "attn.attn_sink",
};

/** A MoE layer's router and shared expert (every DeepSeek-V4 layer is one). */
const FFN_NAMES: Partial<Record<LayerTensor, string>> = {
  router: "ffn.gate.weight",
  shared_gate: "ffn.shared_experts.w1.weight",
  shared_up: "ffn.shared_experts.w3.weight",
  shared_down: "ffn.shared_experts.w2.weight",
};

/**
 * The hyper-connections' weights before each sublayer, stored under their canonical names without
 * a `.weight` suffix (DeepSeek-V4 and GLM-5.3-Flash alike).
 */
export const HYPER_NAMES: Partial<Record<LayerTensor, string>> = {
  hc_attn_fn: "hc_attn_fn",
  hc_attn_base: "hc_attn_base",
  hc_attn_scale: "hc_attn_scale",
  hc_ffn_fn: "hc_ffn_fn",
  hc_ffn_base: "hc_ffn_base",
  hc_ffn_scale: "hc_ffn_scale",
};

/** A compressed layer's compressor, and a CSA layer's indexer. */
const COMPRESSOR_NAMES: Partial<Record<LayerTensor, string>> = {
  cmp_wkv: "attn.compressor.wkv.weight",
  cmp_wgate: "attn.compressor.wgate.weight",
  cmp_ape: "attn.compressor.ape",
  cmp_norm: "attn.compressor.norm.weight",
};
const INDEXER_NAMES: Partial<Record<LayerTensor, string>> = {
  idx_wq_b: "attn.indexer.wq_b.weight",
  idx_weights: "attn.indexer.weights_proj.weight",
  idx_wkv: "attn.indexer.compressor.wkv.weight",
  idx_wgate: "attn.indexer.compressor.wgate.weight",
  idx_ape: "attn.indexer.compressor.ape",
  idx_norm: "attn.indexer.compressor.norm.weight",
};

/** Every tensor of layer `layer` by its original name (the skeleton's included). */
export function deepseekV4LayerNames(
  cfg: ModelConfig,
  layer: number,
): Partial<Record<LayerTensor, string>> {
  const l = cfg.csa!.layers[layer];
  const hash = layer < (cfg.moe?.hashLayers ?? 0);
  const moe = cfg.layerKinds[layer] === "moe";
  return {
    ...LAYER_NAMES,
    ...(cfg.residual?.kind === "hyper" ? HYPER_NAMES : {}),
    ...(moe ? FFN_NAMES : {}),
    ...(!moe
      ? {}
      : hash
      ? { router_tid2eid: "ffn.gate.tid2eid" }
      : { router_bias: "ffn.gate.bias" }),
    ...(l.ratio ? COMPRESSOR_NAMES : {}),
    ...(l.indexed ? INDEXER_NAMES : {}),
  };
}

/** The deepseek_v4 family. */
export const DEEPSEEK_V4: Family = {
  name: "deepseek_v4",
  attentionTensors: deepseekV4LayerNames,
  namesEveryTensor: true,
  validateConfig(c, where) {
    const s = manifestField.obj(c.csa, `${where}.csa`);
    for (const k of ["qLoraRank", "oGroups", "oLoraRank", "window"]) {
      manifestField.int(s[k], `${where}.csa.${k}`, 1, MAX_DIM);
    }
    const ix = manifestField.obj(s.indexer, `${where}.csa.indexer`);
    for (const k of ["heads", "headDim", "topK"]) {
      manifestField.int(ix[k], `${where}.csa.indexer.${k}`, 1, MAX_DIM);
    }
    if (!Array.isArray(s.layers) || s.layers.length !== c.numLayers) {
      throw new Error(`${where}.csa.layers: expected one entry per layer`);
    }
    s.layers.forEach((raw, l) => {
      const e = manifestField.obj(raw, `${where}.csa.layers[${l}]`);
      manifestField.int(e.ratio, `${where}.csa.layers[${l}].ratio`, 0, MAX_DIM);
      manifestField.bool(e.indexed, `${where}.csa.layers[${l}].indexed`);
    });
    manifestField.obj(s.compressRope, `${where}.csa.compressRope`);
    if (manifestField.obj(c.residual, `${where}.residual`).kind !== "hyper") {
      throw new Error(`${where}.residual.kind: deepseek_v4 runs hyper-connections`);
    }
  },
};
