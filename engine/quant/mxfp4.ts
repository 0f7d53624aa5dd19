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
import { checkMatrixShape } from "./int8.ts";

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

/** The exponent of E2M1's largest magnitude, 6 (emax of the element type). */
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

/**
 * E2M1 magnitude code (0..7) of a = |v| / scale, rounded to nearest with ties to the even code and
 * clamped to 6. The grid is 0, 0.5, 1, 1.5, 2, 3, 4, 6, so the rounding boundaries are the
 * midpoints; a tie belongs to the even code, hence the alternating > and >= tests.
 */
function e2m1Magnitude(a: number): number {
  return (a > 0.25 ? 1 : 0) + (a >= 0.75 ? 1 : 0) + (a > 1.25 ? 1 : 0) + (a >= 1.75 ? 1 : 0) +
    (a > 2.5 ? 1 : 0) + (a >= 3.5 ? 1 : 0) + (a > 5 ? 1 : 0);
}

/**
 * floor(log2 |x|) of a finite non-zero float32 given its bits with the sign cleared, read off
 * the exponent field (subnormals from the mantissa's leading bit).
 */
function floorLog2F32(absBits: number): number {
  const e = absBits >>> 23;
  return e === 0 ? 31 - Math.clz32(absBits) - 149 : e - 127;
}

/**
 * Blocks whose largest magnitude has a biased exponent of at least this take the table path of
 * {@link codeOfBits}: there the shared exponent is that exponent − 129 (no clamp), and any
 * subnormal element is below 2^−5 of the scale, so it rounds to 0 as the table says.
 */
const FAST_MIN_EXPONENT = 8;

/**
 * E2M1 code (sign included) of a normal-block element from its float32 bits, by table. With
 * k = (its exponent − the block's) + 2 ≤ 2, |v| / scale = 1.f × 2^k, and the rounding boundaries
 * of {@link e2m1Magnitude} fall at f = 0, 1/4, 1/2, 3/4 exactly, so the code depends only on
 * max(k, −3), the top two bits of f and whether any lower bit is set. The table is filled by
 * applying e2m1Magnitude to one value of each such class, so it is the same rule.
 */
const CODE_TABLE = (() => {
  const t = new Uint8Array(128);
  for (let kk = 0; kk < 6; kk++) {
    for (let m2 = 0; m2 < 4; m2++) {
      for (let sticky = 0; sticky < 2; sticky++) {
        const a = (1 + m2 / 4 + sticky * 2 ** -23) * 2 ** (kk - 3);
        const m = e2m1Magnitude(a);
        const i = (kk << 3) | (m2 << 1) | sticky;
        t[i] = m;
        t[64 | i] = m === 0 ? 0 : m | 8;
      }
    }
  }
  return t;
})();

/** The code of float32 `x` (bits) in a block whose largest exponent field is `emax`. */
function codeOfBits(x: number, emax: number): number {
  const k = ((x >>> 23) & 255) - emax + 2;
  const kk = k < -3 ? 0 : k + 3;
  return CODE_TABLE[
    ((x >>> 25) & 64) | (kk << 3) | ((x >>> 20) & 6) | ((x & 0x1fffff) !== 0 ? 1 : 0)
  ];
}

/**
 * Quantises f32 `w` [rows, cols] to MXFP4 as the OCP MX spec does: per block the shared exponent
 * is floor(log2(max|block|)) − 2 (E2M1's emax), clamped to the E8M0 range [−127, 127] (an
 * all-zero block gets scale byte 0); each element is v / 2^shared rounded to nearest-even E2M1,
 * clamped to ±6. The block maximum is taken on the bit patterns (for finite floats |x| orders
 * as its bits do), and v × 2^−shared is exact in float64, so this is the rule without rounding.
 */
export function quantizeMxfp4(w: Float32Array, rows: number, cols: number): Mxfp4Matrix {
  checkMatrixShape("quantizeMxfp4", w, rows, cols);
  if (cols % 32 !== 0) throw new Error(`quantizeMxfp4: cols ${cols} is not a multiple of 32`);
  const nb = cols / 32;
  const bits = new Uint32Array(w.buffer, w.byteOffset, w.length);
  const blocks = new Uint8Array((rows * cols) / 2);
  const scales = new Uint8Array(rows * nb);
  for (let r = 0; r < rows; r++) {
    for (let b = 0; b < nb; b++) {
      const base = r * cols + b * 32;
      let maxBits = 0;
      for (let i = 0; i < 32; i++) {
        const m = bits[base + i] & 0x7fffffff;
        if (m > maxBits) maxBits = m;
      }
      if (maxBits >= 0x7f800000) {
        throw new Error(`quantizeMxfp4: row ${r} block ${b} holds NaN or Inf`);
      }
      const shared = maxBits === 0
        ? -127
        : Math.max(-127, Math.min(127, floorLog2F32(maxBits) - E2M1_EMAX));
      scales[r * nb + b] = shared + 127;
      const emax = maxBits >>> 23;
      if (emax >= FAST_MIN_EXPONENT) {
        for (let i = 0; i < 32; i += 2) {
          const lo = codeOfBits(bits[base + i], emax), hi = codeOfBits(bits[base + i + 1], emax);
          blocks[(base + i) / 2] = lo | (hi << 4);
        }
        continue;
      }
      const inv = 2 ** -shared;
      for (let i = 0; i < 32; i += 2) {
        const lo = e2m1Magnitude(Math.abs(w[base + i]) * inv);
        const hi = e2m1Magnitude(Math.abs(w[base + i + 1]) * inv);
        const sl = lo !== 0 && bits[base + i] >>> 31 ? 8 : 0;
        const sh = hi !== 0 && bits[base + i + 1] >>> 31 ? 8 : 0;
        blocks[(base + i) / 2] = (lo | sl) | ((hi | sh) << 4);
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
  // Shipped MXFP4 (gpt-oss, K3) times f32 activations: the Q8 copy's error flips gpt-oss's
  // tokens.
  exactGemv: { kernel: "matvec_mxfp4_exact", scaled: true },
  // E2M1 × 2^k has at most 2 significant bits: bf16 holds every value exactly. From 4 vectors the
  // decode pays (docs/PERFORMANCE.md, issue 29).
  exactGemm: { kernel: "gemm_mxfp4_exact", as: "bf16", minBatch: 4 },
  encode: (w, rows, cols) => stored(quantizeMxfp4(w, rows, cols), "blocks"),
  decode: decodeMxfp4Bytes,
};
