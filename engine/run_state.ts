/**
 * The run state of a model, declared once from its parts: each layer's per-sequence mixer state
 * (KV cache, latent rows, recurrent state and conv window), and the scratch of the skeleton, the
 * residual stream, every mixer kind and the feed-forward. The engine allocates exactly these
 * (engine/transformer.ts and engine/parts/), and the planner (engine/planner.ts), `plan`, the
 * prompt cache and saved sessions read the same numbers, so a plan cannot drift from the
 * allocations.
 *
 * @module
 */
import type { ModelConfig } from "../io/model_config.ts";
import { feedForwardScratchBytes } from "./parts/feed_forward.ts";
import { mixerScratchBytes, mixerStateBytes } from "./parts/mod.ts";
import { residualPartOf } from "./parts/residual.ts";
import { regionBytes } from "./parts/scratch.ts";

/**
 * Rows of logits the LM head writes per call: a prefill chunk needs only its last token's, and
 * a caller asking for every token's gets them in pieces of this many, so the buffer (vocab floats
 * a row) does not grow with the chunk.
 */
export const LOGIT_ROWS = 16;

/** Bytes of the skeleton's own buffers, in allocation order: the normed input h, the sublayer output, the logits. */
export function skeletonRegions(cfg: ModelConfig, maxBatch: number): [number, number, number] {
  const row = maxBatch * cfg.hiddenSize * 4;
  return [row, row, Math.min(maxBatch, LOGIT_ROWS) * cfg.vocabSize * 4];
}

/** The sizes of a model's run state for `ctx` positions and calls of up to `maxBatch` tokens. */
export interface RunStateSizes {
  /** Per layer: its mixer's per-sequence state (one arena region each). */
  layerStateBytes: number[];
  /** Arena bytes of each part's scratch. */
  scratch: { skeleton: number; residual: number; mixers: number; feedForward: number };
}

/** The run state every part declares. */
export function runStateSizes(cfg: ModelConfig, ctx: number, maxBatch: number): RunStateSizes {
  return {
    layerStateBytes: mixerStateBytes(cfg, ctx, maxBatch),
    scratch: {
      skeleton: regionBytes(...skeletonRegions(cfg, maxBatch)),
      residual: residualPartOf(cfg).scratchBytes(cfg, maxBatch),
      mixers: mixerScratchBytes(cfg, ctx, maxBatch),
      feedForward: feedForwardScratchBytes(cfg, maxBatch),
    },
  };
}
