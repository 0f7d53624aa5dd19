/**
 * Next-token sampling: greedy argmax or seeded random sampling with the usual filters.
 *
 * Filter order follows Hugging Face transformers' logits processors, applied in this order:
 * 1. repetition penalty on the raw logits (every distinct id in the history: positive logits are
 *    divided by the penalty, negative ones multiplied), then OpenAI's frequency and presence
 *    penalties (minus count × frequency, minus presence once an id occurred), as llama.cpp does;
 * 2. temperature (logits / T);
 * 3. top-k (keep the logits ≥ the k-th largest, so ties at the cut are kept);
 * 4. top-p (keep the most probable tokens until their mass reaches p; the token that crosses p is
 *    kept, at least one token is kept);
 * 5. min-p (drop tokens whose probability is below minP × the top probability).
 * Then one draw from the renormalised distribution. llama.cpp differs only in applying the
 * temperature after the truncation filters, which changes what min-p and top-p see.
 *
 * @module
 */

/** Sampling settings; anything left out is disabled. */
export interface SamplerOptions {
  /** 0 (default) means greedy: the first maximal logit after the repetition penalty. */
  temperature?: number;
  /** Keep the k most likely tokens; 0 or undefined disables. */
  topK?: number;
  /** Nucleus mass in (0, 1]; 1 or undefined disables. */
  topP?: number;
  /** Relative probability floor in [0, 1); 0 or undefined disables. */
  minP?: number;
  /** > 0; 1 or undefined disables. */
  repetitionPenalty?: number;
  /** Subtracted from a logit once per occurrence of its id in the history; 0 disables. */
  frequencyPenalty?: number;
  /** Subtracted from a logit once its id occurs in the history; 0 disables. */
  presencePenalty?: number;
  /** Seed of the PRNG; a random one is drawn when undefined. */
  seed?: number;
}

/** A stateful sampler: its PRNG advances with every random draw. */
export interface Sampler {
  /** The seed actually used (useful to report when it was drawn at random). */
  readonly seed: number;
  /** Picks the next token id from `logits`, given the ids seen so far. */
  sample(logits: Float32Array, history: readonly number[]): number;
}

function checkOptions(opts: SamplerOptions): void {
  const { temperature = 0, topK = 0, topP = 1, minP = 0, repetitionPenalty = 1 } = opts;
  const { frequencyPenalty = 0, presencePenalty = 0 } = opts;
  if (!(temperature >= 0) || !Number.isFinite(temperature)) {
    throw new Error(`sampler: temperature must be a finite number ≥ 0, got ${temperature}`);
  }
  if (!Number.isInteger(topK) || topK < 0) {
    throw new Error(`sampler: topK must be an integer ≥ 0, got ${topK}`);
  }
  if (!(topP > 0 && topP <= 1)) throw new Error(`sampler: topP must be in (0, 1], got ${topP}`);
  if (!(minP >= 0 && minP < 1)) throw new Error(`sampler: minP must be in [0, 1), got ${minP}`);
  if (!(repetitionPenalty > 0) || !Number.isFinite(repetitionPenalty)) {
    throw new Error(`sampler: repetitionPenalty must be > 0, got ${repetitionPenalty}`);
  }
  for (const [name, v] of Object.entries({ frequencyPenalty, presencePenalty })) {
    if (!Number.isFinite(v)) throw new Error(`sampler: ${name} must be a finite number, got ${v}`);
  }
}

/**
 * Applies the repetition penalty (transformers' rule), then the frequency and presence penalties
 * (OpenAI's rule), to a float64 copy of the logits.
 */
export function penalisedLogits(
  logits: Float32Array,
  history: readonly number[],
  penalty = 1,
  frequency = 0,
  presence = 0,
): Float64Array {
  const out = Float64Array.from(logits);
  if (penalty === 1 && frequency === 0 && presence === 0) return out;
  const counts = new Map<number, number>();
  for (const id of history) counts.set(id, (counts.get(id) ?? 0) + 1);
  for (const [id, count] of counts) {
    if (!Number.isInteger(id) || id < 0 || id >= out.length) {
      throw new Error(`sampler: history id ${id} is outside the vocabulary [0, ${out.length})`);
    }
    const v = out[id];
    out[id] = (v < 0 ? v * penalty : v / penalty) - count * frequency - presence;
  }
  return out;
}

/** Index of the first maximum (NaN never wins). */
export function argmax(values: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

/**
 * The distribution a non-greedy sampler draws from: probabilities per token id after all filters
 * (zeros for filtered tokens), summing to 1. Exposed so tests can check the filters exactly.
 */
export function samplingDistribution(
  logits: Float32Array,
  history: readonly number[],
  opts: SamplerOptions,
): Float64Array {
  checkOptions(opts);
  const { temperature = 1, topK = 0, topP = 1, minP = 0, repetitionPenalty = 1 } = opts;
  if (temperature === 0) {
    throw new Error("sampler: temperature 0 is greedy, it has no distribution");
  }
  const z = penalisedLogits(
    logits,
    history,
    repetitionPenalty,
    opts.frequencyPenalty,
    opts.presencePenalty,
  );
  const n = z.length;
  for (let i = 0; i < n; i++) z[i] /= temperature;
  // Ids sorted by decreasing logit, ties by id, so every filter has a deterministic order.
  const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => z[b] - z[a] || a - b);
  const keep = new Uint8Array(n).fill(1);
  if (topK > 0 && topK < n) {
    const kth = z[order[topK - 1]];
    for (let i = 0; i < n; i++) if (z[i] < kth) keep[i] = 0;
  }
  let probs = softmaxKept(z, keep);
  if (topP < 1) {
    let mass = 0;
    for (const id of order) {
      if (!keep[id]) continue;
      if (mass >= topP) keep[id] = 0;
      mass += probs[id];
    }
    probs = softmaxKept(z, keep);
  }
  if (minP > 0) {
    const floor = minP * probs[order[0]];
    for (let i = 0; i < n; i++) if (keep[i] && probs[i] < floor) keep[i] = 0;
    probs = softmaxKept(z, keep);
  }
  return probs;
}

function softmaxKept(z: Float64Array, keep: Uint8Array): Float64Array {
  let max = -Infinity;
  for (let i = 0; i < z.length; i++) if (keep[i] && z[i] > max) max = z[i];
  const p = new Float64Array(z.length);
  let sum = 0;
  for (let i = 0; i < z.length; i++) {
    if (keep[i]) {
      p[i] = Math.exp(z[i] - max);
      sum += p[i];
    }
  }
  for (let i = 0; i < z.length; i++) p[i] /= sum;
  return p;
}

/**
 * xoshiro128** seeded through splitmix32: small, fast, and the same sequence on every platform.
 * Returns a function giving uniform doubles in [0, 1) with 53 random bits.
 */
export function seededUniform(seed: number): () => number {
  let s = seed >>> 0;
  const splitmix = (): number => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return (z ^ (z >>> 16)) >>> 0;
  };
  const st = new Uint32Array([splitmix(), splitmix(), splitmix(), splitmix()]);
  const next = (): number => {
    const r = Math.imul(rotl(Math.imul(st[1], 5), 7), 9) >>> 0;
    const t = st[1] << 9;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl(st[3], 11);
    return r;
  };
  return () => ((next() >>> 5) * 67108864 + (next() >>> 6)) / 9007199254740992;
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/** Builds a sampler; see the module comment for the order of the filters. */
export function createSampler(opts: SamplerOptions = {}): Sampler {
  checkOptions(opts);
  const seed = opts.seed ?? crypto.getRandomValues(new Uint32Array(1))[0];
  if (!Number.isInteger(seed)) throw new Error(`sampler: seed must be an integer, got ${seed}`);
  const uniform = seededUniform(seed);
  const greedy = (opts.temperature ?? 0) === 0;
  return {
    seed,
    sample(logits, history) {
      if (greedy) {
        return argmax(
          penalisedLogits(
            logits,
            history,
            opts.repetitionPenalty,
            opts.frequencyPenalty,
            opts.presencePenalty,
          ),
        );
      }
      return drawFrom(samplingDistribution(logits, history, opts), uniform());
    },
  };
}

/** The id whose cumulative probability first exceeds `u` (a uniform in [0, 1)). */
export function drawFrom(probs: Float64Array, u: number): number {
  let acc = 0;
  let last = -1;
  for (let i = 0; i < probs.length; i++) {
    if (probs[i] === 0) continue;
    acc += probs[i];
    last = i;
    if (u < acc) return i;
  }
  // Rounding can leave the cumulative sum a hair below 1.
  return last;
}
