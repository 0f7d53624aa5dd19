/**
 * FP8 e4m3fn weights with 128×128 block scales, as DeepSeek-V3 and Kimi-K2 ship them
 * (`weight` F8_E4M3 plus `weight_scale_inv` F32 [ceil(rows/128), ceil(cols/128)]):
 * w[r, c] = e4m3(code[r, c]) · scale[r / 128, c / 128]. e4m3fn: sign, 4 exponent bits (bias 7),
 * 3 mantissa bits; exponent 0 is subnormal (m/8 · 2^−6); 0x7F and 0xFF are NaN; no infinities;
 * largest finite 448. Kernels: matvec_fp8b128, and gemm_fp8b128 for batches (each column the
 * matvec's bits).
 *
 * @module
 */
import { dequantFp8Blocks } from "../../io/checkpoint_weights.ts";
import type { Decode, WeightFormat } from "./format.ts";
import { compactFormat, f32View, needScale, stored } from "./format.ts";
import { checkMatrixShape, roundHalfEven } from "./int8.ts";
import { floorLog2 } from "./mxfp4.ts";

const f32 = Math.fround;

/** Largest finite e4m3fn value. */
export const E4M3_MAX = 448;

/** Side of a scale block. */
export const FP8_BLOCK = 128;

/** e4m3fn code (0..255) → value, exactly. */
export function decodeE4m3(code: number): number {
  const sign = code & 0x80 ? -1 : 1;
  const e = (code >> 3) & 15, m = code & 7;
  if (e === 15 && m === 7) return NaN;
  return e === 0 ? sign * (m / 8) * 2 ** -6 : sign * (1 + m / 8) * 2 ** (e - 7);
}

/** Every code's value: E4M3_TABLE[code] = decodeE4m3(code). */
export const E4M3_TABLE: Float32Array = Float32Array.from({ length: 256 }, (_, c) => decodeE4m3(c));

/** A finite value → nearest e4m3fn code (ties to even), saturating at ±448. */
export function encodeE4m3(v: number): number {
  const sign = v < 0 ? 0x80 : 0;
  const a = Math.abs(v);
  if (a >= E4M3_MAX) return sign | 0x7e;
  if (a < 2 ** -6) return sign | roundHalfEven(a * 2 ** 9); // 8 lands on the smallest normal
  let e = floorLog2(a);
  let m = roundHalfEven((a / 2 ** e - 1) * 8);
  if (m === 8) {
    e++;
    m = 0;
  }
  return sign | ((e + 7) << 3) | m;
}

/** An FP8 block-scaled matrix: `codes` [rows, cols], `scales` [ceil(rows/128), ceil(cols/128)]. */
export interface Fp8Matrix {
  rows: number;
  cols: number;
  codes: Uint8Array;
  scales: Float32Array;
}

/**
 * Quantises f32 `w` [rows, cols]: per 128×128 block scale = max|block| / 448 in f32 (an all-zero
 * block gets 1), codes = e4m3(w / scale) rounded to nearest-even, saturated.
 */
export function quantizeFp8b128(w: Float32Array, rows: number, cols: number): Fp8Matrix {
  checkMatrixShape("quantizeFp8b128", w, rows, cols);
  const nrb = Math.ceil(rows / FP8_BLOCK), ncb = Math.ceil(cols / FP8_BLOCK);
  const codes = new Uint8Array(rows * cols);
  const scales = new Float32Array(nrb * ncb);
  for (let rb = 0; rb < nrb; rb++) {
    for (let cb = 0; cb < ncb; cb++) {
      const r1 = Math.min(rows, (rb + 1) * FP8_BLOCK), c1 = Math.min(cols, (cb + 1) * FP8_BLOCK);
      let max = 0;
      for (let r = rb * FP8_BLOCK; r < r1; r++) {
        for (let c = cb * FP8_BLOCK; c < c1; c++) max = Math.max(max, Math.abs(w[r * cols + c]));
      }
      if (!Number.isFinite(max)) {
        throw new Error(`quantizeFp8b128: block (${rb}, ${cb}) holds NaN or Inf`);
      }
      const scale = max === 0 ? 1 : f32(max / E4M3_MAX);
      scales[rb * ncb + cb] = scale;
      for (let r = rb * FP8_BLOCK; r < r1; r++) {
        for (let c = cb * FP8_BLOCK; c < c1; c++) {
          codes[r * cols + c] = encodeE4m3(w[r * cols + c] / scale);
        }
      }
    }
  }
  return { rows, cols, codes, scales };
}

/** The f32 weights an FP8 block-scaled matrix stands for: e4m3(code) · scale, rounded to f32. */
export function dequantizeFp8b128(m: Fp8Matrix): Float32Array {
  const ncb = Math.ceil(m.cols / FP8_BLOCK);
  const out = new Float32Array(m.rows * m.cols);
  for (let r = 0; r < m.rows; r++) {
    const srow = Math.floor(r / FP8_BLOCK) * ncb;
    for (let c = 0; c < m.cols; c++) {
      out[r * m.cols + c] = E4M3_TABLE[m.codes[r * m.cols + c]] *
        m.scales[srow + Math.floor(c / FP8_BLOCK)];
    }
  }
  return out;
}

/** f32 values of FP8 block-scaled bytes (the container form: scales f32 [⌈R/128⌉, ⌈C/128⌉]). */
const decodeFp8Bytes: Decode = (data, scale, rows, cols, what) => {
  return dequantFp8Blocks(data, rows, cols, f32View(needScale(scale, "f8_e4m3", what)));
};

/** The f8_e4m3 weight format: FP8 E4M3 with one f32 scale per 128×128 block (`--experts fp8`). */
export const F8_E4M3: WeightFormat = {
  ...compactFormat("f8_e4m3", "fp8", "f32", "matvec_fp8b128"),
  gemm: "gemm_fp8b128",
  encode: (w, rows, cols) => stored(quantizeFp8b128(w, rows, cols), "codes"),
  decode: decodeFp8Bytes,
};
