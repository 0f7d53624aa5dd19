/**
 * The tensor list of a synthetic model and its size in bytes.
 *
 * @module
 */

import { globalTensors } from "./builders.ts";
import { type Recipe, recipeOf } from "./recipes.ts";
import {
  dtypeName,
  sumBytes,
  type SynthArch,
  type SynthDims,
  type SynthDtype,
  type SynthElemType,
  type SynthTensor,
} from "./types.ts";

/** Every tensor of the model, in model order (embedding, layers in order, final norm, lm_head). */
export function synthTensors(arch: SynthArch, d: SynthDims, dtype: SynthDtype): SynthTensor[] {
  const r = recipeOf(arch), dt = dtypeName(dtype);
  const g = r.globals?.(d, dt) ?? globalTensors(d, dt);
  const out = [...g.head];
  for (let l = 0; l < d.layers; l++) {
    out.push(...r.layer(d, l, dt));
    if (r.isMoe(d, l)) { for (let e = 0; e < d.experts; e++) out.push(...r.expert(d, l, e, dt)); }
  }
  return [...out, ...g.tail];
}

/** Bytes of tensor data of a model, without listing every expert. */
export function modelBytes(r: Recipe, d: SynthDims, dt: SynthElemType): number {
  const g = r.globals?.(d, dt) ?? globalTensors(d, dt);
  let n = sumBytes(g.head) + sumBytes(g.tail);
  const expert = sumBytes(r.expert(d, 0, 0, dt));
  // Layers of one kind have the same tensors, so each kind is measured once.
  const perKind = new Map<string, number>();
  for (let l = 0; l < d.layers; l++) {
    const moe = r.isMoe(d, l);
    const kind = `${moe} ${r.attentionOf?.(d, l) ?? ""}`;
    if (!perKind.has(kind)) {
      perKind.set(kind, sumBytes(r.layer(d, l, dt)) + (moe ? d.experts * expert : 0));
    }
    n += perKind.get(kind)!;
  }
  return n;
}
