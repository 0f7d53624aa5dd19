/**
 * Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, Kimi-Linear and Kimi K3's full-attention
 * layers) with a latent KV cache: each cached position holds the normalised compressed KV
 * (kv_lora_rank floats) and the shared rope key (qk_rope_head_dim floats), about 57× less than
 * expanded K/V at rank 512. Features set from the config: q through a low-rank pair or one
 * projection, NoPE (no rotary at all), and a sigmoid output gate on the heads' values before
 * o_proj (`g_proj`), and DeepSeek Sparse Attention (GLM-5): a lightning indexer whose keys are
 * cached beside the latent rows scores every earlier position for each query, and the query
 * attends only to the best `topK` of them (io/model_config.ts IndexerConfig). The selection is
 * computed on the main thread, so it is the same on every placement and thread count.
 *
 * Decode uses the absorbed form: a head's no-rope query is pulled into latent space through its
 * slice of kv_b_proj (q_lat = W_kbᵀ·q_nope), scored against the latent rows directly, and the
 * attention-weighted latent is mapped to the head's values through W_vb afterwards. The expanded
 * form (engine/reference/mla.ts) is the independent check.
 *
 * @module
 */
import { alignUp } from "../../io/format.ts";
import {
  indexerKept,
  indexerThins,
  type LayerTensor,
  type ModelConfig,
} from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import { rowsToF32 } from "../dequant.ts";
import type { AttentionShape, Matmul, Ops } from "../ops.ts";
import { buildRopeTable, ropeAt, type RopeTable } from "../rope_table.ts";
import { SCORE_TILE, topKTiled } from "../routing.ts";
import type { TensorRef } from "../tensor.ts";
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
 * Floats the indexer caches per position: its key; with pools also the key's pool gate and, at the
 * last position of a pool, the pool's key (made once, when the pool completes).
 */
function indexerRow(cfg: ModelConfig): number {
  const ix = cfg.mla!.indexer;
  return ix ? ix.headDim * (ix.pool ? 3 : 1) : 0;
}

/** One MLA layer's latent rows, then its indexer rows when it has an indexer: `ctx` of each. */
function mlaRowRuns(cfg: ModelConfig, _layer: number, ctx: number): RowShape[] {
  const m = cfg.mla!, ix = indexerRow(cfg);
  const latent = { rows: ctx, rowBytes: (m.kvLoraRank + m.qkRopeHeadDim) * 4 };
  return ix ? [latent, { rows: ctx, rowBytes: ix * 4 }] : [latent];
}

/** Bytes of one MLA layer's latent cache, then its indexer keys and gates, for `ctx` positions. */
function mlaStateBytes(cfg: ModelConfig, layer: number, ctx: number): number {
  return mlaRowRuns(cfg, layer, ctx).reduce((s, r) => s + r.rows * r.rowBytes, 0);
}

/** Per-layer absorbed matrices, float32, built on the layer's first visit. */
interface Absorbed {
  /** Per head: W_kbᵀ, kv_lora_rank × qk_nope_head_dim. */
  kbT: TensorRef[];
  /** Per head: W_vb, v_head_dim × kv_lora_rank. */
  vb: TensorRef[];
}

/** MLA of the layers that run it, with their latent caches and its scratch. */
export class MlaAttention implements Mixer {
  #ops: Ops;
  #arena: Arena;
  #cfg: ModelConfig;
  /** null under NoPE (Kimi-Linear). */
  #rope: RopeTable | null;
  /** The selected sequence's latent cache of each layer (of #caches). */
  #cache: number[];
  #caches: PerSequence<number[]>;
  #absorbed: (Absorbed | null)[];
  #qa: number;
  #q: number;
  #kva: number;
  #qFull: number;
  #latOut: number;
  #att: number;
  /** Output-gate pre-activations (0 when the model has no output gate). */
  #gate = 0;
  #attScratch: number;
  #maxCtx: number;
  #row: number;
  #qkDim: number;
  #shape: AttentionShape;
  #layers: number[];
  /**
   * The indexer's queries, keys, head weights, pool gates (beside the keys) and the rows one
   * sparse query attends to.
   */
  #iq = 0;
  #ik = 0;
  #iw = 0;
  #ig = 0;
  #picked = 0;
  #iscores = 0;

  constructor(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    layers: number[],
    maxBatch: number,
    maxCtx: number,
    sequences: number,
  ) {
    const mla = cfg.mla;
    if (!mla) throw new Error(`${cfg.modelType}: MLA attention needs the mla config`);
    this.#ops = ops;
    this.#arena = arena;
    this.#cfg = cfg;
    this.#maxCtx = maxCtx;
    const H = cfg.numHeads;
    this.#row = mla.kvLoraRank + mla.qkRopeHeadDim;
    this.#qkDim = mla.qkNopeHeadDim + mla.qkRopeHeadDim;
    this.#layers = layers;
    // Sized by the function the planner sums, one per layer and sequence.
    this.#caches = new PerSequence(sequences, (seq) => {
      const cache: number[] = [];
      for (const l of layers) {
        const what = stateName(`latent kv cache L${l}`, seq);
        cache[l] = arena.alloc(what, mlaStateBytes(cfg, l, maxCtx));
      }
      return cache;
    });
    this.#cache = this.#caches.current;
    this.#absorbed = new Array(cfg.numLayers).fill(null);
    this.#rope = mla.nope ? null : buildRopeTable(arena, cfg.rope, maxCtx);
    const ix = mla.indexer;
    if (ix) {
      this.#iq = arena.alloc("indexer q", maxBatch * ix.numHeads * ix.headDim * 4);
      this.#ik = arena.alloc("indexer k", maxBatch * ix.headDim * 4);
      this.#iw = arena.alloc("indexer weights", maxBatch * ix.numHeads * 4);
      if (ix.pool) this.#ig = arena.alloc("indexer pool gates", maxBatch * ix.headDim * 4);
      this.#picked = arena.alloc("dsa picked rows", indexerKept(ix) * this.#row * 4);
      this.#iscores = arena.alloc("indexer scores", Math.min(maxCtx, SCORE_TILE) * 4);
    }
    if (mla.outputGate) {
      this.#gate = arena.alloc("mla output gate", maxBatch * H * mla.vHeadDim * 4);
    }
    this.#qa = arena.alloc("mla q_a", maxBatch * (mla.qLoraRank ?? 1) * 4);
    this.#q = arena.alloc("mla q", maxBatch * H * this.#qkDim * 4);
    this.#kva = arena.alloc("mla kv_a", maxBatch * this.#row * 4);
    this.#qFull = arena.alloc("mla latent queries", maxBatch * H * this.#row * 4);
    this.#latOut = arena.alloc("mla latent outputs", maxBatch * H * mla.kvLoraRank * 4);
    this.#att = arena.alloc("mla values", maxBatch * H * mla.vHeadDim * 4);
    this.#attScratch = arena.alloc("mla tiles", attentionScratchBytes(H, maxBatch));
    this.#shape = {
      nHeads: H,
      nKvHeads: 1,
      headDim: this.#row,
      vHeadDim: mla.kvLoraRank,
      kStride: this.#row,
      vStride: this.#row,
      scale: cfg.attnScale,
    };
  }

  /** Splits kv_b_proj into per-head float32 W_kbᵀ and W_vb, once per layer. */
  #absorb(layer: number, lw: LayerWeights): Absorbed {
    const have = this.#absorbed[layer];
    if (have) return have;
    const mla = this.#cfg.mla!;
    const H = this.#cfg.numHeads;
    const r = mla.kvLoraRank, nope = mla.qkNopeHeadDim, v = mla.vHeadDim;
    const wkvb = lw.get("wkv_b");
    const all = rowsToF32(this.#arena, wkvb, 0, wkvb.rows);
    const kbT: TensorRef[] = [];
    const vb: TensorRef[] = [];
    for (let h = 0; h < H; h++) {
      const base = h * (nope + v) * r;
      const kOff = this.#arena.alloc(`mla W_kbT L${layer} h${h}`, r * nope * 4, 64);
      const k = this.#arena.f32(kOff, r * nope);
      for (let i = 0; i < nope; i++) {
        for (let c = 0; c < r; c++) k[c * nope + i] = all[base + i * r + c];
      }
      kbT.push({ ptr: kOff, dtype: "f32", rows: r, cols: nope });
      const vOff = this.#arena.alloc(`mla W_vb L${layer} h${h}`, v * r * 4, 64);
      this.#arena.f32(vOff, v * r).set(all.subarray(base + nope * r, base + (nope + v) * r));
      vb.push({ ptr: vOff, dtype: "f32", rows: v, cols: r });
    }
    const made = { kbT, vb };
    this.#absorbed[layer] = made;
    return made;
  }

  /**
   * The latent caches of its layers (compressed KV and the shared RoPE key), each followed by
   * the layer's indexer rows when it has an indexer.
   */
  cacheRegions(): CacheRegion[] {
    const ix = this.#cfg.mla!.indexer;
    const rows = this.#maxCtx;
    return this.#layers.flatMap((l) => [
      { offset: this.#cache[l], rowBytes: this.#row * 4, rows },
      ...(ix ? [{ offset: this.#indexRows(l), rowBytes: indexerRow(this.#cfg) * 4, rows }] : []),
    ]);
  }

  select(seq: number): void {
    this.#caches.select(seq);
    this.#cache = this.#caches.current;
  }

  /** Where layer `layer`'s indexer rows start: after its latent rows. */
  #indexRows(layer: number): number {
    return this.#cache[layer] + this.#maxCtx * this.#row * 4;
  }

  /**
   * The indexer rows of tokens pos..pos+nb−1 (the call's rows b0..b0+nb−1) into the cache: the
   * key (LayerNorm with bias, eps 1e-6, then RoPE on the leading qk_rope_head_dim dims, as on the
   * queries), with pools its gate, and the key of each pool these tokens complete.
   */
  #indexerKeys(layer: number, lw: LayerWeights, nb: number, pos: number, b0: number): void {
    const ix = this.#cfg.mla!.indexer!;
    const D = ix.headDim, R = indexerRow(this.#cfg), rows = this.#indexRows(layer);
    const w = this.#arena.f32(lw.get("idx_k_norm").ptr, D);
    const bias = this.#arena.f32(lw.get("idx_k_bias").ptr, D);
    const interleaved = this.#cfg.rope.layout === "interleaved";
    const ropeDim = this.#cfg.mla!.qkRopeHeadDim;
    for (let b = b0; b < b0 + nb; b++) {
      const k = this.#arena.f32(this.#ik + b * D * 4, D);
      let mean = 0;
      for (let i = 0; i < D; i++) mean += k[i];
      mean /= D;
      let v = 0;
      for (let i = 0; i < D; i++) v += (k[i] - mean) ** 2;
      const inv = 1 / Math.sqrt(v / D + 1e-6);
      for (let i = 0; i < D; i++) k[i] = (k[i] - mean) * inv * w[i] + bias[i];
      if (this.#rope) {
        const [cos, sin] = ropeAt(this.#rope, pos + b - b0);
        this.#ops.rope(this.#ik + b * D * 4, 1, D, ropeDim, cos, sin, interleaved);
        this.#ops.rope(
          this.#iq + b * ix.numHeads * D * 4,
          ix.numHeads,
          D,
          ropeDim,
          cos,
          sin,
          interleaved,
        );
      }
      const row = rows + (pos + b - b0) * R * 4;
      this.#ops.copy(row, this.#ik + b * D * 4, D);
      if (ix.pool) this.#ops.copy(row + D * 4, this.#ig + b * D * 4, D);
    }
    if (!ix.pool) return;
    const ape = lw.get("idx_pool_ape").ptr;
    for (let j = Math.floor(pos / ix.pool); (j + 1) * ix.pool <= pos + nb; j++) {
      const last = (j + 1) * ix.pool - 1;
      this.#ops.csaCompress({
        rows,
        rowFloats: R,
        cOff: 0,
        zOff: D,
        ape,
        ratio: ix.pool,
        width: D,
        indexed: false,
        w: j,
        out: rows + (last * R + 2 * D) * 4,
      });
    }
  }

  /**
   * The positions token b of a call (at position p) attends to, when the indexer thins them, in
   * increasing order: the scoring kernel (csa.c) with the head weights scaled by
   * 1/√(heads·head_dim), and top-k with ties to the lower position (routing.ts), scored a tile
   * at a time so the score buffer does not grow with the context.
   */
  #select(b: number, layer: number, p: number): number[] {
    const ix = this.#cfg.mla!.indexer!;
    const D = ix.headDim, H = ix.numHeads, R = indexerRow(this.#cfg);
    const iw = this.#iw + b * H * 4;
    const w = this.#arena.f32(iw, H);
    for (let h = 0; h < H; h++) w[h] /= Math.sqrt(H * D);
    const rows = this.#indexRows(layer);
    const q = this.#iq + b * H * D * 4;
    const best = (keys: number, stride: number, n: number, k: number) =>
      topKTiled(n, k, SCORE_TILE, (from, count) => {
        this.#ops.csaIndexScores(
          q,
          H,
          D,
          iw,
          keys + from * stride * 4,
          stride,
          count,
          this.#iscores,
        );
        return this.#arena.f32(this.#iscores, count);
      }).sort((x, y) => x - y);
    if (!ix.pool) return best(rows, R, p + 1, ix.topK);
    // Complete pools are scored by their keys; the tail after them is always kept.
    const pool = ix.pool, P = Math.floor((p + 1) / pool);
    const kept = best(rows + ((pool - 1) * R + 2 * D) * 4, pool * R, P, Math.floor(ix.topK / pool))
      .flatMap((j) => Array.from({ length: pool }, (_, r) => j * pool + r));
    for (let t = P * pool; t <= p; t++) kept.push(t);
    return kept;
  }

  /** out = o_proj(MLA(h)) for `nb` tokens at positions pos..pos+nb−1. */
  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void {
    this.#forward(layer, lw, h, out, [{ cache: this.#cache, n: nb, pos }]);
  }

  /** out = o_proj(MLA(h)) for the rows of several sequences, each on its own latent cache. */
  forwardSpans(
    layer: number,
    lw: LayerWeights,
    h: number,
    out: number,
    spans: readonly SequenceSpan[],
  ): void {
    const selected = this.#cache;
    try {
      this.#forward(
        layer,
        lw,
        h,
        out,
        spans.map((s) => ({ cache: this.#caches.of(s.seq), n: s.n, pos: s.pos })),
      );
    } finally {
      this.#cache = selected;
    }
  }

  /**
   * The projections, the absorbed queries, the value projections and o_proj over all rows; the
   * latent rows, the indexer and attention per run of rows, on that run's cache.
   */
  #forward(
    layer: number,
    lw: LayerWeights,
    h: number,
    out: number,
    runs: { cache: number[]; n: number; pos: number }[],
  ): void {
    const ops = this.#ops;
    const cfg = this.#cfg;
    const mla = cfg.mla!;
    const H = cfg.numHeads;
    const eps = mla.latentNormEps ?? cfg.rmsNormEps;
    const ix = mla.indexer;
    const nope = mla.qkNopeHeadDim, ropeDim = mla.qkRopeHeadDim, r = mla.kvLoraRank;
    const row = this.#row, qk = this.#qkDim;
    for (const { n, pos } of runs) {
      if (pos + n > this.#maxCtx) {
        throw new Error(`context full: ${pos + n} > ${this.#maxCtx} positions`);
      }
    }
    const nb = runs.reduce((s, x) => s + x.n, 0);
    const ab = this.#absorb(layer, lw);

    // Queries and the new latent rows.
    if (mla.qLoraRank !== null) {
      ops.matmul({ w: lw.get("wq_a"), x: h, y: this.#qa, nb }, {
        w: lw.get("wkv_a"),
        x: h,
        y: this.#kva,
        nb,
      });
      ops.rmsnorm(this.#qa, lw.get("q_a_norm").ptr, this.#qa, mla.qLoraRank, nb, eps);
      ops.matmul(
        { w: lw.get("wq_b"), x: this.#qa, y: this.#q, nb },
        ...(ix
          ? [
            { w: lw.get("idx_wq"), x: this.#qa, y: this.#iq, nb },
            { w: lw.get("idx_wk"), x: h, y: this.#ik, nb },
            { w: lw.get("idx_w"), x: h, y: this.#iw, nb },
            ...(ix.pool ? [{ w: lw.get("idx_pool_gate"), x: h, y: this.#ig, nb }] : []),
          ]
          : []),
      );
    } else {
      ops.matmul({ w: lw.get("wq"), x: h, y: this.#q, nb }, {
        w: lw.get("wkv_a"),
        x: h,
        y: this.#kva,
        nb,
      });
    }
    const interleaved = cfg.rope.layout === "interleaved";
    let b0 = 0;
    for (const { cache, n, pos } of runs) {
      this.#cache = cache;
      for (let b = b0; b < b0 + n; b++) {
        const kv = this.#kva + b * row * 4;
        ops.rmsnorm(kv, lw.get("kv_a_norm").ptr, kv, r, 1, eps);
        if (this.#rope) {
          const [cos, sin] = ropeAt(this.#rope, pos + b - b0);
          ops.rope(kv + r * 4, 1, row, ropeDim, cos, sin, interleaved);
          ops.rope(this.#q + (b * H * qk + nope) * 4, H, qk, ropeDim, cos, sin, interleaved);
        }
      }
      ops.copy(cache[layer] + pos * row * 4, this.#kva + b0 * row * 4, n * row);
      if (ix) this.#indexerKeys(layer, lw, n, pos, b0);
      b0 += n;
    }

    // Absorbed queries: [W_kbᵀ · q_nope | q_pe] per (token, head).
    const absorb: Matmul[] = [];
    for (let b = 0; b < nb; b++) {
      for (let hh = 0; hh < H; hh++) {
        const q = this.#q + (b * H + hh) * qk * 4;
        const qf = this.#qFull + (b * H + hh) * row * 4;
        absorb.push({ w: ab.kbT[hh], x: q, y: qf, nb: 1 });
        ops.copy(qf + r * 4, q + nope * 4, ropeDim);
      }
    }
    ops.matmul(...absorb);

    // A query with more keys than the indexer keeps attends to its picked rows, gathered in
    // order of position; the others attend to the whole cache, all in one call per run.
    const attend = (b: number, k: number, p: number, tokens: number) =>
      ops.attention({
        shape: this.#shape,
        q: this.#qFull + b * H * row * 4,
        qStride: H * row,
        k,
        v: k,
        out: this.#latOut + b * H * r * 4,
        outStride: H * r,
        scratch: this.#attScratch,
        pos: p,
        tokens,
      });
    b0 = 0;
    for (const { cache, n, pos } of runs) {
      this.#cache = cache;
      const thins = (i: number) => ix !== undefined && indexerThins(ix, pos + i + 1);
      const sparse = Array.from({ length: n }, (_, i) => i).findIndex(thins);
      const dense = sparse < 0 ? n : sparse;
      if (dense > 0) attend(b0, cache[layer], pos, dense);
      for (let i = dense; i < n; i++) {
        const picked = this.#select(b0 + i, layer, pos + i);
        picked.forEach((t, j) =>
          ops.copy(this.#picked + j * row * 4, cache[layer] + t * row * 4, row)
        );
        // The picked rows stand at positions 0 .. n − 1, the query at the last.
        attend(b0 + i, this.#picked, picked.length - 1, 1);
      }
      b0 += n;
    }

    // Latent outputs → per-head values → o_proj.
    const values: Matmul[] = [];
    for (let b = 0; b < nb; b++) {
      for (let hh = 0; hh < H; hh++) {
        const lat = this.#latOut + (b * H + hh) * r * 4;
        values.push({
          w: ab.vb[hh],
          x: lat,
          y: this.#att + (b * H + hh) * mla.vHeadDim * 4,
          nb: 1,
        });
      }
    }
    if (this.#gate) values.push({ w: lw.get("g_proj"), x: h, y: this.#gate, nb });
    ops.matmul(...values);
    if (this.#gate) {
      ops.sigmoid(this.#gate, nb * H * mla.vHeadDim);
      ops.mul(this.#att, this.#gate, nb * H * mla.vHeadDim);
    }
    ops.matmul({ w: lw.get("wo"), x: this.#att, y: out, nb });
  }
}

/** The shape of MLA tensor `t`. */
function mlaShape(cfg: ModelConfig, t: LayerTensor): number[] {
  const m = cfg.mla!;
  const H = cfg.hiddenSize, heads = cfg.numHeads;
  const q = heads * (m.qkNopeHeadDim + m.qkRopeHeadDim);
  switch (t) {
    case "wq":
      return [q, H];
    case "wq_a":
      return [m.qLoraRank!, H];
    case "q_a_norm":
      return [m.qLoraRank!];
    case "wq_b":
      return [q, m.qLoraRank!];
    case "wkv_a":
      return [m.kvLoraRank + m.qkRopeHeadDim, H];
    case "kv_a_norm":
      return [m.kvLoraRank];
    case "wkv_b":
      return [heads * (m.qkNopeHeadDim + m.vHeadDim), m.kvLoraRank];
    case "wo":
      return [H, heads * m.vHeadDim];
    // The output gate: one sigmoid per value element of every head.
    case "g_proj":
      return [heads * m.vHeadDim, H];
    case "idx_wq":
      return [m.indexer!.numHeads * m.indexer!.headDim, m.qLoraRank!];
    case "idx_wk":
      return [m.indexer!.headDim, H];
    case "idx_k_norm":
    case "idx_k_bias":
      return [m.indexer!.headDim];
    case "idx_w":
      return [m.indexer!.numHeads, H];
    case "idx_pool_ape":
      return [m.indexer!.pool!, m.indexer!.headDim];
    case "idx_pool_gate":
      return [m.indexer!.headDim, H];
    default:
      throw new Error(`multi-head latent attention has no tensor ${t}`);
  }
}

/** The MLA mixer. */
export const MLA: MixerPart = {
  name: "mla",
  shape: (cfg, t) => mlaShape(cfg, t),
  stateBytes: mlaStateBytes,
  rowRuns: mlaRowRuns,
  scratchBytes(cfg, layers, ctx, maxBatch) {
    const m = cfg.mla!;
    const H = cfg.numHeads, f = maxBatch * 4;
    const row = m.kvLoraRank + m.qkRopeHeadDim;
    // The absorbed float32 matrices of every layer it runs: W_kbᵀ and W_vb of every head, each
    // 64-byte aligned, made on a layer's first visit.
    const absorbed = layers.length * H *
      (alignUp(m.kvLoraRank * m.qkNopeHeadDim * 4, 64) +
        alignUp(m.vHeadDim * m.kvLoraRank * 4, 64));
    return (m.nope ? 0 : ropeTableBytes(cfg.rope, ctx)) +
      regionBytes(
        ...(m.outputGate ? [f * H * m.vHeadDim] : []),
        f * (m.qLoraRank ?? 1),
        f * H * (m.qkNopeHeadDim + m.qkRopeHeadDim),
        f * row,
        f * H * row,
        f * H * m.kvLoraRank,
        f * H * m.vHeadDim,
        attentionScratchBytes(H, maxBatch),
        ...(m.indexer
          ? [
            f * m.indexer.numHeads * m.indexer.headDim,
            f * m.indexer.headDim,
            f * m.indexer.numHeads,
            ...(m.indexer.pool ? [f * m.indexer.headDim] : []),
            indexerKept(m.indexer) * row * 4,
            Math.min(ctx, SCORE_TILE) * 4,
          ]
          : []),
      ) + absorbed;
  },
  create: (ops, arena, cfg, layers, maxBatch, maxCtx, sequences) =>
    new MlaAttention(ops, arena, cfg, layers, maxBatch, maxCtx, sequences),
};
