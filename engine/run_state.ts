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
import { type ModelConfig, mtpDraftLayerIds } from "../io/model_config.ts";
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

/**
 * Most rows the MTP layer runs at once: a pass's catch-up runs in pieces of this many, so its
 * scratch (and its room, lent by the expert cache) does not grow with the prefill chunk.
 */
export const MTP_ROWS = 16;

/** Rows the MTP layer's buffers and state are sized for, with passes of up to `maxBatch` rows. */
export function mtpRows(maxBatch: number): number {
  return Math.min(maxBatch, MTP_ROWS);
}

/**
 * Bytes of the MTP drafter's own buffers (engine/transformer.ts), in allocation order: the
 * hidden states it reads, and each row's [normed embedding; normed hidden state].
 */
export function mtpRegions(cfg: ModelConfig, maxBatch: number): [number, number] {
  const row = maxBatch * cfg.hiddenSize * 4;
  return [row, 2 * row];
}

/** The sizes of a model's run state for `ctx` positions and calls of up to `maxBatch` tokens. */
export interface RunStateSizes {
  /** Per layer: its mixer's per-sequence state (one arena region each); MTP layers last. */
  layerStateBytes: number[];
  /** Arena bytes of each part's scratch (`mtp`: the MTP layers' mixers and buffers). */
  scratch: { skeleton: number; residual: number; mixers: number; feedForward: number; mtp: number };
}

/** The run state every part declares; with `mtp`, the drafting MTP layer's too (`--spec mtp`). */
export function runStateSizes(
  cfg: ModelConfig,
  ctx: number,
  maxBatch: number,
  mtp = false,
): RunStateSizes {
  const extra = mtp ? mtpDraftLayerIds(cfg) : [];
  const rows = mtpRows(maxBatch);
  return {
    layerStateBytes: [
      ...mixerStateBytes(cfg, ctx, maxBatch),
      ...mixerStateBytes(cfg, ctx, rows, extra),
    ],
    scratch: {
      skeleton: regionBytes(...skeletonRegions(cfg, maxBatch)),
      residual: residualPartOf(cfg).scratchBytes(cfg, maxBatch),
      mixers: mixerScratchBytes(cfg, ctx, maxBatch),
      feedForward: feedForwardScratchBytes(cfg, maxBatch),
      mtp: extra.length
        ? mixerScratchBytes(cfg, ctx, rows, extra) + regionBytes(...mtpRegions(cfg, rows))
        : 0,
    },
  };
}
