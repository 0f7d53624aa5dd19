/**
 * Feeds the reference forward pass from a packed container: every stored tensor (plain or
 * compact) is widened to float32 by engine/quant/stored_decode.ts, so the reference computes, in float64,
 * exactly the model the container's weights stand for. That isolates the engine's kernels from
 * the quantisation error when the two are compared.
 *
 * @module
 */
import {
  type Container,
  readCodebooks,
  readExpertRecord,
  readTrunkTensor,
} from "../../io/container.ts";
import { openContainer } from "../container.ts";
import { decodeStored } from "../quant/stored_decode.ts";
import type { ExpertMatrix, ModelConfig } from "../../io/model_config.ts";
import type { WeightGetter } from "./forward.ts";

/** The float32 values of one expert matrix of a container. */
export function containerExpertF32(
  c: Container,
  layer: number,
  expert: number,
  m: ExpertMatrix,
): Float32Array {
  const bank = c.manifest.experts[layer];
  if (!bank) throw new Error(`${c.dir}: layer ${layer} has no experts`);
  const { record } = readExpertRecord(c, layer, expert);
  const e = bank.matrices[m];
  const scale = e.scale
    ? record.subarray(e.scale.offset, e.scale.offset + e.scale.bytes)
    : undefined;
  return decodeStored(
    e,
    record.subarray(e.offset, e.offset + e.bytes),
    scale,
    e.dtype === "vq3r" ? readCodebooks(c, layer, m) : undefined,
    `${c.dir}: layer ${layer} expert ${expert} ${m}`,
  );
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

/** The config of container `dir` and a caching weight getter over its dequantised tensors. */
export function referenceWeightsFromContainer(
  dir: string,
): { cfg: ModelConfig; weight: WeightGetter } {
  const c = openContainer(dir);
  const cfg = c.config;
  const cache = new Map<string, Float32Array>();
  const weight: WeightGetter = (canonical) => {
    let v = cache.get(canonical);
    if (v) return v;
    const p = canonical.split(".");
    if (p.length === 1) {
      const g = p[0] === "lm_head" && cfg.tieWordEmbeddings ? "embed" : p[0];
      v = containerTrunkF32(c, "globals", g);
    } else if (p[0] === "layers" && p.length === 3) {
      v = containerTrunkF32(c, Number(p[1]), p[2]);
    } else if (p[0] === "experts" && p.length === 4) {
      v = containerExpertF32(c, Number(p[1]), Number(p[2]), p[3] as ExpertMatrix);
    } else {
      throw new Error(`not a canonical tensor name: ${canonical}`);
    }
    cache.set(canonical, v);
    return v;
  };
  return { cfg, weight };
}
