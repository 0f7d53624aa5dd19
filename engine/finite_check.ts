/**
 * The per-step check that the logits are finite: a NaN or an infinity there would make greedy
 * decoding pick token 0 forever and sampling garbage, silently. The check is a scan of the logits
 * (microseconds beside a forward pass); only when it fails is the step run again with a probe on
 * every layer's hidden state (the wasm finite scan of kernels/finite.c), to name the layer where
 * the non-finite value first appears.
 *
 * @module
 */
import type { Model } from "./model.ts";

/** The exponent bits of an f32: all set in NaN and ±infinity. */
const F32_EXPONENT = 0x7f800000;

/** Whether `v` holds a NaN or an infinity. */
export function hasNonFinite(v: Float32Array): boolean {
  const u = new Uint32Array(v.buffer, v.byteOffset, v.length);
  for (let i = 0; i < u.length; i++) if ((u[i] & F32_EXPONENT) === F32_EXPONENT) return true;
  return false;
}

/**
 * Throws when `logits` (of `tokens` run at positions pos..) hold a NaN or an infinity, naming
 * the first layer whose hidden state is not finite when the step is run again. The re-run
 * rewrites the same KV cache rows; it counts as a forward call, so a session's prompt cache is
 * dropped after the error.
 */
export function checkLogits(
  model: Model,
  tokens: number[],
  pos: number,
  allLogits: boolean,
  logits: Float32Array,
  seq = 0,
): void {
  if (!hasNonFinite(logits)) return;
  const t = model.transformer;
  const find = model.pool.exports.find_all_ones as (
    p: bigint,
    n: number,
    w: number,
    mask: number,
  ) => number;
  let first = -1;
  t.layerProbe = (layer, x, n) => {
    if (first < 0 && find(BigInt(x), n, 4, F32_EXPONENT) < n) first = layer;
  };
  try {
    t.forwardBatch([{ seq, tokens, pos, allLogits }]);
  } catch {
    // The diagnosis is best effort: the error below says what is known.
  } finally {
    t.layerProbe = null;
  }
  const layers = model.cfg.numLayers;
  const where = first >= 0
    ? `the hidden state first turns NaN or infinite at layer ${first} (of 0..${layers - 1})`
    : `every layer's hidden state is finite, so it arises in the final norm or the LM head`;
  throw new Error(
    `${model.container.dir}: the logits at position ${pos + tokens.length - 1} hold NaN or ` +
      `infinity: ${where}; the output would be meaningless, so generation stops`,
  );
}
