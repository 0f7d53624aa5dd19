/**
 * Router lookahead: as soon as layer L's experts are chosen (their reads already queued), layer
 * L+1's router applied to L's MoE input predicts L+1's experts, and the top N predictions are read
 * speculatively while L's experts and L+1's attention compute. The reads go in the shim's lowest
 * priority class, so they only use disk time no demand read wants. Recall of the real top-k is
 * kept for the stats. Predictions are made and scored every time, but read only while a
 * {@link PrecisionGate} says they pay.
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

/** Where predictions go: the expert store's speculative reads. */
export interface Speculator {
  speculate(layer: number, ids: readonly number[], max: number): number;
}

/** Break-even precision of a speculative read (see {@link PrecisionGate}). */
export const GATE_THRESHOLD = 0.5;
/** Predictions the gate's precision mostly reflects: older ones fade by 1 − 1/this each. */
export const GATE_WINDOW = 32;

/**
 * Whether speculative reads pay, from the precision of recent predictions (scored whether or not
 * they were read). A guess that a demand access then uses hides at most one record's read; one
 * that goes unused costs up to one record's disk time (a demand read issued meanwhile waits behind
 * it) and a cache slot. So reading pays only above precision 1/2, and more than that when reads
 * are only partly hidden. Precision is counted, not timed: the same routing opens and closes the
 * gate at the same tokens. It starts open at 1/2 and decays over about {@link GATE_WINDOW}
 * predictions, so it closes after a run of misses and reopens when guesses improve.
 */
export class PrecisionGate {
  #hits = GATE_THRESHOLD;
  #guesses = 1;

  /** Scores one prediction of `guessed` experts of which `hits` were routed. */
  record(guessed: number, hits: number): void {
    const keep = 1 - 1 / GATE_WINDOW;
    this.#hits = this.#hits * keep + hits;
    this.#guesses = this.#guesses * keep + guessed;
  }

  /** Decayed share of predicted experts that were routed. */
  get precision(): number {
    return this.#hits / this.#guesses;
  }

  /** Whether the next prediction should be read. */
  get open(): boolean {
    return this.precision >= GATE_THRESHOLD;
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
  readonly gate = new PrecisionGate();
  #ops: Ops;
  #cfg: ModelConfig;
  #routers: (ResidentRouter | null)[];
  #target: Speculator;
  #n: number;
  #logits: number;
  #pending = new Map<number, Set<number>>();

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
    this.#logits = arena.alloc("lookahead logits", (cfg.moe?.numExperts ?? 1) * 4);
  }

  /** Recall so far: share of routed experts that the lookahead had predicted (null before any). */
  get recall(): number | null {
    return this.stats.routed > 0 ? this.stats.predictedHits / this.stats.routed : null;
  }

  /** The MoE observer: scores the prediction for `layer`, then predicts the next MoE layer. */
  observe(layer: number, routes: Route[], h: number, nb: number): void {
    if (nb !== 1) {
      this.#pending.clear();
      return;
    }
    const predicted = this.#pending.get(layer);
    if (predicted) {
      this.#pending.delete(layer);
      let hits = 0;
      for (const e of routes[0].ids) if (predicted.has(e)) hits++;
      this.stats.predictedHits += hits;
      this.stats.routed += routes[0].ids.length;
      this.gate.record(predicted.size, hits);
    }
    const next = this.#cfg.layerKinds.indexOf("moe", layer + 1);
    const router = next >= 0 ? this.#routers[next] : null;
    if (!router || this.#n <= 0) return;
    const moe = this.#cfg.moe!;
    this.#ops.matmul({ w: router.weight, x: h, y: this.#logits, nb: 1 });
    if (router.logitBias !== undefined) {
      this.#ops.add(this.#logits, router.logitBias, moe.numExperts);
    }
    const logits = this.#ops.f32(this.#logits, moe.numExperts);
    const bias = router.bias !== undefined ? this.#ops.f32(router.bias, moe.numExperts) : undefined;
    const guess = route(moe, logits, bias, this.#n).ids;
    this.#pending.set(next, new Set(guess));
    if (this.gate.open) this.#target.speculate(next, guess, this.#n);
    else this.stats.skipped++;
  }
}
