/**
 * The qwen3_next family: Qwen3-Next (`Qwen3NextForCausalLM`, Qwen3-Next-80B-A3B,
 * Qwen3-Coder-Next) and Qwen3.5/3.6-MoE (`Qwen3_5MoeForConditionalGeneration`, text model only),
 * hybrids of Gated DeltaNet layers (the `gdn` mixer, engine/parts/gated_deltanet.ts) and gated
 * full-attention layers (the `gqa` mixer with its output gate, (1 + w) q/k norms and partial
 * rotate-half RoPE), chosen per layer by `layer_types`. The feed-forward is the skeleton's softmax
 * top-k MoE with a shared expert scaled by a sigmoid gate, and every RMSNorm of the skeleton
 * scales by (1 + w): all parts that exist, set by config features. This file holds both config
 * normalisers, each layer kind's Hugging Face tensor names (flat in Qwen3.5, fused per key head in
 * Qwen3-Next), the MoE namings and the stored-config check.
 *
 * @module
 */
import { manifestField, MAX_DIM } from "../../io/manifest.ts";
import { type LayerTensor, mixerOf, type ModelConfig } from "../../io/model_config.ts";
import type { Family, MoeNaming } from "./family.ts";
import { checkTopK, type Fields, type Normaliser, requireSilu, ropeSource } from "./hf_config.ts";
import { LLAMA } from "./llama.ts";

/**
 * Per layer: true for a Gated DeltaNet ("linear_attention") layer. From `layer_types` when the
 * config lists them, else every `full_attention_interval`-th layer is full attention.
 */
function linearLayers(f: Fields, numLayers: number): boolean[] {
  if (!f.has("layer_types")) {
    const every = f.int("full_attention_interval", { def: 4, min: 1 });
    return Array.from({ length: numLayers }, (_, i) => (i + 1) % every !== 0);
  }
  const types = f.src.layer_types;
  if (!Array.isArray(types) || types.length !== numLayers) {
    throw new Error(`${f.where}: field layer_types must list ${numLayers} layer types`);
  }
  return types.map((t, i) => {
    if (t !== "linear_attention" && t !== "full_attention") {
      throw new Error(
        `${f.where}: layer_types[${i}] ${JSON.stringify(t)} is not linear_attention or ` +
          `full_attention`,
      );
    }
    return t === "linear_attention";
  });
}

/** The hybrid both storages share, from the text model's fields. */
function normaliseHybrid(
  f: Fields,
  mt: string,
  storage: { projections: "flat" | "grouped"; partialRotary: number; normTopK: boolean },
): ReturnType<Normaliser> {
  requireSilu(f);
  if (f.has("attn_output_gate") && !f.bool("attn_output_gate", true)) {
    throw new Error(`${f.where}: attn_output_gate false is not supported (transformers gates)`);
  }
  if (f.bool("attention_bias", false)) {
    throw new Error(`${f.where}: attention_bias true is not supported`);
  }
  const hidden = f.int("hidden_size", { min: 1 });
  const numLayers = f.int("num_hidden_layers", { min: 1 });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  const numKvHeads = f.int("num_key_value_heads", { min: 1 });
  const headDim = f.has("head_dim") ? f.int("head_dim", { min: 1 }) : hidden / numHeads;
  if (!Number.isInteger(headDim)) {
    throw new Error(`${f.where}: hidden_size ${hidden} is not a multiple of num_attention_heads`);
  }
  const partial = storage.partialRotary;
  const rotDim = Math.floor(headDim * partial);
  if (!(partial > 0 && partial <= 1) || rotDim < 2 || rotDim % 2) {
    throw new Error(
      `${f.where}: partial_rotary_factor ${partial} of head_dim ${headDim} must give an even ` +
        `rotary dim >= 2, got ${rotDim}`,
    );
  }
  const { theta, scaling } = ropeSource(f, {
    ropeTheta: 10000,
    rmsNormEps: 1e-6,
    maxPositions: 32768,
  });
  const numKeyHeads = f.int("linear_num_key_heads", { min: 1 });
  const numValueHeads = f.int("linear_num_value_heads", { min: 1 });
  if (numValueHeads % numKeyHeads) {
    throw new Error(
      `${f.where}: linear_num_value_heads ${numValueHeads} is not a multiple of ` +
        `linear_num_key_heads ${numKeyHeads}`,
    );
  }
  const numExperts = f.int("num_experts", { min: 1 });
  const topK = f.int("num_experts_per_tok", { min: 1 });
  checkTopK(f, numExperts, topK);
  // Qwen3-Next: MoE every decoder_sparse_step layers except mlp_only_layers; Qwen3.5 reads
  // neither (every layer MoE).
  const step = f.int("decoder_sparse_step", { def: 1, min: 1 });
  const mlpOnly = new Set(storage.projections === "grouped" ? f.intList("mlp_only_layers") : []);
  const layerKinds = Array.from(
    { length: numLayers },
    (_, l) => !mlpOnly.has(l) && (l + 1) % step === 0 ? "moe" : "dense",
  ) as ("dense" | "moe")[];
  return {
    family: "qwen3_next",
    modelType: mt,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: hidden,
    numLayers,
    numHeads,
    numKvHeads,
    headDim,
    intermediateSize: layerKinds.includes("dense") ? f.int("intermediate_size", { min: 1 }) : 0,
    rmsNormEps: f.num("rms_norm_eps", 1e-6),
    // Rotate-half on the leading rotDim dims of each head; the frequencies use rotDim.
    rope: { theta, layout: "half", dim: rotDim, scaling },
    maxPositions: f.int("max_position_embeddings", { def: 32768, min: 1 }),
    tieWordEmbeddings: f.bool("tie_word_embeddings", false),
    qkNorm: true,
    attentionBias: false,
    layerKinds,
    moe: {
      numExperts,
      topK,
      expertIntermediate: f.int("moe_intermediate_size", { min: 1 }),
      scoring: "softmax",
      normTopK: storage.normTopK,
      routedScaling: 1,
      nGroup: 1,
      topkGroup: 1,
      selectionBias: false,
      sharedIntermediate: f.int("shared_expert_intermediate_size", { min: 0 }),
      sharedExpertGate: true,
    },
    mla: null,
    gdn: {
      numKeyHeads,
      numValueHeads,
      keyHeadDim: f.int("linear_key_head_dim", { min: 1 }),
      valueHeadDim: f.int("linear_value_head_dim", { min: 1 }),
      convKernel: f.int("linear_conv_kernel_dim", { min: 1 }),
      layers: linearLayers(f, numLayers),
      projections: storage.projections,
    },
    normUnitOffset: true,
    attnOutputGate: true,
    attnScale: 1 / Math.sqrt(headDim),
  };
}

/**
 * Qwen3-Next: a flat config; rope_theta and partial_rotary_factor at the top level, the
 * norm_topk_prob switch, dense layers by decoder_sparse_step / mlp_only_layers, the DeltaNet
 * projections fused per key head.
 */
export const normaliseQwen3Next: Normaliser = (f, mt) =>
  normaliseHybrid(f, mt, {
    projections: "grouped",
    partialRotary: f.num("partial_rotary_factor", 0.25),
    normTopK: f.bool("norm_topk_prob", true),
  });

/**
 * Qwen3.5/3.6-MoE: the text model under `text_config` (the vision tower and the MTP block are
 * not run), partial_rotary_factor in rope_parameters (or at the top), MoE on every layer with
 * the top-k weights always renormalised, flat DeltaNet projections.
 */
export const normaliseQwen3_5Moe: Normaliser = (top, mt) => {
  const f = top.obj("text_config");
  const params = f.src.rope_parameters as Record<string, unknown> | undefined;
  const partial = typeof params?.partial_rotary_factor === "number"
    ? params.partial_rotary_factor
    : f.num("partial_rotary_factor", 0.25);
  return normaliseHybrid(f, mt, { projections: "flat", partialRotary: partial, normTopK: true });
};

/** A Gated DeltaNet layer's tensors, relative to `model.layers.N.`. */
function gdnTensors(cfg: ModelConfig): Partial<Record<LayerTensor, string>> {
  const common: Partial<Record<LayerTensor, string>> = {
    qkv_conv: "linear_attn.conv1d.weight",
    dt_bias: "linear_attn.dt_bias",
    a_log: "linear_attn.A_log",
    o_norm: "linear_attn.norm.weight",
    wo: "linear_attn.out_proj.weight",
  };
  return cfg.gdn!.projections === "grouped"
    ? {
      gdn_qkvz: "linear_attn.in_proj_qkvz.weight",
      gdn_ba: "linear_attn.in_proj_ba.weight",
      ...common,
    }
    : {
      gdn_qkv: "linear_attn.in_proj_qkv.weight",
      gdn_z: "linear_attn.in_proj_z.weight",
      gdn_b: "linear_attn.in_proj_b.weight",
      gdn_a: "linear_attn.in_proj_a.weight",
      ...common,
    };
}

/** The qwen3_next family. */
export const QWEN3_NEXT: Family = {
  name: "qwen3_next",
  attentionTensors: (cfg, layer) =>
    mixerOf(cfg, layer) === "gdn" ? gdnTensors(cfg) : LLAMA.attentionTensors(cfg, layer),
  validateConfig(c, where) {
    if (c.mla !== null) throw new Error(`${where}.mla: the qwen3_next family has no MLA section`);
    if (c.attention !== undefined || c.kda !== undefined) {
      throw new Error(`${where}: sinks, windows and KDA belong to other families`);
    }
    const g = manifestField.obj(c.gdn, `${where}.gdn`);
    for (
      const key of ["numKeyHeads", "numValueHeads", "keyHeadDim", "valueHeadDim", "convKernel"]
    ) {
      manifestField.int(g[key], `${where}.gdn.${key}`, 1, MAX_DIM);
    }
    if ((g.numValueHeads as number) % (g.numKeyHeads as number)) {
      throw new Error(`${where}.gdn: numValueHeads must be a multiple of numKeyHeads`);
    }
    const layers = g.layers;
    if (!Array.isArray(layers) || layers.length !== c.numLayers) {
      throw new Error(`${where}.gdn.layers: expected ${c.numLayers} entries`);
    }
    layers.forEach((x, i) => manifestField.bool(x, `${where}.gdn.layers[${i}]`));
    manifestField.oneOf(g.projections, ["flat", "grouped"], `${where}.gdn.projections`);
  },
};

/** Qwen3.5's MoE naming: stacked experts, `shared_expert` and its gate under `mlp.`. */
export const QWEN3_5_NAMING: MoeNaming = {
  moe: "mlp",
  expert: { gate: "gate_proj", up: "up_proj", down: "down_proj" },
  stacked: true,
  shared: "shared_expert",
};

/** Qwen3-Next's MoE naming: one tensor per expert, `shared_expert` and its gate under `mlp.`. */
export const QWEN3_NEXT_NAMING: MoeNaming = {
  moe: "mlp",
  expert: { gate: "gate_proj", up: "up_proj", down: "down_proj" },
  shared: "shared_expert",
};
