/**
 * What parts' scratch declarations are made of: the arena rounds every region up to a page, so a
 * part declares its regions' bytes through {@link regionBytes} and allocates exactly those.
 *
 * @module
 */
import { alignUp } from "../../io/format.ts";
import type { RopeConfig } from "../../io/model_config.ts";
import { PAGE } from "../arena.ts";
import { ATTENTION_JOBS, ATTENTION_TOKENS, attentionJobFloats } from "../ops.ts";

/** Arena bytes of regions of these sizes (each rounded up to a page, as Arena.alloc does). */
export function regionBytes(...bytes: number[]): number {
  return bytes.reduce((s, b) => s + alignUp(Math.max(b, 1), PAGE), 0);
}

/** Arena bytes of a RoPE cos/sin table for `ctx` positions (engine/rope_table.ts). */
export function ropeTableBytes(rope: RopeConfig, ctx: number): number {
  const row = (rope.dim / 2) * 4;
  return regionBytes(ctx * row, ctx * row);
}

/**
 * Bytes of the attention scratch (engine/ops.ts `Ops.attention`) of calls of up to `maxBatch`
 * tokens of `nHeads` query heads: one slice per job of a dispatch, whatever the context, since
 * the kernel reads keys in tiles.
 */
export function attentionScratchBytes(nHeads: number, maxBatch: number): number {
  const jobs = Math.min(ATTENTION_JOBS, Math.ceil(maxBatch / ATTENTION_TOKENS));
  return jobs * attentionJobFloats(nHeads) * 4;
}
