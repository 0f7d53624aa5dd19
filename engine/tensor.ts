/**
 * Where a weight matrix lives in the arena and how it is stored, plus the kernel call that
 * multiplies it with activations. The forward passes never look at dtypes themselves.
 *
 * @module
 */
import type { Job } from "./pool.ts";

/** A weight in the arena: `rows × cols`, row-major [out, in]. */
export interface TensorRef {
  /** Byte offset of the data in the arena. */
  ptr: number;
  /** Storage format, as in the container manifest (f32, bf16, f16, f8_e4m3, mxfp4, ...). */
  dtype: string;
  rows: number;
  cols: number;
  /** Byte offset of the scales for block-scaled formats. */
  scale?: number;
  /** vq3r: byte offset of the codebooks (f32 [3][8][256]) in the arena. */
  codebook?: number;
  /** vq3r: cols rounded up to a multiple of 8; the kernel runs on this many columns. */
  paddedCols?: number;
  /** mxfp4: multiply f32 activations exactly (matvec_mxfp4_exact) instead of their Q8 copy. */
  exact?: boolean;
}

/**
 * What form a format's kernel reads its input vector in: f32 as is, the Q8 copy of
 * quantize_act_q8 (mxfp4, int4g32), or the lookup table of vq3r_lut (vq3r).
 */
export type InputForm = "f32" | "q8" | "lut";

/** The input form the kernel of `w`'s format reads. */
export function inputFormOf(w: TensorRef): InputForm {
  if (w.dtype === "mxfp4" && w.exact) return "f32";
  if (w.dtype === "mxfp4" || w.dtype === "int4g32") return "q8";
  return w.dtype === "vq3r" ? "lut" : "f32";
}

/** Formats with a batched kernel that reads each weight once for all columns. */
const GEMM: Record<string, string> = { f32: "gemm_f32", bf16: "gemm_bf16" };

/** Single-vector kernels: name and whether the scale pointer comes after the weights. */
const GEMV: Record<string, { kernel: string; scaled: boolean }> = {
  f32: { kernel: "gemv_f32", scaled: false },
  bf16: { kernel: "gemv_bf16", scaled: false },
  f16: { kernel: "gemv_f16", scaled: false },
  f8_e4m3: { kernel: "matvec_fp8b128", scaled: true },
  mxfp4: { kernel: "matvec_mxfp4", scaled: true },
  mxfp4_exact: { kernel: "matvec_mxfp4_exact", scaled: true },
  int4g32: { kernel: "matvec_int4g32", scaled: true },
  int8row: { kernel: "matvec_int8row", scaled: true },
  vq3r: { kernel: "matvec_vq3r", scaled: true },
};

/** Whether the engine can multiply with weights stored as `dtype`. */
export function isMatmulDtype(dtype: string): boolean {
  return dtype in GEMV;
}

/**
 * The jobs computing Y[b] = W · X[b] for `nb` activation vectors laid out one after another
 * (X is nb × cols floats, Y is nb × rows floats). A batched kernel gives bit-identical columns to
 * the single-vector one, so batching never changes output. Formats whose input form is not f32
 * (see {@link inputFormOf}) read `prep[b]`, the arena offset of vector b's prepared form, instead
 * of X.
 */
export function matmulJobs(
  w: TensorRef,
  x: number,
  y: number,
  nb: number,
  prep?: readonly number[],
): Job[] {
  const gemm = GEMM[w.dtype];
  if (gemm && nb > 1) {
    return [{
      kernel: gemm,
      args: [BigInt(w.ptr), BigInt(x), BigInt(y), w.rows, w.cols, nb],
      rows: w.rows,
    }];
  }
  const g = GEMV[w.dtype === "mxfp4" && w.exact ? "mxfp4_exact" : w.dtype];
  if (!g) throw new Error(`no matmul kernel for weights stored as ${w.dtype}`);
  if (g.scaled && w.scale === undefined) throw new Error(`${w.dtype} weights need a scale tensor`);
  const form = inputFormOf(w);
  if (form !== "f32" && prep?.length !== nb) {
    throw new Error(
      `${w.dtype} weights read a prepared (${form}) input: expected ${nb} prepared vectors, got ` +
        `${prep?.length ?? "none"}`,
    );
  }
  if (form === "lut" && w.paddedCols === undefined) {
    throw new Error("vq3r weights need their padded column count");
  }
  const cols = form === "lut" ? w.paddedCols! : w.cols;
  const jobs: Job[] = [];
  for (let b = 0; b < nb; b++) {
    const xb = BigInt(form === "f32" ? x + b * w.cols * 4 : prep![b]);
    const yb = BigInt(y + b * w.rows * 4);
    const args = g.scaled
      ? [BigInt(w.ptr), BigInt(w.scale!), xb, yb, w.rows, cols]
      : [BigInt(w.ptr), xb, yb, w.rows, cols];
    jobs.push({ kernel: g.kernel, args, rows: w.rows });
  }
  return jobs;
}
