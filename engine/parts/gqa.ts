/**
 * Grouped-query attention, the mixer of Llama, Mixtral, Qwen3-MoE, GLM-4.5, MiniMax-M2 and gpt-oss:
 * RoPE (on the leading `rope.dim` dims of each head), a float32 KV cache, and as features set from
 * the config: q/k/v biases, Qwen3's per-head q/k RMSNorm before RoPE (MiniMax-M2's one over the
 * whole projection, `qkNormWhole`), and gpt-oss's o_proj bias, one learned sink logit per head in
 * the softmax denominator and sliding-window layers whose cache is a ring holding only what the
 * window needs. Its float64 reference is engine/reference/gqa.ts.
 *
 * @module
 */
import type { LayerTensor, ModelConfig } from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import type { AttentionShape, Ops } from "../ops.ts";
import { buildRopeTable, ropeAt, type RopeTable } from "../rope_table.ts";
import type { LayerWeights } from "../weights.ts";
import type { CacheRegion, Mixer, MixerPart } from "./mixer.ts";
import { regionBytes, ropeTableBytes, scoreBytes, scoreTokens } from "./scratch.ts";

/**
 * Positions the KV cache of `layer` holds: a sliding-window layer needs its window W plus the
 * other tokens of a prefill chunk (all of a chunk's keys are written before any of its queries
 * run), so min(ctx, W + maxBatch − 1); every other layer ctx.
 */
export function kvSlots(cfg: ModelConfig, layer: number, ctx: number, maxBatch: number): number {
  const w = cfg.attention?.windows[layer] ?? 0;
  return w > 0 ? Math.min(ctx, w + maxBatch - 1) : ctx;
}

/** Bytes of layer `layer`'s keys and values ({@link kvSlots} positions of each). */
export function gqaStateBytes(
  cfg: ModelConfig,
  layer: number,
  ctx: number,
  maxBatch: number,
): number {
  return kvSlots(cfg, layer, ctx, maxBatch) * 2 * cfg.numKvHeads * cfg.headDim * 4;
}

/** Grouped-query attention of the layers that run it, with their KV caches and its scratch. */
export class GqaAttention implements Mixer {
  #ops: Ops;
  #cfg: ModelConfig;
  #rope: RopeTable;
  #k: number[] = [];
  #v: number[] = [];
  #q: number;
  #kNew: number;
  #vNew: number;
  #att: number;
  #scores: number;
  #scoreTokens: number;
  #maxCtx: number;
  #slots: number[] = [];
  #shape: AttentionShape;
  #layers: number[];

  constructor(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    layers: number[],
    maxBatch: number,
    maxCtx: number,
  ) {
    this.#ops = ops;
    this.#cfg = cfg;
    this.#maxCtx = maxCtx;
    this.#layers = layers;
    const hd = cfg.headDim;
    const kvDim = cfg.numKvHeads * hd;
    for (const l of layers) {
      // One region per layer, sized by the function the planner sums: keys, then values.
      const slots = kvSlots(cfg, l, maxCtx, maxBatch);
      this.#slots[l] = slots;
      const kv = arena.alloc(`kv cache L${l}`, gqaStateBytes(cfg, l, maxCtx, maxBatch));
      this.#k[l] = kv;
      this.#v[l] = kv + slots * kvDim * 4;
    }
    this.#rope = buildRopeTable(arena, cfg.rope, maxCtx);
    this.#q = arena.alloc("attn q", maxBatch * cfg.numHeads * hd * 4);
    this.#kNew = arena.alloc("attn k", maxBatch * kvDim * 4);
    this.#vNew = arena.alloc("attn v", maxBatch * kvDim * 4);
    this.#att = arena.alloc("attn out", maxBatch * cfg.numHeads * hd * 4);
    this.#scoreTokens = scoreTokens(maxBatch);
    this.#scores = arena.alloc("attn scores", scoreBytes(cfg, maxCtx, maxBatch));
    this.#shape = {
      nHeads: cfg.numHeads,
      nKvHeads: cfg.numKvHeads,
      headDim: hd,
      vHeadDim: hd,
      kStride: kvDim,
      vStride: kvDim,
      scale: cfg.attnScale,
    };
  }

  /** The K and V caches of its layers. */
  cacheRegions(): CacheRegion[] {
    const rowBytes = this.#cfg.numKvHeads * this.#cfg.headDim * 4;
    return this.#layers.flatMap((l) => [
      { offset: this.#k[l], rowBytes },
      { offset: this.#v[l], rowBytes },
    ]);
  }

  /** out = o_proj(attention(h)) for `nb` tokens at positions pos.. pos+nb−1. */
  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void {
    const ops = this.#ops;
    const cfg = this.#cfg;
    if (pos + nb > this.#maxCtx) {
      throw new Error(`context full: ${pos + nb} > ${this.#maxCtx} positions`);
    }
    const hd = cfg.headDim;
    const qDim = cfg.numHeads * hd;
    const kvDim = cfg.numKvHeads * hd;
    ops.matmul(
      { w: lw.get("wq"), x: h, y: this.#q, nb },
      { w: lw.get("wk"), x: h, y: this.#kNew, nb },
      { w: lw.get("wv"), x: h, y: this.#vNew, nb },
    );
    if (cfg.attentionBias) {
      for (let b = 0; b < nb; b++) {
        ops.add(this.#q + b * qDim * 4, lw.get("bq").ptr, qDim);
        ops.add(this.#kNew + b * kvDim * 4, lw.get("bk").ptr, kvDim);
        ops.add(this.#vNew + b * kvDim * 4, lw.get("bv").ptr, kvDim);
      }
    }
    if (cfg.qkNorm) {
      // Per head, or (qkNormWhole) one norm over each token's whole projection.
      const w = cfg.qkNormWhole === true, eps = cfg.rmsNormEps;
      const [qn, qRows] = w ? [qDim, nb] : [hd, nb * cfg.numHeads];
      const [kn, kRows] = w ? [kvDim, nb] : [hd, nb * cfg.numKvHeads];
      ops.rmsnorm(this.#q, lw.get("q_norm").ptr, this.#q, qn, qRows, eps);
      ops.rmsnorm(this.#kNew, lw.get("k_norm").ptr, this.#kNew, kn, kRows, eps);
    }
    const interleaved = cfg.rope.layout === "interleaved";
    const window = cfg.attention?.windows[layer] ?? 0;
    const slots = this.#slots[layer];
    const lengths: number[] = [];
    const first: number[] = [];
    for (let b = 0; b < nb; b++) {
      const p = pos + b;
      const [cos, sin] = ropeAt(this.#rope, p);
      ops.rope(this.#q + b * qDim * 4, cfg.numHeads, hd, cfg.rope.dim, cos, sin, interleaved);
      ops.rope(this.#kNew + b * kvDim * 4, cfg.numKvHeads, hd, cfg.rope.dim, cos, sin, interleaved);
      // Slot of position p is p mod slots; a window shows p − W + 1 .. p.
      const start = window > 0 ? Math.max(0, p - window + 1) : 0;
      lengths.push(p - start + 1);
      first.push(start % slots);
      ops.copy(this.#k[layer] + (p % slots) * kvDim * 4, this.#kNew + b * kvDim * 4, kvDim);
      ops.copy(this.#v[layer] + (p % slots) * kvDim * 4, this.#vNew + b * kvDim * 4, kvDim);
    }
    ops.attention({
      shape: this.#shape,
      q: this.#q,
      qStride: qDim,
      k: this.#k[layer],
      v: this.#v[layer],
      out: this.#att,
      outStride: qDim,
      scores: this.#scores,
      scoresPerToken: cfg.numHeads * this.#maxCtx,
      scoreTokens: this.#scoreTokens,
      lengths,
      ring: { slots, first },
      sinks: cfg.attention?.sinks ? lw.get("sinks").ptr : undefined,
    });
    ops.matmul({ w: lw.get("wo"), x: this.#att, y: out, nb });
    if (cfg.attention?.outputBias) {
      for (let b = 0; b < nb; b++) {
        ops.add(out + b * cfg.hiddenSize * 4, lw.get("bo").ptr, cfg.hiddenSize);
      }
    }
  }
}

/** The shape of GQA tensor `t`. */
function gqaShape(cfg: ModelConfig, t: LayerTensor): number[] {
  const H = cfg.hiddenSize, q = cfg.numHeads * cfg.headDim, kv = cfg.numKvHeads * cfg.headDim;
  switch (t) {
    case "wq":
      return [q, H];
    case "wk":
    case "wv":
      return [kv, H];
    case "wo":
      return [H, q];
    case "bq":
      return [q];
    case "bk":
    case "bv":
      return [kv];
    case "bo":
      return [H];
    case "sinks":
      return [cfg.numHeads];
    case "q_norm":
      return [cfg.qkNormWhole ? q : cfg.headDim];
    case "k_norm":
      return [cfg.qkNormWhole ? kv : cfg.headDim];
    default:
      throw new Error(`grouped-query attention has no tensor ${t}`);
  }
}

/** The GQA mixer. */
export const GQA: MixerPart = {
  name: "gqa",
  shape: (cfg, t) => gqaShape(cfg, t),
  stateBytes: gqaStateBytes,
  scratchBytes(cfg, _layers, ctx, maxBatch) {
    const q = maxBatch * cfg.numHeads * cfg.headDim * 4;
    const kv = maxBatch * cfg.numKvHeads * cfg.headDim * 4;
    return ropeTableBytes(cfg.rope, ctx) +
      regionBytes(q, kv, kv, q, scoreBytes(cfg, ctx, maxBatch));
  },
  create: (ops, arena, cfg, layers, maxBatch, maxCtx) =>
    new GqaAttention(ops, arena, cfg, layers, maxBatch, maxCtx),
};
