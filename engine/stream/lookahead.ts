/**
 * Router lookahead: as soon as layer L's experts are chosen (their reads already queued), layer
 * L+1's router applied to L's MoE input predicts L+1's experts, and the top N predictions are read
 * speculatively while L's experts and L+1's attention compute. The reads go in the shim's lowest
 * priority class, so they only use disk time no demand read wants. Recall of the real top-k is
 * kept for the stats. Predictions are made and scored every time, but read only while a
 * {@link SpeculationGate} says they pay, from what the store measured they save and cost.
 *
 * @module
 */
import type { Arena } from "../arena.ts";
import type { ModelConfig } from "../../io/model_config.ts";
import type { Ops } from "../ops.ts";
import { type Route, route } from "../routing.ts";
import type { TensorRef } from "../tensor.ts";

/** A router kept resident so the lookahead can use it before its layer is read. */
export interface ResidentRouter {
  weight: TensorRef;
  /** Arena offset of the f32 selection bias, if the model has one. */
  bias?: number;
  /** Arena offset of the f32 bias added to the logits (gpt-oss), if the model has one. */
  logitBias?: number;
}

/**
 * What speculative reads have cost and saved lately, as the expert store measures them (see
 * {@link SpeculationGate}). Times are milliseconds.
 */
export interface SpeculationCosts {
  /** Disk time of one record at the bandwidth the reader threads reach while busy. */
  recordMs: number;
  /** Share of a used guess that had landed by the time its layer asked for it. */
  hidden: number;
  /** Disk time per issued guess that guesses held while reads the engine needed were queued or
   * running (their share of the disk then). */
  blockedMs: number;
  /** Share of records evicted to make room for a guess that a demand access missed afterwards. */
  regret: number;
}

/** Where predictions go: the expert store's speculative reads. */
export interface Speculator {
  speculate(layer: number, ids: readonly number[], max: number): number;
  /** The measured costs of speculation so far. */
  readonly speculationCosts: SpeculationCosts;
}

/** Predictions the gate's precision mostly reflects: older ones fade by 1 − 1/this each. */
export const GATE_WINDOW = 32;
/** While the gate is closed, every this-many-th prediction still reads its first guess, so the
 * costs it measures only while reading (hidden share, blocked time) stay current. */
export const GATE_PROBE_EVERY = 16;

/**
 * A ratio of decayed sums: each {@link add} fades the earlier ones by 1 − 1/window, so the ratio
 * mostly reflects the last `window` samples. It starts at `prior` with the weight of one sample.
 */
export class DecayedRatio {
  #num: number;
  #den = 1;
  #keep: number;

  constructor(prior: number, window = GATE_WINDOW) {
    this.#num = prior;
    this.#keep = 1 - 1 / window;
  }

  /** Adds a sample of `num` over `den`. */
  add(num: number, den: number): void {
    this.#num = this.#num * this.#keep + num;
    this.#den = this.#den * this.#keep + den;
  }

  get value(): number {
    return this.#num / this.#den;
  }
}

/**
 * How many of the next prediction's guesses should be read: a guess pays when what it saves beats
 * what it costs, both in disk time per guess, from measured quantities. Guesses are ranked by the
 * router's score, and each rank keeps its own precision, so a prediction reads its leading ranks
 * that pay.
 *
 * - Saved: a guess that a demand access then uses (precision p of its rank) takes its record's
 *   read off the demand path, for the share of it that landed before its layer asked
 *   (`hidden`): p × hidden × recordMs.
 * - Cost: a wrong guess holds the disk from reads the engine needs (`blockedMs`, its share of
 *   the disk while they wait or run beside it, measured per guess; a right guess holding the disk reads bytes its layer needs anyway) and may have evicted
 *   a record a later token misses (`regret`): (1 − p) × (blockedMs + regret × recordMs).
 *
 * Precision is scored on every prediction, read or not; the hidden share and the blocked time are
 * only measured while reading, so a closed gate still reads the first guess of every
 * {@link GATE_PROBE_EVERY}-th prediction. The store starts the blocked time at a whole record, so
 * before anything is measured the gate reads at p ≥ 1/2 (the precision starts at 1/2).
 * Output never depends on the gate: it only moves reads in time.
 */
export class SpeculationGate {
  /** "measured": decide from the costs; "always" / "never" pin the decision (tests, benches). */
  mode: "measured" | "always" | "never" = "measured";
  readonly #precision = new DecayedRatio(0.5);
  readonly #byRank: DecayedRatio[] = [];
  #closedRun = 0;

  /** Scores one prediction: `routed[k]` says whether its guess of rank k was routed. */
  record(routed: readonly boolean[]): void {
    let hits = 0;
    routed.forEach((hit, k) => {
      if (hit) hits++;
      this.#byRank[k] ??= new DecayedRatio(0.5);
      this.#byRank[k].add(hit ? 1 : 0, 1);
    });
    this.#precision.add(hits, routed.length);
  }

  /** Decayed share of predicted experts that were routed. */
  get precision(): number {
    return this.#precision.value;
  }

  /** Decayed share of guesses of rank `k` (0: the router's top score) that were routed. */
  precisionAt(k: number): number {
    return this.#byRank[k]?.value ?? 0.5;
  }

  /** Net disk time a read of a guess of precision `p` saves at `costs` (negative: it loses). */
  gain(costs: SpeculationCosts, p: number): number {
    return p * costs.hidden * costs.recordMs -
      (1 - p) * (costs.blockedMs + costs.regret * costs.recordMs);
  }

  /**
   * How many of the `n` ranked guesses of the next prediction to read at `costs`: the leading
   * ranks whose reads pay, else none but the first on every {@link GATE_PROBE_EVERY}-th
   * prediction in a row kept shut.
   */
  decide(costs: SpeculationCosts, n: number): number {
    if (this.mode !== "measured") return this.mode === "always" ? n : 0;
    let k = 0;
    while (k < n && this.gain(costs, this.precisionAt(k)) >= 0) k++;
    if (k > 0) {
      this.#closedRun = 0;
      return k;
    }
    this.#closedRun++;
    return this.#closedRun % GATE_PROBE_EVERY === 0 ? Math.min(1, n) : 0;
  }
}

/** Predicts and prefetches the next MoE layer's experts during decode. */
export class Lookahead {
  /**
   * Real routed experts that had been predicted, and all real routed experts, over decode; and
   * predictions the gate kept from being read.
   */
  readonly stats = { predictedHits: 0, routed: 0, skipped: 0 };
  /** Decides whether predictions are read. */
  readonly gate = new SpeculationGate();
  /**
   * Where the gate's costs come from: the store's measurements. Tests pin them here, so what the
   * gate decides does not hang on how busy the machine was while the store measured.
   */
  costs: () => SpeculationCosts;
  #ops: Ops;
  #cfg: ModelConfig;
  #routers: (ResidentRouter | null)[];
  #target: Speculator;
  #n: number;
  #logits: number;
  /** Per MoE layer: each predicted row's guesses, scored when that layer routes. */
  #pending = new Map<number, number[][]>();
  /**
   * Most tokens of one sequence in a pass that get predictions: 1 (decode); a speculative decoder
   * raises it to its verify batch while it decodes.
   */
  predictBatch = 1;
  /** Rows of the current pass that get predictions (see {@link beginPass}). */
  #rows: number[] = [];

  constructor(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    routers: (ResidentRouter | null)[],
    target: Speculator,
    n: number,
  ) {
    this.#ops = ops;
    this.#cfg = cfg;
    this.#routers = routers;
    this.#target = target;
    this.#n = n;
    this.costs = () => target.speculationCosts;
    this.#logits = arena.alloc("lookahead logits", (cfg.moe?.numExperts ?? 1) * 4);
  }

  /** Recall so far: share of routed experts that the lookahead had predicted (null before any). */
  get recall(): number | null {
    return this.stats.routed > 0 ? this.stats.predictedHits / this.stats.routed : null;
  }

  /**
   * Declares the next pass: its sequences' row counts, in order. The rows of a sequence that runs
   * at most {@link predictBatch} tokens (decoding, or verifying drafts) get predictions; a prompt
   * chunk's rows get none, so a batched pass of several decoding sequences predicts for each of
   * them, beside any prompt chunk.
   */
  beginPass(counts: readonly number[]): void {
    this.#pending.clear();
    this.#rows = [];
    let r0 = 0;
    for (const n of counts) {
      if (n <= this.predictBatch) { for (let i = 0; i < n; i++) this.#rows.push(r0 + i); }
      r0 += n;
    }
  }

  /**
   * The MoE observer: scores the predictions for `layer`, then predicts the next MoE layer for
   * each row {@link beginPass} picked, each on its own. The reads are the union of each row's
   * leading guesses.
   */
  observe(layer: number, routes: Route[], h: number, nb: number): void {
    const rows = this.#rows.filter((r) => r < nb);
    if (rows.length === 0) return;
    const predicted = this.#pending.get(layer);
    if (predicted) {
      this.#pending.delete(layer);
      predicted.forEach((guess, i) => {
        const r = rows[i];
        const routed = new Set(routes[r].ids);
        const ranks = guess.map((e) => routed.has(e));
        this.stats.predictedHits += ranks.filter((hit) => hit).length;
        this.stats.routed += routes[r].ids.length;
        this.gate.record(ranks);
      });
    }
    const next = this.#cfg.layerKinds.indexOf("moe", layer + 1);
    const router = next >= 0 ? this.#routers[next] : null;
    if (!router || this.#n <= 0) return;
    const moe = this.#cfg.moe!;
    const bias = router.bias !== undefined ? this.#ops.f32(router.bias, moe.numExperts) : undefined;
    const guesses: number[][] = [];
    for (const r of rows) {
      const x = h + r * this.#cfg.hiddenSize * 4;
      this.#ops.matmul({ w: router.weight, x, y: this.#logits, nb: 1 });
      if (router.logitBias !== undefined) {
        this.#ops.add(this.#logits, router.logitBias, moe.numExperts);
      }
      guesses.push(route(moe, this.#ops.f32(this.#logits, moe.numExperts), bias, this.#n).ids);
    }
    this.#pending.set(next, guesses);
    const read = this.gate.decide(this.costs(), guesses[0].length);
    if (read <= 0) {
      this.stats.skipped++;
      return;
    }
    const ids = [...new Set(guesses.flatMap((g) => g.slice(0, read)))];
    this.#target.speculate(next, ids, ids.length);
  }
}
