/**
 * MXFP4 (OCP Microscaling v1.0, as gpt-oss ships it): along each row, blocks of 32 values share
 * one E8M0 scale byte e (2^(e − 127); e = 255 is NaN, so every element of that block decodes to
 * NaN); each value is an E2M1 code (sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3,
 * 4, 6 and negatives), two per byte, the even element in the low nibble.
 *
 * Stored as two arrays (kernel matvec_mxfp4): `blocks` [rows, cols/2] bytes (16 per block, a
 * row's blocks in order) and `scales` [rows, cols/32] bytes. cols must be a multiple of 32.
 *
 * @module
 */
import type { Decode, WeightFormat } from "./format.ts";
import { compactFormat, decodeNibbles, needScale, stored } from "./format.ts";
import { checkMatrixShape, roundHalfEven } from "./int8.ts";

/** E2M1 code (0..15) → value. */
export const E2M1_VALUES: readonly number[] = [
  0,
  0.5,
  1,
  1.5,
  2,
  3,
  4,
  6,
  -0,
  -0.5,
  -1,
  -1.5,
  -2,
  -3,
  -4,
  -6,
];

/** Largest E2M1 magnitude, and its exponent (emax of the element type). */
const E2M1_MAX = 6;
const E2M1_EMAX = 2;

/** E8M0 scale byte → 2^(e − 127); 255 → NaN. */
export function e8m0ToNumber(e: number): number {
  return e === 255 ? NaN : 2 ** (e - 127);
}

/** An MXFP4 matrix [rows, cols]. */
export interface Mxfp4Matrix {
  rows: number;
  cols: number;
  blocks: Uint8Array;
  scales: Uint8Array;
}

/** floor(log2(a)) exactly, for a finite a > 0. */
export function floorLog2(a: number): number {
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e--;
  else if (2 ** (e + 1) <= a) e++;
  return e;
}

/** |v| rounded to the nearest E2M1 magnitude code (0..7), ties to the even code, clamped to 6. */
function e2m1Magnitude(a: number): number {
  if (a >= E2M1_MAX) return 7;
  // Below 2 the grid step is 0.5 (codes 0..4), from 2 to 4 it is 1 (codes 4..6), then 4 → 6.
  if (a < 2) return roundHalfEven(a * 2);
  if (a < 4) return 4 + roundHalfEven(a - 2);
  return a > 5 ? 7 : 6; // 5 is a tie between 4 (code 6) and 6 (code 7): the even code wins
}

/** One value → E2M1 code, given the block's scale 2^shared. */
export function encodeE2M1(v: number, scale: number): number {
  const m = e2m1Magnitude(Math.abs(v) / scale);
  return v < 0 && m !== 0 ? m | 8 : m;
}

/**
 * Quantises f32 `w` [rows, cols] to MXFP4 as the OCP MX spec does: per block the shared exponent
 * is floor(log2(max|block|)) − 2 (E2M1's emax), clamped to the E8M0 range [−127, 127] (an
 * all-zero block gets scale byte 0); each element is v / 2^shared rounded to nearest-even E2M1,
 * clamped to ±6.
 */
export function quantizeMxfp4(w: Float32Array, rows: number, cols: number): Mxfp4Matrix {
  checkMatrixShape("quantizeMxfp4", w, rows, cols);
  if (cols % 32 !== 0) throw new Error(`quantizeMxfp4: cols ${cols} is not a multiple of 32`);
  const nb = cols / 32;
  const blocks = new Uint8Array((rows * cols) / 2);
  const scales = new Uint8Array(rows * nb);
  for (let r = 0; r < rows; r++) {
    for (let b = 0; b < nb; b++) {
      const base = r * cols + b * 32;
      let max = 0;
      for (let i = 0; i < 32; i++) max = Math.max(max, Math.abs(w[base + i]));
      if (!Number.isFinite(max)) {
        throw new Error(`quantizeMxfp4: row ${r} block ${b} holds NaN or Inf`);
      }
      const shared = max === 0 ? -127 : Math.max(-127, Math.min(127, floorLog2(max) - E2M1_EMAX));
      scales[r * nb + b] = shared + 127;
      const scale = 2 ** shared;
      for (let i = 0; i < 32; i += 2) {
        const lo = encodeE2M1(w[base + i], scale), hi = encodeE2M1(w[base + i + 1], scale);
        blocks[(base + i) / 2] = lo | (hi << 4);
      }
    }
  }
  return { rows, cols, blocks, scales };
}

/** Element (r, c) of an MXFP4 matrix, exactly. */
export function mxfp4At(m: Mxfp4Matrix, r: number, c: number): number {
  const byte = m.blocks[(r * m.cols + c) >> 1];
  const code = c % 2 === 0 ? byte & 15 : byte >> 4;
  return E2M1_VALUES[code] * e8m0ToNumber(m.scales[r * (m.cols / 32) + (c >> 5)]);
}

/** The f32 weights an MXFP4 matrix stands for (exact except below f32's range). */
export function dequantizeMxfp4(m: Mxfp4Matrix): Float32Array {
  const out = new Float32Array(m.rows * m.cols);
  for (let r = 0; r < m.rows; r++) {
    for (let c = 0; c < m.cols; c++) out[r * m.cols + c] = mxfp4At(m, r, c);
  }
  return out;
}

/** f32 values of mxfp4 bytes: E2M1 value of the nibble × 2^(its block's e8m0 − 127). */
const decodeMxfp4Bytes: Decode = (data, scale, rows, cols, what) => {
  const e8 = needScale(scale, "mxfp4", what);
  return decodeNibbles(data, rows, cols, (nib, g) => E2M1_VALUES[nib] * e8m0ToNumber(e8[g]));
};

/** The mxfp4 weight format: OCP MX FP4 (E2M1), one e8m0 scale per 32 columns (`--experts mxfp4`). */
export const MXFP4: WeightFormat = {
  ...compactFormat("mxfp4", "mxfp4", "q8", "matvec_mxfp4"),
  // Shipped MXFP4 (gpt-oss) times f32 activations: the Q8 copy's error flips gpt-oss's tokens.
  exactGemv: { kernel: "matvec_mxfp4_exact", scaled: true },
  // E2M1 × 2^k has at most 2 significant bits: bf16 holds every value exactly.
  exactGemm: { decode: "dequant_mxfp4_bf16", as: "bf16" },
  encode: (w, rows, cols) => stored(quantizeMxfp4(w, rows, cols), "blocks"),
  decode: decodeMxfp4Bytes,
};
