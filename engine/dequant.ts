/**
 * Widening stored weights to float32 in TypeScript, for the few places that need a float copy
 * (embedding rows, MLA's absorbed matrices built once at load). Hot-path matmuls never do this:
 * their kernels consume the stored format directly.
 *
 * @module
 */
import { decodeDtypeToF32, dequantFp8Blocks } from "../io/checkpoint_weights.ts";
import type { Arena } from "./arena.ts";
import type { TensorRef } from "./tensor.ts";

/** Container dtype → (safetensors dtype name, bytes per value) for the plain float formats. */
const PLAIN: Record<string, [string, number]> = {
  f32: ["F32", 4],
  bf16: ["BF16", 2],
  f16: ["F16", 2],
};

/** Rows [r0, r1) of a stored matrix as float32 (row-major, r1 − r0 rows of `cols`). */
export function rowsToF32(arena: Arena, w: TensorRef, r0: number, r1: number): Float32Array {
  const plain = PLAIN[w.dtype];
  if (plain) {
    const [name, size] = plain;
    return decodeDtypeToF32(name, arena.u8(w.ptr + r0 * w.cols * size, (r1 - r0) * w.cols * size));
  }
  if (w.dtype === "f8_e4m3" && w.scale !== undefined) {
    const all = dequantFp8Blocks(
      arena.u8(w.ptr, w.rows * w.cols),
      w.rows,
      w.cols,
      arena.f32(w.scale, Math.ceil(w.rows / 128) * Math.ceil(w.cols / 128)),
    );
    return all.subarray(r0 * w.cols, r1 * w.cols);
  }
  throw new Error(`cannot widen weights stored as ${w.dtype} to float32`);
}
