/**
 * INT4 group-32 symmetric weights in compressed-tensors' "pack-quantized" form, as
 * Kimi-K2-Thinking ships them: `weight_packed` int32 [rows, cols/8] where word k of a row holds
 * elements 8k..8k+7, element 8k+i in bits 4i..4i+3, stored as q + 8 for q in −8..7 (unsigned
 * nibbles; little-endian bytes therefore hold element 2j in the low nibble of byte j);
 * `weight_scale` bf16 [rows, cols/32]; no zero point: w = q · scale. The kernel matvec_int4g32
 * reads the packed words as bytes and the bf16 scales as shipped. cols must be a multiple of 32.
 *
 * @module
 */
import type { Decode, WeightFormat } from "./format.ts";
import { compactFormat, decodeNibbles, needScale, stored } from "./format.ts";
import { checkMatrixShape, roundHalfEven } from "./int8.ts";

const scratch = new DataView(new ArrayBuffer(4));

/** f32 value → bf16 bits, round to nearest even (NaN stays a quiet NaN). */
export function f32ToBf16(v: number): number {
  scratch.setFloat32(0, v);
  const bits = scratch.getUint32(0);
  if ((bits & 0x7fffffff) > 0x7f800000) return (bits >>> 16) | 0x40;
  return (bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16;
}

/** bf16 bits → value (exact). */
export function bf16ToNumber(h: number): number {
  scratch.setUint32(0, (h & 0xffff) << 16);
  return scratch.getFloat32(0);
}

/** An INT4 group-32 matrix: `packed` [rows, cols/8] int32, `scales` [rows, cols/32] bf16 bits. */
export interface Int4Matrix {
  rows: number;
  cols: number;
  packed: Int32Array;
  scales: Uint16Array;
}

/**
 * Quantises f32 `w` [rows, cols] as compressed-tensors' symmetric int4 group quantiser does:
 * scale = bf16(max|group| / 7.5) (half the width of −8..7), q = clamp(round-half-even(w / scale),
 * −8, 7); an all-zero group gets scale 0 and q = 0.
 */
export function quantizeInt4g32(w: Float32Array, rows: number, cols: number): Int4Matrix {
  checkMatrixShape("quantizeInt4g32", w, rows, cols);
  if (cols % 32 !== 0) throw new Error(`quantizeInt4g32: cols ${cols} is not a multiple of 32`);
  const ng = cols / 32;
  const packed = new Int32Array((rows * cols) / 8);
  const scales = new Uint16Array(rows * ng);
  for (let r = 0; r < rows; r++) {
    for (let g = 0; g < ng; g++) {
      const base = r * cols + g * 32;
      let max = 0;
      for (let i = 0; i < 32; i++) max = Math.max(max, Math.abs(w[base + i]));
      if (!Number.isFinite(max)) {
        throw new Error(`quantizeInt4g32: row ${r} group ${g} holds NaN or Inf`);
      }
      const sbits = f32ToBf16(max / 7.5);
      scales[r * ng + g] = sbits;
      const scale = bf16ToNumber(sbits);
      for (let i = 0; i < 32; i++) {
        const q = scale === 0 ? 0 : Math.max(-8, Math.min(7, roundHalfEven(w[base + i] / scale)));
        packed[(base + i) >> 3] |= (q + 8) << (4 * (i & 7));
      }
    }
  }
  return { rows, cols, packed, scales };
}

/** The signed value q (−8..7) of element (r, c). */
export function int4At(m: Int4Matrix, r: number, c: number): number {
  const i = r * m.cols + c;
  return ((m.packed[i >> 3] >>> (4 * (i & 7))) & 15) - 8;
}

/** The f32 weights an INT4 matrix stands for: q · scale (exact in f32). */
export function dequantizeInt4g32(m: Int4Matrix): Float32Array {
  const ng = m.cols / 32;
  const out = new Float32Array(m.rows * m.cols);
  for (let r = 0; r < m.rows; r++) {
    for (let c = 0; c < m.cols; c++) {
      out[r * m.cols + c] = int4At(m, r, c) * bf16ToNumber(m.scales[r * ng + (c >> 5)]);
    }
  }
  return out;
}

/** f32 values of int4g32 bytes: (nibble − 8) · its group's bf16 scale. */
const decodeInt4Bytes: Decode = (data, scale, rows, cols, what) => {
  const bytes = needScale(scale, "int4g32", what);
  const s16 = new Uint16Array(bytes.slice().buffer, 0, rows * (cols / 32));
  return decodeNibbles(data, rows, cols, (nib, g) => (nib - 8) * bf16ToNumber(s16[g]));
};

/** The int4g32 weight format: symmetric int4, one bf16 scale per 32 columns (`--experts int4`). */
export const INT4G32: WeightFormat = {
  ...compactFormat("int4g32", "int4", "q8", "matvec_int4g32"),
  // Shipped INT4 (Kimi-K2) times f32 activations: the Q8 copy moves its logits by ~6e-3.
  exactGemv: { kernel: "matvec_int4g32_exact", scaled: true },
  // q × a bf16 scale has up to 11 significant bits: exact in f32, not in bf16.
  exactGemm: { kernel: "gemm_int4g32_exact", as: "f32", minBatch: 4 },
  encode: (w, rows, cols) => stored(quantizeInt4g32(w, rows, cols), "packed"),
  decode: decodeInt4Bytes,
};
