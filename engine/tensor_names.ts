/**
 * The Hugging Face checkpoint name of every canonical tensor, per model_type. One naming table
 * per checkpoint family; a new family is one more entry.
 *
 * @module
 */

import {
  type ExpertMatrix,
  type GlobalTensor,
  isKdaLayer,
  type LayerTensor,
  type ModelConfig,
} from "../io/model_config.ts";

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
  "shared_gate",
  "shared_up",
  "shared_down",
  "q_conv",
  "k_conv",
  "v_conv",
  "f_a",
  "f_b",
  "dt_bias",
  "a_log",
  "beta_proj",
  "g_a",
  "g_b",
  "o_norm",
  "attn_gate",
  "latent_down",
  "latent_norm",
  "latent_up",
  "attn_res_norm",
  "attn_res_proj",
  "mlp_res_norm",
  "mlp_res_proj",
];

/** Naming of one checkpoint family, relative to `model.layers.N.`. */
interface Naming {
  /** Prefix of every name but lm_head's (`model.`; Kimi K3: `language_model.model.`). */
  prefix?: string;
  /** Name of the untied LM head (default `lm_head.weight`). */
  lmHead?: string;
  /** Prefix of the MoE block (router and experts). */
  moe: string;
  /** Expert matrix names inside `experts.E.`. */
  expert: Record<ExpertMatrix, string>;
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
  kimi_linear: { moe: "block_sparse_moe", expert: { gate: "w1", up: "w3", down: "w2" } },
  kimi_k3: {
    prefix: "language_model.model.",
    lmHead: "language_model.lm_head.weight",
    moe: "block_sparse_moe",
    expert: { gate: "w1", up: "w3", down: "w2" },
  },
};

/** Kimi K3's latent MoE and Attention Residual tensors, relative to `model.layers.N.`. */
const K3_NAMES: Partial<Record<LayerTensor, string>> = {
  latent_down: "block_sparse_moe.routed_expert_down_proj.weight",
  latent_norm: "block_sparse_moe.routed_expert_norm.weight",
  latent_up: "block_sparse_moe.routed_expert_up_proj.weight",
  attn_res_norm: "self_attention_res_norm.weight",
  attn_res_proj: "self_attention_res_proj.weight",
  mlp_res_norm: "mlp_res_norm.weight",
  mlp_res_proj: "mlp_res_proj.weight",
};

/** KDA tensors, relative to `self_attn.` (the names of the released Kimi-Linear checkpoint). */
const KDA_NAMES: Partial<Record<LayerTensor, string>> = {
  q_conv: "q_conv1d.weight",
  k_conv: "k_conv1d.weight",
  v_conv: "v_conv1d.weight",
  f_a: "f_a_proj.weight",
  f_b: "f_b_proj.weight",
  dt_bias: "dt_bias",
  a_log: "A_log",
  beta_proj: "b_proj.weight",
  g_a: "g_a_proj.weight",
  g_b: "g_b_proj.weight",
  o_norm: "o_norm.weight",
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
  const naming = namingOf(cfg);
  const prefix = naming.prefix ?? "model.";
  switch (t) {
    case "embed":
      return `${prefix}embed_tokens.weight`;
    case "final_norm":
      return `${prefix}norm.weight`;
    case "lm_head":
      return cfg.tieWordEmbeddings ? null : naming.lmHead ?? "lm_head.weight";
    case "out_res_norm":
      return cfg.k3 ? `${prefix}output_attn_res_norm.weight` : null;
    case "out_res_proj":
      return cfg.k3 ? `${prefix}output_attn_res_proj.weight` : null;
  }
}

/** The path of a tensor relative to `model.layers.N.`, when the layer has it. */
function relativeName(cfg: ModelConfig, layer: number, t: LayerTensor): string | null {
  const moeLayer = cfg.layerKinds[layer] === "moe";
  const kda = isKdaLayer(cfg, layer);
  // A KDA layer has q/k/v/o projections like GQA, and no MLA tensors.
  const mla = kda ? null : cfg.mla;
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
      return moeLayer ? `${naming.moe}.gate.weight` : null;
    case "router_bias":
      return moeLayer && moe?.selectionBias ? `${naming.moe}.gate.e_score_correction_bias` : null;
    case "shared_gate":
    case "shared_up":
    case "shared_down":
      return moeLayer && moe && moe.sharedIntermediate > 0
        ? `${naming.moe}.shared_experts.${t.slice(7)}_proj.weight`
        : null;
    case "g_a":
    case "g_b":
      return kda && !cfg.kda!.fullRankGate ? `self_attn.${KDA_NAMES[t]}` : null;
    case "attn_gate":
      // K3: KDA's full-rank output gate, or MLA's output gate; both are self_attn.g_proj.
      return (kda && cfg.kda!.fullRankGate) || mla?.outputGate ? "self_attn.g_proj.weight" : null;
    case "latent_down":
    case "latent_norm":
    case "latent_up":
      return moeLayer && cfg.k3 ? K3_NAMES[t]! : null;
    case "attn_res_norm":
    case "attn_res_proj":
    case "mlp_res_norm":
    case "mlp_res_proj":
      return cfg.k3 ? K3_NAMES[t]! : null;
    default:
      return kda ? `self_attn.${KDA_NAMES[t]}` : null;
  }
}

/** Hugging Face name of a layer tensor, or null when that layer of this model has no such tensor. */
export function hfLayerName(cfg: ModelConfig, layer: number, t: LayerTensor): string | null {
  checkLayer(cfg, layer);
  const rel = relativeName(cfg, layer, t);
  return rel === null ? null : `${namingOf(cfg).prefix ?? "model."}layers.${layer}.${rel}`;
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
  const prefix = naming.prefix ?? "model.";
  return `${prefix}layers.${layer}.${naming.moe}.experts.${expert}.${naming.expert[m]}.weight`;
}

/** The canonical tensors present in a layer, in {@link LAYER_TENSOR_ORDER}. */
export function layerTensorsOf(cfg: ModelConfig, layer: number): LayerTensor[] {
  checkLayer(cfg, layer);
  return LAYER_TENSOR_ORDER.filter((t) => relativeName(cfg, layer, t) !== null);
}
