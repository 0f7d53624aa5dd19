/**
 * Where a weight matrix lives in the arena and how it is stored, plus the kernel call that
 * multiplies it with activations (the kernels are the weight formats' own, engine/quant/mod.ts).
 * The forward passes never look at dtypes themselves.
 *
 * @module
 */
import { FORMAT_LAYOUTS, scaleSpecOf, storedBytes, type StoredDtype } from "../io/format.ts";
import type { Job } from "./pool.ts";
import type { InputForm } from "./quant/format.ts";
import { findFormat } from "./quant/mod.ts";

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
  /** vq3r, vq4p: byte offset of the codebooks (f32 [3][8][256] or [4][8][64]) in the arena. */
  codebook?: number;
  /** vq3r, vq4p: cols rounded up to a multiple of 8; the kernel runs on this many columns. */
  paddedCols?: number;
  /**
   * The weights are the model as shipped (gpt-oss's and K3's MXFP4, Kimi-K2's INT4): multiply f32 activations
   * with the format's exact kernel instead of its prepared-input one.
   */
  exact?: boolean;
}

/**
 * Rows `first .. first + rows − 1` of `w` as a weight of their own (the same bytes and scales, so
 * each row's product keeps its bits), or null where the format cannot be cut at `first`: a scale
 * block (FP8's 128 rows) or a row group that the cut would split, or codebook formats.
 */
export function rowBlock(w: TensorRef, first: number, rows: number): TensorRef | null {
  const dtype = w.dtype as StoredDtype;
  if (!Object.hasOwn(FORMAT_LAYOUTS, dtype) || w.codebook !== undefined) return null;
  if (!(first >= 0 && rows >= 1 && first + rows <= w.rows)) return null;
  const data = (r: number) => r && storedBytes(dtype, [r, w.cols]);
  const scale = (r: number) => {
    const s = r ? scaleSpecOf(dtype, [r, w.cols]) : null;
    return s ? storedBytes(s.dtype, s.shape) : 0;
  };
  // A clean cut: the rows before it take whole bytes and whole scale rows of their own.
  for (const f of [data, scale]) if (first && f(first) + f(1) !== f(first + 1)) return null;
  return {
    ...w,
    ptr: w.ptr + data(first),
    rows,
    ...(w.scale === undefined ? {} : { scale: w.scale + scale(first) }),
  };
}

/** The input form the kernel of `w`'s format reads (f32 for a dtype no format has). */
export function inputFormOf(w: TensorRef): InputForm {
  const f = findFormat(w.dtype);
  if (w.exact && f?.exactGemv) return "f32";
  return f?.input ?? "f32";
}

/** Bytes `w` decodes to for a batch ({@link exactBatchJob}); 0 when it multiplies batches as stored. */
export function batchDecodeBytes(w: TensorRef): number {
  const f = findFormat(w.dtype);
  if (!w.exact || !f?.exactGemm) return 0;
  return storedBytes(f.exactGemm.as as StoredDtype, [w.rows, w.cols]);
}

/**
 * For `exact` weights whose format multiplies batches through a decoded copy (MXFP4, INT4 as
 * shipped): the job computing Y[b] = W · X[b] for the `nb` vectors through arena offset `scratch`
 * ({@link batchDecodeBytes} bytes), when `nb` reaches the format's `minBatch` and a scratch is
 * given; else null (the per-vector exact kernel runs, with the same bits).
 */
export function exactBatchJob(
  w: TensorRef,
  x: number,
  y: number,
  nb: number,
  scratch?: number,
): Job | null {
  const f = findFormat(w.dtype);
  const g = f?.exactGemm;
  if (!w.exact || !g || nb < Math.max(2, g.minBatch) || scratch === undefined) return null;
  if (w.scale === undefined) throw new Error(`${w.dtype} weights need a scale tensor`);
  return {
    kernel: g.kernel,
    args: [
      BigInt(w.ptr),
      BigInt(w.scale),
      BigInt(x),
      BigInt(y),
      BigInt(scratch),
      w.rows,
      w.cols,
      nb,
    ],
    rows: w.rows,
  };
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
  const f = findFormat(w.dtype);
  const gemm = f?.gemm;
  if (gemm && nb > 1) {
    return [{
      kernel: gemm,
      args: [...weightArgs(w, f.gemv.scaled), BigInt(x), BigInt(y), w.rows, w.cols, nb],
      rows: w.rows,
    }];
  }
  if (!f) throw new Error(`no matmul kernel for weights stored as ${w.dtype}`);
  const g = w.exact && f.exactGemv ? f.exactGemv : f.gemv;
  const ws = weightArgs(w, g.scaled);
  const form = inputFormOf(w);
  if (form !== "f32" && prep?.length !== nb) {
    throw new Error(
      `${w.dtype} weights read a prepared (${form}) input: expected ${nb} prepared vectors, got ` +
        `${prep?.length ?? "none"}`,
    );
  }
  if (form === "lut" && w.paddedCols === undefined) {
    throw new Error(`${w.dtype} weights need their padded column count`);
  }
  const cols = form === "lut" ? w.paddedCols! : w.cols;
  const jobs: Job[] = [];
  for (let b = 0; b < nb; b++) {
    const xb = BigInt(form === "f32" ? x + b * w.cols * 4 : prep![b]);
    const yb = BigInt(y + b * w.rows * 4);
    jobs.push({ kernel: g.kernel, args: [...ws, xb, yb, w.rows, cols], rows: w.rows });
  }
  return jobs;
}

/** A kernel's leading weight arguments: the data pointer, then the scales' when `scaled`. */
function weightArgs(w: TensorRef, scaled: boolean): bigint[] {
  if (!scaled) return [BigInt(w.ptr)];
  if (w.scale === undefined) throw new Error(`${w.dtype} weights need a scale tensor`);
  return [BigInt(w.ptr), BigInt(w.scale)];
}
