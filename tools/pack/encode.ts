/**
 * Streams one checkpoint tensor in the dtype the container stores it in, in bounded chunks:
 * raw bytes when the dtype is kept, else decoded to float32 (FP8 with its block scales) and
 * re-encoded (f32, or bf16 rounded to nearest-even); and encodes whole float32 matrices in the
 * compact formats (mxfp4, int4g32, int8row, vq3r, vq4p, f8_e4m3).
 *
 * @module
 */

import {
  decodeDtypeToF32,
  dequantFp8Blocks,
  fp8ScaleInfo,
  readF32,
} from "../../io/checkpoint_weights.ts";
import { quantizeFp8b128 } from "../../engine/quant/fp8.ts";
import { quantizeInt4g32 } from "../../engine/quant/int4.ts";
import { quantizeInt8Row } from "../../engine/quant/int8.ts";
import { quantizeMxfp4 } from "../../engine/quant/mxfp4.ts";
import { encodeVq3r } from "../../engine/quant/vq3r.ts";
import { encodeVq4p } from "../../engine/quant/vq4p.ts";
import { type PlainDtype, STORED_DTYPE_BYTES, type StoredDtype } from "../../io/format.ts";
import { type Checkpoint, DTYPE_BYTES, type TensorInfo } from "../../io/safetensors.ts";

/** Checkpoint dtypes the packer accepts, and their container dtype when kept as is. */
export const KEPT_DTYPE: Record<string, PlainDtype> = {
  F32: "f32",
  F16: "f16",
  BF16: "bf16",
  F8_E4M3: "f8_e4m3",
};

/** Rounds float32 values to bf16 (nearest, ties to even; NaN stays NaN). */
export function f32ToBf16Bytes(x: Float32Array): Uint8Array {
  const bits = new Uint32Array(x.buffer, x.byteOffset, x.length);
  const out = new Uint16Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const b = bits[i];
    if ((b & 0x7fffffff) > 0x7f800000) out[i] = (b >>> 16) | 0x40;
    else out[i] = (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
  }
  return new Uint8Array(out.buffer);
}

function encodeF32(x: Float32Array, dst: StoredDtype, what: string): Uint8Array {
  if (dst === "f32") return new Uint8Array(x.buffer, x.byteOffset, x.byteLength);
  if (dst === "bf16") return f32ToBf16Bytes(x);
  throw new Error(`${what}: cannot convert to ${dst}`);
}

/** The block scales of an FP8 weight as float32 bytes (what the container stores). */
export function scaleBytesF32(ckpt: Checkpoint, weight: TensorInfo): Uint8Array {
  const s = fp8ScaleInfo(ckpt, weight);
  const f = readF32(ckpt, s.name);
  return new Uint8Array(f.buffer, f.byteOffset, f.byteLength);
}

/**
 * Emits the bytes of tensor `src` stored as `dst`, in order, in pieces of at most about
 * `chunkBytes` (one row at least). The emitted views are only valid during the call.
 */
export function streamTensor(
  ckpt: Checkpoint,
  src: TensorInfo,
  dst: StoredDtype,
  chunkBytes: number,
  emit: (bytes: Uint8Array) => void,
): void {
  const what = `${src.file}: tensor ${src.name}`;
  if (KEPT_DTYPE[src.dtype] === dst) {
    const step = Math.max(STORED_DTYPE_BYTES[dst as PlainDtype], chunkBytes - (chunkBytes % 8));
    const buf = new Uint8Array(Math.min(step, src.bytes));
    for (let at = 0; at < src.bytes; at += step) {
      const piece = buf.subarray(0, Math.min(step, src.bytes - at));
      ckpt.readRangeInto(src.name, at, piece);
      emit(piece);
    }
    return;
  }
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
    emit(encodeF32(f, dst, what));
  }
}

/** A matrix encoded in a container dtype: its bytes and, for scaled formats, its scale bytes. */
export interface EncodedMatrix {
  data: Uint8Array;
  scale: Uint8Array | null;
}

function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/**
 * Encodes float32 `w` [rows, cols] as `dtype`: plain dtypes as values, compact formats with the
 * quantisers of engine/quant (f8_e4m3 with 128×128 block scales). vq3r and vq4p need the trained
 * codebooks ([3][256][8] or [4][64][8], engine/quant/vq3r.ts, vq4p.ts); their rows are coded as if
 * zero-padded to 8.
 */
export function encodeMatrix(
  w: Float32Array,
  rows: number,
  cols: number,
  dtype: StoredDtype,
  what: string,
  codebooks?: Float32Array,
): EncodedMatrix {
  switch (dtype) {
    case "f32":
    case "bf16":
      return { data: encodeF32(w, dtype, what), scale: null };
    case "f8_e4m3": {
      const m = quantizeFp8b128(w, rows, cols);
      return { data: m.codes, scale: bytesOf(m.scales) };
    }
    case "mxfp4": {
      const m = quantizeMxfp4(w, rows, cols);
      return { data: m.blocks, scale: m.scales };
    }
    case "int4g32": {
      const m = quantizeInt4g32(w, rows, cols);
      return { data: bytesOf(m.packed), scale: bytesOf(m.scales) };
    }
    case "int8row": {
      const m = quantizeInt8Row(w, rows, cols);
      return { data: bytesOf(m.q), scale: bytesOf(m.scales) };
    }
    case "vq3r": {
      if (!codebooks) throw new Error(`${what}: vq3r needs trained codebooks`);
      const m = encodeVq3r({ data: w, rows, cols }, codebooks);
      return { data: m.indices, scale: bytesOf(m.scales) };
    }
    case "vq4p": {
      if (!codebooks) throw new Error(`${what}: vq4p needs trained codebooks`);
      const m = encodeVq4p({ data: w, rows, cols }, codebooks);
      return { data: m.indices, scale: bytesOf(m.scales) };
    }
    default:
      throw new Error(`${what}: cannot encode float32 as ${dtype}`);
  }
}
