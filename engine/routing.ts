/**
 * MoE routing: router logits → chosen experts and their weights, for every family sluice runs.
 * Kept in plain TypeScript: it is a few hundred numbers per layer, and the exact same code serves
 * the engine and the router lookahead.
 *
 * @module
 */
import type { MoeConfig } from "../io/model_config.ts";

/** The experts a token uses in one layer, in routing order, and their weights. */
export interface Route {
  ids: number[];
  weights: number[];
}

/** Scores an indexer computes per kernel call: its score buffer's length at any context. */
export const SCORE_TILE = 4096;

/**
 * {@link topK} of `n` scores that arrive `tile` at a time: `score(from, count)` returns scores
 * from..from+count−1 (a view it may overwrite on the next call). The same indices in the same
 * order as topK over all n at once, for scores that are not NaN, holding at most k + tile of them
 * at a time instead of all n (an indexer at a long context).
 */
export function topKTiled(
  n: number,
  k: number,
  tile: number,
  score: (from: number, count: number) => ArrayLike<number>,
): number[] {
  let ids: number[] = [], vals: number[] = [];
  for (let from = 0; from < n; from += tile) {
    const count = Math.min(tile, n - from), s = score(from, count);
    // Only the tile's own best k can enter (picked by topK when k is small against the tile),
    // and once k are kept only scores above the worst of them (an equal one loses the tie: its
    // index is higher), which leaves few to sort past the first tiles.
    const worst = ids.length === k ? vals[k - 1] : -Infinity;
    const ci = ids.slice(), cv = vals.slice();
    const own = 16 * k < count ? topK(s, k) : Array.from({ length: count }, (_, j) => j);
    for (const j of own) {
      if (ids.length < k || s[j] > worst) {
        ci.push(from + j);
        cv.push(s[j]);
      }
    }
    // The best so far lead, larger score first, ties to the lower index, as topK picks them.
    const order = ci.map((_, j) => j)
      .sort((a, b) => (cv[b] > cv[a] ? 1 : cv[a] > cv[b] ? -1 : ci[a] - ci[b]))
      .slice(0, k);
    ids = order.map((j) => ci[j]);
    vals = order.map((j) => cv[j]);
  }
  return ids;
}

/** Indices of the `k` largest `score` values, descending; ties go to the lower index. */
export function topK(
  score: ArrayLike<number>,
  k: number,
  allowed?: (i: number) => boolean,
): number[] {
  const chosen: number[] = [];
  const taken = new Uint8Array(score.length);
  for (let n = 0; n < k; n++) {
    let best = -1;
    for (let i = 0; i < score.length; i++) {
      if (taken[i] || (allowed && !allowed(i))) continue;
      if (best < 0 || score[i] > score[best]) best = i;
    }
    if (best < 0) break;
    taken[best] = 1;
    chosen.push(best);
  }
  return chosen;
}

/**
 * Routes one token. Softmax scoring (Mixtral, Qwen3): softmax over all logits, top-k, optional
 * renormalisation. Sigmoid scoring (DeepSeek-V3 noaux_tc): sigmoid scores, the selection bias added
 * for choosing only, group-limited top-k, weights from the unbiased scores. topk_softmax
 * (gpt-oss): top-k of the raw logits, weights the softmax of those k logits. sqrtsoftplus
 * (DeepSeek-V4): sqrt(softplus) scores, otherwise as sigmoid; `chosen` (its hash layers' row of
 * tid2eid) replaces the selection. `k` other than top_k ranks more (or fewer) experts the same
 * way, for the lookahead.
 */
export function route(
  moe: MoeConfig,
  logits: ArrayLike<number>,
  bias?: ArrayLike<number>,
  k = moe.topK,
  chosen?: ArrayLike<number>,
): Route {
  const n = moe.numExperts;
  if (moe.scoring === "topk_softmax") {
    const ids = topK(logits, k);
    const top = ids.length ? logits[ids[0]] : 0;
    const e = ids.map((i) => Math.exp(logits[i] - top));
    const sum = e.reduce((a, b) => a + b, 0);
    return { ids, weights: e.map((v) => v / sum) };
  }
  const prob = new Float64Array(n);
  if (moe.scoring === "softmax") {
    let max = -Infinity;
    for (let i = 0; i < n; i++) max = Math.max(max, logits[i]);
    let sum = 0;
    for (let i = 0; i < n; i++) sum += prob[i] = Math.exp(logits[i] - max);
    for (let i = 0; i < n; i++) prob[i] /= sum;
  } else if (moe.scoring === "sqrtsoftplus") {
    for (let i = 0; i < n; i++) {
      const v = logits[i];
      prob[i] = Math.sqrt(v > 0 ? v + Math.log1p(Math.exp(-v)) : Math.log1p(Math.exp(v)));
    }
  } else {
    for (let i = 0; i < n; i++) prob[i] = 1 / (1 + Math.exp(-logits[i]));
  }
  const choice = new Float64Array(n);
  for (let i = 0; i < n; i++) choice[i] = prob[i] + (bias ? bias[i] : 0);
  let allowed: ((i: number) => boolean) | undefined;
  if (moe.nGroup > 1 && moe.topkGroup < moe.nGroup) {
    const size = n / moe.nGroup;
    const groupScore = new Float64Array(moe.nGroup);
    for (let g = 0; g < moe.nGroup; g++) {
      const best2 = topK(choice.subarray(g * size, (g + 1) * size), 2);
      for (const i of best2) groupScore[g] += choice[g * size + i];
    }
    const keep = new Set(topK(groupScore, moe.topkGroup));
    allowed = (i) => keep.has(Math.floor(i / size));
  }
  const ids = chosen ? Array.from(chosen) : topK(choice, k, allowed);
  let weights = ids.map((i) => prob[i]);
  if (moe.normTopK) {
    const sum = weights.reduce((a, b) => a + b, 0) + (moe.scoring === "softmax" ? 0 : 1e-20);
    weights = weights.map((w) => w / sum);
  }
  if (moe.routedScaling !== 1) weights = weights.map((w) => w * moe.routedScaling);
  return { ids, weights };
}
