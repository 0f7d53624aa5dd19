/**
 * Typed view of the compact-weight kernels in wasm/kernels.wasm (kernels/quant_*.c). Pointers
 * are arena byte offsets (bigint, wasm64); counts are numbers. Row-split kernels take [r0, r1)
 * and a row's value never depends on the split.
 *
 * MXFP4 and INT4 multiply by a Q8 copy of x (int8 per 32-block with an f32 scale) that
 * quantize_act_q8 writes once per input vector; VQ3R multiplies through a table vq3r_lut builds
 * once per input vector, VQ4P through the int8 table vq4p_lut builds. Formats: engine/quant/*.ts;
 * layouts: kernels/quant.h and the C files.
 *
 * @module
 */
import type { Ptr } from "./mod.ts";

/**
 * A batched exact kernel: Y[b·rows + r] = Σ_c W[r,c]·X[b·cols + c] for the nb vectors of X, rows
 * [r0, r1), the weights decoded exactly into scratch D ([rows, cols] of the decoded dtype; a call
 * writes only its own rows) and multiplied by the GEMM, a tile of rows at a time.
 */
export type ExactBatchKernel = (
  W: Ptr,
  S: Ptr,
  X: Ptr,
  Y: Ptr,
  D: Ptr,
  rows: number,
  cols: number,
  nb: number,
  r0: number,
  r1: number,
) => void;

/** The compact-weight kernels. */
export interface QuantKernels {
  /** x f32 [cols] → Q8 blocks at xq (q8Bytes(cols) bytes); cols a multiple of 32. */
  quantize_act_q8(x: Ptr, xq: Ptr, cols: number): void;
  /** g = silu(g)·u, then g quantised into xq as quantize_act_q8 does, on 32-blocks [b0, b1). */
  silu_mul_q8_range(g: Ptr, u: Ptr, xq: Ptr, cols: number, b0: number, b1: number): void;
  /** y[r] = Σ_c W[r,c]·x[c]: W MXFP4 [rows, cols/2] bytes, S E8M0 [rows, cols/32], xq Q8 of x. */
  matvec_mxfp4(
    W: Ptr,
    S: Ptr,
    xq: Ptr,
    y: Ptr,
    rows: number,
    cols: number,
    r0: number,
    r1: number,
  ): void;
  /**
   * matvec_mxfp4 with f32 x instead of its Q8 copy: each weight its exact value, the row dots of
   * gemm_bf16, so a batch's columns through dequant_mxfp4_bf16 + gemm_bf16 equal it bit for bit.
   */
  matvec_mxfp4_exact(
    W: Ptr,
    S: Ptr,
    x: Ptr,
    y: Ptr,
    rows: number,
    cols: number,
    r0: number,
    r1: number,
  ): void;
  /** Batches through MXFP4 W: decoded as bf16, gemm_bf16; matvec_mxfp4_exact's bits. */
  gemm_mxfp4_exact: ExactBatchKernel;
  /** Rows [r0, r1) of MXFP4 W (scales S) written to out as bf16 [rows, cols], exactly. */
  dequant_mxfp4_bf16(
    W: Ptr,
    S: Ptr,
    out: Ptr,
    rows: number,
    cols: number,
    r0: number,
    r1: number,
  ): void;
  /** y[r] = Σ_c W[r,c]·x[c]: W int4 packed [rows, cols/8] int32, S bf16 [rows, cols/32], xq Q8. */
  matvec_int4g32(
    W: Ptr,
    S: Ptr,
    xq: Ptr,
    y: Ptr,
    rows: number,
    cols: number,
    r0: number,
    r1: number,
  ): void;
  /**
   * matvec_int4g32 with f32 x instead of its Q8 copy: each weight its exact value q·scale, the row
   * dots of gemm_f32, so a batch's columns through dequant_int4g32_f32 + gemm_f32 equal it bit
   * for bit.
   */
  matvec_int4g32_exact(
    W: Ptr,
    S: Ptr,
    x: Ptr,
    y: Ptr,
    rows: number,
    cols: number,
    r0: number,
    r1: number,
  ): void;
  /** Batches through INT4 g32 W: decoded as f32, gemm_f32; matvec_int4g32_exact's bits. */
  gemm_int4g32_exact: ExactBatchKernel;
  /** Rows [r0, r1) of INT4 g32 W (bf16 scales S) written to out as f32 [rows, cols], exactly. */
  dequant_int4g32_f32(
    W: Ptr,
    S: Ptr,
    out: Ptr,
    rows: number,
    cols: number,
    r0: number,
    r1: number,
  ): void;
  /** y[r] = Σ_c W[r,c]·x[c]: W e4m3fn [rows, cols], S f32 [⌈rows/128⌉, ⌈cols/128⌉], x f32. */
  matvec_fp8b128(
    W: Ptr,
    S: Ptr,
    x: Ptr,
    y: Ptr,
    rows: number,
    cols: number,
    r0: number,
    r1: number,
  ): void;
  /** Y[b·rows + r] = Σ_c W[r,c]·X[b·cols + c] for nb vectors; each column matvec_fp8b128's bits. */
  gemm_fp8b128(
    W: Ptr,
    S: Ptr,
    X: Ptr,
    Y: Ptr,
    rows: number,
    cols: number,
    nb: number,
    r0: number,
    r1: number,
  ): void;
  /** y[r] = S[r]·Σ_c W[r,c]·x[c]: W int8 [rows, cols], S f32 [rows], x f32. */
  matvec_int8row(
    W: Ptr,
    S: Ptr,
    x: Ptr,
    y: Ptr,
    rows: number,
    cols: number,
    r0: number,
    r1: number,
  ): void;
  /** lut f32 [3][cols/8][256] = dots of codebooks C f32 [3][8][256] with each 8-chunk of x. */
  vq3r_lut(C: Ptr, x: Ptr, lut: Ptr, cols: number): void;
  /** y[r] = S[r]·Σ_k Σ_s lut[s][k][I[r][s][k]]: I u8 [rows][3][cols/8], S f32 [rows]. */
  matvec_vq3r(
    I: Ptr,
    S: Ptr,
    lut: Ptr,
    y: Ptr,
    rows: number,
    cols: number,
    r0: number,
    r1: number,
  ): void;
  /** lut int8 [cols/8][4][64] + f32 scales (vq4pLutBytes) from codebooks C f32 [4][8][64], x. */
  vq4p_lut(C: Ptr, x: Ptr, lut: Ptr, cols: number): void;
  /** y[r] = S[r]·Σ_g Σ_s q[g][s]·Σ_{k∈g} lut[k][s][i_s(r, k)]: I as engine/quant/vq4p.ts. */
  matvec_vq4p(
    I: Ptr,
    S: Ptr,
    lut: Ptr,
    y: Ptr,
    rows: number,
    cols: number,
    r0: number,
    r1: number,
  ): void;
}

/** Names of the functions in {@link QuantKernels}. */
export const QUANT_KERNEL_NAMES: readonly (keyof QuantKernels)[] = [
  "quantize_act_q8",
  "silu_mul_q8_range",
  "matvec_mxfp4",
  "matvec_mxfp4_exact",
  "gemm_mxfp4_exact",
  "dequant_mxfp4_bf16",
  "matvec_int4g32",
  "matvec_int4g32_exact",
  "gemm_int4g32_exact",
  "dequant_int4g32_f32",
  "matvec_fp8b128",
  "gemm_fp8b128",
  "matvec_int8row",
  "vq3r_lut",
  "matvec_vq3r",
  "vq4p_lut",
  "matvec_vq4p",
];

/** Bytes of the Q8 copy of a cols-vector: cols int8, then cols/32 f32 scales and i32 sums. */
export function q8Bytes(cols: number): number {
  return cols + (cols / 32) * 8;
}

/** Floats of a VQ3R lookup table for a cols-vector. */
export function vq3rLutFloats(cols: number): number {
  return 3 * (cols / 8) * 256;
}

/** Chunks of 8 columns per VQ4P table-scale group. */
export const VQ4P_LUT_GROUP = 16;

/**
 * Bytes of a VQ4P matvec table for a cols-vector: int8 [cols/8][4][64], then f32 scales
 * [ceil(cols/128)][4] (one per stage per group of 16 chunks).
 */
export function vq4pLutBytes(cols: number): number {
  const nch = cols / 8;
  return nch * 4 * 64 + Math.ceil(nch / VQ4P_LUT_GROUP) * 4 * 4;
}

/** The quant kernels from an instance's exports; throws naming the first one missing. */
export function quantKernels(exports: WebAssembly.Exports): QuantKernels {
  const out: Record<string, unknown> = {};
  for (const name of QUANT_KERNEL_NAMES) {
    if (typeof exports[name] !== "function") {
      throw new Error(`kernels.wasm does not export ${name}: rebuild with deno task build:wasm`);
    }
    out[name] = exports[name];
  }
  return out as unknown as QuantKernels;
}
