/**
 * Encoders from float32 to the ggml tensor types the GGUF exporter writes: F32, F16, BF16 and
 * Q8_0. Rounding follows ggml's reference code (and gguf-py's numpy port), so a tensor encoded
 * here equals what llama.cpp's own converter writes for the same float32 input.
 *
 * @module
 */

import type { GgmlTypeName } from "./format.ts";

/** Elements in one Q8_0 block. */
export const Q8_0_BLOCK = 32;
/** Bytes of one Q8_0 block: an f16 scale and 32 int8 values. */
export const Q8_0_BLOCK_BYTES = 34;

const f32Scratch = new Float32Array(1);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

/** IEEE binary16 bits of a float32 value, rounded to nearest, ties to even (as numpy astype). */
export function f32ToF16Bits(value: number): number {
  f32Scratch[0] = value;
  const x = u32Scratch[0];
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  const man = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (man ? 0x200 | (man >>> 13) : 0);
  // Unbiased exponent; binary16 normals cover [-14, 15].
  const e = exp - 127;
  if (e > 15) return sign | 0x7c00;
  if (e >= -14) {
    // Drop 13 mantissa bits with round-to-nearest-even; a carry may bump the exponent (to inf).
    const bits = ((e + 15) << 10) | (man >>> 13);
    const rest = man & 0x1fff;
    const up = rest > 0x1000 || (rest === 0x1000 && (bits & 1) === 1) ? 1 : 0;
    return sign | (bits + up);
  }
  if (e < -25) return sign;
  // Subnormal: value = full / 2^24 with full the 24-bit significand shifted right.
  const full = man | 0x800000;
  const shift = -e - 14 + 13;
  const q = full >>> shift;
  const rest = full & ((1 << shift) - 1);
  const half = 1 << (shift - 1);
  const up = rest > half || (rest === half && (q & 1) === 1) ? 1 : 0;
  return sign | (q + up);
}

/** bfloat16 bits of a float32 value: nearest, ties to even; NaN stays a quiet NaN. */
export function f32ToBf16Bits(value: number): number {
  f32Scratch[0] = value;
  const b = u32Scratch[0];
  if ((b & 0x7fffffff) > 0x7f800000) return ((b >>> 16) | 0x40) & 0xffff;
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

function encodeF16(x: Float32Array): Uint8Array {
  const out = new Uint16Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = f32ToF16Bits(x[i]);
  return new Uint8Array(out.buffer);
}

function encodeBf16(x: Float32Array): Uint8Array {
  const out = new Uint16Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = f32ToBf16Bits(x[i]);
  return new Uint8Array(out.buffer);
}

/** Rounds half away from zero, like C's roundf. */
function roundHalfAway(v: number): number {
  return v < 0 ? -Math.floor(-v + 0.5) : Math.floor(v + 0.5);
}

/**
 * Q8_0: per block of 32, d = max|x| / 127 (float32), stored as f16; q = roundf(x · (1/d)) with
 * the unrounded float32 1/d, as ggml's quantize_row_q8_0_ref does. A zero block gets d = 0, q = 0.
 */
function encodeQ8_0(x: Float32Array, what: string): Uint8Array {
  if (x.length % Q8_0_BLOCK) {
    throw new Error(`${what}: ${x.length} values are not a whole number of Q8_0 blocks of 32`);
  }
  const blocks = x.length / Q8_0_BLOCK;
  const out = new Uint8Array(blocks * Q8_0_BLOCK_BYTES);
  const view = new DataView(out.buffer);
  const fr = Math.fround;
  for (let b = 0; b < blocks; b++) {
    const base = b * Q8_0_BLOCK;
    let amax = 0;
    for (let j = 0; j < Q8_0_BLOCK; j++) amax = Math.max(amax, Math.abs(x[base + j]));
    const d = fr(amax / 127);
    const id = d ? fr(1 / d) : 0;
    const o = b * Q8_0_BLOCK_BYTES;
    view.setUint16(o, f32ToF16Bits(d), true);
    for (let j = 0; j < Q8_0_BLOCK; j++) {
      view.setInt8(o + 2 + j, roundHalfAway(fr(x[base + j] * id)));
    }
  }
  return out;
}

/** Types {@link encodeTensor} can produce. */
export type EncodableType = Extract<GgmlTypeName, "F32" | "F16" | "BF16" | "Q8_0">;

/** Encodes float32 values (row-major, rows of dims[0]) as `type`; `what` names the tensor. */
export function encodeTensor(x: Float32Array, type: EncodableType, what: string): Uint8Array {
  switch (type) {
    case "F32":
      return new Uint8Array(x.buffer, x.byteOffset, x.byteLength);
    case "F16":
      return encodeF16(x);
    case "BF16":
      return encodeBf16(x);
    case "Q8_0":
      return encodeQ8_0(x, what);
  }
}
