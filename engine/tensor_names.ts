/**
 * The Hugging Face checkpoint name of every canonical tensor. The layer skeleton's tensors (norms,
 * dense FFN, router, shared and routed experts) are named here from the model_type's MoE naming;
 * the attention tensors by the family (engine/models/<family>.ts), both found in the registry.
 *
 * @module
 */

import {
  type ExpertMatrix,
  type GlobalTensor,
  LAYER_TENSOR_ORDER,
  type LayerTensor,
  type ModelConfig,
} from "../io/model_config.ts";
import { familyOf, modelTypeOf } from "./models/mod.ts";

function checkLayer(cfg: ModelConfig, layer: number): void {
  if (!Number.isInteger(layer) || layer < 0 || layer >= cfg.numLayers) {
    throw new Error(`layer ${layer} is outside 0..${cfg.numLayers - 1}`);
  }
}

/** Hugging Face name of a global tensor; null for lm_head when it is tied to the embedding. */
export function hfGlobalName(cfg: ModelConfig, t: GlobalTensor): string | null {
  const type = modelTypeOf(cfg);
  const prefix = type.prefix ?? "model.";
  const own = type.globalNames?.[t];
  if (own !== undefined) return t === "lm_head" && cfg.tieWordEmbeddings ? null : own;
  switch (t) {
    case "embed":
      return `${prefix}embed_tokens.weight`;
    case "final_norm":
      return `${prefix}norm.weight`;
    case "lm_head":
      return cfg.tieWordEmbeddings ? null : type.lmHead ?? "lm_head.weight";
    case "out_res_norm":
      return cfg.residual?.kind === "attn_res" ? `${prefix}output_attn_res_norm.weight` : null;
    case "out_res_proj":
      return cfg.residual?.kind === "attn_res" ? `${prefix}output_attn_res_proj.weight` : null;
    case "hc_head_fn":
    case "hc_head_base":
    case "hc_head_scale":
      return cfg.residual?.kind === "hyper" && cfg.residual.collapse !== "mean"
        ? `${prefix}${t}`
        : null;
  }
}

/** The path of a tensor relative to `model.layers.N.`, when the layer has it. */
function relativeName(cfg: ModelConfig, layer: number, t: LayerTensor): string | null {
  // The family's names come first; a family that names every tensor leaves none to the skeleton.
  const family = familyOf(cfg);
  const own = family.attentionTensors(cfg, layer);
  if (Object.hasOwn(own, t) || family.namesEveryTensor) return own[t] ?? null;
  const moeLayer = cfg.layerKinds[layer] === "moe";
  const moe = cfg.moe;
  const naming = modelTypeOf(cfg).naming;
  switch (t) {
    case "attn_norm":
      return "input_layernorm.weight";
    case "ffn_norm":
      return "post_attention_layernorm.weight";
    case "ffn_gate":
    case "ffn_up":
    case "ffn_down":
      return moeLayer ? null : `mlp.${t.slice(4)}_proj.weight`;
    case "router":
      return moeLayer ? `${naming.moe}.${naming.router ?? "gate"}.weight` : null;
    case "router_bias":
      return moeLayer && moe?.selectionBias
        ? `${naming.moe}.${naming.selectionBias ?? "gate.e_score_correction_bias"}`
        : null;
    case "router_b":
      return moeLayer && moe?.routerLogitBias
        ? `${naming.moe}.${naming.router ?? "gate"}.bias`
        : null;
    case "shared_gate":
    case "shared_up":
    case "shared_down":
      return moeLayer && moe && moe.sharedIntermediate > 0
        ? `${naming.moe}.${naming.shared ?? "shared_experts"}.${t.slice(7)}_proj.weight`
        : null;
    case "shared_expert_gate":
      return moeLayer && moe?.sharedExpertGate && moe.sharedIntermediate > 0
        ? `${naming.moe}.shared_expert_gate.weight`
        : null;
    default:
      return null;
  }
}

/** Hugging Face name of a layer tensor, or null when that layer of this model has no such tensor. */
export function hfLayerName(cfg: ModelConfig, layer: number, t: LayerTensor): string | null {
  checkLayer(cfg, layer);
  const rel = relativeName(cfg, layer, t);
  return rel === null ? null : `${modelTypeOf(cfg).prefix ?? "model."}layers.${layer}.${rel}`;
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
  const type = modelTypeOf(cfg);
  const { moe, expert: names, fused, stacked } = type.naming;
  if (fused || stacked) {
    throw new Error(`${cfg.modelType}: experts are fused per layer, not one tensor per expert`);
  }
  return `${type.prefix ?? "model."}layers.${layer}.${moe}.experts.${expert}.${names[m]}.weight`;
}

/**
 * Where matrix `m` of every expert of MoE layer `layer` lies when the model_type fuses its
 * experts, else null; the matrix's row r is fused row first + r·step, and down_proj is the down
 * matrix as is. gpt-oss (`fused`): `<base>_blocks` U8 [E, R, cols/32, 16], `<base>_scales` U8
 * [E, R, cols/32] and `<base>_bias` [E, R] hold all experts, gate and up rows interleaved in
 * gate_up_proj (row 2m gate unit m, 2m + 1 up unit m). Qwen3.5 and Gemma 4 (`stacked`): `<base>`
 * itself [E, R, cols], gate_up_proj's rows the I gate rows, then the I up rows.
 */
export function hfFusedExpertSlice(
  cfg: ModelConfig,
  layer: number,
  m: ExpertMatrix,
): { base: string; first: number; step: number } | null {
  checkLayer(cfg, layer);
  const type = modelTypeOf(cfg);
  const naming = type.naming;
  if (!(naming.fused || naming.stacked) || cfg.layerKinds[layer] !== "moe") return null;
  // Gemma 4's experts sit in the layer itself (an empty `moe`).
  const p = `${type.prefix ?? "model."}layers.${layer}.${
    naming.moe ? `${naming.moe}.` : ""
  }experts`;
  if (m === "down") return { base: `${p}.down_proj`, first: 0, step: 1 };
  if (naming.stacked) {
    return {
      base: `${p}.gate_up_proj`,
      first: m === "up" ? cfg.moe!.expertIntermediate : 0,
      step: 1,
    };
  }
  return { base: `${p}.gate_up_proj`, first: m === "up" ? 1 : 0, step: 2 };
}

/** The canonical tensors present in a layer, in {@link LAYER_TENSOR_ORDER}. */
export function layerTensorsOf(cfg: ModelConfig, layer: number): LayerTensor[] {
  checkLayer(cfg, layer);
  return LAYER_TENSOR_ORDER.filter((t) => relativeName(cfg, layer, t) !== null);
}
