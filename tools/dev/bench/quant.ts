/**
 * Throughput of the compact-weight matvec kernels (MXFP4, FP8 128×128, INT4 g32, int8 per row,
 * VQ3R) next to the bf16 GEMV: packed GB/s and G weights/s streaming a matrix far larger than the
 * caches. A case runs any row range, so a multi-thread harness can hand each worker its share of
 * the same case (the kernels are row-split); run alone it measures one thread:
 * `npx deno run -A tools/dev/bench/quant.ts [--mib 256] [--passes 5] [--cols 4096]`.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { createArenaMemory, KERNEL_RESERVED_BYTES, loadKernelModule } from "../../../wasm/mod.ts";
import {
  q8Bytes,
  type QuantKernels,
  quantKernels,
  vq3rLutFloats,
} from "../../../wasm/quant_kernels.ts";

const MiB = 1024 * 1024;

/** Formats measured, in report order. */
export const QUANT_BENCH_FORMATS = [
  "bf16",
  "mxfp4",
  "mxfp4_exact",
  "fp8",
  "int4",
  "int4_exact",
  "int8",
  "vq3r",
] as const;
/** One of {@link QUANT_BENCH_FORMATS}. */
export type QuantBenchFormat = typeof QUANT_BENCH_FORMATS[number];

/** A prepared matvec: its sizes and a call over rows [r0, r1). */
export interface QuantBenchCase {
  format: QuantBenchFormat;
  rows: number;
  cols: number;
  /** Bytes the kernel streams over all rows (weights plus scales). */
  bytes: number;
  /** Per-input-vector work done once before the row-split matvec (Q8 copy or VQ3R table). */
  prepare(): void;
  run(r0: number, r1: number): void;
}

/** Packed bytes per row of `cols` weights, scales included. */
function rowBytes(format: QuantBenchFormat, cols: number): number {
  switch (format) {
    case "bf16":
      return 2 * cols;
    case "mxfp4":
    case "mxfp4_exact":
      return cols / 2 + cols / 32;
    case "fp8":
      return cols + (4 * cols) / 128 / 128;
    case "int4":
    case "int4_exact":
      return cols / 2 + (2 * cols) / 32;
    case "int8":
      return cols + 4;
    case "vq3r":
      return (3 * cols) / 8 + 4;
  }
}

function fillRandom(u8: Uint8Array): void {
  for (let i = 0; i < u8.length; i += 65536) crypto.getRandomValues(u8.subarray(i, i + 65536));
}

/**
 * Writes a random `format` matrix of about `bytes` packed bytes at arena offset `base` (valid
 * codes, moderate scales) and returns the case. Cases share the region: prepare one at a time.
 */
export function prepareQuantCase(
  memory: WebAssembly.Memory,
  exports: WebAssembly.Exports,
  base: number,
  format: QuantBenchFormat,
  bytes: number,
  cols: number,
): QuantBenchCase {
  const qk: QuantKernels = quantKernels(exports);
  const gemv = exports.gemv_bf16 as (...a: (bigint | number)[]) => void;
  const rows = Math.floor(bytes / rowBytes(format, cols) / 128) * 128;
  const buf = memory.buffer;
  let off = base;
  const take = (n: number): number => {
    const p = off;
    off += Math.ceil(n / 4096) * 4096;
    return p;
  };
  const x = take(cols * 4),
    y = take(rows * 4),
    scratch = take(Math.max(q8Bytes(cols), vq3rLutFloats(cols) * 4));
  const xs = new Float32Array(buf, x, cols);
  for (let i = 0; i < cols; i++) xs[i] = Math.sin(i * 0.37) * 2;
  const W = take(rows * rowBytes(format, cols));
  const [pX, pY, pT] = [BigInt(x), BigInt(y), BigInt(scratch)];
  const pW = BigInt(W);
  const noPrep = () => {};
  const caseOf = (prepare: () => void, run: (r0: number, r1: number) => void) => ({
    format,
    rows,
    cols,
    bytes: rows * rowBytes(format, cols),
    prepare,
    run,
  });
  switch (format) {
    case "bf16": {
      const w = new Uint16Array(buf, W, rows * cols);
      fillRandom(new Uint8Array(buf, W, rows * cols * 2));
      for (let i = 0; i < w.length; i++) w[i] = (w[i] & 0x80ff) | 0x3f00; // finite, |w| in [0.5, 2)
      return caseOf(noPrep, (r0, r1) => gemv(pW, pX, pY, rows, cols, r0, r1));
    }
    case "mxfp4": {
      fillRandom(new Uint8Array(buf, W, (rows * cols) / 2));
      const S = take((rows * cols) / 32);
      new Uint8Array(buf, S, (rows * cols) / 32).fill(120);
      const pS = BigInt(S);
      return caseOf(
        () => qk.quantize_act_q8(pX, pT, cols),
        (r0, r1) => qk.matvec_mxfp4(pW, pS, pT, pY, rows, cols, r0, r1),
      );
    }
    case "mxfp4_exact": {
      // gpt-oss's shipped MXFP4 times f32 activations (no Q8 copy to prepare).
      fillRandom(new Uint8Array(buf, W, (rows * cols) / 2));
      const S = take((rows * cols) / 32);
      new Uint8Array(buf, S, (rows * cols) / 32).fill(120);
      const pS = BigInt(S);
      return caseOf(noPrep, (r0, r1) => qk.matvec_mxfp4_exact(pW, pS, pX, pY, rows, cols, r0, r1));
    }
    case "int4": {
      fillRandom(new Uint8Array(buf, W, (rows * cols) / 2));
      const S = take((rows * cols) / 16);
      new Uint16Array(buf, S, (rows * cols) / 32).fill(0x3c00);
      const pS = BigInt(S);
      return caseOf(
        () => qk.quantize_act_q8(pX, pT, cols),
        (r0, r1) => qk.matvec_int4g32(pW, pS, pT, pY, rows, cols, r0, r1),
      );
    }
    case "int4_exact": {
      // Kimi-K2's shipped INT4 times f32 activations (no Q8 copy to prepare).
      fillRandom(new Uint8Array(buf, W, (rows * cols) / 2));
      const S = take((rows * cols) / 16);
      new Uint16Array(buf, S, (rows * cols) / 32).fill(0x3c00);
      const pS = BigInt(S);
      return caseOf(
        noPrep,
        (r0, r1) => qk.matvec_int4g32_exact(pW, pS, pX, pY, rows, cols, r0, r1),
      );
    }
    case "fp8": {
      const w = new Uint8Array(buf, W, rows * cols);
      fillRandom(w);
      // No NaN codes, and no subnormals (exponent 0): those cost an x86 denormal assist in the
      // decoder's multiply (6x slower when 1/16 of the codes are subnormal, as in uniform
      // bytes); real block-scaled checkpoints have very few.
      for (let i = 0; i < w.length; i++) {
        if ((w[i] & 0x7f) === 0x7f) w[i] = 0x7e;
        else if ((w[i] & 0x78) === 0) w[i] |= 0x08;
      }
      const n = Math.ceil(rows / 128) * Math.ceil(cols / 128);
      const S = take(n * 4);
      new Float32Array(buf, S, n).fill(0.01);
      const pS = BigInt(S);
      return caseOf(noPrep, (r0, r1) => qk.matvec_fp8b128(pW, pS, pX, pY, rows, cols, r0, r1));
    }
    case "int8": {
      fillRandom(new Uint8Array(buf, W, rows * cols));
      const S = take(rows * 4);
      new Float32Array(buf, S, rows).fill(0.01);
      const pS = BigInt(S);
      return caseOf(noPrep, (r0, r1) => qk.matvec_int8row(pW, pS, pX, pY, rows, cols, r0, r1));
    }
    case "vq3r": {
      fillRandom(new Uint8Array(buf, W, (rows * cols * 3) / 8));
      const S = take(rows * 4), C = take(3 * 8 * 256 * 4);
      new Float32Array(buf, S, rows).fill(0.01);
      const cb = new Float32Array(buf, C, 3 * 8 * 256);
      for (let i = 0; i < cb.length; i++) cb[i] = Math.cos(i * 0.11);
      const [pS, pC] = [BigInt(S), BigInt(C)];
      return caseOf(
        () => qk.vq3r_lut(pC, pX, pT, cols),
        (r0, r1) => qk.matvec_vq3r(pW, pS, pT, pY, rows, cols, r0, r1),
      );
    }
  }
}

/** Arena bytes {@link prepareQuantCase} needs for `bytes` of packed weights. */
export function quantBenchArenaBytes(bytes: number, cols: number): number {
  // The largest case (bf16) rounds its rows down, so the weights never exceed `bytes`; scales,
  // x, y and the scratch table fit in the slack added here.
  return KERNEL_RESERVED_BYTES + bytes + Math.ceil(bytes / 16) + 16 * MiB + cols * 64;
}

/** One format's measurement. */
export interface QuantBenchResult {
  format: QuantBenchFormat;
  rows: number;
  cols: number;
  bytes: number;
  /** Best pass, seconds (matvec only; the per-vector prepare is timed apart). */
  seconds: number;
  gbPerS: number;
  gWeightsPerS: number;
  /** Seconds of the per-input-vector prepare step (0 when none). */
  prepareSeconds: number;
}

/** Times `c` on one thread over all rows: best of `passes`. */
export function timeQuantCase(c: QuantBenchCase, passes: number): QuantBenchResult {
  c.prepare();
  let prepareSeconds = Infinity, seconds = Infinity;
  for (let p = 0; p < passes; p++) {
    let t0 = performance.now();
    c.prepare();
    prepareSeconds = Math.min(prepareSeconds, (performance.now() - t0) / 1000);
    t0 = performance.now();
    c.run(0, c.rows);
    seconds = Math.min(seconds, (performance.now() - t0) / 1000);
  }
  const weights = c.rows * c.cols;
  return {
    format: c.format,
    rows: c.rows,
    cols: c.cols,
    bytes: c.bytes,
    seconds,
    gbPerS: c.bytes / seconds / 1e9,
    gWeightsPerS: weights / seconds / 1e9,
    prepareSeconds: c.format === "bf16" || c.format === "fp8" || c.format === "int8"
      ? 0
      : prepareSeconds,
  };
}

/** Measures every format on one thread, each on about `mib` MiB of packed weights. */
export async function benchQuant(
  mib = 256,
  passes = 5,
  cols = 4096,
  formats: readonly QuantBenchFormat[] = QUANT_BENCH_FORMATS,
): Promise<QuantBenchResult[]> {
  const bytes = mib * MiB;
  const memory = createArenaMemory(quantBenchArenaBytes(bytes, cols));
  const instance = await WebAssembly.instantiate(await loadKernelModule(), { env: { memory } });
  const out: QuantBenchResult[] = [];
  for (const f of formats) {
    const c = prepareQuantCase(memory, instance.exports, KERNEL_RESERVED_BYTES, f, bytes, cols);
    out.push(timeQuantCase(c, passes));
  }
  return out;
}

if (import.meta.main) {
  const { values } = parseArgs({
    options: {
      mib: { type: "string", default: "256" },
      passes: { type: "string", default: "5" },
      cols: { type: "string", default: "4096" },
    },
  });
  const results = await benchQuant(Number(values.mib), Number(values.passes), Number(values.cols));
  console.log("format   rows     cols   MiB    GB/s   Gweights/s  prepare µs");
  for (const r of results) {
    console.log(
      `${r.format.padEnd(8)} ${String(r.rows).padEnd(8)} ${String(r.cols).padEnd(6)} ` +
        `${(r.bytes / MiB).toFixed(0).padStart(4)} ${r.gbPerS.toFixed(2).padStart(7)} ` +
        `${r.gWeightsPerS.toFixed(2).padStart(10)} ${
          (r.prepareSeconds * 1e6).toFixed(0).padStart(10)
        }`,
    );
  }
}
