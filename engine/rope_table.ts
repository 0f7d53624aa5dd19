/**
 * Per-position cos/sin tables for RoPE, built once per model in the arena so that a token's
 * rotation is two table pointers.
 *
 * @module
 */
import type { Arena } from "./arena.ts";
import type { RopeConfig } from "../io/model_config.ts";
import { ropeAttentionFactor, ropeInvFreq } from "./reference/rope.ts";

/** cos and sin of every (position, frequency) pair up to `positions`. */
export interface RopeTable {
  cos: number;
  sin: number;
  /** Floats per position (rotated dims / 2). */
  half: number;
}

/** Builds the table for positions [0, positions). */
export function buildRopeTable(arena: Arena, rope: RopeConfig, positions: number): RopeTable {
  const inv = ropeInvFreq(rope);
  const half = inv.length;
  const mag = ropeAttentionFactor(rope);
  const cosOff = arena.alloc("rope cos", positions * half * 4);
  const sinOff = arena.alloc("rope sin", positions * half * 4);
  const cos = arena.f32(cosOff, positions * half);
  const sin = arena.f32(sinOff, positions * half);
  for (let p = 0; p < positions; p++) {
    for (let i = 0; i < half; i++) {
      const angle = p * inv[i];
      cos[p * half + i] = Math.cos(angle) * mag;
      sin[p * half + i] = Math.sin(angle) * mag;
    }
  }
  return { cos: cosOff, sin: sinOff, half };
}

/** Byte offsets of the cos and sin rows of position `pos`. */
export function ropeAt(t: RopeTable, pos: number): [number, number] {
  return [t.cos + pos * t.half * 4, t.sin + pos * t.half * 4];
}
