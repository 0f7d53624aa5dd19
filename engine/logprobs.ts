/**
 * Log probabilities of generated tokens, as OpenAI's `logprobs` reports them: the log-softmax of
 * the logits the token was drawn from (after any grammar mask, before penalties and temperature,
 * so they describe the model, not the sampler settings), with the k most likely alternatives.
 *
 * @module
 */

/** One token's log probability and its most likely alternatives. */
export interface TokenLogprob {
  logprob: number;
  /** The `k` most likely ids at this step, most likely first (ties by id). */
  top: { id: number; logprob: number }[];
}

/** The log probability of `id` under `logits`, and the top `k` (k may be 0). */
export function tokenLogprob(logits: Float32Array, id: number, k: number): TokenLogprob {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i] - max);
  const lse = max + Math.log(sum);
  const top: { id: number; logprob: number }[] = [];
  if (k > 0) {
    // A small sorted list beats sorting the whole vocabulary for the few k OpenAI allows (≤ 20).
    for (let i = 0; i < logits.length; i++) {
      const v = logits[i];
      if (top.length === k && v <= top[k - 1].logprob) continue;
      let at = top.length;
      while (at > 0 && top[at - 1].logprob < v) at--;
      top.splice(at, 0, { id: i, logprob: v });
      if (top.length > k) top.pop();
    }
    for (const t of top) t.logprob -= lse;
  }
  return { logprob: logits[id] - lse, top };
}
