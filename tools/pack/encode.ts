/**
 * Streams one checkpoint tensor in the dtype the container stores it in, in bounded chunks:
 * raw bytes when the dtype is kept, else decoded to float32 (FP8 with its block scales) and
 * re-encoded (f32, or bf16 rounded to nearest-even); and encodes whole float32 matrices in any
 * weight format through the format registry.
 *
 * @module
 */

import {
  decodeDtypeToF32,
  dequantFp8Blocks,
  fp8ScaleInfo,
  readF32,
} from "../../io/checkpoint_weights.ts";
import type { EncodedMatrix } from "../../engine/quant/format.ts";
import { findFormat } from "../../engine/quant/mod.ts";
import { encodeF32 } from "../../engine/quant/plain.ts";
import type { PlainDtype, StoredDtype } from "../../io/format.ts";
import { type Checkpoint, DTYPE_BYTES, type TensorInfo } from "../../io/safetensors.ts";
import { checkFiniteF32 } from "./finite.ts";

/** Checkpoint dtypes the packer accepts, and their container dtype when kept as is. */
export const KEPT_DTYPE: Record<string, PlainDtype> = {
  F32: "f32",
  F16: "f16",
  BF16: "bf16",
  F8_E4M3: "f8_e4m3",
};

/** The block scales of an FP8 weight as float32 bytes (what the container stores). */
export function scaleBytesF32(ckpt: Checkpoint, weight: TensorInfo): Uint8Array {
  const s = fp8ScaleInfo(ckpt, weight);
  const f = readF32(ckpt, s.name);
  checkFiniteF32(f, `${weight.file}: tensor ${s.name}`);
  return new Uint8Array(f.buffer, f.byteOffset, f.byteLength);
}

/**
 * Emits the bytes of tensor `src` converted to `dst` (a dtype other than its own; kept dtypes are
 * read in place, tools/pack/kept_reader.ts), in order, in pieces of at most about `chunkBytes`
 * (one row at least). The emitted views are only valid during the call.
 */
export function streamTensor(
  ckpt: Checkpoint,
  src: TensorInfo,
  dst: StoredDtype,
  chunkBytes: number,
  emit: (bytes: Uint8Array) => void,
): void {
  const what = `${src.file}: tensor ${src.name}`;
  const cols = src.shape.length ? src.shape[src.shape.length - 1] : 1;
  // Convert row by row: FP8 block scales are indexed by the absolute row.
  const srcRowBytes = cols * DTYPE_BYTES[src.dtype];
  const rows = srcRowBytes ? src.bytes / srcRowBytes : 0;
  const rowsPerChunk = Math.max(1, Math.floor(chunkBytes / Math.max(cols * 4, 1)));
  const scale = src.dtype === "F8_E4M3" ? readF32(ckpt, fp8ScaleInfo(ckpt, src).name) : null;
  for (let r0 = 0; r0 < rows; r0 += rowsPerChunk) {
    const n = Math.min(rowsPerChunk, rows - r0);
    const raw = new Uint8Array(n * srcRowBytes);
    ckpt.readRangeInto(src.name, r0 * srcRowBytes, raw);
    const f = scale
      ? dequantFp8Blocks(raw, n, cols, scale, r0)
      : decodeDtypeToF32(src.dtype, raw, what);
    checkFiniteF32(f, what, r0 * cols);
    emit(encodeF32(f, dst, what));
  }
}

/**
 * Encodes float32 `w` [rows, cols] as `dtype` with that format's encoder (engine/quant/mod.ts).
 * vq3r needs the trained codebooks ([3][256][8], engine/quant/vq3r.ts).
 */
export function encodeMatrix(
  w: Float32Array,
  rows: number,
  cols: number,
  dtype: StoredDtype,
  what: string,
  codebooks?: Float32Array,
): EncodedMatrix {
  checkFiniteF32(w, what);
  const f = findFormat(dtype);
  if (!f) throw new Error(`${what}: cannot encode float32 as ${dtype}`);
  return f.encode(w, rows, cols, what, codebooks);
}
