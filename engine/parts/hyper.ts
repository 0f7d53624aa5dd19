/**
 * Hyper-connections as a residual stream (manifold-constrained hyper-connections, Xie et al.
 * 2026, as DeepSeek-V4 runs them): each token's residual is `residual.streams` copies of the
 * hidden vector. Before each sublayer, weights computed from the flattened streams collapse them
 * into the sublayer's input (pre); after it, the output is spread back (post) and the old streams
 * are mixed by a Sinkhorn-normalised doubly stochastic matrix (comb); the hyper head collapses
 * the streams once more before the final norm, or (`collapse: "mean"`, GLM-5.3-Flash) their
 * unweighted mean does. Kernels: kernels/hyper.c; float64 reference: engine/reference/math.ts
 * `hyperWeights`, `hyperPost`, `hyperHead`, `hyperMean`.
 *
 * Tensors (canonical names; any family maps its own onto them): per layer `hc_attn_fn`
 * [(2+n)·n, n·d], `hc_attn_base` [(2+n)·n], `hc_attn_scale` [3] and the same three `hc_ffn_*`;
 * globals `hc_head_fn` [n, n·d], `hc_head_base` [n], `hc_head_scale` [1] (none with the mean).
 *
 * @module
 */
import type { GlobalTensor, LayerTensor, ModelConfig } from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import type { Ops } from "../ops.ts";
import type { TensorRef } from "../tensor.ts";
import type { LayerWeights } from "../weights.ts";
import type { ResidualPart, ResidualStream } from "./residual.ts";
import { regionBytes } from "./scratch.ts";

/** The hyper-connection settings of a config. */
function hyperOf(
  cfg: ModelConfig,
): { streams: number; sinkhornIters: number; eps: number; collapse?: "mean" } {
  if (cfg.residual?.kind !== "hyper") throw new Error("the config has no hyper-connections");
  return cfg.residual;
}

/**
 * Bytes of each region, in allocation order: the embedded rows, two stream buffers (the current
 * and the next), the collapsed input, post, comb, and the mixes of one token.
 */
function regions(cfg: ModelConfig, maxBatch: number): number[] {
  const n = hyperOf(cfg).streams, row = maxBatch * cfg.hiddenSize * 4;
  return [row, n * row, n * row, row, maxBatch * n * 4, maxBatch * n * n * 4, (2 + n) * n * 4];
}

/** The streams of one model. */
class HyperStream implements ResidualStream {
  readonly x: number;
  #ops: Ops;
  #cfg: ModelConfig;
  #n: number;
  #iters: number;
  #eps: number;
  #streams: number;
  #next: number;
  #collapsed: number;
  #post: number;
  #comb: number;
  #mix: number;
  /** null: the streams' mean collapses them. */
  #head: { fn: TensorRef; base: TensorRef; scale: TensorRef } | null;

  constructor(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    global: (t: GlobalTensor) => TensorRef,
    maxBatch: number,
  ) {
    this.#ops = ops;
    this.#cfg = cfg;
    const h = hyperOf(cfg);
    this.#n = h.streams;
    this.#iters = h.sinkhornIters;
    this.#eps = h.eps;
    const [x, s, next, collapsed, post, comb, mix] = regions(cfg, maxBatch);
    this.x = arena.alloc("hidden x", x);
    this.#streams = arena.alloc("hyper streams", s);
    this.#next = arena.alloc("hyper streams next", next);
    this.#collapsed = arena.alloc("hyper input", collapsed);
    this.#post = arena.alloc("hyper post", post);
    this.#comb = arena.alloc("hyper comb", comb);
    this.#mix = arena.alloc("hyper mixes", mix);
    this.#head = h.collapse === "mean" ? null : {
      fn: global("hc_head_fn"),
      base: global("hc_head_base"),
      scale: global("hc_head_scale"),
    };
  }

  /** Every stream starts as the token's embedding. */
  start(nb: number): void {
    const d = this.#cfg.hiddenSize;
    for (let b = 0; b < nb; b++) {
      for (let k = 0; k < this.#n; k++) {
        this.#ops.copy(this.#streams + (b * this.#n + k) * d * 4, this.x + b * d * 4, d);
      }
    }
  }

  input(which: "mixer" | "ffn", _layer: number, lw: LayerWeights, nb: number): number {
    const site = which === "mixer" ? "attn" : "ffn";
    const t = (k: string) => lw.get(`hc_${site}_${k}` as LayerTensor).ptr;
    this.#ops.hcPre({
      x: this.#streams,
      tokens: nb,
      n: this.#n,
      d: this.#cfg.hiddenSize,
      fn: t("fn"),
      base: t("base"),
      scale: t("scale"),
      iters: this.#iters,
      normEps: this.#cfg.rmsNormEps,
      hcEps: this.#eps,
      mix: this.#mix,
      collapsed: this.#collapsed,
      post: this.#post,
      comb: this.#comb,
    });
    return this.#collapsed;
  }

  add(_which: "mixer" | "ffn", _layer: number, out: number, nb: number): void {
    const { hiddenSize: d } = this.#cfg;
    this.#ops.hcPost(this.#streams, out, this.#post, this.#comb, this.#next, nb, this.#n, d);
    [this.#streams, this.#next] = [this.#next, this.#streams];
  }

  output(first: number, nb: number): number {
    const d = this.#cfg.hiddenSize, n = this.#n;
    const out = this.#collapsed + first * d * 4;
    if (!this.#head) {
      // The mean, summed in stream order then divided, the same for every batch.
      const x = this.#ops.f32(this.#streams + first * n * d * 4, (nb - first) * n * d);
      const y = this.#ops.f32(out, (nb - first) * d);
      for (let b = 0; b < nb - first; b++) {
        for (let i = 0; i < d; i++) {
          let s = 0;
          for (let j = 0; j < n; j++) s = Math.fround(s + x[(b * n + j) * d + i]);
          y[b * d + i] = s / n;
        }
      }
      return out;
    }
    this.#ops.hcHead({
      x: this.#streams + first * n * d * 4,
      tokens: nb - first,
      n,
      d,
      fn: this.#head.fn.ptr,
      base: this.#head.base.ptr,
      scale: this.#ops.f32(this.#head.scale.ptr, 1)[0],
      normEps: this.#cfg.rmsNormEps,
      hcEps: this.#eps,
      mix: this.#mix,
      out,
    });
    return out;
  }
}

/** Hyper-connections. */
export const HYPER: ResidualPart = {
  scratchBytes: (cfg, maxBatch) => regionBytes(...regions(cfg, maxBatch)),
  layerTensors: [
    "hc_attn_fn",
    "hc_attn_base",
    "hc_attn_scale",
    "hc_ffn_fn",
    "hc_ffn_base",
    "hc_ffn_scale",
  ],
  globalTensors: ["hc_head_fn", "hc_head_base", "hc_head_scale"],
  shape(cfg, t) {
    const n = hyperOf(cfg).streams, mixes = (2 + n) * n;
    const flat = n * cfg.hiddenSize;
    switch (t) {
      case "hc_attn_fn":
      case "hc_ffn_fn":
        return [mixes, flat];
      case "hc_attn_base":
      case "hc_ffn_base":
        return [mixes];
      case "hc_attn_scale":
      case "hc_ffn_scale":
        return [3];
      case "hc_head_fn":
        return [n, flat];
      case "hc_head_base":
        return [n];
      case "hc_head_scale":
        return [1];
    }
    throw new Error(`hyper-connections have no tensor ${t}`);
  },
  create: (ops, arena, cfg, global, maxBatch) => new HyperStream(ops, arena, cfg, global, maxBatch),
};
