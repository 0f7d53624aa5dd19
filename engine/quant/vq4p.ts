/**
 * VQ4P: four-stage residual vector quantisation with 64-entry codebooks, 3 bits per weight (four
 * 6-bit indices per 8 weights), after WARP's VQ4P layout. Training and coding are VQ3R's
 * (engine/quant/vq3r.ts) with 4 stages × 64 entries: w[r, 8k + d] ≈ scale[r] · Σ_s C_s[i_s][d].
 *
 * Why 64 entries: a stage's table of dots with one 8-column chunk of x is then 64 bytes once
 * rounded to int8, four byte-shuffle registers, so kernels/quant_vq4p.c looks up 16 rows with
 * four swizzles per stage instead of VQ3R's scalar gathers from a 1 KiB table.
 *
 * Kernel layouts (vq4p_lut / matvec_vq4p), nch = ceil(cols / 8), rows padded to a multiple of 16:
 * - codebooks f32 [4][8][64] (stage, dimension, entry);
 * - indices u8 [rows16 / 16][nch][3][16]: per group of 16 rows and chunk, three 16-byte vectors
 *   A, B, C whose lane j is row 16g + j: A = i0 | (i3 & 3) << 6, B = i1 | ((i3 >> 2) & 3) << 6,
 *   C = i2 | (i3 >> 4) << 6 (padding rows are zero);
 * - scales f32 [rows];
 * - the table: int8 [nch][4][64], then f32 scales q [ceil(nch/16)][4]: entry ≈
 *   (Σ_d C[s][d][e]·x[8k + d]) / q[k / 16][s], rounded to nearest in −127..127, one scale per
 *   stage and group of 16 chunks so an outlier column only coarsens its own group.
 *
 * @module
 */
import { storedBytes, VQ3R_DIM, VQ4P_ROW_GROUP, VQ4P_STAGES } from "../../io/format.ts";
import { vq4pLutBytes } from "../../wasm/quant_kernels.ts";
import {
  compactFormat,
  type Decode,
  f32View,
  needScale,
  stored,
  type WeightFormat,
} from "./format.ts";
import {
  dequantizeResidualVq,
  dimensionMajor,
  encodeResidualVq,
  type MatrixF32,
  trainResidualVq,
  vq3rChunks,
  type Vq3rMatrix,
  type Vq3rTrainOptions,
} from "./vq3r.ts";

/** Entries per stage codebook (8 dimensions per vector, as VQ3R). */
export const VQ4P_ENTRIES = 64;
/** Largest |table entry| (kernels/quant_vq4p.c rounds each table to int8). */
export const VQ4P_LUT_MAX = 127;

/** A VQ4P-coded matrix in the kernel's layout. */
export interface Vq4pMatrix {
  rows: number;
  cols: number;
  /** [ceil(rows/16)][ceil(cols/8)][3][16] packed indices. */
  indices: Uint8Array;
  /** [rows] f32 row scales. */
  scales: Float32Array;
}

/** Bytes of the packed indices of a rows × cols matrix. */
export function vq4pIndexBytes(rows: number, cols: number): number {
  return storedBytes("vq4p", [rows, cols]);
}

/** Trains VQ4P codebooks ([4][64][8] f32, stage-major) as VQ3R trains its. */
export function trainVq4p(matrices: MatrixF32[], options: Vq3rTrainOptions = {}): Float32Array {
  return trainResidualVq(matrices, VQ4P_STAGES, VQ4P_ENTRIES, options);
}

/** Packs per-row stage indices ([rows][4][nch]) into the kernel layout. */
export function packVq4p(m: Vq3rMatrix): Vq4pMatrix {
  const nch = vq3rChunks(m.cols);
  const out = new Uint8Array(vq4pIndexBytes(m.rows, m.cols));
  for (let r = 0; r < m.rows; r++) {
    const g = Math.floor(r / VQ4P_ROW_GROUP), lane = r % VQ4P_ROW_GROUP;
    for (let k = 0; k < nch; k++) {
      const i = (s: number) => m.indices[(r * VQ4P_STAGES + s) * nch + k];
      const i3 = i(3);
      const at = ((g * nch + k) * 3) * VQ4P_ROW_GROUP + lane;
      out[at] = i(0) | (i3 & 3) << 6;
      out[at + VQ4P_ROW_GROUP] = i(1) | ((i3 >> 2) & 3) << 6;
      out[at + 2 * VQ4P_ROW_GROUP] = i(2) | (i3 >> 4) << 6;
    }
  }
  return { rows: m.rows, cols: m.cols, indices: out, scales: m.scales };
}

/** The index of stage `s` of chunk `k` of row `r` in a packed matrix. */
export function vq4pIndex(m: Vq4pMatrix, r: number, s: number, k: number): number {
  const nch = vq3rChunks(m.cols);
  const g = Math.floor(r / VQ4P_ROW_GROUP), lane = r % VQ4P_ROW_GROUP;
  const at = ((g * nch + k) * 3) * VQ4P_ROW_GROUP + lane;
  const b = (j: number) => m.indices[at + j * VQ4P_ROW_GROUP];
  if (s < 3) return b(s) & 63;
  return (b(0) >> 6) | (b(1) >> 6) << 2 | (b(2) >> 6) << 4;
}

/** Unpacks to per-row stage indices ([rows][4][nch]). */
function unpackVq4p(m: Vq4pMatrix): Vq3rMatrix {
  const nch = vq3rChunks(m.cols);
  const indices = new Uint8Array(m.rows * VQ4P_STAGES * nch);
  for (let r = 0; r < m.rows; r++) {
    for (let s = 0; s < VQ4P_STAGES; s++) {
      for (let k = 0; k < nch; k++) {
        indices[(r * VQ4P_STAGES + s) * nch + k] = vq4pIndex(m, r, s, k);
      }
    }
  }
  return { rows: m.rows, cols: m.cols, indices, scales: m.scales };
}

/** Encodes `m` with trained codebooks (greedy per stage, least-squares row scale), packed. */
export function encodeVq4p(m: MatrixF32, codebooks: Float32Array): Vq4pMatrix {
  return packVq4p(encodeResidualVq(m, codebooks, VQ4P_STAGES, VQ4P_ENTRIES));
}

/** The f32 weights a VQ4P matrix stands for. */
export function dequantizeVq4p(m: Vq4pMatrix, codebooks: Float32Array): Float32Array {
  return dequantizeResidualVq(unpackVq4p(m), codebooks, VQ4P_STAGES, VQ4P_ENTRIES);
}

/** Codebooks [4][64][8] → the kernel's dimension-major [4][8][64]. */
export function vq4pKernelCodebooks(codebooks: Float32Array): Float32Array {
  return dimensionMajor(codebooks, VQ4P_STAGES, VQ4P_ENTRIES);
}

/** f32 values of vq4p bytes: scale[r] · Σ over stages of the codebook entries the codes pick. */
const decodeVq4pBytes: Decode = (data, scale, rows, cols, what, codebooks) => {
  const sb = needScale(scale, "vq4p", what);
  if (!codebooks) throw new Error(`${what}: vq4p weights need their codebooks`);
  const m = { rows, cols, indices: data, scales: f32View(sb) };
  const out = new Float32Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      let v = 0;
      for (let st = 0; st < VQ4P_STAGES; st++) {
        v += codebooks[(st * VQ3R_DIM + (c & 7)) * VQ4P_ENTRIES + vq4pIndex(m, r, st, c >> 3)];
      }
      out[r * cols + c] = m.scales[r] * v;
    }
  }
  return out;
};

/**
 * The vq4p weight format: four-stage residual vector quantisation with 64-entry per-layer
 * codebooks, 16-row interleaved indices and one f32 scale per row (`--experts vq4p`).
 */
export const VQ4P: WeightFormat = {
  ...compactFormat("vq4p", "vq4p", "lut", "matvec_vq4p"),
  table: { kernel: "vq4p_lut", bytes: vq4pLutBytes },
  encode(w, rows, cols, what, codebooks) {
    if (!codebooks) throw new Error(`${what}: vq4p needs trained codebooks`);
    return stored(encodeVq4p({ data: w, rows, cols }, codebooks), "indices");
  },
  decode: decodeVq4pBytes,
};
