/**
 * Router plans: per-expert scales of the router rows, uniform or fitted so that expert
 * popularity follows a real routing trace (see {@link routerPlans}).
 *
 * @module
 */

import { join } from "node:path";
import { readTrace, readTraceMeta, traceShape } from "../../io/trace.ts";
import { clamp, range } from "./numbers.ts";
import { recipeOf } from "./recipes.ts";
import type { SynthArch, SynthDims } from "./types.ts";
import { Rng } from "./values.ts";

/** The router rows of one MoE layer. */
export interface RouterPlan {
  /** Multiplier of each expert's router row. */
  scales: number[];
  /** Fraction of tokens meant to choose each expert (sums to top-k). */
  target: number[];
}

/** Expert choice as the architecture does it, on a vector of router logits. */
type Selector = (logits: Float64Array, chosen: Uint8Array) => void;

/** Indices of the k largest values of `v` among those with `allowed[i]`. */
function topIndices(v: Float64Array, k: number, allowed?: Uint8Array): number[] {
  const out: number[] = [];
  for (let j = 0; j < k; j++) {
    let bi = -1;
    for (let i = 0; i < v.length; i++) {
      if ((allowed && !allowed[i]) || out.includes(i)) continue;
      if (bi < 0 || v[i] > v[bi]) bi = i;
    }
    out.push(bi);
  }
  return out;
}

/** The selection rule of `arch` with sizes `d`: softmax top-k, or DeepSeek's grouped sigmoid. */
function selectorFor(arch: SynthArch, d: SynthDims): Selector {
  if (arch !== "deepseek_v3") {
    // Softmax is monotonic: the top-k probabilities are the top-k logits.
    return (logits, chosen) => {
      for (const i of topIndices(logits, d.topK)) chosen[i] = 1;
    };
  }
  const size = d.experts / d.nGroup;
  if (size < 2) {
    throw new Error(`deepseek_v3: ${d.experts} experts in ${d.nGroup} groups leaves < 2 per group`);
  }
  const scores = new Float64Array(d.experts);
  const groupScore = new Float64Array(d.nGroup);
  const allowed = new Uint8Array(d.experts);
  return (logits, chosen) => {
    // noaux_tc with a zero bias: sigmoid scores, best groups by their top-2 sum, then top-k.
    for (let i = 0; i < d.experts; i++) scores[i] = 1 / (1 + Math.exp(-logits[i]));
    for (let g = 0; g < d.nGroup; g++) {
      const [a, b] = topIndices(scores.subarray(g * size, (g + 1) * size), 2);
      groupScore[g] = scores[g * size + a] + scores[g * size + b];
    }
    allowed.fill(0);
    for (const g of topIndices(groupScore, d.topkGroup)) allowed.fill(1, g * size, (g + 1) * size);
    for (const i of topIndices(scores, d.topK, allowed)) chosen[i] = 1;
  };
}

/** Selection frequency of each expert when the logits are `scales[e] · z_e`, z ~ N(0, 1). */
function simulate(z: Float64Array, scales: number[], select: Selector): number[] {
  const e = scales.length, n = z.length / e;
  const counts = new Array(e).fill(0);
  const logits = new Float64Array(e), chosen = new Uint8Array(e);
  for (let s = 0; s < n; s++) {
    for (let i = 0; i < e; i++) logits[i] = scales[i] * z[s * e + i];
    chosen.fill(0);
    select(logits, chosen);
    for (let i = 0; i < e; i++) counts[i] += chosen[i];
  }
  return counts.map((c) => c / n);
}

/** Per-layer relative popularity (count / mean count, sorted descending) of a routing trace. */
export function tracePopularity(tracePath: string): number[][] {
  const path = tracePath.endsWith(".jsonl") ? tracePath : join(tracePath, "trace.jsonl");
  const events = readTrace(path);
  const shape = traceShape(events, readTraceMeta(path));
  const counts = Array.from({ length: shape.nLayers }, () => new Array(shape.nExperts).fill(0));
  for (const ev of events) for (const x of ev.experts) counts[ev.layer][x]++;
  return counts.map((c, l) => {
    const mean = c.reduce((a, b) => a + b, 0) / c.length;
    if (mean === 0) throw new Error(`${path}: trace layer ${l} has no routing events`);
    return c.map((x) => x / mean).sort((a, b) => b - a);
  });
}

/** Resamples a descending curve to `n` points (by quantile, linear interpolation). */
function resample(curve: number[], n: number): number[] {
  return Array.from({ length: n }, (_, r) => {
    const pos = clamp(((r + 0.5) / n) * curve.length - 0.5, 0, curve.length - 1);
    const i = Math.floor(pos), f = pos - i;
    return curve[i] * (1 - f) + (curve[Math.min(i + 1, curve.length - 1)] ?? curve[i]) * f;
  });
}

/**
 * Router plans of the MoE layers. "uniform": every row scale 1, so random routers pick experts
 * about equally often. "skewed": synthetic MoE layer m takes the popularity curve of trace layer
 * ⌊m·T/M⌋ (expert counts sorted, resampled to this model's expert count by quantile, scaled to sum
 * to top-k, capped at 0.45), assigns the ranks to experts in a seeded random order, and scales
 * each expert's router row by s_e. Scaling a row widens the spread of that expert's logit, so it
 * wins the top-k more often. The s_e are fitted by simulation: logits s_e·z_e with z ~ N(0, 1)
 * i.i.d. (what random rows give on RMS-normalised hidden states), the architecture's selection
 * rule (softmax top-k, or DeepSeek's grouped sigmoid with a zero bias), 2000 samples, 30
 * multiplicative updates s_e ← s_e·(target/observed)^0.5. Since a row scale can at most make an
 * expert win whenever its logit is positive, popularities above about one half cannot be reached.
 */
export function routerPlans(
  arch: SynthArch,
  d: SynthDims,
  routing: "uniform" | "skewed",
  trace: string | undefined,
  seed: number,
): Map<number, RouterPlan> {
  const r = recipeOf(arch);
  const moeLayers = range(0, d.layers - 1, 1).filter((l) => r.isMoe(d, l));
  const plans = new Map<number, RouterPlan>();
  if (routing === "uniform") {
    for (const l of moeLayers) {
      plans.set(l, {
        scales: new Array(d.experts).fill(1),
        target: new Array(d.experts).fill(d.topK / d.experts),
      });
    }
    return plans;
  }
  if (routing !== "skewed") throw new Error(`--routing must be uniform or skewed, got ${routing}`);
  if (!trace) throw new Error("--routing skewed needs --trace DIR (a folder with trace.jsonl)");
  const curves = tracePopularity(trace);
  const select = selectorFor(arch, d);
  const samples = 2000;
  moeLayers.forEach((l, m) => {
    const curve = resample(curves[Math.floor((m * curves.length) / moeLayers.length)], d.experts);
    let f = curve.map((x) => (x * d.topK) / d.experts);
    for (let i = 0; i < 4; i++) {
      f = f.map((x) => Math.min(x, 0.45));
      const sum = f.reduce((a, b) => a + b, 0);
      f = f.map((x) => (x * d.topK) / sum);
    }
    const rng = new Rng(seed, `routing.${l}`);
    const order = range(0, d.experts - 1, 1);
    for (let i = order.length - 1; i > 0; i--) {
      const j = Math.floor(rng.next() * (i + 1));
      [order[i], order[j]] = [order[j], order[i]];
    }
    const target = new Array(d.experts);
    order.forEach((e, rank) => target[e] = f[rank]);
    const z = new Float64Array(samples * d.experts);
    for (let i = 0; i < z.length; i++) z[i] = rng.normal();
    let scales = new Array(d.experts).fill(1);
    for (let it = 0; it < 30; it++) {
      const seen = simulate(z, scales, select);
      scales = scales.map((s, e) => s * Math.sqrt(target[e] / Math.max(seen[e], 0.5 / samples)));
      const logMean = scales.reduce((a, s) => a + Math.log(s), 0) / scales.length;
      scales = scales.map((s) => s / Math.exp(logMean));
    }
    plans.set(l, { scales, target });
  });
  return plans;
}
