/**
 * Grouped-query attention, the mixer of Llama, Mixtral, Qwen3-MoE, GLM-4.5, MiniMax-M2 and gpt-oss:
 * RoPE (on the leading `rope.dim` dims of each head), a float32 KV cache, and as features set from
 * the config: q/k/v biases, Qwen3's per-head q/k RMSNorm before RoPE (by 1 + w with
 * `normUnitOffset`; MiniMax-M2's one over the whole projection, `qkNormWhole`), gpt-oss's o_proj
 * bias, one learned sink logit per head in the softmax denominator and sliding-window layers whose
 * cache is a ring holding only what the window needs; Qwen3-Next's / Qwen3.5's output gate
 * (`attnOutputGate`: q_proj holds each head's query and then its gate; the heads' values are
 * multiplied by σ(gate) before o_proj); Gemma 4's full layers with their own head width, KV heads
 * and RoPE (`attention.fullLayers`, values the raw keys with `kEqV`) and a weightless norm on each
 * value head (`attention.valueNorm`). Its float64 reference is engine/reference/gqa.ts.
 *
 * @module
 */
import {
  type FullLayerGeometry,
  layerGeometry,
  type LayerTensor,
  type ModelConfig,
} from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import type { AttentionShape, Ops } from "../ops.ts";
import { buildRopeTable, ropeAt, type RopeTable } from "../rope_table.ts";
import type { LayerWeights } from "../weights.ts";
import {
  type CacheRegion,
  type Mixer,
  type MixerPart,
  PerSequence,
  type RowShape,
  type SequenceSpan,
  stateName,
} from "./mixer.ts";
import { attentionScratchBytes, regionBytes, ropeTableBytes } from "./scratch.ts";

/**
 * Positions the KV cache of `layer` holds: a sliding-window layer needs its window W plus the
 * other tokens of a prefill chunk (all of a chunk's keys are written before any of its queries
 * run), so min(ctx, W + maxBatch − 1); every other layer ctx.
 */
export function kvSlots(cfg: ModelConfig, layer: number, ctx: number, maxBatch: number): number {
  const w = cfg.attention?.windows[layer] ?? 0;
  return w > 0 ? Math.min(ctx, w + maxBatch - 1) : ctx;
}

/** Layer `layer`'s keys, then its values: {@link kvSlots} rows each. */
function gqaRowRuns(cfg: ModelConfig, layer: number, ctx: number, maxBatch: number): RowShape[] {
  const g = layerGeometry(cfg, layer);
  const run = { rows: kvSlots(cfg, layer, ctx, maxBatch), rowBytes: g.numKvHeads * g.headDim * 4 };
  return [run, run];
}

/** Bytes of layer `layer`'s keys and values ({@link kvSlots} positions of each). */
export function gqaStateBytes(
  cfg: ModelConfig,
  layer: number,
  ctx: number,
  maxBatch: number,
): number {
  return gqaRowRuns(cfg, layer, ctx, maxBatch).reduce((s, r) => s + r.rows * r.rowBytes, 0);
}

/**
 * What the attention of `layers` allocates besides their caches, in allocation order: a RoPE
 * table per distinct rope, then q (with the output gate also q_proj's output and the gates), k,
 * v, the heads' output and the scores, sized for the widest layer, and the value norm's weight of
 * ones when the model has one.
 */
function gqaScratch(cfg: ModelConfig, layers: number[], maxBatch: number) {
  const geometry = layers.map((l) => layerGeometry(cfg, l));
  const ropes = [...new Set(geometry.map((g) => g.rope))];
  const headDim = Math.max(...geometry.map((g) => g.headDim));
  const q = maxBatch * Math.max(...geometry.map((g) => cfg.numHeads * g.headDim)) * 4;
  const kv = maxBatch * Math.max(...geometry.map((g) => g.numKvHeads * g.headDim)) * 4;
  const ones = cfg.attention?.valueNorm ? headDim * 4 : 0;
  return { geometry, ropes, headDim, q, kv, ones };
}

/** Grouped-query attention of the layers that run it, with their KV caches and its scratch. */
export class GqaAttention implements Mixer {
  #ops: Ops;
  #cfg: ModelConfig;
  /** Per layer: its geometry, RoPE table and attention shape. */
  #geometry: FullLayerGeometry[] = [];
  #rope: RopeTable[] = [];
  #shape: AttentionShape[] = [];
  /** Ones of the widest head: the weight of the weightless value norm (0 without one). */
  #ones = 0;
  /** Per sequence, per layer: where its keys and its values start. */
  #kv: PerSequence<{ k: number[]; v: number[] }>;
  #q: number;
  /** Gated attention: q_proj's output ([query | gate] per head) and the gates (else 0). */
  #qg = 0;
  #gate = 0;
  #kNew: number;
  #vNew: number;
  #att: number;
  #attScratch: number;
  #maxCtx: number;
  #slots: number[] = [];
  #layers: number[];

  constructor(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    layers: number[],
    maxBatch: number,
    maxCtx: number,
    sequences: number,
  ) {
    this.#ops = ops;
    this.#cfg = cfg;
    this.#maxCtx = maxCtx;
    this.#layers = layers;
    const s = gqaScratch(cfg, layers, maxBatch);
    this.#kv = new PerSequence(sequences, () => ({ k: [], v: [] }));
    layers.forEach((l, i) => {
      const g = s.geometry[i], kvDim = g.numKvHeads * g.headDim;
      this.#geometry[l] = g;
      this.#shape[l] = {
        nHeads: cfg.numHeads,
        nKvHeads: g.numKvHeads,
        headDim: g.headDim,
        vHeadDim: g.headDim,
        kStride: kvDim,
        vStride: kvDim,
        scale: cfg.attnScale,
      };
      // One region per layer and sequence, sized by the function the planner sums: keys, then
      // values.
      const slots = kvSlots(cfg, l, maxCtx, maxBatch);
      this.#slots[l] = slots;
      for (let seq = 0; seq < sequences; seq++) {
        this.#kv.select(seq);
        const bytes = gqaStateBytes(cfg, l, maxCtx, maxBatch);
        const kv = arena.alloc(stateName(`kv cache L${l}`, seq), bytes);
        this.#kv.current.k[l] = kv;
        this.#kv.current.v[l] = kv + slots * kvDim * 4;
      }
    });
    this.#kv.select(0);
    const tables = new Map(s.ropes.map((r) => [r, buildRopeTable(arena, r, maxCtx)]));
    for (const l of layers) this.#rope[l] = tables.get(this.#geometry[l].rope)!;
    this.#q = arena.alloc("attn q", s.q);
    if (cfg.attnOutputGate) {
      this.#qg = arena.alloc("attn q + gate", 2 * s.q);
      this.#gate = arena.alloc("attn gate", s.q);
    }
    this.#kNew = arena.alloc("attn k", s.kv);
    this.#vNew = arena.alloc("attn v", s.kv);
    this.#att = arena.alloc("attn out", s.q);
    this.#attScratch = arena.alloc(
      "attn tiles",
      attentionScratchBytes(cfg.numHeads, maxBatch),
    );
    if (s.ones) {
      this.#ones = arena.alloc("attn value-norm ones", s.ones);
      ops.f32(this.#ones, s.headDim).fill(1);
    }
  }

  /** The K and V caches of its layers (the selected sequence's). */
  cacheRegions(): CacheRegion[] {
    const { k, v } = this.#kv.current;
    return this.#layers.flatMap((l) => {
      const g = this.#geometry[l];
      const rowBytes = g.numKvHeads * g.headDim * 4;
      const rows = this.#slots[l];
      const w = this.#cfg.attention?.windows[l] ?? 0;
      const ring = w > 0 ? { window: w } : {};
      return [{ offset: k[l], rowBytes, rows, ...ring }, { offset: v[l], rowBytes, rows, ...ring }];
    });
  }

  select(seq: number): void {
    this.#kv.select(seq);
  }

  /**
   * Gated attention: splits q_proj's output of `nb` tokens, [query | gate] per head of width `hd`,
   * into the queries and the gates.
   */
  #splitGate(nb: number, hd: number): void {
    const ops = this.#ops, heads = nb * this.#cfg.numHeads;
    const qg = ops.f32(this.#qg, 2 * heads * hd);
    const q = ops.f32(this.#q, heads * hd), gate = ops.f32(this.#gate, heads * hd);
    for (let i = 0; i < heads; i++) {
      q.set(qg.subarray(2 * i * hd, (2 * i + 1) * hd), i * hd);
      gate.set(qg.subarray((2 * i + 1) * hd, (2 * i + 2) * hd), i * hd);
    }
  }

  /** out = o_proj(attention(h)) for `nb` tokens at positions pos.. pos+nb−1. */
  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void {
    this.#forward(layer, lw, h, out, [{ kv: this.#kv.current, n: nb, pos }]);
  }

  /** out = o_proj(attention(h)) for the rows of several sequences, each on its own cache. */
  forwardSpans(
    layer: number,
    lw: LayerWeights,
    h: number,
    out: number,
    spans: readonly SequenceSpan[],
  ): void {
    const runs = spans.map((s) => ({ kv: this.#kv.of(s.seq), n: s.n, pos: s.pos }));
    this.#forward(layer, lw, h, out, runs);
  }

  /**
   * The projections, norms, gate and o_proj over all rows; RoPE, the cache writes and attention
   * per run of rows, on that run's keys and values.
   */
  #forward(
    layer: number,
    lw: LayerWeights,
    h: number,
    out: number,
    runs: { kv: { k: number[]; v: number[] }; n: number; pos: number }[],
  ): void {
    const ops = this.#ops;
    const cfg = this.#cfg;
    for (const { n, pos } of runs) {
      if (pos + n > this.#maxCtx) {
        throw new Error(`context full: ${pos + n} > ${this.#maxCtx} positions`);
      }
    }
    const nb = runs.reduce((s, r) => s + r.n, 0);
    const g = this.#geometry[layer];
    const hd = g.headDim, kvHeads = g.numKvHeads;
    const qDim = cfg.numHeads * hd;
    const kvDim = kvHeads * hd;
    const gated = this.#qg !== 0;
    ops.matmul(
      { w: lw.get("wq"), x: h, y: gated ? this.#qg : this.#q, nb },
      { w: lw.get("wk"), x: h, y: this.#kNew, nb },
      ...(g.kEqV ? [] : [{ w: lw.get("wv"), x: h, y: this.#vNew, nb }]),
    );
    // k = v: the values are the keys as projected, before their norm and rotation.
    if (g.kEqV) ops.copy(this.#vNew, this.#kNew, nb * kvDim);
    if (gated) this.#splitGate(nb, hd);
    if (cfg.attentionBias) {
      for (let b = 0; b < nb; b++) {
        ops.add(this.#q + b * qDim * 4, lw.get("bq").ptr, qDim);
        ops.add(this.#kNew + b * kvDim * 4, lw.get("bk").ptr, kvDim);
        ops.add(this.#vNew + b * kvDim * 4, lw.get("bv").ptr, kvDim);
      }
    }
    if (cfg.qkNorm) {
      // Per head, or (qkNormWhole) one norm over each token's whole projection.
      const w = cfg.qkNormWhole === true, eps = cfg.rmsNormEps, unit = cfg.normUnitOffset;
      const [qn, qRows] = w ? [qDim, nb] : [hd, nb * cfg.numHeads];
      const [kn, kRows] = w ? [kvDim, nb] : [hd, nb * kvHeads];
      ops.rmsnorm(this.#q, lw.get("q_norm").ptr, this.#q, qn, qRows, eps, unit);
      ops.rmsnorm(this.#kNew, lw.get("k_norm").ptr, this.#kNew, kn, kRows, eps, unit);
    }
    if (this.#ones) {
      ops.rmsnorm(this.#vNew, this.#ones, this.#vNew, hd, nb * kvHeads, cfg.rmsNormEps);
    }
    const rope = g.rope, table = this.#rope[layer];
    const interleaved = rope.layout === "interleaved";
    const window = cfg.attention?.windows[layer] ?? 0;
    const slots = this.#slots[layer];
    let b0 = 0;
    for (const { kv, n, pos } of runs) {
      const k = kv.k[layer], v = kv.v[layer];
      for (let b = b0; b < b0 + n; b++) {
        const p = pos + b - b0;
        const [cos, sin] = ropeAt(table, p);
        ops.rope(this.#q + b * qDim * 4, cfg.numHeads, hd, rope.dim, cos, sin, interleaved);
        ops.rope(this.#kNew + b * kvDim * 4, kvHeads, hd, rope.dim, cos, sin, interleaved);
        // Slot of position p is p mod slots; a window shows p − W + 1 .. p.
        ops.copy(k + (p % slots) * kvDim * 4, this.#kNew + b * kvDim * 4, kvDim);
        ops.copy(v + (p % slots) * kvDim * 4, this.#vNew + b * kvDim * 4, kvDim);
      }
      ops.attention({
        shape: this.#shape[layer],
        q: this.#q + b0 * qDim * 4,
        qStride: qDim,
        k,
        v,
        out: this.#att + b0 * qDim * 4,
        outStride: qDim,
        scratch: this.#attScratch,
        pos,
        tokens: n,
        window,
        slots,
        sinks: cfg.attention?.sinks ? lw.get("sinks").ptr : undefined,
      });
      b0 += n;
    }
    if (gated) {
      ops.sigmoid(this.#gate, nb * qDim);
      ops.mul(this.#att, this.#gate, nb * qDim);
    }
    ops.matmul({ w: lw.get("wo"), x: this.#att, y: out, nb });
    if (cfg.attention?.outputBias) {
      for (let b = 0; b < nb; b++) {
        ops.add(out + b * cfg.hiddenSize * 4, lw.get("bo").ptr, cfg.hiddenSize);
      }
    }
  }
}

/** The shape of GQA tensor `t` of layer `layer`. */
function gqaShape(cfg: ModelConfig, t: LayerTensor, layer: number): number[] {
  const g = layerGeometry(cfg, layer);
  const H = cfg.hiddenSize, q = cfg.numHeads * g.headDim, kv = g.numKvHeads * g.headDim;
  switch (t) {
    case "wq":
      // Gated: each head's query, then as many rows of its output gate.
      return [cfg.attnOutputGate ? 2 * q : q, H];
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
      return [cfg.qkNormWhole ? q : g.headDim];
    case "k_norm":
      return [cfg.qkNormWhole ? kv : g.headDim];
    default:
      throw new Error(`grouped-query attention has no tensor ${t}`);
  }
}

/** The GQA mixer. */
export const GQA: MixerPart = {
  name: "gqa",
  shape: gqaShape,
  stateBytes: gqaStateBytes,
  rowRuns: gqaRowRuns,
  scratchBytes(cfg, layers, ctx, maxBatch) {
    const s = gqaScratch(cfg, layers, maxBatch);
    return s.ropes.reduce((sum, r) => sum + ropeTableBytes(r, ctx), 0) +
      regionBytes(
        s.q,
        ...(cfg.attnOutputGate ? [2 * s.q, s.q] : []),
        s.kv,
        s.kv,
        s.q,
        attentionScratchBytes(cfg.numHeads, maxBatch),
      ) +
      (s.ones ? regionBytes(s.ones) : 0);
  },
  create: (ops, arena, cfg, layers, maxBatch, maxCtx, sequences) =>
    new GqaAttention(ops, arena, cfg, layers, maxBatch, maxCtx, sequences),
};
