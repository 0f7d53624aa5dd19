/**
 * Token embedding lookup: copies rows of the (resident) embedding table into the hidden state,
 * widening stored formats to f32. A few KiB per token, so plain TypeScript.
 *
 * @module
 */
import type { Arena } from "./arena.ts";
import { rowsToF32 } from "./dequant.ts";
import type { TensorRef } from "./tensor.ts";

/** Writes the embedding rows of `tokens` to consecutive f32 rows at `dst`. */
export function embedRows(arena: Arena, table: TensorRef, tokens: number[], dst: number): void {
  const d = table.cols;
  const out = arena.f32(dst, tokens.length * d);
  tokens.forEach((t, i) => {
    if (!Number.isInteger(t) || t < 0 || t >= table.rows) {
      throw new Error(`token id ${t} outside the vocabulary (0..${table.rows - 1})`);
    }
    out.set(rowsToF32(arena, table, t, t + 1), i * d);
  });
}
