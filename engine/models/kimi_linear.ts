/**
 * The kimi_linear family (`KimiLinearForCausalLM`, Kimi-Linear-48B-A3B): a hybrid of KDA layers
 * (engine/parts/kda.ts: short convs, gated delta rule, a fixed-size recurrent state per layer)
 * and NoPE MLA layers (engine/parts/mla.ts), chosen per layer by `linear_attn_config` into
 * `kda.layers`; a dense first layer, then sigmoid routing with the correction bias, routed scaling
 * and a shared expert. This file holds the config normaliser, each layer kind's tensors' Hugging
 * Face names and the stored-config check.
 *
 * @module
 */
import { manifestField, MAX_DIM } from "../../io/manifest.ts";
import { isKdaLayer, type LayerTensor, type MoeConfig } from "../../io/model_config.ts";
import { DEEPSEEK_V3, mlaTensors } from "./deepseek_v3.ts";
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

/** The kimi_linear family. */
export const KIMI_LINEAR: Family = {
  name: "kimi_linear",
  attentionTensors: (cfg, layer) => isKdaLayer(cfg, layer) ? KDA_TENSORS : mlaTensors(cfg),
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
};
