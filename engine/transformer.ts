/**
 * The forward pass, top to bottom: embedding, then per layer a mixer and a feed-forward, each on
 * its normed input from the residual stream and added back into it, then the final norm and the
 * LM head. A layer is made of parts (engine/parts/): the residual stream (plain, or Attention
 * Residuals), the layer's mixer (grouped-query, latent or linear attention, by `mixerOf`) and
 * the feed-forward (dense or MoE, by `layerKinds`). Which parts a model runs is its config's; this
 * loop names none of them. A config may soft-cap the final logits (`logitSoftcap`).
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

  constructor(p: TransformerParts) {
    this.#p = p;
    this.cfg = p.cfg;
    const { cfg, ops, arena, maxBatch } = p;
    this.#stream = residualPartOf(cfg).create(ops, arena, cfg, (t) => p.globals.get(t), maxBatch);
    this.#mixers = new LayerMixers(ops, arena, cfg, maxBatch, p.maxCtx);
    this.#ffn = new FeedForward(ops, arena, cfg, p.experts, maxBatch);
    const [h, tmp, logits] = skeletonRegions(cfg, maxBatch);
    this.#h = arena.alloc("hidden h", h);
    this.#tmp = arena.alloc("hidden tmp", tmp);
    this.#logits = arena.alloc("logits", logits);
  }

  /** Observers of MoE routing (may be empty). */
  get moeObservers(): MoeObserver[] {
    return this.#ffn.observers;
  }

  /** The mixers' position-indexed caches (see {@link Mixer.cacheRegions}). */
  cacheRegions(): CacheRegion[] {
    return this.#mixers.cacheRegions();
  }

  /** The mixers' recurrent states (see {@link Mixer.stateRegions}). */
  stateRegions(): StateRegion[] {
    return this.#mixers.stateRegions();
  }

  /** Declares restored recurrent states to be at position `pos`. */
  resumeAt(pos: number): void {
    this.#mixers.resumeAt(pos);
  }

  /** Forward calls so far: a prompt cache knows by it whether anyone else wrote the KV cache. */
  get calls(): number {
    return this.#calls;
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
    this.#calls++;
    const { cfg, arena, ops, trunk, globals } = this.#p;
    const nb = tokens.length;
    const d = cfg.hiddenSize;
    const eps = cfg.rmsNormEps;
    // Qwen3-Next / Qwen3.5: every skeleton norm scales by (1 + w).
    const unit = cfg.normUnitOffset;
    if (nb < 1 || nb > this.maxBatch) {
      throw new Error(`forward: ${nb} tokens, at most ${this.maxBatch}`);
    }
    const stream = this.#stream, h = this.#h, tmp = this.#tmp;
    this.#mixers.begin(pos, nb);
    embedRows(arena, globals.embed, tokens, stream.x);
    stream.start(nb);
    for (let layer = 0; layer < cfg.numLayers; layer++) {
      const lw = trunk.acquire(layer);
      ops.rmsnorm(
        stream.input("mixer", layer, lw, nb),
        lw.get("attn_norm").ptr,
        h,
        d,
        nb,
        eps,
        unit,
      );
      this.#mixers.forward(layer, lw, h, tmp, nb, pos);
      stream.add("mixer", layer, tmp, nb);
      const x = stream.input("ffn", layer, lw, nb);
      ops.rmsnorm(x, lw.get("ffn_norm").ptr, h, d, nb, eps, unit);
      this.#ffn.forward(layer, lw, h, x, tmp, nb, pos, tokens);
      stream.add("ffn", layer, tmp, nb);
      this.layerProbe?.(layer, stream.x, nb * d);
      trunk.release(layer);
    }
    const first = allLogits ? 0 : nb - 1;
    const rows = nb - first;
    ops.rmsnorm(stream.output(first, nb), globals.finalNorm.ptr, h, d, rows, eps, unit);
    const vocab = cfg.vocabSize;
    const logits = new Float32Array(rows * vocab);
    for (let r0 = 0; r0 < rows; r0 += LOGIT_ROWS) {
      const n = Math.min(LOGIT_ROWS, rows - r0);
      ops.matmul({ w: globals.lmHead, x: h + r0 * d * 4, y: this.#logits, nb: n });
      if (cfg.logitSoftcap) ops.softcap(this.#logits, n * vocab, cfg.logitSoftcap);
      logits.set(ops.f32(this.#logits, n * vocab), r0 * vocab);
    }
    return logits;
  }
}
