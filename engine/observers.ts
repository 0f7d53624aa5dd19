/**
 * What watches the MoE layers of a run: the routing trace (--trace), the hot-list use counts
 * (--learn) and the router lookahead, plus the resident router copies the lookahead needs.
 *
 * @module
 */
import { type Container, readFileRange } from "../io/container.ts";
import { hotListPath, mergeHotList, type UseCounts } from "./stream/hot_list.ts";
import { TraceWriter } from "../io/trace.ts";
import type { Arena } from "./arena.ts";
import type { Lookahead, ResidentRouter } from "./stream/lookahead.ts";
import type { MoeObserver } from "./transformer.ts";
import { tensorRef } from "./weights.ts";

/** The optional observers of one open model, watching as one {@link MoeObserver}. */
export class RunObservers {
  lookahead: Lookahead | null = null;
  #trace: TraceWriter | null;
  #counts: UseCounts | null;
  #container: Container;

  constructor(container: Container, opts: { trace?: string; learn?: boolean }) {
    this.#container = container;
    this.#trace = opts.trace ? new TraceWriter(opts.trace) : null;
    this.#counts = opts.learn ? new Map() : null;
  }

  /** The MoE observer: records the routes of tokens at `positions`, then runs the lookahead. */
  readonly observe: MoeObserver = (layer, routes, h, nb, positions) => {
    // The MTP layer's routes (layer numLayers.., --spec mtp) are not the model's: a trace, the
    // hot list and the lookahead see the main layers only.
    if (layer >= this.#container.config.numLayers) return;
    routes.forEach((r, b) => {
      this.#trace?.write(positions[b], layer, r.ids);
      if (this.#counts) {
        for (const e of r.ids) {
          const k = `${layer}:${e}`;
          this.#counts.set(k, (this.#counts.get(k) ?? 0) + 1);
        }
      }
    });
    this.lookahead?.observe(layer, routes, h, nb);
  };

  /** Finishes the trace file and merges the learned counts into the hot list. */
  close(): void {
    const cfg = this.#container.config;
    this.#trace?.close({
      model: cfg.modelType,
      n_layers: cfg.numLayers,
      n_experts: cfg.moe?.numExperts ?? 0,
      top_k: cfg.moe?.topK ?? 0,
      n_tokens: 0,
    });
    this.#trace = null;
    if (this.#counts) mergeHotList(hotListPath(this.#container.dir), this.#counts);
    this.#counts = null;
  }
}

/**
 * Copies every MoE layer's router (and its biases) into the arena once, so the lookahead can
 * score layer L+1 while L+1 is still on disk. f32, a few MiB per layer at most.
 */
export function residentRouters(arena: Arena, c: Container): (ResidentRouter | null)[] {
  return c.manifest.trunk.layers.map((run, layer) => {
    const w = run.tensors["router"];
    if (!w) return null;
    const copy = (entry: typeof w, what: string) => {
      const off = arena.alloc(`lookahead ${what} L${layer}`, entry.bytes, 64);
      arena.u8(off, entry.bytes).set(
        readFileRange(c.trunkPath, run.offset + entry.offset, entry.bytes),
      );
      return off;
    };
    const weight = tensorRef(w, copy(w, "router") - w.offset);
    const b = run.tensors["router_bias"], lb = run.tensors["router_b"];
    return {
      weight,
      bias: b ? copy(b, "router bias") : undefined,
      logitBias: lb ? copy(lb, "router logit bias") : undefined,
    };
  });
}
