/**
 * Disk read bandwidth as sluice sees it: the C shim reading with O_DIRECT into a shared wasm
 * arena, the shim reading through a cold page cache, and `dd iflag=direct` as the peer.
 * Used by the bench (tools/dev/bench/mod.ts); runnable alone:
 * `npx deno run -A tools/dev/bench/disk.ts [--gib 2] [--path F] [--req-mib 1] [--in-flight 4]`
 * (in flight: default the engine's reader threads).
 *
 * @module
 */

import { sharedMemory64 } from "../../../wasm/mod.ts";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { DEFAULT_READER_THREADS, openReader } from "../../../io/reader.ts";
import { dropPageCache, timeSequential, writeTestFile } from "../../../io/disk_probe.ts";

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

/** Options of {@link benchDisk}. */
export interface DiskBenchOptions {
  /** Test file size in bytes (rounded up to 4 KiB); use at least 2 GiB so caches and
   * read-ahead do not dominate. */
  bytes: number;
  /** Test file; written only when missing or of another size. Default: in the temp dir. */
  path?: string;
  /** Bytes per read request (default 1 MiB, a multiple of 4096). */
  reqBytes?: number;
  /** Requests in flight, one per reader thread (default: the engine's reader threads,
   * {@link DEFAULT_READER_THREADS}). */
  inFlight?: number;
  /** Timed passes per method; the best is kept (default 3). */
  runs?: number;
  /** No progress lines on stderr. */
  quiet?: boolean;
}

/** Best-of-runs bandwidths in GB/s (1e9 bytes per second). */
export interface DiskBenchResult {
  /** Shim, O_DIRECT, into the arena; NaN when the direct shim is unavailable. */
  odirect_gbps: number;
  /** Shim (or fallback) through the page cache, dropped before each pass when permitted. */
  buffered_cold_gbps: number;
  /** `dd iflag=direct bs=1M`; null when dd or direct I/O is unavailable. */
  dd_direct_gbps: number | null;
}

function log(quiet: boolean | undefined, text: string): void {
  if (!quiet) console.error(`bench disk: ${text}`);
}

/** Runs dd with O_DIRECT over the file; GB/s from its own byte count and our wall time. */
async function timeDd(path: string): Promise<number | null> {
  try {
    const t0 = performance.now();
    const out = await new Deno.Command("dd", {
      args: [`if=${path}`, "of=/dev/null", "iflag=direct", "bs=1M"],
      stdout: "null",
      stderr: "piped",
    }).output();
    const seconds = (performance.now() - t0) / 1000;
    if (!out.success) return null;
    const bytes = Number(/^(\d+) bytes/m.exec(new TextDecoder().decode(out.stderr))?.[1]);
    return Number.isFinite(bytes) && bytes > 0 ? bytes / seconds / 1e9 : null;
  } catch {
    return null;
  }
}

/**
 * Measures sequential read bandwidth of a test file of `opts.bytes` bytes (written if missing):
 * the shim with O_DIRECT, the shim buffered from a cold cache, and dd with O_DIRECT. Best of
 * `opts.runs` passes each, interleaved in a rotating order so that disk noise hits all three
 * alike, each from a freshly dropped page cache.
 */
export async function benchDisk(opts: DiskBenchOptions): Promise<DiskBenchResult> {
  const reqBytes = opts.reqBytes ?? MiB;
  const inFlight = opts.inFlight ?? DEFAULT_READER_THREADS;
  const runs = opts.runs ?? 3;
  if (reqBytes % 4096 !== 0 || reqBytes <= 0) {
    throw new Error(`bench disk: request size ${reqBytes} is not a positive multiple of 4096`);
  }
  const bytes = Math.ceil(opts.bytes / 4096) * 4096;
  const path = opts.path ?? join(tmpdir(), `sluice-disk-bench-${bytes}.bin`);
  writeTestFile(path, bytes, (line) => log(opts.quiet, line));

  const memory = sharedMemory64(reqBytes * inFlight);
  const direct = openReader(memory, { direct: true, threads: inFlight, quiet: opts.quiet });
  const buffered = openReader(memory, { direct: false, threads: inFlight, quiet: opts.quiet });
  const result: DiskBenchResult = {
    odirect_gbps: direct.kind === "shim-direct" ? 0 : NaN,
    buffered_cold_gbps: 0,
    dd_direct_gbps: null,
  };
  if (direct.kind !== "shim-direct") log(opts.quiet, `no O_DIRECT shim (got ${direct.kind})`);
  let cold = true;
  // Every pass starts right after a drop of the page cache, which sends other processes back to
  // the disk for their files: the first pass after it was measurably slower than the next. So
  // each method gets its own drop, and the order rotates from run to run.
  const methods: (() => void | Promise<void>)[] = [
    () => {
      if (direct.kind !== "shim-direct") return;
      const gbps = timeSequential(direct, path, reqBytes, inFlight);
      result.odirect_gbps = Math.max(result.odirect_gbps, gbps);
    },
    () => {
      const gbps = timeSequential(buffered, path, reqBytes, inFlight);
      result.buffered_cold_gbps = Math.max(result.buffered_cold_gbps, gbps);
    },
    async () => {
      const dd = await timeDd(path);
      if (dd !== null) result.dd_direct_gbps = Math.max(result.dd_direct_gbps ?? 0, dd);
    },
  ];
  try {
    for (let run = 0; run < runs; run++) {
      for (let m = 0; m < methods.length; m++) {
        cold = dropPageCache() && cold;
        await methods[(run + m) % methods.length]();
      }
    }
  } finally {
    direct.close();
    buffered.close();
  }
  if (!cold) {
    log(opts.quiet, "cannot drop the page cache (not root): buffered numbers may be warm");
  }
  return result;
}

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      gib: { type: "string", default: "2" },
      path: { type: "string" },
      "req-mib": { type: "string", default: "1" },
      "in-flight": { type: "string", default: String(DEFAULT_READER_THREADS) },
      runs: { type: "string", default: "3" },
    },
  });
  const opts: DiskBenchOptions = {
    bytes: Number(values.gib) * GiB,
    path: values.path,
    reqBytes: Number(values["req-mib"]) * MiB,
    inFlight: Number(values["in-flight"]),
    runs: Number(values.runs),
  };
  const [load1] = Deno.loadavg();
  const r = await benchDisk(opts);
  const fmt = (v: number | null) => v === null || Number.isNaN(v) ? "n/a" : v.toFixed(2);
  const ratio = r.dd_direct_gbps ? (r.odirect_gbps / r.dd_direct_gbps).toFixed(2) : "n/a";
  console.log(
    `file ${(opts.bytes / GiB).toFixed(2)} GiB, ${opts.reqBytes! / MiB} MiB requests, ` +
      `${opts.inFlight} in flight, best of ${opts.runs}, load average ${load1.toFixed(2)}`,
  );
  console.log("| method                        | GB/s |");
  console.log("|-------------------------------|------|");
  console.log(`| shim O_DIRECT into wasm arena | ${fmt(r.odirect_gbps)} |`);
  console.log(`| shim buffered, cold cache     | ${fmt(r.buffered_cold_gbps)} |`);
  console.log(`| dd iflag=direct bs=1M         | ${fmt(r.dd_direct_gbps)} |`);
  console.log(`shim O_DIRECT / dd: ${ratio}`);
}
