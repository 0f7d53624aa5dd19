/**
 * The batched row of `bench kernels`: `gemm_fp8b128` (prefill of FP8-block models: MiniMax-M2,
 * DeepSeek-V3, GLM FP8) against `gemm_bf16` at the same shape and batch, and with `--baseline`
 * against the baseline build's `gemm_fp8b128`, timed in alternation (best of each). One matrix at
 * a MiniMax-M2 expert's shape (1536 × 3072) against 128 columns (a prefill chunk's tokens): the
 * weights stay in cache, so the figure is the kernel's compute rate, in token-weights per second.
 *
 * @module
 */
import { bestAlternating } from "./alternate.ts";
import type { Arena } from "../../../engine/arena.ts";
import type { Pool } from "../../../engine/pool.ts";

/** The batched kernels at one thread count. */
export interface GemmPoint {
  threads: number;
  rows: number;
  cols: number;
  /** Batch columns (tokens) per call. */
  columns: number;
  /** Token-weights multiplied per second, in billions. */
  fp8_gweights_per_s: number;
  bf16_gweights_per_s: number;
  /** `gemm_fp8b128` ÷ `gemm_bf16`. */
  fp8_over_bf16: number;
  /** The baseline build's `gemm_fp8b128` (null without `--baseline`). */
  baseline_fp8_gweights_per_s: number | null;
  /** This build's ÷ the baseline's `gemm_fp8b128` (null without `--baseline`). */
  fp8_over_baseline: number | null;
}

const ROWS = 1536;
const COLS = 3072;
const COLUMNS = 128;
const ROUNDS = 3;

/**
 * Times the batched kernels on `pool` (and `base`, the baseline build's pool, when given) with
 * weights and scales from `region` (the bench's finite filler) and X, Y placed after them; X is
 * overwritten with floats in [−1, 1), so the caller refills the region afterwards.
 */
export function timeGemm(
  arena: Arena,
  pool: Pool,
  base: Pool | null,
  region: { off: number; bytes: number },
): GemmPoint {
  const columns = COLUMNS;
  const W = region.off, S = W + ROWS * COLS * 2;
  const X = S + Math.ceil(ROWS / 128) * Math.ceil(COLS / 128) * 4;
  const Y = X + columns * COLS * 4;
  if (Y + columns * ROWS * 4 > region.off + region.bytes) {
    throw new Error(`bench kernels: the gemm row needs more than the ${region.bytes}-byte region`);
  }
  const x = arena.f32(X, columns * COLS);
  for (let i = 0; i < x.length; i++) x[i] = ((i * 2654435761) % 1000) / 500 - 1;
  const fp8 = [BigInt(W), BigInt(S), BigInt(X), BigInt(Y), ROWS, COLS, columns];
  const bf16 = [BigInt(W), BigInt(X), BigInt(Y), ROWS, COLS, columns];
  const work = ROWS * COLS * columns;
  const rate = (p: Pool, kernel: string, args: (number | bigint)[]) => {
    p.run1(kernel, args, ROWS, work); // Warm-up: the optimised tier.
    let best = Infinity;
    for (let i = 0; i < 2; i++) {
      const t0 = performance.now();
      p.run1(kernel, args, ROWS, work);
      best = Math.min(best, (performance.now() - t0) / 1000);
    }
    return work / best / 1e9;
  };
  const [f, b, old] = bestAlternating(ROUNDS, [
    () => rate(pool, "gemm_fp8b128", fp8),
    () => rate(pool, "gemm_bf16", bf16),
    ...base ? [() => rate(base, "gemm_fp8b128", fp8)] : [],
  ]);
  return {
    threads: pool.threads,
    rows: ROWS,
    cols: COLS,
    columns,
    fp8_gweights_per_s: f,
    bf16_gweights_per_s: b,
    fp8_over_bf16: f / b,
    baseline_fp8_gweights_per_s: base ? old : null,
    fp8_over_baseline: base ? f / old : null,
  };
}
