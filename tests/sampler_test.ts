import assert from "node:assert/strict";
import {
  argmax,
  createSampler,
  penalisedLogits,
  samplingDistribution,
  seededUniform,
} from "../engine/sampler.ts";

/** Deterministic pseudo-random logits without ties (an LCG independent of the sampler's PRNG). */
function randomLogits(n: number, seed: number): Float32Array {
  let s = seed;
  return Float32Array.from({ length: n }, () => {
    s = (s * 1103515245 + 12345) % 2147483648;
    return (s / 2147483648) * 8 - 4;
  });
}

/** Brute-force reference: softmax of z/T over the ids in `kept`. */
function softmaxOver(z: ArrayLike<number>, kept: number[], t: number): Map<number, number> {
  const max = Math.max(...kept.map((i) => z[i] / t));
  const e = kept.map((i) => Math.exp(z[i] / t - max));
  const sum = e.reduce((a, b) => a + b, 0);
  return new Map(kept.map((id, j) => [id, e[j] / sum]));
}

function assertDistribution(p: Float64Array, expected: Map<number, number>): void {
  for (let i = 0; i < p.length; i++) {
    const want = expected.get(i) ?? 0;
    assert.ok(Math.abs(p[i] - want) < 1e-12, `id ${i}: ${p[i]} vs ${want}`);
  }
}

Deno.test("greedy: temperature 0 picks the first maximal logit", () => {
  const logits = new Float32Array([1, 5, 3, 5, -2]);
  assert.equal(createSampler({ temperature: 0 }).sample(logits, []), 1);
  const big = randomLogits(1000, 7);
  let best = 0;
  for (let i = 0; i < big.length; i++) if (big[i] > big[best]) best = i;
  assert.equal(createSampler({}).sample(big, []), best);
});

Deno.test("seeded sampling is reproducible and differs across seeds", () => {
  const logits = randomLogits(64, 3);
  const draw = (seed: number) => {
    const s = createSampler({ temperature: 1.5, seed });
    return Array.from({ length: 50 }, () => s.sample(logits, []));
  };
  assert.deepEqual(draw(42), draw(42));
  assert.notDeepEqual(draw(42), draw(43));
  const u = seededUniform(9);
  for (let i = 0; i < 1000; i++) {
    const v = u();
    assert.ok(v >= 0 && v < 1);
  }
});

Deno.test("top-k 1 equals greedy", () => {
  for (let seed = 1; seed <= 20; seed++) {
    const logits = randomLogits(200, seed);
    const s = createSampler({ temperature: 0.8, topK: 1, seed });
    assert.equal(s.sample(logits, []), argmax(logits));
  }
});

Deno.test("top-k, top-p and min-p keep the brute-force sets", () => {
  const logits = randomLogits(40, 11);
  const z = Array.from(logits);
  const order = z.map((_, i) => i).sort((a, b) => z[b] - z[a]);
  const t = 0.7;
  // top-k 5 → the 5 largest logits.
  assertDistribution(
    samplingDistribution(logits, [], { temperature: t, topK: 5 }),
    softmaxOver(z, order.slice(0, 5), t),
  );
  // top-p 0.6 → the shortest prefix (by probability) whose mass reaches 0.6.
  const full = softmaxOver(z, order, t);
  let mass = 0;
  const nucleus: number[] = [];
  for (const id of order) {
    nucleus.push(id);
    mass += full.get(id)!;
    if (mass >= 0.6) break;
  }
  assertDistribution(
    samplingDistribution(logits, [], { temperature: t, topP: 0.6 }),
    softmaxOver(z, nucleus, t),
  );
  // min-p 0.1 → probability ≥ 0.1 × the top probability.
  const top = full.get(order[0])!;
  const aboveFloor = order.filter((id) => full.get(id)! >= 0.1 * top);
  assertDistribution(
    samplingDistribution(logits, [], { temperature: t, minP: 0.1 }),
    softmaxOver(z, aboveFloor, t),
  );
  // Chained: top-k 10 first, top-p 0.9 on the renormalised top 10.
  const top10 = softmaxOver(z, order.slice(0, 10), t);
  mass = 0;
  const chained: number[] = [];
  for (const id of order.slice(0, 10)) {
    chained.push(id);
    mass += top10.get(id)!;
    if (mass >= 0.9) break;
  }
  assertDistribution(
    samplingDistribution(logits, [], { temperature: t, topK: 10, topP: 0.9 }),
    softmaxOver(z, chained, t),
  );
});

Deno.test("draws follow the filtered distribution", () => {
  const logits = new Float32Array([2, 1, 0.5, 0, -1, -3]);
  const opts = { temperature: 1, topP: 0.9, seed: 5 };
  const p = samplingDistribution(logits, [], opts);
  const s = createSampler(opts);
  const counts = new Array(logits.length).fill(0);
  const n = 40000;
  for (let i = 0; i < n; i++) counts[s.sample(logits, [])]++;
  for (let i = 0; i < logits.length; i++) {
    const sd = Math.sqrt(n * p[i] * (1 - p[i]));
    assert.ok(
      Math.abs(counts[i] - n * p[i]) <= 5 * sd + 1e-9,
      `id ${i}: ${counts[i]} vs ${n * p[i]}`,
    );
  }
});

Deno.test("repetition penalty: divides positive logits, multiplies negative ones, once per id", () => {
  const logits = new Float32Array([2, -2, 3, 0.5]);
  const out = penalisedLogits(logits, [0, 1, 1, 1], 2);
  assert.deepEqual(Array.from(out), [1, -4, 3, 0.5]);
  // The penalty can change the greedy choice.
  const s = createSampler({ repetitionPenalty: 2 });
  assert.equal(s.sample(new Float32Array([3, 2]), [0]), 1);
  assert.throws(() => penalisedLogits(logits, [9], 1.2), /outside the vocabulary/);
});

Deno.test("frequency and presence penalties: minus count × f, minus p once an id occurred", () => {
  const logits = new Float32Array([2, -2, 3, 0.5]);
  const out = penalisedLogits(logits, [0, 1, 1, 1], 1, 0.5, 0.25);
  assert.deepEqual(Array.from(out), [2 - 0.5 - 0.25, -2 - 1.5 - 0.25, 3, 0.5]);
  // Id 0 seen three times loses to id 1 under a frequency penalty.
  const s = createSampler({ frequencyPenalty: 1 });
  assert.equal(s.sample(new Float32Array([3, 1]), [0, 0, 0]), 1);
  assert.throws(() => createSampler({ presencePenalty: NaN }), /presencePenalty/);
});

Deno.test("invalid options are rejected", () => {
  assert.throws(() => createSampler({ temperature: -1 }), /temperature/);
  assert.throws(() => createSampler({ topP: 0 }), /topP/);
  assert.throws(() => createSampler({ minP: 1 }), /minP/);
  assert.throws(() => createSampler({ topK: 1.5 }), /topK/);
  assert.throws(() => createSampler({ repetitionPenalty: 0 }), /repetitionPenalty/);
});
