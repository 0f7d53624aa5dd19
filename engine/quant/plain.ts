/**
 * The plain weight formats: f32, bf16 and f16, one element in whole bytes each, no scales. Pack
 * writes f32 and bf16 (bf16 rounded to nearest, ties to even); f16 is only kept as shipped.
 *
 * @module
 */
import { decodeDtypeToF32 } from "../../io/checkpoint_weights.ts";
import type { StoredDtype } from "../../io/format.ts";
import type { EncodedMatrix, WeightFormat } from "./format.ts";

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

/** Float32 values as the bytes of plain dtype `dst` (f32 or bf16). */
export function encodeF32(x: Float32Array, dst: StoredDtype, what: string): Uint8Array {
  if (dst === "f32") return new Uint8Array(x.buffer, x.byteOffset, x.byteLength);
  if (dst === "bf16") return f32ToBf16Bytes(x);
  throw new Error(`${what}: cannot convert to ${dst}`);
}

function plain(
  id: "f32" | "bf16" | "f16",
  checkpointDtype: string,
  option: string | undefined,
  gemm: string | undefined,
): WeightFormat {
  return {
    id,
    option,
    lossy: false,
    input: "f32",
    gemv: { kernel: `gemv_${id}`, scaled: false },
    gemm,
    encode(w, _rows, _cols, what): EncodedMatrix {
      if (id === "f16") throw new Error(`${what}: cannot encode float32 as ${id}`);
      return { data: encodeF32(w, id, what), scale: null };
    },
    decode: (data, _scale, _rows, _cols, what) => decodeDtypeToF32(checkpointDtype, data, what),
  };
}

/** float32. */
export const F32: WeightFormat = plain("f32", "F32", "f32", "gemm_f32");
/** bfloat16. */
export const BF16: WeightFormat = plain("bf16", "BF16", "bf16", "gemm_bf16");
/** IEEE half precision, as some checkpoints ship it. */
export const F16: WeightFormat = plain("f16", "F16", undefined, undefined);
