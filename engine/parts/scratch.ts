/**
 * What parts' scratch declarations are made of: the arena rounds every region up to a page, so a
 * part declares its regions' bytes through {@link regionBytes} and allocates exactly those.
 *
 * @module
 */
import { alignUp } from "../../io/format.ts";
import type { ModelConfig, RopeConfig } from "../../io/model_config.ts";
import { PAGE } from "../arena.ts";

/** Arena bytes of regions of these sizes (each rounded up to a page, as Arena.alloc does). */
export function regionBytes(...bytes: number[]): number {
  return bytes.reduce((s, b) => s + alignUp(Math.max(b, 1), PAGE), 0);
}

/** Arena bytes of a RoPE cos/sin table for `ctx` positions (engine/rope_table.ts). */
export function ropeTableBytes(rope: RopeConfig, ctx: number): number {
  const row = (rope.dim / 2) * 4;
  return regionBytes(ctx * row, ctx * row);
}

/** Tokens of a call whose attention scores are held at once (the kernels loop over the rest). */
export function scoreTokens(maxBatch: number): number {
  return Math.min(maxBatch, 8);
}

/** Bytes of the attention score scratch: {@link scoreTokens} rows of heads × ctx floats. */
export function scoreBytes(cfg: ModelConfig, ctx: number, maxBatch: number): number {
  return scoreTokens(maxBatch) * cfg.numHeads * ctx * 4;
}
