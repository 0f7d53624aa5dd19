/**
 * The forward pass, top to bottom: embedding, then per layer attention and FFN with residual
 * adds, then the final norm and the LM head. What differs between families is the attention
 * (engine/models/); everything else is here once. Kimi K3 replaces the plain residual stream by
 * Attention Residuals: the stream is cut into blocks of layers, a snapshot of it is kept at each
 * block start, and the attention and MLP inputs (and the final norm's) are softmax-weighted mixes
 * of the snapshots and the running sum of the current block.
 *
 * @module
 */
import type { Arena } from "./arena.ts";
import { embedRows } from "./embedding.ts";
import { FeedForward } from "./ffn.ts";
import type { ModelConfig } from "../io/model_config.ts";
import type { Ops } from "./ops.ts";
import { LOGIT_ROWS, skeletonBuffers } from "./run_state.ts";
import type { Route } from "./routing.ts";
import type { TensorRef } from "./tensor.ts";
import type { ExpertSource, LayerWeights, TrunkSource } from "./weights.ts";

/** The attention half of a layer, as each family implements it. */
export interface Attention {
  /** out = attention(h) for `nb` tokens at positions pos..pos+nb−1; appends to the KV cache. */
  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void;
  /**
   * Called once per forward pass before any layer runs: a recurrent state (KDA) refuses a
   * position it cannot continue from here, before any cache or state changes.
   */
  begin?(pos: number, nb: number): void;
  /** The position-indexed caches (arena offset, bytes per position): what a saved session holds. */
  cacheRegions(): CacheRegion[];
  /**
   * Recurrent state (KDA): fixed-size regions that carry the whole past, saved whole by a saved
   * session. A model with any cannot rewind: a prompt cache reuses it only to its very end.
   */
  stateRegions?(): StateRegion[];
  /** Declares the recurrent state written back into the arena to be at position `pos`. */
  resumeAt?(pos: number): void;
}

/** One fixed-size recurrent state in the arena. */
export interface StateRegion {
  offset: number;
  bytes: number;
}

/** One position-indexed cache in the arena: position p's row is at offset + p × rowBytes. */
export interface CacheRegion {
  offset: number;
  rowBytes: number;
}

/** Weights that stay in the arena for the whole run. */
export interface GlobalWeights {
  embed: TensorRef;
  finalNorm: TensorRef;
  lmHead: TensorRef;
  /** Kimi K3: the norm and projection of the model-level Attention Residual. */
  outRes?: { norm: TensorRef; proj: TensorRef };
}

/**
 * Watches the MoE layers: called once per MoE layer and forward call when the layer's experts are
 * chosen (their reads queued, none computed yet), with the routes of the batch (tokens at
 * positions pos..) and `h`, the layer's normalised MoE input. The one hook of a run: the trace,
 * the hot-list counts and the lookahead all watch through it (engine/observers.ts).
 */
export type MoeObserver = (
  layer: number,
  routes: Route[],
  h: number,
  nb: number,
  pos: number,
) => void;

/** What a forward pass needs. */
export interface TransformerParts {
  cfg: ModelConfig;
  arena: Arena;
  ops: Ops;
  trunk: TrunkSource;
  experts: ExpertSource;
  globals: GlobalWeights;
  attention: Attention;
  maxBatch: number;
}

/** A model's forward pass over its arena. */
export class Transformer {
  readonly cfg: ModelConfig;
  #p: TransformerParts;
  #ffn: FeedForward;
  #x: number;
  #h: number;
  #tmp: number;
  #logits: number;
  #calls = 0;
  /** Attention Residuals: block snapshots [block][token][d], the mixed input, score scratch. */
  #res: { blocks: number; out: number; scores: number } | null = null;

  constructor(p: TransformerParts) {
    this.#p = p;
    this.cfg = p.cfg;
    this.#ffn = new FeedForward(p.ops, p.arena, p.cfg, p.experts, p.maxBatch);
    const b = skeletonBuffers(p.cfg, p.maxBatch);
    this.#x = p.arena.alloc("hidden x", b.hidden * 4);
    this.#h = p.arena.alloc("hidden h", b.hidden * 4);
    this.#tmp = p.arena.alloc("hidden tmp", b.hidden * 4);
    this.#logits = p.arena.alloc("logits", b.logits * 4);
    if (b.resBlocks) {
      this.#res = {
        blocks: p.arena.alloc("attn-res blocks", b.resSnapshots * 4),
        out: p.arena.alloc("attn-res input", b.resInput * 4),
        scores: p.arena.alloc("attn-res scores", b.resScores * 4),
      };
    }
  }

  /**
   * The Attention Residual of tokens first..nb−1 over the first `n` block snapshots and the
   * running sum `x`, with the norm and projection `wn`, `wp`; returns the mixed inputs' offset.
   */
  #attnRes(x: number, n: number, wn: TensorRef, wp: TensorRef, first: number, nb: number): number {
    const res = this.#res!;
    const d = this.cfg.hiddenSize;
    for (let b = first; b < nb; b++) {
      this.#p.ops.attnRes({
        blocks: res.blocks + b * d * 4,
        n: n + 1,
        stride: this.#p.maxBatch * d,
        last: x + b * d * 4,
        wn: wn.ptr,
        wp: wp.ptr,
        out: res.out + b * d * 4,
        scores: res.scores,
        d,
        eps: this.cfg.rmsNormEps,
      });
    }
    return res.out;
  }

  /** Observers of MoE routing (may be empty). */
  get moeObservers(): MoeObserver[] {
    return this.#ffn.observers;
  }

  /** The attention caches, in layer order (see {@link Attention.cacheRegions}). */
  cacheRegions(): CacheRegion[] {
    return this.#p.attention.cacheRegions();
  }

  /** The recurrent states, in layer order (see {@link Attention.stateRegions}). */
  stateRegions(): StateRegion[] {
    return this.#p.attention.stateRegions?.() ?? [];
  }

  /** Declares restored recurrent states to be at position `pos` (see {@link Attention.resumeAt}). */
  resumeAt(pos: number): void {
    this.#p.attention.resumeAt?.(pos);
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
    const { cfg, arena, ops, trunk, globals, attention } = this.#p;
    const nb = tokens.length;
    const d = cfg.hiddenSize;
    const eps = cfg.rmsNormEps;
    if (nb < 1 || nb > this.maxBatch) {
      throw new Error(`forward: ${nb} tokens, at most ${this.maxBatch}`);
    }
    const x = this.#x, h = this.#h, tmp = this.#tmp;
    const res = this.#res;
    attention.begin?.(pos, nb);
    embedRows(arena, globals.embed, tokens, x);
    // Attention Residuals: x is the running sum of the current block; `blocks` snapshots taken.
    let blocks = 0;
    for (let layer = 0; layer < cfg.numLayers; layer++) {
      const lw = trunk.acquire(layer);
      let attnIn = x, mlpIn = x, restart = false;
      if (res) {
        if (blocks > 0) {
          attnIn = this.#attnRes(
            x,
            blocks,
            lw.get("attn_res_norm"),
            lw.get("attn_res_proj"),
            0,
            nb,
          );
        }
        if (layer % cfg.k3!.attnResBlockSize === 0) {
          ops.copy(res.blocks + blocks * this.maxBatch * d * 4, x, nb * d);
          blocks++;
          restart = true;
        }
      }
      ops.rmsnorm(attnIn, lw.get("attn_norm").ptr, h, d, nb, eps);
      attention.forward(layer, lw, h, tmp, nb, pos);
      if (restart) ops.copy(x, tmp, nb * d);
      else ops.add(x, tmp, nb * d);
      if (res) {
        mlpIn = this.#attnRes(x, blocks, lw.get("mlp_res_norm"), lw.get("mlp_res_proj"), 0, nb);
      }
      ops.rmsnorm(mlpIn, lw.get("ffn_norm").ptr, h, d, nb, eps);
      if (cfg.layerKinds[layer] === "moe") {
        this.#ffn.moe(layer, lw, h, tmp, nb, pos);
      } else {
        this.#ffn.dense(lw, h, tmp, nb);
      }
      ops.add(x, tmp, nb * d);
      this.layerProbe?.(layer, x, nb * d);
      trunk.release(layer);
    }
    const first = allLogits ? 0 : nb - 1;
    const rows = nb - first;
    const out = res && globals.outRes
      ? this.#attnRes(x, blocks, globals.outRes.norm, globals.outRes.proj, first, nb)
      : x;
    ops.rmsnorm(out + first * d * 4, globals.finalNorm.ptr, h, d, rows, eps);
    const vocab = cfg.vocabSize;
    const logits = new Float32Array(rows * vocab);
    for (let r0 = 0; r0 < rows; r0 += LOGIT_ROWS) {
      const n = Math.min(LOGIT_ROWS, rows - r0);
      ops.matmul({ w: globals.lmHead, x: h + r0 * d * 4, y: this.#logits, nb: n });
      logits.set(ops.f32(this.#logits, n * vocab), r0 * vocab);
    }
    return logits;
  }
}
