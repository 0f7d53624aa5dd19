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
  layerKindOf,
  type LayerTensor,
  type ModelConfig,
} from "../io/model_config.ts";
import type { MtpNaming, MtpTensor } from "./models/family.ts";
import { familyOf, modelTypeOf } from "./models/mod.ts";

/** Layers 0..numLayers−1, then the MTP layers a config keeps. */
function checkLayer(cfg: ModelConfig, layer: number): void {
  const n = cfg.numLayers + (cfg.mtp?.layers ?? 0);
  if (!Number.isInteger(layer) || layer < 0 || layer >= n) {
    throw new Error(`layer ${layer} is outside 0..${n - 1}`);
  }
}

const MTP_TENSORS: ReadonlySet<LayerTensor> = new Set<MtpTensor>([
  "mtp_enorm",
  "mtp_hnorm",
  "mtp_proj",
  "mtp_head_norm",
]);

/** The MTP naming of layer `layer`'s model_type when it is an MTP layer, else null. */
function mtpNaming(cfg: ModelConfig, layer: number): MtpNaming | null {
  if (layer < cfg.numLayers) return null;
  const naming = modelTypeOf(cfg).mtp;
  if (!naming) throw new Error(`${cfg.modelType}: no naming of multi-token-prediction layers`);
  return naming;
}

/** Checkpoint name prefix of layer `layer`'s tensors (an MTP layer's own block). */
function layerPrefix(cfg: ModelConfig, layer: number): string {
  const mtp = mtpNaming(cfg, layer);
  if (mtp) return mtp.block(cfg, layer - cfg.numLayers);
  return `${modelTypeOf(cfg).prefix ?? "model."}layers.${layer}.`;
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
  if (MTP_TENSORS.has(t)) return null;
  // The family's names come first; a family that names every tensor leaves none to the skeleton.
  const family = familyOf(cfg);
  const own = family.attentionTensors(cfg, layer);
  if (Object.hasOwn(own, t) || family.namesEveryTensor) return own[t] ?? null;
  const moeLayer = layerKindOf(cfg, layer) === "moe";
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
  const mtp = mtpNaming(cfg, layer);
  if (MTP_TENSORS.has(t)) return mtp ? mtp.own(cfg, layer - cfg.numLayers, t as MtpTensor) : null;
  const rel = relativeName(cfg, layer, t);
  return rel === null ? null : `${layerPrefix(cfg, layer)}${rel}`;
}

/** Hugging Face name of one matrix of one routed expert of a MoE layer. */
export function hfExpertName(
  cfg: ModelConfig,
  layer: number,
  expert: number,
  m: ExpertMatrix,
): string {
  checkLayer(cfg, layer);
  if (layerKindOf(cfg, layer) !== "moe" || !cfg.moe) {
    throw new Error(`layer ${layer} is not a MoE layer`);
  }
  if (!Number.isInteger(expert) || expert < 0 || expert >= cfg.moe.numExperts) {
    throw new Error(`layer ${layer}: expert ${expert} is outside 0..${cfg.moe.numExperts - 1}`);
  }
  const type = modelTypeOf(cfg);
  const { moe, expert: names, fused, stacked } = type.naming;
  if ((fused || stacked) && !mtpNaming(cfg, layer)?.perExpert) {
    throw new Error(`${cfg.modelType}: experts are fused per layer, not one tensor per expert`);
  }
  return `${layerPrefix(cfg, layer)}${moe}.experts.${expert}.${names[m]}.weight`;
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
  if (!(naming.fused || naming.stacked) || layerKindOf(cfg, layer) !== "moe") return null;
  if (mtpNaming(cfg, layer)?.perExpert) return null;
  // Gemma 4's experts sit in the layer itself (an empty `moe`).
  const p = `${layerPrefix(cfg, layer)}${naming.moe ? `${naming.moe}.` : ""}experts`;
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
  return LAYER_TENSOR_ORDER.filter((t) => hfLayerName(cfg, layer, t) !== null);
}
