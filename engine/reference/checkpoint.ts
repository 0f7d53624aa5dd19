/**
 * Feeds the reference forward pass from a Hugging Face checkpoint directory: canonical names are
 * mapped to checkpoint names through engine/tensor_names.ts and read as float32 (FP8 weights
 * dequantised with their block scales, gpt-oss's fused MXFP4 experts cut out per expert and
 * dequantised, their biases as `experts.L.E.<matrix>_bias`).
 *
 * @module
 */

import { decodeDtypeToF32, readExpertRows, readF32 } from "../../io/checkpoint_weights.ts";
import { type Checkpoint, openCheckpoint } from "../../io/safetensors.ts";
import { loadModelConfig } from "../config.ts";
import {
  EXPERT_MATRICES,
  type ExpertMatrix,
  type GlobalTensor,
  type LayerTensor,
  type ModelConfig,
} from "../../io/model_config.ts";
import { dequantizeMxfp4 } from "../quant/mxfp4.ts";
import { hfExpertName, hfFusedExpertSlice, hfGlobalName, hfLayerName } from "../tensor_names.ts";
import type { WeightGetter } from "./forward.ts";

/** Checkpoint name of a canonical reference name, or null when the model has no such tensor. */
export function checkpointNameOf(cfg: ModelConfig, canonical: string): string | null {
  const parts = canonical.split(".");
  if (parts.length === 1) {
    if (parts[0] === "lm_head" && cfg.tieWordEmbeddings) return hfGlobalName(cfg, "embed");
    return hfGlobalName(cfg, parts[0] as GlobalTensor);
  }
  if (parts[0] === "layers" && parts.length === 3) {
    return hfLayerName(cfg, Number(parts[1]), parts[2] as LayerTensor);
  }
  if (
    parts[0] === "experts" && parts.length === 4 &&
    EXPERT_MATRICES.includes(parts[3] as ExpertMatrix)
  ) {
    return hfExpertName(cfg, Number(parts[1]), Number(parts[2]), parts[3] as ExpertMatrix);
  }
  throw new Error(`not a canonical tensor name: ${canonical}`);
}

/**
 * A fused (gpt-oss) expert tensor by canonical name `experts.L.E.<m>` or `experts.L.E.<m>_bias`,
 * or null when the model does not fuse its experts.
 */
function fusedExpertF32(
  cfg: ModelConfig,
  ckpt: Checkpoint,
  canonical: string,
): Float32Array | null {
  const p = canonical.split(".");
  if (p[0] !== "experts" || p.length !== 4) return null;
  const [l, e] = [Number(p[1]), Number(p[2])];
  const bias = p[3].endsWith("_bias");
  const m = (bias ? p[3].slice(0, -5) : p[3]) as ExpertMatrix;
  if (!EXPERT_MATRICES.includes(m)) return null;
  const slice = hfFusedExpertSlice(cfg, l, m);
  if (!slice) return null;
  const rows = m === "down" ? cfg.hiddenSize : cfg.moe!.expertIntermediate;
  const cols = m === "down" ? cfg.moe!.expertIntermediate : cfg.hiddenSize;
  const part = (suffix: string) =>
    readExpertRows(ckpt, `${slice.base}_${suffix}`, e, slice.first, slice.step, rows);
  if (bias) {
    const t = ckpt.tensors.get(`${slice.base}_bias`)!;
    return decodeDtypeToF32(t.dtype, part("bias"), `${t.file}: tensor ${t.name}`);
  }
  return dequantizeMxfp4({ rows, cols, blocks: part("blocks"), scales: part("scales") });
}

/** The config of `dir` and a caching weight getter over its safetensors files. */
export function referenceWeightsFromCheckpoint(
  dir: string,
): { cfg: ModelConfig; weight: WeightGetter } {
  const cfg = loadModelConfig(dir);
  const ckpt = openCheckpoint(dir);
  const cache = new Map<string, Float32Array>();
  const weight: WeightGetter = (canonical) => {
    let v = cache.get(canonical);
    if (v) return v;
    const fused = fusedExpertF32(cfg, ckpt, canonical);
    if (fused) {
      cache.set(canonical, fused);
      return fused;
    }
    const name = checkpointNameOf(cfg, canonical);
    if (name === null) throw new Error(`${dir}: model ${cfg.modelType} has no tensor ${canonical}`);
    v = readF32(ckpt, name);
    cache.set(canonical, v);
    return v;
  };
  return { cfg, weight };
}
