/**
 * int8 weights with one f32 scale per row (trunk option): w[r, c] ≈ q[r, c] · scale[r] with
 * q in −127..127, scale = max|row| / 127 (an all-zero row gets scale 0). Kernel: matvec_int8row.
 *
 * @module
 */
import type { Decode, WeightFormat } from "./format.ts";
import { compactFormat, f32View, needScale, stored } from "./format.ts";

const f32 = Math.fround;

/** Rounds to the nearest integer, ties to even (the IEEE default, as the kernels round). */
export function roundHalfEven(v: number): number {
  const f = Math.floor(v);
  const d = v - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/** An int8 per-row matrix: `q` row-major [rows, cols], `scales` [rows]. */
export interface Int8RowMatrix {
  rows: number;
  cols: number;
  q: Int8Array;
  scales: Float32Array;
}

/** Throws unless `w` holds exactly rows × cols floats with positive integer rows and cols. */
export function checkMatrixShape(name: string, w: Float32Array, rows: number, cols: number): void {
  if (!Number.isInteger(rows) || !Number.isInteger(cols) || rows < 1 || cols < 1) {
    throw new Error(`${name}: expected positive integer rows and cols, got [${rows}, ${cols}]`);
  }
  if (w.length !== rows * cols) {
    throw new Error(`${name}: expected ${rows}×${cols} = ${rows * cols} floats, got ${w.length}`);
  }
}

/** Quantises f32 `w` [rows, cols] to int8 with a per-row scale max|row| / 127. */
export function quantizeInt8Row(w: Float32Array, rows: number, cols: number): Int8RowMatrix {
  checkMatrixShape("quantizeInt8Row", w, rows, cols);
  const q = new Int8Array(rows * cols);
  const scales = new Float32Array(rows);
  for (let r = 0; r < rows; r++) {
    let max = 0;
    for (let c = 0; c < cols; c++) max = Math.max(max, Math.abs(w[r * cols + c]));
    if (!Number.isFinite(max)) throw new Error(`quantizeInt8Row: row ${r} holds NaN or Inf`);
    if (max === 0) continue;
    const scale = f32(max / 127);
    scales[r] = scale;
    for (let c = 0; c < cols; c++) {
      const v = roundHalfEven(w[r * cols + c] / scale);
      q[r * cols + c] = Math.max(-127, Math.min(127, v));
    }
  }
  return { rows, cols, q, scales };
}

/** The f32 weights an int8 per-row matrix stands for: q · scale, exact in f32. */
export function dequantizeInt8Row(m: Int8RowMatrix): Float32Array {
  const out = new Float32Array(m.rows * m.cols);
  for (let r = 0; r < m.rows; r++) {
    for (let c = 0; c < m.cols; c++) out[r * m.cols + c] = m.q[r * m.cols + c] * m.scales[r];
  }
  return out;
}

/**
 * Relative error of an approximation: ‖a − w‖₂ / ‖w‖₂ over all elements (0 for an all-zero w
 * reproduced exactly).
 */
export function relativeError(w: Float32Array, approx: Float32Array): number {
  let num = 0, den = 0;
  for (let i = 0; i < w.length; i++) {
    num += (approx[i] - w[i]) ** 2;
    den += w[i] ** 2;
  }
  return den === 0 ? Math.sqrt(num) : Math.sqrt(num / den);
}

/** f32 values of int8row bytes: q[r, c] · scale[r]. */
const decodeInt8RowBytes: Decode = (data, scale, rows, cols, what) => {
  const s = f32View(needScale(scale, "int8row", what));
  const q = new Int8Array(data.buffer, data.byteOffset, data.length);
  const out = new Float32Array(rows * cols);
  for (let i = 0; i < rows * cols; i++) out[i] = q[i] * s[Math.floor(i / cols)];
  return out;
};

/** The int8row weight format: int8 with one f32 scale per row (`--experts int8`, `--trunk int8`). */
export const INT8ROW: WeightFormat = {
  ...compactFormat("int8row", "int8", "f32", "matvec_int8row"),
  encode: (w, rows, cols) => stored(quantizeInt8Row(w, rows, cols), "q"),
  decode: decodeInt8RowBytes,
};
