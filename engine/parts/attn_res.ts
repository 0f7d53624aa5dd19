/**
 * Attention Residuals (Kimi K3, ../shared/K3.md) as a residual stream: the stream is cut into
 * blocks of `residual.blockSize` layers; at each block start a snapshot of it is kept and the
 * running sum restarts from the block's first sublayer output; each sublayer's input, and the
 * final norm's, is a softmax-weighted mix of the snapshots and the running sum (kernels/kimi_k3.c
 * `attn_res`, with the sublayer's norm and projection). Its float64 reference is
 * engine/reference/math.ts `attnRes`, used by engine/reference/forward.ts.
 *
 * @module
 */
import type { GlobalTensor, ModelConfig } from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import type { Ops } from "../ops.ts";
import type { TensorRef } from "../tensor.ts";
import type { LayerWeights } from "../weights.ts";
import type { ResidualPart, ResidualStream } from "./residual.ts";
import { regionBytes } from "./scratch.ts";

/** The block size of a config whose stream is Attention Residuals. */
function blockSize(cfg: ModelConfig): number {
  if (cfg.residual?.kind !== "attn_res") throw new Error("not an Attention Residuals config");
  return cfg.residual.blockSize;
}

/** Snapshots at every layer L with L % blockSize = 0. */
function blockCount(cfg: ModelConfig): number {
  return Math.ceil(cfg.numLayers / blockSize(cfg));
}

/** Bytes of each region, in allocation order: x, snapshots, mixed input, scores. */
function regions(cfg: ModelConfig, maxBatch: number): number[] {
  const row = maxBatch * cfg.hiddenSize * 4;
  const blocks = blockCount(cfg);
  return [row, blocks * row, row, (blocks + 1) * 4];
}

/** The stream of one model. */
class AttnResStream implements ResidualStream {
  readonly x: number;
  #ops: Ops;
  #cfg: ModelConfig;
  #maxBatch: number;
  #blocks: number;
  #mixed: number;
  #scores: number;
  #out: { norm: TensorRef; proj: TensorRef };
  /** Snapshots taken in this call; the sublayer output that restarts the running sum. */
  #taken = 0;
  #restart = false;

  constructor(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    global: (t: GlobalTensor) => TensorRef,
    maxBatch: number,
  ) {
    this.#ops = ops;
    this.#cfg = cfg;
    this.#maxBatch = maxBatch;
    const [x, blocks, mixed, scores] = regions(cfg, maxBatch);
    this.x = arena.alloc("hidden x", x);
    this.#blocks = arena.alloc("attn-res blocks", blocks);
    this.#mixed = arena.alloc("attn-res input", mixed);
    this.#scores = arena.alloc("attn-res scores", scores);
    this.#out = { norm: global("out_res_norm"), proj: global("out_res_proj") };
  }

  start(): void {
    this.#taken = 0;
  }

  /** The mix of the first `n` snapshots and the running sum, for tokens first..nb−1. */
  #mix(n: number, wn: TensorRef, wp: TensorRef, first: number, nb: number): number {
    const d = this.#cfg.hiddenSize;
    for (let b = first; b < nb; b++) {
      this.#ops.attnRes({
        blocks: this.#blocks + b * d * 4,
        n: n + 1,
        stride: this.#maxBatch * d,
        last: this.x + b * d * 4,
        wn: wn.ptr,
        wp: wp.ptr,
        out: this.#mixed + b * d * 4,
        scores: this.#scores,
        d,
        eps: this.#cfg.rmsNormEps,
      });
    }
    return this.#mixed;
  }

  input(which: "mixer" | "ffn", layer: number, lw: LayerWeights, nb: number): number {
    const d = this.#cfg.hiddenSize;
    if (which === "ffn") {
      return this.#mix(this.#taken, lw.get("mlp_res_norm"), lw.get("mlp_res_proj"), 0, nb);
    }
    const input = this.#taken > 0
      ? this.#mix(this.#taken, lw.get("attn_res_norm"), lw.get("attn_res_proj"), 0, nb)
      : this.x;
    this.#restart = layer % blockSize(this.#cfg) === 0;
    if (this.#restart) {
      this.#ops.copy(this.#blocks + this.#taken * this.#maxBatch * d * 4, this.x, nb * d);
      this.#taken++;
    }
    return input;
  }

  add(which: "mixer" | "ffn", _layer: number, out: number, nb: number): void {
    const n = nb * this.#cfg.hiddenSize;
    if (which === "mixer" && this.#restart) this.#ops.copy(this.x, out, n);
    else this.#ops.add(this.x, out, n);
  }

  output(first: number, nb: number): number {
    return this.#mix(this.#taken, this.#out.norm, this.#out.proj, first, nb) +
      first * this.#cfg.hiddenSize * 4;
  }
}

/** Attention Residuals. */
export const ATTN_RES: ResidualPart = {
  scratchBytes: (cfg, maxBatch) => regionBytes(...regions(cfg, maxBatch)),
  layerTensors: ["attn_res_norm", "attn_res_proj", "mlp_res_norm", "mlp_res_proj"],
  globalTensors: ["out_res_norm", "out_res_proj"],
  // The projections are [1, d] as shipped, read as one f32 vector.
  shape: (cfg, t) => t.endsWith("_proj") ? [1, cfg.hiddenSize] : [cfg.hiddenSize],
  create: (ops, arena, cfg, global, maxBatch) =>
    new AttnResStream(ops, arena, cfg, global, maxBatch),
};
