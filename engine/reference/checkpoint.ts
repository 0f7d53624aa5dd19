/**
 * Feeds the reference forward pass from a Hugging Face checkpoint directory: canonical names are
 * mapped to checkpoint names through engine/tensor_names.ts and read as float32 (FP8 weights
 * dequantised with their block scales, Kimi K3's MXFP4 `weight_packed`/`weight_scale` experts
 * decoded exactly).
 *
 * @module
 */

import { readF32 } from "../../io/checkpoint_weights.ts";
import { type Checkpoint, openCheckpoint } from "../../io/safetensors.ts";
import { dequantizeMxfp4 } from "../quant/mxfp4.ts";
import { loadModelConfig } from "../config.ts";
import {
  EXPERT_MATRICES,
  type ExpertMatrix,
  type GlobalTensor,
  type LayerTensor,
  type ModelConfig,
} from "../../io/model_config.ts";
import { hfExpertName, hfGlobalName, hfLayerName } from "../tensor_names.ts";
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

/** A tensor as float32; a `….weight` shipped as MXFP4 `weight_packed` + `weight_scale` is decoded. */
function readWeightF32(ckpt: Checkpoint, name: string): Float32Array {
  const packed = ckpt.tensors.get(`${name}_packed`);
  if (ckpt.tensors.has(name) || packed?.dtype !== "U8") return readF32(ckpt, name);
  const scale = ckpt.tensors.get(`${name}_scale`);
  const [rows, half] = packed.shape;
  if (scale?.dtype !== "U8" || String(scale.shape) !== String([rows, (half * 2) / 32])) {
    throw new Error(
      `${packed.file}: ${packed.name} needs a U8 ${name}_scale [${rows}, ${half / 16}]`,
    );
  }
  return dequantizeMxfp4({
    rows,
    cols: half * 2,
    blocks: ckpt.read(packed.name),
    scales: ckpt.read(scale.name),
  });
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
    const name = checkpointNameOf(cfg, canonical);
    if (name === null) throw new Error(`${dir}: model ${cfg.modelType} has no tensor ${canonical}`);
    v = readWeightF32(ckpt, name);
    cache.set(canonical, v);
    return v;
  };
  return { cfg, weight };
}
