/**
 * Widening of any stored weight (plain or compact, docs/FORMAT.md) to float32 from its container
 * bytes: for round-trip tests, the quality report and reference forwards built from a container.
 * Each format decodes itself (its entry in engine/quant/mod.ts).
 *
 * @module
 */
import type { TensorEntry } from "../../io/container.ts";
import { findFormat } from "./mod.ts";

/**
 * The float32 values [rows × cols] of a stored tensor from its bytes `data`, its scale bytes and,
 * for vq3r, its codebooks (f32 [3][8][256], the codebooks.bin layout). Throws naming `what` when
 * a needed part is missing.
 */
export function decodeStored(
  entry: TensorEntry,
  data: Uint8Array,
  scale?: Uint8Array,
  codebooks?: Float32Array,
  what = "tensor",
): Float32Array {
  const f = findFormat(entry.dtype);
  if (!f) throw new Error(`${what}: cannot decode ${entry.dtype}`);
  const [rows, cols] = entry.shape;
  return f.decode(data, scale, rows, cols ?? 1, what, codebooks);
}
