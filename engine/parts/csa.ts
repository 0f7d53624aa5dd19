/**
 * DeepSeek-V4's compressed sparse attention as a mixer part (config section `csa`,
 * io/model_config.ts `CsaConfig`): shared-KV MQA (one vector per position is key and value) with
 * RoPE on the trailing dims, a sliding window, a sink per head, per layer CSA (overlapping
 * compressor + Lightning indexer keeping the best entries) or HCA (every entry of a heavy
 * compressor), and the grouped low-rank output projection. Kernels: kernels/csa.c (compressor
 * entry, indexer scores) with the shared attention, RMSNorm and RoPE kernels. Its float64
 * reference is engine/reference/csa.ts.
 *
 * Per-sequence state: one position-indexed cache per layer whose row p holds position p's kv and
 * the compressors' projections of position p (needed by the entries of its window and, on CSA
 * layers, the next one); when a window ends at p, its compressed entry and indexer key replace
 * the projections of p that only that window reads. Every row depends only on positions ≤ p, so the planner, the prompt cache and saved
 * sessions carry it as they carry a KV cache, and rewinding is free.
 *
 * @module
 */
import type { CsaConfig, LayerTensor, ModelConfig } from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import type { AttentionShape, Ops } from "../ops.ts";
import { buildRopeTable, ropeAt, type RopeTable } from "../rope_table.ts";
import { SCORE_TILE, topKTiled } from "../routing.ts";
import { rowBlock } from "../tensor.ts";
import type { LayerWeights } from "../weights.ts";
import {
  type CacheRegion,
  type Mixer,
  type MixerPart,
  PerSequence,
  type SequenceSpan,
  stateName,
} from "./mixer.ts";
import { attentionScratchBytes, regionBytes, ropeTableBytes } from "./scratch.ts";

/** The config's `csa` section; an error when it has none. */
function csaOf(cfg: ModelConfig): CsaConfig {
  if (!cfg.csa) throw new Error(`${cfg.modelType}: no compressed sparse attention (csa) section`);
  return cfg.csa;
}

/** Float offsets inside one position's cache row of layer `layer`, and the row's length. */
interface RowLayout {
  /** kv (head_dim). */
  kv: number;
  /** The compressor's kv and gate projections (cw each; CSA: 2·head_dim, HCA: head_dim). */
  c: number;
  z: number;
  cw: number;
  /** The indexer compressor's kv and gate projections (2·index_head_dim each). */
  ic: number;
  iz: number;
  /**
   * The entry of the window ending here (head_dim), and its indexer key (index_head_dim). They
   * overwrite the part of this row's projections that only this window reads (HCA: all of c; CSA:
   * the second halves of c and ic, the next window reading the first), so no row holds room for
   * an entry that 1 − 1/ratio of the rows never have.
   */
  entry: number;
  key: number;
  floats: number;
}

function rowLayout(cfg: ModelConfig, layer: number): RowLayout {
  const csa = csaOf(cfg), l = csa.layers[layer], hd = cfg.headDim, ixd = csa.indexer.headDim;
  const cw = l.ratio ? (l.indexed ? 2 * hd : hd) : 0;
  const iw = l.indexed ? 2 * ixd : 0;
  const c = hd, z = c + cw, ic = z + cw, iz = ic + iw, floats = iz + iw;
  const entry = c + (l.indexed ? hd : 0), key = ic + ixd;
  return { kv: 0, c, z, cw, ic, iz, entry, key, floats };
}

/** Most compressed entries one query of layer `layer` attends to at `ctx` positions. */
function keptEntries(cfg: ModelConfig, layer: number, ctx: number): number {
  const csa = csaOf(cfg), l = csa.layers[layer];
  if (!l.ratio) return 0;
  const all = Math.floor(ctx / l.ratio);
  return l.indexed ? Math.min(all, csa.indexer.topK) : all;
}

/**
 * Bytes of each scratch region, in allocation order: q_a, q, attention output, projection
 * staging, indexer q, indexer weights, indexer scores, gathered keys, attention tiles, grouped
 * projection, low-rank output, unit norm weights, negated sin row, then the two RoPE tables.
 */
function regions(cfg: ModelConfig, layers: number[], ctx: number, maxBatch: number): number[] {
  const csa = csaOf(cfg), hd = cfg.headDim, H = cfg.numHeads, f = 4 * maxBatch;
  const ix = csa.indexer;
  const keys = csa.window + Math.max(0, ...layers.map((l) => keptEntries(cfg, l, ctx)));
  const stage = Math.max(hd, ...layers.map((l) => rowLayout(cfg, l).cw), 2 * ix.headDim);
  const G = csa.oGroups, R = csa.oLoraRank;
  const ratios = layers.map((l) => csa.layers[l].ratio).filter((r) => r > 0);
  const minRatio = ratios.length ? Math.min(...ratios) : 0;
  return [
    f * csa.qLoraRank,
    f * H * hd,
    f * H * hd,
    f * stage,
    f * ix.heads * ix.headDim,
    f * ix.heads,
    4 * (minRatio ? Math.min(Math.floor(ctx / minRatio), SCORE_TILE) : 1),
    4 * keys * hd,
    attentionScratchBytes(H, 1),
    f * G * G * R,
    f * G * R,
    4 * hd,
    4 * (cfg.rope.dim / 2),
    ropeTableBytes(cfg.rope, ctx),
    ropeTableBytes(csa.compressRope, ctx),
  ];
}

/** Bytes of layer `layer`'s cache at `ctx` positions. */
function stateBytes(cfg: ModelConfig, layer: number, ctx: number): number {
  return ctx * rowLayout(cfg, layer).floats * 4;
}

/** Compressed sparse attention of the layers that run it. */
class CsaAttention implements Mixer {
  #ops: Ops;
  #cfg: ModelConfig;
  #csa: CsaConfig;
  #maxCtx: number;
  #layers: number[];
  /** The selected sequence's cache of each layer (of #caches). */
  #cache: number[];
  #caches: PerSequence<number[]>;
  #rows: RowLayout[] = [];
  #qa: number;
  #q: number;
  #att: number;
  #stage: number;
  #iq: number;
  #iw: number;
  #scores: number;
  #keys: number;
  #attScratch: number;
  #keyCap: number;
  #grouped: number;
  #low: number;
  #ones: number;
  #negSin: number;
  #main: RopeTable;
  #compress: RopeTable;

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
    this.#csa = csaOf(cfg);
    this.#maxCtx = maxCtx;
    this.#layers = layers;
    for (const l of layers) this.#rows[l] = rowLayout(cfg, l);
    this.#caches = new PerSequence(sequences, (seq) => {
      const cache: number[] = [];
      for (const l of layers) {
        cache[l] = arena.alloc(stateName(`csa cache L${l}`, seq), stateBytes(cfg, l, maxCtx));
      }
      return cache;
    });
    this.#cache = this.#caches.current;
    const r = regions(cfg, layers, maxCtx, maxBatch);
    this.#qa = arena.alloc("csa q_a", r[0]);
    this.#q = arena.alloc("csa q", r[1]);
    this.#att = arena.alloc("csa heads out", r[2]);
    this.#stage = arena.alloc("csa projections", r[3]);
    this.#iq = arena.alloc("csa indexer q", r[4]);
    this.#iw = arena.alloc("csa indexer weights", r[5]);
    this.#scores = arena.alloc("csa indexer scores", r[6]);
    this.#keys = arena.alloc("csa gathered keys", r[7]);
    this.#keyCap = r[7] / (4 * cfg.headDim);
    this.#attScratch = arena.alloc("csa attention tiles", r[8]);
    this.#grouped = arena.alloc("csa grouped output", r[9]);
    this.#low = arena.alloc("csa low-rank output", r[10]);
    this.#ones = arena.alloc("csa unit weights", r[11]);
    ops.f32(this.#ones, cfg.headDim).fill(1);
    this.#negSin = arena.alloc("csa negated sin", r[12]);
    this.#main = buildRopeTable(arena, cfg.rope, maxCtx);
    this.#compress = buildRopeTable(arena, this.#csa.compressRope, maxCtx);
  }

  begin(pos: number, nb: number): void {
    if (pos + nb > this.#maxCtx) {
      throw new Error(
        `positions ${pos}..${pos + nb - 1} are beyond the context of ${this.#maxCtx}`,
      );
    }
  }

  select(seq: number): void {
    this.#caches.select(seq);
    this.#cache = this.#caches.current;
  }

  cacheRegions(): CacheRegion[] {
    return this.#layers.map((l) => ({
      offset: this.#cache[l],
      rowBytes: this.#rows[l].floats * 4,
    }));
  }

  /** Rotates the trailing rotary dims of `heads` vectors of `width` floats at `x` (table row `pos`). */
  #rope(x: number, heads: number, width: number, t: RopeTable, pos: number, back = false): void {
    const rd = this.#cfg.rope.dim;
    let [cos, sin] = ropeAt(t, pos);
    if (back) {
      this.#ops.copy(this.#negSin, sin, rd / 2);
      this.#ops.scale(this.#negSin, -1, rd / 2);
      sin = this.#negSin;
    }
    this.#ops.rope(x + (width - rd) * 4, heads, width, rd, cos, sin, true);
  }

  /**
   * Copies `n` floats of each of the `nb` staged rows from row `r0` into the selected sequence's
   * cache rows pos.. at float offset `off`.
   */
  #store(l: number, off: number, n: number, nb: number, pos: number, r0: number): void {
    const row = this.#rows[l].floats;
    for (let b = 0; b < nb; b++) {
      const at = this.#cache[l] + ((pos + b) * row + off) * 4;
      this.#ops.copy(at, this.#stage + (r0 + b) * n * 4, n);
    }
  }

  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void {
    this.#forward(layer, lw, h, out, [{ n: nb, pos }]);
  }

  /**
   * out = CSA(h) for the rows of several sequences, each on its own cache: the projections,
   * norms and output projections over all rows at once (each weight read once), RoPE, the cache
   * writes, the compressor, the indexer and attention per row on its sequence's cache.
   */
  forwardSpans(
    layer: number,
    lw: LayerWeights,
    h: number,
    out: number,
    spans: readonly SequenceSpan[],
  ): void {
    this.#forward(layer, lw, h, out, spans);
  }

  /** The rows of `spans` (one without `seq` is the selected sequence's), one after another. */
  #forward(
    layer: number,
    lw: LayerWeights,
    h: number,
    out: number,
    spans: readonly { seq?: number; n: number; pos: number }[],
  ): void {
    const ops = this.#ops, cfg = this.#cfg, csa = this.#csa;
    const spec = csa.layers[layer], rows = this.#rows[layer];
    const { numHeads: H, headDim: hd } = cfg;
    const eps = cfg.rmsNormEps, rope = spec.ratio ? this.#compress : this.#main;
    const ix = csa.indexer;
    const nb = spans.reduce((s, x) => s + x.n, 0);
    /** Runs `f` on each span with its first row, its sequence's cache selected. */
    const each = (f: (r0: number, n: number, pos: number) => void) => {
      let r0 = 0;
      for (const s of spans) {
        if (s.seq !== undefined) this.select(s.seq);
        f(r0, s.n, s.pos);
        r0 += s.n;
      }
    };
    ops.matmul({ w: lw.get("wq_a"), x: h, y: this.#qa, nb });
    ops.rmsnorm(this.#qa, lw.get("q_a_norm").ptr, this.#qa, csa.qLoraRank, nb, eps);
    ops.matmul({ w: lw.get("wq_b"), x: this.#qa, y: this.#q, nb });
    ops.rmsnorm(this.#q, this.#ones, this.#q, hd, nb * H, eps);
    ops.matmul({ w: lw.get("wkv"), x: h, y: this.#stage, nb });
    ops.rmsnorm(this.#stage, lw.get("kv_norm").ptr, this.#stage, hd, nb, eps);
    each((r0, n, pos) => {
      for (let b = r0; b < r0 + n; b++) {
        this.#rope(this.#q + b * H * hd * 4, H, hd, rope, pos + b - r0);
        this.#rope(this.#stage + b * hd * 4, 1, hd, rope, pos + b - r0);
      }
      this.#store(layer, rows.kv, hd, n, pos, r0);
    });
    const project = (t: LayerTensor, off: number, width: number) => {
      ops.matmul({ w: lw.get(t), x: h, y: this.#stage, nb });
      each((r0, n, pos) => this.#store(layer, off, width, n, pos, r0));
    };
    if (spec.ratio) {
      project("cmp_wkv", rows.c, rows.cw);
      project("cmp_wgate", rows.z, rows.cw);
    }
    if (spec.indexed) {
      project("idx_wkv", rows.ic, 2 * ix.headDim);
      project("idx_wgate", rows.iz, 2 * ix.headDim);
      ops.matmul({ w: lw.get("idx_wq_b"), x: this.#qa, y: this.#iq, nb });
      ops.matmul({ w: lw.get("idx_weights"), x: h, y: this.#iw, nb });
      ops.scale(this.#iw, 1 / Math.sqrt(ix.heads) / Math.sqrt(ix.headDim), nb * ix.heads);
    }
    const sinks = lw.get("sinks").ptr;
    each((r0, n, pos) => this.#attend(layer, lw, sinks, r0, n, pos));
    this.#output(lw, out, nb);
  }

  /** Attention of rows r0.. (positions pos..) of the pass on the selected sequence's cache. */
  #attend(
    layer: number,
    lw: LayerWeights,
    sinks: number,
    r0: number,
    nb: number,
    pos: number,
  ): void {
    const ops = this.#ops, cfg = this.#cfg, csa = this.#csa;
    const spec = csa.layers[layer], rows = this.#rows[layer], cache = this.#cache[layer];
    const { numHeads: H, headDim: hd } = cfg;
    const rope = spec.ratio ? this.#compress : this.#main;
    const ix = csa.indexer;
    for (let b = r0; b < r0 + nb; b++) {
      const p = pos + b - r0;
      if (spec.ratio && (p + 1) % spec.ratio === 0) this.#compressAt(layer, lw, p);
      // Keys: the window, then the kept entries (entry w lives in row w·r + r − 1).
      let n = 0;
      const gather = (src: number) => {
        ops.copy(this.#keys + n++ * hd * 4, src, hd);
      };
      for (let t = Math.max(0, p - csa.window + 1); t <= p; t++) {
        gather(cache + t * rows.floats * 4);
      }
      const count = spec.ratio ? Math.floor((p + 1) / spec.ratio) : 0;
      const entryAt = (w: number) =>
        cache + (((w + 1) * spec.ratio - 1) * rows.floats + rows.entry) * 4;
      let kept = Array.from({ length: count }, (_, w) => w);
      if (spec.indexed && count > ix.topK) {
        const iq = this.#iq + b * ix.heads * ix.headDim * 4;
        this.#rope(iq, ix.heads, ix.headDim, this.#compress, p);
        const stride = spec.ratio * rows.floats;
        const keys = cache + ((spec.ratio - 1) * rows.floats + rows.key) * 4;
        // A tile of entries at a time: the score buffer does not grow with the context.
        kept = topKTiled(count, ix.topK, SCORE_TILE, (from, n) => {
          const iw = this.#iw + b * ix.heads * 4;
          ops.csaIndexScores(
            iq,
            ix.heads,
            ix.headDim,
            iw,
            keys + from * stride * 4,
            stride,
            n,
            this.#scores,
          );
          return ops.f32(this.#scores, n);
        });
      }
      for (const w of kept) gather(entryAt(w));
      if (n > this.#keyCap) throw new Error(`csa: ${n} keys, room for ${this.#keyCap}`);
      const shape: AttentionShape = {
        nHeads: H,
        nKvHeads: 1,
        headDim: hd,
        vHeadDim: hd,
        kStride: hd,
        vStride: hd,
        scale: cfg.attnScale,
      };
      const o = this.#att + b * H * hd * 4;
      ops.attention({
        shape,
        q: this.#q + b * H * hd * 4,
        qStride: H * hd,
        k: this.#keys,
        v: this.#keys,
        out: o,
        outStride: H * hd,
        scratch: this.#attScratch,
        // The gathered keys stand at positions 0 .. n − 1, the query at the last.
        pos: n - 1,
        tokens: 1,
        sinks,
      });
      // The values carried RoPE at their positions: rotate the output back by the query's.
      this.#rope(o, H, hd, rope, p, true);
    }
  }

  /** out = wo_b(grouped wo_a(heads)) over the pass's `nb` rows. */
  #output(lw: LayerWeights, out: number, nb: number): void {
    const ops = this.#ops, cfg = this.#cfg, csa = this.#csa;
    const { numHeads: H, headDim: hd } = cfg;
    // Grouped output: group g's heads through rows g·R .. g·R + R − 1 of wo_a, then wo_b. Where
    // the format can be cut at every g·R, each group multiplies its own rows only (1/G of wo_a);
    // else all rows, keeping group g's.
    const G = csa.oGroups, R = csa.oLoraRank, woA = lw.get("wo_a");
    const blocks = Array.from({ length: G }, (_, g) => rowBlock(woA, g * R, R));
    if (blocks.every((w) => w !== null)) {
      ops.matmul(...Array.from({ length: nb * G }, (_, v) => ({
        w: blocks[v % G]!,
        x: this.#att + v * (H * hd / G) * 4,
        y: this.#low + v * R * 4,
        nb: 1,
      })));
    } else {
      ops.matmul({ w: woA, x: this.#att, y: this.#grouped, nb: nb * G });
      for (let v = 0; v < nb * G; v++) {
        ops.copy(this.#low + v * R * 4, this.#grouped + (v * G * R + (v % G) * R) * 4, R);
      }
    }
    ops.matmul({ w: lw.get("wo_b"), x: this.#low, y: out, nb });
  }

  /**
   * Emits the entry (and on CSA layers the indexer key) of the window that ends at `p`, into row
   * p's own projections (see {@link RowLayout}): the kernel reads each element of that slot once,
   * before it writes the same element.
   */
  #compressAt(layer: number, lw: LayerWeights, p: number): void {
    const ops = this.#ops, cfg = this.#cfg, spec = this.#csa.layers[layer];
    const rows = this.#rows[layer], cache = this.#cache[layer], r = spec.ratio;
    const w = (p + 1) / r - 1, row = cache + p * rows.floats * 4;
    const emit = (
      c: number,
      z: number,
      ape: LayerTensor,
      norm: LayerTensor,
      width: number,
      at: number,
    ) => {
      ops.csaCompress({
        rows: cache,
        rowFloats: rows.floats,
        cOff: c,
        zOff: z,
        ape: lw.get(ape).ptr,
        ratio: r,
        width,
        indexed: spec.indexed,
        w,
        out: row + at * 4,
      });
      ops.rmsnorm(row + at * 4, lw.get(norm).ptr, row + at * 4, width, 1, cfg.rmsNormEps);
      this.#rope(row + at * 4, 1, width, this.#compress, w * r);
    };
    emit(rows.c, rows.z, "cmp_ape", "cmp_norm", cfg.headDim, rows.entry);
    if (spec.indexed) {
      emit(rows.ic, rows.iz, "idx_ape", "idx_norm", this.#csa.indexer.headDim, rows.key);
    }
  }
}

/** Compressed sparse attention. */
export const CSA: MixerPart = {
  name: "csa",
  shape(cfg, t, layer) {
    const csa = csaOf(cfg), d = cfg.hiddenSize, hd = cfg.headDim, H = cfg.numHeads;
    const ix = csa.indexer, l = csa.layers[layer];
    const cw = l.indexed ? 2 * hd : hd;
    switch (t) {
      case "wq_a":
        return [csa.qLoraRank, d];
      case "q_a_norm":
        return [csa.qLoraRank];
      case "wq_b":
        return [H * hd, csa.qLoraRank];
      case "wkv":
        return [hd, d];
      case "kv_norm":
      case "cmp_norm":
        return [hd];
      case "wo_a":
        return [csa.oGroups * csa.oLoraRank, (H * hd) / csa.oGroups];
      case "wo_b":
        return [d, csa.oGroups * csa.oLoraRank];
      case "sinks":
        return [H];
      case "cmp_wkv":
      case "cmp_wgate":
        return [cw, d];
      case "cmp_ape":
        return [l.ratio, cw];
      case "idx_wq_b":
        return [ix.heads * ix.headDim, csa.qLoraRank];
      case "idx_weights":
        return [ix.heads, d];
      case "idx_wkv":
      case "idx_wgate":
        return [2 * ix.headDim, d];
      case "idx_ape":
        return [l.ratio, 2 * ix.headDim];
      case "idx_norm":
        return [ix.headDim];
    }
    throw new Error(`compressed sparse attention has no tensor ${t}`);
  },
  stateBytes: (cfg, layer, ctx) => stateBytes(cfg, layer, ctx),
  scratchBytes: (cfg, layers, ctx, maxBatch) => regionBytes(...regions(cfg, layers, ctx, maxBatch)),
  create: (ops, arena, cfg, layers, maxBatch, maxCtx, sequences) =>
    new CsaAttention(ops, arena, cfg, layers, maxBatch, maxCtx, sequences),
};
