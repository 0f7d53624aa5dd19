/**
 * VQ3R: three-stage residual vector quantisation of weight matrices, 3 bits per weight.
 * Per (layer, matrix kind) one set of codebooks: 3 stages × 256 entries × 8 dims (f32). A row r is
 * normalised by its RMS, cut into 8-wide chunks, and each chunk is coded greedily: stage 0's
 * nearest entry, then stage 1's nearest to the residual, then stage 2's; the row's scale is then
 * refitted by least squares, so w[r, 8k + d] ≈ scale[r] · (C0[i0][d] + C1[i1][d] + C2[i2][d]).
 * Codebooks come from k-means (Lloyd) on a seeded sample of the normalised chunks, each stage on
 * the previous stages' residuals, so training is deterministic for a seed.
 *
 * Kernel layouts (vq3r_lut / matvec_vq3r): codebooks as [3][8][256] (vq3rKernelCodebooks),
 * indices [rows][3][nch] (all stage-0 indices of a row, then stage 1, then stage 2), scales
 * [rows] f32, with nch = ceil(cols / 8): a row whose length is not a multiple of 8 is coded as if
 * zero-padded, and the kernels then run with cols rounded up to a multiple of 8 and an input
 * vector whose padding is zero.
 *
 * @module
 */
import { VQ3R_DIM, VQ3R_STAGES } from "../../io/format.ts";
import type { Decode, WeightFormat } from "./format.ts";
import { compactFormat, f32View, needScale, stored } from "./format.ts";
import { checkMatrixShape } from "./int8.ts";

/** Stages, entries per codebook, and dimensions per vector. */
export const VQ_STAGES = 3;
export const VQ_ENTRIES = 256;
export const VQ_DIM = 8;

/** A matrix to train on or encode: row-major f32 [rows, cols]. */
export interface MatrixF32 {
  data: Float32Array;
  rows: number;
  cols: number;
}

/** Training settings; every field has a default. */
export interface Vq3rTrainOptions {
  /** PRNG seed; the same seed and inputs give the same codebooks. Default 1. */
  seed?: number;
  /** Chunks sampled for k-means (all of them when fewer exist). Default 32768. */
  sampleSize?: number;
  /** Lloyd iterations per stage. Default 12. */
  iterations?: number;
}

/** A VQ3R-coded matrix. */
export interface Vq3rMatrix {
  rows: number;
  cols: number;
  /** [rows][3][ceil(cols/8)] codebook indices. */
  indices: Uint8Array;
  /** [rows] f32 row scales. */
  scales: Float32Array;
}

/** Seeded 32-bit PRNG (mulberry32): uniform floats in [0, 1). */
function prng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function rowRms(w: Float32Array, off: number, cols: number): number {
  let s = 0;
  for (let c = 0; c < cols; c++) s += w[off + c] ** 2;
  return Math.sqrt(s / cols);
}

/** Chunks of 8 per row: ceil(cols / 8), the last one zero-padded. */
export function vq3rChunks(cols: number): number {
  return Math.ceil(cols / VQ_DIM);
}

/** Index of the entry of `book` (256 × 8, at stage offset `off`) nearest to v[vo..vo+8). */
function nearest(book: Float32Array, off: number, v: Float32Array, vo: number): number {
  let best = 0, bestD = Infinity;
  const v0 = v[vo], v1 = v[vo + 1], v2 = v[vo + 2], v3 = v[vo + 3];
  const v4 = v[vo + 4], v5 = v[vo + 5], v6 = v[vo + 6], v7 = v[vo + 7];
  for (let k = 0, p = off; k < VQ_ENTRIES; k++, p += VQ_DIM) {
    const d = (book[p] - v0) ** 2 + (book[p + 1] - v1) ** 2 + (book[p + 2] - v2) ** 2 +
      (book[p + 3] - v3) ** 2 + (book[p + 4] - v4) ** 2 + (book[p + 5] - v5) ** 2 +
      (book[p + 6] - v6) ** 2 + (book[p + 7] - v7) ** 2;
    if (d < bestD) {
      bestD = d;
      best = k;
    }
  }
  return best;
}

/** Lloyd's k-means of n vectors into book[off .. off + 256·8); samples are updated to residuals. */
function kmeansStage(
  samples: Float32Array,
  n: number,
  book: Float32Array,
  off: number,
  iterations: number,
  rand: () => number,
): void {
  // Initial centres: distinct samples drawn by a partial Fisher-Yates shuffle.
  const order = Int32Array.from({ length: n }, (_, i) => i);
  for (let k = 0; k < VQ_ENTRIES; k++) {
    const j = k + Math.floor(rand() * (n - k));
    [order[k], order[j]] = [order[j], order[k]];
    book.set(samples.subarray(order[k] * VQ_DIM, order[k] * VQ_DIM + VQ_DIM), off + k * VQ_DIM);
  }
  const assign = new Int32Array(n);
  const sums = new Float64Array(VQ_ENTRIES * VQ_DIM);
  const counts = new Int32Array(VQ_ENTRIES);
  for (let it = 0; it < iterations; it++) {
    sums.fill(0);
    counts.fill(0);
    let far = 0, farD = -1;
    for (let i = 0; i < n; i++) {
      const k = nearest(book, off, samples, i * VQ_DIM);
      assign[i] = k;
      counts[k]++;
      let d = 0;
      for (let j = 0; j < VQ_DIM; j++) {
        const v = samples[i * VQ_DIM + j];
        sums[k * VQ_DIM + j] += v;
        d += (v - book[off + k * VQ_DIM + j]) ** 2;
      }
      if (d > farD) {
        farD = d;
        far = i;
      }
    }
    for (let k = 0; k < VQ_ENTRIES; k++) {
      for (let j = 0; j < VQ_DIM; j++) {
        // An empty cluster restarts at the worst-served sample, so no entry is wasted.
        book[off + k * VQ_DIM + j] = counts[k] > 0
          ? sums[k * VQ_DIM + j] / counts[k]
          : samples[far * VQ_DIM + j];
      }
    }
  }
  for (let i = 0; i < n; i++) {
    const k = nearest(book, off, samples, i * VQ_DIM);
    for (let j = 0; j < VQ_DIM; j++) samples[i * VQ_DIM + j] -= book[off + k * VQ_DIM + j];
  }
}

/**
 * Trains VQ3R codebooks ([3][256][8] f32, stage-major) on the RMS-normalised 8-wide chunks of
 * `matrices` (typically all experts' matrices of one kind in one layer).
 */
export function trainVq3r(matrices: MatrixF32[], options: Vq3rTrainOptions = {}): Float32Array {
  const seed = options.seed ?? 1, iterations = options.iterations ?? 12;
  const sampleSize = options.sampleSize ?? 32768;
  if (matrices.length === 0) throw new Error("trainVq3r: no matrices to train on");
  let total = 0;
  for (const m of matrices) {
    checkMatrixShape("trainVq3r", m.data, m.rows, m.cols);
    total += m.rows * vq3rChunks(m.cols);
  }
  const n = Math.min(total, sampleSize);
  const rand = prng(seed);
  const samples = new Float32Array(n * VQ_DIM);
  for (let i = 0; i < n; i++) {
    // Every chunk when they all fit; otherwise a uniform draw with replacement.
    let g = n === total ? i : Math.floor(rand() * total);
    let m = matrices[0], mi = 0;
    while (g >= m.rows * vq3rChunks(m.cols)) {
      g -= m.rows * vq3rChunks(m.cols);
      m = matrices[++mi];
    }
    const nch = vq3rChunks(m.cols);
    const r = Math.floor(g / nch), c0 = (g % nch) * VQ_DIM;
    const rms = rowRms(m.data, r * m.cols, m.cols);
    for (let j = 0; j < VQ_DIM && c0 + j < m.cols && rms > 0; j++) {
      samples[i * VQ_DIM + j] = m.data[r * m.cols + c0 + j] / rms;
    }
  }
  if (n < VQ_ENTRIES) {
    throw new Error(`trainVq3r: ${n} chunks of 8 weights are too few for ${VQ_ENTRIES} entries`);
  }
  const book = new Float32Array(VQ_STAGES * VQ_ENTRIES * VQ_DIM);
  for (let s = 0; s < VQ_STAGES; s++) {
    kmeansStage(samples, n, book, s * VQ_ENTRIES * VQ_DIM, iterations, rand);
  }
  return book;
}

/** Encodes `m` with trained codebooks (greedy per stage, least-squares row scale). */
export function encodeVq3r(m: MatrixF32, codebooks: Float32Array): Vq3rMatrix {
  checkMatrixShape("encodeVq3r", m.data, m.rows, m.cols);
  if (codebooks.length !== VQ_STAGES * VQ_ENTRIES * VQ_DIM) {
    throw new Error(`encodeVq3r: codebooks hold ${codebooks.length} floats, expected 6144`);
  }
  const { rows, cols, data } = m;
  const nch = vq3rChunks(cols);
  const indices = new Uint8Array(rows * VQ_STAGES * nch);
  const scales = new Float32Array(rows);
  const res = new Float32Array(nch * VQ_DIM), dec = new Float32Array(nch * VQ_DIM);
  for (let r = 0; r < rows; r++) {
    const rms = rowRms(data, r * cols, cols);
    if (rms === 0) continue;
    res.fill(0);
    for (let c = 0; c < cols; c++) res[c] = data[r * cols + c] / rms;
    dec.fill(0);
    for (let s = 0; s < VQ_STAGES; s++) {
      const off = s * VQ_ENTRIES * VQ_DIM;
      for (let k = 0; k < nch; k++) {
        const e = nearest(codebooks, off, res, k * VQ_DIM);
        indices[(r * VQ_STAGES + s) * nch + k] = e;
        for (let j = 0; j < VQ_DIM; j++) {
          res[k * VQ_DIM + j] -= codebooks[off + e * VQ_DIM + j];
          dec[k * VQ_DIM + j] += codebooks[off + e * VQ_DIM + j];
        }
      }
    }
    let wd = 0, dd = 0;
    for (let c = 0; c < cols; c++) {
      wd += data[r * cols + c] * dec[c];
      dd += dec[c] * dec[c];
    }
    scales[r] = dd > 0 ? wd / dd : 0;
  }
  return { rows, cols, indices, scales };
}

/** The normalised row vector (before the row scale) of chunk k of row r, summed over stages. */
function chunkValue(
  m: Vq3rMatrix,
  codebooks: Float32Array,
  r: number,
  k: number,
  j: number,
): number {
  const nch = vq3rChunks(m.cols);
  let v = 0;
  for (let s = 0; s < VQ_STAGES; s++) {
    const e = m.indices[(r * VQ_STAGES + s) * nch + k];
    v += codebooks[(s * VQ_ENTRIES + e) * VQ_DIM + j];
  }
  return v;
}

/** The f32 weights a VQ3R matrix stands for. */
export function dequantizeVq3r(m: Vq3rMatrix, codebooks: Float32Array): Float32Array {
  const out = new Float32Array(m.rows * m.cols);
  for (let r = 0; r < m.rows; r++) {
    for (let c = 0; c < m.cols; c++) {
      out[r * m.cols + c] = m.scales[r] * chunkValue(m, codebooks, r, c >> 3, c & 7);
    }
  }
  return out;
}

/** Codebooks [3][256][8] → the kernel's dimension-major [3][8][256]. */
export function vq3rKernelCodebooks(codebooks: Float32Array): Float32Array {
  const out = new Float32Array(codebooks.length);
  for (let s = 0; s < VQ_STAGES; s++) {
    for (let e = 0; e < VQ_ENTRIES; e++) {
      for (let d = 0; d < VQ_DIM; d++) {
        out[(s * VQ_DIM + d) * VQ_ENTRIES + e] = codebooks[(s * VQ_ENTRIES + e) * VQ_DIM + d];
      }
    }
  }
  return out;
}

/** f32 values of vq3r bytes: scale[r] · Σ over stages of the codebook entries the codes pick. */
const decodeVq3rBytes: Decode = (data, scale, rows, cols, what, codebooks) => {
  const sb = needScale(scale, "vq3r", what);
  if (!codebooks) throw new Error(`${what}: vq3r weights need their codebooks`);
  const s = f32View(sb);
  const out = new Float32Array(rows * cols);
  const nch = Math.ceil(cols / VQ3R_DIM);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const k = c >> 3, d = c & 7;
      let v = 0;
      for (let st = 0; st < VQ3R_STAGES; st++) {
        const e = data[(r * VQ3R_STAGES + st) * nch + k];
        v += codebooks[(st * VQ3R_DIM + d) * 256 + e];
      }
      out[r * cols + c] = s[r] * v;
    }
  }
  return out;
};

/**
 * The vq3r weight format: three-stage residual vector quantisation of 8-weight vectors with
 * per-layer trained codebooks and one f32 scale per row (`--experts vq3r`).
 */
export const VQ3R: WeightFormat = {
  ...compactFormat("vq3r", "vq3r", "lut", "matvec_vq3r"),
  encode(w, rows, cols, what, codebooks) {
    if (!codebooks) throw new Error(`${what}: vq3r needs trained codebooks`);
    return stored(encodeVq3r({ data: w, rows, cols }, codebooks), "indices");
  },
  decode: decodeVq3rBytes,
};
