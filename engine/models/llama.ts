/**
 * The Llama family (Llama, Mixtral, Qwen3-MoE): grouped-query attention with RoPE and a float32 KV cache (Llama, Mixtral, Qwen3), for a batch
 * of consecutive tokens. Qwen3's per-head q/k RMSNorm runs before RoPE.
 *
 * @module
 */
import type { Arena } from "../arena.ts";
import type { ModelConfig } from "../../io/model_config.ts";
import type { AttentionShape, Ops } from "../ops.ts";
import { buildRopeTable, ropeAt, type RopeTable } from "../rope_table.ts";
import type { LayerWeights } from "../weights.ts";

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
  #shape: AttentionShape;

  constructor(ops: Ops, arena: Arena, cfg: ModelConfig, maxBatch: number, maxCtx: number) {
    this.#ops = ops;
    this.#cfg = cfg;
    this.#maxCtx = maxCtx;
    const hd = cfg.headDim;
    const kvDim = cfg.numKvHeads * hd;
    for (let l = 0; l < cfg.numLayers; l++) {
      this.#k.push(arena.alloc(`kv cache k L${l}`, maxCtx * kvDim * 4));
      this.#v.push(arena.alloc(`kv cache v L${l}`, maxCtx * kvDim * 4));
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
    const lengths: number[] = [];
    for (let b = 0; b < nb; b++) {
      const [cos, sin] = ropeAt(this.#rope, pos + b);
      ops.rope(this.#q + b * qDim * 4, cfg.numHeads, hd, cfg.rope.dim, cos, sin, interleaved);
      ops.rope(this.#kNew + b * kvDim * 4, cfg.numKvHeads, hd, cfg.rope.dim, cos, sin, interleaved);
      lengths.push(pos + b + 1);
    }
    ops.copy(this.#k[layer] + pos * kvDim * 4, this.#kNew, nb * kvDim);
    ops.copy(this.#v[layer] + pos * kvDim * 4, this.#vNew, nb * kvDim);
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
    });
    ops.matmul({ w: lw.get("wo"), x: this.#att, y: out, nb });
  }
}
