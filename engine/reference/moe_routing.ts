/**
 * Expert selection of the reference MoE layer, written from the published semantics:
 * Mixtral/Qwen3 (softmax → top-k → optional renormalisation), DeepSeek-V3 `noaux_tc`
 * (sigmoid scores, a selection-only bias, group-limited top-k, unbiased weights), DeepSeek-V4
 * (sqrt(softplus) scores, or experts chosen by the token id) and gpt-oss (top-k of the logits,
 * softmax over the chosen).
 *
 * @module
 */

import type { MoeConfig } from "../../io/model_config.ts";
import { type GluActivation, sigmoid, softmax, softplus, swiglu } from "./math.ts";

/** Chosen experts in selection order and their mixing weights. */
export interface ReferenceRoute {
  experts: number[];
  weights: number[];
}

/** Indices of the `k` largest `score[i]` among `allowed`, largest first, ties to the lower index. */
function topIndices(
  score: ArrayLike<number>,
  k: number,
  allowed: (i: number) => boolean,
): number[] {
  const ids: number[] = [];
  for (let i = 0; i < score.length; i++) if (allowed(i)) ids.push(i);
  ids.sort((a, b) => score[b] - score[a] || a - b);
  return ids.slice(0, k);
}

/**
 * Routes one token. `logits` are the router outputs (one per expert); `bias` is the selection
 * bias (e_score_correction_bias) when the model has one.
 * 1. scores: softmax or sigmoid of the logits;
 * 2. selection scores: scores + bias;
 * 3. groups of numExperts/nGroup consecutive experts, each scored by the sum of its two best
 *    selection scores (its only one when a group has one expert); the best topkGroup groups stay;
 * 4. the topK best selection scores among the remaining experts are chosen;
 * 5. weights: the unbiased scores of the chosen experts, divided by their sum when normTopK
 *    (+1e-20 for sigmoid and sqrt(softplus) scoring, as DeepSeek does), times routedScaling.
 * `chosen` (DeepSeek-V4's hash layers: the token's row of tid2eid) replaces steps 2–4.
 */
export function routeReference(
  moe: MoeConfig,
  logits: ArrayLike<number>,
  bias?: ArrayLike<number>,
  chosen?: readonly number[],
): ReferenceRoute {
  const n = moe.numExperts;
  if (logits.length !== n) throw new Error(`router: ${logits.length} logits for ${n} experts`);
  if (bias && bias.length !== n) {
    throw new Error(`router: bias has ${bias.length} values, not ${n}`);
  }
  if (moe.scoring === "topk_softmax") {
    // gpt-oss: the top k raw logits, then a softmax over just those k.
    const experts = topIndices(logits, moe.topK, () => true);
    return { experts, weights: Array.from(softmax(experts.map((e) => logits[e]))) };
  }
  const scores = moe.scoring === "softmax"
    ? softmax(logits)
    : moe.scoring === "sqrtsoftplus"
    ? Float64Array.from(logits, (v) => Math.sqrt(softplus(v)))
    : Float64Array.from(logits, (v) => sigmoid(v));
  const sel = Float64Array.from(scores, (s, i) => s + (bias ? bias[i] : 0));
  if (n % moe.nGroup !== 0) {
    throw new Error(`router: ${n} experts do not split into ${moe.nGroup} groups`);
  }
  const groupSize = n / moe.nGroup;
  const groupScore = new Float64Array(moe.nGroup);
  for (let g = 0; g < moe.nGroup; g++) {
    const members = Array.from(sel.subarray(g * groupSize, (g + 1) * groupSize)).sort((a, b) =>
      b - a
    );
    groupScore[g] = members.slice(0, Math.min(2, groupSize)).reduce((a, b) => a + b, 0);
  }
  const keptGroups = new Set(topIndices(groupScore, moe.topkGroup, () => true));
  const experts = chosen
    ? [...chosen]
    : topIndices(sel, moe.topK, (i) => keptGroups.has(Math.floor(i / groupSize)));
  let weights = experts.map((e) => scores[e]);
  if (moe.normTopK) {
    const eps = moe.scoring === "softmax" ? 0 : 1e-20;
    const sum = weights.reduce((a, b) => a + b, 0) + eps;
    weights = weights.map((w) => w / sum);
  }
  return { experts, weights: weights.map((w) => w * moe.routedScaling) };
}

/**
 * Σ_k weights[k] · expert_k(x) over the chosen `experts` of layer `l`: each a gated MLP of
 * `inter` rows with activation `act`, its matrices read through `w` by canonical name
 * (`experts.L.E.gate|up|down`, plus gpt-oss's `…_bias` vectors when `biases`).
 */
export function mixExperts(
  w: (name: string) => Float32Array,
  l: number,
  experts: number[],
  weights: number[],
  x: Float64Array,
  inter: number,
  act: GluActivation,
  biases = false,
): Float64Array {
  const sum = new Float64Array(x.length);
  experts.forEach((e, k) => {
    const at = `experts.${l}.${e}`;
    const y = swiglu(
      w(`${at}.gate`),
      w(`${at}.up`),
      w(`${at}.down`),
      x,
      inter,
      `layer ${l} expert ${e}`,
      act,
      biases ? [w(`${at}.gate_bias`), w(`${at}.up_bias`), w(`${at}.down_bias`)] : undefined,
    );
    for (let i = 0; i < sum.length; i++) sum[i] += weights[k] * y[i];
  });
  return sum;
}
