/**
 * Float32 access to a model's weights by canonical name, whatever stores them: a Hugging Face
 * checkpoint (FP8 dequantised with its block scales, INT4 pack-quantized experts widened,
 * gpt-oss's fused MXFP4 experts cut out per expert) or a container (every stored format decoded
 * by its weight-format entry). The float64 reference
 * pass, the GGUF export and quant-report all read weights through this one adapter.
 *
 * @module
 */
import {
  type Container,
  readCodebooks,
  readExpertRecord,
  readTrunkTensor,
} from "../io/container.ts";
import { isCodebookDtype } from "../io/format.ts";
import { readF32 } from "../io/checkpoint_weights.ts";
import { EXPERT_MATRICES, type ExpertMatrix, type GlobalTensor } from "../io/model_config.ts";
import type { LayerTensor, ModelConfig } from "../io/model_config.ts";
import { openCheckpoint } from "../io/safetensors.ts";
import { findExpertMatrix, readFusedBias, readMatrixF32 } from "./checkpoint_matrix.ts";
import { loadModelConfig } from "./config.ts";
import { openContainer } from "./container.ts";
import { decodeStored } from "./quant/stored_decode.ts";
import type { WeightGetter } from "./reference/forward.ts";
import { hfGlobalName, hfLayerName } from "./tensor_names.ts";

/** A model's tensors as float32, with their shapes. */
export interface FloatWeights {
  readonly cfg: ModelConfig;
  /** The checkpoint or container directory. */
  readonly dir: string;
  /** Whether an lm_head tensor is stored (a tied checkpoint may still ship a copy). */
  readonly hasLmHead: boolean;
  /** A global tensor as stored; lm_head only when {@link hasLmHead}. */
  global(t: GlobalTensor): Float32Array;
  /** A layer's trunk tensor. */
  layer(l: number, t: LayerTensor): Float32Array;
  /** The shape of a layer's trunk tensor. */
  layerShape(l: number, t: LayerTensor): number[];
  /** One matrix of one routed expert. */
  expert(l: number, e: number, m: ExpertMatrix): Float32Array;
  /** [rows, cols] of expert `e`'s matrix `m` in layer `l`. */
  expertShape(l: number, e: number, m: ExpertMatrix): [number, number];
  /** gpt-oss: the bias vector of one matrix of one routed expert. */
  expertBias(l: number, e: number, m: ExpertMatrix): Float32Array;
  close(): void;
}

/** The weights of the Hugging Face checkpoint directory `dir`. */
export function checkpointWeights(dir: string): FloatWeights {
  const cfg = loadModelConfig(dir);
  const ckpt = openCheckpoint(dir);
  const lmHead = hfGlobalName(cfg, "lm_head") ?? "lm_head.weight";
  const need = (name: string | null, what: string): string => {
    if (name === null) throw new Error(`${dir}: model ${cfg.modelType} has no tensor ${what}`);
    if (!ckpt.tensors.has(name)) {
      throw new Error(`${dir}: ${what} needs tensor ${name}, which the checkpoint lacks`);
    }
    return name;
  };
  const layerName = (l: number, t: LayerTensor) => need(hfLayerName(cfg, l, t), `layer ${l} ${t}`);
  const expertMatrix = (l: number, e: number, m: ExpertMatrix) =>
    findExpertMatrix(ckpt, cfg, l, e, m);
  return {
    cfg,
    dir,
    hasLmHead: ckpt.tensors.has(lmHead),
    global: (t) => readF32(ckpt, need(t === "lm_head" ? lmHead : hfGlobalName(cfg, t), t)),
    layer: (l, t) => readF32(ckpt, layerName(l, t)),
    layerShape: (l, t) => [...ckpt.tensors.get(layerName(l, t))!.shape],
    expert: (l, e, m) => readMatrixF32(ckpt, expertMatrix(l, e, m)),
    expertShape(l, e, m) {
      const src = expertMatrix(l, e, m);
      return [src.rows, src.cols];
    },
    expertBias: (l, e, m) => readFusedBias(ckpt, expertMatrix(l, e, m)),
    close: () => ckpt.close(),
  };
}

/** The float32 values of one expert matrix of a container. */
export function containerExpertF32(
  c: Container,
  layer: number,
  expert: number,
  m: ExpertMatrix,
  record?: Uint8Array,
): Float32Array {
  const bank = c.manifest.experts[layer];
  if (!bank) throw new Error(`${c.dir}: layer ${layer} has no experts`);
  const rec = record ?? readExpertRecord(c, layer, expert).record;
  const e = bank.matrices[m];
  const scale = e.scale ? rec.subarray(e.scale.offset, e.scale.offset + e.scale.bytes) : undefined;
  return decodeStored(
    e,
    rec.subarray(e.offset, e.offset + e.bytes),
    scale,
    isCodebookDtype(e.dtype) ? readCodebooks(c, layer, m) : undefined,
    `${c.dir}: layer ${layer} expert ${expert} ${m}`,
  );
}

/** The f32 bias vector of one expert matrix of a container (gpt-oss). */
export function containerExpertBias(
  c: Container,
  layer: number,
  expert: number,
  m: ExpertMatrix,
  record?: Uint8Array,
): Float32Array {
  const e = c.manifest.experts[layer]?.biases?.[m];
  if (!e) throw new Error(`${c.dir}: layer ${layer} experts have no ${m} bias`);
  const rec = record ?? readExpertRecord(c, layer, expert).record;
  return new Float32Array(rec.slice(e.offset, e.offset + e.bytes).buffer);
}

/** The float32 values of a trunk tensor ("globals" or a layer) of a container. */
export function containerTrunkF32(
  c: Container,
  layer: number | "globals",
  name: string,
): Float32Array {
  const { entry, data, scale } = readTrunkTensor(c, layer, name);
  return decodeStored(entry, data, scale, undefined, `${c.dir}: ${layer}/${name}`);
}

/** The weights of the container `dir`, each stored format decoded to float32. */
export function containerWeights(dir: string): FloatWeights {
  const c = openContainer(dir);
  // The three matrices of an expert share one record: read it once.
  let last: { l: number; e: number; record: Uint8Array } | null = null;
  return {
    cfg: c.config,
    dir,
    hasLmHead: c.manifest.trunk.globals.tensors.lm_head !== undefined,
    global: (t) => containerTrunkF32(c, "globals", t),
    layer: (l, t) => containerTrunkF32(c, l, t),
    layerShape(l, t) {
      const e = c.manifest.trunk.layers[l]?.tensors[t];
      if (!e) throw new Error(`${dir}: layer ${l} has no tensor ${t}`);
      return [...e.shape];
    },
    expert(l, e, m) {
      if (!last || last.l !== l || last.e !== e) {
        last = { l, e, record: readExpertRecord(c, l, e).record };
      }
      return containerExpertF32(c, l, e, m, last.record);
    },
    expertBias(l, e, m) {
      if (!last || last.l !== l || last.e !== e) {
        last = { l, e, record: readExpertRecord(c, l, e).record };
      }
      return containerExpertBias(c, l, e, m, last.record);
    },
    expertShape(l, _e, m) {
      const bank = c.manifest.experts[l];
      if (!bank) throw new Error(`${dir}: layer ${l} has no experts`);
      const [rows, cols] = bank.matrices[m].shape;
      return [rows, cols];
    },
    close: () => {},
  };
}

/**
 * The reference pass's view of `w`: canonical names (`embed`, `layers.N.wq`,
 * `experts.N.E.gate`, gpt-oss's `experts.N.E.gate_bias`), a tied lm_head read as the embedding,
 * each tensor fetched once.
 */
export function referenceWeights(w: FloatWeights): { cfg: ModelConfig; weight: WeightGetter } {
  const cfg = w.cfg;
  const cache = new Map<string, Float32Array>();
  const weight: WeightGetter = (canonical) => {
    let v = cache.get(canonical);
    if (v) return v;
    const p = canonical.split(".");
    if (p.length === 1) {
      const g = p[0] === "lm_head" && cfg.tieWordEmbeddings ? "embed" : p[0];
      v = w.global(g as GlobalTensor);
    } else if (p[0] === "layers" && p.length === 3) {
      v = w.layer(Number(p[1]), p[2] as LayerTensor);
    } else if (
      p[0] === "experts" && p.length === 4 && EXPERT_MATRICES.includes(p[3] as ExpertMatrix)
    ) {
      v = w.expert(Number(p[1]), Number(p[2]), p[3] as ExpertMatrix);
    } else if (p[0] === "experts" && p.length === 4 && p[3].endsWith("_bias")) {
      v = w.expertBias(Number(p[1]), Number(p[2]), p[3].slice(0, -5) as ExpertMatrix);
    } else {
      throw new Error(`not a canonical tensor name: ${canonical}`);
    }
    cache.set(canonical, v);
    return v;
  };
  return { cfg, weight };
}

/** The config of checkpoint `dir` and a caching reference weight getter over its tensors. */
export function referenceWeightsFromCheckpoint(
  dir: string,
): { cfg: ModelConfig; weight: WeightGetter } {
  return referenceWeights(checkpointWeights(dir));
}

/** The config of container `dir` and a caching reference weight getter over its tensors. */
export function referenceWeightsFromContainer(
  dir: string,
): { cfg: ModelConfig; weight: WeightGetter } {
  return referenceWeights(containerWeights(dir));
}
