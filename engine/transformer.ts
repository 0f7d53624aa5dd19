/**
 * The forward pass, top to bottom: embedding, then per layer a mixer and a feed-forward, each on
 * its normed input from the residual stream and added back into it, then the final norm and the
 * LM head. A layer is made of parts (engine/parts/): the residual stream (plain, or Attention
 * Residuals), the layer's mixer (grouped-query, latent or linear attention, by `mixerOf`) and
 * the feed-forward (dense or MoE, by `layerKinds`). Which parts a model runs is its config's; this
 * loop names none of them. A config may soft-cap the final logits (`logitSoftcap`).
 *
 * A pass may hold the rows of several sequences (continuous batching, engine/batch.ts): each
 * sequence's rows run the mixers on that sequence's own state, while the residual stream, the
 * norms and the feed-forward run over all rows at once, so each expert is read once for the
 * batch. Every step but attention treats rows independently, so a sequence's logits do not depend
 * on what else is in the pass.
 *
 * @module
 */
import type { GlobalTensor, ModelConfig } from "../io/model_config.ts";
import type { Arena } from "./arena.ts";
import { embedRows } from "./embedding.ts";
import type { Ops } from "./ops.ts";
import { FeedForward, type MoeObserver } from "./parts/feed_forward.ts";
import type { CacheRegion, StateRegion } from "./parts/mixer.ts";
import { LayerMixers } from "./parts/mod.ts";
import { residualPartOf, type ResidualStream } from "./parts/residual.ts";
import { LOGIT_ROWS, skeletonRegions } from "./run_state.ts";
import type { TensorRef } from "./tensor.ts";
import type { Timeline } from "./stream/timeline.ts";
import type { ExpertSource, TrunkSource } from "./weights.ts";

export type { CacheRegion, MoeObserver, StateRegion };

/** Weights that stay in the arena for the whole run. */
export interface GlobalWeights {
  embed: TensorRef;
  finalNorm: TensorRef;
  lmHead: TensorRef;
  /** Any global tensor of the model by name (a residual stream's own, for one). */
  get(t: GlobalTensor): TensorRef;
}

/** What a forward pass needs. */
export interface TransformerParts {
  cfg: ModelConfig;
  arena: Arena;
  ops: Ops;
  trunk: TrunkSource;
  experts: ExpertSource;
  globals: GlobalWeights;
  maxBatch: number;
  maxCtx: number;
  /** Sequences whose mixer state the arena holds (default 1). */
  sequences?: number;
  /** Marks where each pass's time goes (engine/stream/timeline.ts); off when absent. */
  timeline?: Timeline;
}

/** One sequence's rows of a pass: `tokens` at positions pos.. on sequence `seq`'s state. */
export interface SequenceRows {
  /** Whose mixer state the rows run on (0 ≤ seq < sequences). */
  seq: number;
  tokens: number[];
  pos: number;
  /** Logits of every token rather than of the last. */
  allLogits?: boolean;
}

/** A model's forward pass over its arena. */
export class Transformer {
  readonly cfg: ModelConfig;
  #p: TransformerParts;
  #stream: ResidualStream;
  #mixers: LayerMixers;
  #ffn: FeedForward;
  #h: number;
  #tmp: number;
  #logits: number;
  #calls = 0;
  /** Per sequence: passes that ran rows on its state. */
  #writes: number[];

  constructor(p: TransformerParts) {
    this.#p = p;
    this.cfg = p.cfg;
    const { cfg, ops, arena, maxBatch } = p;
    this.#stream = residualPartOf(cfg).create(ops, arena, cfg, (t) => p.globals.get(t), maxBatch);
    this.#writes = new Array(p.sequences ?? 1).fill(0);
    this.#mixers = new LayerMixers(ops, arena, cfg, maxBatch, p.maxCtx, this.#writes.length);
    this.#ffn = new FeedForward(ops, arena, cfg, p.experts, maxBatch, p.timeline);
    const [h, tmp, logits] = skeletonRegions(cfg, maxBatch);
    this.#h = arena.alloc("hidden h", h);
    this.#tmp = arena.alloc("hidden tmp", tmp);
    this.#logits = arena.alloc("logits", logits);
  }

  /** The pass's timeline, when the run keeps one. */
  get timeline(): Timeline | undefined {
    return this.#p.timeline;
  }

  /** Observers of MoE routing (may be empty). */
  get moeObservers(): MoeObserver[] {
    return this.#ffn.observers;
  }

  /** Sequence `seq`'s position-indexed caches (see {@link Mixer.cacheRegions}). */
  cacheRegions(seq = 0): CacheRegion[] {
    this.#mixers.select(seq);
    return this.#mixers.cacheRegions();
  }

  /** Sequence `seq`'s recurrent states (see {@link Mixer.stateRegions}). */
  stateRegions(seq = 0): StateRegion[] {
    this.#mixers.select(seq);
    return this.#mixers.stateRegions();
  }

  /** Declares sequence `seq`'s restored recurrent states to be at position `pos`. */
  resumeAt(pos: number, seq = 0): void {
    this.#mixers.select(seq);
    this.#mixers.resumeAt(pos);
  }

  /** Forward calls so far. */
  get calls(): number {
    return this.#calls;
  }

  /**
   * Passes so far that ran rows on sequence `seq`'s state: a prompt cache knows by it whether
   * anyone else wrote that sequence's KV cache.
   */
  writes(seq = 0): number {
    return this.#writes[seq] ?? 0;
  }

  /** Sequences whose state the arena holds. */
  get sequences(): number {
    return this.#writes.length;
  }

  /** Most tokens one call may take. */
  get maxBatch(): number {
    return this.#p.maxBatch;
  }

  /** Diagnosis only (engine/finite_check.ts): sees each layer's output `x` of `n` floats. */
  layerProbe: ((layer: number, x: number, n: number) => void) | null = null;

  /**
   * Runs `tokens` at positions pos..pos+n−1 and returns the logits of the last token, or of every
   * token when `allLogits` (n × vocab floats). The returned array is a copy.
   */
  forward(tokens: number[], pos: number, allLogits = false): Float32Array {
    return this.forwardBatch([{ seq: 0, tokens, pos, allLogits }])[0];
  }

  /**
   * Runs one pass over the rows of several sequences (each sequence at most once) and returns,
   * per sequence in order, the logits of its last token, or of every token when `allLogits`.
   * A sequence's logits are those of running its rows alone.
   */
  forwardBatch(batch: readonly SequenceRows[]): Float32Array[] {
    const { cfg, arena, ops, trunk, globals } = this.#p;
    const tokens = batch.flatMap((r) => r.tokens);
    const nb = tokens.length;
    const d = cfg.hiddenSize;
    const eps = cfg.rmsNormEps;
    // Qwen3-Next / Qwen3.5: every skeleton norm scales by (1 + w).
    const unit = cfg.normUnitOffset;
    if (batch.some((r) => r.tokens.length < 1) || nb < 1 || nb > this.maxBatch) {
      throw new Error(`forward: ${nb} tokens, at most ${this.maxBatch}`);
    }
    const seqs = new Set(batch.map((r) => r.seq));
    if (seqs.size < batch.length) throw new Error("forward: a sequence appears twice in one pass");
    for (const r of batch) {
      this.#mixers.select(r.seq);
      this.#mixers.begin(r.pos, r.tokens.length);
    }
    this.#calls++;
    for (const s of seqs) this.#writes[s]++;
    const positions = batch.flatMap((r) => r.tokens.map((_, i) => r.pos + i));
    const spans = batch.map((r) => ({ seq: r.seq, n: r.tokens.length, pos: r.pos }));
    const stream = this.#stream, h = this.#h, tmp = this.#tmp;
    embedRows(arena, globals.embed, tokens, stream.x);
    stream.start(nb);
    const timeline = this.#p.timeline;
    for (let layer = 0; layer < cfg.numLayers; layer++) {
      timeline?.mark("wait", layer);
      const lw = trunk.acquire(layer);
      timeline?.mark("mixer", layer);
      ops.rmsnorm(
        stream.input("mixer", layer, lw, nb),
        lw.get("attn_norm").ptr,
        h,
        d,
        nb,
        eps,
        unit,
      );
      // Attention is per sequence: each one's rows on its own state.
      this.#mixers.forwardSpans(layer, lw, h, tmp, spans);
      stream.add("mixer", layer, tmp, nb);
      const x = stream.input("ffn", layer, lw, nb);
      ops.rmsnorm(x, lw.get("ffn_norm").ptr, h, d, nb, eps, unit);
      this.#ffn.forward(layer, lw, h, x, tmp, nb, positions, tokens);
      stream.add("ffn", layer, tmp, nb);
      this.layerProbe?.(layer, stream.x, nb * d);
      trunk.release(layer);
    }
    timeline?.mark("tail", -1);
    // The rows whose logits are asked for, gathered to the front of h after the final norm.
    const picked: number[] = [];
    let end = 0;
    for (const r of batch) {
      end += r.tokens.length;
      for (let i = r.allLogits ? end - r.tokens.length : end - 1; i < end; i++) picked.push(i);
    }
    const first = batch.length === 1 ? picked[0] : 0;
    ops.rmsnorm(stream.output(first, nb), globals.finalNorm.ptr, h, d, nb - first, eps, unit);
    // Each row moves to a lower or equal row no later row is read from.
    picked.forEach((r, i) =>
      r - first !== i && ops.copy(h + i * d * 4, h + (r - first) * d * 4, d)
    );
    const rows = picked.length;
    const vocab = cfg.vocabSize;
    const logits = new Float32Array(rows * vocab);
    for (let r0 = 0; r0 < rows; r0 += LOGIT_ROWS) {
      const n = Math.min(LOGIT_ROWS, rows - r0);
      ops.matmul({ w: globals.lmHead, x: h + r0 * d * 4, y: this.#logits, nb: n });
      if (cfg.logitSoftcap) ops.softcap(this.#logits, n * vocab, cfg.logitSoftcap);
      logits.set(ops.f32(this.#logits, n * vocab), r0 * vocab);
    }
    let at = 0;
    return batch.map((r) => {
      const n = r.allLogits ? r.tokens.length : 1;
      at += n;
      return logits.subarray((at - n) * vocab, at * vocab);
    });
  }
}
