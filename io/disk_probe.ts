/**
 * Disk read figures as sluice's reader sees them: a test file written once, sequential reads of
 * it (trunk-style, large requests) and random record-sized reads (expert-style), through the
 * same {@link BlockReader} the engine uses, plus whether a directory's filesystem takes O_DIRECT.
 * Used by `mod.ts doctor` and the disk benchmark (tools/bench/disk.ts).
 *
 * @module
 */

import { existsSync, renameSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { sharedMemory64 } from "../wasm/mod.ts";
import { type BlockReader, DEFAULT_READER_THREADS, openReader, type ReadTicket } from "./reader.ts";
import { ShimReader } from "./shim.ts";

const MiB = 1024 * 1024;

/** Drops the page cache when root; returns false when not permitted. */
export function dropPageCache(): boolean {
  try {
    new Deno.Command("sync").outputSync();
    Deno.writeTextFileSync("/proc/sys/vm/drop_caches", "3");
    return true;
  } catch {
    return false;
  }
}

/**
 * Writes `bytes` of incompressible data to `path` (temp name, fsync, rename) unless a file of that
 * size is there; `log` hears about the write.
 */
export function writeTestFile(path: string, bytes: number, log: (line: string) => void): void {
  if (existsSync(path) && statSync(path).size === bytes) return;
  log(`writing a ${(bytes / MiB).toFixed(0)} MiB test file ${path}`);
  const chunk = new Uint8Array(Math.min(64 * MiB, bytes));
  for (let i = 0; i < chunk.length; i += 65536) {
    crypto.getRandomValues(chunk.subarray(i, i + 65536));
  }
  const tmp = `${path}.tmp-${Deno.pid}`;
  const f = Deno.openSync(tmp, { write: true, create: true, truncate: true });
  try {
    for (let done = 0; done < bytes;) {
      const n = Math.min(chunk.length, bytes - done);
      // Vary each chunk so no layer below can deduplicate or compress the file.
      new DataView(chunk.buffer).setFloat64(0, done);
      let w = 0;
      while (w < n) w += f.writeSync(chunk.subarray(w, n));
      done += n;
    }
    f.syncSync();
  } catch (e) {
    f.close();
    rmSync(tmp, { force: true });
    throw e;
  }
  f.close();
  renameSync(tmp, path);
}

/**
 * Reads the whole file sequentially in `reqBytes` requests, `inFlight` at a time, into arena
 * slots `0..inFlight-1` (the arena must hold `reqBytes × inFlight`); returns GB/s (1e9).
 */
export function timeSequential(
  reader: BlockReader,
  path: string,
  reqBytes: number,
  inFlight: number,
): number {
  const h = reader.open(path);
  try {
    const size = reader.size(h);
    const slots: { t: ReadTicket; slot: number }[] = [];
    let next = 0;
    const issue = (slot: number) => {
      const len = Math.min(reqBytes, size - next);
      slots.push({ t: reader.submit(h, slot * reqBytes, len, next), slot });
      next += len;
    };
    const t0 = performance.now();
    for (let s = 0; s < inFlight && next < size; s++) issue(s);
    while (slots.length > 0) {
      const { t, slot } = slots.shift()!;
      reader.wait(t);
      if (next < size) issue(slot);
    }
    return size / ((performance.now() - t0) / 1000) / 1e9;
  } finally {
    reader.closeFile(h);
  }
}

/** What {@link timeRandom} measured. */
export interface RandomReadResult {
  /** Bytes per second in GB/s (1e9). */
  gbps: number;
  /** Completed reads per second. */
  readsPerSecond: number;
  /** Mean wall time per read, in milliseconds, with `inFlight` outstanding. */
  meanMs: number;
}

/**
 * Reads `count` records of `recordBytes` (a multiple of 4096) at random record-aligned offsets
 * of the file, `inFlight` at a time, like expert misses; the offsets come from a fixed seed.
 */
export function timeRandom(
  reader: BlockReader,
  path: string,
  recordBytes: number,
  inFlight: number,
  count: number,
): RandomReadResult {
  const h = reader.open(path);
  try {
    const records = Math.floor(reader.size(h) / recordBytes);
    if (records < 1) throw new Error(`${path}: smaller than one ${recordBytes}-byte record`);
    let state = 0x9e3779b9;
    const nextRecord = () => {
      state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
      return state % records;
    };
    const slots: { t: ReadTicket; slot: number }[] = [];
    let issued = 0;
    const issue = (slot: number) => {
      slots.push({
        t: reader.submit(h, slot * recordBytes, recordBytes, nextRecord() * recordBytes),
        slot,
      });
      issued++;
    };
    const t0 = performance.now();
    for (let s = 0; s < inFlight && issued < count; s++) issue(s);
    while (slots.length > 0) {
      const { t, slot } = slots.shift()!;
      reader.wait(t);
      if (issued < count) issue(slot);
    }
    const seconds = (performance.now() - t0) / 1000;
    return {
      gbps: (count * recordBytes) / seconds / 1e9,
      readsPerSecond: count / seconds,
      meanMs: (1000 * seconds) / count,
    };
  } finally {
    reader.closeFile(h);
  }
}

/** What {@link probeDisk} found in a directory. */
export interface DiskProbe {
  /** The reader kind that ran the reads. */
  reader: BlockReader["kind"];
  /** Whether the directory's filesystem took O_DIRECT (null: no shim to try it with). */
  direct: boolean | null;
  /** Whether the page cache could be dropped before the reads (root). */
  cacheDropped: boolean;
  /** Reads in flight: one per reader thread, as many as the engine's reader runs. */
  inFlight: number;
  /** Sequential 1 MiB reads, {@link DiskProbe.inFlight} in flight: GB/s. */
  sequentialGbps: number;
  /** Random record-sized reads, {@link DiskProbe.inFlight} in flight. */
  random: RandomReadResult;
  recordBytes: number;
  fileBytes: number;
}

/**
 * Writes a `fileBytes` test file in `dir`, measures sequential and random `recordBytes` reads of
 * it with the engine's reader (O_DIRECT when the filesystem takes it), and removes the file.
 */
export function probeDisk(
  dir: string,
  fileBytes: number,
  recordBytes: number,
  log: (line: string) => void,
): DiskProbe {
  const reqBytes = MiB;
  const inFlight = DEFAULT_READER_THREADS;
  const record = Math.max(4096, Math.ceil(recordBytes / 4096) * 4096);
  const bytes = Math.max(Math.ceil(fileBytes / MiB) * MiB, 4 * record);
  const path = join(dir, `.sluice-doctor-${Deno.pid}.bin`);
  const memory = sharedMemory64(Math.max(reqBytes, record) * inFlight);
  const reader = openReader(memory, { direct: true, threads: inFlight, quiet: true });
  try {
    writeTestFile(path, bytes, log);
    let direct: boolean | null = null;
    if (reader instanceof ShimReader) {
      const h = reader.open(path);
      direct = reader.isDirect(h);
      reader.closeFile(h);
    }
    const cacheDropped = dropPageCache();
    const sequentialGbps = timeSequential(reader, path, reqBytes, inFlight);
    dropPageCache();
    const count = Math.max(16, Math.min(512, Math.floor(bytes / record)));
    const random = timeRandom(reader, path, record, inFlight, count);
    return {
      reader: reader.kind,
      direct,
      cacheDropped,
      inFlight,
      sequentialGbps,
      random,
      recordBytes: record,
      fileBytes: bytes,
    };
  } finally {
    reader.close();
    rmSync(path, { force: true });
  }
}
