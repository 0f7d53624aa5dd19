/**
 * The residual stream of the layer skeleton: what each sublayer (mixer, feed-forward) reads, how
 * its output joins the stream, and what the final norm reads. The plain stream is here; Attention
 * Residuals are attn_res.ts, hyper-connections hyper.ts, sandwich norms sandwich.ts; a new kind
 * is one file with its {@link ResidualPart} and a line in {@link residualPartOf}.
 *
 * @module
 */
import type { GlobalTensor, LayerTensor, ModelConfig } from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import type { Ops } from "../ops.ts";
import type { TensorRef } from "../tensor.ts";
import type { LayerWeights } from "../weights.ts";
import { ATTN_RES } from "./attn_res.ts";
import { HYPER } from "./hyper.ts";
import { SANDWICH } from "./sandwich.ts";
import { regionBytes } from "./scratch.ts";

/** The residual stream of one forward call of `nb` tokens. */
export interface ResidualStream {
  /** Where the embedding writes the call's `nb` rows, before {@link start}. */
  readonly x: number;
  /** Starts a forward call: the embedded rows are at {@link x}. */
  start(nb: number): void;
  /** The rows layer `layer`'s sublayer `which` reads (before its norm), an arena offset. */
  input(which: "mixer" | "ffn", layer: number, lw: LayerWeights, nb: number): number;
  /**
   * Adds sublayer `which`'s output rows `out` of layer `layer` into the stream, right after that
   * sublayer's {@link input}; `out` is the caller's scratch, which a stream may change.
   */
  add(which: "mixer" | "ffn", layer: number, out: number, nb: number): void;
  /** The rows the final norm reads for tokens first..nb−1 (row `first` at the offset). */
  output(first: number, nb: number): number;
}

/** One kind of residual stream: its tensors' shapes, its scratch, and its implementation. */
export interface ResidualPart {
  /** Bytes it allocates for calls of up to `maxBatch` tokens. */
  scratchBytes(cfg: ModelConfig, maxBatch: number): number;
  /** Layer and global tensors it reads, with their shapes ([n] a vector, [1, n] a row). */
  layerTensors: readonly LayerTensor[];
  globalTensors: readonly GlobalTensor[];
  shape(cfg: ModelConfig, t: LayerTensor | GlobalTensor): number[];
  create(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    global: (t: GlobalTensor) => TensorRef,
    maxBatch: number,
  ): ResidualStream;
}

/** x ← x + sublayer(norm(x)): one stream, updated in place. */
class PlainStream implements ResidualStream {
  readonly x: number;
  #ops: Ops;
  #d: number;

  constructor(ops: Ops, arena: Arena, cfg: ModelConfig, maxBatch: number) {
    this.#ops = ops;
    this.#d = cfg.hiddenSize;
    this.x = arena.alloc("hidden x", maxBatch * cfg.hiddenSize * 4);
  }

  start(): void {}

  input(): number {
    return this.x;
  }

  add(_which: "mixer" | "ffn", _layer: number, out: number, nb: number): void {
    this.#ops.add(this.x, out, nb * this.#d);
  }

  output(first: number): number {
    return this.x + first * this.#d * 4;
  }
}

/** The plain residual stream. */
export const PLAIN: ResidualPart = {
  scratchBytes: (cfg, maxBatch) => regionBytes(maxBatch * cfg.hiddenSize * 4),
  layerTensors: [],
  globalTensors: [],
  shape(_cfg, t) {
    throw new Error(`the plain residual stream has no tensor ${t}`);
  },
  create: (ops, arena, cfg, _global, maxBatch) => new PlainStream(ops, arena, cfg, maxBatch),
};

/** The residual stream of a config. */
export function residualPartOf(cfg: ModelConfig): ResidualPart {
  switch (cfg.residual?.kind) {
    case "attn_res":
      return ATTN_RES;
    case "hyper":
      return HYPER;
    case "sandwich":
      return SANDWICH;
    default:
      return PLAIN;
  }
}
