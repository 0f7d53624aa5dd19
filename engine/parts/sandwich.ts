/**
 * Sandwich norms as a residual stream (Gemma 4, `residual.kind` "sandwich"): one stream, started
 * from the embedding rows × `embedScale`; each sublayer's output is RMS-normed before it joins the
 * stream (`attn_post_norm` after the mixer, `ffn_post_norm` after the feed-forward), and after
 * each layer the whole stream is multiplied by the layer's `layer_scalar`, not only its
 * contribution. Its float64 reference is engine/reference/forward.ts (`residual` sandwich).
 *
 * @module
 */
import type { ModelConfig } from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import type { Ops } from "../ops.ts";
import type { LayerWeights } from "../weights.ts";
import type { ResidualPart, ResidualStream } from "./residual.ts";
import { regionBytes } from "./scratch.ts";

/** The stream of one model. */
class SandwichStream implements ResidualStream {
  readonly x: number;
  #ops: Ops;
  #cfg: ModelConfig;
  #embedScale: number;
  /** The weights of the layer whose sublayer input was last read: its output's norm is theirs. */
  #lw: LayerWeights | null = null;

  constructor(ops: Ops, arena: Arena, cfg: ModelConfig, maxBatch: number) {
    if (cfg.residual?.kind !== "sandwich") throw new Error("not a sandwich-norm config");
    this.#ops = ops;
    this.#cfg = cfg;
    this.#embedScale = cfg.residual.embedScale;
    this.x = arena.alloc("hidden x", maxBatch * cfg.hiddenSize * 4);
  }

  start(nb: number): void {
    this.#ops.scale(this.x, this.#embedScale, nb * this.#cfg.hiddenSize);
  }

  input(_which: "mixer" | "ffn", _layer: number, lw: LayerWeights): number {
    this.#lw = lw;
    return this.x;
  }

  add(which: "mixer" | "ffn", _layer: number, out: number, nb: number): void {
    const d = this.#cfg.hiddenSize, ops = this.#ops, lw = this.#lw!;
    const norm = lw.get(which === "mixer" ? "attn_post_norm" : "ffn_post_norm");
    ops.rmsnorm(out, norm.ptr, out, d, nb, this.#cfg.rmsNormEps);
    ops.add(this.x, out, nb * d);
    if (which === "ffn") ops.scale(this.x, ops.f32(lw.get("layer_scalar").ptr, 1)[0], nb * d);
  }

  output(first: number): number {
    return this.x + first * this.#cfg.hiddenSize * 4;
  }
}

/** Sandwich norms. */
export const SANDWICH: ResidualPart = {
  scratchBytes: (cfg, maxBatch) => regionBytes(maxBatch * cfg.hiddenSize * 4),
  layerTensors: ["attn_post_norm", "ffn_post_norm", "layer_scalar"],
  globalTensors: [],
  shape: (cfg, t) => t === "layer_scalar" ? [1] : [cfg.hiddenSize],
  create: (ops, arena, cfg, _global, maxBatch) => new SandwichStream(ops, arena, cfg, maxBatch),
};
