/**
 * `bench kernels`: the machine's limits and how close the kernels get to them, in one run.
 * DRAM read bandwidth (native sum, dram.ts), f32/bf16 GEMV and the quantised matvecs through the
 * worker pool on cold matrices for 1..N threads, pool dispatch latency, and O_DIRECT vs buffered
 * disk reads (disk.ts), with the ratios checked against the design targets.
 *
 * Options: `--json` (one JSON object on stdout), `--quick` (small sizes, a smoke run),
 * `--threads N` (largest thread count, default all cores), `--skip-disk`, `--baseline <kernels.wasm>`
 * (bf16 and the paired formats also timed with another build's kernels, in alternation).
 *
 * @module
 */

import type { WeightFormat } from "../../../engine/quant/format.ts";
import { WEIGHT_FORMATS } from "../../../engine/quant/mod.ts";
import { scaleSpecOf, storedBytes } from "../../../io/format.ts";
import { alignUp } from "../../../io/format.ts";
import { parseArgs } from "node:util";
import { Arena, PAGE } from "../../../engine/arena.ts";
import { defaultThreads, type Job, MIN_PARALLEL_WORK, Pool } from "../../../engine/pool.ts";
import { ROW_BLOCK } from "../../../engine/pool_protocol.ts";
import { loadKernelModule, type Ptr } from "../../../wasm/mod.ts";
import { q8Bytes, vq3rLutFloats } from "../../../wasm/quant_kernels.ts";
import { bestAlternating } from "./alternate.ts";
import { benchDisk, type DiskBenchResult } from "./disk.ts";
import { type DramResult, measureDramNative } from "../../../io/dram_probe.ts";
import { kdaBenchInputs, type KdaRow, timeKdaKernels } from "./kda.ts";
import { type GemmPoint, timeGemm } from "./gemm.ts";

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

/** Options of {@link runKernelBench}. */
export interface KernelBenchOptions {
  /** Small sizes for a fast smoke run; the figures are then not meaningful. */
  quick: boolean;
  /** Largest thread count measured (tables go 1..threads); the pool's default when absent. */
  threads?: number;
  /** Skip the disk measurement. */
  skipDisk: boolean;
  /**
   * Path of another build's kernels.wasm: bf16 and the {@link PAIRED_FORMATS} are also timed with
   * its kernels, in alternation with this build's (old against new in one run).
   */
  baseline?: string;
  /** Progress lines (default: stderr). */
  log?: (line: string) => void;
}

/** Throughput of one weight format and shape at one thread count. */
export interface GemvPoint {
  threads: number;
  /** Weight bytes (scales included) streamed per second, GB/s. */
  gbps: number;
  /** Weights multiplied per second, in billions. */
  gweights_per_s: number;
  /** Cores that other processes kept busy during the best pass (null where /proc is absent). */
  other_cores: number | null;
}

/** A format and bf16 timed in alternation at one thread count. */
export interface PairedPoint {
  /** The format set against bf16 (a {@link BENCH_FORMATS} name). */
  format: string;
  threads: number;
  bf16_gweights_per_s: number;
  gweights_per_s: number;
  /** The format's ÷ bf16's weights per second. */
  ratio: number;
}

/** A format timed with this build's kernels and with a baseline build's, in alternation. */
export interface BaselinePoint {
  format: string;
  threads: number;
  gweights_per_s: number;
  baseline_gweights_per_s: number;
  /** This build's ÷ the baseline's weights per second. */
  ratio: number;
}

/** One weight format and shape, over every thread count. */
export interface GemvRow {
  format: string;
  kernel: string;
  rows: number;
  cols: number;
  /** Distinct matrices cycled through, so none stays in cache. */
  matrices: number;
  /** Bytes of all those matrices: one timed pass reads each once. */
  bytes_per_pass: number;
  by_threads: GemvPoint[];
}

/** A measured ratio against its design target. */
export interface RatioCheck {
  name: string;
  value: number | null;
  target: number;
  /** ">=": the value must reach the target; "<=": it must not exceed it. */
  kind: ">=" | "<=";
  /** null when the value could not be measured. */
  pass: boolean | null;
}

/** Everything `bench kernels` measured; the `--json` output. */
export interface KernelBenchReport {
  date: string;
  command: string;
  quick: boolean;
  machine: { cpu: string; cores: number; ram_gib: number; cpu_flags: string[] };
  /** /proc/loadavg's 1, 5 and 15 minute figures at the start. */
  load_average: number[];
  /** True when the 1-minute load average was above 0.5: the figures are suspect. */
  machine_busy: boolean;
  threads: number[];
  dram: DramResult;
  dram_read_gbps: number;
  /** True when a GEMV streamed faster than the DRAM read: the ceiling was measured under load. */
  dram_suspect: boolean;
  gemv: GemvRow[];
  /** `gemm_fp8b128` against `gemm_bf16` (and the baseline's) at 128 columns (gemm.ts). */
  gemm: GemmPoint[];
  /** KDA's decode recurrence and short conv at Kimi-Linear-48B's shape (tools/dev/bench/kda.ts). */
  kda: KdaRow[];
  f32_gemv_gbps: number;
  bf16_gemv_gbps: number;
  f32_gweights_per_s: number;
  bf16_gweights_per_s: number;
  mxfp4_gweights_per_s: number | null;
  vq3r_gweights_per_s: number | null;
  vq4p_gweights_per_s: number | null;
  /**
   * The formats with a weights/s target ({@link PAIRED_FORMATS}) against bf16 on the first shape,
   * each timed in alternation with bf16 (best of each), per format and thread count: a ratio that
   * survives load which comes and goes between formats.
   */
  vs_bf16: PairedPoint[];
  /** With `--baseline`: bf16 and the paired formats against the baseline build's kernels. */
  vs_baseline: BaselinePoint[];
  int8_gweights_per_s: number | null;
  int4_gweights_per_s: number | null;
  fp8_gweights_per_s: number | null;
  dispatch_threads: number;
  dispatch_samples: number;
  dispatch_median_us: number;
  dispatch_p99_us: number;
  /** As dispatch_median_us when the workers have parked in Atomics.wait (a futex wake each). */
  dispatch_parked_median_us: number;
  dispatch_parked_p99_us: number;
  /** The same tiny GEMV called directly on the main thread: the floor under the dispatch. */
  direct_call_median_us: number;
  disk: (DiskBenchResult & { bytes: number }) | null;
  odirect_read_gbps: number | null;
  buffered_read_gbps: number | null;
  dd_direct_gbps: number | null;
  ratios: RatioCheck[];
}

type KernelFn = (...a: (number | bigint)[]) => unknown;

/** Arena offsets of the per-input-vector buffers every format shares. */
interface Scratch {
  x: Ptr;
  xq: Ptr;
  lut: Ptr;
  codebooks: Ptr;
  y: Ptr;
}

/**
 * A weight format as the bench drives it: the bytes of one matrix and the kernel call, derived
 * from the weight-format registry (engine/quant/mod.ts), so a new format is measured here too.
 * Formats that another bench (tools/dev/bench/quant.ts) times single-threaded are measured here
 * through the pool.
 */
export interface BenchFormat {
  /** Short name (the `--experts` choice), also the JSON key prefix (`<name>_gweights_per_s`). */
  name: string;
  /** Exported kernel: (W, S?, x-ish, y, rows, cols, r0, r1). */
  kernel: string;
  /** Bytes of the weights (codes) of a rows × cols matrix. */
  weightBytes(rows: number, cols: number): number;
  /** Bytes of its scales (0 for none). */
  scaleBytes(rows: number, cols: number): number;
  /** The kernel's arguments before the row range. */
  args(W: Ptr, S: Ptr, s: Scratch, rows: number, cols: number): (number | bigint)[];
  /** Work done once per input vector and shared by all matrices (not timed). */
  prepare?(k: Record<string, KernelFn>, s: Scratch, cols: number): void;
}

/** A registry format's bench entry; `exact`: its f32-input kernel for shipped weights instead. */
function benchFormat(f: WeightFormat, exact = false): BenchFormat {
  const form = exact ? "f32" : f.input;
  const g = exact ? f.exactGemv! : f.gemv;
  const input = (s: Scratch) => form === "q8" ? s.xq : form === "lut" ? s.lut : s.x;
  return {
    name: exact ? `${f.option}_exact` : f.option!,
    kernel: g.kernel,
    weightBytes: (r, c) => storedBytes(f.id, [r, c]),
    scaleBytes(r, c) {
      const spec = scaleSpecOf(f.id, [r, c]);
      return spec ? storedBytes(spec.dtype, spec.shape) : 0;
    },
    args: (W, S, s, r, c) => g.scaled ? [W, S, input(s), s.y, r, c] : [W, input(s), s.y, r, c],
    prepare: form === "q8"
      ? (k, s, c) => k.quantize_act_q8(s.x, s.xq, c)
      : form === "lut"
      ? (k, s, c) => k[f.table!.kernel](s.codebooks, s.x, s.lut, c)
      : undefined,
  };
}

/**
 * The formats measured (every `--experts` choice, each followed by its exact kernel when it has
 * one, `<name>_exact`), in registry order.
 */
export const BENCH_FORMATS: BenchFormat[] = WEIGHT_FORMATS.filter((f) => f.option).flatMap((f) =>
  f.exactGemv ? [benchFormat(f), benchFormat(f, true)] : [benchFormat(f)]
);

/** Design targets (docs/DESIGN.md): kernel throughput against the machine's ceilings. */
export const TARGETS = {
  bf16_over_dram: 0.65,
  f32_over_dram: 0.85,
  kda_state_over_dram: 0.7,
  dispatch_median_us: 5,
  odirect_over_dd: 0.9,
  /** Issue 16: a 3-bit expert format at least as fast as bf16 in weights per second. */
  vq4p_over_bf16_weights: 1.0,
  /** Issue 29: shipped 4-bit experts (exact kernels) at least as fast as bf16 in weights/s. */
  exact4_over_bf16_weights: 1.0,
  /** A pinned FP8 trunk layer computes no slower than the same layer converted to bf16. */
  fp8_over_bf16_weights: 1.0,
};

/** The formats timed in alternation with bf16, each with its weights/s target against bf16. */
export const PAIRED_FORMATS: readonly { name: string; target: number }[] = [
  { name: "vq4p", target: TARGETS.vq4p_over_bf16_weights },
  { name: "mxfp4_exact", target: TARGETS.exact4_over_bf16_weights },
  { name: "int4_exact", target: TARGETS.exact4_over_bf16_weights },
  { name: "fp8", target: TARGETS.fp8_over_bf16_weights },
];

interface Sizes {
  region: number;
  shapes: [number, number][];
  dramBytes: number;
  passes: number;
  dispatchSamples: number;
  diskBytes: number;
}

const FULL: Sizes = {
  region: 1.25 * GiB,
  shapes: [[4096, 4096], [14336, 4096]],
  dramBytes: 2 * GiB,
  passes: 5,
  dispatchSamples: 20000,
  diskBytes: 2 * GiB,
};

const QUICK: Sizes = {
  region: 48 * MiB,
  shapes: [[1024, 1024], [3584, 1024]],
  dramBytes: 64 * MiB,
  passes: 2,
  dispatchSamples: 2000,
  diskBytes: 64 * MiB,
};

/** Model name, logical cores, RAM and the SIMD flags that matter here. */
function machineInfo(): KernelBenchReport["machine"] {
  let cpu = "unknown";
  let flags: string[] = [];
  try {
    const info = Deno.readTextFileSync("/proc/cpuinfo");
    cpu = /^model name\s*:\s*(.+)$/m.exec(info)?.[1]?.trim() ?? cpu;
    const all = /^flags\s*:\s*(.+)$/m.exec(info)?.[1]?.split(/\s+/) ?? [];
    const wanted = ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile"];
    flags = wanted.filter((f) => all.includes(f));
  } catch {
    // Not Linux: the model stays unknown.
  }
  return {
    cpu,
    cores: navigator.hardwareConcurrency || 1,
    ram_gib: Deno.systemMemoryInfo().total / GiB,
    cpu_flags: flags,
  };
}

/** The 1, 5 and 15 minute load averages, from /proc/loadavg where it exists. */
export function loadAverage(): number[] {
  try {
    return Deno.readTextFileSync("/proc/loadavg").trim().split(/\s+/).slice(0, 3).map(Number);
  } catch {
    return Deno.loadavg();
  }
}

/**
 * Fills `bytes` at `off` with data that is sane under every format's reading: each 16-bit half
 * is 0x3Fnn or 0xBFnn with nn in 0x60..0x7E, so f32, bf16, int8, fp8 and E8M0 scales all decode
 * to ordinary finite numbers (no NaN, no subnormals). Every page is written, so nothing reads
 * the kernel's shared zero page.
 */
function fillWeights(arena: Arena, off: number, bytes: number): void {
  const chunk = new Uint16Array(2 * MiB);
  for (let i = 0; i < chunk.length; i++) {
    const r = (Math.random() * 62) | 0;
    chunk[i] = (r & 1 ? 0xbf00 : 0x3f00) | (0x60 + (r >> 1));
  }
  const src = new Uint8Array(chunk.buffer);
  const dst = arena.u8(off, bytes);
  for (let o = 0; o < bytes; o += src.length) {
    dst.set(src.subarray(0, Math.min(src.length, bytes - o)), o);
  }
}

function fillFloats(arena: Arena, off: number, n: number): void {
  const v = arena.f32(off, n);
  for (let i = 0; i < n; i++) v[i] = Math.random() * 2 - 1;
}

/** Bytes one matrix takes in the region: weights, then scales, 64-byte and page aligned. */
function matrixStride(f: BenchFormat, rows: number, cols: number): number {
  return alignUp(alignUp(f.weightBytes(rows, cols), 64) + f.scaleBytes(rows, cols), PAGE);
}

/** Best-of-`passes` throughput of `f` at one shape, cycling through the region's matrices. */
function timeFormat(
  pool: Pool,
  f: BenchFormat,
  rows: number,
  cols: number,
  region: { off: number; bytes: number },
  scratch: Scratch,
  passes: number,
): { matrices: number; bytes: number; point: GemvPoint } {
  const stride = matrixStride(f, rows, cols);
  const matrices = Math.max(1, Math.floor(region.bytes / stride));
  f.prepare?.(pool.exports, scratch, cols);
  const jobs: Job[] = [];
  for (let i = 0; i < matrices; i++) {
    const W = region.off + i * stride;
    const S = W + alignUp(f.weightBytes(rows, cols), 64);
    jobs.push({ kernel: f.kernel, args: f.args(BigInt(W), BigInt(S), scratch, rows, cols), rows });
  }
  const work = rows * cols;
  const pass = () => {
    for (const job of jobs) pool.run([job], work);
  };
  pass(); // Warm-up: compiles the kernel's optimised tier and wakes the workers.
  let best = Infinity;
  let others: number | null = null;
  const cores = navigator.hardwareConcurrency || 1;
  for (let p = 0; p < passes; p++) {
    const c0 = cpuSample();
    const t0 = performance.now();
    pass();
    const seconds = (performance.now() - t0) / 1000;
    if (seconds < best) {
      best = seconds;
      others = otherCores(c0, cpuSample(), cores);
    }
  }
  const bytes = matrices * (f.weightBytes(rows, cols) + f.scaleBytes(rows, cols));
  return {
    matrices,
    bytes,
    point: {
      threads: pool.threads,
      gbps: bytes / best / 1e9,
      gweights_per_s: (matrices * rows * cols) / best / 1e9,
      other_cores: others,
    },
  };
}

/** Rounds of alternating timings in {@link timePaired} and {@link timeBaseline}. */
const PAIRED_ROUNDS = 3;

/** bf16 and the format `name` at one shape, timed in alternation; the best of each. */
function timePaired(
  pool: Pool,
  name: string,
  rows: number,
  cols: number,
  region: { off: number; bytes: number },
  scratch: Scratch,
  passes: number,
): PairedPoint {
  const [bf16, f] = ["bf16", name].map((n) => BENCH_FORMATS.find((f) => f.name === n)!);
  const [b, v] = bestAlternating(PAIRED_ROUNDS, [
    () => timeFormat(pool, bf16, rows, cols, region, scratch, passes).point.gweights_per_s,
    () => timeFormat(pool, f, rows, cols, region, scratch, passes).point.gweights_per_s,
  ]);
  return {
    format: name,
    threads: pool.threads,
    bf16_gweights_per_s: b,
    gweights_per_s: v,
    ratio: v / b,
  };
}

/** Format `name` with the kernels of `pool` and of `base`, timed in alternation; best of each. */
function timeBaseline(
  pool: Pool,
  base: Pool,
  name: string,
  rows: number,
  cols: number,
  region: { off: number; bytes: number },
  scratch: Scratch,
  passes: number,
): BaselinePoint {
  const f = BENCH_FORMATS.find((f) => f.name === name)!;
  const [b, v] = bestAlternating(PAIRED_ROUNDS, [
    () => timeFormat(base, f, rows, cols, region, scratch, passes).point.gweights_per_s,
    () => timeFormat(pool, f, rows, cols, region, scratch, passes).point.gweights_per_s,
  ]);
  return {
    format: name,
    threads: pool.threads,
    gweights_per_s: v,
    baseline_gweights_per_s: b,
    ratio: v / b,
  };
}

/** CPU time counters (jiffies) of the whole machine and of this process, from /proc. */
interface CpuSample {
  total: number;
  busy: number;
  self: number;
}

function cpuSample(): CpuSample | null {
  try {
    const all = Deno.readTextFileSync("/proc/stat").split("\n")[0].trim().split(/\s+/);
    const [user, nice, system, idle, iowait, irq, softirq, steal] = all.slice(1, 9).map(Number);
    // Fields after the command name (which may hold spaces): utime and stime are 12th and 13th.
    const own = Deno.readTextFileSync("/proc/self/stat").split(") ")[1].split(" ");
    const busy = user + nice + system + irq + softirq + steal;
    return { total: busy + idle + iowait, busy, self: Number(own[11]) + Number(own[12]) };
  } catch {
    return null;
  }
}

/** Cores' worth of CPU that other processes (or the hypervisor, as steal) used between a and b. */
function otherCores(a: CpuSample | null, b: CpuSample | null, cores: number): number | null {
  if (a === null || b === null || b.total <= a.total) return null;
  const others = (b.busy - a.busy) - (b.self - a.self);
  return Math.max(0, (others / (b.total - a.total)) * cores);
}

function percentile(sorted: number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

/** Median and p99 in µs of `samples` timings (ms) of `call`, each after `gapMs` of busy wait. */
function timeCalls(
  call: () => void,
  samples: number,
  gapMs: number,
): { median: number; p99: number } {
  const t = new Float64Array(samples);
  for (let i = 0; i < samples; i++) {
    if (gapMs > 0) {
      const until = performance.now() + gapMs;
      while (performance.now() < until) { /* let the workers give up spinning and park */ }
    }
    const t0 = performance.now();
    call();
    t[i] = performance.now() - t0;
  }
  const sorted = Array.from(t).sort((a, b) => a - b);
  return { median: percentile(sorted, 0.5) * 1000, p99: percentile(sorted, 0.99) * 1000 };
}

/** Dispatch latencies in µs; see {@link timeDispatch}. */
interface DispatchTimes {
  median: number;
  p99: number;
  parkedMedian: number;
  parkedP99: number;
  direct: number;
}

/**
 * Round-trip time of a dispatch that does almost nothing: a GEMV of one row block per thread,
 * forced through the workers by passing work = MIN_PARALLEL_WORK. Back to back (workers still
 * spinning), then after a 200 µs pause (workers parked in Atomics.wait, so each dispatch pays a
 * futex wake), and the same call made directly, which is the floor under both.
 */
function timeDispatch(pool: Pool, W: Ptr, scratch: Scratch, samples: number): DispatchTimes {
  const rows = ROW_BLOCK * pool.threads;
  const cols = 16;
  const args = [W, scratch.x, scratch.y, rows, cols];
  const dispatch = () => pool.run1("gemv_f32", args, rows, MIN_PARALLEL_WORK);
  timeCalls(dispatch, Math.min(2000, samples), 0);
  const spinning = timeCalls(dispatch, samples, 0);
  const parked = timeCalls(dispatch, Math.ceil(samples / 10), 0.2);
  const gemv = pool.exports.gemv_f32;
  const direct = timeCalls(() => gemv(W, scratch.x, scratch.y, rows, cols, 0, rows), samples, 0);
  return {
    median: spinning.median,
    p99: spinning.p99,
    parkedMedian: parked.median,
    parkedP99: parked.p99,
    direct: direct.median,
  };
}

/** The all-threads point of the best shape of format `name` (by `key`), or null. */
function bestAtMax(
  gemv: GemvRow[],
  name: string,
  key: "gbps" | "gweights_per_s",
): number | null {
  let best: number | null = null;
  for (const row of gemv) {
    if (row.format !== name) continue;
    const v = row.by_threads[row.by_threads.length - 1][key];
    if (best === null || v > best) best = v;
  }
  return best;
}

function check(name: string, value: number | null, target: number, kind: ">=" | "<="): RatioCheck {
  const pass = value === null || !Number.isFinite(value)
    ? null
    : kind === ">="
    ? value >= target
    : value <= target;
  return {
    name,
    value: value !== null && Number.isFinite(value) ? value : null,
    target,
    kind,
    pass,
  };
}

/** Runs every measurement once and returns the report (see {@link KernelBenchReport}). */
export async function runKernelBench(opts: KernelBenchOptions): Promise<KernelBenchReport> {
  const log = opts.log ?? ((line: string) => console.error(`bench kernels: ${line}`));
  const sizes = opts.quick ? QUICK : FULL;
  const maxThreads = opts.threads ?? defaultThreads();
  const threads = Array.from({ length: maxThreads }, (_, i) => i + 1);
  const load = loadAverage();
  const busy = load[0] > 0.5;
  if (busy) {
    log(`WARNING: load average ${load.join(" ")} > 0.5: other work is running, figures are low`);
  }

  log(`DRAM: native sum over ${(sizes.dramBytes / GiB).toFixed(2)} GiB`);
  const native = await measureDramNative({
    bytes: sizes.dramBytes,
    threads,
    passes: sizes.passes,
  });
  if (native === null) log("no C compiler: DRAM falls back to the f32 GEMV (a lower bound)");

  const arena = new Arena(sizes.region + 8 * MiB);
  const regionOff = arena.alloc("bench weights", sizes.region);
  const maxRows = Math.max(...sizes.shapes.map(([r]) => r));
  const maxCols = Math.max(...sizes.shapes.map(([, c]) => c));
  const scratch: Scratch = {
    x: BigInt(arena.alloc("x", maxCols * 4)),
    xq: BigInt(arena.alloc("x q8", q8Bytes(maxCols))),
    lut: BigInt(arena.alloc("vq3r lut", vq3rLutFloats(maxCols) * 4)),
    codebooks: BigInt(arena.alloc("vq3r codebooks", 3 * 8 * 256 * 4)),
    y: BigInt(arena.alloc("y", maxRows * 4)),
  };
  log(`filling ${(sizes.region / GiB).toFixed(2)} GiB of weights`);
  fillWeights(arena, regionOff, sizes.region);
  fillFloats(arena, Number(scratch.x), maxCols);
  fillFloats(arena, Number(scratch.codebooks), 3 * 8 * 256);
  const kdaInputs = kdaBenchInputs(arena);
  const kda: KdaRow[] = [];

  const module = await loadKernelModule();
  const baseModule = opts.baseline === undefined ? null : await compileBaseline(opts.baseline);
  const gemv: GemvRow[] = [];
  for (const f of BENCH_FORMATS) {
    for (const [rows, cols] of sizes.shapes) {
      gemv.push({
        format: f.name,
        kernel: f.kernel,
        rows,
        cols,
        matrices: 0,
        bytes_per_pass: 0,
        by_threads: [],
      });
    }
  }
  let dispatch: DispatchTimes = {
    median: NaN,
    p99: NaN,
    parkedMedian: NaN,
    parkedP99: NaN,
    direct: NaN,
  };
  const paired: PairedPoint[] = [];
  const vsBaseline: BaselinePoint[] = [];
  const gemm: GemmPoint[] = [];
  for (const t of threads) {
    const pool = await Pool.create(arena, module, t);
    try {
      let i = 0;
      for (const f of BENCH_FORMATS) {
        for (const [rows, cols] of sizes.shapes) {
          const row = gemv[i++];
          const r = timeFormat(
            pool,
            f,
            rows,
            cols,
            { off: regionOff, bytes: sizes.region },
            scratch,
            sizes.passes,
          );
          row.matrices = r.matrices;
          row.bytes_per_pass = r.bytes;
          row.by_threads.push(r.point);
          log(
            `${f.name} ${rows}x${cols} ${t} thread(s): ${r.point.gbps.toFixed(2)} GB/s, ` +
              `${r.point.gweights_per_s.toFixed(2)} Gweights/s`,
          );
        }
      }
      const [pr, pc] = sizes.shapes[0];
      for (const { name } of PAIRED_FORMATS) {
        const pair = timePaired(
          pool,
          name,
          pr,
          pc,
          { off: regionOff, bytes: sizes.region },
          scratch,
          2,
        );
        paired.push(pair);
        log(`${name} / bf16 ${pr}x${pc} ${t} thread(s), alternating: ${pair.ratio.toFixed(2)}`);
      }
      const base = baseModule ? await Pool.create(arena, baseModule, t) : null;
      try {
        const region = { off: regionOff, bytes: sizes.region };
        for (const name of base ? ["bf16", ...PAIRED_FORMATS.map((p) => p.name)] : []) {
          const p = timeBaseline(pool, base!, name, pr, pc, region, scratch, 2);
          vsBaseline.push(p);
          log(`${name} this build / baseline ${t} thread(s): ${p.ratio.toFixed(2)}`);
        }
        const g = timeGemm(arena, pool, base, region);
        gemm.push(g);
        log(
          `gemm_fp8b128 / gemm_bf16 ${g.rows}x${g.cols}x${g.columns} ${t} thread(s), ` +
            `alternating: ${g.fp8_over_bf16.toFixed(2)}` +
            (g.fp8_over_baseline === null ? "" : `, / baseline ${g.fp8_over_baseline.toFixed(2)}`),
        );
      } finally {
        base?.close();
      }
      const k = timeKdaKernels(
        arena,
        pool,
        { off: regionOff, bytes: sizes.region },
        kdaInputs,
        sizes.passes,
      );
      for (const row of [k.recurrence, k.conv]) {
        const have = kda.find((r) => r.kernel === row.kernel);
        if (have) have.by_threads.push(...row.by_threads);
        else kda.push(row);
        log(`${row.kernel} ${t} thread(s): ${row.by_threads[0].gbps.toFixed(2)} GB/s of state`);
      }
      // The KDA bench wrote floats over the weights: put the GEMV filler back for the next pool.
      fillWeights(arena, regionOff, sizes.region);
      if (t === maxThreads) {
        dispatch = timeDispatch(pool, BigInt(regionOff), scratch, sizes.dispatchSamples);
        log(`dispatch ${t} thread(s): median ${dispatch.median.toFixed(2)} µs`);
      }
    } finally {
      pool.close();
    }
  }

  // DRAM again after the kernels, keeping the better figure per thread count: the ceiling is a
  // maximum, and one burst of other work during the first measurement would inflate every ratio.
  if (native !== null) {
    log("DRAM: second measurement");
    const again = await measureDramNative({
      bytes: sizes.dramBytes,
      threads,
      passes: sizes.passes,
    });
    native.method += ", best of a run before and one after the kernels";
    native.points = native.points.map((p, i) => ({
      threads: p.threads,
      gbps: Math.max(p.gbps, again?.points[i]?.gbps ?? 0),
    }));
  }
  const f32Gbps = bestAtMax(gemv, "f32", "gbps")!;
  const dram: DramResult = native ?? {
    method: "f32 GEMV through the pool (lower bound: no C compiler)",
    bytes: sizes.region,
    points: threads.map((t) => ({
      threads: t,
      gbps: Math.max(
        ...gemv.filter((r) => r.format === "f32").map((r) => r.by_threads[t - 1].gbps),
      ),
    })),
  };
  const dramGbps = dram.points[dram.points.length - 1].gbps;
  const dramSuspect = f32Gbps > dramGbps;
  if (dramSuspect) {
    log("WARNING: the f32 GEMV beat the DRAM read: DRAM was measured under load; rerun when idle");
  }

  let disk: KernelBenchReport["disk"] = null;
  if (!opts.skipDisk) {
    log(`disk: ${(sizes.diskBytes / GiB).toFixed(2)} GiB file, O_DIRECT / buffered / dd`);
    disk = {
      ...(await benchDisk({ bytes: sizes.diskBytes, quiet: true })),
      bytes: sizes.diskBytes,
    };
  }
  const odirect = disk && Number.isFinite(disk.odirect_gbps) ? disk.odirect_gbps : null;
  const bf16Gbps = bestAtMax(gemv, "bf16", "gbps")!;
  const vq4pW = bestAtMax(gemv, "vq4p", "gweights_per_s");
  const ratios = [
    check("bf16 GEMV / DRAM", bf16Gbps / dramGbps, TARGETS.bf16_over_dram, ">="),
    check("f32 GEMV / DRAM", f32Gbps / dramGbps, TARGETS.f32_over_dram, ">="),
    ...kda.map((row) =>
      check(
        `${row.kernel} state / DRAM`,
        row.by_threads[row.by_threads.length - 1].gbps / dramGbps,
        TARGETS.kda_state_over_dram,
        ">=",
      )
    ),
    check("dispatch median µs", dispatch.median, TARGETS.dispatch_median_us, "<="),
    ...PAIRED_FORMATS.map(({ name, target }) =>
      check(
        `${name} / bf16 weights/s (alternating, all threads)`,
        paired.findLast((p) => p.format === name)!.ratio,
        target,
        ">=",
      )
    ),
    check(
      "O_DIRECT / dd",
      odirect !== null && disk?.dd_direct_gbps ? odirect / disk.dd_direct_gbps : null,
      TARGETS.odirect_over_dd,
      ">=",
    ),
  ];
  return {
    date: new Date().toISOString(),
    command: ["deno task bench kernels", ...(opts.quick ? ["--quick"] : [])].join(" "),
    quick: opts.quick,
    machine: machineInfo(),
    load_average: load,
    machine_busy: busy,
    threads,
    dram,
    dram_read_gbps: dramGbps,
    dram_suspect: dramSuspect,
    gemv,
    gemm,
    kda,
    f32_gemv_gbps: f32Gbps,
    bf16_gemv_gbps: bf16Gbps,
    f32_gweights_per_s: bestAtMax(gemv, "f32", "gweights_per_s")!,
    bf16_gweights_per_s: bestAtMax(gemv, "bf16", "gweights_per_s")!,
    mxfp4_gweights_per_s: bestAtMax(gemv, "mxfp4", "gweights_per_s"),
    vq3r_gweights_per_s: bestAtMax(gemv, "vq3r", "gweights_per_s"),
    vq4p_gweights_per_s: vq4pW,
    vs_bf16: paired,
    vs_baseline: vsBaseline,
    int8_gweights_per_s: bestAtMax(gemv, "int8", "gweights_per_s"),
    int4_gweights_per_s: bestAtMax(gemv, "int4", "gweights_per_s"),
    fp8_gweights_per_s: bestAtMax(gemv, "fp8", "gweights_per_s"),
    dispatch_threads: maxThreads,
    dispatch_samples: sizes.dispatchSamples,
    dispatch_median_us: dispatch.median,
    dispatch_p99_us: dispatch.p99,
    dispatch_parked_median_us: dispatch.parkedMedian,
    dispatch_parked_p99_us: dispatch.parkedP99,
    direct_call_median_us: dispatch.direct,
    disk,
    odirect_read_gbps: odirect,
    buffered_read_gbps: disk?.buffered_cold_gbps ?? null,
    dd_direct_gbps: disk?.dd_direct_gbps ?? null,
    ratios,
  };
}

const fmt2 = (v: number | null | undefined) =>
  v === null || v === undefined || !Number.isFinite(v) ? "n/a" : v.toFixed(2);

/** The report as Markdown tables (what docs/PERFORMANCE.md shows). */
export function formatKernelReport(r: KernelBenchReport): string {
  const m = r.machine;
  const out: string[] = [];
  out.push(
    `${r.date} · ${m.cpu} (${m.cpu_flags.join(", ") || "no AVX flags"}), ${m.cores} cores, ` +
      `${m.ram_gib.toFixed(1)} GiB RAM · load average ${r.load_average.join(" ")}` +
      (r.machine_busy ? " (BUSY: figures are low)" : "") + (r.quick ? " · QUICK run" : ""),
  );
  out.push("");
  const th = r.threads;
  out.push(`| DRAM read | ${th.map((t) => `${t} thr GB/s`).join(" | ")} |`);
  out.push(`|---|${th.map(() => "---:").join("|")}|`);
  out.push(
    `| ${r.dram.method}, ${(r.dram.bytes / GiB).toFixed(2)} GiB | ` +
      `${r.dram.points.map((p) => fmt2(p.gbps)).join(" | ")} |`,
  );
  if (r.dram_suspect) {
    out.push("", "DRAM figure suspect: a GEMV beat it, so it was measured under load.");
  }
  out.push("");
  out.push(
    `| kernel | shape | cold set | ${th.map((t) => `${t} thr GB/s (Gw/s)`).join(" | ")} |`,
  );
  out.push(`|---|---|---:|${th.map(() => "---:").join("|")}|`);
  for (const g of r.gemv) {
    const cells = g.by_threads.map((p) =>
      `${fmt2(p.gbps)} (${fmt2(p.gweights_per_s)})${(p.other_cores ?? 0) >= 0.3 ? " *" : ""}`
    );
    out.push(
      `| ${g.format} \`${g.kernel}\` | ${g.rows}×${g.cols} | ${g.matrices} × = ` +
        `${(g.bytes_per_pass / GiB).toFixed(2)} GiB | ${cells.join(" | ")} |`,
    );
  }
  out.push("", "\\* other processes kept ≥ 0.3 cores busy during the best pass.", "");
  for (const { name } of PAIRED_FORMATS) {
    out.push(
      `${name} ÷ bf16 weights/s, timed in alternation on ${r.gemv[0].rows}×${r.gemv[0].cols}: ` +
        r.vs_bf16.filter((p) => p.format === name).map((p) =>
          `${p.threads} thr ${fmt2(p.ratio)} (${fmt2(p.gweights_per_s)} vs ` +
          `${fmt2(p.bf16_gweights_per_s)} Gw/s)`
        ).join(", ") + ".",
    );
  }
  if (r.vs_baseline.length) {
    out.push(
      "",
      "| format, this build ÷ baseline (alternating) | threads | Gw/s | baseline Gw/s | ratio |",
    );
    out.push("|---|---:|---:|---:|---:|");
    for (const p of r.vs_baseline) {
      out.push(
        `| ${p.format} | ${p.threads} | ${fmt2(p.gweights_per_s)} | ` +
          `${fmt2(p.baseline_gweights_per_s)} | ${fmt2(p.ratio)} |`,
      );
    }
  }
  out.push(
    "",
    "| batched, alternating | shape × columns | threads | fp8 Gw/s | bf16 Gw/s | fp8 ÷ bf16 | " +
      "baseline fp8 Gw/s | fp8 ÷ baseline |",
  );
  out.push("|---|---|---:|---:|---:|---:|---:|---:|");
  for (const g of r.gemm) {
    out.push(
      `| \`gemm_fp8b128\` vs \`gemm_bf16\` | ${g.rows}×${g.cols} × ${g.columns} | ${g.threads} | ` +
        `${fmt2(g.fp8_gweights_per_s)} | ${fmt2(g.bf16_gweights_per_s)} | ` +
        `${fmt2(g.fp8_over_bf16)} | ${fmt2(g.baseline_fp8_gweights_per_s)} | ` +
        `${fmt2(g.fp8_over_baseline)} |`,
    );
  }
  out.push("");
  out.push(
    `| KDA kernel | one call | cold set | ${th.map((t) => `${t} thr state GB/s`).join(" | ")} |`,
  );
  out.push(`|---|---|---:|${th.map(() => "---:").join("|")}|`);
  for (const k of r.kda) {
    out.push(
      `| \`${k.kernel}\` | ${k.shape} | ${k.layers} layers = ${
        (k.bytes_per_pass / GiB).toFixed(2)
      } GiB | ${k.by_threads.map((p) => fmt2(p.gbps)).join(" | ")} |`,
    );
  }
  out.push("");
  out.push(
    `Dispatch (${r.dispatch_threads} threads, ${r.dispatch_samples} samples): median ` +
      `${fmt2(r.dispatch_median_us)} µs, p99 ${fmt2(r.dispatch_p99_us)} µs; after the ` +
      `workers parked: median ${fmt2(r.dispatch_parked_median_us)} µs, p99 ` +
      `${fmt2(r.dispatch_parked_p99_us)} µs; direct call of the same GEMV: ` +
      `${fmt2(r.direct_call_median_us)} µs.`,
  );
  out.push("");
  if (r.disk) {
    out.push(`| disk read, ${(r.disk.bytes / GiB).toFixed(2)} GiB file | GB/s |`);
    out.push("|---|---:|");
    out.push(`| shim O_DIRECT into the arena | ${fmt2(r.odirect_read_gbps)} |`);
    out.push(`| shim buffered, cold cache | ${fmt2(r.buffered_read_gbps)} |`);
    out.push(`| dd iflag=direct bs=1M | ${fmt2(r.dd_direct_gbps)} |`);
  } else out.push("Disk: skipped.");
  out.push("");
  out.push("| ratio | measured | target | |");
  out.push("|---|---:|---:|---|");
  for (const c of r.ratios) {
    const verdict = c.pass === null ? "n/a" : c.pass ? "PASS" : "MISS";
    out.push(`| ${c.name} | ${fmt2(c.value)} | ${c.kind} ${c.target} | ${verdict} |`);
  }
  return out.join("\n");
}

/** Another build's kernels.wasm, compiled; an error naming the file when it is not one. */
async function compileBaseline(path: string): Promise<WebAssembly.Module> {
  try {
    return await WebAssembly.compile(await Deno.readFile(path));
  } catch (e) {
    throw new Error(`bench kernels: --baseline ${path}: not a readable kernels.wasm (${e})`);
  }
}

/** CLI entry: `bench kernels [--json] [--quick] [--threads N] [--skip-disk] [--baseline W]`. */
export async function main(args: string[]): Promise<void> {
  const { values } = parseArgs({
    args,
    options: {
      json: { type: "boolean", default: false },
      quick: { type: "boolean", default: false },
      threads: { type: "string" },
      "skip-disk": { type: "boolean", default: false },
      baseline: { type: "string" },
    },
  });
  let threads: number | undefined;
  if (values.threads !== undefined) {
    threads = Number(values.threads);
    if (!Number.isInteger(threads) || threads < 1) {
      throw new Error(`bench kernels: --threads must be a positive integer, got ${values.threads}`);
    }
  }
  const report = await runKernelBench({
    quick: values.quick,
    threads,
    skipDisk: values["skip-disk"],
    baseline: values.baseline,
  });
  console.log(values.json ? JSON.stringify(report, null, 2) : formatKernelReport(report));
}

if (import.meta.main) await main(Deno.args);
