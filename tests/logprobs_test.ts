/**
 * engine/logprobs.ts against a naive float64 reference: the chosen token's log-softmax, and the
 * top k as a full sort of the vocabulary gives them (ties by id), on random and tied logits.
 */
import assert from "node:assert/strict";
import { tokenLogprob } from "../engine/logprobs.ts";
import { seededUniform } from "../engine/sampler.ts";

Deno.test("tokenLogprob: log-softmax and the top k of a full sort", () => {
  const rand = seededUniform(7);
  for (let trial = 0; trial < 200; trial++) {
    const n = 1 + Math.floor(rand() * 300);
    // Few distinct values in some trials, so ties are common.
    const levels = trial % 2 ? 5 : 1e6;
    const logits = Float32Array.from(
      { length: n },
      () => Math.floor(rand() * levels) / (levels / 20) - 10,
    );
    const id = Math.floor(rand() * n);
    const k = Math.floor(rand() * 21);
    const max = Math.max(...logits);
    let sum = 0;
    for (const v of logits) sum += Math.exp(v - max);
    const lse = max + Math.log(sum);
    const got = tokenLogprob(logits, id, k);
    assert.ok(Math.abs(got.logprob - (logits[id] - lse)) < 1e-9);
    const order = Array.from({ length: n }, (_, i) => i).sort((a, b) =>
      logits[b] - logits[a] || a - b
    );
    assert.deepEqual(got.top.map((t) => t.id), order.slice(0, Math.min(k, n)));
    for (const t of got.top) assert.ok(Math.abs(t.logprob - (logits[t.id] - lse)) < 1e-9);
  }
});
