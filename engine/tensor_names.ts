/**
 * The Hugging Face checkpoint name of every canonical tensor, per model_type. One naming table
 * per checkpoint family; a new family is one more entry.
 *
 * @module
 */

import type { ExpertMatrix, GlobalTensor, LayerTensor, ModelConfig } from "../io/model_config.ts";

/** Every canonical layer tensor, in the fixed order runs and listings use. */
export const LAYER_TENSOR_ORDER: readonly LayerTensor[] = [
  "attn_norm",
  "wq",
  "wk",
  "wv",
  "wo",
  "bq",
  "bk",
  "bv",
  "bo",
  "sinks",
  "q_norm",
  "k_norm",
  "wq_a",
  "q_a_norm",
  "wq_b",
  "wkv_a",
  "kv_a_norm",
  "wkv_b",
  "ffn_norm",
  "ffn_gate",
  "ffn_up",
  "ffn_down",
  "router",
  "router_bias",
  "router_b",
  "shared_gate",
  "shared_up",
  "shared_down",
];

/** Naming of one checkpoint family, relative to `model.layers.N.`. */
interface Naming {
  /** Prefix of the MoE block (router and experts). */
  moe: string;
  /** Expert matrix names inside `experts.E.`. */
  expert: Record<ExpertMatrix, string>;
  /** The router's module name inside the MoE block (default `gate`). */
  router?: string;
  /**
   * gpt-oss: all experts of a layer in two fused MXFP4 tensors (see {@link hfFusedExperts})
   * instead of one tensor per expert and matrix.
   */
  fused?: boolean;
}

const MLP_EXPERTS: Record<ExpertMatrix, string> = {
  gate: "gate_proj",
  up: "up_proj",
  down: "down_proj",
};

const NAMINGS: Record<string, Naming> = {
  llama: { moe: "mlp", expert: MLP_EXPERTS },
  mixtral: { moe: "block_sparse_moe", expert: { gate: "w1", up: "w3", down: "w2" } },
  qwen3_moe: { moe: "mlp", expert: MLP_EXPERTS },
  deepseek_v3: { moe: "mlp", expert: MLP_EXPERTS },
  kimi_k2: { moe: "mlp", expert: MLP_EXPERTS },
  glm4_moe: { moe: "mlp", expert: MLP_EXPERTS },
  gpt_oss: { moe: "mlp", expert: MLP_EXPERTS, router: "router", fused: true },
};

function namingOf(cfg: ModelConfig): Naming {
  const n = NAMINGS[cfg.modelType];
  if (!n) {
    throw new Error(
      `no tensor naming for model_type ${cfg.modelType} (known: ${
        Object.keys(NAMINGS).join(", ")
      })`,
    );
  }
  return n;
}

function checkLayer(cfg: ModelConfig, layer: number): void {
  if (!Number.isInteger(layer) || layer < 0 || layer >= cfg.numLayers) {
    throw new Error(`layer ${layer} is outside 0..${cfg.numLayers - 1}`);
  }
}

/** Hugging Face name of a global tensor; null for lm_head when it is tied to the embedding. */
export function hfGlobalName(cfg: ModelConfig, t: GlobalTensor): string | null {
  switch (t) {
    case "embed":
      return "model.embed_tokens.weight";
    case "final_norm":
      return "model.norm.weight";
    case "lm_head":
      return cfg.tieWordEmbeddings ? null : "lm_head.weight";
  }
}

/** The path of a tensor relative to `model.layers.N.`, when the layer has it. */
function relativeName(cfg: ModelConfig, layer: number, t: LayerTensor): string | null {
  const moeLayer = cfg.layerKinds[layer] === "moe";
  const mla = cfg.mla;
  const moe = cfg.moe;
  const naming = namingOf(cfg);
  switch (t) {
    case "attn_norm":
      return "input_layernorm.weight";
    case "ffn_norm":
      return "post_attention_layernorm.weight";
    case "wq":
      return !mla || mla.qLoraRank === null ? "self_attn.q_proj.weight" : null;
    case "wk":
      return mla ? null : "self_attn.k_proj.weight";
    case "wv":
      return mla ? null : "self_attn.v_proj.weight";
    case "wo":
      return "self_attn.o_proj.weight";
    case "bq":
    case "bk":
    case "bv":
      return !mla && cfg.attentionBias ? `self_attn.${t[1]}_proj.bias` : null;
    case "bo":
      return cfg.attention?.outputBias ? "self_attn.o_proj.bias" : null;
    case "sinks":
      return cfg.attention?.sinks ? "self_attn.sinks" : null;
    case "q_norm":
    case "k_norm":
      return cfg.qkNorm ? `self_attn.${t}.weight` : null;
    case "wq_a":
      return mla && mla.qLoraRank !== null ? "self_attn.q_a_proj.weight" : null;
    case "q_a_norm":
      return mla && mla.qLoraRank !== null ? "self_attn.q_a_layernorm.weight" : null;
    case "wq_b":
      return mla && mla.qLoraRank !== null ? "self_attn.q_b_proj.weight" : null;
    case "wkv_a":
      return mla ? "self_attn.kv_a_proj_with_mqa.weight" : null;
    case "kv_a_norm":
      return mla ? "self_attn.kv_a_layernorm.weight" : null;
    case "wkv_b":
      return mla ? "self_attn.kv_b_proj.weight" : null;
    case "ffn_gate":
    case "ffn_up":
    case "ffn_down":
      return moeLayer ? null : `mlp.${t.slice(4)}_proj.weight`;
    case "router":
      return moeLayer ? `${naming.moe}.${naming.router ?? "gate"}.weight` : null;
    case "router_bias":
      return moeLayer && moe?.selectionBias ? `${naming.moe}.gate.e_score_correction_bias` : null;
    case "router_b":
      return moeLayer && moe?.routerLogitBias ? `${naming.moe}.${naming.router}.bias` : null;
    case "shared_gate":
    case "shared_up":
    case "shared_down":
      return moeLayer && moe && moe.sharedIntermediate > 0
        ? `${naming.moe}.shared_experts.${t.slice(7)}_proj.weight`
        : null;
  }
}

/** Hugging Face name of a layer tensor, or null when that layer of this model has no such tensor. */
export function hfLayerName(cfg: ModelConfig, layer: number, t: LayerTensor): string | null {
  checkLayer(cfg, layer);
  const rel = relativeName(cfg, layer, t);
  return rel === null ? null : `model.layers.${layer}.${rel}`;
}

/** Hugging Face name of one matrix of one routed expert of a MoE layer. */
export function hfExpertName(
  cfg: ModelConfig,
  layer: number,
  expert: number,
  m: ExpertMatrix,
): string {
  checkLayer(cfg, layer);
  if (cfg.layerKinds[layer] !== "moe" || !cfg.moe) {
    throw new Error(`layer ${layer} is not a MoE layer`);
  }
  if (!Number.isInteger(expert) || expert < 0 || expert >= cfg.moe.numExperts) {
    throw new Error(`layer ${layer}: expert ${expert} is outside 0..${cfg.moe.numExperts - 1}`);
  }
  const naming = namingOf(cfg);
  if (naming.fused) {
    throw new Error(`${cfg.modelType}: experts are fused per layer, not one tensor per expert`);
  }
  return `model.layers.${layer}.${naming.moe}.experts.${expert}.${naming.expert[m]}.weight`;
}

/**
 * Where matrix `m` of every expert of MoE layer `layer` lies when the family fuses its experts
 * (gpt-oss), else null. `<base>_blocks` U8 [E, R, cols/32, 16], `<base>_scales` U8 [E, R, cols/32]
 * and `<base>_bias` [E, R] hold all experts; the matrix's row r is fused row first + r·step: gate
 * and up rows interleave in gate_up_proj (row 2m gate unit m, 2m + 1 up unit m), down_proj is
 * the down matrix as is.
 */
export function hfFusedExpertSlice(
  cfg: ModelConfig,
  layer: number,
  m: ExpertMatrix,
): { base: string; first: number; step: number } | null {
  checkLayer(cfg, layer);
  const naming = namingOf(cfg);
  if (!naming.fused || cfg.layerKinds[layer] !== "moe") return null;
  const p = `model.layers.${layer}.${naming.moe}.experts`;
  if (m === "down") return { base: `${p}.down_proj`, first: 0, step: 1 };
  return { base: `${p}.gate_up_proj`, first: m === "up" ? 1 : 0, step: 2 };
}

/** The canonical tensors present in a layer, in {@link LAYER_TENSOR_ORDER}. */
export function layerTensorsOf(cfg: ModelConfig, layer: number): LayerTensor[] {
  checkLayer(cfg, layer);
  return LAYER_TENSOR_ORDER.filter((t) => relativeName(cfg, layer, t) !== null);
}
