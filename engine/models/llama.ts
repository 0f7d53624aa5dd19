/**
 * The Llama family: grouped-query attention with RoPE and a float32 KV cache, for a batch of
 * consecutive tokens — Llama, Mixtral, Qwen3-MoE (per-head q/k RMSNorm before RoPE), GLM-4.5
 * (q/k/v biases, RoPE on the leading part of each head) and gpt-oss (q/k/v/o biases, one sink
 * logit per head, sliding-window layers whose cache is a ring holding only what the window needs).
 *
 * @module
 */
import type { Arena } from "../arena.ts";
import type { ModelConfig } from "../../io/model_config.ts";
import type { AttentionShape, Ops } from "../ops.ts";
import { buildRopeTable, ropeAt, type RopeTable } from "../rope_table.ts";
import type { LayerWeights } from "../weights.ts";

/**
 * Positions the KV cache of `layer` holds: a sliding-window layer needs its window W plus the
 * other tokens of a prefill chunk (all of a chunk's keys are written before any of its queries
 * run), so min(ctx, W + maxBatch − 1); every other layer ctx.
 */
export function kvSlots(cfg: ModelConfig, layer: number, ctx: number, maxBatch: number): number {
  const w = cfg.attention?.windows[layer] ?? 0;
  return w > 0 ? Math.min(ctx, w + maxBatch - 1) : ctx;
}

/** Attention of every layer of one model, with its KV cache and scratch. */
export class GqaAttention {
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

  constructor(ops: Ops, arena: Arena, cfg: ModelConfig, maxBatch: number, maxCtx: number) {
    this.#ops = ops;
    this.#cfg = cfg;
    this.#maxCtx = maxCtx;
    const hd = cfg.headDim;
    const kvDim = cfg.numKvHeads * hd;
    for (let l = 0; l < cfg.numLayers; l++) {
      const slots = kvSlots(cfg, l, maxCtx, maxBatch);
      this.#slots.push(slots);
      this.#k.push(arena.alloc(`kv cache k L${l}`, slots * kvDim * 4));
      this.#v.push(arena.alloc(`kv cache v L${l}`, slots * kvDim * 4));
    }
    this.#rope = buildRopeTable(arena, cfg.rope, maxCtx);
    this.#q = arena.alloc("attn q", maxBatch * cfg.numHeads * hd * 4);
    this.#kNew = arena.alloc("attn k", maxBatch * kvDim * 4);
    this.#vNew = arena.alloc("attn v", maxBatch * kvDim * 4);
    this.#att = arena.alloc("attn out", maxBatch * cfg.numHeads * hd * 4);
    this.#scoreTokens = Math.min(maxBatch, 8);
    this.#scores = arena.alloc("attn scores", this.#scoreTokens * cfg.numHeads * maxCtx * 4);
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
      ops.rmsnorm(this.#q, lw.get("q_norm").ptr, this.#q, hd, nb * cfg.numHeads, cfg.rmsNormEps);
      ops.rmsnorm(
        this.#kNew,
        lw.get("k_norm").ptr,
        this.#kNew,
        hd,
        nb * cfg.numKvHeads,
        cfg.rmsNormEps,
      );
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
