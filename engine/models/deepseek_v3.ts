/**
 * The deepseek_v3 family (DeepSeek-V3/R1, Kimi-K2, GLM-5): every layer runs multi-head latent
 * attention (engine/parts/mla.ts; GLM-5's with DeepSeek Sparse Attention's lightning indexer) and a
 * dense or grouped-sigmoid MoE feed-forward with shared experts. This file holds the config
 * normalisers, the MLA tensors' Hugging Face names and the stored-config check.
 *
 * @module
 */
import { manifestField, MAX_DIM } from "../../io/manifest.ts";
import type { LayerTensor, ModelConfig } from "../../io/model_config.ts";
import type { Family } from "./family.ts";
import { groupedMoe, MAX_LAYERS, type Normaliser, requireSilu, ropeSource } from "./hf_config.ts";

/** Bound of the indexer's sizes (GLM-5: 32 heads of 128, top 2048), far above any real model's. */
const MAX_INDEXER = 2 ** 16;

/** yarn_get_mscale of DeepSeek's code: the attention scale multiplier for a YaRN factor. */
function yarnMscale(factor: number, mscale: number): number {
  return factor <= 1 ? 1 : 0.1 * mscale * Math.log(factor) + 1;
}

/** DeepSeek-V3 and Kimi-K2: MLA, sigmoid or softmax routing with groups, shared experts. */
export const normaliseDeepseekV3: Normaliser = (f, mt) => {
  requireSilu(f);
  const hidden = f.int("hidden_size", { min: 1 });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  const numLayers = f.int("num_hidden_layers", { min: 1, max: MAX_LAYERS });
  const qkNope = f.int("qk_nope_head_dim", { min: 1 });
  const qkRope = f.int("qk_rope_head_dim", { min: 2 });
  if (qkRope % 2) throw new Error(`${f.where}: qk_rope_head_dim ${qkRope} must be even`);
  const { theta, scaling } = ropeSource(f, {
    ropeTheta: 10000,
    rmsNormEps: 1e-6,
    maxPositions: 4096,
  });
  let attnScale = 1 / Math.sqrt(qkNope + qkRope);
  if (scaling.type === "yarn" && scaling.mscaleAllDim) {
    const m = yarnMscale(scaling.factor, scaling.mscaleAllDim);
    attnScale *= m * m;
  }
  const numExperts = f.has("n_routed_experts") ? f.int("n_routed_experts", { min: 1 }) : 0;
  const firstDense = f.int("first_k_dense_replace", { def: numExperts ? undefined : 0 });
  const freq = f.int("moe_layer_freq", { def: 1, min: 1 });
  const layerKinds = Array.from(
    { length: numLayers },
    (_, l) => numExperts > 0 && l >= firstDense && l % freq === 0 ? "moe" : "dense",
  ) as ("dense" | "moe")[];
  const moe = layerKinds.includes("moe")
    ? groupedMoe(f, numExperts, f.str("scoring_func", "sigmoid"), f.str("topk_method", "noaux_tc"))
    : null;
  const qLora = f.src.q_lora_rank === null ? null : f.int("q_lora_rank", { min: 1 });
  return {
    family: "deepseek_v3",
    modelType: mt,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: hidden,
    numLayers,
    numHeads,
    // MLA: every head has its own k and v (decompressed from the shared latent).
    numKvHeads: numHeads,
    headDim: qkNope + qkRope,
    intermediateSize: layerKinds.includes("dense") ? f.int("intermediate_size", { min: 1 }) : 0,
    rmsNormEps: f.num("rms_norm_eps", 1e-6),
    rope: {
      theta,
      // transformers' rope_interleave defaults to true: the checkpoint's q_pe/k_pe pairs are (2i, 2i+1).
      layout: f.bool("rope_interleave", true) ? "interleaved" : "half",
      dim: qkRope,
      scaling,
    },
    maxPositions: f.int("max_position_embeddings", { def: 4096, min: 1 }),
    tieWordEmbeddings: f.bool("tie_word_embeddings", false),
    qkNorm: false,
    attentionBias: f.bool("attention_bias", false),
    layerKinds,
    moe,
    mla: {
      qLoraRank: qLora,
      kvLoraRank: f.int("kv_lora_rank", { min: 1 }),
      qkNopeHeadDim: qkNope,
      qkRopeHeadDim: qkRope,
      vHeadDim: f.int("v_head_dim", { min: 1 }),
    },
    attnScale,
  };
};

/**
 * GLM-5 (glm_moe_dsa): DeepSeek-V3's layout plus the lightning indexer in every layer, and latent
 * norms at transformers' fixed eps 1e-6 whatever rms_norm_eps says. The MTP layers stored after
 * num_hidden_layers are skipped like GLM-4.5's.
 */
export const normaliseGlmMoeDsa: Normaliser = (f, mt) => {
  const cfg = normaliseDeepseekV3(f, mt);
  const mla = cfg.mla!;
  if (mla.qLoraRank === null) {
    throw new Error(`${f.where}: the indexer reads the q latent, so q_lora_rank must be set`);
  }
  // GLM-5.2 shares one selection over several layers; this runs an indexer per layer.
  for (const k of ["index_topk_freq", "indexer_types"]) {
    if (f.has(k)) throw new Error(`${f.where}: field ${k} (a shared indexer) is not supported`);
  }
  if (f.bool("indexer_rope_interleave", true) !== (cfg.rope.layout === "interleaved")) {
    throw new Error(
      `${f.where}: indexer_rope_interleave must equal rope_interleave (sluice rotates both alike)`,
    );
  }
  const headDim = f.int("index_head_dim", { min: mla.qkRopeHeadDim, max: MAX_INDEXER });
  return {
    ...cfg,
    mla: {
      ...mla,
      latentNormEps: 1e-6,
      indexer: {
        numHeads: f.int("index_n_heads", { min: 1, max: MAX_INDEXER }),
        headDim,
        topK: f.int("index_topk", { min: 1, max: MAX_INDEXER }),
      },
    },
  };
};

/** The MLA tensors of a layer and their Hugging Face names (also Kimi-Linear's MLA layers). */
export function mlaTensors(cfg: ModelConfig): Partial<Record<LayerTensor, string>> {
  const names: Partial<Record<LayerTensor, string>> = {};
  if (cfg.mla?.qLoraRank === null) names.wq = "self_attn.q_proj.weight";
  names.wo = "self_attn.o_proj.weight";
  if (cfg.mla?.qLoraRank !== null) {
    names.wq_a = "self_attn.q_a_proj.weight";
    names.q_a_norm = "self_attn.q_a_layernorm.weight";
    names.wq_b = "self_attn.q_b_proj.weight";
  }
  names.wkv_a = "self_attn.kv_a_proj_with_mqa.weight";
  names.kv_a_norm = "self_attn.kv_a_layernorm.weight";
  names.wkv_b = "self_attn.kv_b_proj.weight";
  if (cfg.mla?.indexer) {
    names.idx_wq = "self_attn.indexer.wq_b.weight";
    names.idx_wk = "self_attn.indexer.wk.weight";
    names.idx_k_norm = "self_attn.indexer.k_norm.weight";
    names.idx_k_bias = "self_attn.indexer.k_norm.bias";
    names.idx_w = "self_attn.indexer.weights_proj.weight";
  }
  if (cfg.mla?.indexer?.pool) {
    names.idx_pool_ape = "self_attn.indexer.index_kpool_compress_ape";
    names.idx_pool_gate = "self_attn.indexer.index_kpool_compress_gate";
  }
  return names;
}

/** The deepseek_v3 family. */
export const DEEPSEEK_V3: Family = {
  name: "deepseek_v3",
  attentionTensors: mlaTensors,
  validateConfig(c, where) {
    const m = manifestField.obj(c.mla, `${where}.mla`);
    if (m.qLoraRank !== null) manifestField.int(m.qLoraRank, `${where}.mla.qLoraRank`, 1, MAX_DIM);
    for (const k of ["kvLoraRank", "qkNopeHeadDim", "qkRopeHeadDim", "vHeadDim"]) {
      // NoPE MLA may have no rope dims at all (GLM-5.3-Flash).
      const min = k === "qkRopeHeadDim" && m.nope === true ? 0 : 1;
      manifestField.int(m[k], `${where}.mla.${k}`, min, MAX_DIM);
    }
    // Derived fields must say what the MLA section says (normaliseDeepseekV3 sets them so).
    const qk = (m.qkNopeHeadDim as number) + (m.qkRopeHeadDim as number);
    if (c.headDim !== qk || c.numKvHeads !== c.numHeads) {
      throw new Error(
        `${where}: headDim ${c.headDim} and numKvHeads ${c.numKvHeads} must be ` +
          `qkNopeHeadDim + qkRopeHeadDim (${qk}) and numHeads (${c.numHeads}) for MLA`,
      );
    }
    if (m.nope !== undefined) manifestField.bool(m.nope, `${where}.mla.nope`);
    if (m.latentNormEps !== undefined) {
      const eps = manifestField.num(m.latentNormEps, `${where}.mla.latentNormEps`);
      if (!(eps > 0 && eps < 1)) {
        throw new Error(`${where}.mla.latentNormEps: expected 0 < eps < 1`);
      }
    }
    if (m.indexer !== undefined) {
      const ix = manifestField.obj(m.indexer, `${where}.mla.indexer`);
      for (const k of ["numHeads", "headDim", "topK"]) {
        manifestField.int(ix[k], `${where}.mla.indexer.${k}`, 1, MAX_INDEXER);
      }
      if (ix.pool !== undefined) {
        manifestField.int(ix.pool, `${where}.mla.indexer.pool`, 1, ix.topK as number);
      }
      if (m.qLoraRank === null || (ix.headDim as number) < (m.qkRopeHeadDim as number)) {
        throw new Error(
          `${where}.mla.indexer: needs qLoraRank and headDim ≥ qkRopeHeadDim ${m.qkRopeHeadDim}`,
        );
      }
    }
  },
};
