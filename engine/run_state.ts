/**
 * The activation buffers of the layer skeleton, described once: engine/transformer.ts and
 * engine/ffn.ts allocate exactly these, and the planner (engine/planner.ts) sums them, so the
 * plan cannot drift from the allocations. The attention's state and scratch are its family's
 * (engine/models/family.ts: stateBytes, scratchFloats, persistentBytes), used the same way.
 *
 * @module
 */
import type { ModelConfig } from "../io/model_config.ts";

/** Rows of the widest gate/up of any FFN of the model: dense, routed expert or shared experts. */
export function ffnRows(cfg: ModelConfig): number {
  return Math.max(
    cfg.intermediateSize,
    cfg.moe?.expertIntermediate ?? 0,
    cfg.moe?.sharedIntermediate ?? 0,
  );
}

/**
 * Rows of logits the LM head writes per call: a prefill chunk needs only its last token's, and
 * a caller asking for every token's gets them in pieces of this many, so the buffer (vocab floats
 * a row) does not grow with the chunk.
 */
export const LOGIT_ROWS = 16;

/** Floats of each skeleton buffer for a batch of `maxBatch` tokens. */
export interface SkeletonBuffers {
  /** Each of the residual stream x, the normalised h and the sublayer output tmp. */
  hidden: number;
  /** The LM head's logits ({@link LOGIT_ROWS} rows at most). */
  logits: number;
  /** Each of the FFN's gate and up activations. */
  ffn: number;
  /** The MoE's gathered inputs of one expert. */
  gathered: number;
  /** Every routed expert's output of the batch, before the weighted sum. */
  expertOut: number;
  /** The router's logits. */
  routerLogits: number;
  /** Kimi K3's latent MoE: each of the projected expert input and the weighted sum (else 0). */
  latent: number;
  /** Kimi K3's Attention Residuals: block snapshots of at most this many blocks (else 0). */
  resBlocks: number;
  /** The snapshots [block][token][hidden], the mixed input, and the scores (else 0 each). */
  resSnapshots: number;
  resInput: number;
  resScores: number;
}

/** The skeleton's buffers for `maxBatch` tokens. */
export function skeletonBuffers(cfg: ModelConfig, maxBatch: number): SkeletonBuffers {
  const d = cfg.hiddenSize;
  const k3 = cfg.k3;
  // A snapshot at every layer L with L % size = 0.
  const blocks = k3 ? Math.ceil(cfg.numLayers / k3.attnResBlockSize) : 0;
  return {
    hidden: maxBatch * d,
    logits: Math.min(maxBatch, LOGIT_ROWS) * cfg.vocabSize,
    ffn: maxBatch * ffnRows(cfg),
    gathered: maxBatch * d,
    expertOut: maxBatch * (cfg.moe?.topK ?? 1) * d,
    routerLogits: maxBatch * (cfg.moe?.numExperts ?? 1),
    latent: k3 && cfg.moe ? maxBatch * k3.latentDim : 0,
    resBlocks: blocks,
    resSnapshots: blocks * maxBatch * d,
    resInput: k3 ? maxBatch * d : 0,
    resScores: k3 ? blocks + 1 : 0,
  };
}

/** Floats of all skeleton buffers: three hidden, two FFN and two latent, one of the others. */
export function skeletonFloats(cfg: ModelConfig, maxBatch: number): number {
  const b = skeletonBuffers(cfg, maxBatch);
  return 3 * b.hidden + 2 * b.ffn + b.gathered + b.expertOut + b.routerLogits + b.logits +
    2 * b.latent + b.resSnapshots + b.resInput + b.resScores;
}
