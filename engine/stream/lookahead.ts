/**
 * Router lookahead: as soon as layer L's experts are chosen (their reads already queued), layer
 * L+1's router applied to L's MoE input predicts L+1's experts, and the top N predictions are read
 * speculatively while L's experts and L+1's attention compute. The reads go in the shim's lowest
 * priority class, so they only use disk time no demand read wants. Recall of the real top-k is
 * kept for the stats.
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
}

/** Where predictions go: the expert store's speculative reads. */
export interface Speculator {
  speculate(layer: number, ids: readonly number[], max: number): number;
}

/** Predicts and prefetches the next MoE layer's experts during decode. */
export class Lookahead {
  /** Real routed experts that had been predicted, and all real routed experts, over decode. */
  readonly stats = { predictedHits: 0, routed: 0 };
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
      for (const e of routes[0].ids) if (predicted.has(e)) this.stats.predictedHits++;
      this.stats.routed += routes[0].ids.length;
    }
    const next = this.#cfg.layerKinds.indexOf("moe", layer + 1);
    const router = next >= 0 ? this.#routers[next] : null;
    if (!router || this.#n <= 0) return;
    const moe = this.#cfg.moe!;
    this.#ops.matmul({ w: router.weight, x: h, y: this.#logits, nb: 1 });
    const logits = this.#ops.f32(this.#logits, moe.numExperts);
    const bias = router.bias !== undefined ? this.#ops.f32(router.bias, moe.numExperts) : undefined;
    const guess = route(moe, logits, bias, this.#n).ids;
    this.#pending.set(next, new Set(guess));
    this.#target.speculate(next, guess, this.#n);
  }
}
