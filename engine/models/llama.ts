/**
 * The llama family: Llama, Mixtral, Qwen3-MoE (optional q/k/v biases; Qwen3's per-head q/k
 * RMSNorm before RoPE) and GLM-4.5 (q/k/v biases, optional q/k norm, RoPE on the leading part of
 * each head), and MiniMax-M2 (engine/models/minimax_m2.ts: one q/k norm over the whole
 * projection), every layer running the grouped-query attention mixer (engine/parts/gqa.ts) and a
 * dense or MoE feed-forward. This file holds how each model_type's config.json normalises, the
 * attention tensors' Hugging Face names and the stored-config check.
 *
 * @module
 */
import type { LayerTensor, MoeConfig, RopeLayout } from "../../io/model_config.ts";
import type { Family, MoeNaming } from "./family.ts";
import {
  checkTopK,
  type FamilyDefaults,
  type Fields,
  groupedMoe,
  MAX_LAYERS,
  type Normaliser,
  requireSilu,
  ropeSource,
  softmaxMoe,
} from "./hf_config.ts";

/** Fields shared by all Llama-style (GQA) families. */
export function gqaBase(
  f: Fields,
  modelType: string,
  d: FamilyDefaults,
  opts: { qkNorm: boolean },
) {
  requireSilu(f);
  const hidden = f.int("hidden_size", { min: 1 });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  const headDim = f.has("head_dim") ? f.int("head_dim", { min: 1 }) : hidden / numHeads;
  if (!Number.isInteger(headDim)) {
    throw new Error(`${f.where}: hidden_size ${hidden} is not a multiple of num_attention_heads`);
  }
  const numKvHeads = f.int("num_key_value_heads", { def: numHeads, min: 1 });
  if (numHeads % numKvHeads) {
    throw new Error(
      `${f.where}: num_attention_heads ${numHeads} not a multiple of num_key_value_heads`,
    );
  }
  const { theta, scaling } = ropeSource(f, d);
  return {
    family: "llama" as const,
    modelType,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: hidden,
    numLayers: f.int("num_hidden_layers", { min: 1, max: MAX_LAYERS }),
    numHeads,
    numKvHeads,
    headDim,
    rmsNormEps: f.num("rms_norm_eps", d.rmsNormEps),
    rope: { theta, layout: "half" as RopeLayout, dim: headDim, scaling },
    maxPositions: f.int("max_position_embeddings", { def: d.maxPositions, min: 1 }),
    tieWordEmbeddings: f.bool("tie_word_embeddings", false),
    qkNorm: opts.qkNorm,
    attentionBias: f.bool("attention_bias", false),
    mla: null,
    attnScale: 1 / Math.sqrt(headDim),
  };
}

/** Llama (dense). */
export const normaliseLlama: Normaliser = (f, mt) => {
  const base = gqaBase(f, mt, { ropeTheta: 10000, rmsNormEps: 1e-6, maxPositions: 2048 }, {
    qkNorm: false,
  });
  return {
    ...base,
    intermediateSize: f.int("intermediate_size", { min: 1 }),
    layerKinds: Array(base.numLayers).fill("dense"),
    moe: null,
  };
};

/** Mixtral: every layer MoE, softmax top-k, always renormalised. */
export const normaliseMixtral: Normaliser = (f, mt) => {
  const base = gqaBase(f, mt, { ropeTheta: 1e6, rmsNormEps: 1e-5, maxPositions: 4096 * 32 }, {
    qkNorm: false,
  });
  const numExperts = f.int("num_local_experts", { min: 1 });
  const topK = f.int("num_experts_per_tok", { min: 1 });
  checkTopK(f, numExperts, topK);
  return {
    ...base,
    attentionBias: false,
    intermediateSize: 0,
    layerKinds: Array(base.numLayers).fill("moe"),
    // Mixtral always renormalises the chosen top-k weights.
    moe: softmaxMoe(numExperts, topK, f.int("intermediate_size", { min: 1 }), true),
  };
};

/** Qwen3-MoE: q/k norms, MoE every decoder_sparse_step layers except mlp_only_layers. */
export const normaliseQwen3Moe: Normaliser = (f, mt) => {
  const base = gqaBase(f, mt, { ropeTheta: 10000, rmsNormEps: 1e-6, maxPositions: 32768 }, {
    qkNorm: true,
  });
  const numExperts = f.int("num_experts", { min: 0 });
  const step = f.int("decoder_sparse_step", { def: 1, min: 1 });
  const mlpOnly = new Set(f.intList("mlp_only_layers"));
  const layerKinds = Array.from(
    { length: base.numLayers },
    (_, l) => !mlpOnly.has(l) && numExperts > 0 && (l + 1) % step === 0 ? "moe" : "dense",
  ) as ("dense" | "moe")[];
  const anyDense = layerKinds.includes("dense");
  const anyMoe = layerKinds.includes("moe");
  let moe: MoeConfig | null = null;
  if (anyMoe) {
    const topK = f.int("num_experts_per_tok", { min: 1 });
    checkTopK(f, numExperts, topK);
    moe = softmaxMoe(
      numExperts,
      topK,
      f.int("moe_intermediate_size", { min: 1 }),
      f.bool("norm_topk_prob", false),
    );
  }
  return {
    ...base,
    intermediateSize: anyDense ? f.int("intermediate_size", { min: 1 }) : 0,
    layerKinds,
    moe,
  };
};

/**
 * GLM-4.5/4.6/4.7 and -Air (`Glm4MoeForCausalLM`): GQA with q/k/v biases, optional per-head q/k
 * norm and rotate_half RoPE on the leading partial_rotary_factor of each head (its inverse
 * frequencies normalised by the rotary dim); dense layers below first_k_dense_replace, then
 * noaux_tc sigmoid routing with shared experts. The multi-token-prediction layers stored at
 * index ≥ num_hidden_layers are not part of this model (the packer skips them).
 */
export const normaliseGlm4Moe: Normaliser = (f, mt) => {
  const base = gqaBase(f, mt, { ropeTheta: 10000, rmsNormEps: 1e-5, maxPositions: 131072 }, {
    qkNorm: f.bool("use_qk_norm", false),
  });
  const partial = f.num("partial_rotary_factor", 0.5);
  const rotDim = Math.floor(base.headDim * partial);
  if (!(partial > 0 && partial <= 1) || rotDim < 2 || rotDim % 2) {
    throw new Error(
      `${f.where}: partial_rotary_factor ${partial} of head_dim ${base.headDim} must give an ` +
        `even rotary dim >= 2, got ${rotDim}`,
    );
  }
  const numExperts = f.int("n_routed_experts", { def: 128, min: 1 });
  const firstDense = f.int("first_k_dense_replace", { def: 1 });
  const layerKinds = Array.from(
    { length: base.numLayers },
    (_, l) => l >= firstDense ? "moe" : "dense",
  ) as ("dense" | "moe")[];
  return {
    ...base,
    rope: { ...base.rope, dim: rotDim },
    intermediateSize: firstDense > 0 ? f.int("intermediate_size", { min: 1 }) : 0,
    layerKinds,
    moe: layerKinds.includes("moe")
      ? groupedMoe(f, numExperts, "sigmoid", "noaux_tc", {
        routedScaling: 1,
        groups: 1,
        sharedExperts: 1,
      })
      : null,
  };
};

/** The llama family. */
export const LLAMA: Family = {
  name: "llama",
  attentionTensors(cfg) {
    const names: Partial<Record<LayerTensor, string>> = {
      wq: "self_attn.q_proj.weight",
      wk: "self_attn.k_proj.weight",
      wv: "self_attn.v_proj.weight",
      wo: "self_attn.o_proj.weight",
    };
    if (cfg.attentionBias) {
      for (const b of ["q", "k", "v"] as const) names[`b${b}`] = `self_attn.${b}_proj.bias`;
    }
    if (cfg.qkNorm) {
      names.q_norm = "self_attn.q_norm.weight";
      names.k_norm = "self_attn.k_norm.weight";
    }
    return names;
  },
  validateConfig(c, where) {
    if (c.mla !== null) throw new Error(`${where}.mla: the llama family has no MLA section`);
    if (c.attention !== undefined) {
      throw new Error(`${where}.attention: sinks and windows belong to the gpt_oss family`);
    }
  },
};

/** Experts named `experts.E.{gate,up,down}_proj` under `mlp.` (Llama-style, Qwen3, DeepSeek). */
export const MLP_NAMING: MoeNaming = {
  moe: "mlp",
  expert: { gate: "gate_proj", up: "up_proj", down: "down_proj" },
};

/** Mixtral's naming: `block_sparse_moe.experts.E.{w1,w3,w2}`. */
export const MIXTRAL_NAMING: MoeNaming = {
  moe: "block_sparse_moe",
  expert: { gate: "w1", up: "w3", down: "w2" },
};
