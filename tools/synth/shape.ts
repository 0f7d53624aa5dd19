/**
 * The size solver: chooses the layer and expert counts (and, when it must, the width) of a model
 * of about a requested number of bytes, keeping the real model's ratios.
 *
 * @module
 */

import { normalizeConfig } from "../../engine/config.ts";
import { range } from "./numbers.ts";
import { type Recipe, recipeOf } from "./recipes.ts";
import { modelBytes } from "./tensors.ts";
import {
  dtypeName,
  type SynthArch,
  type SynthDims,
  type SynthDtype,
  type SynthElemType,
  type SynthOverrides,
  type SynthShape,
} from "./types.ts";

/** Applies the defaults that follow from the counts, then the caller's overrides again. */
function complete(r: Recipe, base: SynthDims, o: SynthOverrides): SynthDims {
  const d = { ...base, ...o };
  return { ...d, ...r.counts(d), ...o };
}

/** Largest vocabulary (≤ 32000) whose embedding and lm_head take at most a tenth of the budget. */
function defaultVocab(hidden: number, bytes: number, elemBytes: number): number {
  for (const v of [32000, 16384, 8192, 4096, 2048, 1024]) {
    if (2 * v * hidden * elemBytes <= bytes / 10) return v;
  }
  return 512;
}

/** Every size field a caller may override. */
const OVERRIDE_KEYS: readonly (keyof SynthDims)[] = [
  "hidden",
  "layers",
  "experts",
  "topK",
  "expertInter",
  "denseInter",
  "heads",
  "kvHeads",
  "headDim",
  "vocab",
  "maxPositions",
  "qLoraRank",
  "kvLoraRank",
  "ropeDim",
  "nopeDim",
  "vDim",
  "firstDense",
  "nGroup",
  "topkGroup",
  "sharedExperts",
  "latent",
  "kdaHeads",
  "kdaHeadDim",
  "attnResBlock",
  "mlaEvery",
  "mxfp4Experts",
  "gdnKeyHeads",
  "gdnValueHeads",
  "gdnKeyDim",
  "gdnValueDim",
  "fullEvery",
  "sharedInter",
  "oGroups",
  "oLoraRank",
  "window",
  "indexHeads",
  "indexHeadDim",
  "indexTopK",
  "hashLayers",
  "hcMult",
  "globalHeadDim",
  "globalKvHeads",
];

/** Throws on an unknown size field or a value that is not a whole number in range. */
function checkOverrides(o: SynthOverrides): void {
  for (const [k, v] of Object.entries(o)) {
    if (v === undefined) continue;
    if (!OVERRIDE_KEYS.includes(k as keyof SynthDims)) {
      throw new Error(`unknown size override ${k}`);
    }
    const min = ["firstDense", "sharedExperts", "mxfp4Experts", "hashLayers"].includes(k) ? 0 : 1;
    if (!Number.isSafeInteger(v) || v < min) {
      throw new Error(`size override ${k} must be an integer >= ${min}, got ${v}`);
    }
  }
}

/** A shape the solver considered. */
interface Candidate {
  d: SynthDims;
  bytes: number;
  /** |ln(bytes / target)| */
  err: number;
  /** |ln| of the layers/experts ratio over the real model's. */
  aspect: number;
  cost: number;
}

/** How far (in ln) the solver may miss the target size before it counts as a miss. */
const SIZE_TOLERANCE = 0.05;
/** Layers/experts ratio within 4× of the real model's counts as realistic. */
const MAX_ASPECT = Math.log(4);

/**
 * Chooses the sizes of a model of about `bytes` bytes of tensor data. Overridden sizes are kept.
 * At the architecture's base width, the layer and expert counts are chosen together: among the
 * candidates within 5% of the target, the one whose layers/experts ratio is closest to the real
 * model's (in log scale). When no candidate comes within 5% with a ratio within 4× of the real
 * one, the width is halved (down to 64) and the search repeated; the fallback is the best
 * candidate over all widths.
 */
export function synthShape(
  arch: SynthArch,
  bytes: number,
  overrides: SynthOverrides = {},
  dtype: SynthDtype = "bf16",
): SynthShape {
  const r = recipeOf(arch), dt = dtypeName(dtype);
  if (dtype === "fp8" && !r.fp8) throw new Error(`${arch} has no fp8 layout; use bf16 or f32`);
  if (!(bytes > 0)) throw new Error(`target size must be positive, got ${bytes}`);
  checkOverrides(overrides);
  const widths: number[] = [];
  if (overrides.hidden) widths.push(overrides.hidden);
  else {
    const m = r.hiddenMultiple ?? 1;
    for (let h = r.baseHidden; h >= 64; h /= 2) widths.push(Math.max(m, Math.round(h / m) * m));
  }
  let best: Candidate | null = null;
  for (const h of widths) {
    const atWidth = searchCounts(r, h, bytes, overrides, dt);
    if (!atWidth) continue;
    if (!best || atWidth.cost < best.cost) best = atWidth;
    if (atWidth.err <= SIZE_TOLERANCE && atWidth.aspect <= MAX_ASPECT) break;
  }
  // Too big for the largest counts at the base width: try wider models.
  for (let h = 2 * r.baseHidden; !overrides.hidden && best && best.bytes * 1.05 < bytes; h *= 2) {
    if (h > 8 * r.baseHidden) break;
    const atWidth = searchCounts(r, h, bytes, overrides, dt);
    if (atWidth && atWidth.cost < best.cost) best = atWidth;
  }
  if (!best) throw new Error(`no ${arch} shape found for ${bytes} bytes`);
  const config = recipeOf(arch).config(best.d, dtype);
  // The engine's own normaliser is the judge of whether the config is consistent.
  normalizeConfig(config, undefined, `synthetic ${arch} config`);
  return { arch, dims: best.d, config, dataBytes: best.bytes };
}

/** The best layer and expert counts at hidden size `h`. */
function searchCounts(
  r: Recipe,
  h: number,
  bytes: number,
  overrides: SynthOverrides,
  dt: SynthElemType,
): Candidate | null {
  const base = {
    hidden: h,
    layers: r.baseLayers,
    experts: r.baseExperts,
    topK: r.baseTopK,
    vocab: defaultVocab(h, bytes, dt === "F32" ? 4 : 2),
    maxPositions: r.maxPositions,
    // Widths that are not powers of two can give fractions; sizes are whole numbers.
    ...Object.fromEntries(
      Object.entries(r.width(h)).map(([k, v]) => [k, Math.max(1, Math.round(v))]),
    ),
  } as SynthDims;
  const minL = r.minLayers(complete(r, base, { ...overrides, layers: 1 }));
  const ls = overrides.layers ? [overrides.layers] : range(minL, 4 * r.baseLayers, 1);
  const es = overrides.experts
    ? [overrides.experts]
    : range(r.expertStep, r.maxExperts, r.expertStep);
  let best: Candidate | null = null;
  for (const e of es) {
    for (const l of ls) {
      const d = complete(r, base, { ...overrides, layers: l, experts: e });
      const n = modelBytes(r, d, dt);
      const err = Math.abs(Math.log(n / bytes));
      const aspect = Math.abs(Math.log((l / r.baseLayers) / (e / r.baseExperts)));
      const cost = Math.max(err - SIZE_TOLERANCE, 0) * 1000 + aspect + err;
      if (!best || cost < best.cost) best = { d, bytes: n, err, aspect, cost };
      if (n > bytes * 1.5) break;
    }
  }
  return best;
}
